"""The figures and exports as a class reads them (issue 16): one iteration numbering across raster, chart,
extras and the grid's caption; expected tokens as characters; a legend for every mark; τ on the
colour bar; a vicinity window shown whole; the threshold title clear of its ticks; no extras on
prompt positions; the run as a GIF or MP4 for slides and the Compare table as CSV. Checked on figure data and layout, from the hand-made trace and the shipped
sample traces (made by the engine on the embedded model)."""

from __future__ import annotations

import csv
import io
import json
import math
import sys

import numpy as np
import pytest
from PIL import Image, ImageColor

from dinfer_viz.panes.export import MAX_CELLS, MAX_FRAMES, MP4_MISSING, WIDTH, ExportUnavailable, compare_csv, frame_plan, frame_title, mp4_unavailable, render_frames, run_gif, run_mp4
from dinfer_viz.drawing.cells import PINNED
from dinfer_viz.drawing.figure_base import RASTER_MARKS
from dinfer_viz.panes.figures import confidence_raster, extras_figure, iteration_chart
from dinfer_viz.panes.grid import CELL_COLOURS, caption, grid_value
from dinfer_viz.sample_traces import TRACES
from dinfer_viz.reading.timeline import Timeline, iteration_number
from engine import IterationRecord, Trace

from .app_support import handmade_trace


@pytest.fixture
def timeline() -> Timeline:
    return Timeline(handmade_trace())


def sample(stem: str) -> Timeline:
    return Timeline(Trace.from_json((TRACES / f"{stem}.json").read_text(encoding="utf-8")))


def by_uid(fig) -> dict:
    return {t.uid: t for t in fig.data}


def test_every_view_numbers_record_k_as_iteration_k_plus_1(timeline):
    k = 2  # the record the slider shows
    number = iteration_number(k)
    assert number == 3 and caption(timeline, k).startswith(f"iteration {number}/4")  # the grid's caption already counts 1..N
    raster = confidence_raster(timeline, highlight=k)
    heat = raster.data[0]
    assert heat.y0 == 1 and "iteration %{y}" in heat.hovertemplate
    rows = np.asarray(heat.z).shape[0]
    assert list(raster.layout.yaxis.range) == [rows + 0.5, 0.5]  # rows 1..4, none for "before the first forward"
    red = [s for s in raster.layout.shapes if s.line.color == "#dc2626"]
    assert len(red) == 1 and red[0].y0 == number
    forced = by_uid(raster)["commits-forced"]
    assert (7, number) in set(zip(forced.x, forced.y))  # position 7 was forced by record 2
    chart = iteration_chart(timeline, highlight=k)
    assert list(by_uid(chart)["above"].x) == [1, 2, 3, 4] and chart.layout.shapes[0].x0 == number
    assert list(chart.layout.xaxis.range) == [0.5, 4.5]
    extras = extras_figure(timeline, highlight=k)
    assert extras.data[0].y0 == 1 and extras.layout.shapes[0].y0 == number and "iteration %{y}" in extras.data[0].hovertemplate
    assert confidence_raster(timeline, highlight=-1).layout.shapes[-1].line.color != "#dc2626"  # 0: before any forward, no row to mark


def test_expected_token_reads_as_characters_in_raster_and_grid_hover():
    trace = handmade_trace()
    tl = Timeline(trace)
    expected = [20, 21, 26, 22, 0]  # position 5 should be id 26, which the run never proposed
    wrong = by_uid(confidence_raster(tl, expected=expected))["commits-new"]
    hover = dict(zip(wrong.x, wrong.text))
    assert "expected '&lt;26&gt;'" in hover[5]  # an id the trace does not name reads as its number (shown escaped: '<26>')
    trace.tokens["26"] = "4"  # a run given the expected answer names its ids in the header (Engine.generate(expected=...))
    wrong = by_uid(confidence_raster(tl, expected=expected))["commits-new"]
    hover = dict(zip(wrong.x, wrong.text))
    assert hover[5].endswith("<br>expected '4'") and "expected" not in hover[3]  # right commits say nothing
    assert "expected &#x27;4&#x27; (id 26)" in grid_value(tl, 1, expected)["cells"][5]["tip"]  # the grid reads the same strings (HTML-escaped)


def test_token_text_in_a_hover_is_not_markup():
    trace = handmade_trace()
    trace.tokens["20"] = "<b>bold</b>"
    text = by_uid(confidence_raster(Timeline(trace)))["commits-new"].text
    assert any("&lt;b&gt;bold&lt;/b&gt;" in t for t in text) and not any("<b>" in t for t in text)


def test_raster_legend_names_each_mark_drawn(timeline):
    fig = confidence_raster(timeline, highlight=1)
    legend = [t.name for t in fig.data if t.uid.startswith("mark-")]
    # grey band, dashed range, block line, shown iteration (no pinned band: nothing pinned here, tests/test_infill_views.py)
    assert legend == [name for kind, (name, _) in RASTER_MARKS.items() if kind != PINNED]
    assert all(list(t.x) == [None] and t.hoverinfo == "skip" for t in fig.data if t.uid.startswith("mark-"))
    plain = sample("threshold-none")  # no cache: every forward recomputes everything, nothing dashed
    names = {t.uid for t in confidence_raster(plain).data}
    assert {"mark-exact", "mark-block"} <= names and "mark-partial" not in names and "mark-shown" not in names


def test_colour_bar_marks_tau_only_for_a_threshold_decoder(timeline):
    bar = confidence_raster(timeline).data[0].colorbar
    ticks = dict(zip(bar.tickvals, bar.ticktext))
    assert ticks[0.9] == "τ 0.90 ◀" and ticks[0.8] == "0.8" and ticks[1.0] == "1"
    trace = handmade_trace()
    for rec in trace.iterations:
        rec.threshold = 0.85
    ticks = confidence_raster(Timeline(trace)).data[0].colorbar.tickvals
    assert 0.85 in ticks and 0.8 not in ticks and 1.0 in ticks  # a tick too close to τ would print over its label
    fixed = confidence_raster(sample("fixed-none")).data[0].colorbar
    assert fixed.tickvals is None and fixed.tickmode is None


def test_vicinity_window_is_not_cut_off_but_a_prefix_range_to_the_end_is():
    tl = sample("threshold-vicinity")
    window = [r for r in tl.records if r.forward == "window"][0].recomputed[0]
    assert window[1] > tl.view_end()  # the window reaches past the block (after_look)
    fig = confidence_raster(tl)
    low, high = fig.layout.xaxis.range
    dashed = [s for s in fig.layout.shapes if s.line.dash == "dash"]
    assert dashed and all(low <= s.x0 and s.x1 <= high for s in dashed)
    assert high == window[1] - 0.5 and dashed[0].x1 == high
    prefix = sample("threshold-prefix")
    assert prefix.records[1].recomputed[0][1] == prefix.canvas_length  # the block and all after it
    assert confidence_raster(prefix).layout.xaxis.range[1] == prefix.view_end() - 0.5


def test_threshold_title_has_room_beside_its_ticks(timeline):
    layout = iteration_chart(timeline).layout
    assert layout.yaxis2.automargin is True and layout.yaxis2.title.standoff >= 5 and layout.margin.r >= 60


@pytest.mark.parametrize("stem,names", [("credit-none", ("credit", "raw_confidence")), ("hierarchical-none", ("runs", "anchors"))])
def test_extras_leave_prompt_positions_blank(stem, names):
    tl = sample(stem)
    assert tl.records[0].block_range[0] < tl.prompt_length  # the aligned block starts inside the prompt
    fig = extras_figure(tl)
    for trace in fig.data:
        if trace.uid.removeprefix("extra-") in names:
            z = np.asarray(trace.z, dtype=float)
            prompt_columns = tl.prompt_length - int(trace.x0)
            assert np.isnan(z[:, :prompt_columns]).all()
            assert np.isfinite(z[0, prompt_columns:]).any()  # the generated part still drawn


def test_extras_still_drawn_on_committed_positions(timeline):
    z = np.asarray(extras_figure(timeline).data[0].z, dtype=float)
    assert z[1, 0] == pytest.approx(1.5) and not math.isnan(z[3, 4])  # credit of every generated block position


# ---- exports for slides (dinfer_viz/panes/export.py) ------------------------------------------------------


def long_trace(iterations: int, gen: int) -> Trace:
    """One position committed per record over a `gen`-position block after a 3-token prompt."""
    trace = handmade_trace()
    s, e = 3, 3 + gen
    trace.canvas_length, trace.block_length = e, gen
    trace.initial = [[10, 11, 12] + [1] * gen]
    trace.iterations = [
        IterationRecord(iteration=i, block=0, block_range=[s, e], forward="full", recomputed=[[0, e]], threshold=None,
                        committed=[[s + i]], forced=[[s + i]], top1=[[20] * gen], confidence=[[0.5] * gen], seconds=0.001)
        for i in range(iterations)
    ]
    trace.final = [[10, 11, 12] + [20] * iterations + [0] * (gen - iterations)]
    trace.config = {"decoder": "fixed", "cache": "none"}
    return trace


def test_gif_has_one_frame_per_iteration_and_iteration_zero_first():
    tl = sample("threshold-dual")
    data = run_gif(tl)
    gif = Image.open(io.BytesIO(data))
    assert gif.format == "GIF" and gif.n_frames == tl.iterations + 1 and gif.size[0] == WIDTH
    assert frame_title(tl, -1) == f"iteration 0/{tl.iterations} · before the first forward"
    assert frame_title(tl, 2).startswith(f"iteration 3/{tl.iterations} · block 0 [0, 32) · dual forward")
    plan = frame_plan(tl)
    assert plan.header == ["tiny-llada · decoder threshold (τ 0.90) · cache dual · block 32"]  # nothing cut
    assert plan.positions == list(range(0, tl.view_end()))


def cell_row_colours(frame: Image.Image) -> set:
    """The colours along a line through the (single) row of cells, just under their top edge."""
    top = 12 + 22 + 18 + 6  # padding, the iteration line, one header line, the gap
    return {frame.getpixel((x, top + 4)) for x in range(frame.size[0])}


def test_gif_frames_colour_cells_as_the_grid_does(timeline):
    assert len({f.size for f in render_frames(timeline)}) == 1
    gif = Image.open(io.BytesIO(run_gif(timeline)))
    frames = []
    for k in range(gif.n_frames):
        gif.seek(k)
        frames.append(gif.convert("RGB"))
    colour = {state: ImageColor.getrgb(CELL_COLOURS[state][0]) for state in CELL_COLOURS}
    assert len(frames) == 5 and cell_row_colours(frames[0]) >= {colour["prompt"], colour["masked"]}  # iteration 0
    # record 1 (frame 2): position 4 forced, 6 above threshold, 3 and 5 from before, the next block masked
    assert cell_row_colours(frames[2]) >= {colour[s] for s in ("prompt", "old", "forced", "new", "masked")}
    # the last frame forced nothing: no orange cell, yet its colours are exact (one palette for all frames)
    assert colour["forced"] not in cell_row_colours(frames[4]) and colour["new"] in cell_row_colours(frames[4])


def test_gif_size_is_bounded_and_the_caption_says_what_was_cut():
    tl = Timeline(long_trace(300, 400))
    plan = frame_plan(tl)
    assert len(plan.iterations) == MAX_FRAMES and plan.iterations[0] == -1 and plan.iterations[-1] == 299
    assert len(plan.positions) == MAX_CELLS
    assert plan.header[1] == f"{MAX_FRAMES} of 301 frames shown (evenly spaced iterations) · first {MAX_CELLS} of 403 positions shown"
    gif = Image.open(io.BytesIO(run_gif(tl, max_frames=10)))
    assert gif.n_frames == 10 and gif.size[0] == WIDTH and gif.size[1] < 600


def test_gif_written_to_a_path(tmp_path, timeline):
    data = run_gif(timeline, tmp_path / "run.gif")
    assert (tmp_path / "run.gif").read_bytes() == data


def test_mp4_says_in_one_line_when_ffmpeg_is_missing(monkeypatch, timeline):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert mp4_unavailable() == MP4_MISSING and "\n" not in MP4_MISSING
    with pytest.raises(ExportUnavailable, match="needs ffmpeg"):
        run_mp4(timeline)


def test_mp4_encodes_the_frames_through_ffmpeg(monkeypatch, tmp_path, timeline):
    # a stand-in ffmpeg: records its arguments and the frames it was given, writes the last argument
    fake = tmp_path / "bin" / "ffmpeg"
    fake.parent.mkdir()
    fake.write_text(
        "#!" + sys.executable + "\nimport glob, json, os, sys\n"
        "frames = sorted(glob.glob(sys.argv[sys.argv.index('-i') + 1].replace('%05d', '*')))\n"
        "open(sys.argv[-1], 'wb').write(json.dumps({'args': sys.argv[1:], 'frames': len(frames)}).encode())\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    assert mp4_unavailable() is None
    out = json.loads(run_mp4(timeline, tmp_path / "run.mp4", frame_ms=500))
    assert out["frames"] == 4 + 5  # four iterations and the last frame held 2.5 s at 2 frames/s
    assert out["args"][out["args"].index("-framerate") + 1] == "2" and "yuv420p" in out["args"]
    assert json.loads((tmp_path / "run.mp4").read_bytes()) == out


def test_compare_csv_rows_are_the_runs_as_data():
    a, b = sample("fixed-none"), sample("threshold-dual")
    text = compare_csv([a, b], ["A: fixed, cache none", "B: threshold, τ=0.9, cache dual"], [1.5, None])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["run"] for r in rows] == ["A", "B"] and rows[1]["settings"] == "B: threshold, τ=0.9, cache dual"
    assert (rows[0]["threshold"], rows[1]["threshold"]) == ("", "0.9")
    assert int(rows[1]["nfe"]) == b.trace.stats["nfe"] and float(rows[1]["tpf"]) == pytest.approx(b.trace.stats["tpf"])
    assert (rows[0]["wall_seconds"], rows[1]["wall_seconds"]) == ("1.5", "")
    assert rows[1]["text"] == b.text_at(b.iterations - 1) and int(rows[0]["iterations"]) == a.iterations
    trace = handmade_trace()
    trace.tokens["20"] = '=HYPERLINK("x",1), "quoted"'
    hostile = list(csv.DictReader(io.StringIO(compare_csv([Timeline(trace)], ["-cmd"]))))[0]
    assert hostile["settings"] == "'-cmd" and hostile["text"].startswith("'=HYPERLINK")  # data, not a formula
