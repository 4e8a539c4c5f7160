"""The Threshold sweep tab's chart: accuracy against tokens per forward from the sweep's points
(dinfer_viz/sweep.py: SweepState.points), a curve per model, each named with its AUP."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go

from .figure_base import _finish, _plain
from .figures import RUN_COLOURS, message_figure
from .readouts import percent


def sweep_figure(points: Sequence[dict[str, Any]], parameter: str = "threshold") -> go.Figure:
    """Accuracy against tokens per forward: one curve per model (points' "model"), one point per
    swept value (labelled with it); the legend names each curve with its AUP (points' "aup",
    tinymodel/aup.py) when the points carry it."""
    if not points:
        return message_figure("no sweep yet", 340)
    symbol = "τ" if parameter == "threshold" else parameter.rsplit(".", 1)[-1]  # a decoder option by its own name
    models = list(dict.fromkeys(r.get("model", "") for r in points))  # in the order they were swept
    x_span = max(r["tpf"] for r in points) or 1.0  # the x axis runs from 0
    fig = go.Figure()
    for k, model in enumerate(models):
        mine = sorted((r for r in points if r.get("model", "") == model), key=lambda r: r["value"])
        colour = RUN_COLOURS[k % len(RUN_COLOURS)]
        name = _plain(model) or "sweep"
        score = mine[0].get("aup")
        legend = name if score is None else f"{name} · AUP {score:.1f}"
        fig.add_trace(
            go.Scatter(
                x=np.array([r["tpf"] for r in mine], dtype=np.float32),
                y=np.array([r["accuracy"] for r in mine], dtype=np.float32),
                name=legend,
                mode="lines+markers+text",
                text=_grouped_labels(mine, symbol, x_span),
                textposition="top center",
                textfont=dict(color=colour),
                # each point's own value, TPF, accuracy (written as the table writes it) and TPS
                hovertext=[
                    f"{name}: {symbol}={r['value']:g}<br>TPF {r['tpf']:.2f} · accuracy {percent(r['accuracy'])}<br>TPS {r['tps']:.1f} over {r['examples']} prompts"
                    for r in mine
                ],
                hovertemplate="%{hovertext}<extra></extra>",
                marker=dict(size=9, color=colour),
                line=dict(color=colour),
                uid=f"sweep-{k}",
            )
        )
    # inside the top right: the plot's own label covers the space above it, and a model's point rarely lands there
    with_aup = any("aup" in r for r in points)
    fig.update_layout(showlegend=len(models) > 1 or with_aup, legend=dict(x=0.99, xanchor="right", y=0.99, yanchor="top", bgcolor="rgba(255,255,255,0.8)"))
    fig.update_xaxes(title_text="tokens per forward (TPF)", rangemode="tozero")
    fig.update_yaxes(title_text="accuracy", range=[-0.05, 1.1], tickformat=".0%")
    return _finish(fig, 340, "sweep")


def _grouped_labels(points: Sequence[dict[str, Any]], symbol: str, x_span: float, near_x: float = 0.12, near_y: float = 0.06) -> list[str]:
    """One label per run of consecutive values whose points lie near the first's (within `near_x`
    of the x span and `near_y` of accuracy: about a label's width and height on the 340 px chart),
    on that first point ("τ=0.5–0.95"); the others none: labels on nearby points print over each
    other (a flat pair-sum sweep piled five of them)."""
    labels = [""] * len(points)
    start = 0
    for i in range(1, len(points) + 1):
        if i == len(points) or abs(points[i]["tpf"] - points[start]["tpf"]) > near_x * x_span or abs(points[i]["accuracy"] - points[start]["accuracy"]) > near_y:
            first, last = points[start]["value"], points[i - 1]["value"]
            labels[start] = f"{symbol}={first:g}" if i - 1 == start else f"{symbol}={first:g}–{last:g}"
            start = i
    return labels
