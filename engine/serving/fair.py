"""Blocking work that may take long (compiling a request's constraint: seconds to minutes) on
threads of its own, taken in turn between clients (docs/constraints.md §1).

The event loop hands its quick blocking calls to asyncio's default thread pool (a handful of
threads); a request whose checks build an automaton would hold one of them for as long as its
build runs, and eight such requests held them all: a plain request sent meanwhile waited for a
build to end before its own checks could start. Builds are limited anyway (at most
bounded.MAX_BUILDS at once per process), so `FairPool` runs them on that many threads, apart from
the default pool, and takes its next job from the client after the last one served: a client
sending many slow constraints waits behind its own, not in front of everyone else's.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from typing import Any, Callable, TypeVar

T = TypeVar("T")
IDLE_SECONDS = 30.0  # a worker with nothing to do ends after this (an idle server holds no thread)

_Job = tuple[Callable[..., Any], tuple, asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class FairPool:
    """`workers` threads running the jobs of `run`, one client's at a time in turn (round robin over
    the clients with jobs waiting, each client's own in arrival order)."""

    def __init__(self, workers: int, name: str) -> None:
        self.workers, self.name = workers, name
        self._cond = threading.Condition()
        self._queues: OrderedDict[str, deque[_Job]] = OrderedDict()  # the next client to serve first
        self._threads = 0

    @property
    def waiting(self) -> int:
        """Jobs not yet started."""
        with self._cond:
            return sum(len(q) for q in self._queues.values())

    async def run(self, client: str, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on one of the pool's threads, in `client`'s turn; its result or exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._cond:
            self._queues.setdefault(client, deque()).append((function, args, loop, future))
            if self._threads < self.workers:
                self._threads += 1
                threading.Thread(target=self._work, name=self.name, daemon=True).start()
            self._cond.notify()
        return await future

    def _next(self) -> _Job | None:
        """The next client's next job (that client then goes last); None when idle past IDLE_SECONDS."""
        with self._cond:
            while not self._queues:
                if not self._cond.wait(IDLE_SECONDS) and not self._queues:
                    self._threads -= 1
                    return None
            client, jobs = self._queues.popitem(last=False)
            job = jobs.popleft()
            if jobs:
                self._queues[client] = jobs
            return job

    def _work(self) -> None:
        while (job := self._next()) is not None:
            function, args, loop, future = job
            if future.cancelled():  # its request has gone (the client left while it waited)
                continue
            try:
                outcome: tuple[bool, Any] = (True, function(*args))
            except BaseException as exc:  # handed to the awaiting request, as to_thread would
                outcome = (False, exc)
            try:
                loop.call_soon_threadsafe(_settle, future, outcome)
            except RuntimeError:  # the loop has closed: nobody waits
                pass


def _settle(future: "asyncio.Future[Any]", outcome: tuple[bool, Any]) -> None:
    if future.done():
        return
    ok, value = outcome
    future.set_result(value) if ok else future.set_exception(value)
