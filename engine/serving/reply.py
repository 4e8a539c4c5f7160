"""One request's answer: its batch rows, and their events (from the batcher's threads, through
the event loop's queue) turned into one JSON body or a stream of server-sent chunks, counted in
the metrics once by how the request ended."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol

from ..pipeline import Engine, TextResult
from ..trace import Trace
from .batcher import Batcher
from .front import FrontFollower
from .http_errors import SHUTTING_DOWN, HTTPError, error_body
from .metrics import ServerMetrics
from .scheduler import ContinuousBatcher
from .schema import ParsedRequest
from .streaming import RowText, sse


class Serving(Protocol):
    """What a reply reads of the server that made it (app.py's `Server`)."""

    engine: Engine
    metrics: ServerMetrics
    batcher: Batcher | ContinuousBatcher
    front: FrontFollower | None
    stopping: bool

    def keep(self, task: asyncio.Task) -> None: ...


@dataclass
class Row:
    """One prompt of a request, a row of the batcher, and what its events have told so far."""

    index: int
    trace_id: str
    prompt_tokens: int
    text: RowText | None = None  # from the row's header on
    batch: int = 0  # rows decoded together with it (itself included), once it starts
    result: TextResult | None = None
    error: str | None = None
    completion_tokens: int = 0  # counted when it finishes
    draft: str = ""  # the provisional text last sent (a stream with `provisional: true`)


class Reply:
    """The answer to one request: its rows' events turned into one JSON body or a stream of chunks."""

    def __init__(
        self, server: Serving, parsed: ParsedRequest, request_id: str, rows: list[Row], events: asyncio.Queue, arrived: float,
        cancel: threading.Event, done: Callable[[], None], point: int | None = None,
    ) -> None:
        self.server, self.parsed, self.id, self.rows, self.events = server, parsed, request_id, rows, events
        self.cancel = cancel  # the request's: set when its client left, or the server stops
        self.done = done  # called once every row has ended
        self.point = point  # the front's point it runs (None: its own settings, or no front)
        self.open_rows = len(rows)  # rows not yet ended: what `_events` still waits for
        self.created = int(time.time())
        self.arrived = arrived  # time.monotonic() when the request came: its latency's start
        self.first_text: float | None = None  # when its first final text went out
        self.forwards = 0
        self.metrics = server.metrics

    def _row_text(self, header: Trace) -> RowText:
        return RowText(header, self.server.engine.decode, self.parsed.max_tokens, self.parsed.stop)

    async def _events(self) -> AsyncIterator[tuple[Row, str, object]]:
        """Every row's events until each has finished or failed (a later call goes on where an
        earlier one stopped: `_drain`)."""
        while self.open_rows:
            index, kind, value = await self.events.get()
            row = self.rows[index]
            if kind == "started":
                header, row.batch = value  # type: ignore[misc]
                row.text = self._row_text(header)
            elif kind == "batched":  # continuous batching: the most rows its forwards shared so far
                row.batch = max(row.batch, value)  # type: ignore[call-overload]
            elif kind == "finished":
                row.result = value  # type: ignore[assignment]
                self.forwards += row.result.output.stats.nfe
                self.metrics.forwards_per_request.observe(row.result.output.stats.nfe)
                self.open_rows -= 1
            elif kind == "failed":
                row.error = str(value)
                self.open_rows -= 1
            if not self.open_rows:
                self._ended()
            yield row, kind, value

    def _ended(self) -> None:
        """Every row has ended: the request counted once in the metrics by how it ended (a row that
        failed after its request's cancel was set was cancelled, whatever its message), and its times."""
        self.done()
        failed = any(r.error is not None for r in self.rows)
        status = "ok" if not failed else "cancelled" if self.cancel.is_set() or self.server.stopping else "failed"
        self.metrics.requests.labels(status).inc()
        now = time.monotonic()
        self.metrics.latency.observe(now - self.arrived)
        if status == "ok":
            self.metrics.first_token.observe((self.first_text or now) - self.arrived)
        if status == "ok" and self.server.front is not None:  # what the controller follows: answered requests' latencies
            self.server.front.follower.observe(now - self.arrived, self.server.batcher.waiting)
            self.metrics.front_answers.labels("own" if self.point is None else str(self.point)).inc()

    def usage(self) -> dict[str, int]:
        completion = sum(r.completion_tokens for r in self.rows)
        prompt = sum(r.prompt_tokens for r in self.rows)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion, "forwards": self.forwards}

    def _finish(self, row: Row) -> tuple[str, str]:
        """The rest of the row's text and its finish reason, its completion tokens counted."""
        assert row.text is not None and row.result is not None
        rest, reason, row.completion_tokens = row.text.finish(row.result.output.canvas[0].tolist())
        self.metrics.tokens.inc(row.completion_tokens)
        return rest, reason

    def _choice(self, row: Row, text: str, reason: str | None, delta: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": row.index, "finish_reason": reason, "trace_id": row.trace_id}
        if not self.parsed.chat:
            choice.update(text=text, logprobs=None)
        elif delta:
            choice["delta"] = {"content": text} if text else {}
        else:
            choice["message"] = {"role": "assistant", "content": text}
        return choice

    def _used(self, row: Row) -> dict[str, Any]:
        """What a finished row's choice says of how it ran: rows sharing its forwards, and its front point."""
        return {"batch": row.batch, **(self.server.front.reported(self.point) if self.server.front else {})}

    def _envelope(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.parsed.chat else "text_completion") + (".chunk" if chunk and self.parsed.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.server.engine.name, "choices": choices}

    async def whole(self) -> dict[str, Any]:
        async for _ in self._events():
            pass
        failed = [r for r in self.rows if r.error is not None]
        if failed:
            if failed[0].error == SHUTTING_DOWN:
                raise HTTPError(503, SHUTTING_DOWN, "server_busy")
            raise HTTPError(500, failed[0].error or "failed", "server_error")
        choices = []
        for row in self.rows:
            rest, reason = self._finish(row)
            choices.append({**self._choice(row, rest, reason, delta=False), **self._used(row)})
        return {**self._envelope(choices, chunk=False), "usage": self.usage()}

    async def stream(self) -> AsyncIterator[str]:
        """Chunks of final text as records make it final (streaming.py); then each row's rest and
        finish reason; usage when asked; [DONE]. A failure is an error event, then [DONE]. A stream
        closed before its rows ended (its client left) cancels them; `_drain` counts it later."""
        try:
            async for chunk in self._chunks():
                yield chunk
        finally:
            if self.open_rows:
                self.cancel.set()
                with contextlib.suppress(RuntimeError):  # no running loop: the server itself has stopped
                    self.server.keep(asyncio.get_running_loop().create_task(self._drain()))

    async def _drain(self) -> None:
        """A left stream's remaining events, read to its rows' end (`_ended` counts the request)."""
        async for _ in self._events():
            pass

    async def _chunks(self) -> AsyncIterator[str]:
        """The stream's server-sent events (`stream`)."""
        async for row, kind, value in self._events():
            if kind == "started":  # the row's first chunk: its trace id, how many rows share its batch
                first = self._choice(row, "", None, delta=True)
                if self.parsed.chat:
                    first["delta"] = {"role": "assistant", "content": ""}
                yield sse(self._envelope([{**first, "batch": row.batch}], True))
            elif kind == "record" and row.text is not None:
                delta = row.text.update(value)  # type: ignore[arg-type]
                if delta and self.first_text is None:
                    self.first_text = time.monotonic()
                if self.parsed.provisional:  # the draft after the final text, whenever either changed
                    draft = row.text.provisional()
                    if delta or draft != row.draft:
                        row.draft = draft
                        yield sse(self._envelope([{**self._choice(row, delta, None, delta=True), "provisional": draft}], True))
                elif delta:
                    yield sse(self._envelope([self._choice(row, delta, None, delta=True)], True))
            elif kind == "finished":
                rest, reason = self._finish(row)
                last = {**self._choice(row, rest, reason, delta=True), **self._used(row)}
                if self.parsed.provisional:
                    last["provisional"] = ""  # everything is final
                yield sse(self._envelope([last], True))
            elif kind == "failed":
                yield sse(error_body(row.error or "failed", "server_error"))
        if self.parsed.include_usage:
            yield sse({**self._envelope([], True), "usage": self.usage()})
        yield sse("[DONE]")
