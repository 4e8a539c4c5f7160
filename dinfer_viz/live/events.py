"""What an engine thread tells a session's live view (dinfer_viz/live/runner.py reads these from a
queue; dinfer_viz/live/batching.py and jobs.start_worker post them), besides the engine's own
IterationRecords."""

from __future__ import annotations

from dataclasses import dataclass

from engine import Trace

from .host import ModelSpec


@dataclass
class Waiting:
    """Another session holds the engine."""


@dataclass
class Loading:
    spec: ModelSpec


@dataclass
class Started:
    trace: Trace  # the run's header (initial canvas, ids, token strings) the live timeline grows from
    batch: int = 1  # rows decoded together with this one (itself included)


@dataclass
class Finished:
    value: object  # the job's return value (a TextResult for a run)


@dataclass
class Failed:
    message: str
