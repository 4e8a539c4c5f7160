"""engine/trace_diff.py and `python -m engine diff`: a planted difference is found at its step
and position, equal runs say so, bad input is one line."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import GenerationConfig, RunHooks, run_diffusion
from engine.errors import EngineError
from engine.trace import Trace
from engine.trace_diff import canvases, diff_traces

from .conftest import tiny_llada

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "assets" / "traces" / "threshold-none.json"


def planted(data: dict, record: int) -> tuple[dict, int]:
    """A copy of trace `data` whose record `record` wrote another token at its first commit (and
    whose final canvas holds it), with that position."""
    data = copy.deepcopy(data)
    rec = data["iterations"][record]
    p = rec["committed"][0][0]
    w = p - rec["block_range"][0]
    token = rec["top1"][0][w]
    other = next(t for t in range(1, 100) if t not in (token, data["mask_id"]))
    rec["top1"][0][w] = other
    data["final"][0][p] = other
    return data, p


def test_planted_difference_found_at_its_step_and_position():
    data = json.loads(SAMPLE.read_text())
    k = 2
    changed, p = planted(data, k)
    diff = diff_traces(Trace.from_dict(data), Trace.from_dict(changed))
    assert diff.first is not None and (diff.first.step, diff.first.position) == (k, p)
    assert diff.first.a.record == diff.first.b.record == k and diff.first.a.token != diff.first.b.token
    assert diff.first.a.candidates  # the sample holds candidates at the position it committed
    assert diff.steps_equal and not diff.final_equal and diff.final_position == p
    same = diff_traces(Trace.from_dict(data), Trace.from_dict(data))
    assert same.first is None and same.final_equal


def test_replay_equals_canvas_at():
    trace = Trace.from_json(SAMPLE.read_text())
    assert canvases(trace) == [trace.canvas_at(i)[0] for i in range(len(trace.iterations))]


def test_steps_are_aligned_within_blocks():
    """A run with an extra step in a block that changes nothing (as diffusers' runs are) differs in
    steps, not in canvases."""
    trace = run_diffusion(tiny_llada(), [[3, 4, 5]], GenerationConfig(gen_length=8, block_length=4, threshold=0.5, early_stop=False), hooks=RunHooks(trace=True)).trace
    data = trace.to_dict()
    idle = copy.deepcopy(data["iterations"][0])
    idle["committed"], idle["forced"] = [[]], [[]]
    longer = copy.deepcopy(data)
    first_block = [i for i, r in enumerate(longer["iterations"]) if r["block"] == 0]
    longer["iterations"].insert(first_block[-1] + 1, idle)
    diff = diff_traces(trace, Trace.from_dict(longer))
    assert diff.first is None and diff.final_equal and not diff.steps_equal


def test_different_prompts_are_refused():
    model = tiny_llada()
    config = GenerationConfig(gen_length=4, block_length=4)
    a = run_diffusion(model, [[3, 4, 5]], config, hooks=RunHooks(trace=True)).trace
    b = run_diffusion(model, [[3, 4, 6]], config, hooks=RunHooks(trace=True)).trace
    with pytest.raises(EngineError, match="not of one prompt"):
        diff_traces(a, b)
    with pytest.raises(EngineError, match="no row 1"):
        diff_traces(a, a, row_a=1)


def test_diff_command(tmp_path, capsys):
    """The real program once (its status 1 for traces that differ); the other outcomes through the
    same main() in this process (each fresh Python importing torch costs seconds and proves no more)."""
    from engine.__main__ import main

    data = json.loads(SAMPLE.read_text())
    changed, p = planted(data, 1)
    (tmp_path / "b.json").write_text(json.dumps(changed))
    done = subprocess.run([sys.executable, "-m", "engine", "diff", str(SAMPLE), str(tmp_path / "b.json")], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 1, done.stderr
    assert f"step 1 (block 0, step 1 in it; A record 1, B record 1) at position {p}" in done.stdout and "final tokens: differ" in done.stdout
    assert main(["diff", str(SAMPLE), str(SAMPLE), "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["first"] is None and same["final_equal"]
    (tmp_path / "bad.json").write_text('{"version": 7}')
    for bad in ("bad.json", "missing.json"):
        assert main(["diff", str(SAMPLE), str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: "), err
