"""The app's pure parts, from a hand-made trace: timeline, grid, figures, readouts, settings, text."""

from __future__ import annotations

from types import SimpleNamespace

import math

import numpy as np
import pytest

from dinfer_viz.panes.explain import explain
from dinfer_viz.panes.figures import MESSAGE_LINE_CHARS, compare_figure, confidence_raster, extras_figure, iteration_chart, plottable_extras
from dinfer_viz.studies.sweep_chart import sweep_figure
from dinfer_viz.drawing.cells import PINNED, REVISION_STATES
from dinfer_viz.views import view_for
from dinfer_viz.views.speculative import SPECULATIVE_STATES
from dinfer_viz.views.uniform import UNIFORM_STATES
from dinfer_viz.panes.grid import CELL_COLOURS, GRID_CSS, GRID_JS, GRID_TEMPLATE, LiveGrid, grid_value, legend_html
from dinfer_viz.panes.readouts import live_line, readout
from dinfer_viz.settings import OPTION_PREFIX, all_controls, build_config, parse_settings, sections, visible_fields
from dinfer_viz.live.host import ModelSpec
from dinfer_viz.studies.sweep_study import Outcome, SweepState, parse_values
from dinfer_viz.live.system import engine_parameters, offered_options
from dinfer_viz.studies.answers import first_wrong
from dinfer_viz.reading.timeline import Timeline
from dinfer_viz.reading.tokens import glyph, readable
from engine import EngineError, GenerationConfig, Trace, decoder_names
from engine.kinds import kind_options
from engine.registry import KIND_OPTION_PREFIX, decoder_options, is_builtin
from engine.cache_modes import cache_mode_names
from tinymodel.tasks import Example

from .app_support import handmade_trace


@pytest.fixture
def timeline() -> Timeline:
    return Timeline(handmade_trace())


def test_timeline_matches_trace_canvas(timeline):
    trace = timeline.trace
    for i in range(-1, 3):  # before the last record the rebuild is exactly Trace.canvas_at
        assert timeline.canvas_at(i) == trace.canvas_at(i)[0]
    assert timeline.canvas_at(3) == trace.final[0]
    assert timeline.commits[4].forced and timeline.commits[4].iteration == 1 and timeline.commits[4].confidence == 0.6
    view = view_for(timeline)
    assert view.settled_tokens(timeline, timeline.iterations) == 5 and view.settled_tokens(timeline, 2) == 4  # the three EOS do not count
    assert timeline.text_at(0) == "x░z░░░░░"  # no end of text yet: masks as ░ up to the canvas end
    assert timeline.text_at(3) == "x yzzx"  # 'Ġy' reads ' y'; stops at the first EOS


def test_timeline_live_growth_equals_whole(timeline):
    trace = handmade_trace()
    records, trace.iterations = trace.iterations, []
    live = Timeline(trace)
    for rec in records:
        live.add(rec)
    assert live.commits == timeline.commits and live.iterations == 4


def test_grid_states_and_marks(timeline):
    value = grid_value(timeline, 1, expected=[20, 21, 20, 22, 0])
    cells = value["cells"]
    assert len(cells) == 11 and [c["k"].split()[0] for c in cells[:3]] == ["prompt"] * 3
    kinds = {i: c["k"].split() for i, c in enumerate(cells)}
    assert kinds[3][0] == "old" and kinds[4][0] == "forced" and kinds[6][0] == "new"
    assert kinds[7][0] == "masked" and "blk" not in kinds[7]  # next block, not current
    assert "blk" in kinds[4] and "win" in kinds[2] and "win" not in kinds[10]  # window [2, 9)
    assert "wrong" in kinds[5] and "wrong" not in kinds[3]  # expected 20 at offset 2, got 22
    assert cells[4]["t"] == "·y" and cells[4]["c"] == 0.6
    assert "confidence then 0.600" in cells[4]["tip"] and "credit 0.6" in cells[4]["tip"]
    assert value["caption"].startswith("iteration 2/4 · block 0 [3, 7) · window forward over [2, 9)")


def test_grid_before_first_and_final(timeline):
    before = grid_value(timeline, -1)["cells"]
    assert [c["k"] for c in before[3:]] == ["masked"] * 8
    final = grid_value(timeline, 3)["cells"]
    assert [c["t"] for c in final[8:]] == ["∎"] * 3
    assert all(c["k"].split()[0] in CELL_COLOURS for c in final)


def test_grid_collapses_early_stop_fill():
    trace = handmade_trace()
    trace.iterations = trace.iterations[:2]  # block 0 only; early stop filled positions 7-10
    trace.final = [[10, 11, 12, 20, 21, 22, 22, 0, 0, 0, 0]]
    cells = grid_value(Timeline(trace), 1)["cells"]
    # the collapsed cell keeps its run's first position (a click opens its details)
    assert cells[-1] == {"t": "∎×4", "k": "fill", "tip": "pos 7–10: filled with end-of-text by early stop", "c": 0.0, "p": 7}
    assert len(cells) == 8 and [c["p"] for c in cells] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert grid_value(Timeline(trace), 0)["cells"][-1]["k"] == "masked"  # before the last record: still masks
    # figures stop at the last block decoded, or at the end of a window recomputed around it ([2, 9))
    assert confidence_raster(Timeline(trace)).layout.xaxis.range[1] == 8.5


def test_grid_template_has_an_explicit_colour_for_every_state():
    """Every state has its colour, and the legend of the kind of run that has it names it: the
    revision states only for a revising decoder, the uniform-state ones only for a uniform run, the
    pinned state only for a run whose request pinned text."""
    header = SimpleNamespace(config={})  # no constraint: the legend names no constraint mark
    none = frozenset()
    kinds = {
        "masked": SimpleNamespace(kind="masked", capabilities={"revises": False}, revises=False, trace=header, pinned=none),
        "revising": SimpleNamespace(kind="masked", capabilities={"revises": True}, revises=False, trace=header, pinned=none),  # the header says, before any revision
        "uniform": SimpleNamespace(kind="uniform", capabilities={"revises": False}, revises=False, trace=header, pinned=none),
        "speculative": SimpleNamespace(kind="speculative", capabilities={"revises": False}, revises=False, trace=header, pinned=none),
        "pinning": SimpleNamespace(kind="masked", capabilities={"revises": False}, revises=False, trace=header, pinned=frozenset({5})),
    }
    legends = {name: legend_html(kind) for name, kind in kinds.items()}
    assert legend_html(None) == legends["masked"]
    for kind, (colour, label) in CELL_COLOURS.items():
        assert f".cell.{kind}{{background:{colour}}}" in GRID_CSS
        shown = [name for name, legend in legends.items() if f'class="cell {kind}"' in legend]
        expected = (
            ["uniform"] if kind in UNIFORM_STATES else ["revising"] if kind in REVISION_STATES else ["speculative"] if kind in SPECULATIVE_STATES
            else ["pinning"] if kind == PINNED
            else ["masked", "revising", "uniform", "speculative", "pinning"] if kind in ("prompt", "masked", "fill")
            else ["masked", "revising", "speculative", "pinning"] if kind in ("old", "new") else ["masked", "revising", "pinning"]
        )
        assert shown == expected, kind
        if "uniform" not in shown or kind in UNIFORM_STATES:
            assert label in legends[shown[0]]  # the legend names it (a uniform run names prompt/masked/fill its own way)
    assert "{{{value.legend}}}" in GRID_TEMPLATE and "{{#each value.cells}}" in GRID_TEMPLATE


def test_live_grid_sends_the_canvas_then_the_commits_since_what_the_page_holds(timeline):
    live = LiveGrid(timeline, "r1", expected=[20, 21, 20, 22, 0])
    first = live.value(0, 0, -1, "line")["live"]
    assert (first["run"], first["frame"], first["at"], first["commits"], first["stats"]) == ("r1", 0, -1, [], "line")
    assert first["caption"] == "iteration 0/0 · before the first forward · 8 positions to generate"
    assert [c[:3] for c in first["canvas"][:4]] == [[0, "A", "prompt"], [1, "B", "prompt"], [2, "C", "prompt"], [3, "▒", "masked"]]
    assert first["canvas"][0][3] == "pos 0 · prompt\ntoken 'A' (id 10)" and len(first["canvas"]) == 11
    two = live.value(2, 1, -1, "line")["live"]  # a page that holds nothing gets the canvas and every commit
    assert "canvas" in two and two["commits"] == [[3, "x", 0, 0, 0.95, 0, 0], [5, "z", 0, 0, 0.92, 1, 0], [4, "·y", 1, 1, 0.6, 0, 0], [6, "z", 1, 0, 0.91, 0, 0]]
    assert (two["at"], two["block"], two["top1"], two["conf"], two["win"]) == (1, [3, 7], ["x", " y", "z", "z"], [0.99, 0.6, 0.98, 0.91], [[2, 9]])
    assert two["caption"].startswith("iteration 2/2 · block 0 [3, 7) · window forward over [2, 9)")
    three = live.value(3, 2, 2, "line")["live"]  # the page holds the first two records: only the third's commit
    assert "canvas" not in three and three["commits"] == [[7, "x", 2, 1, 0.7, 1, 0]] and three["win"] == []  # expected end of text there; a refresh recomputes all
    trace = handmade_trace()
    trace.tokens["20"] = "<img src=x onerror=alert(1)>${alert(2)}"
    raw = LiveGrid(Timeline(trace), "r2").value(1, 0, -1, "")["live"]
    assert raw["commits"][0][1] == "<img·src=x·onerror=alert(1)>${alert(2)}"  # plain text: the renderer sets it as text


def test_live_renderer_sets_text_never_html():
    assert "innerHTML" not in GRID_JS and "insertAdjacentHTML" not in GRID_JS and "outerHTML" not in GRID_JS
    assert "textContent = text" in GRID_JS and "s.title = tip" in GRID_JS
    live_branch = GRID_TEMPLATE[GRID_TEMPLATE.index("{{#if value.live}}") : GRID_TEMPLATE.index("{{else}}")]
    assert live_branch == '{{#if value.live}}<div class="live"></div>'  # no data reaches the template while live


def test_raster_structure(timeline):
    fig = confidence_raster(timeline, highlight=2)
    heat, above, forced = fig.data[:3]  # then the legend's blank traces for the marks
    z = np.asarray(heat.z, dtype=float)
    assert z.shape == (4, 8) and heat.x0 == 3 and heat.zmin == 0 and heat.zmax == 1  # columns from the first block
    assert z[0, 0] == pytest.approx(0.95) and math.isnan(z[1, 0])  # position 3 committed in iteration 0
    assert z[1, 1] == pytest.approx(0.6) and math.isnan(z[0, 4])  # position 4 masked until 1; 7 not in block 0
    assert heat.y0 == 1  # iterations numbered 1..N, as the page does
    assert sorted(zip(above.x, above.y)) == [(3, 1), (5, 1), (6, 2), (8, 4), (9, 4), (10, 4)]
    assert sorted(zip(forced.x, forced.y)) == [(4, 2), (7, 3)]
    kinds = [(s.type, s.line.dash) for s in fig.layout.shapes]
    assert kinds.count(("rect", None)) == 2  # two refresh bands
    assert kinds.count(("rect", "dash")) == 2  # two windows
    assert kinds.count(("line", None)) == 3  # two block starts and the highlight


def test_raster_upto_and_live_window_cut_rows(timeline):
    assert np.asarray(confidence_raster(timeline, upto=1).data[0].z).shape == (2, 8)
    live = confidence_raster(timeline, last_rows=2)
    assert np.asarray(live.data[0].z).shape == (2, 8) and live.data[0].y0 == 3  # records 2-3: iterations 3-4
    assert list(live.layout.yaxis.range) == [4.5, 2.5]
    assert sorted(live.data[1].y) == [4, 4, 4] and list(live.data[2].y) == [3]  # commits of iterations 3-4 only


def test_iteration_chart(timeline):
    fig = iteration_chart(timeline)
    by_uid = {t.uid: t for t in fig.data}
    assert list(by_uid["above"].y) == [2, 1, 0, 3] and list(by_uid["forced"].y) == [0, 1, 1, 0]
    assert list(by_uid["threshold"].y) == pytest.approx([0.9] * 4)
    assert list(by_uid["scalar-cont_weight"].y) == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert list(by_uid["ms-refresh"].x) == [1, 3] and list(by_uid["ms-window"].y) == pytest.approx([20, 40])


def test_extras_figure(timeline):
    assert plottable_extras(timeline) == ["credit"]
    fig = extras_figure(timeline)
    z = np.asarray(fig.data[0].z, dtype=float)
    assert z.shape == (4, 8) and z[1, 1] == pytest.approx(0.6) and z[1, 0] == pytest.approx(1.5)  # every block position
    trace = handmade_trace()
    for rec in trace.iterations:
        rec.extras = {}
    message = extras_figure(Timeline(trace)).layout.annotations[0].text
    assert "no per-position extras" in message
    # wrapped to fit the narrowest plot, every word kept (it was cut off at both edges at 1024 px)
    lines = message.split("<br>")
    assert len(lines) > 1 and max(map(len, lines)) <= MESSAGE_LINE_CHARS
    assert " ".join(lines).endswith("staleness measurement add them)")


def test_compare_and_sweep_figures(timeline):
    fig = compare_figure([timeline, timeline], ["a", "b"])
    assert list(fig.data[0].y) == [2, 4, 5, 5]  # EOS commits do not count
    assert list(fig.data[0].x) == pytest.approx([0.01, 0.03, 0.06, 0.10])
    sweep = sweep_figure([{"value": 0.9, "accuracy": 1.0, "tpf": 1.5, "tps": 10.0, "examples": 4}, {"value": 0.5, "accuracy": 0.5, "tpf": 3.0, "tps": 20.0, "examples": 4}])
    assert list(sweep.data[0].x) == [3.0, 1.5] and list(sweep.data[0].text) == ["τ=0.5", "τ=0.9"]
    assert "τ=0.9<br>TPF 1.50 · accuracy 100%" in sweep.data[0].hovertext[1]
    # the flat pair-sum sweep: points that would print their labels over each other share one
    flat = [(0.05, 8.0, 0.042), (0.1, 8.0, 0.042), (0.2, 2.37, 0.208), (0.3, 2.04, 0.208), (0.5, 1.79, 0.208), (0.9, 1.68, 0.208)]
    crowded = sweep_figure([{"value": v, "tpf": t, "accuracy": a, "tps": 1.0, "examples": 24} for v, t, a in flat])
    assert list(crowded.data[0].text) == ["τ=0.05–0.1", "", "τ=0.2–0.9", "", "", ""]


def test_readout_uses_engine_stats(timeline):
    text = readout(timeline, wall_seconds=9.0)
    assert "| **50.0** | 1.25 | 4 | 40.0 | 0.100 | 5 | 2.0 ms (2.0%) | 9.00 |" in text
    trace = handmade_trace()
    trace.final, trace.stats = [], {}
    partial = readout(Timeline(trace))  # no footer: sums of per-iteration engine seconds (0.1 s, 5 tokens)
    assert "| 50.0 | 1.25 | 4 | 40.0 | 0.100 | 5 |" in partial and "no footer" in partial
    # the live grid's line: the same figures over the iterations shown (0.03 s, 4 tokens in 2)
    assert live_line(timeline, 2, 1.5) == "live · TPS 133.3 · TPF 2.00 · NFE 2 · fwd/s 66.7 · engine s 0.030 · tokens 4 · server s 1.50"


def test_trace_json_round_trip_keeps_the_view(timeline):
    again = Timeline(Trace.from_json(timeline.trace.to_json()))
    assert grid_value(again, 2) == grid_value(timeline, 2)


def test_first_wrong_commit(timeline):
    wrong = first_wrong(timeline, [20, 21, 22, 20, 0])  # position 6 should be 20, got 22 at iteration 1
    assert (wrong.position, wrong.iteration, wrong.confidence) == (6, 1, 0.91)
    assert first_wrong(timeline, [20, 21, 22, 22, 20, 0]) is None


def test_tokens_readable():
    assert readable("Ġthe") == " the" and readable("▁the") == " the" and readable("Ċ") == "\n"
    assert readable("é") == "é" and readable("<|endoftext|>") == "<|endoftext|>"
    assert glyph(" a\n") == "·a↵"


def test_settings_choices_come_from_the_engine():
    by_field = {c.field: c for c in all_controls()}
    assert list(by_field["decoder"].choices()) == decoder_names()
    assert tuple(by_field["cache"].choices()) == cache_mode_names()
    fields = {c.field for c in all_controls()}
    # every engine setting has a control; decoder_options has one per declared decoder option
    # (the built-in edit decoder's edit_threshold among them), kind_options one per kind's option
    options = {OPTION_PREFIX + name for name in decoder_options()} | {KIND_OPTION_PREFIX + name for name in kind_options()}
    assert {"decoder_options.edit_threshold", "kind_options.verify_threshold"} <= options
    # the answer's constraint: one mode and one text box for regex, json_schema and choice
    assert fields == (set(GenerationConfig().to_dict()) - {"decoder_options", "kind_options", "regex", "json_schema", "choice"}) | {"constraint", "constraint_text"} | options
    assert all(title for title, _ in sections())


def test_settings_validation_messages():
    spec, cfg = parse_settings({"config": {"gen_length": "32", "block_length": 8.0, "refresh_every": None}}, ModelSpec("m"))
    assert (cfg.gen_length, cfg.block_length, spec.path) == (32, 8, "m")
    with pytest.raises(EngineError, match="multiple of block_length"):
        build_config({"gen_length": 10, "block_length": 3})
    with pytest.raises(EngineError, match="unknown generation setting"):
        build_config({"nope": 1})
    with pytest.raises(EngineError, match="gen_length: expected a finite int"):
        build_config({"gen_length": "abc"})
    with pytest.raises(EngineError, match="unknown settings key"):
        parse_settings({"cfg": {}}, ModelSpec("m"))


def test_visible_fields_follow_decoder_and_cache():
    shown = visible_fields("fixed", "none", smoothing=False, unroll=False)
    assert {"steps", "decoder_options.remasking"} <= shown and "threshold" not in shown and "prefix_look" not in shown
    shown = visible_fields("threshold", "vicinity", smoothing=True, unroll=False)
    assert {"threshold", "prefix_look", "after_look", "cont_weight"} <= shown and "steps" not in shown and "max_unroll" not in shown
    assert "decoder_options.credit_alpha" in visible_fields("some_new_decoder", "none", False, False)  # unknown: show all


def test_explain_covers_every_built_in_decoder_and_cache_mode():
    """Every decoder the engine ships (a plug-in another test registered says it has none)."""
    for name in filter(is_builtin, decoder_names()):
        assert "No explanation" not in explain(name, "none")
    for mode in cache_mode_names():
        assert "No explanation" not in explain("threshold", mode)
    assert "No explanation" in explain("unheard_of", "none")


def test_sweep_points_and_values():
    ex = Example("add", "Q: 1+2=? A:", " The sum is 3.", 3)
    state = SweepState("threshold")
    state.outcomes = [
        Outcome(0.9, ex, " The sum is 3.", True, tokens=10, nfe=10, seconds=1.0),
        Outcome(0.9, ex, " The sum is 4.", False, tokens=10, nfe=5, seconds=1.0),
        Outcome(0.5, ex, " The sum is 3.", True, tokens=9, nfe=3, seconds=0.5),
    ]
    points = state.points()
    assert [p["value"] for p in points] == [0.5, 0.9]
    assert points[1]["accuracy"] == 0.5 and points[1]["tpf"] == pytest.approx(20 / 15) and points[1]["tps"] == 10.0
    assert parse_values("0.5, 0.7 0.9") == [0.5, 0.7, 0.9]
    with pytest.raises(EngineError):
        parse_values("a, b")


def test_system_options_say_why_they_are_off():
    params = engine_parameters()
    for device in ("cpu", "cuda"):
        for opt in offered_options(device):
            assert opt.available == (not opt.reason)
            if opt.name not in params:
                assert not opt.available and f"`{opt.name}`" in opt.reason


def test_parallel_degrees_run_as_processes_on_the_cpu_and_take_a_gpu_each_on_cuda(monkeypatch):
    import dinfer_viz.live.system as system

    on_cpu = {o.name: o for o in offered_options("cpu")}
    assert on_cpu["tp_size"].available and on_cpu["ep_size"].available and on_cpu["tp_size"].kind is int
    for gpus, available in ((1, False), (2, True)):
        monkeypatch.setattr(system, "cuda_count", lambda: gpus)
        on_cuda = {o.name: o for o in offered_options("cuda")}
        assert on_cuda["tp_size"].available == available and on_cuda["ep_size"].available == available
    monkeypatch.setattr(system, "cuda_count", lambda: 1)
    assert offered_options("cuda")[0].reason == "needs 2 CUDA GPUs (one per process); this machine has 1"


def test_every_kind_the_engine_registers_has_a_view_found_from_its_file():
    """Kinds and views are discovered from their packages (engine/kinds/, dinfer_viz/views/): every
    view module registers a view, every kind whose records keep a step state of their own has its
    own, and every registered kind is drawn by one (a kind without state by masked diffusion's)."""
    import pkgutil

    import dinfer_viz.views
    from dinfer_viz.views import VIEWS
    from engine.kinds import KINDS

    files = {m.name for m in pkgutil.iter_modules(dinfer_viz.views.__path__)} - {"base"}
    assert {type(view).__module__.split(".")[2] for view in VIEWS.values()} == files
    from dinfer_viz.views import view_of_kind
    from engine.step_state import has_step_state

    assert {kind for kind in KINDS if has_step_state(kind)} <= set(VIEWS)
    assert all(view_of_kind(kind) is VIEWS.get(kind, VIEWS["masked"]) for kind in KINDS)
