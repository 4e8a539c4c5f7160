"""Plotly figures built from a Timeline (and, for the sweep, from its result rows): the raster and
the per-iteration chart (drawn by the run's kind view, dinfer_viz/views/), the extras and the
comparison. What every figure shares (and why: size is frame rate) is dinfer_viz/drawing/figure_base.py's.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..drawing.figure_base import MESSAGE_LINE_CHARS, SHOWN_LINE, _block_matrix, _finish, _plain, _upto, heatmap_rows, heatmap_y, iteration_ticks, message_figure, rows_title
from ..reading.timeline import Timeline, iteration_number
from ..views import view_for

__all__ = ["MESSAGE_LINE_CHARS", "message_figure", "raster", "confidence_raster", "iteration_chart", "extras_figure", "compare_figure", "plottable_extras"]

RUN_COLOURS = ("#2563eb", "#ea580c")


def raster(
    timeline: Timeline, upto: int | None = None, highlight: int | None = None, last_rows: int | None = None, expected: list[int] | None = None
) -> go.Figure:
    """The run's iteration x position raster, as its kind's view draws it (a masked run's top-1
    confidence, a uniform-state run's entropy). `upto`, `highlight`: record indices (0-based, as
    Timeline's); the figure numbers iterations as the page does (`iteration_number`: 1..N).
    `expected`: the answer's ids from the prompt's end, named in the hover of a wrong token.
    `last_rows`: draw only the latest iterations (the live view: gr.Plot resends the whole figure
    every redraw, and a long run's full raster is half a megabyte)."""
    if timeline.iterations == 0:
        return message_figure("no iterations yet", 380)
    return view_for(timeline).raster(timeline, upto, highlight, last_rows, expected)


confidence_raster = raster  # the name the Run tab imports (a masked run's raster is of confidence)


def iteration_chart(timeline: Timeline, upto: int | None = None, highlight: int | None = None) -> go.Figure:
    """Per iteration (numbered 1..N, as the page does; `upto` and `highlight` are record indices),
    as the run's kind view draws it: what each step did, the rule's parameters, the step times."""
    if timeline.iterations == 0:
        return message_figure("no iterations yet", 380)
    return view_for(timeline).iteration_chart(timeline, upto, highlight)


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
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, vertical_spacing=0.16 / len(names), subplot_titles=[_plain(EXTRA_TITLES.get(n, n)) for n in names])  # a trace file's extra names
    rows = heatmap_rows(0, upto, (x1 - x0) * len(names), keep=highlight)  # the cell bound shared by the panels
    for row, name in enumerate(names, start=1):
        z = _block_matrix(timeline, 0, upto, lambda i, rec, name=name: timeline.extras_at(i).get(name), masked_only=False, rows=rows)
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
                **heatmap_y(0, rows),
                zmin=low,
                zmax=high,
                colorscale=_EXTRA_SCALES.get(name, "Cividis"),
                hoverongaps=False,
                colorbar=dict(thickness=8, len=(domain[1] - domain[0]) * 0.9, y=(domain[0] + domain[1]) / 2, yanchor="middle"),
                hovertemplate=f"{_plain(name)}<br>pos %{{x}} · iteration %{{y}}: %{{z:.4g}}<extra></extra>",
                uid=f"extra-{_plain(name)}",
            ),
            row=row,
            col=1,
        )
        fig.update_yaxes(title_text=rows_title(rows, 0, upto), range=[iteration_number(upto) + 0.5, iteration_number(0) - 0.5], row=row, col=1, **iteration_ticks(iteration_number(upto)))
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
        view = view_for(timeline)
        counts = np.array([view.settled_tokens(timeline, n) for n in range(1, timeline.iterations + 1)], dtype=np.float32)
        seconds = np.cumsum([rec.seconds for rec in timeline.records]).astype(np.float32)
        its = np.arange(1, timeline.iterations + 1, dtype=np.float32)
        name = _plain(label)  # a label may hold a model's path or name
        fig.add_trace(go.Scatter(x=seconds, y=counts, name=name, legendgroup=label, mode="lines+markers", marker=dict(size=4), line=dict(color=colour, shape="hv"), uid=f"t-{k}"), row=1, col=1)
        fig.add_trace(go.Scatter(x=its, y=counts, name=name, legendgroup=label, showlegend=False, mode="lines+markers", marker=dict(size=4), line=dict(color=colour, shape="hv"), uid=f"i-{k}"), row=1, col=2)
    fig.update_xaxes(title_text="engine seconds (sum of iterations)", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="iteration", rangemode="tozero", row=1, col=2, **iteration_ticks(max(t.iterations for t in timelines)))
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=1, col=1)
    if highlight is not None:
        fig.add_vline(x=iteration_number(highlight), line=SHOWN_LINE, row=1, col=2)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="iteration shown", line=SHOWN_LINE, hoverinfo="skip", uid="shown"), row=1, col=2)
    # the legend at the figure's foot, below the axis titles (the template's legend, just under the
    # plot, sat on them); the bottom margin holds both
    fig.update_layout(legend=dict(yref="container", y=0.01, yanchor="bottom"), margin=dict(b=110))
    return _finish(fig, 360, "compare")

