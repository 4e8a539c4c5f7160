"""Continuous batching with first-done-first-out (docs/serving.md §3): every request is its own solo
run, in its own thread, and the runs' model forwards are decoded together.

The scheduler has nano-vllm's shape (its `Scheduler`: waiting and running queues, a budget per
step), cut to what a diffusion run needs. A request waits in `waiting` until `running` has room
for its row (`max_rows`, the row budget of one forward), in arrival order; it then runs as it
would alone (engine.run.forwards_routed: its run hands each model call to `Scheduler.forward`
and waits). Once every running run waits on a forward, the scheduler takes them all: the
shareable ones (engine/serving/packed.py: full forwards on the shared layer stack, any prompt or
canvas length, any decoder, seed or setting) become one packed model call, the others are called
one by one, and each run gets its own output and goes on. A run still busy on the host (a long
constraint check, a slow decoder rule) holds no other: the scheduler waits for it at most one
forward's time (the last one's, at least MIN_WAIT_SECONDS) after the first row asked, then runs
the rows that wait without it; it joins the next forward. So rows of different prompt and
generation lengths share forwards, a row joins at the next forward after a slot frees, and it
leaves the moment its own run ends (first done, first out): a short request never waits for a
long one's last block. Each run's decisions, records, stop and counts are its solo run's by
construction, sampling too (its own generator); its logits are its solo forward's up to
floating-point summation order where it was packed (packed.py).

A kind that does not share batches (`KindSettings.shares_batches`: its runs call the model
through methods of their own) runs alone: it is admitted only when nothing runs, and nothing is
admitted beside it.
"""

from __future__ import annotations

import threading
from collections import deque
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import torch

from ..hooks import RunHooks
from ..kinds import run_kind
from ..models.base import DiffusionLM, ModelOutput
from ..pipeline import Engine, TextResult
from ..run import GenerationCancelled, forwards_routed
from .batcher import MAX_BATCH, POLL_SECONDS, BatchRequest, report_failure
from .heap import release_freed_memory
from .packed import packed_forward, shareable

MIN_WAIT_SECONDS = 0.005  # the least the scheduler waits for a straggler (module docstring): a fast forward's rows still gather


def shares_forwards(engine: Engine) -> bool:
    """Whether `engine` generates in this process, where a run's forwards can be routed (a parallel
    engine's run in its workers, a launched job's on every rank at once: those keep the lockstep batcher)."""
    return engine.model.device.type != "meta" and getattr(engine, "_job", None) is None


@dataclass(eq=False)
class Slot:
    """One request's row in the scheduler: its pending forward and its answer."""

    request: BatchRequest
    alone: bool  # its kind does not share batches
    call: tuple[DiffusionLM, dict[str, Any]] | None = None  # the forward it waits on, until the scheduler takes it
    asked: float = 0.0  # time.monotonic() when it asked for that forward
    result: ModelOutput | BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    shared: int = 1  # the most rows one of its forwards decoded


class Scheduler:
    """The waiting and running queues, and the loop that runs the running rows' forwards (module
    docstring). `lock`: held for each model call (a host that holds it pauses the engine);
    `on_forward(rows)`: told of each model call and its rows."""

    def __init__(self, lock: threading.Lock, max_rows: int, on_forward: Callable[[int], None] | None = None) -> None:
        self.lock, self.max_rows, self.on_forward = lock, max_rows, on_forward
        self._cond = threading.Condition()  # guards the queues and every slot's `call`
        self.waiting: deque[Slot] = deque()
        self.running: list[Slot] = []
        self._taken: list[Slot] = []  # the rows of the forwards being run now
        self._forward_seconds = 0.0  # the last round of forwards' time: how long a straggler is waited for
        # the loop's thread, while any row runs: started by the first row admitted to an empty
        # `running`, ended by the last to leave, so an idle server (or a dropped app) holds none
        self.thread: threading.Thread | None = None

    def _admissible(self, slot: Slot) -> bool:
        if self.waiting[0] is not slot or len(self.running) >= self.max_rows:
            return False
        return not self.running or not (slot.alone or any(r.alone for r in self.running))

    def admit(self, slot: Slot, on_wait: Callable[[], None]) -> bool:
        """Queue `slot` and block until it runs (True), or until its request is cancelled while
        it waits (False); `on_wait` is called once if it has to wait."""
        with self._cond:
            self.waiting.append(slot)
            told = False
            while not self._admissible(slot):
                if slot.request.cancel.is_set():
                    self.waiting.remove(slot)
                    self._cond.notify_all()  # the next one may be admissible now
                    return False
                if not told:
                    on_wait()
                    told = True
                self._cond.wait(POLL_SECONDS)
            self.waiting.popleft()
            self.running.append(slot)
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="dinfer-scheduler", daemon=True)
                self.thread.start()
            self._cond.notify_all()
            return True

    @property
    def rows_at_forward(self) -> int:
        """Running rows that wait on a forward (queued, or being run): the engine's state a test
        reads to know every row has reached the scheduler."""
        with self._cond:
            return sum(1 for s in self.running if s.call is not None or s in self._taken)

    def leave(self, slot: Slot) -> None:
        """Its run ended: its row frees at once."""
        with self._cond:
            self.running.remove(slot)
            self._cond.notify_all()

    def forward(self, slot: Slot, model: DiffusionLM, inputs: dict[str, Any]) -> ModelOutput:
        """A routed run's model call (engine.run.forwards_routed): wait for the scheduler to run it.
        A run cancelled while its forward is still queued leaves at once; one already taken waits
        for its forward (shared with others, it cannot stop for this run alone)."""
        with self._cond:
            slot.done.clear()
            slot.call, slot.asked = (model, inputs), time.monotonic()
            self._cond.notify_all()
        while not slot.done.wait(POLL_SECONDS):
            if slot.request.cancel.is_set():
                with self._cond:
                    if slot.call is not None:  # not taken yet
                        slot.call = None
                        self._cond.notify_all()
                        raise GenerationCancelled("generation cancelled")
        result, slot.result = slot.result, None
        if isinstance(result, BaseException):
            raise result
        assert result is not None
        return result

    def _loop(self) -> None:
        """Once every running row waits on a forward, or the first to ask has waited a forward's
        time for the others (module docstring), run the rows that wait; end when no row runs.
        The engine's lock is taken before the rows are: a host that holds it pauses the engine,
        and the rows gather meanwhile."""
        while True:
            with self._cond:
                while not any(s.call is not None for s in self.running):
                    if not self.running:  # under the lock: a row admitted after this starts a new thread
                        self.thread = None
                        return
                    self._cond.wait()
            with self.lock:
                with self._cond:
                    while True:
                        asking = [s for s in self.running if s.call is not None]
                        if not asking or len(asking) == len(self.running):  # none left (cancelled while queued), or all
                            break
                        left = min(s.asked for s in asking) + max(self._forward_seconds, MIN_WAIT_SECONDS) - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                    self._taken = asking
                    taken = [(s, s.call) for s in asking]
                    for s in asking:
                        s.call = None
                if not taken:
                    continue
                start = time.monotonic()
                self._run(taken)  # type: ignore[arg-type]
                self._forward_seconds = time.monotonic() - start
            with self._cond:
                self._taken = []

    def _run(self, taken: list[tuple[Slot, tuple[DiffusionLM, dict[str, Any]]]]) -> None:
        """The shareable forwards of each model as one packed call, the others one by one (the
        engine's lock held)."""
        groups: list[list[tuple[Slot, DiffusionLM, dict[str, Any]]]] = []
        shared: dict[int, list] = {}
        for slot, (model, inputs) in taken:
            if shareable(model, inputs):
                if id(model) not in shared:
                    shared[id(model)] = []
                    groups.append(shared[id(model)])
                shared[id(model)].append((slot, model, inputs))
            else:
                groups.append([(slot, model, inputs)])
        for group in groups:
            slots = [slot for slot, _, _ in group]
            try:
                with torch.inference_mode():  # the engine's lock is held (`_loop`)
                    outputs: list[Any] = packed_forward(group[0][1], [inputs for _, _, inputs in group])
            except BaseException as exc:  # each run fails with it, as its solo run would
                outputs = [exc] * len(group)
            if self.on_forward is not None:
                self.on_forward(len(group))
            for slot, output in zip(slots, outputs):
                slot.result = output
                if len(group) > slot.shared:
                    slot.shared = len(group)
                    slot.request.sink.batched(len(group))
                slot.done.set()


class ContinuousBatcher:
    """The server's batcher with continuous batching (module docstring); the lockstep `Batcher`'s
    interface (submit, waiting, running, lock, max_batch)."""

    def __init__(self, lock: threading.Lock, engine_for: Callable[[list[BatchRequest]], Engine], max_batch: int = MAX_BATCH,
                 on_forward: Callable[[int], None] | None = None) -> None:
        self.engine_for, self.max_batch = engine_for, max_batch
        self.scheduler = Scheduler(lock, max_batch, on_forward)

    @property
    def lock(self) -> threading.Lock:
        return self.scheduler.lock

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet running."""
        return len(self.scheduler.waiting)

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    def submit(self, request: BatchRequest) -> None:
        """Start a request; its news arrives at its sink (waiting, started, batched, records, then finished or failed)."""
        threading.Thread(target=self._serve, args=(request,), name="dinfer-row", daemon=True).start()

    def _serve(self, request: BatchRequest) -> None:
        try:
            engine = self.engine_for([request])
            slot = Slot(request, alone=not run_kind(request.config, engine.model).settings.shares_batches)
        except Exception as exc:
            report_failure([request], exc)
            return
        if not self.scheduler.admit(slot, request.sink.waiting):
            request.sink.failed("cancelled")
            return
        try:
            self._generate(engine, slot)
        except Exception as exc:
            report_failure([request], exc)
        finally:
            self.scheduler.leave(slot)
        release_freed_memory()

    def _generate(self, engine: Engine, slot: Slot) -> None:
        r = slot.request
        ids = r.prompt if isinstance(r.prompt, list) else engine.encode(r.prompt, r.config.use_chat_template)

        def on_iteration(rec: Any) -> None:
            if not r.cancel.is_set():
                r.sink.record(rec)

        hooks = RunHooks(
            trace=True, on_start=lambda header: r.sink.started(header, slot.shared), on_iteration=on_iteration, cancel=r.cancel,
            expected_ids=[engine.answer_ids(r.expected)] if r.expected else None,
        )
        with forwards_routed(partial(self.scheduler.forward, slot)):
            out = engine.generate_ids([ids], r.config, hooks, fitted=r.fitted)
        r.sink.finished(TextResult([engine.decode(out.token_ids[0])], out))
