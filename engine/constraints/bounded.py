"""A constraint's automaton built where a request cannot outlast its bounds (docs/constraints.md §1).

outlines-core's build holds the GIL and cannot be interrupted, and its cost is not a function of
the regex's length: `(a|b)*a(a|b){20}` passes every bound read off its structure and determinizes
to 2^21 states (minutes, gigabytes). So every build runs in a child process with a deadline and an
address-space limit: past the deadline the child is killed; past the memory bound its allocation
fails and it dies; either way the caller gets one EngineError line and the process it is in
(the server, the app, the CLI) never held the build. Children are forked from multiprocessing's
fork server (one clean process started at the first build, which has imported this module and
its engine once), so a build starts in milliseconds, not the seconds an interpreter takes to
import torch, and no child is forked from a process full of threads.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any, Callable, TypeVar

from ..errors import EngineError

DEADLINE_S = 120.0  # one build, waiting for a free slot included: twice json_object's, the largest common one (15-60 s on a loaded 2-core machine)
MEMORY_BYTES = 2 << 30  # address space a build may add to what its child starts with
MAX_BUILDS = 2  # builds at once in this process: each may hold a CPU core and MEMORY_BYTES

T = TypeVar("T")
_context = multiprocessing.get_context("forkserver")
# the caller's main module too: a script's child would otherwise run it again at every build
_context.set_forkserver_preload(["__main__", __name__])
_slots = threading.BoundedSemaphore(MAX_BUILDS)
_live: dict[Any, str] = {}  # the children building now, and what each builds
_live_lock = threading.Lock()


def building() -> list[str]:
    """What is being built in this process now (each build's `what`, its child alive)."""
    with _live_lock:
        return sorted(_live.values())


def run_bounded(what: str, function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` (a module-level function, its arguments and result picklable) in a child
    process within DEADLINE_S (waiting for a free slot included) and MEMORY_BYTES; its EngineError
    re-raised as is. `what` names the build in the messages of the bounds."""
    deadline = time.monotonic() + DEADLINE_S
    if not _slots.acquire(timeout=DEADLINE_S):
        raise EngineError(f"{what}: {MAX_BUILDS} other constraints are compiling and none ended within {DEADLINE_S:.0f} s; retry later")
    try:
        reader, writer = _context.Pipe(duplex=False)
        child = _context.Process(target=_child, args=(writer, MEMORY_BYTES, function, args), daemon=True, name="constraint-build")
        child.start()
        writer.close()
        with _live_lock:
            _live[child] = what
        try:
            wait([reader, child.sentinel], timeout=max(0.0, deadline - time.monotonic()))
            try:
                kind, value = reader.recv() if reader.poll() else ("deadline", None)
            except EOFError:  # the child died without an answer
                child.join()
                kind, value = ("memory", None) if child.exitcode in (-signal.SIGABRT, -signal.SIGKILL) else ("died", child.exitcode)
        finally:
            child.kill()
            child.join()
            reader.close()
            with _live_lock:
                _live.pop(child, None)
    finally:
        _slots.release()
    if kind == "value":
        return value
    if kind == "error":
        raise EngineError(value)
    if kind == "deadline":
        raise EngineError(f"{what}: compiling its automaton took longer than {DEADLINE_S:.0f} s and was stopped; simplify it")
    if kind == "memory":  # the address-space limit: Rust aborts on a failed allocation, Python raises MemoryError
        raise EngineError(f"{what}: compiling its automaton needed more than {MEMORY_BYTES / 2**30:.3g} GiB of memory and was stopped; simplify it")
    raise EngineError(f"{what}: the process compiling its automaton ended without an answer (exit code {value}){_script_hint()}")


def _script_hint() -> str:
    """Why a build's child may end at once: it imports the caller's script first (Python's
    multiprocessing does, as for any process it starts), and a script whose work is not under
    `if __name__ == "__main__":` then compiles again inside it, which Python refuses; a script
    read from standard input (`python - <<EOF`) has no file to import, which it cannot start with."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is not None or not path:
        return ""
    if not os.path.isfile(path):
        return f"; the script ({path}) is not a file the process can import first: save it to a file and run that"
    return f"; if {os.path.basename(path)} runs its work at the top level, put it under `if __name__ == \"__main__\":`"


def _child(writer: Any, memory: int, function: Callable[..., Any], args: tuple) -> None:
    _die_with_parent()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _address_space() + memory
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        writer.send(("value", function(*args)))
    except EngineError as exc:
        writer.send(("error", str(exc)))
    except MemoryError:
        writer.send(("memory", ""))
    finally:
        writer.close()


def _address_space() -> int:
    """This process's virtual memory now (bytes): the child's own start, which the limit adds to."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _die_with_parent() -> None:
    """Killed when the fork server ends (it ends with the process it serves), so a build outlives
    no server, even one killed outright."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the deadline still bounds the build
        pass
    if os.getppid() == 1:  # the fork server ended before prctl took effect
        os._exit(1)
