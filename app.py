"""`python app.py`: the dinfer-viz visual debugger on the embedded model (CPU, no download).

    python app.py                                          # assets/tiny-llada on CPU
    python app.py --model tiny-llada-td                    # another embedded model, by name
    python app.py --model GSAI-ML/LLaDA-8B-Instruct --device cuda
    python app.py --no-model                               # replay downloaded traces only

A model that cannot be loaded, or an address that cannot be listened on, ends the program with
one line on stderr and exit status 2. The files it writes for downloads are removed when it stops
(Ctrl+C or SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from engine.cli import DEFAULT_MODEL, OneLineParser, add_runtime_args
from engine.errors import EngineError
from engine.run import every_run_stopped
from engine.system_options import system_options


EXIT_WAIT_S = 60.0  # the longest an exit waits for a forward under way to end (a bound, not a pace)


def port_number(text: str) -> int:
    """argparse type for --port: a TCP port a server can listen on (99999 was a traceback, 0 a
    port the app could not report)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text[:40]}' is not a port number") from None
    if not 1 <= port <= 65_535:
        raise argparse.ArgumentTypeError(f"port {port} is not in 1-65535")
    return port


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python app.py", description="dinfer-viz: a visual debugger for masked-diffusion LM inference")
    # Environment defaults for hosts that start `python app.py` with no arguments (a Space)
    p.add_argument("--model", default=os.environ.get("DINFER_VIZ_MODEL", DEFAULT_MODEL), help="model folder, hub id or embedded model name (tiny-llada-td; default: $DINFER_VIZ_MODEL, else the embedded model)")
    add_runtime_args(p)
    p.set_defaults(device=os.environ.get("DINFER_VIZ_DEVICE", "cpu"))
    # Left unset, Gradio's own settings decide (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, as a
    # Hugging Face Space sets them; else 127.0.0.1:7860): a flag overrides them only when given.
    p.add_argument("--host", default=None, help="address to listen on (0.0.0.0 for every interface; default: $GRADIO_SERVER_NAME or 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=None, help="1-65535 (default: $GRADIO_SERVER_PORT or 7860)")
    p.add_argument("--fps", type=float, default=20.0, help="most live frames per second (grid and readouts)")
    p.add_argument("--plot-hz", type=float, default=3.0, help="most live plot redraws per second")
    p.add_argument("--max-prompt-chars", type=int, default=4000, help="longest prompt a visitor may send (characters)")
    p.add_argument("--max-gen-length", type=int, default=1024, help="largest generation length a visitor may ask for")
    p.add_argument("--max-batch", type=int, default=8, help="most sessions' runs decoded as one engine batch (1: each run alone)")
    p.add_argument("--public", action="store_true", help="serve visitors: only allow-listed models, no paths shown (on by default when --host is not loopback)")
    p.add_argument("--allow-model", action="append", default=[], metavar="NAME=PATH", help="public mode: a model visitors may load, besides the default (repeatable)")
    p.add_argument(
        "--allow-system", action="append", default=[], choices=[o.name for o in system_options()], metavar="OPTION",
        help="public mode: a system option visitors may use (worker processes, compilation), none by default (repeatable)",
    )
    p.add_argument("--auth", default=os.environ.get("DINFER_VIZ_AUTH"), metavar="USER:PASSWORD", help="ask for this login (default: $DINFER_VIZ_AUTH)")
    p.add_argument("--no-model", action="store_true", help="start without loading a model (trace replay, or load one in the page)")
    return p


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")


def allow_list(default: str, entries: list[str]) -> dict[str, str]:
    """Public mode's models: the default (under its folder's name) and each NAME=PATH."""
    allowed = {Path(default).name or default: default}
    for entry in entries:
        name, sep, path = entry.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--allow-model wants NAME=PATH, got {entry!r}")
        allowed[name.strip()] = path.strip()
    return allowed


def parse_auth(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ValueError("--auth wants USER:PASSWORD")
    return user, password


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    positive = [args.fps, args.plot_hz, args.max_prompt_chars, args.max_gen_length, args.max_batch] + ([args.threads] if args.threads is not None else [])
    if min(positive) <= 0:
        print("error: --fps, --plot-hz, --threads and the --max-* limits must be positive", file=sys.stderr)
        return 2
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from dinfer_viz.live.host import EngineHost, ModelSpec, embedded_models
    from dinfer_viz.ui import Handlers, build_demo, launch_kwargs
    from engine.serving.command import listen as listening

    model = embedded_models().get(args.model, args.model)  # a model shipped under assets/, by name
    listen = args.host or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    public = args.public or not is_loopback(listen)
    try:
        allowed = allow_list(model, args.allow_model) if public else None
        auth = parse_auth(args.auth)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Gradio tries ports for seconds each and then retries others: an address this machine cannot
    # bind (or a port given and in use) is said at once, before the model loads
    port = args.port if args.port is not None else int(os.environ.get("GRADIO_SERVER_PORT") or 0)  # Gradio's import checked it
    try:
        listening(listen, port).close()
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(listen) and auth is None:
        print(f"warning: serving {listen} to the network with no login; anyone who reaches it can run the model (set --auth USER:PASSWORD)", file=sys.stderr)
    host = EngineHost(ModelSpec(model, args.device, args.dtype), allowed=allowed, threads=args.threads)
    if not args.no_model:
        host.preload()
        if host.default_error:
            print(f"error: {host.default_error} (use --no-model to start without one)", file=sys.stderr)
            return 2
    handlers = Handlers(
        host, fps=args.fps, plot_hz=args.plot_hz, max_prompt_chars=args.max_prompt_chars, max_gen_length=args.max_gen_length,
        max_batch=args.max_batch, no_model=args.no_model, allow_system=args.allow_system,
    )  # fmt: skip
    demo = build_demo(handlers)
    # SIGTERM (a container's stop) as an exit, so the download folder goes in the finally below
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        demo.launch(server_name=args.host, server_port=args.port, auth=auth, **launch_kwargs())
    finally:
        # a run under way ends at its next step, and the exit waits for the engine to be free: a
        # thread inside a forward at exit aborted the process (SIGABRT) instead of exiting 0
        with every_run_stopped():
            if host.lock.acquire(timeout=EXIT_WAIT_S):
                host.lock.release()
        handlers.remove_files()
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
