"""Scoring of model responses: exact numeric answers (GSM8K) and unit tests run in a subprocess (code).

Code scoring runs model-written Python in a sandbox (`run_python`): a separate interpreter
(`python -I`) in a fresh temporary folder and its own process group, with a memory cap, killed at
the timeout, and
- an audit hook installed before the program runs (PEP 578), which refuses writing, deleting or
  renaming files outside the folder, starting processes (fork, exec, subprocess, os.system: so no
  grandchild can outlive the kill), opening sockets' connections, and loading ctypes (the way around
  the hook);
- no network at all where the kernel allows it: the interpreter runs under `unshare --net
  --map-root-user` (a new, empty network namespace, no privileges needed); where `unshare` is
  missing or refused (some containers), the audit hook's socket rule is the fallback.
An audit hook is not a security boundary against a determined attacker (C extensions can bypass
it); it stops what model-written test code does by accident. Scoring a model you do not trust
belongs in a container or VM as well.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
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


# Run by the child itself before the program (a preexec_fn is unsafe in a process with threads, as
# torch's is). `FOLDER` is the program's folder, the only place it may change.
_PRELUDE = f"""import os as _os, sys as _sys
_sys.dont_write_bytecode = True
try:
    import resource as _resource
    _resource.setrlimit(_resource.RLIMIT_AS, ({_MEMORY_LIMIT}, {_MEMORY_LIMIT}))
except (ImportError, ValueError, OSError):
    pass
_FOLDER = _os.path.realpath(_os.path.dirname(_os.path.abspath(__file__)))
_WRITE_FLAGS = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_APPEND | _os.O_TRUNC
_NO_PROCESSES = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn")
_NO_NETWORK = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg")
_PATH_CHANGES = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link", "os.truncate", "shutil.rmtree", "os.utime")
def _inside(path):
    try:
        path = _os.fsdecode(path) if not isinstance(path, int) else None
    except TypeError:
        return False
    return path is not None and (_os.path.realpath(path) + _os.sep).startswith(_FOLDER + _os.sep)
def _sandbox(event, args):
    if event == "open":
        path, mode, flags = args
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writes and not isinstance(path, int) and not _inside(path):
            raise PermissionError(f"sandbox: no writing outside the program's folder ({{path}})")
    elif event.startswith(_NO_PROCESSES):
        raise PermissionError(f"sandbox: no new processes ({{event}})")
    elif event in _NO_NETWORK:
        raise PermissionError(f"sandbox: no network ({{event}})")
    elif event in _PATH_CHANGES:
        if not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes, _os.PathLike))):
            raise PermissionError(f"sandbox: no changes outside the program's folder ({{event}})")
    elif event == "import" and args[0] in ("ctypes", "_ctypes"):
        raise PermissionError("sandbox: no ctypes")
    elif event == "ctypes.dlopen":
        raise PermissionError("sandbox: no ctypes")
_sys.addaudithook(_sandbox)
del _sandbox
"""


@functools.cache
def network_isolation() -> list[str]:
    """The command prefix that gives the program an empty network namespace, or [] where the
    kernel or the container refuses it (then the audit hook's socket rule is all there is)."""
    unshare = shutil.which("unshare")
    if unshare is None or os.name != "posix":
        return []
    prefix = [unshare, "--net", "--map-root-user"]
    try:
        ok = subprocess.run([*prefix, sys.executable, "-c", "pass"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return prefix if ok else []


def run_python(program: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """True when `program` exits with status 0 within `timeout` seconds, in the sandbox."""
    with tempfile.TemporaryDirectory(prefix="dinfer-viz-score-") as folder:
        path = Path(folder) / "program.py"
        path.write_text(_PRELUDE + program)
        posix = os.name == "posix"
        process = subprocess.Popen(
            [*network_isolation(), sys.executable, "-I", str(path)],
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
                os.killpg(process.pid, signal.SIGKILL)  # the whole group: the sandbox starts no process that could leave it
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
