"""Fill in the middle on the page (issue 57 items 1 and 3, through the handlers): the suffix and
template boxes say which models fill; a template run's grid shows the pinned cells from its first
frame to its last; a block-causal model's refusal is the engine's one line, under Run before the
run and in the message area through the API, and the session goes on."""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest

from dinfer_viz.drawing.cells import PINNED
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.settings import all_controls
from dinfer_viz.ui import Handlers

from .app_support import EMBEDDED_MODEL, app_model
from .test_constraint_app import final, page_values

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")
BLOCK_CAUSAL = EMBEDDED_MODEL.parent / "tiny-llada2"
PROMPT = "Q: ?+?=57 A:"


@pytest.fixture(scope="module")
def handlers(tmp_path_factory) -> Handlers:
    return Handlers(EngineHost(ModelSpec(app_model(tmp_path_factory))), fps=1000, plot_hz=1000)


def test_the_boxes_say_which_models_fill_and_which_refuse():
    infos = {c.field: c.info for c in all_controls() if c.field in ("suffix", "template")}
    assert set(infos) == {"suffix", "template"}
    for info in infos.values():
        assert "full attention" in info and "tiny-llada" in info and "block-causal" in info and "refuses" in info


def pinned_cells(grid: dict) -> list[int]:
    return [c["p"] for c in grid["cells"] if c["k"].split()[0] == PINNED]


def test_a_template_run_shows_its_pinned_cells_live_and_after(handlers):
    frames = list(handlers.run(PROMPT, {"config": {"template": "{{hole:3}} + 34", "block_length": 8, "decoder": "threshold", "cache": "none"}}))
    view = final(frames)
    tl = view["state"].timeline
    assert "done" in view["message"] and tl.pinned and len(tl.pinned) == len(" + 34")  # a character per position
    assert pinned_cells(view["grid"]) == sorted(tl.pinned)
    first_live = next(f["grid"]["live"] for f in (final([frame]) for frame in frames) if isinstance(f.get("grid"), dict) and "live" in f["grid"] and "canvas" in f["grid"]["live"])
    assert sorted(p for p, _, kind, _ in first_live["canvas"] if kind == PINNED) == sorted(tl.pinned)  # what was asked, at Run
    assert "".join(tl.text_of(tl.initial[p]) for p in sorted(tl.pinned)) == " + 34"


@pytest.mark.skipif(not (BLOCK_CAUSAL / "config.json").is_file(), reason="needs the embedded block-causal model")
def test_a_block_causal_model_refuses_pinned_text_in_one_line_and_the_session_goes_on(handlers):
    values = page_values(handlers, suffix=" + 34", gen_length=8, block_length=8)
    values[0] = str(BLOCK_CAUSAL)
    message, button, _ = handlers.check_with_prompt(PROMPT, *values)
    assert button["interactive"] is False and "block-causal" in message and "\n" not in message  # under Run, before the run
    refused = final(handlers.run(PROMPT, {"model": {"path": str(BLOCK_CAUSAL)}, "config": {"suffix": " + 34", "gen_length": 8, "block_length": 8}}))
    assert "block-causal" in refused["message"] and "\n" not in refused["message"].strip() and refused["state"] is None
    after = final(handlers.run(PROMPT, {"model": {"path": str(BLOCK_CAUSAL)}, "config": {"gen_length": 8, "block_length": 8}}))
    assert "done" in after["message"] and after["state"] is not None and not after["state"].timeline.pinned


@pytest.mark.skipif(not (EMBEDDED_MODEL / "config.json").is_file(), reason="lesson 9 runs the shipped model")
def test_lesson_9_pins_the_end_after_a_hole_and_the_order_analysis_counts_the_hole_only(handlers):
    """Step 1 writes the whole answer, nothing pinned; step 2 changes only the template: the hole of
    3 before ` + 34`, whose pinned cells the grid shows and the order analysis leaves out (what the
    base writes into the hole is its training's: ` 3`); step 3 changes only the model, to the one
    trained to fill, which writes ` 23` with every hole cell's first prediction its final token."""
    from dinfer_viz.panes.analysis_figure import analysis_text, order_figure
    from dinfer_viz.studies.lessons import INFILL_LESSON_PROMPT, INFILL_MODEL, INFILL_TEMPLATE, LESSONS
    from engine.analysis import decided_steps

    lesson = next(l for l in LESSONS if l.name.startswith("9 "))
    assert lesson.prompt == INFILL_LESSON_PROMPT and [lesson.settings(i)["template"] for i in range(2)] == [None, INFILL_TEMPLATE]
    assert [lesson.config(i).gen_length for i in range(3)] == [8, 3, 3] and [lesson.model(i) for i in range(3)] == ["tiny-llada", "tiny-llada", INFILL_MODEL]
    assert lesson.settings(2) == lesson.settings(1)  # step 3 changes the model only
    runs = []
    for i in range(3):
        _, prompt, note, *_ = handlers.lesson_step(lesson.name, i)
        assert prompt == INFILL_LESSON_PROMPT and f"Step {i + 1} of 3" in note
        view = final(handlers.run(prompt, {"model": {"path": lesson.model(i)}, "config": lesson.settings(i)}))
        assert "done" in view["message"], view["message"]
        runs.append(view)
    free, filled, trained = (v["state"].timeline for v in runs)
    assert not free.pinned and pinned_cells(runs[0]["grid"]) == []
    start = filled.prompt_length
    assert sorted(filled.pinned) == list(range(start + 3, start + 8)) == pinned_cells(runs[1]["grid"])
    assert "".join(filled.text_of(filled.initial[p]) for p in sorted(filled.pinned)) == " + 34"
    assert set(decided_steps(filled.trace)) == {start, start + 1, start + 2}  # the hole, in the model's order
    assert filled.iterations == 3  # the fixed decoder: one position a forward
    for tl in (free, filled):
        assert "order correlation ρ" in analysis_text(tl) and "order correlation" in order_figure(tl).layout.title.text
    # step 3: the model trained to fill writes the hole's one right answer, each cell's first guess
    assert sorted(trained.pinned) == sorted(filled.pinned) and trained.iterations == 3
    assert "pairsum verifier: valid" in runs[2]["message"] and "pairsum verifier: NOT valid" in runs[1]["message"]
    assert set(decided_steps(trained.trace).values()) == {0}
    # the readout's tokens are the model's, not the pinned text's (the app's batcher counted ` + 34` too)
    assert trained.trace.stats["tokens"] == 3 and filled.trace.stats["tokens"] <= 3
