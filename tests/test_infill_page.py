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
