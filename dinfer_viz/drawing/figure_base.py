"""What every figure shares: the Figure class (its download button), the template, the line that
marks the iteration shown, the iteration range drawn, the matrix of per-position values a raster
draws, block starts and the forward-time panel, and the escaping of text. Every kind's figures
(dinfer_viz/views/) build on these.

Every figure keeps a fixed height, explicit axis ranges, a constant `uirevision` (zoom survives
live redraws) and a tiny template, and carries numbers as numpy float32 so plotly ships them as
base64 typed arrays: gr.Plot resends the whole figure on every update, so size is frame rate.
Each kind's raster and chart are its view's (dinfer_viz/views/).
"""

from __future__ import annotations

import json
import textwrap
from typing import Any, Callable

import numpy as np
import plotly.graph_objects as go

from engine import IterationRecord

from ..reading.timeline import Timeline, iteration_number
from .cells import CELL_COLOURS, PINNED

_TEMPLATE = go.layout.Template(
    layout=dict(
        font=dict(size=11),
        paper_bgcolor="white",
        plot_bgcolor="white",
        xaxis=dict(gridcolor="#eef0f3", zeroline=False),
        yaxis=dict(gridcolor="#eef0f3", zeroline=False),
        margin=dict(l=50, r=20, t=36, b=40),  # t: room for the gr.Plot label badge
        legend=dict(orientation="h", y=-0.18, yanchor="top", x=0, font=dict(size=10)),
    )
)
FORWARD_COLOURS = {"full": "#6b7280", "refresh": "#2563eb", "prefix": "#0891b2", "dual": "#7c3aed", "window": "#db2777"}


# What the camera button in each figure's modebar saves: a PNG at twice the figure's size (sharp on
# a 1080p slide). Plotly's modebar saves one format; SVG would need kaleido on the server.
FIGURE_DOWNLOAD = {"format": "png", "scale": 2}


class Figure(go.Figure):
    """A go.Figure whose JSON also carries Plotly's config, the modebar's download (FIGURE_DOWNLOAD,
    the file named after the figure's `uirevision` key): gr.Plot takes no Plotly config, but it sends
    the figure's `to_json()` to the page, which hands the JSON's `config` to Plotly."""

    def to_json(self, *args: Any, **kwargs: Any) -> str:
        text = super().to_json(*args, **kwargs).rstrip()
        config = {"toImageButtonOptions": {**FIGURE_DOWNLOAD, "filename": f"dinfer-viz-{self.layout.uirevision or 'figure'}"}, "displaylogo": False}
        return text[:-1] + ',"config":' + json.dumps(config) + "}"  # one more key in the figure's JSON object


SHOWN_LINE = dict(color="#dc2626", width=2)  # the iteration the page shows, in every figure


def shown_iteration_shapes(highlight: int | None, upto: int) -> list[dict]:
    """A vertical line at record `highlight` on an x axis of iteration numbers, when it is drawn."""
    if highlight is None or not 0 <= highlight <= upto:
        return []
    x = iteration_number(highlight)
    return [dict(type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1, line=SHOWN_LINE)]


# Up to this many iterations an iteration axis ticks every whole iteration: Plotly's own step on a
# range of one or two units is 0.5 or 0.2, ticks between iterations that no record has
MAX_UNIT_TICKS = 10


def iteration_ticks(last: int) -> dict[str, Any]:
    """An iteration axis's tick settings, its iteration numbers up to `last`: one a whole iteration
    on a short run, Plotly's own (whole numbers at that span) past MAX_UNIT_TICKS."""
    return dict(tick0=0, dtick=1) if last <= MAX_UNIT_TICKS else {}


def _finish(fig: go.Figure, height: int, key: str) -> Figure:
    fig.update_layout(template=_TEMPLATE, height=height, uirevision=key, hovermode="closest")
    # Every figure leaves through here: made a Figure in place (go.Figure(fig) would copy and
    # re-validate every trace, and live figures are redrawn several times a second)
    fig.__class__ = Figure
    return fig


def _upto(timeline: Timeline, upto: int | None) -> int:
    return timeline.iterations - 1 if upto is None else timeline.clamp(upto)


# The most cells one iteration x position heatmap carries. A long run's full matrix is megabytes of
# JSON that the server builds, Gradio sends and the browser parses on every view (a 1,000-iteration,
# 1,000-position run: 1M cells, tens of seconds before this bound), while the figure's few hundred
# pixel rows cannot show more than a few hundred iterations anyway: past the bound a heatmap draws
# evenly spaced iterations (`heatmap_rows`), the iteration shown and the last always among them.
MAX_HEATMAP_CELLS = 200_000


def heatmap_rows(first: int, upto: int, columns: int, keep: int | None = None, cells: int = MAX_HEATMAP_CELLS) -> list[int]:
    """The record indices (from `first..upto`) a heatmap of `columns` positions draws: all of them
    within `cells`, else every k-th (k as small as fits), plus `upto` and `keep` (the iteration
    shown) when in range."""
    count = upto + 1 - first
    most = max(2, cells // max(columns, 1))
    if count <= most:
        return list(range(first, upto + 1))
    stride = -(-count // (most - 2))  # leaves room for `upto` and `keep`
    rows = set(range(first, upto + 1, stride)) | {upto}
    if keep is not None and first <= keep <= upto:
        rows.add(keep)
    return sorted(rows)


def rows_title(rows: list[int], first: int, upto: int, title: str = "iteration") -> str:
    """A heatmap's y-axis title, saying when `heatmap_rows` thinned its iterations."""
    count = upto + 1 - first
    return title if len(rows) >= count else f"{title} ({len(rows)} of {count} drawn)"


def _block_matrix(
    timeline: Timeline, first: int, upto: int, values_of: Callable[[int, IterationRecord], Any], masked_only: bool, rows: list[int] | None = None
) -> np.ndarray:
    """`[iterations first..upto, positions]` float32 from per-record block values, NaN where
    nothing applies: prompt positions (an aligned block may start inside the prompt, and nothing
    is decoded there) and, with `masked_only`, positions no longer [MASK] when the record started.
    `rows`: only these record indices (`heatmap_rows`), one matrix row each, in their order."""
    x0, x1 = timeline.view_start(), timeline.view_end()
    rows = list(range(first, upto + 1)) if rows is None else rows
    z = np.full((len(rows), x1 - x0), np.nan, dtype=np.float32)
    prompt = np.asarray(timeline.initial) != timeline.mask_id  # never masked
    for k, i in enumerate(rows):
        rec = timeline.records[i]
        values = values_of(i, rec)
        if values is None:
            continue
        s, e = rec.block_range
        row = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float32)
        if masked_only:  # a remasked position is masked again, so read the canvas, not the commits
            hidden = np.array([timeline.token_before(p, i) != timeline.mask_id for p in range(s, e)])
        else:
            hidden = prompt[s:e]
        row[hidden[: len(row)]] = np.nan
        z[k, s - x0 : min(e, x1) - x0] = row[: min(e, x1) - s]
    return z


def heatmap_y(first: int, rows: list[int] | None) -> dict[str, Any]:
    """A heatmap's y placement: iteration numbers from `first`, one a row, or those of `rows`
    (`heatmap_rows`) when it draws some iterations only."""
    if rows is None or rows == list(range(first, first + len(rows))):
        return dict(y0=iteration_number(first), dy=1)
    return dict(y=np.array([iteration_number(i) for i in rows], dtype=np.float32))


def raster_heatmap(z: np.ndarray, x0: int, first: int, zmax: float, rows: list[int] | None = None, **style: Any) -> go.Heatmap:
    """A raster's heatmap of `z` (rows: records from `first`, or the record indices `rows`; columns:
    positions from `x0`), a point's x its canvas position and y its iteration number (what a click
    on the raster pins), zero at the bottom of its scale; `style`: its colour scale, colour bar, hover."""
    return go.Heatmap(z=z, x0=x0, dx=1, zmin=0, zmax=zmax, hoverongaps=False, uid="raster", **heatmap_y(first, rows), **style)


# The raster's marks, each with a legend entry drawn as a blank trace (shapes have no legend)
RASTER_MARKS = {
    "exact": ("recomputed everything (grey band)", dict(mode="markers", marker=dict(symbol="square", size=11, color="rgba(107,114,128,0.35)"))),
    "partial": ("recomputed only this range (dashed)", dict(mode="lines", line=dict(color="#db2777", width=1.5, dash="dash"))),
    "block": ("block start (blue line)", dict(mode="lines", line=dict(color="#2563eb", width=1.5))),
    "shown": ("iteration shown (red line)", dict(mode="lines", line=SHOWN_LINE)),
    PINNED: (f"{CELL_COLOURS[PINNED][1]} (band)", dict(mode="markers", marker=dict(symbol="square", size=11, color=CELL_COLOURS[PINNED][0]))),
}


AXIS_TITLE_PX = 56  # under a plot: its tick labels and its axis title
LEGEND_ENTRY_PX = 19  # one legend entry's line at the template's 10 px font


def legend_at_foot(fig: go.Figure, height: int, margin: int, lines: int | None = None) -> int:
    """Put `fig`'s legend at the figure's foot, under the x-axis title, with room for one line
    per entry (the narrowest column stacks them so), or `lines` lines for a figure as wide as the
    view (the cost panel's one row left an 80 px gap under four empty lines), and return `height`
    changed as the bottom `margin` it was drawn with changes, so the plot keeps its size. Placed
    from the plot's bottom (the template's y -0.18), a legend that wrapped covered the axis title,
    in the page and in the exported PNG alike."""
    entries = sum(1 for t in fig.data if t.showlegend is not False and t.name)
    bottom = AXIS_TITLE_PX + LEGEND_ENTRY_PX * min(entries, lines or entries) + 8
    fig.update_layout(legend=dict(yref="container", y=0.0, yanchor="bottom"), margin=dict(b=bottom))
    return height + bottom - margin


def _legend_only(kind: str) -> go.Scatter:
    name, style = RASTER_MARKS[kind]
    return go.Scatter(x=[None], y=[None], name=name, hoverinfo="skip", uid=f"mark-{kind}", **style)


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Sorted `positions` as [start, end) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs


def block_and_shown_shapes(timeline: Timeline, first: int, upto: int, highlight: int | None) -> tuple[list[dict], set[str]]:
    """A raster's block starts (vertical lines), the iteration shown (a horizontal line at record
    `highlight`, when drawn) and the text the request pinned (a band under each run of pinned
    positions: no step writes them, so the heatmap leaves them blank), with the RASTER_MARKS kinds
    they draw."""
    shapes: list[dict[str, Any]] = []
    drawn: set[str] = set()
    for a, b in _runs(sorted(p for p in timeline.pinned if p < timeline.view_end())):
        drawn.add(PINNED)
        shapes.append(dict(type="rect", xref="x", yref="paper", x0=a - 0.5, x1=b - 0.5, y0=0, y1=1, fillcolor=CELL_COLOURS[PINNED][0], line=dict(width=0), layer="below"))
    for s in sorted({rec.block_range[0] for rec in timeline.records[first : upto + 1]}):
        drawn.add("block")
        shapes.append(dict(type="line", xref="x", yref="paper", x0=s - 0.5, x1=s - 0.5, y0=0, y1=1, line=dict(color="#2563eb", width=1)))
    if highlight is not None and first <= highlight <= upto:
        drawn.add("shown")
        y = iteration_number(highlight)
        shapes.append(dict(type="line", xref="paper", yref="y", x0=0, x1=1, y0=y, y1=y, line=SHOWN_LINE))
    return shapes, drawn


def add_forward_times(fig: go.Figure, records: list[IterationRecord], names: dict[str, str] | None = None) -> None:
    """The engine-measured time of each record, one marker series per forward kind, on `yaxis3`
    (the lower panel of an iteration chart); `names`: a kind's words for a record's `forward`
    (default: the forward kind itself)."""
    order = list(FORWARD_COLOURS)
    kinds = sorted({r.forward for r in records}, key=lambda k: (order.index(k) if k in order else len(order), k))
    for kind in kinds:
        idx = [i for i, r in enumerate(records) if r.forward == kind]
        fig.add_trace(
            go.Scatter(
                x=np.array([iteration_number(i) for i in idx], dtype=np.float32),
                y=np.array([records[i].seconds * 1000 for i in idx], dtype=np.float32),
                yaxis="y3",
                mode="markers",
                name=f"{_plain((names or {}).get(kind, kind))} (ms)",  # a trace file's forward name
                marker=dict(color=FORWARD_COLOURS.get(kind, "#111827"), size=6),
                uid=f"ms-{_plain(kind)}",
            )
        )


def iteration_panels(fig: go.Figure, upto: int, highlight: int | None, counts_title: str, right_axis: dict[str, Any]) -> None:
    """An iteration chart's layout, records 0..`upto` on one x axis of iteration numbers: stacked
    bars of counts above (`counts_title`) with `right_axis` (`yaxis2`) over them, the forward times
    below (`add_forward_times`), the iteration shown as a red line. Two panels laid out by hand:
    make_subplots alone costs ~20 ms, and this figure is redrawn live."""
    fig.update_layout(
        barmode="stack",
        bargap=0.15,
        shapes=shown_iteration_shapes(highlight, upto),
        xaxis=dict(range=[iteration_number(0) - 0.5, iteration_number(upto) + 0.5], anchor="y3", title=dict(text="iteration"), **iteration_ticks(iteration_number(upto))),
        yaxis=dict(domain=[0.45, 1.0], title=dict(text=counts_title)),
        yaxis2=right_axis,
        yaxis3=dict(domain=[0.0, 0.36], rangemode="tozero", title=dict(text="ms (engine)")),
        margin=dict(r=60),  # the bottom's and the legend's: legend_at_foot, once the traces are in
    )


def _plain(text: str) -> str:
    """`text` (a model's name or path, a token string) as Plotly text that shows it literally:
    Plotly reads a few HTML tags and entities in trace names and hover text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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
