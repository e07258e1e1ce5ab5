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

Trimming alone is not enough: glibc's *dynamic* mmap threshold. A buffer
above the threshold (128 KiB at start) is mmapped and given back when freed,
but freeing one raises the threshold to its size (up to 32 MiB) and the trim
threshold to twice that; from then on buffers of a few MiB come from the
heaps, and each worker thread's heap keeps a free top of up to 64 MiB that
``malloc_trim`` does not release (it trims only the main heap's top). A
gateway measured by ``bench/offline.py`` (a 0.25 GiB backlog of one-record
entries) sat 27-29 MB of ``RssAnon`` above its reopened self after a drain
and its trim, ~25 MB of it free space in the drain threads' heaps. So
``edgegw serve`` calls :func:`tune` at start: fixed thresholds
(:data:`MMAP_THRESHOLD`, :data:`TRIM_THRESHOLD`) turn the dynamic ones off,
and the same drain left +11 MB, the rest Python's small-object arenas
(docs/journal.md, "Memory"). An operator's own ``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES`` of glibc.malloc wins.

Elsewhere (musl, macOS) there is no ``malloc_trim`` nor ``mallopt``:
:func:`trim` and :func:`tune` do nothing and say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Final

log = logging.getLogger("edgegw.heap")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    fn = getattr(_libc(), "malloc_trim", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    trim: Callable[[int], int] = fn
    return trim


#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
#: Buffers above this are mmapped, and unmapped when freed (glibc's default
#: start; fixed, it no longer follows the largest buffer freed).
MMAP_THRESHOLD: Final = 256 * 1024
#: A heap's free top above this goes back to the kernel at a free.
TRIM_THRESHOLD: Final = 1024 * 1024
#: Environment that sets these thresholds itself (the operator's choice stands).
_OWN_SETTINGS: Final = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@functools.cache
def _mallopt() -> Callable[[int, int], int] | None:
    fn = getattr(_libc(), "mallopt", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    opt: Callable[[int, int], int] = fn
    return opt


def tune(environ: Mapping[str, str] | None = None) -> bool:
    """Fix glibc's mmap and trim thresholds for a long-running gateway (see above).

    Process-wide: for the ``edgegw serve`` process, at its start, not for a
    library import. False (and nothing changed) where the C library has no
    ``mallopt``, or when the environment sets the thresholds itself.
    """
    env = os.environ if environ is None else environ
    if any(k in env for k in _OWN_SETTINGS) or "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        log.info("heap: malloc thresholds from the environment, left as they are")
        return False
    fn = _mallopt()
    if fn is None:
        return False
    # mallopt returns 1 on success; setting either turns the dynamic thresholds off.
    return bool(fn(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        fn(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


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
