"""Concurrent requests on one Engine decoded as one batch, each request seeing only its own row.

The rule (docs/serving.md, "Batching"): a request that finds the engine busy waits in `Batcher`.
When the engine frees, the next waiting request leads: it takes every other waiting request with
the same `batch_key` (same engine, same settings) whose prompt encodes to the same length (at most
`max_batch` rows), and the engine decodes them together. Each request receives its own row's
header, records, text and trace, and those equal its solo run's: the engine's decisions are per
row (each row's commits depend on its own logits; early stop is per row), the canvas and blocks
are the same when the prompt lengths are, and `RowView` drops the records in which a row had
nothing left to do (its block already complete, or the row finished by early stop while others go
on), which its solo run would never have made: the loop marks each record's rows `active`.

What breaks the equality is never batched (`batch_key` is None): sampling or random remasking
(one random stream per engine call: `Decoder.row_wise_for`), settings that read the request's iteration counter (smoothing,
refresh_every, the vicinity cache's warm-up, unrolling's group size, which follows the row with
the most masks), decoders that do not declare `Decoder.row_wise` (their rule may mix rows), and
block-causal models (their prefix-store forwards are not per-row records) and kinds that do not
share batches (`KindSettings.shares_batches`). A request that is cancelled leaves the batch at once; the batch is cancelled
when every member has.

The app (dinfer_viz/live/batching.py) and the HTTP server (engine/serving/app.py) adapt this to their
hosts and events.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

from ..cache_modes import cache_mode
from ..config import GenerationConfig
from ..constraints import CONSTRAINT_FIELDS, spec_of
from ..errors import EngineError
from ..hooks import RunHooks
from ..run import GenerationOutput
from ..pipeline import Engine, TextResult
from ..registry import decoder_class
from ..kinds import run_kind
from ..trace import IterationRecord, Trace
from .heap import release_freed_memory

log = logging.getLogger(__name__)
MAX_BATCH = 8
POLL_SECONDS = 0.1  # longest a waiting request blocks before it looks whether a batch took it


def batch_key(config: GenerationConfig, engine_id: object) -> str | None:
    """Requests with equal keys may share a batch and each still get its solo tokens; None: alone.
    `engine_id`: what names the engine the request runs on (JSON-serialisable)."""
    if config.temperature > 0:
        return None
    mode = cache_mode(config.cache)
    if config.smoothing or config.refresh_every is not None or (mode is not None and mode.reads_request_counter) or config.unroll:
        return None
    if not decoder_class(config.decoder).row_wise_for(config):
        return None
    # each row keeps its own constraint (RunHooks.constraints), so it does not part a batch
    shared = {k: v for k, v in config.to_dict().items() if k not in CONSTRAINT_FIELDS}
    return json.dumps([engine_id, shared], sort_keys=True, default=str)


class RowView:
    """One row of a batched generate, as its solo run would have reported it: the records in which
    the loop marks the row active (`IterationRecord.active`), renumbered."""

    def __init__(self, header: Trace, row: int, config: GenerationConfig | None = None) -> None:
        """`config`: the row's own (its constraint), when the batch ran with another's."""
        self.row = row
        self.prompt_length = header.prompt_lengths[row]
        self.kept = 0  # records of this row so far: its solo run's iteration index
        self.forwards = 0  # the forwards of those records: its solo run's NFE
        self.trace = replace(header, prompt_lengths=[self.prompt_length], initial=[list(header.initial[row])], iterations=[])
        if header.expected is not None:
            self.trace.expected = [header.expected[row]]
        if config is not None:
            self.trace.config = config.to_dict()

    def header(self) -> Trace:
        return replace(self.trace, iterations=[])

    def record(self, rec: IterationRecord) -> IterationRecord | None:
        """This row's part of `rec`, renumbered; None where the row had nothing to do."""
        r = self.row
        if not rec.active[r]:
            return None
        mine = replace(
            rec, iteration=self.kept, committed=[rec.committed[r]], forced=[rec.forced[r]], top1=[rec.top1[r]],
            confidence=[rec.confidence[r]], candidates=None if rec.candidates is None else [rec.candidates[r]],
            revisions=None if rec.revisions is None else [rec.revisions[r]], active=[True], final_until=[rec.final_until[r]],
            extras={k: [v[r]] if isinstance(v, list) else v for k, v in rec.extras.items()},
            constraint=None if rec.constraint is None or rec.constraint["allowed"][r] is None else {k: [v[r]] for k, v in rec.constraint.items()},
        )
        self.kept += 1
        self.forwards += rec.forwards
        self.trace.iterations.append(mine)
        return mine

    def result(self, out: GenerationOutput, text: str) -> TextResult:
        """The row's output: its canvas, tokens, trace, and stats counted as its solo run counts them."""
        r = self.row
        canvas = out.canvas[r : r + 1]
        # this row's forwards and tokens; the batch's times and counts (wall, trace, communication,
        # compiles, graph replays) as they are: the row waited for all of it
        stats = replace(
            out.stats,
            nfe=self.forwards,
            tokens=len(out.token_ids[r]),  # the engine's own count: text the request pinned is not the model's
            batch=1,
        )
        trace = None
        if out.trace is not None:
            trace = replace(self.trace, tokens=dict(out.trace.tokens), final=[out.trace.final[r]], stats=stats.to_dict(), trace_seconds=out.trace.trace_seconds)
        return TextResult([text], GenerationOutput(canvas, [self.prompt_length], [out.token_ids[r]], stats, trace))


def report_failure(members: list[BatchRequest], exc: Exception) -> None:
    """Tell each member its run failed, in one line (an engine error's own; anything else logged)."""
    if isinstance(exc, EngineError):
        message = str(exc)
    else:  # a bug or an out-of-memory must not kill the other requests
        log.exception("engine run failed")
        message = f"internal error: {type(exc).__name__}: {exc}"
    for r in members:
        r.sink.failed(message)


class AllCancelled:
    """The batch's cancel flag: set once every member has stopped."""

    def __init__(self, events: list[threading.Event]) -> None:
        self.events = events

    def is_set(self) -> bool:
        return all(e.is_set() for e in self.events)


class RowSink(Protocol):
    """Where a request's news goes, from its own thread or its batch leader's."""

    def waiting(self) -> None:
        """The engine is busy: the request waits."""

    def started(self, header: Trace, batch: int) -> None:
        """Its row's header, before the first forward; `batch`: rows decoded together (itself included)."""

    def record(self, record: IterationRecord) -> None:
        """Its row's part of one iteration (renumbered as its solo run's)."""

    def batched(self, rows: int) -> None:
        """Continuous batching (scheduler.py): one of its forwards decoded `rows` rows, more than any before."""

    def finished(self, result: TextResult) -> None:
        """Its row's text, tokens, stats and trace."""

    def failed(self, message: str) -> None:
        """The run failed or was cancelled: one line."""


@dataclass(eq=False)
class BatchRequest:
    """`prompt`: text (encoded with the engine's tokenizer and the config's chat-template switch)
    or token ids as given. `key`: `batch_key`'s answer for it (None: it runs alone). `expected`: an
    answer its header carries as ids (`Trace.expected`; "" for none), which leaves the decoding alone.
    `fitted`: its config is engine.kinds.fit's for the engine's model (the app's), not fitted again."""

    prompt: str | list[int]
    config: GenerationConfig
    cancel: threading.Event
    sink: RowSink
    key: str | None
    expected: str = ""
    fitted: bool = False
    claimed: threading.Event = field(default_factory=threading.Event)  # a batch took it


class Batcher:
    """Where requests wait for the engine, and where a leader gathers its batch (module docstring).

    `lock`: held for every use of the engine (a host may share it with its other users);
    `engine_for(members)`: the engine a claimed batch runs on (the host loads it there, lock held);
    `on_forward(rows)`: told of each model forward a batch ran, with its rows (the server's metrics)."""

    def __init__(
        self, lock: threading.Lock, engine_for: Callable[[list[BatchRequest]], Engine], max_batch: int = MAX_BATCH,
        on_forward: Callable[[int], None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise EngineError(f"max_batch must be >= 1, got {max_batch}")
        self.lock, self.engine_for, self.max_batch, self.on_forward = lock, engine_for, max_batch, on_forward
        self._mutex = threading.Lock()  # guards `_waiting` and every request's `claimed`
        self._waiting: list[BatchRequest] = []
        self.running = 0  # rows of the batch decoding now

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet taken by a batch."""
        with self._mutex:
            return len(self._waiting)

    def submit(self, request: BatchRequest) -> None:
        """Start a request; its news arrives at its sink (waiting, started, records, then finished or failed)."""
        with self._mutex:
            self._waiting.append(request)
        threading.Thread(target=self._serve, args=(request,), name="dinfer-batch", daemon=True).start()

    def _serve(self, request: BatchRequest) -> None:
        if not self.lock.acquire(blocking=False):
            request.sink.waiting()
            while not self.lock.acquire(timeout=POLL_SECONDS):
                if request.claimed.is_set():
                    return  # a leader runs it and posts its news
                if request.cancel.is_set():
                    self._withdraw(request)
                    return
        try:
            if request.cancel.is_set():  # it left while the engine was busy
                self._withdraw(request)
                return
            members = self._claim(request)
            if members:
                self._run(members)
        finally:
            self.lock.release()
        if members:  # after the lock, so the next batch does not wait on it
            release_freed_memory()

    def _withdraw(self, request: BatchRequest) -> None:
        with self._mutex:
            if request in self._waiting:
                self._waiting.remove(request)
        request.sink.failed("cancelled")

    def _claim(self, leader: BatchRequest) -> list[BatchRequest]:
        """The leader and the waiting requests it may take (same key, not stopped; at most
        `max_batch`); [] if a batch took the leader while it was getting the lock. A claimed
        request's own thread ends: the leader posts its news."""
        with self._mutex:
            if leader.claimed.is_set():
                return []
            members = [leader]
            if leader.key is not None:
                members += [r for r in self._waiting if r is not leader and r.key == leader.key and not r.cancel.is_set()]
            members = members[: self.max_batch]
            for r in members:
                r.claimed.set()
                self._waiting.remove(r)
            return members

    def _run(self, members: list[BatchRequest]) -> None:
        """Decode the claimed requests: one engine batch per prompt length (a block-causal or
        uniform-state model: one request at a time), in arrival order; a failure ends only its own batch."""
        try:
            engine = self.engine_for(members)
            encoded = [r.prompt if isinstance(r.prompt, list) else engine.encode(r.prompt, r.config.use_chat_template) for r in members]
        except Exception as exc:
            report_failure(members, exc)
            return
        alone = engine.model.block_causal or not run_kind(members[0].config, engine.model).settings.shares_batches
        groups: dict[object, list[int]] = {}
        for i, ids in enumerate(encoded):
            groups.setdefault(i if alone else len(ids), []).append(i)
        for rows in groups.values():
            batch = [members[i] for i in rows]
            if all(r.cancel.is_set() for r in batch):
                for r in batch:
                    r.sink.failed("cancelled")
                continue
            try:
                self._generate(engine, batch, [encoded[i] for i in rows])
            except Exception as exc:
                report_failure(batch, exc)

    def _generate(self, engine: Engine, members: list[BatchRequest], encoded: list[list[int]]) -> None:
        views: list[RowView] = []

        def on_start(header: Trace) -> None:
            views.extend(RowView(header, row, r.config) for row, r in enumerate(members))
            for r, view in zip(members, views):
                r.sink.started(view.header(), len(members))

        def on_iteration(rec: IterationRecord) -> None:
            for r, view in zip(members, views):
                mine = view.record(rec)
                if mine is not None and not r.cancel.is_set():
                    r.sink.record(mine)

        answers = [engine.answer_ids(r.expected) if r.expected else [] for r in members]
        hooks = RunHooks(
            trace=True, on_start=on_start, on_iteration=on_iteration, cancel=AllCancelled([r.cancel for r in members]), expected_ids=answers if any(answers) else None
        )
        specs = tuple(spec_of(r.config) for r in members)  # each row its own constraint, the batch's config without one
        free = dataclasses.replace(members[0].config, **dict.fromkeys(CONSTRAINT_FIELDS))
        self.running = len(members)
        try:
            out = engine.generate_ids(encoded, free, hooks.but(constraints=specs) if any(specs) else hooks, fitted=members[0].fitted)
        finally:
            self.running = 0
        if self.on_forward is not None:  # every forward of a lockstep batch decodes all its rows
            for _ in range(out.stats.nfe):
                self.on_forward(len(members))
        for r, view, ids in zip(members, views, out.token_ids):
            r.sink.finished(view.result(out, engine.decode(ids)))
