"""Continuous batching with first-done-first-out (docs/serving.md §3): every request is its own solo
run, in its own thread, and the runs' model forwards are decoded together.

The scheduler has nano-vllm's shape (its `Scheduler`: waiting and running queues, a budget per
step), cut to what a diffusion run needs. A request waits in `waiting` until `running` has room
for its row (`max_rows`, the row budget of one forward), in arrival order; it then runs as it
would alone (engine.run.forwards_routed: its run hands each model call to `Scheduler.forward`
and waits). Once every running run waits on a forward, the scheduler takes them all: the calls
that pack together (engine/serving/packed.py: one row's forwards on the shared layer stack, with
or without a store of its own, any prompt or canvas length, any decoder, seed, setting or kind;
DiffusionGemma's denoising forwards) become one model call per kind of call, the others are
called one by one, and each run gets its own output and goes on. A run still busy on the host (a long
constraint check, a slow decoder rule) holds no other: the scheduler waits for it at most one
forward's time (the last one's, at least MIN_WAIT_SECONDS) after the first row asked, then runs
the rows that wait without it; it joins the next forward. So rows of different prompt and
generation lengths share forwards, a row joins at the next forward after a slot frees, and it
leaves the moment its own run ends (first done, first out): a short request never waits for a
long one's last block. Each run's decisions, records, stop and counts are its solo run's by
construction, sampling too (its own generator); its logits are its solo forward's up to
floating-point summation order where it was packed (packed.py).

Every kind runs so (a kind's run calls the network only through the model's call and its family's
`routed_calls`): the uniform-state kind's rows, of any prompt length and step count, share their
denoising forwards (their encoder forwards, which write each run's own cache, run one by one),
and the speculative kind's rows their draft and verify forwards, each reading its own store.

Short first (`short_first`, `--batching short-first`) and a position budget (`forward_positions`,
`--forward-positions`) change only which of the waiting rows a round takes: short first those
within SHORT_SHARE of the shortest canvas asking (`_shortest`); the budget the rows with the fewest
forwards so far, only those, while their positions fit (`_within_budget`). Either takes any row left out
MAX_SKIPPED rounds in a row, so no row starves. Lanes (`lanes`, `--forward-lanes`) run that many
rounds at once, each on a thread of its own, over the rows no other lane is running: on a CPU a
one-thread forward leaves the other cores idle, and a request that arrives while a long row's
forward runs gets its own on another core. Lanes under a budget let a row that has had fewer
forwards than every row in flight cut in: while every lane runs a round, its round starts at once
on a thread of its own, and one lane pauses before its forward's next layer until the cut-in ends
(`_may_cut_in`, `between_layers`).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Hashable

import torch

from ..hooks import RunHooks
from ..models.base import DiffusionLM
from ..pipeline import Engine, TextResult
from ..run import GenerationCancelled, forwards_routed
from .batcher import MAX_BATCH, POLL_SECONDS, BatchRequest, report_failure
from .heap import release_freed_memory
from .packed import pack_key, query_positions, run_calls

MIN_WAIT_SECONDS = 0.005  # the least the scheduler waits for a straggler (module docstring): a fast forward's rows still gather
# Short first (`--batching short-first`): a round runs the rows whose canvas is at most SHORT_SHARE
# times the shortest asking, and a longer row left out MAX_SKIPPED rounds in a row joins anyway
SHORT_SHARE = 2.0
MAX_SKIPPED = 3
LANE_THREAD, CUT_IN_THREAD = "dinfer-scheduler", "dinfer-cut-in"
_LANE = threading.local()  # `.scheduler`: the Scheduler whose lane's round this thread runs, while it may pause for a cut-in
_PAUSE_POINTS: "weakref.WeakSet[DiffusionLM]" = weakref.WeakSet()  # the models whose layers call `_pause_point`
_PAUSE_POINTS_LOCK = threading.Lock()


def _pause_point(module: torch.nn.Module, args: object) -> None:
    """A layer's forward pre-hook (`_pause_points`): a lane's round may pause here for a cut-in;
    any other thread's forward (a cut-in, a run outside the server) passes."""
    scheduler = getattr(_LANE, "scheduler", None)
    if scheduler is not None:
        scheduler.between_layers()


def _pause_points(model: DiffusionLM) -> None:
    """`_pause_point` before each of `model`'s layers, once per model: a hook that does
    nothing outside a lane's round, so it stays (a hook added while another lane's forward runs
    is safe: torch copies a module's hooks before it calls them)."""
    with _PAUSE_POINTS_LOCK:  # two lanes may meet a model first at once
        if model in _PAUSE_POINTS:
            return
        _PAUSE_POINTS.add(model)
        for layer in model.layer_modules():
            layer.register_forward_pre_hook(_pause_point)


@dataclass(eq=False)
class Slot:
    """One request's row in the scheduler: its pending forward and its answer."""

    request: BatchRequest
    call: tuple[DiffusionLM, str, dict[str, Any]] | None = None  # the model call it waits on (model, method, inputs), until the scheduler takes it
    asked: float = 0.0  # time.monotonic() when it asked for that forward
    result: Any = None  # the call's result, or the exception it raised
    done: threading.Event = field(default_factory=threading.Event)
    shared: int = 1  # the most rows one of its forwards decoded
    positions: int = 0  # its prompt and canvas: what short first compares (and the budget counts for a family's own calls)
    skipped: int = 0  # rounds in a row short first or the budget left it out
    forwards: int = 0  # the forwards it has had: what the position budget takes the fewest of first


def _left_out_counted(asking: list[Slot], chosen: list[Slot]) -> list[Slot]:
    """`chosen`, after counting for each row asking how many rounds in a row it was left out."""
    for s in asking:
        s.skipped = 0 if s in chosen else s.skipped + 1
    return chosen


class Scheduler:
    """The waiting and running queues, and the loop that runs the running rows' forwards (module
    docstring). `lock`: held while a round gathers its rows (a host that holds it starts no forward);
    `on_forward(rows)`: told of each model call and its rows; `forward_positions`: the position
    budget of a round (None: every row asking); `lanes`: the rounds run at once."""

    def __init__(self, lock: threading.Lock, max_rows: int, on_forward: Callable[[int], None] | None = None, short_first: bool = False,
                 forward_positions: int | None = None, lanes: int = 1) -> None:
        self.lock, self.max_rows, self.on_forward, self.short_first = lock, max_rows, on_forward, short_first
        self.forward_positions, self.lanes = forward_positions, lanes
        # lanes under a budget: a row with fewer forwards than every row in flight cuts in (`_may_cut_in`)
        self.cut_in = lanes > 1 and forward_positions is not None
        self._cond = threading.Condition()  # guards the queues and every slot's `call`
        self.waiting: deque[Slot] = deque()
        self.running: list[Slot] = []
        self._taken: list[Slot] = []  # the rows of the forwards being run now, in every lane
        self._forward_seconds = 0.0  # the last round of forwards' time: how long a straggler is waited for
        self._rounds = 0  # lanes' rounds being run now
        self._cutting_in = False  # a cut-in round being run
        self._yielded = 0  # lanes paused between layers for it (at most one)
        # the loop's threads, one a lane (and one for cut-ins), while any row runs: started by the first
        # row admitted to an empty `running`, ended by the last to leave, so an idle server (or a
        # dropped app) holds none
        self.threads: list[threading.Thread] = []

    def _admissible(self, slot: Slot) -> bool:
        return self.waiting[0] is slot and len(self.running) < self.max_rows

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
            for name, count in ((LANE_THREAD, self.lanes), (CUT_IN_THREAD, int(self.cut_in))):
                while sum(t.name == name for t in self.threads) < count:
                    self.threads.append(threading.Thread(target=self._loop, args=(name == CUT_IN_THREAD,), name=name, daemon=True))
                    self.threads[-1].start()
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

    def forward(self, slot: Slot, model: DiffusionLM, method: str, inputs: dict[str, Any]) -> Any:
        """A routed run's model call (engine.run.forwards_routed): wait for the scheduler to run it.
        A run cancelled while its forward is still queued leaves at once; one already taken waits
        for its forward (shared with others, it cannot stop for this run alone)."""
        with self._cond:
            slot.done.clear()
            slot.call, slot.asked = (model, method, inputs), time.monotonic()
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
        return result

    def _loop(self, cuts_in: bool = False) -> None:
        """One lane: once every running row not in another lane's forward waits on a forward, or
        the first to ask has waited a forward's time for the others (module docstring), run the
        rows that wait; end when no row runs. The engine's lock is held while a round gathers its
        rows: a host that holds it starts no forward, and the rows gather meanwhile. `cuts_in`:
        the cut-in thread, which runs only the rounds `_may_cut_in` allows."""
        while True:
            with self._cond:
                while not (self._may_cut_in() if cuts_in else any(s.call is not None for s in self.running)):
                    if not self.running:  # under the lock: a row admitted after this starts new threads
                        self.threads.remove(threading.current_thread())
                        return
                    self._cond.wait()
            with self.lock:
                with self._cond:
                    if cuts_in:
                        taken = self._take(self._cutting_in_rows())
                        self._cutting_in = bool(taken)
                    else:
                        taken = self._take(self._gathered())
                        self._rounds += bool(taken)
            if not taken:
                continue
            start = time.monotonic()
            try:
                self._run(taken, yields=self.cut_in and not cuts_in)
            finally:
                _LANE.scheduler = None
                with self._cond:
                    if cuts_in:
                        self._cutting_in = False
                    else:
                        self._rounds -= 1
                        self._forward_seconds = time.monotonic() - start
                    for s in self.running:  # a row a round left out asks again from now (`_shortest`, `_within_budget`)
                        if s.call is not None and s.skipped:
                            s.asked = time.monotonic()
                    self._cond.notify_all()

    def _take(self, rows: list[Slot]) -> list[tuple[Slot, tuple[DiffusionLM, str, dict[str, Any]]]]:
        """`rows` (under `_cond`) into the forwards in flight, each with the call it asked for."""
        self._taken = self._taken + rows
        taken = [(s, s.call) for s in rows]
        for s in rows:
            s.call = None
        return taken  # type: ignore[return-value]

    def _gathered(self) -> list[Slot]:
        """A lane's round (under `_cond`): the rows asking once none worth waiting for is still
        on the host (`_may_join`), or the first asked a forward's time ago; then short first's or
        the budget's choice of them."""
        while True:
            asking = [s for s in self.running if s.call is not None]
            busy = [s for s in self.running if s.call is None and s not in self._taken]  # on the host
            if not asking or not self._may_join(busy, asking):  # none left (cancelled while queued), or none to wait for
                break
            left = min(s.asked for s in asking) + max(self._forward_seconds, MIN_WAIT_SECONDS) - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)
        if self.short_first and asking:
            asking = self._shortest(asking)
        if self.forward_positions is not None and asking:
            asking = self._within_budget(asking, self.forward_positions)
        return asking

    def _cut_in_asking(self) -> list[Slot]:
        """The rows a cut-in round would be for (under `_cond`): while none runs and every lane
        runs a round, the rows asking that have had fewer forwards than every row in them (a new
        request, while the lanes decode rows that have had more); else none."""
        if self._cutting_in or self._rounds < self.lanes or not self._taken:
            return []
        fewest = min(s.forwards for s in self._taken)
        return [s for s in self.running if s.call is not None and s.forwards < fewest]

    def _may_cut_in(self) -> bool:
        """Whether a cut-in round may start (under `_cond`: `_cut_in_asking`). Its round starts at
        once, and one lane pauses at its next layer (`_pause_point`) until it ends: the new row
        waits for no round in flight, and the cores run as many forwards as before."""
        return bool(self._cut_in_asking())

    def _cutting_in_rows(self) -> list[Slot]:
        """A cut-in's round (under `_cond`): the budget's choice of `_cut_in_asking`'s rows, if it still may start."""
        rows = self._cut_in_asking()
        return self._within_budget(rows, self.forward_positions) if rows else []  # type: ignore[arg-type]  (cut_in: a budget)

    def between_layers(self) -> None:
        """Before each layer of a lane's forward (`_pause_point`): while a cut-in round runs and
        no lane has paused for it, this one waits here until it ends; a round pauses at most
        once, so a stream of new requests delays a lane's rows by one cut-in round at most."""
        if not self._cutting_in or self._yielded:  # read without the lock: the common case costs nothing
            return
        with self._cond:
            if not self._cutting_in or self._yielded:
                return
            _LANE.scheduler = None  # this round pauses no more
            self._yielded += 1
            while self._cutting_in:
                self._cond.wait()
            self._yielded -= 1

    def _may_join(self, busy: list[Slot], asking: list[Slot]) -> bool:
        """Whether a row of `busy` (still on the host) could be in the round `asking` would run,
        and so is worth its straggler's wait: any row, but under a budget only one
        `_within_budget` may take beside them, with no more forwards than the fewest asking or left
        out MAX_SKIPPED rounds (a row that has had more is not taken: a new request's first forward
        starts at once on a free lane, not a forward's time later)."""
        if self.forward_positions is None:
            return bool(busy)
        fewest = min(s.forwards for s in asking)
        return any(s.forwards <= fewest or s.skipped >= MAX_SKIPPED for s in busy)

    def _shortest(self, asking: list[Slot]) -> list[Slot]:
        """Short first's round (under `_cond`): the rows within SHORT_SHARE of the shortest canvas
        asking, and any left out MAX_SKIPPED rounds in a row. One left out asks again once the round
        has run (`_loop`), so the next round waits a forward's time for the short rows' next calls
        instead of running it alone at once: a short request's forwards run without the long rows' positions, which wait
        a few of its rounds (on a CPU a forward's cost grows with its positions; a GPU's hardly,
        where sharing costs a short row little)."""
        shortest = min(s.positions for s in asking)
        return _left_out_counted(asking, [s for s in asking if s.positions <= SHORT_SHARE * shortest or s.skipped >= MAX_SKIPPED])

    @staticmethod
    def _within_budget(asking: list[Slot], budget: int) -> list[Slot]:
        """The budget's round (under `_cond`): the rows with the fewest forwards so far (in
        admission order among them) while the positions their calls compute fit in `budget`
        (`query_positions`: a cached forward's block; a family's own call counts its row's prompt
        and canvas); the first always (a row over the budget runs alone), and any left out
        MAX_SKIPPED rounds in a row. The fewest forwards first (least attained service) lets a
        new request's few forwards through without knowing how many any row needs, and alone: on
        a CPU, where a forward's cost grows with its positions, a request that arrives while many
        rows decode waits for one forward of at most `budget` positions rather than one of all of
        theirs, and its own forward carries no row that has had more (docs/serving.md §3)."""
        chosen, used = [], 0
        fewest = min(s.forwards for s in asking)
        for s in sorted(asking, key=lambda s: s.forwards):
            _, method, inputs = s.call  # type: ignore[misc]  (every row asking has its call)
            positions = query_positions(method, inputs) or s.positions
            if not chosen or (s.forwards == fewest and used + positions <= budget) or s.skipped >= MAX_SKIPPED:
                chosen.append(s)
                used += positions
        return _left_out_counted(asking, chosen)

    def _run(self, taken: list[tuple[Slot, tuple[DiffusionLM, str, dict[str, Any]]]], yields: bool = False) -> None:
        """The calls that pack together (equal `pack_key`s: engine/serving/packed.py) as one model
        call each, the others one by one. `yields`: a lane's round, which pauses between layers
        for a cut-in (`between_layers`)."""
        groups: dict[Hashable, list[tuple[Slot, dict[str, Any]]]] = {}
        calls: dict[Hashable, tuple[DiffusionLM, str]] = {}
        for index, (slot, (model, method, inputs)) in enumerate(taken):
            try:
                key = pack_key(model, method, inputs)
            except Exception:  # a call its family cannot judge runs alone, and fails there if it must
                key = None
            group = (id(model), method, key) if key is not None else index  # a call of its own
            groups.setdefault(group, []).append((slot, inputs))
            calls[group] = (model, method)
        _LANE.scheduler = self if yields else None
        for group, members in groups.items():
            model, method = calls[group]
            if yields:
                _pause_points(model)
            try:
                with torch.inference_mode():
                    outputs: list[Any] = run_calls(model, method, [inputs for _, inputs in members])
            except BaseException as exc:  # each run fails with it, as its solo run would
                outputs = [exc] * len(members)
            if self.on_forward is not None:
                self.on_forward(len(members))
            for (slot, _), output in zip(members, outputs):
                slot.result = output
                slot.forwards += 1
                if len(members) > slot.shared:
                    slot.shared = len(members)
                    slot.request.sink.batched(len(members))
                with self._cond:  # out of the forwards in flight before its run can ask again
                    self._taken.remove(slot)
                    self._cond.notify_all()  # a lane gathering waits for this row's next call too
                slot.done.set()


class ContinuousBatcher:
    """The server's batcher with continuous batching (module docstring); the lockstep `Batcher`'s
    interface (submit, waiting, running, lock, max_batch)."""

    def __init__(self, lock: threading.Lock, engine_for: Callable[[list[BatchRequest]], Engine], max_batch: int = MAX_BATCH,
                 on_forward: Callable[[int], None] | None = None, short_first: bool = False, forward_positions: int | None = None,
                 lanes: int = 1) -> None:
        self.engine_for, self.max_batch = engine_for, max_batch
        self.scheduler = Scheduler(lock, max_batch, on_forward, short_first, forward_positions, lanes)

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
            slot = Slot(request)
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
        slot.positions = len(ids) + r.config.gen_length

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
