"""The life of a group of worker processes, with no torch in it: start, requests, a stop that lands
on the same check on every rank, failures, timeouts and the caller's death (engine/runtime/
workers.py puts an Engine's ranks in a group; tests/test_lifecycle.py drives one with plain Python
workers, tests/lifecycle_workers.py).

- **Start.** `world` processes, spawned (fork would copy the caller's threads and CUDA state), each
  with its own environment, made anew at each start (a fresh rendezvous port), and the same
  `load(rank)`, a picklable callable run in the worker that returns its request handler. A worker
  runs this very file (`runpy.run_path`) instead of importing it: importing engine.runtime.lifecycle
  imports the package above it, and engine/__init__ imports torch. A worker so imports only what
  its `load` needs: torch and the engine for an Engine's ranks, nothing for a test's workers.
- **Requests.** `call` sends one request to every rank; each rank's handler may send messages back
  (`send`, delivered to the caller in order, with their rank) before its reply, its last message.
- **Stopping.** A stop must land at the same point on every rank: a rank that leaves a forward
  while another enters the next layer's all-reduce blocks that one forever. Every rank makes its
  cancel checks (`RankCancel.is_set`) at the same points in the same order, so they are numbered
  alike on all ranks; a stop picks the check after the furthest any rank has made (`StopFlags.stop`,
  under the lock every check takes), and every rank stops at exactly that check. The caller stops
  the ranks when its cancel flag is set or when its `deliver` raises (that exception is raised once
  every rank has stopped).
- **Failures end the whole group**: a rank's error (one line), its death (the end of its pipe), a
  rank that has not answered `stop_grace` seconds after a stop (so a frozen worker cannot hold
  Stop), a start not ready within `ready_within` seconds, or anything raised in the caller while
  it waits. Every process is killed and reaped, the caller gets EngineError (one line) or its own
  exception, and the next call starts a fresh group.
- **The caller's death.** A worker exits when its pipe closes, and a watchdog thread ends it when
  its parent process is gone, a worker frozen away from its pipe included; on Linux, spawned from
  the caller's main thread, the kernel also kills it with its parent (PR_SET_PDEATHSIG), whatever
  it is doing. Both are armed in the worker's first lines, before it imports its handler's modules. `close()` kills the
  workers: they hold nothing that needs a clean exit, and a rank stuck in an all-reduce would not
  read a polite request.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import runpy
import signal
import sys
import threading
import time
import types
import weakref
from contextlib import contextmanager
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterator

try:
    from ..errors import EngineError
except ImportError:  # this file run in a worker, outside its package: only the caller raises it
    EngineError = RuntimeError  # type: ignore[assignment,misc]

# A rank's request handler: handler(request, send, cancel) -> its reply; `send(message)` hands the
# caller a message before the reply, `cancel.is_set()` is the rank's next numbered check.
Handler = Callable[[Any, Callable[[Any], None], "RankCancel"], Any]
Load = Callable[[int], Handler]  # load(rank), run in the worker: the rank's handler
Deliver = Callable[[int, Any], None]  # deliver(rank, message), run in the caller

WORKER = "__dinfer_viz_worker__"  # the __name__ this file runs under in a worker
NEVER = 2**62  # stop_at while no stop is asked for
# How often the caller looks at its cancel flag while it waits for the ranks (a threading.Event
# cannot wake a wait on pipes); the ranks then stop within about one layer.
CANCEL_POLL_SECONDS = 0.05
# How long every rank has to answer after a stop: a healthy rank reaches its next check within one
# layer's forward; one that has not answered by then is frozen (a bound, not an expected time).
STOP_GRACE_SECONDS = 10.0
PARENT_POLL_SECONDS = 0.2  # how often a worker's watchdog looks for its parent
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class StopFlags:
    """Shared by the caller and the ranks: how many cancel checks each rank has made in this
    request, and the check at which every rank stops. Made of multiprocessing's own shared objects
    (`parts`), which is how it crosses to a worker."""

    def __init__(self, lock: Any, checks: Any, stop_at: Any) -> None:
        self.lock, self.checks, self.stop_at = lock, checks, stop_at

    @classmethod
    def new(cls, ctx: Any, world: int) -> "StopFlags":
        return cls(ctx.Lock(), ctx.RawArray("q", world), ctx.RawValue("q", NEVER))

    def parts(self) -> tuple[Any, Any, Any]:
        return self.lock, self.checks, self.stop_at

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
    """The cancel flag a rank's handler reads (engine.hooks.CancelFlag): each `is_set` is one
    numbered check."""

    def __init__(self, flags: StopFlags, rank: int) -> None:
        self.flags, self.rank = flags, rank

    def is_set(self) -> bool:
        return self.flags.check(self.rank)


def one_line(rank: int, exc: BaseException) -> str:
    """A failure in one line: an EngineError's own message, anything else with its type and the rank."""
    errors = sys.modules.get("engine.errors")  # a worker has the engine's class only if it imported the engine
    if errors is not None and isinstance(exc, errors.EngineError):
        return str(exc)
    text = str(exc).strip()
    what = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
    return f"worker rank {rank} failed: {what}"


# ---- the worker's side -------------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux's PR_SET_PDEATHSIG): it
    lands whatever the process is doing, a C call holding the GIL included, where the watchdog
    thread cannot run. The kernel sends it when the *thread* that spawned this process ends, so
    the caller asks for it only when it spawns from its main thread (whose end is the process's).
    A parent that died before the request leaves nothing to send it: checked after."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _watch_parent(parent: int) -> None:
    """End this process once its parent is gone (reparented), whatever its main thread is doing."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="parent watchdog", daemon=True).start()


def _end_now(signum: int, frame: Any) -> None:
    os._exit(128 + signum)


def _serve(rank: int, parent: int, death_signal: bool, environment: dict[str, str], pickled_load: bytes, conn: Connection, stop_parts: tuple) -> None:
    """A worker: build the handler (`load`, pickled), then answer requests until the pipe closes.
    It ends with its parent from its first lines (`_die_with_parent` where the caller asked for it,
    and the watchdog): `load` comes pickled so that unpickling it, which imports what it needs
    (torch: seconds), happens after, not in spawn's start where no watch runs yet. SIGTERM
    (multiprocessing's own at the caller's exit) ends it at once, whatever it is doing; set before
    the handler loads, so a launched rank's SIGTERM line (engine/runtime/launch.py: Job.join,
    which leaves a handler already set alone) is not raised in a worker, where nobody reads it."""
    if death_signal:
        _die_with_parent(parent)
    _watch_parent(parent)
    signal.signal(signal.SIGTERM, _end_now)
    os.environ.update(environment)
    cancel = RankCancel(StopFlags(*stop_parts), rank)

    def send(message: Any) -> None:
        conn.send(("message", message))

    try:
        try:
            handle = pickle.loads(pickled_load)(rank)
        except Exception as exc:
            conn.send(("error", one_line(rank, exc)))
            return
        conn.send(("ready", None))
        while True:
            request = conn.recv()
            try:
                reply = ("reply", handle(request, send, cancel))
            except Exception as exc:  # a closed pipe too: sending this reply then ends the worker
                reply = ("error", one_line(rank, exc))
            conn.send(reply)
    except (EOFError, OSError):  # the caller closed the pipe or died: nothing left to serve
        return


# ---- the caller's side -------------------------------------------------------------------------


def _kill(processes: list[Any], conns: list[Connection]) -> None:
    for p in processes:
        p.kill()
    for p in processes:
        p.join()
    for c in conns:
        c.close()
    processes.clear()
    conns.clear()


def _ranks(ranks: list[int]) -> str:
    return f"worker rank {ranks[0]}" if len(ranks) == 1 else f"worker ranks {', '.join(map(str, ranks))}"


class ProcessGroup:
    """`world` worker processes, each serving `load(rank)`'s handler; `call` drives them like one."""

    def __init__(
        self,
        world: int,
        load: Load,
        environments: Callable[[], list[dict[str, str]]] | None = None,
        *,
        name: str = "worker",
        stop_grace: float = STOP_GRACE_SECONDS,
        ready_within: float | None = None,
    ) -> None:
        """`environments()`: each rank's environment variables, asked anew at each start.
        `ready_within`: how long a start may take (None: as long as loading takes)."""
        self.world, self.load, self.name = world, load, name
        self.environments = environments or (lambda: [{} for _ in range(world)])
        self.stop_grace, self.ready_within = stop_grace, ready_within
        self._ctx = multiprocessing.get_context("spawn")
        self.flags = StopFlags.new(self._ctx, world)
        self._processes: list[Any] = []
        self._conns: list[Connection] = []
        self._stop_asked: float | None = None  # when this call's stop was asked (monotonic clock)
        # ends the workers when the group is collected or the interpreter exits without close()
        weakref.finalize(self, _kill, self._processes, self._conns)

    @property
    def pids(self) -> list[int]:
        """The live group's process ids (none once it ended)."""
        return [p.pid for p in self._processes]

    def start(self) -> None:
        """Spawn the ranks and wait until each has loaded (EngineError: the first failing rank's line)."""
        environments = self.environments()
        load = pickle.dumps(self.load)  # unpickled by the worker once it watches its parent (`_serve`)
        # the kernel's death signal follows the spawning thread: only the main thread's end is the process's
        death_signal = threading.current_thread() is threading.main_thread()
        try:
            for rank in range(self.world):
                mine, theirs = self._ctx.Pipe()
                self._conns.append(mine)
                arguments = (rank, os.getpid(), death_signal, environments[rank], load, theirs, self.flags.parts())
                process = self._ctx.Process(
                    target=runpy.run_path, args=(__file__,), kwargs=dict(init_globals={"WORKER_ARGUMENTS": arguments}, run_name=WORKER),
                    name=f"dinfer-viz {self.name} {rank}", daemon=True,
                )
                with _callers_script_hidden():
                    process.start()
                self._processes.append(process)
                theirs.close()  # the worker's end lives in the worker only: its death reads as EOF here
        except BaseException:
            self.close()
            raise
        self._gather(None, None, None, self.ready_within)

    def close(self) -> None:
        """Kill and reap every worker (a later call starts a fresh group)."""
        _kill(self._processes, self._conns)

    def stop(self) -> None:
        """Stop every rank of the running call at one check (from any thread)."""
        self.flags.stop()
        if self._stop_asked is None:
            self._stop_asked = time.monotonic()

    def call(self, request: Any, deliver: Deliver | None = None, cancel: Any = None) -> list[Any]:
        """Every rank handles `request`; their messages reach `deliver(rank, message)` here, in
        order; each rank's reply is returned. `cancel` (anything with `is_set()`) stops the ranks
        when set; a `deliver` that raises stops them too, and its exception is raised once they
        have stopped. A failure ends the group (EngineError, one line)."""
        if not self._processes:  # a failure or close() ended the previous group
            self.start()
        self.flags.reset()
        return self._gather(request, deliver, cancel, None)

    def _gather(self, request: Any, deliver: Deliver | None, cancel: Any, within: float | None) -> list[Any]:
        """Send `request` (None: wait for the start's "ready") to every rank, then read until each
        has sent its final message, handing the others to `deliver`."""
        finals: dict[int, Any] = {}
        raised: list[Exception] = []
        deadline = None if within is None else time.monotonic() + within
        self._stop_asked = None

        def follow_cancel() -> None:
            if cancel is not None and self._stop_asked is None and cancel.is_set():
                self.stop()

        try:
            for rank in range(self.world) if request is not None else []:
                self._send(rank, request)
            while len(finals) < self.world:
                pending = [r for r in range(self.world) if r not in finals]
                wait([self._conns[r] for r in pending], timeout=self._wait_timeout(cancel, deadline))
                for rank in pending:
                    while rank not in finals and self._conns[rank].poll():
                        kind, value = self._receive(rank)
                        if kind == "error":
                            raise EngineError(value)
                        if kind != "message":
                            finals[rank] = value
                        elif deliver is not None and not raised:
                            try:
                                deliver(rank, value)
                            except Exception as exc:
                                raised.append(exc)
                                self.stop()
                        follow_cancel()  # so a delivery that cancels stops the ranks before the next message is read
                follow_cancel()  # a wait that timed out
                self._check_time([r for r in range(self.world) if r not in finals], deadline, within)
        except BaseException:
            self.close()
            raise
        if raised:
            raise raised[0]
        return [finals[r] for r in range(self.world)]

    def _wait_timeout(self, cancel: Any, deadline: float | None) -> float | None:
        now = time.monotonic()
        bounds = [CANCEL_POLL_SECONDS] if cancel is not None and self._stop_asked is None else []
        if self._stop_asked is not None:
            bounds.append(max(0.0, self._stop_asked + self.stop_grace - now))
        if deadline is not None:
            bounds.append(max(0.0, deadline - now))
        return min(bounds) if bounds else None

    def _check_time(self, pending: list[int], deadline: float | None, within: float | None) -> None:
        now = time.monotonic()
        if pending and self._stop_asked is not None and now >= self._stop_asked + self.stop_grace:
            raise EngineError(f"{_ranks(pending)} did not stop within {self.stop_grace:g} s of the stop; the {self.name} processes were ended")
        if pending and deadline is not None and now >= deadline:
            raise EngineError(f"{_ranks(pending)} did not get ready within {within:g} s; the {self.name} processes were ended")

    def _send(self, rank: int, message: Any) -> None:
        try:
            self._conns[rank].send(message)
        except OSError:
            raise self._lost(rank) from None

    def _receive(self, rank: int) -> tuple[str, Any]:
        try:
            return self._conns[rank].recv()
        except (EOFError, OSError):
            raise self._lost(rank) from None

    def _lost(self, rank: int) -> EngineError:
        process = self._processes[rank]
        process.join(self.stop_grace)  # its pipe has ended: it is exiting
        if process.exitcode is None:
            return EngineError(f"worker rank {rank} closed its pipe")
        return EngineError(f"worker rank {rank} died (exit code {process.exitcode})")


@contextmanager
def _callers_script_hidden() -> Iterator[None]:
    """While a worker is spawned, `__main__` is a bare module with no file. Spawn prepares each child
    by running the caller's main script again ("safe importing of the main module"): a plain script
    that starts an Engine at its top level would start one in each of its own workers, which fail
    (and the app's workers would import gradio for nothing). A worker needs nothing from it: its
    target is this file and its `load` was pickled above, from the engine's own modules."""
    script = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = script


if __name__ == WORKER:  # a spawned worker running this file (ProcessGroup.start)
    _serve(*WORKER_ARGUMENTS)  # type: ignore[name-defined]  # noqa: F821
