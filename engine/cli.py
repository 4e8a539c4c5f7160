"""What every command line of the project shares: the one-line error parser and the defaults."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path

import torch

DEFAULT_MODEL = str(Path(__file__).resolve().parent.parent / "assets" / "tiny-llada")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (no usage dump) and exits 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {message}\n")
