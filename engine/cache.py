"""Component 4, the KV-cache manager: which forward each iteration runs, and the stored K/V.

Modes (docs/algorithms.md §4.2-4.4):
- `none`: every iteration is a full forward over the canvas.
- `prefix`: a full refresh at block entry; then the query is the block and everything after it,
  `[s, N)`, against the cached prefix `[0, s)`.
- `dual`: a full refresh at block entry; then the query is the block `[s, e)` against the cached
  prefix and suffix.
- `vicinity`: dual with the window `[s - prefix_look, e + after_look)` (clipped to the canvas)
  recomputed every iteration, `warmup` uncached iterations at the start of the request (the
  per-request counter, so in practice only the first block), and a refresh at block entry.
`refresh_every=N` adds a refresh whenever N forwards have run since the last one (the refresh
counted), in every cached mode: N=1 makes every forward a refresh, hence exact. (dInfer's
`cache_update_freq` tests the global `iter_no % N` instead, and vicinity never refreshes block 0
periodically; neither quirk is reproduced.)

What is exact: a full or refresh forward always; a cached forward only while nothing outside its
query range has changed since the refresh, which for a bidirectional model is never after the
first decode (the cached K/V of the other positions were computed from the older canvas). The
staleness probe (`staleness`, recorded by the iteration manager) measures that error.

The store is one tensor `[n_layers, 2, B, H_kv, N, D]` per request: allocated by the first
refresh and overwritten in place by later ones (a stable address, as CUDA-graph capture needs).
A cached forward merges its fresh K/V into the store out of place (dInfer: the store changes only
on a refresh) or, with `persist_window`, writes them into the store's query slice in place.
Persisting never changes a logit: between two refreshes the query range is the same every
iteration, so a persisted slot is overwritten before any forward reads it; what it saves is the
merged copy of every layer's K/V. Whether keys are stored before or after RoPE is the model's
business (`DiffusionLM.kv_rope`, models/layers.cached_attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import GenerationConfig
from .models.base import DiffusionLM, ModelOutput

# Forward kinds, as the trace records them.
FULL = "full"  # no cache involved (mode none, or vicinity warm-up)
REFRESH = "refresh"  # full forward whose K/V become the new store
PREFIX = "prefix"
DUAL = "dual"
WINDOW = "window"


@dataclass(frozen=True)
class ForwardPlan:
    """One forward: its kind and the canvas range `[start, end)` fed to the model as queries
    (also the range whose K/V it computes fresh)."""

    kind: str
    start: int
    end: int

    @property
    def uses_cache(self) -> bool:
        return self.kind in (PREFIX, DUAL, WINDOW)


class KVCacheManager:
    """Plans each iteration's forward, runs it against the request's K/V store, keeps the store."""

    def __init__(self, config: GenerationConfig, canvas_length: int) -> None:
        self.mode = config.cache
        self.config = config
        self.length = canvas_length
        self.store: torch.Tensor | None = None
        self.refreshed_block: int | None = None
        self.since_refresh = 0  # forwards since the last refresh, the refresh included

    def plan(self, iteration: int, block_index: int, start: int, end: int) -> ForwardPlan:
        """Decide the next forward from host-side counters only (no device read)."""
        cfg, n = self.config, self.length
        if self.mode == "none" or (self.mode == "vicinity" and iteration < cfg.warmup):
            return ForwardPlan(FULL, 0, n)
        due = cfg.refresh_every is not None and self.since_refresh >= cfg.refresh_every
        if self.store is None or self.refreshed_block != block_index or due:
            return ForwardPlan(REFRESH, 0, n)
        if self.mode == "prefix":
            return ForwardPlan(PREFIX, start, n)
        if self.mode == "dual":
            return ForwardPlan(DUAL, start, end)
        return ForwardPlan(WINDOW, max(0, start - cfg.prefix_look), min(n, end + cfg.after_look))

    def forward(self, model: DiffusionLM, plan: ForwardPlan, block_index: int, **inputs: torch.Tensor) -> ModelOutput:
        """Run `plan` on `inputs` (token ids or embeddings of the canvas range `[start, end)`)."""
        if plan.kind == FULL:
            return model(**inputs)
        if plan.kind == REFRESH:
            out = model(**inputs, use_cache=True)
            if self.store is None:
                self.store = out.kv
            else:
                self.store.copy_(out.kv)
            self.refreshed_block = block_index
            self.since_refresh = 1
            return out
        self.since_refresh += 1
        return model(
            **inputs, past_kv=self.store, replace=(plan.start, plan.end), persist=self.config.persist_window
        )


def staleness(cached: torch.Tensor, exact: torch.Tensor, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position `[B, W]`: KL(exact || cached) of the next-token distributions, and whether the
    two top-1 tokens agree. Logits `[B, W, V]`; [MASK] is excluded as every decoder excludes it."""
    # fp64 copies: the caller's logits stay untouched, and rounding stays far below any real gap
    exact, cached = exact.to(torch.float64, copy=True), cached.to(torch.float64, copy=True)
    exact[..., mask_id] = float("-inf")
    cached[..., mask_id] = float("-inf")
    log_p, log_q = torch.log_softmax(exact, -1), torch.log_softmax(cached, -1)
    p = log_p.exp()
    kl = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)  # 0 * log 0 = 0 at [MASK]
    return kl.float(), exact.argmax(-1) == cached.argmax(-1)
