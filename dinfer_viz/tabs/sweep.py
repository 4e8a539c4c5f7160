"""The Threshold sweep tab: one setting swept over held-out prompts with known answers (the sweep
itself is dinfer_viz/studies/sweep_study.py), with the Run tab's other settings, on the Run tab's model and
optionally a second one; accuracy against tokens per forward (a curve per model), a table per model
and value, the runs' analyses against the swept value ("how autoregressive is the decoder at each
value?"), and the wrong answers, each opening in the Run tab at its first wrong commit with the
Run tab's controls set to the settings it ran with (the swept value included), so Run reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import gradio as gr

from engine import EngineError, GenerationConfig

from ..studies.answers import no_first_wrong, single_answer
from ..studies.sweep_chart import sweep_analysis_figure, sweep_figure, value_symbol
from ..drawing.cells import inert_markdown
from ..panes.readouts import MAX_PASSES, passes_count, percent
from ..settings import all_controls, control_value, numeric_fields, sweep_setting
from ..studies.sweep_study import MAX_KEPT_PER_VALUE, MAX_PER_SET, SweepState, parse_values, prompt_sets, run_sweep, sweep_examples
from ..reading.timeline import Timeline, iteration_number
from .common import ENGINE_QUEUE, PRIVATE, Stoppable, SweepStop, TabHandlers, error_text, guarded, outputs
from .run import RUN_VIEW, stored_view
from .run_page import SHOW_RUN_JS, RunTab
from .run_settings import opened_answer

# new slots last: API clients reading the earlier outputs by place keep working
SWEEP_VIEW = ("chart", "table", "failures", "message", "state", "csv", "failure_counts", "failures_at", "analysis_chart")
# Columns added later come after the model, so API clients reading the earlier ones by place keep
# working: a revising decoder's edits and remasks (summed over the prompts), the curve's AUP (its
# complete values; empty before one completes), its constraint, TPS's spread over the passes.
SWEEP_TABLE_HEADERS = ["value", "accuracy", "TPF", "TPS (median of the passes)", "prompts", "model", "edits", "remasks", "AUP", "constraint", "TPS over the passes"]
ALL_VALUES = ""  # the wrong-answers filter's "every value"
# shares of the tab's width: every column shows at 1024 px, each wide enough for its one-word
# header and its numbers (a header of several words wraps between them)
SWEEP_COLUMN_WIDTHS = ["7%", "9%", "6%", "9%", "10%", "11%", "7%", "8%", "7%", "12%", "14%"]
FAILURE_HEADERS = ["value", "prompt", "expected", "got", "first wrong pos", "at iteration", "confidence then", "forced", "model"]
SWEEP_DEFAULT_SETS = ("pairsum",)
SWEEP_DEFAULT_VALUES = "0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.95"
# every held-out pair-sum prompt (the default set), so the default sweep's figures are the model
# card's, not a sample's (24 of the 34 moved accuracy by up to 6 points)
SWEEP_DEFAULT_PER_SET = 34


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _per_set(value: Any) -> int:
    """The prompts-per-set box's value (an API client may send anything) as a count, which
    sweep_examples bounds."""
    try:
        return int(value or 0)
    except (TypeError, ValueError, OverflowError):
        raise EngineError(f"prompts per set must be a whole number, got {value!r}") from None


def _spread(p: dict[str, Any]) -> str:
    """The TPS column's companion: one pass's TPS is noise-prone (the CPU is shared with the page,
    other sessions and the OS), so it says so; over several, their range."""
    if p["passes"] == 1:
        return "1 pass: noisy"  # the passes slider's info says what more passes give
    low, high = p["tps_range"]
    return f"{p['passes']} passes: {low:.1f}–{high:.1f}"


def _sweep_rows(state: SweepState, points: list[dict[str, Any]] | None = None) -> list[list[Any]]:
    """The table's rows, from `points` (state.points(), computed when not given)."""
    return [
        [
            p["value"], percent(p["accuracy"]), round(p["tpf"], 2), round(p["tps"], 1),
            f"{p['examples']} of {state.per_value} (partial)" if p["partial"] else p["examples"],
            p["model"], p["edits"], p["remasks"], "" if p["aup"] is None else round(p["aup"], 1), p["constraint"] or "none", _spread(p),
        ]
        for p in (state.points() if points is None else points)
    ]


def _group_label(state: SweepState, g: dict[str, Any]) -> str:
    symbol = value_symbol(state.parameter)
    curve = g["model"] + (f" · {g['constraint']}" if g["constraint"] else "")
    cut = f", the first {g['kept']} kept" if g["kept"] < g["wrong"] else ""
    return f"{symbol}={g['value']:g} · {curve}: {g['wrong']} wrong{cut}"


def _failure_summary(state: SweepState, group: str) -> tuple[str, Any]:
    """The line over the wrong answers (how many each value has, and where the list is cut) and
    the filter's choices (every value, then each curve and value with a wrong answer)."""
    groups = state.failure_groups()
    wrong, kept = sum(g["wrong"] for g in groups), sum(g["kept"] for g in groups)
    choices = [(f"every value ({wrong} wrong, {kept} listed)", ALL_VALUES), *((_group_label(state, g), g["key"]) for g in groups)]
    if not groups:
        return "no wrong answers" + ("" if state.done else " so far"), gr.update(choices=choices, value=ALL_VALUES)
    cut = [g for g in groups if g["kept"] < g["wrong"]]
    line = f"**{wrong} wrong answers** over {len(groups)} values: " + " · ".join(inert_markdown(_group_label(state, g)) for g in groups)
    if cut:
        line += f". The list keeps the first {MAX_KEPT_PER_VALUE} of each value (their traces open in the Run tab)."
    known = group in {key for _, key in choices}
    return line, gr.update(choices=choices, value=group if known else ALL_VALUES)


def _failure_rows(state: SweepState, group: str = ALL_VALUES) -> list[list[Any]]:
    rows = []
    for o in state.kept_failures(group):
        w = o.wrong
        rows.append([o.value, o.example.prompt, o.example.response, o.text, w.position if w else "", iteration_number(w.iteration) if w else "", round(w.confidence, 3) if w else "", w.forced if w else "", o.model])
    return rows


class SweepHandlers(TabHandlers):
    """The Sweep tab's events: run the sweep, open a wrong answer in the Run tab."""

    @guarded(SWEEP_VIEW)
    def sweep(
        self,
        settings: dict[str, Any] | None,
        tasks: list[str] | None,
        per_task: float,
        parameter: str,
        values: str,
        own_prompts: str = "",
        also_model: str | None = "",
        passes: float = 1,
        unconstrained_too: bool = False,
        failures_at: str = ALL_VALUES,
        request: gr.Request | None = None,
    ) -> Iterator[tuple]:
        """Run every chosen prompt at every value, on the settings' model and then on `also_model`
        when one is named (same settings); stream the accuracy-vs-TPF chart and tables. `passes`:
        runs of each prompt timed; TPS is the median over them. `unconstrained_too`: each value
        also without the settings' constraint (a second curve). `failures_at`: the wrong answers
        listed (a `failure_groups` key; "" every value). The state comes with every frame, so a
        stopped sweep's wrong answers still open. `request`: the session, whose Stop ends this sweep
        (`stop_sweep`: Gradio's cancel of the event alone left the sweep's engine running)."""
        stop = self.sweep_stop(request)
        try:
            yield from self._sweep_frames(stop, settings, tasks, per_task, parameter, values, own_prompts, also_model, passes, unconstrained_too, failures_at)
        finally:  # the last frame has gone (or the stream was closed): a Stop waiting on it goes on
            stop.ended.set()

    def _sweep_frames(
        self, stop: SweepStop, settings: dict[str, Any] | None, tasks: list[str] | None, per_task: float, parameter: str, values: str, own_prompts: str,
        also_model: str | None, passes: float, unconstrained_too: bool, failures_at: str,
    ) -> Iterator[tuple]:
        """`sweep`'s frames; each one's message is kept in `stop` (what a Stop says after it)."""
        try:
            passes = passes_count(passes)
            spec, config = self.parse(settings)
            also = self.host.second_model(spec, also_model)
            examples = sweep_examples(list(tasks or []), _per_set(per_task), seed=config.seed, own_prompts=own_prompts)
            for example in examples:
                self.check_request(example.prompt, config)
            numbers = parse_values(values)
            states = run_sweep(self.host, spec, config, parameter, numbers, examples, also=also, passes=passes, unconstrained_too=bool(unconstrained_too), cancel=stop.cancel)
            first = next(states)  # a generator: its own checks (setting, values) raise on this first step
        except EngineError as exc:
            yield outputs(SWEEP_VIEW, {"message": error_text(str(exc))})
            return
        for state in _chain(first, states):
            counts, chooser = _failure_summary(state, failures_at or ALL_VALUES)
            points = state.points()
            out = {
                "chart": sweep_figure(points, parameter),
                "analysis_chart": sweep_analysis_figure(points, parameter),
                "table": _sweep_rows(state, points),
                "failures": _failure_rows(state, chooser["value"]),
                "message": error_text(state.message) if state.failed else state.message,
                "state": state, "failure_counts": counts, "failures_at": chooser,
            }
            if state.done:
                out["csv"] = self.write_file(f"sweep-{state.parameter}", ".csv", state.csv())
            stop.message = state.message
            yield outputs(SWEEP_VIEW, out)

    def show_failures(self, state: SweepState | None, failures_at: str = ALL_VALUES) -> tuple:
        """The wrong answers of one value (the filter's choice), or of every value: (rows, line)."""
        if state is None:
            return [], "no sweep yet"
        counts, _ = _failure_summary(state, failures_at)
        return _failure_rows(state, failures_at), counts

    def open_failure(self, state: SweepState | None, evt: gr.SelectData, failures_at: str = ALL_VALUES) -> tuple:
        """A clicked wrong answer opens in the Run tab at its first wrong commit, and the Run tab's
        controls take the settings it ran with (the swept value included) and its model, so Run
        reproduces it. Returns the Run view, then (prompt, expected, tab selection, model box,
        every control in `all_controls()` order). `failures_at`: the filter the table lists (its rows)."""
        kept = state.kept_failures(failures_at or ALL_VALUES) if state else []  # the rows the table lists
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if state is None or not 0 <= row < len(kept):
            return outputs(RUN_VIEW, {"message": "that row has no stored trace"}) + (gr.skip(),) * (5 + len(all_controls()))
        outcome = kept[row]
        tl = Timeline(outcome.trace)
        at = outcome.wrong.iteration if outcome.wrong else tl.iterations - 1
        where = (
            f"first wrong commit at position {outcome.wrong.position}, iteration {iteration_number(outcome.wrong.iteration)}, confidence {outcome.wrong.confidence:.3f}"
            if outcome.wrong
            else "no single wrong commit found" if single_answer(outcome.example) else no_first_wrong(outcome.example)
        )
        pinned = outcome.wrong.position if outcome.wrong else None  # the details panel opens on the wrong commit
        out = stored_view(
            tl, at, outcome.expected, highlight=True, pinned=pinned,
            note=f"sweep: {inert_markdown(outcome.model)}, {state.parameter} = {outcome.value:g}",
            message=f"wrong answer from the sweep ({inert_markdown(outcome.model)}, {state.parameter} = {outcome.value:g}): {where}; the Run tab's settings are now its settings, so Run reproduces it",
        )
        config = GenerationConfig.from_dict(outcome.trace.config)  # what the engine ran: the swept value included
        controls = tuple(control_value(c, config) for c in all_controls())
        return outputs(RUN_VIEW, out) + (outcome.example.prompt, opened_answer(outcome.example.prompt, config), gr.Tabs(selected="run"), outcome.model_box or gr.skip(), *controls, pinned)


@dataclass
class SweepTab:
    """The Sweep tab's parts that ui.build_demo wires across tabs."""

    engine: Stoppable
    parameter: gr.Dropdown  # the setting swept: follows the Run tab's decoder (run.wire_structure)


def build(h: SweepHandlers, run: RunTab, tabs: gr.Tabs) -> SweepTab:
    """The Sweep tab and its events: it sweeps with the Run tab's settings and opens a wrong answer
    there (selecting it in `tabs`)."""
    with gr.Tab("Threshold sweep", id="sweep"):
        gr.Markdown(
            "Runs held-out prompts of the embedded model's task families (never trained on; each answer judged by "
            "its family's verifier) at each value, with the Run tab's other settings, one prompt at a time. "
            "Pair-sum shows the trade-off: a low threshold commits dependent digits in one forward and breaks the sum. "
            "Click a wrong answer to open its trace at the first wrong commit."
        )
        with gr.Row():
            tasks = gr.CheckboxGroup(prompt_sets(), value=list(SWEEP_DEFAULT_SETS), label="prompt sets (held-out prompts of each family; arithmetic out of range)")
            per_task = gr.Number(SWEEP_DEFAULT_PER_SET, precision=0, minimum=1, maximum=MAX_PER_SET, label="prompts per set")
            parameter = gr.Dropdown(numeric_fields(), value=sweep_setting(GenerationConfig().decoder), label="setting to sweep", info="set by the decoder's declaration; any numeric setting")
            values = gr.Textbox(SWEEP_DEFAULT_VALUES, label="values")
            passes = gr.Slider(1, MAX_PASSES, value=1, step=1, label="passes", info="runs of each prompt; TPS: the median of the passes (one pass is noisy: 3 or more for a median)", elem_id="sweep-passes")
            also_model = gr.Dropdown(
                [("none", ""), *h.host.model_choices()], value="", label="also sweep model",
                info="the same sweep on a second model, after the Run tab's; the chart overlays the two curves",
                allow_custom_value=not h.host.public, elem_id="sweep-also-model",
            )
        with gr.Row():
            own_prompts = gr.Textbox(label="your own prompts (optional; one a line, each from a family)", lines=2, elem_id="sweep-own", scale=3)
            unconstrained_too = gr.Checkbox(
                False, label="also without the constraint", elem_id="sweep-unconstrained", scale=1,
                info="with a constraint set on the Run tab: a second curve, the same values and prompts with no constraint",
            )
        with gr.Row():
            sweep_btn = gr.Button("Sweep", variant="primary", elem_id="sweep-btn")
            stop_btn = gr.Button("Stop", variant="stop", elem_id="sweep-stop")
        message = gr.Markdown(elem_id="sweep-message")
        # the chart, then the table across the whole tab: beside the chart, the table's later
        # columns (model, edits, remasks, AUP...) sat behind a scroll even at 1400 px
        chart = gr.Plot(label="accuracy against tokens per forward", elem_id="sweep-chart")
        table = gr.Dataframe(headers=SWEEP_TABLE_HEADERS, label="per value", interactive=False, wrap=True, column_widths=SWEEP_COLUMN_WIDTHS, elem_id="sweep-table")
        csv = gr.DownloadButton("Download the table (CSV)", value=None, elem_id="sweep-csv")
        # a label of one line even at 1024 px: a second line of the badge covered the top panel
        analysis_chart = gr.Plot(label="how autoregressive is the decoder at each value?", elem_id="sweep-analysis-chart")
        with gr.Row(equal_height=False):
            failures_at = gr.Dropdown([("every value", ALL_VALUES)], value=ALL_VALUES, label="wrong answers at", elem_id="sweep-failures-at", scale=1)
            failure_counts = gr.Markdown(elem_id="sweep-failure-counts")
        failures = gr.Dataframe(headers=FAILURE_HEADERS, label="wrong answers (click a row to inspect it)", interactive=False, wrap=True, elem_id="sweep-failures")
        state = gr.State(None)
    slots = dict(chart=chart, table=table, failures=failures, message=message, state=state, csv=csv, failure_counts=failure_counts, failures_at=failures_at, analysis_chart=analysis_chart)

    collect = sweep_btn.click(None, run.settings_inputs, run.settings_json, js=h.settings_js(), **PRIVATE)
    event = collect.then(
        h.sweep, [run.settings_json, tasks, per_task, parameter, values, own_prompts, also_model, passes, unconstrained_too, failures_at], [slots[n] for n in SWEEP_VIEW],
        api_name="sweep", show_progress="minimal", **ENGINE_QUEUE,
    )
    failures_at.input(h.show_failures, [state, failures_at], [failures, failure_counts], **PRIVATE)
    # run.settings_inputs[0]: the model box (TabHandlers.settings' order)
    copied = [run.settings_inputs[0], *(run.controls[c.field] for c in all_controls())]
    opened = failures.select(h.open_failure, [state, failures_at], [*run.view, run.prompt, run.expected, tabs, *copied, run.pinned], api_visibility="private")
    opened.success(None, js=SHOW_RUN_JS, **PRIVATE)
    return SweepTab(Stoppable(event, stop_btn, message), parameter)

