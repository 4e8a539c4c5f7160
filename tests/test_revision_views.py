"""Every view shows a revision (issue 26 part 6): the timeline replays edits and remasks as the
engine's own replay does, and the grid (live and replayed), details panel, raster, per-iteration
counts, export frames, Compare and the sweep show them, with every string from the trace escaped.

A hand-made trace pins the cases (an edit, a remask, a recommit, hostile token strings); real
runs of the edit decoder check the views against the engine's own records, whatever the weights.
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import numpy as np
import pytest
from PIL import ImageColor

from dinfer_viz.panes.details import position_details
from dinfer_viz.panes.export import frame_iterations, frame_title, legend_states, render_frames
from dinfer_viz.panes.figures import compare_figure, confidence_raster, iteration_chart
from dinfer_viz.panes.grid import CELL_COLOURS, LiveGrid, cell_state, grid_value
from dinfer_viz.tabs.run import RUN_VIEW, RunState
from dinfer_viz.reading.timeline import Timeline
from engine import IterationRecord, Trace
from engine.trace import EDIT, REMASK

from .app_support import edit_model, handmade_trace

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "assets" / "tiny-llada"
MASK = 1
HOSTILE = "${alert(1)}"
HOSTILE_RULE = "p(new) > <img src=x onerror=alert(2)>"  # a trace file's rule text is anyone's


def _revision(position, old, new, kind, rule, score, bound):
    return {"position": position, "old": old, "new": new, "kind": kind, "rule": rule, "score": score, "bound": bound}


def revising_trace() -> Trace:
    """Prompt [A B C], one block [3, 7), decoder edit at τ 0.3. Record 0 commits 3, 4, 5; record 1
    commits 6, edits 3 ('4' -> '7') and remasks 5; record 2 commits 5 again ('<b>x</b>') and edits
    4 (the hostile '${alert(1)}' -> '7')."""
    tokens = {"0": "<|endoftext|>", "1": "<|mdm_mask|>", "10": "A", "11": "B", "12": "C", "20": "4", "21": "7", "22": HOSTILE, "23": "<b>x</b>"}

    def rec(i, committed, top1, conf, revisions):
        return IterationRecord(
            iteration=i, block=0, block_range=[3, 7], forward="full", recomputed=[[0, 7]], threshold=0.3,
            committed=[committed], forced=[[]], top1=[top1], confidence=[conf], seconds=0.01, revisions=[revisions],
            active=[True], final_until=[3],  # a revising decoder's commits are final when the loop leaves their block
        )

    records = [
        rec(0, [3, 4, 5], [20, 22, 20, 0], [0.9, 0.5, 0.4, 0.2], []),
        rec(1, [6], [21, 22, 20, 0], [0.93, 0.5, 0.12, 0.8], [
            _revision(3, 20, 21, EDIT, "p(new) > edit threshold", 0.93, 0.9),
            _revision(5, 20, MASK, REMASK, "p(current) < remask threshold", 0.12, 0.2),
        ]),
        rec(2, [5], [21, 21, 23, 0], [0.95, 0.97, 0.6, 0.9], [_revision(4, 22, 21, EDIT, HOSTILE_RULE, 0.97, 0.9)]),
    ]
    return Trace(
        model="handmade-edit", kind="masked", capabilities={"revises": True, "shadow_block": False}, mask_id=MASK, eos_ids=[0], prompt_lengths=[3], canvas_length=7, block_length=4,
        config={"decoder": "edit", "cache": "none", "threshold": 0.3, "decoder_options": {"edit_threshold": 0.9}},
        initial=[[10, 11, 12, MASK, MASK, MASK, MASK]], tokens=tokens, iterations=records, final=[[10, 11, 12, 21, 21, 23, 0]],
        stats={"nfe": 3, "tokens": 3, "seconds": 0.03, "batch": 1, "trace_seconds": 0.001, "tps": 100.0, "tpf": 1.0, "forwards_per_second": 100.0},
    )


@pytest.fixture
def timeline() -> Timeline:
    trace = revising_trace()
    trace.check()
    return Timeline(trace)


def _plain(html_text: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", html_text))


def test_the_timeline_replays_edits_and_remasks_as_the_engine_does(timeline):
    for i in range(-1, timeline.iterations):
        assert timeline.canvas_at(i) == timeline.trace.canvas_at(i)[0]
    assert timeline.revision_counts == {EDIT: 2, REMASK: 1}
    assert timeline.commit_at(5, 1) is None and timeline.commit_at(5, 2).iteration == 2  # remasked, then committed again
    assert timeline.token_before(5, 2) == MASK and timeline.token_before(3, 1) == 20 and timeline.token_before(3, 2) == 21
    edit = timeline.revision_at(3, 1)
    assert timeline.describe_revision(edit) == "edited '4' -> '7' (p(new) 0.930 > edit threshold 0.9)"
    assert timeline.describe_revision(timeline.revision_at(5, 1)) == "remasked '4' -> [MASK] (p(current) 0.120 < remask threshold 0.2)"
    assert timeline.revises and not Timeline(handmade_trace()).revises


def test_the_grid_strikes_the_old_token_beside_the_new_and_marks_a_remask(timeline):
    canvas = timeline.canvas_at(1)
    assert [cell_state(timeline, canvas, p, 1) for p in range(3, 7)] == ["edited", "old", "remasked", "new"]
    cells = {c["p"]: c for c in grid_value(timeline, 1)["cells"]}
    assert cells[3]["t"] == '<s class="was">4</s>7' and cells[3]["k"].split()[0] == "edited"
    assert cells[5]["k"].split()[0] == "remasked" and "back to [MASK] at iteration 2" in cells[5]["tip"]
    assert "iteration 2: edited &#x27;4&#x27; -&gt; &#x27;7&#x27; (p(new) 0.930 &gt; edit threshold 0.9)" in cells[3]["tip"]
    assert "edited 1 · remasked 1" in grid_value(timeline, 1)["caption"]
    later = {c["p"]: c for c in grid_value(timeline, 2)["cells"]}
    assert later[3]["k"].split()[0] == "old" and "edited" in later[3]["tip"]  # the hover keeps the revision's story
    assert later[5]["k"].split()[0] == "new"
    for label in (CELL_COLOURS["edited"][1], CELL_COLOURS["remasked"][1]):
        assert label in grid_value(timeline, 1)["legend"]  # a revising run's legend names both


def test_hostile_token_strings_in_a_revision_stay_text(timeline):
    cells = {c["p"]: c for c in grid_value(timeline, 2)["cells"]}
    edited = cells[4]
    assert edited["t"].startswith('<s class="was">') and "${" not in edited["t"] and "&#36;&#123;" in edited["t"]
    assert "<b>" not in cells[5]["t"] and "&lt;b&gt;" in cells[5]["t"]
    panel = position_details(timeline, 4, 2)
    assert "${" not in panel and "<b>x" not in panel and "<img" not in panel and HOSTILE in _plain(panel)
    assert "<img" not in edited["tip"] and "&lt;img src=x onerror=alert(2)&gt; 0.9" in edited["tip"]
    hovers = [text for t in confidence_raster(timeline).data if t.text is not None for text in t.text]
    assert any("&lt;img" in text for text in hovers) and not any("<img" in text for text in hovers)  # Plotly reads tags in text


def test_the_live_grid_carries_each_revision_in_order(timeline):
    live = LiveGrid(timeline, "run-1").value(2, 1, -1, "")["live"]
    assert [(r[0], r[2], r[3]) for r in live["revisions"]] == [(3, 1, EDIT), (5, 1, REMASK)]
    assert live["revisions"][0][4] == "4" and "p(new) 0.930 > edit threshold 0.9" in live["revisions"][0][5]
    since = LiveGrid(timeline, "run-1").value(3, 2, 2, "")["live"]  # a page holding records 0-1 gets record 2's only
    assert [(r[0], r[2]) for r in since["revisions"]] == [(4, 2)] and since["revisions"][0][4] == HOSTILE


def test_the_details_panel_lists_each_revision_with_the_rules_numbers(timeline):
    text = _plain(position_details(timeline, 3, 2))
    assert "iteration 2: edited '4' -> '7' (p(new) 0.930 > edit threshold 0.9)" in text
    assert "committed: confidence 0.900 > τ 0.30 (strictly above)" in text  # the edit decoder's commit rule
    remasked = _plain(position_details(timeline, 5, 1))
    assert "iteration 2: remasked '4' -> [MASK] (p(current) 0.120 < remask threshold 0.2) (this iteration)" in remasked
    assert "1 more revision(s) after the iteration shown, the next at iteration 3" in _plain(position_details(timeline, 4, 1))


def test_the_raster_marks_edits_and_remasks(timeline):
    fig = confidence_raster(timeline)
    traces = {t.uid: t for t in fig.data}
    assert list(traces["revisions-edited"].x) == [3, 4] and list(traces["revisions-edited"].y) == [2, 3]
    assert list(traces["revisions-remasked"].x) == [5] and list(traces["revisions-remasked"].y) == [2]
    assert "edited '4' -> '7'" in html.unescape(traces["revisions-edited"].text[0])  # Plotly reads entities
    # a remasked position is masked again: its confidence is drawn at the record after the remask
    z = np.asarray(fig.data[0].z, dtype=float)
    assert np.isfinite(z[2, 5 - timeline.view_start()]) and np.isnan(z[1, 5 - timeline.view_start()])
    assert not any(str(t.uid).startswith("revisions") for t in confidence_raster(Timeline(handmade_trace())).data)


def test_the_per_iteration_counts_stack_commits_edits_and_remasks(timeline):
    bars = {t.uid: list(t.y) for t in iteration_chart(timeline).data if t.type == "bar"}
    assert bars == {"above": [3, 1, 1], "forced": [0, 0, 0], "edited": [0, 1, 1], "remasked": [0, 1, 0]}
    assert set(t.uid for t in iteration_chart(Timeline(handmade_trace())).data if t.type == "bar") == {"above", "forced"}


def _has_colour(image, colour: str) -> bool:
    rgb = np.asarray(image.convert("RGB")).reshape(-1, 3)
    return bool((rgb == np.array(ImageColor.getrgb(colour))).all(axis=1).any())


def test_export_frames_draw_the_edit_and_the_remask(timeline):
    frames = render_frames(timeline)
    assert frame_iterations(timeline) == [-1, 0, 1, 2]
    edited, remasked = CELL_COLOURS["edited"][0], CELL_COLOURS["remasked"][0]
    # the legend names both in every frame; the cells take the colours only in the frames that revise
    assert legend_states(timeline)[-2:] == ("edited", "remasked")
    assert "edited 1 · remasked 1" in frame_title(timeline, 1) and "edited 1 · remasked 0" in frame_title(timeline, 2)
    legend_top = frames[0].height - 2 * 20 - 12  # the legend's rows sit at the bottom
    cells = [f.crop((0, 0, f.width, legend_top)) for f in frames]
    assert [_has_colour(c, edited) for c in cells] == [False, False, True, True]
    assert [_has_colour(c, remasked) for c in cells] == [False, False, True, False]


def test_the_run_tabs_handlers_show_the_revisions_of_a_loaded_trace(tmp_path, timeline):
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers

    h = Handlers(EngineHost(ModelSpec(str(tmp_path / "never-loaded"))), no_model=True)
    path = tmp_path / "edit.json"
    path.write_text(timeline.trace.to_json())
    view = dict(zip(RUN_VIEW, h.load_trace(str(path))))
    state = view["state"]
    assert isinstance(state, RunState) and state.timeline.revision_counts == {EDIT: 2, REMASK: 1}
    at_two = dict(zip(RUN_VIEW, h.replay(2, state)))
    assert any(c["k"].startswith("edited") for c in at_two["grid"]["cells"])
    bars = {t.uid: list(t.y) for t in at_two["iterations"].data if t.type == "bar"}
    assert bars["edited"] == [0, 1, 1] and bars["remasked"] == [0, 1, 0]
    gif, message = h.export_gif(state)
    assert gif and Path(gif).read_bytes()[:6] == b"GIF89a"


@pytest.mark.skipif(not (MODEL / "config.json").exists(), reason="needs the embedded model")
def test_a_real_edit_run_shows_every_revision_the_engine_recorded():
    import torch

    from engine import Engine, GenerationConfig, RunHooks

    torch.set_num_threads(1)
    engine = Engine(str(MODEL))
    config = GenerationConfig(gen_length=64, block_length=32, decoder="edit", threshold=0.3, decoder_options={"edit_threshold": 0.5})
    trace = engine.generate("Q: 12+35=? A:", config, hooks=RunHooks(trace=True)).output.trace
    tl = Timeline(trace)
    recorded = [[r for r in rec.revisions[0]] for rec in trace.iterations]
    assert sum(map(len, recorded)) == sum(tl.revision_counts.values())
    for i in range(tl.iterations - 1):  # at the last record, early stop's fill comes from the final canvas
        assert tl.canvas_at(i) == trace.canvas_at(i)[0]
    assert tl.canvas_at(tl.iterations - 1) == trace.final[0]
    bars = {t.uid: list(t.y) for t in iteration_chart(tl).data if t.type == "bar"}
    assert bars["edited"] == [sum(r["kind"] == EDIT for r in rows) for rows in recorded]
    assert bars["remasked"] == [sum(r["kind"] == REMASK for r in rows) for rows in recorded]
    for i, rows in enumerate(recorded):  # the grid marks exactly the positions each record revised
        marked = {c["p"] for c in grid_value(tl, i)["cells"] if c["k"].split()[0] in ("edited", "remasked")}
        assert marked == {r["position"] for r in rows}
    if any(recorded):
        i = next(k for k, rows in enumerate(recorded) if rows)
        first = recorded[i][0]
        panel = _plain(position_details(tl, first["position"], i))
        assert f"iteration {i + 1}: edited" in panel or f"iteration {i + 1}: remasked" in panel
    # Compare draws a revising run beside a plain one, on one figure
    plain = Timeline(engine.generate("Q: 12+35=? A:", config.replace(decoder="threshold", decoder_options={}), hooks=RunHooks(trace=True)).output.trace)
    assert len(compare_figure([plain, tl], ["threshold", "edit"]).data) == 4


@pytest.mark.skipif(not (MODEL / "config.json").exists(), reason="needs the embedded model")
def test_the_sweep_of_the_edit_threshold_counts_edits_and_remasks_in_its_table_and_csv():
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.tabs.sweep import SWEEP_TABLE_HEADERS, SWEEP_VIEW
    from dinfer_viz.ui import Handlers
    from tinymodel.aup import aup_by_curve

    h = Handlers(EngineHost(ModelSpec(str(MODEL))))
    settings = {"config": {"gen_length": 32, "block_length": 32, "decoder": "edit", "threshold": 0.3}}
    prompts = "Q: ?+?=38 A:\nQ: ?+?=57 A:"
    frames = list(h.sweep(settings, [], 1, "decoder_options.edit_threshold", "0.5, 0.95", prompts, "", 1))
    view = dict(zip(SWEEP_VIEW, frames[-1]))
    assert view["message"].startswith("done"), view["message"]
    state = view["state"]
    assert SWEEP_TABLE_HEADERS[6:9] == ["edits", "remasks", "AUP"]  # by place: later columns come after
    rows = view["table"]
    assert [r[0] for r in rows] == [0.5, 0.95] and all(len(r) == len(SWEEP_TABLE_HEADERS) for r in rows)
    # each value's edits and remasks are its outcomes' counts, each read from the run's own trace
    for value, row in zip((0.5, 0.95), rows):
        mine = [o for o in state.outcomes if o.value == value]
        assert row[6:8] == [sum(o.edits for o in mine), sum(o.remasks for o in mine)]
        for o in mine:
            if o.trace is not None:  # a wrong answer keeps its trace
                kinds = [r["kind"] for rec in o.trace.iterations for r in rec.revisions[0]]
                assert (o.edits, o.remasks) == (kinds.count(EDIT), kinds.count(REMASK))
        assert {o.trace.config["decoder_options"]["edit_threshold"] for o in mine if o.trace is not None} <= {value}
    points = state.points()
    expected = aup_by_curve({"": [(p["tpf"], 100 * p["accuracy"]) for p in points]})
    assert [r[8] for r in rows] == [round(list(expected.values())[0], 1)] * 2
    header, *lines = state.csv().splitlines()
    assert header.startswith("decoder_options.edit_threshold,") and header.split(",")[9:13] == ["model", "edits", "remasks", "aup"]  # by place
    assert [line.split(",")[10:12] for line in lines] == [[str(r[6]), str(r[7])] for r in rows]
    legend = [t.name for t in view["chart"].data]
    assert legend and all("AUP" in name for name in legend)


@pytest.mark.skipif(not (MODEL / "config.json").exists(), reason="needs the embedded model")
def test_the_run_tab_shows_every_iteration_of_an_edit_run_its_post_edit_steps_included():
    """Run goes through the batcher (engine/serving/batcher.py: RowView), which must keep a
    revising decoder's records after its block has no masks left, as the solo run has them."""
    import gradio as gr
    import torch

    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.ui import Handlers
    from engine import GenerationConfig, RunHooks

    torch.set_num_threads(1)
    h = Handlers(EngineHost(ModelSpec(str(MODEL))), fps=1000, plot_hz=1000)
    config = {"decoder": "edit", "threshold": 0.3, "decoder_options": {"edit_threshold": 0.5}}
    seen: dict = {}
    for frame in h.run("Q: 12+35=? A:", {"config": config}, ""):
        seen.update({k: v for k, v in zip(RUN_VIEW, frame) if not (isinstance(v, dict) and v == gr.skip())})
    shown = seen["state"].timeline.trace
    with h.host.lock:
        solo = h.host.get(h.host.default).generate("Q: 12+35=? A:", GenerationConfig.from_dict(shown.config), RunHooks(trace=True)).output.trace
    assert [r.revisions for r in shown.iterations] == [r.revisions for r in solo.iterations]
    assert [r.committed for r in shown.iterations] == [r.committed for r in solo.iterations]
    assert shown.stats["nfe"] == solo.stats["nfe"] and shown.final == solo.final


@pytest.mark.skipif(not (MODEL / "config.json").exists(), reason="needs the embedded model")
def test_compare_steps_a_threshold_run_and_an_edit_run_and_shows_the_revisions_on_their_side():
    """A: the base model with threshold τ 0.3; B: the edit model (the base when it is not there yet)
    with `edit`, its model in B's settings (the /compare API's settings_b). One slider steps both,
    and at each of B's revising iterations B's grid marks exactly the positions revised."""
    import gradio as gr

    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.tabs.compare import COMPARE_VIEW
    from dinfer_viz.ui import Handlers

    h = Handlers(EngineHost(ModelSpec(str(MODEL))), fps=1000, plot_hz=1000)
    b_model = str(edit_model() or MODEL)
    a = {"config": {"decoder": "threshold", "threshold": 0.3}}
    b = {"model": {"path": b_model}, "config": {"decoder": "edit", "threshold": 0.3, "decoder_options": {"edit_threshold": 0.5}}}
    seen: dict = {}
    for frame in h.compare("Q: 12+35=? A:", a, b, "", 1):
        seen.update({k: v for k, v in zip(COMPARE_VIEW, frame) if not (isinstance(v, dict) and v == gr.skip())})
    state = seen["state"]
    assert not state.a.revises and state.b.revises and state.b.trace.config["decoder"] == "edit"
    revising = [i for i, rows in enumerate(state.b.record_revisions) if rows]
    assert sum(map(len, state.b.record_revisions)) == state.b.trace.stats["edits"] + state.b.trace.stats["remasks"]
    for i in revising[:3]:
        view = dict(zip(COMPARE_VIEW, h.compare_replay(i + 1, state)))
        marked = {c["p"] for c in view["grid_b"]["cells"] if c["k"].split()[0] in ("edited", "remasked")}
        assert marked == {r.position for r in state.b.record_revisions[i]}
        assert not any(c["k"].split()[0] in ("edited", "remasked") for c in view["grid_a"]["cells"])


def test_the_details_state_wino_and_remdm_commit_rules(timeline):
    from dinfer_viz.views.masked.masked_details import rule_text

    trace = revising_trace()
    trace.config["decoder"] = "wino"
    wino = Timeline(trace)
    assert rule_text(wino, 0, 3) == "committed (wide-in): confidence 0.900 > τ_in 0.30 (strictly above)"
    assert rule_text(wino, 1, 6) == "committed (wide-in): confidence 0.800 > τ_in 0.30 (strictly above)"
    trace.config["decoder"] = "remdm"
    remdm = Timeline(trace)
    assert rule_text(remdm, 0, 3).startswith("forced by the schedule: the block had to commit 3 token(s)")
