"""What the answer's constraint did, as every kind's view reads it (docs/constraints.md; the
records' `constraint`, docs/trace.md §3.3): the run's constraint from its header's config, and per
record and position the tokens it allowed, the probability mass it removed, the model's own top-1
and whether the constraint removed it, and the writes its joint check dropped.

A record of a run without a constraint (and every record of a trace older than version 4) has
`constraint` None, and a position the constraint did not restrict holds None: every reader here
answers None or nothing for them, so old traces show as before. A trace file is anyone's: its
config's constraint is display data, and its numbers were type-checked on load (engine/trace.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
import numpy as np
import plotly.graph_objects as go

from engine.constraints import CONSTRAINT_FIELDS, ConstraintSpec, spec_of

from .cells import CONSTRAINT_COLOUR
from .figure_base import _plain
from .panel import number, token_name
from ..reading.timeline import Timeline, iteration_number
from ..reading.words import plural

CUT = "cut"  # the grid's mark (cells.CELL_MARKS) of a position whose top-1 the constraint removed


def run_constraint(timeline: Timeline | None) -> ConstraintSpec | None:
    """The constraint the run's answer was held to, from its header's config (None: a free answer,
    an old trace, or a config whose constraint is not of its declared type)."""
    config = (timeline.trace.config or {}) if timeline is not None else {}
    values = {kind: config.get(kind) or None for kind in CONSTRAINT_FIELDS}
    if values["choice"] is not None and not isinstance(values["choice"], list):
        values["choice"] = None
    return spec_of(SimpleNamespace(**values))


def constraint_marks(timeline: Timeline | None, marks: tuple[str, ...]) -> tuple[str, ...]:
    """A kind's legend marks, with the constraint's for a constrained run: the header says so
    from the first live frame, so the legend stays the same to the last."""
    return marks + (CUT,) if run_constraint(timeline) is not None else marks


@dataclass(frozen=True)
class Restricted:
    """What the constraint did at one position of one record: `allowed` token ids, the model's own
    probability mass it `removed`, the model's own top-1 and its probability, whether it removed it."""

    allowed: int
    removed: float
    model_top1: int
    model_probability: float
    top1_removed: bool


def restricted_at(timeline: Timeline, index: int, position: int) -> Restricted | None:
    """What record `index`'s constraint did at canvas `position` (None: no constraint there)."""
    if not 0 <= index < timeline.iterations:
        return None
    rec = timeline.records[index]
    s, e = rec.block_range
    if rec.constraint is None or not s <= position < e:
        return None
    values = []
    for name in ("allowed", "removed", "model_top1", "model_probability", "top1_removed"):
        row = rec.constraint[name][timeline.row]
        values.append(None if row is None else row[position - s])
    if any(v is None for v in values):
        return None
    allowed, removed, top1, probability, cut = values
    return Restricted(int(allowed), float(removed), int(top1), float(probability), bool(cut))


def cut_positions(timeline: Timeline, index: int) -> set[int]:
    """The positions where record `index`'s constraint removed the model's top-1."""
    if not 0 <= index < timeline.iterations or timeline.records[index].constraint is None:
        return set()
    rec = timeline.records[index]
    row = rec.constraint["top1_removed"][timeline.row]
    return {rec.block_range[0] + k for k, cut in enumerate(row or []) if cut}


def dropped_at(timeline: Timeline, index: int) -> list[int]:
    """The positions whose write record `index`'s decoder chose and the constraint's joint check dropped."""
    if not 0 <= index < timeline.iterations or timeline.records[index].constraint is None:
        return []
    return list(timeline.records[index].constraint["dropped"][timeline.row])


def restriction_words(timeline: Timeline, r: Restricted, mask_word: str = "[MASK]") -> str:
    """The details panel's line: what the model wanted there, with what probability, how many
    tokens the constraint allowed and the mass it removed."""
    wanted = f"the model wanted {token_name(timeline, r.model_top1, mask_word)} with probability {number(r.model_probability)}"
    fate = "the constraint removed it" if r.top1_removed else "the constraint allowed it"
    return f"{wanted}; {fate}: {plural(r.allowed, 'token')} allowed here, {number(r.removed)} of the probability mass removed"


def hover_line(timeline: Timeline, r: Restricted) -> str:
    """A grid cell's or raster point's short line for a removed top-1."""
    return f"constraint removed the model's top-1 {timeline.text_of(r.model_top1)!r} (p {r.model_probability:.3f}) · {r.allowed} allowed · mass removed {r.removed:.3f}"


def history_cell(timeline: Timeline, index: int, position: int) -> str:
    """The details history's `constraint` column for `position` at record `index`."""
    r = restricted_at(timeline, index, position)
    if r is None:
        return "—"
    cut = f" · removed top-1 {timeline.text_of(r.model_top1)!r}" if r.top1_removed else ""
    return f"{r.allowed} allowed, −{number(r.removed)}{cut}"


def run_line(timeline: Timeline) -> str | None:
    """The details panel's line naming the run's constraint (None for a free answer)."""
    spec = run_constraint(timeline)
    return None if spec is None else f"{spec.describe()}: at each step only the tokens that keep the answer completable were allowed"


def cut_markers(timeline: Timeline, first: int, upto: int) -> go.Scatter | None:
    """The raster's markers at every (position, iteration) of records `first..upto` where the
    constraint removed the model's top-1, sized by the probability mass it removed (hover: the
    numbers); None when it removed none (the legend names the marks only where they are)."""
    points = [(i, p, restricted_at(timeline, i, p)) for i in range(first, upto + 1) for p in sorted(cut_positions(timeline, i))]
    points = [(i, p, r) for i, p, r in points if r is not None]
    if not points:
        return None
    return go.Scatter(
        x=np.array([p for _, p, _ in points], dtype=np.float32),
        y=np.array([iteration_number(i) for i, _, _ in points], dtype=np.float32),
        mode="markers",
        name="constraint removed the top-1 (size: mass removed)",
        marker=dict(symbol="square-open", size=[8 + 12 * r.removed for _, _, r in points], color=CONSTRAINT_COLOUR, line=dict(width=2, color=CONSTRAINT_COLOUR)),
        text=[_plain(hover_line(timeline, r)) for _, _, r in points],
        hovertemplate="pos %{x} · iteration %{y}<br>%{text}<extra></extra>",
        uid="constraint-cut",
    )


def summary(timeline: Timeline, index: int) -> str:
    """" · constraint removed 3 top-1s, dropped 1 write" for record `index` of a constrained run
    ("" for a free one); the grid's caption."""
    if run_constraint(timeline) is None or not 0 <= index < timeline.iterations or timeline.records[index].constraint is None:
        return ""
    cut, dropped = len(cut_positions(timeline, index)), len(dropped_at(timeline, index))
    return f" · constraint removed {plural(cut, 'top-1')}" + (f", dropped {plural(dropped, 'write')}" if dropped else "")
