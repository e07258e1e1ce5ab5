"""The journal's segments at rest: which segment holds an LSN, and how its bytes are read.

What it owns: the segments in LSN order (sealed ones first, the active one
last) with their base LSNs for the bisect, and the read descriptors of
sealed segments (a small LRU cache; the active segment is read through its
write descriptor). Everything that asks where an LSN is stored, or reads a
segment's bytes, asks here: the read path (``_reads.py``), retention
(``_retention.py``, which takes the oldest segment off with
:meth:`SegmentSet.pop_oldest`) and the open (``_open.py``).

It is the one place that knows what a segment at rest is, so a second kind
of sealed segment (one rewritten as compressed blocks) plugs in here
(``locate``, ``pread``) and in ``_reads.py``, not across the journal.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
from collections import OrderedDict
from typing import Final

from edge_gateway.errors import InvalidInput, Unavailable
from edge_gateway.journal import _fs
from edge_gateway.journal._segment import Segment

log = logging.getLogger("edgegw.journal")

#: Read descriptors of sealed segments kept open (least recently used closed first).
READ_FD_CACHE: Final = 32


class SegmentSet:
    """The journal's segments in LSN order (the active one last) and their read descriptors."""

    __slots__ = ("_read_fds", "bases", "segments")

    def __init__(self) -> None:
        #: oldest first; contiguous LSN ranges; the last one is the active segment
        self.segments: list[Segment] = []
        #: each segment's base LSN (``segments[i].base_lsn``), for the bisect of :meth:`locate`
        self.bases: list[int] = []
        self._read_fds: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def active(self) -> Segment:
        """The segment appends go to (the last one)."""
        return self.segments[-1]

    @property
    def first_lsn(self) -> int:
        """The first LSN still in the journal (0 when it holds no segment)."""
        return self.segments[0].base_lsn if self.segments else 0

    def add(self, seg: Segment) -> None:
        """Add ``seg`` as the new active segment (its LSNs follow the last one's)."""
        self.segments.append(seg)
        self.bases.append(seg.base_lsn)

    def pop_active(self) -> Segment:
        """Take the active segment off (a reset of an empty journal)."""
        self.bases.pop()
        return self.segments.pop()

    def pop_oldest(self) -> Segment:
        """Take the oldest segment off (retention deleted its file); closes its read descriptor."""
        self.bases.pop(0)
        seg = self.segments.pop(0)
        fd = self._read_fds.pop(seg.base_lsn, None)
        if fd is not None:
            os.close(fd)
        return seg

    def delete_oldest(self) -> tuple[Segment, int] | None:
        """Delete the oldest segment's files and take it off: (it, the bytes freed).

        None if its file cannot be removed: it is kept, since deleting a
        later one would leave a hole the next open refuses (segments must be
        contiguous). Which segment may go, and when, is retention's to say.
        """
        seg = self.segments[0]
        try:
            _fs.ops.unlink(seg.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("journal: could not delete segment %s: %s", seg.path, exc)
            return None
        self.pop_oldest()
        freed = seg.size
        with contextlib.suppress(OSError):
            freed += seg.index_path.stat().st_size
            _fs.ops.unlink(seg.index_path)
        return seg, freed

    def locate(self, lsn: int) -> tuple[Segment, int]:
        """The segment holding ``lsn``, and its place in :attr:`segments`."""
        i = bisect.bisect_right(self.bases, lsn) - 1
        if i < 0 or lsn >= self.segments[i].end_lsn:
            raise InvalidInput(f"LSN {lsn} is not in the journal")
        return self.segments[i], i

    def with_base(self, base_lsn: int) -> Segment:
        """The segment whose first LSN is ``base_lsn`` (it must be there)."""
        return self.segments[bisect.bisect_left(self.bases, base_lsn)]

    def read_fd(self, seg: Segment) -> int:
        """A descriptor to read ``seg`` through (cached; owned by the set)."""
        if seg.fd is not None:
            return seg.fd
        fd = self._read_fds.get(seg.base_lsn)
        if fd is None:
            try:
                fd = _fs.ops.open(seg.path, os.O_RDONLY)
            except OSError as exc:
                raise Unavailable(f"journal: cannot open {seg.path} to read: {exc}") from exc
            self._read_fds[seg.base_lsn] = fd
            if len(self._read_fds) > READ_FD_CACHE:
                _, old = self._read_fds.popitem(last=False)
                os.close(old)
        else:
            self._read_fds.move_to_end(seg.base_lsn)
        return fd

    def pread(self, seg: Segment, n: int, pos: int) -> bytes:
        """``n`` bytes of ``seg`` from byte ``pos``."""
        try:
            return os.pread(self.read_fd(seg), n, pos)
        except OSError as exc:
            raise Unavailable(f"journal: cannot read {seg.path}@{pos}: {exc}") from exc

    def close_reads(self) -> None:
        """Close every read descriptor (the journal closes)."""
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

    def bytes_from(self, lsn: int) -> int:
        """Bytes of the entries from ``lsn`` on."""
        total = 0
        for seg in reversed(self.segments):
            if seg.end_lsn <= lsn:
                break
            if seg.base_lsn >= lsn:
                total += seg.size
            else:
                total += seg.size - seg.entry_positions[lsn - seg.base_lsn]
        return total

    def only_checkpoints(self, first_lsn: int, last_lsn: int) -> bool:
        """Whether every entry from ``first_lsn`` to ``last_lsn`` is a checkpoint.

        A checkpoint is only ever the first entry of a segment, so this is a
        count of segment bases in the range (no read).
        """
        if last_lsn < first_lsn:
            return True
        bases = self.bases
        inside = bisect.bisect_right(bases, last_lsn) - bisect.bisect_left(bases, first_lsn)
        return inside == last_lsn - first_lsn + 1
