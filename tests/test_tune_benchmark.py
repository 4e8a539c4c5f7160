"""benchmarks/tune_vs_sweep.py (issue #45 item 5): Optuna's hypervolume of the held-out points,
the best tuned points, and one small run of both sides at the same number of runs."""

from __future__ import annotations

import pytest

from benchmarks.tune_vs_sweep import best_points, hypervolume, main


def point(accuracy: float, tpf: float) -> dict:
    return {"held_out_accuracy": accuracy, "held_out_tpf": tpf}


def test_the_hypervolume_is_the_area_the_held_out_points_dominate_from_zero():
    # (1.0, 2) and (0.5, 4): 1.0 x 2 + 0.5 x (4 - 2); a dominated point adds nothing
    assert hypervolume([point(1.0, 2.0), point(0.5, 4.0)]) == pytest.approx(3.0)
    assert hypervolume([point(1.0, 2.0), point(0.5, 4.0), point(0.5, 1.0)]) == pytest.approx(3.0)
    assert hypervolume([]) == 0.0


def test_the_best_points_are_judged_on_the_held_out_split():
    front = [point(0.9, 1.5), point(0.75, 3.0), point(0.5, 6.0)]
    best = best_points(front, point(0.75, 1.6))
    assert best["most_accurate"] is front[0] and best["fastest_as_accurate_as_default"] is front[1]
    assert best_points(front, point(0.95, 1.0))["fastest_as_accurate_as_default"] is None


def test_both_sides_run_as_many_configs_and_report_held_out_fronts(capsys):
    import json

    assert main(["--trials", "2", "--prompts", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    for side in ("tuned", "sweep"):
        assert result[side]["front"] and result[side]["hypervolume"] == pytest.approx(hypervolume(result[side]["front"]))
    assert all(set(p["config"]) == {"threshold"} for p in result["sweep"]["front"])  # thresholds 0.05 and 1: the sweep's only change
    assert result["default"]["config"] == {} and result["most_accurate"]["held_out_tpf"] > 0
