"""The filesystem under the journal: free space, disk-full episodes, the reserve file.

The journal decides what to delete and when to roll (``_journal.py``); this
module keeps the state of the disk itself: how much room there is, whether
the disk is full (one episode from the first refused write until space
returns, with one WARNING), and the reserve file (``space.reserve``) kept
for the moment everything shipped is in the active segment. See
docs/journal.md, "Disk full".
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from pathlib import Path
from typing import Final

from edge_gateway.errors import DiskFull
from edge_gateway.journal import _fs

log = logging.getLogger("edgegw.journal")

#: errno values that mean "no room": the write is undone and may be retried later.
NO_ROOM: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: The file the journal deletes to roll over on a full disk (see JournalConfig.reserve_bytes).
RESERVE_NAME: Final = "space.reserve"
#: A disk found full again within this many seconds continues the last episode
#: (no second WARNING): typically another process took the room the journal made.
EPISODE_GAP_S: Final = 60.0
#: Segments roll at no more than this fraction of the filesystem (a small disk
#: gets segments small enough that shipped ones can be deleted to make room).
SEGMENTS_PER_DISK: Final = 16


#: What a disk-full episode means for produce, by the lane's policy (the WARNING).
_BLOCKING: Final = (
    "Produce answers 503 disk_full (and mirrors wait) while no room can be made; shipped "
    "segments are deleted to make room (and drop-oldest lanes' oldest segments), never "
    "unshipped data of this journal."
)
_DROPPING: Final = (
    "This drop-oldest lane keeps accepting: shipped segments, then its oldest unshipped "
    "ones (recorded in dropped.log) are deleted to make room."
)


def no_room(exc: OSError) -> bool:
    return exc.errno in NO_ROOM


class DiskSpace:
    """The disk under one journal directory, and its disk-full episodes."""

    def __init__(self, path: Path, reserve_bytes: int) -> None:
        self.path = path
        self.reserve_bytes = reserve_bytes
        #: monotonic time the current episode began, None while the disk has room
        self.full_since: float | None = None
        self.full_ended = -float(EPISODE_GAP_S)
        #: free bytes that end the episode (twice the refused write, and the reserve)
        self.resume_at = 0
        self.rejections = 0
        self.episodes = 0
        self.episode_rejections = 0
        self.episode_deleted = 0
        self.deleted_for_space = 0
        self.has_reserve = False
        #: The journal is a drop-oldest lane's (what the WARNING says).
        self.drop_oldest = False

    def free_and_size(self) -> tuple[int, int]:
        """(bytes free for this user, size) of the filesystem; -1 if unknown."""
        try:
            st = _fs.ops.statvfs(self.path)
        except OSError:
            return -1, -1
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize

    def fit(self, segment_bytes: int, max_bytes: int) -> int:
        """The segment size for this disk; warns when the budget exceeds the disk.

        A segment is the unit of deletion: on a disk smaller than a few
        segments (a 20 MB card and the default 64 MiB), shipped data could
        never be deleted to make room. Segments then roll at 1/16 of the
        filesystem (at least 64 KiB).
        """
        free, size = self.free_and_size()
        if size <= 0:
            return segment_bytes
        fitted = max(64 * 1024, size // SEGMENTS_PER_DISK // 4096 * 4096)
        segment_bytes = min(segment_bytes, fitted)
        if max_bytes + segment_bytes > size:
            log.warning(
                "journal: journal.max_bytes (%d) plus a segment exceeds the filesystem holding "
                "%s (%d bytes, %d free): the disk fills before the budget does. When it is "
                "full, shipped segments are deleted to make room and produce answers 503 "
                "disk_full while none can be; segments roll at %d bytes. Set journal.max_bytes "
                "below the space the journal may use.",
                max_bytes,
                self.path,
                size,
                free,
                segment_bytes,
            )
        return segment_bytes

    def full(self, where: Path, exc: OSError, need: int) -> DiskFull:
        """Note that a write found no room (one WARNING per episode); the error to raise.

        The episode lasts until the disk has room again (twice the write
        that failed, and the reserve file).
        """
        free, _ = self.free_and_size()
        self.resume_at = 2 * max(need, 4096) + self.reserve_bytes
        if self.full_since is None:
            now = time.monotonic()
            self.full_since = now
            if now - self.full_ended < EPISODE_GAP_S:
                # Room the journal made itself was taken again: the same
                # episode for the operator (one WARNING, not one per segment).
                log.info("journal: disk full again writing %s: %d bytes free", where, free)
                return self.error(where, exc, free)
            self.episodes += 1
            self.episode_rejections = 0
            self.episode_deleted = 0
            log.warning(
                "journal: disk full writing %s (%s): %d bytes free. %s Free space on this "
                "filesystem.",
                where,
                exc.strerror or exc,
                free,
                _DROPPING if self.drop_oldest else _BLOCKING,
            )
        return self.error(where, exc, free)

    @staticmethod
    def error(where: Path, exc: OSError, free: int) -> DiskFull:
        return DiskFull(
            f"disk full writing {where}: {exc.strerror or exc} ({max(free, 0)} bytes free); "
            "retry when space returns"
        )

    def refused(self) -> None:
        """Count an append refused with DiskFull."""
        self.rejections += 1
        self.episode_rejections += 1

    def deleted_early(self) -> None:
        """Count a shipped segment deleted before its retention ended, to make room."""
        self.deleted_for_space += 1
        self.episode_deleted += 1

    def end(self, free: int) -> None:
        """End the episode: space returned."""
        assert self.full_since is not None
        log.info(
            "journal: disk space returned (%d bytes free): intake resumed after %.1fs "
            "(%d writes refused, %d shipped segments deleted to make room)",
            free,
            time.monotonic() - self.full_since,
            self.episode_rejections,
            self.episode_deleted,
        )
        self.full_since = None
        self.full_ended = time.monotonic()

    def keep_reserve(self) -> None:
        """Create the reserve file if it is missing and the disk has room for it twice."""
        size = self.reserve_bytes
        if size <= 0 or self.has_reserve:
            return
        path = self.path / RESERVE_NAME
        try:
            if path.stat().st_size == size:
                self.has_reserve = True
                return
        except FileNotFoundError:
            pass
        except OSError:
            return
        free, _ = self.free_and_size()
        if 0 <= free < 2 * size:
            return
        fd = -1
        try:
            fd = _fs.ops.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            _fs.ops.posix_fallocate(fd, 0, size)
        except OSError as exc:
            log.info("journal: no reserve file for now: %s", exc)
            with contextlib.suppress(OSError):
                _fs.ops.unlink(path)
            return
        finally:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    _fs.ops.close(fd)
        self.has_reserve = True

    def release_reserve(self, why: str = "to roll over") -> bool:
        """Delete the reserve file to make room for a roll (or ``why``); False if there is none."""
        if not self.has_reserve:
            return False
        try:
            _fs.ops.unlink(self.path / RESERVE_NAME)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("journal: could not delete the reserve file: %s", exc)
            return False
        self.has_reserve = False
        log.info("journal: the disk is full: released the reserve file %s", why)
        return True
