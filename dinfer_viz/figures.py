"""Plotly figures built from a Timeline (and, for the sweep, from its result rows): the raster,
the per-iteration chart, the extras and the comparison. A uniform-state run's raster and chart are
dinfer_viz/uniform_figures.py's; what every figure shares (and why: size is frame rate) is
dinfer_viz/figure_base.py's.
"""

from __future__ import annotations

import textwrap
from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine import IterationRecord
from engine.trace import EDIT, REMASK

from .cells import CELL_COLOURS
from .figure_base import (
    RASTER_MARKS,
    SHOWN_LINE,
    _block_matrix,
    _finish,
    _legend_only,
    _plain,
    _upto,
    add_forward_times,
    block_and_shown_shapes,
    iteration_panels,
    raster_heatmap,
)
from .grid import expected_at
from .timeline import EXACT_FORWARDS, Commit, Timeline, iteration_number
from .uniform_figures import uniform_iteration_chart, uniform_raster

RUN_COLOURS = ("#2563eb", "#ea580c")
MAX_SHAPES = 300  # shapes are one SVG element each; past this the raster draws none


# Characters a line of a figure's message holds: the narrowest plot (the extras chart in a
# projector's 1024 px column, about 600 px) shows about 80 at the message's size; longer lines were
# cut off at both edges.
MESSAGE_LINE_CHARS = 72


def message_figure(text: str, height: int = 220) -> go.Figure:
    """A blank figure that says why it is blank, in lines that fit the narrowest plot."""
    fig = go.Figure()
    fig.add_annotation(text="<br>".join(textwrap.wrap(text, MESSAGE_LINE_CHARS)), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=13, color="#6b7280"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _finish(fig, height, "message")


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
    named in the legend; the colour bar marks the threshold τ when the decoder has one.

    `upto`, `highlight`: record indices (0-based, as Timeline's); the figure numbers iterations as
    the page does (`iteration_number`: 1..N). `expected`: the answer's token ids from the prompt's
    end (as the grid takes them), to name the expected token in the hover of a wrong commit.
    `last_rows`: draw only the latest iterations (the live view: gr.Plot resends the whole figure
    every redraw, and a long run's full raster is half a megabyte)."""
    if timeline.iterations == 0:
        return message_figure("no iterations yet", 380)
    if timeline.uniform:
        return uniform_raster(timeline, upto, highlight, last_rows, expected)
    upto = _upto(timeline, upto)
    first = max(0, upto + 1 - last_rows) if last_rows else 0
    runs = _range_runs(timeline, first, upto)
    x0 = timeline.view_start()
    lo, hi = _x_extent(timeline, runs)
    z = _block_matrix(timeline, first, upto, lambda i, rec: rec.confidence[timeline.row], masked_only=True)
    tau = _threshold_shown(timeline.records[first : upto + 1])
    fig = go.Figure()
    fig.add_trace(
        raster_heatmap(
            z, x0, first, 1, colorscale="Viridis", colorbar=_colour_bar("conf", tau),
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
    fig.update_yaxes(title_text="iteration", range=[iteration_number(upto) + 0.5, iteration_number(first) - 0.5])
    fig.update_layout(margin=dict(b=110))
    return _finish(fig, 400, "raster")


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
    if timeline.iterations == 0:
        return message_figure("no iterations yet", 380)
    if timeline.uniform:
        return uniform_iteration_chart(timeline, upto, highlight)
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
    return _finish(fig, 380, "iterations")


# Titles for the extras the engine's decoders and cache modes record; any other numeric
# per-position extra is plotted under its own name.
EXTRA_TITLES = {
    "credit": "credit of the top-1 token (credit decoder)",
    "staleness_kl": "cache staleness: KL(exact ‖ cached) per position",
    "staleness_agree": "top-1 agrees with an exact forward (1) or not (0)",
    "anchors": "anchors (hierarchical decoder)",
    "runs": "index of each run of masks (hierarchical decoder)",
    "raw_confidence": "top-1 probability before the credit boost (credit decoder)",
    "rank": "confidence rank among the masks (factor decoder)",
    "factor_threshold": "threshold of each rank, 1 - factor/(rank+2) (factor decoder)",
}


_EXTRA_SCALES = {"staleness_kl": "Reds", "staleness_agree": [[0.0, "#dc2626"], [1.0, "#e5e7eb"]], "anchors": [[0.0, "#f3f4f6"], [1.0, "#be185d"]]}


def plottable_extras(timeline: Timeline, upto: int | None = None) -> list[str]:
    """Names of extras that hold one number (or bool) per block position in some record."""
    names: list[str] = []
    for i in range(_upto(timeline, upto) + 1):
        width = timeline.records[i].block_range[1] - timeline.records[i].block_range[0]
        for name, values in timeline.extras_at(i).items():
            if name not in names and isinstance(values, list) and len(values) == width and all(isinstance(v, (int, float, bool)) or v is None for v in values):
                names.append(name)
    return names


def extras_figure(timeline: Timeline, upto: int | None = None, highlight: int | None = None) -> go.Figure:
    """One iteration x position heatmap per recorded extra (credit, staleness, anchors...), each
    with its own colour bar; staleness KL is white at zero, top-1 disagreement red. Iterations
    numbered 1..N as the page does; prompt positions inside a block are left blank (nothing is
    decoded there, whatever the decoder recorded for them)."""
    names = plottable_extras(timeline, upto)
    if not names:
        return message_figure("this run recorded no per-position extras (the credit decoder, the hierarchical decoder and staleness measurement add them)")
    upto = _upto(timeline, upto)
    x0, x1 = timeline.view_start(), timeline.view_end()
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, vertical_spacing=0.16 / len(names), subplot_titles=[EXTRA_TITLES.get(n, n) for n in names])
    for row, name in enumerate(names, start=1):
        z = _block_matrix(timeline, 0, upto, lambda i, rec, name=name: timeline.extras_at(i).get(name), masked_only=False)
        finite = z[np.isfinite(z)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if name == "staleness_agree" or set(np.unique(finite).tolist()) <= {0.0, 1.0}:
            low, high = 0.0, 1.0  # booleans: a fixed scale, so all-true looks like all-true
        elif name.startswith("staleness"):
            low, high = 0.0, max(high, 1e-3)  # KL >= 0: zero stays white however small the rest
        elif high <= low:
            high = low + 1.0
        domain = fig.layout[f"yaxis{row if row > 1 else ''}"].domain
        fig.add_trace(
            go.Heatmap(
                z=z,
                x0=x0,
                dx=1,
                y0=iteration_number(0),
                dy=1,
                zmin=low,
                zmax=high,
                colorscale=_EXTRA_SCALES.get(name, "Cividis"),
                hoverongaps=False,
                colorbar=dict(thickness=8, len=(domain[1] - domain[0]) * 0.9, y=(domain[0] + domain[1]) / 2, yanchor="middle"),
                hovertemplate=f"{name}<br>pos %{{x}} · iteration %{{y}}: %{{z:.4g}}<extra></extra>",
                uid=f"extra-{name}",
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(title_text="iteration", range=[iteration_number(upto) + 0.5, iteration_number(0) - 0.5], row=row, col=1)
        if highlight is not None and 0 <= highlight <= upto:
            fig.add_hline(y=iteration_number(highlight), line=SHOWN_LINE, row=row, col=1)
    fig.update_xaxes(range=[x0 - 0.5, x1 - 0.5])
    fig.update_xaxes(title_text="canvas position", row=len(names), col=1)
    fig.update_layout(margin=dict(t=60))
    return _finish(fig, 180 + 200 * len(names), "extras")


def compare_figure(timelines: Sequence[Timeline], labels: Sequence[str], highlight: int | None = None) -> go.Figure:
    """Two (or more) runs: tokens committed against engine time, and against iteration;
    `highlight` (a record index, the shared slider's) is marked on the iteration axis."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["tokens vs engine time", "tokens vs iteration"], horizontal_spacing=0.1)
    for k, (timeline, label) in enumerate(zip(timelines, labels)):
        colour = RUN_COLOURS[k % len(RUN_COLOURS)]
        counts = np.array([timeline.committed_tokens(n) for n in range(1, timeline.iterations + 1)], dtype=np.float32)
        seconds = np.cumsum([rec.seconds for rec in timeline.records]).astype(np.float32)
        its = np.arange(1, timeline.iterations + 1, dtype=np.float32)
        name = _plain(label)  # a label may hold a model's path or name
        fig.add_trace(go.Scatter(x=seconds, y=counts, name=name, legendgroup=label, mode="lines+markers", marker=dict(size=4), line=dict(color=colour, shape="hv"), uid=f"t-{k}"), row=1, col=1)
        fig.add_trace(go.Scatter(x=its, y=counts, name=name, legendgroup=label, showlegend=False, mode="lines+markers", marker=dict(size=4), line=dict(color=colour, shape="hv"), uid=f"i-{k}"), row=1, col=2)
    fig.update_xaxes(title_text="engine seconds (sum of iterations)", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="iteration", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=1, col=1)
    if highlight is not None:
        fig.add_vline(x=iteration_number(highlight), line=SHOWN_LINE, row=1, col=2)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="iteration shown", line=SHOWN_LINE, hoverinfo="skip", uid="shown"), row=1, col=2)
    # the legend at the figure's foot, below the axis titles (the template's legend, just under the
    # plot, sat on them); the bottom margin holds both
    fig.update_layout(legend=dict(yref="container", y=0.01, yanchor="bottom"), margin=dict(b=110))
    return _finish(fig, 360, "compare")

