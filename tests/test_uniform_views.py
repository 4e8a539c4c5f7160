"""The Run tab's raster, per-iteration chart, details panel and explanation for a uniform-state run
(DiffusionGemma), from real runs of the tiny random checkpoint: every number drawn or written is
the one the records hold (docs/trace.md §3.2), and every string from the tokenizer stays text.
Masked runs' views are checked unchanged by tests/test_app_views.py, test_details.py and
test_figures_teaching.py."""

from __future__ import annotations

import html
import math
import re

import numpy as np
import pytest

from dinfer_viz.panes.details import position_details
from dinfer_viz.panes.explain import explain
from dinfer_viz.panes.figures import confidence_raster, iteration_chart
from dinfer_viz.reading.timeline import Timeline, iteration_number
from dinfer_viz.views.uniform import UNIFORM_READING, UNIFORM_SETTINGS
from engine import Engine, GenerationConfig, RunHooks, Trace
from engine.cache_modes import cache_mode
from engine.kinds.uniform import UniformSampler

from .gemma_models import CANVAS

PROMPT = "Q: 7+5=? A:"
HOSTILE = "<script>alert(1)</script>${alert(2)}`"
# Stability 0 and a high confidence threshold: the random model's rows stop (it never settles a
# draft), one before the other in a batch, so a frozen row's steps are exercised.
STOPPING = dict(max_denoising_steps=10, confidence_threshold=1.8, stability_threshold=0, t_min=0.2, t_max=1.0, entropy_bound=0.5)


def _trace(folder, prompts, seed: int, **options) -> Trace:
    config = GenerationConfig(decoder="uniform", block_length=CANVAS, gen_length=2 * CANVAS, seed=seed, decoder_options=options)
    out = Engine(str(folder)).generate(prompts, config, RunHooks(trace=True), expected="12")
    return Trace.from_dict(out.output.trace.to_dict())  # as a loaded trace file reads


@pytest.fixture(scope="module")
def single(tiny_gemma_folder) -> Trace:
    return _trace(tiny_gemma_folder, PROMPT, 3, max_denoising_steps=6, entropy_bound=3.0)  # a wide bound: several accepted per step


@pytest.fixture(scope="module")
def batch(tiny_gemma_folder) -> Trace:
    return _trace(tiny_gemma_folder, [PROMPT, "xyz abc"], 2, **STOPPING)


def _timelines(single: Trace, batch: Trace) -> list[Timeline]:
    return [Timeline(single), Timeline(batch, 0), Timeline(batch, 1)]


def by_uid(fig) -> dict:
    return {t.uid: t for t in fig.data}


def _active(tl: Timeline, i: int) -> bool:
    return tl.records[i].active[tl.row]


def test_the_runs_exercise_accepting_several_and_a_frozen_row(single, batch):
    assert all(rec.state is not None for rec in single.iterations + batch.iterations)
    assert max(len(rec.committed[0]) for rec in single.iterations) >= 3
    assert any(rec.active == [True, False] for rec in batch.iterations)  # row 1 stopped first
    assert all(any(rec.state["output"] is not None for rec in t.iterations) for t in (single, batch))


# ---- the raster ---------------------------------------------------------------------------------
def test_raster_is_each_steps_entropy_and_marks_exactly_the_accepted(single, batch):
    for tl in _timelines(single, batch):
        fig = confidence_raster(tl, expected=tl.expected)
        marks = by_uid(fig)
        heat = marks["raster"]
        z = np.asarray(heat.z, dtype=float)
        x0 = tl.view_start()
        assert (heat.x0, heat.dx, heat.y0, heat.dy) == (x0, 1, 1, 1)  # a point's x is its position, y its iteration number (the click pins them)
        assert z.shape == (tl.iterations, tl.view_end() - x0) and heat.colorbar.title.text == "entropy" and heat.zmin == 0
        accepted = set()
        for i, rec in enumerate(tl.records):
            s, e = rec.block_range
            u = rec.state
            for p in range(x0, tl.view_end()):
                if s <= p < e and _active(tl, i):
                    assert z[i, p - x0] == pytest.approx(u["entropy"][tl.row][p - s], abs=1e-6)
                else:
                    assert math.isnan(z[i, p - x0])  # outside the step's canvas, or a stopped row's frozen step
            rule = {p for p in range(s, e) if u["entropy_sum"][tl.row][p - s] <= u["bound"]} if _active(tl, i) else set()
            assert set(rec.committed[tl.row]) == rule  # the records' own rule: accepted iff entropy_sum <= bound
            accepted |= {(p, iteration_number(i)) for p in rule}
        points = marks["accepted"]
        assert set(zip(points.x.tolist(), points.y.tolist())) == accepted and len(points.x) == len(accepted)
        bound = tl.records[-1].state["bound"]
        assert f"bound {bound:g}" in points.name  # the legend states the bound
        done = marks["canvas-done"]
        assert sorted(done.y.tolist()) == [iteration_number(i) for i, rec in enumerate(tl.records) if rec.state["output"] is not None]


def test_raster_hovers_carry_the_rule_and_the_noise_drawn(single):
    tl = Timeline(single)
    heat = by_uid(confidence_raster(tl))["raster"]
    x0 = tl.view_start()
    for i, rec in enumerate(tl.records):
        u = rec.state
        s = rec.block_range[0]
        for p, noise in zip(u["renoised"][0], u["noise"][0]):
            text = heat.text[i][p - x0]
            assert text.startswith("re-noised → random ") and f"sum to {u['entropy_sum'][0][p - s]:.4g} &gt; bound {u['bound']:g}" in text
            assert tl.text_of(noise) in html.unescape(text)
        for p in rec.committed[0]:
            assert heat.text[i][p - x0].startswith("accepted ") and "≤ bound" in heat.text[i][p - x0]


def test_raster_highlight_and_live_rows(single):
    tl = Timeline(single)
    k = 3
    fig = confidence_raster(tl, highlight=k)
    red = [s for s in fig.layout.shapes if s.line.color == "#dc2626"]
    assert len(red) == 1 and red[0].y0 == iteration_number(k)
    starts = sorted(s.x0 + 0.5 for s in fig.layout.shapes if s.line.color == "#2563eb")
    assert starts == sorted({rec.block_range[0] for rec in tl.records})  # one line per canvas start
    live = confidence_raster(tl, upto=k, last_rows=2)
    heat = by_uid(live)["raster"]
    assert np.asarray(heat.z).shape[0] == 2 and heat.y0 == iteration_number(k - 1)
    assert set(by_uid(live)["accepted"].y.tolist()) <= {iteration_number(k - 1), iteration_number(k)}


# ---- the per-iteration chart --------------------------------------------------------------------
def test_iteration_chart_counts_accepted_and_renoised_with_the_temperature(single, batch):
    for tl in _timelines(single, batch):
        marks = by_uid(iteration_chart(tl, highlight=1))
        assert marks["accepted"].x.tolist() == [iteration_number(i) for i in range(tl.iterations)]
        assert marks["accepted"].y.tolist() == [len(rec.committed[tl.row]) for rec in tl.records]
        assert marks["renoised"].y.tolist() == [len(rec.state["renoised"][tl.row]) for rec in tl.records]
        assert marks["temperature"].y.tolist() == pytest.approx([rec.state["temperature"] for rec in tl.records])
        for i, rec in enumerate(tl.records):  # a denoising step accepts or re-noises every canvas position; a frozen one nothing
            s, e = rec.block_range
            assert marks["accepted"].y[i] + marks["renoised"].y[i] == (e - s if _active(tl, i) else 0)
        assert marks["canvas-done"].x.tolist() == [iteration_number(i) for i, rec in enumerate(tl.records) if rec.state["output"] is not None]
        assert "commits" not in " ".join(str(t.name) for t in iteration_chart(tl).data)
    assert iteration_chart(Timeline(single), highlight=2).layout.shapes[0].x0 == iteration_number(2)


# ---- the details panel --------------------------------------------------------------------------
def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", fragment))


def _rows(panel: str) -> dict[str, str]:
    """The panel's label -> value rows (text)."""
    table = panel[: panel.index("</table>")]
    return {_text(label).strip(): _text(value).strip() for label, value in re.findall(r"<tr><td[^>]*>(.*?)</td><td[^>]*>(.*?)</td></tr>", table)}


def _history(panel: str) -> list[tuple[list[str], bool]]:
    """The step-by-step table's rows: cells as text, and whether the row is highlighted."""
    rest = panel[panel.index("Its canvas, step by step") :]
    return [([_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", body)], "font-weight:700" in style) for style, body in re.findall(r'<tr style="([^"]*)">(.*?)</tr>', rest)]


def _name(tl: Timeline, token: int) -> str:
    return "pad (id 0)" if token == tl.mask_id else f"{tl.text_of(token)!r} (id {token})"


def test_details_list_each_step_as_the_records_say(single, batch):
    for tl in _timelines(single, batch):
        for p in (tl.prompt_length, tl.prompt_length + CANVAS // 2 + 1, tl.prompt_length + CANVAS + 2):
            steps = [i for i, rec in enumerate(tl.records) if rec.block_range[0] <= p < rec.block_range[1]]
            for shown in (steps[0], steps[-1]):
                history = _history(position_details(tl, p, shown, tl.expected))
                assert [row[0][0] for row in history] == [str(iteration_number(i)) for i in steps]
                assert [row[1] for row in history] == [i == shown for i in steps]  # the step shown is highlighted
                for (cells, _), i in zip(history, steps):
                    rec = tl.records[i]
                    u, s = rec.state, rec.block_range[0]
                    read = u["start"][tl.row][p - s] if u["start"] is not None else tl.token_before(p, i)
                    assert cells[1] == f"{u['step'] + 1} · t {u['temperature']:.3g}" and cells[2] == _name(tl, read)
                    if not _active(tl, i):
                        assert cells[6] == "row stopped: frozen"
                        continue
                    assert cells[3] == _name(tl, u['proposal'][tl.row][p - s]) and cells[4] == f"{u['entropy'][tl.row][p - s]:.3f}"
                    assert cells[7] == _name(tl, u["draft"][tl.row][p - s])
                    if p in rec.committed[tl.row]:
                        assert cells[6] == "accepted" and " ≤ " in cells[5]
                        assert tl.canvas_at(i)[p] == u['proposal'][tl.row][p - s] or u["output"] is not None  # the proposal was written
                    else:
                        noise = dict(zip(u["renoised"][tl.row], u["noise"][tl.row]))[p]
                        assert cells[6] == f"re-noised → {_name(tl, noise)}" and " > " in cells[5]
                    assert cells[5].endswith(f"{u['bound']:g}")


def test_details_state_the_rule_the_temperature_and_the_stop_at_the_step_shown(single, batch):
    for tl in _timelines(single, batch):
        for i, rec in enumerate(tl.records):
            u, (s, e) = rec.state, rec.block_range
            p = s + i % (e - s)
            rows = _rows(position_details(tl, p, i, tl.expected))
            assert rows["temperature"].startswith(f"{u['temperature']:.4g}") and f"× {u['steps_left']}/" in rows["temperature"]
            stop = u["stopping"]
            assert f"< confidence threshold {stop['confidence_threshold']:g}: {'yes' if stop['confident'][tl.row] else 'no'}" in rows["stop rule"]
            assert f"mean entropy {stop['mean_entropy'][tl.row]:.3f}" in rows["stop rule"]
            assert ("this row has stopped" in rows["stop rule"]) == stop["stopped"][tl.row]
            if not _active(tl, i):
                assert "its canvas is frozen" in rows["this step"] and "decision" not in rows
                continue
            total = u["entropy_sum"][tl.row][p - s]
            if p in rec.committed[tl.row]:
                assert rows["decision"].startswith("accepted:") and f"sum to {total:.3f}" in rows["decision"] and f"≤ bound {u['bound']:g}" in rows["decision"]
                assert rows["token"].endswith("accepted at this step: the model's proposal") or u["output"] is not None
            else:
                noise = dict(zip(u["renoised"][tl.row], u["noise"][tl.row]))[p]
                assert rows["decision"].startswith("not accepted:") and f"> bound {u['bound']:g}" in rows["decision"]
                assert f"random token {_name(tl, noise)}" in rows["decision"]
            assert rows["proposal"].startswith(_name(tl, u['proposal'][tl.row][p - s])) and rows["draft"].startswith(_name(tl, u["draft"][tl.row][p - s]))


def test_details_before_the_first_step_and_outside_the_canvas(single):
    tl = Timeline(single)
    p = tl.prompt_length + CANVAS  # in the second canvas
    before = _rows(position_details(tl, p, -1, tl.expected))
    assert before["token"].startswith("pad (id 0): not generated yet") and "before the first step" in before["this iteration"]
    outside = _rows(position_details(tl, p, 0))
    assert "not in this step's canvas" in outside["this iteration"] and "decision" not in outside


def test_token_strings_in_the_uniform_views_stay_inert(single):
    data = single.to_dict()
    data["tokens"] = {k: HOSTILE for k in data["tokens"]}
    tl = Timeline(Trace.from_dict(data))
    for i in (-1, 0, tl.iterations - 1):
        for p in range(tl.prompt_length - 1, tl.canvas_length, 3):
            panel = position_details(tl, p, i, tl.expected)
            assert "<script" not in panel and "${" not in panel and "`" not in panel
            assert "&lt;script&gt;" in panel  # shown, as text
    for fig in (confidence_raster(tl, expected=tl.expected), iteration_chart(tl)):
        text = fig.to_json()
        assert "<script" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;${alert(2)}" in by_uid(confidence_raster(tl))["accepted"].text[0]  # Plotly shows it literally


# ---- the explanation ----------------------------------------------------------------------------
def test_explanation_names_the_uniform_rule_and_its_sources():
    text = explain("uniform", "dual", smoothing=True, unroll=True)
    assert text.startswith(UniformSampler.explanation) and "arXiv 2505.24857" in text and "DiffusionGemma" in text
    assert UNIFORM_SETTINGS in text and UNIFORM_READING in text
    assert cache_mode("dual").explanation not in text and "smoothing**" not in text  # masked-diffusion settings it does not read
    assert "positions still masked" in explain("threshold", "dual")  # a masked decoder's reading is as before
