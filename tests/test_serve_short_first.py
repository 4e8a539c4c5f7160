"""Which rows a round takes (engine/serving/scheduler.py). Short first (`engine serve --batching
short-first`): a short row's forwards run without a much longer row's positions, the longer row
joins at the latest after MAX_SKIPPED of them. A position budget (`--forward-positions`): the rows
with the fewest forwards first while their positions fit, a row over it alone. Every row still gets
its solo run's tokens. Nothing here reads a clock: the rows are held until all wait on the
scheduler, and the rounds are read from the forwards the scheduler runs."""

from __future__ import annotations

import threading

import pytest
import torch

from engine import Engine, EngineError, GenerationConfig
from engine.__main__ import main as cli_main
from engine.cli import DEFAULT_MODEL
from engine.serving.batcher import MAX_BATCH, BatchRequest
from engine.serving.scheduler import MAX_SKIPPED, SHORT_SHARE, ContinuousBatcher
from engine.serving.served import BUDGET_MAX_ROWS, CPU_FORWARD_POSITIONS, batcher_for, served_budget, served_max_batch

from .test_serve import until
from .test_serve_continuous import Collect

SHORT = ("Q: 14+5=? A:", GenerationConfig(gen_length=32, block_length=32, cache="none", use_chat_template=False))
LONG = ("Q: ?+?=57 A:", GenerationConfig(gen_length=256, block_length=32, cache="none", use_chat_template=False))
OTHER_SHORT = ("Q: 23+4=? A:", SHORT[1])


def positions(engine: Engine, request: tuple[str, GenerationConfig]) -> int:
    """A row's prompt and canvas: what short first and the budget count."""
    return len(engine.encode(request[0], False)) + request[1].gen_length


def rounds_of(short_first: bool, forward_positions: int | None = None, requests: dict | None = None) -> tuple[list[frozenset[str]], list[Collect], Engine]:
    """`requests` (name: request; SHORT and LONG by default) submitted in order while the engine is
    held, then decoded; each round's rows (by name), each request's sink."""
    requests = requests or {"short": SHORT, "long": LONG}
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    rounds: list[frozenset[str]] = []
    names: dict[int, str] = {}

    def on_forward(rows: int) -> None:  # inside the round (the scheduler's `_taken` is its rows)
        rounds.append(frozenset(names[id(slot.request.sink)] for slot in batcher.scheduler._taken))

    batcher = ContinuousBatcher(threading.Lock(), lambda members: engine, 8, on_forward, short_first=short_first, forward_positions=forward_positions)
    sinks = [Collect() for _ in requests]
    names.update({id(sink): name for sink, name in zip(sinks, requests)})
    with batcher.lock:
        for (prompt, config), sink in zip(requests.values(), sinks):
            batcher.submit(BatchRequest(prompt, config, threading.Event(), sink, None))
        until(lambda: batcher.running == len(requests) and batcher.scheduler.rows_at_forward == len(requests))
    for sink in sinks:
        sink.done.wait()
    return rounds, sinks, engine


def assert_solo(engine: Engine, requests: list[tuple[str, GenerationConfig]], sinks: list[Collect]) -> None:
    for (prompt, config), sink in zip(requests, sinks):  # each row's tokens are its solo run's
        alone = engine.generate(prompt, config)
        assert sink.error is None and sink.result.output.token_ids == alone.output.token_ids, prompt


def test_the_rows_differ_past_the_share():
    lengths = [len(Engine(DEFAULT_MODEL).encode(p, False)) + c.gen_length for p, c in (SHORT, LONG)]
    assert lengths[1] > SHORT_SHARE * lengths[0]


@pytest.mark.parametrize("short_first", [True, False], ids=["short-first", "continuous"])
def test_a_short_rows_forwards_leave_the_long_row_out_at_most_max_skipped_times_in_a_row(short_first):
    rounds, sinks, engine = rounds_of(short_first)
    assert_solo(engine, [SHORT, LONG], sinks)
    short_rounds = [r for r in rounds if "short" in r]
    if not short_first:  # the control: both rows asked for the first forward, and it took both
        assert short_rounds[0] == {"short", "long"}
        return
    # the first forward, both asking, ran the short row alone; the long row joined a forward of the
    # short row's only after MAX_SKIPPED rounds left out since it last ran (alone or not)
    assert short_rounds[0] == {"short"}
    skipped = 0
    for r in rounds:
        if "long" in r:
            assert "short" not in r or skipped >= MAX_SKIPPED, (rounds, skipped)
            skipped = 0
        elif "short" in r:
            skipped += 1
    assert any(r == {"long"} for r in rounds)  # the long row went on alone once the short one left


def test_the_server_takes_short_first_by_name_and_refuses_an_unknown_batching():
    engine = Engine(DEFAULT_MODEL)
    assert batcher_for("short-first", engine, 4, lambda rows: None).scheduler.short_first
    assert not batcher_for("continuous", engine, 4, lambda rows: None).scheduler.short_first
    with pytest.raises(EngineError, match=r"^batching must be one of continuous, lockstep, short-first, got 'fifo'$"):
        batcher_for("fifo", engine, 4, lambda rows: None)


@pytest.mark.parametrize("budget", [True, False], ids=["budget", "no-budget"])
def test_a_position_budget_takes_the_fewest_forwards_first_and_a_row_over_it_alone(budget):
    engine = Engine(DEFAULT_MODEL)
    requests = {"short": SHORT, "other": OTHER_SHORT, "long": LONG}
    sizes = {name: positions(engine, r) for name, r in requests.items()}
    limit = sizes["short"] + sizes["other"]
    assert sizes["long"] > limit  # the long row fits with neither short one
    rounds, sinks, engine = rounds_of(False, limit if budget else None, requests)
    assert_solo(engine, list(requests.values()), sinks)
    if not budget:  # the control: every row asked for the first forward, and it took all three
        assert rounds[0] == set(requests)
        return
    # all three asked, none had a forward: the two short rows fit, in admission order, the long one
    # not; then the long row has had the fewest and goes first, over the budget, so alone
    assert rounds[:2] == [{"short", "other"}, {"long"}], rounds[:6]
    since = dict.fromkeys(requests, 0)  # rounds without each row since its last: at least the scheduler's count
    for r in rounds:
        if sum(sizes[name] for name in r) > limit and len(r) > 1:  # over the budget: a row left out too long joined
            assert any(since[name] >= MAX_SKIPPED for name in r), (rounds, since)
        for name in since:
            since[name] = 0 if name in r else since[name] + 1


def test_a_budget_counts_the_positions_a_forward_computes_so_cached_rows_share_their_block_forwards():
    """Two rows whose prompts and canvases together exceed the budget, with a dual cache: their
    first forwards compute the whole sequence (one row a round), their later ones a block each,
    which fit together."""
    engine = Engine(DEFAULT_MODEL)
    cached = GenerationConfig(gen_length=32, block_length=8, cache="dual", use_chat_template=False)
    requests = {"short": (SHORT[0], cached), "other": (OTHER_SHORT[0], cached)}
    limit = max(positions(engine, r) for r in requests.values())  # one whole row, never two
    rounds, sinks, engine = rounds_of(False, limit, requests)
    assert_solo(engine, list(requests.values()), sinks)
    assert rounds[0] == {"short"} and {"short", "other"} in rounds, rounds


def test_a_budget_is_refused_in_one_line_where_no_round_takes_it(capsys):
    engine = Engine(DEFAULT_MODEL)
    assert batcher_for("continuous", engine, 4, lambda rows: None, 256).scheduler.forward_positions == 256
    assert batcher_for("short-first", engine, 4, lambda rows: None).scheduler.forward_positions is None
    with pytest.raises(EngineError, match=r"^forward positions must be >= 1, got 0$"):
        batcher_for("continuous", engine, 4, lambda rows: None, 0)
    assert cli_main(["serve", "--port", "1", "--batching", "lockstep", "--forward-positions", "256"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: a forward positions budget needs continuous or short-first batching") and "\n" not in err, err
    assert cli_main(["serve", "--port", "1", "--forward-positions", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "error: --forward-positions must be >= 0 (0: none), got -1"


def test_the_server_budgets_a_cpu_engines_rounds_unless_told_otherwise():
    engine = Engine(DEFAULT_MODEL)  # on the CPU, generating in this process
    assert served_budget(None, "continuous", engine) == served_budget(None, "short-first", engine) == CPU_FORWARD_POSITIONS
    assert served_budget(None, "lockstep", engine) is None  # lockstep's batches take no budget
    assert served_budget(0, "continuous", engine) is None and served_budget(100, "continuous", engine) == 100
    engine.model.to("meta")  # an engine whose runs are elsewhere (a parallel engine's skeleton): none
    assert served_budget(None, "continuous", engine) is None


def test_under_a_budget_the_server_decodes_more_rows_at_once_unless_told_otherwise():
    """Rows past a round wait for a forward, fewest forwards first, not for a slot in arrival order."""
    assert served_max_batch(None, CPU_FORWARD_POSITIONS) == BUDGET_MAX_ROWS > MAX_BATCH
    assert served_max_batch(None, None) == MAX_BATCH  # no budget (a GPU, lockstep, --forward-positions 0)
    assert served_max_batch(4, CPU_FORWARD_POSITIONS) == served_max_batch(4, None) == 4


def test_a_row_arriving_while_another_decodes_has_its_first_forward_alone_though_both_fit():
    """The fewest forwards, and only those: the round a new request's first forward runs in takes
    no row that has had more, whatever room the budget has (least attained service)."""
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    rounds: list[frozenset[str]] = []
    sinks = {"long": Collect(), "short": Collect()}
    names = {id(sink): name for name, sink in sinks.items()}

    def on_forward(rows: int) -> None:  # inside the round (the scheduler's `_taken` is its rows)
        rounds.append(frozenset(names[id(slot.request.sink)] for slot in batcher.scheduler._taken))

    batcher = ContinuousBatcher(threading.Lock(), lambda members: engine, 8, on_forward, forward_positions=10 * positions(engine, LONG))
    batcher.submit(BatchRequest(LONG[0], LONG[1], threading.Event(), sinks["long"], None))
    until(lambda: len(rounds) >= 2)  # the long row has had forwards
    with batcher.lock:  # no round starts until the short row asks too
        batcher.submit(BatchRequest(SHORT[0], SHORT[1], threading.Event(), sinks["short"], None))
        until(lambda: batcher.running == 2 and batcher.scheduler.rows_at_forward == 2)
    for sink in sinks.values():
        sink.done.wait()
    assert next(r for r in rounds if "short" in r) == {"short"}, rounds
    assert_solo(engine, [LONG, SHORT], [sinks["long"], sinks["short"]])


class HeldOnTheHost(Collect):
    """A sink whose row, once `hold` is set, stops on the host at its next record (between its
    forwards: asking for none) until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hold, self.held, self.release = threading.Event(), threading.Event(), threading.Event()

    def record(self, record) -> None:
        super().record(record)
        if self.hold.is_set():
            self.held.set()
            self.release.wait()


def test_a_new_rows_first_forward_waits_for_no_row_on_the_host_that_has_had_more():
    """A straggler's wait (a forward's time for a row still on the host) is only for a row the
    round could take: under a budget, none that has had more forwards than the rows asking. The
    last round is made to look an hour long, so a wait for the held row would outlast the test."""
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    rounds: list[frozenset[str]] = []
    sinks = {"long": HeldOnTheHost(), "short": Collect()}
    names = {id(sink): name for name, sink in sinks.items()}

    def on_forward(rows: int) -> None:
        rounds.append(frozenset(names[id(slot.request.sink)] for slot in batcher.scheduler._taken))

    batcher = ContinuousBatcher(threading.Lock(), lambda members: engine, 8, on_forward, forward_positions=CPU_FORWARD_POSITIONS)
    batcher.submit(BatchRequest(LONG[0], LONG[1], threading.Event(), sinks["long"], None))
    until(lambda: len(rounds) >= 2)
    sinks["long"].hold.set()
    until(sinks["long"].held.is_set)  # on the host, between its forwards
    before = len(rounds)
    batcher.scheduler._forward_seconds = 3600.0
    batcher.submit(BatchRequest(SHORT[0], SHORT[1], threading.Event(), sinks["short"], None))
    until(sinks["short"].done.is_set)  # every forward of the short row while the long one is held
    assert not sinks["long"].done.is_set() and rounds[before:] and all(r == {"short"} for r in rounds[before:]), rounds
    sinks["long"].release.set()
    sinks["long"].done.wait()
    assert_solo(engine, [LONG, SHORT], [sinks["long"], sinks["short"]])
