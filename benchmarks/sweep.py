"""Threshold sweep: accuracy against TPF for each decoder over a range of its knob (the Pareto view).

    python -m benchmarks.sweep --model assets/tiny-llada --prompts heldout --limit 20 \\
        --decoders fixed,threshold,hierarchical,credit,factor --thresholds 0.5,0.7,0.8,0.9,0.95

Each decoder sweeps the knob it declares (`Decoder.sweep_setting`), the one that trades accuracy
for parallelism: `threshold` for the decoders that use one (plug-ins included, when they declare
`uses_threshold`), `steps` as tokens per step k (steps = gen_length / k), `factor`. Every point is one
pass over the prompt set (batch 1) through the same runner as `benchmarks.run`; the Pareto
front is the set of points no other point beats on both accuracy and TPF. `sweep()` returns the
rows, for the app; the CLI prints them and writes JSON and a chart. Each decoder's curve gets its
AUP (d3LLM's accuracy under parallelism, tinymodel/aup.py), in the table, the JSON and the legend.
With `--analyses`, each point also runs one traced, untimed pass (greedy decoding repeats the timed
pass's tokens) and aggregates its runs' analyses (engine.analysis.aggregate_runs, docs/analysis.md
§3.7: the order correlation's median and quartiles, the mean KL area, the share converged) into
its row: the table's last columns and the JSON's `analysis`.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from engine.cli import DEFAULT_MODEL, OneLineParser, add_runtime_args, apply_runtime, set_cpu_threads
from engine.analysis import aggregate_runs, run_figures
from engine.config import GenerationConfig
from engine.decoders import make_decoder
from engine.registry import OPTION_SETTING_PREFIX, builtin_decoder_names, decoder_class, decoder_names
from engine.errors import EngineError
from engine.pipeline import Engine
from tinymodel.aup import aup_by_curve
from tinymodel.eval import answer_prompts

from . import charts, machine
from .presets import parse_assignment
from .prompts import PromptSet, load_prompt_set
from .run import Scorer, encode_all, run_pass, total

DEFAULT_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
DEFAULT_TOKENS_PER_STEP = (1, 2, 4, 8)
DEFAULT_FACTORS = (0.5, 1.0, 2.0, 4.0)
# a decoder whose sweep setting is an option of its own (entropy_bound's bound, in nats)
DEFAULT_OPTION_VALUES = (0.01, 0.1, 0.5, 1.0, 2.0)


@dataclass
class SweepRow:
    decoder: str
    knob: str  # "threshold", "tokens_per_step" or "factor"
    value: float
    accuracy: float
    tpf: float
    tps: float
    tokens: int
    nfe: int
    seconds: float
    pareto: bool = False
    aup: float = 0.0  # the decoder's curve's AUP (tinymodel/aup.py), on every row of that decoder
    analysis: dict[str, Any] | None = None  # the runs' analyses aggregated (`analyses`), else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sweep_points(
    decoder: str,
    base: GenerationConfig,
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS,
    tokens_per_step: tuple[int, ...] = DEFAULT_TOKENS_PER_STEP,
    factors: tuple[float, ...] = DEFAULT_FACTORS,
    option_values: tuple[float, ...] = DEFAULT_OPTION_VALUES,
) -> list[tuple[str, float, GenerationConfig]]:
    """(knob, value, config) for each point of `decoder`'s sweep, over the setting it declares
    (`Decoder.sweep_setting`); a decoder whose setting has no values here runs once at its defaults."""
    probe = base.replace(decoder=decoder)
    setting = decoder_class(decoder).sweep_setting
    if setting == "steps":
        # swept as tokens per step k (steps = gen_length / k); steps per block must be whole: k must divide the block length
        ks = [k for k in tokens_per_step if k >= 1 and base.block_length % k == 0]
        return [("tokens_per_step", k, probe.replace(steps=base.gen_length // k)) for k in ks]
    if setting == OPTION_SETTING_PREFIX + "factor":  # the factor decoder's own option, with values of its own
        return [("factor", f, probe.replace(decoder_options={**probe.decoder_options, "factor": f})) for f in factors]
    if setting == "threshold" and make_decoder(probe, mask_id=0).uses_threshold:
        return [("threshold", t, probe.replace(threshold=t)) for t in thresholds]
    if setting.startswith(OPTION_SETTING_PREFIX):  # an option the decoder declares (entropy_bound's bound)
        name = setting[len(OPTION_SETTING_PREFIX):]
        return [(name, v, probe.replace(decoder_options={**base.decoder_options, name: v})) for v in option_values]
    return [("default", 0.0, probe)]  # a plug-in with a knob of its own


def mark_aup(rows: list[SweepRow]) -> list[SweepRow]:
    """Set `aup` on every row: its decoder's curve scored against the best accuracy of any decoder
    swept (one task, one prompt set)."""
    scores = aup_by_curve({d: [(r.tpf, 100 * r.accuracy) for r in rows if r.decoder == d] for d in dict.fromkeys(r.decoder for r in rows)})
    for row in rows:
        row.aup = scores[row.decoder]
    return rows


def mark_pareto(rows: list[SweepRow]) -> list[SweepRow]:
    """Set `pareto` on the rows no other row dominates (at least as good on accuracy and TPF, better on one)."""
    for row in rows:
        row.pareto = not any(
            o.accuracy >= row.accuracy and o.tpf >= row.tpf and (o.accuracy > row.accuracy or o.tpf > row.tpf) for o in rows
        )
    return rows


def sweep(
    engine: Engine,
    prompt_set: PromptSet,
    base: GenerationConfig,
    decoders: list[str],
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS,
    tokens_per_step: tuple[int, ...] = DEFAULT_TOKENS_PER_STEP,
    factors: tuple[float, ...] = DEFAULT_FACTORS,
    option_values: tuple[float, ...] = DEFAULT_OPTION_VALUES,
    on_row: Callable[[SweepRow], None] | None = None,
    cancel: threading.Event | None = None,
    analyses: bool = False,
) -> list[SweepRow]:
    """One pass over `prompt_set` per sweep point of every decoder; rows in sweep order, Pareto marked.

    `on_row` sees each row as it is measured (before the Pareto marks, which need them all);
    `cancel` stops between generate calls (GenerationCancelled); `analyses`: one more pass per
    point, traced and not timed, whose runs' analyses each row aggregates (module docstring)."""
    if not prompt_set.scored:
        raise EngineError(f"prompt set '{prompt_set.name}' has no answers: a sweep needs accuracy")
    unknown = [d for d in decoders if d not in decoder_names()]
    if unknown:
        raise EngineError(f"unknown decoder '{unknown[0]}'; choose from {', '.join(decoder_names())}")
    points = [p for d in decoders for p in sweep_points(d, base, thresholds, tokens_per_step, factors, option_values)]
    if not points:
        raise EngineError("the sweep has no points (no tokens-per-step value divides the block length?)")
    encoded = encode_all(engine, prompt_set.items, base.use_chat_template)
    scorer = Scorer()
    rows = []
    for knob, value, config in points:
        calls = run_pass(engine, prompt_set.items, encoded, config, scorer, cancel=cancel)
        stats = total([c.stats for c in calls])
        accuracy = sum(bool(c.correct) for c in calls) / len(calls)
        row = SweepRow(config.decoder, knob, value, accuracy, stats.tpf, stats.tps, stats.tokens, stats.nfe, stats.seconds)
        if analyses:  # each trace analysed as its call returns and dropped: a few numbers a run are kept
            traced = answer_prompts(engine.generate_ids, engine.decode, prompt_set.items, encoded, config, scorer, trace=True, cancel=cancel)
            row.analysis = aggregate_runs([run_figures(a.output.trace, a.row) for a in traced])
        rows.append(row)
        if on_row:
            on_row(row)
    return mark_aup(mark_pareto(rows))


def format_rows(rows: list[SweepRow]) -> str:
    """The rows as a Markdown table; with the runs' analyses (`sweep(analyses=True)`), their columns last."""
    analysed = any(r.analysis is not None for r in rows)
    lines = [
        "| decoder | knob | value | accuracy | TPF | TPS | tokens | NFE | Pareto | AUP (decoder) |" + (ANALYSIS_HEADER if analysed else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" * ANALYSIS_HEADER.count("|") if analysed else ""),
    ]
    for r in rows:
        lines.append(
            f"| {r.decoder} | {r.knob} | {r.value:g} | {100 * r.accuracy:.1f}% | {r.tpf:.2f} | {r.tps:.1f} | {r.tokens} | {r.nfe} | {'*' if r.pareto else ''} | {r.aup:.1f} |"
            + (_analysis_cells(r.analysis) if analysed else "")
        )
    return "\n".join(lines)


ANALYSIS_HEADER = " ρ median (quartiles) | ρ within blocks | KL area | converged |"


def _analysis_cells(analysis: dict[str, Any] | None) -> str:
    def spread(q: dict[str, Any]) -> str:
        return "n/a" if q["median"] is None else f"{q['median']:.2f} ({q['q1']:.2f}–{q['q3']:.2f})"

    if analysis is None:
        return " |" * ANALYSIS_HEADER.count("|")
    kl = "n/a" if analysis["kl_area"] is None else f"{analysis['kl_area']:.3f}"
    converged = "n/a" if analysis["converged_share"] is None else f"{100 * analysis['converged_share']:.0f}%"
    return f" {spread(analysis['order_correlation'])} | {spread(analysis['order_correlation_within_blocks'])} | {kl} | {converged} |"


def _numbers(kind: type) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got '{text}'") from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m benchmarks.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--prompts", default="heldout", help="a prompt set with answers (see benchmarks/prompts.py)")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--decoders", default=",".join(builtin_decoder_names()), help="comma-separated (default: every decoder the engine ships)")
    parser.add_argument("--thresholds", type=_numbers(float), default=DEFAULT_THRESHOLDS)
    parser.add_argument("--tokens-per-step", type=_numbers(int), default=DEFAULT_TOKENS_PER_STEP, help="fixed decoder")
    parser.add_argument("--factors", type=_numbers(float), default=DEFAULT_FACTORS, help="factor decoder")
    parser.add_argument("--option-values", type=_numbers(float), default=DEFAULT_OPTION_VALUES, help="a decoder swept by an option of its own (entropy_bound: the bound in nats)")
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a GenerationConfig field for every point")
    parser.add_argument("--analyses", action="store_true", help="one more traced, untimed pass per point: the runs' order correlation, KL area and convergence (docs/analysis.md §3.7)")
    add_runtime_args(parser)
    parser.add_argument("--out", default="runs/bench")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        runtime = apply_runtime(args)
        changes = dict(parse_assignment(s, "=") for s in args.set)
        base = GenerationConfig(gen_length=args.gen_length, block_length=args.block_length).replace(**changes)
        if args.limit is not None and args.limit < 1:
            raise EngineError(f"--limit must be positive, got {args.limit}")
        prompt_set = load_prompt_set(args.prompts, args.limit)
        engine = Engine(args.model, **runtime)
        set_cpu_threads(engine.model, args.threads)
        decoders = [d.strip() for d in args.decoders.split(",") if d.strip()]
        rows = sweep(
            engine, prompt_set, base, decoders, args.thresholds, args.tokens_per_step, args.factors, args.option_values,
            on_row=lambda r: print(f"{r.decoder} {r.knob} {r.value:g}: accuracy {r.accuracy:.3f} TPF {r.tpf:.2f}", file=sys.stderr), analyses=args.analyses,
        )
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    document = {
        "model": engine.path,
        "prompt_set": prompt_set.name,
        "machine": machine.describe(args.device),
        "arguments": vars(args),
        "rows": [r.to_dict() for r in rows],
    }
    print(format_rows(rows))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(document, indent=2) + "\n")
    figure = charts.sweep_figure(document["rows"], title=f"{engine.name} on {prompt_set.name}: accuracy vs TPF")
    for path in [out / "sweep.json", *charts.write_figure(figure, out / "sweep")]:
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
