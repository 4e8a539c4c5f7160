"""A torchrun rank killed mid-request (engine/runtime/launch.py, docs/scaling.md): the caller reads
one line from the rank that reports, never a traceback, and no rank outlives the job.

The ranks are held inside their request by the marked gate decoder's files (tests/
marked_gate_decoder.py): the test kills rank 1 only once both ranks have reached their first
decode, then opens every gate. What rank 0 hits first, the lost peer at its next all-reduce or
torchrun's SIGTERM once torchrun has seen the death, is the machine's timing, so either line is
accepted; that there is exactly one, and no process left, is not.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .app_support import EMBEDDED_MODEL
from .conftest import assert_processes_end
from .test_serve import _children
from .test_torchrun import LIMIT_S, PROMPT, ROOT, _torchrun

GATE_DECODER = Path(__file__).with_name("marked_gate_decoder.py")
ONE_LINE = re.compile(
    r"error: rank 0 of 2(: another rank of the job is gone \(.+\); a process group cannot take a rank back, so the job ends"
    r"| was stopped by the job's launcher \(SIGTERM\): another rank failed, or the job was stopped)"
)


def _rank_of(pid: int) -> str:
    environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(e.split(b"=", 1)[1].decode() for e in environment if e.startswith(b"RANK="))


@pytest.mark.torchrun
def test_a_rank_killed_mid_request_gives_one_line_and_leaves_no_process(tmp_path):
    gates = tmp_path / "gates"
    gates.mkdir()
    command = _torchrun(
        "--standalone", "--nproc-per-node", "2", "-m", "engine", "generate", "--model", str(EMBEDDED_MODEL), "--tp", "2",
        "--prompt", PROMPT, "--gen-length", "16", "--block-length", "8", "--decoder", "marked_gate", "--gates", str(gates), "--json",
    )
    env = {**os.environ, "DINFER_VIZ_DECODERS": str(GATE_DECODER)}
    job = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + LIMIT_S  # a bound on a hang, not a speed
        while not all((gates / f"reached-1-{rank}").exists() for rank in (0, 1)):  # both ranks inside the request
            assert job.poll() is None and time.monotonic() < deadline, job.stderr.read()[-3000:] if job.poll() is not None else "never reached"
            time.sleep(0.05)
        ranks = {_rank_of(pid): pid for pid in _children(job.pid)}
        assert sorted(ranks) == ["0", "1"], ranks
        killed = time.monotonic()
        os.kill(ranks["1"], signal.SIGKILL)
        for gate in range(1, 17):  # rank 0 goes on to its next all-reduce, with nobody at the other end
            (gates / str(gate)).touch()
        out, err = job.communicate(timeout=LIMIT_S)
        print(f"kill -9 of rank 1 to torchrun's exit: {time.monotonic() - killed:.2f} s")
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode != 0 and out == ""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ONE_LINE.fullmatch(errors[0]), err[-3000:]
    assert not [line for line in err.splitlines() if line.startswith("[rank")], err[-3000:]  # no rank printed a traceback
    assert_processes_end(list(ranks.values()), LIMIT_S, "the torchrun job")
