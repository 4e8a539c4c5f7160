"""engine/analysis.py and `python -m engine analyze` on runs whose answers are known."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from engine import GenerationConfig, RunHooks, load_model, run_diffusion
from engine.analysis import analyze, spearman
from engine.trace import Trace

from .conftest import tiny_llada
from .gemma_models import CANVAS, STOP
from .test_diffusion_gemma import checkpoint, uniform_config  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from write_trace import step_record, trace_dict  # noqa: E402

KEYS = {"finalized_fraction", "kl_to_final", "gate_confidence", "mean_confidence", "order_correlation", "converged"}


def check_lists(result: dict, steps: int) -> None:
    assert KEYS <= set(result)
    for key in ("finalized_fraction", "kl_to_final", "gate_confidence", "mean_confidence", "commits"):
        assert len(result[key]) == steps, key
    for gate, mean in zip(result["gate_confidence"], result["mean_confidence"]):
        assert gate is None or gate <= mean


def test_blocks_of_one_are_perfectly_left_to_right():
    trace = run_diffusion(tiny_llada(), [[3, 4, 5]], GenerationConfig(gen_length=8, block_length=1, early_stop=False), hooks=RunHooks(trace=True)).trace
    result = analyze(trace)
    check_lists(result, 8)
    assert result["order_correlation"] == 1.0 and result["order_correlation_within_blocks"] == 1.0
    assert result["finalized_fraction"][-1] == 1.0 and result["kl_to_final"][-1] == 0.0
    assert result["commits"] == [1] * 8 and result["converged"] is True
    assert result["finalized_fraction"] == sorted(result["finalized_fraction"])  # a non-revising run only gains


def test_a_parallel_run_ends_final_and_converged():
    trace = run_diffusion(tiny_llada(), [[3, 4, 5]], GenerationConfig(gen_length=16, block_length=8, threshold=0.3), hooks=RunHooks(trace=True)).trace
    result = analyze(trace)
    check_lists(result, len(trace.iterations))
    assert result["finalized_fraction"][-1] == 1.0 and result["converged"] is True
    assert sum(result["commits"]) <= 16


def test_right_to_left_is_minus_one_and_known_kl():
    """Hand-written with the example writer: three positions committed right to left."""
    final = [1, 6, 7, 8]

    def top1(i: int) -> list[int]:  # written or writing: the final token; still open: a wrong one
        return [final[p] if p >= 3 - i else 2 for p in range(1, 4)]

    steps = [step_record(i, 0, (1, 4), {3 - i: final[3 - i]}, top1(i), [0.5, 0.75, 0.9]) for i in range(3)]
    trace = Trace.from_dict(trace_dict([1], 3, 3, 0, [9], steps, final))
    result = analyze(trace)
    assert result["order_correlation"] == -1.0 and result["order_correlation_within_blocks"] == -1.0
    assert result["finalized_fraction"] == [0.3333, 0.6667, 1.0]
    # step 0: position 3 written (0); positions 1 and 2 open, top-1 wrong at 0.5 and 0.75: p(final) <= 0.5, 0.25
    assert abs(result["kl_to_final"][0] - (math.log(2) + math.log(4)) / 3) < 1e-3
    assert result["gate_confidence"][0] == 0.5 and result["mean_confidence"][0] == round((0.5 + 0.75 + 0.9) / 3, 4) and result["commits"] == [1, 1, 1]
    assert spearman([1, 2, 3], [5, 5, 5]) is None


def test_a_uniform_run_ends_final(checkpoint):
    config = uniform_config(0, max_denoising_steps=12, confidence_threshold=2.5)
    trace = run_diffusion(load_model(checkpoint), [[12, 30, 45, 9, 17]], config, stop_ids=[STOP], hooks=RunHooks(trace=True)).trace
    result = analyze(trace)
    check_lists(result, len(trace.iterations))
    assert result["finalized_fraction"][-1] == 1.0 and isinstance(result["converged"], bool)
    assert len(result["order_correlation_per_block"]) == len({rec.block for rec in trace.iterations}) <= 3 * CANVAS


def test_analyze_command(capsys):
    """The real program once; its refusal through the same main() in this process (one fresh
    Python importing torch is the cost of this test, a second would prove nothing more)."""
    from engine.__main__ import main

    sample = ROOT / "assets" / "traces" / "edit-none.json"
    done = subprocess.run([sys.executable, "-m", "engine", "analyze", str(sample), "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    check_lists(result, len(Trace.from_json(sample.read_text()).iterations))
    assert main(["analyze", str(sample), "--row", "3"]) == 2
    err = capsys.readouterr().err
    assert "no row 3" in err and err.count("\n") == 1, err


def test_positions_early_stop_filled_are_left_out_of_the_order():
    """#44 item 7: early stop fills the canvas after a row's end at no step; counted as final at the
    last step they made any early-stopped run read 'left to right'. They are left out, and counted."""
    from engine import Engine, GenerationConfig, RunHooks
    from engine.analysis import analyze, decided_steps, finalization_steps

    trace = Engine("tiny-llada").generate("Q: 7+58=? A:", GenerationConfig(gen_length=64, block_length=8), RunHooks(trace=True)).output.trace
    recorded = max(rec.block_range[1] for rec in trace.iterations)
    assert recorded < trace.canvas_length  # the run stopped early
    result, decided = analyze(trace), decided_steps(trace)
    assert set(decided) == {p for p in finalization_steps(trace) if p < recorded}
    assert result["order_left_out"] == trace.canvas_length - recorded == len(finalization_steps(trace)) - len(decided)


def test_analyze_prints_what_the_trace_cannot_give_as_the_app_does(tmp_path, capsys, monkeypatch):
    """#54: `engine analyze` printed Python's None (a step with no open position, an order not
    known) where the app says n/a; both print through engine.analysis.figure_text."""
    import engine.analysis
    from engine.__main__ import main

    from .app_support import handmade_trace

    file = tmp_path / "trace.json"
    file.write_text(handmade_trace().to_json())
    result = analyze(handmade_trace())
    # what a trace without the numbers gives (an old one, a run with no open position at a step)
    unknown = {**result, "order_correlation": None, "converged": None, "gate_confidence": [None] * result["steps"], "kl_to_final": [None] * result["steps"]}
    monkeypatch.setattr(engine.analysis, "analyze", lambda trace, row=0: unknown)
    assert main(["analyze", str(file)]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "order correlation n/a" in out and "converged unknown" in out
