"""Lessons (#16 item 3): every step builds a valid GenerationConfig against the registries and
changes exactly one setting from the step before; the Run tab's handler sets prompt and controls."""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from dinfer_viz.lessons import LESSONS, Lesson, Step, check_lessons, lesson_named
from dinfer_viz.settings import all_controls
from engine import EngineError, GenerationConfig


def test_every_step_is_a_valid_config_changing_one_setting():
    check_lessons()
    for lesson in LESSONS:
        assert len(lesson.steps) >= 2 and lesson.prompt
        for i, step in enumerate(lesson.steps):
            assert isinstance(lesson.config(i), GenerationConfig)
            assert step.look.endswith(".") and len(step.look) < 300  # one sentence


def test_each_lesson_steps_through_the_setting_it_is_about():
    seq = [[lesson.settings(i)[key] for i in range(len(lesson.steps))] for lesson, key in zip(LESSONS, ("decoder", "cache", "smoothing"))]
    assert seq[0] == ["fixed", "threshold", "threshold", "credit"]
    assert [LESSONS[0].settings(i)["threshold"] for i in range(4)] == [0.9, 0.9, 0.7, 0.7]
    assert seq[1] == ["none", "prefix", "dual", "vicinity"]
    assert seq[2] == [False, True]
    assert [LESSONS[3].settings(i)["block_length"] for i in range(2)] == [64, 32]


def test_a_lesson_changing_two_settings_or_an_invalid_one_is_refused():
    two = Lesson("two", "p", {}, (Step("a", {}, "x."), Step("b", {"decoder": "fixed", "cache": "dual"}, "y.")))
    with pytest.raises(EngineError, match="changes"):
        check_lessons((two,))
    bad = Lesson("bad", "p", {}, (Step("a", {"decoder": "no-such-decoder"}, "x."),))
    with pytest.raises(EngineError):
        check_lessons((bad,))
    with pytest.raises(EngineError, match="choose a lesson"):
        lesson_named(None)
    with pytest.raises(EngineError, match="steps 1 to"):
        LESSONS[0].settings(9)


def test_the_run_tab_sets_prompt_and_controls_and_next_stops_at_the_last_step():
    from dinfer_viz.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers

    h = Handlers(EngineHost(ModelSpec("/nonexistent")), no_model=True)
    fields = [c.field for c in all_controls()]
    menu, prompt, note, *values = h.lesson_step(LESSONS[0].name, 2)
    assert menu["value"] == 2 and len(menu["choices"]) == 4 and prompt == LESSONS[0].prompt
    got = dict(zip(fields, values))
    assert got["decoder"] == "threshold" and got["threshold"] == 0.7 and got["cache"] == "none"
    assert "Step 3 of 4" in note and "Press Run" in note
    menu, *_ = h.lesson_step(LESSONS[0].name, 99)  # "next" past the end stays on the last step
    assert menu["value"] == 3
    out = h.lesson_step("<b>nope</b>", 0)
    assert "no lesson named" in out[2] and "<b>" not in out[2]  # one line, escaped
