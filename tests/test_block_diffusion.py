"""LLaDA2 block diffusion: the exact prefix cache equals the attention-mask reference token for
token; the masked store is exact where a zero-padded one is not; forwards are counted as run."""

import pytest
import torch

from engine import GenerationConfig, RunHooks, run_diffusion
from engine.cache import block_causal_mask
from engine.errors import EngineError

from .moe_models import EOS, MASK, tiny_llada2, tiny_llada_moe

PROMPTS = {
    "batch, prefill": [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]],
    "first block at 0": [[5, 6, 7]],
}
VARIANTS = {
    "threshold": dict(),
    "fixed": dict(decoder="fixed", steps=12),
    "unrolled": dict(unroll=True, expected_tpf=1, max_unroll=4, threshold=0.3),
    "smoothing": dict(smoothing=True),
}


@pytest.fixture(scope="module")
def model():
    return tiny_llada2()


@pytest.mark.parametrize("prompts", PROMPTS.values(), ids=PROMPTS.keys())
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_cached_path_equals_the_attention_mask_path(model, prompts, variant):
    config = GenerationConfig(gen_length=12, block_length=4, early_stop=False, **variant)
    reference = run_diffusion(model, prompts, config.replace(cache="none"), hooks=RunHooks(trace=True))
    cached = run_diffusion(model, prompts, config.replace(cache="prefix"), hooks=RunHooks(trace=True))
    assert cached.canvas.equal(reference.canvas)
    assert (cached.canvas != MASK).all()
    assert {r.forward for r in reference.trace.iterations} == {"full"}
    assert {r.forward for r in cached.trace.iterations} == {"prefix"}
    firsts = {}
    for r in cached.trace.iterations:
        firsts.setdefault(r.block, r)
    for r in cached.trace.iterations:  # the block, after the pending positions at a block's first forward
        (a, e), (s, end) = r.recomputed[0], r.block_range
        assert len(r.recomputed) == 1 and e == end and (a == s or (r is firsts[r.block] and a < s))
    first = firsts[min(firsts)]
    assert first.recomputed[0][0] == 0  # the prompt's blocks ride on the first forward: no prefill forward
    assert all(r.recomputed == [[0, r.block_range[1]]] for r in reference.trace.iterations)


def test_a_forward_stopped_at_the_blocks_end_gives_the_whole_canvas_logits_there(model):
    """Block-causal attention: positions after the block cannot change its logits, so the
    uncached forward over `[0, e)` (what cache none runs) equals the whole canvas's on `[s, e)`."""
    x = torch.randint(0, 38, (2, 24), generator=torch.Generator().manual_seed(3))
    s, e, n = 8, 12, 24
    mask = block_causal_mask(n, 4, x.device)
    whole = model(x, attention_mask=mask).logits[:, s:e]
    stopped = model(x[:, :e], attention_mask=mask[:e, :e]).logits[:, s:e]
    torch.testing.assert_close(stopped, whole, rtol=1e-5, atol=1e-5)


def test_a_full_attention_model_always_runs_the_whole_canvas(model):
    """LLaDA-MoE attends both ways across the canvas: later blocks change the current one's
    logits, so no forward of cache none stops at the block's end."""
    full = tiny_llada_moe()
    assert model.block_causal and not full.block_causal  # each family declares its attention
    out = run_diffusion(full, [[1, 2, 3, 4, 5]], GenerationConfig(gen_length=8, block_length=4, early_stop=False), hooks=RunHooks(trace=True))
    assert all(r.recomputed == [[0, 13]] for r in out.trace.iterations)
    x = torch.randint(0, 30, (1, 13), generator=torch.Generator().manual_seed(4))
    assert not torch.allclose(full(x[:, :9]).logits[:, 5:9], full(x).logits[:, 5:9])  # the suffix matters here


def test_masked_store_is_exact_and_a_zero_padded_one_is_not(model):
    x = torch.randint(0, 38, (2, 16))
    s, e, n = 8, 12, 16
    mask = block_causal_mask(n, 4, x.device)
    exact = model(x[:, :e], attention_mask=mask[:e, :e]).logits[:, s:e]
    store = torch.zeros_like(model(x, use_cache=True).kv)  # [layers, 2, B, H_kv, N, D], slots [s, N) zero
    store[..., :s, :] = model(x[:, :s], attention_mask=mask[:s, :s], use_cache=True).kv
    keys = (torch.arange(n) < e).view(1, 1, 1, -1)
    cached = model(x[:, s:e], past_kv=store, replace=(s, e), attention_mask=keys).logits
    torch.testing.assert_close(cached, exact, rtol=1e-5, atol=1e-5)
    zero_padded = model(x[:, s:e], past_kv=store, replace=(s, e)).logits  # SGLang-style: slots unmasked
    assert (zero_padded - exact).abs().max() > 1e-3


def test_staleness_probe_measures_the_cache_as_exact(model):
    config = GenerationConfig(gen_length=8, block_length=4, cache="prefix", measure_staleness=True)
    out = run_diffusion(model, PROMPTS["batch, prefill"], config)
    kl = [v for r in out.trace.iterations for row in r.extras["staleness_kl"] for v in row]
    agree = [v for r in out.trace.iterations for row in r.extras["staleness_agree"] for v in row]
    assert max(kl) < 1e-6 and all(agree)


@pytest.mark.parametrize("variant", ["threshold", "unrolled"])
def test_forwards_are_counted_and_a_finished_blocks_kv_rides_on_the_next_forward(model, variant):
    """Every forward is an iteration: the prompt's K/V and a finished block's (when its last
    forward ran on masked input) are computed by the next block's first forward, fed ahead of it."""
    config = GenerationConfig(gen_length=12, block_length=4, cache="prefix", early_stop=False, **VARIANTS[variant])
    out = run_diffusion(model, PROMPTS["batch, prefill"], config, hooks=RunHooks(trace=True))
    assert out.stats.nfe == len(out.trace.iterations)
    by_block: dict[int, list] = {}
    for r in out.trace.iterations:
        by_block.setdefault(r.block, []).append(r)
    blocks = sorted(by_block)
    fed = 0
    for before, block in zip(blocks, blocks[1:]):
        last, first = by_block[before][-1], by_block[block][0]
        pending = any(last.committed)  # its input held a mask: its K/V are not the final tokens'
        assert first.recomputed[0][0] == (last.block_range[0] if pending else first.block_range[0])
        fed += pending
    if variant == "unrolled":  # a no-op forward on a finished block already computed its final K/V
        assert fed < len(blocks) - 1
    else:
        assert fed == len(blocks) - 1


def test_early_stop_fills_the_rest_with_eos_on_both_paths(model):
    prompts = PROMPTS["batch, prefill"]
    config = GenerationConfig(gen_length=12, block_length=4, early_stop=False)
    free = run_diffusion(model, prompts, config)
    stop = int(free.canvas[0, 8])  # a token row 0 generates in its first block [8, 12)
    runs = {
        cache: run_diffusion(model, prompts, config.replace(cache=cache, early_stop=True), stop_ids=[stop, EOS])
        for cache in ("none", "prefix")
    }
    assert runs["none"].canvas.equal(runs["prefix"].canvas)
    assert (runs["prefix"].canvas[0, 12:] == stop).all()
    assert runs["prefix"].stats.nfe < run_diffusion(model, prompts, config.replace(cache="prefix"), stop_ids=[stop, EOS]).stats.nfe


@pytest.mark.parametrize("setting", [dict(cache="dual"), dict(cache="vicinity"), dict(align_blocks=False)])
def test_settings_that_do_not_apply_are_refused(model, setting):
    with pytest.raises(EngineError):
        run_diffusion(model, [[1, 2, 3]], GenerationConfig(gen_length=8, block_length=4, **setting))
