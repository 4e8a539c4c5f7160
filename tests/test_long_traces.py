"""A long trace loads in bounded work, and the replay step takes any value (issue #33, the app).

A 30 MB trace (about 1,000 iterations over a 1,000-position canvas) took about 90 s to load: its
heatmaps (raster, extras, K/V states) carried one cell per iteration and position, a hover line
each in the K/V figure, and the browser parsed tens of megabytes. The heatmaps now draw at most
MAX_HEATMAP_CELLS cells (evenly spaced iterations, the one shown and the last among them, the axis
title saying so). These tests count cells, rows built and bytes, never seconds.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
import pytest

from dinfer_viz.drawing.figure_base import MAX_HEATMAP_CELLS, heatmap_rows
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.tabs.compare import COMPARE_VIEW, CompareState
from dinfer_viz.tabs.run import RUN_VIEW, RunState
from dinfer_viz.reading.timeline import Timeline
from dinfer_viz.ui import Handlers
from engine import IterationRecord, Trace

from .app_support import handmade_trace

PROMPT, BLOCK = 4, 128


def long_trace(iterations: int, gen: int) -> Trace:
    """A dual-cache run with measured staleness over a `gen`-position answer in blocks of BLOCK,
    one commit an iteration (a refresh at each block's start), as the engine writes them."""
    mask, canvas = 1, PROMPT + gen
    per_block = iterations // (gen // BLOCK)
    records, committed = [], 0
    for i in range(iterations):
        block = min(i // per_block, gen // BLOCK - 1)
        s, e = PROMPT + block * BLOCK, PROMPT + (block + 1) * BLOCK
        commit = [PROMPT + committed] if committed < gen and s <= PROMPT + committed < e else []
        committed += len(commit)
        records.append(IterationRecord(
            iteration=i, block=block, block_range=[s, e], forward="refresh" if i % per_block == 0 else "dual",
            recomputed=[[0, canvas]] if i % per_block == 0 else [[s, e]], threshold=None, committed=[commit], forced=[commit],
            top1=[[20] * BLOCK], confidence=[[0.5] * BLOCK], seconds=0.001,
            extras={"staleness_kl": [[0.01] * BLOCK], "staleness_agree": [[1.0] * BLOCK]}, active=[True], final_until=[PROMPT + committed],
        ))
    final = [10] * PROMPT + [20] * committed + [mask] * (gen - committed)
    return Trace(
        model="long", mask_id=mask, eos_ids=[0], prompt_lengths=[PROMPT], canvas_length=canvas, block_length=BLOCK,
        config={"decoder": "fixed", "cache": "dual", "measure_staleness": True}, initial=[[10] * PROMPT + [mask] * gen],
        tokens={"0": "<|endoftext|>", "1": "<|mdm_mask|>", "10": "A", "20": "x"}, iterations=records, final=[final],
        stats={"nfe": iterations, "tokens": committed, "seconds": 1.0, "batch": 1, "trace_seconds": 0.0, "tps": 1.0, "tpf": 1.0, "forwards_per_second": 1.0}, trace_seconds=0.0,
    )


@pytest.fixture
def handlers(tmp_path) -> Handlers:
    return Handlers(EngineHost(ModelSpec(str(tmp_path / "never-loaded"))), no_model=True)


def heatmaps(view: dict) -> list:
    figures = [view["raster"], view["extras"], view["cache_states"]["value"]]
    return [t for f in figures for t in f.data if t.type == "heatmap"]


def test_heatmap_rows_keep_the_shown_and_the_last_iteration():
    assert heatmap_rows(0, 9, 100) == list(range(10))  # within the bound: every iteration
    rows = heatmap_rows(0, 2999, 1000, keep=1234, cells=50_000)
    assert len(rows) <= 50 and {0, 1234, 2999} <= set(rows) and rows == sorted(set(rows))
    assert heatmap_rows(40, 2999, 1000, cells=50_000)[0] == 40  # a live view's window starts where it starts


def test_a_long_trace_loads_with_bounded_heatmaps(handlers, tmp_path, monkeypatch):
    trace = long_trace(1024, 1024)
    path = tmp_path / "long.json"
    path.write_text(trace.to_json())
    assert path.stat().st_size > 2_500_000  # a few MB here; the bound makes the views' size independent of it
    built = []  # the block rows the rasters built (each costs a canvas lookup per block position)
    real = Timeline.token_before
    monkeypatch.setattr(Timeline, "token_before", lambda self, p, i: built.append(i) or real(self, p, i))
    view = dict(zip(RUN_VIEW, handlers.load_trace(str(path))))
    assert view["message"].startswith("loaded a trace"), view["message"]
    maps = heatmaps(view)
    assert len(maps) == 4  # raster, two extras panels, K/V states
    for heatmap in maps:
        assert heatmap.z.shape[0] * heatmap.z.shape[1] <= MAX_HEATMAP_CELLS
        assert heatmap.y[-1] == 1024  # the last iteration, the one shown, is drawn
    assert len(set(built)) * BLOCK * 1.0 <= MAX_HEATMAP_CELLS  # rows built for the raster only, not all 1,024
    assert "drawn)" in view["raster"].layout.yaxis.title.text and "of 1024 drawn" in view["cache_states"]["value"].layout.yaxis.title.text
    sent = sum(len(gr.Plot().postprocess(f).plot) for f in (view["raster"], view["extras"], view["cache_states"]["value"]))
    assert sent < 8_000_000  # what the page receives (1M cells per figure before: ~25 MB)
    # scrubbing keeps the iteration asked for among the rows drawn
    scrubbed = dict(zip(RUN_VIEW, handlers.replay(300, view["state"])))
    assert all(300 in set(h.y.tolist()) for h in heatmaps(scrubbed))


def test_a_short_trace_draws_every_iteration(handlers, tmp_path):
    view = dict(zip(RUN_VIEW, handlers.replay(2, RunState(Timeline(handmade_trace()), expected=None))))
    raster = view["raster"].data[0]
    assert raster.y is None and raster.y0 == 1 and raster.z.shape[0] == 4 and view["raster"].layout.yaxis.title.text == "iteration"


@pytest.mark.parametrize("value", ["abc", "", None, "2.5", float("nan"), [1], {"x": 1}, True])
def test_a_replay_step_that_is_not_a_whole_number_is_one_line(handlers, value):
    state = RunState(Timeline(handmade_trace()), expected=None)
    message = dict(zip(RUN_VIEW, handlers.replay(value, state)))["message"]
    assert "the iteration to show must be a whole number" in message and "\n" not in message
    a = Timeline(handmade_trace())
    compared = CompareState(a, a, ("A", "B"), (0.1, 0.1), ({}, {}), (None, None))
    assert "must be a whole number" in dict(zip(COMPARE_VIEW, handlers.compare_replay(value, compared)))["message"]


def test_the_replay_endpoints_take_the_raw_value(handlers):
    """Gradio's slider check would reject a non-number before the handler with its generic error."""
    from dinfer_viz.ui import build_demo

    demo = build_demo(handlers)
    by_name = {fn.api_name: fn for fn in demo.fns.values()}
    assert not by_name["replay"].preprocess and not by_name["compare_replay"].preprocess
    assert dict(zip(RUN_VIEW, handlers.replay("3", RunState(Timeline(handmade_trace()), expected=None))))["grid"]["caption"].startswith("iteration 3/4")
    json.dumps(demo.config, default=str)  # the page still builds its config


def test_a_trace_whose_footer_names_some_figures_only_loads(handlers, tmp_path):
    """A hand-written footer may leave figures out (or null): the readout sums them from the
    records, as a live run's, instead of failing with an internal KeyError."""
    trace = handmade_trace()
    trace.stats = {"nfe": 4, "tokens": 5, "tps": None}
    path = tmp_path / "footer.json"
    path.write_text(trace.to_json())
    view = dict(zip(RUN_VIEW, handlers.load_trace(str(path))))
    assert view["message"].startswith("loaded a trace"), view["message"]
    assert "| **50.0** | 1.25 | 4 | 40.0 | 0.100 | 5 |" in view["readout"]
