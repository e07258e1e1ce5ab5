"""What a journal holds on disk, read-only: a lane's entries in LSN order, for tools.

``edgegw bucket verify`` compares the region's log in the bucket with the
ranges the journal still holds (issue 45, item 5). It runs beside a serving
gateway, so it cannot open the journal (:class:`~edge_gateway.journal.Journal`
takes the data directory's lock and recovers the tail); it reads the segment
files the way ``edgegw journal verify`` does -- no lock, nothing written --
with the same rules:

* the lane's last segment is the *active* one, which may be being written: a
  torn or zero tail there ends what is held, it is not damage;
* a segment deleted (retention, a drop, the rewriter replacing it) after the
  listing is simply no longer held;
* a sealed segment that does not decode is *unreadable* from the bad entry
  on: :attr:`HeldLane.problems` says where, and the entries after it are not
  held (``edgegw journal verify`` names the damage).

A compressed segment (``EGWC``, docs/at-rest.md) is read through its entry
table, so it yields the very entries of the segment it replaced.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from edge_gateway.errors import CorruptData
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.entry import Entry
from edge_gateway.journal._lane import Lane, lane_path
from edge_gateway.journal._segment import SEGMENT_SUFFIX
from edge_gateway.journal._verify import read_whole

__all__ = ["HeldLane", "HeldRange"]

#: A journal segment's header: magic, version, base LSN (docs/format.md).
_WAL_HEADER = struct.Struct("<4sB3xQ")


@dataclass(slots=True)
class HeldRange:
    """The DATA entries a lane holds of an LSN range (:meth:`HeldLane.take`)."""

    #: the first LSN of the range the journal holds (None: none of it)
    held_from: int | None
    #: the last LSN of the range the journal holds (None: none of it)
    held_to: int | None = None
    #: whether LSNs are missing between ``held_from`` and ``held_to``
    holes: bool = False
    #: the DATA entries in the held part, in LSN order
    data: list[Entry] = field(default_factory=list)


def _wal_entries(wal: bytes, where: str) -> Iterator[atrest.AnyEntry]:
    """:func:`~edge_gateway.format.atrest.iter_wal_entries` with the journal's fast path for
    ordinary data entries (:func:`~edge_gateway.format.entry.decode_data_entry`: the same
    checks, a third of the time); anything else as it checks it."""
    if len(wal) < fentry.SEGMENT_HEADER_SIZE:
        raise CorruptData("segment header truncated", where=where)
    magic, version, base_lsn = _WAL_HEADER.unpack_from(wal)
    if magic != fentry.SEGMENT_MAGIC or version not in atrest.WAL_VERSIONS:
        raise CorruptData(f"not a journal segment ({magic!r} version {version})", where=where)
    pos, lsn, end = fentry.SEGMENT_HEADER_SIZE, base_lsn, len(wal)
    fast = fentry.decode_data_entry
    while pos < end and not (wal[pos] == 0 and fentry.is_zero_tail(wal, pos)):
        e: atrest.AnyEntry | None = fast(wal, pos)
        if e is None:
            e = atrest.decode_any_entry(wal, pos, where=f"{where}@{pos}")
            if isinstance(e, atrest.BlockEntry) and version != atrest.WAL_VERSION_BLOCKS:
                raise CorruptData(f"a block entry in a version {version} segment", where=where)
        if e.lsn != lsn:
            raise CorruptData(f"entry LSN {e.lsn} where {lsn} comes next", where=f"{where}@{pos}")
        yield e
        pos += e.length
        lsn += 1


class HeldLane:
    """One lane's journal on disk, walked forward once (LSN ranges asked in growing order).

    Holds one segment's entries at a time. Never raises for bad bytes: a
    sealed segment that does not decode adds a line to :attr:`problems`.
    """

    def __init__(self, main: Path, lane: Lane) -> None:
        self.lane = lane
        self.directory = lane_path(main, lane)
        self._segments: list[tuple[int, Path]] = []
        if self.directory.is_dir():
            for f in sorted(self.directory.glob(f"*{SEGMENT_SUFFIX}")):
                with contextlib.suppress(ValueError):
                    self._segments.append((int(f.stem), f))
        self._next = 0  # index of the next segment to load
        # the loaded segment's entries (block entries too: they hold LSNs, never shipped)
        self._entries: list[atrest.AnyEntry] = []
        self._base: int | None = None  # the loaded segment's base LSN
        #: sealed segments that did not decode: one line each
        self.problems: list[str] = []
        #: bytes of segment files read
        self.bytes_read = 0

    @property
    def first_lsn(self) -> int | None:
        """The lowest LSN the lane's files held when listed (None: no segment)."""
        return self._segments[0][0] if self._segments else None

    def take(self, first: int, last: int) -> HeldRange:
        """The DATA entries of LSNs ``first..last`` that the journal holds.

        Ranges must be asked in growing order (entries before ``first`` are
        dropped as the walk passes them).
        """
        out = HeldRange(None)
        if first > last:
            return out
        while True:
            if self._entries and self._entries[-1].lsn >= first:
                for e in self._entries:
                    if e.lsn < first:
                        continue
                    if e.lsn > last:
                        return out
                    if out.held_from is None:
                        out.held_from = e.lsn
                    elif out.held_to is not None and e.lsn != out.held_to + 1:
                        out.holes = True
                    out.held_to = e.lsn
                    if isinstance(e, Entry) and e.kind == fentry.KIND_DATA:
                        out.data.append(e)
                if self._entries[-1].lsn >= last:
                    return out
                first = self._entries[-1].lsn + 1
            if not self._load_next():
                return out

    def _load_next(self) -> bool:
        """Load the next segment's entries (False: no more segments)."""
        while self._next < len(self._segments):
            base, path = self._segments[self._next]
            self._next += 1
            active = self._next == len(self._segments)
            data = read_whole(path)
            if data is None:
                continue  # deleted since the listing: no longer held
            self.bytes_read += len(data)
            self._base = base
            self._entries = list(self._decode(data, path, active))
            if self._entries:
                return True
        self._entries = []
        return False

    def _decode(self, data: bytes, path: Path, active: bool) -> Iterator[atrest.AnyEntry]:
        where = str(path)
        try:
            entries: Iterator[atrest.AnyEntry]
            if data[:4] == atrest.MAGIC:
                entries = atrest.CompressedSegment(data, where=where).entries()
            else:
                entries = _wal_entries(data, where)
            yield from entries
        except CorruptData as exc:
            if not active:
                self.problems.append(
                    f"{path}: unreadable ({exc}); its later entries are not compared "
                    "(edgegw journal verify names the damage)"
                )
            # active: a torn tail, or a write overtaken; what follows is not held yet
