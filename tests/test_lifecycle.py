"""The worker processes' life (engine/runtime/lifecycle.py) with plain Python workers
(tests/lifecycle_workers.py), so no spawned process imports torch: requests and their messages, a
stop that lands on the same check on every rank, a failing or dying rank that ends the group and a
fresh group on the next call, a rank that cannot load, a frozen rank that cannot hold Stop, and
workers that end with their caller, however frozen. The Engine's own ranks on this lifecycle:
tests/test_parallel_engine.py (the `workers` lane).

Every outcome is decided by events (messages, replies, process exits), never by how long anything
took; a frozen rank never answers, so the stop grace a test gives is a bound, not a speed.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import pytest

from engine import EngineError
from engine.runtime import lifecycle
from engine.runtime.lifecycle import ProcessGroup, RankCancel, StopFlags

from . import lifecycle_workers
from .conftest import assert_processes_end

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 600  # a bound on a hang, not a speed


def _children() -> set[int]:
    """The pids of this process's live children (multiprocessing reaps those that ended)."""
    return {p.pid for p in multiprocessing.active_children()}


def _gone(pids) -> bool:
    """Whether every one of these processes has ended and been reaped."""
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


@pytest.fixture
def groups():
    """Makes groups of plain Python workers (`behaviour`: tests/lifecycle_workers.py's `load`) and
    ends them after the test; the test process has no other worker left."""
    before, made = _children(), []

    def make(world: int = 2, behaviour: str = "", **options) -> ProcessGroup:
        made.append(ProcessGroup(world, partial(lifecycle_workers.load, behaviour), **options))
        return made[-1]

    yield make
    for group in made:
        group.close()
    assert _children() == before


def test_every_rank_answers_and_its_messages_arrive_in_order_with_its_rank(groups):
    group = groups(3)
    group.start()
    seen = []
    replies = group.call(("echo", 4), deliver=lambda rank, message: seen.append((rank, message)))
    assert replies == [(0, "echo", 4), (1, "echo", 4), (2, "echo", 4)]
    for rank in range(3):
        assert [m for r, m in seen if r == rank] == [(rank, i) for i in range(4)]
    assert group.call(("echo", 0)) == [(0, "echo", 0), (1, "echo", 0), (2, "echo", 0)]  # the same processes serve on


def test_the_workers_import_neither_torch_nor_the_engine(groups):
    """A worker runs lifecycle.py as a file: importing engine.runtime.lifecycle would import
    engine/__init__ and, with it, torch."""
    assert groups().call(("modules", None)) == [[], []]


def test_each_rank_gets_its_environment_made_anew_at_each_start(groups):
    starts = []

    def environments():
        starts.append(len(starts))
        return [{"LIFECYCLE_TEST": f"start {starts[-1]} rank {rank}"} for rank in range(2)]

    group = groups(environments=environments)
    assert group.call(("environment", None)) == ["start 0 rank 0", "start 0 rank 1"]
    group.close()
    assert group.call(("environment", None)) == ["start 1 rank 0", "start 1 rank 1"]


def test_a_stop_lands_on_the_same_check_for_every_rank():
    """Rank 0 has made 5 checks, rank 1 only 3, when the stop comes: both stop at check 6, so
    neither leaves a forward that the other is still in."""
    flags = StopFlags.new(multiprocessing.get_context("spawn"), 2)
    flags.reset()
    ahead, behind = RankCancel(flags, 0), RankCancel(flags, 1)
    assert not any(ahead.is_set() for _ in range(5)) and not any(behind.is_set() for _ in range(3))
    flags.stop()
    assert ahead.is_set()
    assert [behind.is_set() for _ in range(3)] == [False, False, True]


def test_a_cancel_stops_every_rank_at_the_same_check_and_the_group_goes_on(groups):
    """The ranks check forever (only a stop ends them); the cancel is set on reading rank 0's third check."""
    group = groups(3)
    group.start()
    pids, cancel, seen = group.pids, threading.Event(), []

    def deliver(rank, message):
        seen.append(message[1])
        if message[1] == 3:
            cancel.set()

    replies = group.call(("count", None), deliver=deliver, cancel=cancel)
    assert replies[0] == replies[1] == replies[2] and replies[0][0] == "stopped" and replies[0][1] > 3
    assert seen == list(range(1, len(seen) + 1))
    assert group.pids == pids and group.call(("echo", 0))[1] == (1, "echo", 0)


def test_a_deliver_that_raises_stops_the_ranks_and_its_exception_comes_back(groups):
    group = groups()
    group.start()
    pids = group.pids

    def deliver(rank, message):
        if message[1] == 2:
            raise ValueError("the viewer broke")

    with pytest.raises(ValueError, match="the viewer broke"):
        group.call(("count", None), deliver=deliver)
    assert group.pids == pids  # every rank stopped and answered: the group stays
    assert group.call(("echo", 0)) == [(0, "echo", 0), (1, "echo", 0)]


def test_a_failing_rank_is_one_line_ends_the_group_and_the_next_call_starts_a_fresh_one(groups):
    group = groups()
    first = group.call(("pid", None))
    assert sorted(first) == sorted(group.pids)
    with pytest.raises(EngineError) as failure:
        group.call(("fail", 1))
    assert str(failure.value) == "worker rank 1 failed: ValueError: told to fail"
    assert group.pids == [] and _gone(first)  # a failure ends the whole group
    second = group.call(("pid", None))  # ... and the next call starts a fresh one
    assert len(set(second)) == 2 and not set(second) & set(first)


def test_a_rank_that_dies_mid_call_is_one_line_and_the_next_call_starts_a_fresh_one(groups):
    group = groups()
    first = group.call(("pid", None))
    with pytest.raises(EngineError, match=r"^worker rank 1 died \(exit code 3\)$"):
        group.call(("die", 1))
    assert group.pids == [] and _gone(first)
    assert not set(group.call(("pid", None))) & set(first)


def test_a_rank_that_cannot_load_is_one_line_and_leaves_no_process(groups):
    before = _children()
    group = groups(3, "cannot load 1")
    with pytest.raises(EngineError) as failure:
        group.start()
    assert str(failure.value) == "worker rank 1 failed: ValueError: no shard for rank 1"
    assert group.pids == [] and _children() == before


def test_a_rank_that_never_gets_ready_is_one_line_after_the_bound_and_leaves_no_process(groups):
    before = _children()
    group = groups(2, "hangs loading 1", ready_within=1.0)
    with pytest.raises(EngineError) as failure:
        group.start()
    # rank 0 is named too if it was not ready by then either (a loaded machine): the outcome is the same
    assert re.fullmatch(r"worker ranks? (0, )?1 did not get ready within 1 s; the worker processes were ended", str(failure.value))
    assert group.pids == [] and _children() == before


def test_a_frozen_rank_cannot_hold_stop(groups):
    """Rank 1 freezes away from its pipe and its checks; the cancel, set once it said so, ends the
    call within the grace: one line naming it, and no process left."""
    before = _children()
    group = groups(2, stop_grace=1.0)
    group.start()
    pids, cancel = group.pids, threading.Event()

    def deliver(rank, message):
        if message == ("frozen", 1):
            cancel.set()

    with pytest.raises(EngineError) as failure:
        group.call(("count", 1), deliver=deliver, cancel=cancel)
    assert re.fullmatch(r"worker ranks? (0, )?1 did not stop within 1 s of the stop; the worker processes were ended", str(failure.value))
    assert group.pids == [] and _children() == before and _gone(pids)
    assert group.call(("echo", 0)) == [(0, "echo", 0), (1, "echo", 0)]  # a fresh group


def test_close_ends_the_workers_and_a_later_call_starts_a_fresh_group(groups):
    group = groups()
    first = group.call(("pid", None))
    group.close()
    assert group.pids == [] and _gone(first)
    assert not set(group.call(("pid", None))) & set(first)


CALLER = """
import importlib.util, os, signal, sys, threading
from functools import partial

# lifecycle.py by its file, as its workers run it: this caller imports no torch either
spec = importlib.util.spec_from_file_location("lifecycle", sys.argv[1])
lifecycle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lifecycle)
from tests import lifecycle_workers

group = lifecycle.ProcessGroup(2, partial(lifecycle_workers.load, ""))
group.start()
frozen = threading.Event()
deliver = lambda rank, message: frozen.set() if message == ("frozen", 1) else None
threading.Thread(target=group.call, args=(("count", 1), deliver), daemon=True).start()
frozen.wait()  # rank 1 frozen away from its pipe, rank 0 checking
print(" ".join(map(str, group.pids)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_workers_end_when_their_caller_dies_a_frozen_one_too():
    caller = subprocess.run([sys.executable, "-c", CALLER, lifecycle.__file__], cwd=ROOT, capture_output=True, text=True, timeout=LIMIT_S)
    pids = [int(p) for p in caller.stdout.split()]
    assert caller.returncode == -9 and len(pids) == 2, caller.stderr[-2000:]
    assert_processes_end(pids, LIMIT_S, "its caller")
