"""The KV-cache manager (engine/cache.py): exactness at a refresh, the modes against each other and
against no cache, the staleness probe, persist_window, and the forward count per block."""

import pytest
import torch

from engine.hooks import RunHooks
from engine.cache import DUAL, FULL, PREFIX, REFRESH, WINDOW, KVCacheManager, staleness
from engine.config import GenerationConfig
from engine.errors import EngineError
from engine import run_diffusion

from .conftest import tiny_llada

PROMPTS = [[3, 14, 15, 9, 26, 5, 35, 8, 9, 7], [2, 7, 18, 28]]  # two lengths: right-padded batch
CACHED_MODES = ["prefix", "dual", "vicinity"]
KIND_LETTER = {FULL: "F", REFRESH: "R", PREFIX: "P", DUAL: "D", WINDOW: "W"}


def config(**changes) -> GenerationConfig:
    """Threshold decoding over four 8-token blocks; a low threshold so steps commit several tokens.
    Early stop is off: the random model may emit EOS anywhere, and every block should run."""
    base = dict(gen_length=32, block_length=8, threshold=0.3, early_stop=False, prefix_look=3, after_look=5, warmup=2)
    return GenerationConfig(**{**base, **changes}).validate()


def refreshed(model, mode: str, x: torch.Tensor, block: tuple[int, int], **changes) -> tuple[KVCacheManager, object]:
    """A manager for `mode` that has just run its block-entry refresh on canvas `x`."""
    cache = KVCacheManager(config(cache=mode, warmup=0, **changes), x.shape[1])
    plan = cache.plan(0, 0, *block)
    assert plan.kind == REFRESH and (plan.start, plan.end) == (0, x.shape[1])
    return cache, cache.forward(model, plan, 0, input_ids=x)


# ---- exactness at a refresh -------------------------------------------------------------------


@pytest.mark.parametrize("kv_heads", [4, 2])  # 2: grouped-query attention
@pytest.mark.parametrize("kv_rope", ["pre", "post"])
@pytest.mark.parametrize("mode", CACHED_MODES)
@pytest.mark.parametrize("block", [(8, 16), (24, 30)])  # the second clips the window at the canvas end
def test_cached_forward_after_refresh_equals_uncached(mode, block, kv_rope, kv_heads):
    """Right after a refresh nothing is stale, so the cached forward (prefix, dual or window query
    against the fresh store) must reproduce the uncached logits, for either RoPE ordering."""
    model = tiny_llada(n_kv_heads=kv_heads)
    model.kv_rope = kv_rope
    x = torch.randint(0, 48, (2, 30))
    exact = model(x).logits
    cache, out = refreshed(model, mode, x, block)
    torch.testing.assert_close(out.logits, exact, rtol=0, atol=1e-5)
    plan = cache.plan(1, 0, *block)
    expected = {"prefix": (PREFIX, block[0], 30), "dual": (DUAL, *block), "vicinity": (WINDOW, block[0] - 3, min(30, block[1] + 5))}
    assert (plan.kind, plan.start, plan.end) == expected[mode]
    cached = cache.forward(model, plan, 0, input_ids=x[:, plan.start : plan.end]).logits
    torch.testing.assert_close(cached, exact[:, plan.start : plan.end], rtol=0, atol=1e-5)
    kl, agree = staleness(cached, exact[:, plan.start : plan.end], model.mask_token_id)
    assert kl.abs().max() < 1e-6 and bool(agree.all())


def test_post_rope_store_holds_keys_rotated_at_their_positions():
    model = tiny_llada()
    x = torch.randint(0, 48, (1, 12))
    pre = model(x, use_cache=True).kv
    model.kv_rope = "post"
    post = model(x, use_cache=True).kv
    torch.testing.assert_close(post[:, 1], pre[:, 1])  # values are never rotated
    for layer in range(model.n_layers):
        torch.testing.assert_close(post[layer, 0], model.rope(pre[layer, 0], 0))
    assert not torch.allclose(post[:, 0, :, :, 1:], pre[:, 0, :, :, 1:])  # position 0 is RoPE's identity


def test_unknown_rope_ordering_and_persist_without_store_are_rejected():
    model = tiny_llada()
    x = torch.randint(0, 48, (1, 6))
    with pytest.raises(EngineError, match="persist needs past_kv"):
        model(x, persist=True)
    model.kv_rope = "both"
    with pytest.raises(ValueError, match="kv_rope"):
        model(x)


def test_later_refresh_overwrites_the_same_store():
    model = tiny_llada()
    x = torch.randint(0, 48, (1, 24))
    cache, _ = refreshed(model, "dual", x, (8, 16))
    address = cache.store.data_ptr()
    y = x.clone()
    y[:, 8:16] = (y[:, 8:16] + 1) % 48
    plan = cache.plan(1, 1, 16, 24)  # a new block: refresh
    assert plan.kind == REFRESH
    cache.forward(model, plan, 1, input_ids=y)
    assert cache.store.data_ptr() == address
    torch.testing.assert_close(cache.store, model(y, use_cache=True).kv, rtol=0, atol=0)


# ---- the modes against each other and against no cache ---------------------------------------


@pytest.mark.parametrize("persist", [False, True])
def test_vicinity_without_look_or_warmup_equals_dual(persist):
    model = tiny_llada()
    dual = run_diffusion(model, PROMPTS, config(cache="dual", persist_window=persist))
    vicinity = run_diffusion(model, PROMPTS, config(cache="vicinity", prefix_look=0, after_look=0, warmup=0, persist_window=persist))
    assert vicinity.token_ids == dual.token_ids
    assert torch.equal(vicinity.canvas, dual.canvas)
    assert vicinity.stats.nfe == dual.stats.nfe


@pytest.mark.parametrize("decoder", ["threshold", "fixed"])
@pytest.mark.parametrize("mode", CACHED_MODES)
def test_refresh_every_iteration_gives_the_no_cache_tokens(mode, decoder):
    model = tiny_llada()
    settings = dict(decoder=decoder, steps=16)
    reference = run_diffusion(model, PROMPTS, config(cache="none", **settings))
    cached = run_diffusion(model, PROMPTS, config(cache=mode, refresh_every=1, **settings), hooks=RunHooks(trace=True))
    assert torch.equal(cached.canvas, reference.canvas)
    assert {r.forward for r in cached.trace.iterations} <= {FULL, REFRESH}


def test_without_refreshes_the_cached_modes_do_differ_from_no_cache():
    """Guards the test above: on this model the cache's staleness is large enough to change tokens,
    so equality there comes from the refreshes, not from an insensitive model."""
    model = tiny_llada()
    reference = run_diffusion(model, PROMPTS, config(cache="none"))
    assert any(not torch.equal(run_diffusion(model, PROMPTS, config(cache=m)).canvas, reference.canvas) for m in CACHED_MODES)


@pytest.mark.parametrize("mode", CACHED_MODES)
def test_one_layer_model_caches_exactly(mode):
    """With one layer a position's K/V depend only on its own token, and only the block's tokens
    change between refreshes, so every cached forward is exact: no-cache tokens, zero staleness.
    This checks the replaced ranges and positions of every mode end to end."""
    model = tiny_llada(n_layers=1)
    reference = run_diffusion(model, PROMPTS, config(cache="none"))
    cached = run_diffusion(model, PROMPTS, config(cache=mode, measure_staleness=True))
    assert torch.equal(cached.canvas, reference.canvas)
    assert max(max(row) for r in cached.trace.iterations for row in r.extras["staleness_kl"]) == 0.0


@pytest.mark.parametrize("persist", [False, True])
@pytest.mark.parametrize("mode", CACHED_MODES)
def test_post_rope_ordering_generates_the_same_tokens(mode, persist):
    model = tiny_llada()
    pre = run_diffusion(model, PROMPTS, config(cache=mode))
    model.kv_rope = "post"
    assert torch.equal(run_diffusion(model, PROMPTS, config(cache=mode, persist_window=persist)).canvas, pre.canvas)


# ---- staleness ----------------------------------------------------------------------------------


def test_staleness_of_a_known_pair_and_mask_excluded():
    mask_id = 2
    log3 = torch.log(torch.tensor(3.0))
    exact = torch.tensor([[[0.0, log3, 9.0]]])  # p = (1/4, 3/4) once [MASK] (id 2) is excluded
    cached = torch.tensor([[[log3, 0.0, -9.0]]])  # q = (3/4, 1/4)
    kl, agree = staleness(cached, exact, mask_id)
    # KL(p || q) = 1/4 log(1/3) + 3/4 log(3) = log(3) / 2
    torch.testing.assert_close(kl, (log3 / 2).reshape(1, 1))
    assert agree.tolist() == [[False]]
    assert exact[0, 0, 2] == 9.0  # the caller's logits are left untouched
    same_kl, same_agree = staleness(exact, exact, mask_id)
    assert same_kl.tolist() == [[0.0]] and same_agree.tolist() == [[True]]


@pytest.mark.parametrize("mode", CACHED_MODES)
def test_staleness_is_recorded_without_a_trace_request_and_is_zero_only_where_exact(mode):
    model = tiny_llada()
    out = run_diffusion(model, PROMPTS, config(cache=mode, measure_staleness=True))
    assert out.trace is not None  # measure_staleness alone records the trace
    records = out.trace.iterations
    kl = {r.iteration: [v for row in r.extras["staleness_kl"] for v in row] for r in records}
    agree = {r.iteration: [v for row in r.extras["staleness_agree"] for v in row] for r in records}
    exact = [r.iteration for r in records if r.forward in (FULL, REFRESH)]
    cached = [r.iteration for r in records if r.forward not in (FULL, REFRESH)]
    assert exact and cached
    assert all(v == 0.0 for i in exact for v in kl[i]) and all(all(agree[i]) for i in exact)
    assert all(v >= 0.0 for i in cached for v in kl[i])
    assert max(v for i in cached for v in kl[i]) > 1e-3  # a two-layer cache is stale after a decode
    assert run_diffusion(model, PROMPTS, config(cache=mode)).trace is None


# ---- persist_window -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", CACHED_MODES)
def test_persist_window_changes_the_store_only_inside_the_recomputed_range(mode):
    model = tiny_llada()
    x = torch.randint(0, 48, (2, 30))
    block = (8, 16)
    for persist in (False, True):
        cache, _ = refreshed(model, mode, x, block, persist_window=persist)
        before = cache.store.clone()
        y = x.clone()
        y[:, 9:12] = (y[:, 9:12] + 1) % 48  # the decode committed some block tokens
        plan = cache.plan(1, 0, *block)
        a, b = plan.start, plan.end
        fresh = model(y[:, a:b], past_kv=before, replace=(a, b), use_cache=True)
        out = cache.forward(model, plan, 0, input_ids=y[:, a:b])
        torch.testing.assert_close(out.logits, fresh.logits, rtol=0, atol=1e-6)
        outside = torch.ones(30, dtype=torch.bool)
        outside[a:b] = False
        assert torch.equal(cache.store[..., outside, :], before[..., outside, :])
        if persist:
            torch.testing.assert_close(cache.store[..., a:b, :], fresh.kv, rtol=0, atol=1e-6)
            assert not torch.equal(cache.store[..., a:b, :], before[..., a:b, :])
        else:
            assert torch.equal(cache.store, before)


@pytest.mark.parametrize("smoothing", [False, True])
@pytest.mark.parametrize("mode", CACHED_MODES)
def test_persist_window_never_changes_tokens_or_staleness(mode, smoothing):
    """Between two refreshes every cached forward has the same query range, so a persisted slot is
    overwritten before anything reads it: persisting saves the merge copy, and changes no logit."""
    model = tiny_llada()
    runs = [run_diffusion(model, PROMPTS, config(cache=mode, smoothing=smoothing, measure_staleness=True, persist_window=p)) for p in (False, True)]
    assert torch.equal(runs[0].canvas, runs[1].canvas)
    kls = [[r.extras["staleness_kl"] for r in run.trace.iterations] for run in runs]
    assert kls[0] == kls[1]


# ---- forward count per block ------------------------------------------------------------------------
# Prompt of 8 tokens, gen 16 in blocks [8, 16) and [16, 24), fixed decoder. With steps=8 each block
# takes 4 decodes of 2 tokens; with steps=2, one decode of 8. Letters: F full (no cache), R refresh,
# P prefix, D dual, W window. Derivations (docs/algorithms.md §4.3):
# - none: one full forward per decode.
# - prefix/dual: the refresh at block entry decodes, then the cached forwards do the other 3.
# - vicinity, warm-up w: the first w iterations (request-wide) are full; block 0 then refreshes once
#   and continues with windows; later blocks refresh at entry.
# - A refresh and the next forward run in one call, so when the refresh's decode completes the
#   block (warm-up 3, or one decode per block) a no-op cached forward still runs: dInfer's count.
# - refresh_every=N: a refresh once N forwards have run since the last one, the refresh included
#   (N=1: every forward refreshes; a call is then two refreshes, two decodes).
FORWARD_COUNTS = [
    (dict(cache="none"), "FFFF|FFFF"),
    (dict(cache="prefix"), "RPPP|RPPP"),
    (dict(cache="dual"), "RDDD|RDDD"),
    (dict(cache="vicinity", warmup=0), "RWWW|RWWW"),
    (dict(cache="vicinity", warmup=2), "FFRW|RWWW"),
    (dict(cache="vicinity", warmup=3), "FFFRW|RWWW"),
    (dict(cache="vicinity", warmup=4), "FFFF|RWWW"),
    (dict(cache="dual", refresh_every=2), "RDRD|RDRD"),
    (dict(cache="dual", refresh_every=3), "RDDRD|RDDRD"),
    (dict(cache="prefix", refresh_every=1), "RRRR|RRRR"),
    (dict(cache="none", steps=2), "F|F"),
    (dict(cache="dual", steps=2), "RD|RD"),
    (dict(cache="vicinity", warmup=0, steps=2), "RW|RW"),
]


@pytest.mark.parametrize("changes,expected", FORWARD_COUNTS)
def test_forward_count_per_block(changes, expected):
    model = tiny_llada()
    cfg = config(**{**dict(gen_length=16, decoder="fixed", steps=8, prefix_look=2, after_look=2), **changes})
    out = run_diffusion(model, [list(range(1, 9))], cfg, hooks=RunHooks(trace=True))
    per_block = ["".join(KIND_LETTER[r.forward] for r in out.trace.iterations if r.block == b) for b in (0, 1)]
    assert "|".join(per_block) == expected
    assert out.stats.nfe == len(expected) - 1
    assert int((out.canvas == model.mask_token_id).sum()) == 0
    ranges = {(r.block, r.forward): tuple(r.recomputed[0]) for r in out.trace.iterations}
    recomputed = {PREFIX: {0: (8, 24), 1: (16, 24)}, DUAL: {0: (8, 16), 1: (16, 24)}, WINDOW: {0: (6, 18), 1: (14, 24)}}
    for (block, kind), span in ranges.items():
        assert span == recomputed.get(kind, {0: (0, 24), 1: (0, 24)})[block]
