"""Give the C allocator's freed memory back to the operating system after each batch.

A server decodes requests of many shapes: each batch allocates and frees tensors and buffers of
sizes the next one does not reuse, and glibc's malloc keeps the freed pages in its arenas (one per
thread that allocated) instead of returning them. Nothing leaks (the Python heap and every queue
are bounded), but the process's resident memory creeps up with the mix of shapes it has seen:
+11.6% over 500 requests in `benchmarks/load.py` before this. `malloc_trim(0)` returns the free
pages of every arena; it costs about 2 ms against a batch's tens of milliseconds or more.
On a C library without it (musl, macOS) this does nothing: their allocators return memory
themselves or keep it by design."""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Callable


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_freed_memory() -> bool:
    """Return the allocator's free pages to the system; True where the C library can (glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
