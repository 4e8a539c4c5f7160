"""Two traces of one prompt, step by step (docs/analysis.md §2): where their canvases first
differ, what each side believed there, and whether they end equal.

Steps are aligned within blocks: the j-th record of block b on one side against the j-th record of
block b on the other; where one side ran fewer steps in a block (diffusers' LLaDA2Pipeline runs
one more forward after a block's last mask than the engine does), its last canvas in that block
stands for the missing steps. The canvas after a record is `Trace.canvas_at`'s (built here
incrementally, with the same `record_writes`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import EngineError
from .trace import IterationRecord, Trace, record_writes


@dataclass
class Side:
    """What one trace held at the divergence: its record (None: it ran no such step and holds its
    last canvas), the canvas token there, and the record's top-1, confidence and candidates at the
    position when the position lies in the record's block (candidates None when not recorded)."""

    record: int | None
    token: int
    top1: int | None = None
    confidence: float | None = None
    candidates: list[list[float]] | None = None
    text: str = ""


@dataclass
class Divergence:
    step: int  # the aligned step (0-based)
    block: int
    block_step: int  # the step's index inside its block
    position: int
    a: Side
    b: Side


@dataclass
class TraceDiff:
    steps_a: int
    steps_b: int
    blocks_a: dict[int, int]  # block -> records
    blocks_b: dict[int, int]
    first: Divergence | None
    final_equal: bool
    final_position: int | None  # first position where the final canvases differ
    aligned: list[tuple[int | None, int | None]] = field(default_factory=list)

    @property
    def steps_equal(self) -> bool:
        return self.steps_a == self.steps_b and self.blocks_a == self.blocks_b

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("aligned")
        d["steps_equal"] = self.steps_equal
        d["blocks_a"] = {str(k): v for k, v in self.blocks_a.items()}
        d["blocks_b"] = {str(k): v for k, v in self.blocks_b.items()}
        return d

    def summary(self) -> str:
        """The lines `python -m engine diff` prints."""
        steps = "equal" if self.steps_equal else "differ" + ("" if self.steps_a != self.steps_b else " per block")
        lines = [f"steps: A {self.steps_a}, B {self.steps_b} ({steps})"]
        if self.first is None:
            lines.append("first divergence: none (every aligned canvas is equal)")
        else:
            d = self.first
            lines.append(f"first divergence: step {d.step} (block {d.block}, step {d.block_step} in it; A record {_rec(d.a)}, B record {_rec(d.b)}) at position {d.position}")
            lines += [f"  {name}: {_side(side)}" for name, side in (("A", d.a), ("B", d.b))]
        lines.append("final tokens: equal" if self.final_equal else f"final tokens: differ (first at position {self.final_position})")
        return "\n".join(lines)


def _rec(side: Side) -> str:
    return "-" if side.record is None else str(side.record)


def _side(side: Side) -> str:
    text = f"token {side.token}{f' {side.text!r}' if side.text else ''}"
    if side.top1 is not None:
        text += f"; top-1 {side.top1} p {side.confidence}"
    if side.candidates:
        text += "; candidates " + ", ".join(f"{int(i)} {p}" for i, p in side.candidates)
    return text


def canvases(trace: Trace, row: int = 0) -> list[list[int]]:
    """Row `row`'s canvas after each record (what `trace.canvas_at(i)[row]` gives), in one pass."""
    canvas, out = list(trace.initial[row]), []
    for rec in trace.iterations:
        for p, token in record_writes(rec, row, trace.kind):
            canvas[p] = token
        out.append(list(canvas))
    return out


def _by_block(trace: Trace) -> dict[int, list[int]]:
    blocks: dict[int, list[int]] = {}
    for i, rec in enumerate(trace.iterations):
        blocks.setdefault(rec.block, []).append(i)
    return blocks


def align(a: Trace, b: Trace) -> list[tuple[int | None, int | None, int, int]]:
    """(record of A, record of B, block, step in block) per aligned step; None where a side ran
    no such step (it holds its last canvas)."""
    ba, bb = _by_block(a), _by_block(b)
    steps = []
    for block in sorted(set(ba) | set(bb)):
        ra, rb = ba.get(block, []), bb.get(block, [])
        steps += [(ra[j] if j < len(ra) else None, rb[j] if j < len(rb) else None, block, j) for j in range(max(len(ra), len(rb)))]
    return steps


def diff_traces(a: Trace, b: Trace, row_a: int = 0, row_b: int = 0) -> TraceDiff:
    """Compare row `row_a` of `a` with row `row_b` of `b`; EngineError when they are not of one
    prompt (different initial canvases) or a row does not exist."""
    for name, trace, row in (("A", a, row_a), ("B", b, row_b)):
        if not 0 <= row < len(trace.initial):
            raise EngineError(f"trace {name} has no row {row} (it has {len(trace.initial)})")
    if a.initial[row_a] != b.initial[row_b]:
        raise EngineError("the traces are not of one prompt: their initial canvases differ (prompt, canvas length or padding)")
    ca, cb = canvases(a, row_a), canvases(b, row_b)
    held_a, held_b = list(a.initial[row_a]), list(b.initial[row_b])
    first, aligned = None, []
    for step, (ia, ib, block, j) in enumerate(align(a, b)):
        aligned.append((ia, ib))
        held_a = ca[ia] if ia is not None else held_a
        held_b = cb[ib] if ib is not None else held_b
        if first is None and held_a != held_b:
            p = next(q for q, (x, y) in enumerate(zip(held_a, held_b)) if x != y)
            first = Divergence(step, block, j, p, _at(a, ia, row_a, p, held_a[p]), _at(b, ib, row_b, p, held_b[p]))
    fa, fb = (a.final[row_a] if a.final else held_a), (b.final[row_b] if b.final else held_b)
    final_position = next((q for q, (x, y) in enumerate(zip(fa, fb)) if x != y), None if len(fa) == len(fb) else min(len(fa), len(fb)))
    return TraceDiff(
        len(a.iterations), len(b.iterations), {k: len(v) for k, v in _by_block(a).items()}, {k: len(v) for k, v in _by_block(b).items()},
        first, final_position is None, final_position, aligned,
    )


def _at(trace: Trace, record: int | None, row: int, p: int, token: int) -> Side:
    side = Side(record, token, text=trace.tokens.get(str(token), ""))
    if record is None:
        return side
    rec: IterationRecord = trace.iterations[record]
    s, e = rec.block_range
    if s <= p < e:
        side.top1, side.confidence = rec.top1[row][p - s], rec.confidence[row][p - s]
        if rec.candidates is not None and rec.candidates[row][p - s]:
            side.candidates = rec.candidates[row][p - s]
    return side
