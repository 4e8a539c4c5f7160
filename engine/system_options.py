"""The system-option declarations: the `Engine` keywords that change how a model runs, not what it
computes (tensor and expert parallelism, torch.compile, CUDA graphs), each with its CLI flag, help,
explanation and what it needs from the machine, as decoders and cache modes declare theirs.

The CLI's flags (engine/__main__.py), the app's Model and system controls and their explanations
read these; the engine's own checks stay where each option is built (engine/pipeline.py,
engine/runtime/). docs/algorithms.md §6.4-6.5 describe what the options do. The CPU thread count
is the process's, not the engine's: engine/cli.py's `--threads` and its rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import EngineError

MAX_DEGREE = 64  # worker processes one engine may start (tp_size, ep_size)


@dataclass(frozen=True)
class SystemOption:
    """One `Engine(...)` keyword. `kind`: int for a degree (N worker processes, engine/runtime/
    workers.py; 1 is off) or bool for a switch (False is off). `help`: one line for the CLI and the
    app's control; `explanation`: the paragraph the app shows. `runs_on_cpu`: whether it does
    anything for a model on the CPU; `cuda_devices`: the CUDA devices it needs for a model on CUDA
    at its smallest setting that does something (a degree of 2 takes a device per process)."""

    name: str
    flag: str
    label: str
    kind: type
    help: str
    explanation: str
    runs_on_cpu: bool
    cuda_devices: int

    @property
    def off(self) -> bool | int:
        """The value that leaves the option out (what Engine takes by default)."""
        return 1 if self.kind is int else False

    def check(self, value: Any) -> None:
        """EngineError unless `value` is one this option takes: a switch true or false, a degree a
        whole number in 1..MAX_DEGREE (the app's JSON and gradio_client send anything); None is
        the option left out (its default), as `is_set` reads it."""
        if value is None:
            return
        if self.kind is bool:
            ok, want = isinstance(value, bool), "true or false"
        else:
            ok, want = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_DEGREE, f"a whole number in 1..{MAX_DEGREE}"
        if not ok:
            raise EngineError(f"{self.name} must be {want}, got {str(value)[:40]!r}")

    def is_set(self, value: Any) -> bool:
        """Whether `value` asks for anything beyond the default (a degree above 1, a switch on)."""
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)):
            return value > 1
        return value not in (None, "")


# The paragraphs the app shows, one per option
_TP_SIZE = (
    "**Tensor parallelism (TP = N).** N worker processes each hold 1/N of every layer: the "
    "attention heads and the MLP's hidden units are split, each process computes its share, and "
    "an all-reduce sums the shares after the attention and after the MLP: two all-reduces per "
    "layer, every forward. It pays when a layer's matrices are big enough that computing a part "
    "saves more than the all-reduces cost (a 7-8B model whose weights one GPU cannot hold or "
    "stream fast enough, GPUs joined by a fast link). The embedded model's layers take "
    "microseconds, so TP=2 on this CPU is slower than one process: the two processes share the "
    "same cores, and in the cost chart each forward's communication (red) is taller than its "
    "compute (blue): the all-reduces' fixed cost, and the wait for the slower rank, outweigh the "
    "halved matmuls."
)
_EP_SIZE = (
    "**Expert parallelism (EP = N, MoE models).** N worker processes each hold 1/N of the "
    "experts, each expert whole; attention and the router are replicated, every token is routed on every "
    "process, each computes its own experts' share and one all-reduce per MoE layer sums them "
    "(no all-to-all). It pays when the experts' weights, most of an MoE model, do not fit or "
    "stream fast enough on one device; on a tiny MoE the all-reduces cost more than they save."
)
_COMPILE = (
    "**torch.compile.** Every forward runs through inductor, which fuses the layer's small "
    "operations into fewer kernels. Lengths are padded to a few bucket sizes so a run compiles "
    "one graph per bucket, the first time it meets it (tens of seconds on the CPU, the purple "
    "bar and the line in the cost chart; 1-2 s from inductor's disk cache), and no more after "
    "warm-up. It pays over many runs of the same shapes: a warm compiled forward is faster (about "
    "1.1× for the embedded model on this CPU), the first run is much slower."
)
_CUDA_GRAPHS = (
    "**CUDA graphs (CUDA, one process).** The first forward at each bucket is captured into a "
    "graph; later ones replay it as one launch instead of one per kernel (starred in the cost "
    "chart). It removes the host's launch overhead, which dominates when kernels are short "
    "(small models, cached forwards over one block); it costs a capture per bucket and a fixed "
    "K/V scratch store per bucket."
)

_DECLARED = (
    SystemOption("tp_size", "--tp", "tensor-parallel degree", int, "tensor-parallel degree: that many worker processes (one GPU each on CUDA)", _TP_SIZE, runs_on_cpu=True, cuda_devices=2),
    SystemOption("ep_size", "--ep", "expert-parallel degree (MoE models)", int, "expert-parallel degree (MoE models): that many worker processes (one GPU each on CUDA)", _EP_SIZE, runs_on_cpu=True, cuda_devices=2),
    SystemOption("compile", "--compile", "torch.compile", bool, "run the forwards through torch.compile, at bucketed shapes (the first run compiles)", _COMPILE, runs_on_cpu=True, cuda_devices=0),
    SystemOption("cuda_graphs", "--cuda-graphs", "CUDA graphs", bool, "CUDA, one process: capture each forward shape once as a CUDA graph and replay it", _CUDA_GRAPHS, runs_on_cpu=False, cuda_devices=1),
)
SYSTEM_OPTIONS: dict[str, SystemOption] = {option.name: option for option in _DECLARED}


def system_options() -> tuple[SystemOption, ...]:
    """Every declared option, in the order the CLI and the app list them."""
    return tuple(SYSTEM_OPTIONS.values())
