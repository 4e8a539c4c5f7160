"""The KV-cache modes side by side: cost, staleness, and agreement with no cache.

    python -m benchmarks.cache_modes --model assets/tiny-llada --prompts heldout --limit 8 --repeats 5

Every configuration runs the same prompts (batch 1, greedy) and differs from the first, the
no-cache reference, only in its cache settings. Per configuration:
- NFE, TPF: the engine's counts (engine/stats.py), summed over the prompts;
- seconds: the median over `--repeats` passes of the summed generate time, staleness probe off;
  passes are interleaved across configurations so a shared machine's drift hits all alike;
- KL, top-1: one more pass with `measure_staleness`: the mean KL(exact || cached) and the share
  of agreeing top-1 tokens, over the positions still masked when a cache-reading forward ran
  (the positions the decoder chooses among; the trace stores KL rounded to 4 decimals);
- same tokens: prompts whose generated tokens equal the reference's, of all prompts;
- accuracy, when the prompt set is scored.
Prints a Markdown table.

`--persist-cost`: instead, what `persist_window` saves per cached forward, on a random dense LLaDA
of `--shape d_model,n_layers,canvas` (no checkpoint needed): a refresh on a random canvas, then
the median ms of one prefix, dual and window forward on the middle block, persist off and on
interleaved (persisting changes no logit, engine/cache.py; it skips the merged K/V copy).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from engine.cli import DEFAULT_MODEL, OneLineParser, add_runtime_args, apply_runtime, set_cpu_threads
from engine.cache import FULL, KVCacheManager
from engine.cache_modes import cache_modes
from engine.config import GenerationConfig
from engine.errors import EngineError
from engine import run_diffusion
from engine.models import LLaDAModelLM
from engine.pipeline import Engine
from engine.trace import Trace

from .presets import NamedConfig, parse_configs
from .prompts import load_prompt_set
from .run import Scorer, base_config, encode_all, run_pass, total

# vicinity with the defaults (16 before, 16 after, 4 warm-up iterations), then without warm-up, so
# the window's effect is seen apart from the uncached warm-up; persist_window on dual and vicinity.
DEFAULT_CONFIGS = ",".join(
    [
        "none=cache:none",
        "prefix=cache:prefix",
        "dual=cache:dual",
        "vicinity=cache:vicinity",
        "vicinity-w0=cache:vicinity,warmup:0",
        "vicinity-4-w0=cache:vicinity,prefix_look:4,after_look:4,warmup:0",
        "dual+persist=cache:dual,persist_window:true",
        "vicinity+persist=cache:vicinity,persist_window:true",
        "vicinity-4-w0+persist=cache:vicinity,prefix_look:4,after_look:4,warmup:0,persist_window:true",
    ]
)


def masked_staleness(trace: Trace) -> tuple[list[float], list[bool]]:
    """KL and top-1 agreement at every still-masked block position of every cache-reading forward."""
    canvas = [list(row) for row in trace.initial]
    kls: list[float] = []
    agrees: list[bool] = []
    for rec in trace.iterations:
        s, e = rec.block_range
        if rec.forward != FULL:
            for row, (kl_row, agree_row) in enumerate(zip(rec.extras["staleness_kl"], rec.extras["staleness_agree"])):
                masked = [canvas[row][p] == trace.mask_id for p in range(s, e)]
                kls += [k for k, m in zip(kl_row, masked) if m]
                agrees += [a for a, m in zip(agree_row, masked) if m]
        for row, positions in enumerate(rec.committed):
            for p in positions:
                canvas[row][p] = rec.top1[row][p - s]
    return kls, agrees


def measure(engine: Engine, prompts: list[list[int]], configs: list[NamedConfig], items, repeats: int) -> list[dict]:
    scorer = Scorer()
    timed: dict[str, list[float]] = {c.name: [] for c in configs}
    calls: dict[str, list] = {}
    for named in configs:  # one untimed warm-up call each
        run_diffusion(engine.model, [prompts[0]], named.config, stop_ids=engine.stop_ids)
    for _ in range(repeats):
        for named in configs:
            calls[named.name] = run_pass(engine, items, prompts, named.config, scorer)
            timed[named.name].append(sum(c.stats.seconds for c in calls[named.name]))
    reference: list[list[int]] | None = None
    rows = []
    for named in configs:
        probed = named.config.replace(measure_staleness=True)
        outs = [run_diffusion(engine.model, [ids], probed, stop_ids=engine.stop_ids) for ids in prompts]
        tokens = [out.token_ids[0] for out in outs]
        reference = reference or tokens
        kls, agrees = [], []
        for out in outs:
            k, a = masked_staleness(out.trace)
            kls += k
            agrees += a
        stats = total([c.stats for c in calls[named.name]])
        scored = [c.correct for c in calls[named.name] if c.correct is not None]
        rows.append(
            {
                "name": named.name,
                "nfe": stats.nfe,
                "tpf": stats.tpf,
                "seconds": statistics.median(timed[named.name]),
                "kl": statistics.mean(kls) if kls else None,
                "agree": sum(agrees) / len(agrees) if agrees else None,
                "same": sum(t == r for t, r in zip(tokens, reference)),
                "prompts": len(prompts),
                "accuracy": sum(scored) / len(scored) if scored else None,
            }
        )
    return rows


def persist_cost(d_model: int, n_layers: int, canvas: int, block_length: int, repeats: int) -> str:
    """Median ms per cached forward, persist off and on, as a Markdown table."""
    torch.manual_seed(0)
    heads = max(1, d_model // 64)
    model = LLaDAModelLM(dict(model_type="llada", d_model=d_model, n_heads=heads, n_layers=n_layers, vocab_size=1024,
                              mask_token_id=1023, eos_token_id=1022, max_sequence_length=canvas)).eval()
    x = torch.randint(0, 1022, (1, canvas))
    s = canvas // 2 // block_length * block_length
    e = s + block_length
    lines = ["| mode | query | ms, merge (dInfer) | ms, persist | persist / merge |", "|---|---|---|---|---|"]
    with torch.inference_mode():
        for mode in (m.name for m in cache_modes() if not m.exact):  # the modes that read a store
            managers, plans = [], []
            for persist in (False, True):
                cfg = GenerationConfig(gen_length=block_length, block_length=block_length, cache=mode, warmup=0, persist_window=persist)
                manager = KVCacheManager(cfg, canvas)
                manager.forward(model, manager.plan(0, 0, s, e), 0, input_ids=x)
                managers.append(manager)
                plans.append(manager.plan(1, 0, s, e))
            times: list[list[float]] = [[], []]
            for _ in range(repeats + 2):  # the first two are warm-up
                for i, (manager, plan) in enumerate(zip(managers, plans)):
                    start = time.perf_counter()
                    manager.forward(model, plan, 0, input_ids=x[:, plan.start : plan.end])
                    times[i].append(time.perf_counter() - start)
            merge, persist = (1e3 * statistics.median(t[2:]) for t in times)
            lines.append(f"| {mode} | [{plans[0].start}, {plans[0].end}) | {merge:.1f} | {persist:.1f} | {persist / merge:.2f} |")
    return "\n".join(lines)


def format_table(rows: list[dict]) -> str:
    header = ["config", "NFE", "TPF", "seconds (median)", "mean KL (masked, cached fwd)", "top-1 agree", f"same tokens as {rows[0]['name']}", "accuracy"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        same = "yes" if r["same"] == r["prompts"] else f"no ({r['same']}/{r['prompts']})"
        cells = [
            r["name"],
            str(r["nfe"]),
            f"{r['tpf']:.2f}",
            f"{r['seconds']:.3f}",
            "-" if r["kl"] is None else f"{r['kl']:.4f}",
            "-" if r["agree"] is None else f"{100 * r['agree']:.1f}%",
            same,
            "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}%",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m benchmarks.cache_modes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model folder (default: the embedded model)")
    parser.add_argument("--prompts", default="heldout", help="prompt set (benchmarks/prompts.py)")
    parser.add_argument("--limit", type=int, default=8, help="prompts to keep (heldout: per task)")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="benchmarks/presets.py grammar; the first is the reference")
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--block-length", type=int, default=16)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a GenerationConfig field for every configuration")
    parser.add_argument("--repeats", type=int, default=3)
    add_runtime_args(parser)
    parser.add_argument("--persist-cost", action="store_true", help="time cached forwards with and without persist_window instead")
    parser.add_argument("--shape", default="512,8,2048", help="--persist-cost model: d_model,n_layers,canvas")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        runtime = apply_runtime(args)
        if args.repeats < 1:
            raise EngineError(f"--repeats must be positive, got {args.repeats}")
        if args.persist_cost:
            d_model, n_layers, canvas = (int(v) for v in args.shape.split(","))
            print(f"random LLaDA d_model {d_model}, {n_layers} layers, canvas {canvas}, block {args.block_length}, {args.repeats} repeats, cpu")
            print(persist_cost(d_model, n_layers, canvas, args.block_length, args.repeats))
            return 0
        configs = parse_configs(args.configs, base_config(args.gen_length, args.block_length, args.set))
        prompt_set = load_prompt_set(args.prompts, args.limit)
        engine = Engine(args.model, **runtime)
        set_cpu_threads(engine.model, args.threads)
        prompts = encode_all(engine, prompt_set.items, configs[0].config.use_chat_template)
        rows = measure(engine, prompts, configs, prompt_set.items, args.repeats)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"model {args.model}, {len(prompts)} prompts of {prompt_set.name}, gen {args.gen_length}, block {args.block_length}, {args.repeats} repeats, {args.device}")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
