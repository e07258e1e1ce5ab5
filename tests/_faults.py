"""A fault-injecting ``FileOps`` for the journal (``edge_gateway/journal/_fs.py``).

As SQLite's I/O-error tests and LevelDB's fault-injection ``Env`` do: every
call is counted per kind, and the N-th call of a kind (and the ones after
it, for ``count`` calls, or until :meth:`FaultyFs.heal`) fails with an
``errno``. A failing write first writes half of its bytes, as a torn write
would; a failing fsync may also drop what it should have synced (the
kernel's page cache after a writeback error, PostgreSQL's "fsyncgate").
"""

from __future__ import annotations

import errno as errno_mod
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from edge_gateway.journal._fs import FileOps

#: kind -> the FileOps methods it covers
KINDS: dict[str, tuple[str, ...]] = {
    "write": ("write", "pwrite", "pwritev"),
    "fsync": ("fsync", "fdatasync"),
    "open": ("open",),
    "rename": ("replace",),
    "resize": ("ftruncate", "posix_fallocate"),
}


class FaultyFs(FileOps):
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.kind = ""
        self.first = 0
        self.count = 0
        self.errno = errno_mod.ENOSPC
        self.failures = 0
        #: on a failed fsync, overwrite the bytes written since the last good one with zeros
        self.drop_unsynced = False
        #: fail only calls on paths that contain this (fd calls: the path it was opened at)
        self.only = ""
        self._synced: dict[int, int] = {}
        self._paths: dict[int, str] = {}

    # ------------------------------------------------------------ control

    def fail(
        self, kind: str, first: int, *, errno: int, count: int = 10**9, only: str = ""
    ) -> None:
        """Fail calls ``first``, ``first + 1``, ... (``count`` of them) of ``kind``.

        With ``only``, just the calls on paths that contain it fail (and count).
        """
        assert kind in KINDS, kind
        self.kind, self.first, self.count, self.errno = kind, first, count, errno
        self.only = only

    def heal(self) -> None:
        self.kind = ""

    def _check(self, kind: str, target: int | str | os.PathLike[str]) -> bool:
        self.calls[kind] += 1
        if self.kind != kind:
            return False
        if self.only:
            where = self._paths.get(target, "") if isinstance(target, int) else str(target)
            if self.only not in where:
                return False
        n = self.calls[kind]
        if self.first <= n < self.first + self.count:
            self.failures += 1
            return True
        return False

    def _error(self) -> OSError:
        return OSError(self.errno, os.strerror(self.errno))

    # ------------------------------------------------------------ the calls

    def open(self, path: str | os.PathLike[str], flags: int, mode: int = 0o777) -> int:  # type: ignore[override]
        if self._check("open", path):
            raise self._error()
        fd = os.open(path, flags, mode)
        self._paths[fd] = str(path)
        self._synced[fd] = os.fstat(fd).st_size  # what is there is as durable as it gets
        return fd

    def write(self, fd: int, data: bytes) -> int:  # type: ignore[override]
        if self._check("write", fd):
            if len(data) > 1:
                os.write(fd, bytes(data[: len(data) // 2]))
            raise self._error()
        return os.write(fd, data)

    def pwrite(self, fd: int, data: bytes, pos: int) -> int:  # type: ignore[override]
        if self._check("write", fd):
            if len(data) > 1:
                os.pwrite(fd, bytes(data[: len(data) // 2]), pos)
            raise self._error()
        return os.pwrite(fd, data, pos)

    def pwritev(self, fd: int, parts: Sequence[bytes | memoryview], pos: int) -> int:  # type: ignore[override]
        if self._check("write", fd):
            data = b"".join(parts)
            if len(data) > 1:
                os.pwrite(fd, data[: len(data) // 2], pos)
            raise self._error()
        return os.pwritev(fd, parts, pos)

    def _sync(self, fd: int, real: str) -> None:
        size = os.fstat(fd).st_size
        if self._check("fsync", fd):
            synced = self._synced.get(fd)
            if self.drop_unsynced and synced is not None and size > synced:
                os.pwrite(fd, bytes(size - synced), synced)
            raise self._error()
        getattr(os, real)(fd)
        self._synced[fd] = size

    def fsync(self, fd: int) -> None:  # type: ignore[override]
        self._sync(fd, "fsync")

    def fdatasync(self, fd: int) -> None:  # type: ignore[override]
        self._sync(fd, "fdatasync")

    def close(self, fd: int) -> None:  # type: ignore[override]
        self._synced.pop(fd, None)
        self._paths.pop(fd, None)
        os.close(fd)

    def ftruncate(self, fd: int, size: int) -> None:  # type: ignore[override]
        if self._check("resize", fd):
            raise self._error()
        os.ftruncate(fd, size)

    def posix_fallocate(self, fd: int, offset: int, length: int) -> None:  # type: ignore[override]
        if self._check("resize", fd):
            raise self._error()
        os.posix_fallocate(fd, offset, length)

    def statvfs(self, path: str | os.PathLike[str]) -> os.statvfs_result:  # type: ignore[override]
        st = os.statvfs(path)
        if self.kind and self.errno in (errno_mod.ENOSPC, errno_mod.EDQUOT):
            # A disk that refuses writes for lack of room reports none free.
            return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, 0, 0, *st[5:]))
        return st

    def replace(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:  # type: ignore[override]
        if self._check("rename", src):
            raise self._error()
        os.replace(src, dst)


def journal_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())
