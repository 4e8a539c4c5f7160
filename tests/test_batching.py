"""Concurrent runs batched into one engine call (engine/serving/batcher.py, through the app's
adapter dinfer_viz/live/batching.py): each row's header,
records, tokens and NFE equal its solo run's, runs wait and join by the rule, and nothing here
depends on timing (the host's lock is held while the runs queue up)."""

from __future__ import annotations

import queue
import threading

import pytest

from dinfer_viz.live.batching import RowView, RunBatcher, batch_key
from dinfer_viz.live.events import Finished, Started, Waiting
from dinfer_viz.live.host import EngineHost, ModelSpec
from engine import Engine, GenerationConfig, RunHooks
from engine.cli import DEFAULT_MODEL

# held-out and training prompts of the same length (12 characters), different answers and speeds
PROMPTS = ["Q: ?+?=57 A:", "Q: ?+?=12 A:", "Q: ?+?=83 A:", "Q: 14+5=? A:"]
SPEC = ModelSpec(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(DEFAULT_MODEL)


def solo(engine: Engine, prompt: str, config: GenerationConfig):
    return engine.generate(prompt, config, hooks=RunHooks(trace=True))


@pytest.mark.parametrize(
    "settings",
    [
        dict(decoder="threshold", threshold=0.9),
        dict(decoder="threshold", threshold=0.5, cache="dual"),
        dict(decoder="fixed", steps=16, cache="prefix"),
        dict(decoder="hierarchical"),
        dict(decoder="credit", cache="dual"),
        dict(decoder="factor", factor=2.0),
    ],
)
def test_each_row_of_a_batch_is_its_solo_run(engine, settings):
    config = GenerationConfig(gen_length=32, block_length=8, **settings)
    encoded = [engine.encode(p) for p in PROMPTS]
    assert len({len(ids) for ids in encoded}) == 1
    views: list[RowView] = []
    out = engine.generate_ids(encoded, config, hooks=RunHooks(trace=True, on_start=lambda header: views.extend(RowView(header, r) for r in range(len(PROMPTS))), on_iteration=lambda rec: [view.record(rec) for view in views]))
    for row, (prompt, view) in enumerate(zip(PROMPTS, views)):
        alone = solo(engine, prompt, config)
        mine = view.result(out, engine.decode(out.token_ids[row]))
        assert mine.text == alone.text
        assert mine.output.token_ids == alone.output.token_ids
        assert mine.output.stats.nfe == alone.output.stats.nfe and mine.output.stats.tokens == alone.output.stats.tokens
        ours, theirs = mine.output.trace, alone.output.trace
        assert [(r.iteration, r.block, r.committed, r.forced, r.top1) for r in ours.iterations] == [
            (r.iteration, r.block, r.committed, r.forced, r.top1) for r in theirs.iterations
        ]
        assert ours.initial == theirs.initial and ours.final == theirs.final and ours.prompt_lengths == theirs.prompt_lengths
    # the rows really differ in speed, so some records were dropped for the faster rows
    assert len({view.kept for view in views}) > 1


def test_what_would_change_the_tokens_is_never_batched():
    base = GenerationConfig()
    assert batch_key(SPEC, base) is not None and batch_key(SPEC, base) == batch_key(SPEC, GenerationConfig())
    assert batch_key(SPEC, base) != batch_key(SPEC, base.replace(threshold=0.5))
    assert batch_key(ModelSpec("other"), base) != batch_key(SPEC, base)
    for changes in (dict(temperature=0.7), dict(decoder="fixed", remasking="random"), dict(smoothing=True), dict(refresh_every=2, cache="dual"), dict(cache="vicinity"), dict(unroll=True)):
        assert batch_key(SPEC, base.replace(**changes)) is None, changes


def test_only_decoders_that_declare_row_wise_are_batched(gate_decoders):
    """The built-ins declare it; a plug-in that does not (or a subclass of a built-in that changes
    its rule without saying so) runs alone."""
    from engine.registry import decoder_names
    from tests.turnstile_decoder import TurnstileDecoder  # a FixedStepDecoder subclass

    builtin = ("fixed", "threshold", "hierarchical", "credit", "factor")
    assert all(batch_key(SPEC, GenerationConfig(decoder=name)) is not None for name in builtin)
    assert TurnstileDecoder.name in decoder_names() and not TurnstileDecoder.row_wise
    assert batch_key(SPEC, GenerationConfig(decoder=TurnstileDecoder.name)) is None


def drain(events: "queue.SimpleQueue[object]") -> list[object]:
    seen = []
    while True:
        event = events.get(timeout=600)  # a hang guard only: the engine always ends a run
        seen.append(event)
        if isinstance(event, Finished) or type(event).__name__ == "Failed":
            return seen


def test_runs_waiting_for_the_engine_join_one_batch_and_get_their_own_rows(engine):
    host = EngineHost(SPEC)
    host.preload()
    batcher = RunBatcher(host)
    config = GenerationConfig(gen_length=32, block_length=8)
    prompts = PROMPTS[:3] + ["Q: 123+45=? A:"]  # the last is longer: it cannot join the others
    with host.lock:  # the engine is busy while they all arrive
        queues = [batcher.submit(SPEC, p, config, threading.Event()) for p in prompts]
        waiting = [q.get(timeout=600) for q in queues]
    assert all(isinstance(w, Waiting) for w in waiting)
    runs = [drain(q) for q in queues]
    sizes = [next(e.batch for e in run if isinstance(e, Started)) for run in runs]
    assert sizes == [3, 3, 3, 1]
    for prompt, run in zip(prompts, runs):
        result = run[-1].value
        alone = solo(engine, prompt, config)
        assert result.text == alone.text and result.output.stats.nfe == alone.output.stats.nfe
        records = [e for e in run if type(e).__name__ == "IterationRecord"]
        assert [r.committed for r in records] == [r.committed for r in alone.output.trace.iterations]


def test_a_visitor_who_stops_leaves_the_batch_and_the_others_finish(engine):
    host = EngineHost(SPEC)
    host.preload()
    batcher = RunBatcher(host)
    config = GenerationConfig(gen_length=32, block_length=8)
    stop = threading.Event()
    with host.lock:
        first = batcher.submit(SPEC, PROMPTS[0], config, stop)
        second = batcher.submit(SPEC, PROMPTS[1], config, threading.Event())
        assert isinstance(first.get(timeout=600), Waiting) and isinstance(second.get(timeout=600), Waiting)
        stop.set()  # the first visitor leaves before the engine frees
    run = drain(second)
    assert next(e.batch for e in run if isinstance(e, Started)) == 1
    assert run[-1].value.text == solo(engine, PROMPTS[1], config).text


def test_two_sessions_of_the_app_share_one_batch_and_each_gets_its_own_text(engine):
    """Through the Run tab's handler (what /run calls): both runs wait while the engine is busy,
    then say they were batched, and each ends with its solo text."""
    from dinfer_viz.tabs.run import RUN_VIEW
    from dinfer_viz.ui import Handlers

    host = EngineHost(SPEC)
    host.preload()
    handlers = Handlers(host)
    settings = {"config": {"gen_length": 32, "block_length": 8}}
    finals: dict[str, tuple] = {}
    messages: dict[str, list[str]] = {p: [] for p in PROMPTS[:2]}
    waiting = threading.Barrier(3)

    def session(prompt: str) -> None:
        for out in handlers.run(prompt, settings):
            view = dict(zip(RUN_VIEW, out))
            message = str(view.get("message") or "")
            messages[prompt].append(message)
            if message.startswith("waiting"):
                waiting.wait()
            finals[prompt] = view

    with host.lock:
        threads = [threading.Thread(target=session, args=(p,)) for p in PROMPTS[:2]]
        for t in threads:
            t.start()
        waiting.wait(timeout=600)  # both sessions are queued behind the busy engine
    for t in threads:
        t.join(timeout=600)
    config = GenerationConfig(gen_length=32, block_length=8)
    for prompt in PROMPTS[:2]:
        assert any("batched with 1 other session's run" in m for m in messages[prompt]), messages[prompt]
        assert finals[prompt]["text"] == solo(engine, prompt, config).text


def test_after_each_batch_the_allocator_gives_its_freed_pages_back(engine, monkeypatch):
    """glibc keeps freed pages in its arenas; the batcher returns them after every batch, so a
    server's memory stays flat across many shapes of request (benchmarks/load.py)."""
    import platform

    from engine.serving import batcher as batcher_module
    from engine.serving.heap import release_freed_memory

    if platform.libc_ver()[0] == "glibc":
        assert release_freed_memory()
    calls: list[int] = []
    trimmed = threading.Event()

    def spy() -> bool:
        calls.append(1)
        trimmed.set()
        return True

    monkeypatch.setattr(batcher_module, "release_freed_memory", spy)
    host = EngineHost(SPEC)
    host.preload()
    batcher = RunBatcher(host)
    config = GenerationConfig(gen_length=16, block_length=8)
    with host.lock:
        queues = [batcher.submit(SPEC, p, config, threading.Event()) for p in PROMPTS[:2]]
        assert all(isinstance(q.get(timeout=600), Waiting) for q in queues)
    for q in queues:
        drain(q)
    assert trimmed.wait(600)  # the leader trims once it let go of the engine, after the news
    assert calls == [1]  # one batch of two rows: one trim, by its leader
