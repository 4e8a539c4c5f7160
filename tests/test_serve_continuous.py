"""Continuous batching with first-done-first-out (engine/serving/scheduler.py, packed.py): rows of
different prompt and generation lengths, decoders, cache modes and seeds share forwards, and each
still gets its solo run's tokens, forwards and records; a short request sent after long ones
finishes first. Nothing here reads a clock: the test holds the engine's lock (no model call runs)
until the scheduler's own state says every row has reached it, and the finish order is the order
in which the server stores the rows' traces."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from engine import Engine, GenerationConfig
from engine.cache import block_causal_mask
from engine.cli import DEFAULT_MODEL
from engine.hooks import RunHooks
from engine.serving.app import create_app
from engine.serving.batcher import BatchRequest
from engine.serving.packed import packed_forward
from engine.serving.scheduler import ContinuousBatcher
from engine.serving.traces import TraceStore

from .test_serve import LIMITS, Served, running, served, until  # noqa: F401 (served: the fixture, max_batch 16)

LLADA2 = "assets/tiny-llada2"


def prompts(count: int, seed: int = 0) -> list[str]:
    """`count` prompts of the embedded model's families, of many encoded lengths."""
    rng = random.Random(seed)
    shapes = [
        lambda: f"Q: {rng.randint(0, 10 ** rng.randint(1, 5))}+{rng.randint(0, 10 ** rng.randint(1, 3))}=? A:",
        lambda: f"Q: ?+?={rng.randint(0, 199)} A:",
        lambda: f"Q: {rng.randint(0, 999)}-{rng.randint(0, 99)}=? A:",
        lambda: f"Q: rhymes with {rng.choice(['cat', 'dog', 'sun', 'tree', 'moon', 'bat'])}? A:",
        lambda: f"Q: what is {rng.randint(0, 99)} plus {rng.randint(0, 99)}? then {rng.randint(0, 99)}+{rng.randint(0, 9)}=? A:",
    ]
    return [shapes[i % len(shapes)]() for i in range(count)]


class Collect:
    """A row's news, as the server's sink gets it."""

    def __init__(self) -> None:
        self.records: list = []
        self.result: Any = None
        self.error: str | None = None
        self.batch = 1
        self.done = threading.Event()

    def waiting(self) -> None:
        pass

    def started(self, header, batch: int) -> None:
        self.header = header

    def record(self, record) -> None:
        self.records.append(record)

    def batched(self, rows: int) -> None:
        self.batch = rows

    def finished(self, result) -> None:
        self.result = result
        self.done.set()

    def failed(self, message: str) -> None:
        self.error = message
        self.done.set()


def continuous(engine: Engine, rows: list[tuple[str, GenerationConfig]], max_batch: int = 8) -> list[Collect]:
    """Every row submitted at once while the engine is held, then decoded by the scheduler."""
    batcher = ContinuousBatcher(threading.Lock(), lambda members: engine, max_batch)
    sinks = [Collect() for _ in rows]
    with batcher.lock:
        for (prompt, config), sink in zip(rows, sinks):
            batcher.submit(BatchRequest(prompt, config, threading.Event(), sink, None))
        until(lambda: batcher.running == min(max_batch, len(rows)) and batcher.scheduler.rows_at_forward == batcher.running)
    for sink in sinks:
        sink.done.wait()
    return sinks


def view(records) -> list:
    return [(r.iteration, r.block, r.block_range, r.committed, r.forced, r.top1, r.final_until) for r in records]


BASE = dict(gen_length=32, block_length=8, use_chat_template=False)


@pytest.mark.parametrize(
    "model, settings",
    [
        (DEFAULT_MODEL, [dict(threshold=0.9), dict(decoder="fixed", steps=16, gen_length=16), dict(decoder="hierarchical", gen_length=64)]),
        (DEFAULT_MODEL, [dict(threshold=0.5, cache="dual"), dict(decoder="credit", cache="prefix"), dict(smoothing=True)]),
        (DEFAULT_MODEL, [dict(temperature=0.8, seed=s) for s in (0, 1, 2)]),
        (LLADA2, [dict(threshold=0.9, cache="none"), dict(decoder="fixed", steps=32, cache="prefix"), dict(threshold=0.7, cache="none", gen_length=16)]),
    ],
    ids=["decoders-and-lengths", "caches-and-smoothing", "seeded-sampling", "block-causal"],
)
def test_rows_of_many_lengths_and_settings_get_their_solo_run(model, settings):
    torch.set_num_threads(1)
    engine = Engine(model)
    rows = [(p, GenerationConfig(**{**BASE, **settings[i % len(settings)]})) for i, p in enumerate(prompts(24))]
    assert len({len(engine.encode(p, False)) for p, _ in rows}) >= 8
    got = continuous(engine, rows)
    for (prompt, config), sink in zip(rows, got):
        assert sink.error is None, (prompt, sink.error)
        alone = engine.generate(prompt, config, hooks=RunHooks(trace=True))
        assert sink.result.output.token_ids == alone.output.token_ids, (prompt, config)
        assert sink.result.output.stats.nfe == alone.output.stats.nfe
        assert view(sink.records) == view(alone.output.trace.iterations), (prompt, config)
    assert max(sink.batch for sink in got) >= 2  # rows of different lengths and settings shared forwards


def test_packing_changes_the_logits_and_kv_by_summation_order_only():
    """The measured difference (docs/serving.md §3): rows of 8 to 60 tokens packed into one sequence,
    the block-causal model with its mask, against each row's own forward (logits and K/V)."""
    torch.manual_seed(0)
    rng = random.Random(0)
    for model in (DEFAULT_MODEL, LLADA2):
        net = Engine(model).model
        worst = 0.0
        with torch.inference_mode():
            for _ in range(10):
                calls = []
                for length in (rng.randint(8, 60) for _ in range(rng.randint(2, 8))):
                    ids = torch.randint(0, net.mask_token_id, (1, length))
                    calls.append({"input_ids": ids, "use_cache": True, **({"attention_mask": block_causal_mask(length, 8, ids.device)} if net.block_causal else {})})
                for call, out in zip(calls, packed_forward(net, calls)):
                    alone = net(**call)
                    assert out.logits.shape == alone.logits.shape and out.kv.shape == alone.kv.shape
                    assert torch.equal(out.logits.argmax(-1), alone.logits.argmax(-1))
                    worst = max(worst, (out.logits - alone.logits).abs().max().item(), (out.kv - alone.kv).abs().max().item())
        assert worst < 1e-3, (model, worst)  # fp32: 3e-5 measured


def test_the_scheduler_holds_a_thread_only_while_rows_run_and_its_rows_still_share_forwards():
    """An idle server holds no scheduler thread (a dropped app none either); the first row admitted
    starts one, the last to leave ends it, and the next rows start another and share its forwards."""
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    batcher = ContinuousBatcher(threading.Lock(), lambda members: engine, 8)
    scheduler = batcher.scheduler
    assert scheduler.threads == []
    config = GenerationConfig(**BASE, threshold=0.9)
    threads = []
    for round_prompts in (prompts(3), prompts(4, seed=1)):
        sinks = [Collect() for _ in round_prompts]
        with batcher.lock:
            for prompt, sink in zip(round_prompts, sinks):
                batcher.submit(BatchRequest(prompt, config, threading.Event(), sink, None))
            until(lambda: batcher.running == len(sinks) and scheduler.rows_at_forward == len(sinks))
            (thread,) = scheduler.threads  # one lane
            threads.append(thread)
            assert thread.is_alive()
        for sink in sinks:
            sink.done.wait()
        until(lambda: batcher.running == 0 and not threads[-1].is_alive())
        assert scheduler.threads == []
        for prompt, sink in zip(round_prompts, sinks):
            assert sink.error is None and sink.result.text == engine.generate(prompt, config).text
        assert min(sink.batch for sink in sinks) == len(sinks)  # the held forward took them all
    assert threads[0] is not threads[1]


EIGHT = ["Q: 5-5=? A:", "Q: 14+5=? A:", "Q: ?+?=140 A:", "Q: 123+45=? A:", "Q: 300-125=? A:", "Q: rhymes with cat? A:",
         "Q: rhymes with moon? A:", "Q: what rhymes with dog? A:"]


def complete(served: Served, prompt: str, **settings: Any) -> Any:
    return served.client.completions.create(model=served.engine.name, prompt=prompt, max_tokens=settings.get("gen_length", 32), extra_body=settings)


def test_eight_requests_of_eight_lengths_share_forwards_and_get_their_solo_answers(served):
    assert len({len(served.engine.encode(p, False)) for p in EIGHT}) == 8
    settings = dict(gen_length=32, block_length=8, threshold=0.9)
    scheduler = served.server.batcher.scheduler
    with ThreadPoolExecutor(8) as pool, served.server.batcher.lock:  # no forward runs until all eight wait on one
        futures = [pool.submit(complete, served, p, **settings) for p in EIGHT]
        until(lambda: served.server.batcher.running == 8 and scheduler.rows_at_forward == 8)
    answers = [f.result().choices[0] for f in futures]
    for prompt, choice in zip(EIGHT, answers):
        assert choice.text == served.engine.generate(prompt, GenerationConfig(**settings, use_chat_template=False)).text
    assert sum(choice.model_extra["batch"] >= 2 for choice in answers) >= 2
    assert served.server.pending == 0


@pytest.mark.parametrize("batching", ["continuous", "lockstep"])
def test_a_short_request_sent_after_three_long_ones_finishes_first(batching):
    """Continuous: the short one joins the long ones' forwards and leaves after its own few.
    Lockstep (the comparison): it waits for the long ones' batch to end."""
    torch.set_num_threads(1)
    engine = Engine(DEFAULT_MODEL)
    traces = TraceStore(max_traces=64)
    finished: list[str] = []
    done = traces.done
    traces.done = lambda trace_id, trace: (finished.append(trace_id), done(trace_id, trace))  # type: ignore[method-assign]
    app = create_app(engine, LIMITS, max_batch=8, max_pending=32, traces=traces, batching=batching)
    server = app.state.server
    long = dict(gen_length=64, block_length=8, decoder="fixed", steps=64, early_stop=False)
    short = dict(gen_length=8, block_length=8, decoder="fixed", steps=8)
    with running(app) as url, ThreadPoolExecutor(4) as pool:
        served = Served(engine, server, url)
        with server.batcher.lock:  # the engine held while the long ones arrive
            longs = [pool.submit(complete, served, p, **long) for p in ("Q: 14+5=? A:", "Q: 7-65=? A:", "Q: 61-7=? A:")]
            if batching == "continuous":
                until(lambda: server.batcher.running == 3 and server.batcher.scheduler.rows_at_forward == 3)
            else:
                until(lambda: server.batcher.waiting == 3)
        if batching == "lockstep":
            until(lambda: server.batcher.running == 3)  # the long ones (one prompt length) decode as one batch
        with server.batcher.lock:  # continuous: the short one joins before the long ones' second forward
            first = pool.submit(complete, served, "Q: 9+9=? A:", **short)
            if batching == "continuous":
                until(lambda: server.batcher.running == 4 and server.batcher.scheduler.rows_at_forward == 4)
            else:
                until(lambda: server.batcher.waiting == 1)
        ids = [f.result().choices[0].model_extra["trace_id"] for f in (*longs, first)]
    assert sorted(finished) == sorted(ids)
    if batching == "continuous":
        assert finished[0] == ids[3]
    else:
        assert finished[-1] == ids[3]
