"""Compare across kinds of diffusion and settings: a masked model (the embedded tiny-llada, or its
random stand-in) against a uniform-state one (the tiny random DiffusionGemma of tests/gemma_models.py),
each side fitted to its own model, one slider over runs of different lengths; and "B uses its own
settings" (issue #26: the base model with one decoder against a second model with another).
Everything is decided from the runs' traces, never from timing."""

from __future__ import annotations

import asyncio
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
import pytest

from dinfer_viz.panes.grid import grid_value
from dinfer_viz.live.host import EngineHost, ModelSpec, model_title
from dinfer_viz.settings import all_controls, control_value
from dinfer_viz.tabs.compare import COMPARE_FIELDS, COMPARE_VIEW, DECODER_OWN, SCRUB_LABEL
from dinfer_viz.ui import Handlers
from dinfer_viz.views import view_for
from engine import Engine, GenerationConfig, RunHooks

from .app_support import app_model, random_char_model
from .gemma_models import CANVAS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")
PROMPT = "Q: 7+58=? A:"
SMALL = {"gen_length": 16, "block_length": 16, "threshold": 0.9}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_gemma_folder) -> dict[str, str]:
    """The embedded models by name: a masked one, a second masked one, a uniform-state one."""
    return {
        "tiny-llada": app_model(tmp_path_factory),
        "other-llada": str(random_char_model(tmp_path_factory.mktemp("other-llada"))),
        "tiny-gemma": str(tiny_gemma_folder),
    }


@pytest.fixture(scope="module")
def handlers(models) -> Handlers:
    return Handlers(EngineHost(ModelSpec(models["tiny-llada"]), embedded=models), fps=1000, plot_hz=1000)


def finished(frames) -> dict:
    """Every slot the streamed outputs filled, by name, as the page ends up showing them."""
    seen: dict = {}
    for frame in frames:
        seen.update({k: v for k, v in zip(COMPARE_VIEW, frame) if not (isinstance(v, dict) and v == gr.skip())})
    return seen


def solo(path: str, config: dict) -> list[list[int]]:
    """The final canvas of PROMPT under `config` (a trace's header) on a fresh engine of that model."""
    return Engine(path).generate(PROMPT, GenerationConfig.from_dict(config), RunHooks(trace=True)).output.trace.final


def test_a_masked_model_against_a_uniform_one_each_runs_its_own_kind_on_one_slider(handlers, models):
    view = finished(handlers.compare(PROMPT, {"config": SMALL}, None, "tiny-gemma", 1))
    state = view["state"]
    a, b = state.a.trace.config, state.b.trace.config
    assert (a["decoder"], a["block_length"]) == ("threshold", 16)  # A's settings as chosen
    # B: the same settings fitted to the uniform-state model: its sampler, on canvases of its length
    assert (b["decoder"], b["block_length"], b["gen_length"]) == ("uniform", CANVAS, 16)
    assert state.a.kind == "masked" and state.b.kind == "uniform"
    assert state.a.trace.final == solo(models["tiny-llada"], a) and state.b.trace.final == solo(models["tiny-gemma"], b)
    assert "masked diffusion (threshold)" in view["title_a"] and "uniform-state diffusion (uniform)" in view["title_b"]
    assert state.labels == ("A: tiny-llada · threshold, τ=0.9, cache none, block 16", f"B: {model_title('tiny-gemma')} · uniform, entropy bound 0.1, canvas {CANVAS}")
    assert "(both:" not in view["message"]  # the sides' settings differ, so each label gives its own

    counts = (state.a.iterations, state.b.iterations)
    held = f"ends after iteration {min(counts)} of {max(counts)} and holds its last frame"
    assert (held in view["message"]) == (counts[0] != counts[1])
    assert (view["scrub"]["maximum"], view["scrub"]["value"]) == (max(counts), max(counts))
    for number in range(max(counts) + 1):
        shown = dict(zip(COMPARE_VIEW, handlers.compare_replay(number, state)))
        for side, tl in (("a", state.a), ("b", state.b)):
            assert shown[f"grid_{side}"] == grid_value(tl, min(number - 1, tl.iterations - 1), tl.expected)
    # the chart counts a uniform run's settled tokens (its view's settled_tokens), not its noise
    curves = {t.name: list(t.y) for t in view["chart"].data if t.uid in ("i-0", "i-1")}
    assert curves[state.labels[1]][-1] == view_for(state.b).settled_tokens(state.b, state.b.iterations) and curves[state.labels[0]][-1] == view_for(state.a).settled_tokens(state.a, state.a.iterations)


def test_a_uniform_model_against_a_masked_one_gives_the_masked_side_the_settings_as_chosen(handlers, models):
    """The reverse: A on the uniform-state model runs its sampler; B, the masked model, runs the
    settings as they were chosen (threshold), not A's fitted ones."""
    view = finished(handlers.compare(PROMPT, {"model": {"path": "tiny-gemma"}, "config": SMALL}, None, "tiny-llada", 1))
    state = view["state"]
    assert state.a.trace.config["decoder"] == "uniform" and state.b.trace.config["decoder"] == "threshold"
    assert state.b.trace.config["block_length"] == 16 and state.b.trace.final == solo(models["tiny-llada"], state.b.trace.config)
    assert "uniform-state" in view["title_a"] and "masked" in view["title_b"]


def test_b_uses_its_own_settings_on_model_b_only_when_asked(handlers, models):
    """Issue #26: A, the base model with threshold; B, a second model with its own decoder. Without
    the flag B runs A's settings and settings_b is not read (today's behaviour)."""
    own = {"config": {**SMALL, "decoder": "fixed"}}
    view = finished(handlers.compare(PROMPT, {"config": SMALL}, own, "other-llada", 1, "", True))
    state = view["state"]
    assert state.a.trace.config["decoder"] == "threshold" and state.b.trace.config["decoder"] == "fixed"
    assert state.b.trace.final == solo(models["other-llada"], state.b.trace.config)
    assert state.labels == ("A: tiny-llada · threshold, τ=0.9, cache none, block 16", "B: other-llada · fixed, cache none, block 16")
    unread = finished(handlers.compare(PROMPT, {"config": SMALL}, own, "other-llada", 1))["state"]
    assert unread.b.trace.config == unread.a.trace.config

    # B's own settings reach a uniform-state model too: its sampler's bound as chosen
    bound = {"config": {"decoder": "uniform", "gen_length": 16, "block_length": CANVAS, "decoder_options": {"entropy_bound": 0.5}}}
    uniform = finished(handlers.compare(PROMPT, {"config": SMALL}, bound, "tiny-gemma", 1, "", True))["state"].b
    assert uniform.trace.config["decoder_options"] == {"entropy_bound": 0.5}
    assert {rec.state["bound"] for rec in uniform.records} == {0.5}


def test_the_page_applies_b_s_side_on_model_b_only_with_b_uses_its_own_settings(handlers):
    base = ["tiny-llada", "cpu", "auto", *[None] * len(handlers.option_names), *(control_value(c, GenerationConfig()) for c in all_controls())]
    own = [control_value(c, GenerationConfig()) for c in all_controls() if c.field in DECODER_OWN]  # each decoder's other settings, at their defaults
    a_side, b_side = ["fixed", 0.5, "none", 8, False, False, "none", "", *own, None], ["edit", 0.3, "none", 32, False, False, "none", "", *own, None]
    assert len(a_side) == len(COMPARE_FIELDS)
    a, b = handlers.compare_settings(*base, *a_side, *b_side, "other-llada", True)
    assert a["config"]["decoder"] == GenerationConfig().decoder  # A: the Run tab's settings
    assert (b["config"]["decoder"], b["config"]["threshold"], b["config"]["block_length"]) == ("edit", 0.3, 32)
    assert (a["model"]["path"], b["model"]["path"]) == ("tiny-llada", "other-llada")
    a, b = handlers.compare_settings(*base, *a_side, *b_side, "other-llada", False)
    assert a["config"] == b["config"]
    a, b = handlers.compare_settings(*base, *a_side, *b_side, "", True)  # no model B: each side its changes
    assert (a["config"]["decoder"], b["config"]["decoder"], b["model"]["path"]) == ("fixed", "edit", "tiny-llada")


def test_the_tab_offers_the_box_only_with_model_b_and_the_api_takes_it_last(handlers):
    """/compare's inputs end with the box (default off), so clients passing the earlier ones by
    place keep working; the box shows with model B set, and B's settings with it."""
    from dinfer_viz.ui import build_demo

    demo = build_demo(handlers)
    fns = list(demo.fns.values())
    api = next(fn for fn in fns if fn.api_name == "compare")
    box = api.inputs[-1]
    assert box.elem_id == "compare-b-own" and box.value is False and not box.visible
    assert len(api.outputs) == len(COMPARE_VIEW) and next(c for c in demo.blocks.values() if getattr(c, "elem_id", None) == "compare-scrub").label == SCRUB_LABEL

    chosen = next(fn for fn in fns if [c.elem_id for c in fn.inputs] == ["compare-model-b", "compare-b-own", "call-number"] and box in fn.outputs)
    assert all(isinstance(group, gr.Column) for group in chosen.outputs[:2])  # A's settings, B's settings, the box

    numbers = iter(range(1, 100))

    def shown(*values):  # Gradio's request first, the page's call number last, awaited (common.redraw_on)
        return asyncio.run(chosen.fn(None, *values, next(numbers)))

    assert [u["visible"] for u in shown("other-llada", False)] == [False, False, True]
    assert [u["visible"] for u in shown("other-llada", True)] == [False, True, True]
    assert [u["visible"] for u in shown("", True)] == [True, True, False]
