"""torch.compile as an Engine option on this machine: the same tokens, and what it costs and saves.

    python -m benchmarks.compile --repeats 5

The embedded model (assets/tiny-llada) as `Engine(path)` (eager) and `Engine(path, compile=True)`,
per cache mode, on prompts of several lengths (so several canvases, sharing buckets:
engine/runtime/compiled.py). Each engine first generates every prompt once: the warm-up, which for the
compiled engine compiles every bucket the prompts need (its wall time, the part of it spent in
compiling forwards and the graphs compiled are the "warm-up" columns). Then `--repeats` timed
passes over the prompts, one generate per prompt (batch 1, as the app runs), eager and compiled
passes interleaved so that a shared machine's drift hits both alike. Per row: whether every pass
generated exactly the eager tokens, the median over passes of TPS (tokens / engine seconds) and of
ms per forward, each also as the median of the per-pass ratios to eager, and the graphs compiled
during the timed passes (0: no recompilation after warm-up).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from engine import Engine, GenerationConfig
from engine.cli import DEFAULT_MODEL, OneLineParser, set_cpu_threads
from engine.cache_modes import cache_mode_names
from engine.models import model_skeleton
from engine.registry import decoder_names

from .run import total

# Four canvas lengths (prompt + gen_length) after the chat template.
PROMPTS = ["Q: 3+4=? A:", "Q: 48+57=? A:", "Q: ?+?=57 A:", "Q: 123+456+789=? A:"]


@dataclass
class Row:
    cache: str
    engine: str
    warmup_seconds: float
    compile_seconds: float
    compiles: int
    tokens: list[list[list[int]]] = field(default_factory=list)  # per timed pass, per prompt
    tps: list[float] = field(default_factory=list)  # per timed pass
    ms_per_forward: list[float] = field(default_factory=list)
    compiles_after_warmup: int = 0


def warm_up(engine: Engine, name: str, config: GenerationConfig) -> Row:
    start = time.perf_counter()
    stats = total([engine.generate(p, config).output.stats for p in PROMPTS])
    return Row(config.cache, name, time.perf_counter() - start, stats.compile_seconds, stats.compiles)


def timed_pass(engine: Engine, config: GenerationConfig, row: Row) -> None:
    outs = [engine.generate(p, config).output for p in PROMPTS]
    stats = total([o.stats for o in outs])
    row.tokens.append([o.token_ids[0] for o in outs])
    row.tps.append(stats.tps)
    row.ms_per_forward.append(1000 * stats.seconds / stats.nfe)
    row.compiles_after_warmup += stats.compiles


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.compile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--caches", default="none,dual", help="comma-separated cache modes: " + ", ".join(cache_mode_names()))
    parser.add_argument("--decoder", choices=decoder_names(), default="threshold")
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the CLI's rule)")
    args = parser.parse_args(argv)
    caches = [c.strip() for c in args.caches.split(",") if c.strip()]
    unknown = [c for c in caches if c not in cache_mode_names()]
    if unknown or args.repeats < 1:
        parser.error(f"unknown cache mode '{unknown[0]}'" if unknown else "--repeats must be >= 1")
    threads = set_cpu_threads(model_skeleton(DEFAULT_MODEL), args.threads)
    rows = []
    with Engine(DEFAULT_MODEL) as eager, Engine(DEFAULT_MODEL, compile=True) as compiled:
        for cache in caches:
            config = GenerationConfig(decoder=args.decoder, cache=cache, gen_length=args.gen_length, block_length=args.block_length).validate()
            pair = [warm_up(eager, "eager", config), warm_up(compiled, "compiled", config)]
            for _ in range(args.repeats):
                timed_pass(eager, config, pair[0])
                timed_pass(compiled, config, pair[1])
            rows.append(pair)
    print(f"{args.decoder}, gen {args.gen_length}, block {args.block_length}, {len(PROMPTS)} prompts one at a time; "
          f"{args.repeats} timed passes (eager and compiled interleaved) after one warm-up pass; {threads} CPU thread(s)\n")
    print("| cache | engine | tokens identical to eager | TPS (median) | × eager | ms per forward (median) | × eager "
          "| warm-up pass (s) | of which compiling (s) | graphs compiled | compiles after warm-up |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    median = statistics.median
    for base, row in rows:
        for r in (base, row):
            same = all(t == base.tokens[0] for t in r.tokens)
            tps_ratio = median(a / b for a, b in zip(r.tps, base.tps))
            ms_ratio = median(a / b for a, b in zip(r.ms_per_forward, base.ms_per_forward))
            print(f"| {r.cache} | {r.engine} | {'yes' if same else 'no'} | {median(r.tps):.1f} | {tps_ratio:.2f} | "
                  f"{median(r.ms_per_forward):.2f} | {ms_ratio:.2f} | {r.warmup_seconds:.1f} | {r.compile_seconds:.1f} | "
                  f"{r.compiles} | {r.compiles_after_warmup} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
