"""LLaDA dense (LLaDA-8B-Base/Instruct, LLaDA-1.5): a bidirectional Llama-style transformer.

Module names reproduce the real checkpoint's state-dict keys (`model.transformer.wte.weight`,
`model.transformer.blocks.{i}.q_proj.weight`, ...), so a Hugging Face folder loads with a strict
`load_state_dict` and nothing renamed. The cache holds keys *before* RoPE (`kv_rope = "pre"`, as
LLaDA's own code does): RoPE is applied after the merge, to all keys at `[0, T)` and to the queries
at `[a, b)` (layers.cached_attention).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import EngineError
from .base import DiffusionLM
from .layers import AttentionCache, RMSNorm, RotaryEmbedding, cached_attention, merge_heads, split_heads, token_embedding

# config.json fields this class reads, with the defaults of LLaDA-8B where the field is optional.
_DEFAULTS: dict[str, Any] = {
    "n_kv_heads": None,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "embedding_size": None,
    "weight_tying": False,
    "mlp_ratio": 4,
    "mlp_hidden_size": None,
    "max_sequence_length": 4096,
}
_REQUIRED = ("d_model", "n_heads", "n_layers", "vocab_size", "mask_token_id", "eos_token_id")


# Sizes that may be 0 or absent, meaning "derive me" (n_kv_heads = n_heads, and so on).
_OPTIONAL_SIZES = ("n_kv_heads", "embedding_size", "mlp_hidden_size", "mlp_ratio")


def llada_config(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` config.json with defaults filled in and the derived sizes checked."""
    missing = [k for k in _REQUIRED if raw.get(k) is None]
    if missing:
        raise EngineError(f"config.json lacks required LLaDA field(s): {', '.join(missing)}")
    cfg = {**_DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
    sizes = ("d_model", "n_heads", "n_layers", "vocab_size", "n_kv_heads", "embedding_size", "mlp_hidden_size", "mlp_ratio", "max_sequence_length")
    for key in sizes:
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < (0 if key in _OPTIONAL_SIZES else 1)):
            raise EngineError(f"config.json: {key} must be a positive integer, got {value!r}")
    cfg["n_kv_heads"] = cfg["n_kv_heads"] or cfg["n_heads"]
    cfg["embedding_size"] = cfg["embedding_size"] or cfg["vocab_size"]
    cfg["mlp_hidden_size"] = cfg["mlp_hidden_size"] or cfg["mlp_ratio"] * cfg["d_model"]
    if cfg["d_model"] % cfg["n_heads"] or cfg["n_heads"] % cfg["n_kv_heads"]:
        raise EngineError("config.json: d_model must divide by n_heads, and n_heads by n_kv_heads")
    return cfg


class LLaDABlock(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        d, h, hkv = cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"]
        self.n_heads, self.n_kv_heads, self.head_dim = h, hkv, d // h
        self.attn_norm = RMSNorm(d, cfg["rms_norm_eps"])
        self.q_proj = nn.Linear(d, h * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, hkv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, hkv * self.head_dim, bias=False)
        self.attn_out = nn.Linear(h * self.head_dim, d, bias=False)
        self.ff_norm = RMSNorm(d, cfg["rms_norm_eps"])
        # LLaDA names its SwiGLU gate `ff_proj` and the down projection `ff_out`.
        hidden = cfg["mlp_hidden_size"]
        self.ff_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.ff_out = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor, cache: AttentionCache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = self.attn_norm(x)
        q = split_heads(self.q_proj(n), self.n_heads, self.head_dim)
        k = split_heads(self.k_proj(n), self.n_kv_heads, self.head_dim)
        v = split_heads(self.v_proj(n), self.n_kv_heads, self.head_dim)
        att, k, v = cached_attention(q, k, v, cache)
        h = x + self.attn_out(merge_heads(att))
        n = self.ff_norm(h)
        return h + self.ff_out(F.silu(self.ff_proj(n)) * self.up_proj(n)), k, v


class LLaDAModelLM(DiffusionLM):
    """LLaDA dense. `config` is the checkpoint's config.json as a dict."""

    kv_rope = "pre"
    takes_shadow_block = True  # bidirectional, on the engine's layer stack

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = llada_config(config)
        cfg = self.config
        self.model = nn.Module()
        self.model.transformer = nn.ModuleDict(
            {
                "wte": token_embedding(cfg["embedding_size"], cfg["d_model"]),
                "blocks": nn.ModuleList(LLaDABlock(cfg) for _ in range(cfg["n_layers"])),
                "ln_f": RMSNorm(cfg["d_model"], cfg["rms_norm_eps"]),
            }
        )
        if not cfg["weight_tying"]:
            self.model.transformer["ff_out"] = nn.Linear(cfg["d_model"], cfg["embedding_size"], bias=False)
        self.rope = RotaryEmbedding(cfg["d_model"] // cfg["n_heads"], cfg["rope_theta"])

    @property
    def n_layers(self) -> int:
        return self.config["n_layers"]

    def embedding_weight(self) -> torch.Tensor:
        return self.model.transformer["wte"].weight

    def layer_modules(self) -> nn.ModuleList:
        return self.model.transformer["blocks"]

    def head(self, x: torch.Tensor) -> torch.Tensor:
        t = self.model.transformer
        x = t["ln_f"](x)
        return t["ff_out"](x) if "ff_out" in t else x @ t["wte"].weight.T
