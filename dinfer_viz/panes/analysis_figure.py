"""The analysis panel of a run ("how autoregressive is this decoder?"): engine/analysis.py's
numbers for the run on display drawn as two figures and a few lines of text (docs/analysis.md §3,
docs/app.md §2).

- per step: the finalized fraction, the gate and mean confidence of the open positions (all in
  [0, 1], one axis) and the KL to the final answer (nats, its own axis);
- the finalisation order: each generated position against the step from which it holds its final
  token, so a left-to-right decoder draws a staircase up the diagonal and the order correlation
  (Spearman's rho of the two) is its one number.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from engine.analysis import CONVERGED_WORDS, analyze, decided_steps, figure_text

from ..drawing.figure_base import _finish, iteration_ticks, message_figure, shown_iteration_shapes
from .grid import inert
from ..reading.timeline import Timeline, iteration_number
from ..views import view_for

# one colour per per-step series, the same in the figure and in the text that names them
SERIES = {
    "finalized_fraction": ("finalized fraction", "#16a34a"),
    "gate_confidence": ("gate: least confident open position", "#ea580c"),
    "mean_confidence": ("mean confidence of the open positions", "#2563eb"),
    "kl_to_final": ("KL to the final answer (nats, right axis)", "#7c3aed"),
}


def _xs(n: int) -> np.ndarray:
    return np.array([iteration_number(i) for i in range(n)], dtype=np.float32)


def _ys(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float32)


def per_step_figure(timeline: Timeline, result: dict[str, Any] | None = None, highlight: int | None = None) -> go.Figure:
    """The per-step analyses of `timeline`'s run (`result`: analyze's, computed when not given),
    on an x axis of iteration numbers; `highlight`: the record the page shows."""
    if not timeline.iterations:
        return message_figure("no steps recorded: nothing to analyse", 340)
    result = result if result is not None else analyze(timeline.trace, timeline.row)
    n, fig = timeline.iterations, go.Figure()
    for key, (name, colour) in SERIES.items():
        fig.add_trace(go.Scatter(
            x=_xs(n), y=_ys(result[key]), name=name, mode="lines+markers", yaxis="y2" if key == "kl_to_final" else "y",
            line=dict(color=colour, width=2, dash="dot" if key == "kl_to_final" else "solid"), marker=dict(size=5), uid=key,
        ))
    kl = [v for v in result["kl_to_final"] if v is not None]
    fig.update_layout(
        shapes=shown_iteration_shapes(highlight, n - 1),
        xaxis=dict(range=[0.5, n + 0.5], title=dict(text="iteration"), **iteration_ticks(n)),
        yaxis=dict(range=[0, 1.05], title=dict(text="fraction / probability")),
        yaxis2=dict(overlaying="y", side="right", range=[0, max(kl + [1.0]) * 1.05], title=dict(text="KL (nats)"), showgrid=False),
        margin=dict(r=60, b=100),
        legend=dict(y=-0.25),
    )
    return _finish(fig, 360, "analysis-steps")


def order_figure(timeline: Timeline, result: dict[str, Any] | None = None) -> go.Figure:
    """Each generated position against its finalisation step (iteration numbers): the diagonal
    staircase of a left-to-right decoder; the title gives the order correlation."""
    if not timeline.iterations:
        return message_figure("no steps recorded: no finalisation order", 340)
    result = result if result is not None else analyze(timeline.trace, timeline.row)
    steps = decided_steps(timeline.trace, timeline.row)
    positions = sorted(steps)
    rho = result["order_correlation"]
    fig = go.Figure(go.Scatter(
        x=np.array(positions, dtype=np.float32), y=np.array([iteration_number(steps[p]) for p in positions], dtype=np.float32),
        mode="markers", marker=dict(size=7, color="#16a34a"), name="position finalised", uid="order",
        hovertemplate="position %{x}<br>final from iteration %{y}<extra></extra>",
    ))
    for s in sorted({rec.block_range[0] for rec in timeline.records}):  # block starts, as the raster draws them
        fig.add_shape(type="line", xref="x", yref="paper", x0=s - 0.5, x1=s - 0.5, y0=0, y1=1, line=dict(color="#2563eb", width=1))
    fig.update_layout(
        title=dict(text=f"order correlation ρ = {figure_text(rho)} (1: left to right)" + (f"; {result['order_left_out']} early-stop positions left out" if result.get("order_left_out") else ""), font=dict(size=12)),
        xaxis=dict(title=dict(text="canvas position")),
        yaxis=dict(range=[0.5, timeline.iterations + 0.5], title=dict(text="finalised at iteration")),
        margin=dict(t=50), showlegend=False,
    )
    return _finish(fig, 360, "analysis-order")


def approximations(timeline: Timeline) -> list[str]:
    """What this run's analyses approximate (docs/analysis.md §3.1 and §3.3), in the run's terms."""
    notes = view_for(timeline).finality_notes(timeline)
    if any(rec.candidates is None for rec in timeline.records):
        notes.append("the trace holds only each position's top-1 and its confidence, no candidates: KL is a lower bound wherever the final token is not the top-1")
    else:
        notes.append("the trace holds the top-3 candidates, not the whole distribution: KL is exact where the final token is among them, a lower bound elsewhere")
    return notes


def analysis_text(timeline: Timeline, result: dict[str, Any] | None = None) -> str:
    """The per-run numbers (order correlation overall and within blocks, converged, the last
    finalized fraction) and the approximations named, as Markdown; every trace string escaped."""
    result = result if result is not None else analyze(timeline.trace, timeline.row)
    converged = CONVERGED_WORDS[result["converged"]]
    last = next((v for v in reversed(result["finalized_fraction"]) if v is not None), None)
    lines = [
        f"**How autoregressive is this decoder?** `{inert(timeline.trace.model or 'an unnamed model')}`, {result['steps']} steps",
        "",
        "| order correlation ρ (overall) | ρ within blocks | converged | finalized at the end |",
        "|---|---|---|---|",
        f"| {figure_text(result['order_correlation'])} | {figure_text(result['order_correlation_within_blocks'])} | {converged} | {figure_text(last)} |",
        "",
        "ρ is Spearman's rank correlation of position against the step from which it holds its final token: 1 is strictly left to right "
        "(an autoregressive order), 0 no order, −1 right to left. The finalized fraction counts the positions whose current token (written, "
        "or the step's top-1) already is the final one; the gate is the least confident open position, which threshold decoding and early stopping watch.",
        "",
        "**Approximated:** " + "; ".join(inert(n) for n in approximations(timeline)) + ".",
    ]
    return "\n".join(lines)
