"""The app's side of the system options (issue #17): the per-iteration cost chart, the progress
lines while an engine with worker processes or compiling starts, the system options' explanation.

Every check reads figures, messages and trace contents, never how long anything took."""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import numpy as np
import pytest

from dinfer_viz.panes.cost_figure import CATEGORIES, NO_COST, cost_figure
from dinfer_viz.panes.explain import explain, system_markdown
from engine.system_options import SYSTEM_OPTIONS
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.live.system import startup_note
from dinfer_viz.tabs.run import RUN_VIEW, RunState
from dinfer_viz.reading.timeline import Timeline
from dinfer_viz.ui import Handlers
from engine import Trace

from .app_support import app_model, click_run, handmade_trace, open_app, random_char_model

SMALL = {"gen_length": 16, "block_length": 16}


def _cost(compute: list[float], comm: list[float], compile_seconds: float = 0.0, compiles: int = 0, captures: int = 0, replay: bool = False) -> dict:
    return dict(compute_seconds=compute, comm_seconds=comm, compile_seconds=compile_seconds, compiles=compiles, captures=captures, graph_replay=replay)


def costed_trace() -> Trace:
    """handmade_trace with a two-rank cost on every record: iteration 0 compiles for ~5 s, 2
    compiles a little, 3 replays a graph; 1 and 3 are warm."""
    trace = handmade_trace()
    recs = trace.iterations
    recs[0].seconds = 5.0
    recs[0].cost = _cost([0.004, 0.003], [0.004, 0.005], compile_seconds=4.99, compiles=1)  # host 2 ms
    recs[1].cost = _cost([0.005, 0.006], [0.010, 0.009])  # seconds 0.02: host 5 ms
    recs[2].cost = _cost([0.010, 0.010], [0.015, 0.014], compile_seconds=0.002, captures=1)  # 0.03: host 3 ms
    recs[3].cost = _cost([0.010, 0.012], [0.020, 0.018], replay=True)  # 0.04: host 10 ms
    return trace


def _bars(fig) -> dict[tuple[str, str], object]:
    """(rank, category) -> its bar trace."""
    return {(t.offsetgroup, t.name): t for t in fig.data if t.type == "bar"}


def test_cost_bars_stack_compute_communication_compile_and_host_per_rank():
    fig = cost_figure(Timeline(costed_trace()))
    bars = _bars(fig)
    names = [name for name, _ in CATEGORIES]
    # rank 0 has every part; rank 1 reports only its compute and all-reduces
    assert sorted(bars) == sorted([("0", n) for n in names] + [("1", "compute"), ("1", "communication")])
    np.testing.assert_allclose(bars["0", "compute"].y, [4, 5, 10, 10], rtol=1e-5)
    np.testing.assert_allclose(bars["1", "communication"].y, [5, 9, 14, 18], rtol=1e-5)
    np.testing.assert_allclose(bars["0", "host"].y, [2, 5, 3, 10], rtol=1e-4)  # seconds less the rest
    np.testing.assert_allclose(bars["0", "host"].base, [4998, 15, 27, 30], rtol=1e-5)  # on top of the others
    np.testing.assert_allclose(bars["1", "communication"].base, bars["1", "compute"].y)
    assert "communication" in fig.layout.title.text and "(2 processes)" in fig.layout.title.text


def test_cost_chart_counts_graphs_marks_replays_and_scales_to_the_warm_iterations():
    fig = cost_figure(Timeline(costed_trace()), highlight=2)
    traces = {t.uid: t for t in fig.data}
    np.testing.assert_array_equal(traces["cost-graphs"].y, [1, 0, 1, 0])  # compiles + captures
    assert traces["cost-graphs"].yaxis == "y2"
    np.testing.assert_array_equal(traces["cost-replays"].x, [4])  # record 3: the page's iteration 4
    # the 5 s compile would flatten the millisecond bars: the axis fits the warm ones (iterations 1
    # and 3, at most 40 ms) and the compiling bar is labelled with its time
    assert fig.layout.yaxis.range[1] == pytest.approx(40 * 1.25)
    assert list(traces["cost-off-scale"].x) == [1] and traces["cost-off-scale"].text == ("↑ 5.0 s",)
    assert [s.x0 for s in fig.layout.shapes] == [3]  # the scrubbed record 2: iteration 3, as the slider says
    assert list(fig.layout.xaxis.range) == [0.5, 4.5] and list(traces["cost-graphs"].x) == [1, 2, 3, 4]
    live = cost_figure(Timeline(costed_trace()), upto=1)  # a live run's first two iterations
    assert len(_bars(live)["0", "compute"].x) == 2


def test_a_trace_without_cost_gets_a_one_line_message():
    fig = cost_figure(Timeline(handmade_trace()))  # written before records had a cost
    assert not fig.data and fig.layout.annotations[0].text == NO_COST and "\n" not in NO_COST


@pytest.fixture
def offline() -> Handlers:
    """Handlers whose model is never loaded: trace replay only."""
    return Handlers(EngineHost(ModelSpec("never-loaded")))


def test_a_loaded_trace_with_cost_draws_the_chart_and_replay_marks_the_iteration(offline, tmp_path):
    file = tmp_path / "costed.json"
    file.write_text(costed_trace().to_json())
    view = dict(zip(RUN_VIEW, offline.load_trace(str(file))))
    assert len(_bars(view["cost"])) == 6 and not view["cost"].layout.shapes
    replay = dict(zip(RUN_VIEW, offline.replay(2, RunState(Timeline(costed_trace())))))  # the slider at 2
    assert [s.x0 for s in replay["cost"].layout.shapes] == [2] and replay["grid"]["caption"].startswith("iteration 2/4")


def test_startup_notes_say_what_each_option_spends_and_when():
    assert startup_note({}, "cpu", loaded=False) == ""
    assert "starting 2 worker processes (gloo" in startup_note({"tp_size": 2}, "cpu", loaded=False)
    assert startup_note({"tp_size": 2}, "cpu", loaded=True) == ""  # the workers are up
    assert "each shape bucket compiles" in startup_note({"compile": True}, "cpu", loaded=True)
    assert startup_note({"tp_size": "2", "compile": "yes"}, "cpu", loaded=False) == ""  # Engine refuses these itself


def test_the_explanation_adds_each_system_option_that_is_on():
    plain = explain("threshold", "none", system={"tp_size": 1, "compile": False})
    assert not any(o.explanation in plain for o in SYSTEM_OPTIONS.values())
    on = explain("threshold", "none", system={"tp_size": 2, "compile": True})
    text = {name: o.explanation for name, o in SYSTEM_OPTIONS.items()}
    assert text["tp_size"] in on and text["compile"] in on and text["cuda_graphs"] not in on
    assert "two all-reduces per layer" in text["tp_size"]
    assert all(t in system_markdown() for t in text.values())


def _load_args(handlers: Handlers, path: str, device: str = "cpu", **options) -> list:
    return [path, device, "auto", *(options.get(name) for name in handlers.option_names)]


def test_load_says_what_it_starts_first_then_the_result(tmp_path_factory):
    handlers = Handlers(EngineHost(ModelSpec(app_model(tmp_path_factory))))
    args = _load_args(handlers, handlers.host.default.path, compile=True)
    lines = list(handlers.load_model(*args))  # loading compiles nothing: the first run does
    assert len(lines) == 2 and lines[0].startswith("loading ") and "compile on" in lines[0]
    assert lines[1].startswith("loaded **") and "the first run: compile on" in lines[1]
    again = list(handlers.load_model(*args))  # loaded already: nothing to wait for, one line
    assert len(again) == 1 and again[0].startswith("loaded **")
    refused = list(handlers.load_model(*_load_args(handlers, handlers.host.default.path, "cuda:7")))
    assert len(refused) == 1 and refused[0].startswith("**⚠") and "\n" not in refused[0]


@pytest.fixture(scope="module")
def handlers(tmp_path_factory):
    """The app's handlers on a random 2-layer model (what these tests read is the page's messages
    and cost chart, which no model's quality changes; compiling its forwards takes a third of the
    embedded model's 6 layers); every engine they loaded (a TP one has worker processes) is closed
    at the end."""
    folder = random_char_model(tmp_path_factory.mktemp("cost-model"))
    handlers = Handlers(EngineHost(ModelSpec(str(folder))), fps=1000, plot_hz=1000)
    yield handlers
    for engine in handlers.host._engines.values():
        engine.close()


def _run(handlers: Handlers, model: dict) -> tuple[list[dict], Trace]:
    """Every output of a run as a dict of RUN_VIEW slots, and the run's trace."""
    views = [dict(zip(RUN_VIEW, out)) for out in handlers.run("Q: 1+2=? A:", {"model": model, "config": SMALL})]
    assert str(views[-1]["message"]).startswith("done"), views[-1]["message"]
    return views, views[-1]["state"].timeline.trace


@pytest.mark.parametrize("model", [{"compile": True}, {"tp_size": 2}], ids=["compile", "tp2"])
def test_a_run_with_a_system_option_says_so_first_and_draws_its_cost(handlers, model):
    views, trace = _run(handlers, model)
    note = "compile on" if "compile" in model else "starting 2 worker processes"
    messages = [str(v["message"]) for v in views if isinstance(v["message"], str)]
    assert messages[0].startswith("loading ") and note in messages[0]  # before anything else
    # however many there were: every loading line and heartbeat says it, and (TP) a heartbeat of a
    # slow forward does not claim workers are starting
    assert all(note in m for m in messages if m.startswith("loading"))
    slow_forwards = [m for m in messages if m.startswith("generating: a forward is running (")]
    assert all(("compile on" in m) == ("compile" in model) and "worker processes" not in m for m in slow_forwards)
    bars = _bars(views[-1]["cost"])
    assert float(np.sum(bars["0", "compute"].y)) > 0
    if "compile" in model:
        graphs = next(t for t in views[-1]["cost"].data if t.uid == "cost-graphs")
        assert int(np.nansum(graphs.y)) == sum(r.cost["compiles"] for r in trace.iterations) >= 1  # a fresh engine compiles its buckets
    else:  # both ranks drawn, and both spent time in all-reduces
        assert ("1", "compute") in bars and all(r.cost and min(r.cost["comm_seconds"]) > 0 for r in trace.iterations)
        assert float(np.sum(bars["1", "communication"].y)) > 0


@pytest.mark.browser
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_cost_chart_is_on_the_page_after_a_run_and_options_explain_themselves(app_in_browser):
    from playwright.sync_api import expect

    page = app_in_browser.browser.new_page(viewport={"width": 1400, "height": 1000})
    open_app(page, app_in_browser.url)
    page.get_by_text("Model and system").click()
    compile_box = page.get_by_label("torch.compile")
    compile_box.check()
    expect(page.locator("#explain")).to_contain_text("torch.compile.")
    compile_box.uncheck()  # the run below is a plain one: no compiling in a browser test
    expect(page.locator("#explain")).not_to_contain_text("torch.compile.")
    expect(page.locator("#system-explain")).to_contain_text("What the system options do")
    click_run(page)
    expect(page.locator("#message")).to_contain_text("done", timeout=90_000)
    expect(page.locator("#cost .js-plotly-plot .barlayer")).to_have_count(1)
    assert page.locator("#cost .barlayer .point").count() > 0
    expect(page.locator("#cost .gtitle")).to_contain_text("rank 0's time: compute")
    page.close()
