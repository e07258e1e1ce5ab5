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

Two more settings are for a gateway that runs for weeks, not for a drain.
glibc gives threads heaps of their own ("arenas"), up to eight per core,
and an arena, once made, lives as long as the process and is handed from
thread to thread. A gateway's worker threads come and go (trio ends one
after 10 s idle; an hour of a soak made ~800) and each burst of them used
a few more arenas: the soak's gateways (``python bench/soak.py
--no-restarts``, smaps sampled every 30 s) had 16 arenas within minutes,
their resident pages growing from 2.6 to 6.8 MB in 9 minutes while what
was in use in them stayed ~2.5 MB, each arena's high-water mark reached
by a rarer burst later. So :func:`tune` caps the arenas at
:data:`ARENA_MAX` (``MALLOC_ARENA_MAX`` or ``glibc.malloc.arena_max`` of
the environment win): the worker threads run zstd, ``pread`` and
``fsync``, and allocate little outside the GIL, so they hardly contend for
an arena's lock. And :func:`keep_trimmed` (``edgegw serve`` runs it) trims
every :data:`TRIM_INTERVAL_S`: a free chunk in the middle of a heap stays
resident until a trim hands its pages back, so without it the resident set
follows the heap's high-water mark, not what is in use.

Elsewhere (musl, macOS) there is no ``malloc_trim`` nor ``mallopt``:
:func:`trim` and :func:`tune` do nothing and say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import trio

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
_M_ARENA_MAX: Final = -8
#: Buffers above this are mmapped, and unmapped when freed (glibc's default
#: start; fixed, it no longer follows the largest buffer freed).
MMAP_THRESHOLD: Final = 256 * 1024
#: A heap's free top above this goes back to the kernel at a free.
TRIM_THRESHOLD: Final = 1024 * 1024
#: Heaps for threads besides the main one (glibc: 8 per core).
ARENA_MAX: Final = 2
#: Seconds between the serve process's trims (:func:`keep_trimmed`).
TRIM_INTERVAL_S: Final = 300.0
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


class _State:
    """What :func:`statistics` reports."""

    def __init__(self) -> None:
        #: the cap :func:`tune` set (None: glibc's, or the environment's)
        self.arena_max: int | None = None
        self.trims = 0
        self.trim_seconds = 0.0
        self.max_trim_seconds = 0.0
        #: trims run in worker threads (the shipper's and the periodic one)
        self.lock = threading.Lock()


_STATE: Final = _State()


def tune(environ: Mapping[str, str] | None = None) -> bool:
    """Fix glibc's mmap and trim thresholds and cap its arenas, for a long-running gateway.

    Process-wide: for the ``edgegw serve`` process, at its start (before
    worker threads make arenas), not for a library import. False where the
    C library has no ``mallopt`` (nothing changed), or when the environment
    sets the thresholds itself (they are left alone; the arena cap may still
    be set). The cap is left alone when the environment has its own
    (``MALLOC_ARENA_MAX``, ``glibc.malloc.arena_max``).
    """
    env = os.environ if environ is None else environ
    fn = _mallopt()
    if fn is None:
        return False
    tunables = env.get("GLIBC_TUNABLES", "")
    if "MALLOC_ARENA_MAX" not in env and "glibc.malloc.arena_max" not in tunables:
        _STATE.arena_max = ARENA_MAX if fn(_M_ARENA_MAX, ARENA_MAX) else None
    if any(k in env for k in _OWN_SETTINGS) or any(
        f"glibc.malloc.{k}" in tunables for k in ("mmap_threshold", "trim_threshold")
    ):
        log.info("heap: malloc thresholds from the environment, left as they are")
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
    started = time.perf_counter()
    fn(0)
    took = time.perf_counter() - started
    with _STATE.lock:
        _STATE.trims += 1
        _STATE.trim_seconds += took
        _STATE.max_trim_seconds = max(_STATE.max_trim_seconds, took)
    return True


async def keep_trimmed(interval_s: float = TRIM_INTERVAL_S) -> None:
    """Trim every ``interval_s`` (in a worker thread), for as long as the process serves.

    Returns at once where the C library cannot trim.
    """
    if _malloc_trim() is None:
        return
    while True:
        await trio.sleep(interval_s)
        await trio.to_thread.run_sync(trim)


def statistics() -> dict[str, Any]:
    """What ``edgegw status`` shows under ``heap``: the arena cap and the trims so far."""
    s = _STATE
    return {
        "arena_max": s.arena_max,
        "trims": s.trims,
        "trim_seconds": round(s.trim_seconds, 6),
        "max_trim_ms": round(s.max_trim_seconds * 1e3, 3),
    }
