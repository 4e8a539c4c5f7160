"""Forward lanes (engine/serving/scheduler.py, `engine serve --forward-lanes`): on a CPU, rounds of
forwards run at once, each on a thread of its own, so a request that arrives while a long row's
forward runs has its own forward run beside it. Every row still gets its solo run's tokens.
Nothing here reads a clock: one row's forward is held inside the model call until the test lets
it go, and what the other rows did meanwhile is read from their sinks."""

from __future__ import annotations

import threading

import pytest
import torch

from engine import Engine, EngineError, GenerationConfig
from engine.__main__ import main as cli_main
from engine.cli import DEFAULT_MODEL
from engine.serving import scheduler
from engine.serving.batcher import BatchRequest
from engine.serving.packed import query_positions
from engine.serving import served
from engine.serving.scheduler import ContinuousBatcher
from engine.serving.served import CPU_FORWARD_LANES, CPU_FORWARD_POSITIONS, batcher_for, served_lanes

from .test_serve import until
from .test_serve_continuous import Collect
from .test_serve_short_first import LONG, SHORT, assert_solo, positions


def held_long_row(monkeypatch, engine: Engine, lanes: int) -> tuple[ContinuousBatcher, list[Collect], threading.Event]:
    """LONG submitted and its first forward held inside the model call, then SHORT submitted; the
    batcher, their sinks, and the event that lets the held forward go."""
    entered, go = threading.Event(), threading.Event()
    run_calls, long_positions = scheduler.run_calls, positions(engine, LONG)

    def gated(model, method, inputs):
        if not go.is_set() and any(query_positions(method, i) == long_positions for i in inputs):
            entered.set()
            go.wait(120)  # a bound on a broken test, not a timing: the test sets it
        return run_calls(model, method, inputs)

    monkeypatch.setattr(scheduler, "run_calls", gated)
    batcher = ContinuousBatcher(threading.Lock(), lambda members: engine, 8, lanes=lanes)
    sinks = [Collect(), Collect()]
    batcher.submit(BatchRequest(LONG[0], LONG[1], threading.Event(), sinks[0], None))
    assert entered.wait(120)
    batcher.submit(BatchRequest(SHORT[0], SHORT[1], threading.Event(), sinks[1], None))
    return batcher, sinks, go


def test_a_request_arriving_while_a_long_forward_runs_is_answered_beside_it(monkeypatch):
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    _, sinks, go = held_long_row(monkeypatch, engine, lanes=2)
    assert sinks[1].done.wait(120)  # its whole run while the long row's first forward is still held
    assert not sinks[0].done.is_set()
    go.set()
    assert sinks[0].done.wait(120)
    assert_solo(engine, [LONG, SHORT], sinks)


def test_one_lane_runs_one_round_at_a_time(monkeypatch):
    """The control: with one lane the short request waits for the held forward."""
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    batcher, sinks, go = held_long_row(monkeypatch, engine, lanes=1)
    until(lambda: batcher.running == 2 and batcher.scheduler.rows_at_forward == 2)  # the long row's held, the short one's asked
    short = next(s for s in batcher.scheduler.running if s.request.sink is sinks[1])
    assert short.call is not None and not sinks[1].done.is_set()  # asking, and no lane free to take it
    go.set()
    assert sinks[0].done.wait(120) and sinks[1].done.wait(120)
    assert_solo(engine, [LONG, SHORT], sinks)


def test_each_lane_ends_with_the_last_row_and_the_next_rows_start_them_again():
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    batcher = ContinuousBatcher(threading.Lock(), lambda members: engine, 8, lanes=2)
    for _ in range(2):
        sinks = [Collect(), Collect()]
        for (prompt, config), sink in zip((SHORT, LONG), sinks):
            batcher.submit(BatchRequest(prompt, config, threading.Event(), sink, None))
        until(lambda: len(batcher.scheduler.threads) == 2)
        threads = list(batcher.scheduler.threads)
        for sink in sinks:
            sink.done.wait()
        until(lambda: batcher.running == 0 and not any(t.is_alive() for t in threads))
        assert batcher.scheduler.threads == []
        assert_solo(engine, [SHORT, LONG], sinks)


def test_the_server_runs_a_lane_per_threads_worth_of_cores_on_a_cpu(monkeypatch):
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    for cores, threads, lanes in ((1, 1, 1), (2, 1, 2), (2, 2, 1), (16, 1, CPU_FORWARD_LANES), (16, 4, CPU_FORWARD_LANES)):
        monkeypatch.setattr(served.os, "cpu_count", lambda: cores)
        monkeypatch.setattr(served.torch, "get_num_threads", lambda: threads)
        assert served_lanes(None, "continuous", engine) == served_lanes(None, "short-first", engine) == lanes, (cores, threads)
    assert served_lanes(None, "lockstep", engine) == 1
    assert served_lanes(3, "continuous", engine) == 3
    compiled = Engine(DEFAULT_MODEL, compile=True)  # static-shape forwards keep buffers across calls: one lane
    assert served_lanes(None, "continuous", compiled) == 1
    with pytest.raises(EngineError, match=r"^forward lanes need a CPU engine's own forwards"):
        batcher_for("continuous", compiled, 4, lambda rows: None, None, 2)


def test_lanes_are_refused_in_one_line_where_no_round_takes_them(capsys):
    engine = Engine(DEFAULT_MODEL)
    assert batcher_for("continuous", engine, 4, lambda rows: None, None, 2).scheduler.lanes == 2
    with pytest.raises(EngineError, match=r"^forward lanes must be >= 1, got 0$"):
        batcher_for("continuous", engine, 4, lambda rows: None, None, 0)
    assert cli_main(["serve", "--port", "1", "--batching", "lockstep", "--forward-lanes", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: forward lanes needs continuous or short-first batching") and "\n" not in err, err
    assert cli_main(["serve", "--port", "1", "--forward-lanes", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: forward lanes must be >= 1, got 0"



# rows that need many forwards (a fixed step count, no early stop), of two prompt lengths: a
# row's forwards are told apart by their positions
STEADY = GenerationConfig(gen_length=256, block_length=32, cache="none", use_chat_template=False, decoder="fixed", steps=16, early_stop=False)
STEADY_ROWS = [("Q: ?+?=57 A:", STEADY), ("Q: ?+?=57, ?+?=9 A:", STEADY)]


class Gate:
    """While closed, holds the forwards of the row of `positions` inside the model call once
    `after` of them have run."""

    def __init__(self, positions: int, after: int = 0) -> None:
        self.positions, self.after, self.seen, self.held = positions, after, 0, 0
        self.open, self.lock = threading.Event(), threading.Lock()

    def check(self, method: str, inputs: list) -> None:
        if not any(query_positions(method, i) == self.positions for i in inputs):
            return
        with self.lock:
            self.seen += 1
            if self.seen <= self.after or self.open.is_set():
                return
            self.held += 1
        assert self.open.wait(120)  # a bound on a broken test, not a timing: the test opens it
        with self.lock:
            self.held -= 1


def cut_in_setup(monkeypatch, engine: Engine) -> tuple[ContinuousBatcher, list[Collect], list[Gate], Gate]:
    """STEADY_ROWS decoding, one a lane, under a budget, each held inside the model call from its
    fourth forward (every lane busy with rows that have had 3); then SHORT submitted, its
    forwards held too (every gate closed). The batcher, the sinks (the steady rows', SHORT's), the
    steady rows' gates and SHORT's."""
    steady = [Gate(positions(engine, row), after=3) for row in STEADY_ROWS]
    short_gate = Gate(positions(engine, SHORT))
    assert len({g.positions for g in steady + [short_gate]}) == 3
    run_calls = scheduler.run_calls

    def gated(model, method, inputs):
        for gate in steady + [short_gate]:
            gate.check(method, inputs)
        return run_calls(model, method, inputs)

    monkeypatch.setattr(scheduler, "run_calls", gated)
    batcher = ContinuousBatcher(threading.Lock(), lambda members: engine, 8, forward_positions=CPU_FORWARD_POSITIONS, lanes=2)
    assert batcher.scheduler.cut_in
    sinks = [Collect(), Collect(), Collect()]
    for (prompt, config), sink in zip(STEADY_ROWS, sinks):
        batcher.submit(BatchRequest(prompt, config, threading.Event(), sink, None))
    until(lambda: all(g.held == 1 for g in steady))  # both lanes inside a round
    batcher.submit(BatchRequest(SHORT[0], SHORT[1], threading.Event(), sinks[2], None))
    return batcher, sinks, steady, short_gate


def test_a_new_request_cuts_in_while_every_lane_runs_rows_that_have_had_more_forwards(monkeypatch):
    """Its forwards run on the cut-in thread while both lanes' rounds are held: it is answered
    before either round ends (least attained service across lanes)."""
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    batcher, sinks, steady, short_gate = cut_in_setup(monkeypatch, engine)
    short_gate.open.set()
    assert sinks[2].done.wait(120) and all(g.held == 1 for g in steady) and not any(s.done.is_set() for s in sinks[:2])
    for gate in steady:
        gate.open.set()
    assert all(s.done.wait(120) for s in sinks)
    assert_solo(engine, STEADY_ROWS + [SHORT], sinks)


def test_one_lane_pauses_between_layers_while_a_cut_in_runs_and_the_other_goes_on(monkeypatch):
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    batcher, sinks, steady, short_gate = cut_in_setup(monkeypatch, engine)
    s = batcher.scheduler
    until(lambda: short_gate.held == 1)  # the cut-in's forward held, on the cut-in thread
    assert s._cutting_in and s._rounds == 2
    for gate in steady:  # both lanes' forwards start: the first to reach a layer pauses there
        gate.open.set()
    until(lambda: s._yielded == 1)
    rows = [slot for slot in s.running if slot.request.sink in sinks[:2]]
    before = sum(slot.forwards for slot in rows)
    until(lambda: sum(slot.forwards for slot in rows) >= before + 2)  # the other lane goes on
    assert s._yielded == 1 and s._cutting_in and not sinks[2].done.is_set()
    short_gate.open.set()
    assert all(x.done.wait(120) for x in sinks)
    assert s._yielded == 0 and not s._cutting_in
    assert_solo(engine, STEADY_ROWS + [SHORT], sinks)


def test_only_lanes_under_a_budget_cut_in():
    engine = Engine(DEFAULT_MODEL)
    for budget, lanes, cuts_in in ((CPU_FORWARD_POSITIONS, 2, True), (None, 2, False), (CPU_FORWARD_POSITIONS, 1, False)):
        assert ContinuousBatcher(threading.Lock(), lambda members: engine, 8, forward_positions=budget, lanes=lanes).scheduler.cut_in is cuts_in
