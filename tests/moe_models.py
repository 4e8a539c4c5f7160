"""Tiny random LLaDA-MoE and LLaDA2 models, and their checkpoints in the Hugging Face per-expert
layout (save_model writes the stacked layout the models hold, which is dInfer's fused one)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.models.llada2 import LLaDA2MoeModelLM
from engine.models.llada_moe import LLaDAMoEModelLM

VOCAB, MASK, EOS = 40, 39, 38

LLADA_MOE_CONFIG = dict(
    model_type="llada",
    architectures=["LLaDAMoEModelLM"],
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    num_experts=8,
    num_experts_per_tok=3,
    expert_intermediate_size=16,
    norm_topk_prob=False,
    qk_layernorm=True,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    vocab_size=VOCAB,
    mask_token_id=MASK,
    eos_token_id=EOS,
    moe_layer_freq=[1, 1],
    shared_expert_intermediate_size=None,
)

LLADA2_CONFIG = dict(
    model_type="llada2_moe",
    architectures=["LLaDA2MoeModelLM"],
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    partial_rotary_factor=0.5,
    num_experts=8,
    num_experts_per_tok=3,
    moe_intermediate_size=8,
    intermediate_size=24,
    first_k_dense_replace=1,
    num_shared_experts=1,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    score_function="sigmoid",
    moe_router_enable_expert_bias=True,
    norm_topk_prob=True,
    use_qk_norm=True,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    vocab_size=VOCAB,
    mask_token_id=MASK,
    eos_token_id=EOS,
)


def _widen(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Default init gives near-uniform logits; wider weights make confidences and routes vary."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.normal_(0.0, 0.2)
    return model.eval().requires_grad_(False)


def tiny_llada_moe(seed: int = 0, **overrides) -> LLaDAMoEModelLM:
    torch.manual_seed(seed)
    return _widen(LLaDAMoEModelLM({**LLADA_MOE_CONFIG, **overrides}), seed)


def tiny_llada2(seed: int = 0, **overrides) -> LLaDA2MoeModelLM:
    torch.manual_seed(seed)
    return _widen(LLaDA2MoeModelLM({**LLADA2_CONFIG, **overrides}), seed)


def per_expert_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with every stacked `mlp.w1`/`mlp.w2` split into one tensor per
    expert, named as the Hugging Face checkpoints name them."""
    state = {}
    for name, t in model.state_dict().items():
        stacked = re.match(r"^(.*\.mlp)\.(w1|w2)$", name)
        if not stacked:
            state[name] = t.contiguous()
            continue
        prefix, which = stacked.groups()
        for j, expert in enumerate(t):
            if which == "w1":
                gate, up = expert.chunk(2)
                state[f"{prefix}.experts.{j}.gate_proj.weight"] = gate.contiguous()
                state[f"{prefix}.experts.{j}.up_proj.weight"] = up.contiguous()
            else:
                state[f"{prefix}.experts.{j}.down_proj.weight"] = expert.contiguous()
    return state


def save_per_expert(model: torch.nn.Module, folder: Path, state: dict[str, torch.Tensor] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config, indent=2) + "\n")
    save_file(state if state is not None else per_expert_state(model), folder / "model.safetensors")
    return folder


def save_llada2_folder(folder: Path, seed: int = 3) -> Path:
    """A random LLaDA2 checkpoint with the embedded character tokenizer (tiny-llada's), its special
    ids and vocabulary in range: a model folder the CLI, the app and the references load."""
    from engine import save_model
    from tinymodel.tokenizer import build_tokenizer, save_tokenizer, special_ids

    ids = special_ids()
    save_model(tiny_llada2(seed=seed, vocab_size=build_tokenizer().get_vocab_size(), mask_token_id=ids["mask_token_id"], eos_token_id=ids["eos_token_id"]), folder)
    save_tokenizer(folder)
    return folder
