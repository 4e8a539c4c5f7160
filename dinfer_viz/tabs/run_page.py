"""The Run tab's page: its components (the settings column, the view column) and their events.
The handlers they call are tabs/run.py's `RunHandlers` (its parts: run_settings, replay, run_files);
docs/app.md §2-3 describe its views and controls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from engine import GenerationConfig

from . import server_trace
from ..studies import answers
from ..studies.answers import FAMILY_DESCRIPTIONS, FAMILY_EXAMPLES, OUT_OF_FAMILY_EXAMPLES, model_knows_markdown
from ..panes.explain import explain
from ..panes.export import mp4_unavailable
from ..panes.figures import message_figure
from ..panes.grid import EMPTY_GRID, RASTER_PICK_JS, inert
from ..studies.lessons import LESSONS
from ..panes.readouts import message_readout
from ..sample_traces import shipped_samples
from ..settings import CONSTRAINT, CONSTRAINT_TEXT, all_controls, control_value, decoder_presets, preset_controls, sections
from .common import ALONGSIDE, ENGINE_QUEUE, LATEST, PRIVATE, Stoppable, grid_view, make_control, redraw_on
from .run import DEFAULT_PROMPT, KEEP_TYPED_JS, LIVE_SPEEDS, PICK_HINT, RUN_VIEW, RunHandlers

# The lesson menu sits low in the sidebar, so Gradio opened its list upwards, over Run, and cut
# lesson 8 off at the window's top (at 1024x768 and at 1400x1000). Before the list opens (a capture
# listener runs before the menu's own), the Lessons box is scrolled to the window's top: the list
# then has the room below it and opens there, whole, over the lesson's own controls only.
LESSON_LIST_JS = (
    "() => { const lift = (e) => { const t = e.target;"
    " if (t && t.tagName === 'INPUT' && t.closest('#lesson')) { const box = document.querySelector('#lessons-box'); if (box) box.scrollIntoView({block: 'start'}); } };"
    " document.addEventListener('mousedown', lift, true); document.addEventListener('focusin', lift, true); }"
)
CLICKED = "starting a run…"  # the message from Run's click until the server's first frame
OPEN_SECTIONS = ("Decoder", "Blocks and length", "KV cache", "Structured output")
# Another tab that opens a run here (a sweep's wrong answer) brings the run's message to the top of
# the screen, the grid and the details panel under it: the window kept the other tab's scroll, the
# Run tab's charts. It waits (at most ~2 s of frames) for the tab switch to show the message.
SHOW_RUN_JS = (
    "() => { const go = (frames) => { const m = document.querySelector('#message');"
    " if (m && m.offsetParent !== null) m.scrollIntoView({block: 'start'}); else if (frames > 0) requestAnimationFrame(() => go(frames - 1)); }; go(120); }"
)
# The page's components by name: RUN_VIEW's under theirs, the other ones under what they are
Parts = dict[str, Any]


@dataclass
class RunTab:
    """The Run tab's components the other tabs read or write."""

    prompt: gr.Textbox
    expected: gr.Textbox
    settings_inputs: list[gr.components.Component]  # what TabHandlers.settings maps, in its order
    settings_json: gr.JSON  # the settings collected in the browser, which /run and /sweep receive
    view: list[gr.components.Component]  # RUN_VIEW's components, in its order
    controls: dict[str, gr.components.Component]  # by GenerationConfig field
    explain: gr.Markdown
    engine: Stoppable
    system: list[gr.components.Component]  # the Model and system section's system options
    pinned: gr.State  # the position the details panel shows
    state: gr.State  # the run on display (tabs/shown.py: RunState)
    sections: list[gr.Accordion]  # the settings' sections (settings.sections), in its order


def build(h: RunHandlers, demo: gr.Blocks, model_section: Callable[[], list[gr.components.Component]], header: gr.Markdown) -> RunTab:
    """The Run tab and its events. `model_section` builds the Model and system controls where they
    sit, in the settings column, and returns them in TabHandlers.settings' order; `header`: the
    page's line naming the model of the run on display."""
    defaults = GenerationConfig()
    parts: Parts = {"header": header}
    with gr.Tab("Run", id="run"):
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=300):
                _prompt_box(h, parts)
                _lessons_and_samples(h, parts)
                controls = _settings_controls(defaults, parts)
                model_inputs = model_section()
                with gr.Accordion("Settings JSON (what /run receives)", open=False):
                    parts["settings_json"] = gr.JSON(value=None, elem_id="settings-json")
            with gr.Column(scale=3):
                _view_column(defaults, parts)
        parts["state"] = gr.State(None)
        parts["pinned"] = gr.State(None)  # the position the details panel shows, kept while scrubbing and across runs
        # the response suggested for the prompt, and the one the page last put in the expected box
        # (hidden boxes, not gr.State: KEEP_TYPED_JS reads them in the browser)
        parts["suggestion"] = gr.Textbox("", visible=False, elem_id="expected-suggestion")
        parts["suggested"] = gr.Textbox("", visible=False, elem_id="expected-suggested")
        parts["timer"] = gr.Timer(1 / 6, active=False)

    settings_inputs = [*model_inputs, *(controls[c.field] for c in all_controls())]
    view = [parts[name] for name in RUN_VIEW]
    run_event = _wire_run(h, demo, parts, settings_inputs, view, controls)
    _wire_replay(h, parts, view)
    _wire_lessons(h, demo, parts, controls, settings_inputs)
    _wire_presets(parts, controls)
    h.page_fields = list(controls)
    _wire_files(h, parts, [*view, parts["prompt"], model_inputs[0], *controls.values()])
    _wire_costs(h, parts, settings_inputs)
    system = model_inputs[3:]  # after path, device and dtype (TabHandlers.settings' order)
    return RunTab(
        parts["prompt"], parts["expected"], settings_inputs, parts["settings_json"], view, controls, parts["explain"],
        Stoppable(run_event, parts["stop_btn"], parts["message"]), system, parts["pinned"], parts["state"], parts["sections"],
    )


def _prompt_box(h: RunHandlers, parts: Parts) -> None:
    """The prompt, its expected response and family note, Run and Stop, the live view's speed."""
    parts["prompt"] = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, elem_id="prompt", info=h.limits_text(), max_length=h.max_prompt_chars)
    parts["expected"] = gr.Textbox(
        label="Expected response (optional)",
        value=answers.expected_response(DEFAULT_PROMPT),
        info="filled in for arithmetic prompts (one right answer); committed tokens that differ are struck out",
        elem_id="expected",
    )
    parts["note"] = gr.Markdown(answers.prompt_note(DEFAULT_PROMPT), elem_id="prompt-note")
    with gr.Row():
        parts["run_btn"] = gr.Button("Run", variant="primary", elem_id="run-btn")
        parts["stop_btn"] = gr.Button("Stop", variant="stop", elem_id="stop-btn")
    parts["live_speed"] = gr.Dropdown(
        LIVE_SPEEDS, value=0, label="Live view speed", elem_id="live-speed",
        info="slower than the engine: it finishes first and the view plays the run back (for a class)",
    )
    parts["settings_msg"] = gr.Markdown(elem_id="settings-msg")


def _lessons_and_samples(h: RunHandlers, parts: Parts) -> None:
    """The lessons, the shipped sample traces, the example prompts and what the model knows."""
    with gr.Accordion("Lessons: one setting changed at a time", open=False, elem_id="lessons-box"):
        parts["lesson_menu"] = gr.Dropdown([l.name for l in LESSONS], value=None, label="Lesson", elem_id="lesson")
        with gr.Row():
            parts["lesson_steps"] = gr.Radio([], value=None, label="Step", elem_id="lesson-step", scale=3)
            parts["next_btn"] = gr.Button("Next step ▶", elem_id="lesson-next", scale=1, min_width=100)
        gr.Markdown("Choose a lesson: each step sets the prompt and the settings; press Run after each. The step's sentence shows above the grid.")
    # open by default with no model (app.py --no-model): replaying them is all it can do
    with gr.Accordion("Sample traces (replay with no model)", open=h.no_model, elem_id="samples-box"):
        parts["sample"] = gr.Dropdown(
            [(label, Path(path).name) for label, path in shipped_samples()], value=None, label="Sample traces",
            info="made by the engine on the embedded model: one per decoder and per cache mode", elem_id="samples",
        )
    with gr.Accordion("Examples, by family", open=True, elem_id="examples"):
        for family, prompts in FAMILY_EXAMPLES.items():
            gr.Examples([[p] for p in prompts], inputs=[parts["prompt"]], label=FAMILY_DESCRIPTIONS[family])
        gr.Examples([[p] for p in OUT_OF_FAMILY_EXAMPLES], inputs=[parts["prompt"]], label="outside every family: what low confidence looks like")
    with gr.Accordion("What this model knows", open=False, elem_id="model-knows"):
        gr.Markdown(model_knows_markdown())


def _settings_controls(defaults: GenerationConfig, parts: Parts) -> dict[str, gr.components.Component]:
    """One control per setting, by section (settings.sections), at the engine's defaults; in the
    decoder's section, its published default sets (shown for a decoder that has them)."""
    controls: dict[str, gr.components.Component] = {}
    parts["sections"] = []  # hidden where none of its controls shows (the Decoder's for a kind that takes none)
    for title, ctrls in sections():
        with gr.Accordion(title, open=title in OPEN_SECTIONS) as section:
            parts["sections"].append(section)
            for c in ctrls:
                controls[c.field] = make_control(c, control_value(c, defaults), elem_id=f"cfg-{c.field}")
            if title == "Decoder":
                presets = list(decoder_presets(defaults.decoder))
                parts["preset"] = gr.Dropdown(
                    presets, value=None, label="Published default set", visible=bool(presets), elem_id="decoder-preset",
                    info="fills the decoder's controls with one of its published default sets (the explanation lists them)",
                )
    return controls


def _view_column(defaults: GenerationConfig, parts: Parts) -> None:
    """The message and readout, the grid with the scrubber and the details beside it, the figures,
    and the downloads."""
    # message and readout above the grid's row, at its full width: the grid and the details panel
    # beside it start at the same height (both on a projector's screen)
    parts["message"] = gr.Markdown(elem_id="message")
    parts["readout"] = gr.Markdown(message_readout("no run yet"), elem_id="stats")
    with gr.Row(equal_height=False):
        # narrow enough minimums that at 1024 px the details stay beside the grid
        with gr.Column(scale=3, min_width=380):
            # a lesson step's sentence right above the grid it talks about (in the lessons' accordion
            # it sat a screen below the grid); empty, and so out of the way, until a lesson is chosen
            parts["lesson_note"] = gr.Markdown("", elem_id="lesson-note")
            parts["grid"] = grid_view(EMPTY_GRID, "grid", 120, extra_js=RASTER_PICK_JS)
            parts["text"] = gr.Textbox(label="Output text", interactive=False, lines=2, elem_id="output")
            # the scrubber on a line of its own, playback under it: one row of all four wraps into
            # three in a projector's column, pushing the raster off the screen
            parts["scrub"] = gr.Slider(0, 1, value=0, step=1, label="iteration (0 = before the first forward)", interactive=False, elem_id="scrub")
            with gr.Row(equal_height=True):
                parts["play_btn"] = gr.Button("▶ Play", elem_id="play-btn", scale=0, min_width=100)
                parts["pause_btn"] = gr.Button("Pause", elem_id="pause-btn", scale=0, min_width=80)
                parts["skip_btn"] = gr.Button("⇥ End", elem_id="skip-btn", scale=0, min_width=100)
                parts["speed"] = gr.Slider(1, 30, value=6, step=1, label="iterations/s", scale=1, min_width=160)
        # the details panel alone beside the grid: it grows with no scroll of its own (dinfer_viz/ui.py)
        with gr.Column(scale=2, min_width=240):
            parts["details"] = gr.HTML(f'<div class="pos-details">{inert(PICK_HINT)}</div>', label="Position details", elem_id="details")
    _figures(parts, defaults)
    with gr.Row():
        parts["download"] = gr.DownloadButton("Download trace (JSON)", value=None, elem_id="download")
        parts["upload"] = gr.UploadButton("Load a trace (JSON)", file_types=[".json"], elem_id="upload")
        parts["gif_btn"] = gr.Button("Download animation (GIF)", elem_id="export-gif")
        no_mp4 = mp4_unavailable()
        parts["mp4_btn"] = gr.Button("Download MP4", elem_id="export-mp4", interactive=no_mp4 is None)
    if no_mp4:  # a gr.Button has no info line: the reason sits under the row
        gr.Markdown(f"<small>{no_mp4}</small>", elem_id="mp4-note")
    parts["export_file"] = gr.File(label="animation", visible=False, interactive=False, elem_id="export-file")
    server_trace.add_box(parts)


def _figures(parts: Parts, defaults: GenerationConfig) -> None:
    """The run's figures with the explanation of the settings under the first row, and the
    forward-cost measurement."""
    with gr.Row(equal_height=False):
        parts["raster"] = gr.Plot(message_figure("run something, or load a trace", 360), label="Raster: iteration × position (its colour bar names what it shows: confidence, or a uniform-state run's entropy)", elem_id="raster")
        parts["iterations"] = gr.Plot(message_figure("", 380), label="Per iteration: what each step did, its rule's parameters, engine time", elem_id="iterations")
    # under the first figures, at the row's full width and whole, with no box of its own: a 200 px
    # box beside the details cut it mid-sentence, and under the playback controls its 600 px at
    # 1024 px pushed the raster a screen below the grid
    parts["explain"] = gr.Markdown(explain(defaults.decoder, defaults.cache), elem_id="explain")
    parts["cost"] = gr.Plot(message_figure("", 340), label="Per iteration cost in ms: where each iteration's time went", elem_id="cost")
    parts["extras"] = gr.Plot(message_figure("", 220), label="Extras: credit, staleness, anchors (drawn when a run ends)", elem_id="extras")
    parts["cache_states"] = gr.Plot(
        label="K/V cache state: iteration × position (drawn when a run ends; runs with a cache)", elem_id="cache-states", visible=False
    )
    with gr.Accordion("What a forward costs", open=False, elem_id="forward-costs-box"):
        gr.Markdown(
            "Times one forward of each kind (full, refresh, prefix, dual, window) on the Run tab's model at several canvas "
            "lengths: a cache pays only where its forwards are cheaper than a full one. Takes a few seconds; it waits for the engine."
        )
        parts["costs_btn"] = gr.Button("Measure forward costs", elem_id="forward-costs-btn")
        parts["costs_msg"] = gr.Markdown(elem_id="forward-costs-msg")
        parts["costs_plot"] = gr.Plot(label="Cost per forward kind against canvas length", elem_id="forward-costs")


def _wire_run(h: RunHandlers, demo: gr.Blocks, p: Parts, settings_inputs: list[Any], view: list[Any], controls: dict[str, Any]) -> Any:
    """The settings check, the expected box's suggestion, and Run; returns the run's event."""
    # the prompt too: the model's max_sequence_length holds prompt and generation together
    page = [p["prompt"], *settings_inputs]
    # as the page loads and changes: the settings check, and the lesson sentence (a step's settings
    # changed by hand are no longer the step's), as one event (LATEST: one such event per trigger);
    # the lesson's step too, since a step's controls can change (and be read) before its step box
    # does, and the sentence read from them then named the step before as changed
    lesson = [p["lesson_menu"], p["lesson_steps"]]
    checked = ([*lesson, *page], [p["settings_msg"], p["run_btn"], p["prompt"], p["lesson_note"]])
    redraw_on([demo.load, *(c.change for c in [*page, *lesson])], h.page_changed, *checked, **LATEST)
    # the decoder box follows the model's kind (a uniform-state model runs its own sampler)
    redraw_on([settings_inputs[0].change, controls["kind"].change], h.fitted_decoder, settings_inputs, controls["decoder"], **ALONGSIDE)
    # the constraint too: an answer it cannot write is no answer to compare with (suggest_expected)
    constraint = [p["prompt"], controls[CONSTRAINT], controls[CONSTRAINT_TEXT]]
    redraw_on([c.change for c in constraint], h.suggest_expected, constraint, [p["suggestion"], p["note"]], **ALONGSIDE).then(
        None, [p["suggestion"], p["expected"], p["suggested"]], [p["expected"], p["suggested"]], js=KEEP_TYPED_JS, **PRIVATE
    )
    collect = p["run_btn"].click(None, settings_inputs, p["settings_json"], js=h.settings_js(), **PRIVATE)
    # the previous run's message (its verdict) leaves at the click, in the browser: the server's own
    # "starting" line comes a round trip later, seconds under load
    p["run_btn"].click(None, None, p["message"], js=f"() => {json.dumps(CLICKED)}", **PRIVATE)
    # Progress (queue position, elapsed time) on the message only: the live grid says where the
    # run is, and a timer over each of the eleven outputs is noise. Runs do not queue on "engine":
    # up to a batch of them at once wait for the engine in the RunBatcher, which is where runs of
    # different sessions join one batch (Gradio's one-at-a-time queue would hand it one run at a time).
    return collect.then(
        h.run, [p["prompt"], p["settings_json"], p["expected"], p["live_speed"], p["pinned"]], view, api_name="run",
        show_progress="minimal", show_progress_on=p["message"], concurrency_id="runs", concurrency_limit=h.batcher.max_batch,
    )


def _wire_replay(h: RunHandlers, p: Parts, view: list[Any]) -> None:
    """The scrubber, a click on the grid or the raster, and playback."""
    scrub, state, pinned, timer = p["scrub"], p["state"], p["pinned"], p["timer"]
    # preprocess=False: the handler takes the slider's raw value, so a non-number from the API is its
    # one-line message, not Gradio's generic error from the slider's own check
    scrub.release(h.replay, [scrub, state, pinned], view, api_name="replay", show_progress="hidden", preprocess=False)
    redraw_on([scrub.input], h.glance, [scrub, state, pinned], [p["grid"], p["text"], p["details"]], trigger_mode="always_last", show_progress="hidden", api_visibility="private")
    p["grid"].select(h.pick, [scrub, state], [*view, pinned], show_progress="hidden", api_visibility="private")
    # playback, apart from the engine: a live run's view pauses, resumes (Play) and skips to the end
    # while the engine runs on or is already free; a replay's timer likewise
    p["play_btn"].click(h.play, [scrub, state], [scrub, timer], **PRIVATE)
    p["pause_btn"].click(h.pause, state, [p["message"], timer], **PRIVATE)
    p["skip_btn"].click(h.skip_to_end, [state, pinned], [*view, timer], **PRIVATE)
    redraw_on([p["speed"].change], lambda v: gr.Timer(value=1 / max(float(v), 1.0)), p["speed"], timer, **LATEST)
    timer.tick(h.step, [scrub, state, pinned], [scrub, p["grid"], p["text"], p["details"], timer], api_visibility="private")


def _wire_lessons(h: RunHandlers, demo: gr.Blocks, p: Parts, controls: dict[str, gr.components.Component], settings_inputs: list[Any]) -> None:
    """A lesson's step sets the prompt, every control (their change events check the settings
    and show the step's controls) and, when it names one, the model; .input: only the user's
    choices, never the handler's own updates. The lesson list opens below its box (LESSON_LIST_JS)."""
    demo.load(None, js=LESSON_LIST_JS, **PRIVATE)
    menu, steps = p["lesson_menu"], p["lesson_steps"]
    lesson_out = [steps, p["prompt"], p["lesson_note"], *(controls[c.field] for c in all_controls()), settings_inputs[0]]
    menu.input(lambda name: h.lesson_step(name, 0), menu, lesson_out, **PRIVATE)
    steps.input(h.lesson_step, [menu, steps], lesson_out, **PRIVATE)
    p["next_btn"].click(lambda name, step: h.lesson_step(name, (step if isinstance(step, int) else -1) + 1), [menu, steps], lesson_out, **PRIVATE)


def _wire_presets(p: Parts, controls: dict[str, gr.components.Component]) -> None:
    """The decoder's presets follow the decoder; choosing one fills the controls it sets."""
    preset, decoder = p["preset"], controls["decoder"]

    def offer(name: str) -> Any:
        presets = list(decoder_presets(name))
        return gr.update(choices=presets, value=None, visible=bool(presets))

    def fill(name: str, chosen: str | None) -> tuple:
        values = preset_controls(name, chosen) if chosen in decoder_presets(name) else {}
        return tuple(values.get(c.field, gr.skip()) for c in all_controls())

    redraw_on([decoder.change], offer, decoder, preset, **ALONGSIDE)
    preset.input(fill, [decoder, preset], [controls[c.field] for c in all_controls()], **PRIVATE)


def _wire_costs(h: RunHandlers, p: Parts, settings_inputs: list[Any]) -> None:
    """The forward-cost measurement."""
    p["costs_btn"].click(
        h.forward_costs, settings_inputs, [p["costs_plot"], p["costs_msg"]], show_progress="minimal", show_progress_on=p["costs_msg"], api_visibility="private", **ENGINE_QUEUE
    )


def _wire_files(h: RunHandlers, p: Parts, loaded: list[Any]) -> None:
    """Loading a trace or a sample (`loaded`: `h.loaded_slots`' components: the view, then the boxes a
    trace fills), and the exports."""
    p["upload"].upload(lambda file: h.load_trace(file), p["upload"], loaded, api_name="load_trace")
    p["sample"].input(h.load_sample, p["sample"], loaded, api_name="load_sample")
    server_trace.wire(h, p, loaded)
    # The file box shows once it holds a file (an API client gets the plain path: no update dict)
    export_file, message = p["export_file"], p["message"]
    reveal = dict(fn=lambda f: gr.update(visible=f is not None), inputs=export_file, outputs=export_file, **PRIVATE)
    p["gif_btn"].click(h.export_gif, p["state"], [export_file, message], api_name="export_gif", show_progress="minimal", show_progress_on=message).then(**reveal)
    p["mp4_btn"].click(h.export_mp4, p["state"], [export_file, message], api_name="export_mp4", show_progress="minimal", show_progress_on=message).then(**reveal)


def wire_structure(h: RunHandlers, demo: gr.Blocks, tab: RunTab, parameter: gr.components.Component) -> None:
    """Kind, decoder, cache mode and features decide which controls show, the explanation, and the
    setting the Sweep tab varies (`parameter`, hence wired once that tab exists); the system
    options add their paragraphs to the explanation."""
    choice = [tab.controls["decoder"], tab.controls["cache"], tab.controls["smoothing"], tab.controls["unroll"], tab.controls["kind"]]
    inputs = [*choice, *tab.system]
    changed = [*(tab.controls[c.field] for c in all_controls()), tab.explain, parameter, *tab.sections]
    redraw_on([demo.load, *(c.change for c in choice)], h.structure, inputs, changed, **ALONGSIDE)
    # a system option changes the explanation only (structure would also reset the sweep's setting)
    redraw_on([c.change for c in tab.system], h.explanation, inputs, tab.explain, **ALONGSIDE)
