"""LLaDA-MoE and LLaDA2: both checkpoint layouts load to the same logits, routing matches a
per-token reference, the post-RoPE cache is consistent, unsupported configs are refused."""

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from engine import GenerationConfig, run_diffusion, load_model, save_model
from engine.errors import EngineError
from engine.models import LLaDA2MoeModelLM, LLaDAMoEModelLM, LLaDAModelLM, model_class
from engine.models.llada_moe import lladamoe_config
from engine.models.moe import LING_MASK_TOKEN_ID

from .conftest import TINY_CONFIG
from .moe_models import LLADA2_CONFIG, LLADA_MOE_CONFIG, MASK, per_expert_state, save_per_expert, tiny_llada2, tiny_llada_moe

FAMILIES = {"llada_moe": tiny_llada_moe, "llada2": tiny_llada2}


def test_registry_picks_the_family_from_the_config():
    assert model_class(TINY_CONFIG) is LLaDAModelLM
    assert model_class(LLADA_MOE_CONFIG) is LLaDAMoEModelLM
    assert model_class({**LLADA_MOE_CONFIG, "model_type": "lladamoe"}) is LLaDAMoEModelLM
    assert model_class(LLADA2_CONFIG) is LLaDA2MoeModelLM


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_and_per_expert_layouts_give_identical_logits(tmp_path, family):
    model = FAMILIES[family]()
    save_model(model, tmp_path / "fused")
    save_per_expert(model, tmp_path / "per_expert")
    per_expert_names = load_file(tmp_path / "per_expert" / "model.safetensors").keys()
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in per_expert_names
    assert not any(n.endswith((".mlp.w1", ".mlp.w2")) for n in per_expert_names)
    assert "model.layers.1.mlp.w1" in load_file(tmp_path / "fused" / "model.safetensors")

    fused, unfused = load_model(tmp_path / "fused"), load_model(tmp_path / "per_expert")
    assert type(fused) is type(model)
    x = torch.randint(0, 38, (2, 11))
    expected = model(x).logits
    torch.testing.assert_close(fused(x).logits, expected, rtol=0, atol=0)
    torch.testing.assert_close(unfused(x).logits, expected, rtol=0, atol=0)


def test_missing_expert_tensor_is_named(tmp_path):
    model = tiny_llada_moe()
    state = per_expert_state(model)
    del state["model.layers.0.mlp.experts.3.up_proj.weight"]
    save_per_expert(model, tmp_path, state)
    with pytest.raises(EngineError, match=r"lacks tensor model\.layers\.0\.mlp\.experts\.3\.up_proj\.weight"):
        load_model(tmp_path)


def test_expert_of_the_wrong_shape_is_named(tmp_path):
    model = tiny_llada_moe()
    state = per_expert_state(model)
    state["model.layers.1.mlp.experts.2.down_proj.weight"] = torch.zeros(32, 15)
    save_per_expert(model, tmp_path, state)
    with pytest.raises(EngineError, match=r"model\.layers\.1\.mlp\.w2 cannot be built"):
        load_model(tmp_path)


def test_routers_stay_fp32_in_a_bf16_model(tmp_path):
    model = tiny_llada2()
    save_model(model, tmp_path)
    half = load_model(tmp_path, dtype=torch.bfloat16)
    moe = half.model.layers[1].mlp
    assert moe.gate.weight.dtype == moe.gate.expert_bias.dtype == torch.float32
    assert moe.w1.dtype == half.embedding_weight().dtype == torch.bfloat16
    x = torch.randint(0, 38, (1, 9))
    torch.testing.assert_close(half(x).logits.float(), model(x).logits, rtol=0.1, atol=0.15)


def _swiglu(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    gate, up = (w1 @ x).chunk(2)
    return w2 @ (F.silu(gate) * up)


def _reference_moe(moe, x: torch.Tensor, choose) -> torch.Tensor:
    """Per token, in float64: `choose(logits)` gives (experts, weights); sum their SwiGLUs."""
    rows = []
    for token in x.double():
        experts, weights = choose(moe.gate.weight.double() @ token)
        y = sum(w * _swiglu(moe.w1[j].double(), moe.w2[j].double(), token) for j, w in zip(experts, weights))
        if moe.shared_experts is not None:
            s = moe.shared_experts
            y = y + s.down_proj.weight.double() @ (F.silu(s.gate_proj.weight.double() @ token) * (s.up_proj.weight.double() @ token))
        rows.append(y)
    return torch.stack(rows).float()


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_softmax_router_matches_a_per_token_reference(norm_topk_prob):
    moe = tiny_llada_moe(norm_topk_prob=norm_topk_prob).model.layers[0].mlp
    k = LLADA_MOE_CONFIG["num_experts_per_tok"]

    def choose(logits):
        probs = torch.softmax(logits, dim=0).tolist()
        top = sorted(range(len(probs)), key=lambda j: -probs[j])[:k]
        weights = [probs[j] for j in top]
        total = sum(weights) if norm_topk_prob else 1.0
        return top, [w / total for w in weights]

    x = torch.randn(17, 32)
    torch.testing.assert_close(moe(x), _reference_moe(moe, x, choose), rtol=1e-5, atol=1e-5)


def test_grouped_sigmoid_router_matches_a_per_token_reference():
    cfg = LLADA2_CONFIG
    moe = tiny_llada2().model.layers[1].mlp
    k, groups, keep, scale = cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"], cfg["routed_scaling_factor"]

    def chooser(bias):
        def choose(logits):
            scores = torch.sigmoid(logits).tolist()
            biased = [s + b for s, b in zip(scores, bias)]
            size = len(scores) // groups
            group_score = [sum(sorted(biased[g * size : (g + 1) * size])[-2:]) for g in range(groups)]
            kept = sorted(range(groups), key=lambda g: -group_score[g])[:keep]
            eligible = [j for g in kept for j in range(g * size, (g + 1) * size)]
            top = sorted(eligible, key=lambda j: -biased[j])[:k]
            total = sum(scores[j] for j in top)
            return top, [scores[j] / total * scale for j in top]

        return choose

    x = torch.randn(17, 32)
    expected = _reference_moe(moe, x, chooser(moe.gate.expert_bias.tolist()))
    torch.testing.assert_close(moe(x), expected, rtol=1e-5, atol=1e-5)
    # the bias changes the choice somewhere, so a router that ignored it would fail above
    assert not torch.allclose(expected, _reference_moe(moe, x, chooser([0.0] * 8)), atol=1e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_forward_reuses_post_rope_keys_exactly(family):
    model = FAMILIES[family]()
    assert model.kv_rope == "post"
    x = torch.randint(0, 38, (2, 12))
    full = model(x, use_cache=True)
    part = model(x[:, 4:9], past_kv=full.kv, replace=(4, 9), use_cache=True)
    torch.testing.assert_close(part.logits, full.logits[:, 4:9], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(part.kv, full.kv[..., 4:9, :], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("smoothing, other_cache", [(False, "prefix"), (True, "vicinity")])
def test_llada_moe_cached_generation_with_refresh_every_forward_equals_no_cache(smoothing, other_cache):
    model = tiny_llada_moe()
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
    base = GenerationConfig(gen_length=8, block_length=4, smoothing=smoothing, early_stop=False)
    plain = run_diffusion(model, prompts, base)
    refreshed = run_diffusion(model, prompts, base.replace(cache="dual", refresh_every=1))
    assert refreshed.canvas.equal(plain.canvas)
    assert (run_diffusion(model, prompts, base.replace(cache=other_cache)).canvas != MASK).all()


def test_unsupported_and_incomplete_configs_are_refused():
    with pytest.raises(EngineError, match="shared_expert_intermediate_size"):
        LLaDAMoEModelLM({**LLADA_MOE_CONFIG, "shared_expert_intermediate_size": 64})
    with pytest.raises(EngineError, match="moe_layer_freq"):
        LLaDAMoEModelLM({**LLADA_MOE_CONFIG, "moe_layer_freq": [0, 1]})
    with pytest.raises(EngineError, match="score_function"):
        LLaDA2MoeModelLM({**LLADA2_CONFIG, "score_function": "softmax"})
    with pytest.raises(EngineError, match="n_group"):
        LLaDA2MoeModelLM({**LLADA2_CONFIG, "n_group": 3})
    with pytest.raises(EngineError, match="expert_intermediate_size"):
        LLaDAMoEModelLM({k: v for k, v in LLADA_MOE_CONFIG.items() if k != "expert_intermediate_size"})


def test_absent_special_ids_fall_back_to_the_ling_tokenizer_ids():
    cfg = lladamoe_config({k: v for k, v in LLADA_MOE_CONFIG.items() if k != "mask_token_id"})
    assert cfg["mask_token_id"] == LING_MASK_TOKEN_ID
    assert cfg["partial_rotary_factor"] == 1.0
    assert lladamoe_config({**LLADA_MOE_CONFIG, "partial_rotary_factor": -1})["partial_rotary_factor"] == 1.0
