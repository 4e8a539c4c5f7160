"""Handler-level behaviour that needs no model: playback, scrubbing, opening a sweep failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
import pytest

from dinfer_viz.studies.answers import first_wrong
from dinfer_viz.settings import all_controls
from dinfer_viz.tabs.run import RUN_VIEW, RunState
from dinfer_viz.ui import Handlers
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.studies.sweep_study import Outcome, SweepState, with_answers
from dinfer_viz.tabs.run_settings import KEEP_TYPED_JS
from engine import RunHooks
from dinfer_viz.reading.timeline import Timeline
from tinymodel.tasks import Example, parse_prompt

from .app_support import handmade_trace


@pytest.fixture
def handlers(tmp_path) -> Handlers:
    return Handlers(EngineHost(ModelSpec(str(tmp_path / "never-loaded"))))


@pytest.fixture
def state() -> RunState:
    return RunState(Timeline(handmade_trace()), expected=None)


# The slider shows the page's numbering: 0 is the canvas before the first forward, 1..4 the records.
def test_playback_steps_and_stops_at_the_end(handlers, state):
    it, grid, text, details, timer = handlers.step(0, state)
    assert it == 1 and grid["caption"].startswith("iteration 1/4") and text == "x░z░░░░░" and timer.active
    assert isinstance(details, type(gr.skip()))  # nothing pinned: the panel is left as it is (its hint, or a click being pinned)
    it, grid, text, details, timer = handlers.step(2, state, 4)
    assert it == 3 and grid["caption"].startswith("iteration 3/4") and timer.active
    assert "Position 4 · iteration 3 of 4" in details  # the pinned position follows playback
    it, grid, text, _, timer = handlers.step(3, state)
    assert it == 4 and text == "x yzzx" and not timer.active  # reached the last iteration
    *_, timer = handlers.step(4, state)
    assert not timer.active


def test_play_restarts_from_the_beginning_at_the_end(handlers, state):
    start, timer = handlers.play(4, state)
    assert start == 0 and timer.active
    start, timer = handlers.play(2, state)
    assert isinstance(start, type(gr.skip())) and timer.active


def test_scrubbing_marks_the_iteration_on_the_figures(handlers, state):
    view = dict(zip(RUN_VIEW, handlers.replay(2, state)))
    assert view["grid"]["caption"].startswith("iteration 2/4")
    red = [s for s in view["raster"].layout.shapes if s.line.color == "#dc2626"]  # the highlight line
    assert [s.y0 for s in red] == [2] and [s.x0 for s in view["iterations"].layout.shapes] == [2]
    grid, text, details = handlers.glance(1, state, 5)
    assert grid["caption"].startswith("iteration 1/4") and text == "x░z░░░░░" and "Position 5 · iteration 1 of 4" in details
    grid, text, _ = handlers.glance(0, state)
    assert grid["caption"].startswith("iteration 0/4 · before the first forward") and text == "░" * 8


def test_nothing_to_replay_is_a_message(handlers):
    view = dict(zip(RUN_VIEW, handlers.replay(0, None)))
    assert "nothing to replay" in view["message"]


def test_a_sweep_failure_opens_at_its_first_wrong_commit(handlers):
    trace = handmade_trace()
    expected = [20, 21, 20, 22, 0]  # offset 2 (position 5) should be 20; it was committed as 22 at iteration 0
    example = Example("add", "Q: 1+2=? A:", " The sum is 3.", 3)
    outcome = Outcome(0.7, example, "x yzzx", False, 5, 4, 0.1, trace=trace, expected=expected, wrong=first_wrong(Timeline(trace), expected))
    state = SweepState("threshold", outcomes=[outcome], done=True)
    result = handlers.open_failure(state, gr.SelectData(None, {"index": [0, 2], "value": "x"}))
    view = dict(zip(RUN_VIEW, result[: len(RUN_VIEW)]))
    prompt, response, tabs, model_box, *controls, pinned = result[len(RUN_VIEW) :]
    assert (prompt, response) == (example.prompt, "   1+  2=   3")  # the prompt's one right answer, as the page writes it
    # the Run tab's controls take the failure's settings (the trace's config), so Run reproduces it
    values = dict(zip([c.field for c in all_controls()], controls))
    assert (values["decoder"], values["cache"], values["threshold"]) == ("threshold", "vicinity", 0.9)
    assert isinstance(model_box, type(gr.skip()))  # no model recorded on this hand-made outcome: the box stays
    assert view["grid"]["caption"].startswith("iteration 1/4") and view["scrub"]["value"] == 1  # record 0
    assert (view["scrub"]["minimum"], view["scrub"]["maximum"]) == (0, 4)
    assert "wrong" in view["grid"]["cells"][5]["k"] and "confidence 0.920" in view["message"]
    assert view["state"].expected == expected
    # the details panel opens on the first wrong commit, pinned for the scrubbing that follows
    assert pinned == 5 and "Position 5 · iteration 1 of 4" in view["details"]


def test_a_pair_sum_failure_opens_with_no_expected_answer_and_says_why_it_has_no_first_wrong_commit(handlers):
    """#54 item 4: pair-sum has many right answers, so the sweep gives its runs none (with_answers)
    and its wrong answer opens with the expected box empty, saying the first wrong commit is left out."""
    example = Example("pairsum", "Q: ?+?=38 A:", " 19 + 19", 38)
    outcome = Outcome(0.7, example, " 20 + 20", False, 5, 4, 0.1, trace=handmade_trace())
    result = handlers.open_failure(SweepState("threshold", outcomes=[outcome], done=True), gr.SelectData(None, {"index": [0, 2], "value": "x"}))
    view = dict(zip(RUN_VIEW, result[: len(RUN_VIEW)]))
    prompt, response = result[len(RUN_VIEW) : len(RUN_VIEW) + 2]
    assert (prompt, response) == (example.prompt, "")
    assert "no first wrong commit: pairsum has many right answers" in view["message"] and "left out" in view["message"]
    assert not any("wrong" in cell["k"] for cell in view["grid"]["cells"])


def test_a_sweep_gives_expected_ids_only_to_prompts_with_one_right_answer():
    given = []
    engine = SimpleNamespace(answer_ids=lambda text: [ord(c) for c in text], generate_ids=lambda prompts, config, hooks: given.append(hooks.expected_ids))
    examples = [parse_prompt("Q: 7+58=? A:"), parse_prompt("Q: ?+?=38 A:"), parse_prompt("Q: rhymes with cat? A:")]
    generate = with_answers(engine, examples, [[1], [2], [3]])
    generate([[1], [2], [3]], None, RunHooks())
    assert given == [[[ord(c) for c in "   7+ 58=  65"], [], []]]


def test_the_expected_box_takes_a_prompt_change_over_an_answer_another_tab_filled():
    """#54 item 4: a sweep's wrong answer or a Tune trial fills the box with the suggestion for its
    prompt (opened_answer); the page's next suggestion replaces it, while a typed answer stays."""
    if shutil.which("node") is None:
        pytest.skip("no node to run the page's script")

    def keep(suggestion: str, current: str, last: str) -> list[str]:
        script = f"console.log(JSON.stringify(({KEEP_TYPED_JS})(...{json.dumps([suggestion, current, last])})))"
        return json.loads(subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout)

    opened = "   7+ 58=  65"  # filled with the prompt change that brought it: the box holds the suggestion
    assert keep(opened, opened, "") == [opened, opened]
    assert keep("", opened, opened) == ["", ""]  # the next prompt (pair-sum) empties it
    assert keep(opened, " my answer", "") == [" my answer", ""]  # typed: kept


def test_the_expected_answer_suggested_for_a_prompt_and_its_family_note(handlers):
    """The page decides whether the box takes it (the browser tests: an answer the user typed stays)."""
    response, note = handlers.suggest_expected("Q: 123+45=? A:")
    assert response == " 123+ 45= 168" and "family **add**" in note
    response, note = handlers.suggest_expected("Q: ?+?=120 A:")
    assert response == "" and "family **pairsum**" in note  # pair-sum has many right answers: none to expect
