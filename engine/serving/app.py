"""The OpenAI-compatible HTTP app over one Engine: routes, a request's checks and its batch rows,
and the bridge from the batcher's threads to the event loop (docs/serving.md); the answer made of
the rows' events is reply.py's, the refusals' shape http_errors.py's.

`create_app(engine)` -> a FastAPI app: GET /v1/models, POST /v1/completions and
/v1/chat/completions (JSON, or server-sent events with `stream: true`), GET /v1/traces/{id},
GET /metrics (Prometheus text: engine/serving/metrics.py).
Every prompt of a request is one row submitted to the engine's batcher: continuous batching
(engine/serving/scheduler.py: rows of any length share forwards, each leaves when it is done) or
the lockstep batcher (engine/serving/batcher.py: equal prompt lengths and settings decode as one
batch); either way each row gets its solo tokens. A client that disconnects cancels its rows
(the others go on).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
from dataclasses import replace
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..cache import PrefixStore
from ..constraints import ConstraintSpec, compile_in_background, spec_of
from ..constraints.bounded import MAX_BUILDS
from ..errors import EngineError
from ..generation import check_fitted
from ..kinds import fit
from ..pipeline import Engine, TextResult
from ..trace import IterationRecord, Trace
from .batcher import MAX_BATCH, BatchRequest, Batcher, batch_key
from .scheduler import ContinuousBatcher
from .served import BATCHING, batcher_for, shares_forwards
from .limits import RequestLimits, TooLarge
from .metrics import ServerMetrics
from .fair import FairPool
from .front import FrontFollower
from .http_errors import SHUTTING_DOWN, HTTPError, error_response
from .reply import Reply, Row
from .schema import ParsedRequest, constraint_of, encode_prompt, parse_request
from .traces import CANCELLED, DONE, FAILED, RUNNING, TraceStore

DEFAULT_MAX_PENDING = 64  # rows queued or decoding at once; more are refused (503), not queued without bound
# what Python's parser, number and text handling raise on a hostile body or field (a number of
# 5000 digits, nesting 100000 deep, a lone surrogate): the client's input, so a 400, never a 500
BAD_INPUT_ERRORS = (ValueError, UnicodeError, OverflowError, RecursionError)
PREFIX_CACHE_BYTES = 256 << 20  # the prompt blocks' K/V a block-causal model's server keeps across requests


class RowSinkToLoop:
    """One row's news from the batcher's threads: into the trace store at once, and to the request's
    event loop as (row, kind, value) when the request still listens."""

    def __init__(self, server: "Server", index: int, trace_id: str, cancel: threading.Event, loop: asyncio.AbstractEventLoop, events: asyncio.Queue) -> None:
        self.server, self.index, self.trace_id, self.cancel = server, index, trace_id, cancel
        self.loop, self.events = loop, events

    def _post(self, kind: str, value: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, kind, value))
        except RuntimeError:  # the loop has closed: nobody listens
            pass

    def waiting(self) -> None:
        pass  # the client sees nothing until its row starts

    def started(self, header: Trace, batch: int) -> None:
        self._post("started", (header, batch))

    def record(self, record: IterationRecord) -> None:
        self._post("record", record)

    def batched(self, rows: int) -> None:
        self._post("batched", rows)

    def finished(self, result: TextResult) -> None:
        if result.output.trace is not None:
            self.server.traces.done(self.trace_id, result.output.trace)
        self.server.row_ended()
        self._post("finished", result)

    def failed(self, message: str) -> None:
        message = SHUTTING_DOWN if self.server.stopping else message
        self.server.traces.ended(self.trace_id, CANCELLED if self.cancel.is_set() else FAILED, message)
        self.server.row_ended()
        self._post("failed", message)


class Server:
    """One engine, its batcher, its trace store and the bounds of a request. `batching`: one of
    BATCHING (`batcher_for`), with `forward_positions` and `forward_lanes` its rounds' budget and lanes. `prefix_cache_bytes`:
    the bound of the prompt blocks' K/V a block-causal model in this process shares across
    requests (0: none; docs/serving.md §3)."""

    def __init__(
        self, engine: Engine, limits: RequestLimits, max_batch: int, max_pending: int, traces: TraceStore, batching: str = BATCHING[0],
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES, front: FrontFollower | None = None, forward_positions: int | None = None, forward_lanes: int = 1,
    ) -> None:
        self.engine, self.limits, self.traces, self.max_pending, self.front = engine, limits, traces, max_pending, front
        self.batcher: Batcher | ContinuousBatcher = batcher_for(batching, engine, max_batch, lambda rows: self.metrics.forward(rows), forward_positions, forward_lanes)
        self.metrics = ServerMetrics(lambda: self.batcher.waiting, lambda: self.batcher.running, len(front.front.settings) if front else 0)
        if engine.model.block_causal and prefix_cache_bytes > 0 and shares_forwards(engine):  # the weights are here
            engine.model.prefix_store = PrefixStore(prefix_cache_bytes, on_hit=self.metrics.prefix_hit)
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._watchers: set[asyncio.Task] = set()  # disconnect watchers and drains, referenced until they end (`keep`)
        self._cancels: set[threading.Event] = set()  # the cancel flags of the requests in flight
        self.builds = FairPool(MAX_BUILDS, "constraint-checks")  # the checks of requests whose constraint is built
        self.stopping = False

    @property
    def pending(self) -> int:
        """Rows queued or decoding now."""
        return self._pending

    def row_ended(self) -> None:
        with self._pending_lock:
            self._pending -= 1

    def stop(self) -> None:
        """Shutting down (SIGINT/SIGTERM): refuse new requests (503) and cancel those in flight, so
        each stream ends with an error event at the engine's next cancel check and the server's
        graceful shutdown does not wait on whole generations."""
        self.stopping = True
        for cancel in list(self._cancels):
            cancel.set()

    def _reserve(self, rows: int) -> None:
        if self.stopping:
            raise HTTPError(503, SHUTTING_DOWN, "server_busy")
        with self._pending_lock:
            if self._pending + rows > self.max_pending:
                raise HTTPError(503, f"the server is busy: {self._pending} rows in flight, at most {self.max_pending}; retry later", "server_busy")
            self._pending += rows

    async def read_body(self, request: Request) -> Any:
        """The JSON body, refused past `max_body_bytes` before it is all read."""
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, f"the request body has {declared} bytes; this server takes at most {limit}")
        body = bytearray()

        async def read() -> None:
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > limit:
                    raise HTTPError(413, f"the request body is over {limit} bytes, this server's limit")

        try:  # a client that sends fewer bytes than its Content-Length says holds no slot for long
            await asyncio.wait_for(read(), self.limits.body_seconds)
        except asyncio.TimeoutError:
            raise HTTPError(408, f"the request body did not arrive within {self.limits.body_seconds:g} s") from None
        try:
            return json.loads(body)
        except BAD_INPUT_ERRORS as exc:  # JSONDecodeError, bad UTF-8, a 5000-digit number, deep nesting
            raise HTTPError(400, f"the request body is not JSON this server can read: {exc}") from None

    def watch_disconnect(self, request: Request, cancel: threading.Event, trace_ids: list[str]) -> None:
        """When the client goes: set `cancel` and mark its running rows cancelled (uvicorn also
        reports a disconnect once the response is complete; the rows have ended by then)."""

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            cancel.set()
            for trace_id in trace_ids:
                self.traces.ended(trace_id, CANCELLED, "the client disconnected")

        self.keep(asyncio.get_running_loop().create_task(watch()))

    def keep(self, task: asyncio.Task) -> None:
        """Hold a request's task (a disconnect watcher, a left stream's drain) until it ends."""
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def complete(self, request: Request, chat: bool) -> Response:
        arrived = time.monotonic()
        try:
            body, point = await self.read_body(request), None
            if self.front is not None:  # a new request: the point the load has moved to (engine/serving/front.py)
                body, point = self.front.assign(body)
            # off the event loop (a constraint's build takes seconds to minutes); one that builds on the
            # builds' own threads, in its client's turn (fair.py), holding no quick check's thread
            spec = constraint_of(body)
            if spec is not None and await asyncio.to_thread(self._builds, spec):  # the vocabulary's first use reads the tokenizer
                client = request.client.host if request.client is not None else ""
                parsed, encoded = await self.builds.run(client, self._checked, body, chat)
            else:
                parsed, encoded = await asyncio.to_thread(self._checked, body, chat)
            self._reserve(len(encoded))
        except Exception:
            self.metrics.requests.labels("refused").inc()
            raise
        request_id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(8)
        cancel, events = threading.Event(), asyncio.Queue()
        self._cancels.add(cancel)
        loop = asyncio.get_running_loop()
        key = batch_key(parsed.config, self.engine.path)
        rows = []
        for i, ids in enumerate(encoded):
            row = Row(i, self.traces.new(), len(ids))
            rows.append(row)
            sink = RowSinkToLoop(self, i, row.trace_id, cancel, loop, events)
            self.batcher.submit(BatchRequest(ids, parsed.config, cancel, sink, key, fitted=True))
        self.watch_disconnect(request, cancel, [r.trace_id for r in rows])
        headers = {"X-Trace-Ids": ",".join(r.trace_id for r in rows)}
        reply = Reply(self, parsed, request_id, rows, events, arrived, cancel, done=lambda: self._cancels.discard(cancel), point=point)
        if parsed.stream:
            return StreamingResponse(reply.stream(), media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})
        body = await reply.whole()
        return JSONResponse(body, headers=headers)

    def _builds(self, spec: ConstraintSpec) -> bool:
        """Whether checking a request of constraint `spec` may build its automaton (neither in this
        process's memory nor in the store yet; a schema outlines-core refuses is refused at once)."""
        with contextlib.suppress(EngineError):
            return not self.engine.vocabulary.kept(spec.regex())
        return False

    def _checked(self, body: Any, chat: bool) -> tuple[ParsedRequest, list[list[int]]]:
        """The request parsed, its config fitted to the model (once: its rows run it as it is,
        `BatchRequest.fitted`), each prompt encoded and every check a run makes before any forward
        (the canvas, the kind, the constraint's room): refused here, in one line."""
        parsed = parse_request(body, chat, self.limits, self.engine.answer_length)
        if parsed.model is not None and parsed.model != self.engine.name:
            raise HTTPError(404, f"model '{parsed.model[:80]}' is not served here; this server serves '{self.engine.name}'", "model_not_found")
        for i in range(len(parsed.prompts)):
            self.limits.check(parsed.prompt_chars(i), parsed.config)
        config = fit(parsed.config, self.engine.model)
        vocabulary = self.engine.vocabulary if spec_of(config) is not None else None  # the constraint's room checked too
        encoded = []
        for prompt in parsed.prompts:
            ids = encode_prompt(self.engine, prompt, config.use_chat_template)
            check_fitted(self.engine.model, [ids], config, self.engine.max_tokens, vocabulary, (self.engine.layout(config),))
            encoded.append(ids)
        return replace(parsed, config=config), encoded


def create_app(
    engine: Engine,
    limits: RequestLimits = RequestLimits(),
    max_batch: int = MAX_BATCH,
    max_pending: int = DEFAULT_MAX_PENDING,
    traces: TraceStore | None = None,
    on_shutdown: Callable[[], None] | None = None,
    batching: str = BATCHING[0],
    prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
    front: FrontFollower | None = None,
    forward_positions: int | None = None, forward_lanes: int = 1,
) -> FastAPI:
    """The FastAPI app serving `engine` (module docstring). `on_shutdown`: called when the server
    stops (uvicorn re-raises a SIGTERM once it has shut down, so code after its run never runs);
    `batching`, `forward_positions`, `forward_lanes`, `prefix_cache_bytes` (`Server`); `front`: the tuned
    front its requests follow under load (engine/serving/front.py)."""
    # `is None`, not `or`: an empty store is falsy (its __len__), and it is the caller's bounds
    server = Server(engine, limits, max_batch, max_pending, TraceStore() if traces is None else traces, batching, prefix_cache_bytes, front,
                    forward_positions, forward_lanes)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        compile_in_background(lambda: engine.vocabulary)  # json_object's grammar, which no first request should wait for
        yield
        if on_shutdown is not None:
            on_shutdown()

    app = FastAPI(title="dinfer-viz engine", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError):
        return error_response(exc.status, exc.message, exc.kind)

    @app.exception_handler(EngineError)
    async def _engine_error(request: Request, exc: EngineError):
        return error_response(413 if isinstance(exc, TooLarge) else 400, str(exc))

    for bad_input in BAD_INPUT_ERRORS:  # raised while a request is read and checked, before it queues
        @app.exception_handler(bad_input)
        async def _bad_input(request: Request, exc: Exception):
            return error_response(400, f"the request cannot be read: {type(exc).__name__}: {exc}"[:300])

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": engine.name, "object": "model", "created": 0, "owned_by": "dinfer-viz"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await server.complete(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await server.complete(request, chat=True)

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.scrape(), media_type=server.metrics.content_type)

    @app.get("/v1/traces/{trace_id}")
    async def trace(trace_id: str):
        entry = server.traces.get(trace_id)
        if entry is None:
            raise HTTPError(404, f"no trace '{trace_id[:80]}' (unknown, or pruned from the store)", "not_found")
        if entry.status != DONE:
            reason = f": {entry.message}" if entry.message else ""
            raise HTTPError(409 if entry.status == RUNNING else 410, f"trace '{trace_id}' is {entry.status}{reason}", entry.status)
        return Response(entry.json, media_type="application/json")

    return app
