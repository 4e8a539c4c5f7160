"""GPU check on real model shapes with random weights: cache correctness, forward time per cache
mode against the memory-bandwidth floor, the dual forward behind static shapes, and a full generate
on a fixed schedule.

    benchmarks/gpu_check.sh                      # CUDA: LLaDA-8B and LLaDA-MoE-7B-A1B shapes, bf16
    python -m benchmarks.gpu_check --tiny        # CPU: the same steps at tiny shapes, fp32 (CI)

The DiffusionGemma-26B-A4B step (one denoising forward against its floor, projected tok/s beside
vLLM's): benchmarks/gpu_check_gemma.py.

The four steps, their tolerances and the bandwidth used: docs/performance.md §4; the floor's model
(the weights and routed experts a forward touches, the cached and fresh K/V; embedding lookups and
activations ignored): §1.1-1.2. Models are built on the meta device, then materialised on the
target and filled with N(0, 0.02), so nothing is downloaded and nothing large is initialised on the
host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from engine.hooks import RunHooks
from engine.cache import DUAL, FULL, PREFIX, WINDOW, ForwardPlan, KVCacheManager
from engine.cache_modes import cache_mode_names
from engine.runtime.compiled import CompiledLM
from engine.config import GenerationConfig
from engine.errors import EngineError
from engine import run_diffusion
from engine.models import DiffusionLM, ModelOutput, model_class
from engine.models.moe import SparseMoE

from . import gpu_check_gemma, machine

# Published shapes (docs/algorithms.md §6.1-6.2, docs/performance.md §2.1).
LLADA_8B = dict(
    model_type="llada", d_model=4096, n_heads=32, n_kv_heads=32, n_layers=32, mlp_hidden_size=12288,
    vocab_size=126464, embedding_size=126464, rope_theta=500000.0, mask_token_id=126336, eos_token_id=126081,
)
LLADA_MOE_7B = dict(
    model_type="llada", hidden_size=2048, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
    num_experts=64, num_experts_per_tok=8, expert_intermediate_size=1024, vocab_size=157184, rope_theta=50000.0,
    qk_layernorm=True, mask_token_id=156895, eos_token_id=156892,
)
TINY_LLADA = dict(LLADA_8B, d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=96, vocab_size=128,
                  embedding_size=128, mask_token_id=127, eos_token_id=126)
TINY_MOE = dict(LLADA_MOE_7B, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                num_experts=8, num_experts_per_tok=2, expert_intermediate_size=32, vocab_size=128,
                mask_token_id=127, eos_token_id=126)
SHAPES = {"llada-8b": (LLADA_8B, TINY_LLADA), "llada-moe-7b-a1b": (LLADA_MOE_7B, TINY_MOE)}
GEMMA = "diffusion-gemma-26b-a4b"  # its own step (benchmarks/gpu_check_gemma.py); --tiny: tiny-gemma's shapes

# name fragment -> (bytes/s, bf16 FLOP/s), dense peaks from the data sheets
NOMINAL = {"H200": (4.8e12, 989e12), "H100": (3.35e12, 989e12)}
# Relative L2 error of the block logits. bf16 measured ~0.8% at 8 layers (CPU, d=1024); a wrong
# position, merge or RoPE order gives errors of order 1, a stale cache several percent in fp32.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 2e-2}
# canvas and timing: the dInfer-like case of docs/performance.md §2.2 on a GPU; seconds of work with --tiny
FULL_DEFAULTS = dict(prompt_length=512, gen_length=256, block_length=32, repeats=20)
TINY_DEFAULTS = dict(prompt_length=24, gen_length=16, block_length=8, repeats=5)
MODES = (("full", "none"), ("refresh", "dual"), ("prefix", "prefix"), ("dual", "dual"), ("window", "vicinity"))
# --static variants: name -> (compile, cuda_graphs) of engine/runtime/compiled.py's CompiledLM
STATIC = {"eager": (False, False), "compile": (True, False), "graphs": (False, True), "compile+graphs": (True, True)}


def build(config: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int = 0) -> DiffusionLM:
    """A model of the family `config` names, random N(0, 0.02) matrices and unit norms, on `device`."""
    cls = model_class(config)
    with torch.device("meta"):
        model = cls(config)
    model = model.to(dtype).to_empty(device=device)
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(cls.fp32_suffixes):
                p.data = p.data.float()
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=generator)
    return model.eval().requires_grad_(False)


@dataclass(frozen=True)
class Shape:
    """What the floor needs to know of a model."""

    layers: int
    attn_dim: int  # heads x head_dim
    kv_dim: int
    dense_params: int  # read by every forward, the embedding table excluded (a lookup)
    expert_params: int  # of one expert, summed over the layers; 0 for a dense model
    experts: int
    top_k: int
    element_bytes: int

    @classmethod
    def of(cls, model: DiffusionLM) -> "Shape":
        cfg = model.config
        layers = cfg.get("n_layers") or cfg["num_hidden_layers"]
        d = cfg.get("d_model") or cfg["hidden_size"]
        heads = cfg.get("n_heads") or cfg["num_attention_heads"]
        kv_heads = cfg.get("n_kv_heads") or cfg.get("num_key_value_heads") or heads
        moes = [m for m in model.modules() if isinstance(m, SparseMoE)]
        expert_ids = {id(p) for m in moes for p in (m.w1, m.w2)}
        embedding = model.embedding_weight()
        # the embedding table is only looked up, unless it is also the output head
        tied = bool(cfg.get("weight_tying") or cfg.get("tie_word_embeddings"))
        dense = sum(p.numel() for p in model.parameters() if id(p) not in expert_ids and (p is not embedding or tied))
        return cls(
            layers=layers,
            attn_dim=d,
            kv_dim=kv_heads * d // heads,
            dense_params=dense,
            expert_params=sum(m.w1[0].numel() + m.w2[0].numel() for m in moes),
            experts=moes[0].num_experts if moes else 0,
            top_k=moes[0].gate.top_k if moes else 0,
            element_bytes=embedding.element_size(),
        )

    def distinct_experts(self, tokens: int) -> float:
        """Expected experts hit per layer by `tokens` tokens under uniform top-k routing."""
        return self.experts * (1 - (1 - self.top_k / self.experts) ** tokens) if self.experts else 0.0

    def floor(self, query: int, keys: int, cached: int, stores: bool, bandwidth: float, flops: float | None) -> dict[str, float]:
        """Bytes, FLOPs and the floor (s) of one forward of `query` tokens attending to `keys` keys,
        `cached` of them read from the cache; `stores`: its fresh K/V are written (all but a full forward)."""
        weights = (self.dense_params + self.distinct_experts(query) * self.expert_params) * self.element_bytes
        kv = (cached + (query if stores else 0)) * self.layers * 2 * self.kv_dim * self.element_bytes
        active = self.dense_params + self.top_k * self.expert_params  # parameters one token uses
        work = 2 * active * query + 4 * self.layers * query * keys * self.attn_dim
        seconds = (weights + kv) / bandwidth
        if flops:
            seconds = max(seconds, work / flops)
        return {"bytes": weights + kv, "flops": work, "floor_s": seconds}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def back_to_back(fn: Callable[[], Any], device: torch.device, repeats: int) -> tuple[float, float | None]:
    """`repeats` calls queued without a sync: seconds per call, and on CUDA the median device gap
    (s) between one call's end and the next one's start (events recorded around each call)."""
    marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)] if device.type == "cuda" else []
    synchronize(device)
    start = time.perf_counter()
    for i in range(repeats):
        if marks:
            marks[i][0].record()
        fn()
        if marks:
            marks[i][1].record()
    synchronize(device)
    seconds = (time.perf_counter() - start) / repeats
    gaps = [marks[i][1].elapsed_time(marks[i + 1][0]) / 1e3 for i in range(len(marks) - 1)]
    return seconds, statistics.median(gaps) if gaps else None


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a device-to-device copy, read and write both counted (docs/performance.md §4: the measured copy bandwidth)."""
    n = (1 << 30) if device.type == "cuda" else (1 << 26)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * n / median_seconds(lambda: dst.copy_(src), device, repeats=10)


def canvas(model: DiffusionLM, prompt_length: int, gen_length: int, decoded: int, device: torch.device) -> torch.Tensor:
    """Random non-special prompt tokens, `decoded` random tokens (a block under way), then masks."""
    generator = torch.Generator().manual_seed(1)
    vocab = min(model.mask_token_id, model.eos_token_id)  # the special ids sit at the top of both vocabularies
    x = torch.full((1, prompt_length + gen_length), model.mask_token_id, dtype=torch.long)
    x[0, : prompt_length + decoded] = torch.randint(0, vocab, (prompt_length + decoded,), generator=generator)
    return x.to(device)


def cache_config(mode: str, gen_length: int, block_length: int) -> GenerationConfig:
    return GenerationConfig(gen_length=gen_length, block_length=block_length, cache=mode, warmup=0)


@dataclass(frozen=True)
class BlockBench:
    """One block's forwards to time on one model: the canvas, the block, the generation settings
    the cache plans follow, and what the floor compares against."""

    model: DiffusionLM
    x: torch.Tensor
    block: tuple[int, int]
    gen_length: int
    block_length: int
    repeats: int
    bandwidth: float
    flops: float | None
    device: torch.device


def block_forwards(b: BlockBench) -> list[dict[str, Any]]:
    """Correctness of each cached mode against the uncached forward, then ms per forward per mode."""
    model, x, (s, e), repeats, device = b.model, b.x, b.block, b.repeats, b.device
    gen_length, block_length, bandwidth, flops = b.gen_length, b.block_length, b.bandwidth, b.flops
    n = x.shape[1]
    shape = Shape.of(model)
    exact = model(input_ids=x).logits[:, s:e].float()
    rows = []
    for label, mode in MODES:
        manager = KVCacheManager(cache_config(mode, gen_length, block_length), n)
        first = manager.plan(0, 0, s, e)
        manager.forward(model, first, 0, input_ids=x[:, first.start : first.end])
        plan = first if label in ("full", "refresh") else manager.plan(1, 0, s, e)

        def run(manager: KVCacheManager = manager, plan: ForwardPlan = plan) -> ModelOutput:
            return manager.forward(model, plan, 0, input_ids=x[:, plan.start : plan.end])

        logits = run().logits[:, s - plan.start : e - plan.start].float()
        error = float((logits - exact).norm() / exact.norm())
        agree = float((logits.argmax(-1) == exact.argmax(-1)).float().mean())
        seconds = median_seconds(run, device, repeats)
        query = plan.end - plan.start
        cached = n - query if plan.uses_cache else 0
        floor = shape.floor(query, n, cached, plan.kind != FULL, bandwidth, flops)
        rows.append(
            {"mode": label, "kind": plan.kind, "query": query, "ms": 1e3 * seconds, "floor_ms": 1e3 * floor["floor_s"],
             "x_floor": seconds / floor["floor_s"], "gb": floor["bytes"] / 1e9, "rel_error": error, "top1_agree": agree}
        )
    return rows


def static_forwards(b: BlockBench, variants: list[str]) -> list[dict[str, Any]]:
    """The dual forward plain and behind static shapes: first call, ms per forward (synchronised
    and back to back), device gap between forwards, error against the plain logits."""
    model, x, (s, e), repeats, device = b.model, b.x, b.block, b.repeats, b.device
    gen_length, block_length, bandwidth, flops = b.gen_length, b.block_length, b.bandwidth, b.flops
    n = x.shape[1]
    manager = KVCacheManager(cache_config("dual", gen_length, block_length), n)
    manager.forward(model, manager.plan(0, 0, s, e), 0, input_ids=x)  # the refresh: the store
    plan = manager.plan(1, 0, s, e)
    query = plan.end - plan.start
    plain = manager.forward(model, plan, 0, input_ids=x[:, plan.start : plan.end]).logits.float()
    floor = Shape.of(model).floor(query, n, n - query, True, bandwidth, flops)["floor_s"]
    rows = []
    for name in variants:
        runner = model if name == "eager" else CompiledLM(model, *STATIC[name])

        def run(runner: DiffusionLM = runner) -> ModelOutput:
            return manager.forward(runner, plan, 0, input_ids=x[:, plan.start : plan.end])

        synchronize(device)
        start = time.perf_counter()
        logits = run().logits.float()
        synchronize(device)
        first = time.perf_counter() - start
        seconds = median_seconds(run, device, repeats)
        queued, gap = back_to_back(run, device, repeats)
        rows.append(
            {"variant": name, "query": query, "first_call_s": first, "ms": 1e3 * seconds, "x_floor": seconds / floor,
             "queued_ms": 1e3 * queued, "gap_ms": None if gap is None else 1e3 * gap,
             "rel_error": float((logits - plain).norm() / plain.norm())}
        )
    return rows


def full_generate(
    model: DiffusionLM,
    prompt: list[int],
    gen_length: int,
    block_length: int,
    tokens_per_step: int,
    bandwidth: float,
    flops: float | None,
) -> list[dict[str, Any]]:
    """Generate on the fixed schedule per cache mode: first traced (warm-up, and the forwards that
    ran, for the floor), then timed untraced. The schedule depends on no value, so both runs issue
    the same forwards."""
    shape = Shape.of(model)
    rows = []
    for mode in cache_mode_names():
        config = GenerationConfig(
            gen_length=gen_length, block_length=block_length, decoder="fixed", steps=gen_length // tokens_per_step,
            cache=mode, early_stop=False, use_chat_template=False,
        )
        traced = run_diffusion(model, [prompt], config, hooks=RunHooks(trace=True))
        n = traced.trace.canvas_length
        floor = 0.0
        for rec in traced.trace.iterations:
            a, b = rec.recomputed[0]
            cached = n - (b - a) if rec.forward in (PREFIX, DUAL, WINDOW) else 0
            floor += shape.floor(b - a, n, cached, rec.forward != FULL, bandwidth, flops)["floor_s"]
        timed = run_diffusion(model, [prompt], config).stats
        rows.append(
            {"cache": mode, "nfe": timed.nfe, "tokens": timed.tokens, "tpf": timed.tpf, "tps": timed.tps,
             "ms_per_forward": 1e3 * timed.seconds / timed.nfe, "floor_tps": timed.tokens / floor, "x_floor": timed.seconds / floor}
        )
    return rows


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """Markdown table; `columns` are (header, key, format spec); a None value shows as n/a."""
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join("n/a" if r[key] is None else format(r[key], spec) for _, key, spec in columns) + " |")
    return "\n".join(lines)


BLOCK_COLUMNS = [
    ("mode", "mode", ""), ("forward", "kind", ""), ("query tokens", "query", ""), ("ms (median)", "ms", ".3f"),
    ("floor ms", "floor_ms", ".3f"), ("x floor", "x_floor", ".2f"), ("GB read", "gb", ".3f"),
    ("rel. error vs uncached", "rel_error", ".2e"), ("top-1 agree", "top1_agree", ".3f"),
]
STATIC_COLUMNS = [
    ("dual forward", "variant", ""), ("query tokens", "query", ""), ("first call s", "first_call_s", ".2f"),
    ("ms (median)", "ms", ".3f"), ("x floor", "x_floor", ".2f"), ("ms back to back", "queued_ms", ".3f"),
    ("gap between forwards ms", "gap_ms", ".3f"), ("rel. error vs plain", "rel_error", ".2e"),
]
GENERATE_COLUMNS = [
    ("cache", "cache", ""), ("NFE", "nfe", ""), ("tokens", "tokens", ""), ("TPF", "tpf", ".2f"), ("TPS", "tps", ".1f"),
    ("ms/forward", "ms_per_forward", ".3f"), ("floor TPS", "floor_tps", ".1f"), ("x floor", "x_floor", ".2f"),
]


def check_model(name: str, config: dict[str, Any], args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
                bandwidth: float, flops: float | None) -> dict[str, Any]:
    start = time.perf_counter()
    model = build(config, device, dtype)
    built = time.perf_counter() - start
    x = canvas(model, args.prompt_length, args.gen_length, args.block_length // 2, device)
    block = (args.prompt_length, args.prompt_length + args.block_length)
    with torch.inference_mode():
        bench = BlockBench(model, x, block, args.gen_length, args.block_length, args.repeats, bandwidth, flops, device)
        blocks = block_forwards(bench)
        static = static_forwards(bench, args.static)
        prompt = x[0, : args.prompt_length].tolist()
        generates = full_generate(model, prompt, args.gen_length, args.block_length, args.tokens_per_step, bandwidth, flops)
    params = sum(p.numel() for p in model.parameters())
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    tolerance = TOLERANCE[dtype]
    failures = [r["mode"] for r in blocks if not r["rel_error"] < tolerance] + [r["variant"] for r in static if not r["rel_error"] < tolerance]
    return {"model": name, "params": params, "build_s": built, "tolerance": tolerance, "failures": failures,
            "block_forward": blocks, "static_forward": static, "generate": generates}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU by default, fp32)")
    parser.add_argument("--device", default=None, help="default: cuda, or cpu with --tiny")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None, help="default: bf16, or fp32 with --tiny")
    parser.add_argument("--models", default=",".join([*SHAPES, GEMMA]), help="comma-separated: " + ", ".join([*SHAPES, GEMMA]))
    parser.add_argument("--prompt-length", type=int, default=None)
    parser.add_argument("--gen-length", type=int, default=None)
    parser.add_argument("--block-length", type=int, default=None)
    parser.add_argument("--tokens-per-step", type=int, default=4, help="fixed schedule of the full generate")
    parser.add_argument("--repeats", type=int, default=None, help="timed forwards per mode (median)")
    parser.add_argument("--bandwidth", type=float, default=None, help="bytes/s for the floor (default: nominal, else measured copy)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--static", default=None, help="comma-separated dual-forward variants: " + ", ".join(STATIC)
                        + " (default: all on CUDA, none on the CPU; graphs need CUDA)")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    if args.static is None:
        args.static = ",".join(STATIC) if device.type == "cuda" else ""
    args.static = [v.strip() for v in args.static.split(",") if v.strip()]
    bad = [v for v in args.static if v not in STATIC or (STATIC[v][1] and device.type != "cuda")]
    if bad:
        print(f"error: --static {bad[0]}: " + ("CUDA graphs need a CUDA device" if bad[0] in STATIC else f"choose from {', '.join(STATIC)}"), file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype or ("float32" if args.tiny else "bfloat16"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here; run with --tiny for the CPU check", file=sys.stderr)
        return 2
    for key, value in (TINY_DEFAULTS if args.tiny else FULL_DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in SHAPES and m != GEMMA]
    if unknown or args.gen_length % args.block_length or args.block_length % args.tokens_per_step:
        print(f"error: unknown model {unknown[0]}" if unknown else
              "error: gen_length must divide by block_length, and block_length by tokens_per_step", file=sys.stderr)
        return 2
    info = machine.describe(device)
    nominal = next((v for k, v in NOMINAL.items() if k in info.get("gpu", "")), None)
    measured = copy_bandwidth(device)
    bandwidth = args.bandwidth or (nominal[0] if nominal else measured)
    flops = nominal[1] if nominal else None
    print(f"{machine.one_line(info)}; {dtype}")
    print(f"bandwidth for the floor {bandwidth / 1e12:.3f} TB/s ({'nominal' if nominal and not args.bandwidth else 'given' if args.bandwidth else 'measured copy'}); "
          f"measured copy {measured / 1e12:.3f} TB/s; compute peak {'%.0f TFLOP/s' % (flops / 1e12) if flops else 'not used'}")
    print(f"canvas: prompt {args.prompt_length} + gen {args.gen_length}, block {args.block_length}, "
          f"{args.tokens_per_step} tokens per step in the generate")
    results = []
    for name in names:
        if name == GEMMA:
            result = gpu_check_gemma.check_gemma(name, args.tiny, device, dtype, bandwidth, args.prompt_length,
                                                 lambda fn: median_seconds(fn, device, args.repeats))
            results.append(result)
            verdict = "OK" if not result["failures"] else "FAILED: " + ", ".join(result["failures"])
            print(f"\n## {name}: {result['params'] / 1e6:,.1f}M parameters, built in {result['build_s']:.1f}s; "
                  f"one denoising step's decoder forward, {result['steps']} steps per canvas: {verdict}")
            print(_table([result], gpu_check_gemma.GEMMA_COLUMNS))
            continue
        config = SHAPES[name][1 if args.tiny else 0]
        try:
            result = check_model(name, config, args, device, dtype, bandwidth, flops)
        except EngineError as exc:  # a family not available in this build
            print(f"\n## {name}: skipped ({exc})")
            results.append({"model": name, "skipped": str(exc)})
            continue
        results.append(result)
        verdict = "OK" if not result["failures"] else "FAILED: " + ", ".join(result["failures"])
        print(f"\n## {name}: {result['params'] / 1e6:,.1f}M parameters, built in {result['build_s']:.1f}s; "
              f"cached vs uncached logits (tolerance {result['tolerance']:g}): {verdict}")
        print(_table(result["block_forward"], BLOCK_COLUMNS))
        if result["static_forward"]:
            print()
            print(_table(result["static_forward"], STATIC_COLUMNS))
        print()
        print(_table(result["generate"], GENERATE_COLUMNS))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "dtype": str(dtype), "bandwidth": bandwidth,
                                               "measured_copy_bandwidth": measured, "arguments": vars(args),
                                               "results": results}, indent=2) + "\n")
    failed = any(r.get("failures") for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
