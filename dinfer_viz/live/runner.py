"""Runs the engine for the UI: a worker thread under the host's lock, paced frames, cancel
(docs/app.md §5, Live streaming).

The engine's worker thread posts the trace header (`on_start`) and each IterationRecord
(`on_iteration`) into a queue; `run_live` drains it and yields a `Frame` when the time limits
(`FrameClock`), the page's painting (`PagePacer`) and the playback speed (`Playback`) allow, and
at least once a second (a "busy" frame), since Gradio can close a generator only when it yields;
closing it sets the engine's cancel event, and the engine stops before its next layer.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from engine import Engine, EngineError, GenerationConfig, IterationRecord, RunHooks
from engine.pipeline import TextResult

from .batching import RunBatcher
from .events import Failed, Finished, Loading, Started, Waiting
from .host import EngineHost, ModelSpec
from .jobs import POLL_SECONDS, start_worker
from ..reading.timeline import Timeline

# Longest a live run goes without yielding: Gradio can close (Stop, a closed tab) a generator only
# when it yields, and one forward on a long canvas can take many seconds without an event.
HEARTBEAT_SECONDS = 1.0
MAX_UNPAINTED = 2  # frames sent that the page has not painted yet, at most
# A page that reported once but has said nothing for this long while frames wait is presumed to
# have lost a report (a failed request, a hidden tab that stopped animation frames, a paint that
# threw): the next frame goes anyway and carries everything, so a lost report costs this long, not
# the rest of the live view. A page that is only slow is sent one frame per this interval.
REPORT_GRACE_SECONDS = 5.0


class FrameClock:
    """Decides when a frame (and its plots) is due by time: at most `fps` frames and `plot_hz`
    plot redraws per second, and not so often that the server's share of the wall time (a frame's
    yield to the generator's resumption: building the views, Gradio's diff and send) exceeds
    `budget`, so a slow machine gets fewer frames instead of a slower engine. Costs are smoothed,
    and the gaps capped, so one slow frame (a GC pause, a busy CPU) never freezes the view for long."""

    MAX_FRAME_GAP = 1.0  # seconds
    MAX_PLOT_GAP = 2.0
    SMOOTHING = 0.3  # weight of the newest cost

    def __init__(self, fps: float, plot_hz: float, budget: float = 0.25) -> None:
        self.fps, self.plot_hz, self.budget = fps, plot_hz, budget
        self.last_frame = float("-inf")
        self.last_plot = float("-inf")
        self.frame_cost = 0.0  # smoothed server seconds of a frame without plots
        self.plot_cost = 0.0  # ... and with plots

    @property
    def frame_interval(self) -> float:
        return min(max(1.0 / self.fps, self.frame_cost / self.budget), max(self.MAX_FRAME_GAP, 1.0 / self.fps))

    @property
    def plot_interval(self) -> float:
        return min(max(1.0 / self.plot_hz, self.plot_cost / self.budget), max(self.MAX_PLOT_GAP, 1.0 / self.plot_hz))

    def share(self, streams: int) -> None:
        """`streams` runs of one engine batch stream at once: each takes its share of the frame
        rate, the plot rate and the server's budget, so a batch costs the server what one run does
        (on a CPU, eight sessions' frames at the full rate took more than the engine saved)."""
        self.fps, self.plot_hz, self.budget = self.fps / streams, self.plot_hz / streams, self.budget / streams

    def wait(self, now: float) -> float:
        """Seconds until the next frame may go."""
        return max(0.0, self.last_frame + self.frame_interval - now)

    def tick(self, now: float, force: bool = False, plots_allowed: bool = True) -> tuple[bool, bool]:
        """(send a frame, redraw plots with it); records the send. `plots_allowed`: False holds
        the plots back (the page is still painting) without spending their turn."""
        if not force and now - self.last_frame < self.frame_interval:
            return False, False
        plots = force or (plots_allowed and now - self.last_plot >= self.plot_interval)
        self.last_frame = now
        if plots:
            self.last_plot = now
        return True, plots

    def spent(self, seconds: float, plots: bool) -> None:
        """What the server took for the frame just sent."""
        if plots:
            self.plot_cost += self.SMOOTHING * (seconds - self.plot_cost)
        else:
            self.frame_cost += self.SMOOTHING * (seconds - self.frame_cost)


class Painted:
    """Posted into a live run's event queue when its page reported a frame: the consumer, blocked
    on that queue, looks at once whether the next frame may go."""


class PagePacer:
    """What one run's page has painted. Frames are numbered from 0 as they are sent; the page
    reports the latest it painted (`painted`, from the web server's threads; `wake` tells the
    run's consumer). A frame carries the changes since the last frame the page reported painted,
    which is the state it holds (or everything, before any report: an API client never sends one).
    Plot redraws cost a browser far more than the grid: one goes only when the page has painted
    every frame sent, and no sooner after the previous one than the time that one took to be
    painted times (1 / PLOT_SHARE - 1), so plots take at most that share of the page's time."""

    PLOT_SHARE = 0.25

    def __init__(self, wake: Callable[[], None] = lambda: None) -> None:
        self.sent = 0  # frames sent so far; the next one's number
        self.latest = -1  # highest frame number the page reported painted
        self.base = -1  # the frame whose state the page holds (-1: none)
        self.shown: list[int] = []  # records each frame showed
        self.plot_frames: dict[int, float] = {}  # frames with plots not yet painted -> when sent
        self.plot_due = float("-inf")  # the next plot redraw may go from then
        self.heard = float("-inf")  # when the page last reported, or a frame last went without a report
        self._wake = wake
        self._lock = threading.Lock()

    def send(self, shown: int, plots: bool, now: float) -> tuple[int, int]:
        """Register a frame showing `shown` records: (its number, the records the page holds,
        -1 for none: the frame carries the canvas and everything)."""
        with self._lock:
            if self.latest >= 0 and self.sent - 1 - self.latest >= MAX_UNPAINTED:
                # past the limit: only after the page's silence (may_send), whose state is unknown now
                self.base, self.heard = -1, now
            number = self.sent
            self.sent += 1
            self.shown.append(shown)
            if plots:
                self.plot_frames[number] = now
            return number, (self.shown[self.base] if self.base >= 0 else -1)

    def painted(self, frame: int, now: float) -> None:
        """The page painted `frame`; -1: it holds nothing of this run (its grid was redrawn by
        another view meanwhile), so the next frame carries everything."""
        with self._lock:
            self.heard = now
            if frame < 0:
                self.base, self.latest = -1, self.sent - 1
            elif frame < self.sent:
                self.latest = max(self.latest, frame)
                self.base = max(self.base, frame)
                for number in [n for n in self.plot_frames if n <= frame]:
                    took = now - self.plot_frames.pop(number)
                    self.plot_due = max(self.plot_due, now + took * (1 / self.PLOT_SHARE - 1))
        self._wake()

    def may_send(self, now: float) -> bool:
        """A page that reports (an API client never does) is at most MAX_UNPAINTED - 1 frames behind,
        unless it has been silent for REPORT_GRACE_SECONDS: then one frame goes, carrying everything
        (a report it lost would otherwise stop the live view for good)."""
        with self._lock:
            return self.latest < 0 or self.sent - 1 - self.latest < MAX_UNPAINTED or now - self.heard >= REPORT_GRACE_SECONDS

    def plots_allowed(self, now: float) -> bool:
        with self._lock:
            return self.latest < 0 or (self.latest == self.sent - 1 and now >= self.plot_due)


# Live runs by id: what the pages' reports name. Ids are random, so a page can only pace the runs
# it was sent.
_PACERS: dict[str, PagePacer] = {}
_PACERS_LOCK = threading.Lock()


def acknowledge(run: str, frame: int) -> None:
    """The page painted frame `frame` of live run `run` (-1: it lost the run's grid); ignored once
    the run has ended."""
    with _PACERS_LOCK:
        pacer = _PACERS.get(run)
    if pacer is not None:
        pacer.painted(frame, time.perf_counter())


@dataclass
class Frame:
    stage: str  # "waiting" | "loading" | "running" | "busy" (no news for a while) | "done" | "error" | "stopped" (the last)
    wall: float  # seconds since the server took the run (run_live's start): not the page's request or painting
    plots: bool = False  # redraw the plots with this frame
    timeline: Timeline | None = None  # live: keeps growing after the yield; read `shown`
    text: str = ""  # the engine's decoded text (done)
    message: str = ""  # what the stage means, or the error
    shown: int = 0  # records of the timeline this frame shows
    run: str = ""  # the live run's id, which the page's reports name
    number: int = -1  # running frames: the number the page reports once it painted it
    since: int = -1  # running frames: records the page already holds (-1: none, send it all)
    live: "LiveRun | None" = None  # the run's consumer: what the page's playback controls and Stop act on


class Playback:
    """How many records a live view shows: all of them (`speed` 0), or `speed` more per second,
    never more than have arrived (a slow engine is followed, not overtaken). The page's playback
    controls act on it, apart from the engine (which runs on, or has finished, either way):
    `pause` holds the view where it is, `resume` goes on from there, `skip` shows every record
    that arrived and follows the engine at its own pace from then on."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self.position = 0.0
        self.last: float | None = None
        self.paused = False

    def shown(self, arrived: int, now: float) -> int:
        """Records to show at `now`, `arrived` of them having come from the engine."""
        if self.speed <= 0 and not self.paused:
            self.position = float(arrived)
            return arrived
        if self.last is not None and not self.paused:
            self.position = min(float(arrived), self.position + (now - self.last) * self.speed)
        self.last = now
        return int(self.position)

    def wait(self, arrived: int) -> float:
        """Seconds until one more record shows (inf: all that arrived show already, or paused)."""
        if self.paused or self.speed <= 0 or self.position >= arrived:
            return float("inf")
        return (int(self.position) + 1 - self.position) / self.speed

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def skip(self) -> None:
        self.paused, self.speed = False, 0.0


def run_live(
    host: EngineHost,
    spec: ModelSpec,
    prompt: str,
    config: GenerationConfig,
    fps: float = 20.0,
    plot_hz: float = 3.0,
    speed: float = 0.0,
    batcher: RunBatcher | None = None,
    expected: str = "",
    fitted: bool = False,
) -> Iterator[Frame]:
    """Generate `prompt` with `config` and yield paced frames of the growing timeline (module
    docstring); `speed`: iterations shown per second, 0 for as fast as the engine. With `batcher`,
    a run that waits for the engine may join other sessions' runs in one batch
    (dinfer_viz/live/batching.py); without, it runs alone. `expected`: the answer the header carries
    (as ids, their strings in its tokens) for the views to mark where the run departs from it.
    `fitted`: `config` is engine.kinds.fit's for this model (the page's `parse`): not fitted again."""
    t0 = time.perf_counter()
    cancel = threading.Event()

    def job(engine: Engine, post: Callable[[object], None], cancel: threading.Event) -> object:
        hooks = RunHooks(trace=True, on_start=lambda header: post(Started(header)), on_iteration=post, cancel=cancel)
        return engine.generate(prompt, config, hooks, expected=expected or None, fitted=fitted)

    events = batcher.submit(spec, prompt, config, cancel, expected, fitted) if batcher is not None else start_worker(host, spec, job, cancel)
    run = LiveRun(events, FrameClock(fps, plot_hz), Playback(speed), t0, cancel)
    with _PACERS_LOCK:
        _PACERS[run.id] = run.pacer
    try:
        yield from run.frames()
    finally:
        cancel.set()
        with _PACERS_LOCK:
            del _PACERS[run.id]
        run.ended.set()


class LiveRun:
    """One live run's consumer: drains the engine's `events`, keeps the growing timeline and
    yields the frames the clock, the page and the playback allow (module docstring)."""

    def __init__(
        self, events: "queue.SimpleQueue[object]", clock: FrameClock, playback: Playback, t0: float, cancel: threading.Event | None = None
    ) -> None:
        self.events, self.clock, self.playback, self.t0 = events, clock, playback, t0
        self.cancel = cancel or threading.Event()
        self.halted = False  # Stop: the next frame is the last ("stopped"), the engine is cancelled
        self.ended = threading.Event()  # the stream has ended (run_live's caller sent its last frame)
        self.id = secrets.token_hex(8)  # what the page's reports name
        self.pacer = PagePacer(wake=lambda: events.put(Painted()))
        self.timeline: Timeline | None = None
        self.result: TextResult | None = None  # the engine's once it finished
        self.failed = False
        self.status = "starting"  # what a heartbeat says while there is no news
        self.shown = 0  # records shown by the last frame sent
        self.last_yield = time.perf_counter()

    # ---- the page's playback controls (called from the web server's threads) -------------------
    @property
    def engine_done(self) -> bool:
        """The engine has finished this run (its result is in): what is left is playback."""
        return self.result is not None

    @property
    def paused(self) -> bool:
        return self.playback.paused

    def pause(self) -> None:
        """Hold the view at the records it shows; the engine runs on (and is freed when done)."""
        self.playback.pause()
        self.events.put(Painted())  # wake the consumer: its heartbeat now says nothing

    def resume(self) -> None:
        self.playback.resume()
        self.events.put(Painted())

    def skip(self) -> None:
        """Show every record that arrived at once, then follow the engine at its pace."""
        self.playback.skip()
        self.events.put(Painted())

    def halt(self, wait: float = 30.0) -> bool:
        """Stop: cancel the engine (it stops before its next layer) and end the stream with one
        "stopped" frame carrying every record that arrived (and the result, when the engine had
        finished and only playback was left). The stream itself sends that frame, so nothing it
        sent before can land after it. Waits up to `wait` seconds for the stream to end; whether it did."""
        self.halted = True
        self.cancel.set()
        self.events.put(Painted())
        return self.ended.wait(wait)

    def frames(self) -> Iterator[Frame]:
        while True:
            if self.halted:
                tl = self.timeline
                yield self._frame("stopped", plots=True, timeline=tl, text=self.result.text if self.result else "", message="stopped", shown=tl.iterations if tl else 0)
                return
            for event in self._arrived():
                if self.halted and not isinstance(event, IterationRecord):
                    break  # Stop: the cancel's failure (or a late end) is not news; the stopped frame comes next
                yield from self._on_event(event)
                if self.failed:
                    return
            now = time.perf_counter()
            target = self.playback.shown(self.timeline.iterations, now) if self.timeline is not None else 0
            if self.result is not None and self.timeline is not None and target >= self.timeline.iterations:
                self.clock.tick(now, force=True)
                trace = self.result.output.trace
                yield self._frame("done", plots=True, timeline=Timeline(trace), text=self.result.text, message="done", shown=len(trace.iterations))
                return
            if self.timeline is not None and target > self.shown and self.pacer.may_send(now):
                send, plots = self.clock.tick(now, plots_allowed=self.pacer.plots_allowed(now))
                if send:
                    self.shown = target
                    number, since = self.pacer.send(self.shown, plots, now)
                    yield self._frame("running", plots=plots, timeline=self.timeline, message="generating", shown=self.shown, number=number, since=since)
                    self.clock.spent(time.perf_counter() - self.last_yield, plots)
                    continue
            if time.perf_counter() - self.last_yield >= HEARTBEAT_SECONDS:
                # nothing new (a long forward, a wait, a slow playback, a page still painting): yield so Gradio can close us
                yield self._frame("busy", message=self._busy_message(target))

    def _busy_message(self, target: int) -> str:
        """What a heartbeat says: a playback behind the engine says so (the engine may long have
        finished: a slow playback is not a slow forward), else the engine's status; nothing while
        the page paints what is due or the playback is paused."""
        if self.playback.paused or target > self.shown:
            return ""
        made = self.timeline.iterations if self.timeline is not None else 0
        if made > self.shown:
            engine = "the engine has finished" if self.result is not None else "the engine runs ahead"
            return f"playing back: iteration {self.shown} of {made} ({engine})"
        return self.status

    def _arrived(self) -> Iterator[object]:
        """The events come in: sleeps until one, or until the clock allows a frame when there is
        something to show and the page is ready for it, or until the playback shows one more
        record; then every event already queued."""
        arrived = self.timeline.iterations if self.timeline is not None else 0
        now = time.perf_counter()
        due = self.timeline is not None and self.playback.shown(arrived, now) > self.shown and self.pacer.may_send(now)
        timeout = self.clock.wait(now) if due else self.playback.wait(arrived)
        try:
            yield self.events.get(timeout=min(POLL_SECONDS, timeout))
            while True:
                yield self.events.get_nowait()
        except queue.Empty:
            return

    def _on_event(self, event: object) -> Iterator[Frame]:
        if isinstance(event, IterationRecord) and self.timeline is not None:
            self.timeline.add(event)  # its token strings are already in the header's `tokens`
        elif isinstance(event, Started):
            yield self._started(event)
        elif isinstance(event, Waiting):
            self.status = "waiting for the engine: another session is running"
            yield self._frame("waiting", message=self.status)
        elif isinstance(event, Loading):
            self.status = f"loading {event.spec.describe()}"
            yield self._frame("loading", message=self.status)
        elif isinstance(event, Finished):
            self.result = event.value
        elif isinstance(event, Failed):
            self.failed = True
            tl = self.timeline
            yield self._frame("error", plots=True, timeline=tl, message=event.message, shown=tl.iterations if tl else 0)

    def _started(self, event: Started) -> Frame:
        """The header arrived: the first frame, the masked canvas, plots and all."""
        self.timeline = Timeline(event.trace)
        self.status = "generating: a forward is running"
        self.clock.share(event.batch)
        now = time.perf_counter()
        self.clock.tick(now, force=True)
        number, since = self.pacer.send(0, True, now)
        others = "1 other session's run" if event.batch == 2 else f"{event.batch - 1} other sessions' runs"
        joined = f" (batched with {others})" if event.batch > 1 else ""
        return self._frame("running", plots=True, timeline=self.timeline, message="generating" + joined, number=number, since=since)

    def _frame(self, stage: str, **fields: Any) -> Frame:
        self.last_yield = time.perf_counter()
        return Frame(stage, self.last_yield - self.t0, run=self.id, live=self, **fields)


def timed_passes(host: EngineHost, spec: ModelSpec, prompt: str, config: GenerationConfig, passes: int) -> Iterator[dict | None]:
    """Generate `prompt` `passes` more times with no view, for timings: yields each pass's engine
    stats (a trace footer's dict: traced like the live run, so the figures compare) as it ends, and
    None when nothing came for HEARTBEAT_SECONDS (the caller yields, so Gradio can close it).
    EngineError when the engine fails; closed early, the engine is cancelled before its next layer."""
    cancel = threading.Event()

    def job(engine: Engine, post: Callable[[object], None], cancel: threading.Event) -> None:
        for _ in range(passes):
            post(engine.generate(prompt, config, hooks=RunHooks(trace=True, cancel=cancel)).output.stats.to_dict())

    events = start_worker(host, spec, job, cancel)
    try:
        while True:
            try:
                event = events.get(timeout=HEARTBEAT_SECONDS)
            except queue.Empty:
                yield None
                continue
            if isinstance(event, dict):
                yield event
            elif isinstance(event, Failed):
                raise EngineError(event.message)
            elif isinstance(event, Finished):
                return
    finally:
        cancel.set()
