"""AUP (tinymodel/aup.py, d3LLM's definition) on hand-computed curves: the order by TPF, the filter
(within 5 points of the lowest-TPF accuracy), the weight W and its cap, y_max shared by the curves."""

from __future__ import annotations

import math

import pytest

from tinymodel.aup import aup, aup_by_curve, kept_points, weight


def test_weight_is_one_at_the_best_and_capped_above_it():
    assert weight(90.0, 90.0) == 1.0
    assert weight(95.0, 90.0) == 1.0  # min(., 1): a point above y_max counts unweighted
    assert weight(60.0, 90.0) == pytest.approx(math.exp(-1.0))  # exp(-3 * (1 - 60/90))
    assert weight(0.0, 0.0) == 1.0


def test_the_filter_keeps_points_within_five_points_of_the_lowest_tpf_accuracy():
    points = [(3.0, 74.99), (1.0, 80.0), (2.0, 75.0), (1.5, 90.0)]
    assert kept_points(points) == [(1.0, 80.0), (1.5, 90.0), (2.0, 75.0)]  # 75 = 80 - 5 stays, 74.99 goes
    assert kept_points([]) == []


def test_aup_on_a_hand_computed_curve():
    # sorted: (1, 80), (1.5, 82), (2, 78), (3, 70); 70 < 80 - 5 is dropped; y_max 90 from another curve
    points = [(2.0, 78.0), (1.0, 80.0), (3.0, 70.0), (1.5, 82.0)]
    w80, w82, w78 = math.exp(-3 * 10 / 90), math.exp(-3 * 8 / 90), math.exp(-3 * 12 / 90)
    expected = 1.0 * 80 + 0.5 * 0.5 * (82 * w82 + 80 * w80) + 0.5 * 0.5 * (78 * w78 + 82 * w82)
    assert aup(points, y_max=90.0) == pytest.approx(expected)
    assert aup(points, y_max=90.0) == pytest.approx(138.805, abs=1e-3)
    # its own best (82) as y_max: W(82) = 1
    own = 80 + 0.25 * (82 + 80 * math.exp(-3 * 2 / 82)) + 0.25 * (78 * math.exp(-3 * 4 / 82) + 82)
    assert aup(points) == pytest.approx(own)


def test_one_point_and_no_point():
    assert aup([(2.5, 40.0)], y_max=90.0) == pytest.approx(100.0)  # rho_1 * y_1, unweighted
    assert aup([]) == 0.0


def test_curves_share_y_max_so_a_weaker_curve_is_weighed_against_the_best():
    base = [(1.0, 90.0), (2.0, 88.0)]
    fast = [(1.0, 60.0), (4.0, 58.0)]
    scores = aup_by_curve({"base": base, "fast": fast})
    assert scores["base"] == pytest.approx(90 + 0.5 * (88 * math.exp(-3 * 2 / 90) + 90))
    assert scores["fast"] == pytest.approx(60 + 0.5 * 3 * (58 * math.exp(-3 * 32 / 90) + 60 * math.exp(-1.0)))
    assert scores["fast"] < aup(fast)  # alone, its own best would weigh it as 1


def test_the_app_sweep_table_and_csv_carry_edits_remasks_and_each_models_aup():
    from dinfer_viz.studies.sweep_study import Outcome, SweepState
    from tinymodel.tasks import Example

    ex = Example("pairsum", "Q: ?+?=5 A:", " 2 + 3")

    def outcome(value, correct, tokens, nfe, model, edits=0, remasks=0):
        return Outcome(value, ex, "", correct, tokens, nfe, 1.0, model=model, edits=edits, remasks=remasks)

    state = SweepState("threshold", [
        outcome(0.9, True, 10, 10, "base"), outcome(0.9, True, 10, 10, "base"),  # 100%, TPF 1
        outcome(0.5, True, 10, 5, "base"), outcome(0.5, False, 10, 5, "base"),  # 50%, TPF 2: dropped by the filter
        outcome(0.9, True, 10, 5, "edit", edits=3), outcome(0.9, False, 10, 5, "edit", edits=1, remasks=2),  # 50%, TPF 2
    ])
    points = state.points()
    base = [p for p in points if p["model"] == "base"]
    edit = [p for p in points if p["model"] == "edit"]
    assert [p["aup"] for p in base] == [pytest.approx(100.0)] * 2  # rho_1 * y_1 only: 50% is 50 points below 100%
    assert edit[0]["aup"] == pytest.approx(2.0 * 50.0)  # one point: rho_1 * y_1, unweighted
    assert (edit[0]["edits"], edit[0]["remasks"]) == (4, 2) and base[0]["edits"] == 0
    header, *rows = state.csv().splitlines()
    assert header.split(",")[9:13] == ["model", "edits", "remasks", "aup"]  # by place: later columns come after
    assert rows[-1].split(",")[9:13] == ["edit", "4", "2", "100.00"]


def test_the_sweep_benchmark_gives_each_decoder_its_aup():
    from benchmarks.sweep import SweepRow, format_rows, mark_aup

    rows = mark_aup([
        SweepRow("threshold", "threshold", 0.9, 0.9, 1.0, 1.0, 10, 10, 1.0),
        SweepRow("threshold", "threshold", 0.5, 0.88, 2.0, 1.0, 20, 10, 1.0),
        SweepRow("edit", "threshold", 0.5, 0.6, 3.0, 1.0, 30, 10, 1.0),
    ])
    assert rows[0].aup == rows[1].aup == pytest.approx(90 + 0.5 * (88 * math.exp(-3 * 2 / 90) + 90))
    assert rows[2].aup == pytest.approx(3.0 * 60.0)
    assert "AUP" in format_rows(rows).splitlines()[0] and f"{rows[2].aup:.1f}" in format_rows(rows)
