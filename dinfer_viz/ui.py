"""The Gradio layout and its event wiring; what the events do lives in handlers.py.

Public API endpoints (gradio_client, `api_name`): /run, /replay, /load_trace, /load_model,
/compare, /compare_replay, /sweep. Runs, comparisons, sweeps and model loads share the queue
concurrency id "engine" with limit 1: one at a time on the shared engine, the rest wait in line.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from engine import GenerationConfig

from .answers import FAMILY_DESCRIPTIONS, FAMILY_EXAMPLES, OUT_OF_FAMILY_EXAMPLES, expected_response, model_knows_markdown, prompt_note
from .explain import explain
from .grid import EMPTY_GRID, GRID_CSS, GRID_TEMPLATE
from .handlers import COMPARE_FIELDS, COMPARE_VIEW, FAILURE_HEADERS, RUN_VIEW, SWEEP_TABLE_HEADERS, SWEEP_VIEW, Handlers, empty_run_view
from .host import DTYPES
from .readouts import message_readout
from .sweep import prompt_sets
from .settings import Control, all_controls, control_value, numeric_fields, sections, sweep_setting
from .system import describe_machine, devices, system_options

# Pair-sum: the first forward cannot commit the digits (a is uniform among N's splits), so the
# threshold decoder forces one, and the rest follows over several iterations
DEFAULT_PROMPT = FAMILY_EXAMPLES["pairsum"][0]
OPEN_SECTIONS = ("Decoder", "Blocks and length", "KV cache")
SWEEP_DEFAULT_SETS = ("pairsum",)
SWEEP_DEFAULT_VALUES = "0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.95"
COMPARE_DEFAULTS = ({"decoder": "fixed", "cache": "none"}, {"decoder": "threshold", "cache": "dual"})


def make_control(c: Control, value: Any, show_info: bool = True, **kw: Any) -> gr.components.Component:
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
    return gr.Textbox(**common)


# The largest trace the app writes (1024 generated positions in one block, the fixed decoder: one
# record per position) measured 12.5 MB; the cap leaves room for a longer prompt.
MAX_UPLOAD = "32mb"


def launch_kwargs(max_upload: str = MAX_UPLOAD) -> dict[str, Any]:
    """The theme goes to launch() in Gradio 6 (Blocks(theme=) is deprecated). Gradio's run history
    would store every run's outputs (plots, grids) in the browser: the trace download does that job.
    Uploads (trace files) are capped at `max_upload`."""
    return {"theme": gr.themes.Soft(primary_hue="blue"), "run_history": False, "max_file_size": max_upload}


def build_demo(handlers: Handlers) -> gr.Blocks:
    defaults = GenerationConfig()
    # Gradio's cached copies of downloads and uploads: swept every 30 min, kept 2 h
    with gr.Blocks(title="dinfer-viz", delete_cache=(1800, 7200)) as demo:
        gr.Markdown("## dinfer-viz · watch a masked-diffusion LM decode, one iteration at a time")
        gr.Markdown(handlers.model_status(), elem_id="model-status")
        with gr.Tabs() as tabs:
            # ---- Run -----------------------------------------------------------------------------
            with gr.Tab("Run", id="run"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=330):
                        prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, elem_id="prompt", info=handlers.limits_text(), max_length=handlers.max_prompt_chars)
                        expected = gr.Textbox(
                            label="Expected response (optional)",
                            value=expected_response(DEFAULT_PROMPT),
                            info="filled in for arithmetic prompts (one right answer); committed tokens that differ are struck out",
                            elem_id="expected",
                        )
                        note = gr.Markdown(prompt_note(DEFAULT_PROMPT), elem_id="prompt-note")
                        with gr.Row():
                            run_btn = gr.Button("Run", variant="primary", elem_id="run-btn")
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                        settings_msg = gr.Markdown(elem_id="settings-msg")
                        with gr.Accordion("Examples, by family", open=True, elem_id="examples"):
                            for family, prompts in FAMILY_EXAMPLES.items():
                                gr.Examples([[p] for p in prompts], inputs=[prompt], label=FAMILY_DESCRIPTIONS[family])
                            gr.Examples([[p] for p in OUT_OF_FAMILY_EXAMPLES], inputs=[prompt], label="outside every family: what low confidence looks like")
                        with gr.Accordion("What this model knows", open=False, elem_id="model-knows"):
                            gr.Markdown(model_knows_markdown())
                        controls: dict[str, gr.components.Component] = {}
                        for title, ctrls in sections():
                            with gr.Accordion(title, open=title in OPEN_SECTIONS):
                                for c in ctrls:
                                    controls[c.field] = make_control(c, control_value(c, defaults), elem_id=f"cfg-{c.field}")
                        with gr.Accordion("Model and system", open=False):
                            model_path = gr.Textbox(
                                label="model" + (f" (this server offers: {', '.join(handlers.host.allowed)})" if handlers.host.public else " folder or hub id"),
                                value=handlers.host.default.label or handlers.host.default.path,
                                elem_id="model-path",
                            )
                            device = gr.Dropdown(devices(), value=handlers.host.default.device, label="device", allow_custom_value=True)
                            dtype = gr.Dropdown(list(DTYPES), value=handlers.host.default.dtype, label="dtype", info="auto: float32 on CPU, bfloat16 on GPUs")
                            options = []
                            for opt in system_options():
                                info = None if opt.available else f"unavailable: {opt.reason}"
                                if opt.kind is bool:
                                    options.append(gr.Checkbox(label=opt.label, value=False, interactive=opt.available, info=info))
                                else:
                                    options.append(gr.Number(label=opt.label, value=1, precision=0, minimum=1, interactive=opt.available, info=info))
                            load_btn = gr.Button("Load model")
                            load_msg = gr.Markdown()
                            gr.Markdown(describe_machine())
                        with gr.Accordion("Settings JSON (what /run receives)", open=False):
                            settings_json = gr.JSON(value=None, elem_id="settings-json")
                    with gr.Column(scale=3):
                        with gr.Row(equal_height=False):
                            with gr.Column(scale=3, min_width=420):
                                message = gr.Markdown(elem_id="message")
                                readout_md = gr.Markdown(message_readout("no run yet"), elem_id="stats")
                                grid = gr.HTML(EMPTY_GRID, html_template=GRID_TEMPLATE, css_template=GRID_CSS, elem_id="grid", min_height=120)
                                text_out = gr.Textbox(label="Output text", interactive=False, lines=2, elem_id="output")
                                with gr.Row(equal_height=False):
                                    scrub = gr.Slider(-1, 0, value=0, step=1, label="iteration", interactive=False, elem_id="scrub", scale=5)
                                    play_btn = gr.Button("▶ Play", elem_id="play-btn", scale=0, min_width=90)
                                    pause_btn = gr.Button("Pause", elem_id="pause-btn", scale=0, min_width=90)
                                    speed = gr.Slider(1, 30, value=6, step=1, label="iterations / s", scale=1)
                            with gr.Column(scale=1, min_width=240):
                                explain_md = gr.Markdown(explain(defaults.decoder, defaults.cache), elem_id="explain")
                        empty = empty_run_view()
                        with gr.Row(equal_height=False):
                            raster = gr.Plot(empty["raster"], label="Confidence raster: iteration × position", elem_id="raster")
                            iterations = gr.Plot(empty["iterations"], label="Per iteration: commits, threshold, engine time", elem_id="iterations")
                        extras = gr.Plot(empty["extras"], label="Extras: credit, staleness, anchors (drawn when a run ends)", elem_id="extras")
                        with gr.Row():
                            download = gr.DownloadButton("Download trace (JSON)", value=None, elem_id="download")
                            upload = gr.UploadButton("Load a trace (JSON)", file_types=[".json"], elem_id="upload")
                run_state = gr.State(None)
                timer = gr.Timer(1 / 6, active=False)

            # ---- Compare -------------------------------------------------------------------------
            with gr.Tab("Compare", id="compare"):
                gr.Markdown(
                    "Runs **A**, then **B**, on the Run tab's prompt, each with the Run tab's settings changed as below "
                    "(one device: the runs never overlap, so each speed is its own)."
                )
                with gr.Row():
                    compare_btn = gr.Button("Compare", variant="primary", elem_id="compare-btn")
                    compare_stop = gr.Button("Stop", variant="stop")
                compare_msg = gr.Markdown()
                side_controls: list[list[gr.components.Component]] = []
                side_views: list[tuple] = []
                by_field = {c.field: c for c in all_controls()}
                with gr.Row(equal_height=False):
                    for side, overrides in zip("AB", COMPARE_DEFAULTS):
                        with gr.Column():
                            gr.Markdown(f"### {side}")
                            comps = []
                            for row in (COMPARE_FIELDS[:3], COMPARE_FIELDS[3:]):
                                with gr.Row():
                                    comps += [make_control(by_field[f], overrides.get(f, control_value(by_field[f], defaults)), show_info=False, min_width=140) for f in row]
                            side_controls.append(comps)
                            readout_x = gr.Markdown(message_readout("not run yet"), elem_id=f"stats-{side.lower()}")
                            grid_x = gr.HTML(EMPTY_GRID, html_template=GRID_TEMPLATE, css_template=GRID_CSS, elem_id=f"grid-{side.lower()}", min_height=100)
                            text_x = gr.Textbox(label=f"{side} output", interactive=False, elem_id=f"output-{side.lower()}")
                            side_views.append((grid_x, readout_x, text_x))
                compare_scrub = gr.Slider(-1, 0, value=0, step=1, label="iteration (both runs)", interactive=False)
                compare_chart = gr.Plot(label="A against B", elem_id="compare-chart")
                with gr.Accordion("Settings JSON of A and B (what /compare receives)", open=False):
                    settings_a = gr.JSON(value=None)
                    settings_b = gr.JSON(value=None)
                compare_state = gr.State(None)

            # ---- Sweep ---------------------------------------------------------------------------
            with gr.Tab("Threshold sweep", id="sweep"):
                gr.Markdown(
                    "Runs held-out prompts of the embedded model's task families (never trained on; each answer judged by "
                    "its family's verifier) at each value, with the Run tab's other settings, one prompt at a time. "
                    "Pair-sum shows the trade-off: a low threshold commits dependent digits in one forward and breaks the sum. "
                    "Click a wrong answer to open its trace at the first wrong commit."
                )
                with gr.Row():
                    sweep_tasks = gr.CheckboxGroup(prompt_sets(), value=list(SWEEP_DEFAULT_SETS), label="prompt sets (held-out prompts of each family; arithmetic out of range)")
                    per_task = gr.Number(24, precision=0, minimum=1, label="prompts per set")
                    parameter = gr.Dropdown(numeric_fields(), value=sweep_setting(defaults.decoder), label="setting to sweep", info="set by the decoder's declaration; any numeric setting")
                    values = gr.Textbox(SWEEP_DEFAULT_VALUES, label="values")
                own_prompts = gr.Textbox(label="your own prompts (optional; one a line, each from a family)", lines=2, elem_id="sweep-own")
                with gr.Row():
                    sweep_btn = gr.Button("Sweep", variant="primary", elem_id="sweep-btn")
                    sweep_stop = gr.Button("Stop", variant="stop")
                sweep_msg = gr.Markdown()
                with gr.Row(equal_height=False):
                    sweep_chart = gr.Plot(label="accuracy against tokens per forward", elem_id="sweep-chart")
                    sweep_table = gr.Dataframe(headers=SWEEP_TABLE_HEADERS, label="per value", interactive=False)
                sweep_csv = gr.DownloadButton("Download the table (CSV)", value=None, elem_id="sweep-csv")
                failures = gr.Dataframe(headers=FAILURE_HEADERS, label="wrong answers (click a row to inspect it)", interactive=False, wrap=True)
                sweep_state = gr.State(None)

        # ---- wiring ----------------------------------------------------------------------------------
        config_controls = [controls[c.field] for c in all_controls()]
        settings_inputs = [model_path, device, dtype, *options, *config_controls]
        run_outputs = dict(
            grid=grid, readout=readout_md, text=text_out, raster=raster, iterations=iterations, extras=extras,
            scrub=scrub, download=download, message=message, state=run_state, explain=explain_md,
        )
        run_view = [run_outputs[name] for name in RUN_VIEW]
        engine_queue = dict(concurrency_id="engine", concurrency_limit=1)
        private = dict(api_visibility="private", queue=False, show_progress="hidden")

        gr.on(
            [c.change for c in settings_inputs], handlers.check, settings_inputs, [settings_msg, run_btn], **private
        )
        structure_inputs = [controls["decoder"], controls["cache"], controls["smoothing"], controls["unroll"]]
        structure_outputs = [*config_controls, explain_md, parameter]
        gr.on([c.change for c in structure_inputs], handlers.structure, structure_inputs, structure_outputs, **private)
        demo.load(handlers.structure, structure_inputs, structure_outputs, **private)
        prompt.change(handlers.suggest_expected, prompt, [expected, note], **private)

        collect = run_btn.click(None, settings_inputs, settings_json, js=handlers.settings_js(), **private)
        run_ev = collect.then(handlers.run, [prompt, settings_json, expected], run_view, api_name="run", show_progress="minimal", **engine_queue)

        scrub.release(handlers.replay, [scrub, run_state], run_view, api_name="replay", show_progress="hidden")
        scrub.input(handlers.glance, [scrub, run_state], [grid, text_out], trigger_mode="always_last", show_progress="hidden", api_visibility="private")
        play_btn.click(handlers.play, [scrub, run_state], [scrub, timer], **private)
        pause_btn.click(lambda: gr.Timer(active=False), None, timer, **private)
        speed.change(lambda v: gr.Timer(value=1 / max(float(v), 1.0)), speed, timer, **private)
        timer.tick(handlers.step, [scrub, run_state], [scrub, grid, text_out, timer], api_visibility="private")
        upload.upload(handlers.load_trace, upload, run_view, api_name="load_trace")
        load_btn.click(handlers.load_model, [model_path, device, dtype, *options], load_msg, api_name="load_model", **engine_queue)

        compare_collect = compare_btn.click(
            handlers.compare_settings, [*settings_inputs, *side_controls[0], *side_controls[1]], [settings_a, settings_b], **private
        )
        compare_outputs = dict(
            grid_a=side_views[0][0], readout_a=side_views[0][1], text_a=side_views[0][2],
            grid_b=side_views[1][0], readout_b=side_views[1][1], text_b=side_views[1][2],
            chart=compare_chart, message=compare_msg, scrub=compare_scrub, state=compare_state,
        )
        compare_view = [compare_outputs[name] for name in COMPARE_VIEW]
        compare_ev = compare_collect.then(handlers.compare, [prompt, settings_a, settings_b], compare_view, api_name="compare", show_progress="minimal", **engine_queue)
        compare_scrub.release(handlers.compare_replay, [compare_scrub, compare_state], compare_view, api_name="compare_replay", show_progress="hidden")

        sweep_collect = sweep_btn.click(None, settings_inputs, settings_json, js=handlers.settings_js(), **private)
        sweep_outputs = dict(chart=sweep_chart, table=sweep_table, failures=failures, message=sweep_msg, state=sweep_state, csv=sweep_csv)
        sweep_ev = sweep_collect.then(
            handlers.sweep, [settings_json, sweep_tasks, per_task, parameter, values, own_prompts], [sweep_outputs[n] for n in SWEEP_VIEW], api_name="sweep", show_progress="minimal", **engine_queue
        )
        failures.select(handlers.open_failure, sweep_state, [*run_view, prompt, expected, tabs], api_visibility="private")

        engine_events = [run_ev, compare_ev, sweep_ev]
        stop_btn.click(handlers.stopped, None, message, cancels=engine_events, **private)
        compare_stop.click(handlers.stopped, None, compare_msg, cancels=engine_events, **private)
        sweep_stop.click(handlers.stopped, None, sweep_msg, cancels=engine_events, **private)
        demo.load(handlers.check, settings_inputs, [settings_msg, run_btn], **private)
    # Engine events queue one at a time (concurrency id "engine"); replay and loading traces are
    # cheap and run side by side for several sessions.
    demo.queue(max_size=32, default_concurrency_limit=4)
    return demo
