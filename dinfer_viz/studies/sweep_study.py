"""Sweep one decoder setting (the threshold, by default) over prompts with known answers: the
Sweep tab's engine side (docs/app.md §3, "Threshold sweep").

Each prompt runs alone (batch 1), so TPF is the per-sequence figure a user sees; each answer is
judged by its family's verifier (tinymodel/tasks.py), and each wrong answer keeps its trace, its
header carrying the expected answer, to open in the Run tab at the first wrong commit. With
`passes` > 1 only the first pass is decoded and judged: decoding is greedy, so every pass commits
the same tokens in the same forwards (tests/test_app_teaching.py checks it), and only the time
differs.

Curves: one per model and, with `unconstrained_too`, per constraint (the settings' regex, JSON
schema or choice, and the same sweep without it, value by value on the same prompts). A value is
*partial* while fewer than all the prompts have run at it (a running or stopped sweep): its point
is marked and left out of its curve's AUP. Each curve keeps up to MAX_KEPT_PER_VALUE wrong answers
per value, so every value's failures stay reachable, and says how many it did not keep. Every
answer keeps its run's analyses (engine/analysis.py: RunFigures, a few numbers, not the trace),
which each point aggregates (docs/analysis.md §3.7).
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from engine import Engine, EngineError, GenerationConfig, GenerationOutput, RunHooks, Trace
from engine.analysis import RunFigures, aggregate_runs, run_figures
from engine.constraints import spec_of
from engine.registry import KIND_OPTION_PREFIX
from tinymodel.aup import aup_by_curve
from tinymodel.eval import answer_prompts, check_answer
from tinymodel.tasks import TASKS, Example, get_task, out_of_range_examples, parse_prompt, split_examples

from .answers import WrongCommit, first_wrong, single_answer
from ..live.host import EngineHost, ModelSpec
from ..settings import OPTION_PREFIX, coerce
from ..panes.readouts import plural
from ..live.jobs import Job, follow_job, start_worker
from ..reading.timeline import Timeline

# traces of wrong answers kept for inspection, per curve and value: a low threshold's dozens of
# failures must not crowd out a high one's few (one list of 50 for the whole sweep did)
MAX_KEPT_PER_VALUE = 20
# Every sweep is bounded before it queues for the engine (one sweep holds it, and the tabs' queue,
# until it ends or is stopped): a family's sampler searches for distinct prompts, so asking for more
# than a family holds would never return; 300 is what every family has (tinymodel/tasks.py's default).
MAX_PER_SET = 300
MAX_VALUES = 32
MAX_OWN_PROMPTS = 300
# engine runs in one sweep (values x prompts x passes x models): an hour or so of the embedded model
# on a CPU for the app's own user; a tenth of it for a public server's visitors, who share the engine
MAX_SWEEP_RUNS = 30_000
PUBLIC_MAX_SWEEP_RUNS = 3_000


@dataclass
class Outcome:
    """One prompt at one value of the swept setting."""

    value: float
    example: Example
    text: str
    correct: bool
    tokens: int
    nfe: int
    seconds: float
    trace: Trace | None = None  # kept for wrong answers only
    expected: list[int] | None = None
    wrong: WrongCommit | None = None
    model: str = ""  # the model's name (EngineHost.name_of), which the table and chart group by
    model_box: str = ""  # the model as the Run tab's model box takes it (a wrong answer opens there)
    passes: list[float] = field(default_factory=list)  # engine seconds of each pass (the first: `seconds`)
    edits: int = 0  # a revising decoder's edits and remasks in this answer's run (its trace)
    remasks: int = 0
    constraint: str = ""  # the constraint the answer was held to (ConstraintSpec.describe), "" for none
    analysis: RunFigures | None = None  # its run's order correlation, KL area, convergence (every answer's)

    @property
    def curve(self) -> tuple[str, str]:
        """The chart's curve this outcome belongs to: its model and constraint."""
        return self.model, self.constraint


@dataclass
class SweepState:
    parameter: str
    outcomes: list[Outcome] = field(default_factory=list)
    done: bool = False
    failed: bool = False  # ended by an error (message says which)
    stopped: bool = False  # ended by Stop (its points so far stay)
    message: str = ""
    per_value: int = 0  # prompts each curve runs at each value (0: unknown, every point complete)
    passes: int = 1  # runs of each prompt timed (TPS is their median; one pass is noisy)

    def points(self) -> list[dict]:
        """Per curve (model, constraint) and value: accuracy, TPF, TPS (sums over prompts, so long
        answers weigh more; TPS the median over the passes, with its lowest and highest), count,
        `partial` (fewer than `per_value` prompts run: left out of the AUP), `analysis` (the runs'
        analyses aggregated: engine.analysis.aggregate_runs); curves in the order they ran, each
        by value."""
        rows: dict[tuple[str, str, float], dict] = {}
        order: dict[tuple[str, str], int] = {}
        figures: dict[tuple[str, str, float], list[RunFigures]] = {}
        for o in self.outcomes:
            order.setdefault(o.curve, len(order))
            r = rows.setdefault((*o.curve, o.value), {"model": o.model, "constraint": o.constraint, "value": o.value, "correct": 0, "examples": 0, "tokens": 0, "nfe": 0, "edits": 0, "remasks": 0, "pass_seconds": []})
            r["correct"] += o.correct
            r["examples"] += 1
            r["tokens"] += o.tokens
            r["nfe"] += o.nfe
            r["edits"] += o.edits
            r["remasks"] += o.remasks
            if o.analysis is not None:
                figures.setdefault((*o.curve, o.value), []).append(o.analysis)
            timings = o.passes or [o.seconds]
            r["pass_seconds"] = [a + b for a, b in zip(r["pass_seconds"], timings)] if r["pass_seconds"] else list(timings)
        for key, r in rows.items():
            r["analysis"] = aggregate_runs(figures.get(key, []))
            r["accuracy"] = r["correct"] / r["examples"]
            r["tpf"] = r["tokens"] / r["nfe"] if r["nfe"] else 0.0
            r["passes"] = len(r["pass_seconds"])
            r["seconds"] = statistics.median(r["pass_seconds"])
            rates = [r["tokens"] / s if s > 0 else 0.0 for s in r["pass_seconds"]]
            r["tps"], r["tps_range"] = statistics.median(rates), (min(rates), max(rates))
            r["partial"] = 0 < r["examples"] < self.per_value
        # each curve scored against the best accuracy of the curves shown (accuracy in percent), on
        # its complete values only: a stopped value's prompts are the first families' alone
        complete = {c: [(r["tpf"], 100 * r["accuracy"]) for r in rows.values() if (r["model"], r["constraint"]) == c and not r["partial"]] for c in order}
        scores = aup_by_curve({c: points for c, points in complete.items() if points})
        for r in rows.values():
            r["aup"] = scores.get((r["model"], r["constraint"]))  # None: no complete value yet
        return sorted(rows.values(), key=lambda r: (order[(r["model"], r["constraint"])], r["value"]))

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.correct]

    def kept_failures(self, group: str = "") -> list[Outcome]:
        """The wrong answers with a stored trace (the ones a click opens), of one `failure_groups`
        key, or of every group for ""."""
        return [o for o in self.failures() if o.trace is not None and (not group or failure_key(o) == group)]

    def failure_groups(self) -> list[dict[str, Any]]:
        """Per curve and value with a wrong answer, in the table's order: its `key`, model,
        constraint, value, how many answers were wrong and how many of them were kept."""
        groups: dict[str, dict[str, Any]] = {}
        for o in self.failures():
            g = groups.setdefault(failure_key(o), {"key": failure_key(o), "model": o.model, "constraint": o.constraint, "value": o.value, "wrong": 0, "kept": 0})
            g["wrong"] += 1
            g["kept"] += o.trace is not None
        order = {(p["model"], p["constraint"], p["value"]): k for k, p in enumerate(self.points())}
        return sorted(groups.values(), key=lambda g: order.get((g["model"], g["constraint"], g["value"]), len(order)))

    def csv(self) -> str:
        """The per-model, per-value table as CSV (accuracy as a fraction, for spreadsheets: the page
        shows it as a percentage; TPF, and TPS as the median over `passes`); the model (quoted when
        its name, a path, holds a comma), then the edits and remasks (a revising decoder's, summed
        over the prompts) and the model's AUP: columns added later come last, so the earlier ones
        keep their places. Last, the runs' analyses (docs/analysis.md §3.7): the order correlation's
        median and quartiles, overall and within blocks, the mean KL area, the share converged
        (empty where no run has one)."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([self.parameter, "accuracy", "correct", "prompts", "tokens", "nfe", "tpf", "tps", "passes", "model", "edits", "remasks", "aup", "constraint", "tps_min", "tps_max", "partial", *ANALYSIS_COLUMNS])
        for p in self.points():
            writer.writerow([
                f"{p['value']:g}", f"{p['accuracy']:.4f}", p["correct"], p["examples"], p["tokens"], p["nfe"], f"{p['tpf']:.3f}", f"{p['tps']:.1f}", p["passes"], p["model"],
                p["edits"], p["remasks"], "" if p["aup"] is None else f"{p['aup']:.2f}", p["constraint"], f"{p['tps_range'][0]:.1f}", f"{p['tps_range'][1]:.1f}", int(p["partial"]),
                *analysis_cells(p["analysis"]),
            ])
        return out.getvalue()


ANALYSIS_COLUMNS = ["order_median", "order_q1", "order_q3", "order_within_median", "order_within_q1", "order_within_q3", "kl_area", "converged_share"]


def analysis_cells(analysis: dict[str, Any]) -> list[str]:
    """A point's aggregated analyses as the CSV's ANALYSIS_COLUMNS ("" for a figure no run has)."""
    def cell(v: float | None) -> str:
        return "" if v is None else f"{v:.4f}"

    order, within = analysis["order_correlation"], analysis["order_correlation_within_blocks"]
    return [*(cell(order[k]) for k in ("median", "q1", "q3")), *(cell(within[k]) for k in ("median", "q1", "q3")), cell(analysis["kl_area"]), cell(analysis["converged_share"])]


def failure_key(o: Outcome) -> str:
    """The key of an outcome's curve and value (the Sweep tab's filter of wrong answers by value)."""
    return json.dumps([o.model, o.constraint, o.value])


def parse_values(text: str) -> list[float]:
    """'0.5, 0.7 0.9' -> [0.5, 0.7, 0.9]."""
    items = [t for t in text.replace(",", " ").split() if t]
    if not items:
        raise EngineError("give at least one value to sweep, e.g. 0.5, 0.7, 0.9")
    if len(items) > MAX_VALUES:
        raise EngineError(f"{len(items)} values to sweep; a sweep takes at most {MAX_VALUES}")
    try:
        return [float(t) for t in items]
    except ValueError:
        raise EngineError(f"sweep values must be numbers, got {text!r}") from None


def sweep_configs(config: GenerationConfig, parameter: str, values: list[float]) -> list[GenerationConfig]:
    """One validated config per value (a bad value fails the sweep before anything runs); a
    decoder's or a kind's own option (`decoder_options.edit_threshold`,
    `kind_options.verify_threshold`) is set inside `decoder_options` or `kind_options`."""
    if parameter.startswith((OPTION_PREFIX, KIND_OPTION_PREFIX)):
        field, name = parameter.split(".", 1)
        return [config.replace(**{field: {**getattr(config, field), name: coerce(parameter, v)}}) for v in values]
    if not hasattr(config, parameter):
        raise EngineError(f"unknown setting to sweep: {parameter}")
    return [config.replace(**{parameter: coerce(parameter, v)}) for v in values]  # 32.0 -> 32 for an int setting


OUT_OF_RANGE_SUFFIX = " out of range"  # "add out of range": arithmetic with a four-digit operand


def prompt_sets() -> list[str]:
    """What the sweep can run: each family's held-out prompts, and the arithmetic out-of-range sets."""
    out_of_range = [f"{name}{OUT_OF_RANGE_SUFFIX}" for name in TASKS if out_of_range_examples([name], 1)]
    return list(TASKS) + out_of_range


def own_examples(text: str) -> list[Example]:
    """The user's prompts, one a line; each must belong to a family (its verifier scores it)."""
    lines = text.splitlines()
    if len(lines) > MAX_OWN_PROMPTS:
        raise EngineError(f"{len(lines)} lines of your own prompts; a sweep takes at most {MAX_OWN_PROMPTS}")
    out = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            example = parse_prompt(line)
            if example is None:
                raise EngineError(f"your prompt on line {number} ({line.strip()[:40]!r}) is in no task family, so it cannot be scored")
            out.append(example)
    return out


def sweep_examples(sets: list[str], per_task: int, seed: int = 0, own_prompts: str = "", split: str = "held_out") -> list[Example]:
    """`per_task` seeded prompts of each chosen set, then the user's own prompts. `split`: the
    families' split (tinymodel/tasks.py `split_examples`, the one source of it): the sweep and the
    Tune tab's report run the held-out prompts, the Tune tab's trials the train ones."""
    if not 1 <= per_task <= MAX_PER_SET:
        raise EngineError(f"prompts per set must be from 1 to {MAX_PER_SET}, got {per_task}")
    examples: list[Example] = []
    for name in sets:
        if name.endswith(OUT_OF_RANGE_SUFFIX):
            family = name[: -len(OUT_OF_RANGE_SUFFIX)]
            get_task(family)  # EngineError for an unknown family
            examples += out_of_range_examples([family], per_task, seed=seed)
        else:
            get_task(name)
            examples += split_examples([name], split, limit=per_task, seed=seed)
    examples += own_examples(own_prompts or "")
    if not examples:
        raise EngineError("choose at least one task family or type prompts of your own")
    return examples


def with_answers(engine: Engine, examples: list[Example], encoded: list[list[int]]) -> Callable[..., GenerationOutput]:
    """`engine.generate_ids` that gives each prompt's expected answer to the run, found by the
    prompt's ids, so its trace header carries the answer's ids and their strings (`Trace.expected`).
    Only a prompt with one right answer has one: a family with many (pair-sum, rhyme, grammar) gets
    none, so no valid commit is struck out against one of its answers and no first wrong commit is
    claimed for it (answers.no_first_wrong)."""
    answers = {tuple(ids): engine.answer_ids(ex.response) if single_answer(ex) else [] for ex, ids in zip(examples, encoded)}

    def generate_ids(prompts: list[list[int]], config: GenerationConfig, hooks: RunHooks) -> GenerationOutput:
        return engine.generate_ids(prompts, config, hooks.but(expected_ids=[answers[tuple(p)] for p in prompts]))

    return generate_ids


def run_sweep(
    host: EngineHost,
    spec: ModelSpec,
    config: GenerationConfig,
    parameter: str,
    values: list[float],
    examples: list[Example],
    interval: float = 0.5,
    also: ModelSpec | None = None,
    passes: int = 1,
    unconstrained_too: bool = False,
    cancel: threading.Event | None = None,
) -> Iterator[SweepState]:
    """Yield the growing SweepState at most every `interval` seconds, and when done. `cancel`: the
    sweep's Stop (set by the page's Stop button): the engine stops within its next layer, the
    sweep yields its state once more, marked stopped, and ends. `also`: a
    second model swept the same way once the first is done (EngineHost.second_model); `passes`:
    runs of each prompt timed (module docstring); `unconstrained_too`: each value also without
    the config's constraint, right after it with it (a stopped sweep leaves both curves at the same
    values). EngineError, on the first step, for a sweep over the host's bound on engine runs
    (MAX_SWEEP_RUNS; PUBLIC_MAX_SWEEP_RUNS for visitors), or a comparison with no constraint."""
    constraint = spec_of(config)
    variants = [(config, constraint.describe() if constraint else "")]
    if unconstrained_too:
        if constraint is None:
            raise EngineError("to draw a constrained and an unconstrained curve, set a constraint (regex, JSON schema or choice) in the Run tab's settings")
        variants.append((config.replace(regex=None, json_schema=None, choice=None), ""))
    swept = [[(value, cfg, label) for (base, label) in variants for cfg in sweep_configs(base, parameter, [value])] for value in values]
    specs = [spec] if also is None else [spec, also]
    total = len(values) * len(examples) * len(specs) * len(variants)
    most = PUBLIC_MAX_SWEEP_RUNS if host.public else MAX_SWEEP_RUNS
    if total * passes > most:
        raise EngineError(
            f"this sweep would run the engine {total * passes:,} times ({len(values)} values x {len(examples)} prompts x {passes} passes x {len(specs)} models"
            + (" x 2 curves" if len(variants) > 1 else "") + f"); this server runs at most {most:,}"
        )
    state = SweepState(parameter, per_value=len(examples), passes=passes)
    cancel = cancel if cancel is not None else threading.Event()

    def job_on(model: str, model_box: str) -> Job:
        def job(engine: Engine, post: Callable[[object], None], cancel: threading.Event) -> None:
            for value, cfg, label in (run for at_value in swept for run in at_value):
                kept = 0
                encoded = [engine.encode(ex.prompt, cfg.use_chat_template) for ex in examples]
                # the engine's own generate: its trace named as a run's, so a kept failure opens in the Run tab like a run
                answers = answer_prompts(with_answers(engine, examples, encoded), engine.decode, examples, encoded, cfg, check_answer, trace=True, cancel=cancel)
                for answer, ids in zip(answers, encoded):
                    stats = answer.output.stats
                    # the other passes are timed only (traced as the first, so the times compare)
                    timings = [stats.seconds] + [engine.generate_ids([ids], cfg, hooks=RunHooks(trace=True, cancel=cancel)).stats.seconds for _ in range(passes - 1)]
                    # one prompt a call: the stats' edits and remasks are this answer's (docs/counting.md §10)
                    outcome = Outcome(
                        value, answer.item, answer.text, answer.correct, stats.tokens, stats.nfe, stats.seconds, model=model, model_box=model_box, passes=timings,
                        edits=stats.edits, remasks=stats.remasks, constraint=label,
                        # the analyses now, while the trace is at hand: only wrong answers keep it
                        analysis=run_figures(answer.output.trace, answer.row),
                    )
                    if not answer.correct and kept < MAX_KEPT_PER_VALUE:
                        kept += 1
                        outcome.trace = answer.output.trace
                        timeline = Timeline(outcome.trace)
                        outcome.expected = timeline.expected
                        outcome.wrong = first_wrong(timeline, outcome.expected) if outcome.expected else None
                    post(outcome)

        return job

    try:
        for k, current in enumerate(specs):
            # one worker per model: each takes the engine lock for its own part, as a run does
            events = start_worker(host, current, job_on(host.name_of(current), current.label or host.label_of(current.path)), cancel)
            for event, due in follow_job(events, cancel, state, interval, lambda: f"stopped: {len(state.outcomes)}/{total} prompts run"):
                if isinstance(event, Outcome):
                    state.outcomes.append(event)
                    state.message = f"{len(state.outcomes)}/{total} prompts run"
                if due:
                    yield state
            if state.stopped or state.failed:
                return
        state.done = True
        state.message = f"done: {plural(len(state.outcomes), 'prompt')}" + (f" ({len(state.outcomes) // len(specs)} on each model)" if len(specs) > 1 else "")
        yield state
    finally:
        cancel.set()
