"""The prefix cache across requests (engine/cache.py: PrefixStore) on the block-causal tiny-llada2:
prompts that share a system prompt reuse its whole blocks' K/V, and every answer's tokens and
forwards equal those of the run without the cache; the store keeps its memory bound, least recently
used dropped first; a server counts the hits in /metrics."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from engine import Engine, GenerationConfig
from engine.cache import PrefixStore
from engine.serving.app import create_app
from engine.serving.traces import TraceStore

from .test_serve import LIMITS, Served, running
from .test_serve_metrics import scrape, value

LLADA2 = "assets/tiny-llada2"
SYSTEM = "You answer sums. Think, then answer briefly. "  # 6 whole blocks of 8 once encoded
QUESTIONS = ["Q: 14+5=? A:", "Q: 7-65=? A:", "Q: ?+?=57 A:", "Q: rhymes with cat? A:", "Q: 300-12=? A:", "Q: 52+48=? A:"]


@pytest.fixture(scope="module")
def engine() -> Engine:
    torch.set_num_threads(1)
    return Engine(LLADA2)


@pytest.mark.parametrize("settings", [dict(threshold=0.9), dict(decoder="fixed", steps=32), dict(decoder="hierarchical", block_length=16)])
def test_tokens_and_forwards_are_those_without_the_cache(engine, settings):
    config = GenerationConfig(**{"gen_length": 32, "block_length": 8, "cache": "prefix", "use_chat_template": False, **settings})
    prompts = [SYSTEM + q for q in QUESTIONS]
    off = [engine.generate(p, config) for p in prompts]
    hits: list[int] = []
    engine.model.prefix_store = PrefixStore(1 << 26, on_hit=hits.append)
    try:
        on = [engine.generate(p, config) for p in prompts]
    finally:
        engine.model.prefix_store = None
    for a, b in zip(off, on):
        assert b.output.token_ids == a.output.token_ids and b.output.stats.nfe == a.output.stats.nfe
    whole = len(engine.encode(SYSTEM, False)) // config.block_length * config.block_length
    assert len(hits) == len(prompts) - 1 and min(hits) >= whole  # every request after the first reused the system prompt


def test_the_store_keeps_its_bound_dropping_the_least_recently_used():
    kv = torch.ones(2, 2, 1, 1, 16, 4)  # two blocks of 8, 512 bytes each
    store = PrefixStore(max_bytes=1024)
    store.insert(8, list(range(16)), kv)
    assert len(store) == 2 and store.lookup(8, list(range(16))).shape[4] == 16
    store.insert(8, [7] * 16, kv)  # two more blocks: the two oldest go
    assert store.bytes <= 1024 and len(store) == 2
    assert store.lookup(8, list(range(16))) is None and store.lookup(8, [7] * 16 + [1]).shape[4] == 16
    assert store.lookup(16, [7] * 16) is None  # another block length draws other blocks


def test_a_server_shares_the_system_prompt_across_requests(engine):
    config = GenerationConfig(gen_length=32, block_length=8, cache="prefix", use_chat_template=False)
    solo = {q: engine.generate(SYSTEM + q, config).text for q in QUESTIONS}  # no store yet: each computes its own
    app = create_app(engine, LIMITS, max_batch=8, max_pending=32, traces=TraceStore(max_traces=64))
    try:
        with running(app) as url:
            served = Served(engine, app.state.server, url)
            answer = lambda q: served.client.completions.create(model=engine.name, prompt=SYSTEM + q, max_tokens=32, extra_body={"block_length": 8, "cache": "prefix"})  # noqa: E731
            first = answer(QUESTIONS[0]).choices[0].text  # stores the system prompt's blocks
            with ThreadPoolExecutor(4) as pool:
                rest = list(pool.map(lambda q: answer(q).choices[0].text, QUESTIONS[1:]))
            metrics = scrape(served)
    finally:
        engine.model.prefix_store = None
    assert [first, *rest] == [solo[q] for q in QUESTIONS]
    assert value(metrics, "dinfer_prefix_cache_hits_total") == len(QUESTIONS) - 1
    assert value(metrics, "dinfer_prefix_cache_saved_tokens_total") >= 48 * (len(QUESTIONS) - 1)
