"""The page's logic behind issue #44 items 8 and 9: a constrained run is not compared against an
answer its constraint cannot write (the expected box's suggestion), the settings line keeps a
regex's leading spaces, the decoder box follows the model's kind (a uniform-state model runs its
own sampler), and a uniform-state run's canvases that never ran are no longer "not generated yet"
once the run is done."""

from __future__ import annotations

from pathlib import Path

import pytest

from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.settings import CONSTRAINT, CONSTRAINT_TEXT, all_controls, control_value
from dinfer_viz.live.system import offered_options
from dinfer_viz.tabs.run_settings import constraint_admits, held_words
from dinfer_viz.reading.timeline import Timeline
from dinfer_viz.ui import Handlers
from dinfer_viz.views.uniform.uniform_grid import uniform_state
from engine import Engine, GenerationConfig
from engine.constraints import ConstraintSpec
from engine.hooks import RunHooks
from engine.trace import Trace

ASSETS = Path(__file__).resolve().parents[1] / "assets"
PROMPT = "Q: 7+58=? A:"
ANSWER = "   7+ 58=  65"  # the embedded models' answer format: it echoes the operands


@pytest.fixture(scope="module")
def handlers() -> Handlers:
    return Handlers(EngineHost(ModelSpec(str(ASSETS / "tiny-llada"))), fps=1000, plot_hz=1000)


def page_values(model: str, **changes) -> list:
    """The Run tab's values as the page sends them (TabHandlers.settings' order), `changes` by field."""
    values = {c.field: control_value(c, GenerationConfig()) for c in all_controls()} | changes
    return [model, "cpu", "auto", *((1 if o.kind is int else False) for o in offered_options()), *(values[c.field] for c in all_controls())]


def test_the_expected_answer_is_suggested_only_where_the_constraint_can_write_it(handlers):
    assert handlers.suggest_expected(PROMPT)[0] == ANSWER  # no constraint
    assert handlers.suggest_expected(PROMPT, "none", "")[0] == ANSWER
    assert handlers.suggest_expected(PROMPT, "json_schema", '{"type": "object"}')[0] == ""  # JSON: never this answer
    assert handlers.suggest_expected(PROMPT, "choice", "65\n66\n64")[0] == ""  # not in the model's format
    assert handlers.suggest_expected(PROMPT, "choice", f"{ANSWER}\n   7+ 58=  66")[0] == ANSWER
    assert handlers.suggest_expected(PROMPT, "regex", r" *[0-9]+\+ *[0-9]+= *[0-9]+")[0] == ANSWER
    assert handlers.suggest_expected(PROMPT, "regex", r"[0-9]+")[0] == ""
    assert handlers.suggest_expected(PROMPT, "regex", "")[0] == ANSWER  # unfinished: the settings check says so
    assert handlers.suggest_expected(PROMPT, "regex", "(")[0] == ""  # no regex Python reads: nothing to compare with
    assert handlers.suggest_expected("Q: ?+?=38 A:", "none", "")[0] == ""  # pair-sum: many answers, none suggested


def test_constraint_admits_reads_each_mode():
    assert constraint_admits(None, None, "x") and constraint_admits("none", "whatever", "x")
    assert constraint_admits("json_schema", '{"type": "object"}', '{"a": 1}')
    assert not constraint_admits("json_schema", '{"type": "object"}', ANSWER)
    assert constraint_admits("choice", "yes\nno", "no") and not constraint_admits("choice", "yes\nno", "maybe")


def test_the_settings_line_keeps_a_regexs_spaces():
    words = held_words(ConstraintSpec("regex", "  [0-9]+ \\+ [0-9]+ "))
    assert words.startswith("regex “\u00a0\u00a0") and words.endswith("\u00a0”")  # Markdown would drop them
    assert "+ \\+" not in words and "&#92;+ " in words  # escaped; a single inner space stays a space (a line may wrap there)
    assert held_words(ConstraintSpec("choice", ("a", "b"))) == 'choice &#91;"a", "b"&#93;'


def test_the_decoder_box_follows_the_models_kind(handlers):
    to_uniform = handlers.fitted_decoder(*page_values(str(ASSETS / "tiny-gemma"), decoder="threshold"))
    assert to_uniform["value"] == "uniform"  # the sampler a uniform-state model runs, whatever the box held
    back = handlers.fitted_decoder(*page_values(str(ASSETS / "tiny-llada"), decoder="uniform"))
    assert back["value"] == GenerationConfig().decoder
    unchanged = handlers.fitted_decoder(*page_values(str(ASSETS / "tiny-llada"), decoder="credit"))
    assert unchanged == {"__type__": "update"} or unchanged.get("value") is None  # a masked decoder on a masked model stays
    invalid = handlers.fitted_decoder(*page_values(str(ASSETS / "tiny-llada"), gen_length=-5))
    assert invalid.get("value") is None  # invalid settings: the check says why, the box stays


def test_a_uniform_runs_canvases_that_never_ran_are_fill_once_it_is_done():
    engine = Engine(str(ASSETS / "tiny-gemma"))
    run = engine.generate(PROMPT, GenerationConfig(gen_length=64), RunHooks(trace=True))
    tl = Timeline(Trace.from_dict(run.output.trace.to_dict()))
    last = tl.iterations - 1
    end = tl.records[last].block_range[1]
    assert tl.finished and end < tl.canvas_length, "the embedded model ends this answer in its first canvases"
    for p in range(end, tl.canvas_length):
        assert uniform_state(tl, tl.canvas_at(last), p, last) == "fill"  # the row ended: never generated
        assert uniform_state(tl, tl.canvas_at(last - 1), p, last - 1) == "masked"  # before the end: not yet


def test_the_diff_chart_of_equal_runs_marks_the_step_shown_apart_from_a_difference():
    """Item 10: a trace against itself differs nowhere; the step shown is not drawn in the strip's
    red, and the axes tick whole numbers from 0 (an all-zero curve put "0" on "0.5")."""
    from dinfer_viz.panes.diff_view import diff_figure, diff_state
    from dinfer_viz.drawing.figure_base import SHOWN_LINE

    from .app_support import handmade_trace

    state = diff_state(handmade_trace(), handmade_trace())
    assert state.count > 1 and all(not state.differing(k) for k in range(state.count))
    fig = diff_figure(state, highlight=0)
    line = fig.layout.shapes[0].line
    assert line.color != SHOWN_LINE["color"] and line.dash == "dash"
    assert fig.layout.yaxis.range[0] == 0 and fig.layout.yaxis.tickformat == "d" and fig.layout.yaxis.dtick == 1
    assert fig.layout.xaxis.tickformat == "d" and fig.layout.xaxis.dtick >= 1


def test_the_compare_csv_has_each_runs_edits_and_remasks():
    """Item 10: the Compare CSV carries a revising decoder's edits and remasks, as the sweep's does."""
    import csv
    import io

    from dinfer_viz.panes.export import compare_csv

    from .app_support import handmade_trace

    edited = handmade_trace()
    edited.stats.update(edits=3, remasks=1)
    rows = list(csv.DictReader(io.StringIO(compare_csv([Timeline(handmade_trace()), Timeline(edited)], ["A", "B"]))))
    assert [(r["edits"], r["remasks"]) for r in rows] == [("0", "0"), ("3", "1")]
