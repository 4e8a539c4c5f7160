"""What each iteration cost: the trace's per-iteration `cost` (docs/trace.md §3) as stacked bars.

A record's `seconds` (the iteration's wall time, device synchronised) splits into the forward's
compute and all-reduce time per rank, rank 0's compiling/capturing time, and the host's part
(decode, commit, smoothing: what is left). One bar group per iteration, one bar per rank when the
engine ran several processes (tensor or expert parallelism), so a user sees the all-reduces next to
the compute they wrap; a line on a second axis counts the graphs compiled or captured, and a marker
shows the forwards that replayed a CUDA graph.

Built like the figures in figures.py (fixed height, float32 arrays, a constant `uirevision`), as
it is redrawn with them while a run is live.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..drawing.figure_base import _finish, _upto, iteration_ticks, legend_at_foot, shown_iteration_shapes
from ..drawing.figure_base import message_figure
from ..reading.timeline import Timeline, iteration_number
from ..views import view_for

# (name, colour): the order bars stack in, bottom first
CATEGORIES = (("compute", "#2563eb"), ("communication", "#dc2626"), ("compile", "#7c3aed"), ("host", "#9ca3af"))
HEIGHT = 340
WIDE_LEGEND_LINES = 2  # the panel spans the view: its five or six entries wrap into two lines at most at 1024 px
NO_COST = "no per-iteration cost: this trace predates the engine recording one"
# When some iterations compiled and others did not, the axis is scaled to the others (a compile
# takes seconds, a warm forward milliseconds: on one scale the warm bars would be invisible) and
# the compiling bars run off the top, labelled with their time.
HEADROOM = 1.25


def cost_ms(timeline: Timeline, upto: int) -> np.ndarray:
    """`[iterations 0..upto, ranks, CATEGORIES]` milliseconds, NaN where not measured: ranks other
    than 0 report compute and communication only (the iteration's wall time, hence the host's
    part, and compiling are rank 0's), and a record without `cost` has none."""
    records = timeline.records[: upto + 1]
    ranks = max((len(r.cost["compute_seconds"]) for r in records if r.cost), default=1)
    out = np.full((len(records), ranks, len(CATEGORIES)), np.nan, dtype=np.float32)
    for i, rec in enumerate(records):
        cost = rec.cost
        if not cost:
            continue
        for rank, (compute, comm) in enumerate(zip(cost["compute_seconds"], cost["comm_seconds"])):
            out[i, rank, :2] = (compute * 1000, comm * 1000)
        host = rec.seconds - cost["compute_seconds"][0] - cost["comm_seconds"][0] - cost["compile_seconds"]
        # compute is floored at 0 by the engine, so the parts can exceed the wall time by rounding
        out[i, 0, 2:] = (cost["compile_seconds"] * 1000, max(host, 0.0) * 1000)
    return out


def _shares(ms: np.ndarray) -> str:
    """Rank 0's time over the iterations shown, by category: the chart's one-line summary."""
    totals = np.nansum(ms[:, 0, :], axis=0)
    whole = float(totals.sum())
    if whole <= 0:
        return ""
    parts = " · ".join(f"{name} {t / whole:.0%}" for (name, _), t in zip(CATEGORIES, totals))
    ranks = ms.shape[1]
    return f"rank 0's time: {parts}" + (f" ({ranks} processes)" if ranks > 1 else "")


def cost_figure(timeline: Timeline, upto: int | None = None, highlight: int | None = None) -> go.Figure:
    """Per-iteration stacked bars of compute / communication / compile / host milliseconds, one
    bar per rank, iterations numbered 1..N as the page does (`upto`, `highlight`: record indices); compiles + captures per iteration as a line (right axis); graph replays marked.
    A trace without cost gets a one-line message (an older one), or, for a kind whose records
    carry none (its view's `records_cost`), its forwards' times (`forward_times_figure`)."""
    if timeline.iterations == 0:
        return message_figure("no iterations yet", HEIGHT)
    upto = _upto(timeline, upto)
    records = timeline.records[: upto + 1]
    if not any(r.cost for r in records):
        view = view_for(timeline)
        return message_figure(NO_COST, HEIGHT) if view.records_cost else forward_times_figure(timeline, upto, highlight, *view.forward_costs(timeline))
    ms = cost_ms(timeline, upto)
    ranks = ms.shape[1]
    its = np.array([iteration_number(i) for i in range(len(records))], dtype=np.float32)
    fig = go.Figure()
    # Stacked and grouped at once: barmode "group" places each rank's bars side by side
    # (offsetgroup), and each category's `base` is the sum of those below it.
    for rank in range(ranks):
        base = np.zeros(len(records))  # float64, so rounding gives short decimals in the JSON
        for c, (name, colour) in enumerate(CATEGORIES):
            values = ms[:, rank, c]
            if np.isnan(values).all():  # another rank's compile and host: not measured
                continue
            values = np.nan_to_num(values)
            fig.add_trace(
                go.Bar(
                    x=its,
                    y=values,
                    base=np.round(base, 3).tolist(),  # plotly sends `base` as a JSON list, not a typed array: keep it short
                    offsetgroup=str(rank),
                    name=name,
                    legendgroup=name,
                    showlegend=rank == 0,
                    marker=dict(color=colour, pattern=dict(shape="/" if rank else "")),
                    hovertemplate=f"iteration %{{x}} · rank {rank}<br>{name} %{{y:.2f}} ms<extra></extra>",
                    uid=f"cost-{rank}-{name}",
                )
            )
            base += values
    totals = np.nansum(ms[:, 0, :], axis=1)
    compiling = ms[:, 0, 2] > 0
    layout_y: dict = dict(rangemode="tozero", title=dict(text="ms (iteration wall time)" if ranks == 1 else "ms per rank (hatched: rank ≥ 1)"))
    if compiling.any() and not compiling.all():
        top = float(np.nanmax(np.nansum(ms[~compiling], axis=2))) * HEADROOM
        layout_y = dict(layout_y, range=[0, top], rangemode=None)
        over = np.flatnonzero(totals > top)
        fig.add_trace(
            go.Scatter(
                x=its[over],
                y=np.full(len(over), top, dtype=np.float32),
                mode="text",
                text=[f"↑ {totals[i] / 1000:.1f} s" for i in over],
                textposition="bottom center",
                textfont=dict(color="white", size=11),  # on the compile bar, which fills the top
                showlegend=False,
                hoverinfo="skip",
                uid="cost-off-scale",
            )
        )
    graphs = np.array([(r.cost["compiles"] + r.cost["captures"]) if r.cost else np.nan for r in records], dtype=np.float32)
    fig.add_trace(
        go.Scatter(
            x=its, y=graphs, yaxis="y2", name="graphs compiled / captured", mode="lines+markers",
            line=dict(color="#111827", width=1.5, shape="hv"), marker=dict(size=4),
            hovertemplate="iteration %{x}: %{y} graph(s) compiled or captured<extra></extra>", uid="cost-graphs",
        )
    )
    replayed = np.flatnonzero([bool(r.cost and r.cost["graph_replay"]) for r in records])
    if replayed.size:
        fig.add_trace(
            go.Scatter(
                x=its[replayed], y=totals[replayed], name="replayed a CUDA graph", mode="markers",
                marker=dict(symbol="star", size=9, color="#f59e0b", line=dict(width=1, color="#111827")),
                hovertemplate="iteration %{x}: replayed a CUDA graph<extra></extra>", uid="cost-replays",
            )
        )
    shapes = shown_iteration_shapes(highlight, upto)
    fig.update_layout(
        barmode="group",
        bargap=0.15,
        bargroupgap=0.05,
        shapes=shapes,
        # below the gr.Plot label badge, which covers the figure's top left
        title=dict(text="<br>".join(t for t in (_shares(ms), view_for(timeline).cost_note(timeline)) if t), font=dict(size=11), x=0.01, xanchor="left", yref="container", y=1 - 40 / HEIGHT, yanchor="top"),
        xaxis=dict(range=[iteration_number(0) - 0.5, iteration_number(len(records) - 1) + 0.5], title=dict(text="iteration"), **iteration_ticks(len(records))),
        yaxis=layout_y,
        yaxis2=dict(
            overlaying="y", side="right", range=[0, max(1.0, float(np.nanmax(graphs, initial=0.0))) * 1.2], dtick=1, showgrid=False,
            title=dict(text="graphs compiled"),
        ),
        margin=dict(t=70, r=60),
    )
    return _finish(fig, legend_at_foot(fig, HEIGHT, 90, WIDE_LEGEND_LINES), "cost")


def forward_times_figure(timeline: Timeline, upto: int, highlight: int | None, title: str, names: dict[str, str]) -> go.Figure:
    """The cost panel of a kind whose records carry no `cost` split (a uniform-state run): each
    record's engine-measured time as a bar, one colour per forward kind named as its view names it
    (`names`), under `title` (the kind's forwards counted)."""
    records = timeline.records[: upto + 1]
    its = np.array([iteration_number(i) for i in range(len(records))], dtype=np.float32)
    fig = go.Figure()
    for k, kind in enumerate(dict.fromkeys(r.forward for r in records)):
        idx = [i for i, r in enumerate(records) if r.forward == kind]
        name = names.get(kind, kind)
        fig.add_trace(
            go.Bar(
                x=its[idx], y=np.array([records[i].seconds * 1000 for i in idx], dtype=np.float32), name=name,
                marker=dict(color=CATEGORIES[k % len(CATEGORIES)][1]), hovertemplate=f"iteration %{{x}}<br>{name} %{{y:.2f}} ms<extra></extra>", uid=f"forward-{kind}",
            )
        )
    fig.update_layout(
        bargap=0.15,
        shapes=shown_iteration_shapes(highlight, upto),
        title=dict(text=title, font=dict(size=11), x=0.01, xanchor="left", yref="container", y=1 - 40 / HEIGHT, yanchor="top"),
        xaxis=dict(range=[iteration_number(0) - 0.5, iteration_number(len(records) - 1) + 0.5], title=dict(text="iteration"), **iteration_ticks(len(records))),
        yaxis=dict(rangemode="tozero", title=dict(text="ms (step wall time)")),
        margin=dict(t=70, r=60),
    )
    return _finish(fig, legend_at_foot(fig, HEIGHT, 90, WIDE_LEGEND_LINES), "cost")
