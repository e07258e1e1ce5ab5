"""Replace a small file whole: readers and a crash see the old bytes or the new ones.

Every small state file of edgegw is written this way: the shipper's
``shipper.json``, the producers' table, the routing cache, the auto-created
topics, a server's address file, the pipeline's commit markers, a sealed
segment's index. The steps are the ones SQLite's and LevelDB's
"atomic write" documentation spells out for POSIX:

1. write the new bytes to a temporary file beside the target (same
   directory, so the rename below stays within one file system);
2. ``fsync`` it, so its data is on disk before its name is;
3. ``rename`` it over the target (atomic: the name holds one whole file);
4. ``fsync`` the directory, so the rename itself survives a power cut.

A failure at any step removes the temporary file and raises the
``OSError`` unchanged, so the caller decides what a full disk means (the
shipper raises :class:`~edge_gateway.errors.DiskFull`, the link's usage
counter skips a save). The target is never touched before step 3.

The system calls go through ``ops`` (``os`` by default): the journal passes
its fault-injection seam (``journal._fs.ops``) so its failure tests cover
these writes too. This module imports nothing of edgegw, so every layer may
use it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

__all__ = ["replace_file", "sync_directory"]


def sync_directory(path: Path, *, ops: Any = os) -> None:
    """``fsync`` the directory ``path`` (makes a rename or a create in it durable)."""
    fd = ops.open(path, os.O_RDONLY)
    try:
        ops.fsync(fd)
    finally:
        ops.close(fd)


def replace_file(
    path: Path,
    data: bytes,
    *,
    sync_dir: bool = True,
    ops: Any = os,
) -> None:
    """Write ``data`` to ``path`` by ``<name>.tmp``, fsync, rename and (``sync_dir``)
    a directory fsync. All or nothing; the temporary file is removed on failure."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[ops.write(fd, view) :]
            ops.fsync(fd)
        finally:
            ops.close(fd)
        ops.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            ops.unlink(tmp)
        raise
    if sync_dir:
        sync_directory(path.parent, ops=ops)
