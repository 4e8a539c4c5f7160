"""Tensor and expert parallelism over torch.distributed (docs/algorithms.md §6.4).

One process per device (an Engine's worker processes, engine/runtime/workers.py, or torchrun's,
engine/runtime/launch.py; NCCL on GPUs, gloo on CPU). Every rank reads only its shard from the
checkpoint (`load_shard`: its slices of the safetensors files, docs/scaling.md) and runs the same
decoding loop: the embedding, the norms, the routers and the lm_head are replicated, so every
rank sees identical logits and makes identical decisions with no broadcast of the canvas
(docs/algorithms.md §8 item 14).

- Tensor parallel (`tp` = the number of processes): the attention's q/k/v projections are
  column-parallel (each rank computes `heads/tp` query heads and `kv_heads/tp` KV heads; LLaDA2's
  fused `query_key_value` splits its q, k and v rows separately), the output projection is
  row-parallel followed by an all-reduce; MLPs likewise (gate/up column, down row). Without
  expert parallelism each MoE expert is split the same way along its hidden units.
- Expert parallel (`ep` = the number of processes, MoE models): each rank holds `E/ep` whole
  experts, routes every token with the replicated router, computes its experts' share and
  all-reduces the partial sums (no all-to-all). Shared experts stay replicated unless `tp` splits
  them too.

Each layer then costs two all-reduces (three where a split shared expert adds its own).
The per-family split is a plan keyed by the model class, so the model files stay single-device;
`shard_cuts` is the one rule for which slice of each split tensor a rank keeps, applied to the
checkpoint's slices by the loader (`load_shard`) and to a model in memory by `shard_model`.

Every all-reduce goes through `all_reduce`, which times itself into `COMM` (this process's clock:
the iteration manager reads it around each forward through `DiffusionLM.comm_seconds`). Under
torch.compile it is a custom op, so the compiler keeps it as one opaque node of the forward's graph
(no graph break) and its time is still measured when the compiled forward runs; eager forwards call
the sum directly (a custom op's first call imports torch._dynamo: a second of CPU in every rank).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from ..errors import EngineError
from ..models import load_model
from ..models.base import DiffusionLM
from ..models.llada import LLaDAModelLM
from ..models.llada2 import LLaDA2MoeModelLM
from ..models.llada_moe import LLaDAMoEModelLM
from ..models.loader import Cut
from ..models.moe import SparseMoE

COLUMN, ROW, QKV = "column", "row", "qkv"


@dataclass(frozen=True)
class TensorParallelPlan:
    """Which child linears of the modules under `scope` split how (by their attribute name)."""

    scope: str
    linears: dict[str, str]


# Attention owners carry `n_heads`/`n_kv_heads`/`head_dim`; the lm_head sits outside every scope.
PLANS: dict[type[DiffusionLM], TensorParallelPlan] = {
    LLaDAModelLM: TensorParallelPlan(
        "model.transformer.blocks.",
        {"q_proj": COLUMN, "k_proj": COLUMN, "v_proj": COLUMN, "attn_out": ROW, "ff_proj": COLUMN, "up_proj": COLUMN, "ff_out": ROW},
    ),
    LLaDAMoEModelLM: TensorParallelPlan(
        "model.layers.", {"q_proj": COLUMN, "k_proj": COLUMN, "v_proj": COLUMN, "o_proj": ROW}
    ),
    LLaDA2MoeModelLM: TensorParallelPlan(
        "model.layers.",
        {"query_key_value": QKV, "dense": ROW, "gate_proj": COLUMN, "up_proj": COLUMN, "down_proj": ROW},
    ),
}


class CommClock:
    """The time this process has spent in all-reduces: wall time on the CPU (gloo's all-reduce
    returns when done, waiting for the slowest rank included), CUDA events on a GPU (NCCL's is
    asynchronous, so the host's clock would see only the launch)."""

    def __init__(self) -> None:
        self._seconds = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def timed(self, device: torch.device) -> Iterator[None]:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end))
            return
        start_s = time.perf_counter()
        yield
        self._seconds += time.perf_counter() - start_s

    def seconds(self) -> float:
        """The running total; on CUDA it waits for the all-reduces timed so far to finish."""
        for start, end in self._events:
            end.synchronize()
            self._seconds += start.elapsed_time(end) / 1000
        self._events.clear()
        return self._seconds


COMM = CommClock()


def _summed(t: torch.Tensor) -> torch.Tensor:
    out = t.clone()
    with COMM.timed(out.device):
        dist.all_reduce(out)
    return out


@torch.library.custom_op("dinfer_viz::all_reduce", mutates_args=())
def _compiled_all_reduce(t: torch.Tensor) -> torch.Tensor:
    return _summed(t)


@_compiled_all_reduce.register_fake
def _(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t)


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """The sum of `t` over the ranks (a new tensor), timed into `COMM`: the custom op while
    torch.compile traces, the sum itself in eager forwards (the module docstring)."""
    return _compiled_all_reduce(t) if torch.compiler.is_compiling() else _summed(t)


class RowParallelLinear(nn.Linear):
    """A linear holding this rank's slice of the input features: its output is a partial sum,
    all-reduced so that every rank continues with the full result."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(super().forward(x))


def _sparse_moes(model: nn.Module) -> list[tuple[str, SparseMoE]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, SparseMoE)]


def _planned_linears(model: nn.Module, plan: TensorParallelPlan) -> list[tuple[str, nn.Module, str, str]]:
    """(owner's name, owner module, child name, style) for every linear the plan splits."""
    found = []
    for name, module in model.named_modules():
        if name.startswith(plan.scope):
            for child_name, child in module.named_children():
                if child_name in plan.linears and isinstance(child, nn.Linear):
                    found.append((name, module, child_name, plan.linears[child_name]))
    return found


def check_degrees(model: DiffusionLM, tp: int, ep: int, world: int | None = None) -> None:
    """Raise EngineError unless `model` splits `tp`-way (heads, KV heads, MLP widths) and `ep`-way
    (experts) over `world` processes (default: max(tp, ep), as an Engine starts them). Touches
    nothing, so a failure leaves the model intact."""
    name = type(model).__name__
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in (tp, ep)):  # degrees may come from JSON
        raise EngineError(f"tp and ep must be whole numbers, got tp={tp!r}, ep={ep!r}")
    if tp < 1 or ep < 1:
        raise EngineError(f"tp and ep must be >= 1, got tp={tp}, ep={ep}")
    world = max(tp, ep) if world is None else world
    if tp not in (1, world) or ep not in (1, world) or max(tp, ep) != world:
        raise EngineError(f"tp={tp}, ep={ep}: each must be 1 or the number of processes ({world}), and one of them {world}")
    moes = [moe for _, moe in _sparse_moes(model)]
    if ep > 1:
        if not moes:
            raise EngineError(f"expert parallelism needs an MoE model; {name} is dense")
        if moes[0].num_experts % ep:
            raise EngineError(f"ep={ep} does not divide the {moes[0].num_experts} experts")
    if tp == 1:
        return
    if type(model) not in PLANS:
        raise EngineError(f"{name} has no tensor-parallel plan")
    for module in model.modules():
        if hasattr(module, "n_kv_heads"):
            if module.n_heads % tp:
                raise EngineError(f"tp={tp} does not divide the {module.n_heads} attention heads")
            if module.n_kv_heads % tp:
                raise EngineError(f"tp={tp} does not divide the {module.n_kv_heads} KV heads")
    for _, owner, child_name, style in _planned_linears(model, PLANS[type(model)]):
        linear = getattr(owner, child_name)
        width = linear.in_features if style == ROW else linear.out_features
        if width % tp:
            raise EngineError(f"tp={tp} does not divide the width {width} of {child_name}")
    if ep == 1 and moes and moes[0].w2.shape[-1] % tp:
        raise EngineError(f"tp={tp} does not divide the expert hidden size {moes[0].w2.shape[-1]}")


def _span(size: int, rank: int, parts: int, offset: int = 0) -> tuple[int, int]:
    """Rank `rank`'s equal part of `size` indices from `offset` (check_degrees: `parts` divides it)."""
    step = size // parts
    return offset + rank * step, offset + (rank + 1) * step


def _linear_cut(linear: nn.Linear, style: str, owner: nn.Module, rank: int, tp: int) -> Cut:
    if style == QKV:  # rows [q heads | k heads | v heads]: each part splits on its own heads
        q_rows, kv_rows = owner.n_heads * owner.head_dim, owner.n_kv_heads * owner.head_dim
        return Cut(0, tuple(_span(rows, rank, tp, start) for rows, start in ((q_rows, 0), (kv_rows, q_rows), (kv_rows, q_rows + kv_rows))))
    if style == COLUMN:
        return Cut(0, (_span(linear.out_features, rank, tp),))
    return Cut(1, (_span(linear.in_features, rank, tp),))


def shard_cuts(model: DiffusionLM, tp: int, ep: int, rank: int) -> dict[str, Cut]:
    """The slice rank `rank` keeps of every tensor that TP=`tp`, EP=`ep` splits, by its name in the
    whole model's state dict (`model` whole, on any device, the meta one included; the degrees
    checked). The one place this rule lives: the loader reads these slices, `shard_model` cuts them."""
    cuts: dict[str, Cut] = {}
    if tp > 1:
        for owner_name, owner, child_name, style in _planned_linears(model, PLANS[type(model)]):
            cuts[f"{owner_name}.{child_name}.weight"] = _linear_cut(getattr(owner, child_name), style, owner, rank, tp)
    for name, moe in _sparse_moes(model) if max(tp, ep) > 1 else []:
        if ep > 1:  # whole experts: [rank·E/ep, (rank+1)·E/ep)
            cuts[f"{name}.w1"] = cuts[f"{name}.w2"] = Cut(0, (_span(moe.num_experts, rank, ep),))
        else:  # a slice of every expert's hidden units: its gate rows, its up rows, its down columns
            hidden = moe.w2.shape[-1]
            cuts[f"{name}.w1"] = Cut(1, (_span(hidden, rank, tp), _span(hidden, rank, tp, hidden)))
            cuts[f"{name}.w2"] = Cut(2, (_span(hidden, rank, tp),))
    return cuts


def _keep(model: DiffusionLM, cuts: dict[str, Cut], tp: int, ep: int, rank: int) -> DiffusionLM:
    """Reshape `model` (in place) to the shard `cuts` describe: each split tensor cut (a copy; on
    the meta device only its shape), the split linears' modules and head counts, the experts' offset
    and the all-reduces."""
    if tp > 1:
        for owner_name, owner, child_name, style in _planned_linears(model, PLANS[type(model)]):
            w = cuts[f"{owner_name}.{child_name}.weight"].of(getattr(owner, child_name).weight.detach())
            with torch.device("meta"):
                split = (RowParallelLinear if style == ROW else nn.Linear)(w.shape[1], w.shape[0], bias=False)
            split.weight = nn.Parameter(w, requires_grad=False)
            setattr(owner, child_name, split)
        for module in model.modules():
            if hasattr(module, "n_kv_heads"):
                module.n_heads //= tp
                module.n_kv_heads //= tp
    for name, moe in _sparse_moes(model) if max(tp, ep) > 1 else []:
        if ep > 1:
            moe.first_expert = rank * (moe.num_experts // ep)
        moe.w1 = nn.Parameter(cuts[f"{name}.w1"].of(moe.w1.detach()), requires_grad=False)
        moe.w2 = nn.Parameter(cuts[f"{name}.w2"].of(moe.w2.detach()), requires_grad=False)
        moe.reduce = all_reduce
    model.comm_clock = COMM  # what the loop reads through model.comm_seconds()
    return model


def shard_model(model: DiffusionLM, tp: int = 1, ep: int = 1, rank: int | None = None, world: int | None = None) -> DiffusionLM:
    """Keep rank `rank`'s shard of `model`, already loaded whole (in place). The rank and the world
    default to this process's in its initialised process group."""
    rank = dist.get_rank() if rank is None else rank
    world = dist.get_world_size() if world is None else world
    check_degrees(model, tp, ep, world)
    return _keep(model, shard_cuts(model, tp, ep, rank), tp, ep, rank)


def load_shard(path: str, device: str | torch.device, dtype: torch.dtype | None, tp: int, ep: int, rank: int, world: int) -> DiffusionLM:
    """Rank `rank`'s shard of the checkpoint at `path`, reading only its slices of the files (no
    process group needed to read: the rank and world are given)."""

    def shard(skeleton: DiffusionLM) -> dict[str, Cut]:
        check_degrees(skeleton, tp, ep, world)
        cuts = shard_cuts(skeleton, tp, ep, rank)
        _keep(skeleton, cuts, tp, ep, rank)
        return cuts

    return load_model(path, device=device, dtype=dtype, shard=shard)
