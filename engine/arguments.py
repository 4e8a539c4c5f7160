"""The Python API's edge: the checks `Engine`, `Engine.generate`, `generate_ids` and `RunHooks`
make of their arguments, so a caller's wrong type or value is an EngineError in one line, never a
TypeError, an AttributeError or an IndexError from deep inside (the CLI's flags share the device
and dtype rules)."""

from __future__ import annotations

import os
import stat
from typing import Any

import torch

from .errors import EngineError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def need(ok: bool, message: str) -> None:
    if not ok:
        raise EngineError(message)


def shown(value: Any) -> str:
    """A value as a message quotes it: its type and at most 40 characters of it."""
    return f"{type(value).__name__} {str(value)[:40]!r}"


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_device(value: Any) -> str:
    """A device torch knows and this machine has: cpu, cuda, cuda:N or mps."""
    need(isinstance(value, str), f"device must be a text such as 'cpu' or 'cuda:0', got {shown(value)}")
    try:
        parsed = torch.device(value)
    except RuntimeError:
        raise EngineError(f"'{value[:40]}' is not a device; use cpu, cuda, cuda:N or mps") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        need(count > 0, f"'{value}': this machine has no CUDA device (use cpu)")
        need(parsed.index is None or parsed.index < count, f"'{value}': this machine has {count} CUDA device(s)")
    elif parsed.type == "mps":
        need(torch.backends.mps.is_available(), f"'{value}': MPS is not available here (use cpu)")
    else:
        need(parsed.type == "cpu", f"'{value}': only cpu, cuda and mps devices are supported")
    return value


def check_dtype(value: Any) -> torch.dtype | None:
    """None or "auto" (the engine's choice), a torch dtype of DTYPES, or its name."""
    if value is None or value == "auto":
        return None
    if isinstance(value, str):
        need(value in DTYPES, f"dtype '{value[:40]}' is not one of auto, {', '.join(DTYPES)}")
        return DTYPES[value]
    need(value in DTYPES.values(), f"dtype must be one of {', '.join(DTYPES)} (a name or a torch dtype), got {shown(value)}")
    return value


def check_engine_arguments(path: Any, max_tokens: Any) -> None:
    """Engine's own arguments (the device and dtype: `check_device`, `check_dtype`; the degrees:
    engine/runtime/parallel.py's `check_degrees`; compile and CUDA graphs: runtime/compiled.py's
    `check_options`)."""
    need(isinstance(path, (str, os.PathLike)) and str(path).strip() != "", f"the model must be a folder, a hub id or an embedded model's name, got {shown(path)}")
    need(max_tokens is None or (is_int(max_tokens) and max_tokens >= 1), f"max_tokens must be a positive integer or None, got {shown(max_tokens)}")


def check_prompts(prompts: Any) -> list[str]:
    """One text, or a non-empty list of texts."""
    batch = [prompts] if isinstance(prompts, str) else prompts
    need(isinstance(batch, (list, tuple)) and len(batch) > 0 and all(isinstance(p, str) for p in batch), f"prompts must be a text or a non-empty list of texts, got {shown(prompts)}")
    return list(batch)


def check_token_prompts(prompts: Any, vocab_size: int) -> None:
    """A non-empty list of rows of token ids, each id in the vocabulary."""
    rows = prompts if isinstance(prompts, (list, tuple)) else None
    need(rows is not None and len(rows) > 0 and all(isinstance(r, (list, tuple)) and all(is_int(i) for i in r) for r in rows), f"prompts must be a non-empty list of lists of token ids, got {shown(prompts)}")
    bad = next((i for r in rows for i in r if not 0 <= i < vocab_size), None)
    need(bad is None, f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})")


def check_ids(ids: Any, vocab_size: int) -> list[int]:
    """One row of token ids to decode (a list, a tuple or a 1-d tensor's), each in the vocabulary."""
    row = ids.tolist() if isinstance(ids, torch.Tensor) and ids.dim() == 1 else ids
    need(isinstance(row, (list, tuple)) and all(is_int(i) for i in row), f"ids must be a list of token ids (integers), got {shown(ids)}")
    bad = next((i for i in row if not 0 <= i < vocab_size), None)
    need(bad is None, f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})")
    return list(row)


def check_expected(expected: Any, prompts: int) -> list[str]:
    """`generate`'s expected answers: one text for every prompt, or a text per prompt ("" or None for none)."""
    answers = [expected] * prompts if isinstance(expected, str) else expected
    need(isinstance(answers, (list, tuple)) and all(a is None or isinstance(a, str) for a in answers), f"expected must be a text or a list of texts (one per prompt), got {shown(expected)}")
    need(len(answers) == prompts, f"{len(answers)} expected answers for {prompts} prompts")
    return list(answers)


def check_instance(name: str, value: Any, cls: type, hint: str = "") -> None:
    need(isinstance(value, cls), f"{name} must be a {cls.__name__}{hint}, got {shown(value)}")


def read_text_file(path: str | os.PathLike, what: str, limit: int) -> str:
    """A regular file's text, at most `limit` bytes: a FIFO would block the read and a device
    (/dev/zero) never end it, so each is refused, as is a longer file, in one line."""
    try:
        info = os.stat(path)
        need(stat.S_ISREG(info.st_mode), f"{what} {str(path)[:200]} is not a regular file")
        need(info.st_size <= limit, f"{what} {str(path)[:200]} holds {info.st_size:,} bytes; at most {limit:,}")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        need(len(data) <= limit, f"{what} {str(path)[:200]} holds more than {limit:,} bytes")
        return data.decode("utf-8")
    except OSError as exc:
        raise EngineError(f"cannot read {what} {str(path)[:200]}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise EngineError(f"{what} {str(path)[:200]} is not UTF-8 text") from None
