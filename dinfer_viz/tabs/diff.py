"""The Diff & analysis tab (issue #36): how autoregressive the run on display is (engine/analysis.py
drawn by dinfer_viz/panes/analysis_figure.py), and two runs of one prompt diffed step by step on one
slider (engine/trace_diff.py drawn by dinfer_viz/panes/diff_view.py): two uploaded trace files, or the
run on display against its reference library's own run recorded here (engine/reference.py:
transformers' DiffusionGemma `generate` for a uniform-state model, diffusers' `LLaDA2Pipeline` for
an LLaDA2 one). docs/app.md §2 ("Diff & analysis"), docs/analysis.md.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import gradio as gr

from engine import EngineError, GenerationConfig, Trace
from engine.arguments import read_text_file
from engine.trace import MAX_TRACE_BYTES
from engine.analysis import analyze
from engine.reference import check_settings, record_diffusers, record_transformers, reference_of_kind

from ..panes.analysis_figure import analysis_text, order_figure, per_step_figure
from ..panes.diff_view import DiffState, diff_figure, diff_state, diff_strip, divergence_card, summary_text
from ..drawing.figure_base import message_figure
from ..panes.grid import inert
from ..panes.readouts import plural
from .common import ENGINE_QUEUE, LATEST, PRIVATE, TabHandlers, error_text, guarded, outputs, redraw_on
from .run_page import RunTab
from .shown import LIVE, RunState

ANALYSIS_VIEW = ("analysis_text", "analysis_steps", "analysis_order")
DIFF_VIEW = ("summary", "strip", "first", "chart", "scrub", "diff_state", "message", "reference", "reference_file")
STEP_VIEW = ("strip", "chart")
INTRO = (
    "**How autoregressive is this decoder?** The analysis of the run on display (the Run tab's): per step, how much of the answer is "
    "already final and how far the step's beliefs are from it (KL), and in which order the positions settled. **Diff two runs** of one "
    "prompt step by step: two trace files, or the run on display against its reference library's own run, recorded here "
    "(transformers' DiffusionGemma `generate` for a uniform-state model such as `tiny-gemma`, diffusers' `LLaDA2Pipeline` for an LLaDA2 one)."
)


def reference_config(trace: Trace) -> GenerationConfig:
    """The settings a trace was made with, as a GenerationConfig (a reference trace's note left out)."""
    config = {k: v for k, v in (trace.config or {}).items() if k != "reference"}
    try:
        return GenerationConfig.from_dict(config)
    except (TypeError, ValueError) as exc:
        raise EngineError(f"the run's settings cannot be read: {exc}") from None


def read_trace(file: Any, side: str) -> tuple[Trace, str]:
    """(an uploaded trace file, its name), or EngineError in one line naming the side."""
    name = Path(getattr(file, "name", file)).name
    try:
        return Trace.from_json(read_text_file(getattr(file, "name", file), "the trace", MAX_TRACE_BYTES)), name
    except (EngineError, OSError, UnicodeDecodeError, ValueError) as exc:
        raise EngineError(f"cannot load trace {side} ({name}): {exc}") from None


def diff_view(state: DiffState, message: str, reference: Any = None, reference_file: Any = None) -> dict[str, Any]:
    """Every slot of the diff, shown at its first divergence (else its first step)."""
    at = state.diff.first.step if state.diff.first is not None else 0
    return {
        "summary": summary_text(state), "strip": diff_strip(state, at), "first": divergence_card(state), "chart": diff_figure(state, at),
        "scrub": gr.update(minimum=1, maximum=max(state.count, 1), value=at + 1, interactive=state.count > 1), "diff_state": state,
        "message": message, "reference": gr.skip() if reference is None else reference, "reference_file": gr.skip() if reference_file is None else reference_file,
    }


class DiffHandlers(TabHandlers):
    """The Diff & analysis tab's events."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reference_models: dict[str, Any] = {}  # "folder@device" -> the reference library's own model (one kept)

    def analyse(self, shown: RunState | None) -> tuple:
        """The analysis panel for the run on display (ANALYSIS_VIEW)."""
        if shown is None or not shown.timeline.iterations:
            blank = message_figure("no run on display: run something or load a trace in the Run tab", 340)
            return outputs(ANALYSIS_VIEW, {"analysis_text": "no run on display yet", "analysis_steps": blank, "analysis_order": message_figure("", 340)})
        tl = shown.timeline
        result = analyze(tl.trace, tl.row)
        return outputs(ANALYSIS_VIEW, {"analysis_text": analysis_text(tl, result), "analysis_steps": per_step_figure(tl, result), "analysis_order": order_figure(tl, result)})

    @guarded(DIFF_VIEW)
    def diff(self, file_a: Any, file_b: Any, shown: RunState | None, reference: Trace | None) -> tuple:
        """Diff trace A (an uploaded file; none: the run on display) with trace B (an uploaded
        file; none: the reference recorded here)."""
        try:
            a, label_a = read_trace(file_a, "A") if file_a else self._shown_trace(shown)
            if file_b:
                b, label_b = read_trace(file_b, "B")
            elif reference is not None:
                b, label_b = reference, reference_label(reference)
            else:
                raise EngineError("no trace B: upload one, or record the reference of the run on display")
            state = diff_state(a, b, (label_a, label_b))
        except EngineError as exc:
            return outputs(DIFF_VIEW, {"message": error_text(inert(str(exc)))})
        return outputs(DIFF_VIEW, diff_view(state, f"diffed {plural(state.count, 'aligned step')}"))

    @guarded(DIFF_VIEW)
    def record(self, shown: RunState | None, model: str) -> tuple:
        """Record the reference library's own run of the run on display's prompt and settings
        (its prompt ids exactly, so both start from one canvas) on `model` (empty: the run's own
        model, by the name its trace gives), then diff the run on display against it."""
        try:
            ours, label = self._shown_trace(shown)
            recorded = self._record(ours, (model or "").strip() or ours.model)
            state = diff_state(ours, recorded, (label, reference_label(recorded)))
        except EngineError as exc:
            return outputs(DIFF_VIEW, {"message": error_text(inert(str(exc)))})
        file = self.write_file(f"reference-{recorded.model or 'model'}", ".json", recorded.to_json())
        note = recorded.config["reference"]
        message = f"recorded {inert(note['library'])} {inert(str(note['version']))}'s own run ({plural(len(recorded.iterations), 'step')}) and diffed the run on display against it"
        return outputs(DIFF_VIEW, diff_view(state, message, reference=recorded, reference_file=file))

    def diff_step(self, step: float, state: DiffState | None) -> tuple:
        """The slider: both canvases at aligned step `step` (1-based), marked on the chart."""
        if state is None:
            return outputs(STEP_VIEW, {})
        at = max(0, min(int(step) - 1, state.count - 1))
        return outputs(STEP_VIEW, {"strip": diff_strip(state, at), "chart": diff_figure(state, at)})

    def _shown_trace(self, shown: RunState | None) -> tuple[Trace, str]:
        if shown is None:
            raise EngineError("no run on display: run something or load a trace in the Run tab first")
        if shown.status == LIVE:  # its trace is still growing: a diff of it would be of no run
            raise EngineError("the run on display is still running: wait for it to end (or Stop it)")
        trace = shown.timeline.trace
        return trace, f"run on display ({trace.model or 'unnamed model'})"

    def _record(self, ours: Trace, model: str) -> Trace:
        """The reference's run of `ours`' prompt (its row 0) and settings on the model `model`
        names (an embedded name, a folder; public mode: the allow-list), under the engine's lock."""
        path, label = self.host.resolve(model)
        spec = replace(self.host.default, path=path, label=label, options=())
        reference = reference_of_kind(ours.kind)  # the run's kind (its header), not the model's own
        if reference is None:
            raise EngineError(f"no reference library runs {ours.kind} diffusion")
        config = reference_config(ours)
        check_settings(reference, config)
        prompt = list(ours.initial[0][: ours.prompt_lengths[0]])
        name = label or Path(path).name
        with self.host.lock:
            engine = self.host.get(spec)  # the tokenizer's strings; diffusers' network is the engine's own
            if reference == "transformers":
                return record_transformers(self._transformers_model(path, spec.device), prompt, config, stop_ids=ours.eos_ids, pad_id=ours.mask_id, token_strings=engine.token_strings, name=name)
            return record_diffusers(engine.model, prompt, config, stop_ids=ours.eos_ids, token_strings=engine.token_strings, name=name)

    def _transformers_model(self, path: str, device: str) -> Any:
        """transformers' own DiffusionGemmaForBlockDiffusion for `path`, loaded by transformers
        (the engine's copy wraps only its network); the last one is kept, under the host's lock."""
        from transformers import DiffusionGemmaForBlockDiffusion

        models = self._reference_models
        key = f"{path}@{device}"
        if key not in models:
            models.clear()  # one reference model at a time: an 8B checkpoint twice would not fit
            try:
                models[key] = DiffusionGemmaForBlockDiffusion.from_pretrained(path, attn_implementation="eager").to(device).eval()
            except (OSError, ValueError) as exc:
                raise EngineError(f"transformers cannot load {Path(path).name} as a DiffusionGemma: {str(exc).splitlines()[0]}") from None
        return models[key]


def reference_label(trace: Trace) -> str:
    """A reference trace's name on the page: its library and model."""
    note = (trace.config or {}).get("reference") or {}
    return f"{note.get('library', 'reference')} reference ({trace.model or 'unnamed model'})"


def build(h: DiffHandlers, run: RunTab) -> None:
    """The Diff & analysis tab and its events; it reads the Run tab's run on display (`run.state`)."""
    with gr.Tab("Diff & analysis", id="diff") as tab:
        gr.Markdown(INTRO)
        with gr.Accordion("How autoregressive is this decoder? (the run on display)", open=True, elem_id="analysis-box"):
            analyse_btn = gr.Button("Analyse the run on display", elem_id="analyse-btn")
            slots: dict[str, Any] = {"analysis_text": gr.Markdown("open this tab or press the button to analyse the run on display", elem_id="analysis-text")}
            with gr.Row(equal_height=False):
                slots["analysis_steps"] = gr.Plot(message_figure("", 340), label="Per step: finalized fraction, gate and mean confidence, KL to the final answer", elem_id="analysis-steps")
                slots["analysis_order"] = gr.Plot(message_figure("", 340), label="Finalisation order: position against the iteration it became final", elem_id="analysis-order")
        gr.Markdown("### Diff two runs of one prompt")
        with gr.Row(equal_height=False):
            file_a = gr.File(label="trace A (empty: the run on display)", file_types=[".json"], elem_id="diff-file-a", height=120)
            file_b = gr.File(label="trace B (empty: the reference recorded here)", file_types=[".json"], elem_id="diff-file-b", height=120)
            with gr.Column(min_width=260):
                model = gr.Textbox(label="reference model (empty: the run's own)", elem_id="reference-model", max_lines=1)
                record_btn = gr.Button("Record the reference of the run on display", variant="primary", elem_id="record-reference")
                diff_btn = gr.Button("Diff A and B", elem_id="diff-btn")
        slots["message"] = gr.Markdown(elem_id="diff-message")
        slots["summary"] = gr.Markdown(elem_id="diff-summary")
        slots["scrub"] = gr.Slider(1, 2, value=1, step=1, label="aligned step (both runs; a side with fewer steps in a block holds its last canvas)", interactive=False, elem_id="diff-scrub")
        slots["strip"] = gr.HTML(elem_id="diff-strip")
        slots["first"] = gr.HTML(elem_id="diff-first-box")
        slots["chart"] = gr.Plot(message_figure("no diff yet", 280), label="Positions where the two canvases differ, per aligned step", elem_id="diff-chart")
        slots["reference_file"] = gr.DownloadButton("Download the reference trace (JSON)", value=None, elem_id="reference-download")
        slots["diff_state"] = gr.State(None)
        slots["reference"] = gr.State(None)  # the reference trace recorded in this session

    analysis = dict(fn=h.analyse, inputs=run.state, outputs=[slots[n] for n in ANALYSIS_VIEW], api_visibility="private")
    tab.select(**analysis)
    analyse_btn.click(**analysis)
    view = [slots[n] for n in DIFF_VIEW]
    record_btn.click(h.record, [run.state, model], view, api_name="record_reference", show_progress="minimal", show_progress_on=slots["message"], **ENGINE_QUEUE)
    diff_btn.click(h.diff, [file_a, file_b, run.state, slots["reference"]], view, api_name="diff", show_progress="minimal", show_progress_on=slots["message"])
    redraw_on([slots["scrub"].change], h.diff_step, [slots["scrub"], slots["diff_state"]], [slots[n] for n in STEP_VIEW], **LATEST)
