"""The journal's file operations, behind one seam so tests can make them fail.

Every system call the journal makes to write, sync, create, rename, resize
or map its files goes through the module-level object
``edge_gateway.journal._fs.ops``, an instance of :class:`FileOps` (every
journal module calls ``_fs.ops.<call>``, so one swap covers them all). A
test swaps it for a subclass that fails the N-th call of a kind with
``ENOSPC`` or ``EIO`` (as SQLite's I/O-error tests and LevelDB's
fault-injection ``Env`` do) and checks that the journal keeps its promises.

The hottest path, copying a small entry into the memory map of the active
segment, makes no system call and so does not pass here: it writes into
space that ``posix_fallocate`` reserved when the segment started, which is
where a full disk shows (see docs/journal.md, "Disk full").

Reads (``pread``, reading a whole segment at open) use ``os`` directly;
only the opens of files to read pass here.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from edge_gateway.durable import sync_directory

_fdatasync: Final[Callable[[int], None]] = getattr(os, "fdatasync", os.fsync)


class FileOps:
    """Pass-through to ``os``; a subclass may fail any call like the kernel would.

    The attributes are the ``os`` functions themselves (no wrapper to call
    through), so the seam costs one attribute lookup per call.
    """

    open: Callable[..., int] = staticmethod(os.open)
    close: Callable[[int], None] = staticmethod(os.close)
    write: Callable[[int, bytes], int] = staticmethod(os.write)
    pwrite: Callable[[int, bytes, int], int] = staticmethod(os.pwrite)
    pwritev: Callable[[int, Sequence[bytes | memoryview], int], int] = staticmethod(os.pwritev)
    fsync: Callable[[int], None] = staticmethod(os.fsync)
    fdatasync: Callable[[int], None] = staticmethod(_fdatasync)
    ftruncate: Callable[[int, int], None] = staticmethod(os.ftruncate)
    posix_fallocate: Callable[[int, int, int], None] = staticmethod(os.posix_fallocate)
    replace: Callable[[str | os.PathLike[str], str | os.PathLike[str]], None] = staticmethod(
        os.replace
    )
    unlink: Callable[[str | os.PathLike[str]], None] = staticmethod(os.unlink)
    statvfs: Callable[[str | os.PathLike[str]], os.statvfs_result] = staticmethod(os.statvfs)

    @staticmethod
    def mmap(fd: int, length: int) -> mmap.mmap:
        """A shared, writable map of ``length`` bytes of ``fd``."""
        return mmap.mmap(fd, length)


def write_all(fs: FileOps, fd: int, data: bytes) -> None:
    """``write`` until every byte is out (a short write is not an error)."""
    view = memoryview(data)
    while view:
        n = fs.write(fd, view)  # type: ignore[arg-type]
        view = view[n:]


#: The file operations of every journal module (a test swaps this object to inject faults).
ops: FileOps = FileOps()


def fsync_dir(path: Path) -> None:
    """fsync the directory ``path`` through :data:`ops` (a rename in it is durable after this)."""
    sync_directory(path, ops=ops)
