"""Concurrent visitors' runs decoded as one engine batch, each visitor seeing only its own row.

The rule (README, "Concurrency rule"): a run that finds the engine busy waits in `RunBatcher`.
When the engine frees, the next waiting run leads: it takes every other waiting run that asks the
same model for the same settings and whose prompt encodes to the same length (at most
`MAX_BATCH` rows), and the engine decodes them together. Each visitor receives its own row's
header, records, text and trace, and those equal its solo run's: the engine's decisions are per
row (each row's commits depend on its own logits; early stop is per row), the canvas and blocks
are the same when the prompt lengths are, and `RowView` drops the records in which a row had
nothing left to do (its block already complete, or the row finished by early stop while others go
on), which its solo run would never have made.

What breaks the equality is never batched (`batch_key` is None): sampling or random remasking
(one random stream per engine call), settings that read the request's iteration counter (smoothing,
refresh_every, the vicinity cache's warm-up, unrolling's group size, which follows the row with
the most masks), plug-in decoders (their rule may mix rows), and block-causal models (their
prefix-store forwards are not records). Compare, sweep and model loads take the engine alone.
A visitor who stops leaves the batch at once; the batch is cancelled when every member has.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from dataclasses import dataclass, field, replace

from engine import Engine, EngineError, GenerationConfig, GenerationOutput, IterationRecord, Trace
from engine.cache import REFRESH
from engine.pipeline import TextResult
from engine.stats import count_tokens

from .events import Failed, Finished, Loading, Started, Waiting
from .host import EngineHost, ModelSpec

log = logging.getLogger(__name__)
MAX_BATCH = 8
POLL_SECONDS = 0.1  # longest a waiting run blocks before it looks whether a batch took it
# Decoders whose rule is row by row (engine/decoders.py); a plug-in's may not be.
ROW_WISE_DECODERS = ("fixed", "threshold", "hierarchical", "credit", "factor")


def batch_key(spec: ModelSpec, config: GenerationConfig) -> str | None:
    """Runs with equal keys may share a batch and each still get its solo tokens; None: alone."""
    if config.temperature > 0 or (config.decoder == "fixed" and config.remasking == "random"):
        return None
    if config.smoothing or config.refresh_every is not None or config.cache == "vicinity" or config.unroll:
        return None
    if config.decoder not in ROW_WISE_DECODERS:
        return None
    return json.dumps([spec.path, spec.device, spec.dtype, list(spec.options), config.to_dict()], sort_keys=True, default=str)


class RowView:
    """One row of a batched generate, as its solo run would have reported it."""

    def __init__(self, header: Trace, row: int) -> None:
        self.row = row
        self.canvas = list(header.initial[row])
        self.mask_id, self.stop_ids = header.mask_id, set(header.eos_ids)
        self.prompt_length = header.prompt_lengths[row]
        self.early_stop = bool(header.config.get("early_stop", True))
        self.stop_block: int | None = None  # the block in which this row committed an end-of-text
        self.kept = 0  # records of this row so far: its solo run's iteration index and NFE
        self.after_refresh = False  # the row's last record was a refresh: the same step's next forward follows
        self.trace = replace(header, prompt_lengths=[self.prompt_length], initial=[list(self.canvas)], iterations=[])

    def header(self) -> Trace:
        return replace(self.trace, iterations=[])

    def record(self, rec: IterationRecord) -> IterationRecord | None:
        """This row's part of `rec`, renumbered; None where the row had nothing to do."""
        s, e = rec.block_range
        finished = self.early_stop and self.stop_block is not None and rec.block > self.stop_block
        # A refresh is followed, in the same step, by another forward even when its decode
        # completed the block (engine/iteration.py: `step`): the solo run makes that one too.
        follows_refresh, self.after_refresh = self.after_refresh, False
        if finished or (not follows_refresh and all(self.canvas[p] != self.mask_id for p in range(s, e))):
            return None
        self.after_refresh = rec.forward == REFRESH
        r = self.row
        mine = replace(
            rec, iteration=self.kept, committed=[rec.committed[r]], forced=[rec.forced[r]], top1=[rec.top1[r]],
            confidence=[rec.confidence[r]], candidates=None if rec.candidates is None else [rec.candidates[r]], extras={k: [v[r]] if isinstance(v, list) else v for k, v in rec.extras.items()},
        )
        for p in rec.committed[r]:
            self.canvas[p] = rec.top1[r][p - s]
            if self.canvas[p] in self.stop_ids and p >= self.prompt_length and self.stop_block is None:
                self.stop_block = rec.block
        self.kept += 1
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
            nfe=self.kept,
            tokens=count_tokens(canvas, [self.prompt_length], sorted(self.stop_ids), self.mask_id)[0],
            batch=1,
        )
        trace = None
        if out.trace is not None:
            trace = replace(self.trace, tokens=dict(out.trace.tokens), final=[out.trace.final[r]], stats=stats.to_dict(), trace_seconds=out.trace.trace_seconds)
        return TextResult([text], GenerationOutput(canvas, [self.prompt_length], [out.token_ids[r]], stats, trace))


class AllCancelled:
    """The batch's cancel flag: set once every member has stopped."""

    def __init__(self, events: list[threading.Event]) -> None:
        self.events = events

    def is_set(self) -> bool:
        return all(e.is_set() for e in self.events)


@dataclass(eq=False)
class RunRequest:
    spec: ModelSpec
    prompt: str
    config: GenerationConfig
    cancel: threading.Event
    events: "queue.SimpleQueue[object]" = field(default_factory=queue.SimpleQueue)
    claimed: threading.Event = field(default_factory=threading.Event)  # a batch took it

    def __post_init__(self) -> None:
        self.key = batch_key(self.spec, self.config)


class RunBatcher:
    """Where runs wait for the engine, and where a leader gathers its batch (module docstring)."""

    def __init__(self, host: EngineHost, max_batch: int = MAX_BATCH) -> None:
        self.host, self.max_batch = host, max_batch
        self._mutex = threading.Lock()  # guards `_waiting` and every request's `claimed`
        self._waiting: list[RunRequest] = []

    def submit(self, spec: ModelSpec, prompt: str, config: GenerationConfig, cancel: threading.Event) -> "queue.SimpleQueue[object]":
        """Start a run; its events (Waiting, Loading, Started, IterationRecords, then Finished or
        Failed) arrive in the returned queue, from a batch's leader thread or its own."""
        request = RunRequest(spec, prompt, config, cancel)
        with self._mutex:
            self._waiting.append(request)
        threading.Thread(target=self._serve, args=(request,), name="dinfer-viz-run", daemon=True).start()
        return request.events

    def _serve(self, request: RunRequest) -> None:
        lock = self.host.lock
        if not lock.acquire(blocking=False):
            request.events.put(Waiting())
            while not lock.acquire(timeout=POLL_SECONDS):
                if request.claimed.is_set():
                    return  # a leader runs it and posts its events
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
            lock.release()

    def _withdraw(self, request: RunRequest) -> None:
        with self._mutex:
            if request in self._waiting:
                self._waiting.remove(request)

    def _claim(self, leader: RunRequest) -> list[RunRequest]:
        """The leader and the waiting runs it may take (same key, not stopped; at most
        `max_batch`); [] if a batch took the leader while it was getting the lock. A claimed run's
        own thread ends: the leader posts its events."""
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

    def _run(self, members: list[RunRequest]) -> None:
        """Decode the claimed runs: one engine batch per prompt length (a block-causal model: one
        run at a time), in arrival order; a failure ends only its own batch."""
        try:
            if not self.host.is_loaded(members[0].spec):
                for r in members:
                    r.events.put(Loading(members[0].spec))
            engine = self.host.get(members[0].spec)
            encoded = [engine.encode(r.prompt, r.config.use_chat_template) for r in members]
        except Exception as exc:
            self._fail(members, exc)
            return
        groups: dict[object, list[int]] = {}
        for i, ids in enumerate(encoded):
            groups.setdefault(i if engine.model.block_causal else len(ids), []).append(i)
        for rows in groups.values():
            batch = [members[i] for i in rows]
            if all(r.cancel.is_set() for r in batch):
                continue
            try:
                self._generate(engine, batch, [encoded[i] for i in rows])
            except Exception as exc:
                self._fail(batch, exc)

    @staticmethod
    def _fail(members: list[RunRequest], exc: Exception) -> None:
        if isinstance(exc, EngineError):
            message = str(exc)
        else:  # a bug or an out-of-memory must not kill the sessions
            log.exception("engine run failed")
            message = f"internal error: {type(exc).__name__}: {exc}"
        for r in members:
            r.events.put(Failed(message))

    def _generate(self, engine: Engine, members: list[RunRequest], encoded: list[list[int]]) -> None:
        views: list[RowView] = []

        def on_start(header: Trace) -> None:
            views.extend(RowView(header, row) for row in range(len(members)))
            for r, view in zip(members, views):
                r.events.put(Started(view.header(), batch=len(members)))

        def on_iteration(rec: IterationRecord) -> None:
            for r, view in zip(members, views):
                mine = view.record(rec)
                if mine is not None and not r.cancel.is_set():
                    r.events.put(mine)

        cancel = AllCancelled([r.cancel for r in members])
        out = engine.generate_ids(encoded, members[0].config, trace=True, on_start=on_start, on_iteration=on_iteration, cancel=cancel)
        for r, view, ids in zip(members, views, out.token_ids):
            r.events.put(Finished(view.result(out, engine.decode(ids))))
