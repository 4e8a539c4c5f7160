"""The Run tab's files: a trace loaded for replay (a downloaded JSON, a shipped sample from
assets/traces, what `app.py --no-model` leads with), which fills the prompt, model and settings
boxes with what it was made with, and the run on display written out: its trace as JSON, its
animation as GIF or MP4.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Sequence

from engine import EngineError, GenerationConfig, Trace
from engine.arguments import read_text_file
from engine.trace import MAX_TRACE_BYTES

from ..drawing.cells import inert_markdown
from ..panes.export import run_gif, run_mp4
from ..panes.readouts import plural
from ..sample_traces import shipped_samples
from ..settings import all_controls, config_fields, control_value
from ..reading.timeline import Timeline
from ..views import view_of_kind
from .common import TabHandlers, error_text, guarded, outputs
from .run_view import RUN_VIEW, stored_view
from .shown import RunState

log = logging.getLogger(__name__)

EXPORT_VIEW = ("file", "message")  # the GIF / MP4 exports: the file, and the Run tab's message
# Loading a trace: the view, then the boxes it fills with what the trace was made with (the
# prompt, the model, every control in all_controls() order; the family note follows the prompt)


def load_view(fields: Sequence[str] | None = None) -> tuple[str, ...]:
    """The slots a loaded trace fills: the run view, the prompt, the model and one box per setting
    control (`fields`: those of the page being served; default: every control registered now, for
    handlers used without a page). A plug-in registered after a page was built has no box there."""
    return (*RUN_VIEW, "prompt", "model_box", *(f"cfg:{f}" for f in (fields if fields is not None else [c.field for c in all_controls()])))


JSON_SAFE_INT = 2**53  # the largest integer a page's number box (a JavaScript number) holds exactly


class RunFileHandlers(TabHandlers):
    """The Run tab's events on files: load a trace or a sample, export the run on display."""

    page_fields: Sequence[str] | None = None  # the setting controls of the page served (run_page sets them)

    @property
    def loaded_slots(self) -> tuple[str, ...]:
        """What a loaded trace's handlers return: `load_view` of the page served."""
        return load_view(self.page_fields)

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
            value = control_value(c, config) if config_fields(c) & named and f"cfg:{c.field}" in self.loaded_slots else None
            # a number no page box holds (a file's gen_length 10**30: the page's JSON writer refused
            # it and the client saw the event cancelled) leaves its box as it is
            if value is not None and not (isinstance(value, int) and abs(value) > JSON_SAFE_INT):
                out[f"cfg:{c.field}"] = value
        return out

    @guarded(lambda h: h.loaded_slots)
    def load_trace(self, file: Any, source: str = "a trace file") -> tuple:
        """Load a downloaded trace JSON for replay (needs no model): the run on display, and the
        prompt, model and settings boxes filled with what it was made with (`loaded_slots`)."""
        path = getattr(file, "name", file)
        if not path:
            return outputs(self.loaded_slots, {"message": "no file"})
        try:
            trace = Trace.from_json(read_text_file(path, "the trace", MAX_TRACE_BYTES))
            view_of_kind(trace.kind)  # a kind this app cannot draw: refused here, not by the first view
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

    def _write_trace(self, trace: Trace) -> str:
        """The trace as a JSON file for the download button."""
        return self.write_file(f"trace-{trace.model or 'model'}", ".json", trace.to_json())

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
            return outputs(EXPORT_VIEW, {"message": error_text(inert_markdown(str(exc)))})
        path = self.write_file(f"run-{tl.trace.model or 'model'}", suffix, data)
        return outputs(EXPORT_VIEW, {"file": path, "message": f"animation of {plural(tl.iterations, 'iteration')} ({len(data) / 1024:.0f} KiB): download it below the figures"})
