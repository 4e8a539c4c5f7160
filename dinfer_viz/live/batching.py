"""Concurrent visitors' runs decoded as one engine batch, each visitor seeing only its own row: the
app's adapter over the engine's batcher (engine/serving/batcher.py, where the rule and its reasons
live; docs/app.md §10, the concurrency rule).

What the app adds: runs name a model (`ModelSpec`) that the EngineHost loads under its lock (the one
every compare, sweep and load also takes), and each run's news arrives in a queue as the app's
events (Waiting, Loading, Started, IterationRecords, then Finished or Failed), which the live view
reads (dinfer_viz/live/runner.py). Compare, sweep and model loads take the engine alone.
"""

from __future__ import annotations

import queue
import threading
from typing import cast

from engine import Engine, GenerationConfig, IterationRecord, Trace
from engine.pipeline import TextResult
from engine.serving import batcher as engine_batcher
from engine.serving.batcher import MAX_BATCH, BatchRequest, RowView

from .events import Failed, Finished, Loading, Started, Waiting
from .host import EngineHost, ModelSpec

__all__ = ["MAX_BATCH", "RowView", "RunBatcher", "batch_key"]


def batch_key(spec: ModelSpec, config: GenerationConfig) -> str | None:
    """Runs with equal keys may share a batch and each still get its solo tokens; None: alone."""
    return engine_batcher.batch_key(config, [spec.path, spec.device, spec.dtype, list(spec.options)])


class QueueSink:
    """A run's news as the app's events, in the queue its live view reads."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.events: "queue.SimpleQueue[object]" = queue.SimpleQueue()

    def waiting(self) -> None:
        self.events.put(Waiting())

    def loading(self) -> None:
        self.events.put(Loading(self.spec))

    def started(self, header: Trace, batch: int) -> None:
        self.events.put(Started(header, batch=batch))

    def record(self, record: IterationRecord) -> None:
        self.events.put(record)

    def finished(self, result: TextResult) -> None:
        self.events.put(Finished(result))

    def failed(self, message: str) -> None:
        self.events.put(Failed(message))


class RunBatcher:
    """Where runs wait for the host's engine, and where a leader gathers its batch."""

    def __init__(self, host: EngineHost, max_batch: int = MAX_BATCH) -> None:
        self.host = host
        self._batcher = engine_batcher.Batcher(host.lock, self._engine_for, max_batch)

    @property
    def max_batch(self) -> int:
        return self._batcher.max_batch

    def submit(
        self, spec: ModelSpec, prompt: str, config: GenerationConfig, cancel: threading.Event, expected: str = "", fitted: bool = False
    ) -> "queue.SimpleQueue[object]":
        """Start a run; its events (Waiting, Loading, Started, IterationRecords, then Finished or
        Failed) arrive in the returned queue, from a batch's leader thread or its own. `expected`:
        the answer its header carries, `fitted`: its config is fit's (engine/serving/batcher.py: BatchRequest)."""
        sink = QueueSink(spec)
        self._batcher.submit(BatchRequest(prompt, config, cancel, sink, batch_key(spec, config), expected=expected, fitted=fitted))
        return sink.events

    def _engine_for(self, members: list[BatchRequest]) -> Engine:
        """The members' model (they share a key, so one spec; a run alone names its own), loaded
        under the host's lock, the members told while it loads."""
        sinks = [cast(QueueSink, r.sink) for r in members]  # this adapter submits only QueueSinks
        if not self.host.is_loaded(sinks[0].spec):
            for sink in sinks:
                sink.loading()
        return self.host.get(sinks[0].spec)
