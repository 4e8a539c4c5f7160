"""The Run tab: a prompt and its settings, the live run, then replay (scrubber, playback) of the
finished run, of a trace file loaded from disk or of a shipped sample trace (assets/traces, what
`app.py --no-model` leads with), and its exports (the trace as JSON, the animation as GIF or MP4).
The Model and system section (tabs/model.py) sits in this tab's settings column; a sweep's wrong
answer opens here too (`stored_view`). The page's components and events are tabs/run_page.py's.

The scrubber shows the page's iteration numbers (timeline.iteration_number: 0 is the canvas before
the first forward, 1..N the iterations); the handlers turn them into record indices (n - 1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import gradio as gr

from engine import EngineError, GenerationConfig, Trace
from engine.constraints import spec_of
from engine.pipeline import check_request, encode_prompt

from .. import answers
from ..answers import FAMILY_EXAMPLES
from ..cache_figure import cache_state_figure, forward_cost_figure, measure_forward_costs
from ..cost_figure import cost_figure
from ..details import position_details
from ..explain import explain
from ..export import run_gif, run_mp4
from ..figures import confidence_raster, extras_figure, iteration_chart
from ..figures import message_figure
from ..cells import inert_markdown
from ..grid import EMPTY_GRID, grid_value, inert
from ..host import ModelSpec, model_title
from ..lessons import lesson_named
from ..readouts import message_readout, plural, readout
from ..runner import Frame, run_live
from ..sample_traces import shipped_samples
from ..settings import all_controls, config_fields, control_value, sweep_setting, visible_fields
from ..system import progress_line, startup_note
from ..timeline import Timeline, iteration_number, record_index
from ..views import view_for
from .common import TabHandlers, error_text, guarded, outputs
from .live import LiveView
from .shown import FAILED, FINISHED, LIVE, LOADED, STOPPED, RunState, frozen, model_code, trace_prompt

log = logging.getLogger(__name__)

EXPORT_VIEW = ("file", "message")  # the GIF / MP4 exports: the file, and the Run tab's message
# details, cache_states and header come last: API clients reading the earlier outputs by place keep working
RUN_VIEW = (
    "grid", "readout", "text", "raster", "iterations", "cost", "extras", "scrub", "download", "message", "state", "explain", "details", "cache_states", "header",
)
# Loading a trace: the view, then the boxes it fills with what the trace was made with (the
# prompt, the model, every control in all_controls() order; the family note follows the prompt)


def load_view(fields: Sequence[str] | None = None) -> tuple[str, ...]:
    """The slots a loaded trace fills: the run view, the prompt, the model and one box per setting
    control (`fields`: those of the page being served; default: every control registered now, for
    handlers used without a page). A plug-in registered after a page was built has no box there."""
    return (*RUN_VIEW, "prompt", "model_box", *(f"cfg:{f}" for f in (fields if fields is not None else [c.field for c in all_controls()])))

SKIP_VIEW = (*RUN_VIEW, "timer")  # "skip to the end" of a replay: the view at its end, the timer off
PICK_VIEW = (*RUN_VIEW, "pinned")  # a click on the grid or the raster: the view, and the position pinned
PICK_HINT = "Click a cell of the grid or a point of the raster: everything about that position at the iteration shown appears here, and stays pinned while you scrub."
# Canvas lengths of the forward-cost chart (those above the model's limit are left out)
COST_LENGTHS = (32, 64, 128, 256, 512, 1024)
LIVE_RASTER_ROWS = 48  # while live, the raster shows the latest iterations only (payload per redraw)
# The expected box takes the suggested response only while it is empty or still holds the page's
# last suggestion: an answer the user typed stays when the prompt changes. Decided in the browser
# when the suggestion arrives, on the box's value at that moment, so that an answer typed while the
# suggestion was on its way stays too (the server saw the box as it was when the prompt changed).
KEEP_TYPED_JS = "(suggestion, current, last) => (current === '' || current === last) ? [suggestion, suggestion] : [current, last]"
# The live view's pace: iterations shown per second, 0 for as fast as the engine makes them.
LIVE_SPEEDS = [("as fast as the engine", 0), *((f"{n} iteration{'s' * (n > 1)} / s", n) for n in (1, 2, 5, 10, 20))]
# Pair-sum: the first forward cannot commit the digits (a is uniform among N's splits), so the
# threshold decoder forces one, and the rest follows over several iterations
DEFAULT_PROMPT = FAMILY_EXAMPLES["pairsum"][0]


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
    return explain(cfg.get("decoder", "?"), cfg.get("cache", "?"), bool(cfg.get("smoothing")), bool(cfg.get("unroll")))


def live_speed(value: Any) -> float:
    """A run's live speed (iterations shown per second, 0: as fast as the engine), checked."""
    try:
        speed = float(value or 0)
    except (TypeError, ValueError):
        raise EngineError(f"live speed must be a number of iterations per second, got {value!r}") from None
    if not 0 <= speed < float("inf"):
        raise EngineError(f"live speed must be 0 (as fast as the engine) or a positive number of iterations per second, got {value!r}")
    return speed


class RunHandlers(TabHandlers):
    """The Run tab's events: settings checks, the live run, replay, playback, loading a trace."""

    page_fields: Sequence[str] | None = None  # the setting controls of the page served (run_page sets them)

    @property
    def loaded_slots(self) -> tuple[str, ...]:
        """What a loaded trace's handlers return: `load_view` of the page served."""
        return load_view(self.page_fields)

    def check(self, *values: Any) -> tuple[str, Any]:
        """(message next to the controls, Run button update): Run is refused while invalid (a
        constraint by the engine's own check, before any run). The message may quote what the
        user typed (a regex), so it is escaped."""
        try:
            _, config = self.parse(self.settings(*values))
        except EngineError as exc:
            return error_text(inert_markdown(str(exc))), gr.update(interactive=False)
        held = spec_of(config)
        return "settings ok" + (f" · the answer is held to {inert_markdown(held.describe())}" if held is not None else ""), gr.update(interactive=True)

    def check_with_prompt(self, prompt: str, *values: Any) -> tuple[str, Any, Any]:
        """`check`, then this server's bounds and the engine's checks of this prompt on this model
        (its max_sequence_length, prompt included: engine/pipeline.py check_request), with the
        prompt box's length hint; the page redoes it as the prompt, the settings or the model
        change, so Run is refused, with the reason, before the engine would refuse it."""
        message, button = self.check(*values)
        hint = self.limits_text()
        if not button["interactive"]:
            return message, button, gr.update(info=hint)
        try:
            model, config = self.parse(self.settings(*values))
            reader = self.host.reader(model) if prompt and prompt.strip() else None
            if reader is not None:
                hint = self.limits_text(len(encode_prompt(reader[1], prompt, config.use_chat_template)), reader[0].max_positions, model.label or self.host.label_of(model.path))
                check_request(*reader, prompt, config)
            self.check_request(prompt, config)
        except EngineError as exc:
            return error_text(inert_markdown(str(exc))), gr.update(interactive=False), gr.update(info=hint)
        return message, button, gr.update(info=hint)

    def structure(self, decoder: str, cache: str, smoothing: bool, unroll: bool, *system: Any) -> tuple:
        """Show only the controls that matter for this decoder / cache mode / feature set, the
        explanation of the choice, and the setting a sweep of this decoder varies."""
        shown = visible_fields(decoder, cache, bool(smoothing), bool(unroll))
        return (
            *(gr.update(visible=c.field in shown) for c in all_controls()),
            self.explanation(decoder, cache, smoothing, unroll, *system),
            gr.update(value=sweep_setting(decoder)),
        )

    def explanation(self, decoder: str, cache: str, smoothing: bool, unroll: bool, *system: Any) -> str:
        """The explanation panel: the decoder, cache mode and features, and the system options that
        are on (`system`: the Model and system controls' values, in `option_names` order)."""
        return explain(decoder, cache, bool(smoothing), bool(unroll), dict(zip(self.option_names, system)))

    def suggest_expected(self, prompt: str) -> tuple[str, str]:
        """(the known right response of an arithmetic prompt, "" for other families; the note on the
        prompt's family). Whether the expected box takes the response is the page's decision
        (KEEP_TYPED_JS)."""
        return answers.expected_response(prompt or ""), answers.prompt_note(prompt or "")

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
        for frame in run_live(self.host, spec, prompt, config, self.fps, self.plot_hz, speed, batcher=self.batcher, expected=expected):
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
        judged = answers.verdict(prompt, frame.text or "")
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

    def stop_quietly(self, state: RunState | None, pinned: int | None = None) -> tuple:
        """Another tab's Stop: a live Run stays as Stop leaves it; otherwise the Run tab is untouched."""
        if state is None or state.status != LIVE:
            return outputs(RUN_VIEW, {})
        return self.stop(state, pinned)

    def stop(self, state: RunState | None, pinned: int | None = None) -> tuple:
        """Stop: a live run's stream is halted (runner.LiveRun.halt: the engine is cancelled, and
        the stream's last frame is the stopped run, `_stopped_view`); this waits for that frame to
        go, so the click's follow-up cancel (of a run still queued, of Compare or Sweep) never cuts
        it off. Nothing live: the message says the engine is free."""
        if state is None or state.status != LIVE or state.live is None:
            return outputs(RUN_VIEW, {"message": self.stopped()})
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

    def _write_trace(self, trace: Trace) -> str:
        """The trace as a JSON file for the download button."""
        return self.write_file(f"trace-{trace.model or 'model'}", ".json", trace.to_json())

    @guarded(RUN_VIEW)
    def replay(self, iteration: Any, state: RunState | None, pinned: int | None = None) -> tuple:
        """The stored run at `iteration` (the slider's number: 0 before the first forward, 1..N;
        raw, as the API sent it: a non-number is one line in the page), figures included, the
        iteration marked on them; the details of the `pinned` position."""
        if state is None:
            return outputs(RUN_VIEW, {"message": "nothing to replay: run something or load a trace"})
        try:
            it = record_index(iteration)
        except EngineError as exc:
            return outputs(RUN_VIEW, {"message": error_text(str(exc))})
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

    def lesson_step(self, name: str | None, step: Any) -> tuple:
        """Step `step` (0-based; past the last: the last) of the lesson `name`: (the step menu, the
        prompt, the sentence of what to look at, every Run control's value in all_controls' order,
        the model box: the step's model, or unchanged when the lesson names none).
        An unknown lesson or step changes nothing but the sentence, which says why."""
        try:
            lesson = lesson_named(name)
            index = min(max(int(step or 0), 0), len(lesson.steps) - 1)
            config = lesson.config(index)
        except (EngineError, TypeError, ValueError) as exc:
            return (gr.skip(), gr.skip(), error_text(inert_markdown(str(exc))), *(gr.skip() for _ in all_controls()), gr.skip())
        choices = [(f"{i + 1}. {s.title}", i) for i, s in enumerate(lesson.steps)]
        last = " (the last step)" if index == len(lesson.steps) - 1 else ""
        note = f"**Step {index + 1} of {len(lesson.steps)}{last}: {inert(lesson.steps[index].title)}.** Press Run, then: {inert(lesson.steps[index].look)}"
        return (gr.update(choices=choices, value=index), lesson.prompt, note, *(control_value(c, config) for c in all_controls()), lesson.model(index) or gr.skip())

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

    def forward_costs(self, *values: Any) -> tuple[Any, str]:
        """Measure each forward kind's cost against canvas length on the Run tab's model (its
        settings' values, TabHandlers.settings' order): (figure, one-line message)."""
        try:
            spec, _ = self.parse(self.settings(*values))
            with self.host.lock:
                engine = self.host.get(spec)
                limit = engine.model.max_positions
                lengths = [n for n in COST_LENGTHS if not limit or n <= limit]
                rows = measure_forward_costs(engine, lengths)
        except EngineError as exc:
            return gr.skip(), error_text(str(exc))
        return forward_cost_figure(rows), f"measured on {inert_markdown(spec.describe())}: median of {plural(rows[0]['repeats'] if rows else 0, 'forward')} per kind and length"

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
            return f"paused at iteration {live.shown} ({engine}): ▶ Play resumes, ⏭ End skips to the end, Stop keeps what the run produced", gr.Timer(active=False)
        return gr.skip(), gr.Timer(active=False)

    @guarded(SKIP_VIEW)
    def skip_to_end(self, state: RunState | None, pinned: int | None = None) -> tuple:
        """⏭ End: a live run's view shows every record that arrived and follows the engine from
        there (the final view comes when it ends); a replay jumps to its last iteration."""
        if state is None:
            return outputs(SKIP_VIEW, {"message": "nothing to skip: run something or load a trace"})
        if state.status == LIVE:
            if state.live is not None:
                state.live.skip()
            return outputs(SKIP_VIEW, {"message": "skipping to the end…"})
        tl = state.timeline
        view = timeline_view(tl, tl.iterations - 1, state.expected, highlight=True, pinned=pinned, scrub=iteration_number(tl.iterations - 1), timer=gr.Timer(active=False))
        if state.text:
            view["text"] = state.text
        return outputs(SKIP_VIEW, unpinned_kept(view, pinned))

    def loaded_boxes(self, shown: RunState) -> dict[str, Any]:
        """The boxes a loaded trace fills (`loaded_slots` after RUN_VIEW): the prompt, the model and
        every setting it was made with; a setting the trace does not name, or a config this
        engine no longer reads, leaves the controls as they are."""
        trace = shown.timeline.trace
        out: dict[str, Any] = {"prompt": shown.prompt} if shown.prompt else {}
        if trace.model:
            out["model_box"] = trace.model
        try:
            config = GenerationConfig.from_dict(dict(trace.config or {}))
        except (EngineError, TypeError, ValueError):
            return out
        named = set(trace.config or {})
        for c in all_controls():  # a plug-in registered after the page was built has no box here
            if config_fields(c) & named and f"cfg:{c.field}" in self.loaded_slots:
                out[f"cfg:{c.field}"] = control_value(c, config)
        return out

    @guarded(lambda h: h.loaded_slots)
    def load_trace(self, file: Any, source: str = "a trace file") -> tuple:
        """Load a downloaded trace JSON for replay (needs no model): the run on display, and the
        prompt, model and settings boxes filled with what it was made with (`loaded_slots`)."""
        path = getattr(file, "name", file)
        if not path:
            return outputs(self.loaded_slots, {"message": "no file"})
        try:
            trace = Trace.from_json(Path(path).read_text(encoding="utf-8"))
            tl = Timeline(trace)
        except (EngineError, OSError, UnicodeDecodeError, ValueError) as exc:
            return outputs(self.loaded_slots, {"message": error_text(f"cannot load this trace: {inert_markdown(str(exc))}")})  # it may quote the file
        except Exception as exc:  # a trace the checks let through but the views cannot show
            log.exception("trace could not be shown")
            return outputs(self.loaded_slots, {"message": error_text(f"cannot show this trace: {type(exc).__name__}: {inert_markdown(str(exc))}")})
        # the file's strings reach Markdown (the readout's note, the message) as text only
        note = f"loaded trace of {inert_markdown(trace.model or 'an unnamed model')}"
        message = f"loaded a trace: {inert_markdown(trace.model)}, {plural(tl.iterations, 'iteration')}"
        view = stored_view(tl, tl.iterations - 1, None, note=note, message=message, source=source)
        return outputs(self.loaded_slots, {**view, **self.loaded_boxes(view["state"])})

    @guarded(lambda h: h.loaded_slots)
    def load_sample(self, name: str | None) -> tuple:
        """Load one of the shipped sample traces (assets/traces), by file name, for replay."""
        path = self.samples.get(name or "")
        if path is None:
            return outputs(self.loaded_slots, {"message": error_text(f"no sample trace named {inert_markdown(repr(name))}")})
        return self.load_trace(path, source="a sample trace")

    @property
    def samples(self) -> dict[str, str]:
        """File name -> path of each shipped sample trace: the page and the API name a sample by
        its file, never by a path (public mode shows no paths)."""
        return {Path(path).name: path for _, path in shipped_samples()}

    @guarded(EXPORT_VIEW)
    def export_gif(self, state: RunState | None) -> tuple:
        """The stored run as an animated GIF, one frame per iteration (iteration 0 first)."""
        return self._export(state, ".gif", run_gif)

    @guarded(EXPORT_VIEW)
    def export_mp4(self, state: RunState | None) -> tuple:
        """The stored run as an MP4 (needs ffmpeg on the server: mp4_unavailable says why not)."""
        return self._export(state, ".mp4", run_mp4)

    def _export(self, state: RunState | None, suffix: str, render: Callable[[Timeline], bytes]) -> tuple:
        if state is None:
            return outputs(EXPORT_VIEW, {"message": "nothing to export: run something or load a trace"})
        tl = state.timeline
        try:
            data = render(tl)
        except EngineError as exc:
            return outputs(EXPORT_VIEW, {"message": error_text(str(exc))})
        path = self.write_file(f"run-{tl.trace.model or 'model'}", suffix, data)
        return outputs(EXPORT_VIEW, {"file": path, "message": f"animation of {plural(tl.iterations, 'iteration')} ({len(data) / 1024:.0f} KiB): download it below the figures"})
