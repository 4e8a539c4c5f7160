"""What every command line of the project shares: the one-line error parser and the defaults."""

from __future__ import annotations

import argparse
import os
import typing
from pathlib import Path

import torch

from .arguments import DTYPES, check_device
from .errors import EngineError
from .models.loader import embedded_models
from .system_options import system_options

DEFAULT_MODEL = str(Path(__file__).resolve().parent.parent / "assets" / "tiny-llada")
MODEL_HELP = f"model folder, hub id (org/name) or an embedded model's name ({', '.join(embedded_models())}; default tiny-llada)"

# torch's own choice (one thread per physical core), read before anything changes it
TORCH_DEFAULT_THREADS = torch.get_num_threads()
# Below this size a CPU forward is too small to split: each op is microseconds of work, so extra
# threads mostly add synchronisation, and on a shared machine a thread that loses its time slice
# stalls every op (measured by benchmarks/threads.py; README, "CPU threads").
SMALL_MODEL_PARAMETERS = 50_000_000


def cpu_threads_for(parameters: int) -> int:
    """The CPU thread count the CLI and the app use for a model of this size, unless told."""
    return 1 if parameters < SMALL_MODEL_PARAMETERS else TORCH_DEFAULT_THREADS


def set_cpu_threads(model: torch.nn.Module, requested: int | None) -> int:
    """Set torch's CPU threads: `requested` (--threads) when given, else the rule; returns it."""
    threads = requested or cpu_threads_for(sum(p.numel() for p in model.parameters()))
    torch.set_num_threads(threads)
    return threads


def check_threads(requested: int | None) -> None:
    """--threads: at least 1 and at most this machine's CPUs (far more threads than cores only
    slows every op, and tens of thousands fail inside the thread pools, even with a crash)."""
    most = os.cpu_count() or 1
    if requested is not None and not 1 <= requested <= most:
        raise EngineError(f"threads must be >= 1 and at most {most} (this machine's CPUs), got {requested}")


def checked_device(value: str) -> str:
    """argparse type for `--device`: a device torch knows and this machine has (cpu, cuda, cuda:1, mps)."""
    try:
        return check_device(value)
    except EngineError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (no usage dump) and exits 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {printable(message)}\n")


def printable(message: str) -> str:
    """One line any stream can write: whitespace runs joined, a lone surrogate (an argument's bytes
    that are not UTF-8) as its escape."""
    return " ".join(message.split()).encode("utf-8", "backslashreplace").decode("utf-8")


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """`--device`, `--dtype` and `--threads`: where and how a command runs the model."""
    parser.add_argument("--device", type=checked_device, default="cpu", help="cpu, cuda, cuda:1, mps")
    parser.add_argument("--dtype", choices=["auto", *sorted(DTYPES)], default="auto", help="auto: float32 on CPU, bfloat16 on accelerators")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 for models under 50M parameters, else one per core)")


def apply_runtime(args: argparse.Namespace) -> dict[str, typing.Any]:
    """The `device`/`dtype` keywords for Engine or load_model (threads: `set_cpu_threads` once the
    model is loaded, since the default depends on its size)."""
    return {"device": args.device, "dtype": DTYPES.get(args.dtype)}  # "auto": None, the engine's choice


def add_system_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per system option (engine/system_options.py): `--tp N` for a degree, `--compile`
    for a switch, each with its declared help."""
    for option in system_options():
        if option.kind is bool:
            parser.add_argument(option.flag, dest=option.name, action="store_true", help=option.help)
        else:
            parser.add_argument(option.flag, dest=option.name, type=option.kind, default=option.off, help=option.help)


def system_kwargs(args: argparse.Namespace) -> dict[str, typing.Any]:
    """The `Engine` keywords the system flags give; EngineError for a degree below 1."""
    values = {option.name: getattr(args, option.name) for option in system_options()}
    degrees = [o for o in system_options() if o.kind is int]
    if any(values[o.name] < 1 for o in degrees):
        raise EngineError(f"{' and '.join(o.flag for o in degrees)} must be >= 1, got {' and '.join(str(values[o.name]) for o in degrees)}")
    for option in system_options():  # the declared bounds (engine/system_options.py)
        option.check(values[option.name])
    return values
