"""The Tune tab: the engine's tuner (engine/tuning/, docs/tuning.md) on a model of the page, its
Pareto front of accuracy against tokens per forward growing as trials finish (the engine side:
dinfer_viz/studies/tuning.py), the front's held-out figures beside it, a table and a CSV of the front;
a click on a point (or a row) opens that trial's run of the chosen prompt on the Run tab with the
trial's settings on its controls, and runs it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import gradio as gr

from engine import EngineError, GenerationConfig
from engine.kinds.base import KINDS, kind_decoders
from engine.tuning.command import parse_pairs
from engine.tuning.space import build_space
from engine.tuning.study import HELD_OUT_SPLIT, TUNING_SPLIT, check_seed
from tinymodel.tasks import TASKS

from ..drawing.cells import inert_markdown
from ..settings import all_controls, control_value
from ..studies.sweep_study import sweep_examples
from ..studies.tuning import TuneState, front_rows, run_tune, settings_of, tune_figure
from .common import ENGINE_QUEUE, PRIVATE, Stoppable, SweepStop, TabHandlers, error_text, guarded, outputs
from .run_page import SHOW_RUN_JS, RunTab
from .run_settings import opened_answer

TUNE_VIEW = ("chart", "table", "message", "state", "csv")
TABLE_HEADERS = ["trial", "accuracy", "TPF", "TPS", "held-out accuracy", "held-out TPF", "settings"]
COLUMN_WIDTHS = ["7%", "10%", "7%", "8%", "11%", "10%", "47%"]
DEFAULT_FAMILIES = ("pairsum",)
DEFAULT_PROMPTS, DEFAULT_TRIALS, DEFAULT_SECONDS = 8, 20, 300
DEFAULT_OPEN_PROMPT = "Q: ?+?=38 A:"  # the Run tab's own default prompt, a held-out pair sum
# A click on a point of the front's chart: plotly's click event lives on the figure's div, which
# Gradio makes anew when the plot draws, so the listener goes on whichever div is there, once per
# div (as the Run tab's raster does: dinfer_viz/panes/grid.py RASTER_PICK_JS); it sends the trial number
# (the point's customdata) through this element's select event.
PICK_JS = r"""
setInterval(() => {
  const plot = document.querySelector('#tune-chart .js-plotly-plot');
  if (!plot || plot.dataset.pick || typeof plot.on !== 'function') return;
  plot.dataset.pick = '1';
  plot.on('plotly_click', ev => {
    const pt = ev && ev.points && ev.points[0];
    if (pt && Number.isInteger(pt.customdata)) trigger('select', {index: pt.customdata, value: pt.customdata});
  });
}, 300);
"""
# After the Run tab took a trial's settings: run them there (the Run button reads the controls),
# its message at the top of the screen as a sweep's wrong answer opens (the window kept the Tune
# tab's scroll)
RUN_CLICK_JS = (
    "() => { if (!(document.querySelector('#tune-message') || {}).textContent?.includes('opened on the Run tab')) return;"
    f" document.querySelector('#run-btn').click(); ({SHOW_RUN_JS})(); }}"
)


def _count(value: Any, what: str) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError, OverflowError):
        raise EngineError(f"{what} must be a whole number, got {str(value)[:40]!r}") from None


class TuneHandlers(TabHandlers):
    """The Tune tab's events: run a study, open a trial on the Run tab."""

    @guarded(TUNE_VIEW)
    def tune(
        self, settings: dict[str, Any] | None, model: str, families: list[str] | None, per_family: float, trials: float, seconds: float,
        seed: float = 0, decoders: list[str] | None = None, fix: str = "", space: str = "", request: gr.Request | None = None,
    ) -> Iterator[tuple]:
        """Stream the study: the chart, the front's table and the message after each trial; the
        CSV when it ends. `settings`: the Run tab's (its device and system options; the model is
        `model`, by name); `fix`, `space`: NAME=VALUE and NAME[=LOW:HIGH|=A,B] lines or commas."""
        stop = self.sweep_stop(request)  # the Stop of every tab ends it (ui.build_demo)
        try:
            yield from self._frames(stop, settings, model, families, per_family, trials, seconds, seed, decoders, fix, space)
        finally:
            stop.ended.set()

    def _frames(self, stop: SweepStop, settings: dict[str, Any] | None, model: str, families: list[str] | None, per_family: float, trials: float, seconds: float, seed: float, decoders: list[str] | None, fix: str, space: str) -> Iterator[tuple]:
        try:
            spec, _ = self.parse(settings)
            if model:
                path, label = self.host.resolve(model)
                spec = dataclasses.replace(spec, path=path, label=label)
            chosen = list(families or [])
            if not chosen:
                raise EngineError("choose at least one task family")
            per, seed_n = _count(per_family, "prompts per family"), _count(seed, "the seed")
            check_seed(seed_n)
            splits = {s: sweep_examples(chosen, per, seed=seed_n, split=s) for s in (TUNING_SPLIT, HELD_OUT_SPLIT)}
            searched = build_space(self.host.model_kind(spec), decoders=list(decoders or []) or None, fix=parse_pairs(_items(fix), "a fixed setting", True), space=parse_pairs(_items(space), "a search range", False))
            for example in splits[TUNING_SPLIT]:
                self.check_request(example.prompt, searched.base)
            states = run_tune(self.host, spec, searched, splits, _count(trials, "trials"), float(seconds or 0), seed=seed_n, cancel=stop.cancel)
            first = next(states)  # its bounds are checked on this first step
        except EngineError as exc:  # it may quote a setting's name or value as typed
            yield outputs(TUNE_VIEW, {"message": error_text(inert_markdown(str(exc)))})
            return
        state = first
        while True:
            message = inert_markdown(state.message)  # a failed study's line may quote what was typed
            out = {"chart": tune_figure(state), "table": front_rows(state), "message": error_text(message) if state.failed else message, "state": state}
            if state.done and state.front:
                out["csv"] = self.write_file("tune-front", ".csv", state.csv())
            stop.message = state.message
            yield outputs(TUNE_VIEW, out)
            state = next(states, None)
            if state is None:
                return

    def open_trial(self, state: TuneState | None, prompt: str, evt: gr.SelectData) -> tuple:
        """A clicked point (its trial number) or a row of the front's table: the Run tab takes the
        trial's settings, the tab's model and the chosen prompt, and is selected. Returns (message,
        prompt, expected, tab selection, model box, every control in `all_controls()` order)."""
        skip = (gr.skip(),) * (4 + len(all_controls()))
        if state is None:
            return ("no study yet", *skip)
        if isinstance(evt.index, (list, tuple)):  # a row of the table: its trial number
            rows = front_rows(state)
            number = rows[evt.index[0]][0] if 0 <= evt.index[0] < len(rows) else -1
        else:
            number = evt.index if isinstance(evt.index, int) else -1
        try:
            config = settings_of(state, number)
            prompt = (prompt or "").strip()
            self.check_request(prompt, config)
        except EngineError as exc:
            return (error_text(inert_markdown(str(exc))), *skip)
        controls = tuple(control_value(c, config) for c in all_controls())
        return (f"trial {number} opened on the Run tab with its settings", prompt, opened_answer(prompt, config), gr.Tabs(selected="run"), state.model_box or gr.skip(), *controls)


def _items(text: str) -> list[str]:
    """A box's NAME=VALUE items, one a line or separated by semicolons."""
    return [part.strip() for line in (text or "").splitlines() for part in line.split(";") if part.strip()]


def build(h: TuneHandlers, run: RunTab, tabs: gr.Tabs) -> Stoppable:
    """The Tune tab and its events; a trial opens on the Run tab (selecting it in `tabs`)."""
    decoders = list(dict.fromkeys(n for k in KINDS for n in kind_decoders(KINDS[k].decoder_kind())))
    with gr.Tab("Tune", id="tune"):
        gr.Markdown(
            "Searches the decoder settings (the decoder and its options, threshold, block length, cache mode, smoothing, "
            "unrolling, the kind) for the best accuracy at each tokens per forward, with Optuna, on the train prompts of "
            "the chosen families; each point of the front is then run on the held-out prompts (never tuned on). "
            "Click a point, or a row of the table, to run that trial's settings on the Run tab."
        )
        with gr.Row():
            model = gr.Dropdown(h.host.model_choices(), value=h.host.label_of(h.host.default.path), label="model", elem_id="tune-model", allow_custom_value=not h.host.public)
            families = gr.CheckboxGroup(list(TASKS), value=list(DEFAULT_FAMILIES), label="task families", elem_id="tune-families")
            per_family = gr.Number(DEFAULT_PROMPTS, precision=0, minimum=1, label="prompts per family (each split)", elem_id="tune-prompts")
            trials = gr.Number(DEFAULT_TRIALS, precision=0, minimum=1, label="trials", elem_id="tune-trials")
            seconds = gr.Number(DEFAULT_SECONDS, minimum=1, label="time limit (s)", elem_id="tune-seconds")
            seed = gr.Number(0, precision=0, minimum=0, label="seed", elem_id="tune-seed")
        with gr.Row():
            chosen = gr.Dropdown(decoders, value=[], multiselect=True, label="decoders (none chosen: every one the model runs)", elem_id="tune-decoders")
            fix = gr.Textbox(label="fixed settings (NAME=VALUE, one a line)", placeholder="gen_length=32", lines=1, elem_id="tune-fix")
            space = gr.Textbox(label="search ranges (NAME=LOW:HIGH or NAME=A,B; NAME adds a setting)", placeholder="threshold=0.5:1.0", lines=1, elem_id="tune-space")
        with gr.Row():
            tune_btn = gr.Button("Tune", variant="primary", elem_id="tune-btn")
            stop_btn = gr.Button("Stop", variant="stop", elem_id="tune-stop")
        message = gr.Markdown(elem_id="tune-message")
        chart = gr.Plot(label="the Pareto front: accuracy against tokens per forward", elem_id="tune-chart")
        pick = gr.HTML("", js_on_load=PICK_JS, elem_id="tune-pick")
        prompt = gr.Textbox(DEFAULT_OPEN_PROMPT, label="the prompt a click runs on the Run tab", elem_id="tune-open-prompt")
        table = gr.Dataframe(headers=TABLE_HEADERS, label="the front (click a row to run it)", interactive=False, wrap=True, column_widths=COLUMN_WIDTHS, elem_id="tune-table")
        csv = gr.DownloadButton("Download the front (CSV)", value=None, elem_id="tune-csv")
        state = gr.State(None)
    slots = dict(chart=chart, table=table, message=message, state=state, csv=csv)
    collect = tune_btn.click(None, run.settings_inputs, run.settings_json, js=h.settings_js(), **PRIVATE)
    event = collect.then(
        h.tune, [run.settings_json, model, families, per_family, trials, seconds, seed, chosen, fix, space], [slots[n] for n in TUNE_VIEW],
        api_name="tune", show_progress="minimal", **ENGINE_QUEUE,
    )
    copied = [run.settings_inputs[0], *(run.controls[c.field] for c in all_controls())]
    opened = [message, run.prompt, run.expected, tabs, *copied]
    for source in (pick, table):
        source.select(h.open_trial, [state, prompt], opened, api_visibility="private").success(None, js=RUN_CLICK_JS, **PRIVATE)
    return Stoppable(event, stop_btn, message)
