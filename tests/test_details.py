"""The details panel (dinfer_viz/panes/details.py) and the cache's state per position and forward costs
(dinfer_viz/drawing/cache_figure.py): from hand-made traces, and from real runs of the embedded model in
every cache mode and with every decoder, checked against the records the engine wrote."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dinfer_viz.drawing.cache_figure import (
    EXACT,
    FRESH,
    NOT_COMPUTED,
    STALE,
    cache_rule_markdown,
    cache_state_figure,
    cache_states,
    forward_cost_figure,
    measure_forward_costs,
)
from dinfer_viz.panes.details import position_details
from dinfer_viz.views.masked.masked_details import rule_text
from dinfer_viz.reading.timeline import Timeline
from engine import Engine, EngineError, GenerationConfig, RunHooks

from .app_support import app_model, handmade_trace

HOSTILE = "<img src=x onerror=alert(1)>"
PROMPT = "Q: ?+?=38 A:"  # the app's default: a forced commit in the first block


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    return Engine(app_model(tmp_path_factory))


def _run(engine: Engine, **settings) -> Timeline:
    config = GenerationConfig(gen_length=16, block_length=8, measure_staleness=True, **settings)
    return Timeline(engine.generate(PROMPT, config, hooks=RunHooks(trace=True)).output.trace)


def _masked_before(timeline: Timeline, p: int, i: int) -> bool:
    commit = timeline.commits.get(p)
    return timeline.initial[p] == timeline.mask_id and (commit is None or commit.iteration >= i)


def _decisions(timeline: Timeline):
    """(record index, record, position, the panel's rule text) for every position of the record's
    block still masked before it: each decision the decoder made."""
    for i, rec in enumerate(timeline.records):
        s, e = rec.block_range
        for p in range(s, e):
            if _masked_before(timeline, p, i):
                yield i, rec, p, rule_text(timeline, i, p)


# ---- the panel on a hand-made trace -------------------------------------------------------------
def test_panel_names_the_rule_and_its_numbers() -> None:
    timeline = Timeline(handmade_trace())
    # record 0: position 3 at 0.95 (committed), position 6 at 0.3 (not); record 1: position 4 forced at 0.6
    assert "committed: confidence 0.950 ≥ τ 0.90" in position_details(timeline, 3, 0)
    assert "not committed: confidence 0.300 &lt; τ 0.90" in position_details(timeline, 6, 0)
    forced = position_details(timeline, 4, 1)
    assert "forced: confidence 0.600 &lt; τ 0.90" in forced and "at least one token per row" in forced
    # the token, its commit and the cache state are named; iteration numbers are the page's (1..N)
    assert "Position 4 · iteration 2 of 4" in forced and "at iteration 2 (this iteration)" in forced
    assert "recomputed by this forward" in forced  # 4 lies in record 1's window [2, 9)
    assert "top candidates" in forced and "not recorded" in forced  # none in this trace: said, not invented
    assert "credit of the candidate" in forced


def test_panel_expected_token_and_before_the_first_forward() -> None:
    timeline = Timeline(handmade_trace())
    panel = position_details(timeline, 4, 1, expected=[20, 20])  # wants 'x' at position 4, got ' y'
    assert "&#x27;x&#x27; (id 20): differs from the token here" in panel
    before = position_details(timeline, 4, -1, expected=[20, 20])
    assert "before the first forward" in before and "not committed yet" in before and "nothing in the cache" in before


def test_panel_escapes_hostile_token_strings() -> None:
    trace = handmade_trace()
    trace.tokens["21"] = HOSTILE  # position 4's token and candidate
    for rec in trace.iterations:  # and every position's runner-up
        rec.candidates = [[[[20, 0.5], [21, 0.25]] for _ in range(rec.block_range[1] - rec.block_range[0])]]
    timeline = Timeline(trace)
    for iteration in (-1, 0, 1, 3):
        panel = position_details(timeline, 4, iteration)
        assert "<img" not in panel and "&lt;img src=x onerror=alert(1)&gt;" in panel
    assert "onerror=alert(1)&gt;&#x27; (id 21) 0.250" in position_details(timeline, 6, 0)
    assert "<img" not in cache_state_figure(timeline).to_json()


@pytest.mark.parametrize("position, iteration", [(-1, 0), (11, 0), (99, 2), (3, 4), (3, -2), (3, 99)])
def test_panel_out_of_range_is_one_line(position: int, iteration: int) -> None:
    panel = position_details(Timeline(handmade_trace()), position, iteration)
    assert "outside" in panel and "<tr" not in panel and "\n" not in panel


# ---- the cache's state on hand-made traces ---------------------------------------------------------
def test_states_of_the_handmade_vicinity_trace() -> None:
    states = cache_states(Timeline(handmade_trace()))
    # refresh, window [2, 9) after commits, refresh, window [6, 11) after a commit
    assert (states.codes[0] == FRESH).all() and (states.codes[2] == FRESH).all()
    assert (states.codes[1, 2:9] == FRESH).all() and (states.codes[1, [0, 1, 9, 10]] == STALE).all()
    assert (states.codes[3, 6:] == FRESH).all() and (states.codes[3, :6] == STALE).all()
    assert states.refreshed == [0, 0, 2, 2] and states.commits == [0, 2, 0, 1]
    assert np.isnan(states.kl).all()  # no staleness measured in this trace


def test_exact_until_the_canvas_changes_and_smoothing_changes_it() -> None:
    trace = handmade_trace()
    trace.iterations[0].committed, trace.iterations[0].forced = [[]], [[]]  # a refresh that commits nothing
    assert (cache_states(Timeline(trace)).codes[1, [0, 1, 9, 10]] == EXACT).all()
    # with smoothing the soft inputs of masked positions change after every forward
    trace.config = {**trace.config, "smoothing": True}
    assert (cache_states(Timeline(trace)).codes[1, [0, 1, 9, 10]] == STALE).all()


def test_block_diffusion_prefix_cache_is_exact_and_later_blocks_not_computed() -> None:
    trace = handmade_trace()  # as BlockCausalCache records it: prefix forwards over the block, no refresh
    trace.iterations = [dataclasses.replace(r, forward="prefix", recomputed=[list(r.block_range)]) for r in trace.iterations]
    codes = cache_states(Timeline(trace)).codes
    assert (codes[0, :3] == EXACT).all() and (codes[0, 3:7] == FRESH).all() and (codes[0, 7:] == NOT_COMPUTED).all()
    assert (codes[3, :7] == EXACT).all() and (codes[3, 7:] == FRESH).all()
    panel = position_details(Timeline(trace), 0, 2)
    assert "exact by construction" in panel


def test_cache_figure_legend_numbering_and_highlight() -> None:
    timeline = Timeline(handmade_trace())
    fig = cache_state_figure(timeline, highlight=1)
    names = {t.name for t in fig.data if t.name}
    assert {"recomputed this forward (fresh)", "block start (black line)", "iteration shown (red outline)"} <= names
    assert any(n.startswith("cached, stale") for n in names)
    assert list(fig.layout.yaxis.ticktext) == ["1 refresh", "2 window", "3 refresh", "4 window"]
    assert np.asarray(fig.data[0].z).shape == (4, timeline.view_end())
    assert cache_state_figure(timeline, upto=1).layout.yaxis.ticktext == ("1 refresh", "2 window")


def test_cache_rule_markdown() -> None:
    for mode in ("prefix", "dual", "vicinity"):
        text = cache_rule_markdown(mode)
        assert "refresh" in text and "commits nothing" in text and "NFE" in text
    assert "NFE" in cache_rule_markdown("none")
    assert "No forward count rule" in cache_rule_markdown("lookahead")


# ---- real runs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "vicinity"])
def test_states_follow_the_records_in_each_mode(engine: Engine, cache: str) -> None:
    timeline = _run(engine, cache=cache, warmup=1, prefix_look=2, after_look=2)
    states = cache_states(timeline)
    n = timeline.canvas_length
    last_refresh, commits = -1, 0
    for i, rec in enumerate(timeline.records):
        recomputed = np.zeros(n, dtype=bool)
        for a, b in rec.recomputed:
            recomputed[a:b] = True
        codes = states.codes[i]
        assert (codes[recomputed] == FRESH).all()
        if rec.forward == "refresh":
            last_refresh, commits = i, 0
        if rec.forward in ("full", "refresh"):
            assert recomputed.all()  # every K/V fresh, nothing read from a store
        else:
            # cached positions: exact until this row commits after the refresh, then stale until the next
            assert last_refresh >= 0 and (codes[~recomputed] == (STALE if commits else EXACT)).all()
            if cache == "dual":
                assert (codes[rec.block_range[0] : rec.block_range[1]] == FRESH).all() and not recomputed[rec.block_range[1] :].any()
            # the measured staleness agrees: an exact store gives the exact logits
            if not commits:
                assert max(timeline.extras_at(i)["staleness_kl"]) <= 1e-4
        commits += len(rec.committed[timeline.row])
    if cache == "none":
        assert (states.codes == FRESH).all()
    else:
        assert (states.codes == STALE).any()  # a refresh's decode commits, so the next forward reads stale K/V


@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "vicinity"])
def test_panel_matches_every_decision_of_a_real_run(engine: Engine, cache: str) -> None:
    timeline = _run(engine, cache=cache, warmup=1)
    seen = set()
    for i, rec, p, text in _decisions(timeline):
        c, tau = rec.confidence[timeline.row][p - rec.block_range[0]], rec.threshold
        if p in rec.forced[timeline.row]:
            assert text.startswith(f"forced: confidence {c:.3f} < τ {tau:.2f}"), text
        elif p in rec.committed[timeline.row]:
            assert text.startswith("committed: confidence") and f"≥ τ {tau:.2f}" in text, text
        else:
            assert text.startswith("not committed: confidence") and f"< τ {tau:.2f}" in text, text
        seen.add(text.split(":")[0])
        panel = position_details(timeline, p, i)
        assert "K/V cache" in panel
        # greedy decoding: the first candidate is the decoder's top-1, at its confidence, and the panel lists it
        pairs = rec.candidates[timeline.row][p - rec.block_range[0]]
        assert pairs[0] == [rec.top1[timeline.row][p - rec.block_range[0]], c] and pairs[1][1] <= c
        assert f"(id {pairs[1][0]}) {pairs[1][1]:.3f}" in panel
    assert seen == {"committed", "not committed", "forced"}  # the default prompt forces a commit


@pytest.mark.parametrize(
    "settings",
    [
        dict(decoder="fixed", steps=8),
        dict(decoder="fixed", steps=8, remasking="random"),
        dict(decoder="factor"),
        dict(decoder="hierarchical"),
        dict(decoder="hierarchical", anchor="centre"),
        dict(decoder="credit"),
        dict(decoder="threshold", smoothing=True),
    ],
)
def test_rules_of_every_decoder_agree_with_the_engine(engine: Engine, settings: dict) -> None:
    timeline = _run(engine, **settings)
    for i, rec, p, text in _decisions(timeline):
        assert text.startswith("not committed") != (p in rec.committed[timeline.row]), text
        if settings["decoder"] == "fixed":  # the schedule's commits are "forced" by it (the trace's forced stays empty)
            committed = p in rec.committed[timeline.row]
            word = "at random" if settings.get("remasking") == "random" else "forced by the schedule" if committed else "the top"
            assert word in text, text
        else:
            assert text.startswith("forced") == (p in rec.forced[timeline.row]), text
        if settings["decoder"] == "credit":
            assert "raw probability" in text and "α = 0.7" in text


# ---- forward costs ------------------------------------------------------------------------------------
def test_measure_forward_costs_one_row_per_kind_and_length(engine: Engine) -> None:
    rows = measure_forward_costs(engine, [16, 48], repeats=1, block_length=8)
    assert sorted((r["kind"], r["length"]) for r in rows) == sorted((k, n) for k in ("full", "refresh", "prefix", "dual", "window") for n in (16, 48))
    assert all(r["ms"] > 0 and 0 < r["query"] <= r["length"] for r in rows)
    by = {(r["kind"], r["length"]): r["query"] for r in rows}
    assert by["full", 48] == 48 and by["dual", 48] == 8 and by["prefix", 48] == 48 - 24  # the block in the middle
    fig = forward_cost_figure(rows)
    assert {t.name for t in fig.data} == {"full", "refresh", "prefix", "dual", "window"}
    assert "cheaper than a full forward" in fig.layout.title.text
    with pytest.raises(EngineError):
        measure_forward_costs(engine, [100_000], repeats=1)


def test_forward_cost_figure_without_rows() -> None:
    assert "no forward costs" in forward_cost_figure([]).layout.annotations[0].text
