"""The journal's in-memory records: where an append landed, and per partition and topic.

``Appended`` is what an append returns. ``_Partition`` holds a partition's
next offset and its read index (the active segment's LSNs and offsets in
memory, per sealed segment where its run is in the index file); ``_Topic`` the
per-topic constants of the append hot path. The append, mirror and read paths
(``_journal.py``, ``_mirror_append.py``, ``_reads.py``) share them.
"""

from __future__ import annotations

import struct
import sys
import time
from array import array
from dataclasses import dataclass, field
from typing import NamedTuple

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


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
