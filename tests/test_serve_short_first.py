"""Short first (`engine serve --batching short-first`, engine/serving/scheduler.py): a short row's
forwards run without a much longer row's positions, the longer row joins at the latest after
MAX_SKIPPED of them, and every row still gets its solo run's tokens. Nothing here reads a clock:
the rows are held until both wait on the scheduler, and the rounds are read from the forwards the
scheduler runs."""

from __future__ import annotations

import threading

import pytest
import torch

from engine import Engine, EngineError, GenerationConfig
from engine.cli import DEFAULT_MODEL
from engine.serving.batcher import BatchRequest
from engine.serving.scheduler import MAX_SKIPPED, SHORT_SHARE, ContinuousBatcher, batcher_for

from .test_serve import until
from .test_serve_continuous import Collect

SHORT = ("Q: 14+5=? A:", GenerationConfig(gen_length=32, block_length=32, cache="none", use_chat_template=False))
LONG = ("Q: ?+?=57 A:", GenerationConfig(gen_length=256, block_length=32, cache="none", use_chat_template=False))


def rounds_of(short_first: bool) -> tuple[list[frozenset[str]], list[Collect], Engine]:
    """SHORT and LONG submitted while the engine is held, then decoded; each round's rows (by name)."""
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    rounds: list[frozenset[str]] = []
    names: dict[int, str] = {}

    def on_forward(rows: int) -> None:  # inside the round (the scheduler's `_taken` is its rows)
        rounds.append(frozenset(names[id(slot.request.sink)] for slot in batcher.scheduler._taken))

    batcher = ContinuousBatcher(threading.Lock(), lambda members: engine, 8, on_forward, short_first=short_first)
    sinks = [Collect(), Collect()]
    names.update({id(sinks[0]): "short", id(sinks[1]): "long"})
    with batcher.lock:
        for (prompt, config), sink in zip((SHORT, LONG), sinks):
            batcher.submit(BatchRequest(prompt, config, threading.Event(), sink, None))
        until(lambda: batcher.running == 2 and batcher.scheduler.rows_at_forward == 2)
    for sink in sinks:
        sink.done.wait()
    return rounds, sinks, engine


def test_the_rows_differ_past_the_share():
    lengths = [len(Engine(DEFAULT_MODEL).encode(p, False)) + c.gen_length for p, c in (SHORT, LONG)]
    assert lengths[1] > SHORT_SHARE * lengths[0]


@pytest.mark.parametrize("short_first", [True, False], ids=["short-first", "continuous"])
def test_a_short_rows_forwards_leave_the_long_row_out_at_most_max_skipped_times_in_a_row(short_first):
    rounds, sinks, engine = rounds_of(short_first)
    for (prompt, config), sink in zip((SHORT, LONG), sinks):  # each row's tokens are its solo run's
        alone = engine.generate(prompt, config)
        assert sink.error is None and sink.result.output.token_ids == alone.output.token_ids, prompt
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
