"""The engine against its peers' own code, at identical tokens, on the CPU (issue 37).

Two peers, each run by its own code on the same network, prompts and seeds as the engine:

- **transformers**: `DiffusionGemmaForBlockDiffusion.generate` on `assets/tiny-gemma` (loaded by
  transformers' `from_pretrained`, eager attention) against the engine's uniform-state loop on the
  same checkpoint (loaded by the engine), held-out prompts of the embedded tasks (tinymodel/tasks.py),
  seeded as tests/test_diffusion_gemma.py seeds both (`torch.manual_seed(seed)` against the
  request generator);
- **diffusers**: `LLaDA2Pipeline` with its `BlockRefinementScheduler` over a tiny random LLaDA2
  built here (the engine's network behind `engine.reference.DiffusersAdapter`, as
  tests/test_diffusers_parity.py runs it), greedy, against the engine's threshold decoder and edit
  decoder, each with the exact prefix cache and with none; diffusers has no cache: it recomputes
  the prompt's blocks and the current one every step.

Per row the same prompts run on both sides; tokens are compared row by row. Timing: one torch
thread, `--warmup` untimed passes, then `--repeats` passes interleaved (per pass every row's
engine and peer side, in alternating order), each side timed around all its prompts; the table
gives the medians and the engine / peer speed ratio as the median of per-pass ratios. `--clock
cpu` times by this process's CPU seconds instead of the wall clock: both sides run here on one
thread, so on a machine shared with other work it leaves out the time others hold the cores.

    python -m benchmarks.peers                       # the default rows (RESULTS.md)
    python -m benchmarks.peers --gemma-gen-length 64 --llada2-prompt-length 256 --llada2-gen-length 256
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

GEMMA = Path(__file__).resolve().parent.parent / "assets" / "tiny-gemma"

# the tiny random LLaDA2 (the shape tests/moe_models.py builds, its weights widened so that
# confidences vary and edits happen)
LLADA2_CONFIG = dict(
    model_type="llada2_moe", architectures=["LLaDA2MoeModelLM"], hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=8,
    intermediate_size=24, first_k_dense_replace=1, num_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
    score_function="sigmoid", moe_router_enable_expert_bias=True, norm_topk_prob=True, use_qk_norm=True, rope_theta=10000.0,
    rms_norm_eps=1e-6, vocab_size=40, mask_token_id=39, eos_token_id=38, max_position_embeddings=4096,
)


@dataclass
class Row:
    """One line of the table: a peer's run against the engine's, over the same prompts."""

    name: str
    peer: str
    settings: str
    engine: Callable[[int], list[int]] = field(repr=False)  # prompt index -> generated ids
    theirs: Callable[[int], list[int]] = field(repr=False)
    prompts: int
    probes: tuple[list, list] = field(default=([], []), repr=False)  # (engine's, peer's) network modules, for --profile
    engine_seconds: list[float] = field(default_factory=list)
    peer_seconds: list[float] = field(default_factory=list)
    identical: int = 0
    tokens: int = 0

    def summary(self) -> dict:
        ratios = [p / e for e, p in zip(self.engine_seconds, self.peer_seconds)]
        return {
            "row": self.name, "peer": self.peer, "settings": self.settings, "prompts": self.prompts, "identical": self.identical,
            "tokens": self.tokens, "engine_s": statistics.median(self.engine_seconds), "peer_s": statistics.median(self.peer_seconds),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "engine_passes": self.engine_seconds, "peer_passes": self.peer_seconds,
        }


# ---- transformers: DiffusionGemma -----------------------------------------------------------
def gemma_rows(args) -> list[Row]:
    from transformers import DiffusionGemmaForBlockDiffusion, EntropyBoundSamplerConfig

    from engine import GenerationConfig, RunHooks, load_model, run_diffusion
    from engine.pipeline import load_tokenizer, stop_ids_for
    from tinymodel.tasks import split_examples

    folder = Path(args.gemma)
    ours = load_model(folder)
    theirs = DiffusionGemmaForBlockDiffusion.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = load_tokenizer(folder)
    stop = stop_ids_for(ours, tokenizer)
    pad = ours.mask_token_id
    tasks = ["add", "sub", "pairsum"]
    per = -(-args.gemma_prompts // len(tasks))
    by_task = [split_examples([t], "held_out", per) for t in tasks]
    examples = [e for group in zip(*by_task) for e in group][: args.gemma_prompts]
    prompts = [tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    canvas = ours.canvas_length
    gen = -(-args.gemma_gen_length // canvas) * canvas
    options = {"entropy_bound": args.entropy_bound, "max_denoising_steps": args.steps}
    config = GenerationConfig(decoder="uniform", gen_length=gen, block_length=canvas, decoder_options=options)
    settings = dict(max_new_tokens=gen, max_denoising_steps=args.steps, sampler_config=EntropyBoundSamplerConfig(entropy_bound=args.entropy_bound))

    def engine_on(network):
        def engine(i: int) -> list[int]:
            out = run_diffusion(network, [prompts[i]], config.replace(seed=i), stop_ids=stop, hooks=RunHooks())
            return out.canvas[0, len(prompts[i]):].tolist()
        return engine

    def peer(i: int) -> list[int]:
        torch.manual_seed(i)
        ids = theirs.generate(torch.tensor([prompts[i]]), eos_token_id=stop, pad_token_id=pad, **settings)
        ids = ids.sequences if hasattr(ids, "sequences") else ids
        got = ids[0, len(prompts[i]):].tolist()
        return got + [pad] * (gen - len(got))

    label = f"bound {args.entropy_bound:g}, {args.steps} steps, {len(prompts)} prompts, gen {gen}"
    probes = ([ours.hf, ours.model.encoder], [theirs, theirs.model.encoder])  # what each side calls: the whole network, the encoder
    rows = [Row("DiffusionGemma uniform", "transformers generate", label, engine_on(ours), peer, len(prompts), probes)]
    if args.compile:  # the engine's --compile (engine/runtime/compiled.py): the denoiser through torch.compile, compiled in the warm-up
        from engine.runtime.compiled import static_shape_model

        compiled = static_shape_model(ours, compile=True, cuda_graphs=False)
        rows.append(Row("DiffusionGemma uniform, engine --compile", "transformers generate", label, engine_on(compiled), peer, len(prompts), ([], [])))
    return rows


# ---- diffusers: LLaDA2 ----------------------------------------------------------------------
def tiny_llada2(seed: int = 0):
    from engine.models.llada2 import LLaDA2MoeModelLM

    torch.manual_seed(seed)
    model = LLaDA2MoeModelLM(dict(LLADA2_CONFIG))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.normal_(0.0, 0.2)
    return model.eval().requires_grad_(False)


def llada2_rows(args) -> list[Row]:
    import diffusers

    from engine import GenerationConfig, RunHooks, run_diffusion
    from engine.cache import BlockCausalCache
    from engine.reference import DiffusersAdapter

    model = tiny_llada2(args.seed)
    bl, gen, p = args.block_length, args.llada2_gen_length, args.llada2_prompt_length
    if p % bl or gen % bl:
        raise SystemExit(f"--llada2-prompt-length and --llada2-gen-length must be whole blocks of {bl}")
    g = torch.Generator().manual_seed(args.seed)
    specials = {model.mask_token_id, model.eos_token_id}
    vocab = [i for i in range(LLADA2_CONFIG["vocab_size"]) if i not in specials]
    prompts = [[vocab[int(j)] for j in torch.randint(0, len(vocab), (p,), generator=g)] for _ in range(args.llada2_prompts)]
    pipe = diffusers.LLaDA2Pipeline(model=DiffusersAdapter(model, bl), scheduler=diffusers.BlockRefinementScheduler(), tokenizer=None)
    pipe.set_progress_bar_config(disable=True)
    post = args.max_post_steps

    def peer_for(threshold: float, editing: float | None):
        def peer(i: int) -> list[int]:
            with torch.no_grad():
                out = pipe(
                    input_ids=torch.tensor([prompts[i]]), use_chat_template=False, gen_length=gen, block_length=bl, num_inference_steps=gen,
                    temperature=0.0, sampling_method="greedy", threshold=threshold, editing_threshold=editing, max_post_steps=post,
                    eos_early_stop=False, mask_token_id=model.mask_token_id, eos_token_id=model.eos_token_id, output_type="seq",
                )
            return out.sequences[0].tolist()
        return peer

    def engine_for(config: GenerationConfig, network=model):
        config = config.replace(gen_length=gen, block_length=bl, early_stop=False)

        def engine(i: int) -> list[int]:
            out = run_diffusion(network, [prompts[i]], config, hooks=RunHooks())
            return out.canvas[0, p:].tolist()
        return engine

    t, (et, ee) = args.threshold, args.edit
    probes = ([model], [model])  # one network object: the engine calls it, and diffusers through the adapter
    shape = f"prompt {p}, gen {gen}, block {bl}, {len(prompts)} prompts"
    rows = [
        Row("LLaDA2 threshold, prefix cache", "diffusers LLaDA2Pipeline", f"threshold {t:g}; {shape}",
            engine_for(GenerationConfig(decoder="threshold", threshold=t, cache="prefix")), peer_for(t, None), len(prompts), probes),
        Row("LLaDA2 threshold, no cache", "diffusers LLaDA2Pipeline", f"threshold {t:g}; {shape}",
            engine_for(GenerationConfig(decoder="threshold", threshold=t, cache="none")), peer_for(t, None), len(prompts), probes),
        *(Row(f"LLaDA2 edit, {'prefix cache' if cache == 'prefix' else 'no cache'}", "diffusers LLaDA2Pipeline", f"threshold {et:g}, edit {ee:g}; {shape}",
              engine_for(GenerationConfig(decoder="edit", threshold=et, cache=cache, decoder_options={"edit_threshold": ee, "max_post_edit_steps": post})),
              peer_for(et, ee), len(prompts), probes) for cache in reversed(BlockCausalCache.MODES)),  # the exact modes: prefix, none
    ]
    if args.compile:  # the engine's --compile: bucketed static shapes through torch.compile (engine/runtime/compiled.py)
        from engine.runtime.compiled import static_shape_model

        compiled = static_shape_model(model, compile=True, cuda_graphs=False)
        rows.insert(1, Row("LLaDA2 threshold, prefix cache, engine --compile", "diffusers LLaDA2Pipeline", f"threshold {t:g}; {shape}",
                           engine_for(GenerationConfig(decoder="threshold", threshold=t, cache="prefix"), compiled), peer_for(t, None), len(prompts), ([], [])))
    return rows


# ---- the measurement ------------------------------------------------------------------------
# --clock: the wall clock, or this process's CPU seconds (one thread: the work itself)
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def _timed(fn: Callable[[int], list[int]], n: int) -> tuple[float, list[list[int]]]:
    t0 = clock()
    out = [fn(i) for i in range(n)]
    return clock() - t0, out


def measure(rows: list[Row], repeats: int, warmup: int) -> None:
    """Warm-up passes (untimed; the first also compares tokens), then `repeats` interleaved passes."""
    for row in rows:
        mine, theirs = [row.engine(i) for i in range(row.prompts)], [row.theirs(i) for i in range(row.prompts)]
        row.identical = sum(a == b for a, b in zip(mine, theirs))
        row.tokens = sum(len(a) for a in mine)
        for _ in range(max(0, warmup - 1)):
            _timed(row.engine, row.prompts), _timed(row.theirs, row.prompts)
    for k in range(repeats):
        for row in rows:
            sides = [(row.engine, row.engine_seconds), (row.theirs, row.peer_seconds)]
            for fn, into in sides if k % 2 == 0 else sides[::-1]:
                into.append(_timed(fn, row.prompts)[0])


class NetworkTimer:
    """Wall time inside the probed modules' forwards (outermost calls only) and their count."""

    def __init__(self, modules: list) -> None:
        self.modules, self.seconds, self.calls, self.depth = modules, 0.0, 0, 0

    def __enter__(self):
        for m in self.modules:
            inner = m.forward

            def timed(*a, _inner=inner, **k):
                if self.depth:
                    return _inner(*a, **k)
                self.depth += 1
                t0 = clock()
                try:
                    return _inner(*a, **k)
                finally:
                    self.seconds += clock() - t0
                    self.calls += 1
                    self.depth -= 1
            m.forward = timed
        return self

    def __exit__(self, *exc):
        for m in self.modules:
            del m.forward  # the instance attribute set above; the class's forward shows through again


def profile(rows: list[Row], repeats: int) -> list[dict]:
    """Per row and side: forwards per pass, ms per forward, and the seconds outside the network
    (the sampler's own work between forwards), medians of `repeats` interleaved passes."""
    out = []
    for row in rows:
        per_side = {"engine": [], "peer": []}
        for k in range(repeats):
            sides = [("engine", row.engine, row.probes[0]), ("peer", row.theirs, row.probes[1])]
            for name, fn, modules in sides if k % 2 == 0 else sides[::-1]:
                with NetworkTimer(modules) as timer:
                    total = _timed(fn, row.prompts)[0]
                per_side[name].append((total, timer.seconds, timer.calls))
        for name, passes in per_side.items():
            total = statistics.median(p[0] for p in passes)
            network = statistics.median(p[1] for p in passes)
            calls = passes[0][2]
            out.append({"row": row.name, "side": name, "seconds": total, "network_s": network, "forwards": calls,
                        "ms_per_forward": 1000 * network / max(calls, 1), "outside_s": total - network})
    return out


def profile_table(profiles: list[dict]) -> str:
    lines = ["| row | side | s per pass | forwards per pass | ms per forward | s in the network | s outside it (share) |", "|---|---|---|---|---|---|---|"]
    for p in profiles:
        lines.append(f"| {p['row']} | {p['side']} | {p['seconds']:.3f} | {p['forwards']} | {p['ms_per_forward']:.2f} | {p['network_s']:.3f} | "
                     f"{p['outside_s']:.3f} ({p['outside_s'] / p['seconds']:.0%}) |")
    return "\n".join(lines)


def table(summaries: list[dict]) -> str:
    lines = ["| row | peer | settings | tokens identical | engine s (median) | peer s (median) | engine / peer speed (median, range) |",
             "|---|---|---|---|---|---|---|"]
    for s in summaries:
        same = f"{'yes' if s['identical'] == s['prompts'] else 'no'} ({s['identical']}/{s['prompts']})"
        lines.append(f"| {s['row']} | {s['peer']} | {s['settings']} | {same} | {s['engine_s']:.3f} | {s['peer_s']:.3f} | "
                     f"{s['ratio']:.2f}x ({s['ratio_min']:.2f}-{s['ratio_max']:.2f}) |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", default="transformers,diffusers", help="which peers: transformers, diffusers or both")
    ap.add_argument("--gemma", default=str(GEMMA), help="the DiffusionGemma checkpoint (default: the embedded tiny-gemma)")
    ap.add_argument("--gemma-prompts", type=int, default=10, help="held-out prompts (add, sub, pair-sum in turn)")
    ap.add_argument("--gemma-gen-length", type=int, default=16, help="tokens to generate (whole canvases; longer = more canvases)")
    ap.add_argument("--compile", action="store_true", help="add a row with the engine's --compile (its denoiser through torch.compile; compiles in the warm-up, minutes on a CPU)")
    ap.add_argument("--entropy-bound", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=16, help="max_denoising_steps per canvas")
    ap.add_argument("--llada2-prompts", type=int, default=3, help="random prompts for the LLaDA2 rows")
    ap.add_argument("--llada2-prompt-length", type=int, default=64)
    ap.add_argument("--llada2-gen-length", type=int, default=64)
    ap.add_argument("--block-length", type=int, default=8)
    ap.add_argument("--threshold", type=float, default=0.7)
    ap.add_argument("--edit", type=float, nargs=2, default=(0.5, 0.3), metavar=("THRESHOLD", "EDIT"))
    ap.add_argument("--max-post-steps", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1, help="the random LLaDA2's weights and prompts (seed 0: one edit run cycles to the post-edit bound, where the two rules differ)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="wall seconds, or this process's CPU seconds (a shared machine)")
    ap.add_argument("--profile", action="store_true", help="also time the network's forwards on each side (another set of interleaved passes)")
    ap.add_argument("--json", help="write the summaries here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    global clock
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    peers = {p.strip() for p in args.peers.split(",") if p.strip()}
    if not peers or peers - {"transformers", "diffusers"}:
        print("--peers takes transformers, diffusers or both", file=sys.stderr)
        return 2
    rows = (gemma_rows(args) if "transformers" in peers else []) + (llada2_rows(args) if "diffusers" in peers else [])
    with torch.inference_mode():
        measure(rows, args.repeats, args.warmup)
    summaries = [r.summary() for r in rows]
    print(table(summaries))
    profiles = None
    if args.profile:
        with torch.inference_mode():
            profiles = profile(rows, args.repeats)
        print()
        print(profile_table(profiles))
    if args.json:
        doc = {"arguments": vars(args) | {"edit": list(args.edit)}, "rows": summaries, "profile": profiles}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
