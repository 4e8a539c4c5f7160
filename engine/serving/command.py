"""`python -m engine serve`: load one Engine and serve it over HTTP with uvicorn (docs/serving.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import uvicorn

    from .front import FrontFollower

from ..cli import DEFAULT_MODEL, MODEL_HELP, add_runtime_args, check_threads, add_system_flags, apply_runtime, set_cpu_threads, system_kwargs
from ..errors import EngineError
from .batcher import MAX_BATCH
from .served import BATCHING, BUDGET_MAX_ROWS, CPU_FORWARD_LANES, CPU_FORWARD_POSITIONS, check_rounds, served_budget, served_lanes, served_max_batch
from .limits import DEFAULT_MAX_GEN_LENGTH, DEFAULT_MAX_PROMPT_CHARS, RequestLimits
from .traces import TraceStore

MAX_CONNECTIONS = 256  # open connections at once (uvicorn answers more with 503)
IDLE_SECONDS = 5  # a kept-alive connection with no request is closed after this
# a request's line and headers must be whole within this of the connection's start (or of the
# previous response): uvicorn itself waits for them forever, so a client that opens connections
# and sends its headers a byte at a time would hold them all, and --max-connections with them
HEADER_SECONDS = 10.0
GRACE_SECONDS = 30  # after a signal, what is still running after this is cancelled


def add_serve_command(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="serve one model over an OpenAI-compatible HTTP API")
    serve.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default 8000)")
    add_runtime_args(serve)
    add_system_flags(serve)
    serve.add_argument("--max-batch", type=int, default=None,
                       help=f"most rows decoding at once, lockstep's rows of one batch (1: each alone; default {MAX_BATCH}, {BUDGET_MAX_ROWS} under a position budget)")
    serve.add_argument("--batching", choices=BATCHING, default=BATCHING[0],
                       help="continuous: rows of any length share forwards and each leaves when done; lockstep: equal prompt lengths and settings decode as one batch to its end; "
                       "short-first: continuous, a round taking the rows within twice the shortest canvas asking (a longer row joins after 3 rounds left out)")
    serve.add_argument("--forward-positions", type=int, default=None,
                       help="continuous and short-first: a forward's budget of positions computed, the rows with the fewest forwards first, a row over it alone "
                       f"(default: {CPU_FORWARD_POSITIONS} on a CPU, none on a GPU; 0: none, every row asking joins)")
    serve.add_argument("--forward-lanes", type=int, default=None,
                       help="continuous and short-first: rounds of forwards run at once, each on a thread of its own "
                       f"(default: on a CPU one per --threads of the machine's cores, at most {CPU_FORWARD_LANES}; on a GPU 1)")
    serve.add_argument("--prefix-cache-mb", type=int, default=256,
                       help="a block-causal model (LLaDA2): megabytes of prompt blocks' K/V shared across requests, least recently used dropped first (0: off)")
    serve.add_argument("--max-pending", type=int, default=64, help="most rows queued or decoding at once; more are refused with 503")
    serve.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, help="most open connections; more are answered 503 at once")
    serve.add_argument("--header-timeout", type=float, default=HEADER_SECONDS, help="seconds a request's headers may take to arrive; a slower client is answered 408 and dropped")
    serve.add_argument("--max-prompt-chars", type=int, default=DEFAULT_MAX_PROMPT_CHARS, help="longest prompt a request may send (characters)")
    serve.add_argument("--max-gen-length", type=int, default=DEFAULT_MAX_GEN_LENGTH, help="largest generation length a request may ask for")
    serve.add_argument("--max-traces", type=int, default=256, help="traces kept for GET /v1/traces/{id}, the oldest pruned first")
    serve.add_argument("--max-trace-mb", type=int, default=64, help="megabytes of trace JSON kept, the oldest pruned first")
    serve.add_argument("--front", metavar="FILE", help="a tuned front (engine tune --front-out FILE): under load, new requests move along it toward fewer forwards (docs/serving.md §7)")
    serve.add_argument("--target-p95-ms", type=float, metavar="MS", help="with --front: the p95 latency the server holds by moving along the front")
    serve.set_defaults(run=serve_command)


def stopping_server(config: "uvicorn.Config", stop: Callable[[], None]) -> "uvicorn.Server":
    """uvicorn's server, which on SIGINT/SIGTERM first cancels the requests in flight (`stop`: each
    stream ends with an error event), then shuts down as uvicorn does."""
    import uvicorn  # imported only to serve

    class StoppingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            stop()
            super().handle_exit(sig, frame)

    return StoppingServer(config)


def header_deadline_protocol(seconds: float) -> type:
    """uvicorn's HTTP/1.1 protocol (h11) with a deadline on each request's headers: `seconds` from
    the connection's start, and again from each response (the next request on a kept-alive
    connection); once the headers are whole the body's own bound applies (RequestLimits.body_seconds).
    A client that has sent part of a request by then is answered 408 in OpenAI's error shape; one
    that has sent nothing is closed without a word (an idle connection, which no client is waiting on)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from .http_errors import error_body

    late = json.dumps(error_body(f"the request headers did not arrive within {seconds:g} s")).encode()
    answer = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(late), late)

    class HeaderDeadline(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._headers_late)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _headers_late(self) -> None:
            self._deadline = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return  # closed already, or its headers came: the request is under way
            if self.conn.trailing_data[0]:  # part of a request: say why it is dropped
                self.transport.write(answer)
            self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:  # the request's line and headers are whole
                self._disarm()

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._arm()  # the next request's headers (a pipelined one disarms it at once)
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadline


def server_config(app: Any, max_connections: int = MAX_CONNECTIONS, header_seconds: float = HEADER_SECONDS) -> "uvicorn.Config":
    """How `serve` runs `app` on uvicorn: its connection cap, the header deadline, the idle and
    shutdown bounds (tests/test_serve_faults.py runs the same)."""
    import uvicorn

    return uvicorn.Config(
        app, log_level="warning", http=header_deadline_protocol(header_seconds), limit_concurrency=max_connections,
        timeout_keep_alive=IDLE_SECONDS, timeout_graceful_shutdown=GRACE_SECONDS,
    )


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on `host`:`port` (0: any free port), or EngineError in one line for an
    address this machine cannot bind, a name that does not resolve, or a port in use; checked
    before any slow start-up (the model load), so the failure is said at once, never retried."""
    try:
        created = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=128)
    except (OSError, OverflowError) as exc:  # socket.gaierror included; OverflowError: a port past 65535
        raise EngineError(f"cannot listen on {host}{f':{port}' if port else ''}: {exc.strerror or exc}") from None
    # named as TCP (create_server leaves the protocol 0), so each accepted connection is too and
    # asyncio sets TCP_NODELAY on it, as on the sockets it makes itself: without, on a kept-alive
    # connection the answer's second write waited for the client's delayed ACK (40 ms a request)
    return socket.socket(created.family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=created.detach())


def following(args: argparse.Namespace) -> "FrontFollower | None":
    """`--front` and `--target-p95-ms` (both or neither), the front checked against the served
    model's skeleton before the model loads; EngineError in one line."""
    from ..models import model_skeleton
    from .front import FrontFollower, LoadFollower, read_front

    if (args.front is None) != (args.target_p95_ms is None):
        raise EngineError("--front and --target-p95-ms go together: the front to follow and the latency that moves along it")
    if args.front is None:
        return None
    if not 0 < args.target_p95_ms < float("inf"):
        raise EngineError(f"--target-p95-ms must be a positive number of milliseconds, got {args.target_p95_ms:g}")
    front = read_front(args.front, model_skeleton(args.model))
    return FrontFollower(front, LoadFollower(len(front.settings), args.target_p95_ms / 1000))


def serve_command(args: argparse.Namespace) -> int:
    from ..models import model_skeleton
    from ..pipeline import Engine
    from .app import create_app

    positive = {"--port": args.port, "--max-batch": MAX_BATCH if args.max_batch is None else args.max_batch, "--max-pending": args.max_pending, "--max-connections": args.max_connections, "--max-traces": args.max_traces, "--max-trace-mb": args.max_trace_mb}
    if args.prefix_cache_mb < 0:
        raise EngineError(f"--prefix-cache-mb must be >= 0, got {args.prefix_cache_mb}")
    if args.forward_positions is not None and args.forward_positions < 0:
        raise EngineError(f"--forward-positions must be >= 0 (0: none), got {args.forward_positions}")
    bad = [f"{flag} {value}" for flag, value in positive.items() if value < 1]
    if bad:
        raise EngineError(f"these must be >= 1: {', '.join(bad)}")
    if args.port > 65535:
        raise EngineError(f"--port must be in 1..65535, got {args.port}")
    if not 0 < args.header_timeout < float("inf"):
        raise EngineError(f"--header-timeout must be a positive number of seconds, got {args.header_timeout:g}")
    check_threads(args.threads)
    check_rounds(args.batching, args.forward_positions or None, 1 if args.forward_lanes is None else args.forward_lanes)
    front = following(args)
    system = system_kwargs(args)
    listener = listen(args.host, args.port)
    limits = RequestLimits(max_prompt_chars=args.max_prompt_chars, max_gen_length=args.max_gen_length)
    traces = TraceStore(args.max_traces, args.max_trace_mb << 20)
    # before the engine: --tp/--ep worker processes share this process's threads (engine/runtime/workers.py)
    set_cpu_threads(model_skeleton(args.model), args.threads)
    with listener, Engine(args.model, **apply_runtime(args), **system) as engine:
        # a parallel engine's workers end with the server, also when a signal stops it
        budget = served_budget(args.forward_positions, args.batching, engine)
        app = create_app(engine, limits, served_max_batch(args.max_batch, budget), args.max_pending, traces, on_shutdown=engine.close,
                         batching=args.batching, forward_positions=budget,
                         forward_lanes=served_lanes(args.forward_lanes, args.batching, engine),
                         prefix_cache_bytes=args.prefix_cache_mb << 20, front=front)
        server = stopping_server(server_config(app, args.max_connections, args.header_timeout), app.state.server.stop)
        print(f"serving {engine.name} on http://{args.host}:{args.port}/v1", flush=True)
        try:
            server.run(sockets=[listener])
        except KeyboardInterrupt:  # uvicorn re-raises a SIGINT once it has shut down: a clean stop
            pass
    return 0

