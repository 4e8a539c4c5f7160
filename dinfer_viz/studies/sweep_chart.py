"""The Threshold sweep tab's charts, from the sweep's points (dinfer_viz/studies/sweep_study.py:
SweepState.points), a curve per model and constraint; a partial value (a running or stopped sweep)
drawn hollow.

- `sweep_figure`: accuracy against tokens per forward, each curve named with its AUP over its
  complete values and its partial value; point labels placed so that none covers another or a
  point (`place_labels`);
- `sweep_analysis_figure`: "how autoregressive is the decoder at each value?", the runs' analyses
  against the swept value (docs/analysis.md §3.7): the order correlation's median and quartiles
  (overall, within blocks), the mean KL area, the share of runs converged, one panel each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go

from ..drawing.figure_base import _finish, _plain, legend_at_foot
from ..panes.figures import RUN_COLOURS, message_figure
from ..panes.readouts import percent

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


def value_symbol(parameter: str) -> str:
    """How the charts and the tab name the swept setting: τ for the threshold, a decoder option by
    its own name (`decoder_options.edit_threshold` -> `edit_threshold`)."""
    return "τ" if parameter == "threshold" else parameter.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Curve:
    """One curve of both charts: a model and constraint's points by value, its colour (the
    model's), its name as Plotly text, its line's dash (the unconstrained curve of a comparison
    dashed)."""

    points: list[dict[str, Any]]
    colour: str
    name: str
    dash: str


def curves_of(points: Sequence[dict[str, Any]]) -> list[Curve]:
    """The points' curves, in the order they were swept (points' "model", "constraint"); a curve
    named by its constraint too when any curve has one."""
    keys = list(dict.fromkeys((r.get("model", ""), r.get("constraint", "")) for r in points))
    models = list(dict.fromkeys(m for m, _ in keys))
    constrained = any(c for _, c in keys)
    out = []
    for model, constraint in keys:
        mine = sorted((r for r in points if (r.get("model", ""), r.get("constraint", "")) == (model, constraint)), key=lambda r: r["value"])
        name = (_plain(model) or "sweep") + ((f" · {_plain(constraint) if constraint else 'no constraint'}") if constrained else "")
        out.append(Curve(mine, RUN_COLOURS[models.index(model) % len(RUN_COLOURS)], name, "dash" if constrained and not constraint else "solid"))
    return out


def _symbols(points: Sequence[dict[str, Any]]) -> list[str]:
    """Each point's marker: a partial value hollow (its figures are of the prompts run so far, the first families')."""
    return ["circle-open" if r.get("partial") else "circle" for r in points]


def sweep_figure(points: Sequence[dict[str, Any]], parameter: str = "threshold") -> go.Figure:
    """Accuracy against tokens per forward: one curve per model and constraint (points' "model",
    "constraint"), one point per swept value (labelled with it where a label fits); the legend
    names each curve with its AUP (points' "aup", tinymodel/aup.py: complete values only) and its
    partial value; the hover gives TPS, marked noisy when it comes from one pass."""
    if not points:
        return message_figure("no sweep yet", HEIGHT)
    symbol = value_symbol(parameter)
    curves = curves_of(points)
    x_top = 1.2 * (max(r["tpf"] for r in points) or 1.0)  # the x axis runs from 0, with room for the last point's label
    labels = place_labels([(c.points, _grouped_labels(c.points, symbol, x_top)) for c in curves], x_top)
    fig = go.Figure()
    for k, curve in enumerate(curves):
        mine, colour, name = curve.points, curve.colour, curve.name
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
                marker=dict(size=9, color=colour, symbol=_symbols(mine), line=dict(width=2, color=colour)),
                line=dict(color=colour, dash=curve.dash),
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


ANALYSIS_HEIGHT = 400
# the three panels' shares of the plot's height, top to bottom: ρ, KL area, converged
ANALYSIS_PANELS = {"y": (0.56, 1.0), "y2": (0.28, 0.48), "y3": (0.0, 0.2)}


def _or_nan(value: float | None) -> float:
    return np.nan if value is None else value


def sweep_analysis_figure(points: Sequence[dict[str, Any]], parameter: str = "threshold") -> go.Figure:
    """The runs' analyses at each swept value (points' "analysis": engine.analysis.aggregate_runs),
    on one x axis of the swept value: the order correlation ρ's median with its quartiles as error
    bars, overall (solid) and within blocks (dotted); the mean KL area (nats); the share of runs
    converged. A curve per model and constraint, coloured as in `sweep_figure`; a partial value
    hollow and said in the hover."""
    points = [r for r in points if "analysis" in r]
    if not points:
        return message_figure("no sweep yet", ANALYSIS_HEIGHT)
    symbol = value_symbol(parameter)
    fig = go.Figure()
    kl_top = 0.0
    for k, curve in enumerate(curves_of(points)):
        mine, colour, name, dash = curve.points, curve.colour, curve.name, curve.dash
        xs = np.array([r["value"] for r in mine], dtype=np.float32)
        hover = [_analysis_hover(name, symbol, r) for r in mine]
        symbols = _symbols(mine)
        for key, label, line_dash in (("order_correlation", "ρ overall", dash), ("order_correlation_within_blocks", "ρ within blocks", "dot")):
            q = [r["analysis"][key] for r in mine]
            median = np.array([_or_nan(x["median"]) for x in q], dtype=np.float32)
            fig.add_trace(go.Scatter(
                x=xs, y=median, name=f"{name} · {label}", mode="lines+markers", yaxis="y", legendgroup=f"c{k}",
                error_y=dict(
                    type="data", symmetric=False, color=colour, thickness=1,
                    array=np.array([_or_nan(x["q3"]) for x in q], dtype=np.float32) - median,
                    arrayminus=median - np.array([_or_nan(x["q1"]) for x in q], dtype=np.float32),
                ),
                marker=dict(size=8, color=colour, symbol=symbols, line=dict(width=2, color=colour)),
                line=dict(color=colour, dash=line_dash), hovertext=hover, hovertemplate="%{hovertext}<extra></extra>", uid=f"{key}-{k}",
            ))
        kl = [r["analysis"]["kl_area"] for r in mine]
        kl_top = max([kl_top, *(v for v in kl if v is not None)])
        share = [r["analysis"]["converged_share"] for r in mine]
        for axis, ys, key in (("y2", kl, "kl_area"), ("y3", share, "converged_share")):
            fig.add_trace(go.Scatter(
                x=xs, y=np.array([_or_nan(v) for v in ys], dtype=np.float32), yaxis=axis, showlegend=False, legendgroup=f"c{k}", name=name,
                mode="lines+markers", marker=dict(size=8, color=colour, symbol=symbols, line=dict(width=2, color=colour)),
                line=dict(color=colour, dash=dash), hovertext=hover, hovertemplate="%{hovertext}<extra></extra>", uid=f"{key}-{k}",
            ))
    values = [r["value"] for r in points]
    pad = 0.05 * ((max(values) - min(values)) or 1.0)
    fig.update_layout(
        xaxis=dict(range=[min(values) - pad, max(values) + pad], anchor="y3", title=dict(text=f"{symbol} ({parameter})" if symbol != parameter else symbol)),
        yaxis=dict(domain=ANALYSIS_PANELS["y"], range=[-1.1, 1.1], title=dict(text="order ρ")),
        yaxis2=dict(domain=ANALYSIS_PANELS["y2"], range=[-0.1 * (kl_top or 1.0), 1.1 * (kl_top or 1.0)], title=dict(text="KL area")),  # a point at 0 drawn whole
        yaxis3=dict(domain=ANALYSIS_PANELS["y3"], range=[-0.1, 1.1], tickformat=".0%", title=dict(text="converged")),
        showlegend=True,
    )
    return _finish(fig, legend_at_foot(fig, ANALYSIS_HEIGHT, 40), "sweep-analysis")


def _analysis_hover(name: str, symbol: str, r: dict[str, Any]) -> str:
    """A value's aggregated analyses in words (a figure no run has: "n/a")."""
    a = r["analysis"]

    def spread(q: dict[str, Any]) -> str:
        return "n/a" if q["median"] is None else f"{q['median']:.2f} (quartiles {q['q1']:.2f}–{q['q3']:.2f}, {q['runs']} runs)"

    kl = "n/a" if a["kl_area"] is None else f"{a['kl_area']:.3f} nats"
    converged = "n/a" if a["converged_share"] is None else f"{percent(a['converged_share'])} of {a['converged_runs']} runs"
    partial = " · partial: the sweep did not finish this value" if r.get("partial") else ""
    return (
        f"{name}: {symbol}={r['value']:g}{partial}<br>ρ overall {spread(a['order_correlation'])}<br>ρ within blocks {spread(a['order_correlation_within_blocks'])}"
        f"<br>KL area {kl} · converged {converged}"
    )
