"""Sweep one decoder setting (the threshold, by default) over prompts with known answers: the
Sweep tab's engine side (docs/app.md §3, "Threshold sweep").

Each prompt runs alone (batch 1), so TPF is the per-sequence figure a user sees; each answer is
judged by its family's verifier (tinymodel/tasks.py), and each wrong answer keeps its trace, its
header carrying the expected answer, to open in the Run tab at the first wrong commit. With
`passes` > 1 only the first pass is decoded and judged: decoding is greedy, so every pass commits
the same tokens in the same forwards (tests/test_app_teaching.py checks it), and only the time
differs.
"""

from __future__ import annotations

import csv
import io
import queue
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from engine import Engine, EngineError, GenerationConfig, GenerationOutput, RunHooks, Trace
from tinymodel.aup import aup_by_curve
from tinymodel.eval import answer_prompts, check_answer
from tinymodel.tasks import TASKS, Example, get_task, out_of_range_examples, parse_prompt, split_examples

from .answers import WrongCommit, first_wrong
from .host import EngineHost, ModelSpec
from .settings import OPTION_PREFIX, coerce
from .readouts import plural
from .runner import POLL_SECONDS, Failed, Finished, Job, Loading, Waiting, start_worker
from .timeline import Timeline

MAX_KEPT_FAILURES = 50  # traces of wrong answers kept for inspection
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


@dataclass
class SweepState:
    parameter: str
    outcomes: list[Outcome] = field(default_factory=list)
    done: bool = False
    failed: bool = False  # ended by an error (message says which)
    message: str = ""

    def points(self) -> list[dict]:
        """Per model and value: accuracy, TPF, TPS (sums over prompts, so long answers weigh more;
        TPS the median over the passes), count; models in the order they ran, each by value."""
        rows: dict[tuple[str, float], dict] = {}
        order: dict[str, int] = {}
        for o in self.outcomes:
            order.setdefault(o.model, len(order))
            r = rows.setdefault((o.model, o.value), {"model": o.model, "value": o.value, "correct": 0, "examples": 0, "tokens": 0, "nfe": 0, "edits": 0, "remasks": 0, "pass_seconds": []})
            r["correct"] += o.correct
            r["examples"] += 1
            r["tokens"] += o.tokens
            r["nfe"] += o.nfe
            r["edits"] += o.edits
            r["remasks"] += o.remasks
            timings = o.passes or [o.seconds]
            r["pass_seconds"] = [a + b for a, b in zip(r["pass_seconds"], timings)] if r["pass_seconds"] else list(timings)
        for r in rows.values():
            r["accuracy"] = r["correct"] / r["examples"]
            r["tpf"] = r["tokens"] / r["nfe"] if r["nfe"] else 0.0
            r["passes"] = len(r["pass_seconds"])
            r["seconds"] = statistics.median(r["pass_seconds"])
            r["tps"] = statistics.median(r["tokens"] / s if s > 0 else 0.0 for s in r["pass_seconds"])
        # each model's curve scored against the best accuracy of the curves shown (accuracy in percent)
        scores = aup_by_curve({m: [(r["tpf"], 100 * r["accuracy"]) for r in rows.values() if r["model"] == m] for m in order})
        for r in rows.values():
            r["aup"] = scores[r["model"]]
        return sorted(rows.values(), key=lambda r: (order[r["model"]], r["value"]))

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.correct]

    def csv(self) -> str:
        """The per-model, per-value table as CSV (accuracy as a fraction, for spreadsheets: the page
        shows it as a percentage; TPF, and TPS as the median over `passes`); the model (quoted when
        its name, a path, holds a comma), then the edits and remasks (a revising decoder's, summed
        over the prompts) and the model's AUP: columns added later come last, so the earlier ones
        keep their places."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([self.parameter, "accuracy", "correct", "prompts", "tokens", "nfe", "tpf", "tps", "passes", "model", "edits", "remasks", "aup"])
        for p in self.points():
            writer.writerow([
                f"{p['value']:g}", f"{p['accuracy']:.4f}", p["correct"], p["examples"], p["tokens"], p["nfe"], f"{p['tpf']:.3f}", f"{p['tps']:.1f}", p["passes"], p["model"],
                p["edits"], p["remasks"], f"{p['aup']:.2f}",
            ])
        return out.getvalue()


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
    decoder's own option (`decoder_options.edit_threshold`) is set inside `decoder_options`."""
    if parameter.startswith(OPTION_PREFIX):
        name = parameter[len(OPTION_PREFIX):]
        return [config.replace(decoder_options={**config.decoder_options, name: coerce(parameter, v)}) for v in values]
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


def sweep_examples(sets: list[str], per_task: int, seed: int = 0, own_prompts: str = "") -> list[Example]:
    """`per_task` seeded prompts of each chosen set, then the user's own prompts."""
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
            examples += split_examples([name], "held_out", limit=per_task, seed=seed)
    examples += own_examples(own_prompts or "")
    if not examples:
        raise EngineError("choose at least one task family or type prompts of your own")
    return examples


def with_answers(engine: Engine, examples: list[Example], encoded: list[list[int]]) -> Callable[..., GenerationOutput]:
    """`engine.generate_ids` that gives each prompt's expected answer to the run, found by the
    prompt's ids, so its trace header carries the answer's ids and their strings (`Trace.expected`)."""
    answers = {tuple(ids): engine.answer_ids(ex.response) for ex, ids in zip(examples, encoded)}

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
) -> Iterator[SweepState]:
    """Yield the growing SweepState at most every `interval` seconds, and when done. `also`: a
    second model swept the same way once the first is done (EngineHost.second_model); `passes`:
    runs of each prompt timed (module docstring). EngineError, on the first step, for a sweep
    over the host's bound on engine runs (MAX_SWEEP_RUNS; PUBLIC_MAX_SWEEP_RUNS for visitors)."""
    configs = sweep_configs(config, parameter, values)
    specs = [spec] if also is None else [spec, also]
    total = len(values) * len(examples) * len(specs)
    most = PUBLIC_MAX_SWEEP_RUNS if host.public else MAX_SWEEP_RUNS
    if total * passes > most:
        raise EngineError(
            f"this sweep would run the engine {total * passes:,} times ({len(values)} values x {len(examples)} prompts x {passes} passes x {len(specs)} models); this server runs at most {most:,}"
        )
    state = SweepState(parameter)
    cancel = threading.Event()

    def job_on(model: str, model_box: str) -> Job:
        def job(engine: Engine, post: Callable[[object], None], cancel: threading.Event) -> None:
            kept = 0
            for value, cfg in zip(values, configs):
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
                        edits=stats.edits, remasks=stats.remasks,
                    )
                    if not answer.correct and kept < MAX_KEPT_FAILURES:
                        kept += 1
                        outcome.trace = answer.output.trace
                        timeline = Timeline(outcome.trace)
                        outcome.expected = timeline.expected
                        outcome.wrong = first_wrong(timeline, outcome.expected)
                    post(outcome)

        return job

    last = time.perf_counter()
    try:
        for k, current in enumerate(specs):
            # one worker per model: each takes the engine lock for its own part, as a run does
            events = start_worker(host, current, job_on(host.name_of(current), current.label or host.label_of(current.path)), cancel)
            while True:
                try:
                    event = events.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    # a frame now and then while a prompt runs: Stop closes this generator, which
                    # Gradio can do only between its steps, and the close sets `cancel`
                    if time.perf_counter() - last >= interval:
                        last = time.perf_counter()
                        yield state
                    continue
                if isinstance(event, Outcome):
                    state.outcomes.append(event)
                    state.message = f"{len(state.outcomes)}/{total} prompts run"
                    if time.perf_counter() - last >= interval:
                        last = time.perf_counter()
                        yield state
                elif isinstance(event, (Waiting, Loading)):
                    state.message = "waiting for the engine: another session is running" if isinstance(event, Waiting) else f"loading {event.spec.describe()}"
                    yield state
                elif isinstance(event, Finished):
                    break
                elif isinstance(event, Failed):
                    state.done = state.failed = True
                    state.message = event.message
                    yield state
                    return
        state.done = True
        state.message = f"done: {plural(len(state.outcomes), 'prompt')}" + (f" ({len(state.outcomes) // len(specs)} on each model)" if len(specs) > 1 else "")
        yield state
    finally:
        cancel.set()
