"""LLaDA-MoE-7B-A1B (Base, Instruct, TD): an OLMoE-style bidirectional transformer (docs/algorithms.md §6.2).

Per layer: pre-norm attention with a per-head QK-norm (each head's q and k normalised over its own
`head_dim`, unlike upstream OLMoE's full-width norm) and RoPE, then a sparse MoE of SwiGLU experts
behind a softmax top-k router computed in fp32, not renormalised unless `norm_topk_prob`. The
cache holds keys after RoPE (`kv_rope = "post"`).

Checkpoints: the Hugging Face layout (`mlp.experts.{j}.{gate,up,down}_proj.weight`) and dInfer's
fused layout (`mlp.w1`, `mlp.w2`) both load; the layout is detected from the tensor names. Every
size comes from config.json.
"""

from __future__ import annotations

from typing import Any, Collection

import torch
from torch import nn

from ..errors import EngineError
from .base import DerivedTensor
from .layers import AttentionCache, RMSNorm, RotaryEmbedding, cached_attention, merge_heads, split_heads
from .moe import STACK_REQUIRED, DecoderStackLM, PreNormLayer, SoftmaxTopKRouter, SparseMoE, family_config, fused_expert_sources, reject_unsupported

_REQUIRED = STACK_REQUIRED + ("expert_intermediate_size",)
# Defaults are those of the model's own config class (LLaDAConfig in configuration_lladamoe.py).
_DEFAULTS: dict[str, Any] = {
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "norm_topk_prob": False,
    "qk_layernorm": False,
    "partial_rotary_factor": 1.0,
    "hidden_act": "silu",
}


def lladamoe_config(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` config.json with defaults filled in; sizes checked, unsupported variants refused."""
    cfg = family_config(raw, "LLaDA-MoE", _REQUIRED, _DEFAULTS)
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    if cfg["partial_rotary_factor"] <= 0:  # the config class's -1 means "not set": full rotary
        cfg["partial_rotary_factor"] = 1.0
    h, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if h % heads or heads % kv_heads:
        raise EngineError("config.json: hidden_size must divide by num_attention_heads, and that by num_key_value_heads")
    shared = cfg.get("shared_expert_intermediate_size")
    reject_unsupported(
        cfg,
        "LLaDA-MoE",
        {
            "moe_layer_freq": 0 in cfg.get("moe_layer_freq", []),  # dense layers
            "shared_expert_intermediate_size": shared is not None and shared > 0,
            "moe_router_enable_expert_bias": bool(cfg.get("moe_router_enable_expert_bias")),
            "moe_router_score_function": cfg.get("moe_router_score_function") not in (None, "softmax"),
            "attention_bias": bool(cfg.get("attention_bias")),
            "clip_qkv": cfg.get("clip_qkv") is not None,
        },
    )
    return cfg


class LLaDAMoEAttention(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.n_heads, self.n_kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = hidden // self.n_heads
        self.q_proj = nn.Linear(hidden, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, hidden, bias=False)
        if cfg["qk_layernorm"]:
            self.q_norm = RMSNorm(self.head_dim, cfg["rms_norm_eps"])
            self.k_norm = RMSNorm(self.head_dim, cfg["rms_norm_eps"])
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, cache: AttentionCache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q = split_heads(self.q_proj(x), self.n_heads, self.head_dim)
        k = split_heads(self.k_proj(x), self.n_kv_heads, self.head_dim)
        v = split_heads(self.v_proj(x), self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:  # per head, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        att, k, v = cached_attention(q, k, v, cache)
        return self.o_proj(merge_heads(att)), k, v


class LLaDAMoEDecoderLayer(PreNormLayer):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.input_layernorm = RMSNorm(hidden, cfg["rms_norm_eps"])
        self.self_attn = LLaDAMoEAttention(cfg)
        self.post_attention_layernorm = RMSNorm(hidden, cfg["rms_norm_eps"])
        router = SoftmaxTopKRouter(hidden, cfg["num_experts"], cfg["num_experts_per_tok"], cfg["norm_topk_prob"])
        self.mlp = SparseMoE(router, cfg["num_experts"], hidden, cfg["expert_intermediate_size"], shared=None)

    def attention_module(self) -> nn.Module:
        return self.self_attn


class LLaDAMoEModelLM(DecoderStackLM):
    """LLaDA-MoE. `config` is the checkpoint's config.json as a dict."""

    fp32_suffixes = ("mlp.gate.weight",)
    takes_shadow_block = True  # bidirectional, on the engine's layer stack

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        cfg = lladamoe_config(config)
        self.build_stack(cfg, "embed_tokens", (LLaDAMoEDecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"])))
        head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
        self.rope = RotaryEmbedding(int(head_dim * cfg["partial_rotary_factor"]), cfg["rope_theta"])

    def embedding_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight

    def checkpoint_sources(self, names: Collection[str]) -> dict[str, DerivedTensor]:
        return fused_expert_sources(names, self.config["num_experts"])
