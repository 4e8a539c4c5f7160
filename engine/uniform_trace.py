"""A uniform-state step in the trace: the `IterationRecord.uniform` dict (docs/trace.md §2.2).
`Trace.canvas_at` replays it (engine/trace.py: record_writes).

The record's own fields keep their meaning: `committed` lists the positions accepted this step,
`top1` the proposal sampled at every canvas position and `confidence` its probability under the
temperature-scaled softmax. `uniform` adds what the entropy-bound rule, the re-noising and the
adaptive stop decided, per row unless said otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cache import PREFIX, ForwardPlan
from .decoders import DecodeResult
from .trace import IterationRecord, TraceRecorder


@dataclass
class UniformStep:
    """One denoising step's tensors (`[B, W]` per position, `[B]` per row)."""

    block: int
    block_range: tuple[int, int]
    step: int
    steps_left: int
    temperature: float
    bound: float
    active: torch.Tensor
    accepted: torch.Tensor
    proposal: torch.Tensor
    confidence: torch.Tensor
    noise: torch.Tensor
    entropy: torch.Tensor
    lower_sum: torch.Tensor
    draft: torch.Tensor
    stable: torch.Tensor
    confident: torch.Tensor
    mean_entropy: torch.Tensor
    stopped: torch.Tensor
    stability_threshold: int
    confidence_threshold: float
    start: torch.Tensor | None
    output: torch.Tensor | None


def _rounded(t: torch.Tensor) -> list:
    return [[round(v, 4) for v in row] for row in t.float().cpu().tolist()] if t.dim() == 2 else [round(v, 4) for v in t.float().cpu().tolist()]


def uniform_state(step: UniformStep) -> dict:
    """The record's `uniform` dict (JSON types only)."""
    s = step.block_range[0]
    renoised = ~step.accepted & step.active[:, None]
    noise = step.noise.cpu().tolist()
    positions = [row.nonzero().flatten().tolist() for row in renoised.cpu()]
    return {
        "step": step.step,
        "steps_left": step.steps_left,
        "temperature": round(step.temperature, 6),
        "bound": step.bound,
        "active": step.active.cpu().tolist(),
        "entropy": _rounded(step.entropy),
        "entropy_sum": _rounded(step.lower_sum),
        "draft": step.draft.cpu().tolist(),
        "renoised": [[p + s for p in row] for row in positions],
        "noise": [[noise[r][p] for p in row] for r, row in enumerate(positions)],
        "start": step.start.cpu().tolist() if step.start is not None else None,
        "output": step.output.cpu().tolist() if step.output is not None else None,
        "stopping": {
            "stable": step.stable.cpu().tolist(),
            "confident": step.confident.cpu().tolist(),
            "mean_entropy": _rounded(step.mean_entropy),
            "stopped": step.stopped.cpu().tolist(),
            "stability_threshold": step.stability_threshold,
            "confidence_threshold": step.confidence_threshold,
        },
    }


def record_step(recorder: TraceRecorder, iteration: int, step: UniformStep, seconds: float) -> IterationRecord:
    """Append the step's record to the recorder's trace and return it."""
    s, e = step.block_range
    # the decoder reads the cached prefix (prompt and earlier canvases) and computes the canvas
    plan = ForwardPlan(PREFIX, s, e)
    # no forced commits: the lowest-entropy position passes the rule by itself
    result = DecodeResult(step.proposal, step.confidence, step.accepted, torch.zeros_like(step.accepted))
    rec = recorder.record(iteration, step.block, (s, e), plan, result, threshold=None, seconds=seconds, staleness={})
    rec.uniform = uniform_state(step)
    u = rec.uniform
    ids = {i for key in ("draft", "noise", "start", "output") for row in (u[key] or []) for i in row}
    recorder._add_tokens(ids)  # TraceRecorder.record has no `uniform` argument yet: its ids, as record adds top1's
    return rec
