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
all-reduce seconds, engine/iteration.py: `forward_cost`), and the caller appends them to rank 0's
record before handing it on, so a record's cost lists every rank.

The caller is not a rank: torch.distributed allows one process group per process, so a caller
that was rank 0 could hold only one parallel engine, and a caller stopping between two layers
(a callback raising, Ctrl-C) would leave the other ranks blocked in an all-reduce. Out of process,
a rank that fails or dies ends the whole group (one EngineError line in the caller) and the next
request starts a fresh one; the app itself never blocks.

Stopping must happen at the same point on every rank: a rank that leaves a forward while another
enters the next layer's all-reduce blocks that one forever. Every rank checks its cancel flag at
the same points in the same order (before each layer, between groups of iterations:
engine/iteration.py), so the checks are numbered alike on all ranks. A stop picks the check after
the furthest any rank has reached (`StopFlags.stop`, under the lock every check takes), and every
rank stops at exactly that check: within about one layer of the request, as with one process.

Workers exit when their pipe closes, i.e. when the caller dies; `close()` kills them (they hold
nothing that needs a clean exit, and a rank stuck in an all-reduce would not read a polite request).
"""

from __future__ import annotations

import os
import socket
import weakref
from dataclasses import replace
from itertools import islice
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

from ..config import GenerationConfig
from ..errors import EngineError
from ..hooks import CancelFlag, RunHooks
from ..iteration import GenerationCancelled, GenerationOutput
from ..trace import COST_PER_RANK, IterationRecord, Trace

# A rank's own generate (Engine.generate_ids of its shard), and how a rank builds it on its device.
RankGenerate = Callable[[list[list[int]], GenerationConfig, RunHooks], GenerationOutput]
Load = Callable[[str], RankGenerate]

NEVER = 2**62  # stop_at while no stop is asked for
# How often the caller looks at its cancel event while it waits for the ranks (a threading.Event
# cannot wake a wait on pipes); the ranks then stop within about one layer.
CANCEL_POLL_SECONDS = 0.05
FINAL = ("ready", "done", "cancelled")  # a rank's last message of a start or a request


class StopFlags:
    """Shared by the caller and the ranks: how many cancel checks each rank has made in this
    request, and the check at which every rank stops."""

    def __init__(self, ctx: Any, world: int) -> None:
        self.lock = ctx.Lock()
        self.checks = ctx.RawArray("q", world)
        self.stop_at = ctx.RawValue("q", NEVER)

    def reset(self) -> None:
        """Before a request (no rank is running)."""
        with self.lock:
            self.checks[:] = [0] * len(self.checks)
            self.stop_at.value = NEVER

    def stop(self) -> None:
        """Stop every rank at the check after the furthest any has made: none has passed it."""
        with self.lock:
            if self.stop_at.value == NEVER:
                self.stop_at.value = max(self.checks) + 1

    def check(self, rank: int) -> bool:
        """Rank `rank` makes its next check: stop here?"""
        with self.lock:
            self.checks[rank] += 1
            return self.checks[rank] >= self.stop_at.value


class RankCancel:
    """The cancel flag a rank's generate reads (engine.iteration.CancelFlag): each `is_set` is
    one numbered check."""

    def __init__(self, flags: StopFlags, rank: int) -> None:
        self.flags, self.rank = flags, rank

    def is_set(self) -> bool:
        return self.flags.check(self.rank)


class _Forwarder:
    """Rank 0's hooks: the header and each record go to the caller, a record with the token
    strings the engine added to the header's `tokens` since the last message (the recorder grows
    that dict in place, engine/trace.py; the caller's copy must grow alike)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.tokens: dict[str, str] = {}
        self.sent = 0

    def on_start(self, header: Trace) -> None:
        self.tokens, self.sent = header.tokens, len(header.tokens)
        self.conn.send(("start", header))

    def on_iteration(self, record: IterationRecord) -> None:
        new = dict(islice(self.tokens.items(), self.sent, None))  # new ids are appended
        self.sent = len(self.tokens)
        self.conn.send(("iteration", record, new))


def _failure(rank: int, exc: BaseException) -> str:
    """One line: an EngineError's own message, anything else with its type and the rank."""
    if isinstance(exc, EngineError):
        return str(exc)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"worker rank {rank} failed: {type(exc).__name__}: {first}"


def _answer(rank: int, conn: Connection, flags: StopFlags, generate: RankGenerate, request: tuple) -> tuple:
    prompts, config, hooks, want_start, want_iteration = request
    recorded = hooks.records(config.measure_staleness) or want_start or want_iteration  # as the loop decides
    if rank == 0:  # rank 0 speaks for all; its records go out as they come, for the others' costs to join
        forwarder = _Forwarder(conn)
        hooks = hooks.but(on_start=forwarder.on_start if want_start else None, on_iteration=forwarder.on_iteration if recorded else None)
    else:
        hooks = hooks.but(trace=False, on_iteration=(lambda record: conn.send(("cost", record.cost))) if recorded else None)
    try:
        out = generate(prompts, config, hooks.but(cancel=RankCancel(flags, rank)))
    except GenerationCancelled:
        return ("cancelled",)
    except Exception as exc:  # a closed pipe too: sending this reply then ends the worker
        return ("error", _failure(rank, exc))
    return ("done", replace(out, canvas=out.canvas.cpu()) if rank == 0 else None)


def serve(rank: int, world: int, port: int, device: str, threads: int, load: Load, conn: Connection, flags: StopFlags) -> None:
    """A worker process: join the group and load the shard (`load`), answer requests until the pipe closes."""
    torch.set_num_threads(threads)
    index = torch.device(device).index or 0
    # what torchrun would set: the rank's Engine reads them (engine/runtime/launch.py; cuda: rank r on device index + r)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(index + rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        try:
            generate = load(device)
        except Exception as exc:
            conn.send(("error", _failure(rank, exc)))
            return
        conn.send(("ready",))
        while True:
            conn.send(_answer(rank, conn, flags, generate, conn.recv()))
    except (EOFError, OSError):  # the caller closed the pipe or died: nothing left to serve
        return


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(processes: list[Any], conns: list[Connection]) -> None:
    for p in processes:
        p.kill()
    for p in processes:
        p.join()
    for c in conns:
        c.close()
    processes.clear()
    conns.clear()


class WorkerGroup:
    """`world` worker processes serving one model's shards; `run_request` drives them like one process."""

    def __init__(self, world: int, device: str, load: Load) -> None:
        """`load(device)`: a rank's generate, built in the worker (picklable: a module-level
        function or a partial of one). Raises EngineError (the first rank's message) if a rank fails."""
        self.world, self.device, self.load = world, device, load
        if torch.device(device).type == "cuda":
            index = torch.device(device).index or 0
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if index + world > have:
                raise EngineError(f"{world} processes need CUDA devices {index}..{index + world - 1} (one each); this machine has {have}")
        # the caller's CPU threads shared among the ranks, so N ranks use the cores one process would
        self.threads = max(1, torch.get_num_threads() // world)
        self._ctx = mp.get_context("spawn")  # fork would copy the caller's threads and CUDA state
        self._flags = StopFlags(self._ctx, world)
        self._processes: list[Any] = []
        self._conns: list[Connection] = []
        # ends the workers when the group is collected or the interpreter exits without close()
        weakref.finalize(self, _kill, self._processes, self._conns)
        self.start()

    def start(self) -> None:
        """Spawn the ranks and wait until each has loaded its shard."""
        port = _free_port()
        try:
            for rank in range(self.world):
                mine, theirs = self._ctx.Pipe()
                self._conns.append(mine)
                process = self._ctx.Process(
                    target=serve, args=(rank, self.world, port, self.device, self.threads, self.load, theirs, self._flags),
                    name=f"dinfer-viz rank {rank}", daemon=True,
                )
                process.start()
                self._processes.append(process)
                theirs.close()  # the worker's end lives in the worker only: its death reads as EOF here
        except BaseException:
            self.close()
            raise
        self._gather(lambda rank, message: None, None)

    def close(self) -> None:
        _kill(self._processes, self._conns)

    def run_request(self, prompts: list[list[int]], config: GenerationConfig, hooks: RunHooks) -> GenerationOutput:
        """Every rank generates; rank 0's header and records reach `hooks`' callbacks here, its
        output is returned. A callback that raises stops every rank (as a cancel) and its exception
        is raised once they have stopped."""
        if not self._processes:  # a failure ended the previous group
            self.start()
        header: Trace | None = None
        raised: list[Exception] = []
        # rank 0's records (with their new token strings) waiting for the other ranks' costs;
        # then completed, in order
        waiting: list[tuple[IterationRecord, dict[str, str]]] = []
        costs: dict[int, list[dict[str, Any]]] = {rank: [] for rank in range(1, self.world)}
        records: list[IterationRecord] = []

        def deliver(rank: int, message: tuple) -> None:
            nonlocal header
            if raised:
                return
            try:
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
            except Exception as exc:
                raised.append(exc)
                self._flags.stop()

        self._flags.reset()
        # what crosses to the ranks: the hooks' values (the callbacks and the cancel stay here; the
        # ranks' own engines add the name and token strings)
        sent = RunHooks(trace=hooks.trace, max_tokens=hooks.max_tokens, expected_ids=hooks.expected_ids)
        request = (prompts, config, sent, hooks.on_start is not None, hooks.on_iteration is not None)
        finals = self._gather(deliver, hooks.cancel, request)
        if raised:
            raise raised[0]
        if any(kind == "cancelled" for kind, *_ in finals):
            raise GenerationCancelled("generation cancelled")
        out = finals[0][1]
        if out.trace is not None:  # the records with every rank's cost (the very objects the callback saw)
            out.trace.iterations = records
        return out

    def _gather(self, deliver: Callable[[int, tuple], None], cancel: CancelFlag | None, request: tuple | None = None) -> list[tuple]:
        """Send `request` to every rank, then read until each rank has sent its final message,
        handing the others to `deliver` (with the rank that sent it). A rank's error or death, or
        anything raised here, ends the group: EngineError (the rank's line) or the exception itself."""
        finals: dict[int, tuple] = {}

        def follow_cancel() -> None:
            if cancel is not None and cancel.is_set():
                self._flags.stop()

        try:
            for conn in self._conns if request is not None else []:
                conn.send(request)
            while len(finals) < self.world:
                pending = [r for r in range(self.world) if r not in finals]
                wait([self._conns[r] for r in pending], timeout=CANCEL_POLL_SECONDS if cancel is not None else None)
                for rank in pending:
                    conn = self._conns[rank]
                    while rank not in finals and conn.poll():
                        message = self._receive(rank)
                        if message[0] == "error":
                            raise EngineError(message[1])
                        if message[0] in FINAL:
                            finals[rank] = message
                        else:
                            deliver(rank, message)
                        follow_cancel()  # so a callback that cancels stops the ranks before the next record is read
                follow_cancel()  # a wait that timed out
        except BaseException:
            self.close()
            raise
        return [finals[r] for r in range(self.world)]

    def _receive(self, rank: int) -> tuple:
        try:
            return self._conns[rank].recv()
        except (EOFError, OSError):
            process = self._processes[rank]
            process.join()
            raise EngineError(f"worker rank {rank} died (exit code {process.exitcode})") from None
