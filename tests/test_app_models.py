"""Several embedded models in the app: found by name under assets/, set side by side in Compare (model
B), overlaid in the threshold sweep; through the handlers, the Gradio API and a browser.

The second model is a random LLaDA with the embedded model's tokenizer (tests/app_support.py), so
its tokens differ from the first's: a side that ran on the wrong engine would show. Nothing here
needs assets/tiny-llada-td.
"""

from __future__ import annotations

import csv
import io
import os
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
import pytest

from dinfer_viz.studies import answers
from dinfer_viz.panes.grid import grid_value
from dinfer_viz.live.host import DISTILLED, EngineHost, ModelSpec, embedded_models
from dinfer_viz.tabs.compare import COMPARE_VIEW
from dinfer_viz.tabs.sweep import SWEEP_TABLE_HEADERS, SWEEP_VIEW
from dinfer_viz.ui import Handlers
from engine import Engine, EngineError, GenerationConfig, RunHooks

from .app_support import app_model, chromium, launch_app, open_app, random_char_model

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")
PROMPT = "Q: 48+57=? A:"
SMALL = {"gen_length": 16, "block_length": 16, "threshold": 0.9}
TITLE_B = f"{DISTILLED} (trajectory-distilled)"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Two embedded models by name: the app's test model, and a different model standing in for the distilled copy."""
    return {"tiny-llada": app_model(tmp_path_factory), DISTILLED: str(random_char_model(tmp_path_factory.mktemp("other-llada")))}


@pytest.fixture(scope="module")
def handlers(models) -> Handlers:
    return Handlers(EngineHost(ModelSpec(models["tiny-llada"]), embedded=models), fps=1000, plot_hz=1000)


def solo(path: str, config: dict) -> list[int]:
    """The final canvas of `PROMPT` generated on a fresh engine of that model alone."""
    return Engine(path).generate(PROMPT, GenerationConfig(**config), hooks=RunHooks(trace=True)).output.trace.final[0]


def last(frames) -> dict:
    """Every slot a handler's streamed outputs filled, by name, as the page ends up showing them."""
    seen: dict = {}
    for frame in frames:
        seen.update({k: v for k, v in frame.items() if not (isinstance(v, dict) and v == gr.skip())})
    return seen


# ---- the model list --------------------------------------------------------------------------------
def test_the_model_list_finds_every_model_folder_and_names_the_distilled_one(tmp_path, monkeypatch):
    for name in ("tiny-llada", DISTILLED, "notes"):
        (tmp_path / name).mkdir()
    for name in ("tiny-llada", DISTILLED):
        (tmp_path / name / "config.json").write_text("{}")
    (tmp_path / "loose.json").write_text("{}")
    found = embedded_models(tmp_path)
    assert found == {"tiny-llada": str(tmp_path / "tiny-llada"), DISTILLED: str(tmp_path / DISTILLED)}  # "notes" has no config.json

    private = EngineHost(ModelSpec(found["tiny-llada"]), embedded=found)
    assert private.model_choices() == [("tiny-llada", "tiny-llada"), (TITLE_B, DISTILLED)]
    assert private.resolve(DISTILLED) == (found[DISTILLED], DISTILLED)  # a name, not a hub id
    assert private.resolve("org/some-model") == ("org/some-model", "")
    public = EngineHost(ModelSpec(found["tiny-llada"]), allowed={"tiny-llada": found["tiny-llada"]}, embedded=found)
    assert list(public.allowed) == ["tiny-llada", DISTILLED] and public.resolve(DISTILLED) == (found[DISTILLED], DISTILLED)
    with pytest.raises(EngineError, match="only these models: tiny-llada, tiny-llada-td"):
        public.resolve(str(tmp_path / "notes"))
    assert public.name_of(ModelSpec(found[DISTILLED])) == TITLE_B

    monkeypatch.setattr(answers, "embedded_models", lambda: found)
    assert f"**{TITLE_B}**" in answers.model_knows_markdown() and "knows the same families" in answers.model_knows_markdown()
    monkeypatch.setattr(answers, "embedded_models", lambda: {"tiny-llada": found["tiny-llada"]})
    assert DISTILLED not in answers.model_knows_markdown()


# ---- Compare: model B ------------------------------------------------------------------------------
def test_compare_two_models_gives_each_side_its_solo_tokens_and_one_slider_scrubs_both(handlers, models):
    frames = [dict(zip(COMPARE_VIEW, out)) for out in handlers.compare(PROMPT, {"config": SMALL}, None, DISTILLED)]
    view = last(frames)
    assert view["message"].startswith("done: A: tiny-llada") and f"B: {TITLE_B}" in view["message"]
    assert (view["title_a"], view["title_b"]) == ("### A · tiny-llada", f"### B · {TITLE_B}")
    state = view["state"]
    assert state.a.trace.final[0] == solo(models["tiny-llada"], SMALL)
    assert state.b.trace.final[0] == solo(models[DISTILLED], SMALL)
    assert state.a.trace.final[0] != state.b.trace.final[0]  # two models, not one run twice
    assert {s.path for s in handlers.host._engines} == set(models.values())  # each side on its own engine
    assert state.a.trace.config == state.b.trace.config  # the same settings on both

    longest = max(state.a.iterations, state.b.iterations)
    assert (view["scrub"]["minimum"], view["scrub"]["maximum"], view["scrub"]["value"]) == (0, longest, longest)  # 0: before the first forward
    for number in range(0, longest + 1):
        shown = dict(zip(COMPARE_VIEW, handlers.compare_replay(number, state)))
        for side, tl in (("a", state.a), ("b", state.b)):
            # the slider's number n is record n - 1; past its own end a run holds its last frame
            assert shown[f"grid_{side}"] == grid_value(tl, min(number - 1, tl.iterations - 1))
    end = dict(zip(COMPARE_VIEW, handlers.compare_replay(longest, state)))
    assert all("masked" not in cell["k"].split() for side in "ab" for cell in end[f"grid_{side}"]["cells"])


def test_compare_settings_without_model_b_keeps_each_sides_settings(handlers):
    view = last(dict(zip(COMPARE_VIEW, out)) for out in handlers.compare(PROMPT, {"config": {**SMALL, "decoder": "fixed"}}, {"config": SMALL}, ""))
    assert "A: fixed" in view["message"] and "B: threshold" in view["message"] and view["title_b"] == "### B"
    assert view["state"].a.trace.config["decoder"] == "fixed" and view["state"].b.trace.config["decoder"] == "threshold"


def test_model_b_that_is_a_s_own_model_or_unknown_is_a_message(handlers, models):
    same = [dict(zip(COMPARE_VIEW, out)) for out in handlers.compare(PROMPT, {"config": SMALL}, None, "tiny-llada")]
    assert same[-1]["message"] == "**⚠ tiny-llada is already the run's model: choose a different second model**"
    public = Handlers(EngineHost(ModelSpec(models["tiny-llada"]), allowed={"tiny-llada": models["tiny-llada"]}, embedded=models))
    stranger = [dict(zip(COMPARE_VIEW, out)) for out in public.compare(PROMPT, {"config": SMALL}, None, "/etc")]
    assert "this server loads only these models" in stranger[-1]["message"]


def test_the_page_sends_the_run_tabs_settings_to_both_sides_when_model_b_is_set(handlers):
    from dinfer_viz.settings import all_controls, control_value
    from dinfer_viz.tabs.compare import COMPARE_FIELDS, DECODER_OWN

    base = ["tiny-llada", "cpu", "auto", *[None] * len(handlers.option_names), *(control_value(c, GenerationConfig()) for c in all_controls())]
    sides = ["fixed", 0.5, "none", 8, False, False, "none", "", *(control_value(c, GenerationConfig()) for c in all_controls() if c.field in DECODER_OWN), None] * 2
    assert len(sides) == 2 * len(COMPARE_FIELDS)
    a, b = handlers.compare_settings(*base, *sides, DISTILLED, False)  # last: "B uses its own settings"
    assert a["config"] == b["config"] and a["config"]["decoder"] == GenerationConfig().decoder
    assert (a["model"]["path"], b["model"]["path"]) == ("tiny-llada", DISTILLED)
    a, b = handlers.compare_settings(*base, *sides, "", False)
    assert a["config"]["decoder"] == "fixed" and b["model"]["path"] == "tiny-llada"


# ---- the sweep over two models -----------------------------------------------------------------------
def test_a_sweep_of_two_models_returns_points_for_both_and_overlays_two_curves(handlers, models):
    outs = [dict(zip(SWEEP_VIEW, out)) for out in handlers.sweep({"config": SMALL}, ["add"], 2, "threshold", "0.5, 0.9", "", DISTILLED)]
    view = last(outs)
    assert view["message"] == "done: 8 prompts (4 on each model)"
    state = view["state"]
    assert [(p["model"], p["value"], p["examples"]) for p in state.points()] == [
        ("tiny-llada", 0.5, 2), ("tiny-llada", 0.9, 2), (TITLE_B, 0.5, 2), (TITLE_B, 0.9, 2)
    ]
    fig = view["chart"]
    # each curve is named by its model and its accuracy under parallelism (AUP, docs/counting.md §11)
    assert [t.name.split(" · AUP ")[0] for t in fig.data] == ["tiny-llada", TITLE_B] and fig.layout.showlegend
    assert all(" · AUP " in t.name for t in fig.data)
    assert all(len(t.x) == 2 for t in fig.data)
    model_col = SWEEP_TABLE_HEADERS.index("model")
    assert [row[model_col] for row in view["table"]] == ["tiny-llada"] * 2 + [TITLE_B] * 2
    rows = list(csv.DictReader(io.StringIO(open(view["csv"]).read())))
    assert [(r["model"], r["threshold"]) for r in rows] == [("tiny-llada", "0.5"), ("tiny-llada", "0.9"), (TITLE_B, "0.5"), (TITLE_B, "0.9")]
    # each model's answers are its own engine's
    config = GenerationConfig(**SMALL)
    for title, path in (("tiny-llada", models["tiny-llada"]), (TITLE_B, models[DISTILLED])):
        engine = Engine(path)
        mine = [o for o in state.outcomes if o.model == title and o.value == config.threshold]
        assert [o.text for o in mine] == [engine.generate(o.example.prompt, config).text for o in mine]


def test_a_sweep_of_one_model_draws_one_curve_whose_legend_gives_its_aup(handlers):
    view = last(dict(zip(SWEEP_VIEW, out)) for out in handlers.sweep({"config": SMALL}, ["add"], 1, "threshold", "0.9", "", ""))
    (curve,) = view["chart"].data
    assert curve.name.startswith("tiny-llada · AUP ") and view["chart"].layout.showlegend
    assert view["table"][0][SWEEP_TABLE_HEADERS.index("model")] == "tiny-llada"


# ---- the API and the browser -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def app(tmp_path_factory, models):
    demo, url, host = launch_app(tmp_path_factory, fps=20, plot_hz=3, embedded=models)
    yield SimpleNamespace(url=url, host=host)
    demo.close()


def test_the_compare_api_takes_model_b(app, models):
    from gradio_client import Client

    client = Client(app.url, verbose=False)
    result = client.predict(PROMPT, {"config": SMALL}, None, DISTILLED, api_name="/compare")
    api = [name for name in COMPARE_VIEW if name != "state"]  # gr.State is not part of the API
    out = dict(zip(api, result))
    assert out["message"].startswith("done: A: tiny-llada") and f"B: {TITLE_B}" in out["message"]
    assert out["title_b"] == f"### B · {TITLE_B}"
    engine = Engine(models[DISTILLED])
    assert out["text_b"] == engine.generate(PROMPT, GenerationConfig(**SMALL)).text
    wrong = dict(zip(api, client.predict(PROMPT, {"config": SMALL}, None, "tiny-llada", api_name="/compare")))
    assert "already the run's model" in wrong["message"]


@pytest.mark.browser
def test_two_grids_appear_after_a_two_model_compare_in_the_browser(app, tmp_path):
    from playwright.sync_api import expect

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        open_app(page, app.url)
        page.fill("#prompt textarea", PROMPT)
        for field in ("gen_length", "block_length"):
            page.fill(f"#cfg-{field} input", "16")
        page.get_by_role("tab", name="Compare").click()
        page.locator("#compare-model-b input").click()
        page.get_by_role("option", name=TITLE_B).click()
        page.click("#compare-btn")
        expect(page.locator("#compare-message")).to_contain_text("done:", timeout=180_000)  # or what went wrong
        page.locator("#compare-chart").scroll_into_view_if_needed()
        expect(page.locator("#compare-chart .js-plotly-plot")).to_have_count(1, timeout=120_000)  # drawn once both finished
        expect(page.locator("#compare-title-b")).to_contain_text(TITLE_B)
        for side in "ab":
            expect(page.locator(f"#grid-{side} .cells .cell").first).to_be_visible()
            assert page.locator(f"#grid-{side} .cells .cell.masked").count() == 0
        texts = [page.locator(f"#output-{side} textarea").input_value() for side in "ab"]
        assert texts == [Engine(path).generate(PROMPT, GenerationConfig(gen_length=16, block_length=16)).text for path in (app.host.default.path, app.host.embedded[DISTILLED])]
        page.screenshot(path=str(tmp_path / "compare_models.png"))
