"""Every view shows the text a request pinned (issue 57 item 3, docs/algorithms.md §11) as its own
state, "pinned by the request": the grid (replayed and live), its legend, the details panel, the
raster, the exported frames and the order analysis; Compare's two grids; a trace from before
pinned text existed (version 6) draws as it always did.

A hand-made trace pins the cases (text between two holes and after the last, hostile token
strings); a real template run on the embedded model checks the views against the engine's own
`pinned` header, whatever the weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import numpy as np
import pytest
from PIL import ImageColor

from dinfer_viz.drawing.cells import PINNED
from dinfer_viz.panes.details import position_details
from dinfer_viz.panes.export import legend_states, render_frames
from dinfer_viz.panes.figures import raster
from dinfer_viz.panes.grid import CELL_COLOURS, GRID_CSS, LiveGrid, cell_state, grid_value, legend_html
from dinfer_viz.reading.timeline import Timeline
from engine import IterationRecord, Trace
from engine.analysis import analyze, decided_steps

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "assets" / "tiny-llada"
MASK = 1
HOSTILE = "${alert(1)}"
PINNED_AT = [5, 7, 8]  # '<b>+</b>' between the holes [3, 5) and [6, 7); '=', HOSTILE after the last


def pinned_trace() -> Trace:
    """Prompt [A B C], template `{{hole:2}}<b>+</b>{{hole:1}}=${alert(1)}`: one block [3, 7) over
    the holes and the pinned '<b>+</b>' between them; '=' and the hostile string after the last
    hole are context. Record 0 commits 4, record 1 commits 3 and 6 (the middle last)."""
    tokens = {"0": "<|endoftext|>", "1": "<|mdm_mask|>", "10": "A", "11": "B", "12": "C", "20": "4", "21": "7", "30": "<b>+</b>", "31": "=", "32": HOSTILE}

    def rec(i, committed, top1, conf):
        return IterationRecord(
            iteration=i, block=0, block_range=[3, 7], forward="full", recomputed=[[0, 9]], threshold=0.9,
            committed=[committed], forced=[[]], top1=[top1], confidence=[conf], seconds=0.01, active=[True], final_until=[3 if i == 0 else 9],
        )

    initial = [10, 11, 12, MASK, MASK, 30, MASK, 31, 32]
    return Trace(
        model="handmade-infill", mask_id=MASK, eos_ids=[0], prompt_lengths=[3], canvas_length=9, block_length=4,
        config={"decoder": "threshold", "cache": "none", "threshold": 0.9, "template": "{{hole:2}}<b>+</b>{{hole:1}}=" + HOSTILE},
        initial=[initial], tokens=tokens, pinned=[list(PINNED_AT)],
        iterations=[rec(0, [4], [20, 21, 30, 20], [0.5, 0.95, 0.1, 0.4]), rec(1, [3, 6], [20, 21, 30, 21], [0.97, 0.99, 0.1, 0.96])],
        final=[[10, 11, 12, 20, 21, 30, 21, 31, 32]],
        stats={"nfe": 2, "tokens": 3, "seconds": 0.02, "batch": 1, "trace_seconds": 0.001, "tps": 150.0, "tpf": 1.5, "forwards_per_second": 100.0},
    )


def older_trace() -> Trace:
    """The same run as a version-6 file holds it: no `pinned` (nothing could be)."""
    data = json.loads(pinned_trace().to_json())
    data["version"] = 6
    del data["pinned"]
    return Trace.from_json(json.dumps(data))


@pytest.fixture
def timeline() -> Timeline:
    trace = pinned_trace()
    trace.check()
    return Timeline(trace)


def test_the_grid_draws_pinned_cells_in_their_own_state_at_every_iteration(timeline):
    assert timeline.pinned == frozenset(PINNED_AT)
    for i in range(-1, timeline.iterations):
        canvas = timeline.canvas_at(i)
        assert [p for p in range(timeline.canvas_length) if cell_state(timeline, canvas, p, i) == PINNED] == PINNED_AT
        cells = {c["p"]: c for c in grid_value(timeline, i)["cells"]}
        assert [p for p, c in cells.items() if c["k"].split()[0] == PINNED] == PINNED_AT
    cells = {c["p"]: c for c in grid_value(timeline, 1)["cells"]}
    assert cells[4]["k"].split()[0] == "old" and cells[3]["k"].split()[0] == "new"  # the holes as before
    assert "pinned by the request" in cells[5]["tip"] and "pinned by the request" not in cells[4]["tip"]
    # token strings escaped, as every cell's
    assert "<b>" not in cells[5]["t"] and "&lt;b&gt;" in cells[5]["t"]
    assert "${" not in cells[8]["t"] and "&#36;&#123;" in cells[8]["t"]
    assert "pinned by the request" in legend_html(timeline)
    assert f".cell.{PINNED}{{background:{CELL_COLOURS[PINNED][0]}}}" in GRID_CSS


def test_a_live_grid_starts_with_the_pinned_cells_in_their_state(timeline):
    live = LiveGrid(timeline, "run-1").value(1, 1, -1, "")
    kinds = {p: kind for p, _, kind, _ in live["live"]["canvas"]}
    assert [p for p, k in kinds.items() if k == PINNED] == PINNED_AT and kinds[3] == "masked" and kinds[0] == "prompt"
    assert "pinned by the request" in live["legend"]


def test_the_details_panel_says_a_pinned_cell_was_pinned_by_the_request(timeline):
    for i in (-1, 0, 1):
        panel = position_details(timeline, 5, i)
        assert "pinned by the request" in panel and "early stop" not in panel and "&lt;b&gt;+&lt;/b&gt;" in panel and "<b>+" not in panel
    assert "pinned by the request" not in position_details(timeline, 4, 1)
    assert "generated token 2 of the answer" in position_details(timeline, 4, 1)
    after = position_details(timeline, 8, 1)  # after the last hole: context, in no block
    assert "pinned by the request" in after and "after the last hole" in after and "early stop" not in after and HOSTILE not in after


def test_the_raster_bands_the_pinned_text(timeline):
    fig = raster(timeline)
    colour = CELL_COLOURS[PINNED][0]
    bands = sorted((s.x0, s.x1) for s in fig.layout.shapes if s.fillcolor == colour)
    assert bands == [(4.5, 5.5), (6.5, 8.5)]  # position 5, and 7-8 (the view reaches the text the model read)
    assert any(t.uid == f"mark-{PINNED}" and "pinned by the request" in t.name for t in fig.data)
    assert fig.layout.xaxis.range[1] == 8.5


def _has_colour(image, colour: str) -> bool:
    rgb = np.asarray(image.convert("RGB")).reshape(-1, 3)
    return bool((rgb == np.array(ImageColor.getrgb(colour))).all(axis=1).any())


def test_export_frames_draw_and_name_the_pinned_state(timeline):
    assert PINNED in legend_states(timeline)
    frames = render_frames(timeline)
    legend_top = frames[0].height - 2 * 20 - 12  # the legend's rows sit at the bottom
    assert all(_has_colour(f.crop((0, 0, f.width, legend_top)), CELL_COLOURS[PINNED][0]) for f in frames)


def test_compare_draws_a_pinning_run_beside_an_older_one(tmp_path, timeline):
    from dinfer_viz.live.host import EngineHost, ModelSpec
    from dinfer_viz.tabs.compare import COMPARE_VIEW, CompareState
    from dinfer_viz.ui import Handlers

    h = Handlers(EngineHost(ModelSpec(str(tmp_path / "never-loaded"))), no_model=True)
    for number in (0, 2):
        view = dict(zip(COMPARE_VIEW, h.compare_replay(number, CompareState(timeline, Timeline(older_trace())))))
        assert [c["p"] for c in view["grid_a"]["cells"] if c["k"].split()[0] == PINNED] == PINNED_AT
        assert not [c for c in view["grid_b"]["cells"] if c["k"].split()[0] == PINNED]
        assert "pinned by the request" in view["grid_a"]["legend"] and "pinned by the request" not in view["grid_b"]["legend"]


def test_the_order_analysis_leaves_the_pinned_text_out(timeline):
    steps = decided_steps(timeline.trace)
    assert sorted(steps) == [3, 4, 6]  # the holes only: pinned text is final before any step
    result = analyze(timeline.trace)
    # after record 0: 3 predicted right, 4 written, 6 predicted wrong (the pinned three would make it 5 of 6)
    assert result["order_left_out"] == 0 and result["finalized_fraction"][0] == round(2 / 3, 4)


def test_an_older_trace_draws_as_before():
    old = Timeline(older_trace())
    assert old.trace.pinned is None and old.pinned == frozenset()
    states = {p: cell_state(old, old.canvas_at(1), p, 1) for p in range(old.canvas_length)}
    assert PINNED not in states.values() and states[5] == "fill"  # a committed-looking token no step wrote
    assert "pinned by the request" not in legend_html(old) and PINNED not in legend_states(old)
    fig = raster(old)
    assert not any(s.fillcolor == CELL_COLOURS[PINNED][0] for s in fig.layout.shapes)
    assert fig.layout.xaxis.range[1] == 6.5  # the last block's end, as before
    assert "pinned by the request" not in position_details(old, 5, 1)
    assert [k for _, _, k, _ in LiveGrid(old, "r").canvas].count(PINNED) == 0


@pytest.mark.skipif(not (MODEL / "config.json").exists(), reason="needs the embedded model")
def test_a_real_template_run_shows_the_engines_pinned_positions():
    import torch

    from engine import Engine, GenerationConfig, RunHooks

    torch.set_num_threads(1)
    engine = Engine(str(MODEL))
    config = GenerationConfig(template=" {{hole:2}} + {{hole:3}}", block_length=4, decoder="threshold", cache="none")
    trace = engine.generate("Q: ?+?=57 A:", config, hooks=RunHooks(trace=True)).output.trace
    tl = Timeline(trace)
    assert trace.pinned and tl.pinned == frozenset(trace.pinned[0])
    for i in range(-1, tl.iterations):
        cells = grid_value(tl, i)["cells"]
        assert {c["p"] for c in cells if c["k"].split()[0] == PINNED} == set(trace.pinned[0])
    written = {p for rec in trace.iterations for p in rec.committed[0]}
    assert not written & tl.pinned and set(decided_steps(trace)) <= written | {p for rec in trace.iterations for p in range(*rec.block_range)} - tl.pinned
