"""What every command line of the project shares: the one-line error parser and the defaults."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path

import torch

DEFAULT_MODEL = str(Path(__file__).resolve().parent.parent / "assets" / "tiny-llada")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def checked_device(value: str) -> str:
    """argparse type for `--device`: a device torch knows and this machine has (cpu, cuda, cuda:1, mps)."""
    try:
        parsed = torch.device(value)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a device; use cpu, cuda, cuda:N or mps") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(f"'{value}': this machine has no CUDA device (use --device cpu)")
        if parsed.index is not None and parsed.index >= count:
            raise argparse.ArgumentTypeError(f"'{value}': this machine has {count} CUDA device(s)")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"'{value}': MPS is not available here (use --device cpu)")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"'{value}': only cpu, cuda and mps devices are supported")
    return value


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (no usage dump) and exits 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {message}\n")


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """`--device`, `--dtype` and `--threads`: where and how a command runs the model."""
    parser.add_argument("--device", type=checked_device, default="cpu", help="cpu, cuda, cuda:1, mps")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: float32 on CPU, bfloat16 on accelerators")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def apply_runtime(args: argparse.Namespace) -> dict[str, typing.Any]:
    """Set `--threads`, and return the `device`/`dtype` keywords for Engine or load_model."""
    if args.threads:
        torch.set_num_threads(args.threads)
    return {"device": args.device, "dtype": DTYPES[args.dtype] if args.dtype else None}
