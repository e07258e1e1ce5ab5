"""Which files this process holds open: a leaked SQLite connection keeps its database open.

Python 3.13 warns (``ResourceWarning``) when a ``sqlite3.Connection`` is
garbage-collected unclosed, 3.11 and 3.12 say nothing; these checks catch a
leak on every version, and :func:`no_gc` makes them deterministic (a leaked
connection caught in a reference cycle stays open until the collector runs).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from pathlib import Path


def open_paths(*files: Path) -> list[str]:
    """The descriptors of this process open on ``files`` (or their -wal/-shm/-journal)."""
    wanted = set()
    for f in files:
        real = os.path.realpath(f)
        wanted |= {real, f"{real}-wal", f"{real}-shm", f"{real}-journal"}
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target in wanted:
                found.append(f"{fd} -> {target}")
    return found


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off: what is not closed explicitly stays open."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
