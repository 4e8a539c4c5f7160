"""Plain Python workers for engine/runtime/lifecycle.py's tests (tests/test_lifecycle.py): a worker
process unpickles these by reference, so this module imports no torch and nothing of the engine.

`load(behaviour, rank)` is what a ProcessGroup runs in each worker: it returns the handler
`handle(request, send, cancel)` of the named behaviour. A request is a (what, argument) pair."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable


def _freeze() -> None:
    """Never return and never read the pipe again (only a kill ends it)."""
    threading.Event().wait()


def _count(rank: int, send: Callable[[Any], None], cancel: Any, freeze: int | None) -> tuple[str, int]:
    """Check the cancel flag forever, rank 0 reporting each check; rank `freeze` reports once, then freezes."""
    if rank == freeze:
        send(("frozen", rank))
        _freeze()
    check = 0
    while True:
        check += 1
        if cancel.is_set():
            return ("stopped", check)
        if rank == 0:
            send(("check", check))


def handle(rank: int, request: tuple[str, Any], send: Callable[[Any], None], cancel: Any) -> Any:
    what, argument = request
    if what == "echo":  # `argument` messages from every rank, then its reply
        for i in range(argument):
            send((rank, i))
        return (rank, "echo", argument)
    if what == "pid":
        return os.getpid()
    if what == "environment":
        return os.environ.get("LIFECYCLE_TEST")
    if what == "modules":  # which of these the worker has imported
        return sorted(m for m in ("torch", "engine", "numpy") if m in sys.modules)
    if what == "count":  # until stopped; `argument`: the rank that freezes instead, or None
        return _count(rank, send, cancel, argument)
    if what == "fail" and rank == argument:
        raise ValueError("told to fail\nsecond line")
    if what == "die" and rank == argument:
        os._exit(3)
    return None


def load(behaviour: str, rank: int) -> Callable[[tuple, Callable[[Any], None], Any], Any]:
    """Rank `rank`'s handler; `behaviour` "cannot load r" / "hangs loading r" fails rank r's load."""
    if behaviour == f"cannot load {rank}":
        raise ValueError(f"no shard for rank {rank}\nsecond line")
    if behaviour == f"hangs loading {rank}":
        _freeze()
    return lambda request, send, cancel: handle(rank, request, send, cancel)
