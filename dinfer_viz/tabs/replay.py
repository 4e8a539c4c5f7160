"""The Run tab's replay of the run on display: the scrubber (`replay`, and `glance` while it is
dragged), playback (`play`, `pause`, the timer's `step`, ⇥ End), and a click on the grid or the
raster pinning a position (`pick`). A live run's Play, Pause and End act on its stream
(runner.LiveRun); a stored run's on the timer. The panels come from tabs/run_view.py.

The scrubber shows the page's iteration numbers (timeline.iteration_number: 0 is the canvas before
the first forward, 1..N the iterations); the handlers turn them into record indices (n - 1).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from engine import EngineError

from ..drawing.cells import inert_markdown
from ..panes.grid import inert
from ..reading.timeline import iteration_number, record_index
from .common import TabHandlers, error_text, guarded, outputs
from .run_view import RUN_VIEW, details_view, timeline_view, unpinned_kept
from .shown import LIVE, RunState

SKIP_VIEW = (*RUN_VIEW, "timer")  # "skip to the end" of a replay: the view at its end, the timer off
PICK_VIEW = (*RUN_VIEW, "pinned")  # a click on the grid or the raster: the view, and the position pinned


class ReplayHandlers(TabHandlers):
    """The Run tab's events on the run on display: scrub, play, pause, skip to the end, pick."""

    @guarded(RUN_VIEW)
    def replay(self, iteration: Any, state: RunState | None, pinned: int | None = None) -> tuple:
        """The stored run at `iteration` (the slider's number: 0 before the first forward, 1..N;
        raw, as the API sent it: a non-number is one line in the page), figures included, the
        iteration marked on them; the details of the `pinned` position."""
        if state is None:
            return outputs(RUN_VIEW, {"message": "nothing to replay: run something or load a trace"})
        try:
            it = record_index(iteration)
            if not -1 <= it < state.timeline.iterations:  # the slider's range; an API client's number may be any
                raise EngineError(f"the iteration to show must be from 0 (before the first forward) to {state.timeline.iterations}, not {it + 1}")
        except EngineError as exc:
            return outputs(RUN_VIEW, {"message": error_text(inert_markdown(str(exc)))})
        return outputs(RUN_VIEW, unpinned_kept(timeline_view(state.timeline, it, state.expected, highlight=True, pinned=pinned), pinned))

    def glance(self, iteration: float, state: RunState | None, pinned: int | None = None) -> tuple:
        """While the scrubber is dragged: grid, text and details only (figures follow on release)."""
        if state is None:
            return gr.skip(), gr.skip(), gr.skip()
        view = unpinned_kept(timeline_view(state.timeline, int(iteration) - 1, state.expected, plots=False, extras=False, pinned=pinned), pinned)
        return view["grid"], view["text"], view["details"]

    def step(self, iteration: float, state: RunState | None, pinned: int | None = None, delta: int = 1) -> tuple:
        """Playback tick: the next iteration's grid, text and details (figures untouched); the timer
        stops at the end. Returns (scrub value, grid, text, details, timer update)."""
        if state is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.Timer(active=False)
        tl = state.timeline
        it = int(iteration) - 1 + delta  # the record index shown next
        if it > tl.iterations - 1:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.Timer(active=False)
        view = unpinned_kept(timeline_view(tl, it, state.expected, plots=False, extras=False, pinned=pinned), pinned)
        return iteration_number(it), view["grid"], view["text"], view["details"], gr.Timer(active=it < tl.iterations - 1)

    def play(self, iteration: float, state: RunState | None) -> tuple:
        """Start playback (from the beginning when at the end); a live run's paused playback
        resumes where it was."""
        if state is None:
            return gr.skip(), gr.Timer(active=False)
        if state.status == LIVE:
            if state.live is not None:
                state.live.resume()
            return gr.skip(), gr.Timer(active=False)
        at_end = int(iteration) - 1 >= state.timeline.iterations - 1
        return (0 if at_end else gr.skip()), gr.Timer(active=True)

    def pause(self, state: RunState | None) -> tuple:
        """Pause playback: a live run's view holds at the iteration it shows (the engine runs on,
        or has finished and is free already), a replay's timer stops. (message, timer)."""
        if state is not None and state.status == LIVE and state.live is not None:
            live = state.live
            live.pause()
            engine = "the engine has finished and is free" if live.engine_done else "the engine runs on"
            return f"paused at iteration {live.shown} ({engine}): ▶ Play resumes, ⇥ End skips to the end, Stop keeps what the run produced", gr.Timer(active=False)
        return gr.skip(), gr.Timer(active=False)

    @guarded(SKIP_VIEW)
    def skip_to_end(self, state: RunState | None, pinned: int | None = None) -> tuple:
        """⇥ End: a live run's view shows every record that arrived and follows the engine from
        there (the final view comes when it ends); a replay jumps to its last iteration."""
        if state is None:
            return outputs(SKIP_VIEW, {"message": "nothing to skip: run something or load a trace"})
        if state.status == LIVE:
            if state.live is not None:
                state.live.skip()
            # no message of its own: the run's stream sends its last frame at once, and an answer of
            # this event's arriving after it overwrote its "done" (a CI run under load)
            return outputs(SKIP_VIEW, {})
        tl = state.timeline
        view = timeline_view(tl, tl.iterations - 1, state.expected, highlight=True, pinned=pinned, scrub=iteration_number(tl.iterations - 1), timer=gr.Timer(active=False))
        if state.text:
            view["text"] = state.text
        return outputs(SKIP_VIEW, unpinned_kept(view, pinned))

    @guarded(PICK_VIEW)
    def pick(self, iteration: float, state: RunState | None, evt: gr.SelectData) -> tuple:
        """A click on the grid (index: the cell's position) or on the raster (index: position,
        value: the point's iteration number): that position's details, pinned (PICK_VIEW). A
        raster click also moves the whole view to the point's iteration."""
        position, number = evt.index, evt.value
        if state is None:
            return outputs(PICK_VIEW, {"details": f'<div class="pos-details">{inert("nothing to inspect yet: run something or load a trace")}</div>'})
        if not isinstance(position, int) or isinstance(position, bool):
            return outputs(PICK_VIEW, {"message": error_text(f"cannot pin position {inert_markdown(repr(position))}: not a canvas position")})
        tl = state.timeline
        if isinstance(number, int) and not isinstance(number, bool):  # the raster: go to that iteration
            it = tl.clamp(number - 1)
            view = timeline_view(tl, it, state.expected, highlight=True, pinned=position, scrub=iteration_number(it))
        else:
            view = {"details": details_view(tl, position, tl.clamp(int(iteration) - 1), state.expected)}
        return outputs(PICK_VIEW, {**view, "pinned": position})
