"""The sweep keeps every value's wrong answers reachable, marks a stopped value partial, says when
TPS is one pass's, never prints a point label over another, and draws a constrained and an
unconstrained curve on one chart (issue #34 item 2, issue #35's sweep)."""

from __future__ import annotations

import json
import os
import random

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
import pytest

from dinfer_viz.studies import sweep_study as sweep_module
from dinfer_viz.live.host import EngineHost, ModelSpec
from dinfer_viz.studies.sweep_study import Outcome, SweepState, failure_key, run_sweep, sweep_examples
from dinfer_viz.studies.sweep_chart import MARKER_PX, PLOT_PX, _pixel, label_box, place_labels, sweep_figure
from dinfer_viz.tabs.run import RUN_VIEW
from dinfer_viz.tabs.sweep import SWEEP_TABLE_HEADERS, SWEEP_VIEW, _failure_summary, _sweep_rows
from dinfer_viz.ui import Handlers
import threading
import time
from types import SimpleNamespace
from tinymodel.aup import aup_by_curve
from tinymodel.tasks import Example

from .app_support import app_model, handmade_trace

SMALL = {"gen_length": 16, "block_length": 16}
# pair-sum prompts a low threshold gets wrong (dependent digits committed in one forward)
WRONG_PROMPTS = "\n".join(f"Q: ?+?={n} A:" for n in (38, 57, 91, 120))
PAIR_SUM = r" [0-9]{1,3} \+ [0-9]{1,3}"  # what a pair-sum answer looks like: " 16 + 22"


@pytest.fixture(scope="module")
def handlers(tmp_path_factory) -> Handlers:
    return Handlers(EngineHost(ModelSpec(app_model(tmp_path_factory))))


def outcome(value: float, correct: bool, model: str = "m", constraint: str = "", trace: bool = True) -> Outcome:
    ex = Example("pairsum", f"Q: ?+?={int(value * 100)} A:", " 2 + 3")
    return Outcome(value, ex, " 9", correct, 10, 5, 1.0, trace=handmade_trace() if trace and not correct else None, model=model, constraint=constraint)


def test_every_value_keeps_its_wrong_answers_and_the_filter_lists_one_value():
    # τ 0.05: 3 wrong, the first 2 kept (the list was cut); τ 0.9: 1 wrong, kept
    outcomes = [outcome(0.05, False), outcome(0.05, False), outcome(0.05, False, trace=False), outcome(0.9, False), outcome(0.9, True)]
    state = SweepState("threshold", outcomes, per_value=0)
    line, chooser = _failure_summary(state, "")
    assert "**4 wrong answers** over 2 values" in line and "τ=0.05 · m: 3 wrong, the first 2 kept" in line and "τ=0.9 · m: 1 wrong" in line
    assert "The list keeps the first" in line  # the page says a list is cut
    keys = [key for _, key in chooser["choices"]]
    assert keys == ["", failure_key(outcomes[0]), failure_key(outcomes[3])]
    assert chooser["choices"][0][0] == "every value (4 wrong, 3 listed)"
    assert [o.value for o in state.kept_failures(keys[2])] == [0.9]
    h = Handlers(EngineHost(ModelSpec("/never-loaded")))
    rows, _ = h.show_failures(state, keys[2])
    assert [r[0] for r in rows] == [0.9]
    # a click opens the row the filtered table lists: τ 0.9's, not the sweep's first
    opened = h.open_failure(state, gr.SelectData(None, {"index": [0, 1], "value": "x"}), keys[2])
    assert "= 0.9" in dict(zip(RUN_VIEW, opened[: len(RUN_VIEW)]))["message"]
    _, chooser = _failure_summary(state, json.dumps(["gone", "", 1.0]))
    assert chooser["value"] == ""  # a choice the sweep no longer has falls back to every value


def test_a_real_sweep_keeps_its_bound_per_value(handlers, monkeypatch):
    monkeypatch.setattr(sweep_module, "MAX_KEPT_PER_VALUE", 1)
    spec, config = handlers.parse({"config": SMALL})
    examples = sweep_examples([], 1, own_prompts=WRONG_PROMPTS)
    *_, state = run_sweep(handlers.host, spec, config, "threshold", [0.05, 0.1], examples)
    groups = state.failure_groups()
    assert groups, "the low thresholds should break at least one pair-sum"
    assert all(g["kept"] == min(g["wrong"], 1) for g in groups)  # every value with a wrong answer keeps one


def test_a_stopped_sweep_marks_its_unfinished_value_partial_and_leaves_it_out_of_the_aup(handlers):
    spec, config = handlers.parse({"config": SMALL})
    examples = sweep_examples([], 1, own_prompts=WRONG_PROMPTS)
    states = run_sweep(handlers.host, spec, config, "threshold", [0.9, 0.5], examples, interval=0.0)
    for state in states:
        if sum(o.value == 0.5 for o in state.outcomes) == 2:  # half of τ 0.5's prompts
            break
    states.close()  # what Stop does
    by_value = {p["value"]: p for p in state.points()}
    assert not by_value[0.9]["partial"] and by_value[0.5]["partial"] and by_value[0.5]["examples"] == 2
    complete = aup_by_curve({"c": [(by_value[0.9]["tpf"], 100 * by_value[0.9]["accuracy"])]})["c"]
    assert by_value[0.5]["aup"] == by_value[0.9]["aup"] == pytest.approx(complete)
    row = _sweep_rows(state)[0]  # by value: τ 0.5 first
    assert row[SWEEP_TABLE_HEADERS.index("prompts")] == "2 of 4 (partial)"
    chart = sweep_figure(state.points())
    curve = chart.data[0]
    assert list(curve.marker.symbol) == ["circle-open", "circle"]  # by value: τ 0.5 first, hollow
    assert "τ=0.5 partial (2 prompts)" in curve.name and "AUP" in curve.name
    assert "partial: the sweep did not finish this value" in curve.hovertext[0]  # its label too, where one fits


def test_one_pass_tps_is_marked_noisy_and_several_give_their_spread():
    one = SweepState("threshold", [outcome(0.9, True)], passes=1)
    assert _sweep_rows(one)[0][-1].startswith("1 pass: noisy")
    assert "(one pass: noisy)" in sweep_figure(one.points()).data[0].hovertext[0]
    three = SweepState("threshold", [Outcome(0.9, outcome(0.9, True).example, "", True, 10, 5, 1.0, passes=[1.0, 2.0, 0.5])], passes=3)
    assert _sweep_rows(three)[0][-1] == "3 passes: 5.0–20.0"
    assert "median of 3 passes, 5.0–20.0" in sweep_figure(three.points()).data[0].hovertext[0]


def boxes_of(figure) -> tuple[list, list]:
    """(label boxes, marker boxes) in the label layout's model, as sweep_figure placed them."""
    x_top = figure.layout.xaxis.range[1]
    labels, markers = [], []
    for trace in figure.data:
        for x, y, text, position in zip(trace.x, trace.y, trace.text, trace.textposition):
            px, py = _pixel(float(x), float(y), x_top)
            markers.append((px - MARKER_PX / 2, py - MARKER_PX / 2, px + MARKER_PX / 2, py + MARKER_PX / 2))
            if text:
                labels.append(label_box(px, py, text, position))
    return labels, markers


def overlapping(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.parametrize("seed", range(40))
def test_point_labels_never_cover_each_other_or_a_point(seed):
    rng = random.Random(seed)
    values = sorted(rng.sample([0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95], rng.randint(3, 11)))
    points = [
        {"model": model, "constraint": constraint, "value": v, "tpf": rng.uniform(1, 4), "accuracy": rng.choice([rng.random(), 0.9, 0.92]), "tps": 1.0, "examples": 4, "passes": 1, "aup": 1.0}
        for model in ("a", "b") for constraint in ("regex x", "") for v in values
    ]
    labels, markers = boxes_of(sweep_figure(points))
    assert labels  # some labels fit
    for i, a in enumerate(labels):
        assert not any(overlapping(a, b) for b in labels[i + 1 :])
        assert not any(overlapping(a, m) for m in markers)
        assert 0 <= a[0] and a[2] <= PLOT_PX[0] and 0 <= a[1] and a[3] <= PLOT_PX[1]


def test_place_labels_moves_a_label_before_it_drops_it():
    near = [{"tpf": 2.0, "accuracy": 0.5}, {"tpf": 2.0, "accuracy": 0.56}]  # the second point sits where the first's label would
    (texts, positions), = place_labels([(near, ["τ=0.1", "τ=0.2"])], 4.0)
    assert texts == ["τ=0.1", "τ=0.2"] and positions[0] != "top center"


def test_a_constrained_and_an_unconstrained_curve_on_one_chart(handlers):
    settings = {"config": {**SMALL, "regex": PAIR_SUM}}
    frames = list(handlers.sweep(settings, [], 1, "threshold", "0.1, 0.9", WRONG_PROMPTS, "", 1, True))
    view = dict(zip(SWEEP_VIEW, frames[-1]))
    assert view["message"].startswith("done"), view["message"]
    state = view["state"]
    curves = {}
    for o in state.outcomes:
        curves.setdefault(o.constraint, []).append((o.value, o.example.prompt))
    assert set(curves) == {f"regex {PAIR_SUM}", ""} and curves[""] == curves[f"regex {PAIR_SUM}"]  # same values, same prompts
    names = [t.name for t in view["chart"].data]
    assert len(names) == 2 and "regex" in names[0] and "no constraint" in names[1]
    assert view["chart"].data[1].line.dash == "dash"
    assert [r[SWEEP_TABLE_HEADERS.index("constraint")] for r in view["table"]] == [f"regex {PAIR_SUM}"] * 2 + ["none"] * 2
    assert "constraint" in state.csv().splitlines()[0].split(",")
    # every constrained answer is well-formed (the engine's guarantee), whatever its sum
    import re

    assert all(re.fullmatch(PAIR_SUM, o.text) for o in state.outcomes if o.constraint)


def test_the_comparison_needs_a_constraint(handlers):
    frames = list(handlers.sweep({"config": SMALL}, [], 1, "threshold", "0.9", WRONG_PROMPTS, "", 1, True))
    message = dict(zip(SWEEP_VIEW, frames[-1]))["message"]
    assert "set a constraint" in message and "\n" not in message


def test_stop_ends_the_sessions_sweep_and_frees_the_engine(handlers, gate_decoders, tmp_path):
    """#44 item 1: the page's Stop reached Gradio's cancel only, which left the sweep's engine
    running (its generator is never closed). Stop now sets the session's sweep cancel: the sweep's
    next state is its last, marked stopped, and the engine is free. Decided by the gate decoder's
    files (tests/marked_gate_decoder.py), never by timing: the sweep's first prompt is inside its
    first decode when Stop comes."""
    request, other = SimpleNamespace(session_hash="session-a"), SimpleNamespace(session_hash="session-b")
    config = {**SMALL, "decoder": "marked_gate", "decoder_options": {"gates": str(tmp_path)}}
    frames = handlers.sweep({"config": config}, [], 1, "threshold", "0.9, 0.5, 0.3", WRONG_PROMPTS, "", 1, False, request=request)
    rest: list[dict] = []
    started = threading.Thread(target=lambda: rest.extend(dict(zip(SWEEP_VIEW, frame)) for frame in frames))  # the page's stream
    started.start()
    while not (tmp_path / "reached-1-0").exists():  # the first prompt's first decode is at its gate
        time.sleep(0.002)
    handlers.stop_quietly(None, None, other)  # another session's Stop leaves this sweep alone
    handlers.stop_quietly(None, None, request)
    for n in range(1, 65):  # let the decode go: the engine then meets the cancel at its next layer
        (tmp_path / str(n)).touch()
    started.join()  # the stream ended by itself
    last = rest[-1]["state"]
    assert last.stopped and last.done and rest[-1]["message"].startswith("stopped:")
    assert len(last.outcomes) == 0  # the first prompt was cancelled; nothing ran after it
    assert handlers.host.lock.acquire(timeout=120)  # the engine's worker let go (a bound on a hang, not a timing)
    handlers.host.lock.release()
