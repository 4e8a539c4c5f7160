"""Tensor and expert parallelism as Engine options on this machine: same tokens, and at what cost.

    python -m benchmarks.parallel --repeats 5

Two models: the embedded one (assets/tiny-llada, dense: TP only) and a random LLaDA-MoE of the
same width and depth (8 experts, top-2; random weights: only tokens and time matter). Each runs
as one process (TP=1), as `Engine(..., tp_size=2)` and, for the MoE, `ep_size=2`: the same prompts
and settings, `--repeats` times after one warm-up. Per layout: whether every repeat generated
exactly the TP=1 tokens, the median engine time per forward (rank 0's own clock: the all-reduces
are inside it, the hand-off to this process is not) and the median NFE, each also as a ratio to
TP=1 in the same run. A degree of 2 runs two worker processes, each with half this process's CPU
threads (engine/runtime/workers.py), so every layout uses the same cores.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from engine import Engine, GenerationConfig, save_model
from engine.cli import DEFAULT_MODEL, OneLineParser, set_cpu_threads
from engine.cache_modes import cache_mode_names
from engine.models import LLaDAMoEModelLM, model_skeleton
from engine.registry import decoder_names
from tinymodel.tokenizer import build_tokenizer, save_tokenizer, special_ids

PROMPTS = ["Q: 48+57=? A:", "Q: ?+?=57 A:"]


def tiny_moe(folder: Path) -> Path:
    """A random LLaDA-MoE as wide and deep as the embedded model, with its character tokenizer."""
    torch.manual_seed(0)
    config = dict(
        model_type="llada", architectures=["LLaDAMoEModelLM"], hidden_size=192, num_hidden_layers=6, num_attention_heads=6,
        num_experts=8, num_experts_per_tok=2, expert_intermediate_size=256, qk_layernorm=True, rope_theta=10000.0,
        max_sequence_length=512, vocab_size=build_tokenizer().get_vocab_size(), **special_ids(),
    )
    save_model(LLaDAMoEModelLM(config).eval(), folder)
    save_tokenizer(folder)
    return folder


@dataclass
class Row:
    model: str
    layout: str
    same_tokens: bool
    ms_per_forward: float
    nfe: float
    comm_share: float  # rank 0's all-reduce seconds over its engine seconds (median)


def measure(engine: Engine, config: GenerationConfig, repeats: int) -> tuple[list[list[list[int]]], float, float, float]:
    """(token ids of every repeat, median ms per forward, median NFE, median share of engine time
    in all-reduces) after one warm-up."""
    engine.generate(PROMPTS, config)
    tokens, ms, nfe, comm = [], [], [], []
    for _ in range(repeats):
        out = engine.generate(PROMPTS, config).output
        tokens.append(out.token_ids)
        ms.append(1000 * out.stats.seconds / out.stats.nfe)
        nfe.append(out.stats.nfe)
        comm.append(out.stats.comm_seconds / out.stats.seconds)
    return tokens, statistics.median(ms), statistics.median(nfe), statistics.median(comm)


def bench(name: str, folder: Path, layouts: dict[str, dict[str, int]], config: GenerationConfig, repeats: int) -> list[Row]:
    rows, reference = [], None
    for layout, degrees in layouts.items():
        with Engine(folder, **degrees) as engine:
            tokens, ms, nfe, comm = measure(engine, config, repeats)
        reference = reference or tokens[0]
        rows.append(Row(name, layout, all(t == reference for t in tokens), ms, nfe, comm))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.parallel", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decoder", choices=decoder_names(), default="threshold")
    parser.add_argument("--cache", choices=cache_mode_names(), default="dual")
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--block-length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of TP=1, shared by the ranks otherwise (default: the CLI's rule)")
    args = parser.parse_args(argv)
    config = GenerationConfig(decoder=args.decoder, cache=args.cache, gen_length=args.gen_length, block_length=args.block_length).validate()
    threads = set_cpu_threads(model_skeleton(DEFAULT_MODEL), args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {
            "embedded (dense)": (Path(DEFAULT_MODEL), {"TP=1": {}, "TP=2": {"tp_size": 2}}),
            "tiny MoE": (tiny_moe(Path(tmp)), {"TP=1": {}, "TP=2": {"tp_size": 2}, "EP=2": {"ep_size": 2}}),
        }
        for name, (folder, layouts) in models.items():
            rows += bench(name, folder, layouts, config, args.repeats)
    print(f"{config.decoder}, cache {config.cache}, gen {config.gen_length}, block {config.block_length}, {len(PROMPTS)} prompts; "
          f"{args.repeats} repeats; TP=1 on {threads} thread(s), each rank on {max(1, threads // 2)}\n")
    print("| model | layout | tokens identical to TP=1 | ms per forward (median) | × TP=1 | in all-reduces | NFE (median) | × TP=1 |")
    print("|---|---|---|---|---|---|---|---|")
    base = {}
    for r in rows:
        ms0, nfe0 = base.setdefault(r.model, (r.ms_per_forward, r.nfe))
        print(f"| {r.model} | {r.layout} | {'yes' if r.same_tokens else 'no'} | {r.ms_per_forward:.2f} | {r.ms_per_forward / ms0:.2f} | {100 * r.comm_share:.0f}% | {r.nfe:g} | {r.nfe / nfe0:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
