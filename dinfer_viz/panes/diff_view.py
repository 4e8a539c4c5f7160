"""The diff view: two traces of one prompt on one slider (engine/trace_diff.py, docs/analysis.md
§2), drawn for the page (docs/app.md §2, "Diff two runs").

- `DiffState`: both runs, their diff and each side's canvas at every aligned step (steps aligned
  within blocks; a side that ran fewer steps in a block holds its last canvas there);
- `diff_strip`: both canvases at one aligned step, one column per generated position (A above B),
  the positions where they differ marked, the first divergence outlined;
- `divergence_card`: the first divergence, with both sides' token, top-1 and candidates there;
- `summary_text`: steps equal, first divergence, final tokens equal;
- `diff_figure`: positions that differ at each aligned step, the first divergence and the step
  shown marked.

Every token string comes from a trace file (someone else's): escaped with `inert` before it
reaches HTML or Markdown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go

from engine import Trace
from engine.trace_diff import Divergence, Side, TraceDiff, align, canvases, diff_traces

from ..drawing.cells import cell_text
from ..drawing.figure_base import _finish, _plain, message_figure
from .grid import inert
from ..reading.timeline import Timeline

DIFF_CSS = (
    "<style>"
    ".diff-strip {display: flex; flex-wrap: wrap; gap: 3px; font-family: ui-monospace, monospace; font-size: 14px}"
    ".diff-strip .col {display: flex; flex-direction: column; align-items: stretch; min-width: 26px; border: 1px solid #e5e7eb; border-radius: 4px; text-align: center}"
    ".diff-strip .col > span {padding: 1px 3px; white-space: pre}"
    ".diff-strip .pos {font-size: 10px; color: #6b7280}"
    ".diff-strip .a {border-bottom: 1px dashed #d1d5db}"
    ".diff-strip .col.differs {background: #fee2e2; border-color: #dc2626}"
    ".diff-strip .col.first {outline: 3px solid #111827; outline-offset: 1px}"
    ".diff-strip .side {font-size: 11px; color: #374151; display: flex; flex-direction: column; justify-content: space-around; padding-right: 4px}"
    ".diff-card {font-size: 15px; line-height: 1.5}"
    ".diff-card table {border-collapse: collapse} .diff-card td, .diff-card th {padding: 2px 8px; border: 1px solid #e5e7eb; text-align: left}"
    "</style>"
)


@dataclass
class DiffState:
    """A session's diff: the two runs (`a`, `b`, their `labels`), `diff_traces`' result, and
    per aligned step (`steps`: (A record or None, B record or None, block, step in block)) the
    canvas each side holds there."""

    a: Timeline
    b: Timeline
    diff: TraceDiff
    labels: tuple[str, str]
    steps: list[tuple[int | None, int | None, int, int]]
    held_a: list[list[int]] = field(repr=False)
    held_b: list[list[int]] = field(repr=False)

    @property
    def count(self) -> int:
        return len(self.steps)

    def differing(self, step: int) -> list[int]:
        """The canvas positions where the two sides differ at aligned `step`."""
        return [p for p, (x, y) in enumerate(zip(self.held_a[step], self.held_b[step])) if x != y]


def diff_state(a: Trace, b: Trace, labels: tuple[str, str] = ("A", "B")) -> DiffState:
    """Both runs diffed (row 0 of each); EngineError when they are not of one prompt."""
    diff = diff_traces(a, b)
    steps = align(a, b)
    held = []
    for trace, which in ((a, 0), (b, 1)):
        after, canvas, rows = canvases(trace), list(trace.initial[0]), []
        for step in steps:
            canvas = after[step[which]] if step[which] is not None else canvas
            rows.append(canvas)
        held.append(rows)
    return DiffState(Timeline(a), Timeline(b), diff, labels, steps, held[0], held[1])


def _step_words(state: DiffState, step: int) -> str:
    ia, ib, block, j = state.steps[step]
    sides = " · ".join(f"{inert(label)}: {'holds its last canvas' if record is None else f'record {record}'}" for label, record in zip(state.labels, (ia, ib)))
    return f"aligned step {step + 1}/{state.count} · block {block}, step {j + 1} in it · {sides}"


def diff_strip(state: DiffState, step: int) -> str:
    """Both canvases after aligned `step` (0-based), one column per generated position: A's
    token above B's, differing columns red, the first divergence's column outlined (at its
    step and after)."""
    if not state.count:
        return DIFF_CSS + '<div class="diff-card">no steps on either side</div>'
    step = max(0, min(step, state.count - 1))
    differs = set(state.differing(step))
    first = state.diff.first
    outlined = first.position if first is not None and step >= first.step else None
    start = state.a.prompt_length
    cols = [
        f'<div class="side"><span>{inert(state.labels[0])}</span><span>{inert(state.labels[1])}</span></div>'
    ]
    for p in range(start, len(state.held_a[step])):
        x, y = state.held_a[step][p], state.held_b[step][p]
        classes = "col" + (" differs" if p in differs else "") + (" first" if p == outlined else "")
        tip = inert(f"position {p}: {state.labels[0]} {x} {state.a.piece(x)!r}, {state.labels[1]} {y} {state.b.piece(y)!r}")
        cols.append(
            f'<div class="{classes}" title="{tip}" data-pos="{p}"><span class="pos">{p}</span>'
            f'<span class="a">{inert(cell_text(state.a, x))}</span><span class="b">{inert(cell_text(state.b, y))}</span></div>'
        )
    caption = f"{_step_words(state, step)} · {len(differs)} position{'s differ' if len(differs) != 1 else ' differs'}"
    return f'{DIFF_CSS}<div class="diff-card" id="diff-caption">{caption}</div><div class="diff-strip">{"".join(cols)}</div>'


def _side_row(label: str, side: Side, timeline: Timeline) -> str:
    def token(t: int | None) -> str:
        return "—" if t is None else f"{t} <code>{inert(repr(timeline.piece(int(t))))}</code>"

    candidates = (
        ", ".join(f"{token(int(i))} {float(p):.4f}" for i, p in side.candidates) if side.candidates else "not recorded"
    )
    record = "holds its last canvas" if side.record is None else f"record {side.record}"
    top1 = "not in its block" if side.top1 is None else f"{token(side.top1)} p {'—' if side.confidence is None else f'{float(side.confidence):.4f}'}"
    return f"<tr><th>{inert(label)}</th><td>{record}</td><td>{token(side.token)}</td><td>{top1}</td><td>{candidates}</td></tr>"


def divergence_card(state: DiffState) -> str:
    """Where the canvases first differ, with what each side wrote and believed there."""
    d: Divergence | None = state.diff.first
    if d is None:
        return DIFF_CSS + '<div class="diff-card" id="diff-first">no divergence: every aligned canvas is equal</div>'
    head = f"<b>first divergence: aligned step {d.step + 1}, position {d.position}</b> (block {d.block}, step {d.block_step + 1} in it)"
    rows = _side_row(state.labels[0], d.a, state.a) + _side_row(state.labels[1], d.b, state.b)
    table = f"<table><tr><th></th><th>step</th><th>canvas token</th><th>top-1, probability</th><th>candidates (top 3)</th></tr>{rows}</table>"
    return f'{DIFF_CSS}<div class="diff-card" id="diff-first">{head}{table}</div>'


def summary_text(state: DiffState) -> str:
    """steps equal, first divergence, final tokens equal: the CLI's summary in the page's words."""
    diff, (la, lb) = state.diff, (inert(state.labels[0]), inert(state.labels[1]))
    steps = "equal" if diff.steps_equal else ("differ per block" if diff.steps_a == diff.steps_b else "differ")
    first = "none (every aligned canvas is equal)" if diff.first is None else (
        f"aligned step {diff.first.step + 1} at position {diff.first.position}"
    )
    final = "**equal**" if diff.final_equal else f"**differ** (first at position {diff.final_position})"
    return (
        f"**A** = {la} · **B** = {lb}\n\n| steps | first divergence | final tokens |\n|---|---|---|\n"
        f"| A {diff.steps_a}, B {diff.steps_b} ({steps}) | {first} | {final} |"
    )


STEP_SHOWN = dict(color="#6b7280", width=2, dash="dash")  # the slider's step (figure_base.SHOWN_LINE's place)


def _whole_step(top: int) -> int:
    """A tick spacing of whole numbers giving at most about 8 ticks up to `top`."""
    return max(1, -(-top // 8))


def diff_figure(state: DiffState, highlight: int | None = None) -> go.Figure:
    """Positions where the canvases differ at each aligned step (1-based on the x axis), the
    first divergence as a marker and the step shown as a dashed grey line: red is the strip's
    colour for a position that differs (a red line at step 1 read as a difference where none was).
    Counts and steps are whole numbers: integer ticks from 0 (an all-zero curve drew "0" over "0.5")."""
    if not state.count:
        return message_figure("no steps on either side", 280)
    xs = np.arange(1, state.count + 1, dtype=np.float32)
    fig = go.Figure(go.Scatter(
        x=xs, y=np.array([len(state.differing(k)) for k in range(state.count)], dtype=np.float32), mode="lines+markers",
        name="positions that differ", line=dict(color="#7c3aed", width=2), uid="differ",  # red is the step shown
    ))
    first = state.diff.first
    if first is not None:
        fig.add_trace(go.Scatter(
            x=[first.step + 1], y=[len(state.differing(first.step))], mode="markers", name=_plain(f"first divergence (position {first.position})"),
            marker=dict(symbol="star", size=14, color="#111827"), uid="first",
        ))
    if highlight is not None and 0 <= highlight < state.count:
        fig.add_shape(type="line", xref="x", yref="paper", x0=highlight + 1, x1=highlight + 1, y0=0, y1=1, line=STEP_SHOWN)
    most = max(len(state.differing(k)) for k in range(state.count))
    fig.update_layout(
        xaxis=dict(range=[0.5, state.count + 0.5], title=dict(text="aligned step"), tickformat="d", dtick=_whole_step(state.count)),
        yaxis=dict(range=[0, max(most, 1) * 1.1], title=dict(text="positions that differ"), tickformat="d", dtick=_whole_step(most)),
        margin=dict(b=80),
    )
    return _finish(fig, 280, "diff")
