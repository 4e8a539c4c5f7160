"""An engine job a tab runs and follows: `start_worker` runs it on a thread under the host's lock
(a live run's, a sweep's model's, a tuning study's), `follow_job` reads its events as every tab
that shows a job's progress does (docs/app.md §5).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Iterator, Protocol

from engine import Engine, EngineError

from .events import Failed, Finished, Loading, Waiting
from .host import EngineHost, ModelSpec

log = logging.getLogger(__name__)
POLL_SECONDS = 0.1  # longest the consumer blocks on the queue
Job = Callable[[Engine, Callable[[object], None], threading.Event], object]


def start_worker(host: EngineHost, spec: ModelSpec, job: Job, cancel: threading.Event) -> "queue.SimpleQueue[object]":
    """Run `job(engine, post, cancel)` on a daemon thread holding the host's lock; every event,
    ending with Finished or Failed, goes into the returned queue."""
    events: queue.SimpleQueue[object] = queue.SimpleQueue()

    def work() -> None:
        if not host.lock.acquire(blocking=False):
            events.put(Waiting())
            while not host.lock.acquire(timeout=POLL_SECONDS):
                if cancel.is_set():
                    return
        try:
            if cancel.is_set():
                return
            if not host.is_loaded(spec):
                events.put(Loading(spec))
            engine = host.get(spec)
            events.put(Finished(job(engine, events.put, cancel)))
        except EngineError as exc:
            events.put(Failed(str(exc)))
        except Exception as exc:  # a bug or an out-of-memory must not kill the session
            log.exception("engine job failed")
            events.put(Failed(f"internal error: {type(exc).__name__}: {exc}"))
        finally:
            host.lock.release()

    threading.Thread(target=work, name="dinfer-viz-engine", daemon=True).start()
    return events


class JobView(Protocol):
    """What a tab shows of a job besides its own results: how it ended, and the message."""

    done: bool
    failed: bool
    stopped: bool
    message: str


def follow_job(events: "queue.SimpleQueue[object]", cancel: threading.Event, view: JobView, interval: float, stopped: Callable[[], str]) -> Iterator[tuple[object | None, bool]]:
    """The job's own events (a sweep's outcomes, a study's updates) as (event, due) for the caller
    to fold into `view`, with `due` True at most every `interval` seconds: a frame is due (Gradio
    closes a generator, on Stop or a closed tab, only when it yields). What every job's view does
    alike happens here, each as (None, True): a wait for the engine or a load is said in the
    message; Stop (`cancel`) marks the view stopped with `stopped()` and ends; a failure marks it
    failed and ends (a failure after Stop is the stop's own "cancelled"); Finished ends quietly."""
    last = time.perf_counter()

    def due() -> bool:
        nonlocal last
        if time.perf_counter() - last < interval:
            return False
        last = time.perf_counter()
        return True

    while True:
        if cancel.is_set():  # what ran stays, nothing more runs
            view.done = view.stopped = True
            view.message = stopped()
            yield None, True
            return
        try:
            event = events.get(timeout=POLL_SECONDS)
        except queue.Empty:
            yield None, due()
            continue
        if isinstance(event, (Waiting, Loading)):
            view.message = "waiting for the engine: another session is running" if isinstance(event, Waiting) else f"loading {event.spec.describe()}"
            yield None, True
        elif isinstance(event, Finished):
            return
        elif isinstance(event, Failed):
            if not cancel.is_set():
                view.done = view.failed = True
                view.message = event.message
                yield None, True
                return
        else:
            yield event, due()
