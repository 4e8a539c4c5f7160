"""What every tab stands on: `TabHandlers` (the engine host, the bounds of a request, the settings
mapping, the download folder), output slots, errors in the page, and the shared wiring options.

Each tab's outputs are a fixed tuple of named slots (its `*_VIEW`); handlers fill the slots they
change and leave the others `gr.skip()`, so a streamed frame only carries what moved. Errors a user
can fix (EngineError) become a message in the page and the session carries on.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Sequence

import anyio
import gradio as gr
from gradio.context import Context
from gradio.events import Dependency

from engine import EngineError, GenerationConfig

from ..live.batching import MAX_BATCH, RunBatcher
from ..drawing.cells import inert_markdown
from ..panes.grid import GRID_CSS, GRID_JS, GRID_TEMPLATE
from ..live.host import EngineHost, ModelSpec
from ..live.runner import acknowledge
from engine.kinds import fit

from ..settings import Control, all_controls, parse_settings, without_hidden
from ..live.system import check_offered, offered_options

log = logging.getLogger(__name__)

# Comparisons, sweeps and model loads: one at a time, the rest in line (runs queue apart: run.py).
ENGINE_QUEUE: dict[str, Any] = dict(concurrency_id="engine", concurrency_limit=1)
# Events that only update the page: no API endpoint, no queue, no spinner.
PRIVATE: dict[str, Any] = dict(api_visibility="private", queue=False, show_progress="hidden")
# Events that redraw a verdict on the controls as they change (the settings check, which controls
# show): queued, because Gradio defers a trigger to run after the one in flight (always_last) only
# for queued events; unqueued, overlapping requests land in any order, and a slow earlier check
# (a model's tokenizer loading) overwrote the later one, leaving the verdict of settings gone by.
# No concurrency limit: the deferral is per page, and one visitor's check never waits for another's.
# One such event per trigger, never two: Gradio's page (6.31), when a deferred event ends, triggers
# the whole trigger again, every event bound to it; with two always_last events on one trigger, each
# end re-ran the other while it was in flight, which deferred it again, without end. A trace
# loaded into the Run tab (a dozen controls set at once) left the page sending the settings check,
# the lesson sentence and the controls shown, about six events a second, for as long as it stayed
# open. tests/test_page_limits.py checks every trigger of the page.
LATEST: dict[str, Any] = dict(api_visibility="private", show_progress="hidden", trigger_mode="always_last", concurrency_limit=None)
# An event beside a LATEST one on the same trigger: it runs for every trigger (queued, no limit, so
# one visitor's never waits for another's) and defers nothing, so it never triggers that one again.
ALONGSIDE: dict[str, Any] = dict(api_visibility="private", show_progress="hidden", trigger_mode="multiple", concurrency_limit=None)
# Visitors whose latest call `redraw_on` remembers, per handler (the oldest forgotten first).
REMEMBERED_VISITORS = 4096
# The page numbers the calls `redraw_on` wires as it sends them (one counter per page, in the
# browser; the number rides in a hidden slot, the call's last input). The server's order is not
# the page's: each call is a request of its own, and two sent close together can reach the server
# either way round; numbered by the server, a check of the settings before the last change could
# answer last. (A browser test's "held to regex" that never came, once taken for this, was its
# dropdown helper's: tests/test_run_on_display_browser.py.)
CALL_NUMBER_JS = (
    "(...values) => { values[values.length - 1] = "
    "(window.__dinferVizCalls = (window.__dinferVizCalls || 0) + 1); return values; }"
)


def _call_number_slot() -> gr.Number:
    """The hidden slot that carries a call's number: one per page, made where it is first wired."""
    page = Context.root_block
    if page is None:
        raise RuntimeError("redraw_on wires events inside a gr.Blocks")
    slot = getattr(page, "_call_number_slot", None)
    if slot is None:
        slot = page._call_number_slot = gr.Number(visible=False, precision=0, elem_id="call-number")
    return slot


def redraw_on(triggers: Sequence[Any], fn: Callable[..., Any], inputs: Any, outputs: Any, **options: Any) -> Dependency:
    """`fn` on `triggers` (gr.on's; `demo.load` too) with LATEST's or ALONGSIDE's `options`, writing
    only the answer to the page's latest state. Neither option orders one visitor's calls: two
    changes close together both run (the page checks for one in flight before it gathers the
    values and sends), side by side, and the first can end last; with nothing re-running it
    (Gradio's re-trigger loop, LATEST) its verdict on settings gone by stayed. So a call answers
    only if the page sent no later one (CALL_NUMBER_JS numbers them in the page); an overtaken call
    writes `gr.skip()` in every slot, and one that arrives after a later call started is not run."""
    listed = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    count = len(outputs) if isinstance(outputs, (list, tuple)) else 1
    skipped = gr.skip() if count == 1 else tuple(gr.skip() for _ in range(count))
    latest: OrderedDict[str | None, int] = OrderedDict()

    async def answer(request: gr.Request, *args: Any) -> Any:
        *values, number = args
        visitor = getattr(request, "session_hash", None)
        if number < latest.get(visitor, number):
            return skipped  # a later call has started; its answer would overwrite this one's
        latest[visitor] = number
        latest.move_to_end(visitor)
        while len(latest) > REMEMBERED_VISITORS:
            latest.popitem(last=False)
        result = await anyio.to_thread.run_sync(functools.partial(fn, *values))
        return result if latest.get(visitor, number) == number else skipped

    # not functools.wraps: its __wrapped__ would show Gradio fn's signature, and no request
    answer.__name__, answer.__doc__ = getattr(fn, "__name__", "answer"), fn.__doc__
    answer.answers_newest = True  # type: ignore[attr-defined]  # tests/test_page_limits.py reads it
    # the call's status (pending, then complete) goes to the hidden slot, never to the outputs:
    # Gradio 6.31's status tracker of a component an event hides while it is pending keeps
    # counting on every animation frame for as long as the page is open (the Run tab's load hides
    # the controls its decoder does not read: an idle page ran 1,600 frame callbacks a second,
    # 2,000 after three decoder changes; about 70 with the status here)
    slot = _call_number_slot()
    return gr.on(list(triggers), answer, [*listed, slot], outputs, js=CALL_NUMBER_JS, show_progress_on=slot, **options)


def outputs(slots: Sequence[str], values: dict[str, Any]) -> tuple:
    """`values` as the tuple of `slots`, `gr.skip()` for every slot not given."""
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


def guarded(slots: Sequence[str] | Callable[[Any], Sequence[str]] | None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Any exception a handler lets through becomes a one-line message in the page (its `slots`'
    "message", or the returned text when `slots` is None), with the traceback in the server log:
    the session and the loaded engines go on. `slots` may be a function of the handler's first
    argument (its handlers object), for slots that depend on the page it serves."""

    def message(exc: Exception, args: tuple) -> Any:
        log.exception("handler failed")
        text = error_text(f"internal error: {type(exc).__name__}: {inert_markdown(str(exc)[:300])}")  # it may quote a file
        if slots is None:
            return text
        return outputs(slots(args[0]) if callable(slots) else slots, {"message": text})

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def stream(*args: Any, **kwargs: Any) -> Iterator[Any]:
                try:
                    yield from fn(*args, **kwargs)
                except Exception as exc:  # GeneratorExit (a closed stream) is not an Exception
                    yield message(exc, args)

            return stream

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                return message(exc, args)

        return call

    return wrap


@dataclass
class Stoppable:
    """A tab's engine event and its Stop button with the message beside it. Every Stop cancels
    every tab's engine event (the engine runs one at a time), so ui.build_demo wires the Stops once
    all tabs exist."""

    event: Dependency
    stop: gr.Button
    message: gr.Markdown


def grid_view(value: dict, elem_id: str, min_height: int, extra_js: str = "") -> gr.HTML:
    """A token grid (dinfer_viz/panes/grid.py): full values drawn by its template, live frames by its
    renderer, which reports each frame it painted through the server function `painted` (a plain
    request: no queue, no event, nothing else updated in the page). A click on a cell is the grid's
    select event (index: the position); `extra_js` runs in the same scope (RASTER_PICK_JS)."""
    return gr.HTML(
        value, html_template=GRID_TEMPLATE, css_template=GRID_CSS, js_on_load=GRID_JS + extra_js, elem_id=elem_id, min_height=min_height,
        server_functions=[painted],
    )


def painted(report: Any) -> None:
    """A grid's report {run, frame} (runner.acknowledge); anything else is ignored."""
    run, frame = (report.get("run"), report.get("frame")) if isinstance(report, dict) else (None, None)
    if isinstance(run, str) and isinstance(frame, int) and not isinstance(frame, bool):
        acknowledge(run, frame)


def make_control(c: Control, value: Any, show_info: bool = True, **kw: Any) -> gr.components.Component:
    """The component for one generation setting (the Run tab's controls, the Compare tab's sides)."""
    common = dict(label=c.label, info=(c.info or None) if show_info else None, value=value, **kw)
    if c.kind == "choice":
        return gr.Dropdown(choices=list(c.choices()), **common)
    if c.kind == "slider":
        return gr.Slider(minimum=c.minimum, maximum=c.maximum, step=c.step, **common)
    if c.kind == "int":
        return gr.Number(precision=0, minimum=c.minimum, maximum=c.maximum, **common)
    if c.kind == "float":
        return gr.Number(minimum=c.minimum, step=c.step, **common)
    if c.kind == "bool":
        return gr.Checkbox(**common)
    if c.kind == "lines":
        return gr.Textbox(lines=2, max_lines=8, **common)
    return gr.Textbox(**common)


def sent_value(control: Control, value: Any) -> Any:
    """A control's value as a run's settings carry it: an optional int's 0 is None ("off")."""
    return None if control.none_as_zero and value in (0, None) else value


class TabHandlers:
    """What every tab's handlers use: the EngineHost, the live frame rates, the bounds of one
    request, the settings mapping and the folder of files for download buttons; `no_model`: the
    app started without loading a model (trace replay first); `allow_system`: the system options a
    public server's visitors may use (app.py --allow-system; a private app offers every one)."""

    def __init__(
        self,
        host: EngineHost,
        fps: float = 20.0,
        plot_hz: float = 3.0,
        max_prompt_chars: int = 4000,
        max_gen_length: int = 1024,
        max_batch: int = MAX_BATCH,
        no_model: bool = False,
        allow_system: Collection[str] = (),
    ) -> None:
        self.host = host
        self.allowed_system = frozenset(allow_system) if host.public else None
        self.no_model = no_model  # started with no model (app.py --no-model): the page leads with the sample traces
        # Runs of different sessions that wait for the engine join one batch (README, "Concurrency
        # rule"); max_batch 1: each run alone, in arrival order.
        self.batcher = RunBatcher(host, max_batch)
        self.fps = fps
        self.plot_hz = plot_hz
        # Every request is bounded (the engine also refuses canvases beyond the model's positions).
        self.max_prompt_chars = max_prompt_chars
        self.max_gen_length = max_gen_length
        self._files: Path | None = None  # made on the first file written
        self.option_names = [o.name for o in offered_options()]
        self._sweeps: dict[str, SweepStop] = {}  # each session's running sweep: its Stop (stop_sweep)
        self._stopped_sweeps: dict[str, SweepStop] = {}  # a sweep this Stop ended, for its message (stopped)

    def parse(self, settings: dict[str, Any] | None) -> tuple[ModelSpec, GenerationConfig]:
        """A run's settings, its model checked against the host's allow-list; the settings whose
        controls are hidden back at their defaults (settings.without_hidden), then the config
        fitted to the model's kind of diffusion by the engine's own function (engine.kinds.fit,
        carrying over: the page's settings may have been chosen for a model of another kind, so
        what this kind does not read goes back to its defaults, a decoder of another kind becomes
        the kind's own), which validates it: once, as the engine then runs it (`fitted`)."""
        spec, config = parse_settings(settings, self.host.default, self.host.resolve, validate=False)
        check_offered(spec.options, spec.device, self.allowed_system)  # public mode's system options
        return spec, self.fit_to(spec, config)

    def fit_to(self, spec: ModelSpec, config: GenerationConfig) -> GenerationConfig:
        """`config` as `spec`'s model runs it (parse): hidden settings at their defaults, then
        engine.kinds.fit carrying over from a model of another kind."""
        return fit(without_hidden(config), self.host.model_kind(spec), carry_over=True)

    def settings(self, *values: Any) -> dict[str, Any]:
        """Control values -> the settings JSON a run takes. Order: model path, device, dtype, the
        system options, then `all_controls()`. Values pass through unvalidated; the run checks them."""
        n = 3 + len(self.option_names)
        config = {c.field: sent_value(c, v) for c, v in zip(all_controls(), values[n:])}
        return {"model": self.model_settings(*values[:n]), "config": config}

    def model_settings(self, path: str, device: str, dtype: str, *options: Any) -> dict[str, Any]:
        """The settings' "model" part: the Model and system controls' values by name."""
        return {"path": path, "device": device, "dtype": dtype, **dict(zip(self.option_names, options))}

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

    def limits_text(self, prompt_tokens: int = 0, positions: int | None = None, model: str = "", block: int = 1) -> str:
        """The prompt box's hint: this server's bounds and, given the model's positions (its
        max_sequence_length, prompt included), the generation length this prompt leaves room for:
        a multiple of the block length `block`, as a run's must be (504 positions left run 480 with
        blocks of 32)."""
        if positions is None:
            return f"at most {self.max_prompt_chars} characters; generation length at most {self.max_gen_length}"
        room = min(self.max_gen_length, positions - prompt_tokens) // max(block, 1) * max(block, 1)
        return (f"at most {self.max_prompt_chars} characters; generation length at most {max(room, 0)} for this prompt "
                f"({prompt_tokens} tokens of {model}'s {positions} positions, prompt included)")

    def check_request(self, prompt: str, config: GenerationConfig) -> None:
        """The bounds of one run, before it queues for the engine."""
        if not prompt or not prompt.strip():
            raise EngineError("empty prompt: type a prompt first")
        if len(prompt) > self.max_prompt_chars:
            raise EngineError(f"the prompt has {len(prompt)} characters; this server takes at most {self.max_prompt_chars}")
        if config.gen_length > self.max_gen_length:
            raise EngineError(f"generation length {config.gen_length} is above this server's limit of {self.max_gen_length}")

    def write_file(self, stem: str, suffix: str, content: str | bytes) -> str:
        """A file for a download button (Gradio serves files from the temp dir), named uniquely:
        text (traces, CSV) or bytes (animations)."""
        if self._files is None:
            self._files = Path(tempfile.mkdtemp(prefix="dinfer-viz-traces-"))
        prune(self._files)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem)[:80]
        path = self._files / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{time.perf_counter_ns() % 10**6}{suffix}"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return str(path)

    def remove_files(self) -> None:
        """Remove this instance's download folder (app.py, at exit)."""
        if self._files is not None:
            shutil.rmtree(self._files, ignore_errors=True)
            self._files = None

    def stopped(self, request: gr.Request | None = None) -> str:
        """The message after any Stop: the session's sweep's own ("stopped: k/N prompts run"), if
        this Stop ended one, else the engine's."""
        self.stop_sweep(request)
        sweep = self._stopped_sweeps.pop(_session(request), None)
        return sweep.message if sweep is not None and sweep.message else "stopped: the engine ends its current iteration and is free for the next run"

    def sweep_stop(self, request: gr.Request | None) -> "SweepStop":
        """A new sweep's Stop, kept for its session (the API's calls without a session share one)."""
        stop = SweepStop()
        self._sweeps[_session(request)] = stop
        return stop

    def stop_sweep(self, request: gr.Request | None) -> None:
        """Stop the session's sweep, if one runs: its engine stops within a layer, and the sweep
        ends with its last state marked stopped (dinfer_viz/studies/sweep_study.py: run_sweep's `cancel`); this
        waits (a bound, not a pace) for that last frame to go, so the click's follow-up cancel of
        the sweep's event never cuts it off."""
        stop = self._sweeps.pop(_session(request), None)
        if stop is not None:
            stop.cancel.set()
            stop.ended.wait(30.0)
            self._stopped_sweeps[_session(request)] = stop


@dataclass
class SweepStop:
    """A running sweep's Stop: `cancel` (set by Stop), `ended` (its stream has sent its last
    frame) and that frame's `message`."""

    cancel: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    message: str = ""


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or ""
