"""The runs' analyses over a sweep (issue #36 item 3): each answer keeps its run's order
correlation, KL area and convergence (not its trace), each value aggregates them (median and
quartiles of ρ, the mean KL area, the share converged), and the Sweep tab draws them against the
swept value and writes them to its CSV; a stopped value is marked partial; `python -m
benchmarks.sweep --analyses` puts them in its table and JSON."""

from __future__ import annotations

import csv
import io
import json
import os
import random

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import numpy as np
import pytest

from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.studies.sweep_study import ANALYSIS_COLUMNS, Outcome, SweepState
from dinfer_viz.studies.sweep_chart import sweep_analysis_figure
from dinfer_viz.tabs.sweep import SWEEP_VIEW
from dinfer_viz.ui import Handlers
from engine.analysis import RunFigures, aggregate_runs, kl_area, quartiles
from tinymodel.tasks import Example

from .app_support import app_model

PROMPTS = "\n".join(f"Q: ?+?={n} A:" for n in (38, 57, 91))
# blocks of one position, no early stop: every run finalises strictly left to right (ρ = 1)
BLOCKS_OF_ONE = {"gen_length": 8, "block_length": 1, "early_stop": False}


@pytest.fixture(scope="module")
def handlers(tmp_path_factory) -> Handlers:
    return Handlers(EngineHost(ModelSpec(app_model(tmp_path_factory))))


def figures(order: float | None, within: float | None = None, kl: float | None = None, converged: bool | None = None) -> RunFigures:
    return RunFigures(order, within, kl, converged)


def outcome(value: float, analysis: RunFigures | None) -> Outcome:
    return Outcome(value, Example("pairsum", "Q: ?+?=5 A:", " 2 + 3"), " 2 + 3", True, 10, 5, 1.0, analysis=analysis)


def test_a_planted_set_aggregates_to_its_known_figures():
    runs = [figures(1.0, 1.0, 0.2, True), figures(0.5, None, 0.4, False), figures(0.0, 0.5, None, True), figures(-0.5, None, None, None), figures(None, None, None, True)]
    a = aggregate_runs(runs)
    # ρ over the four runs that have one, sorted -0.5, 0, 0.5, 1: median 0.25, quartiles at ranks 0.75 and 2.25
    assert a["order_correlation"] == {"median": 0.25, "q1": -0.125, "q3": 0.625, "runs": 4}
    assert a["order_correlation_within_blocks"] == {"median": 0.75, "q1": 0.625, "q3": 0.875, "runs": 2}
    assert a["kl_area"] == pytest.approx(0.3)  # the mean of the runs that have one
    assert (a["converged_share"], a["converged_runs"], a["runs"]) == (0.75, 4, 5)  # 3 of the 4 that know
    empty = aggregate_runs([])
    assert empty["order_correlation"]["median"] is None and empty["kl_area"] is None and empty["converged_share"] is None
    assert quartiles([0.3]) == {"median": 0.3, "q1": 0.3, "q3": 0.3, "runs": 1}


def test_quartiles_agree_with_numpy_and_the_kl_area_is_the_mean_of_the_known_steps():
    rng = random.Random(0)
    for n in (2, 3, 7, 20):
        xs = [rng.uniform(-1, 1) for _ in range(n)]
        q = quartiles(xs)
        assert [q["q1"], q["median"], q["q3"]] == pytest.approx(list(np.percentile(xs, [25, 50, 75])), abs=1e-6)
    assert kl_area([0.5, None, 1.5]) == 1.0
    assert kl_area([None, None]) is None and kl_area([]) is None


def test_a_sweep_in_blocks_of_one_is_left_to_right_at_every_value(handlers):
    frames = list(handlers.sweep({"config": BLOCKS_OF_ONE}, [], 1, "threshold", "0.5, 0.9", PROMPTS, "", 1))
    view = dict(zip(SWEEP_VIEW, frames[-1]))
    assert view["message"].startswith("done"), view["message"]
    state = view["state"]
    assert len(state.outcomes) == 6
    for o in state.outcomes:
        assert o.analysis is not None and o.analysis.order_correlation == 1.0 and o.analysis.order_correlation_within_blocks == 1.0
        assert (o.trace is None) == o.correct  # a right answer keeps its figures, not its trace
    for p in state.points():
        a = p["analysis"]
        assert a["runs"] == 3 and a["order_correlation"] == {"median": 1.0, "q1": 1.0, "q3": 1.0, "runs": 3}
        assert a["order_correlation_within_blocks"]["median"] == 1.0
        assert a["converged_share"] == 1.0  # no [MASK] left, no revision
        assert a["kl_area"] is not None and a["kl_area"] >= 0
    chart = view["analysis_chart"]
    rho = [t for t in chart.data if t.yaxis == "y"]
    assert [t.name.split(" · ")[-1] for t in rho] == ["ρ overall", "ρ within blocks"]
    for t in rho:
        assert list(t.x) == pytest.approx([0.5, 0.9]) and list(t.y) == [1.0, 1.0]
        assert list(t.error_y.array) == [0.0, 0.0] and list(t.error_y.arrayminus) == [0.0, 0.0]
    assert {t.yaxis for t in chart.data} == {"y", "y2", "y3"}  # ρ, KL area, converged
    rows = list(csv.DictReader(io.StringIO(state.csv())))
    assert [r["order_median"] for r in rows] == ["1.0000", "1.0000"] and [r["converged_share"] for r in rows] == ["1.0000", "1.0000"]


def test_a_stopped_value_is_partial_in_the_analysis_chart_and_blank_where_no_run_has_a_figure():
    outcomes = [outcome(0.5, figures(0.2, None, 1.0, True)), outcome(0.5, figures(0.6, None, 3.0, False)), outcome(0.9, figures(1.0, 1.0, 0.5, True))]
    state = SweepState("threshold", outcomes, per_value=2)
    by_value = {p["value"]: p for p in state.points()}
    assert not by_value[0.5]["partial"] and by_value[0.9]["partial"]
    chart = sweep_analysis_figure(state.points(), "threshold")
    overall = chart.data[0]
    assert list(overall.y) == pytest.approx([0.4, 1.0])  # the median of 0.2 and 0.6; 0.9's one run
    assert list(overall.marker.symbol) == ["circle", "circle-open"]
    assert "partial: the sweep did not finish this value" in overall.hovertext[1] and "partial" not in overall.hovertext[0]
    within = chart.data[1]
    assert np.isnan(within.y[0]) and within.y[1] == 1.0 and "ρ within blocks n/a" in within.hovertext[0]
    kl = next(t for t in chart.data if t.yaxis == "y2")
    assert list(kl.y) == pytest.approx([2.0, 0.5])
    assert "converged 50% of 2 runs" in overall.hovertext[0]
    header, first, _ = list(csv.reader(io.StringIO(state.csv())))
    assert header[-len(ANALYSIS_COLUMNS):] == ANALYSIS_COLUMNS
    cells = dict(zip(header, first))
    assert (cells["order_median"], cells["order_within_median"], cells["kl_area"], cells["converged_share"]) == ("0.4000", "", "2.0000", "0.5000")
    # outcomes without figures (none kept) draw nothing and say so in the hover, not an error
    bare = sweep_analysis_figure(SweepState("threshold", [outcome(0.5, None)]).points())
    assert np.isnan(bare.data[0].y[0]) and "ρ overall n/a" in bare.data[0].hovertext[0]
    assert sweep_analysis_figure([]).layout.annotations[0].text == "no sweep yet"


def test_the_benchmark_sweep_aggregates_the_analyses_of_a_traced_pass(tmp_path_factory, tmp_path, capsys):
    from benchmarks import sweep as bench

    argv = ["--model", app_model(tmp_path_factory), "--prompts", "heldout:add", "--limit", "2", "--decoders", "threshold", "--thresholds", "0.5,0.9",
            "--gen-length", "8", "--block-length", "1", "--set", "early_stop=false", "--set", "align_blocks=false", "--out", str(tmp_path)]
    assert bench.main([*argv, "--analyses"]) == 0
    table = capsys.readouterr().out
    assert "| ρ median (quartiles) | ρ within blocks | KL area | converged |" in table and table.count("| 1.00 (1.00–1.00) | 1.00 (1.00–1.00) |") == 2
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    assert [r["analysis"]["order_correlation"] for r in rows] == [{"median": 1.0, "q1": 1.0, "q3": 1.0, "runs": 2}] * 2
    plain = bench.format_rows([bench.SweepRow("threshold", "threshold", 0.9, 1.0, 1.0, 1.0, 8, 8, 1.0)])
    assert [line.count("|") for line in plain.splitlines()] == [11, 11, 11]  # no analyses: the table as it was
