"""A constraint's automaton built where a request cannot outlast its bounds (docs/constraints.md §1).

outlines-core's build holds the GIL and cannot be interrupted, and its cost is not a function of
the regex's length: `(a|b)*a(a|b){20}` passes every bound read off its structure and determinizes
to 2^21 states (minutes, gigabytes). So every build runs in a child process with a CPU-time limit,
an address-space limit and a wall-time bound on a hang: past its CPU time the kernel ends the
child (SIGXCPU), past the memory bound its allocation fails and it dies, past the wall bound it is
killed; either way the caller gets one EngineError line and the process it is in (the server, the
app, the CLI, a script) never held the build. Children are forked by this
process's build server (builder.py: a fresh interpreter started at the first build, which imports
the engine once and never the caller's main module), so a build starts in milliseconds, not the
seconds an interpreter takes to import torch, no child is forked from a process full of threads,
and a script may build at its top level.

The wire, shared with builder.py: orders of ORDER_BYTES on the server's control socket, and frames
(an 8-byte length, then a pickle) on each build's own socket pair, private to the two processes.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..errors import EngineError

# A build's work is bounded in its own CPU time, which no load on the machine stretches: a deadline
# in wall time (what it was) failed json_object's build under a CI run's load, and a request's
# answer then depended on how busy the machine was. The wall bound is only a bound on a hang (a
# build stopped or starved of the CPU), far beyond what the work bound allows on a loaded machine.
DEADLINE_S = 120.0  # CPU seconds of one build: eight times json_object's (6-15 s of CPU), the largest common one
WALL_BOUND_S = 600.0  # wall seconds of one build, and of its wait for a free slot
MEMORY_BYTES = 2 << 30  # address space a build may add to what its child starts with
MAX_BUILDS = 2  # builds at once in this process: each may hold a CPU core and MEMORY_BYTES
REAPED_S = 10.0  # how long a build's end is waited for once it answered or was killed (the server reaps it)

BUILD, KILL = b"b", b"k"  # orders: a build (its socket attached), or the end of one (its pid)
ORDER_BYTES = 9  # the order's byte, then a pid in 8 bytes

T = TypeVar("T")
_ROOT = Path(__file__).resolve().parents[2]  # where this engine package is imported from
_slots = threading.BoundedSemaphore(MAX_BUILDS)
_live: dict[int, str] = {}  # the children building now (pid), and what each builds
_live_lock = threading.Lock()


def building() -> list[str]:
    """What is being built in this process now (each build's `what`, its child alive)."""
    with _live_lock:
        return sorted(_live.values())


def run_bounded(what: str, function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` (a module-level function, its arguments and result picklable) in a child
    process within DEADLINE_S of CPU time, MEMORY_BYTES and WALL_BOUND_S (waiting for a free slot,
    then building); its EngineError re-raised as is. `what` names the build in the messages of the bounds."""
    slots = _slots  # released where acquired, whatever the module's slots are by then (a test's own)
    if not slots.acquire(timeout=WALL_BOUND_S):
        raise EngineError(f"{what}: {MAX_BUILDS} other constraints are compiling and none ended within {WALL_BOUND_S:.0f} s; retry later")
    try:
        kind, value = _build(what, time.monotonic() + WALL_BOUND_S, function, args)
    finally:
        slots.release()
    if kind == "value":
        return value
    if kind == "error":
        raise EngineError(value)
    if kind == "deadline":
        raise EngineError(f"{what}: compiling its automaton took longer than {WALL_BOUND_S:.0f} s and was stopped; the machine is busy: retry later")
    if value == -signal.SIGXCPU:  # RLIMIT_CPU's soft limit: the work bound
        raise EngineError(f"{what}: compiling its automaton took longer than {cpu_seconds(DEADLINE_S)} s of CPU time and was stopped; simplify it")
    if kind == "memory" or value in (-signal.SIGABRT, -signal.SIGKILL):  # the address-space limit: Rust aborts on a failed allocation, Python raises MemoryError
        raise EngineError(f"{what}: compiling its automaton needed more than {MEMORY_BYTES / 2**30:.3g} GiB of memory and was stopped; simplify it")
    raise EngineError(f"{what}: the process compiling its automaton ended without an answer (exit code {value})")


def _build(what: str, deadline: float, function: Callable[..., Any], args: tuple) -> tuple[str, Any]:
    """(kind, value): the child's answer, ("deadline", None), or ("exit", its exit code; None when
    the server ended) when it ended without one. Returns once the child has ended and been reaped,
    killed first unless it answered."""
    server = _Server.get()
    mine, theirs = socket.socketpair()
    pid, answer = None, None
    with mine:
        try:
            try:
                server.order(BUILD, 0, theirs)
            finally:
                theirs.close()
            mine.settimeout(max(0.001, deadline - time.monotonic()))
            _, pid = receive(mine)
            with _live_lock:
                _live[pid] = what
            path = [os.path.abspath(entry) for entry in sys.path]  # '' (a script's directory, -c's cwd) is relative
            send(mine, (path, MEMORY_BYTES, cpu_seconds(DEADLINE_S)))
            send(mine, (function, args))
            mine.settimeout(max(0.001, deadline - time.monotonic()))
            answer = receive(mine)
        except TimeoutError:
            answer = ("deadline", None)
        except (EOFError, OSError):  # the child ended without an answer, or the server did
            answer = ("exit", _exit_code(mine))
        finally:
            if pid is not None and (answer is None or answer[0] != "exit"):
                if answer is None or answer[0] == "deadline":  # no answer (the caller interrupted, too)
                    with contextlib.suppress(OSError):  # the server ended, and its children with it
                        server.order(KILL, pid)
                _exit_code(mine)
            with _live_lock:
                _live.pop(pid, None)
    return answer


def cpu_seconds(seconds: float) -> int:
    """RLIMIT_CPU counts whole seconds: `seconds` rounded up, at least 1."""
    return max(1, math.ceil(seconds))


def _exit_code(build: socket.socket) -> int | None:
    """The build's child's exit code once the server has reaped it (REAPED_S at most); None when
    the server ended first."""
    build.settimeout(REAPED_S)
    try:
        while True:
            kind, value = receive(build)
            if kind == "exit":
                return value
    except (EOFError, OSError):
        return None


class _Server:
    """This process's build server (builder.py): started at the first build, again if it ended;
    a process forked from this one starts its own."""

    _current: _Server | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.control, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(_ROOT), os.environ.get("PYTHONPATH"))))}
        with theirs:  # in a session of its own: a terminal's Ctrl-C reaches the caller, which ends it
            self.process = subprocess.Popen(
                [sys.executable, "-m", "engine.constraints.builder", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), cwd=_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
            )
        self.sending = threading.Lock()

    @classmethod
    def get(cls) -> _Server:
        with cls._lock:
            if cls._current is None or cls._current.process.poll() is not None:
                cls._current = cls()
            return cls._current

    def order(self, order: bytes, pid: int, build: socket.socket | None = None) -> None:
        """Send an order; OSError when the server has ended (the next build starts another)."""
        data = order + pid.to_bytes(ORDER_BYTES - 1, "big")
        with self.sending:
            sent = socket.send_fds(self.control, [data], [build.fileno()] if build else [])
            self.control.sendall(data[sent:])

    @classmethod
    def forget(cls) -> None:
        """In a forked child: the parent's server is the parent's (its control socket closed here,
        so the server still ends with the parent)."""
        if cls._current is not None:
            cls._current.control.close()
        cls._current, cls._lock = None, threading.Lock()


os.register_at_fork(after_in_child=_Server.forget)


def send(build: socket.socket, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    build.sendall(len(data).to_bytes(8, "big") + data)


def receive(build: socket.socket) -> Any:
    """The next frame's message; EOFError when the other end closed."""
    return pickle.loads(exactly(build, int.from_bytes(exactly(build, 8), "big")))


def exactly(stream: socket.socket, count: int) -> bytes:
    """`count` bytes from `stream`; EOFError when it closes first."""
    data = bytearray()
    while len(data) < count:
        chunk = stream.recv(min(count - len(data), 1 << 20))
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)
