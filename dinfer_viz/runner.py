"""Runs the engine for the UI: a worker thread under the host's lock, time-throttled frames, cancel.

The engine runs on a worker thread and pushes the trace header (its `on_start` hook) and then each
IterationRecord (`on_iteration`) into a queue; the UI's generator drains the queue and yields a `Frame` at most `fps`
times a second (plots at most `plot_hz`), always the first and the last. Gradio never drops
streamed frames, so yielding per iteration would let a fast engine build a backlog and the
"live" view fall behind. When the generator is closed (Stop, a client that left), its `finally`
sets the engine's cancel event, and the engine stops before its next iteration.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from engine import Engine, EngineError, GenerationConfig, IterationRecord, Trace

from .host import EngineHost, ModelSpec
from .timeline import Timeline

log = logging.getLogger(__name__)
POLL_SECONDS = 0.1  # longest the consumer blocks on the queue
# Longest a live run goes without yielding: Gradio can close (Stop, a closed tab) a generator only
# when it yields, and one forward on a long canvas can take many seconds without an event.
HEARTBEAT_SECONDS = 1.0


# ---- what the worker tells the consumer ------------------------------------------------------
@dataclass
class Waiting:
    """Another session holds the engine."""


@dataclass
class Loading:
    spec: ModelSpec


@dataclass
class Started:
    trace: Trace  # the engine's header (initial canvas, ids, token strings) the live timeline grows from


@dataclass
class Finished:
    value: object  # the job's return value (a TextResult for a run)


@dataclass
class Failed:
    message: str


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


class FrameClock:
    """Decides when a frame (and its plots) is due: at most `fps` frames and `plot_hz` plot
    redraws per second, and not so often that the UI's share of the wall time (a frame's yield
    to the generator's resumption: building the views, Gradio's diff and send) exceeds `budget`,
    so a slow machine gets fewer frames instead of a slower engine. Costs are smoothed, and the
    gaps capped, so one slow frame (a GC pause, a busy CPU) never freezes the view for long."""

    MAX_FRAME_GAP = 1.0  # seconds
    MAX_PLOT_GAP = 2.0
    SMOOTHING = 0.3  # weight of the newest cost

    def __init__(self, fps: float, plot_hz: float, budget: float = 0.25) -> None:
        self.fps, self.plot_hz, self.budget = fps, plot_hz, budget
        self.last_frame = float("-inf")
        self.last_plot = float("-inf")
        self.frame_cost = 0.0  # smoothed UI seconds of a frame without plots
        self.plot_cost = 0.0  # ... and with plots

    @property
    def frame_interval(self) -> float:
        return min(max(1.0 / self.fps, self.frame_cost / self.budget), max(self.MAX_FRAME_GAP, 1.0 / self.fps))

    @property
    def plot_interval(self) -> float:
        return min(max(1.0 / self.plot_hz, self.plot_cost / self.budget), max(self.MAX_PLOT_GAP, 1.0 / self.plot_hz))

    def wait(self, now: float) -> float:
        """Seconds until the next frame may go."""
        return max(0.0, self.last_frame + self.frame_interval - now)

    def tick(self, now: float, force: bool = False) -> tuple[bool, bool]:
        """(send a frame, redraw plots with it); records the send."""
        if not force and now - self.last_frame < self.frame_interval:
            return False, False
        plots = force or now - self.last_plot >= self.plot_interval
        self.last_frame = now
        if plots:
            self.last_plot = now
        return True, plots

    def spent(self, seconds: float, plots: bool) -> None:
        """What the UI took for the frame just sent."""
        if plots:
            self.plot_cost += self.SMOOTHING * (seconds - self.plot_cost)
        else:
            self.frame_cost += self.SMOOTHING * (seconds - self.frame_cost)


@dataclass
class Frame:
    stage: str  # "waiting" | "loading" | "running" | "busy" (a forward without news) | "done" | "error"
    wall: float  # seconds since the run was asked for (includes the UI)
    plots: bool  # redraw the plots with this frame
    timeline: Timeline | None = None  # live: keeps growing after the yield; read `shown`
    text: str = ""  # the engine's decoded text (done)
    message: str = ""  # what the stage means, or the error
    shown: int = 0  # records in the timeline when the frame was made

    def __post_init__(self) -> None:
        if self.timeline is not None:
            self.shown = self.timeline.iterations


def run_live(host: EngineHost, spec: ModelSpec, prompt: str, config: GenerationConfig, fps: float = 20.0, plot_hz: float = 3.0) -> Iterator[Frame]:
    """Generate `prompt` with `config` and yield throttled frames of the growing timeline."""
    t0 = time.perf_counter()
    cancel = threading.Event()

    def job(engine: Engine, post: Callable[[object], None], cancel: threading.Event) -> object:
        return engine.generate(prompt, config, trace=True, on_start=lambda header: post(Started(header)), on_iteration=post, cancel=cancel)

    events = start_worker(host, spec, job, cancel)
    clock = FrameClock(fps, plot_hz)
    timeline: Timeline | None = None
    pending = False  # records arrived since the last frame
    last_yield = time.perf_counter()
    try:
        while True:
            try:
                event = events.get(timeout=min(POLL_SECONDS, clock.wait(time.perf_counter())) if pending else POLL_SECONDS)
            except queue.Empty:
                event = None
                if time.perf_counter() - last_yield >= HEARTBEAT_SECONDS:
                    last_yield = time.perf_counter()
                    yield Frame("busy", last_yield - t0, False, message="generating: a forward is running")
            while event is not None:
                if isinstance(event, IterationRecord) and timeline is not None:
                    timeline.add(event)  # its token strings are already in the header's `tokens`
                    pending = True
                elif isinstance(event, Started):
                    timeline = Timeline(event.trace)
                    clock.tick(time.perf_counter(), force=True)
                    yield Frame("running", time.perf_counter() - t0, True, timeline, message="generating")
                elif isinstance(event, Waiting):
                    yield Frame("waiting", time.perf_counter() - t0, False, message="waiting for the engine: another session is running")
                elif isinstance(event, Loading):
                    yield Frame("loading", time.perf_counter() - t0, False, message=f"loading {event.spec.describe()}")
                elif isinstance(event, Finished):
                    result = event.value
                    clock.tick(time.perf_counter(), force=True)
                    yield Frame("done", time.perf_counter() - t0, True, Timeline(result.output.trace), text=result.text, message="done")
                    return
                elif isinstance(event, Failed):
                    yield Frame("error", time.perf_counter() - t0, True, timeline, message=event.message)
                    return
                try:
                    event = events.get_nowait()
                except queue.Empty:
                    event = None
            if pending:
                send, plots = clock.tick(time.perf_counter())
                if send:
                    pending = False
                    sent = last_yield = time.perf_counter()
                    yield Frame("running", sent - t0, plots, timeline, message="generating")
                    clock.spent(time.perf_counter() - sent, plots)
    finally:
        cancel.set()
