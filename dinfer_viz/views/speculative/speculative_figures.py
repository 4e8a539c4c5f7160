"""The per-iteration chart of a self-speculative run: per step the drafted tokens the verifier
accepted and the correction it wrote, stacked, with the forwards the step ran (2: draft + verify,
1: the draft alone, verify skipped) on the right axis; below, the engine-measured step times by
forward. Built as the masked view's chart is (dinfer_viz/drawing/figure_base.py)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ...drawing.cells import CELL_COLOURS
from ...drawing.figure_base import _finish, _upto, add_forward_times, iteration_panels, legend_at_foot
from ...reading.timeline import Timeline, iteration_number


def speculative_chart(timeline: Timeline, upto: int | None, highlight: int | None, names: dict[str, str]) -> go.Figure:
    """Records 0..`upto` (iterations numbered 1..N as the page does): `accepted` (the state's
    accepted drafted tokens), `corrected` (1 where the verifier wrote its own token), `forwards`
    (2 or 1, by `verified`); `names`: the view's words for a record's `forward`."""
    upto = _upto(timeline, upto)
    records = timeline.records[: upto + 1]
    row = timeline.row
    its = np.array([iteration_number(i) for i in range(len(records))], dtype=np.float32)
    accepted = np.array([r.state["accepted"][row] for r in records], dtype=np.float32)
    corrected = np.array([r.state["corrected"][row] is not None for r in records], dtype=np.float32)
    forwards = np.array([2 if r.state["verified"][row] else 1 for r in records], dtype=np.float32)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=its, y=accepted, name="accepted drafted tokens", marker_color=CELL_COLOURS["new"][0], uid="accepted"))
    fig.add_trace(go.Bar(x=its, y=corrected, name="verifier's correction", marker_color=CELL_COLOURS["corrected"][0], uid="corrected"))
    fig.add_trace(
        go.Scatter(x=its, y=forwards, yaxis="y2", name="forwards (2: draft + verify, 1: verify skipped)", mode="lines+markers",
                   line=dict(color="#111827", width=1.5, shape="hv"), marker=dict(size=4), uid="forwards")
    )
    add_forward_times(fig, records, names)
    iteration_panels(
        fig, upto, highlight, "tokens committed",
        dict(overlaying="y", side="right", range=[0, 2.5], tickmode="array", tickvals=[1, 2], showgrid=False, automargin=True, title=dict(text="forwards", standoff=8)),
    )
    return _finish(fig, legend_at_foot(fig, 380, 90), "iterations")
