"""Compiled automata kept on disk, shared by every process on the machine (docs/constraints.md §2).

A JSON object's automaton takes outlines-core 10-30 s to build even over the 99-token character
vocabulary (its byte-level DFA for the size check, then the token-level index), and each process
built it again: a restarted server, each of the app's and the CLI's runs, each rank-0 of a job. An
automaton is a few numpy arrays, so the first process to build one writes it here and the others
read it in milliseconds.

What is read decides a request's answer, and what is removed could be anyone's file, so the store
trusts only what it made (docs/constraints.md §2 has the rules): a folder it created (mode 0700,
MARKER inside), owned by this user, writable by no one else, never reached through a link (any
other is not used, with one warning line); files opened relative to that folder's descriptor;
each file named by a SHA-256 of its key and recording the key in full, a SHA-256 of its arrays
and WRITER, all checked on reading with the automaton's shapes; and only a file with its name
pattern and WRITER is ever removed (one failing its checks, or the least recently used once the
folder is over MAX_BYTES, down to seven eighths of it). Files are safetensors, written to a
temporary name and renamed into place, so a reader never sees half a file.

The folder: $DINFER_VIZ_CACHE/automata, else $XDG_CACHE_HOME/dinfer-viz/automata, else
~/.cache/dinfer-viz/automata; DINFER_VIZ_CACHE=off keeps nothing on disk. A folder that cannot be
written (read-only, full) leaves the engine building as before: this is a cache, never a failure.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import struct
import threading
import time
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import numpy as np

from .automaton import TokenAutomaton
from .bounded import WALL_BOUND_S
from .limits import MAX_REGEX_CHARS, MAX_REPEAT, MAX_STATES, MAX_TABLE_ENTRIES

CACHE_ENV = "DINFER_VIZ_CACHE"
OFF = "off"
FORMAT = 3  # raise when what a file holds changes meaning (2: the key and the digest recorded; 3: no step matrix `succ`, derived from the table)
MAX_BYTES = 512 << 20  # the folder's bound: dozens of JSON-schema automata over a 32k-token vocabulary
SUFFIX = ".safetensors"
NAME = re.compile(r"[0-9a-f]{64}\.safetensors")  # the only names the store writes (or removes)
MARKER = ".dinfer-viz-automata"  # written by the store into a folder it creates: the folder is its own
WRITER = "dinfer-viz automata store"  # in each file's header: a file the store wrote
ARRAYS = ("class_of", "table", "initial", "accepting")  # what a file holds: a TokenAutomaton's own arrays
HEADER_BYTES = 1 << 20  # the most read to tell whose a file is: its key holds a regex (a schema's compiled one may pass MAX_REGEX_CHARS)
T = TypeVar("T")
_ROOM: dict[tuple[int, int, int], int] = {}  # per folder (and bound): what this process may write before it sizes the folder again
_ROOM_LOCK = threading.Lock()

log = logging.getLogger(__name__)
_warned: set[str] = set()  # folders already refused in this process: one line each


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


def key(vocabulary: str, regex: str) -> str:
    """Everything the automaton of `regex` over the vocabulary of digest `vocabulary` depends on."""
    bounds = [MAX_REGEX_CHARS, MAX_REPEAT, MAX_STATES, MAX_TABLE_ENTRIES]
    return json.dumps([FORMAT, _builder_version(), bounds, vocabulary, regex])


@lru_cache(maxsize=1)
def _builder_version() -> str:
    """outlines-core's version (read once: importlib parses its metadata file at every call)."""
    return version("outlines_core")


def file_name(vocabulary: str, regex: str) -> str:
    """The name of the file that holds the automaton of `key(vocabulary, regex)`."""
    return hashlib.sha256(key(vocabulary, regex).encode()).hexdigest() + SUFFIX


def kept(vocabulary: str, regex: str) -> bool:
    """Whether a file for the automaton of `regex` over `vocabulary` is in the store (a look at
    its name only: reading it may still find it fails its checks, and build)."""
    root = folder()
    return root is not None and os.path.isfile(root / file_name(vocabulary, regex))


def content_digest(arrays: dict[str, np.ndarray]) -> str:
    """A SHA-256 of the arrays: each one's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(json.dumps([name, array.dtype.str, list(array.shape)]).encode() + array.tobytes())
    return digest.hexdigest()


def load(vocabulary: str, regex: str, vocab_size: int) -> TokenAutomaton | None:
    """The automaton of `regex` over the vocabulary of digest `vocabulary`, if a process built it;
    None when it is not kept (or its file fails the checks, which removes it)."""

    def automaton(arrays: dict[str, np.ndarray]) -> TokenAutomaton:
        if sorted(arrays) != sorted(ARRAYS):
            raise ValueError("not the arrays of an automaton")
        kept = TokenAutomaton(arrays["class_of"], arrays["table"], int(arrays["initial"][0]), arrays["accepting"])
        _check(kept, vocab_size)
        return kept

    return _read(vocabulary, regex, automaton)


def save(vocabulary: str, regex: str, automaton: TokenAutomaton) -> None:
    """Keep `automaton` for the next process that asks for `regex` over this vocabulary; a folder
    that cannot take it is left as it is."""
    arrays = {"class_of": automaton.class_of, "table": automaton.table, "initial": np.array([automaton.initial], dtype=np.int64),
              "accepting": automaton.accepting}
    _write(vocabulary, regex, arrays)


LOCK_POLL_S = 0.05  # how often a process waiting for another's build looks again


@contextlib.contextmanager
def building(vocabulary: str, regex: str) -> Iterator[None]:
    """Held while this caller builds what the store will keep for `regex` over `vocabulary`: a
    caller in another process (or on another thread with its own vocabulary) asking for the same
    key meanwhile waits here, then reads the file rather than build it again (servers, the app and
    scripts started together each built json_object's grammar, 10-30 s of CPU apiece). The lock is
    one byte of the folder's MARKER file at an offset named by the key (an open-file-description
    lock: per opening, so threads wait on each other too, and gone when its holder ends, however);
    a wait longer than a build's own wall bound gives up and builds. Where nothing is kept or such
    locks are missing (not Linux), it holds nothing."""
    offset = int(file_name(vocabulary, regex)[:15], 16)
    with _folder() as descriptor:
        lock = None
        if descriptor is not None and hasattr(fcntl, "F_OFD_SETLK"):
            with contextlib.suppress(OSError):
                lock = os.open(MARKER, os.O_RDWR | os.O_NOFOLLOW, dir_fd=descriptor)
    if lock is None:
        yield
        return
    try:
        deadline = time.monotonic() + WALL_BOUND_S
        record = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)  # struct flock; l_pid 0
        while True:
            try:
                fcntl.fcntl(lock, fcntl.F_OFD_SETLK, record)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    break
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(lock)  # releases the byte


def built_once(vocabulary: str, regex: str, load: Callable[[], T | None], build: Callable[[], T], save: Callable[[T], None]) -> T:
    """What the store keeps for `regex` over `vocabulary` (`load`: None when nothing is kept), else
    `build` it and `save` it, holding `building` so a caller asking at once reads this one's file."""
    kept = load()
    if kept is not None:
        return kept
    with building(vocabulary, regex):
        kept = load()  # another caller's, built while this one waited
        if kept is None:
            kept = build()
            save(kept)
    return kept


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

    return _read(BYTE_LEVEL, regex, states)


def save_byte_states(regex: str, states: int) -> None:
    """Keep the state count of `regex`'s byte-level DFA."""
    _write(BYTE_LEVEL, regex, {"states": np.array([states], dtype=np.int64)})


@contextlib.contextmanager
def _folder() -> Iterator[int | None]:
    """A descriptor of the store's own folder (created if absent), closed after use; None when
    nothing is kept: DINFER_VIZ_CACHE=off, a folder that cannot be made, or one that is not the
    store's own (module docstring; warned once)."""
    root = folder()
    if root is None:
        yield None
        return
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(root):
            _create(root)
        descriptor = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(root):
            _refuse(root, "is a symbolic link")
        yield None
        return
    try:
        problem = _foreign(descriptor)
        if problem:
            _refuse(root, problem)
        yield None if problem else descriptor
    finally:
        os.close(descriptor)


def _create(root: Path) -> None:
    """The store's folder at `root`, whole (mode 0700, MARKER inside) or not at all: made under a
    temporary name and renamed into place, so another process never sees it without its marker. A
    process that made it first wins; this one's is removed."""
    made = root.with_name(f".{root.name}-{secrets.token_hex(8)}.new")
    os.mkdir(made, 0o700)
    try:
        os.chmod(made, 0o700)  # the umask may only take bits away; this states them whole
        marker = os.open(made / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(marker, "w") as out:
            out.write("made by dinfer-viz's automata store (engine/constraints/stored.py): its files are removed when over its bound\n")
        os.rename(made, root)
    except OSError:
        (made / MARKER).unlink(missing_ok=True)
        made.rmdir()
        if not os.path.lexists(root):  # not another process's folder: this one could not be made
            raise


def _foreign(descriptor: int) -> str | None:
    """Why the folder open at `descriptor` is not the store's own; None when it is."""
    info = os.fstat(descriptor)
    if info.st_uid != os.getuid():
        return "is not owned by this user"
    if info.st_mode & 0o022:
        return "is writable by group or others"
    try:
        marker = os.stat(MARKER, dir_fd=descriptor, follow_symlinks=False)
    except OSError:
        return f"was not made by dinfer-viz (it has no {MARKER})"
    if not stat.S_ISREG(marker.st_mode) or marker.st_uid != os.getuid():
        return f"was not made by dinfer-viz (its {MARKER} is not this user's file)"
    return None


def _refuse(root: Path, problem: str) -> None:
    """One warning line per folder and process: nothing is kept there."""
    if str(root) not in _warned:
        _warned.add(str(root))
        log.warning("the automata cache folder %r %s: automata are built in memory, none kept or read there "
                    "(remove it, or set %s, for dinfer-viz to make a folder of its own)", str(root), problem, CACHE_ENV)


def _open_file(descriptor: int, name: str) -> int | None:
    """A read descriptor of the regular file `name` in the folder, never through a link (and never
    waiting on a FIFO); None when there is no such file."""
    try:
        handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=descriptor)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        return None
    return handle


def _metadata(header: bytes) -> dict[str, str] | None:
    """The metadata of a safetensors file whose first bytes are `header`, if the store wrote it."""
    if len(header) < 8:
        return None
    size = int.from_bytes(header[:8], "little")
    if size > min(HEADER_BYTES, len(header) - 8):
        return None
    try:
        metadata = json.loads(header[8:8 + size]).get("__metadata__")
    except (ValueError, AttributeError):
        return None
    return metadata if isinstance(metadata, dict) and metadata.get("writer") == WRITER else None


def _own_header(descriptor: int, name: str) -> dict[str, str] | None:
    """The metadata of `name` in the folder when it is a file the store wrote; None otherwise."""
    if not NAME.fullmatch(name):
        return None
    handle = _open_file(descriptor, name)
    if handle is None:
        return None
    with os.fdopen(handle, "rb") as data:
        size = data.read(8)
        return _metadata(size + data.read(min(int.from_bytes(size.ljust(8, b"\0"), "little"), HEADER_BYTES)))


def _read(vocabulary: str, regex: str, interpret: Callable[[dict[str, np.ndarray]], T]) -> T | None:
    """`interpret` of the arrays kept for `regex` over `vocabulary`; None when there are none, or
    they fail a check (the file then removed: it is the store's own), or the file there is not the
    store's (left alone)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load as from_bytes

    with _folder() as descriptor:
        if descriptor is None:
            return None
        name = file_name(vocabulary, regex)
        handle = _open_file(descriptor, name)
        if handle is None:
            return None
        try:
            with os.fdopen(handle, "rb") as opened:
                data = opened.read(MAX_BYTES + 1)
        except OSError:
            return None
        metadata = _metadata(data)
        if metadata is None or len(data) > MAX_BYTES:
            return None
        try:
            arrays = from_bytes(data)
            if metadata.get("key") != key(vocabulary, regex):
                raise ValueError("kept for another key")
            if metadata.get("sha256") != content_digest(arrays):
                raise ValueError("its arrays are not the ones written")
            value = interpret(arrays)
        except (KeyError, IndexError, TypeError, ValueError, SafetensorError):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=descriptor)
            return None
        with contextlib.suppress(OSError):  # recently used: the last to go when the folder is over its bound
            os.utime(name, dir_fd=descriptor, follow_symlinks=False)
        return value


def _write(vocabulary: str, regex: str, arrays: dict[str, np.ndarray]) -> None:
    """`arrays` kept for `regex` over `vocabulary`, whole or not at all (a temporary name renamed
    into place), unless a file the store did not write has that name."""
    from safetensors import SafetensorError
    from safetensors.numpy import save as to_bytes

    with _folder() as descriptor:
        if descriptor is None:
            return
        name = file_name(vocabulary, regex)
        with contextlib.suppress(FileNotFoundError):
            os.stat(name, dir_fd=descriptor, follow_symlinks=False)
            if _own_header(descriptor, name) is None:
                return
        temporary = f".{secrets.token_hex(8)}.part"
        try:
            data = to_bytes(arrays, metadata={"writer": WRITER, "key": key(vocabulary, regex), "sha256": content_digest(arrays)})
            handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=descriptor)
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(data)
                os.replace(temporary, name, src_dir_fd=descriptor, dst_dir_fd=descriptor)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary, dir_fd=descriptor)
            _within_bound(descriptor, len(data))
        except (OSError, SafetensorError):
            return


def _check(automaton: TokenAutomaton, vocab_size: int) -> None:
    """ValueError unless the arrays are an automaton over `vocab_size` tokens within the bounds."""
    classes, states = automaton.table.shape if automaton.table.ndim == 2 else (-1, -1)
    fits = (
        automaton.class_of.shape == (vocab_size,) and automaton.class_of.dtype == np.int64
        and automaton.table.dtype == np.int64 and 0 < states <= MAX_STATES and classes * states <= MAX_TABLE_ENTRIES
        and automaton.accepting.shape == (states,) and automaton.accepting.dtype == np.bool_
        and 0 <= automaton.initial < states
        and int(automaton.class_of.min(initial=-1)) >= -1 and int(automaton.class_of.max(initial=-1)) < classes
        and int(automaton.table.min(initial=-1)) >= -1 and int(automaton.table.max(initial=-1)) < states
    )
    if not fits:
        raise ValueError("not an automaton of this vocabulary")


def _within_bound(descriptor: int, written: int) -> None:
    """After a write of `written` bytes: the folder sized again (`_bound`) once this process has
    written the room it found there the last time, at most an eighth of MAX_BYTES (other processes
    write too). Sizing is a stat of every file of the store's names: at 2,757 files 11 ms of the
    interpreter, which each write of a loaded server's constraint checks paid (a fifth of a core
    between them)."""
    info = os.fstat(descriptor)
    folder = (info.st_dev, info.st_ino, MAX_BYTES)  # the room under another bound is not known
    with _ROOM_LOCK:
        room = _ROOM.get(folder, 0) - written
        _ROOM[folder] = room if room > 0 else min(_bound(descriptor), MAX_BYTES // 8)


def _bound(descriptor: int) -> int:
    """Past MAX_BYTES, remove the store's least recently used files until they hold at most
    seven eighths of it; no other file in the folder is counted or touched. The files of the
    store's names are sized first (one stat each) and only read when those exceed the bound (the
    store's own are among them): with the eighth freed, the writes after it read no header until
    another eighth is written (down to the bound itself, a full folder's every write read
    thousands). The room left under the bound."""
    named = []
    for name in os.listdir(descriptor):
        if NAME.fullmatch(name):
            with contextlib.suppress(OSError):  # removed by another process meanwhile
                info = os.stat(name, dir_fd=descriptor, follow_symlinks=False)
                named.append((info.st_mtime, info.st_size, name))
    total = sum(size for _, size, _ in named)
    if total <= MAX_BYTES:
        return MAX_BYTES - total
    files = [entry for entry in named if _own_header(descriptor, entry[2]) is not None]
    total = sum(size for _, size, _ in files)
    for _, size, name in sorted(files):
        if total <= MAX_BYTES - MAX_BYTES // 8:
            break
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=descriptor)
        total -= size
    return max(0, MAX_BYTES - total)
