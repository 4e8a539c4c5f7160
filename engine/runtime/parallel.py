"""Tensor and expert parallelism over torch.distributed (docs/algorithms.md §6.4).

One process per device (an Engine's worker processes, engine/runtime/workers.py; NCCL on GPUs, gloo on
CPU). Every rank loads the whole checkpoint onto its device, keeps its shard (`shard_model`), and
runs the same decoding loop: the embedding, the norms, the
routers and the lm_head are replicated, so every rank sees identical logits and makes identical
decisions with no broadcast of the canvas (docs/algorithms.md §8 item 14).

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
The per-family split is a plan keyed by the model class, so the model files stay single-device.

Every all-reduce goes through `all_reduce`, which times itself into `COMM` (this process's clock:
the iteration manager reads it around each forward through `DiffusionLM.comm_seconds`). It is a custom op, so
torch.compile keeps it as one opaque node of the forward's graph (no graph break) and its time is
still measured when the compiled forward runs.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from ..errors import EngineError
from ..models.base import DiffusionLM
from ..models.llada import LLaDAModelLM
from ..models.llada2 import LLaDA2MoeModelLM
from ..models.llada_moe import LLaDAMoEModelLM
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


@torch.library.custom_op("dinfer_viz::all_reduce", mutates_args=())
def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """The sum of `t` over the ranks (a new tensor), timed into `COMM`."""
    out = t.clone()
    with COMM.timed(out.device):
        dist.all_reduce(out)
    return out


@all_reduce.register_fake
def _(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t)


class RowParallelLinear(nn.Linear):
    """A linear holding this rank's slice of the input features: its output is a partial sum,
    all-reduced so that every rank continues with the full result."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(super().forward(x))


def init_distributed(device: str) -> torch.device:
    """Join the process group the environment describes as torchrun would (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR/PORT; engine/runtime/workers.py sets them): NCCL on CUDA, each rank on its
    LOCAL_RANK device; gloo on CPU."""
    target = torch.device(device)
    if target.type == "cuda":
        target = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(target)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if target.type == "cuda" else "gloo")
    return target


def _sparse_moes(model: nn.Module) -> list[SparseMoE]:
    return [m for m in model.modules() if isinstance(m, SparseMoE)]


def _planned_linears(model: nn.Module, plan: TensorParallelPlan) -> list[tuple[nn.Module, str, str]]:
    """(owner module, child name, style) for every linear the plan splits."""
    found = []
    for name, module in model.named_modules():
        if name.startswith(plan.scope):
            for child_name, child in module.named_children():
                if child_name in plan.linears and isinstance(child, nn.Linear):
                    found.append((module, child_name, plan.linears[child_name]))
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
    moes = _sparse_moes(model)
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
    for owner, child_name, style in _planned_linears(model, PLANS[type(model)]):
        linear = getattr(owner, child_name)
        width = linear.in_features if style == ROW else linear.out_features
        if width % tp:
            raise EngineError(f"tp={tp} does not divide the width {width} of {child_name}")
    if ep == 1 and moes and moes[0].w2.shape[-1] % tp:
        raise EngineError(f"tp={tp} does not divide the expert hidden size {moes[0].w2.shape[-1]}")


def _piece(t: torch.Tensor, dim: int, rank: int, parts: int) -> torch.Tensor:
    return t.chunk(parts, dim=dim)[rank]


def _split_linear(linear: nn.Linear, style: str, owner: nn.Module, rank: int, tp: int) -> nn.Linear:
    w = linear.weight.detach()
    if style == QKV:  # rows [q heads | k heads | v heads]: each part splits on its own heads
        q_rows, kv_rows = owner.n_heads * owner.head_dim, owner.n_kv_heads * owner.head_dim
        parts = w.split([q_rows, kv_rows, kv_rows])
        w = torch.cat([_piece(p, 0, rank, tp) for p in parts])
    elif style == COLUMN:
        w = _piece(w, 0, rank, tp)
    else:
        w = _piece(w, 1, rank, tp)
    cls = RowParallelLinear if style == ROW else nn.Linear
    with torch.device("meta"):
        split = cls(w.shape[1], w.shape[0], bias=False)
    split.weight = nn.Parameter(w.clone(), requires_grad=False)
    return split


def shard_model(model: DiffusionLM, tp: int = 1, ep: int = 1) -> DiffusionLM:
    """Keep this rank's shard of `model` (in place; the process group must be initialised)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    check_degrees(model, tp, ep, world)
    if tp > 1:
        for owner, child_name, style in _planned_linears(model, PLANS[type(model)]):
            setattr(owner, child_name, _split_linear(getattr(owner, child_name), style, owner, rank, tp))
        for module in model.modules():
            if hasattr(module, "n_kv_heads"):
                module.n_heads //= tp
                module.n_kv_heads //= tp
    for moe in _sparse_moes(model) if max(tp, ep) > 1 else []:
        w1, w2 = moe.w1.detach(), moe.w2.detach()
        if ep > 1:  # whole experts: [rank·E/ep, (rank+1)·E/ep)
            moe.first_expert = rank * (moe.num_experts // ep)
            w1, w2 = _piece(w1, 0, rank, ep), _piece(w2, 0, rank, ep)
        else:  # a slice of every expert's hidden units: its gate rows, its up rows, its down columns
            gate, up = w1.chunk(2, dim=1)
            w1 = torch.cat([_piece(gate, 1, rank, tp), _piece(up, 1, rank, tp)], dim=1)
            w2 = _piece(w2, 2, rank, tp)
        moe.w1, moe.w2 = nn.Parameter(w1.clone(), requires_grad=False), nn.Parameter(w2.clone(), requires_grad=False)
        moe.reduce = all_reduce
    model.comm_clock = COMM  # what the loop reads through model.comm_seconds()
    return model

