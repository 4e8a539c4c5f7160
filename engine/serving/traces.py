"""The server's traces by id: bounded in count and bytes, the oldest pruned first.

Every row a request decodes gets an id when it is submitted; its entry says whether it is running,
done (with the trace's JSON), cancelled or failed (with the one-line reason). `GET /v1/traces/{id}`
reads it, and the app opens it (dinfer_viz/tabs/server_trace.py).
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

from ..errors import EngineError
from ..trace import Trace

RUNNING, DONE, CANCELLED, FAILED = "running", "done", "cancelled", "failed"


@dataclass
class TraceEntry:
    status: str = RUNNING
    message: str = ""  # why it was cancelled or failed
    json: str | None = None  # the trace (Trace.to_json) once done


class TraceStore:
    """At most `max_traces` entries and `max_bytes` of trace JSON; adding beyond either drops the
    oldest entries (a running one too: its trace is then not kept)."""

    def __init__(self, max_traces: int = 256, max_bytes: int = 64 << 20) -> None:
        if max_traces < 1 or max_bytes < 1:
            raise EngineError(f"the trace store needs room: max_traces {max_traces}, max_bytes {max_bytes}")
        self.max_traces, self.max_bytes = max_traces, max_bytes
        self._entries: OrderedDict[str, TraceEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # entries are written from the engine's threads and read by the routes

    def new(self) -> str:
        """A fresh id, its entry running."""
        trace_id = "trace-" + secrets.token_hex(8)
        with self._lock:
            self._entries[trace_id] = TraceEntry()
            self._prune()
        return trace_id

    def done(self, trace_id: str, trace: Trace) -> None:
        text = trace.to_json()
        with self._lock:
            entry = self._entries.get(trace_id)
            if entry is None:  # pruned while it ran
                return
            entry.status, entry.json = DONE, text
            self._bytes += len(text)
            self._prune()

    def ended(self, trace_id: str, status: str, message: str) -> None:
        """A run that left without a trace: CANCELLED or FAILED, and why."""
        with self._lock:
            entry = self._entries.get(trace_id)
            if entry is not None and entry.status == RUNNING:
                entry.status, entry.message = status, message

    def get(self, trace_id: str) -> TraceEntry | None:
        with self._lock:
            entry = self._entries.get(trace_id)
            return None if entry is None else TraceEntry(entry.status, entry.message, entry.json)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def _prune(self) -> None:
        while len(self._entries) > self.max_traces or self._bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= len(dropped.json or "")
