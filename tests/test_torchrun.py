"""torchrun launches (engine/runtime/launch.py, docs/scaling.md) on this CPU with gloo: two ranks on
one node and two one-rank "nodes" on the loopback address give the tokens of one process (greedy),
only rank 0 prints them; a degree that does not match the job is one error line and a non-zero
exit before any weight is read; through the API, a stop or a failing callback on any rank ends
every rank at the same check, and the job goes on.

Every outcome is read from the processes' output and exit codes, never from how long they took.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engine import Engine, GenerationConfig

from .app_support import EMBEDDED_MODEL
from .test_parallel_engine import moe_folder  # noqa: F401  (the fixture: a tiny LLaDA-MoE with the embedded tokenizer)

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Q: 12+35=? A:"
SETTINGS = ["--gen-length", "16", "--block-length", "8"]
LIMIT_S = 600  # a bound on a hang, not a speed


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=LIMIT_S)


def _generate(folder: Path, degree: str) -> list[str]:
    return ["-m", "engine", "generate", "--model", str(folder), degree, "2", "--prompt", PROMPT, *SETTINGS, "--json"]


def _one_process_tokens(folder: Path) -> list[int]:
    with Engine(folder) as engine:
        return engine.generate(PROMPT, GenerationConfig(gen_length=16, block_length=8)).output.token_ids[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("model, degree", [("embedded", "--tp"), ("moe", "--tp"), ("moe", "--ep")])
def test_two_ranks_on_one_node_give_the_tokens_of_one_process(moe_folder, model, degree):
    folder = EMBEDDED_MODEL if model == "embedded" else moe_folder
    done = _run(_torchrun("--standalone", "--nproc-per-node", "2", *_generate(folder, degree)))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1  # rank 0 prints; rank 1 holds the same output silently
    assert json.loads(lines[0])["token_ids"] == _one_process_tokens(folder)


def test_two_loopback_nodes_give_the_tokens_of_one_process():
    node = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "--nproc-per-node", "1"]
    second = subprocess.Popen(_torchrun(*node, "--node-rank", "1", *_generate(EMBEDDED_MODEL, "--tp")), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = _run(_torchrun(*node, "--node-rank", "0", *_generate(EMBEDDED_MODEL, "--tp")))
        second_out, second_err = second.communicate(timeout=LIMIT_S)
    finally:
        second.kill()
    assert first.returncode == 0 and second.returncode == 0, first.stderr[-2000:] + second_err[-2000:]
    assert json.loads(first.stdout)["token_ids"] == _one_process_tokens(EMBEDDED_MODEL)
    assert second_out == ""  # node 1's only rank is rank 1


def test_a_degree_that_is_not_the_jobs_size_is_one_line_from_the_reporting_rank_before_any_weight_is_read(tmp_path):
    """The weights are truncated: had any rank read them, the error would name the file. Rank 0
    (the one that reports) starts late, held by a sitecustomize the job's processes run first, so
    rank 1 fails the same check long before it: torchrun ends the other ranks as soon as one exits,
    so rank 1 waits for that (engine/runtime/launch.py `wait_for_the_reporter`) rather than exiting
    first and ending rank 0 before its line (a CI run once printed no line at all)."""
    model, site = tmp_path / "model", tmp_path / "site"
    model.mkdir(), site.mkdir()
    for f in EMBEDDED_MODEL.iterdir():
        if f.is_file():
            (model / f.name).write_bytes(f.read_bytes())
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    (site / "sitecustomize.py").write_text("import os, time\nif os.environ.get('LOCAL_RANK') == '0':\n    time.sleep(5)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    argv = _torchrun("--standalone", "--nproc-per-node", "2", "-m", "engine", "generate", "--model", str(model), "--tp", "4", "--prompt", PROMPT)
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=LIMIT_S, env=env)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and done.stdout == ""
    assert errors == ["error: tp=4, ep=1: each must be 1 or the number of processes (2), and one of them 2"], done.stderr[-3000:]


# each rank writes its report to a file of its own: the ranks' stdout is one pipe, where two
# ranks' lines once ran together into one
SCRIPT = """
import json, sys, threading
from pathlib import Path
from engine import Engine, GenerationCancelled, GenerationConfig
from engine.hooks import RunHooks

config = GenerationConfig(decoder="fixed", gen_length=16, block_length=8, early_stop=False)  # 16 iterations
engine = Engine(sys.argv[1], tp_size=2)
report = {"rank": engine.rank}

def attempt(name, hooks):
    seen = []
    hooks = hooks(seen)
    try:
        engine.generate("Q: 12+35=? A:", config, hooks)
        report[name] = ("done", seen)
    except GenerationCancelled:
        report[name] = ("cancelled", seen)
    except ValueError as exc:
        report[name] = (str(exc), seen)

cancel = threading.Event()  # set on rank 0 only, on reading record 2
def stop_at_2(seen):
    def on_iteration(record):
        seen.append(record.iteration)
        if engine.rank == 0 and record.iteration == 2:
            cancel.set()
    return RunHooks(on_iteration=on_iteration, cancel=cancel)

def rank_1_fails_at_1(seen):
    def on_iteration(record):
        seen.append(record.iteration)
        if engine.rank == 1 and record.iteration == 1:
            raise ValueError("rank 1's viewer broke")
    return RunHooks(on_iteration=on_iteration)

attempt("stopped", stop_at_2)
attempt("failed", rank_1_fails_at_1)
report["after"] = engine.generate("Q: 12+35=? A:", config).output.token_ids
engine.close()
Path(sys.argv[2], f"rank{report['rank']}.json").write_text(json.dumps(report))
"""


def test_through_the_api_a_stop_on_any_rank_ends_every_rank_at_the_same_check_and_the_job_goes_on(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    done = _run(_torchrun("--standalone", "--nproc-per-node", "2", str(script), str(EMBEDDED_MODEL), str(tmp_path)))
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in reports] == [0, 1]
    zero, one = reports
    # rank 0's cancel, set on record 2, stops both ranks before iteration 3
    assert zero["stopped"] == one["stopped"] == ["cancelled", [0, 1, 2]]
    # rank 1's callback raises on record 1: its exception there, a cancel on rank 0, both before iteration 2
    assert one["failed"] == ["rank 1's viewer broke", [0, 1]] and zero["failed"] == ["cancelled", [0, 1]]
    with Engine(EMBEDDED_MODEL) as alone:
        tokens = alone.generate(PROMPT, GenerationConfig(decoder="fixed", gen_length=16, block_length=8, early_stop=False)).output.token_ids
    assert zero["after"] == one["after"] == tokens


LEAVE_PROBE = """
import os, sys
import torch
import torch.distributed as dist
from engine.runtime.launch import Job

def threads():
    return len(os.listdir('/proc/self/task'))

before = threads()
job = Job.from_environment()
job.join('cpu')
dist.all_reduce(torch.ones(2))
held = [dist.group.WORLD]
held.append(held)  # a reference cycle holding the group, as a callback's exception and its traceback held it
del held
job.leave()
print(before, threads())
"""


def test_leaving_a_job_ends_the_groups_threads_even_when_a_cycle_still_held_the_group(tmp_path):
    """A group that outlived destroy_process_group (still referenced from a cycle) kept its gloo
    threads into the interpreter's shutdown, where freeing the last all-reduce's tensors aborted the
    rank (SIGABRT in test_through_the_api_..., 3 jobs in 24 on the loaded machine): leave() ends them."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    done = subprocess.run([sys.executable, "-c", LEAVE_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=LIMIT_S, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = map(int, done.stdout.split())
    assert after == before, (before, after)
