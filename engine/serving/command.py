"""`python -m engine serve`: load one Engine and serve it over HTTP with uvicorn (docs/serving.md)."""

from __future__ import annotations

import argparse
import socket
from types import FrameType
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import uvicorn

from ..cli import DEFAULT_MODEL, MODEL_HELP, add_runtime_args, check_threads, add_system_flags, apply_runtime, set_cpu_threads, system_kwargs
from ..errors import EngineError
from .batcher import MAX_BATCH
from .limits import DEFAULT_MAX_GEN_LENGTH, DEFAULT_MAX_PROMPT_CHARS, RequestLimits
from .traces import TraceStore

MAX_CONNECTIONS = 256  # open connections at once (uvicorn answers more with 503)
IDLE_SECONDS = 5  # a kept-alive connection with no request is closed after this
GRACE_SECONDS = 30  # after a signal, what is still running after this is cancelled


def add_serve_command(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="serve one model over an OpenAI-compatible HTTP API")
    serve.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default 8000)")
    add_runtime_args(serve)
    add_system_flags(serve)
    serve.add_argument("--max-batch", type=int, default=MAX_BATCH, help="most requests' rows decoded as one engine batch (1: each alone)")
    serve.add_argument("--max-pending", type=int, default=64, help="most rows queued or decoding at once; more are refused with 503")
    serve.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, help="most open connections; more are answered 503 at once")
    serve.add_argument("--max-prompt-chars", type=int, default=DEFAULT_MAX_PROMPT_CHARS, help="longest prompt a request may send (characters)")
    serve.add_argument("--max-gen-length", type=int, default=DEFAULT_MAX_GEN_LENGTH, help="largest generation length a request may ask for")
    serve.add_argument("--max-traces", type=int, default=256, help="traces kept for GET /v1/traces/{id}, the oldest pruned first")
    serve.add_argument("--max-trace-mb", type=int, default=64, help="megabytes of trace JSON kept, the oldest pruned first")
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


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on `host`:`port` (0: any free port), or EngineError in one line for an
    address this machine cannot bind, a name that does not resolve, or a port in use; checked
    before any slow start-up (the model load), so the failure is said at once, never retried."""
    try:
        return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET, backlog=128)
    except (OSError, OverflowError) as exc:  # socket.gaierror included; OverflowError: a port past 65535
        raise EngineError(f"cannot listen on {host}{f':{port}' if port else ''}: {exc.strerror or exc}") from None


def serve_command(args: argparse.Namespace) -> int:
    import uvicorn

    from ..models import model_skeleton
    from ..pipeline import Engine
    from .app import create_app

    positive = {"--port": args.port, "--max-batch": args.max_batch, "--max-pending": args.max_pending, "--max-connections": args.max_connections, "--max-traces": args.max_traces, "--max-trace-mb": args.max_trace_mb}
    bad = [f"{flag} {value}" for flag, value in positive.items() if value < 1]
    if bad:
        raise EngineError(f"these must be >= 1: {', '.join(bad)}")
    if args.port > 65535:
        raise EngineError(f"--port must be in 1..65535, got {args.port}")
    check_threads(args.threads)
    system = system_kwargs(args)
    listener = listen(args.host, args.port)
    limits = RequestLimits(max_prompt_chars=args.max_prompt_chars, max_gen_length=args.max_gen_length)
    traces = TraceStore(args.max_traces, args.max_trace_mb << 20)
    # before the engine: --tp/--ep worker processes share this process's threads (engine/runtime/workers.py)
    set_cpu_threads(model_skeleton(args.model), args.threads)
    with listener, Engine(args.model, **apply_runtime(args), **system) as engine:
        # a parallel engine's workers end with the server, also when a signal stops it
        app = create_app(engine, limits, args.max_batch, args.max_pending, traces, on_shutdown=engine.close)
        config = uvicorn.Config(app, log_level="warning", limit_concurrency=args.max_connections, timeout_keep_alive=IDLE_SECONDS, timeout_graceful_shutdown=GRACE_SECONDS)
        server = stopping_server(config, app.state.server.stop)
        print(f"serving {engine.name} on http://{args.host}:{args.port}/v1", flush=True)
        try:
            server.run(sockets=[listener])
        except KeyboardInterrupt:  # uvicorn re-raises a SIGINT once it has shut down: a clean stop
            pass
    return 0

