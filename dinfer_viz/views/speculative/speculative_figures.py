"""The per-iteration chart of a self-speculative run: per step the drafted tokens the verifier
accepted and the correction it wrote, stacked, with the forwards the step ran (2: draft + verify,
1: the draft alone, verify skipped) on the right axis; with `verify=router`, a lane under them with
each step's router decision and its estimate; below, the engine-measured step times by forward.
Built as the masked view's chart is (dinfer_viz/drawing/figure_base.py)."""

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
    add_router_lane(fig, its, [r.state.get("router", [None])[row] for r in records])
    return _finish(fig, legend_at_foot(fig, 380, 90), "iterations")


# a router decision's lane marker: (words, symbol, colour), by whether it verified and why
ROUTER_MARKS = {
    "verify": ("router: verify (score passed)", "circle", "#111827"),
    "skip": ("router: skip (score below)", "circle-open", "#111827"),
    "one open position": ("router: skip, exact (one open position: the draft is the verify's query)", "diamond", "#059669"),
    "nothing confident": ("router: verify (a skip had nothing confident to commit)", "x", "#b91c1c"),
}


def router_mark(decision: dict) -> str:
    """The ROUTER_MARKS key of a record's `state.router` entry."""
    return decision["why"] if decision["why"] != "score" else "verify" if decision["verify"] else "skip"


def router_words(decision: dict) -> str:
    """"E[K] 7.95 · confident run 8 · score -0.05: skip"."""
    return f"E[K] {decision['expected']:.2f} · confident run {decision['confident']} · score {decision['score']:.2f}: {ROUTER_MARKS[router_mark(decision)][0].removeprefix('router: ')}"


def add_router_lane(fig: go.Figure, its: np.ndarray, decisions: list[dict | None]) -> None:
    """The router's decisions (verify=router records' `state.router`) as a lane of markers between
    the two panels (`yaxis4`), one series per kind of decision, the estimate on hover; nothing for
    a run without a router."""
    if not any(decisions):
        return
    for key, (name, symbol, colour) in ROUTER_MARKS.items():
        idx = [i for i, d in enumerate(decisions) if d is not None and router_mark(d) == key]
        if idx:
            fig.add_trace(go.Scatter(
                x=its[idx], y=[0] * len(idx), yaxis="y4", mode="markers", name=name, uid=f"router-{symbol}",
                marker=dict(symbol=symbol, color=colour, size=9, line=dict(color=colour, width=1.5)),
                text=[router_words(decisions[i]) for i in idx], hovertemplate="iteration %{x}: %{text}<extra></extra>",
            ))
    fig.update_layout(yaxis4=dict(domain=[0.37, 0.43], range=[-1, 1], showticklabels=False, showgrid=False, zeroline=False, title=dict(text="router", standoff=4)))
