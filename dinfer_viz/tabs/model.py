"""The Model and system section (in the Run tab's settings column): which model, on which device
and dtype, with which system options; loading it ahead of a run; and the page's model status line.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import gradio as gr

from engine import EngineError

from ..drawing.cells import inert_markdown
from ..panes.explain import system_markdown
from ..live.host import DTYPES
from ..live.system import OfferedOption, describe_machine, devices, progress_line, startup_note, offered_options
from .common import ALONGSIDE, ENGINE_QUEUE, TabHandlers, error_text, guarded, redraw_on


class ModelHandlers(TabHandlers):
    """Loading a model, and saying which one serves by default."""

    @guarded(None)
    def load_model(self, path: str, device: str, dtype: str, *options: Any) -> Iterator[str]:
        """A progress line (what loading this spec involves: worker processes, ...) unless it is
        loaded already, then the result or the error, each one line."""
        try:
            spec, _ = self.parse({"model": self.model_settings(path, device, dtype, *options)})
            if not self.host.is_loaded(spec):  # before the lock: another session's run may hold it
                note = startup_note(dict(spec.options), spec.device, loaded=False)
                yield progress_line(f"loading {spec.describe()}", note)
            with self.host.lock:
                t0 = time.perf_counter()
                engine = self.host.get(spec)
                seconds = time.perf_counter() - t0
        except EngineError as exc:
            yield error_text(inert_markdown(str(exc)))  # it may quote a path or a config.json value
            return
        params = sum(p.numel() for p in engine.model.parameters())
        ahead = startup_note(dict(spec.options), spec.device, loaded=True)  # compiling is left to the first run
        yield f"loaded **{engine.name}** ({params / 1e6:.1f} M parameters) on {spec.device} in {seconds:.1f} s" + (f"; the first run: {ahead}" if ahead else "")

    def model_status(self) -> str:
        d = self.host.default
        if self.host.default_error:
            return error_text(f"default model not loaded: {self.host.default_error}. Load a model below, or load a trace to replay it.")
        state = "loaded" if self.host.is_loaded(d) else "loads on first run"
        return f"default model: `{d.label or d.path}` on {d.device} ({state})"


def _option_update(opt: OfferedOption) -> dict[str, Any]:
    return {"interactive": opt.available, "info": opt.declared.help if opt.available else f"unavailable: {opt.reason}"}


def build(h: ModelHandlers) -> list[gr.components.Component]:
    """The section and its Load button; returns its controls in TabHandlers.settings' order
    (path, device, dtype, the system options)."""
    host = h.host
    with gr.Accordion("Model and system", open=False):
        model_path = gr.Textbox(
            label="model" + (f" (this server offers: {', '.join(host.allowed)})" if host.public else f" folder, hub id or embedded name ({', '.join([*host.embedded, '…'])})"),
            value=host.default.label or host.default.path,
            elem_id="model-path",
        )
        device = gr.Dropdown(devices(), value=host.default.device, label="device", allow_custom_value=True)
        dtype = gr.Dropdown(list(DTYPES), value=host.default.dtype, label="dtype", info="auto: float32 on CPU, bfloat16 on GPUs")
        options = []
        for opt in offered_options(host.default.device, h.allowed_system):
            if opt.kind is bool:
                options.append(gr.Checkbox(label=opt.label, value=opt.declared.off, **_option_update(opt)))
            else:
                options.append(gr.Number(label=opt.label, value=opt.declared.off, precision=0, minimum=1, **_option_update(opt)))
        load_btn = gr.Button("Load model", elem_id="load-btn")
        load_msg = gr.Markdown(elem_id="load-msg")
        gr.Markdown(describe_machine())
        with gr.Accordion("What the system options do", open=False, elem_id="system-explain"):
            gr.Markdown(system_markdown())
    inputs = [model_path, device, dtype, *options]

    def offer(chosen: str) -> list[Any]:
        """What each system option can do on the chosen device (CUDA graphs need CUDA, a degree
        of N on CUDA needs N GPUs); an unknown device leaves the controls as they are."""
        try:
            return [gr.update(**_option_update(opt)) for opt in offered_options(chosen, h.allowed_system)]
        except RuntimeError:  # not a device name: the run's validation says so
            return [gr.update() for _ in options]

    redraw_on([device.change], offer, device, options, **ALONGSIDE)  # the settings check runs on this trigger too
    load_btn.click(h.load_model, inputs, load_msg, api_name="load_model", **ENGINE_QUEUE)
    return inputs
