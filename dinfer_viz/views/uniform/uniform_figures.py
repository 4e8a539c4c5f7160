"""The raster and the per-iteration chart of a uniform-state run (DiffusionGemma; docs/trace.md
§3.2), drawn from the records' `uniform` dict: what each step's entropy-bound rule saw and did.
The uniform view (dinfer_viz/views/uniform/__init__.py) draws them for dinfer_viz/panes/figures.py.

In a uniform run every canvas position holds a token at every step. The raster shows the entropy of
each position's scaled distribution per step (low: the model is sure), and marks the positions the
step accepted: sorted by entropy, lowest first, a position is accepted iff the entropies of those
before it sum to at most the bound (`entropy_sum <= bound`); every other position was re-noised. A
row that has stopped (its canvas frozen, stable and confident) is blank at the steps it sat out.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from engine import IterationRecord

from ...drawing.cells import CELL_COLOURS, expected_at
from ...drawing.constraint import cut_markers
from ...drawing.figure_base import RASTER_MARKS, _block_matrix, _finish, _legend_only, _plain, _upto, add_forward_times, block_and_shown_shapes, heatmap_rows, iteration_panels, iteration_ticks, legend_at_foot, raster_heatmap, rows_title
from ...reading.timeline import Timeline, iteration_number
from .uniform_grid import step_verdict

NOISE_BAR = "#a8a29e"  # re-noised counts: the grid dims noise to this (a near-white cell would vanish as a bar)
OUTPUT_MARK = dict(symbol="star", size=11, color="#2563eb", line=dict(width=1, color="#111827"))


def _active(timeline: Timeline, rec: IterationRecord) -> bool:
    return bool(rec.active[timeline.row])


def uniform_raster(timeline: Timeline, upto: int | None, highlight: int | None, last_rows: int | None, expected: list[int] | None) -> go.Figure:
    """Iteration x position heatmap of each step's per-position entropy (`uniform.entropy`), the
    accepted positions as circles (the legend names the bound), block (canvas) starts as lines, the
    iteration shown as a red line, and stars where a canvas wrote its output. Arguments as
    figures.confidence_raster's; a point's x is its position and y its iteration number, as a
    click on the raster pins them."""
    upto = _upto(timeline, upto)
    first = max(0, upto + 1 - last_rows) if last_rows else 0
    records = timeline.records[first : upto + 1]
    row = timeline.row
    x0, x1 = timeline.view_start(), timeline.view_end()
    rows = heatmap_rows(first, upto, x1 - x0, keep=highlight)
    z = _block_matrix(timeline, first, upto, lambda i, rec: rec.state["entropy"][row] if _active(timeline, rec) else None, masked_only=False, rows=rows)
    text = np.full(z.shape, "", dtype=object)
    for k, rec in enumerate(timeline.records[i] for i in rows):
        s, e = rec.block_range
        if _active(timeline, rec):
            for p in range(max(s, x0), min(e, x1)):
                text[k, p - x0] = _plain(step_verdict(timeline, rec, p))
    finite = z[np.isfinite(z)]
    bound = float(records[-1].state["bound"])  # one per run: the `uniform` decoder's option
    fig = go.Figure()
    fig.add_trace(
        raster_heatmap(
            z, x0, first, max(float(finite.max()) if finite.size else 0.0, bound, 1e-3), rows,
            colorscale="Viridis_r",  # low entropy bright, as high confidence is in a masked run's raster
            text=text.tolist(),
            colorbar=dict(title=dict(text="entropy"), thickness=10, len=0.9),
            hovertemplate="pos %{x} · iteration %{y}<br>entropy %{z:.3f}<br>%{text}<extra></extra>",
        )
    )
    points = [(i, p) for i, rec in enumerate(records, start=first) for p in rec.committed[row]]
    fig.add_trace(
        go.Scatter(
            x=np.array([p for _, p in points], dtype=np.float32),
            y=np.array([iteration_number(i) for i, _ in points], dtype=np.float32),
            mode="markers",
            name=f"accepted: lower entropies sum ≤ bound {bound:g}",
            marker=dict(symbol="circle", size=7, color=CELL_COLOURS["accepted"][0], line=dict(width=1, color="#111827")),
            text=[_accepted_text(timeline, i, p, expected) for i, p in points],
            hovertemplate="pos %{x} · iteration %{y}<br>%{text}<extra></extra>",
            uid="accepted",
        )
    )
    ends = [(i, rec) for i, rec in enumerate(records, start=first) if rec.state.get("output") is not None]
    if ends:
        fig.add_trace(
            go.Scatter(
                x=np.array([(rec.block_range[0] + rec.block_range[1] - 1) / 2 for _, rec in ends], dtype=np.float32),
                y=np.array([iteration_number(i) for i, _ in ends], dtype=np.float32),
                mode="markers",
                name="canvas done: its output is the last draft",
                marker=OUTPUT_MARK,
                text=[_plain(_stop_text(timeline, rec)) for _, rec in ends],
                hovertemplate="iteration %{y}<br>%{text}<extra></extra>",
                uid="canvas-done",
            )
        )
    cut = cut_markers(timeline, first, upto)
    if cut is not None:
        fig.add_trace(cut)
    shapes, drawn = block_and_shown_shapes(timeline, first, upto, highlight)
    for kind in RASTER_MARKS:
        if kind in drawn:
            fig.add_trace(_legend_only(kind))
    fig.update_layout(shapes=shapes)
    fig.update_xaxes(title_text="canvas position", range=[x0 - 0.5, x1 - 0.5])
    fig.update_yaxes(title_text=rows_title(rows, first, upto), range=[iteration_number(upto) + 0.5, iteration_number(first) - 0.5], **iteration_ticks(iteration_number(upto)))
    return _finish(fig, legend_at_foot(fig, 400, 110), "raster")


def _accepted_text(timeline: Timeline, i: int, p: int, expected: list[int] | None) -> str:
    """An accepted proposal's hover: the rule's numbers, and the expected token when it differs."""
    rec = timeline.records[i]
    offset = p - rec.block_range[0]
    lines = [step_verdict(timeline, rec, p) + f" (p {rec.state['proposal_probability'][timeline.row][offset]:.3f})"]
    want = expected_at(timeline, expected, p)
    if want is not None and want != rec.state["proposal"][timeline.row][offset]:
        lines.append(f"expected {timeline.text_of(want)!r}")
    return "<br>".join(_plain(line) for line in lines)


def _stop_text(timeline: Timeline, rec: IterationRecord) -> str:
    """Why a canvas ended at `rec`: this row's stop rule fired (stable and confident), or its steps ran out."""
    stop = rec.state["stopping"]
    if stop["stopped"][timeline.row]:
        return f"this row stopped: draft stable and mean entropy {stop['mean_entropy'][timeline.row]:.4g} < {stop['confidence_threshold']:g}"
    return f"the steps ran out (mean entropy {stop['mean_entropy'][timeline.row]:.4g}, confidence threshold {stop['confidence_threshold']:g})"


def uniform_iteration_chart(timeline: Timeline, upto: int | None, highlight: int | None, step_forward: str, encoder_forward: str) -> go.Figure:
    """Per step (numbered 1..N): positions accepted and re-noised (stacked; a stopped row's steps
    are empty), with the temperature in force on the right axis and a star where a canvas wrote its
    output; below, the engine-measured time of each step, named `step_forward`, and a legend entry
    `encoder_forward` for the forwards no record times. Arguments as figures.iteration_chart's."""
    upto = _upto(timeline, upto)
    records = timeline.records[: upto + 1]
    row = timeline.row
    its = np.array([iteration_number(i) for i in range(len(records))], dtype=np.float32)
    accepted = np.array([len(r.committed[row]) for r in records], dtype=np.float32)
    renoised = np.array([len(r.state["renoised"][row]) for r in records], dtype=np.float32)
    temperature = np.array([r.state["temperature"] for r in records], dtype=np.float32)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=its, y=accepted, name="accepted", marker_color=CELL_COLOURS["accepted"][0], uid="accepted"))
    fig.add_trace(go.Bar(x=its, y=renoised, name="re-noised", marker_color=NOISE_BAR, uid="renoised"))
    fig.add_trace(go.Scatter(x=its, y=temperature, yaxis="y2", name="temperature", mode="lines", line=dict(color="#111827", width=1.5, shape="hv"), uid="temperature"))
    done = [i for i, r in enumerate(records) if r.state.get("output") is not None]
    if done:
        fig.add_trace(
            go.Scatter(
                x=its[done], y=(accepted + renoised)[done], mode="markers", name="canvas done (its output)", marker=OUTPUT_MARK,
                text=[_plain(_stop_text(timeline, records[i])) for i in done], hovertemplate="iteration %{x}<br>%{text}<extra></extra>", uid="canvas-done",
            )
        )
    add_forward_times(fig, records, {rec.forward: step_forward for rec in records})
    fig.add_trace(go.Scatter(x=[None], y=[None], yaxis="y3", mode="markers", name=encoder_forward, marker=dict(color="#9ca3af", size=6, symbol="square-open"), hoverinfo="skip", uid="ms-encoder"))
    right: dict[str, Any] = dict(
        overlaying="y", side="right", range=[0, max(1.05, float(temperature.max()) * 1.05)], showgrid=False, automargin=True, title=dict(text="temperature", standoff=8)
    )
    iteration_panels(fig, upto, highlight, "positions this step", right)
    return _finish(fig, legend_at_foot(fig, 380, 90), "iterations")
