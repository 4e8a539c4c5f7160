"""Lessons (#16 item 3): every step builds a valid GenerationConfig against the registries and
changes exactly one setting from the step before; the Run tab's handler sets prompt and controls."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from dinfer_viz.studies.lessons import LESSONS, Lesson, Step, check_lessons, lesson_named
from dinfer_viz.settings import all_controls
from engine import EngineError, GenerationConfig

from .app_support import edit_model


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
    from dinfer_viz.live.host import EngineHost, ModelSpec
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


def test_a_step_may_change_the_model_and_counts_as_its_one_setting():
    lesson = next(l for l in LESSONS if l.name.startswith("5 "))
    assert [lesson.model(i) for i in range(3)] == ["tiny-llada", "tiny-llada-edit", "tiny-llada-edit"]
    assert [lesson.settings(i)["decoder"] for i in range(3)] == ["threshold", "threshold", "edit"]
    assert "model" not in lesson.settings(1) and lesson.settings(1)["threshold"] == 0.3
    two = Lesson("two", "p", {}, (Step("a", {}, "x."), Step("b", {"model": "m", "decoder": "fixed"}, "y.")))
    with pytest.raises(EngineError, match="changes"):
        check_lessons((two,))
    assert Lesson("no model", "p", {}, (Step("a", {}, "x."),)).model(0) is None  # a lesson that names no model leaves the model box alone
    assert all(lesson.model(0) for lesson in LESSONS)  # every built-in one names its model (#44 item 2)


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(edit_model() is None or not (ROOT / "assets" / "tiny-llada" / "config.json").exists(), reason="needs the base and the edit model")
def test_lesson_5_the_base_errs_at_threshold_0_3_and_edit_on_the_edit_model_repairs_it():
    """Decided from the runs' traces: the base model's answer at τ 0.3 fails the verifier; the edit
    model with `edit` ends with one that passes, and it got there by edits: at least one edit of a
    committed answer position, each with p(new) above the edit threshold."""
    import torch

    from engine import Engine, RunHooks
    from engine.trace import EDIT
    from tinymodel.eval import check_answer
    from tinymodel.tasks import parse_prompt

    torch.set_num_threads(1)
    lesson = next(l for l in LESSONS if l.name.startswith("5 "))
    example = parse_prompt(lesson.prompt)
    assert example is not None and example.task == "pairsum"
    base = Engine(str(ROOT / "assets" / "tiny-llada")).generate(lesson.prompt, lesson.config(0), RunHooks(trace=True))
    assert not check_answer(example, base.text), base.text
    edit = Engine(str(edit_model())).generate(lesson.prompt, lesson.config(2), RunHooks(trace=True))
    assert check_answer(example, edit.text), edit.text
    trace = edit.output.trace
    answer_end = trace.prompt_lengths[0] + len(edit.output.token_ids[0])
    edits = [r for rec in trace.iterations for r in rec.revisions[0] if r["kind"] == EDIT]
    assert any(trace.prompt_lengths[0] <= r["position"] < answer_end for r in edits)
    bound = lesson.config(2).decoder_options.get("edit_threshold", 0.5)  # the decoder's default unless the lesson sets it
    assert all(r["bound"] == bound and r["score"] > bound for r in edits)


# ---- lesson 6: masked → uniform-state diffusion ---------------------------------------------------
UNIFORM_LESSON = next(l for l in LESSONS if l.name.startswith("6 "))
UNIFORM_ASSET = ROOT / "assets" / "tiny-gemma"


def test_lesson_6_moves_from_the_masked_model_to_the_uniform_one_then_raises_the_entropy_bound():
    from dinfer_viz.studies.lessons import LARGER_BOUND, UNIFORM_MODEL
    from engine.kinds.uniform import UniformSampler

    lesson = UNIFORM_LESSON
    assert [lesson.model(i) for i in range(3)] == ["tiny-llada", UNIFORM_MODEL, UNIFORM_MODEL]
    assert [lesson.config(i).decoder for i in range(3)] == ["threshold", "uniform", "uniform"]
    default = UniformSampler.options["entropy_bound"].default
    assert [lesson.config(i).decoder_options.get("entropy_bound", default) for i in (1, 2)] == [default, LARGER_BOUND] and LARGER_BOUND > default
    assert [(lesson.config(i).block_length, lesson.config(i).gen_length) for i in range(3)] == [(16, 32)] * 3  # tiny-gemma's canvas: 16
    # moving to a uniform-state model takes its sampler with it: one setting; any other pair stays two
    check_lessons((lesson,))
    back = Lesson("back", "p", {"decoder": "uniform", "model": "u"}, (Step("a", {}, "x."), Step("b", {"model": "m", "decoder": "threshold"}, "y.")))
    check_lessons((back,))
    sampler_and_bound = Lesson("two", "p", {}, (Step("a", {}, "x."), Step("b", {"decoder": "uniform", "decoder_options": {"entropy_bound": 1.0}}, "y.")))
    with pytest.raises(EngineError, match="changes"):
        check_lessons((sampler_and_bound,))


def test_the_run_tab_puts_lesson_6_s_model_and_the_uniform_sampler_s_bound_in_its_controls():
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.studies.lessons import LARGER_BOUND, UNIFORM_MODEL
    from dinfer_viz.ui import Handlers

    h = Handlers(EngineHost(ModelSpec("/nonexistent")), no_model=True)
    fields = [c.field for c in all_controls()]
    for step, bound in ((1, 0.1), (2, LARGER_BOUND)):
        menu, prompt, note, *values, model_box = h.lesson_step(UNIFORM_LESSON.name, step)
        got = dict(zip(fields, values))
        assert model_box == UNIFORM_MODEL and prompt == UNIFORM_LESSON.prompt and f"Step {step + 1} of 3" in note
        assert got["decoder"] == "uniform" and got["decoder_options.entropy_bound"] == bound
    *_, model_box = h.lesson_step(UNIFORM_LESSON.name, 0)
    assert model_box == "tiny-llada"


def first_accepted(trace) -> set[int]:
    """The positions a uniform run's first denoising step accepted (its other positions were re-noised)."""
    return set(trace.iterations[0].committed[0])


def test_lesson_6_s_uniform_steps_on_a_stand_in_model_record_their_bound_and_the_larger_accepts_more(tiny_gemma_folder):
    """On the tests' random DiffusionGemma (its canvas for the lesson's 16): each step's records
    carry the bound the step sets; the same seed gives both runs the same first forward, so the
    larger bound's first step accepts what the smaller's did and more."""
    import torch

    from engine import Engine, RunHooks

    from .gemma_models import CANVAS

    torch.set_num_threads(1)
    engine = Engine(str(tiny_gemma_folder))
    traces = [engine.generate(UNIFORM_LESSON.prompt, UNIFORM_LESSON.config(i).replace(block_length=CANVAS), RunHooks(trace=True)).output.trace for i in (1, 2)]
    bounds = [{rec.state["bound"] for rec in trace.iterations} for trace in traces]
    assert bounds == [{0.1}, {UNIFORM_LESSON.config(2).decoder_options["entropy_bound"]}]
    assert first_accepted(traces[1]) > first_accepted(traces[0])  # a strict superset


@pytest.mark.skipif(not (UNIFORM_ASSET / "config.json").exists(), reason="needs the embedded uniform-state model assets/tiny-gemma")
@pytest.mark.skipif(not (ROOT / "assets" / "tiny-llada" / "config.json").exists(), reason="needs the embedded masked model")
def test_lesson_6_masked_then_noise_into_the_sum_then_fewer_steps_with_the_larger_bound():
    """Decided from the runs' traces on the shipped models: the masked run answers right; tiny-gemma
    answers right from noise (its first step re-noises part of the canvas: the open digits); the
    larger bound's first step accepts all that the default's did (the same seed, so the same first
    forward), and its canvas settles in fewer denoising steps."""
    import torch

    from engine import Engine, RunHooks
    from tinymodel.eval import check_answer
    from tinymodel.tasks import parse_prompt

    torch.set_num_threads(1)
    lesson = UNIFORM_LESSON
    example = parse_prompt(lesson.prompt)
    assert example is not None
    masked = Engine(str(ROOT / "assets" / "tiny-llada")).generate(lesson.prompt, lesson.config(0), RunHooks(trace=True))
    assert check_answer(example, masked.text), masked.text
    engine = Engine(str(UNIFORM_ASSET))
    assert engine.model.canvas_length == lesson.config(1).block_length
    runs = [engine.generate(lesson.prompt, lesson.config(i), RunHooks(trace=True)) for i in (1, 2)]
    assert check_answer(example, runs[0].text), runs[0].text  # step 3's sum the look sentence asks to check
    traces = [run.output.trace for run in runs]
    assert traces[0].iterations[0].state["renoised"][0]  # the first step re-noised part of the canvas
    assert first_accepted(traces[1]) >= first_accepted(traces[0])
    steps = [len(trace.iterations) for trace in traces]
    assert steps[1] < steps[0], steps
