"""What each UI event does: settings in, view values out. ui.py wires these to components.

Each tab's outputs are a fixed tuple of named slots (`RUN_VIEW`, `COMPARE_VIEW`, `SWEEP_VIEW`);
handlers fill the slots they change and leave the others `gr.skip()`, so a streamed frame only
carries what moved. Errors a user can fix (EngineError) become a message in the page and the
session carries on.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import gradio as gr

from engine import EngineError, GenerationConfig, Trace

from . import answers
from .explain import explain
from .figures import compare_figure, confidence_raster, extras_figure, iteration_chart, message_figure, sweep_figure
from .grid import EMPTY_GRID, grid_value
from .host import EngineHost, ModelSpec
from .readouts import message_readout, readout
from .runner import Frame, run_live
from .settings import all_controls, parse_settings, sweep_setting, visible_fields
from .sweep import SweepState, parse_values, run_sweep, sweep_examples
from .system import system_options
from .timeline import Timeline

log = logging.getLogger(__name__)

RUN_VIEW = ("grid", "readout", "text", "raster", "iterations", "extras", "scrub", "download", "message", "state", "explain")
COMPARE_VIEW = ("grid_a", "readout_a", "text_a", "grid_b", "readout_b", "text_b", "chart", "message", "scrub", "state")
SWEEP_VIEW = ("chart", "table", "failures", "message", "state", "csv")
LIVE_RASTER_ROWS = 48  # while live, the raster shows the latest iterations only (payload per redraw)
SWEEP_TABLE_HEADERS = ["value", "accuracy", "TPF", "TPS", "prompts"]
# The settings each side of a comparison sets itself; the rest come from the Run tab.
COMPARE_FIELDS = ("decoder", "threshold", "cache", "block_length", "smoothing", "unroll")
FAILURE_HEADERS = ["value", "prompt", "expected", "got", "first wrong pos", "at iteration", "confidence then", "forced"]


@dataclass
class RunState:
    """A session's finished (or loaded) run: what the scrubber and replay read."""

    timeline: Timeline
    expected: list[int] | None = None


@dataclass
class CompareState:
    """A session's finished comparison: what the shared slider steps through."""

    a: Timeline
    b: Timeline


def _outputs(slots: Sequence[str], values: dict[str, Any]) -> tuple:
    unknown = set(values) - set(slots)
    if unknown:
        raise KeyError(f"no output slot(s) {sorted(unknown)}")
    return tuple(values.get(name, gr.skip()) for name in slots)


def error_text(message: str) -> str:
    return f"**⚠ {message}**"


# Files written for download buttons: Gradio copies each into its own cache when the handler returns
# (that copy is what the browser downloads; ui.build_demo's delete_cache removes those), so ours are
# needed only briefly: older ones are deleted, and the folder never holds more than this.
KEEP_FILES_SECONDS = 600
KEEP_FILES_BYTES = 256 * 2**20


def prune(folder: Path, now: float | None = None) -> None:
    """Delete files in `folder` older than KEEP_FILES_SECONDS, then the oldest beyond KEEP_FILES_BYTES."""
    now = time.time() if now is None else now
    files = sorted((p for p in folder.iterdir() if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True)
    total = 0
    for path in files:
        stat = path.stat()
        total += stat.st_size
        if now - stat.st_mtime > KEEP_FILES_SECONDS or total > KEEP_FILES_BYTES:
            path.unlink(missing_ok=True)


def guarded(slots: Sequence[str] | None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Any exception a handler lets through becomes a one-line message in the page (its `slots`'
    "message", or the returned text when `slots` is None), with the traceback in the server log:
    the session and the loaded engines go on."""

    def message(exc: Exception) -> Any:
        log.exception("handler failed")
        text = error_text(f"internal error: {type(exc).__name__}: {str(exc)[:300]}")
        return _outputs(slots, {"message": text}) if slots is not None else text

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def stream(*args: Any, **kwargs: Any) -> Iterator[Any]:
                try:
                    yield from fn(*args, **kwargs)
                except Exception as exc:  # GeneratorExit (a closed stream) is not an Exception
                    yield message(exc)

            return stream

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                return message(exc)

        return call

    return wrap


def _config_of(timeline: Timeline) -> dict[str, Any]:
    return timeline.trace.config or {}


class Handlers:
    """The app's event functions around one EngineHost."""

    def __init__(
        self, host: EngineHost, fps: float = 20.0, plot_hz: float = 3.0, max_prompt_chars: int = 4000, max_gen_length: int = 1024
    ) -> None:
        self.host = host
        self.fps = fps
        self.plot_hz = plot_hz
        # Every request is bounded (the engine also refuses canvases beyond the model's positions).
        self.max_prompt_chars = max_prompt_chars
        self.max_gen_length = max_gen_length
        self._trace_dir: Path | None = None  # made on the first trace written
        self.option_names = [o.name for o in system_options()]

    # ---- settings -------------------------------------------------------------------------------
    def parse(self, settings: dict[str, Any] | None) -> tuple[ModelSpec, GenerationConfig]:
        """A run's settings, validated, its model checked against the host's allow-list."""
        return parse_settings(settings, self.host.default, self.host.resolve)

    def settings(self, *values: Any) -> dict[str, Any]:
        """Control values -> the settings JSON a run takes. Order: model path, device, dtype, the
        system options, then `all_controls()`. Values pass through unvalidated; the run checks them."""
        n = 3 + len(self.option_names)
        path, device, dtype, *options = values[:n]
        model = {"path": path, "device": device, "dtype": dtype, **dict(zip(self.option_names, options))}
        config = {c.field: (None if c.none_as_zero and v in (0, None) else v) for c, v in zip(all_controls(), values[n:])}
        return {"model": model, "config": config}

    def settings_js(self) -> str:
        """`settings` as a browser-side function, so Run sends the settings without a server round
        trip first (the same mapping; the run validates either way)."""
        model_keys = ["path", "device", "dtype", *self.option_names]
        fields = [[c.field, c.none_as_zero] for c in all_controls()]
        return (
            "(...v) => { const mk = " + json.dumps(model_keys) + "; const fs = " + json.dumps(fields) + ";"
            " const model = {}; mk.forEach((k, i) => { model[k] = v[i]; });"
            " const config = {}; fs.forEach(([f, z], i) => { const x = v[mk.length + i]; config[f] = (z && (x === 0 || x === null)) ? null : x; });"
            " return [{model: model, config: config}]; }"
        )

    def compare_settings(self, *values: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run-tab control values, then A's and B's COMPARE_FIELDS values -> two settings JSONs."""
        n = len(COMPARE_FIELDS)
        base, a, b = values[: -2 * n], values[-2 * n : -n], values[-n:]
        out = []
        for side in (a, b):
            settings = self.settings(*base)
            settings["config"].update(dict(zip(COMPARE_FIELDS, side)))
            out.append(settings)
        return out[0], out[1]

    def check(self, *values: Any) -> tuple[str, Any]:
        """(message next to the controls, Run button update): Run is refused while invalid."""
        try:
            self.parse(self.settings(*values))
        except EngineError as exc:
            return error_text(str(exc)), gr.update(interactive=False)
        return "settings ok", gr.update(interactive=True)

    def structure(self, decoder: str, cache: str, smoothing: bool, unroll: bool) -> tuple:
        """Show only the controls that matter for this decoder / cache mode / feature set, the
        explanation of the choice, and the setting a sweep of this decoder varies."""
        shown = visible_fields(decoder, cache, bool(smoothing), bool(unroll))
        return (
            *(gr.update(visible=c.field in shown) for c in all_controls()),
            explain(decoder, cache, bool(smoothing), bool(unroll)),
            gr.update(value=sweep_setting(decoder)),
        )

    def suggest_expected(self, prompt: str) -> tuple[str, str]:
        """(the known right response of an arithmetic prompt, the note on the prompt's family)."""
        return answers.expected_response(prompt or ""), answers.prompt_note(prompt or "")

    @guarded(None)
    def load_model(self, path: str, device: str, dtype: str, *options: Any) -> str:
        settings = {"model": {"path": path, "device": device, "dtype": dtype, **dict(zip(self.option_names, options))}}
        try:
            spec, _ = self.parse(settings)
            with self.host.lock:
                t0 = time.perf_counter()
                engine = self.host.get(spec)
                seconds = time.perf_counter() - t0
        except EngineError as exc:
            return error_text(str(exc))
        params = sum(p.numel() for p in engine.model.parameters())
        return f"loaded **{engine.name}** ({params / 1e6:.1f} M parameters) on {spec.device} in {seconds:.1f} s"

    def model_status(self) -> str:
        d = self.host.default
        if self.host.default_error:
            return error_text(f"default model not loaded: {self.host.default_error}. Load a model below, or load a trace to replay it.")
        state = "loaded" if self.host.is_loaded(d) else "loads on first run"
        return f"default model: `{d.label or d.path}` on {d.device} ({state})"

    # ---- the Run tab ----------------------------------------------------------------------------
    def view(
        self, timeline: Timeline, iteration: int, expected: list[int] | None, *, plots: bool = True, extras: bool = True, highlight: bool = False, live: bool = False, **slots: Any
    ) -> dict[str, Any]:
        """Grid, text and (optionally) figures of `timeline` at `iteration`, plus extra slots;
        `live` draws only the raster's latest rows."""
        iteration = timeline.clamp(iteration)
        out: dict[str, Any] = {
            "grid": grid_value(timeline, iteration, expected),
            "text": timeline.text_at(iteration),
        }
        mark = iteration if highlight else None
        if plots:
            out["raster"] = confidence_raster(timeline, highlight=mark, last_rows=LIVE_RASTER_ROWS if live else None)
            out["iterations"] = iteration_chart(timeline, highlight=mark)
        if extras:
            out["extras"] = extras_figure(timeline, highlight=mark)
        out.update(slots)
        return out

    def _scrub(self, timeline: Timeline, value: int) -> Any:
        return gr.update(minimum=-1, maximum=max(timeline.iterations - 1, 0), value=timeline.clamp(value), interactive=True)

    def _write_trace(self, trace: Trace) -> str:
        """The trace as a JSON file for the download button."""
        return self._write_file(f"trace-{trace.model or 'model'}", ".json", trace.to_json())

    def _write_file(self, stem: str, suffix: str, text: str) -> str:
        """A file for a download button (Gradio serves files from the temp dir), named uniquely."""
        if self._trace_dir is None:
            self._trace_dir = Path(tempfile.mkdtemp(prefix="dinfer-viz-traces-"))
        prune(self._trace_dir)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem)[:80]
        path = self._trace_dir / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{time.perf_counter_ns() % 10**6}{suffix}"
        path.write_text(text)
        return str(path)

    def limits_text(self) -> str:
        return f"at most {self.max_prompt_chars} characters; generation length at most {self.max_gen_length}"

    def check_request(self, prompt: str, config: GenerationConfig) -> None:
        """The bounds of one run, before it queues for the engine."""
        if not prompt or not prompt.strip():
            raise EngineError("empty prompt: type a prompt first")
        if len(prompt) > self.max_prompt_chars:
            raise EngineError(f"the prompt has {len(prompt)} characters; this server takes at most {self.max_prompt_chars}")
        if config.gen_length > self.max_gen_length:
            raise EngineError(f"generation length {config.gen_length} is above this server's limit of {self.max_gen_length}")

    @guarded(RUN_VIEW)
    def run(self, prompt: str, settings: dict[str, Any] | None, expected: str = "") -> Iterator[tuple]:
        """Stream a run: frames of the growing timeline, then the final view, trace file and state."""
        try:
            spec, config = self.parse(settings)
            self.check_request(prompt, config)
        except EngineError as exc:
            yield _outputs(RUN_VIEW, {"message": error_text(str(exc))})
            return
        expected_ids: list[int] | None = None
        unknown = ""  # characters the tokenizer cannot encode, said with the result
        for frame in run_live(self.host, spec, prompt, config, self.fps, self.plot_hz):
            engine = self.host.peek(spec) if frame.timeline is not None and expected_ids is None else None
            if engine is not None:
                expected_ids = answers.expected_ids(engine, expected) if expected else []
                missing = sorted(set(engine.unencodable(prompt, config.use_chat_template)))
                unknown = f"; ⚠ the tokenizer has no token for {''.join(missing)!r}" if missing else ""
            view = self._frame_view(frame, spec.describe(), expected_ids or None, prompt)
            if frame.stage == "done" and unknown:
                view["message"] += unknown
            yield _outputs(RUN_VIEW, view)

    def _frame_view(self, frame: Frame, model: str, expected: list[int] | None, prompt: str = "") -> dict[str, Any]:
        if frame.stage in ("waiting", "loading"):
            return {"readout": message_readout(frame.message), "message": frame.message}
        if frame.stage == "busy":
            return {"message": f"{frame.message} ({frame.wall:.0f} s)…"}
        if frame.timeline is None:  # failed before the engine started
            return {"message": error_text(frame.message)}
        tl, last = frame.timeline, frame.shown - 1
        if frame.stage == "error":
            return {"message": error_text(frame.message), **self.view(tl, last, expected, plots=True, extras=True)}
        done = frame.stage == "done"
        out = self.view(tl, last, expected, plots=frame.plots, extras=done, live=not done)
        out["readout"] = readout(tl, frame.wall, note=model)
        out["message"] = f"{frame.message}: {tl.iterations} iterations" if done else f"{frame.message}…"
        if done:
            judged = answers.verdict(prompt, frame.text or "")
            out["message"] += f"; {judged}" if judged else ""
            out["text"] = frame.text
            out["scrub"] = self._scrub(tl, tl.iterations - 1)
            out["download"] = self._write_trace(tl.trace)
            out["state"] = RunState(tl, expected)
        return out

    def stopped(self) -> str:
        return "stopped: the engine ends its current iteration and is free for the next run"

    @guarded(RUN_VIEW)
    def replay(self, iteration: float, state: RunState | None) -> tuple:
        """The stored run at `iteration`, figures included, the iteration marked on them."""
        if state is None:
            return _outputs(RUN_VIEW, {"message": "nothing to replay: run something or load a trace"})
        it = int(iteration)
        return _outputs(RUN_VIEW, self.view(state.timeline, it, state.expected, highlight=True))

    def glance(self, iteration: float, state: RunState | None) -> tuple:
        """While the scrubber is dragged: grid and text only (figures follow on release)."""
        if state is None:
            return gr.skip(), gr.skip()
        view = self.view(state.timeline, int(iteration), state.expected, plots=False, extras=False)
        return view["grid"], view["text"]

    def step(self, iteration: float, state: RunState | None, delta: int = 1) -> tuple:
        """Playback tick: the next iteration's grid and text (figures untouched); the timer stops at
        the end. Returns (scrub value, grid, text, timer update)."""
        if state is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.Timer(active=False)
        tl = state.timeline
        it = int(iteration) + delta
        if it > tl.iterations - 1:
            return gr.skip(), gr.skip(), gr.skip(), gr.Timer(active=False)
        view = self.view(tl, it, state.expected, plots=False, extras=False)
        return it, view["grid"], view["text"], gr.Timer(active=it < tl.iterations - 1)

    def play(self, iteration: float, state: RunState | None) -> tuple:
        """Start playback (from the beginning when at the end)."""
        if state is None:
            return gr.skip(), gr.Timer(active=False)
        at_end = int(iteration) >= state.timeline.iterations - 1
        return (-1 if at_end else gr.skip()), gr.Timer(active=True)

    @guarded(RUN_VIEW)
    def load_trace(self, file: Any) -> tuple:
        """Load a downloaded trace JSON for replay; needs no model."""
        path = getattr(file, "name", file)
        if not path:
            return _outputs(RUN_VIEW, {"message": "no file"})
        try:
            trace = Trace.from_json(Path(path).read_text(encoding="utf-8"))
            tl = Timeline(trace)
        except (EngineError, OSError, UnicodeDecodeError, ValueError) as exc:
            return _outputs(RUN_VIEW, {"message": error_text(f"cannot load this trace: {exc}")})
        except Exception as exc:  # a trace the checks let through but the views cannot show
            log.exception("trace could not be shown")
            return _outputs(RUN_VIEW, {"message": error_text(f"cannot show this trace: {type(exc).__name__}: {exc}")})
        cfg = _config_of(tl)
        out = self.view(tl, tl.iterations - 1, None)
        out.update(
            readout=readout(tl, None, note=f"loaded trace of {trace.model or 'an unnamed model'}"),
            scrub=self._scrub(tl, tl.iterations - 1),
            state=RunState(tl, None),
            message=f"loaded a trace: {trace.model}, {tl.iterations} iterations",
            explain=explain(cfg.get("decoder", "?"), cfg.get("cache", "?"), bool(cfg.get("smoothing")), bool(cfg.get("unroll"))),
        )
        return _outputs(RUN_VIEW, out)

    # ---- the Compare tab ------------------------------------------------------------------------
    @guarded(COMPARE_VIEW)
    def compare(self, prompt: str, settings_a: dict[str, Any] | None, settings_b: dict[str, Any] | None) -> Iterator[tuple]:
        """Run A, then B (one device: runs never overlap, so each speed is its own), streaming each
        into its panel; then the comparison chart."""
        try:
            runs = [self.parse(s) for s in (settings_a, settings_b)]
            for _, config in runs:
                self.check_request(prompt, config)
        except EngineError as exc:
            yield _outputs(COMPARE_VIEW, {"message": error_text(str(exc))})
            return
        labels = tuple(f"{side}: {_label(cfg.to_dict())}" for side, (_, cfg) in zip("AB", runs))
        done: list[Timeline] = []
        for side, (spec, config) in zip("ab", runs):
            for frame in run_live(self.host, spec, prompt, config, self.fps, self.plot_hz):
                out: dict[str, Any] = {"message": f"{side.upper()}: {frame.message}"}
                if frame.stage == "error":
                    out["message"] = error_text(f"{side.upper()}: {frame.message}")
                    yield _outputs(COMPARE_VIEW, out)
                    return
                if frame.timeline is not None:
                    tl = frame.timeline
                    out[f"grid_{side}"] = grid_value(tl, frame.shown - 1)
                    out[f"readout_{side}"] = readout(tl, frame.wall, note=labels["ab".index(side)])
                    out[f"text_{side}"] = frame.text if frame.stage == "done" else tl.text_at(frame.shown - 1)
                    if frame.stage == "done":
                        done.append(tl)
                yield _outputs(COMPARE_VIEW, out)
        longest = max(t.iterations for t in done)
        yield _outputs(
            COMPARE_VIEW,
            {
                "chart": compare_figure(done, labels),
                "scrub": gr.update(minimum=-1, maximum=max(longest - 1, 0), value=longest - 1, interactive=True),
                "state": CompareState(done[0], done[1]),
                "message": "done: " + " · ".join(f"{l} → TPF {t.trace.stats['tpf']:.2f}, TPS {t.trace.stats['tps']:.1f}" for l, t in zip(labels, done)),
            },
        )

    def compare_replay(self, iteration: float, state: CompareState | None) -> tuple:
        """Both runs at the same iteration (a run that already finished shows its end)."""
        if state is None:
            return _outputs(COMPARE_VIEW, {"message": "nothing to replay: compare first"})
        it = int(iteration)
        return _outputs(
            COMPARE_VIEW,
            {
                "grid_a": grid_value(state.a, state.a.clamp(it)),
                "grid_b": grid_value(state.b, state.b.clamp(it)),
                "text_a": state.a.text_at(state.a.clamp(it)),
                "text_b": state.b.text_at(state.b.clamp(it)),
            },
        )

    # ---- the Sweep tab --------------------------------------------------------------------------
    @guarded(SWEEP_VIEW)
    def sweep(
        self, settings: dict[str, Any] | None, tasks: list[str] | None, per_task: float, parameter: str, values: str, own_prompts: str = ""
    ) -> Iterator[tuple]:
        """Run every chosen prompt at every value; stream the accuracy-vs-TPF chart and tables."""
        try:
            spec, config = self.parse(settings)
            examples = sweep_examples(list(tasks or []), int(per_task or 0), seed=config.seed, own_prompts=own_prompts)
            for example in examples:
                self.check_request(example.prompt, config)
            numbers = parse_values(values)
            states = run_sweep(self.host, spec, config, parameter, numbers, examples)
            first = next(states)
        except EngineError as exc:
            yield _outputs(SWEEP_VIEW, {"message": error_text(str(exc))})
            return
        for state in _chain(first, states):
            out = {
                "chart": sweep_figure(state.points(), parameter),
                "table": _sweep_rows(state),
                "failures": _failure_rows(state),
                "message": error_text(state.message) if state.failed else state.message,
            }
            if state.done:
                out["state"] = state
                out["csv"] = self._write_file(f"sweep-{state.parameter}", ".csv", state.csv())
            yield _outputs(SWEEP_VIEW, out)

    def open_failure(self, state: SweepState | None, evt: gr.SelectData) -> tuple:
        """A clicked wrong answer opens in the Run tab at its first wrong commit.
        Returns the Run view, then (prompt, expected, tab selection)."""
        kept = [o for o in (state.failures() if state else []) if o.trace is not None]
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if state is None or not 0 <= row < len(kept):
            return _outputs(RUN_VIEW, {"message": "that row has no stored trace"}) + (gr.skip(), gr.skip(), gr.skip())
        outcome = kept[row]
        tl = Timeline(outcome.trace)
        at = outcome.wrong.iteration if outcome.wrong else tl.iterations - 1
        out = self.view(tl, at, outcome.expected, highlight=True)
        cfg = _config_of(tl)
        where = f"first wrong commit at position {outcome.wrong.position}, iteration {outcome.wrong.iteration}, confidence {outcome.wrong.confidence:.3f}" if outcome.wrong else "no single wrong commit found"
        out.update(
            readout=readout(tl, None, note=f"sweep: {state.parameter} = {outcome.value:g}"),
            scrub=self._scrub(tl, at),
            state=RunState(tl, outcome.expected),
            message=f"wrong answer from the sweep ({state.parameter} = {outcome.value:g}): {where}",
            explain=explain(cfg.get("decoder", "?"), cfg.get("cache", "?"), bool(cfg.get("smoothing")), bool(cfg.get("unroll"))),
        )
        return _outputs(RUN_VIEW, out) + (outcome.example.prompt, outcome.example.response, gr.Tabs(selected="run"))


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _label(config: dict[str, Any]) -> str:
    parts = [config.get("decoder", "?")]
    if config.get("decoder") != "fixed":
        parts.append(f"τ={config.get('threshold')}")
    parts.append(f"cache {config.get('cache')}")
    parts.append(f"block {config.get('block_length')}")
    if config.get("smoothing"):
        parts.append("smoothing")
    if config.get("unroll"):
        parts.append("unroll")
    return ", ".join(str(p) for p in parts)


def _sweep_rows(state: SweepState) -> list[list[Any]]:
    return [[p["value"], round(p["accuracy"], 3), round(p["tpf"], 2), round(p["tps"], 1), p["examples"]] for p in state.points()]


def _failure_rows(state: SweepState) -> list[list[Any]]:
    rows = []
    for o in state.failures():
        if o.trace is None:
            continue
        w = o.wrong
        rows.append([o.value, o.example.prompt, o.example.response, o.text, w.position if w else "", w.iteration if w else "", round(w.confidence, 3) if w else "", w.forced if w else ""])
    return rows


def empty_run_view() -> dict[str, Any]:
    return {"grid": EMPTY_GRID, "raster": message_figure("run something, or load a trace", 360), "iterations": message_figure("", 380), "extras": message_figure("", 220)}
