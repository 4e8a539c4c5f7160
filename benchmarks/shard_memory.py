"""What one rank holds when it reads only its shard (docs/scaling.md): measured on a tiny MoE,
projected for LLaDA2.0-flash.

    python -m benchmarks.shard_memory --repeats 3

Measured: a random LLaDA-MoE checkpoint (save_model's stacked-expert layout; tests/test_shard_loading.py
covers the per-expert one too) is loaded as one rank of TP=1, TP=2 and EP=2, each rank in a fresh process (`load_shard`, engine/runtime/parallel.py), `--repeats` times. Per
rank: the bytes of the tensors it loaded and the bytes it read from the files (counted at the
safetensors slice reads), and its peak resident memory (VmHWM) above what the process held
before loading (Python, torch, the engine, one model built on the meta device), medians; each also as a ratio to TP=1 in the same run.

Projected: LLaDA2.0-flash's published config.json, built on the meta device (no weights) and cut
by the same rule (`shard_model` on the skeleton): parameters and bf16 bytes per rank (routers in
fp32, as loaded) for each degree the model takes.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch

from engine import save_model
from engine.cli import OneLineParser
from engine.errors import EngineError
from engine.models import LLaDA2MoeModelLM, LLaDAMoEModelLM, model_skeleton
from engine.models import loader
from engine.runtime.parallel import load_shard, shard_model

# the layouts measured: name -> (tp, ep); every rank of each is loaded
LAYOUTS = {"TP=1": (1, 1), "TP=2": (2, 1), "EP=2": (1, 2)}
# LLaDA2.0-flash (inclusionAI's published config.json): the fields the family reads
FLASH_CONFIG = dict(
    model_type="llada2_moe", architectures=["LLaDA2MoeModelLM"], num_hidden_layers=32, hidden_size=4096, intermediate_size=9216,
    first_k_dense_replace=1, moe_intermediate_size=1024, num_experts=256, num_experts_per_tok=8, num_shared_experts=1,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, partial_rotary_factor=0.5, rope_theta=600000, rope_scaling=None,
    vocab_size=157184, max_position_embeddings=16384, norm_topk_prob=True, n_group=8, topk_group=4, routed_scaling_factor=2.5,
    score_function="sigmoid", moe_router_enable_expert_bias=True, use_qkv_bias=False, use_bias=False, tie_word_embeddings=False,
    rms_norm_eps=1e-6, pad_token_id=156892,
)
# (tp, ep) per rank count: LLaDA2.0-flash's 4 KV heads cap TP at 4; its 256 experts take EP up to 256
FLASH_DEGREES = [(1, 1), (2, 1), (4, 1), (1, 2), (1, 4), (1, 8), (4, 4)]
GIB = 2**30


def tiny_moe(folder: Path, layers: int, experts: int) -> Path:
    """A random LLaDA-MoE, wide enough that a row of each weight spans whole memory pages (hidden
    and expert width 2048, fp32: 8 KiB rows), so that a rank reading half of every row touches
    half of the file's pages (a narrower row shares its pages between the ranks' halves)."""
    torch.manual_seed(0)
    config = dict(
        model_type="llada", architectures=["LLaDAMoEModelLM"], hidden_size=2048, num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=8, num_experts=experts, num_experts_per_tok=2, expert_intermediate_size=2048, qk_layernorm=True,
        rope_theta=10000.0, vocab_size=512, mask_token_id=511, eos_token_id=510,
    )
    return save_model(LLaDAMoEModelLM(config).eval(), folder)


class _CountedSlice:
    def __init__(self, inner: Any, counter: dict[str, int]) -> None:
        self.inner, self.counter = inner, counter

    def get_shape(self) -> list[int]:
        return self.inner.get_shape()

    def __getitem__(self, index: Any) -> torch.Tensor:
        t = self.inner[index]
        self.counter["bytes"] += t.numel() * t.element_size()
        return t


class _CountedFile:
    """A safetensors handle whose slice reads add up their bytes. It has no `get_tensor`: a whole
    read bypassing the slices fails rather than going uncounted."""

    def __init__(self, inner: Any, counter: dict[str, int]) -> None:
        self.inner, self.counter = inner, counter

    def __enter__(self) -> "_CountedFile":
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.__exit__(*exc)

    def keys(self) -> list[str]:
        return self.inner.keys()

    def get_slice(self, name: str) -> _CountedSlice:
        return _CountedSlice(self.inner.get_slice(name), self.counter)


@contextlib.contextmanager
def counting_reads() -> Iterator[dict[str, int]]:
    """While inside: every safetensors file the loader opens counts the bytes its slices read
    into the yielded dict's "bytes" (the loader reads a tensor only through slices)."""
    counter = {"bytes": 0}
    opened = loader._open_safetensors
    loader._open_safetensors = lambda file: _CountedFile(opened(file), counter)
    try:
        yield counter
    finally:
        loader._open_safetensors = opened


def _memory(field: str) -> int:
    """A /proc/self/status figure in bytes: VmRSS (resident now) or VmHWM (its peak). Not
    ru_maxrss, which a child started by fork and exec inherits from its parent."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise EngineError(f"/proc/self/status has no {field} (this benchmark needs Linux)")


def _child(folder: str, tp: int, ep: int, rank: int) -> None:
    """In a fresh process: load one rank's shard and print what it cost, as JSON."""
    torch.set_num_threads(1)
    model_skeleton(folder)  # the first model built costs the same in every layout (torch's own set-up): not counted
    start = _memory("VmRSS")
    with counting_reads() as read:
        model = load_shard(folder, "cpu", None, tp, ep, rank, max(tp, ep))
    state = model.state_dict()
    for t in state.values():  # touch every weight, as a forward would: a tensor may be a view of the mmap'd file
        t.sum()
    held = sum(t.numel() * t.element_size() for t in state.values())
    print(json.dumps({"held": held, "read": read["bytes"], "peak_above_start": _memory("VmHWM") - start}))


def measure(folder: Path, repeats: int) -> list[dict]:
    """One row per (layout, rank): the medians over `repeats` fresh processes."""
    rows = []
    for layout, (tp, ep) in LAYOUTS.items():
        for rank in range(max(tp, ep)):
            runs = []
            for _ in range(repeats):
                argv = [sys.executable, "-m", "benchmarks.shard_memory", "--child", str(folder), str(tp), str(ep), str(rank)]
                done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parent.parent)
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            rows.append({"layout": layout, "rank": rank, **{k: statistics.median(r[k] for r in runs) for k in runs[0]}})
    return rows


def flash_projection() -> list[dict]:
    """Rank 0's parameters and bytes for each degree (every rank of a layout holds as many)."""
    rows = []
    for tp, ep in FLASH_DEGREES:
        with torch.device("meta"):
            model = LLaDA2MoeModelLM(dict(FLASH_CONFIG))
        if max(tp, ep) > 1:
            shard_model(model, tp, ep, rank=0, world=max(tp, ep))
        state = model.state_dict()
        params = sum(t.numel() for t in state.values())
        nbytes = sum(t.numel() * (4 if name.endswith(LLaDA2MoeModelLM.fp32_suffixes) else 2) for name, t in state.items())
        rows.append({"tp": tp, "ep": ep, "params": params, "bytes": nbytes})
    return rows


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        folder, tp, ep, rank = sys.argv[2:6]
        _child(folder, int(tp), int(ep), int(rank))
        return 0
    parser = OneLineParser(prog="python -m benchmarks.shard_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=8)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_moe(Path(tmp), args.layers, args.experts)
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        rows = measure(folder, args.repeats)
    print(f"tiny LLaDA-MoE: {args.layers} layers, {args.experts} experts, fp32, {size / 2**20:.0f} MiB of safetensors; "
          f"each rank in a fresh process, median of {args.repeats}\n")
    print("| layout | rank | tensors loaded (MiB) | × TP=1 | bytes read (MiB) | × TP=1 | peak RSS above start (MiB) | × TP=1 |")
    print("|---|---|---|---|---|---|---|---|")
    base = rows[0]
    for r in rows:
        cells = [f"{r[k] / 2**20:.1f} | {r[k] / base[k]:.2f}" for k in ("held", "read", "peak_above_start")]
        print(f"| {r['layout']} | {r['rank']} | " + " | ".join(cells) + " |")
    print("\nLLaDA2.0-flash (its config.json on the meta device, cut by the same rule): per rank, bf16 (routers fp32)\n")
    print("| TP | EP | processes | parameters per rank (B) | GiB per rank | × one process |")
    print("|---|---|---|---|---|---|")
    flash = flash_projection()
    for r in flash:
        print(f"| {r['tp']} | {r['ep']} | {max(r['tp'], r['ep'])} | {r['params'] / 1e9:.2f} | {r['bytes'] / GIB:.1f} | {r['bytes'] / flash[0]['bytes']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
