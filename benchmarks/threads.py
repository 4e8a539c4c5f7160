"""Which torch CPU thread count is fastest, by model size, on an idle and on a busy machine.

    python -m benchmarks.threads                  # idle machine
    python -m benchmarks.threads --load 2         # two busy-loop processes run meanwhile

For each model (the embedded one, and random LLaDAs of growing width: only the time matters) and
each thread count from 1 to the number of cores, one generate (fixed decoder, gen 64, block 32:
64 forwards) is timed; medians over `--repeats`, interleaved (every thread count once per round)
so a change in the machine's load hits them alike. `--load N` starts N processes that spin on
the CPU for the whole run, as another job on a shared machine would. The rule the app and the CLI
follow (engine/cli.py: `cpu_threads_for`, docs/app.md §8) comes from this table (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time

import torch

from engine import GenerationConfig
from engine.cli import DEFAULT_MODEL, OneLineParser, cpu_threads_for
from engine import run_diffusion
from engine.models import DiffusionLM, LLaDAModelLM, load_model
from tinymodel.tokenizer import build_tokenizer, special_ids

CONFIG = GenerationConfig(gen_length=64, block_length=32, decoder="fixed", early_stop=False, use_chat_template=False)


def random_llada(d_model: int, layers: int) -> LLaDAModelLM:
    config = dict(model_type="llada", d_model=d_model, n_heads=d_model // 64, n_layers=layers, mlp_hidden_size=d_model * 8 // 3,
                  rope_theta=10000.0, vocab_size=build_tokenizer().get_vocab_size(), max_sequence_length=512, **special_ids())
    return LLaDAModelLM(config).eval()


def generate_seconds(model: DiffusionLM, threads: int) -> float:
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    run_diffusion(model, [[5] * 16], CONFIG)
    return time.perf_counter() - t0


def spin() -> None:
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.threads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", nargs="*", type=int, default=[512, 1024], help="random LLaDAs of these widths (8 layers)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes to run meanwhile")
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    models = [("embedded", load_model(DEFAULT_MODEL, dtype=torch.float32).eval())]
    models += [(f"random d{w} x8", random_llada(w, 8)) for w in args.widths]
    burners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.load)]
    for burner in burners:
        burner.start()
    try:
        counts = list(range(1, cores + 1))
        print(f"{cores} cores, {args.load} busy processes; seconds per generate (64 forwards), median of {args.repeats}")
        print("| model | parameters | " + " | ".join(f"{n} thread{'s' * (n > 1)}" for n in counts) + " | fastest | rule |")
        print("|---|---|" + "---|" * len(counts) + "---|---|")
        for name, model in models:
            parameters = sum(p.numel() for p in model.parameters())
            generate_seconds(model, 1)  # warm-up
            times: dict[int, list[float]] = {n: [] for n in counts}
            for _ in range(args.repeats):
                for n in counts:
                    times[n].append(generate_seconds(model, n))
            medians = {n: statistics.median(t) for n, t in times.items()}
            fastest = min(medians, key=medians.get)
            cells = " | ".join(f"{medians[n]:.2f}" for n in counts)
            print(f"| {name} | {parameters / 1e6:.1f}M | {cells} | {fastest} | {cpu_threads_for(parameters)} |")
    finally:
        for burner in burners:
            burner.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
