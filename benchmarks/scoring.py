"""Scoring of model responses: exact numeric answers (GSM8K) and unit tests run in a subprocess (code).

Code scoring runs model-written Python in a separate interpreter (`python -I`, in a fresh
temporary folder, its own process group, a memory cap, killed at the timeout). That
isolates crashes, hangs and stray files, not malice: run untrusted models' code in a container.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT = 10.0  # seconds per program
_MEMORY_LIMIT = 2 << 30  # bytes of address space per program

_NUMBER = r"-?[\d,]*\.?\d+"
_FENCE = re.compile(r"```(?:[A-Za-z0-9_+-]*)\n(.*?)(?:```|$)", re.DOTALL)


# ---- numeric answers (GSM8K) ---------------------------------------------------------------------
def gsm8k_gold(answer: str) -> str:
    """The reference number of a GSM8K `answer` field: what follows its final `####`."""
    _, found, tail = answer.rpartition("####")
    if not found:
        raise ValueError("GSM8K answer has no '####' line")
    return tail.strip()


def extract_answer(response: str) -> str | None:
    """The number a response gives as its answer: after `####`, else in `\\boxed{}`, else after
    "answer is", else the last number in the text (lm-eval's strict, then flexible, extraction)."""
    for pattern in (rf"####\s*\$?\s*({_NUMBER})", rf"\\boxed\{{\s*\$?\s*({_NUMBER})", rf"answer is[:\s]*\$?\s*({_NUMBER})"):
        found = re.findall(pattern, response, flags=re.IGNORECASE)
        if found:
            return found[-1]
    numbers = re.findall(_NUMBER, response)
    return numbers[-1] if numbers else None


def _as_decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text.replace(",", "").replace("$", "").strip().rstrip("."))
    except InvalidOperation:
        return None


def numeric_match(response: str, gold: str) -> bool:
    """Exact match of the response's answer with `gold` as numbers (`1,000` == `1000.0`)."""
    answer = extract_answer(response)
    if answer is None:
        return False
    got, want = _as_decimal(answer), _as_decimal(gold)
    return got is not None and want is not None and got == want


# ---- code (HumanEval, MBPP) ----------------------------------------------------------------------
def extract_code(response: str) -> str:
    """The first fenced code block of a response, else the whole response."""
    match = _FENCE.search(response)
    return match.group(1) if match else response


# Set by the child itself (a preexec_fn is unsafe in a process with threads, as torch's is).
_PRELUDE = f"""try:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, ({_MEMORY_LIMIT}, {_MEMORY_LIMIT}))
except (ImportError, ValueError, OSError):
    pass
"""


def run_python(program: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """True when `program` exits with status 0 within `timeout` seconds, in a separate interpreter."""
    with tempfile.TemporaryDirectory(prefix="dinfer-viz-score-") as folder:
        path = Path(folder) / "program.py"
        path.write_text(_PRELUDE + program)
        posix = os.name == "posix"
        process = subprocess.Popen(
            [sys.executable, "-I", str(path)],
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=posix,
        )
        try:
            return process.wait(timeout=timeout) == 0
        except subprocess.TimeoutExpired:
            if posix:
                os.killpg(process.pid, signal.SIGKILL)  # the program's children too
            else:
                process.kill()
            process.wait()
            return False


def humaneval_program(problem: dict[str, Any], response: str) -> str:
    """The completed function followed by the problem's `check`. A response that restates the
    function (`def entry_point`) is used as is; otherwise it completes the prompt's signature."""
    code = extract_code(response)
    if not re.search(rf"def\s+{re.escape(problem['entry_point'])}\s*\(", code):
        code = problem["prompt"] + code
    return f"{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def humaneval_passes(problem: dict[str, Any], response: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    return run_python(humaneval_program(problem, response), timeout)


def mbpp_program(record: dict[str, Any], response: str) -> str:
    """Setup code, the response's code, then every assert of the record's tests."""
    tests = list(record.get("test_list", [])) + list(record.get("challenge_test_list") or [])
    setup = record.get("test_setup_code") or record.get("test_imports") or ""
    if isinstance(setup, list):
        setup = "\n".join(setup)
    return "\n\n".join(part for part in (setup, extract_code(response), "\n".join(tests)) if part) + "\n"


def mbpp_passes(record: dict[str, Any], response: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    return run_python(mbpp_program(record, response), timeout)
