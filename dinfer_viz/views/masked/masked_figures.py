"""The raster and the per-iteration chart of a masked-diffusion run: the top-1 confidence of the
positions still masked, the commits (above the threshold or forced), a revising decoder's edits and
remasks, what each forward recomputed; per iteration the commits, the threshold in force and the
forward times. dinfer_viz/panes/figures.py asks the run's view for these (dinfer_viz/views/)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go

from engine import IterationRecord
from engine.trace import EDIT, REMASK

from ...drawing.cells import CELL_COLOURS, expected_at
from ...drawing.constraint import cut_markers
from ...drawing.figure_base import RASTER_MARKS, _block_matrix, _finish, _legend_only, _plain, _upto, add_forward_times, block_and_shown_shapes, heatmap_rows, iteration_panels, iteration_ticks, legend_at_foot, raster_heatmap, rows_title
from ...reading.timeline import EXACT_FORWARDS, Commit, Timeline, iteration_number

MAX_SHAPES = 300  # shapes are one SVG element each; past this the raster draws none


def _range_runs(timeline: Timeline, first: int, upto: int) -> list[tuple[int, int, bool, list[list[int]]]]:
    """Consecutive records with the same recomputed ranges and exactness, merged:
    (first, last, exact, ranges). A vicinity window is one rectangle per block, not per forward."""
    runs: list[tuple[int, int, bool, list[list[int]]]] = []
    for i in range(first, upto + 1):
        rec = timeline.records[i]
        exact = rec.forward in EXACT_FORWARDS
        if runs and runs[-1][1] == i - 1 and runs[-1][2] == exact and runs[-1][3] == rec.recomputed:
            runs[-1] = (runs[-1][0], i, exact, rec.recomputed)
        else:
            runs.append((i, i, exact, rec.recomputed))
    return runs


def _x_extent(timeline: Timeline, runs: list[tuple[int, int, bool, list[list[int]]]]) -> tuple[int, int]:
    """[start, end) of the positions drawn: the view, widened to every partial recomputation that
    ends inside the canvas (a vicinity window reaches `after_look` past its block, and
    `prefix_look` before it), so a window is never cut off. A range that runs to the canvas end
    (prefix mode: the block and everything after it) stays cut at the view's end: widening to it
    would squeeze the decoded part of an early-stopped run into a corner."""
    x0, x1 = timeline.view_start(), timeline.view_end()
    for _, _, exact, ranges in runs:
        if not exact:
            for a, b in ranges:
                x0 = min(x0, max(a, 0))
                if b < timeline.canvas_length:
                    x1 = max(x1, b)
    return x0, x1


def _threshold_shown(records: Sequence[IterationRecord]) -> float | None:
    """The threshold in force at the last record drawn (smoothing lowers it run by run), or None
    when the decoder has none (fixed, factor)."""
    thresholds = [r.threshold for r in records if r.threshold is not None]
    return float(thresholds[-1]) if thresholds else None


def _colour_bar(title: str, tau: float | None) -> dict[str, Any]:
    """A 0-1 colour bar; with `tau`, a tick at the threshold labelled τ (ticks too close to it
    dropped so the labels stay apart)."""
    bar: dict[str, Any] = dict(title=dict(text=title), thickness=10, len=0.9)
    if tau is not None:
        ticks = [t for t in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0) if abs(t - tau) >= 0.07]
        values = sorted(ticks + [tau])
        bar.update(tickmode="array", tickvals=values, ticktext=[f"τ {v:.2f} ◀" if v == tau else f"{v:g}" for v in values])
    return bar


def confidence_raster(
    timeline: Timeline, upto: int | None = None, highlight: int | None = None, last_rows: int | None = None, expected: list[int] | None = None
) -> go.Figure:
    """Iteration x position heatmap of the top-1 confidence of still-masked positions, with the
    commits as markers (circle: above threshold, x: forced), block starts as lines, forwards that
    recomputed everything as grey bands and partial recomputations as dashed rectangles, each mark
    named in the legend, and under a constraint its removed top-1s (constraint.cut_markers); the
    colour bar marks the threshold τ when the decoder has one.

    `upto`, `highlight`: record indices (0-based, as Timeline's); the figure numbers iterations as
    the page does (`iteration_number`: 1..N). `expected`: the answer's token ids from the prompt's
    end (as the grid takes them), to name the expected token in the hover of a wrong commit.
    `last_rows`: draw only the latest iterations (the live view: gr.Plot resends the whole figure
    every redraw, and a long run's full raster is half a megabyte)."""
    upto = _upto(timeline, upto)
    first = max(0, upto + 1 - last_rows) if last_rows else 0
    runs = _range_runs(timeline, first, upto)
    x0 = timeline.view_start()
    lo, hi = _x_extent(timeline, runs)
    rows = heatmap_rows(first, upto, timeline.view_end() - x0, keep=highlight)
    z = _block_matrix(timeline, first, upto, lambda i, rec: rec.confidence[timeline.row], masked_only=True, rows=rows)
    tau = _threshold_shown(timeline.records[first : upto + 1])
    fig = go.Figure()
    fig.add_trace(
        raster_heatmap(
            z, x0, first, 1, rows, colorscale="Viridis", colorbar=_colour_bar("conf", tau),
            hovertemplate="pos %{x} · iteration %{y}<br>top-1 confidence %{z:.3f}<extra></extra>",
        )
    )
    for forced, name in ((False, "new"), (True, "forced")):
        points = [(p, c) for p, c in timeline.commits.items() if c.forced == forced and first <= c.iteration <= upto]
        fig.add_trace(
            go.Scatter(
                x=np.array([p for p, _ in points], dtype=np.float32),
                y=np.array([iteration_number(c.iteration) for _, c in points], dtype=np.float32),
                mode="markers",
                name=CELL_COLOURS[name][1],
                marker=dict(symbol="x" if forced else "circle", size=7, color=CELL_COLOURS[name][0], line=dict(width=1, color="#111827")),
                text=[_commit_text(timeline, p, c, expected) for p, c in points],
                hovertemplate="pos %{x} · iteration %{y}<br>committed %{text}<extra></extra>",
                uid=f"commits-{name}",
            )
        )
    for kind, state, symbol in ((EDIT, "edited", "diamond"), (REMASK, "remasked", "triangle-down")):
        revised = [r for i in range(first, upto + 1) for r in timeline.record_revisions[i] if r.kind == kind]
        if revised:  # only a revising decoder's runs name these marks
            fig.add_trace(
                go.Scatter(
                    x=np.array([r.position for r in revised], dtype=np.float32),
                    y=np.array([iteration_number(r.iteration) for r in revised], dtype=np.float32),
                    mode="markers",
                    name=CELL_COLOURS[state][1],
                    marker=dict(symbol=symbol, size=9, color=CELL_COLOURS[state][0], line=dict(width=1, color="#111827")),
                    text=[_plain(timeline.describe_revision(r)) for r in revised],
                    hovertemplate="pos %{x} · iteration %{y}<br>%{text}<extra></extra>",
                    uid=f"revisions-{state}",
                )
            )
    cut = cut_markers(timeline, first, upto)
    if cut is not None:
        fig.add_trace(cut)
    shapes: list[dict[str, Any]] = []
    drawn: set[str] = set()
    for start, end, exact, ranges in runs:
        y0, y1 = iteration_number(start) - 0.5, iteration_number(end) + 0.5
        if exact:
            drawn.add("exact")
            shapes.append(dict(type="rect", xref="x", yref="y", x0=lo - 0.5, x1=hi - 0.5, y0=y0, y1=y1, fillcolor="rgba(107,114,128,0.12)", line=dict(width=0), layer="below"))
        else:
            drawn.add("partial")
            for a, b in ranges:
                shapes.append(dict(type="rect", xref="x", yref="y", x0=max(a, lo) - 0.5, x1=min(b, hi) - 0.5, y0=y0, y1=y1, line=dict(color="#db2777", width=1, dash="dash")))
    marks, shown = block_and_shown_shapes(timeline, first, upto, highlight)
    shapes += marks
    drawn |= shown
    for kind in RASTER_MARKS:
        if kind in drawn:
            fig.add_trace(_legend_only(kind))
    fig.update_layout(shapes=shapes if len(shapes) <= MAX_SHAPES else shapes[-MAX_SHAPES:])
    fig.update_xaxes(title_text="canvas position", range=[lo - 0.5, hi - 0.5])
    fig.update_yaxes(title_text=rows_title(rows, first, upto), range=[iteration_number(upto) + 0.5, iteration_number(first) - 0.5], **iteration_ticks(iteration_number(upto)))
    return _finish(fig, legend_at_foot(fig, 400, 110), "raster")


def _commit_text(timeline: Timeline, p: int, c: Commit, expected: list[int] | None) -> str:
    """A commit's hover line: its token as text and confidence, and the expected token (as text,
    through the timeline's token strings) when it differs."""
    text = f"{_plain(repr(timeline.text_of(c.token)))} conf {c.confidence:.3f}" + (" (forced)" if c.forced else "")
    want = expected_at(timeline, expected, p)
    if want is not None and want != c.token:
        text += f"<br>expected {_plain(repr(timeline.text_of(want)))}"
    return text


def iteration_chart(timeline: Timeline, upto: int | None = None, highlight: int | None = None) -> go.Figure:
    """Per iteration (numbered 1..N, as the page does; `upto` and `highlight` are record indices):
    tokens committed (above threshold / forced, stacked) with the threshold in force; below, the
    engine-measured time of each iteration coloured by forward kind."""
    upto = _upto(timeline, upto)
    records = timeline.records[: upto + 1]
    its = np.array([iteration_number(i) for i in range(len(records))], dtype=np.float32)
    forced = np.array([len(r.forced[timeline.row]) for r in records], dtype=np.float32)
    above = np.array([len(r.committed[timeline.row]) for r in records], dtype=np.float32) - forced
    fig = go.Figure()
    fig.add_trace(go.Bar(x=its, y=above, name="above threshold", marker_color=CELL_COLOURS["new"][0], uid="above"))
    fig.add_trace(go.Bar(x=its, y=forced, name="forced top-1", marker_color=CELL_COLOURS["forced"][0], uid="forced"))
    if timeline.revises:  # a revising decoder's edits and remasks, stacked on its commits
        for kind, state in ((EDIT, "edited"), (REMASK, "remasked")):
            counts = np.array([sum(r.kind == kind for r in timeline.record_revisions[i]) for i in range(len(records))], dtype=np.float32)
            fig.add_trace(go.Bar(x=its, y=counts, name=state, marker_color=CELL_COLOURS[state][0], uid=state))
    thresholds = np.array([np.nan if r.threshold is None else r.threshold for r in records], dtype=np.float32)
    fig.add_trace(go.Scatter(x=its, y=thresholds, yaxis="y2", name="threshold", mode="lines", line=dict(color="#111827", width=1.5, shape="hv"), uid="threshold"))
    scalars: dict[str, list[float]] = {}
    for i in range(len(records)):
        for name, value in timeline.scalar_extras_at(i).items():
            scalars.setdefault(name, [np.nan] * len(records))[i] = value
    for name, values in scalars.items():
        fig.add_trace(go.Scatter(x=its, y=np.array(values, dtype=np.float32), yaxis="y2", name=name, mode="lines", line=dict(width=1.5, dash="dot"), uid=f"scalar-{name}"))
    right_top = max([1.05] + [float(np.nanmax(v)) * 1.05 for v in scalars.values() if np.isfinite(v).any()])
    add_forward_times(fig, records)
    iteration_panels(
        fig, upto, highlight, "positions changed" if timeline.revises else "tokens committed",
        # automargin with a standoff: the right margin grows to hold the tick labels and then the
        # title, which otherwise sits on the ticks ("1.05" under "threshold")
        dict(
            overlaying="y", side="right", range=[0, right_top], showgrid=False, automargin=True, title=dict(text="threshold", standoff=8),
            # thresholds and weights live in [0, 1]: quarter ticks, not the 0.312 steps plotly picks for 1.05
            **(dict(tickmode="linear", tick0=0, dtick=0.25) if right_top <= 1.05 else {}),
        ),
    )
    return _finish(fig, legend_at_foot(fig, 380, 90), "iterations")
