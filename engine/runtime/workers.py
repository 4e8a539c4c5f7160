"""The worker processes behind `Engine(..., tp_size=N)` or `ep_size=N` (docs/algorithms.md §6.4).

N spawned processes (gloo on CPU; NCCL on CUDA, rank r on device index + r), each with the
environment torchrun would give it, so that its Engine joins the group and reads only its shard as
a torchrun rank's does (engine/runtime/launch.py, parallel.py: `load_shard`), serve generate
requests. Every rank runs the same generate on the same token ids: the replicated
embedding, norms, routers and head make their decisions identical, so nothing but the all-reduces
inside the layers crosses between ranks. Rank 0 sends the trace header, each iteration record
(with the token strings the engine added for it) and the output back over its pipe; the caller
replays them into its own callbacks and returns the output, as one process would have. When the
run is recorded, every other rank sends the cost of each of its iterations (its compute and
all-reduce seconds, engine/run.py: `forward_cost`), and the caller appends them to rank 0's
record before handing it on, so a record's cost lists every rank.

The caller is not a rank: torch.distributed allows one process group per process, so a caller
that was rank 0 could hold only one parallel engine, and a caller stopping between two layers
(a callback raising, Ctrl-C) would leave the other ranks blocked in an all-reduce.

The processes' life is engine/runtime/lifecycle.py's, which knows nothing of torch: the start, the
requests, a stop that lands on the same cancel check on every rank (each rank's generate reads a
`RankCancel`; the loop checks it at the same points in the same order on every rank, before each
layer and between groups of iterations, engine/iteration.py), and failures: a rank that fails,
dies, or does not stop within `stop_grace` seconds of a Stop ends the whole group (one EngineError
line in the caller, no process left) and the next request starts a fresh one; workers end with
their caller. This module is what the ranks do: build a shard's generate and answer a request.
"""

from __future__ import annotations

import socket
from dataclasses import replace
from functools import partial
from itertools import islice
from typing import Any, Callable

import torch

from ..config import GenerationConfig
from ..errors import EngineError
from ..hooks import CancelFlag, RunHooks
from ..run import GenerationCancelled, GenerationOutput
from ..trace import COST_PER_RANK, IterationRecord, Trace
from .lifecycle import STOP_GRACE_SECONDS, ProcessGroup, RankCancel, StopFlags

__all__ = ["RankCancel", "RankGenerate", "StopFlags", "WorkerGroup"]  # the stop's parts, defined in lifecycle

# A rank's own generate (Engine.generate_ids of its shard), and how a rank builds it on its device.
# Its last argument: the request's constraint automata, built by the caller (engine/constraints/).
RankGenerate = Callable[[list[list[int]], GenerationConfig, RunHooks, dict[str, Any]], GenerationOutput]
Load = Callable[[str], RankGenerate]



class _Forwarder:
    """Rank 0's hooks: the header and each record go to the caller, a record with the token
    strings the engine added to the header's `tokens` since the last message (the recorder grows
    that dict in place, engine/trace.py; the caller's copy must grow alike)."""

    def __init__(self, send: Callable[[tuple], None]) -> None:
        self.send = send
        self.tokens: dict[str, str] = {}
        self.sent = 0

    def on_start(self, header: Trace) -> None:
        self.tokens, self.sent = header.tokens, len(header.tokens)
        self.send(("start", header))

    def on_iteration(self, record: IterationRecord) -> None:
        new = dict(islice(self.tokens.items(), self.sent, None))  # new ids are appended
        self.sent = len(self.tokens)
        self.send(("iteration", record, new))


def _start_rank(device: str, threads: int, load: Load, rank: int) -> Callable[[tuple, Callable[[tuple], None], CancelFlag], tuple]:
    """In the worker (its environment already that of a torchrun rank): the shard's generate on
    `device` (`load`), and the handler that answers a request with it."""
    torch.set_num_threads(threads)
    return partial(_answer, rank, load(device))


def _answer(rank: int, generate: RankGenerate, request: tuple, send: Callable[[tuple], None], cancel: CancelFlag) -> tuple:
    """One rank's part of a request: ("done", rank 0's output) or ("cancelled",) (an error is lifecycle's to report)."""
    prompts, config, hooks, built, want_start, want_iteration = request
    recorded = hooks.records(config.measure_staleness) or want_start or want_iteration  # as the loop decides
    if rank == 0:  # rank 0 speaks for all; its records go out as they come, for the others' costs to join
        forwarder = _Forwarder(send)
        hooks = hooks.but(on_start=forwarder.on_start if want_start else None, on_iteration=forwarder.on_iteration if recorded else None)
    else:
        hooks = hooks.but(trace=False, on_iteration=(lambda record: send(("cost", record.cost))) if recorded else None)
    try:
        out = generate(prompts, config, hooks.but(cancel=cancel), built)
    except GenerationCancelled:
        return ("cancelled",)
    return ("done", replace(out, canvas=out.canvas.cpu()) if rank == 0 else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environments(world: int, device: str) -> list[dict[str, str]]:
    """What torchrun would set in each rank, on a fresh port (cuda: rank r on device index + r)."""
    index, port = torch.device(device).index or 0, str(_free_port())
    return [dict(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(index + r), MASTER_ADDR="127.0.0.1", MASTER_PORT=port) for r in range(world)]


class WorkerGroup:
    """`world` worker processes serving one model's shards; `run_request` drives them like one process."""

    def __init__(self, world: int, device: str, load: Load, stop_grace: float = STOP_GRACE_SECONDS) -> None:
        """`load(device)`: a rank's generate, built in the worker (picklable: a module-level
        function or a partial of one). Raises EngineError (the first rank's message) if a rank fails."""
        self.world, self.device = world, device
        if torch.device(device).type == "cuda":
            index = torch.device(device).index or 0
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if index + world > have:
                raise EngineError(f"{world} processes need CUDA devices {index}..{index + world - 1} (one each); this machine has {have}")
        # the caller's CPU threads shared among the ranks, so N ranks use the cores one process would
        threads = max(1, torch.get_num_threads() // world)
        self.group = ProcessGroup(world, partial(_start_rank, device, threads, load), partial(_environments, world, device), name="worker", stop_grace=stop_grace)
        self.group.start()

    def close(self) -> None:
        self.group.close()

    def run_request(self, prompts: list[list[int]], config: GenerationConfig, hooks: RunHooks, built: dict[str, Any] | None = None) -> GenerationOutput:
        """Every rank generates; rank 0's header and records reach `hooks`' callbacks here, its
        output is returned. `built`: the request's constraint automata (regex -> automaton), which
        the ranks adopt. A callback that raises stops every rank (as a cancel) and its exception
        is raised once they have stopped."""
        header: Trace | None = None
        # rank 0's records (with their new token strings) waiting for the other ranks' costs;
        # then completed, in order
        waiting: list[tuple[IterationRecord, dict[str, str]]] = []
        costs: dict[int, list[dict[str, Any]]] = {rank: [] for rank in range(1, self.world)}
        records: list[IterationRecord] = []

        def deliver(rank: int, message: tuple) -> None:
            nonlocal header
            if message[0] == "start":
                header = message[1]
                hooks.on_start(header)
                return
            if message[0] == "cost":
                costs[rank].append(message[1])
            else:
                waiting.append(message[1:])
            while waiting and all(len(c) > len(records) for c in costs.values()):
                record, tokens = waiting.pop(0)
                for rank_costs in costs.values():
                    for key in COST_PER_RANK:
                        record.cost[key] += rank_costs[len(records)][key]
                records.append(record)
                if header is not None:
                    header.tokens.update(tokens)
                if hooks.on_iteration is not None:
                    hooks.on_iteration(record)

        # what crosses to the ranks: the hooks' values (the callbacks and the cancel stay here; the
        # ranks' own engines add the name and token strings)
        sent = RunHooks(trace=hooks.trace, max_tokens=hooks.max_tokens, expected_ids=hooks.expected_ids, constraints=hooks.constraints)
        request = (prompts, config, sent, built or {}, hooks.on_start is not None, hooks.on_iteration is not None)
        replies = self.group.call(request, deliver, hooks.cancel)
        if any(kind == "cancelled" for kind, *_ in replies):
            raise GenerationCancelled("generation cancelled")
        out = replies[0][1]
        if out.trace is not None:  # the records with every rank's cost (the very objects the callback saw)
            out.trace.iterations = records
        return out
