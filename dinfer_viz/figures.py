"""Plotly figures built from a Timeline (and, for the sweep, from its result rows).

Every figure keeps a fixed height, explicit axis ranges, a constant `uirevision` (zoom survives
live redraws) and a tiny template, and carries numbers as numpy float32 so plotly ships them as
base64 typed arrays: gr.Plot resends the whole figure on every update, so size is frame rate.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .grid import CELL_COLOURS
from .timeline import EXACT_FORWARDS, Timeline

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
RUN_COLOURS = ("#2563eb", "#ea580c")
MAX_SHAPES = 300  # shapes are one SVG element each; past this the raster draws none


def _finish(fig: go.Figure, height: int, key: str) -> go.Figure:
    fig.update_layout(template=_TEMPLATE, height=height, uirevision=key, hovermode="closest")
    return fig


def message_figure(text: str, height: int = 220) -> go.Figure:
    """A blank figure that says why it is blank."""
    fig = go.Figure()
    fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=13, color="#6b7280"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _finish(fig, height, "message")


def _upto(timeline: Timeline, upto: int | None) -> int:
    return timeline.iterations - 1 if upto is None else timeline.clamp(upto)


def _block_matrix(timeline: Timeline, first: int, upto: int, values_of, masked_only: bool) -> np.ndarray:
    """`[iterations first..upto, positions]` float32 from per-record block values, NaN where
    nothing applies (with `masked_only`: where the position was no longer [MASK] when the record
    started)."""
    x0, x1 = timeline.view_start(), timeline.view_end()
    z = np.full((upto + 1 - first, x1 - x0), np.nan, dtype=np.float32)
    # iteration that committed each position; +inf for never, -1 for prompt (never masked)
    committed_at = np.full(timeline.canvas_length, np.inf)
    committed_at[np.asarray(timeline.initial) != timeline.mask_id] = -1
    for p, c in timeline.commits.items():
        committed_at[p] = c.iteration
    for i in range(first, upto + 1):
        rec = timeline.records[i]
        values = values_of(i, rec)
        if values is None:
            continue
        s, e = rec.block_range
        row = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float32)
        if masked_only:
            row[committed_at[s:e] < i] = np.nan
        z[i - first, s - x0 : min(e, x1) - x0] = row[: min(e, x1) - s]
    return z


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


def confidence_raster(timeline: Timeline, upto: int | None = None, highlight: int | None = None, last_rows: int | None = None) -> go.Figure:
    """Iteration x position heatmap of the top-1 confidence of still-masked positions, with the
    commits as markers (circle: above threshold, x: forced), block starts as lines, forwards that
    recomputed everything as grey bands and partial recomputations as dashed rectangles.

    `last_rows`: draw only the latest iterations (the live view: gr.Plot resends the whole figure
    every redraw, and a long run's full raster is half a megabyte)."""
    if timeline.iterations == 0:
        return message_figure("no iterations yet", 380)
    upto = _upto(timeline, upto)
    first = max(0, upto + 1 - last_rows) if last_rows else 0
    x0, x1 = timeline.view_start(), timeline.view_end()
    z = _block_matrix(timeline, first, upto, lambda i, rec: rec.confidence[timeline.row], masked_only=True)
    fig = go.Figure()
    fig.add_trace(
        go.Heatmap(
            z=z,
            x0=x0,
            dx=1,
            y0=first,
            dy=1,
            zmin=0,
            zmax=1,
            colorscale="Viridis",
            hoverongaps=False,
            colorbar=dict(title=dict(text="conf"), thickness=10, len=0.9),
            hovertemplate="pos %{x} · iteration %{y}<br>top-1 confidence %{z:.3f}<extra></extra>",
            uid="raster",
        )
    )
    for forced, name in ((False, "new"), (True, "forced")):
        points = [(p, c) for p, c in timeline.commits.items() if c.forced == forced and first <= c.iteration <= upto]
        fig.add_trace(
            go.Scatter(
                x=np.array([p for p, _ in points], dtype=np.float32),
                y=np.array([c.iteration for _, c in points], dtype=np.float32),
                mode="markers",
                name=CELL_COLOURS[name][1],
                marker=dict(symbol="x" if forced else "circle", size=7, color=CELL_COLOURS[name][0], line=dict(width=1, color="#111827")),
                text=[f"{timeline.text_of(c.token)!r} conf {c.confidence:.3f}" for _, c in points],
                hovertemplate="pos %{x} · iteration %{y}<br>committed %{text}<extra></extra>",
                uid=f"commits-{name}",
            )
        )
    shapes: list[dict[str, Any]] = []
    for start, end, exact, ranges in _range_runs(timeline, first, upto):
        y0, y1 = start - 0.5, end + 0.5
        if exact:
            shapes.append(dict(type="rect", xref="x", yref="y", x0=x0 - 0.5, x1=x1 - 0.5, y0=y0, y1=y1, fillcolor="rgba(107,114,128,0.12)", line=dict(width=0), layer="below"))
        else:
            for a, b in ranges:
                shapes.append(dict(type="rect", xref="x", yref="y", x0=max(a, x0) - 0.5, x1=b - 0.5, y0=y0, y1=y1, line=dict(color="#db2777", width=1, dash="dash")))
    for s in sorted({rec.block_range[0] for rec in timeline.records[first : upto + 1]}):
        shapes.append(dict(type="line", xref="x", yref="paper", x0=s - 0.5, x1=s - 0.5, y0=0, y1=1, line=dict(color="#2563eb", width=1)))
    if highlight is not None and 0 <= highlight <= upto:
        shapes.append(dict(type="line", xref="paper", yref="y", x0=0, x1=1, y0=highlight, y1=highlight, line=dict(color="#dc2626", width=2)))
    fig.update_layout(shapes=shapes if len(shapes) <= MAX_SHAPES else shapes[-MAX_SHAPES:])
    fig.update_xaxes(title_text="canvas position", range=[x0 - 0.5, x1 - 0.5])
    fig.update_yaxes(title_text="iteration", range=[upto + 0.5, first - 0.5])
    fig.update_layout(margin=dict(b=80))
    return _finish(fig, 380, "raster")


def iteration_chart(timeline: Timeline, upto: int | None = None, highlight: int | None = None) -> go.Figure:
    """Per iteration: tokens committed (above threshold / forced, stacked) with the threshold in
    force; below, the engine-measured time of each iteration coloured by forward kind."""
    if timeline.iterations == 0:
        return message_figure("no iterations yet", 380)
    upto = _upto(timeline, upto)
    records = timeline.records[: upto + 1]
    its = np.arange(len(records), dtype=np.float32)
    forced = np.array([len(r.forced[timeline.row]) for r in records], dtype=np.float32)
    above = np.array([len(r.committed[timeline.row]) for r in records], dtype=np.float32) - forced
    # Two panels sharing one x axis, laid out by hand: make_subplots alone costs ~20 ms, and this
    # figure is redrawn live.
    fig = go.Figure()
    fig.add_trace(go.Bar(x=its, y=above, name="above threshold", marker_color=CELL_COLOURS["new"][0], uid="above"))
    fig.add_trace(go.Bar(x=its, y=forced, name="forced top-1", marker_color=CELL_COLOURS["forced"][0], uid="forced"))
    thresholds = np.array([np.nan if r.threshold is None else r.threshold for r in records], dtype=np.float32)
    fig.add_trace(go.Scatter(x=its, y=thresholds, yaxis="y2", name="threshold", mode="lines", line=dict(color="#111827", width=1.5, shape="hv"), uid="threshold"))
    scalars: dict[str, list[float]] = {}
    for i in range(len(records)):
        for name, value in timeline.scalar_extras_at(i).items():
            scalars.setdefault(name, [np.nan] * len(records))[i] = value
    for name, values in scalars.items():
        fig.add_trace(go.Scatter(x=its, y=np.array(values, dtype=np.float32), yaxis="y2", name=name, mode="lines", line=dict(width=1.5, dash="dot"), uid=f"scalar-{name}"))
    right_top = max([1.05] + [float(np.nanmax(v)) * 1.05 for v in scalars.values() if np.isfinite(v).any()])
    order = list(FORWARD_COLOURS)
    kinds = sorted({r.forward for r in records}, key=lambda k: (order.index(k) if k in order else len(order), k))
    for kind in kinds:
        idx = [i for i, r in enumerate(records) if r.forward == kind]
        fig.add_trace(
            go.Scatter(
                x=np.array(idx, dtype=np.float32),
                y=np.array([records[i].seconds * 1000 for i in idx], dtype=np.float32),
                yaxis="y3",
                mode="markers",
                name=f"{kind} (ms)",
                marker=dict(color=FORWARD_COLOURS.get(kind, "#111827"), size=6),
                uid=f"ms-{kind}",
            )
        )
    shapes = []
    if highlight is not None and 0 <= highlight <= upto:
        shapes.append(dict(type="line", xref="x", yref="paper", x0=highlight, x1=highlight, y0=0, y1=1, line=dict(color="#dc2626", width=2)))
    fig.update_layout(
        barmode="stack",
        bargap=0.15,
        shapes=shapes,
        xaxis=dict(range=[-0.5, len(records) - 0.5], anchor="y3", title=dict(text="iteration")),
        yaxis=dict(domain=[0.45, 1.0], title=dict(text="tokens committed")),
        yaxis2=dict(overlaying="y", side="right", range=[0, right_top], showgrid=False, title=dict(text="threshold")),
        yaxis3=dict(domain=[0.0, 0.36], rangemode="tozero", title=dict(text="ms (engine)")),
        margin=dict(b=90),
        legend=dict(y=-0.2, yanchor="top"),
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
    with its own colour bar; staleness KL is white at zero, top-1 disagreement red."""
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
                y0=0,
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
        fig.update_yaxes(title_text="iteration", range=[upto + 0.5, -0.5], row=row, col=1)
        if highlight is not None and 0 <= highlight <= upto:
            fig.add_hline(y=highlight, line=dict(color="#dc2626", width=2), row=row, col=1)
    fig.update_xaxes(range=[x0 - 0.5, x1 - 0.5])
    fig.update_xaxes(title_text="canvas position", row=len(names), col=1)
    fig.update_layout(margin=dict(t=60))
    return _finish(fig, 180 + 200 * len(names), "extras")


def compare_figure(timelines: Sequence[Timeline], labels: Sequence[str]) -> go.Figure:
    """Two (or more) runs: tokens committed against engine time, and against iteration."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["tokens vs engine time", "tokens vs iteration"], horizontal_spacing=0.1)
    for k, (timeline, label) in enumerate(zip(timelines, labels)):
        colour = RUN_COLOURS[k % len(RUN_COLOURS)]
        counts = np.cumsum([sum(1 for p in rec.committed[timeline.row] if timeline.commits[p].token not in timeline.trace.eos_ids) for rec in timeline.records]).astype(np.float32)
        seconds = np.cumsum([rec.seconds for rec in timeline.records]).astype(np.float32)
        its = np.arange(1, timeline.iterations + 1, dtype=np.float32)
        fig.add_trace(go.Scatter(x=seconds, y=counts, name=label, legendgroup=label, mode="lines+markers", marker=dict(size=4), line=dict(color=colour, shape="hv"), uid=f"t-{k}"), row=1, col=1)
        fig.add_trace(go.Scatter(x=its, y=counts, name=label, legendgroup=label, showlegend=False, mode="lines+markers", marker=dict(size=4), line=dict(color=colour, shape="hv"), uid=f"i-{k}"), row=1, col=2)
    fig.update_xaxes(title_text="engine seconds (sum of iterations)", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="iteration", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=1, col=1)
    return _finish(fig, 320, "compare")


def sweep_figure(points: Sequence[dict[str, Any]], parameter: str = "threshold") -> go.Figure:
    """Accuracy against tokens per forward, one point per swept value (labelled with it)."""
    if not points:
        return message_figure("no sweep yet", 340)
    points = sorted(points, key=lambda r: r["value"])
    symbol = "τ" if parameter == "threshold" else parameter
    fig = go.Figure(
        go.Scatter(
            x=np.array([r["tpf"] for r in points], dtype=np.float32),
            y=np.array([r["accuracy"] for r in points], dtype=np.float32),
            mode="lines+markers+text",
            text=[f"{symbol}={r['value']:g}" for r in points],
            textposition="top center",
            customdata=np.array([[r["tps"], r["examples"]] for r in points], dtype=np.float32),
            hovertemplate="%{text}<br>TPF %{x:.2f} · accuracy %{y:.1%}<br>TPS %{customdata[0]:.1f} over %{customdata[1]} prompts<extra></extra>",
            marker=dict(size=9, color="#2563eb"),
            uid="sweep",
        )
    )
    fig.update_xaxes(title_text="tokens per forward (TPF)", rangemode="tozero")
    fig.update_yaxes(title_text="accuracy", range=[-0.05, 1.1], tickformat=".0%")
    return _finish(fig, 340, "sweep")
