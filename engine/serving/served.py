"""What `engine serve` runs on an engine (docs/serving.md §3): the batcher a `--batching` name
picks, which rounds it may take (a position budget, lanes), and the defaults of its flags by where
the engine runs (a CPU's forward grows with its positions and runs one torch thread a lane; a
GPU's hardly grows with its rows)."""

from __future__ import annotations

import os
import threading
from typing import Callable

import torch

from ..errors import EngineError
from ..pipeline import Engine
from .batcher import MAX_BATCH, Batcher
from .scheduler import ContinuousBatcher

BATCHING = ("continuous", "lockstep", "short-first")  # the batchers a server may run (docs/serving.md §3)
# `engine serve`'s position budget on a CPU, where a forward's cost grows with its positions (`served_budget`;
# benchmarks/RESULTS.md, constraint load: a plain request under load 3.9x -> 2.2x its solo time, at lockstep's throughput)
CPU_FORWARD_POSITIONS = 256
# `engine serve`'s forward lanes on a CPU: rounds run at once, each on a thread of its own, at most one
# per `--threads` of the machine's cores (`served_lanes`; measured on 2 cores, benchmarks/RESULTS.md #60)
CPU_FORWARD_LANES = 2
# `engine serve`'s rows decoding at once under a position budget (`served_max_batch`): the budget bounds
# what a round takes, so rows past a round wait for a forward, where the fewest forwards go first,
# rather than for a slot, in arrival order (benchmarks/RESULTS.md #60: a plain request's mean under
# the constrained load 6-9x its solo time at 8 rows, 1.5-3.7x at 16)
BUDGET_MAX_ROWS = 16


def batcher_for(batching: str, engine: Engine, max_batch: int, on_forward: Callable[[int], None],
                forward_positions: int | None = None, lanes: int = 1) -> "Batcher | ContinuousBatcher":
    """The batcher `batching` names (BATCHING) for `engine`, on a lock of its own: continuous and
    short-first need an engine that generates in this process (`shares_forwards`); another runs the
    lockstep batcher. `forward_positions` and `lanes`: the rounds' position budget and how many run
    at once (`Scheduler`), which only those two take. EngineError (one line) for any other name, or
    rounds they cannot take."""
    if batching not in BATCHING:
        raise EngineError(f"batching must be one of {', '.join(BATCHING)}, got {batching!r}")
    check_rounds(batching, forward_positions, lanes, engine)
    if batching == "lockstep" or not shares_forwards(engine):
        return Batcher(threading.Lock(), lambda members: engine, max_batch, on_forward=on_forward)
    return ContinuousBatcher(threading.Lock(), lambda members: engine, max_batch, on_forward, short_first=batching == "short-first",
                             forward_positions=forward_positions, lanes=lanes)


def check_rounds(batching: str, forward_positions: int | None, lanes: int = 1, engine: Engine | None = None) -> None:
    """A round's position budget (None: none) is at least 1, lanes are at least 1, and either,
    when asked, is asked of a batcher whose rounds take it: continuous or short first, on an engine
    whose runs are routed here (`shares_forwards`), and lanes of an engine that runs them
    (`runs_lanes`); the server checks before loading its model too, with no `engine`. EngineError otherwise."""
    if forward_positions is not None and forward_positions < 1:
        raise EngineError(f"forward positions must be >= 1, got {forward_positions}")
    if lanes < 1:
        raise EngineError(f"forward lanes must be >= 1, got {lanes}")
    asked = [what for what, given in (("a forward positions budget", forward_positions is not None), ("forward lanes", lanes > 1)) if given]
    if asked and (batching == "lockstep" or (engine is not None and not shares_forwards(engine))):
        raise EngineError(f"{' and '.join(asked)} {'need' if len(asked) > 1 else 'needs'} continuous or short-first batching on an engine that generates in this process (not lockstep, --tp/--ep or torchrun)")
    if lanes > 1 and engine is not None and not runs_lanes(engine):
        raise EngineError("forward lanes need a CPU engine's own forwards (not a GPU, --compile or CUDA graphs)")


def served_budget(flag: int | None, batching: str, engine: Engine) -> int | None:
    """`engine serve --forward-positions` as the server runs it: not given, CPU_FORWARD_POSITIONS
    for continuous or short-first batching on a CPU engine that generates here, none elsewhere (a
    GPU's forward costs about the same with more rows: splitting them would only slow the long
    ones); 0: none; N: N (`check_rounds` refuses it where no round takes it)."""
    if flag is None:
        return CPU_FORWARD_POSITIONS if batching != "lockstep" and shares_forwards(engine) and engine.model.device.type == "cpu" else None
    return flag or None


def served_max_batch(flag: int | None, forward_positions: int | None) -> int:
    """`engine serve --max-batch` as the server runs it: not given, BUDGET_MAX_ROWS under a
    position budget (`served_budget`: a CPU server's default), else MAX_BATCH; N: N."""
    if flag is None:
        return BUDGET_MAX_ROWS if forward_positions is not None else MAX_BATCH
    return flag


def served_lanes(flag: int | None, batching: str, engine: Engine) -> int:
    """`engine serve --forward-lanes` as the server runs it: not given, with continuous or
    short-first batching on an engine that runs lanes (`runs_lanes`), one lane per
    `torch.get_num_threads()` of this machine's cores, at most CPU_FORWARD_LANES (a request that
    arrives while a long row's forward runs starts its own on a core a one-thread forward leaves
    idle), else 1; N: N (`check_rounds` refuses N > 1 where no round takes it)."""
    if flag is None:
        return max(1, min(CPU_FORWARD_LANES, (os.cpu_count() or 1) // torch.get_num_threads())) if batching != "lockstep" and runs_lanes(engine) else 1
    return flag


def runs_lanes(engine: Engine) -> bool:
    """Whether `engine`'s forwards may run in several lanes at once: a CPU model that generates in
    this process through its own forward (compiled or captured forwards keep buffers across calls;
    a GPU runs its kernels one stream after another)."""
    return shares_forwards(engine) and engine.model.device.type == "cpu" and not engine.static_shapes


def shares_forwards(engine: Engine) -> bool:
    """Whether `engine` generates in this process, where a run's forwards can be routed (a parallel
    engine's run in its workers, a launched job's on every rank at once: those keep the lockstep batcher)."""
    return engine.model.device.type != "meta" and getattr(engine, "_job", None) is None
