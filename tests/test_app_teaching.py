"""Issue 16 through the handlers, on the test model: the hover names the expected token by its
characters, a sweep's wrong answer copies its settings (the swept value too) into the Run tab so Run
reproduces it, timings are medians over passes of identical greedy runs, accuracy is a percentage
in the table and the chart alike, and the shipped sample traces replay with no model."""

from __future__ import annotations

import json
import os
import re
import statistics
from types import SimpleNamespace

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
import pytest

from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.panes.readouts import median_stats, passes_count, percent
from dinfer_viz.sample_traces import sample_settings, shipped_samples
from dinfer_viz.settings import all_controls
from dinfer_viz.studies.sweep_study import run_sweep, sweep_examples
from dinfer_viz.live.system import offered_options
from dinfer_viz.tabs.run import RUN_VIEW
from dinfer_viz.tabs.sweep import SWEEP_VIEW
from dinfer_viz.ui import Handlers
from engine import EngineError, RunHooks

from .app_support import app_model

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:.*(no_silent_downcasting|copy keyword).*")
PROMPT = "Q: 23+45=? A:"
SMALL = {"gen_length": 16, "block_length": 16}
# Pair-sum prompts at a threshold this low commit dependent digits in one forward: wrong answers
WRONG_PROMPTS = "\n".join(f"Q: ?+?={n} A:" for n in (38, 57, 91, 120))


@pytest.fixture(scope="module")
def handlers(tmp_path_factory) -> Handlers:
    return Handlers(EngineHost(ModelSpec(app_model(tmp_path_factory))), fps=1000, plot_hz=1000)


def final(frames) -> dict:
    """The slots of a streamed handler's last frame that filled them, by name."""
    seen: dict = {}
    for frame in frames:
        seen.update({k: v for k, v in zip(RUN_VIEW, frame) if not (isinstance(v, dict) and v == gr.skip())})
    return seen


def test_a_wrong_commits_hover_names_the_expected_token_by_its_characters(handlers):
    view = final(handlers.run(PROMPT, {"config": SMALL}, expected="ZZZZ"))
    tl = view["state"].timeline
    with handlers.host.lock:
        engine = handlers.host.get(handlers.host.default)
        z = engine.encode("Z", use_chat_template=False)[0]
    # the run never proposed it, yet the header names it: the start event carries the expected answer
    assert not any(z in row for rec in tl.records for row in rec.top1)
    assert tl.trace.expected[0][:4] == [z] * 4 and tl.expected == tl.trace.expected[0] and tl.trace.tokens[str(z)] == "Z"
    wrong = [cell for cell in view["grid"]["cells"] if "wrong" in cell["k"].split()]
    assert wrong and all("expected &#x27;Z&#x27;" in cell["tip"] for cell in wrong[:4])
    raster = {t.uid: t for t in view["raster"].data}
    hovers = [text for t in (raster["commits-new"], raster["commits-forced"]) for text in (t.text or ())]
    said = [h for h in hovers if "expected 'Z'" in h]
    assert len(said) == 4  # the four positions of ZZZZ; the fifth expects the end of text, by its name
    raw_id = re.compile(r"(<|&lt;)\d+(>|&gt;)")  # `<26>`: an id with no string
    assert not any(raw_id.search(h) for h in hovers) and not any(raw_id.search(cell["tip"]) for cell in view["grid"]["cells"])


def sweep_to_the_end(handlers: Handlers, settings: dict, values: str, passes: int = 1):
    frames = list(handlers.sweep(settings, [], 1, "threshold", values, WRONG_PROMPTS, "", passes))
    view = dict(zip(SWEEP_VIEW, frames[-1]))
    assert view["message"].startswith("done"), view["message"]
    return view


def test_a_sweep_failure_copies_its_settings_so_run_reproduces_its_trace(handlers):
    settings = {"config": {**SMALL, "block_length": 8}}  # not the Run tab's defaults: they must be copied too
    view = sweep_to_the_end(handlers, settings, "0.05")
    state = view["state"]
    failed = [o for o in state.failures() if o.trace is not None]
    assert failed, "the low threshold should break at least one pair-sum"
    # pair-sum has many right answers: the run was given none, so no commit is judged against one (#54 item 4)
    assert failed[0].expected is None and failed[0].trace.expected[0] == [] and failed[0].wrong is None
    result = handlers.open_failure(state, gr.SelectData(None, {"index": [0, 0], "value": ""}))
    prompt, response, _, model_box, *controls, _pinned = result[len(RUN_VIEW) :]
    assert response == "" and "no first wrong commit: pairsum has many right answers" in dict(zip(RUN_VIEW, result))["message"]
    values = dict(zip([c.field for c in all_controls()], controls))
    assert values["threshold"] == 0.05 and (values["gen_length"], values["block_length"]) == (16, 8)  # the swept value, and the rest
    defaults = [False if o.kind is bool else 1 for o in offered_options()]
    copied = handlers.settings(model_box, "cpu", "auto", *defaults, *controls)
    again = final(handlers.run(prompt, copied, response))
    assert again["message"].startswith("done")
    assert again["state"].timeline.trace.final == failed[0].trace.final  # the same tokens: Run reproduced it
    assert [r.committed for r in again["state"].timeline.records] == [r.committed for r in failed[0].trace.iterations]


def test_sweep_tps_is_the_median_of_passes_of_identical_greedy_runs(handlers):
    spec, config = handlers.parse({"config": {**SMALL, "threshold": 0.5}})
    examples = sweep_examples([], 1, own_prompts=WRONG_PROMPTS)
    *_, state = run_sweep(handlers.host, spec, config, "threshold", [0.5], examples, passes=3)
    assert all(len(o.passes) == 3 and o.passes[0] == o.seconds for o in state.outcomes)
    point = state.points()[0]
    per_pass = [sum(o.passes[k] for o in state.outcomes) for k in range(3)]
    assert point["passes"] == 3 and point["tps"] == pytest.approx(statistics.median(point["tokens"] / s for s in per_pass))
    # only the first pass is judged: greedy decoding makes every pass the same tokens in the same forwards
    with handlers.host.lock:
        engine = handlers.host.get(spec)
        ids = [engine.encode(e.prompt, config.use_chat_template) for e in examples]
        runs = [engine.generate_ids(ids[:1], config.replace(threshold=0.5), hooks=RunHooks(trace=True)) for _ in range(3)]
    assert all(r.token_ids == runs[0].token_ids and r.stats.nfe == runs[0].stats.nfe for r in runs)
    assert all([rec.committed for rec in r.trace.iterations] == [rec.committed for rec in runs[0].trace.iterations] for r in runs)


def test_accuracy_is_a_percentage_in_the_table_and_the_chart_alike(handlers):
    view = sweep_to_the_end(handlers, {"config": SMALL}, "0.05, 0.9")
    table = [row[1] for row in view["table"]]
    chart = [h for t in view["chart"].data for h in t.hovertext]
    assert len(table) == len(chart) and all(a.endswith("%") and f"accuracy {a}<br>" in h for a, h in zip(table, chart))
    assert (percent(1.0), percent(2 / 3), percent(0.5), percent(0.0)) == ("100%", "66.7%", "50%", "0%")


def test_passes_and_their_median():
    assert passes_count(3) == 3 and passes_count(5.0) == 5
    for bad in (0, 6, 2.5, "x", None):
        with pytest.raises(EngineError, match="passes must be a whole number from 1 to 5"):
            passes_count(bad)
    stats = median_stats([{"seconds": 0.4, "tokens": 8, "nfe": 4, "tps": 20.0, "batch": 1}, {"seconds": 0.1, "tokens": 8, "nfe": 4}, {"seconds": 0.2, "tokens": 8, "nfe": 4}])
    assert (stats["seconds"], stats["tps"], stats["forwards_per_second"], stats["passes"], stats["seconds_range"]) == (0.2, 40.0, 20.0, 3, (0.1, 0.4))


def test_every_sample_trace_replays_with_no_model(tmp_path):
    offline = Handlers(EngineHost(ModelSpec(str(tmp_path / "absent"))), no_model=True)
    samples = shipped_samples()
    assert len(samples) == len(sample_settings())  # one per built-in decoder and per other cache mode
    for label, path in samples:
        view = dict(zip(RUN_VIEW, offline.load_sample(os.path.basename(path))))
        assert view["message"].startswith("loaded a trace"), (label, view["message"])
        assert view["grid"]["cells"] and view["raster"].data[0].type == "heatmap" and view["scrub"]["value"] == view["scrub"]["maximum"]
    assert "no sample trace named" in dict(zip(RUN_VIEW, offline.load_sample("../../etc/passwd")))["message"]
    assert not offline.host._engines  # nothing was loaded


def test_every_figure_saves_as_a_png_and_the_model_box_names_the_embedded_models(tmp_path):
    from dinfer_viz.drawing.figure_base import FIGURE_DOWNLOAD
    from dinfer_viz.ui import build_demo

    offline = Handlers(EngineHost(ModelSpec(str(tmp_path / "absent")), embedded={"tiny-llada": "/m/a", "tiny-llada-td": "/m/b"}), no_model=True)
    view = dict(zip(RUN_VIEW, offline.load_sample("threshold-dual.json")))
    for slot in ("raster", "iterations", "cost", "extras"):  # what gr.Plot sends the page: the figure's to_json()
        config = json.loads(gr.Plot().postprocess(view[slot]).plot)["config"]
        assert config["toImageButtonOptions"] == {**FIGURE_DOWNLOAD, "filename": f"dinfer-viz-{view[slot].layout.uirevision}"}
    demo = build_demo(offline)
    box = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "model-path")
    assert box.label == "model folder, hub id or embedded name (tiny-llada, tiny-llada-td, …)"
    samples = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "samples-box")
    assert samples.open  # no model: the sample traces lead


# ---- #16 items 1, 2 and 4 through the handlers ---------------------------------------------------

from dinfer_viz.panes import readouts  # noqa: E402
from dinfer_viz.panes.explain import explain  # noqa: E402
from dinfer_viz.settings import control_value  # noqa: E402
from dinfer_viz.tabs import run_settings  # noqa: E402
from dinfer_viz.tabs.compare import COMPARE_DEFAULTS, COMPARE_FIELDS, COMPARE_VIEW, side_fields  # noqa: E402
from engine import GenerationConfig  # noqa: E402


def page_values(handlers: Handlers, **config) -> list:
    """The Run tab's control values as the page sends them (TabHandlers.settings' order)."""
    cfg = GenerationConfig().replace(**config)
    return [None, None, None, *((1 if o.kind is int else False) for o in offered_options()), *(control_value(c, cfg) for c in all_controls())]


def test_a_pinned_position_shows_at_the_end_of_a_run_and_follows_replay(handlers):
    view = final(handlers.run(PROMPT, {"config": {**SMALL, "cache": "dual"}}, pinned=15))
    tl = view["state"].timeline
    assert f"Position 15 · iteration {tl.iterations} of {tl.iterations}" in view["details"]
    assert view["cache_states"]["visible"] is True  # a cache: its K/V states are drawn
    replay = dict(zip(RUN_VIEW, handlers.replay(1, view["state"], 15)))
    assert "Position 15 · iteration 1 of" in replay["details"]
    none = final(handlers.run(PROMPT, {"config": SMALL}))
    assert none["cache_states"] == gr.update(visible=False) and "Click a cell" in none["details"]


def test_the_explanation_states_the_forward_count_rule_of_a_cache():
    assert "Forward count, dual cache" in explain("threshold", "dual")
    assert "Forward count" not in explain("threshold", "none")


def test_forward_costs_are_measured_on_the_loaded_model_and_a_parallel_engine_says_why_not(handlers, monkeypatch):
    monkeypatch.setattr(run_settings, "COST_LENGTHS", (32, 64))
    fig, message = handlers.forward_costs(*page_values(handlers))
    assert "measured on" in message and {t.uid for t in fig.data} >= {"fc-full", "fc-dual"}
    fake = SimpleNamespace(model=SimpleNamespace(device=SimpleNamespace(type="meta"), max_positions=512))
    monkeypatch.setattr(handlers.host, "get", lambda spec: fake)
    fig, message = handlers.forward_costs(*page_values(handlers))
    assert "worker processes" in message and "\n" not in message


def test_compare_default_b_changes_one_setting_and_fixed_shows_no_tau():
    a, b = COMPARE_DEFAULTS
    full = [{f: side.get(f, getattr(GenerationConfig(), f, None)) for f in COMPARE_FIELDS} for side in (a, b)]  # the constraint: none on both
    assert sum(full[0][f] != full[1][f] for f in COMPARE_FIELDS) == 1
    assert "threshold" not in side_fields("fixed") and "threshold" in side_fields("threshold")


def test_compare_marks_wrong_commits_against_the_expected_answer_and_replay_marks_the_iteration(handlers):
    settings = {"config": SMALL}
    frames = list(handlers.compare(PROMPT, settings, settings, "", 1, expected="ZZZZ"))
    seen: dict = {}
    for frame in frames:
        seen.update({k: v for k, v in zip(COMPARE_VIEW, frame) if not (isinstance(v, dict) and v == gr.skip())})
    assert any("wrong" in cell["k"] for cell in seen["grid_a"]["cells"])
    state = seen["state"]
    assert state.expected[0] and state.expected == (state.a.trace.expected[0], state.b.trace.expected[0])  # each side's header carries them
    replay = dict(zip(COMPARE_VIEW, handlers.compare_replay(1, state)))
    assert any("wrong" in cell["k"] for cell in replay["grid_b"]["cells"]) or state.b.iterations < 2
    shown = [t for t in replay["chart"].data if t.uid == "shown"]
    assert shown and any(s.x0 == 1 for s in replay["chart"].layout.shapes)
    assert replay["chart"].layout.legend.yref == "container"  # below the axis titles, never on them


def test_counts_are_singular_for_one_and_a_fixed_runs_low_tpf_is_explained(handlers):
    assert readouts.plural(1, "iteration") == "1 iteration" and readouts.plural(2, "torch thread") == "2 torch threads"
    view = final(handlers.run(PROMPT, {"config": {"gen_length": 64, "block_length": 64, "decoder": "fixed"}}))  # one block: 64 forwards
    tl = view["state"].timeline
    assert tl.trace.stats["tpf"] < readouts.LOW_TPF and "Why TPF is this low" in view["readout"]
    assert "Why TPF" not in final(handlers.run(PROMPT, {"config": SMALL}))["readout"]


def test_one_torch_thread_is_singular():
    import torch

    from dinfer_viz.live.system import describe_machine

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert "1 torch thread" in describe_machine() and "1 torch threads" not in describe_machine()
    finally:
        torch.set_num_threads(threads)
