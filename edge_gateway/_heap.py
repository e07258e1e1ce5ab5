"""Hand the C heap's free pages back to the kernel after a burst (glibc ``malloc_trim``).

A drain of a large backlog reads, decodes and compresses hundreds of
megabytes through the interpreter: buffers of a few MiB (``pread`` of entry
runs, compressed objects) come from glibc's heap, and once they are freed the
heap keeps the pages, fragmented between smaller blocks that live on. A
gateway measured by ``bench/offline.py`` kept ~12 MB more of anonymous memory
after a drain than ``malloc_trim(0)`` leaves (docs/journal.md, "Memory"), and
the next drain may be days away. So the shipper trims once after a drain
(:data:`edge_gateway.shipper.TRIM_AFTER_OBJECTS` objects or more back to
back). Python's own small-object arenas are not affected (they return an
arena when it empties).

Elsewhere (musl, macOS) there is no ``malloc_trim``: :func:`trim` does
nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger("edgegw.heap")


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    trim: Callable[[int], int] = fn
    return trim


def trim() -> bool:
    """Return the heap's free pages to the kernel; False where the C library cannot.

    Blocking (a few milliseconds for a heap of tens of MB, the GIL released):
    call it from a worker thread.
    """
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
