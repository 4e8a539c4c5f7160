"""Continuous batching of the kinds that call the network their own way (issue 58 item 2;
engine/serving/scheduler.py, packed.py, docs/serving.md §3): uniform-state rows (DiffusionGemma)
of different prompt lengths, canvases and step counts share their denoising forwards, and
speculative rows (LLaDA2) their draft and verify forwards; each row still gets its solo run's
tokens, forwards and records, its random draws (seeded) from its own generator. Nothing reads a
clock: rows are held at the engine's lock until the scheduler's own state says each waits on a
model call, and sharing is read from the rows' own `batch` (the most rows one of their calls ran
with). Before this, both kinds ran alone (every `batch` 1): the sharing asserts fail there."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
import torch

from engine import Engine, GenerationConfig
from engine.cli import DEFAULT_MODEL
from engine.hooks import RunHooks
from engine.serving.app import create_app
from engine.serving.batcher import BatchRequest
from engine.serving.packed import packed_forward, shareable
from engine.serving.scheduler import ContinuousBatcher
from engine.serving.served import CPU_FORWARD_POSITIONS
from engine.serving.traces import TraceStore

from .test_serve import LIMITS, running, until
from .test_serve_continuous import Collect, prompts

GEMMA, LLADA2 = "assets/tiny-gemma", "assets/tiny-llada2"


def uniform_view(records) -> list:
    """What a uniform step decided and drew: its draft, acceptances, proposals, noise and stop."""
    return [(r.iteration, r.block, r.committed, r.top1, r.state["proposal"], r.state["noise"], r.state["stopping"]["stopped"]) for r in records]


def speculative_view(records) -> list:
    return [(r.iteration, r.block_range, r.forward, r.committed, r.top1, r.state["draft"], r.state["verify"], r.state["accepted"]) for r in records]


def all_arrived(batcher: Any, count: int, answered: bool) -> bool:
    """Every one of `count` rows reached the batcher and each running one waits on a model call;
    or a row was `answered` while the engine was held, so it called the network past the scheduler
    (as these kinds' runs did when they ran alone: the sharing asserts then fail at once)."""
    return answered or (batcher.running + batcher.waiting == count and batcher.scheduler.rows_at_forward == batcher.running)


def continuous(engine: Engine, rows: list[tuple[str, GenerationConfig]], **rounds: Any) -> list[Collect]:
    """Every row submitted at once while the engine is held (at most eight run, the rest wait),
    then decoded by the scheduler (`rounds`: its budget and lanes)."""
    batcher = ContinuousBatcher(threading.Lock(), lambda members: engine, 8, **rounds)
    sinks = [Collect() for _ in rows]
    with batcher.lock:
        for (prompt, config), sink in zip(rows, sinks):
            batcher.submit(BatchRequest(prompt, config, threading.Event(), sink, None))
        until(lambda: all_arrived(batcher, len(rows), any(sink.done.is_set() for sink in sinks)))
    for sink in sinks:
        sink.done.wait()
    return sinks


def check_solo(engine: Engine, rows: list[tuple[str, GenerationConfig]], got: list, view) -> None:
    for (prompt, config), sink in zip(rows, got):
        assert sink.error is None, (prompt, sink.error)
        alone = engine.generate(prompt, config, hooks=RunHooks(trace=True))
        assert sink.result.output.token_ids == alone.output.token_ids, (prompt, config)
        assert sink.result.text == alone.text
        assert sink.result.output.stats.nfe == alone.output.stats.nfe, (prompt, config)
        assert view(sink.records) == view(alone.output.trace.iterations), (prompt, config)


def shared_lengths(engine: Engine, rows: list[tuple[str, GenerationConfig]], got: list) -> set[int]:
    """The prompt lengths of the rows whose calls ran with others'."""
    return {len(engine.encode(prompt, False)) for (prompt, _), sink in zip(rows, got) if sink.batch >= 2}


UNIFORM_SETTINGS = [
    dict(seed=0),
    dict(seed=1, gen_length=48, decoder_options={"max_denoising_steps": 5}),
    dict(seed=7, gen_length=16, decoder_options={"entropy_bound": 0.5, "t_max": 1.2}),
    dict(seed=3, gen_length=32, early_stop=False, decoder_options={"max_denoising_steps": 12, "stability_threshold": 2}),
    dict(seed=11, gen_length=48, decoder_options={"t_min": 0.0, "t_max": 0.05, "max_denoising_steps": 3}),  # near-greedy
]


@pytest.mark.parametrize("seed", [3, 4])
def test_uniform_rows_of_many_lengths_and_steps_share_denoising_forwards_and_get_their_solo_run(seed):
    """The trained tiny-gemma (canvases of 16): its canvases stop adaptively after different step
    counts, so rows leave and join between canvases. (Not a random wide-weight model: its steps
    amplify the packed logits' summation-order differences through self-conditioning, docs/serving.md §3.)"""
    torch.set_num_threads(1)
    engine = Engine(GEMMA)
    rows = [(p, GenerationConfig(**{"gen_length": 32, "use_chat_template": False, **UNIFORM_SETTINGS[(i + seed) % len(UNIFORM_SETTINGS)]})) for i, p in enumerate(prompts(12, seed=seed))]
    got = continuous(engine, rows)  # eight at once; the other four join as rows leave
    check_solo(engine, rows, got, uniform_view)
    assert len(shared_lengths(engine, rows, got)) >= 4  # rows of different prompt lengths shared denoising forwards


SPECULATIVE_SETTINGS = [
    dict(),
    dict(threshold=0.5, gen_length=48, kind_options={"verify": "auto", "verify_threshold": 0.6}),
    dict(decoder="fixed", steps=16, kind_options={"verify": "router"}),
    dict(gen_length=16, block_length=4, kind_options={"draft_window": "adaptive", "draft_most": 16}),
    dict(decoder="credit", threshold=0.7, kind_options={"verify": "router", "router_on": 0.5, "router_gap": 2.0}),
]


def test_speculative_rows_share_draft_and_verify_forwards_and_get_their_solo_run():
    torch.set_num_threads(1)
    engine = Engine(LLADA2)
    rows = [(p, GenerationConfig(**{"kind": "speculative", "gen_length": 32, "block_length": 8, "use_chat_template": False, **SPECULATIVE_SETTINGS[i % len(SPECULATIVE_SETTINGS)]}))
            for i, p in enumerate(prompts(12, seed=5))]
    got = continuous(engine, rows)
    check_solo(engine, rows, got, speculative_view)
    assert len(shared_lengths(engine, rows, got)) >= 4


EIGHT = ["Q: 5-5=? A:", "Q: 14+5=? A:", "Q: ?+?=140 A:", "Q: 123+45=? A:", "Q: 300-125=? A:", "Q: rhymes with cat? A:",
         "Q: rhymes with moon? A:", "Q: what rhymes with dog? A:"]


@pytest.mark.parametrize("model, settings", [
    (GEMMA, dict(gen_length=32, seed=5, decoder="uniform", decoder_options={"max_denoising_steps": 24})),
    (LLADA2, dict(gen_length=32, block_length=8, kind="speculative", threshold=0.9)),
], ids=["tiny-gemma", "speculative"])
def test_eight_concurrent_requests_share_forwards_through_the_server_with_their_solo_answers(model, settings):
    """Issue 58's words: eight concurrent tiny-gemma requests share forwards (every choice's `batch`
    at least 2) with their solo answers; the same for speculative rows."""
    torch.set_num_threads(1)
    engine = Engine(model)
    assert len({len(engine.encode(p, False)) for p in EIGHT}) == 8
    app = create_app(engine, LIMITS, max_batch=8, max_pending=32, traces=TraceStore(max_traces=64))
    server = app.state.server

    def complete(client: Any, prompt: str) -> Any:
        return client.completions.create(model=engine.name, prompt=prompt, max_tokens=settings["gen_length"], extra_body=settings).choices[0]

    with running(app) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
        with ThreadPoolExecutor(8) as pool, server.batcher.lock:  # no model call runs until all eight wait on one
            futures = [pool.submit(complete, client, p) for p in EIGHT]

            def all_wait() -> bool:
                for future in futures:
                    if future.done():  # answered while the engine was held: a refusal says why here
                        future.result()
                return all_arrived(server.batcher, 8, any(future.done() for future in futures))

            until(all_wait)
        answers = [f.result() for f in futures]
    config = GenerationConfig(**settings, use_chat_template=False)
    for prompt, choice in zip(EIGHT, answers):
        assert choice.text == engine.generate(prompt, config).text, prompt
    assert all(choice.model_extra["batch"] >= 2 for choice in answers), [c.model_extra["batch"] for c in answers]


MASKED_SETTINGS = [dict(cache="none"), dict(cache="prefix"), dict(cache="dual", gen_length=64), dict(cache="vicinity", decoder="credit")]
ROUNDS_CASES = {  # model, the rows' common settings, each row's own in turn, what a record shows
    "masked": (DEFAULT_MODEL, {"gen_length": 32, "use_chat_template": False}, MASKED_SETTINGS, lambda records: [(r.iteration, r.committed) for r in records]),
    "uniform": (GEMMA, {"gen_length": 32, "use_chat_template": False}, UNIFORM_SETTINGS, uniform_view),
    "speculative": (LLADA2, {"kind": "speculative", "gen_length": 32, "block_length": 8, "use_chat_template": False}, SPECULATIVE_SETTINGS, speculative_view),
}


@pytest.mark.parametrize("case", ROUNDS_CASES)
def test_rows_of_each_kind_get_their_solo_run_in_a_cpu_servers_rounds(case):
    """A CPU server's rounds (a budget and two lanes; a row that joins late cuts in where both
    lanes are busy, which the timing decides: tests/test_serve_lanes.py forces it) change when a
    forward runs, never what it computes."""
    model, base, settings, view = ROUNDS_CASES[case]
    torch.set_num_threads(1)
    engine = Engine(model)
    rows = [(p, GenerationConfig(**{**base, **settings[i % len(settings)]})) for i, p in enumerate(prompts(12, seed=9))]
    got = continuous(engine, rows, forward_positions=CPU_FORWARD_POSITIONS, lanes=2)
    check_solo(engine, rows, got, view)


def test_packed_calls_change_the_logits_by_summation_order_only():
    """The measured difference (docs/serving.md §3), against each row's own call: DiffusionGemma's
    denoising forwards over caches of 3 to 90 prompt tokens (some rows self-conditioned, some on
    their first step), and LLaDA2 forwards that read a store of their own at index slots with
    positions apart from them (the speculative kind's verify) or write none (its first draft)."""
    torch.manual_seed(0)
    rng = random.Random(0)
    gemma, llada2 = Engine(GEMMA).model, Engine(LLADA2).model
    width, worst = gemma.canvas_length, {"denoise": 0.0, "stored": 0.0}
    with torch.inference_mode():
        for _ in range(4):
            calls = []
            for length in (rng.randint(3, 90) for _ in range(rng.randint(2, 6))):
                cache = gemma.new_cache()
                gemma.encode(torch.randint(0, gemma.vocab_size, (1, length)), torch.ones(1, length, dtype=torch.bool), torch.arange(length, dtype=torch.int32)[None], cache)
                canvas = torch.randint(0, gemma.vocab_size, (1, width))
                calls.append(dict(canvas=canvas, cache=cache, masks=gemma.decoder_masks(canvas, cache, torch.ones(1, length + width, dtype=torch.bool)),
                                  position_ids=torch.arange(length, length + width, dtype=torch.int32)[None],
                                  self_conditioning=torch.randn(1, width, gemma.vocab_size) if rng.random() < 0.5 else None))
            assert len({gemma.pack_key("denoise", c) for c in calls}) == 1
            for call, out in zip(calls, gemma.run_packed("denoise", calls)):
                alone = gemma.denoise(**call)
                assert torch.equal(out.argmax(-1), alone.argmax(-1))
                worst["denoise"] = max(worst["denoise"], (out - alone).abs().max().item())
            calls = []
            for _ in range(rng.randint(2, 6)):
                total, q = rng.randint(16, 60), rng.randint(2, 8)
                ids = torch.randint(0, llada2.mask_token_id, (1, q))
                if rng.random() < 0.3:  # no store yet: the queries are the only keys
                    calls.append(dict(input_ids=ids, replace=torch.arange(q), attention_mask=torch.ones(q, q, dtype=torch.bool), use_cache=True))
                    continue
                store = llada2(input_ids=torch.randint(0, llada2.mask_token_id, (1, total)), use_cache=True).kv
                slots = torch.tensor(sorted(rng.sample(range(total), q)))
                llada2.rope.table(total, slots.device)
                sees = (torch.rand(q, total) < 0.7).index_fill_(1, slots, False)
                sees[torch.arange(q), slots] = True  # each query sees its own key at least
                calls.append(dict(input_ids=ids, past_kv=store, replace=slots, positions=torch.tensor([rng.randrange(total) for _ in range(q)]),
                                  attention_mask=sees, use_cache=True))
            assert all(shareable(llada2, c) for c in calls)
            for call, out in zip(calls, packed_forward(llada2, calls)):
                alone = llada2(**call)
                assert torch.equal(out.logits.argmax(-1), alone.logits.argmax(-1))
                worst["stored"] = max(worst["stored"], (out.logits - alone.logits).abs().max().item(), (out.kv - alone.kv).abs().max().item())
    assert max(worst.values()) < 1e-3, worst  # fp32: 2e-5 measured (docs/serving.md §3)


def test_a_compiled_uniform_state_engine_serves_its_rows_beside_each_other_each_call_alone(tiny_gemma_folder):
    """A compiled denoiser's calls reach the scheduler by name and run alone (a packed call would run
    the eager network): each row gets the compiled engine's solo answer, and no call was shared."""
    torch.set_num_threads(1)
    engine = Engine(str(tiny_gemma_folder), compile=True)
    config = GenerationConfig(gen_length=16, seed=2, use_chat_template=False, decoder_options={"max_denoising_steps": 4})
    rows = [(p, config) for p in prompts(3, seed=8)]
    got = continuous(engine, rows)
    check_solo(engine, rows, got, uniform_view)
    assert [sink.batch for sink in got] == [1, 1, 1]
