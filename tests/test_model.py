"""The LLaDA model's forward: key names, the cached-forward API, GQA."""

import pytest
import torch

from engine.errors import EngineError

from .conftest import tiny_llada


def test_state_dict_uses_real_llada_key_names(model):
    keys = set(model.state_dict())
    assert "model.transformer.wte.weight" in keys
    assert "model.transformer.ln_f.weight" in keys
    assert "model.transformer.ff_out.weight" in keys
    for name in ("attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out"):
        assert f"model.transformer.blocks.1.{name}.weight" in keys
    assert len(keys) == 3 + 2 * 9


@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("query", [(0, 20), (5, 9), (12, 20), (0, 3)])
def test_cached_forward_equals_full_forward_slice(gqa, query):
    model = tiny_llada(n_kv_heads=2) if gqa else tiny_llada()
    x = torch.randint(0, 48, (2, 20), generator=torch.Generator().manual_seed(0))
    full = model(x, use_cache=True)
    a, b = query
    cached = model(x[:, a:b], past_kv=full.kv, replace=(a, b), use_cache=True)
    # equal up to fp32 summation order: a 3-row and a 20-row matmul take different CPU kernels
    # (measured up to 5e-6 apart on one CI machine), so both bounds are 1e-5
    torch.testing.assert_close(cached.logits, full.logits[:, a:b], rtol=0, atol=1e-5)
    torch.testing.assert_close(cached.kv, full.kv[..., a:b, :], rtol=0, atol=1e-5)


def test_cached_forward_sees_fresh_query_tokens():
    """With one layer, other positions' K/V depend only on their own tokens, so a cached forward on
    changed query tokens is exact: this proves the past's stale slots are really replaced."""
    model = tiny_llada(n_layers=1)
    x = torch.randint(0, 48, (1, 16))
    past = model(x, use_cache=True).kv
    y = x.clone()
    y[:, 4:8] = (y[:, 4:8] + 1) % 48
    cached = model(y[:, 4:8], past_kv=past, replace=(4, 8)).logits
    exact_on_changed_block = model(torch.cat([x[:, :4], y[:, 4:8], x[:, 8:]], 1)).logits[:, 4:8]
    torch.testing.assert_close(cached, exact_on_changed_block, rtol=0, atol=1e-5)


def test_kv_shape_and_inputs_embeds_path(model):
    x = torch.randint(0, 48, (3, 10))
    out = model(x, use_cache=True)
    assert out.logits.shape == (3, 10, 50)
    assert out.kv.shape == (2, 2, 3, 4, 10, 16)  # layers, k/v, batch, heads, tokens, head dim
    torch.testing.assert_close(model(inputs_embeds=model.embed(x)).logits, out.logits)


def test_replace_range_must_match_query_length(model):
    x = torch.randint(0, 48, (1, 10))
    past = model(x, use_cache=True).kv
    with pytest.raises(EngineError, match="replace range"):
        model(x[:, 2:5], past_kv=past, replace=(2, 6))


def test_config_missing_field_is_named():
    with pytest.raises(EngineError, match="mask_token_id"):
        tiny_llada(mask_token_id=None)
