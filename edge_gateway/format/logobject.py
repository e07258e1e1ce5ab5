"""Log object encoding, versions 1, 2 and 3 (sans-IO).

Each shipper flush writes ONE object, ``regions/<region>/log/<seq:020d>.egw``,
holding slices of many partitions; the object *is* the region's log entry
``seq``. The byte-level specification is in ``docs/log-object.md``; the short
form (little-endian, CRC-32C)::

    header:
    offset size field
    0      4    magic           "EGWL"
    4      1    version         u8 = 1
    5      1    flags           u8 bit0 FENCE (no blocks), bit1 ENCRYPTED, bit2 NULLS
    6      2    reserved        u16 = 0
    8      4    header_length   u32 bytes of the header, its CRC included
    12     8    epoch           u64 writer's epoch
    20     8    seq             u64 log sequence number of this entry
    28     8    first_lsn       u64 journal LSNs shipped: first_lsn..last_lsn inclusive,
    36     8    last_lsn        u64 empty (first_lsn = last_lsn + 1) for a fence
    44     8    created_ms      i64
    52     2    region_len      u16, then the region (UTF-8)
           4    n_blocks        u32, then n_blocks index entries:
                  u16 topic_len | topic | u32 partition
                  i64 first_offset | i64 last_offset | u32 record_count
                  i64 min_ts | i64 max_ts | u64 offset | u32 stored_length
                  u32 raw_length | u8 codec (0 none, 1 zstd) | u32 crc (of the stored bytes)
           4    header_crc      CRC-32C of bytes [0, header_length - 4)
    blocks: back to back from header_length, in index order

Version 2 (written only by a gateway with more than one journal *lane*, see
``docs/journal.md``) is version 1 plus a lane table right after the region::

           1    n_lanes         u8 >= 1, then n_lanes entries of 17 bytes:
                  u8 lane (1..255, ascending) | u64 first_lsn | u64 last_lsn

The fixed ``first_lsn``/``last_lsn`` are then the LSN range of lane 0 (the
``normal`` lane, whose journal is the one a version 1 writer has), the table
the range of every other lane in use (empty at its watermark when the object
ships nothing of it). A version 1 reader refuses version 2 ("unsupported log
object version 2") instead of misreading it.

Version 3 (written only for an entry that carries a *gap marker*: records a
``drop-oldest`` lane deleted before they were shipped) is version 2 plus a gap
table right after the lane table::

           4    n_gaps          u32 >= 1, then n_gaps entries:
                  u8 lane | u16 topic_len | topic | u32 partition
                  i64 first_offset | i64 last_offset | u64 records | u64 bytes

Each names offsets ``first_offset..last_offset`` of one partition that the
source dropped (``records = last - first + 1``; ``bytes``: the journal bytes
that held them). A version 2 reader refuses version 3 ("unsupported log
object version 3"): it never mistakes the offsets after a gap for a loss.

A block's raw content is the partition's record batches (``batch.py``)
concatenated as the journal holds them; the shipper never re-encodes records.

Encrypted objects (``[encryption]``) set flag bit 1 (:data:`FLAG_ENCRYPTED`)
and carry ``u8 key_id_len | key_id`` right before ``n_blocks``; each block's
stored bytes are then ``nonce(12) | AES-256-GCM(compressed payload) |
tag(16)``, sealed under a key derived for the object from
:func:`seal_context`, with :func:`block_aad` as associated data (the keys
and the AEAD: :mod:`edge_gateway.format.crypt`). A reader from before
encryption refuses the flag ("unknown flags 0x02").

An object with a block holding a record batch with null values or null header
values (the batch's NULLS flag, ``batch.py``) sets flag bit 2
(:data:`FLAG_NULLS`); a reader from before nulls refuses the object
("unknown flags 0x04") as a format it does not know, and never reaches the
batch it would take for a corrupt one. Objects without nulls keep flags 0.

The index comes first because the shipper builds the whole object before its
one PUT: a reader GETs the first :data:`FIRST_GET_BYTES` (the index, and all of
a small object), asks :func:`header_length_hint` whether the header is longer,
then GETs only the ranges :func:`plan_ranges` picks for the partitions it needs.

Every decoder here raises :class:`~edge_gateway.errors.CorruptData` and nothing
else on bad input; encoders raise :class:`~edge_gateway.errors.InvalidInput`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import struct
import threading
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

import zstandard as zstd

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData, InvalidInput, InvalidName, UnsupportedFormat
from edge_gateway.format import batch as _batch
from edge_gateway.format.batch import RecordBatch
from edge_gateway.names import validate_region, validate_topic

MAGIC: Final = b"EGWL"
#: The version written when only lane 0 is in use (byte-identical to older writers).
VERSION: Final = 1
#: The version with a lane table (:class:`LaneRange`), written with several lanes.
VERSION_LANES: Final = 2
#: The version with a gap table (:class:`GapRange`), written only by an entry that has one.
VERSION_GAPS: Final = 3
#: Versions this reader decodes.
VERSIONS: Final = (VERSION, VERSION_LANES, VERSION_GAPS)
#: Lane whose LSN range is in the fixed header fields (the ``normal`` lane).
LANE_MAIN: Final = 0
#: Highest lane id of a lane table.
MAX_LANE: Final = 255
FLAG_FENCE: Final = 0x01
#: The blocks are sealed with AES-256-GCM; a key id follows the region (and lane table).
FLAG_ENCRYPTED: Final = 0x02
#: A block holds a batch with the NULLS flag (null values or null header values).
FLAG_NULLS: Final = 0x04
_KNOWN_FLAGS: Final = FLAG_FENCE | FLAG_ENCRYPTED | FLAG_NULLS
#: Bytes an encrypted block adds to its payload: a 96-bit nonce and a 128-bit tag.
SEAL_OVERHEAD: Final = 12 + 16
#: Longest key id (bytes of ``[A-Za-z0-9._-]``).
MAX_KEY_ID_BYTES: Final = 64
CODEC_NONE: Final = 0
CODEC_ZSTD: Final = 1
_CODECS: Final = (CODEC_NONE, CODEC_ZSTD)

_PREFIX = struct.Struct("<4sBBHI")
#: Bytes :func:`header_length_hint` needs to learn the header's length.
PREFIX_BYTES: Final = _PREFIX.size  # 12
_FIXED = struct.Struct("<4sBBHIQQQQqH")  # everything up to and including region_len
_FIXED_SIZE: Final = _FIXED.size  # 54
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_BLOCK = struct.Struct("<IqqIqqQIIBI")  # an index entry after its topic
_BLOCK_FIXED: Final = 2 + _BLOCK.size  # 63: topic_len + the fields above
_U8 = struct.Struct("<B")
_LANE = struct.Struct("<BQQ")  # a lane table entry
_LANE_SIZE: Final = _LANE.size  # 17
_GAP = struct.Struct("<IqqQQ")  # a gap table entry after its lane and topic
_GAP_FIXED: Final = 1 + 2 + _GAP.size  # 39: lane, topic_len and the fields above
#: Smallest index entry: a one-character topic.
MIN_INDEX_ENTRY_BYTES: Final = _BLOCK_FIXED + 1  # 64
#: Smallest header: a one-character region, no blocks.
MIN_HEADER_BYTES: Final = _FIXED_SIZE + 1 + 4 + 4  # 63
#: Largest header a reader accepts (about 260,000 index entries).
MAX_HEADER_BYTES: Final = 16 * 1024 * 1024
#: Largest raw (decompressed) block: a block holds whole batches and is split
#: before it outgrows the builder's limit, so one batch is the worst case.
MAX_BLOCK_RAW_BYTES: Final = _batch.MAX_BATCH_BYTES
#: The builder starts a new block for a partition past this many raw bytes.
DEFAULT_MAX_BLOCK_BYTES: Final = 64 * 1024 * 1024
DEFAULT_LEVEL: Final = 3
#: Size of a reader's first ranged GET: holds the index of all but huge objects.
FIRST_GET_BYTES: Final = 64 * 1024
#: Neighbouring wanted blocks closer than this are fetched with one GET.
DEFAULT_COALESCE_GAP: Final = 64 * 1024
#: A plan that would fetch more than this fraction of an object fetches it whole.
DEFAULT_WHOLE_OBJECT_FRACTION: Final = 0.5

_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
_MIN_LEVEL: Final = -(1 << 17)
# Each record costs at least 12 bytes of columns (i64 timestamp, i32 value
# length), each batch 40 bytes of header: a bound of the records in a block.
_MIN_RECORD_BYTES: Final = 12

_U32_MAX: Final = 2**32 - 1
_U64_MAX: Final = 2**64 - 1
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class BlockIndex:
    """One index entry: where a partition's slice lies in the object and what it holds."""

    topic: str
    partition: int
    #: Offsets of the first and last record, inclusive.
    first_offset: int
    last_offset: int
    record_count: int
    min_ts: int
    max_ts: int
    #: Byte position of the stored block from the start of the object.
    offset: int
    stored_length: int
    raw_length: int
    codec: int
    #: CRC-32C of the stored (compressed) bytes.
    crc: int

    @property
    def end(self) -> int:
        """The byte position just past the stored block."""
        return self.offset + self.stored_length

    @property
    def next_offset(self) -> int:
        """The offset that follows this block in its partition."""
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class LaneRange:
    """A version 2 lane table entry: the LSNs of journal lane ``lane`` the entry ships.

    Inclusive; empty when ``first_lsn == last_lsn + 1`` (then ``last_lsn`` is
    the highest LSN of the lane shipped so far, 0 if none).
    """

    lane: int
    first_lsn: int
    last_lsn: int

    @property
    def is_empty(self) -> bool:
        return self.first_lsn > self.last_lsn


@dataclass(frozen=True, slots=True)
class GapRange:
    """A version 3 gap table entry: offsets ``first_offset..last_offset`` (inclusive) of
    one partition, dropped by lane ``lane`` of the source before they were shipped.

    They are in no log object: a reader's next offset of the partition jumps
    past them.
    """

    lane: int
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    records: int
    #: journal bytes that held them (informational)
    bytes: int


@dataclass(frozen=True, slots=True)
class LogObjectHeader:
    """The decoded header of a log object: the entry's coordinates and its index."""

    version: int
    flags: int
    header_length: int
    epoch: int
    seq: int
    #: Journal LSNs shipped in this entry, inclusive; empty when
    #: ``first_lsn == last_lsn + 1`` (then ``last_lsn`` is the highest LSN
    #: shipped so far).
    first_lsn: int
    last_lsn: int
    created_ms: int
    region: str
    blocks: tuple[BlockIndex, ...]
    #: Version 2: the LSN ranges of the lanes other than lane 0, by lane id
    #: (``first_lsn``/``last_lsn`` above are lane 0's). Empty in version 1.
    lanes: tuple[LaneRange, ...] = ()
    #: With :data:`FLAG_ENCRYPTED`: the id of the key the blocks are sealed with.
    key_id: str | None = None
    #: Version 3: offsets the source dropped unshipped (a drop-oldest lane).
    gaps: tuple[GapRange, ...] = ()

    @property
    def is_fence(self) -> bool:
        return bool(self.flags & FLAG_FENCE)

    @property
    def is_encrypted(self) -> bool:
        return bool(self.flags & FLAG_ENCRYPTED)

    @property
    def has_nulls(self) -> bool:
        return bool(self.flags & FLAG_NULLS)

    @property
    def total_length(self) -> int:
        """Size of the whole object: the end of the last block, or the header alone."""
        return self.blocks[-1].end if self.blocks else self.header_length


class HasBlocks(Protocol):
    """What :func:`plan_ranges` needs: a header, or a manifest entry."""

    @property
    def blocks(self) -> tuple[BlockIndex, ...]: ...

    @property
    def total_length(self) -> int: ...


# --------------------------------------------------------------------------
# validation shared by the decoder, the encoder and the manifest


def header_size(
    region: str,
    topics: Iterable[str],
    lanes: int = 0,
    key_id: str | None = None,
    gap_topics: Iterable[str] = (),
) -> int:
    """Bytes of the header for ``region``, one index entry per topic in ``topics``,
    (version 2) a lane table of ``lanes`` entries, (version 3) a gap table of
    one entry per topic in ``gap_topics`` and (encrypted) ``key_id``."""
    size = _FIXED_SIZE + len(region.encode("utf-8")) + 4 + 4
    gap_topics = list(gap_topics)
    if lanes or gap_topics:  # version 3 has the lane table's count, even of none
        size += 1 + lanes * _LANE_SIZE
    if gap_topics:
        size += 4 + sum(_GAP_FIXED + len(t.encode("utf-8")) for t in gap_topics)
    if key_id is not None:
        size += 1 + len(key_id.encode("utf-8"))
    for topic in topics:
        size += _BLOCK_FIXED + len(topic.encode("utf-8"))
    return size


def _int_in(value: int, lo: int, hi: int) -> bool:
    return type(value) is int and lo <= value <= hi


_KEY_ID_RE: Final = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_KEY_ID_BYTES}}}")


def valid_key_id(key_id: object) -> bool:
    """Whether ``key_id`` may name an encryption key: 1-64 characters of ``[A-Za-z0-9._-]``."""
    return type(key_id) is str and _KEY_ID_RE.fullmatch(key_id) is not None


def _block_what(b: BlockIndex) -> str:
    """How an error names a block (built only for an error: a manifest checks thousands)."""
    return f"block {b.topic!r}/{b.partition} at {b.offset}"


def _check_block(b: BlockIndex, where: str, overhead: int = 0) -> None:
    if not (
        _int_in(b.partition, 0, _U32_MAX)
        and _int_in(b.first_offset, _I64_MIN, _I64_MAX)
        and _int_in(b.last_offset, _I64_MIN, _I64_MAX)
        and _int_in(b.record_count, 0, _U32_MAX)
        and _int_in(b.min_ts, _I64_MIN, _I64_MAX)
        and _int_in(b.max_ts, _I64_MIN, _I64_MAX)
        and _int_in(b.offset, 0, _U64_MAX)
        and _int_in(b.stored_length, 0, _U32_MAX)
        and _int_in(b.raw_length, 0, _U32_MAX)
        and _int_in(b.codec, 0, 0xFF)
        and _int_in(b.crc, 0, _U32_MAX)
    ):
        raise CorruptData(f"{_block_what(b)}: a field is out of range", where=where)
    if b.first_offset > b.last_offset:
        raise CorruptData(
            f"{_block_what(b)}: first_offset {b.first_offset} > last_offset", where=where
        )
    if b.record_count != b.last_offset - b.first_offset + 1:
        raise CorruptData(
            f"{_block_what(b)}: record_count {b.record_count} for offsets "
            f"{b.first_offset}..{b.last_offset}",
            where=where,
        )
    if b.min_ts > b.max_ts:
        raise CorruptData(f"{_block_what(b)}: min_ts > max_ts", where=where)
    if b.codec not in _CODECS:
        raise CorruptData(f"{_block_what(b)}: unknown codec {b.codec}", where=where)
    if not _batch.HEADER_SIZE <= b.raw_length <= MAX_BLOCK_RAW_BYTES:
        raise CorruptData(f"{_block_what(b)}: raw_length {b.raw_length} out of bounds", where=where)
    if _batch.HEADER_SIZE + b.record_count * _MIN_RECORD_BYTES > b.raw_length:
        raise CorruptData(
            f"{_block_what(b)}: {b.record_count} records cannot fit in {b.raw_length} bytes",
            where=where,
        )
    if b.codec == CODEC_NONE and b.stored_length != b.raw_length + overhead:
        raise CorruptData(
            f"{_block_what(b)}: uncompressed but stored_length != raw_length"
            + (f" + {overhead}" if overhead else ""),
            where=where,
        )
    if not overhead < b.stored_length <= b.raw_length + overhead:
        raise CorruptData(
            f"{_block_what(b)}: stored_length {b.stored_length} for raw_length {b.raw_length}",
            where=where,
        )


def validate_block(b: BlockIndex, *, where: str) -> None:
    """Check one index entry of an unencrypted block on its own (ranges, counts,
    timestamps, codec, sizes): the rules :func:`decode_header` applies to each."""
    _check_block(b, where)


def validate_header(header: LogObjectHeader, *, where: str) -> None:
    """Check every rule of the format that does not need the bytes.

    :func:`decode_header` runs it on what it parsed, :func:`encode_header` on
    what it is asked to write and ``Manifest.decode`` on each entry, so the
    three agree on what a valid log entry is. Raises :class:`CorruptData`.
    """
    h = header
    if h.version not in VERSIONS:
        raise UnsupportedFormat(
            f"unsupported log object version {h.version} (this reader knows {_KNOWN})",
            where=where,
        )
    if not _int_in(h.flags, 0, 0xFF):
        raise CorruptData(f"flags {h.flags!r} out of range", where=where)
    if h.flags & ~_KNOWN_FLAGS:
        raise UnsupportedFormat(f"unknown flags 0x{h.flags:02x}", where=where)
    if not (
        _int_in(h.epoch, 0, _U64_MAX)
        and _int_in(h.seq, 0, _U64_MAX)
        and _int_in(h.first_lsn, 0, _U64_MAX)
        and _int_in(h.last_lsn, 0, _U64_MAX)
        and _int_in(h.created_ms, _I64_MIN, _I64_MAX)
    ):
        raise CorruptData("a header field is out of range", where=where)
    try:
        validate_region(h.region)
    except InvalidName as exc:
        raise CorruptData(str(exc), where=where) from None
    if h.first_lsn < 1:
        raise CorruptData("first_lsn is 0; journal LSNs start at 1", where=where)
    if h.first_lsn > h.last_lsn + 1:
        raise CorruptData(f"LSN range {h.first_lsn}..{h.last_lsn} is negative", where=where)
    _check_lanes(h, where)
    _check_gaps(h, where)
    if h.is_encrypted:
        if not valid_key_id(h.key_id):
            raise CorruptData(f"encrypted entry with a bad key id {h.key_id!r}", where=where)
        if not h.blocks:
            raise CorruptData("an encrypted entry has blocks (a fence never is)", where=where)
    elif h.key_id is not None:
        raise CorruptData("a key id without the ENCRYPTED flag", where=where)
    if h.has_nulls and not h.blocks:
        raise CorruptData("an entry with the NULLS flag has blocks", where=where)
    overhead = SEAL_OVERHEAD if h.is_encrypted else 0
    empty = h.first_lsn > h.last_lsn and all(r.is_empty for r in h.lanes)
    if h.blocks and empty:
        raise CorruptData("an entry with blocks has an empty LSN range", where=where)
    if h.is_fence and (h.blocks or h.first_lsn != h.last_lsn + 1 or not empty):
        raise CorruptData(
            "a fence entry must have no blocks and an empty LSN range in every lane", where=where
        )
    checked: set[str] = set()
    for b in h.blocks:
        if b.topic not in checked:
            try:
                validate_topic(b.topic)
            except InvalidName as exc:
                raise CorruptData(str(exc), where=where) from None
            checked.add(b.topic)
    expected = header_size(
        h.region,
        (b.topic for b in h.blocks),
        len(h.lanes),
        h.key_id,
        (g.topic for g in h.gaps),
    )
    if h.header_length != expected or expected > MAX_HEADER_BYTES:
        raise CorruptData(
            f"header_length {h.header_length} for a header of {expected} bytes", where=where
        )
    pos = h.header_length
    prev: BlockIndex | None = None
    for b in h.blocks:
        _check_block(b, where, overhead)
        if b.offset != pos:
            raise CorruptData(
                f"block {b.topic!r}/{b.partition} at {b.offset}, expected at {pos} "
                "(blocks follow the header back to back)",
                where=where,
            )
        pos = b.end
        if prev is not None:
            if (prev.topic, prev.partition) > (b.topic, b.partition):
                raise CorruptData("blocks are not sorted by (topic, partition)", where=where)
            if (prev.topic, prev.partition) == (b.topic, b.partition) and (
                b.first_offset != prev.last_offset + 1
            ):
                raise CorruptData(
                    f"blocks of {b.topic!r}/{b.partition} are not contiguous "
                    f"({prev.last_offset} then {b.first_offset})",
                    where=where,
                )
        prev = b


def _check_lanes(h: LogObjectHeader, where: str) -> None:
    if type(h.lanes) is not tuple or not all(type(r) is LaneRange for r in h.lanes):
        raise CorruptData("lanes must be a tuple of LaneRange", where=where)
    if h.version == VERSION:
        if h.lanes:
            raise CorruptData("a version 1 entry has no lane table", where=where)
        return
    if not h.lanes and h.version != VERSION_GAPS:
        # (version 3 with no lane table: a one-lane gateway's gap markers of entries
        # lost to damage, lane 0's, docs/log-object.md)
        raise CorruptData(
            f"a version {h.version} entry has a lane table of at least one lane", where=where
        )
    prev = LANE_MAIN
    for r in h.lanes:
        if not (
            _int_in(r.lane, 1, MAX_LANE)
            and _int_in(r.first_lsn, 1, _U64_MAX)
            and _int_in(r.last_lsn, 0, _U64_MAX)
        ):
            raise CorruptData(f"lane table entry {r.lane!r}: a field is out of range", where=where)
        if r.lane <= prev:
            raise CorruptData(
                f"lane table not in ascending lane order ({prev} then {r.lane})", where=where
            )
        if r.first_lsn > r.last_lsn + 1:
            raise CorruptData(
                f"lane {r.lane}: LSN range {r.first_lsn}..{r.last_lsn} is negative", where=where
            )
        prev = r.lane


def _check_gaps(h: LogObjectHeader, where: str) -> None:
    if type(h.gaps) is not tuple or not all(type(g) is GapRange for g in h.gaps):
        raise CorruptData("gaps must be a tuple of GapRange", where=where)
    if h.version != VERSION_GAPS:
        if h.gaps:
            raise CorruptData(f"a version {h.version} entry has no gap table", where=where)
        return
    if not h.gaps:
        raise CorruptData("a version 3 entry has a gap table of at least one gap", where=where)
    if h.is_fence:
        raise CorruptData("a fence entry has no gap table", where=where)
    shipping = {r.lane for r in h.lanes if not r.is_empty}
    if h.first_lsn <= h.last_lsn:
        shipping.add(LANE_MAIN)  # lane 0's range is the fixed one
    prev: GapRange | None = None
    for g in h.gaps:
        what = f"gap {g.topic!r}/{g.partition}"
        if not (
            _int_in(g.lane, LANE_MAIN, MAX_LANE)
            and _int_in(g.partition, 0, _U32_MAX)
            and _int_in(g.first_offset, 0, _I64_MAX)
            and _int_in(g.last_offset, 0, _I64_MAX)
            and _int_in(g.records, 1, _U64_MAX)
            and _int_in(g.bytes, 0, _U64_MAX)
        ):
            raise CorruptData(f"{what}: a field is out of range", where=where)
        try:
            validate_topic(g.topic)
        except InvalidName as exc:
            raise CorruptData(str(exc), where=where) from None
        if g.first_offset > g.last_offset or g.records != g.last_offset - g.first_offset + 1:
            raise CorruptData(
                f"{what}: {g.records} records for offsets {g.first_offset}..{g.last_offset}",
                where=where,
            )
        if g.lane not in shipping:
            raise CorruptData(
                f"{what}: lane {g.lane} ships no LSNs in this entry (a gap belongs to "
                "the LSN range of its lane)",
                where=where,
            )
        if prev is not None:
            key, pkey = (g.topic, g.partition), (prev.topic, prev.partition)
            if pkey > key or (pkey == key and prev.last_offset >= g.first_offset):
                raise CorruptData(
                    "gaps are not sorted by (topic, partition, offset) or overlap", where=where
                )
        prev = g
    for b in h.blocks:
        for g in h.gaps:
            if (g.topic, g.partition) == (b.topic, b.partition) and not (
                g.last_offset < b.first_offset or b.last_offset < g.first_offset
            ):
                raise CorruptData(
                    f"gap {g.topic!r}/{g.partition} {g.first_offset}..{g.last_offset} "
                    f"overlaps a block ({b.first_offset}..{b.last_offset})",
                    where=where,
                )


_KNOWN: Final = ", ".join(map(str, VERSIONS))


def lanes_version(lanes: Sequence[LaneRange], gaps: Sequence[GapRange] = ()) -> int:
    """The version an entry with lane table ``lanes`` and gap table ``gaps`` is written in."""
    if gaps:
        return VERSION_GAPS
    return VERSION_LANES if lanes else VERSION


# --------------------------------------------------------------------------
# sealing (AES-256-GCM, the AEAD itself is in edge_gateway.format.crypt)

_SEAL_TAG: Final = b"EGWL-SEAL\x01"
_SEAL_FIXED = struct.Struct("<QQQQI")  # epoch, seq, first_lsn, last_lsn, n_blocks
_SEAL_BLOCK = struct.Struct("<IqqIqqQIIB")  # an index entry after its topic, without crc


def seal_context(
    region: str, key_id: str, epoch: int, seq: int, first_lsn: int, last_lsn: int, n_blocks: int
) -> bytes:
    """What binds every block of one encrypted object to that object.

    ``"EGWL-SEAL" 01 | u16 len region | u8 len key_id | epoch | seq | first_lsn
    | last_lsn | u32 n_blocks`` (``docs/log-object.md``, "Encryption"). The
    per-object key is derived from it and it starts every block's associated
    data, so a block is bound to its region, seq, epoch, key and object.
    """
    r = region.encode("utf-8")
    k = key_id.encode("ascii")
    return b"".join(
        (
            _SEAL_TAG,
            _U16.pack(len(r)),
            r,
            _U8.pack(len(k)),
            k,
            _SEAL_FIXED.pack(epoch, seq, first_lsn, last_lsn, n_blocks),
        )
    )


def block_aad(context: bytes, b: BlockIndex) -> bytes:
    """A block's associated data: the object's context and its index entry but the CRC.

    The entry holds the block's position (``offset``) as well as what it
    claims to hold (topic, partition, offsets, counts, timestamps, sizes,
    codec); the CRC is left out because it is computed over the sealed bytes.
    """
    t = b.topic.encode("utf-8")
    return b"".join(
        (
            context,
            _U16.pack(len(t)),
            t,
            _SEAL_BLOCK.pack(
                b.partition,
                b.first_offset,
                b.last_offset,
                b.record_count,
                b.min_ts,
                b.max_ts,
                b.offset,
                b.stored_length,
                b.raw_length,
                b.codec,
            ),
        )
    )


@dataclass(frozen=True, slots=True)
class SealRef:
    """What a reader needs besides the region and seq to open an encrypted object's blocks."""

    key_id: str
    epoch: int
    first_lsn: int
    last_lsn: int
    #: Blocks of the whole object (not only the ones read).
    n_blocks: int

    @classmethod
    def of(cls, key_id: str | None, entry: _HasLsns, n_blocks: int) -> SealRef | None:
        """The reference of a header or manifest entry (None when it is not encrypted)."""
        if key_id is None:
            return None
        return cls(key_id, entry.epoch, entry.first_lsn, entry.last_lsn, n_blocks)


class _HasLsns(Protocol):
    @property
    def epoch(self) -> int: ...

    @property
    def first_lsn(self) -> int: ...

    @property
    def last_lsn(self) -> int: ...


class BlockSealer(Protocol):
    """Seals the blocks of one object (see :class:`edge_gateway.format.crypt.WriteKey`)."""

    def seal(self, aad: bytes, payload: bytes) -> bytes:
        """``nonce | ciphertext | tag`` of ``payload`` (exactly :data:`SEAL_OVERHEAD` longer)."""
        ...


class WriteKeyLike(Protocol):
    """A region's write key: its id and a sealer per object."""

    @property
    def key_id(self) -> str: ...

    def sealer(self, context: bytes) -> BlockSealer: ...


class BlockOpener(Protocol):
    """Opens the blocks of one object (see :class:`edge_gateway.format.crypt.Keyring`)."""

    @property
    def key_id(self) -> str: ...

    @property
    def context(self) -> bytes: ...

    def open(self, aad: bytes, stored: Buffer) -> bytes | None:
        """The payload of ``nonce | ciphertext | tag``, or None when it fails authentication."""
        ...


# --------------------------------------------------------------------------
# encoding


def encode_header(header: LogObjectHeader) -> bytes:
    """The header bytes of ``header`` (which must be valid, else :class:`InvalidInput`)."""
    try:
        validate_header(header, where="log object header")
    except CorruptData as exc:
        raise InvalidInput(exc.reason) from None
    h = header
    region = h.region.encode("utf-8")
    parts = [
        _FIXED.pack(
            MAGIC,
            h.version,
            h.flags,
            0,
            h.header_length,
            h.epoch,
            h.seq,
            h.first_lsn,
            h.last_lsn,
            h.created_ms,
            len(region),
        ),
        region,
    ]
    if h.lanes or h.gaps:
        parts.append(_U8.pack(len(h.lanes)))
        parts += (_LANE.pack(r.lane, r.first_lsn, r.last_lsn) for r in h.lanes)
    if h.gaps:
        parts.append(_U32.pack(len(h.gaps)))
        for g in h.gaps:
            topic = g.topic.encode("utf-8")
            parts += (
                _U8.pack(g.lane),
                _U16.pack(len(topic)),
                topic,
                _GAP.pack(g.partition, g.first_offset, g.last_offset, g.records, g.bytes),
            )
    if h.key_id is not None:
        key_id = h.key_id.encode("ascii")
        parts += (_U8.pack(len(key_id)), key_id)
    parts.append(_U32.pack(len(h.blocks)))
    for b in h.blocks:
        topic = b.topic.encode("utf-8")
        parts += (
            _U16.pack(len(topic)),
            topic,
            _BLOCK.pack(
                b.partition,
                b.first_offset,
                b.last_offset,
                b.record_count,
                b.min_ts,
                b.max_ts,
                b.offset,
                b.stored_length,
                b.raw_length,
                b.codec,
                b.crc,
            ),
        )
    body = b"".join(parts)
    return body + _U32.pack(crc32c(body))


def encode_fence(
    region: str,
    epoch: int,
    seq: int,
    last_lsn: int,
    created_ms: int,
    lane_watermarks: Mapping[int, int] | None = None,
) -> bytes:
    """A fence entry: claims the log for ``epoch`` and ships nothing.

    ``last_lsn`` is the highest LSN of lane 0 shipped so far (0 if none); the
    entry's LSN range is the empty ``last_lsn + 1 .. last_lsn``.
    ``lane_watermarks`` (lane id -> highest LSN shipped) makes it a version 2
    fence that carries every other lane's watermark the same way.
    """
    lanes = tuple(LaneRange(lane, w + 1, w) for lane, w in sorted((lane_watermarks or {}).items()))
    return _encode_empty(region, epoch, seq, last_lsn + 1, last_lsn, created_ms, FLAG_FENCE, lanes)


def _encode_empty(
    region: str,
    epoch: int,
    seq: int,
    first_lsn: int,
    last_lsn: int,
    created_ms: int,
    flags: int,
    lanes: tuple[LaneRange, ...] = (),
    gaps: tuple[GapRange, ...] = (),
) -> bytes:
    validate_region(region)  # InvalidName is an InvalidInput
    header = LogObjectHeader(
        lanes_version(lanes, gaps),
        flags,
        header_size(region, (), len(lanes), gap_topics=(g.topic for g in gaps)),
        epoch,
        seq,
        first_lsn,
        last_lsn,
        created_ms,
        region,
        (),
        lanes,
        gaps=gaps,
    )
    return encode_header(header)


_T = TypeVar("_T")


class _Pool(Generic[_T]):
    """Objects one thread may use at a time (zstd contexts, buffers), lent out and kept.

    The shipper builds and the mirrors decode in worker threads, which trio
    ends after seconds idle and starts anew for the next burst: a context
    per thread was made again for each new thread (a level-3 compressor's
    workspace is 2.6 MB once it has compressed a MiB block), and held by
    as many threads as a burst started for as long as they lived. A pool
    keeps at most ``keep`` idle ones whatever the threads do; a thread
    borrows one for one call.
    """

    def __init__(self, make: Callable[[], _T], keep: int = 4) -> None:
        self._make = make
        self._keep = keep
        self._idle: list[_T] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def lend(self) -> Iterator[_T]:
        item = self.take()
        try:
            yield item
        finally:
            self.give(item)

    def take(self) -> _T:
        """An idle object, or a new one: the caller owns it until :meth:`give`."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._make()

    def give(self, item: _T) -> None:
        """Return an object :meth:`take` gave (kept if fewer than ``keep`` are idle)."""
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(item)


_COMPRESSORS: dict[tuple[int, int], _Pool[zstd.ZstdCompressor]] = {}
_COMPRESSORS_LOCK: Final = threading.Lock()
_DECOMPRESSORS: Final = _Pool(zstd.ZstdDecompressor)
#: Buffers that join a block's batches (:func:`_block_input`).
_JOINED: Final = _Pool(io.BytesIO)


def _compressor(level: int, threads: int) -> contextlib.AbstractContextManager[zstd.ZstdCompressor]:
    """A compressor of this level and thread count, lent for the ``with``."""
    with _COMPRESSORS_LOCK:
        pool = _COMPRESSORS.get((level, threads))
        if pool is None:
            pool = _COMPRESSORS[(level, threads)] = _Pool(
                lambda: zstd.ZstdCompressor(level=level, threads=threads)
            )
    return pool.lend()


def lend_compressor(
    level: int = DEFAULT_LEVEL, threads: int = 0
) -> contextlib.AbstractContextManager[zstd.ZstdCompressor]:
    """A pooled zstd compressor for :func:`compress_block`, lent for the ``with``.

    The same pool :meth:`LogObjectBuilder.build` borrows from, so the journal's
    at-rest encoder (``format/atrest.py``) and the builder share contexts.
    """
    if not _int_in(level, _MIN_LEVEL, zstd.MAX_COMPRESSION_LEVEL):
        raise InvalidInput(f"zstd level must be within {_MIN_LEVEL}..22, got {level!r}")
    if not _int_in(threads, -1, 256):
        raise InvalidInput(f"threads must be within -1..256, got {threads!r}")
    return _compressor(level, threads)


def compress_block(cctx: zstd.ZstdCompressor, raw: Buffer) -> tuple[bytes, int]:
    """A block's stored payload and codec: one zstd frame, or ``raw`` itself when
    zstd does not make it smaller (the one rule of the format, "Codecs").

    Every writer of blocks calls this: the log-object builder and the at-rest
    segment encoder, so a block compressed at rest is byte for byte the block
    the builder would ship for the same batches at the same level.
    """
    packed = cctx.compress(raw)
    if len(packed) >= len(raw):
        return bytes(raw), CODEC_NONE
    return packed, CODEC_ZSTD


@contextlib.contextmanager
def _block_input(batches: list[bytes | memoryview]) -> Iterator[bytes | memoryview]:
    """A block's batches as one buffer, valid inside the ``with``.

    Several batches are copied into a reused buffer (:data:`_JOINED`)
    rather than joined into fresh memory: a fresh buffer of a MiB costs the
    kernel 256 page faults (``edgegw serve`` maps every buffer above 256
    KiB afresh, ``heap.tune``), about as much CPU as copying it. A pooled
    buffer grows to the largest block built in it.
    """
    if len(batches) == 1:
        yield batches[0]
        return
    with _JOINED.lend() as joined:
        joined.seek(0)
        joined.writelines(batches)
        size = joined.tell()
        with joined.getbuffer() as whole, whole[:size] as raw:
            yield raw


@dataclass(slots=True)
class _Slice:
    """Batches of one partition collected for one block."""

    batches: list[bytes | memoryview]
    first_offset: int
    next_offset: int
    min_ts: int
    max_ts: int
    raw_length: int
    #: A block already compressed (:meth:`LogObjectBuilder.add_stored`): no batches.
    stored: StoredBlock | None = None


@dataclass(frozen=True, slots=True)
class StoredBlock:
    """A compressed block as a journal keeps it at rest (``format/atrest.py``):
    what an index entry says of it besides its place, and its payload (the
    stored bytes of an unencrypted block: one zstd frame, or the raw batches)."""

    first_offset: int
    last_offset: int
    min_ts: int
    max_ts: int
    raw_length: int
    codec: int
    payload: bytes
    #: record batches in it (for the builder's counts)
    batches: int
    #: a batch in it has the batch flag NULLS (the object then sets FLAG_NULLS)
    nulls: bool = False

    @property
    def record_count(self) -> int:
        return self.last_offset - self.first_offset + 1


class LogObjectBuilder:
    """Collects record batches per partition and builds one log object.

    Batches of a partition must come in offset order with no gap (checked with
    each batch's header); a failed :meth:`add_batch` or :meth:`add` leaves the
    builder unchanged. A partition's slice is one block, split into several
    consecutive blocks only past ``max_block_bytes`` of raw batches.
    """

    def __init__(self, *, max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> None:
        if not _int_in(max_block_bytes, _batch.HEADER_SIZE, MAX_BLOCK_RAW_BYTES):
            raise InvalidInput(
                f"max_block_bytes must be within {_batch.HEADER_SIZE}..{MAX_BLOCK_RAW_BYTES}"
            )
        self._max_block_bytes = max_block_bytes
        self._slices: dict[tuple[str, int], list[_Slice]] = {}
        self._raw_bytes = 0
        self._batch_count = 0
        self._record_count = 0
        self._nulls = False

    @property
    def raw_bytes(self) -> int:
        """Bytes of batches added so far (before compression)."""
        return self._raw_bytes

    @property
    def batch_count(self) -> int:
        return self._batch_count

    @property
    def record_count(self) -> int:
        return self._record_count

    def next_offset(self, topic: str, partition: int) -> int | None:
        """The offset the next batch of the partition must start at (None: none added)."""
        slices = self._slices.get((topic, partition))
        return slices[-1].next_offset if slices else None

    def add_batch(self, topic: str, partition: int, batch: Buffer) -> None:
        """Add one record batch (exactly one, as the journal stores it)."""
        self.add(topic, partition, (batch,))

    def add(self, topic: str, partition: int, batches: Iterable[Buffer]) -> None:
        """Add a partition's batches, in offset order, all or none.

        ``bytes`` and read-only ``memoryview`` batches are kept as given until
        :meth:`build` (a read-only view is the caller's promise that its bytes
        do not change before then); anything else is copied.
        """
        validate_topic(topic)
        if not _int_in(partition, 0, _U32_MAX):
            raise InvalidInput(f"partition must be an int in 0..{_U32_MAX}, got {partition!r}")
        slices = self._slices.get((topic, partition), [])
        expected = slices[-1].next_offset if slices else None
        checked: list[tuple[bytes | memoryview, _batch.BatchHeader]] = []
        where = f"{topic}/{partition}"
        read_header = _batch.read_header
        for raw in batches:
            if type(raw) is bytes:
                data: bytes | memoryview = raw
            elif (
                type(raw) is memoryview and raw.readonly and raw.c_contiguous and raw.itemsize == 1
            ):
                # A read-only view (the journal's reads hand payloads over so,
                # into buffers reused only once no view of them lives): kept,
                # and copied once, into its block, by build().
                data = raw
            elif isinstance(raw, bytes | bytearray | memoryview):
                data = bytes(raw)
            else:
                raise InvalidInput(f"a batch must be bytes, got {type(raw).__name__}")
            try:
                h = read_header(data, 0, where=where)
            except CorruptData as exc:
                raise InvalidInput(f"not a record batch: {exc}") from None
            if h.length != len(data):
                raise InvalidInput(
                    f"{topic}/{partition}: a batch of {h.length} bytes in {len(data)} bytes"
                )
            if expected is not None and h.base_offset != expected:
                raise InvalidInput(
                    f"{topic}/{partition}: batch at offset {h.base_offset}, expected {expected} "
                    "(offsets of a partition must be contiguous)"
                )
            expected = h.next_offset
            checked.append((data, h))
        if not checked:
            return
        # Everything is checked: from here on nothing can fail, so the builder
        # never holds half of a call's batches.
        for data, h in checked:
            cur = slices[-1] if slices else None
            if (
                cur is None
                or cur.stored is not None
                or cur.raw_length + h.length > self._max_block_bytes
            ):
                slices.append(
                    _Slice(
                        [data],
                        h.base_offset,
                        h.next_offset,
                        h.min_timestamp,
                        h.max_timestamp,
                        h.length,
                    )
                )
                continue
            cur.batches.append(data)
            cur.next_offset = h.next_offset
            cur.min_ts = min(cur.min_ts, h.min_timestamp)
            cur.max_ts = max(cur.max_ts, h.max_timestamp)
            cur.raw_length += h.length
        self._slices[(topic, partition)] = slices
        self._raw_bytes += sum(len(d) for d, _ in checked)
        self._batch_count += len(checked)
        self._record_count += sum(h.count for _, h in checked)
        if any(h.flags & _batch.FLAG_NULLS for _, h in checked):
            self._nulls = True

    def add_stored(self, topic: str, partition: int, block: StoredBlock) -> None:
        """Add a block compressed at rest, to be shipped as it is (no recompression).

        It becomes one block of the object (codec, payload and sizes as given);
        its offsets must continue the partition's, as for :meth:`add`. The
        payload is checked against the block's sizes and codec here; its
        batches were checked when the journal compressed them.
        """
        validate_topic(topic)
        if not _int_in(partition, 0, _U32_MAX):
            raise InvalidInput(f"partition must be an int in 0..{_U32_MAX}, got {partition!r}")
        probe = BlockIndex(
            topic,
            partition,
            block.first_offset,
            block.last_offset,
            block.record_count,
            block.min_ts,
            block.max_ts,
            0,
            len(block.payload),
            block.raw_length,
            block.codec,
            0,
        )
        try:
            _check_block(probe, "stored block")
        except CorruptData as exc:
            raise InvalidInput(exc.reason) from None
        if block.codec == CODEC_ZSTD and bytes(block.payload[:4]) != _ZSTD_MAGIC:
            raise InvalidInput("a zstd block's payload is not a zstd frame")
        if block.batches < 1:
            raise InvalidInput("a stored block holds at least one batch")
        slices = self._slices.get((topic, partition), [])
        expected = slices[-1].next_offset if slices else None
        if expected is not None and block.first_offset != expected:
            raise InvalidInput(
                f"{topic}/{partition}: block at offset {block.first_offset}, expected {expected} "
                "(offsets of a partition must be contiguous)"
            )
        slices.append(
            _Slice(
                [],
                block.first_offset,
                block.last_offset + 1,
                block.min_ts,
                block.max_ts,
                block.raw_length,
                block,
            )
        )
        self._slices[(topic, partition)] = slices
        self._raw_bytes += block.raw_length
        self._batch_count += block.batches
        self._record_count += block.record_count
        if block.nulls:
            self._nulls = True

    def build(
        self,
        region: str,
        epoch: int,
        seq: int,
        first_lsn: int,
        last_lsn: int,
        created_ms: int,
        level: int = DEFAULT_LEVEL,
        *,
        threads: int = 0,
        lanes: Sequence[LaneRange] = (),
        key: WriteKeyLike | None = None,
        gaps: Sequence[GapRange] = (),
    ) -> bytes:
        """The whole object: the header (with the index) followed by the blocks.

        Each block is one zstd frame at ``level``, or stored as is when zstd
        does not make it smaller. ``threads`` > 0 (or -1: one per CPU) lets
        zstd split big blocks (several MiB) across threads; the default keeps
        the output a pure function of the input. An entry with no batches is
        allowed (LSNs holding nothing to ship); its range may be empty.

        ``first_lsn``/``last_lsn`` are lane 0's range; ``lanes`` (the other
        lanes' ranges, ascending lane ids) makes it a version 2 object. Without
        ``lanes`` the object is version 1, as every older writer built it.
        ``gaps`` (offsets a drop-oldest lane dropped) makes it version 3.

        A batch with null values (``batch.FLAG_NULLS``) sets :data:`FLAG_NULLS`.

        ``key`` (the region's write key, :class:`~edge_gateway.format.crypt.WriteKey`)
        seals every block with AES-256-GCM after compression and sets
        :data:`FLAG_ENCRYPTED` with the key's id; the nonces are random, so the
        output is then no longer a pure function of the input. An entry
        without blocks is never encrypted (there is nothing to hide).
        """
        validate_region(region)  # InvalidName is an InvalidInput
        if not _int_in(level, _MIN_LEVEL, zstd.MAX_COMPRESSION_LEVEL):
            raise InvalidInput(f"zstd level must be within {_MIN_LEVEL}..22, got {level!r}")
        if not _int_in(threads, -1, 256):
            raise InvalidInput(f"threads must be within -1..256, got {threads!r}")
        if not _int_in(first_lsn, 1, _U64_MAX) or not _int_in(last_lsn, 0, _U64_MAX):
            raise InvalidInput("LSNs must be u64, first_lsn >= 1")
        lane_table = tuple(lanes)
        gap_table = tuple(gaps)
        if not self._slices:
            return _encode_empty(
                region, epoch, seq, first_lsn, last_lsn, created_ms, 0, lane_table, gap_table
            )
        keys = sorted(self._slices)
        key_id = key.key_id if key is not None else None
        if key_id is not None and not valid_key_id(key_id):
            raise InvalidInput(f"bad key id {key_id!r}")
        n_blocks = sum(len(v) for v in self._slices.values())
        hlen = header_size(
            region,
            (t for t, p in keys for _ in self._slices[(t, p)]),
            len(lane_table),
            key_id,
            (g.topic for g in gap_table),
        )
        context = b""
        sealer: BlockSealer | None = None
        if key is not None and key_id is not None:
            context = seal_context(region, key_id, epoch, seq, first_lsn, last_lsn, n_blocks)
            sealer = key.sealer(context)
        overhead = SEAL_OVERHEAD if sealer is not None else 0
        if hlen > MAX_HEADER_BYTES:
            raise InvalidInput(
                f"{len(keys)} partitions need a header of {hlen} bytes; "
                f"the limit is {MAX_HEADER_BYTES}"
            )
        blocks: list[BlockIndex] = []
        stored: list[bytes] = []
        pos = hlen
        # One compressor for the whole object, lent from the pool.
        with _compressor(level, threads) as cctx:
            for topic, partition in keys:
                for s in self._slices[(topic, partition)]:
                    if s.stored is not None:
                        # Compressed at rest (format/atrest.py): shipped as stored.
                        packed, codec = s.stored.payload, s.stored.codec
                        raw_length = s.raw_length
                    else:
                        with _block_input(s.batches) as raw:
                            packed, codec = compress_block(cctx, raw)
                            raw_length = len(raw)
                    index = BlockIndex(
                        topic,
                        partition,
                        s.first_offset,
                        s.next_offset - 1,
                        s.next_offset - s.first_offset,
                        s.min_ts,
                        s.max_ts,
                        pos,
                        len(packed) + overhead,
                        raw_length,
                        codec,
                        0,
                    )
                    if sealer is not None:
                        # Compression before encryption: ciphertext does not compress.
                        packed = sealer.seal(block_aad(context, index), packed)
                        if len(packed) != index.stored_length:
                            raise InvalidInput("the sealer did not add exactly SEAL_OVERHEAD bytes")
                    blocks.append(dataclasses.replace(index, crc=crc32c(packed)))
                    stored.append(packed)
                    pos += len(packed)
        header = LogObjectHeader(
            lanes_version(lane_table, gap_table),
            (FLAG_ENCRYPTED if sealer is not None else 0) | (FLAG_NULLS if self._nulls else 0),
            hlen,
            epoch,
            seq,
            first_lsn,
            last_lsn,
            created_ms,
            region,
            tuple(blocks),
            lane_table,
            key_id if sealer is not None else None,
            gap_table,
        )
        return b"".join([encode_header(header), *stored])


# --------------------------------------------------------------------------
# decoding


def _check_prefix(buf: Buffer, where: str) -> int:
    magic, version, flags, reserved, header_length = _PREFIX.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CorruptData(f"not a log object (magic {bytes(magic)!r})", where=where)
    if version not in VERSIONS:
        raise UnsupportedFormat(
            f"unsupported log object version {version} (this reader knows {_KNOWN})",
            where=where,
        )
    if flags & ~_KNOWN_FLAGS or reserved:
        raise UnsupportedFormat(
            f"unknown flags 0x{flags:02x}/reserved 0x{reserved:04x}", where=where
        )
    if not MIN_HEADER_BYTES <= header_length <= MAX_HEADER_BYTES:
        raise CorruptData(f"bad header_length {header_length}", where=where)
    return int(header_length)


def header_length_hint(prefix: Buffer, *, where: str = "log object") -> int:
    """How many bytes from the start of the object :func:`decode_header` needs.

    ``prefix`` is the start of the object (any length). With fewer than
    :data:`PREFIX_BYTES` bytes it returns :data:`PREFIX_BYTES` (after
    checking the magic bytes present); then it returns the header length read
    from the first 12 bytes, checked against the magic, version, flags and
    :data:`MAX_HEADER_BYTES`. A reader that got fewer bytes than this from its
    first GET issues one more for the rest of the header.
    """
    n = min(len(prefix), PREFIX_BYTES)
    if bytes(prefix[: min(n, 4)]) != MAGIC[: min(n, 4)]:
        raise CorruptData(f"not a log object (magic {bytes(prefix[:4])!r})", where=where)
    if n < PREFIX_BYTES:
        return PREFIX_BYTES
    return _check_prefix(prefix, where)


def decode_header(buf: Buffer, *, where: str, object_size: int | None = None) -> LogObjectHeader:
    """Decode and validate the header at the start of ``buf``.

    ``buf`` may hold more than the header (the first GET, the whole object).
    With ``object_size`` (the object's size from the GET), it must equal the
    end of the last block. Raises :class:`CorruptData` for any violation of
    ``docs/log-object.md``, with ``where`` (the bucket key) in the message.
    """
    if len(buf) < PREFIX_BYTES:
        raise CorruptData(f"truncated: {len(buf)} bytes, a header needs more", where=where)
    hlen = _check_prefix(buf, where)
    if len(buf) < hlen:
        raise CorruptData(f"truncated: header of {hlen} bytes, {len(buf)} present", where=where)
    view = memoryview(buf)[:hlen]
    end = hlen - 4
    (stored_crc,) = _U32.unpack_from(view, end)
    actual = crc32c(view[:end])
    if actual != stored_crc:
        raise CorruptData(
            f"header CRC mismatch (stored {stored_crc:08x}, computed {actual:08x})", where=where
        )
    (_, version, flags, _, _, epoch, seq, first_lsn, last_lsn, created_ms, rlen) = (
        _FIXED.unpack_from(view, 0)
    )
    pos = _FIXED_SIZE
    if pos + rlen + 4 > end:
        raise CorruptData("region overruns the header", where=where)
    region = _utf8(view[pos : pos + rlen], "region", where)
    pos += rlen
    lanes: list[LaneRange] = []
    if version in (VERSION_LANES, VERSION_GAPS):
        (n_lanes,) = _U8.unpack_from(view, pos)
        pos += 1
        if pos + n_lanes * _LANE_SIZE + 4 > end:
            raise CorruptData("lane table overruns the header", where=where)
        for _ in range(n_lanes):
            lanes.append(LaneRange(*_LANE.unpack_from(view, pos)))
            pos += _LANE_SIZE
    gaps: list[GapRange] = []
    if version == VERSION_GAPS:
        (n_gaps,) = _U32.unpack_from(view, pos)
        pos += 4
        if n_gaps * (_GAP_FIXED + 1) > end - pos:
            raise CorruptData(
                f"{n_gaps} gap entries cannot fit in a header of {hlen} bytes", where=where
            )
        for _ in range(n_gaps):
            if pos + 3 > end:
                raise CorruptData("gap entry overruns the header", where=where)
            (gap_lane,) = _U8.unpack_from(view, pos)
            (tlen,) = _U16.unpack_from(view, pos + 1)
            pos += 3
            if pos + tlen + _GAP.size + 4 > end:
                raise CorruptData("gap entry overruns the header", where=where)
            gap_topic = _utf8(view[pos : pos + tlen], "topic", where)
            pos += tlen
            gaps.append(GapRange(gap_lane, gap_topic, *_GAP.unpack_from(view, pos)))
            pos += _GAP.size
        if pos + 4 > end:
            raise CorruptData("gap table overruns the header", where=where)
    key_id: str | None = None
    if flags & FLAG_ENCRYPTED:
        (klen,) = _U8.unpack_from(view, pos)
        pos += 1
        if pos + klen + 4 > end:
            raise CorruptData("key id overruns the header", where=where)
        key_id = _utf8(view[pos : pos + klen], "key id", where)
        pos += klen
    (n_blocks,) = _U32.unpack_from(view, pos)
    pos += 4
    if n_blocks * MIN_INDEX_ENTRY_BYTES > end - pos:
        raise CorruptData(
            f"{n_blocks} index entries cannot fit in a header of {hlen} bytes", where=where
        )
    blocks: list[BlockIndex] = []
    topics: dict[bytes, str] = {}
    for _ in range(n_blocks):
        if pos + 2 > end:
            raise CorruptData("index entry overruns the header", where=where)
        (tlen,) = _U16.unpack_from(view, pos)
        pos += 2
        if pos + tlen + _BLOCK.size > end:
            raise CorruptData("index entry overruns the header", where=where)
        raw_topic = bytes(view[pos : pos + tlen])
        topic = topics.get(raw_topic)
        if topic is None:
            topic = topics[raw_topic] = _utf8(raw_topic, "topic", where)
        pos += tlen
        blocks.append(BlockIndex(topic, *_BLOCK.unpack_from(view, pos)))
        pos += _BLOCK.size
    if pos != end:
        raise CorruptData(f"{end - pos} unexpected bytes after the index", where=where)
    header = LogObjectHeader(
        version,
        flags,
        hlen,
        epoch,
        seq,
        first_lsn,
        last_lsn,
        created_ms,
        region,
        tuple(blocks),
        tuple(lanes),
        key_id,
        tuple(gaps),
    )
    validate_header(header, where=where)
    if object_size is not None and object_size != header.total_length:
        raise CorruptData(
            f"object is {object_size} bytes, its index describes {header.total_length}",
            where=where,
        )
    return header


def _utf8(data: Buffer, what: str, where: str) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptData(f"{what} is not UTF-8", where=where) from None


def decode_block(
    index: BlockIndex,
    stored: Buffer,
    *,
    where: str,
    opener: BlockOpener | None = None,
    opened: bool = False,
) -> bytes:
    """The raw batches of a block from its stored bytes, checked against ``index``.

    Checks the length and CRC first, then (an encrypted object: ``opener``
    from the reader's keyring, :mod:`edge_gateway.format.crypt`) authenticates
    and decrypts, then decompresses into at most ``raw_length`` bytes: a frame
    that claims or produces any other size is refused before it can allocate
    more. A wrong tag (tampered bytes, a block moved from another position,
    object or region, or the wrong key) is :class:`CorruptData`. ``opened``:
    the caller already checked ``stored`` as :func:`open_block` would (or a
    CRC of its own covers it, as a journal block entry's does), so only the
    decompression and its size are checked.
    """
    what = f"block {index.topic}/{index.partition} at {index.offset}"
    if not opened:
        stored = open_block(index, stored, where=where, opener=opener)
    elif opener is not None:
        raise InvalidInput("decode_block: an opened block takes no opener")
    if index.codec == CODEC_NONE:
        raw = bytes(stored)
    elif index.codec == CODEC_ZSTD:
        raw = _unzstd(stored, index.raw_length, what, where)
    else:
        raise CorruptData(f"{what}: unknown codec {index.codec}", where=where)
    if len(raw) != index.raw_length:
        raise CorruptData(
            f"{what}: {len(raw)} raw bytes, the index says {index.raw_length}", where=where
        )
    return raw


def open_block(
    index: BlockIndex, stored: Buffer, *, where: str, opener: BlockOpener | None = None
) -> Buffer:
    """A block's payload as compressed (one zstd frame, or raw batches): its length and CRC
    checked against ``index``, then (an encrypted object) authenticated and decrypted.
    Nothing is decompressed (see :func:`decode_block`)."""
    what = f"block {index.topic}/{index.partition} at {index.offset}"
    if len(stored) != index.stored_length:
        raise CorruptData(
            f"{what}: {len(stored)} bytes, the index says {index.stored_length}", where=where
        )
    actual = crc32c(stored)
    if actual != index.crc:
        raise CorruptData(
            f"{what}: CRC mismatch (stored {index.crc:08x}, computed {actual:08x})", where=where
        )
    if opener is not None:
        if len(stored) <= SEAL_OVERHEAD:
            raise CorruptData(f"{what}: too short for a sealed block", where=where)
        plain = opener.open(block_aad(opener.context, index), stored)
        if plain is None:
            raise CorruptData(
                f"{what}: authentication failed (tampered, moved from another object or "
                f"position, or sealed with another key under key id {opener.key_id!r})",
                where=where,
            )
        return plain
    return stored


def _unzstd(stored: Buffer, raw_length: int, what: str, where: str) -> bytes:
    if bytes(stored[:4]) != _ZSTD_MAGIC:
        raise CorruptData(f"{what}: not a zstd frame", where=where)
    try:
        params = zstd.get_frame_parameters(stored)
        # python-zstandard sizes its output by the frame's declared content
        # size and ignores max_output_size then: check it before decompressing.
        if params.content_size not in (raw_length, zstd.CONTENTSIZE_UNKNOWN):
            raise CorruptData(
                f"{what}: zstd frame declares {params.content_size} bytes, "
                f"the index says {raw_length}",
                where=where,
            )
        # take/give, not lend(): a context manager costs a small block's read
        # (a cold one-record fetch from a mirror's block entry) 2 us of 40
        dctx = _DECOMPRESSORS.take()
        try:
            raw = dctx.decompress(stored, max_output_size=raw_length, allow_extra_data=False)
        finally:
            _DECOMPRESSORS.give(dctx)
    except zstd.ZstdError as exc:
        raise CorruptData(f"{what}: zstd: {exc}", where=where) from None
    return bytes(raw)


def iter_block_batches(
    index: BlockIndex, raw: Buffer, *, where: str = "block", verify: bool = True
) -> Iterator[RecordBatch]:
    """Decode the batches of a block (from :func:`decode_block`), checked against ``index``.

    The batches' offsets must run exactly ``first_offset..last_offset`` with
    no gap, and their timestamps span exactly ``min_ts..max_ts``. Being a
    generator, it raises at the first bad batch, after yielding the good ones
    before it; the last checks run when the iteration ends.
    """
    what = f"block {index.topic}/{index.partition} at {index.offset}"
    if len(raw) != index.raw_length:
        raise CorruptData(
            f"{what}: {len(raw)} raw bytes, the index says {index.raw_length}", where=where
        )
    pos, end = 0, len(raw)
    expected = index.first_offset
    lo: int | None = None
    hi: int | None = None
    while pos < end:
        b = _batch.decode_batch(raw, pos, where=f"{where} {what}+{pos}", verify=verify)
        h = b.header
        if h.base_offset != expected or h.last_offset > index.last_offset:
            raise CorruptData(
                f"{what}: batch with offsets {h.base_offset}..{h.last_offset} where "
                f"{expected}..{index.last_offset} remain",
                where=where,
            )
        if h.min_timestamp < index.min_ts or h.max_timestamp > index.max_ts:
            raise CorruptData(f"{what}: batch timestamps outside min_ts..max_ts", where=where)
        lo = h.min_timestamp if lo is None else min(lo, h.min_timestamp)
        hi = h.max_timestamp if hi is None else max(hi, h.max_timestamp)
        expected = h.next_offset
        pos += h.length
        yield b
    if expected != index.last_offset + 1:
        raise CorruptData(
            f"{what}: batches end at offset {expected - 1}, the index says {index.last_offset}",
            where=where,
        )
    if (lo, hi) != (index.min_ts, index.max_ts):
        raise CorruptData(
            f"{what}: batch timestamps span {lo}..{hi}, the index says "
            f"{index.min_ts}..{index.max_ts}",
            where=where,
        )


# --------------------------------------------------------------------------
# ranged reads


def plan_ranges(
    header: HasBlocks,
    wanted: Callable[[str, int], bool] | Container[tuple[str, int]],
    *,
    coalesce_gap: int = DEFAULT_COALESCE_GAP,
    whole_object_fraction: float = DEFAULT_WHOLE_OBJECT_FRACTION,
    have: int = 0,
) -> list[tuple[int, int]]:
    """The byte ranges ``[start, end)`` to GET for the blocks of the wanted partitions.

    ``wanted`` is a predicate ``(topic, partition) -> bool`` or a container of
    ``(topic, partition)`` pairs; ``header`` a :class:`LogObjectHeader` or a
    manifest entry. Bytes ``[0, have)`` are already in hand (the first GET)
    and never planned again. Wanted blocks separated by less than
    ``coalesce_gap`` bytes share one range (one request costs more than a few
    KiB of transfer). When the ranges would cover more than
    ``whole_object_fraction`` of the bytes still missing, the plan is the
    whole rest of the object in one range. An empty plan means nothing to fetch.
    """
    if not _int_in(coalesce_gap, 0, _U64_MAX):
        raise InvalidInput(f"coalesce_gap must be a non-negative int, got {coalesce_gap!r}")
    if not 0.0 <= whole_object_fraction <= 1.0:
        raise InvalidInput(f"whole_object_fraction must be within 0..1: {whole_object_fraction}")
    if not _int_in(have, 0, _U64_MAX):
        raise InvalidInput(f"have must be a non-negative int, got {have!r}")
    pick: Callable[[str, int], bool]
    if callable(wanted):
        pick = wanted
    else:
        container = wanted

        def pick(topic: str, partition: int) -> bool:
            return (topic, partition) in container

    total = header.total_length
    ranges: list[list[int]] = []
    for b in header.blocks:
        start, stop = max(b.offset, have), b.end
        if start >= stop or not pick(b.topic, b.partition):
            continue
        if ranges and start - ranges[-1][1] < coalesce_gap:
            ranges[-1][1] = stop
        else:
            ranges.append([start, stop])
    if not ranges:
        return []
    planned = sum(stop - start for start, stop in ranges)
    if planned > whole_object_fraction * (total - have):
        return [(have, total)]
    return [(start, stop) for start, stop in ranges]


def slice_block(
    index: BlockIndex, fetched: Iterable[tuple[int, Buffer]], *, where: str
) -> memoryview:
    """The stored bytes of a block out of fetched ranges ``(start, data)``.

    One range usually holds the whole block (a zero-copy view of it is
    returned). A block may also be split across ranges that meet or overlap
    — the first GET ``[0, have)`` and a planned range starting at ``have``
    (:func:`plan_ranges` never fetches bytes in hand again) — and is then
    joined into a copy. A range that should hold the block but stops short
    (the object is shorter than its index says) raises :class:`CorruptData`,
    as does a block the ranges do not cover without a hole.
    """
    pieces = sorted(((start, memoryview(data).cast("B")) for start, data in fetched),
                    key=lambda piece: piece[0])  # fmt: skip
    for start, view in pieces:
        if start <= index.offset and index.end <= start + len(view):
            return view[index.offset - start : index.end - start]
    joined = bytearray()
    pos = index.offset
    for start, view in pieces:
        stop = min(start + len(view), index.end)
        if start <= pos < stop:
            joined += view[pos - start : stop - start]
            pos = stop
    if pos == index.end and index.stored_length:
        return memoryview(bytes(joined))
    raise CorruptData(
        f"block {index.topic}/{index.partition} [{index.offset}, {index.end}) "
        "is not within the bytes read (object truncated?)",
        where=where,
    )


def blocks_for(header: HasBlocks, topic: str, partition: int) -> Sequence[BlockIndex]:
    """The blocks of one partition, in offset order."""
    return [b for b in header.blocks if b.topic == topic and b.partition == partition]
