"""Counting rules (docs/counting.md, with the model's own EOS/EoT ids).

- nfe: every model forward of the call (warm-up, refresh, cached, window, unrolled no-ops).
- tokens: per row, the generated positions (after the row's prompt) that hold neither an
  EOS/EoT id nor [MASK]; summed over rows.
- seconds: wall time of the block loop (forwards, decodes, early stop; not the canvas and cache set-up before it),
  device synchronised, minus the time spent recording the trace (reported separately).
- host_syncs: device-to-host reads the block loop waited on (one per group of iterations, one per
  block for early stop); loop unrolling exists to lower it.
- comm_seconds: of `seconds`, the time this process spent in all-reduces (a parallel engine's rank 0).
- compiles, captures, compile_seconds: graphs torch.compile compiled and CUDA graphs captured
  during the call (engine/runtime/compiled.py; 0 once the shapes are warm), and the wall time of the
  forwards that did it (inside `seconds`); graph_replays: forwards that replayed a CUDA graph.
- edits, remasks: committed tokens a revising decoder replaced or returned to [MASK] (0 for the
  others). A revising run's `tokens` are still the final ones, so its TPF is final tokens per
  forward, as LLaDA2.1 reports it: a token written, edited and written again counts once.
- a kind's own counters (`counts`, flattened into `to_dict`): the speculative kind's verified
  steps, accepted drafted tokens and skipped verifies (engine/kinds/speculative.py).
- tps = tokens / seconds / batch (tokens per second per sequence); tpf = tokens / nfe / batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class GenerationStats:
    nfe: int
    tokens: int
    seconds: float
    batch: int = 1
    trace_seconds: float = 0.0
    host_syncs: int = 0
    comm_seconds: float = 0.0
    compiles: int = 0
    captures: int = 0
    graph_replays: int = 0
    compile_seconds: float = 0.0
    edits: int = 0
    remasks: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds / self.batch if self.seconds > 0 else 0.0

    @property
    def tpf(self) -> float:
        return self.tokens / self.nfe / self.batch if self.nfe else 0.0

    @property
    def forwards_per_second(self) -> float:
        return self.nfe / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        flat = {k: v for k, v in asdict(self).items() if k != "counts"}
        return {**flat, **self.counts, "tps": self.tps, "tpf": self.tpf, "forwards_per_second": self.forwards_per_second}


def generated_mask(canvas: torch.Tensor, prompt_lengths: list[int], stop_ids: list[int], mask_id: int) -> torch.Tensor:
    """`[B, N]` True where a row holds a generated token that counts (after its prompt, not EOS/EoT/MASK)."""
    positions = torch.arange(canvas.shape[1], device=canvas.device)
    after_prompt = positions.unsqueeze(0) >= torch.tensor(prompt_lengths, device=canvas.device).unsqueeze(1)
    stop = torch.isin(canvas, torch.tensor(stop_ids + [mask_id], device=canvas.device))
    return after_prompt & ~stop
