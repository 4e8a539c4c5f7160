"""Component 4, the KV-cache manager: which forward each iteration runs, and the stored K/V.

Modes (algorithms.md §1.5, §2.5, §4):
- `none`: every iteration is a full forward over the canvas.
- `prefix`: a full refresh at block entry; then the query is the block and everything after it,
  `[s, N)`, against the cached prefix `[0, s)`.
- `dual`: a full refresh at block entry; then the query is the block `[s, e)` against the cached
  prefix and suffix.
- `vicinity`: dual with a window `[s - prefix_look, e + after_look)` recomputed every iteration,
  `warmup` uncached iterations at the start of a request, and a refresh at block entry.
  `persist_window` writes the window's fresh K/V back into the store (dInfer discards them).
`refresh_every` adds a full refresh every N iterations to any cached mode.

The store is one tensor `[n_layers, 2, B, H_kv, N, D]` per request, replaced whole on a full
refresh and written by slice when the window persists; the model merges a query's fresh K/V
into it out of place (models/layers.merge_past), so a plain cached forward never mutates it.
Whether keys are stored before or after RoPE is the model's business (`DiffusionLM.kv_rope`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import GenerationConfig

# Forward kinds, as the trace records them.
FULL = "full"  # no cache involved (mode none, or vicinity warm-up)
REFRESH = "refresh"  # full forward whose K/V become the new store
PREFIX = "prefix"
DUAL = "dual"
WINDOW = "window"


@dataclass(frozen=True)
class ForwardPlan:
    """One forward: its kind and the canvas range `[start, end)` fed to the model as queries."""

    kind: str
    start: int
    end: int

    @property
    def uses_cache(self) -> bool:
        return self.kind in (PREFIX, DUAL, WINDOW)

    @property
    def stores(self) -> bool:
        return self.kind == REFRESH


class KVCacheManager:
    """Plans each iteration's forward and holds the request's K/V store."""

    def __init__(self, config: GenerationConfig, canvas_length: int) -> None:
        self.mode = config.cache
        self.config = config
        self.length = canvas_length
        self.store: torch.Tensor | None = None
        self.refreshed_block: int | None = None
        self.since_refresh = 0

    def plan(self, iteration: int, block_index: int, start: int, end: int) -> ForwardPlan:
        """Decide the next forward from host-side counters only (no device read)."""
        cfg, n = self.config, self.length
        if self.mode == "none":
            return ForwardPlan(FULL, 0, n)
        if self.mode == "vicinity" and iteration < cfg.warmup:
            return ForwardPlan(FULL, 0, n)
        due = cfg.refresh_every is not None and self.since_refresh >= cfg.refresh_every
        if self.store is None or self.refreshed_block != block_index or due:
            return ForwardPlan(REFRESH, 0, n)
        if self.mode == "prefix":
            return ForwardPlan(PREFIX, start, n)
        if self.mode == "dual":
            return ForwardPlan(DUAL, start, end)
        return ForwardPlan(WINDOW, max(0, start - cfg.prefix_look), min(n, end + cfg.after_look))

    def past(self, plan: ForwardPlan) -> torch.Tensor | None:
        return self.store if plan.uses_cache else None

    def wants_kv(self, plan: ForwardPlan) -> bool:
        return plan.stores or (plan.kind == WINDOW and self.config.persist_window)

    def update(self, plan: ForwardPlan, block_index: int, kv: torch.Tensor | None) -> None:
        """Account for a finished forward: keep a refresh's K/V, persist a window if asked."""
        if plan.stores:
            self.store = kv
            self.refreshed_block = block_index
            self.since_refresh = 0
            return
        if plan.uses_cache:
            self.since_refresh += 1
        if plan.kind == WINDOW and self.config.persist_window and kv is not None and self.store is not None:
            self.store[:, :, :, :, plan.start : plan.end] = kv
