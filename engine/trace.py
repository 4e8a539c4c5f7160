"""The per-iteration trace: the contract between the engine and everything that shows it.

One `Trace` per generate call, JSON-serialisable, schema version `TRACE_VERSION`:

header
  version, model (name), mask_id, eos_ids (every id that ends a row), prompt_lengths (per row),
  canvas_length, block_length, config (the GenerationConfig as a dict), initial (the canvas
  before the first iteration, per row: prompt ids then mask ids), tokens (id -> string for every
  id that occurs in the trace; filled by the pipeline, which has the tokenizer)
iterations: a list of records, one per forward + decode:
  iteration      global index in the request (0-based)
  block          block index; block_range [s, e) in canvas positions
  forward        "full" | "refresh" | "prefix" | "dual" | "window" (engine/cache.py)
  recomputed     list of [a, b) canvas ranges whose K/V this forward computed fresh
  threshold      the decoder threshold in force (None for the fixed decoder)
  committed      per row, the canvas positions written this iteration
  forced         per row, the subset committed only by the at-least-one rule
  top1           per row, per block position, the candidate token id
  confidence     per row, per block position, its probability (4 decimals)
  seconds        wall time of this iteration (forward + decode), device synchronised
  extras         decoder/cache specifics: name -> per row list (e.g. credit, anchors, staleness)
footer
  final (canvas per row), stats (engine/stats.py), trace_seconds (time spent recording)

Replaying `committed` with `top1` from `initial` rebuilds every intermediate canvas, which is
how the app scrubs through a run without the model.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

TRACE_VERSION = 1


@dataclass
class IterationRecord:
    iteration: int
    block: int
    block_range: list[int]
    forward: str
    recomputed: list[list[int]]
    threshold: float | None
    committed: list[list[int]]
    forced: list[list[int]]
    top1: list[list[int]]
    confidence: list[list[float]]
    seconds: float
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trace:
    version: int = TRACE_VERSION
    model: str = ""
    mask_id: int = 0
    eos_ids: list[int] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)
    canvas_length: int = 0
    block_length: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    initial: list[list[int]] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)
    iterations: list[IterationRecord] = field(default_factory=list)
    final: list[list[int]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    trace_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trace":
        if data.get("version") != TRACE_VERSION:
            raise ValueError(f"trace version {data.get('version')!r} is not {TRACE_VERSION}")
        fields = dict(data)
        fields["iterations"] = [IterationRecord(**r) for r in data.get("iterations", [])]
        return cls(**fields)

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        return cls.from_dict(json.loads(text))

    def canvas_at(self, iteration: int) -> list[list[int]]:
        """Canvas per row after record `iteration` (-1: before the first), rebuilt from commits."""
        canvas = [list(row) for row in self.initial]
        for rec in self.iterations[: iteration + 1]:
            s = rec.block_range[0]
            for row, positions in enumerate(rec.committed):
                for p in positions:
                    canvas[row][p] = rec.top1[row][p - s]
        return canvas


class TraceRecorder:
    """Builds IterationRecords from device tensors; times itself so its cost can be reported."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace

    def record(
        self,
        *,
        iteration: int,
        block: int,
        block_range: tuple[int, int],
        forward: str,
        recomputed: list[tuple[int, int]],
        threshold: float | None,
        commit: torch.Tensor,
        forced: torch.Tensor,
        tokens: torch.Tensor,
        confidence: torch.Tensor,
        seconds: float,
        extras: dict[str, torch.Tensor],
    ) -> IterationRecord:
        t0 = time.perf_counter()
        s = block_range[0]
        rec = IterationRecord(
            iteration=iteration,
            block=block,
            block_range=list(block_range),
            forward=forward,
            recomputed=[list(r) for r in recomputed],
            threshold=threshold,
            committed=[(row.nonzero().flatten() + s).tolist() for row in commit.cpu()],
            forced=[(row.nonzero().flatten() + s).tolist() for row in forced.cpu()],
            top1=tokens.cpu().tolist(),
            confidence=[[round(c, 4) for c in row] for row in confidence.float().cpu().tolist()],
            seconds=seconds,
            extras={k: _jsonable(v) for k, v in extras.items()},
        )
        self.trace.iterations.append(rec)
        self.trace.trace_seconds += time.perf_counter() - t0
        return rec


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.is_floating_point():
            return [[round(x, 4) for x in row] for row in value.float().tolist()] if value.dim() == 2 else value.tolist()
        return value.tolist()
    return value
