"""The journal's in-memory records: where an append landed, and per partition and topic.

``Appended`` is what an append returns. ``_Partition`` holds a partition's
next offset and its read index (the active segment's LSNs and offsets in
memory, per sealed segment where its run is in the index file); ``_Topic`` the
per-topic constants of the append hot path; ``MirrorRuns`` the runs of
mirror LSNs that reads may step over. The append, mirror and read paths
(``_journal.py``, ``_mirror_append.py``, ``_reads.py``) share them.
"""

from __future__ import annotations

import bisect
import struct
import sys
import time
from array import array
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import trio


class Appended(NamedTuple):
    """Where an append landed."""

    lsn: int
    base_offset: int
    # shadows tuple.count on purpose: a NamedTuple is the cheapest result object
    count: int  # type: ignore[assignment]

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count


@dataclass(slots=True)
class _Partition:
    topic: str
    partition: int
    next_offset: int = 0
    #: LSNs and base offsets of its data entries in the active segment
    lsns: array[int] = field(default_factory=lambda: array("q"))
    offsets: array[int] = field(default_factory=lambda: array("q"))
    lot: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)
    waiters: int = 0
    # Per sealed segment holding its entries, oldest first (32 bytes each):
    # the segment's base LSN, the first base offset in it, and where its run
    # of (LSNs, base offsets) is in the index file, and how long.
    seg_bases: array[int] = field(default_factory=lambda: array("q"))
    seg_first: array[int] = field(default_factory=lambda: array("q"))
    seg_at: array[int] = field(default_factory=lambda: array("q"))
    seg_count: array[int] = field(default_factory=lambda: array("q"))

    @property
    def first_offset(self) -> int:
        if self.seg_first:
            return self.seg_first[0]
        return self.offsets[0] if self.offsets else self.next_offset

    def memory(self) -> int:
        """Bytes of its index arrays (allocated, so over-allocation included)."""
        return sum(
            sys.getsizeof(a)
            for a in (
                self.lsns,
                self.offsets,
                self.seg_bases,
                self.seg_first,
                self.seg_at,
                self.seg_count,
            )
        )


@dataclass(slots=True)
class _Topic:
    """Per-topic constants of the append hot path, computed once."""

    name: str
    raw: bytes
    #: entry bytes [8, 44 + len(raw) + 16): the entry header after length and
    #: CRC, the topic, then the batch's first 16 bytes with the assigned base
    #: offset (length, version, flags, reserved, base_offset)
    head: struct.Struct
    #: ENTRY_HEADER_SIZE + len(raw): an entry's length minus its batch's
    overhead: int
    partitions: dict[int, _Partition] = field(default_factory=dict)
    #: ``head`` with the producer fields after the topic (a PRODUCER entry), made
    #: at the topic's first idempotent append
    producer_head: struct.Struct | None = None


#: mirror LSN runs kept for the shipper to step over (a hint: beyond it, headers are read)
MAX_MIRROR_RUNS: Final = 65536


class MirrorRuns:
    """LSN runs ``[start, end)`` of mirror entries appended since the open.

    A hint for the shipper's reads, which step over a run unread
    (docs/journal.md, "Mirror entries and the shipper"): noted by the mirror
    append path, read by ``_reads.py``, forgotten as reads pass them. At most
    :data:`MAX_MIRROR_RUNS` are kept; beyond that, entries are stepped over by
    their headers.
    """

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: array[int] = array("q")
        self.ends: array[int] = array("q")

    def note(self, start: int, end: int) -> None:
        """LSNs [start, end) are mirror entries."""
        ends = self.ends
        if ends and ends[-1] == start:
            ends[-1] = end
        elif len(ends) < MAX_MIRROR_RUNS:
            self.starts.append(start)
            ends.append(end)

    def clear(self) -> None:
        del self.starts[:], self.ends[:]

    def any_from(self, lsn: int) -> bool:
        """Whether a run ends after ``lsn``; forgets the runs a read has passed."""
        starts, ends = self.starts, self.ends
        if not starts:
            return False
        k = bisect.bisect_right(ends, lsn)
        if k > 1024:  # runs the shipper has passed: forget them
            del starts[:k], ends[:k]
        return bool(starts)

    def at(self, lsn: int, base_lsn: int, last: int) -> tuple[bool, int]:
        """Where a read at ``lsn`` of the segment starting at ``base_lsn`` (up to
        entry index ``last``) meets the runs: (True, the run's end index) inside
        one; (False, the index to read up to: the next run's start, not into
        it) otherwise."""
        starts, ends = self.starts, self.ends
        k = bisect.bisect_right(starts, lsn) - 1
        if k >= 0 and lsn < ends[k]:
            return True, min(ends[k] - base_lsn, last)
        if k + 1 < len(starts):
            return False, min(last, starts[k + 1] - base_lsn)
        return False, last


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
