"""Issue 35 item 5, through the handlers: the constraint control (one mode and one text box, on the
Run tab and on each Compare side) checked by the engine's own check before any run, a constrained
run's grid marking where the constraint removed the model's top-1, the details panel saying what
the model wanted and what the constraint allowed and removed, the raster's markers, the lesson's
claims on the embedded model, old traces as before, and every string escaped."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
import pytest

from dinfer_viz.drawing.constraint import CUT, run_constraint
from dinfer_viz.panes.details import position_details
from dinfer_viz.panes.figures import confidence_raster
from dinfer_viz.panes.grid import grid_value, legend_html
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.studies.lessons import LESSONS, PAIR_SUM_REGEX, STRUCTURE_LESSON_PROMPT
from dinfer_viz.live.system import offered_options
from dinfer_viz.settings import CONSTRAINT, CONSTRAINT_TEXT, OTHER_SECTION, all_controls, build_config, control_value, sections
from dinfer_viz.tabs.compare import COMPARE_FIELDS, COMPARE_VIEW
from dinfer_viz.tabs.run import RUN_VIEW
from dinfer_viz.reading.timeline import Timeline
from dinfer_viz.ui import Handlers
from engine import EngineError, GenerationConfig

from .app_support import EMBEDDED_MODEL, app_model

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")
STRUCTURE = next(lesson for lesson in LESSONS if lesson.prompt == STRUCTURE_LESSON_PROMPT)
PAIR = re.compile(PAIR_SUM_REGEX)
needs_embedded = pytest.mark.skipif(not (EMBEDDED_MODEL / "config.json").is_file(), reason="the lesson's claims are the shipped model's")


@pytest.fixture(scope="module")
def handlers(tmp_path_factory) -> Handlers:
    return Handlers(EngineHost(ModelSpec(app_model(tmp_path_factory))), fps=1000, plot_hz=1000)


def final(frames, slots=RUN_VIEW) -> dict:
    """The slots a streamed handler filled, by name, as the page ends up showing them."""
    seen: dict = {}
    for frame in frames:
        seen.update({k: v for k, v in zip(slots, frame) if not (isinstance(v, dict) and v == gr.skip())})
    return seen


def page_values(handlers: Handlers, **changes) -> list:
    """The Run tab's control values as the page sends them, the constraint's two boxes set by `changes`."""
    values = {c.field: control_value(c, GenerationConfig()) for c in all_controls()} | changes
    return [None, None, None, *((1 if o.kind is int else False) for o in offered_options()), *(values[c.field] for c in all_controls())]


def constrained_run(handlers: Handlers, regex: str | None = PAIR_SUM_REGEX, threshold: float = 0.1) -> dict:
    config = {"threshold": threshold, CONSTRAINT: "regex" if regex else "none", CONSTRAINT_TEXT: regex or ""}
    return final(handlers.run(STRUCTURE_LESSON_PROMPT, {"config": config}))


# ---- the control -------------------------------------------------------------------------------
def test_one_control_stands_for_the_three_fields_and_round_trips_each():
    fields = [c.field for _, ctrls in sections() for c in ctrls]
    assert CONSTRAINT in fields and CONSTRAINT_TEXT in fields
    other = dict(sections()).get(OTHER_SECTION, ())
    assert not {"regex", "json_schema", "choice"} & {c.field for c in other}  # no second way in the page
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for mode, text, field, value in (
        ("regex", r" [0-9]+", "regex", r" [0-9]+"),
        ("json_schema", json.dumps(schema), "json_schema", schema),
        ("choice", " yes\n no\n", "choice", [" yes", " no"]),  # one per line, spaces kept, blank lines dropped
    ):
        config = build_config({CONSTRAINT: mode, CONSTRAINT_TEXT: text})
        assert getattr(config, field) == value
        boxes = {c.field: control_value(c, config) for c in all_controls() if c.field in (CONSTRAINT, CONSTRAINT_TEXT)}
        assert boxes[CONSTRAINT] == mode and getattr(build_config({CONSTRAINT: mode, CONSTRAINT_TEXT: boxes[CONSTRAINT_TEXT]}), field) == value
    free = build_config({CONSTRAINT: "none", CONSTRAINT_TEXT: "ignored"})
    assert (free.regex, free.json_schema, free.choice) == (None, None, None)
    assert build_config({"regex": "a"}).regex == "a"  # the API's field by name still works


@pytest.mark.parametrize(
    "config, says",
    [
        ({CONSTRAINT: "regex", CONSTRAINT_TEXT: "  "}, "box is empty"),
        ({CONSTRAINT: "grammar", CONSTRAINT_TEXT: "x"}, "unknown mode"),
        ({CONSTRAINT: "regex", CONSTRAINT_TEXT: "a", "regex": "b"}, "given twice"),
        ({CONSTRAINT: "regex", CONSTRAINT_TEXT: "a", "choice": ["b"]}, "at most one"),
        ({CONSTRAINT: "regex", CONSTRAINT_TEXT: "(["}, "invalid regex"),
        ({CONSTRAINT: "json_schema", CONSTRAINT_TEXT: "{"}, "not valid JSON"),
        ({CONSTRAINT: "json_schema", CONSTRAINT_TEXT: '{"type": 5}'}, "not a valid JSON Schema"),
    ],
)
def test_a_bad_constraint_is_one_line(config, says):
    with pytest.raises(EngineError, match=says) as caught:
        build_config(config)
    assert "\n" not in str(caught.value)


def test_the_page_refuses_a_bad_constraint_before_run_in_one_escaped_line(handlers):
    message, button = handlers.check(*page_values(handlers, **{CONSTRAINT: "regex", CONSTRAINT_TEXT: "<b>*x*(["}))
    assert button["interactive"] is False and "invalid regex" in message and "\n" not in message
    assert "<b>" not in message and "*x*" not in message  # shown as typed: no HTML, no Markdown emphasis
    message, button = handlers.check(*page_values(handlers, **{CONSTRAINT: "regex", CONSTRAINT_TEXT: PAIR_SUM_REGEX}))
    assert button["interactive"] is True and message.startswith("settings ok") and "held to regex" in message
    run = final(handlers.run(STRUCTURE_LESSON_PROMPT, {"config": {CONSTRAINT: "choice", CONSTRAINT_TEXT: ""}}))
    assert "box is empty" in run["message"] and run["state"] is None  # through the API: refused, no run


# ---- a constrained run's views -----------------------------------------------------------------
def cut_cells(view: dict) -> list[dict]:
    return [c for c in view["grid"]["cells"] if CUT in c["k"].split()]


def test_the_grid_marks_where_the_constraint_removed_the_top1_and_the_details_say_what_the_model_wanted(handlers):
    view = constrained_run(handlers)
    tl = view["state"].timeline
    assert run_constraint(tl) is not None and "constraint removed the model" in view["grid"]["legend"]
    cut = cut_cells(view)
    assert cut, "the constraint removed no top-1: the lesson's prompt no longer shows anything"
    assert all("constraint removed the model&#x27;s top-1" in c["tip"] for c in cut)
    assert "constraint removed" in view["grid"]["caption"]
    p = cut[0]["p"]
    details = position_details(tl, p, tl.iterations - 1)
    text = re.sub(r"<[^>]+>", " ", details)
    for words in ("the model wanted", "with probability", "allowed here", "of the probability mass removed", "the constraint removed it"):
        assert words in text, words
    assert ">constraint<" in details  # the history table's column
    raster = confidence_raster(tl)
    markers = next(t for t in raster.data if t.uid == "constraint-cut")
    assert len(markers.x) >= len(cut) and all("mass removed" in t for t in markers.text)
    # every finished answer is a word of the language
    assert PAIR.fullmatch(view["state"].text or tl.text_at(tl.iterations - 1))


def test_an_unconstrained_run_and_an_old_trace_show_no_constraint(handlers):
    view = constrained_run(handlers, regex=None)
    tl = view["state"].timeline
    assert run_constraint(tl) is None and not cut_cells(view)
    assert "constraint" not in view["grid"]["legend"] and "constraint" not in view["grid"]["caption"]
    assert "constraint" not in position_details(tl, tl.prompt_length, tl.iterations - 1)
    assert not any(t.uid == "constraint-cut" for t in confidence_raster(tl).data)
    loaded = dict(zip(handlers.loaded_slots, handlers.load_sample("threshold-none.json")))  # a version-2 trace
    old = loaded["state"].timeline
    assert all(rec.constraint is None for rec in old.records)
    assert not cut_cells(loaded) and "constraint" not in loaded["grid"]["legend"]
    assert "constraint" not in position_details(old, old.prompt_length, old.iterations - 1)


def test_a_loaded_constrained_trace_fills_the_constraint_boxes_and_hostile_strings_stay_text(handlers, tmp_path):
    tl = constrained_run(handlers)["state"].timeline
    trace = tl.trace
    r = next(rec.constraint for rec in trace.iterations if rec.constraint)
    wanted = next(t for t, cut in zip(r["model_top1"][0], r["top1_removed"][0]) if cut)
    hostile = replace(trace, tokens={**trace.tokens, str(wanted): "<img src=x onerror=alert(1)>${7*7}`"})
    path = tmp_path / "constrained.json"
    path.write_text(hostile.to_json())
    loaded = dict(zip(handlers.loaded_slots, handlers.load_trace(str(path))))
    assert loaded[f"cfg:{CONSTRAINT}"] == "regex" and loaded[f"cfg:{CONSTRAINT_TEXT}"] == PAIR_SUM_REGEX
    again = loaded["state"].timeline
    p = next(c["p"] for c in cut_cells(loaded))
    shown = position_details(again, p, again.iterations - 1) + json.dumps(grid_value(again, again.iterations - 1))
    assert "<img" not in shown and "${" not in shown and "`" not in shown
    assert "&lt;img" in shown


@needs_embedded
def test_the_structure_lesson_holds_on_the_shipped_model(handlers):
    """Step 1 (τ 0.1, free): one forward, not `a + b`; step 2 (the pair-sum regex): one forward,
    `a + b`, the constraint having removed top-1s; step 3 (τ 0.9): more forwards, the same shape."""
    runs = []
    for i in range(len(STRUCTURE.steps)):
        config = {c.field: control_value(c, STRUCTURE.config(i)) for c in all_controls()}
        view = final(handlers.run(STRUCTURE.prompt, handlers.settings(*page_values(handlers, **config))))
        runs.append((view["state"].text, view["state"].timeline.iterations, len(cut_cells(view))))
    (free, free_its, _), (held, held_its, held_cut), (careful, careful_its, _) = runs
    assert free_its == held_its == 1 and careful_its > held_its
    assert not PAIR.fullmatch(free) and PAIR.fullmatch(held) and PAIR.fullmatch(careful), runs
    assert held_cut > 0


def test_a_uniform_state_run_marks_and_explains_its_constraint_too(handlers):
    if not (EMBEDDED_MODEL.parent / "tiny-gemma" / "config.json").is_file():
        pytest.skip("the embedded uniform-state model is not shipped here")
    settings = {"model": {"path": "tiny-gemma"}, "config": {"decoder": "uniform", "gen_length": 16, "block_length": 16, CONSTRAINT: "regex", CONSTRAINT_TEXT: PAIR_SUM_REGEX}}
    view = final(handlers.run(STRUCTURE_LESSON_PROMPT, settings))
    tl = view["state"].timeline
    assert PAIR.fullmatch(view["state"].text)
    marked = [(i, c["p"]) for i in range(tl.iterations) for c in grid_value(tl, i)["cells"] if CUT in c["k"].split()]
    assert marked and "constraint removed the model" in legend_html(tl)
    i, p = marked[0]
    assert "the model wanted" in position_details(tl, p, i)
    assert any(t.uid == "constraint-cut" for t in confidence_raster(tl).data)


# ---- Compare -----------------------------------------------------------------------------------
def test_each_compare_side_sets_its_own_constraint(handlers):
    base = page_values(handlers)
    n = len(COMPARE_FIELDS)
    side = {f: control_value(next(c for c in all_controls() if c.field == f), GenerationConfig()) for f in COMPARE_FIELDS}
    a = [side[f] for f in COMPARE_FIELDS]
    b = [{**side, "threshold": 0.1, CONSTRAINT: "regex", CONSTRAINT_TEXT: "(["}[f] for f in COMPARE_FIELDS]
    message, button = handlers.check_sides(*base, *a, *b, "", False)
    assert message.startswith("**⚠ B: invalid regex") and button["interactive"] is False
    b[COMPARE_FIELDS.index(CONSTRAINT_TEXT)] = PAIR_SUM_REGEX
    message, button = handlers.check_sides(*base, *a, *b, "", False)
    assert message == "" and button["interactive"] is True and len(a) == len(b) == n
    settings_a, settings_b = handlers.compare_settings(*base, *[{**side, "threshold": 0.1}[f] for f in COMPARE_FIELDS], *b, "", False)
    done = final(handlers.compare(STRUCTURE_LESSON_PROMPT, settings_a, settings_b, "", 1), COMPARE_VIEW)
    state = done["state"]
    assert run_constraint(state.a) is None and run_constraint(state.b) is not None
    assert "regex" in state.labels[1] and "regex" not in state.labels[0]
    assert not any(CUT in c["k"].split() for c in done["grid_a"]["cells"])
    assert any(CUT in c["k"].split() for c in done["grid_b"]["cells"]) and PAIR.fullmatch(done["text_b"])
