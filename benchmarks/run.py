"""Benchmark several engine configurations on one prompt set, in one process, against the first.

    python -m benchmarks.run --model assets/tiny-llada --prompts heldout --limit 20 \\
        --configs llada,fastdllm,dinfer --repeats 5 --trace-overhead

The protocol (prompts tokenised once, warm-up, interleaved passes, the engine's own counts, medians
of per-pass ratios to the first configuration, `--trace-overhead`): docs/performance.md §5; the sums
it takes: docs/counting.md §7.
Writes the table (Markdown), the JSON and a plotly chart (HTML; PNG when kaleido is installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from engine.cli import DEFAULT_MODEL, OneLineParser, add_runtime_args, apply_runtime, set_cpu_threads
from engine.config import GenerationConfig
from engine.errors import EngineError
from engine import run_diffusion
from engine.pipeline import Engine
from engine.stats import GenerationStats
from tinymodel.eval import answer_prompts

from . import charts, machine
from .presets import NamedConfig, parse_assignment, parse_configs
from .prompts import PromptItem, PromptSet, load_prompt_set


@dataclass
class Call:
    """One timed generate call on one prompt."""

    prompt_id: str
    stats: GenerationStats
    wall_seconds: float  # around the whole call, trace recording included
    text: str
    correct: bool | None
    token_ids: list[int] | None = None  # the answer's ids (the `same ids` column compares them with the first configuration's)


def total(stats: list[GenerationStats]) -> GenerationStats:
    """Several calls' stats as one: every count summed, so `.tps`/`.tpf` are the aggregate rates."""
    summed = {f.name: sum(getattr(s, f.name) for s in stats) for f in dataclasses.fields(GenerationStats) if f.name not in ("batch", "counts")}
    counts = {name: sum(s.counts.get(name, 0) for s in stats) for name in {k for s in stats for k in s.counts}}  # a kind's own counters
    return GenerationStats(batch=1, counts=counts, **summed)


class Scorer:
    """Scores responses, each distinct (prompt, response) once: greedy passes repeat them, and a
    code check runs a subprocess."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], bool] = {}

    def __call__(self, item: PromptItem, text: str) -> bool | None:
        if item.check is None:
            return None
        key = (item.id, text)
        if key not in self.seen:
            self.seen[key] = bool(item.check(text))
        return self.seen[key]


def encode_all(engine: Engine, items: list[PromptItem], use_chat_template: bool) -> list[list[int]]:
    return [engine.encode(item.prompt, use_chat_template) for item in items]


def run_pass(
    engine: Engine,
    items: list[PromptItem],
    encoded: list[list[int]],
    config: GenerationConfig,
    scorer: Scorer,
    trace: bool = False,
    cancel: threading.Event | None = None,
) -> list[Call]:
    """One generate call per prompt (batch 1), scored."""
    answers = answer_prompts(engine.generate_ids, engine.decode, items, encoded, config, scorer, trace=trace, cancel=cancel)
    return [Call(a.item.id, a.output.stats, a.wall_seconds, a.text, a.correct, list(a.output.token_ids[a.row])) for a in answers]


@dataclass
class ConfigRun:
    """Everything measured for one configuration."""

    named: NamedConfig
    passes: list[list[Call]] = field(default_factory=list)
    traced_passes: list[list[Call]] = field(default_factory=list)

    def pass_stats(self) -> list[GenerationStats]:
        return [total([c.stats for c in calls]) for calls in self.passes]

    def accuracy(self) -> tuple[int, int] | None:
        """(right, scored) over every timed call; None when the set has no answers."""
        scored = [c.correct for calls in self.passes for c in calls if c.correct is not None]
        return (sum(scored), len(scored)) if scored else None

    def trace_overhead(self) -> float | None:
        if not self.traced_passes:
            return None
        ratios = [
            sum(c.wall_seconds for c in traced) / sum(c.wall_seconds for c in plain)
            for traced, plain in zip(self.traced_passes, self.passes)
        ]
        return statistics.median(ratios)


def benchmark(
    engine: Engine,
    prompt_set: PromptSet,
    configs: list[NamedConfig],
    repeats: int = 3,
    warmup: int = 1,
    trace_overhead: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[ConfigRun]:
    """Warm up every configuration, then `repeats` interleaved passes (module docstring)."""
    if repeats < 1 or warmup < 0:
        raise EngineError("repeats must be >= 1 and warmup >= 0")
    items = prompt_set.items
    encodings = {flag: encode_all(engine, items, flag) for flag in {c.config.use_chat_template for c in configs}}
    scorer = Scorer()
    runs = [ConfigRun(c) for c in configs]
    for run in runs:
        encoded = encodings[run.named.config.use_chat_template]
        for i in range(warmup):
            run_diffusion(engine.model, [encoded[i % len(encoded)]], run.named.config, stop_ids=engine.stop_ids)
    for repeat in range(repeats):
        for run in runs:
            config, encoded = run.named.config, encodings[run.named.config.use_chat_template]
            run.passes.append(run_pass(engine, items, encoded, config, scorer))
            if trace_overhead:
                run.traced_passes.append(run_pass(engine, items, encoded, config, scorer, trace=True))
            if progress:
                progress(f"pass {repeat + 1}/{repeats} {run.named.name}: {run.pass_stats()[-1].tps:.1f} TPS")
    return runs


def _median_ratio(values: list[float], baseline: list[float]) -> float | None:
    """Median over passes of value / baseline in the same pass (None if the baseline made no tokens)."""
    ratios = [v / b for v, b in zip(values, baseline) if b > 0]
    return statistics.median(ratios) if ratios else None


def same_ids(run: ConfigRun, base: ConfigRun) -> int:
    """How many prompts got the first configuration's token ids, prompt by prompt, in every pass."""
    reference = {c.prompt_id: c.token_ids for c in base.passes[0]}
    return sum(all(calls[i].token_ids == reference[calls[i].prompt_id] for calls in run.passes) for i in range(len(run.passes[0])))


def summarize(runs: list[ConfigRun]) -> list[dict[str, Any]]:
    """One row per configuration: the table's figures and the ratios to the first."""
    base_stats = runs[0].pass_stats()
    base_tpf = total(base_stats).tpf
    rows = []
    for run in runs:
        passes = run.pass_stats()
        overall = total(passes)
        tps = [s.tps for s in passes]
        accuracy = run.accuracy()
        calls = [c for calls in run.passes for c in calls]
        rows.append(
            {
                "name": run.named.name,
                "prompts": len(run.passes[0]),
                "repeats": len(passes),
                "tokens": overall.tokens / len(passes),  # per pass
                "nfe": overall.nfe / len(passes),
                "seconds": statistics.median(s.seconds for s in passes),
                "host_syncs": overall.host_syncs / len(passes),
                "tpf": overall.tpf,
                "tps_median": statistics.median(tps),
                "tps_min": min(tps),
                "tps_max": max(tps),
                "tps_passes": tps,
                "tps_request_mean": statistics.mean(c.stats.tps for c in calls),
                "forwards_per_second": overall.forwards_per_second,
                "accuracy": accuracy[0] / accuracy[1] if accuracy else None,
                "correct": accuracy[0] if accuracy else None,
                "scored": accuracy[1] if accuracy else 0,
                "tps_ratio": _median_ratio([s.tps for s in passes], [b.tps for b in base_stats]),
                "tpf_ratio": overall.tpf / base_tpf if base_tpf else None,
                "trace_overhead": run.trace_overhead(),
                # the speculative kind: drafted tokens the verifier kept, per verify forward (engine/kinds/speculative.py)
                "accepted_per_verify": overall.counts["accepted_draft_tokens"] / overall.counts["verified_steps"] if overall.counts.get("verified_steps") else None,
                "same_ids": same_ids(run, runs[0]),
                "config": run.named.config.to_dict(),
            }
        )
    return rows


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table, one row per configuration; ratios are to the first row."""
    base = rows[0]["name"]
    header = ["config", "prompts", "tokens", "NFE", "TPF", "TPS median", "TPS min-max", "accuracy", f"TPS / {base}", f"TPF / {base}", "trace on/off", "accepted / verify", "seconds median", f"same ids as {base}"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        accuracy = "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}% ({r['correct']}/{r['scored']})"
        cells = [
            r["name"],
            str(r["prompts"]),
            f"{r['tokens']:.0f}",
            f"{r['nfe']:.0f}",
            f"{r['tpf']:.2f}",
            f"{r['tps_median']:.1f}",
            f"{r['tps_min']:.1f}-{r['tps_max']:.1f}",
            accuracy,
            _times(r["tps_ratio"]),
            _times(r["tpf_ratio"]),
            _times(r["trace_overhead"]),
            "-" if r["accepted_per_verify"] is None else f"{r['accepted_per_verify']:.2f}",
            f"{r['seconds']:.2f}",
            f"{r['same_ids']}/{r['prompts']}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(engine: Engine, prompt_set: PromptSet, runs: list[ConfigRun], device: str, args: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: machine, protocol, one summary per configuration, per-prompt results."""
    return {
        "model": engine.path,
        "prompt_set": prompt_set.name,
        "machine": machine.describe(device),
        "arguments": args,
        "counting_rules": "engine/stats.py (docs/counting.md)",
        "results": summarize(runs),
        "calls": {
            run.named.name: [
                {"prompt": c.prompt_id, **c.stats.to_dict(), "wall_seconds": c.wall_seconds, "correct": c.correct, "text": c.text}
                for c in run.passes[0]
            ]
            for run in runs
        },
    }


def write_outputs(document: dict[str, Any], out: Path, stem: str = "benchmark") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{stem}.json"
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    table_path = out / f"{stem}.md"
    table_path.write_text(format_table(document["results"]) + "\n")
    figure = charts.benchmark_figure(document["results"], title=f"{Path(document['model']).name} on {document['prompt_set']}")
    return [json_path, table_path, *charts.write_figure(figure, out / stem)]


def base_config(gen_length: int, block_length: int, settings: list[str]) -> GenerationConfig:
    """The run's base: the lengths, then every `--set KEY=VALUE`."""
    changes = dict(parse_assignment(s, "=") for s in settings)
    return GenerationConfig(gen_length=gen_length, block_length=block_length).replace(**changes)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model folder (default: the embedded model)")
    parser.add_argument("--prompts", default="heldout", help="prompt set: heldout[:TASKS], gsm8k:FILE, humaneval[:FILE], mbpp:FILE, text:FILE")
    parser.add_argument("--limit", type=int, default=None, help="prompts to keep (heldout: per task, a seeded sample)")
    parser.add_argument("--configs", default="llada,fastdllm,dinfer", help="comma-separated; the first is the baseline (see benchmarks/presets.py)")
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a GenerationConfig field for every configuration (repeatable)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per configuration")
    parser.add_argument("--trace-overhead", action="store_true", help="also run every pass with tracing and report the ratio")
    add_runtime_args(parser)
    parser.add_argument("--out", default="runs/bench", help="folder for benchmark.json/.md/.html")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        runtime = apply_runtime(args)
        base = base_config(args.gen_length, args.block_length, args.set)
        configs = parse_configs(args.configs, base)
        if args.limit is not None and args.limit < 1:
            raise EngineError(f"--limit must be positive, got {args.limit}")
        prompt_set = load_prompt_set(args.prompts, args.limit)
        engine = Engine(args.model, **runtime)
        set_cpu_threads(engine.model, args.threads)
        runs = benchmark(
            engine, prompt_set, configs, args.repeats, args.warmup, args.trace_overhead, progress=lambda m: print(m, file=sys.stderr)
        )
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    document = report(engine, prompt_set, runs, args.device, vars(args))
    print(f"{engine.name} on {prompt_set.name} ({len(prompt_set.items)} prompts), {args.repeats} passes; {machine.one_line(document['machine'])}")
    print(format_table(document["results"]))
    for path in write_outputs(document, Path(args.out)):
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
