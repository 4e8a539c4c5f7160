"""LLaDA2.0-mini / -flash (BailingMoeV2, "Ling" architecture) with block-causal attention
(docs/algorithms.md §6.3, §5).

Per layer: pre-norm attention with a fused `query_key_value` projection (rows `[q | k | v]`), GQA,
a per-head QK-norm, and RoPE on the first `partial_rotary_factor · head_dim` dims of each head;
then a dense SwiGLU MLP for the first `first_k_dense_replace` layers and a sparse MoE elsewhere
(grouped sigmoid routing with an expert bias and routed scaling, plus a shared expert). The cache
holds keys after RoPE (`kv_rope = "post"`).

The model was trained block-causal (a token sees its own block and every earlier one), so
`block_causal = True` and engine.generate runs it with the block-causal cache policy
(engine/cache.py: BlockCausalCache), whose prefix cache is exact. The attention pattern is the caller's: this class attends to whatever keys it is
given, within `attention_mask`.

Checkpoints: per-expert Hugging Face keys or pre-fused `mlp.w1`/`mlp.w2`, detected from the names.
Every size comes from config.json.
"""

from __future__ import annotations

from typing import Any, Collection

import torch
from torch import nn

from ..errors import EngineError
from .base import DerivedTensor
from .layers import AttentionCache, RMSNorm, RotaryEmbedding, cached_attention, merge_heads, split_heads
from .moe import STACK_REQUIRED, DecoderStackLM, GatedMLP, GroupedSigmoidRouter, PreNormLayer, SparseMoE, family_config, fused_expert_sources, reject_unsupported

_REQUIRED = STACK_REQUIRED + ("num_key_value_heads", "moe_intermediate_size")
# Defaults are those of the model's own config class (LLaDA2MoeConfig) where it has one.
_DEFAULTS: dict[str, Any] = {
    "head_dim": None,
    "partial_rotary_factor": 1.0,
    "rms_norm_eps": 1e-6,
    "num_shared_experts": 0,
    "first_k_dense_replace": 0,
    "intermediate_size": None,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
    "score_function": "sigmoid",
    "moe_router_enable_expert_bias": True,
    "norm_topk_prob": True,
    "use_qk_norm": True,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


def llada2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` config.json with defaults filled in; sizes checked, unsupported variants refused."""
    cfg = family_config(raw, "LLaDA2", _REQUIRED, _DEFAULTS)
    cfg["head_dim"] = cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"]
    if cfg["partial_rotary_factor"] <= 0:  # a config class's -1 means "not set": full rotary
        cfg["partial_rotary_factor"] = 1.0
    experts, groups = cfg["num_experts"], cfg["n_group"]
    checks = [
        (cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0, "num_attention_heads must divide by num_key_value_heads"),
        (experts % groups == 0 and experts // groups >= 2, "num_experts must split into n_group groups of at least 2"),
        (1 <= cfg["topk_group"] <= groups, "topk_group must be between 1 and n_group"),
        (cfg["num_experts_per_tok"] <= experts // groups * cfg["topk_group"], "num_experts_per_tok exceeds the experts of topk_group groups"),
        (cfg["first_k_dense_replace"] == 0 or cfg["intermediate_size"], "first_k_dense_replace > 0 needs intermediate_size"),
    ]
    for ok, message in checks:
        if not ok:
            raise EngineError(f"config.json: {message}")
    reject_unsupported(
        cfg,
        "LLaDA2",
        {
            "score_function": cfg["score_function"] != "sigmoid",
            "use_qkv_bias": bool(cfg.get("use_qkv_bias")),
            "use_bias": bool(cfg.get("use_bias")),
            "num_nextn_predict_layers": bool(cfg.get("num_nextn_predict_layers")),  # MTP heads
        },
    )
    return cfg


class LLaDA2Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.n_heads, self.n_kv_heads, self.head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.query_key_value = nn.Linear(hidden, (self.n_heads + 2 * self.n_kv_heads) * self.head_dim, bias=False)
        if cfg["use_qk_norm"]:
            self.query_layernorm = RMSNorm(self.head_dim, cfg["rms_norm_eps"])
            self.key_layernorm = RMSNorm(self.head_dim, cfg["rms_norm_eps"])
        else:
            self.query_layernorm = self.key_layernorm = None
        self.dense = nn.Linear(self.n_heads * self.head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cache: AttentionCache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        qkv = split_heads(self.query_key_value(x), self.n_heads + 2 * self.n_kv_heads, self.head_dim)
        q, k, v = qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=1)
        if self.query_layernorm is not None:  # per head, before RoPE
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        att, k, v = cached_attention(q, k, v, cache)
        return self.dense(merge_heads(att)), k, v


class LLaDA2DecoderLayer(PreNormLayer):
    def __init__(self, cfg: dict[str, Any], index: int) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.input_layernorm = RMSNorm(hidden, cfg["rms_norm_eps"])
        self.attention = LLaDA2Attention(cfg)
        self.post_attention_layernorm = RMSNorm(hidden, cfg["rms_norm_eps"])
        if index < cfg["first_k_dense_replace"]:
            self.mlp: nn.Module = GatedMLP(hidden, cfg["intermediate_size"])
            return
        router = GroupedSigmoidRouter(
            hidden,
            cfg["num_experts"],
            cfg["num_experts_per_tok"],
            cfg["n_group"],
            cfg["topk_group"],
            cfg["norm_topk_prob"],
            cfg["routed_scaling_factor"],
            cfg["moe_router_enable_expert_bias"],
        )
        moe_hidden = cfg["moe_intermediate_size"]
        shared = GatedMLP(hidden, moe_hidden * cfg["num_shared_experts"]) if cfg["num_shared_experts"] else None
        self.mlp = SparseMoE(router, cfg["num_experts"], hidden, moe_hidden, shared)

    def attention_module(self) -> nn.Module:
        return self.attention


class LLaDA2MoeModelLM(DecoderStackLM):
    """LLaDA2 (BailingMoeV2). `config` is the checkpoint's config.json as a dict."""

    fp32_suffixes = ("mlp.gate.weight", "mlp.gate.expert_bias")
    block_causal = True

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        cfg = llada2_config(config)
        self.build_stack(cfg, "word_embeddings", (LLaDA2DecoderLayer(cfg, i) for i in range(cfg["num_hidden_layers"])))
        self.rope = RotaryEmbedding(int(cfg["head_dim"] * cfg["partial_rotary_factor"]), cfg["rope_theta"])

    def embedding_weight(self) -> torch.Tensor:
        return self.model.word_embeddings.weight

    def checkpoint_sources(self, names: Collection[str]) -> dict[str, DerivedTensor]:
        return fused_expert_sources(names, self.config["num_experts"])
