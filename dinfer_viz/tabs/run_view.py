"""The Run tab's panels drawn from a run: the grid, the output text, the figures, the details of the
pinned position, the K/V states, the readout, the scrubber and the explanation, as the named slots
of `RUN_VIEW` (tabs/common.py `outputs`). The handlers of tabs/run.py (the live run and Stop),
tabs/replay.py (scrubbing, playback, picking a position) and tabs/run_files.py (loading a trace)
draw with these; a sweep's wrong answer opens through `stored_view`.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ..drawing.cache_figure import cache_state_figure
from ..panes.cost_figure import cost_figure
from ..panes.details import position_details
from ..panes.explain import explain
from ..panes.figures import confidence_raster, extras_figure, iteration_chart
from ..panes.grid import grid_value, inert
from ..live.host import model_title
from ..panes.readouts import readout
from ..reading.timeline import Timeline, iteration_number
from ..views import view_for
from .shown import LOADED, RunState, trace_prompt

# details, cache_states and header come last: API clients reading the earlier outputs by place keep working
RUN_VIEW = (
    "grid", "readout", "text", "raster", "iterations", "cost", "extras", "scrub", "download", "message", "state", "explain", "details", "cache_states", "header",
)
PICK_HINT = "Click a cell of the grid or a point of the raster: everything about that position at the iteration shown appears here, and stays pinned while you scrub."


def details_view(timeline: Timeline | None, pinned: int | None, iteration: int, expected: list[int] | None) -> str:
    """The details panel: the pinned position at record `iteration`, or how to pin one."""
    if pinned is None or timeline is None:
        return f'<div class="pos-details">{inert(PICK_HINT)}</div>'
    return position_details(timeline, pinned, iteration, expected)


def unpinned_kept(view: dict[str, Any], pinned: int | None) -> dict[str, Any]:
    """A view of the same run at another iteration with nothing pinned leaves the details panel as
    it is: it shows the hint already, unless a cell click is pinning a position at this very moment
    (leaving the scrubber's box blurs it and releases the slider, so both events race) and the
    click must win."""
    return {**view, "details": gr.skip()} if pinned is None else view


def cache_view(timeline: Timeline, highlight: int | None) -> Any:
    """The K/V-state figure of a run with a cache; hidden for cache mode none (nothing is cached)."""
    if (timeline.trace.config or {}).get("cache", "none") == "none":
        return gr.update(visible=False)
    return gr.update(value=cache_state_figure(timeline, highlight=highlight), visible=True)


def timeline_view(
    timeline: Timeline,
    iteration: int,
    expected: list[int] | None,
    *,
    plots: bool = True,
    extras: bool = True,
    highlight: bool = False,
    pinned: int | None = None,
    **slots: Any,
) -> dict[str, Any]:
    """Grid, text, details of the `pinned` position and (optionally) figures of `timeline` at
    `iteration`, plus extra slots."""
    iteration = timeline.clamp(iteration)
    out: dict[str, Any] = {
        "grid": grid_value(timeline, iteration, expected),
        "text": timeline.text_at(iteration),
        "details": details_view(timeline, pinned, iteration, expected),
    }
    mark = iteration if highlight else None
    if plots:
        out["raster"] = confidence_raster(timeline, highlight=mark, expected=expected)
        out["iterations"] = iteration_chart(timeline, highlight=mark)
        out["cost"] = cost_figure(timeline, highlight=mark)
        out["cache_states"] = cache_view(timeline, mark)
    if extras:
        out["extras"] = extras_figure(timeline, highlight=mark)
    out.update(slots)
    return out


def scrub_to(timeline: Timeline, value: int) -> Any:
    """The scrubber spanning `timeline`'s iterations, at record `value`. The slider shows the
    page's numbering (`iteration_number`): 0 is the canvas before the first forward, N the last."""
    return gr.update(minimum=0, maximum=max(timeline.iterations, 1), value=iteration_number(timeline.clamp(value)), interactive=True)


def stored_view(
    timeline: Timeline, at: int, expected: list[int] | None, *, note: str, message: str, highlight: bool = False, pinned: int | None = None,
    source: str = "a sweep's wrong answer",
) -> dict[str, Any]:
    """A finished run (a loaded trace, a sweep's wrong answer) opened for replay at iteration `at`:
    its view, readout, scrubber, state and the explanation of the settings it ran with."""
    shown = RunState(timeline, expected, LOADED, model_title(timeline.trace.model) if timeline.trace.model else "", trace_prompt(timeline), source=source)
    return shown_view(shown, at, message, pinned, note=note, highlight=highlight)


def shown_view(
    shown: RunState, at: int, message: str, pinned: int | None = None, *, note: str = "", wall: float | None = None, highlight: bool = False
) -> dict[str, Any]:
    """Every slot of the page drawn from the run on display `shown` at record `at`: the grid, the
    figures, the output box (the engine's text of a finished run, else the canvas at `at`), the
    readout marked with the run's status, the scrubber over its iterations, the header naming
    its model, the state itself, and the explanation of the settings it ran with."""
    tl = shown.timeline
    out = timeline_view(tl, at, shown.expected, highlight=highlight, pinned=pinned)
    last = tl.clamp(at) == tl.iterations - 1
    out.update(
        readout=shown.marked(readout(tl, wall, note=note)),
        text=shown.text if shown.text and last else out["text"],
        scrub=scrub_to(tl, at),
        state=shown,
        message=message,
        header=shown.header(),
    )
    if shown.status == LOADED or view_for(tl).runs_own_sampler:  # it ran its own sampler, not the decoder the controls explain
        out["explain"] = ran_explanation(tl)
    return out


def ran_explanation(timeline: Timeline) -> str:
    """The explanation panel for the settings `timeline`'s run ran with (its trace's header)."""
    cfg = timeline.trace.config or {}
    return explain(cfg.get("decoder", "?"), cfg.get("cache", "?"), bool(cfg.get("smoothing")), bool(cfg.get("unroll")), kind=timeline.kind)
