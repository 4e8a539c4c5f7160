"""No worker outlives its parent (issue #55 item 5): a tensor-parallel run's worker processes end
when the process that started them is killed (SIGKILL: no handler, no exit code of its own runs),
at its workers' start as in the middle of a generation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import assert_processes_end

ROOT = Path(__file__).resolve().parent.parent
# The parent: a TP=2 engine on the embedded model, one long generation that prints a line per
# iteration (the test's sign that the run is under way)
PARENT = """
import sys
from engine import Engine, GenerationConfig, RunHooks
with Engine("tiny-llada", tp_size=2) as engine:
    engine.generate("Q: 1+1= A:", GenerationConfig(gen_length=256, block_length=256, decoder="fixed"), RunHooks(on_iteration=lambda record: print("iteration", flush=True)))
"""
HANG_GUARD_S = 300  # bounds on a hang (torch's import on a loaded machine), never a speed


def _workers(parent: int) -> list[int]:
    """The parent's spawned workers (multiprocessing's resource tracker is not one)."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and int(stat.rpartition(")")[2].split()[1]) == parent and b"spawn_main" in command:
            out.append(int(entry.name))
    return sorted(out)


def _importing_torch(pid: int) -> bool:
    """Whether the process has torch's library mapped (it is importing or has imported torch)."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _ending(pid: int) -> bool:
    """Whether the process is gone, a zombie, or has SIGKILL pending (the kernel is ending it)."""
    try:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    except OSError:
        return True
    pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
    return status["State"].strip()[0] in "ZX" or bool(pending & (1 << (signal.SIGKILL - 1)))


@pytest.mark.parametrize("when", ["starting", "generating"])
def test_workers_end_when_their_parent_is_killed(when):
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        if when == "generating":
            assert parent.stdout.readline() == "iteration\n"  # the ranks run the generation
            workers = _workers(parent.pid)
        else:  # each worker has begun importing torch: loading its shard, seconds before it serves
            while len(workers := _workers(parent.pid)) < 2 or not all(map(_importing_torch, workers)):
                assert parent.poll() is None and time.monotonic() < deadline, "the workers did not start"
                time.sleep(0.05)
        assert len(workers) == 2
        parent.kill()
        parent.wait()
        # the parent is reaped: the kernel has already sent each worker its death signal
        assert all(map(_ending, workers)), [(pid, Path(f"/proc/{pid}/status").read_text()[:200]) for pid in workers if not _ending(pid)]
        assert_processes_end(workers, HANG_GUARD_S, "its parent's SIGKILL")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
