"""The Threshold sweep tab's chart: accuracy against tokens per forward from the sweep's points
(dinfer_viz/sweep.py: SweepState.points), a curve per model and constraint, each named with its
AUP over its complete values; a partial value (a running or stopped sweep) drawn hollow and named
in the legend; point labels placed so that none covers another or a point (`place_labels`)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go

from .figure_base import _finish, _plain
from .figures import RUN_COLOURS, message_figure
from .readouts import percent

HEIGHT = 340  # the figure with one legend line; each more curve adds LEGEND_LINE_PX below the axis
MARGIN_TOP, MARGIN_BOTTOM, LEGEND_LINE_PX = 36, 72, 18  # the bottom: the x-axis title, then the legend
# The label layout's model of the plot area: the narrowest the page gives it (the chart spans the
# tab at 1024 px, less the axes' margins) and a label's size at the template's 11 px font. Wider
# plots only spread the labels further apart, so labels apart here are apart at every size.
PLOT_PX = (420.0, float(HEIGHT - MARGIN_TOP - MARGIN_BOTTOM))  # width, height
CHAR_PX, LABEL_PX, MARKER_PX = 6.6, 15.0, 10.0
Y_RANGE = (-0.05, 1.1)
# where a label may sit, in the order tried: plotly's textposition and the box's offset from the point
POSITIONS = ("top center", "bottom center", "middle right", "middle left")


def sweep_figure(points: Sequence[dict[str, Any]], parameter: str = "threshold") -> go.Figure:
    """Accuracy against tokens per forward: one curve per model and constraint (points' "model",
    "constraint"), one point per swept value (labelled with it where a label fits); the legend
    names each curve with its AUP (points' "aup", tinymodel/aup.py: complete values only) and its
    partial value; the hover gives TPS, marked noisy when it comes from one pass."""
    if not points:
        return message_figure("no sweep yet", HEIGHT)
    symbol = "τ" if parameter == "threshold" else parameter.rsplit(".", 1)[-1]  # a decoder option by its own name
    curves = list(dict.fromkeys((r.get("model", ""), r.get("constraint", "")) for r in points))  # in the order they were swept
    models = list(dict.fromkeys(m for m, _ in curves))
    constrained = any(c for _, c in curves)
    x_top = 1.2 * (max(r["tpf"] for r in points) or 1.0)  # the x axis runs from 0, with room for the last point's label
    mine_of = {curve: sorted((r for r in points if (r.get("model", ""), r.get("constraint", "")) == curve), key=lambda r: r["value"]) for curve in curves}
    labels = place_labels([(mine_of[c], _grouped_labels(mine_of[c], symbol, x_top)) for c in curves], x_top)
    fig = go.Figure()
    for k, curve in enumerate(curves):
        model, constraint = curve
        mine = mine_of[curve]
        colour = RUN_COLOURS[models.index(model) % len(RUN_COLOURS)]
        name = _plain(model) or "sweep"
        if constrained:
            name += f" · {_plain(constraint) if constraint else 'no constraint'}"
        score = mine[0].get("aup", "none")
        legend = name if score == "none" else f"{name} · AUP {score:.1f}" if score is not None else f"{name} · AUP when a value completes"
        partial = [r for r in mine if r.get("partial")]
        if partial:
            legend += "".join(f" · {symbol}={r['value']:g} partial ({r['examples']} prompts)" for r in partial)
        texts, positions = labels[k]
        fig.add_trace(
            go.Scatter(
                x=np.array([r["tpf"] for r in mine], dtype=np.float32),
                y=np.array([r["accuracy"] for r in mine], dtype=np.float32),
                name=legend,
                mode="lines+markers+text",
                text=texts,
                textposition=positions,
                textfont=dict(color=colour),
                hovertext=[_hover(name, symbol, r) for r in mine],
                hovertemplate="%{hovertext}<extra></extra>",
                # a partial value hollow: its accuracy is of the prompts run so far (the first families')
                marker=dict(size=9, color=colour, symbol=["circle-open" if r.get("partial") else "circle" for r in mine], line=dict(width=2, color=colour)),
                line=dict(color=colour, dash="dash" if constrained and not constraint else "solid"),
                uid=f"sweep-{k}",
            )
        )
    # below the axis title, a line per curve: inside the plot a long legend (a constraint, a partial
    # value) covered points and labels; the figure grows by the lines, so the plot keeps its size
    with_aup = any("aup" in r for r in points)
    extra = LEGEND_LINE_PX * (len(curves) - 1)
    fig.update_layout(
        showlegend=len(curves) > 1 or with_aup,
        legend=dict(orientation="v", x=0, xanchor="left", yref="container", y=0, yanchor="bottom"),
        margin=dict(t=MARGIN_TOP, b=MARGIN_BOTTOM + extra),
    )
    fig.update_xaxes(title_text="tokens per forward (TPF)", range=[0, x_top])
    fig.update_yaxes(title_text="accuracy", range=list(Y_RANGE), tickformat=".0%")
    return _finish(fig, HEIGHT + extra, "sweep")


def _hover(name: str, symbol: str, r: dict[str, Any]) -> str:
    """A point's value, TPF, accuracy (written as the table writes it) and TPS: the median of its
    passes with their spread, or marked noisy when it is one pass's (a shared CPU's load moves it)."""
    if r.get("passes", 1) > 1 and "tps_range" in r:
        low, high = r["tps_range"]
        tps = f"TPS {r['tps']:.1f} (median of {r['passes']} passes, {low:.1f}–{high:.1f})"
    else:
        tps = f"TPS {r['tps']:.1f} (one pass: noisy)"
    partial = " · partial: the sweep did not finish this value" if r.get("partial") else ""
    return f"{name}: {symbol}={r['value']:g}{partial}<br>TPF {r['tpf']:.2f} · accuracy {percent(r['accuracy'])}<br>{tps} over {r['examples']} prompts"


def _grouped_labels(points: Sequence[dict[str, Any]], symbol: str, x_span: float, near_x: float = 0.12, near_y: float = 0.06) -> list[str]:
    """One label per run of consecutive values whose points lie near the first's (within `near_x`
    of the x span and `near_y` of accuracy: about a label's width and height on the 340 px chart),
    on that first point ("τ=0.5–0.95"); the others none: labels on nearby points print over each
    other (a flat pair-sum sweep piled five of them). A partial value's label says so."""
    labels = [""] * len(points)
    start = 0
    for i in range(1, len(points) + 1):
        if i == len(points) or abs(points[i]["tpf"] - points[start]["tpf"]) > near_x * x_span or abs(points[i]["accuracy"] - points[start]["accuracy"]) > near_y:
            first, last = points[start]["value"], points[i - 1]["value"]
            labels[start] = f"{symbol}={first:g}" if i - 1 == start else f"{symbol}={first:g}–{last:g}"
            if any(p.get("partial") for p in points[start:i]):
                labels[start] += " (partial)"
            start = i
    return labels


Box = tuple[float, float, float, float]  # left, bottom, right, top in the plot model's pixels


def _pixel(tpf: float, accuracy: float, x_top: float) -> tuple[float, float]:
    width, height = PLOT_PX
    return tpf / x_top * width, (accuracy - Y_RANGE[0]) / (Y_RANGE[1] - Y_RANGE[0]) * height


def label_box(x: float, y: float, text: str, position: str) -> Box:
    """The box a label at `position` (POSITIONS) takes beside the point at pixel (x, y)."""
    w, h, gap = CHAR_PX * len(text), LABEL_PX, MARKER_PX / 2 + 1
    if position == "top center":
        return x - w / 2, y + gap, x + w / 2, y + gap + h
    if position == "bottom center":
        return x - w / 2, y - gap - h, x + w / 2, y - gap
    if position == "middle right":
        return x + gap, y - h / 2, x + gap + w, y + h / 2
    return x - gap - w, y - h / 2, x - gap, y + h / 2


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def place_labels(curves: Sequence[tuple[Sequence[dict[str, Any]], list[str]]], x_top: float) -> list[tuple[list[str], list[str]]]:
    """Per curve (its points and wanted labels), the labels kept and their textpositions: each at
    the first of POSITIONS where its box stays inside the plot and covers no point and no label
    placed before it (curves in order, points by value); a label with no such place is left out
    (the point's hover still names its value). Positions are judged on the PLOT_PX model."""
    width, height = PLOT_PX
    markers = [
        (x - MARKER_PX / 2, y - MARKER_PX / 2, x + MARKER_PX / 2, y + MARKER_PX / 2)
        for points, _ in curves for x, y in (_pixel(r["tpf"], r["accuracy"], x_top) for r in points)
    ]
    placed: list[Box] = []
    out = []
    for points, wanted in curves:
        texts, positions = [], []
        for r, text in zip(points, wanted):
            x, y = _pixel(r["tpf"], r["accuracy"], x_top)
            chosen = ""
            for position in POSITIONS if text else ():
                box = label_box(x, y, text, position)
                inside = box[0] >= 0 and box[2] <= width and box[1] >= 0 and box[3] <= height
                if inside and not any(_overlap(box, other) for other in placed + markers):
                    placed.append(box)
                    chosen = position
                    break
            texts.append(text if chosen else "")
            positions.append(chosen or "top center")
        out.append((texts, positions))
    return out
