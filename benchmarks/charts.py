"""Plotly charts of benchmark and sweep results, written as standalone HTML (PNG when kaleido is installed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def benchmark_figure(rows: list[dict[str, Any]], title: str) -> go.Figure:
    """TPS (median, min-max bars), TPF and accuracy per configuration, side by side."""
    names = [r["name"] for r in rows]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TPS (median, min-max)", "TPF (tokens per forward)", "accuracy"))
    fig.add_bar(
        x=names,
        y=[r["tps_median"] for r in rows],
        error_y=dict(
            type="data",
            symmetric=False,
            array=[r["tps_max"] - r["tps_median"] for r in rows],
            arrayminus=[r["tps_median"] - r["tps_min"] for r in rows],
        ),
        text=[f"{r['tps_ratio']:.2f}x" if r["tps_ratio"] is not None else "" for r in rows],
        name="TPS",
        row=1,
        col=1,
    )
    fig.add_bar(x=names, y=[r["tpf"] for r in rows], name="TPF", row=1, col=2)
    fig.add_bar(x=names, y=[r["accuracy"] for r in rows], name="accuracy", row=1, col=3)
    fig.update_yaxes(range=[0, 1], tickformat=".0%", row=1, col=3)
    fig.update_layout(title=title, showlegend=False, template="plotly_white", height=420)
    return fig


def sweep_figure(rows: list[dict[str, Any]], title: str) -> go.Figure:
    """Accuracy against TPF, one line per decoder through its sweep values; the Pareto front dashed."""
    fig = go.Figure()
    for decoder in dict.fromkeys(r["decoder"] for r in rows):
        mine = sorted((r for r in rows if r["decoder"] == decoder), key=lambda r: r["tpf"])
        fig.add_scatter(
            x=[r["tpf"] for r in mine],
            y=[r["accuracy"] for r in mine],
            mode="lines+markers",
            name=decoder if "aup" not in mine[0] else f"{decoder} · AUP {mine[0]['aup']:.1f}",
            text=[f"{r['knob']} {r['value']:g}" for r in mine],
            hovertemplate="%{text}<br>TPF %{x:.2f}<br>accuracy %{y:.1%}<extra>" + decoder + "</extra>",
        )
    front = sorted((r for r in rows if r["pareto"]), key=lambda r: r["tpf"])
    fig.add_scatter(
        x=[r["tpf"] for r in front],
        y=[r["accuracy"] for r in front],
        mode="lines",
        line=dict(dash="dash", color="black"),
        name="Pareto front",
    )
    fig.update_layout(
        title=title,
        xaxis_title="TPF (tokens per forward)",
        yaxis=dict(title="accuracy", tickformat=".0%"),
        template="plotly_white",
        height=480,
    )
    return fig


def write_figure(fig: go.Figure, stem: Path) -> list[Path]:
    """`stem`.html, self-contained (works offline), and `stem`.png when kaleido is importable."""
    paths = [stem.with_suffix(".html")]
    fig.write_html(paths[0], include_plotlyjs=True)
    if importlib.util.find_spec("kaleido") is not None:
        paths.append(stem.with_suffix(".png"))
        fig.write_image(paths[1])
    return paths
