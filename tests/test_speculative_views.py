"""The Run tab's grid, per-iteration chart, details panel, cost panel, exported frames and
explanation for a self-speculative run (engine/kinds/speculative.py; records: docs/trace.md §3.4),
from real runs of the random tiny LLaDA2 model: every cell, count and verdict drawn is the one the
records' `state` holds, and every string from the tokenizer stays text. The masked and
uniform-state views are checked unchanged by tests/test_app_views.py and test_uniform_views.py."""

from __future__ import annotations

import html
import re

import pytest

from dinfer_viz.panes.cost_figure import cost_figure
from dinfer_viz.panes.details import position_details
from dinfer_viz.panes.export import frame_title, legend_states, render_frames
from dinfer_viz.panes.explain import explain
from dinfer_viz.panes.figures import iteration_chart
from dinfer_viz.panes.grid import LiveGrid, caption, grid_value, legend_html
from dinfer_viz.reading.timeline import Timeline, iteration_number
from dinfer_viz.views import view_for, view_of_kind
from dinfer_viz.views.speculative import SPECULATION, SPECULATIVE_SETTINGS, SpeculativeView
from engine import GenerationConfig, RunHooks, Trace, run_diffusion

from .moe_models import EOS, VOCAB, tiny_llada2

HOSTILE = "<img src=x>${alert(1)}`"


def _trace(**options) -> Trace:
    config = GenerationConfig(kind="speculative", gen_length=16, block_length=8, threshold=0.5, **options)
    out = run_diffusion(tiny_llada2(seed=3).eval(), [[1, 2, 3, 4, 5]], config, stop_ids=[EOS], hooks=RunHooks(trace=True))
    return Trace.from_dict(out.trace.to_dict())  # as a loaded trace file reads


@pytest.fixture(scope="module")
def always() -> Trace:
    return _trace()


@pytest.fixture(scope="module")
def auto() -> Trace:
    return _trace(verify="auto", verify_threshold=0.0)  # every draft is confident enough: some steps skip


def _timelines(always: Trace, auto: Trace) -> list[Timeline]:
    return [Timeline(always), Timeline(auto)]


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", fragment))


def test_the_runs_exercise_corrections_full_acceptance_and_skipped_verifies(always, auto):
    assert always.kind == auto.kind == "speculative"
    for trace in (always, auto):
        tl = Timeline(trace)
        assert isinstance(view_for(tl), SpeculativeView) and view_for(tl).label == "self-speculative"
        states = [rec.state for rec in trace.iterations]
        assert any(s["corrected"][0] is not None for s in states) and any(s["accepted"][0] > 0 for s in states)
    assert all(rec.state["verified"][0] for rec in always.iterations)
    assert not all(rec.state["verified"][0] for rec in auto.iterations)


# ---- the grid ----------------------------------------------------------------------------------
def test_grid_marks_each_steps_accepted_corrected_and_rejected_positions(always, auto):
    drawn = set()
    for tl in _timelines(always, auto):
        for i, rec in enumerate(tl.records):
            st, (s, e) = rec.state, rec.block_range
            c, corrected = st["open_from"][0], st["corrected"][0]
            cells = {cell["p"]: cell for cell in grid_value(tl, i)["cells"]}
            kinds = {p: cells[p]["k"].split()[0] for p in range(s, e) if p in cells}
            committed = rec.committed[0]
            assert committed == list(range(c, c + len(committed)))
            assert [p for p in committed if kinds[p] == "new"] == [p for p in committed if p != corrected]
            assert [p for p in committed if kinds[p] == "corrected"] == ([corrected] if corrected is not None else [])
            assert len(committed) == st["accepted"][0] + (corrected is not None)
            rejected = [p for p in range(c, e) if corrected is not None and p > corrected and st["draft"][0][p - s] != st["verify"][0][p - s]]
            assert [p for p in range(s, e) if kinds.get(p) == "rejected"] == rejected
            for p in rejected:  # the rejected draft's token, on a position still open
                assert tl.canvas_at(i)[p] == tl.mask_id and html.unescape(cells[p]["t"]) == tl.text_of(st["draft"][0][p - s])
            for p in range(c, e):
                tip = html.unescape(cells[p]["tip"])
                assert f"draft {tl.text_of(st['draft'][0][p - s])!r}" in tip and f"p {st['draft_probability'][0][p - s]:.3f}" in tip
                if st["verified"][0]:
                    assert f"verifier {tl.text_of(st['verify'][0][p - s])!r}" in tip and f"p {st['verify_probability'][0][p - s]:.3f}" in tip
                else:
                    assert "verifier not run (verify skipped)" in tip
            assert "rejected" in grid_value(tl, i)["legend"] and "corrected" in legend_html(tl)
            drawn |= set(kinds.values())
    assert {"new", "corrected", "rejected", "old"} <= drawn


def test_caption_says_what_the_step_drafted_accepted_and_corrected(always, auto):
    for tl in _timelines(always, auto):
        for i, rec in enumerate(tl.records):
            st, (s, e) = rec.state, rec.block_range
            text = caption(tl, i)
            assert text.startswith(f"iteration {iteration_number(i)}/{tl.iterations}") and f"drafted {e - st['open_from'][0]}" in text
            if not st["verified"][0]:
                assert "skipped the verify" in text and "τ_v 0" in text
            elif st["corrected"][0] is not None:
                p = st["corrected"][0]
                assert f"accepted {st['accepted'][0]}, corrected at {p} (verifier {tl.text_of(rec.top1[0][p - s])!r})" in text
                assert rec.top1[0][p - s] == st["verify"][0][p - s]  # the correction is the verifier's token
            else:
                assert f"accepted {st['accepted'][0]}" in text
            assert frame_title(tl, i) == text


def test_live_frames_bring_the_same_cells(always):
    tl = Timeline(always)
    for shown in (1, tl.iterations):
        live = LiveGrid(tl, "run").value(shown, 1, shown - 1, "")["live"]
        statics = {cell["p"]: cell for cell in grid_value(tl, shown - 1)["cells"]}
        for p, text, kind, tip in live["canvas"]:
            if p in statics and "∎" not in statics[p]["t"]:
                assert kind == statics[p]["k"] and text == html.unescape(statics[p]["t"]) and tip == html.unescape(statics[p]["tip"])
        assert live["commits"] == [] and live["block"] == tl.records[shown - 1].block_range


# ---- the chart and the cost panel ---------------------------------------------------------------
def test_chart_counts_the_acceptance_length_and_the_forwards(always, auto):
    for tl in _timelines(always, auto):
        traces = {t.uid: t for t in iteration_chart(tl, highlight=1).data}
        records = tl.records
        assert traces["accepted"].x.tolist() == [iteration_number(i) for i in range(tl.iterations)]
        assert traces["accepted"].y.tolist() == [r.state["accepted"][0] for r in records]
        assert traces["corrected"].y.tolist() == [int(r.state["corrected"][0] is not None) for r in records]
        assert traces["forwards"].y.tolist() == [2 if r.state["verified"][0] else 1 for r in records]
        assert {r.forward for r in records} == ({"draft+verify"} if tl.trace is always else {"draft+verify", "draft"})
        names = " ".join(str(t.name) for t in iteration_chart(tl).data)
        assert "draft + verify forwards (ms)" in names


def test_cost_panel_splits_each_steps_cost_and_names_both_forwards(always, auto):
    for tl in _timelines(always, auto):
        assert all(r.cost for r in tl.records)
        title = cost_figure(tl).layout.title.text
        verified = sum(r.state["verified"][0] for r in tl.records)
        skipped = tl.iterations - verified
        assert "compute" in title and f"NFE {2 * verified + skipped}: {verified} draft + verify steps" in title
        assert ("draft-only" in title) == bool(skipped) and tl.trace.stats["nfe"] == 2 * verified + skipped


# ---- the details panel --------------------------------------------------------------------------
def _rows(panel: str) -> dict[str, str]:
    table = panel[: panel.index("</table>")]
    return {_text(label).strip(): _text(value).strip() for label, value in re.findall(r"<tr><td[^>]*>(.*?)</td><td[^>]*>(.*?)</td></tr>", table)}


def test_details_say_why_each_draft_was_kept_or_replaced(always, auto):
    for tl in _timelines(always, auto):
        for i, rec in enumerate(tl.records):
            st, s = rec.state, rec.block_range[0]
            for p in rec.committed[0]:
                why = _rows(position_details(tl, p, i))["why"]
                draft = f"draft {tl.text_of(st['draft'][0][p - s])!r} (id {st['draft'][0][p - s]}) p {st['draft_probability'][0][p - s]:.3f}"
                assert draft in why
                if p == st["corrected"][0]:  # both tokens named
                    verifier = st["verify"][0][p - s]
                    assert why.startswith("replaced: verifier's argmax differs") and f"verifier {tl.text_of(verifier)!r} (id {verifier})" in why
                    assert verifier != st["draft"][0][p - s]
                elif st["verified"][0]:
                    assert why.startswith("kept: verifier agrees")
                else:
                    assert why.startswith("kept without a verify")
            corrected = st["corrected"][0]
            if corrected is not None and corrected + 1 < rec.block_range[1]:
                now = _rows(position_details(tl, corrected + 1, i))["this iteration"]
                assert now.startswith("not verified: after the first disagreement")


def test_details_before_the_first_step_and_outside_its_block(always):
    tl = Timeline(always)
    p = tl.canvas_length - 1
    assert _rows(position_details(tl, p, -1))["this iteration"] == "before the first forward: nothing drafted, nothing verified"
    assert "not in this iteration's block" in _rows(position_details(tl, p, 0))["this iteration"]


# ---- strings from the tokenizer, the explanation and the settings --------------------------------
def test_token_strings_in_the_speculative_views_stay_inert(always):
    data = always.to_dict()
    data["tokens"] = {str(t): HOSTILE for t in range(VOCAB)}
    tl = Timeline(Trace.from_dict(data))
    for i in (-1, 0, tl.iterations - 1):
        value = grid_value(tl, i)
        shown = value["caption"] + "".join(cell["t"] + cell["tip"] for cell in value["cells"])
        assert "<img" not in shown and "${" not in shown and "`" not in shown and "&lt;img src=x&gt;" in shown
        for p in range(tl.prompt_length - 1, tl.canvas_length, 2):
            panel = position_details(tl, p, i)
            assert "<img" not in panel and "${" not in panel and "`" not in panel
    assert "&lt;img src=x&gt;" in position_details(tl, tl.prompt_length, 0)
    assert "<img" not in iteration_chart(tl).to_json() and "<img" not in cost_figure(tl).to_json()
    assert len(render_frames(tl, max_frames=3)) == 3  # the frames draw the new states
    assert set(legend_states(tl)) >= {"new", "corrected", "rejected"}


def test_explanation_and_settings_words():
    view = view_of_kind("speculative")
    text = view.explanation("**threshold.** the decoder's paragraph", "dual", True, True, ["an option"])
    assert text.startswith(SPECULATION) and "the decoder's paragraph" in text and "an option" in text
    assert "lossless" in text and "block-length-1 greedy decode" in text and "τ_v" in text and "verify auto" in text
    page = explain("threshold", "dual", smoothing=True, kind="speculative")
    assert page.startswith(SPECULATION) and SPECULATIVE_SETTINGS in page and "smoothing**" not in page
    assert view.settings_words(GenerationConfig(kind="speculative", block_length=8)) == ["verify always", "block 8"]
    assert view.settings_words(GenerationConfig(kind="speculative", block_length=4, verify="auto", verify_threshold=0.8)) == ["verify auto τ_v=0.8", "block 4"]


def test_the_router_lane_and_the_details_show_each_decision_with_its_estimate():
    """verify=router (docs/algorithms.md §10.4): the per-iteration chart has a lane with one marker
    per step, under its decision's name, its estimate on hover; the caption and the details panel
    say the estimate of the step shown."""
    from dinfer_viz.views.speculative.speculative_figures import ROUTER_MARKS, router_mark

    trace = _trace(kind_options={"verify": "router", "router_confidence": 0.3})  # it verifies some steps, skips others, one exactly
    tl = Timeline(trace)
    decisions = [rec.state["router"][0] for rec in trace.iterations]
    assert {router_mark(d) for d in decisions} == {"verify", "skip", "one open position"}
    lane = [t for t in iteration_chart(tl).data if str(t.uid).startswith("router-")]
    assert sum(len(t.x) for t in lane) == len(decisions)
    for trace_ in lane:
        assert trace_.yaxis == "y4" and trace_.name in {name for name, _, _ in ROUTER_MARKS.values()}
        for x, text in zip(trace_.x, trace_.text):
            d = decisions[int(x) - iteration_number(0)]
            assert ROUTER_MARKS[router_mark(d)][0] == trace_.name and f"E[K] {d['expected']:.2f}" in text and f"score {d['score']:.2f}" in text
    for i, d in enumerate(decisions):
        assert f"E[K] {d['expected']:.2f} · confident run {d['confident']}" in caption(tl, i)
        p = trace.iterations[i].committed[0][0]
        assert f"E[K] {d['expected']:.2f}" in _rows(position_details(tl, p, i))["router this iteration"]
    assert not [t for t in iteration_chart(Timeline(_trace())).data if str(t.uid).startswith("router-")]  # verify always: no lane
