"""The Tune tab's engine side (docs/tuning.md §5): the engine's tuner (engine/tuning/) on the app's
engine, its Pareto front with held-out figures growing as trials finish, and the chart of it.

The study lives in memory for the page's session (the command line's `python -m engine tune`
keeps one in a database that workers share). Trials score the families' train split, the front's
points and the default settings the held-out split: both from `sweep_examples`, the Threshold
sweep's source of prompts (tinymodel/tasks.py's split). A point joins the front with its held-out
figures, each config's computed once. Bounded as a sweep: the engine runs of every trial and of
every held-out check together at most the sweep's caps (public mode's for visitors), trials at
most MAX_TUNE_TRIALS, seconds at most MAX_TUNE_SECONDS; Stop ends the running trial within a
layer (the engine's cancel) and the study with it.
"""

from __future__ import annotations

import csv
import io
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

import optuna
import plotly.graph_objects as go

from engine import Engine, EngineError, GenerationCancelled, GenerationConfig
from engine.kinds import fit
from engine.tuning.space import SearchSpace
from engine.tuning.study import HELD_OUT_SPLIT, TUNING_SPLIT, Figures, front, open_study, run_trials, settings_text, trial_config
from tinymodel.tasks import Example
from tinymodel.tune_prompts import evaluator

from ..drawing.figure_base import _finish, _plain, legend_at_foot
from ..panes.figures import message_figure
from ..live.host import EngineHost, ModelSpec
from ..panes.readouts import percent
from ..reading.words import plural
from ..live.jobs import follow_job, start_worker
from .sweep_study import MAX_SWEEP_RUNS, PUBLIC_MAX_SWEEP_RUNS

MAX_TUNE_TRIALS = 500
PUBLIC_MAX_TUNE_TRIALS = 60
MAX_TUNE_SECONDS = 3600
PUBLIC_MAX_TUNE_SECONDS = 600
HEIGHT = 380
FRONT_COLOUR, HELD_COLOUR, TRIAL_COLOUR, DEFAULT_COLOUR = "#2563eb", "#ea580c", "#cbd5e1", "#16a34a"
CSV_HEADERS = ["trial", "accuracy", "tpf", "tps", "held_out_accuracy", "held_out_tpf", "settings"]


@dataclass
class TunePoint:
    """A completed trial: its settings and tuning-split figures; `held_out` once it is on the front."""

    number: int
    config: dict[str, Any]
    accuracy: float
    tpf: float
    tps: float
    held_out: Figures | None = None

    @property
    def settings(self) -> str:
        return settings_text(self.config)


@dataclass
class TuneState:
    """What the page shows: every completed trial, the front (trial numbers, by TPF), the default
    settings' held-out figures, the failed and stopped trials' count, and the message."""

    trials: list[TunePoint] = field(default_factory=list)
    front: list[int] = field(default_factory=list)
    default: Figures | None = None
    refused: int = 0
    model_box: str = ""  # the model as the Run tab's model box takes it (a click opens the run there)
    done: bool = False
    stopped: bool = False
    failed: bool = False
    message: str = ""

    def point(self, number: int) -> TunePoint | None:
        return next((t for t in self.trials if t.number == number), None)

    def front_points(self) -> list[TunePoint]:
        return [p for n in self.front if (p := self.point(n)) is not None]

    def csv(self) -> str:
        """The front as CSV (accuracies as fractions), one row per point."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_HEADERS)
        for p in self.front_points():
            held = p.held_out or Figures()
            writer.writerow([p.number, f"{p.accuracy:.4f}", f"{p.tpf:.3f}", f"{p.tps:.1f}", f"{held.accuracy:.4f}", f"{held.tpf:.3f}", p.settings])
        return out.getvalue()


@dataclass(frozen=True)
class Update:
    """Posted by the tuning job after each trial: the trials so far, the front, the new held-out figures."""

    trials: list[TunePoint]
    front: list[int]
    refused: int


def check_budget(host: EngineHost, trials: int, seconds: float, train: int, held: int) -> None:
    """Refuse a study over the host's bounds before it queues for the engine."""
    most_trials = PUBLIC_MAX_TUNE_TRIALS if host.public else MAX_TUNE_TRIALS
    most_seconds = PUBLIC_MAX_TUNE_SECONDS if host.public else MAX_TUNE_SECONDS
    if not 1 <= trials <= most_trials:
        raise EngineError(f"trials must be from 1 to {most_trials} on this server, got {trials}")
    if not 0 < seconds <= most_seconds:
        raise EngineError(f"the time limit must be above 0 and at most {most_seconds} seconds on this server, got {seconds:g}")
    runs = trials * train + (trials + 1) * held  # every trial, and at worst each on the front, and the default, held out
    most = PUBLIC_MAX_SWEEP_RUNS if host.public else MAX_SWEEP_RUNS
    if runs > most:
        raise EngineError(f"this study could run the engine {runs:,} times ({trials} trials x {train} prompts, and up to {trials + 1} held-out checks x {held}); this server runs at most {most:,}")


def run_tune(
    host: EngineHost, spec: ModelSpec, space: SearchSpace, splits: dict[str, list[Example]], trials: int, seconds: float, seed: int = 0,
    cancel: threading.Event | None = None, interval: float = 0.5,
) -> Iterator[TuneState]:
    """Yield the growing TuneState after each trial (at most every `interval` seconds while one
    runs), and when done; EngineError on the first step for a study over the bounds."""
    check_budget(host, trials, seconds, len(splits[TUNING_SPLIT]), len(splits[HELD_OUT_SPLIT]))
    cancel = cancel if cancel is not None else threading.Event()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a refused trial is counted on the page, not logged with its traceback
    state = TuneState(model_box=spec.label or host.label_of(spec.path))

    def job(engine: Engine, post: Any, cancel: threading.Event) -> None:
        evaluate = evaluator(engine, splits, cancel)
        traits = engine.model
        try:
            post(evaluate(fit(GenerationConfig(), traits), HELD_OUT_SPLIT))
        except GenerationCancelled:
            return
        study = open_study(None, None, space, ("accuracy", "tpf"), seed=seed)
        held: dict[int, Figures] = {}

        def on_trial(study: Any, trial: Any) -> None:
            on_front = front(study) if study.best_trials else []
            try:
                for t in on_front:
                    if t.number not in held:
                        held[t.number] = evaluate(trial_config(t), HELD_OUT_SPLIT)
            except GenerationCancelled:
                study.stop()
            done = [t for t in study.trials if t.state.name == "COMPLETE"]
            points = [TunePoint(t.number, t.user_attrs["config"], t.user_attrs["accuracy"], t.user_attrs["tpf"], t.user_attrs["tps"], held.get(t.number)) for t in done]
            post(Update(points, [t.number for t in on_front if t.number in held], sum(t.state.name == "FAIL" for t in study.trials)))

        run_trials(study, space, traits, evaluate, trials, seconds, cancel, on_trial=on_trial)

    events = start_worker(host, spec, job, cancel)
    try:
        for event, due in follow_job(events, cancel, state, interval, lambda: f"stopped: {plural(len(state.trials), 'trial')} completed"):
            if isinstance(event, Figures):
                state.default = event
                state.message = "the default settings run on the held-out prompts; trials start"
            elif isinstance(event, Update):  # a trial completed: always a frame
                state.trials, state.front, state.refused = event.trials, event.front, event.refused
                state.message = f"{plural(len(state.trials), 'trial')} completed" + (f", {state.refused} refused" if state.refused else "") + f"; {len(state.front)} on the front"
                due = True
            if due:
                yield state
        if state.stopped or state.failed:
            return
        state.done = True
        state.message = f"done: {plural(len(state.trials), 'trial')} completed" + (f", {state.refused} refused by the model or its kind" if state.refused else "") + f"; {len(state.front)} on the front"
        yield state
    finally:
        cancel.set()


def tune_figure(state: TuneState | None) -> go.Figure:
    """Accuracy against TPF, in this order (the page's tests find the traces by it): the default
    settings' held-out point (green, under the rest), every completed trial off the front (grey),
    the front on the tuning prompts (blue, joined), each front point's held-out figures (orange).
    Each point's hover names its trial and settings; its customdata is the trial number (a click
    opens the trial on the Run tab)."""
    if state is None:
        return message_figure("no trial yet: choose the families and the budget, then Tune", HEIGHT)
    if not state.trials:  # a study under way says so: "no trial yet" read as a study that never started
        ended = state.done or state.stopped or state.failed
        return message_figure("no trial completed" if ended else "the first trial is running: its point shows here when it ends", HEIGHT)
    fig = go.Figure()
    on_front = state.front_points()

    def trace(points: list[TunePoint], name: str, colour: str, held: bool = False, **kw: Any) -> None:
        xs = [(p.held_out.tpf if held else p.tpf) for p in points]
        ys = [100 * (p.held_out.accuracy if held else p.accuracy) for p in points]
        hover = [f"trial {p.number}{' (held-out)' if held else ''}: {percent(y / 100)} at TPF {x:.2f}<br>{_plain(p.settings)}" for p, x, y in zip(points, xs, ys)]
        fig.add_trace(go.Scatter(x=xs, y=ys, name=name, customdata=[p.number for p in points], hovertext=hover, hoverinfo="text", marker=dict(color=colour, size=9), **kw))

    # drawn first, under the trials: a trial often lands on the default's figures
    default = state.default or Figures()
    fig.add_trace(go.Scatter(
        x=[default.tpf] if state.default else [], y=[100 * default.accuracy] if state.default else [], name="default settings (held-out)", mode="markers", hoverinfo="text",
        hovertext=[f"the default settings on the held-out prompts: {percent(default.accuracy)} at TPF {default.tpf:.2f}"], marker=dict(color=DEFAULT_COLOUR, size=14, symbol="star"),
    ))
    trace([p for p in state.trials if p.number not in state.front], "trials (tuning prompts)", TRIAL_COLOUR, mode="markers")
    trace(on_front, "front (tuning prompts)", FRONT_COLOUR, mode="lines+markers")
    trace([p for p in on_front if p.held_out is not None], "front on held-out prompts", HELD_COLOUR, held=True, mode="markers", marker_symbol="diamond")
    fig.update_xaxes(title_text="tokens per forward (TPF)")
    fig.update_yaxes(title_text="accuracy (%)", range=[-5, 105])
    height = legend_at_foot(fig, HEIGHT, 60)
    fig.update_layout(margin=dict(t=20))
    return _finish(fig, height, "tune")


def front_rows(state: TuneState | None) -> list[list[Any]]:
    """The front's table: trial, tuning and held-out figures, settings."""
    rows = []
    for p in state.front_points() if state else []:
        held = p.held_out or Figures()
        rows.append([p.number, percent(p.accuracy), round(p.tpf, 2), round(p.tps, 1), percent(held.accuracy), round(held.tpf, 2), p.settings])
    return rows


def settings_of(state: TuneState, number: int) -> GenerationConfig:
    """The config trial `number` ran (its stored settings); EngineError for one not in `state`."""
    point = state.point(number)
    if point is None:
        raise EngineError(f"no completed trial {number} in this study")
    return GenerationConfig.from_dict(point.config)

