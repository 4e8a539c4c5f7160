"""Compiled automata kept on disk, shared by every process on the machine (docs/constraints.md §2).

A JSON object's automaton takes outlines-core 10-30 s to build even over the 99-token character
vocabulary (its byte-level DFA for the size check, then the token-level index), and each process
built it again: a restarted server, each of the app's and the CLI's runs, each rank-0 of a job. An
automaton is a few numpy arrays, so the first process to build one writes it here and the others
read it in milliseconds. A file is named by a digest of everything its automaton depends on (the
vocabulary's tokens, stop ids and `after`, the regex, the bounds it was checked against, the
format and outlines-core's version), so a file can only be the automaton its name asks for; each is
checked on reading (shapes, dtypes, states in range), and one that fails is removed and rebuilt.
Safetensors only, written to a temporary name and renamed into place, so a reader never sees half
a file. The folder is bounded (MAX_BYTES, the least recently used go first).

The folder: $DINFER_VIZ_CACHE/automata, else $XDG_CACHE_HOME/dinfer-viz/automata, else
~/.cache/dinfer-viz/automata; DINFER_VIZ_CACHE=off keeps nothing on disk. A folder that cannot be
written (read-only, full) leaves the engine building as before: this is a cache, never a failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from .automaton import TokenAutomaton
from .limits import MAX_REGEX_CHARS, MAX_REPEAT, MAX_STATES, MAX_TABLE_ENTRIES

CACHE_ENV = "DINFER_VIZ_CACHE"
OFF = "off"
FORMAT = 1  # raise when what a file holds changes meaning
MAX_BYTES = 512 << 20  # the folder's bound: dozens of JSON-schema automata over a 32k-token vocabulary
SUFFIX = ".safetensors"
T = TypeVar("T")


def folder() -> Path | None:
    """Where automata are kept (module docstring); None when DINFER_VIZ_CACHE=off."""
    chosen = os.environ.get(CACHE_ENV, "")
    if chosen == OFF:
        return None
    if chosen:
        return Path(chosen) / "automata"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dinfer-viz" / "automata"


def vocabulary_digest(tokens: dict[int, bytes], stop_ids: list[int], after: tuple[int, ...], vocab_size: int) -> str:
    """A digest of what an automaton depends on besides its regex: the bytes each token writes, the
    stop ids, the ids allowed after the answer and the vocabulary's size."""
    digest = hashlib.sha256()
    digest.update(json.dumps([list(stop_ids), list(after), vocab_size]).encode())
    for token, written in sorted(tokens.items()):
        digest.update(token.to_bytes(8, "little") + len(written).to_bytes(4, "little") + written)
    return digest.hexdigest()


def _path(vocabulary: str, regex: str) -> Path | None:
    root = folder()
    if root is None:
        return None
    bounds = [MAX_REGEX_CHARS, MAX_REPEAT, MAX_STATES, MAX_TABLE_ENTRIES]
    name = hashlib.sha256(json.dumps([FORMAT, version("outlines_core"), bounds, vocabulary, regex]).encode()).hexdigest()
    return root / f"{name}{SUFFIX}"


def load(vocabulary: str, regex: str, vocab_size: int) -> TokenAutomaton | None:
    """The automaton of `regex` over the vocabulary of digest `vocabulary`, if a process built it;
    None when it is not kept (or its file fails the checks, which removes it)."""

    def automaton(arrays: dict[str, np.ndarray]) -> TokenAutomaton:
        kept = TokenAutomaton(arrays["class_of"], arrays["table"], int(arrays["initial"][0]), arrays["accepting"], arrays["succ"])
        _check(kept, vocab_size)
        return kept

    return _read(_path(vocabulary, regex), automaton)


def save(vocabulary: str, regex: str, automaton: TokenAutomaton) -> None:
    """Keep `automaton` for the next process that asks for `regex` over this vocabulary; a folder
    that cannot take it is left as it is."""
    arrays = {"class_of": automaton.class_of, "table": automaton.table, "initial": np.array([automaton.initial], dtype=np.int64),
              "accepting": automaton.accepting, "succ": automaton.succ}
    _write(_path(vocabulary, regex), arrays, regex)


# check_regex's size check builds the regex's byte-level DFA (half of a JSON object's build): its
# state count is kept too, under a name no vocabulary's digest can take
BYTE_LEVEL = "byte-level DFA"


def load_byte_states(regex: str) -> int | None:
    """The state count of `regex`'s byte-level DFA if a process counted it (spec.byte_states)."""

    def states(arrays: dict[str, np.ndarray]) -> int:
        count = int(arrays["states"][0])
        if not 0 < count <= MAX_STATES:
            raise ValueError("a state count outside the bound")
        return count

    return _read(_path(BYTE_LEVEL, regex), states)


def save_byte_states(regex: str, states: int) -> None:
    """Keep the state count of `regex`'s byte-level DFA."""
    _write(_path(BYTE_LEVEL, regex), {"states": np.array([states], dtype=np.int64)}, regex)


def _read(path: Path | None, interpret: Callable[[dict[str, np.ndarray]], T]) -> T | None:
    """`interpret` of the arrays at `path`; None when there is no such file, or it fails (then removed)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    if path is None or not path.is_file():
        return None
    try:
        value = interpret(load_file(path))
        os.utime(path)  # recently used: the last to go when the folder is over its bound
        return value
    except (OSError, KeyError, IndexError, TypeError, ValueError, SafetensorError):
        path.unlink(missing_ok=True)
        return None


def _write(path: Path | None, arrays: dict[str, np.ndarray], regex: str) -> None:
    """`arrays` at `path`, whole or not at all (a temporary name renamed into place)."""
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".part")
        os.close(handle)
        try:
            save_file(arrays, temporary, metadata={"regex": regex[:200]})
            os.replace(temporary, path)
        finally:
            Path(temporary).unlink(missing_ok=True)
        _bound(path.parent)
    except (OSError, SafetensorError):
        return


def _check(automaton: TokenAutomaton, vocab_size: int) -> None:
    """ValueError unless the arrays are an automaton over `vocab_size` tokens within the bounds."""
    classes, states = automaton.table.shape if automaton.table.ndim == 2 else (-1, -1)
    fits = (
        automaton.class_of.shape == (vocab_size,) and automaton.class_of.dtype == np.int64
        and automaton.table.dtype == np.int64 and 0 < states <= MAX_STATES and classes * states <= MAX_TABLE_ENTRIES
        and automaton.accepting.shape == (states,) and automaton.accepting.dtype == np.bool_
        and automaton.succ.shape == (states, states) and automaton.succ.dtype == np.bool_
        and 0 <= automaton.initial < states
        and int(automaton.class_of.min(initial=-1)) >= -1 and int(automaton.class_of.max(initial=-1)) < classes
        and int(automaton.table.min(initial=-1)) >= -1 and int(automaton.table.max(initial=-1)) < states
    )
    if not fits:
        raise ValueError("not an automaton of this vocabulary")


def _bound(root: Path) -> None:
    """Remove the least recently used files until the folder holds at most MAX_BYTES."""
    files = []
    for entry in root.glob(f"*{SUFFIX}"):
        try:
            stat = entry.stat()
        except OSError:  # removed by another process meanwhile
            continue
        files.append((stat.st_mtime, stat.st_size, entry))
    total = sum(size for _, size, _ in files)
    for _, size, entry in sorted(files):
        if total <= MAX_BYTES:
            break
        entry.unlink(missing_ok=True)
        total -= size
