"""Pieces shared by the MoE families (LLaDA-MoE, LLaDA2): routers, the expert bank, a SwiGLU MLP,
the fused-expert checkpoint layout, and the decoder stack's forward.

Experts are stored stacked, as dInfer's fused checkpoints hold them: `w1` `[E, 2I, H]` (each
expert's gate rows, then its up rows) and `w2` `[E, H, I]`. A checkpoint with one tensor per
expert (`mlp.experts.{j}.{gate,up,down}_proj.weight`, the Hugging Face layout) is stacked at load
time (`fused_expert_sources`). Tokens are grouped by expert: the (token, expert) pairs are sorted
by expert and each active expert runs its SwiGLU (two matmuls) once over all its tokens. That
reads per-expert counts on the host; a static-shape forward (torch.compile, CUDA graphs) uses the
capture-safe form instead, `SparseMoE.experts_static`.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import EngineError
from .base import DerivedTensor, DiffusionLM
from .layers import AttentionCache, RMSNorm, token_embedding

# dInfer hard-codes these ids for the Ling tokenizer that LLaDA-MoE and LLaDA2 share; they are
# used only when config.json does not name them.
LING_MASK_TOKEN_ID = 156895
LING_EOS_TOKEN_ID = 156892


# config.json fields both MoE families require (each adds its own expert-size field)
STACK_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_experts", "num_experts_per_tok", "vocab_size", "rope_theta")


def family_config(raw: dict[str, Any], family: str, required: Iterable[str], defaults: dict[str, Any]) -> dict[str, Any]:
    """`raw` config.json with `defaults` filled in where a field is absent or null."""
    missing = [k for k in required if raw.get(k) is None]
    if missing:
        raise EngineError(f"config.json lacks required {family} field(s): {', '.join(missing)}")
    cfg = {**defaults, **{k: v for k, v in raw.items() if v is not None}}
    cfg.setdefault("mask_token_id", LING_MASK_TOKEN_ID)
    cfg.setdefault("eos_token_id", LING_EOS_TOKEN_ID)
    if isinstance(cfg["eos_token_id"], list):  # some configs list several; the first pads rows
        cfg["eos_token_id"] = cfg["eos_token_id"][0]
    return cfg


def reject_unsupported(cfg: dict[str, Any], family: str, checks: dict[str, bool]) -> None:
    """Raise for the first config field (name -> is its value unsupported?) this implementation
    does not cover, rather than silently computing something else; both families refuse RoPE
    scaling and an activation other than SiLU."""
    shared = {"rope_scaling": cfg.get("rope_scaling") is not None, "hidden_act": cfg.get("hidden_act", "silu") != "silu"}
    for field, bad in {**checks, **shared}.items():
        if bad:
            raise EngineError(f"config.json: {family} with {field}={cfg.get(field)!r} is not supported")


class GatedMLP(nn.Module):
    """SwiGLU MLP with Hugging Face names: `down_proj(silu(gate_proj(x)) * up_proj(x))`."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SoftmaxTopKRouter(nn.Module):
    """OLMoE router (LLaDA-MoE): softmax over all experts in fp32, top-k, renormalised only when
    `norm_topk_prob` (LLaDA-MoE's config says false: the k weights sum to less than 1)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, norm_topk_prob: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`x` `[T, H]` -> (expert ids `[T, k]`, fp32 weights `[T, k]`)."""
        probs = torch.softmax(F.linear(x.float(), self.weight.float()), dim=-1)
        weight, idx = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weight = weight / weight.sum(dim=-1, keepdim=True)
        return idx, weight


class GroupedSigmoidRouter(nn.Module):
    """BailingMoeV2 router (LLaDA2): sigmoid scores in fp32; the expert bias steers the choice only.

    The experts form `n_group` groups; a group scores the sum of its two best biased scores and the
    `topk_group` best groups stay eligible; the top-k experts by biased score among them are chosen.
    Their weights are the unbiased scores, normalised to sum to 1 when `norm_topk_prob`, times
    `routed_scaling_factor`.
    """

    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        n_group: int,
        topk_group: int,
        norm_topk_prob: bool,
        routed_scaling_factor: float,
        expert_bias: bool,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if expert_bias:
            self.register_buffer("expert_bias", torch.zeros(num_experts))
        else:
            self.expert_bias = None
        self.top_k, self.n_group, self.topk_group = top_k, n_group, topk_group
        self.norm_topk_prob, self.scale = norm_topk_prob, routed_scaling_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`x` `[T, H]` -> (expert ids `[T, k]`, fp32 weights `[T, k]`)."""
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))
        biased = scores if self.expert_bias is None else scores + self.expert_bias.float()
        tokens, experts = biased.shape
        group_score = biased.view(tokens, self.n_group, -1).topk(2, dim=-1).values.sum(dim=-1)
        best_groups = group_score.topk(self.topk_group, dim=-1).indices
        eligible = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best_groups, True)
        eligible = eligible.repeat_interleave(experts // self.n_group, dim=1)
        idx = biased.masked_fill(~eligible, float("-inf")).topk(self.top_k, dim=-1).indices
        weight = scores.gather(1, idx)
        if self.norm_topk_prob and self.top_k > 1:
            weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, weight * self.scale


class SparseMoE(nn.Module):
    """Routed SwiGLU experts (stacked `w1`/`w2`), plus an optional shared expert added to every token.

    Under expert parallelism this rank holds experts `[first_expert, first_expert + E_local)`;
    under tensor parallelism a slice of every expert's hidden units. Either way its routed sum is
    partial, and `engine.runtime.parallel` sets `reduce` (its all-reduce) so that the sum is completed
    (in fp32) before the replicated shared expert's output is added. `capture_safe` (set by
    engine/runtime/compiled.py around its forwards) selects `experts_static`, the form without a host sync.
    """

    def __init__(self, gate: nn.Module, num_experts: int, hidden: int, intermediate: int, shared: GatedMLP | None) -> None:
        super().__init__()
        self.gate = gate
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        nn.init.uniform_(self.w1, -1 / math.sqrt(hidden), 1 / math.sqrt(hidden))
        nn.init.uniform_(self.w2, -1 / math.sqrt(intermediate), 1 / math.sqrt(intermediate))
        self.shared_experts = shared
        self.first_expert = 0
        self.reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.capture_safe = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        idx, weight = self.gate(flat)
        routed = (self.experts_static if self.capture_safe else self.experts)(flat, idx, weight)
        if self.reduce is not None:
            routed = self.reduce(routed)
        out = routed.to(x.dtype)
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view_as(x)

    def experts(self, x: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Σ_k weight[t, k] · expert_{idx[t, k]}(x[t]) over this rank's experts, in fp32 `[T, H]`.

        The `T·k` (token, expert) pairs are sorted by expert and their tokens gathered in that
        order once; each local expert with tokens runs one SwiGLU over its contiguous run (a slice),
        and the runs, weighted, are put back at their pair's slot of a `[T·k, H]` buffer (pairs of
        other ranks' experts add 0) and summed over k in a fixed order, so the sum is deterministic
        (no atomic scatter-add). Per expert only its two matmuls are dispatched: on a small model
        those dispatches are the forward's cost. Reading the per-expert counts is one host sync per
        MoE layer.
        """
        tokens, k = idx.shape
        pairs = idx.reshape(-1)
        order = pairs.argsort(stable=True)
        counts = torch.bincount(pairs, minlength=self.num_experts)
        starts = counts.cumsum(0) - counts
        local = slice(self.first_expert, self.first_expert + self.w1.shape[0])
        runs = torch.stack([starts[local], counts[local]]).tolist()
        first = runs[0][0]
        pick = order[first : runs[0][-1] + runs[1][-1]]  # the pairs of this rank's experts, by expert
        grouped = x[pick // k]  # each one's token
        outs = []
        for start, count, w1, w2 in zip(*runs, self.w1.unbind(0), self.w2.unbind(0)):
            if count:
                gate, up = F.linear(grouped[start - first : start - first + count], w1).chunk(2, dim=-1)
                outs.append(F.linear(F.silu(gate) * up, w2))
        slots = x.new_zeros(tokens * k, x.shape[-1], dtype=torch.float32)
        if outs:
            slots.index_copy_(0, pick, torch.cat(outs).float() * weight.reshape(-1, 1).float()[pick])
        return slots.view(tokens, k, -1).sum(dim=1)

    def experts_static(self, x: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """`experts` without a host sync or a data-dependent shape, so that torch.compile makes
        one graph of it and a CUDA graph can capture it: every local expert runs over every token
        (one batched matmul per weight), then each (token, expert) pair takes its expert's row and
        the k rows are summed in the same order as `experts` sums them (equal results, up to the
        matmul kernels' rounding).

        The price is E_local/k times the routed FLOPs. A cached forward's few query tokens already
        reach nearly every expert (64 experts, top-8, 32 tokens: 63.1 expected, docs/performance.md
        §1.2), so its weights are read in full either way and it stays bandwidth-bound; a full
        forward over a long canvas does pay the extra compute (docs/algorithms.md §6.5).
        """
        tokens, k = idx.shape
        local = idx - self.first_expert
        mine = (local >= 0) & (local < self.w1.shape[0])  # pairs routed to this rank's experts
        gate, up = torch.matmul(x, self.w1.transpose(1, 2)).chunk(2, dim=-1)  # [E_local, T, I] each
        out = torch.matmul(F.silu(gate) * up, self.w2.transpose(1, 2)).float()  # [E_local, T, H]
        rows = out[local.clamp(0, self.w1.shape[0] - 1), torch.arange(tokens, device=x.device).unsqueeze(1)]  # [T, k, H]
        rows = rows * weight.float().unsqueeze(-1)
        return torch.where(mine.unsqueeze(-1), rows, torch.zeros_like(rows)).sum(dim=1)


_EXPERT_KEY = re.compile(r"^(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def fused_expert_sources(names: Iterable[str], num_experts: int) -> dict[str, DerivedTensor]:
    """For a checkpoint with one tensor per expert: how to build each layer's stacked `w1`/`w2`.

    `w1[j] = cat(gate_proj_j, up_proj_j)` and `w2[j] = down_proj_j`, dInfer's fused layout
    (tools/transfer.py). Layers already stored fused (`mlp.w1`/`mlp.w2`) need nothing.
    """
    prefixes = sorted({m.group(1) for m in map(_EXPERT_KEY.match, names) if m})
    sources: dict[str, DerivedTensor] = {}
    for p in prefixes:
        experts = range(num_experts)
        sources[f"{p}.w1"] = DerivedTensor(
            tuple(f"{p}.experts.{j}.{proj}.weight" for j in experts for proj in ("gate_proj", "up_proj")),
            lambda ts: torch.stack([torch.cat(ts[i : i + 2]) for i in range(0, len(ts), 2)]),
        )
        sources[f"{p}.w2"] = DerivedTensor(
            tuple(f"{p}.experts.{j}.down_proj.weight" for j in experts),
            torch.stack,
        )
    return sources


class PreNormLayer(nn.Module):
    """`h = x + attention(input_layernorm(x))`, then `h + mlp(post_attention_layernorm(h))`.

    Both MoE families' layers; each builds the norms and `mlp` and names its attention module as
    its checkpoint does, returned by `attention_module`.
    """

    input_layernorm: nn.Module
    post_attention_layernorm: nn.Module
    mlp: nn.Module

    def attention_module(self) -> nn.Module:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, cache: AttentionCache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        att, k, v = self.attention_module()(self.input_layernorm(x), cache)
        h = x + att
        return h + self.mlp(self.post_attention_layernorm(h)), k, v


class DecoderStackLM(DiffusionLM):
    """The forward both MoE families share: embeddings, `model.layers`, `model.norm`, `lm_head`.

    Subclasses build `self.model` (with `layers` and `norm`), `self.rope`, `self.lm_head` (None when
    the embeddings are tied) and implement `embedding_weight`. A layer is called as
    `layer(x, cache) -> (x, k, v)` (DiffusionLM.forward); K/V are cached after RoPE (`kv_rope = "post"`).
    """

    kv_rope = "post"
    lm_head: nn.Linear | None

    def build_stack(self, cfg: dict[str, Any], embedding: str, layers: Iterable[nn.Module]) -> None:
        """`config`, and `model` as the checkpoint names it (the embedding under `embedding`,
        `layers`, `norm`) with `lm_head` (None when the embeddings are tied)."""
        hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
        self.config = cfg
        self.model = nn.Module()
        setattr(self.model, embedding, token_embedding(vocab, hidden))
        self.model.layers = nn.ModuleList(layers)
        self.model.norm = RMSNorm(hidden, cfg["rms_norm_eps"])
        self.lm_head = None if cfg["tie_word_embeddings"] else nn.Linear(hidden, vocab, bias=False)

    def layer_modules(self) -> nn.ModuleList:
        return self.model.layers

    def head(self, x: torch.Tensor) -> torch.Tensor:
        x = self.model.norm(x)
        return self.lm_head(x) if self.lm_head is not None else x @ self.embedding_weight().T
