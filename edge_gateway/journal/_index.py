"""Index checkpoint files (``<segment>.idx``) for sealed journal segments.

When a segment is sealed its read index is written next to it, so opening a
journal loads arrays with ``array.frombytes`` instead of re-parsing every
entry; only the active segment is scanned. Layout (little-endian)::

    magic "EGWI" | u8 version=1 | 3 bytes zero
    u64 base_lsn | u64 n_entries | u64 segment_size | i64 last_append_time
    positions         n_entries x i64   byte position of entry base_lsn + i
    u32 n_partitions
    per partition:    u16 topic_len | topic | u32 partition | u32 k
                      lsns k x i64 | base_offsets k x i64
    u32 crc32c of everything before it

An index file that is missing, short, or fails its CRC or size check is
ignored and rebuilt by scanning its segment.
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass, field

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData

_MAGIC = b"EGWI"
_VERSION = 1
_HEAD = struct.Struct("<4sB3xQQQq")
_PART = struct.Struct("<HII")
_BIG = sys.byteorder == "big"


def _arr_bytes(a: array[int]) -> bytes:
    if _BIG:  # pragma: no cover
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def _arr_from(data: bytes | memoryview) -> array[int]:
    a = array("q")
    a.frombytes(data)
    if _BIG:  # pragma: no cover
        a.byteswap()
    return a


@dataclass(slots=True)
class SegmentIndex:
    """The read index of one segment: entry positions and per-partition entries."""

    base_lsn: int
    size: int
    last_append_time: int
    positions: array[int] = field(default_factory=lambda: array("q"))
    #: (topic, partition) -> (lsns, base offsets) of its data entries in this segment
    partitions: dict[tuple[str, int], tuple[array[int], array[int]]] = field(default_factory=dict)

    def encode(self) -> bytes:
        parts = [
            _HEAD.pack(
                _MAGIC,
                _VERSION,
                self.base_lsn,
                len(self.positions),
                self.size,
                self.last_append_time,
            ),
            _arr_bytes(self.positions),
            struct.pack("<I", len(self.partitions)),
        ]
        for (topic, partition), (lsns, offsets) in self.partitions.items():
            raw = topic.encode()
            parts += (_PART.pack(len(raw), partition, len(lsns)), raw)
            parts += (_arr_bytes(lsns), _arr_bytes(offsets))
        body = b"".join(parts)
        return body + struct.pack("<I", crc32c(body))

    @classmethod
    def decode(cls, data: bytes, *, where: str) -> SegmentIndex:
        if len(data) < _HEAD.size + 8:
            raise CorruptData("index file truncated", where=where)
        (stored,) = struct.unpack_from("<I", data, len(data) - 4)
        body = memoryview(data)[:-4]
        if crc32c(body) != stored:
            raise CorruptData("index file CRC mismatch", where=where)
        magic, version, base_lsn, n, size, last_time = _HEAD.unpack_from(body)
        if magic != _MAGIC or version != _VERSION:
            raise CorruptData("not an index file of this version", where=where)
        try:
            cur = _HEAD.size
            positions = _arr_from(body[cur : cur + 8 * n])
            cur += 8 * n
            (nparts,) = struct.unpack_from("<I", body, cur)
            cur += 4
            parts: dict[tuple[str, int], tuple[array[int], array[int]]] = {}
            for _ in range(nparts):
                tlen, partition, k = _PART.unpack_from(body, cur)
                cur += _PART.size
                topic = bytes(body[cur : cur + tlen]).decode()
                cur += tlen
                lsns = _arr_from(body[cur : cur + 8 * k])
                cur += 8 * k
                offsets = _arr_from(body[cur : cur + 8 * k])
                cur += 8 * k
                parts[(topic, partition)] = (lsns, offsets)
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            raise CorruptData(f"malformed index file: {exc}", where=where) from None
        if cur != len(body) or len(positions) != n:
            raise CorruptData("index file length mismatch", where=where)
        return cls(base_lsn, size, last_time, positions, parts)
