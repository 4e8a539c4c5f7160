"""What a newcomer met on the page in issue #54's fourth pass (item 6): the kind menus can go
back to the model's own kind, Compare says whether each answer is right, and the rest of the
page's small untruths. Each is decided from the page's values or the engine's runs, never timing."""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from pathlib import Path

import gradio as gr
import pytest

from benchmarks.screenshots import LESSON_SHOT, README_SHOT
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.live.system import offered_options
from dinfer_viz.panes.analysis_figure import per_step_figure
from dinfer_viz.panes.cost_figure import forward_times_figure
from dinfer_viz.panes.figures import compare_figure, extras_figure, iteration_chart, raster
from dinfer_viz.panes.readouts import readout
from dinfer_viz.reading.timeline import Timeline
from dinfer_viz.studies.tuning import TuneState, tune_figure
from dinfer_viz.studies.answers import prompt_note, verdict
from dinfer_viz.studies.lessons import LESSONS, STRUCTURE_LESSON_PROMPT
from dinfer_viz.settings import all_controls, control_value
from dinfer_viz.tabs.compare import COMPARE_VIEW
from dinfer_viz.tabs.server_trace import TRACE_ID, TRACE_ID_EXAMPLE, add_box
from dinfer_viz.ui import Handlers
from dinfer_viz.views.masked.masked_details import rule_text
from engine import Engine, GenerationConfig, RunHooks

from .app_support import handmade_trace

ASSETS = Path(__file__).resolve().parents[1] / "assets"
SMALL = {"gen_length": 16, "block_length": 16, "threshold": 0.9}


@pytest.fixture(scope="module")
def handlers() -> Handlers:
    return Handlers(EngineHost(ModelSpec(str(ASSETS / "tiny-llada"))), fps=1000, plot_hz=1000)


def test_the_kind_menu_offers_the_models_own_kind_as_a_choice(handlers):
    """A kind once picked can be unpicked: "the model's own kind" is a choice of the menu (the Run
    tab's and each Compare side's: one Control), and it runs as no kind chosen."""
    kind = next(c for c in all_controls() if c.field == "kind")
    values = [c[1] if isinstance(c, tuple) else c for c in kind.choices()]
    own = control_value(kind, GenerationConfig())
    assert own in values and values.index(own) == 0
    assert handlers.parse({"config": {"kind": own}})[1].kind is None
    assert handlers.parse({"config": {"kind": "masked"}})[1].kind == "masked"


def test_compare_says_whether_each_answer_is_right(handlers):
    seen: dict = {}
    for frame in handlers.compare("Q: 7+58=? A:", {"config": SMALL}, {"config": {**SMALL, "threshold": 0.05}}, "", 1):
        seen.update({k: v for k, v in zip(COMPARE_VIEW, frame) if not (isinstance(v, dict) and v == gr.skip())})
    message = seen["message"]
    assert message.startswith("done"), message
    a, b = message.split(" · ")[:2]
    for said, text in ((a, seen["text_a"]), (b, seen["text_b"])):  # each side its own verdict, the Run tab's
        assert said.endswith(f", {verdict('Q: 7+58=? A:', text)}") and "add verifier:" in said


def test_a_short_runs_iteration_axes_tick_whole_iterations():
    """A run of one or two iterations had ticks at 0.5, 1.5, 2.5: no record sits there."""
    trace = handmade_trace()
    trace.iterations = trace.iterations[:2]
    tl = Timeline(trace)
    axes = {
        "raster": raster(tl).layout.yaxis, "iterations": iteration_chart(tl).layout.xaxis, "forward times": forward_times_figure(tl, 1, None, "", {}).layout.xaxis,
        "extras": extras_figure(tl).layout.yaxis, "compare": compare_figure([tl, tl], ["A", "B"]).layout.xaxis2,
        "analysis": per_step_figure(tl).layout.xaxis,
    }
    for name, axis in axes.items():
        assert (axis.dtick, axis.tick0) == (1, 0), name


def test_the_readout_names_its_seconds_for_what_they_measure():
    """"wall s: since the click, UI included" was 0.13 s of a 5.5 s click-to-done: it is the
    server's time for the run, and says so."""
    shown = readout(Timeline(handmade_trace()), 0.13)
    assert "since the click" not in shown and "server s" in shown and "not the page's request, queue or painting" in shown


def test_the_tune_chart_says_the_first_trial_is_running_while_it_runs():
    """The study's first frames come before any trial ends: the chart said "no trial yet"."""
    def words(state):
        return " ".join(a.text for a in tune_figure(state).layout.annotations)

    assert "no trial yet" in words(None)
    assert "the first trial is running" in words(TuneState(message="trial 1 running"))
    assert "no trial completed" in words(TuneState(stopped=True))


def test_the_eb_samplers_commits_state_its_rule():
    """Each commit of the entropy-bound decoder, and each mask it left, gives the numbers its rule
    compared (it said "no rule for it is written here")."""
    config = GenerationConfig(decoder="entropy_bound", gen_length=16, block_length=16)
    tl = Timeline(Engine(str(ASSETS / "tiny-llada")).generate("Q: 7+58=? A:", config, RunHooks(trace=True)).output.trace)
    texts = [
        rule_text(tl, i, p)
        for i, rec in enumerate(tl.records)
        for p in range(*rec.block_range)
        if tl.token_before(p, i) == tl.mask_id
    ]
    assert texts and not any("no rule" in t for t in texts)
    assert any(t.startswith("committed: entropy") for t in texts) and all("bound γ 0.1" in t for t in texts)


def test_the_server_trace_box_shows_what_an_id_looks_like():
    parts: dict = {}
    with gr.Blocks():
        add_box(parts)
    assert parts["trace_id"].placeholder == TRACE_ID_EXAMPLE and TRACE_ID.fullmatch(TRACE_ID_EXAMPLE)


def test_lesson_7s_own_prompt_is_not_warned_of_as_nonsense():
    lesson = next(l for l in LESSONS if l.prompt == STRUCTURE_LESSON_PROMPT)
    note = prompt_note(lesson.prompt)
    assert "on purpose" in note and "lesson 7" in note and "⚠" not in note
    assert "⚠ **outside every family**" in prompt_note("Hello, how are you?")  # any other prompt outside them still is


def test_the_lesson_sentence_says_when_the_page_left_the_steps_settings(handlers):
    """The step's sentence stayed over settings that were no longer the step's; it now says which
    changed, and is the step's own again when they are back."""
    lesson = LESSONS[0]
    _, prompt, note, *controls, model = handlers.lesson_step(lesson.name, 1)
    box = model if isinstance(model, str) else handlers.host.label_of(handlers.host.default.path)
    values = [box, "cpu", "auto", *((1 if o.kind is int else False) for o in offered_options()), *controls]
    assert handlers.lesson_left(lesson.name, 1, prompt, *values) == note and "⚠" not in note
    field = [c.field for c in all_controls()].index("threshold")
    moved = handlers.lesson_left(lesson.name, 1, prompt, *values[: len(values) - len(controls) + field], 0.42, *values[len(values) - len(controls) + field + 1 :])
    assert moved.startswith("⚠ *no longer this step's settings (changed: threshold τ)") and moved.endswith(note)
    assert "changed: prompt" in handlers.lesson_left(lesson.name, 1, "Q: 1+1=? A:", *values)
    assert isinstance(handlers.lesson_left(None, None, prompt, *values), type(gr.skip()))  # no lesson: left as it is


def test_the_docs_pictures_are_the_ones_the_screenshot_script_renews():
    """#54 item 5: `python -m benchmarks.screenshots` writes the README's and docs/app.md §4's pictures."""
    root = Path(__file__).resolve().parents[1]
    for doc, shot in ((root / "README.md", README_SHOT), (root / "docs" / "app.md", LESSON_SHOT)):
        text = doc.read_text(encoding="utf-8")
        assert f"]({shot.relative_to(doc.parent).as_posix()})" in text and "python -m benchmarks.screenshots" in text
        assert shot.stat().st_size > 50_000


def test_constraints_md_says_why_a_bare_choice_list_can_pick_a_wrong_answer():
    """docs/app.md told it; the constraints guide, where a script's author looks, did not."""
    root = Path(__file__).resolve().parents[1]
    guide = (root / "docs" / "constraints.md").read_text(encoding="utf-8")
    assert "**Why a bare choice list can pick a wrong answer.**" in guide and "whole answer in the model's own format" in guide
    assert "constraints.md#1-asking-for-it" in (root / "docs" / "app.md").read_text(encoding="utf-8")


def test_every_lesson_step_as_the_page_sets_it_reads_as_its_own(handlers):
    """No step is flagged as changed by the page's own doing (the decoder fitted to the step's model)."""
    fields = [c.field for c in all_controls()]
    for lesson in LESSONS:
        for index in range(len(lesson.steps)):
            _, prompt, note, *controls, model = handlers.lesson_step(lesson.name, index)
            values = [model if isinstance(model, str) else "tiny-llada", "cpu", "auto", *((1 if o.kind is int else False) for o in offered_options()), *controls]
            fitted = handlers.fitted_decoder(*values)
            if isinstance(fitted, dict) and "value" in fitted:
                values[len(values) - len(controls) + fields.index("decoder")] = fitted["value"]
            assert handlers.lesson_left(lesson.name, index, prompt, *values) == note, (lesson.name, index)
