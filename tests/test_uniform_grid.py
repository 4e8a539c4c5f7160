"""The grid, its live frames and the exported frames of a uniform-state run (DiffusionGemma), from a
real run of the tiny random checkpoint: every cell's state, text, mark and hover are what the
records say (docs/trace.md §3.2), and every string from the tokenizer stays text."""

from __future__ import annotations

import re

import pytest

from engine import Engine, GenerationConfig
from engine.hooks import RunHooks
from engine.trace import Trace
from dinfer_viz.panes.export import frame_title, legend_states, render_frames
from dinfer_viz.panes.grid import LiveGrid, cell_state, grid_value
from dinfer_viz.reading.timeline import Timeline
from dinfer_viz.views.uniform.uniform_grid import finished_until

from .gemma_models import CANVAS

PROMPT = "Q: 7+5=? A:"


@pytest.fixture(scope="module")
def run(tiny_gemma_folder):
    engine = Engine(str(tiny_gemma_folder))
    config = GenerationConfig(decoder="uniform", block_length=CANVAS, gen_length=2 * CANVAS, seed=3, decoder_options={"max_denoising_steps": 6})
    return engine.generate(PROMPT, config, RunHooks(trace=True))


@pytest.fixture(scope="module")
def timeline(run) -> Timeline:
    return Timeline(Trace.from_dict(run.output.trace.to_dict()))


def _cells(timeline: Timeline, iteration: int) -> dict[int, dict]:
    return {c["p"]: c for c in grid_value(timeline, iteration)["cells"] if c["p"] >= 0}


def test_each_cell_is_what_its_record_did(timeline):
    assert timeline.kind == "uniform" and timeline.iterations > 2
    for i, rec in enumerate(timeline.records):
        cells = _cells(timeline, i)
        s, e = rec.block_range
        canvas, before = timeline.canvas_at(i), timeline.canvas_at(i - 1)
        u = rec.state
        done = u["output"] is not None
        for p in range(s, e):
            kinds = cells[p]["k"].split()
            if done:
                assert kinds[0] in ("output", "fill")
            elif rec.active[0]:
                # accepted iff the record accepted it; every other canvas position was re-noised
                assert (kinds[0] == "accepted") == (p in rec.committed[0]) and (kinds[0] == "noise") == (p in u["renoised"][0])
            assert ("chg" in kinds) == (canvas[p] != before[p])
            assert "blk" in kinds or done
        for p in range(e, timeline.canvas_length):
            assert cells[p]["k"] == "masked"  # later canvases: not generated yet
        for p in range(timeline.prompt_length, s):
            assert cells.get(p, {"k": "fill"})["k"].split()[0] in ("output", "fill")  # a collapsed fill run keeps its first position


def test_hover_and_caption_carry_the_rules_numbers(timeline):
    i = next(k for k, rec in enumerate(timeline.records) if rec.state["output"] is None and len(rec.committed[0]) >= 1)
    rec, u = timeline.records[i], timeline.records[i].state
    s = rec.block_range[0]
    cells = _cells(timeline, i)
    p = rec.committed[0][0]
    assert f"entropy {u['entropy'][0][p - s]:.3f} · accepted" in cells[p]["tip"]
    assert f"sum to {u['entropy_sum'][0][p - s]:.4g} ≤ bound {u['bound']:g}" in cells[p]["tip"]
    q = u["renoised"][0][0]
    noise = u["noise"][0][0]
    assert "re-noised" in cells[q]["tip"] and f"(id {noise})" in cells[q]["tip"]
    caption = grid_value(timeline, i)["caption"]
    assert f"accepted {len(rec.committed[0])} (entropy bound {u['bound']:g})" in caption
    assert f"re-noised {len(u['renoised'][0])}" in caption and f"temperature {u['temperature']:.2f}" in caption
    legend = grid_value(timeline, i)["legend"]
    assert "accepted this step" in legend and "noise" in legend and "committed now" not in legend


def test_finished_canvases_show_their_output(timeline, run):
    last = timeline.iterations - 1
    assert finished_until(timeline, last) == timeline.canvas_length
    cells = _cells(timeline, last)
    final = run.output.trace.final[0]
    for p in range(timeline.prompt_length, timeline.canvas_length):
        if p in cells and cells[p]["k"].split()[0] == "output":
            assert f"(id {final[p]})" in cells[p]["tip"]


def test_live_frames_bring_the_whole_canvas_as_the_grid_draws_it(timeline):
    live = LiveGrid(timeline, "run-u")
    for shown in range(1, timeline.iterations + 1):
        frame = live.value(shown, shown, shown - 1, "")
        cells = {c[0]: c for c in frame["live"]["canvas"] if c[0] >= 0}
        want = _cells(timeline, shown - 1)
        assert frame["live"]["commits"] == [] and frame["live"]["win"] == []
        for p, c in cells.items():
            if p in want:
                assert c[2] == want[p]["k"]
        assert "accepted this step" in frame["legend"]


def test_token_strings_from_the_tokenizer_stay_text(run):
    data = run.output.trace.to_dict()
    data["tokens"] = {k: "<img src=x onerror=alert(1)>${x}`" for k in data["tokens"]}
    tl = Timeline(Trace.from_dict(data))
    for i in (-1, 0, tl.iterations - 1):
        value = grid_value(tl, i)
        for cell in value["cells"]:
            for field in ("t", "tip"):
                assert "<img" not in cell[field] and "${" not in cell[field] and "`" not in cell[field]
        assert "<img" not in value["caption"]


def test_exported_frames_name_the_uniform_states(timeline):
    assert legend_states(timeline) == ("prompt", "noise", "accepted", "output")
    assert frame_title(timeline, 0).startswith("iteration 1/")
    assert re.search(r"accepted \d+ \(entropy bound", frame_title(timeline, 0))
    frames = render_frames(timeline, max_frames=4)
    assert len(frames) == 4 and len({f.size for f in frames}) == 1
    assert cell_state(timeline, timeline.canvas_at(0), timeline.records[0].committed[0][0], 0) == "accepted"
