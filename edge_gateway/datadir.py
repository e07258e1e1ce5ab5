"""One process per data directory: an exclusive lock held for the owner's life.

Two processes that open one journal destroy it: closing a journal truncates
the preallocated tail of its active segment, which the other process is still
writing through its memory map, and both would claim the region's log. So
every command that opens a data directory for writing (``edgegw serve``,
``edgegw sync``, ``edgegw restore``, the scenario runner, an embedded
:class:`~edge_gateway.gateway.Gateway`) first takes :func:`lock_directory`
on it, and the journal takes its own on the journal directory (which may be
configured elsewhere). A second process is refused with :class:`InUse`,
whose message names the holder's PID and what it is.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a lock file that is never
deleted (deleting it would let two processes lock two different files). The
kernel releases it when the holder's descriptor closes — at exit, or at
kill -9 — so a crash never leaves a stale lock behind; the PID written in the
file is only information for the message. Read-only inspection
(``edgegw inspect journal``) takes no lock: it cannot modify anything.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from edge_gateway.errors import ConfigError, InUse

__all__ = ["LOCK_FILE", "DirectoryLock", "LockHolder", "holder_of", "lock_directory"]

#: The lock file in each locked directory.
LOCK_FILE = "edgegw.lock"


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Who holds a directory's lock, as it wrote itself into the lock file."""

    pid: int | None
    #: What the holder is: ``gateway`` (serving), ``sync``, ``restore``, ``journal``...
    role: str
    #: The holder's command line, for people.
    command: str
    since_ms: int

    def describe(self) -> str:
        pid = f"pid {self.pid}" if self.pid is not None else "an unknown pid"
        since = (
            time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(self.since_ms / 1000))
            if self.since_ms
            else ""
        )
        return f"{pid} ({self.command or self.role}{since})"


class DirectoryLock:
    """A held lock on one directory; :meth:`release` (or exit) lets it go."""

    def __init__(self, directory: Path, fd: int, holder: LockHolder) -> None:
        self.directory = directory
        self.holder = holder
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Release the lock. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _command_line() -> str:
    argv = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else []
    return " ".join(argv)[:300]


def _read_holder(fd: int) -> LockHolder | None:
    try:
        raw = os.pread(fd, 4096, 0)
        doc: Any = json.loads(raw) if raw else None
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    pid = doc.get("pid")
    since = doc.get("since_ms")
    return LockHolder(
        pid if isinstance(pid, int) else None,
        str(doc.get("role", "")),
        str(doc.get("command", "")),
        since if isinstance(since, int) else 0,
    )


def lock_directory(directory: str | os.PathLike[str], role: str) -> DirectoryLock:
    """Take the exclusive lock of ``directory`` (created if missing) for this process.

    Raises :class:`InUse` naming the holder when another process (or another
    open of the same directory in this process) holds it. Never blocks.
    """
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise _os_error(path, exc) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise InUse(path, holder) from None
    except OSError as exc:
        os.close(fd)
        raise _os_error(path, exc) from exc
    holder = LockHolder(os.getpid(), role, _command_line(), time.time_ns() // 1_000_000)
    doc = json.dumps(
        {
            "pid": holder.pid,
            "role": holder.role,
            "command": holder.command,
            "since_ms": holder.since_ms,
        }
    ).encode()
    # Information only: the flock is what protects, so a full disk that
    # refuses these bytes must not refuse the lock.
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, doc, 0)
    return DirectoryLock(path, fd, holder)


def holder_of(directory: str | os.PathLike[str]) -> LockHolder | None:
    """Who holds ``directory``'s lock now, or None when nobody does (nothing is created)."""
    lock_path = Path(directory) / LOCK_FILE
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _os_error(Path(directory), exc) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd) or LockHolder(None, "", "", 0)
        return None
    finally:
        os.close(fd)  # releases the shared lock, if taken


def _os_error(path: Path, exc: OSError) -> Exception:
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        # mkdir of a path that is a file (EEXIST), or under one (ENOTDIR).
        found = _file_in(path)
        where = f"{path} is a file" if found == path else f"{path} is inside {found}, a file"
        return ConfigError(
            f"{where}, not a directory: point data_dir at a directory (or a path to create), "
            "or move the file away"
        )
    if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
        return ConfigError(
            f"the filesystem of {path} does not support file locks ({exc.strerror}); "
            "put the data directory on a local filesystem"
        )
    return exc  # permission denied, read-only filesystem...: the caller reports it as is


def _file_in(path: Path) -> Path:
    """``path`` or the first of its parents that exists and is not a directory."""
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            return p
    return path
