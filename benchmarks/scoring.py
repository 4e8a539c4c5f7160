"""Scoring of model responses: exact numeric answers (GSM8K) and unit tests of generated code.

A model's program is untrusted input: `run_python` runs it behind the boundary of
benchmarks/sandbox.py (bubblewrap namespaces with no host files, processes or network, a filter
refusing new processes, resource limits, killed whole at the timeout), and refuses to run it, saying
why, on a machine that cannot provide that boundary unless the user opts in
(DINFER_VIZ_UNSANDBOXED_CODE=1).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from . import sandbox

DEFAULT_TIMEOUT = 10.0  # seconds per program

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


def run_python(program: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """True when `program` exits with status 0 within `timeout` seconds, in the sandbox."""
    return sandbox.run(program, timeout) == 0


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
