"""The Run tab: a prompt and its settings, the live run, then replay (scrubber, playback) of the
finished run, of a trace file loaded from disk or of a shipped sample trace (assets/traces, what
`app.py --no-model` leads with), and its exports (the trace as JSON, the animation as GIF or MP4).
The Model and system section (tabs/model.py) sits in this tab's settings column; a sweep's wrong
answer opens here too (`stored_view`). The page's components and events are tabs/run_page.py's.

`RunHandlers` is the tab's handlers on one class, each part in its own module: this one streams a
run and stops it; tabs/run_settings.py checks the settings column, tabs/replay.py scrubs, plays and
pins, tabs/run_files.py loads traces and exports, and tabs/run_view.py draws the panels they show.
"""

from __future__ import annotations

from typing import Any, Iterator

import gradio as gr

from engine import EngineError, GenerationConfig

from ..studies import answers
from ..studies.answers import FAMILY_EXAMPLES
from ..panes.cost_figure import cost_figure
from ..panes.figures import confidence_raster, iteration_chart, message_figure
from ..drawing.cells import inert_markdown
from ..panes.grid import EMPTY_GRID
from ..live.host import ModelSpec
from ..panes.readouts import message_readout, plural
from ..live.runner import Frame, run_live
from ..live.system import progress_line, startup_note
from ..reading.timeline import Timeline
from .common import error_text, guarded, outputs
from .live_view import LiveView
from .replay import ReplayHandlers
from .run_files import RunFileHandlers
from .run_settings import KEEP_TYPED_JS, RunSettingsHandlers
from .run_view import PICK_HINT, RUN_VIEW, details_view, shown_view, stored_view
from .shown import FAILED, FINISHED, LIVE, STOPPED, RunState, frozen, model_code

__all__ = ["DEFAULT_PROMPT", "KEEP_TYPED_JS", "LIVE_SPEEDS", "PICK_HINT", "RUN_VIEW", "RunHandlers", "RunState", "live_speed", "stored_view"]

LIVE_RASTER_ROWS = 48  # while live, the raster shows the latest iterations only (payload per redraw)
# The live view's pace: iterations shown per second, 0 for as fast as the engine makes them.
LIVE_SPEEDS = [("as fast as the engine", 0), *((f"{n} iteration{'s' * (n > 1)} / s", n) for n in (1, 2, 5, 10, 20))]
# Pair-sum: the first forward cannot commit the digits (a is uniform among N's splits), so the
# threshold decoder forces one, and the rest follows over several iterations
DEFAULT_PROMPT = FAMILY_EXAMPLES["pairsum"][0]


def live_speed(value: Any) -> float:
    """A run's live speed (iterations shown per second, 0: as fast as the engine), checked."""
    try:
        speed = float(value or 0)
    except (TypeError, ValueError):
        raise EngineError(f"live speed must be a number of iterations per second, got {value!r}") from None
    if not 0 <= speed < float("inf"):
        raise EngineError(f"live speed must be 0 (as fast as the engine) or a positive number of iterations per second, got {value!r}")
    return speed


class RunHandlers(RunSettingsHandlers, ReplayHandlers, RunFileHandlers):
    """The Run tab's events: settings checks, the live run, replay, playback, loading a trace."""

    @guarded(RUN_VIEW)
    def run(self, prompt: str, settings: dict[str, Any] | None, expected: str = "", speed: float = 0, pinned: int | None = None) -> Iterator[tuple]:
        """Stream a run: live frames (the grid's changes, the plots at a lower rate), then the
        final view, trace file and state. `speed`: iterations shown per second, 0 for as fast as
        the engine (LIVE_SPEEDS); `pinned`: the position the details panel shows at the end."""
        try:
            spec, config = self.parse(settings)
            self.check_request(prompt, config)
            speed = live_speed(speed)
        except EngineError as exc:  # no run to show: the message over an empty page, never the previous run
            yield outputs(RUN_VIEW, self.no_run_view(error_text(inert_markdown(str(exc)))))
            return
        unknown = ""  # characters the tokenizer cannot encode, said with the result
        live = LiveView()
        # What this spec's engine spends before its iterations show (worker processes, compiling),
        # said while the page would otherwise only count seconds: with the loading line and its
        # heartbeats, then with the heartbeats of a slow forward (a bucket compiling)
        notes = {"loading": startup_note(dict(spec.options), spec.device, loaded=False), "running": startup_note(dict(spec.options), spec.device, loaded=True)}
        phase = "running" if self.host.is_loaded(spec) else "loading"  # the stage a heartbeat ("busy") belongs to
        model = self.host.name_of(spec)
        # said at once, before waiting for the engine or loading it; and the previous run leaves the
        # page at once: the slider, the grid and the header follow this one from now on
        starting = progress_line(f"loading {spec.describe()}", notes["loading"]) if phase == "loading" else f"starting a run on {inert_markdown(model)}…"
        yield outputs(RUN_VIEW, self.no_run_view(starting, header=f"run shown: {model_code(model)} · starting"))
        for frame in run_live(self.host, spec, prompt, config, self.fps, self.plot_hz, speed, batcher=self.batcher, expected=expected, fitted=True):
            if frame.stage == "running" and live.live is None:  # the first frame: the engine is loaded
                unknown = self._unencodable(spec, prompt, config)
            phase = phase if frame.stage == "busy" else frame.stage
            view = self._frame_view(frame, spec.describe(), live, prompt, notes.get(phase, ""), pinned, model)
            if frame.stage == "done" and unknown:
                view["message"] += unknown
            yield outputs(RUN_VIEW, view)

    def _unencodable(self, spec: ModelSpec, prompt: str, config: GenerationConfig) -> str:
        """What the result says of the prompt's characters the model's tokenizer has no token for."""
        engine = self.host.peek(spec)
        missing = sorted(set(engine.unencodable(prompt, config.use_chat_template))) if engine is not None else []
        return f"; ⚠ the tokenizer has no token for {''.join(missing)!r}" if missing else ""

    def _frame_view(
        self, frame: Frame, described: str, live: LiveView, prompt: str = "", note: str = "", pinned: int | None = None, model: str = ""
    ) -> dict[str, Any]:
        """One frame's slots; `described`: the spec as the readout names it; `note`: what the
        engine's system options spend at this stage (run); `model`: the model's name (header)."""
        if frame.stage in ("waiting", "loading"):
            message = progress_line(frame.message, note) if note else frame.message
            return {"readout": message_readout(frame.message), "message": message}
        if frame.stage == "busy":  # a heartbeat: says what is slow, or nothing (the page is still painting)
            return {"message": progress_line(f"{frame.message} ({frame.wall:.0f} s)", note)} if frame.message else {}
        if frame.stage == "stopped":
            return self._stopped_view(frame, described, prompt, pinned, model)
        if frame.timeline is None:  # failed before the engine started: no run to show
            return self.no_run_view(error_text(inert_markdown(frame.message)))  # it may quote the user's constraint
        tl, last, expected = frame.timeline, frame.shown - 1, frame.timeline.expected
        if frame.stage == "error":  # the records it made stay, marked failed
            failed = RunState(frozen(tl), expected, FAILED, model, prompt)
            return shown_view(failed, last, error_text(inert_markdown(frame.message)), pinned, note=described, wall=frame.wall)
        if frame.stage == "running":
            out = live.running(frame, message=f"{frame.message}…")
            if "readout" in out:  # the first frame: this run is the one on display from now on
                shown = RunState(tl, expected, LIVE, model, prompt, live=frame.live)
                out.update(state=shown, header=shown.header(), download=None, details=details_view(tl, pinned, -1, expected))
            # the slider follows the live run: its length so far, at the iteration shown
            out["scrub"] = gr.update(minimum=0, maximum=max(frame.shown, 1), value=frame.shown, interactive=False)
            if frame.plots:
                out.update(raster=confidence_raster(tl, upto=last, last_rows=LIVE_RASTER_ROWS), iterations=iteration_chart(tl, upto=last), cost=cost_figure(tl, upto=last))
            return out
        done = RunState(tl, expected, FINISHED, model, prompt, frame.text)
        judged = answers.verdict(prompt, tl.judged_answer(frame.text or ""))
        message = f"{frame.message}: {plural(tl.iterations, 'iteration')}" + (f"; {judged}" if judged else "")
        out = shown_view(done, tl.iterations - 1, message, pinned, note=described, wall=frame.wall)
        out["download"] = self._write_trace(tl.trace)
        return out

    def no_run_view(self, message: str, header: str | None = None) -> dict[str, Any]:
        """The page with no run on display (a Run refused, or failed before its first record, or
        one just starting): `message` over an empty grid and figures, the slider off, no state."""
        return {
            "grid": EMPTY_GRID, "readout": message_readout("no run shown"), "text": "",
            "raster": message_figure("no run shown", 360), "iterations": message_figure("", 380), "cost": message_figure("", 340), "extras": message_figure("", 220),
            "scrub": gr.update(minimum=0, maximum=1, value=0, interactive=False), "download": None, "message": message, "state": None,
            "details": details_view(None, None, -1, None), "cache_states": gr.update(visible=False), "header": header or self.model_status(),
        }

    def stop_quietly(self, state: RunState | None, pinned: int | None = None, request: gr.Request | None = None) -> tuple:
        """Another tab's Stop: the session's sweep stops; a live Run stays as Stop leaves it;
        otherwise the Run tab is untouched."""
        self.stop_sweep(request)
        if state is None or state.status != LIVE:
            return outputs(RUN_VIEW, {})
        return self.stop(state, pinned)

    def stop(self, state: RunState | None, pinned: int | None = None, request: gr.Request | None = None) -> tuple:
        """Stop: a live run's stream is halted (runner.LiveRun.halt: the engine is cancelled, and
        the stream's last frame is the stopped run, `_stopped_view`); this waits for that frame to
        go, so the click's follow-up cancel (of a run still queued, of Compare or Sweep) never cuts
        it off. Nothing live: the message says the engine is free. The session's sweep stops too."""
        if state is None or state.status != LIVE or state.live is None:
            return outputs(RUN_VIEW, {"message": self.stopped(request)})
        self.stop_sweep(request)
        state.live.halt()
        return outputs(RUN_VIEW, {})

    def _stopped_view(self, frame: Frame, described: str, prompt: str, pinned: int | None, model: str) -> dict[str, Any]:
        """The stream's last frame after Stop: the run stays on the page with whatever it produced:
        every record the engine made, readable and scrubbable, marked "stopped at iteration k"; a
        run the engine had finished (only its playback was left) stays whole, as finished."""
        live, tl = frame.live, frame.timeline
        if tl is None:
            return self.no_run_view("stopped before the engine started: the engine is free for the next run")
        expected = tl.expected
        if live is not None and live.engine_done:
            tl = Timeline(live.result.output.trace)
            shown = RunState(tl, expected, FINISHED, model, prompt, live.result.text)
            message = f"stopped the playback: the engine had finished, and its whole run ({plural(tl.iterations, 'iteration')}) stays here to scrub"
        else:
            tl = frozen(tl)
            shown = RunState(tl, expected, STOPPED, model, prompt)
            message = f"stopped at iteration {tl.iterations}: the engine ends its current iteration and is free for the next run; the iterations it ran stay here to scrub"
        out = shown_view(shown, tl.iterations - 1, message, pinned, note=described, wall=frame.wall)
        out["download"] = self._write_trace(tl.trace)
        return out
