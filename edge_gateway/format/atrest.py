"""Journal data at rest, compressed (sans-IO): the compressed segment and the block entry.

Two encodings, specified in ``docs/at-rest.md``:

**The compressed segment** (magic ``"EGWC"``, version 1) holds exactly the
entries of one sealed journal segment, rewritten so that record batches are
stored as *log-object blocks*: per (topic, partition) runs of batches,
compressed with the log object's own block encoding
(:func:`~edge_gateway.format.logobject.compress_block`: one zstd frame or the
raw batches, CRC-32C of the stored bytes). A block kept at rest is therefore
byte for byte a block the shipper can put in a log object without
recompressing it (:meth:`~edge_gateway.format.logobject.LogObjectBuilder.add_stored`),
and a block fetched from another region's log object is kept as fetched.
Every other byte of every journal entry -- LSN, kind, flags, append time,
offsets and counts, producer stamps, mirror source coordinates, markers and
checkpoints -- is kept in a compressed column-wise *entry table* per chunk, so
the compressed segment expands back into the very bytes of the segment it
replaced (:func:`expand_segment`)::

    0   4  magic "EGWC" | 1 version = 1 | 1 wal_version (1..3) | 2 zero
    8   8  base_lsn                                (16 bytes: the journal's header size)
    16     chunk 0: its frames back to back, then its entry table (meta block)
           chunk 1 ...
           directory (uncompressed, CRC-32C at its end)
    -16    trailer: u64 dir_offset | u32 dir_length | "EGWC"

    directory:
      u64 base_lsn | u64 last_lsn | i64 last_append_time | u64 wal_bytes
      u32 n_parts | u32 n_chunks | u32 n_frames | u8 wal_version (= the header's) | 3 zero
      parts   n_parts  x (u16 topic_len | topic | u32 partition)   first appearance order
      chunks  n_chunks x (u64 first_lsn | u64 last_lsn | u32 first_frame | u32 n_frames
                          | u64 meta_offset | u32 meta_stored | u32 meta_raw | u8 meta_codec
                          | u32 meta_crc)
      frames  n_frames x (u32 part | u8 origin | u8 flags | i64 first_offset | i64 last_offset
                          | u32 record_count | i64 min_ts | i64 max_ts | u64 offset
                          | u32 stored_length | u32 raw_length | u8 codec | u32 crc
                          | u32 n_entries)
      u32 CRC-32C of the directory's bytes before it

    entry table (raw, before its codec), n = last_lsn - first_lsn + 1 of the chunk:
      u32 n | u32 extras_length
      kinds n x u8 | flags n x u8 | parts n x u32 | frames n x u32 | counts n x u32
      raw_lengths n x u32 | extra_lengths n x u32 | append_time deltas n x u64 (mod 2**64)
      extras (concatenated)

**The block entry** (journal entry kind 4, :data:`KIND_BLOCK`, only in a
version 3 journal segment) is a mirror append of one fetched log-object block
as it was shipped: the journal entry header (the topic, partition, first
offset and record count of the block), the mirror source tail of a MIRROR
entry, then ``u8 codec | u8 flags (bit0 NULLS) | u16 zero | u32 raw_length |
i64 min_ts | i64 max_ts | u32 crc`` and the block's stored bytes (opened when
the source object was encrypted).

Decoders raise :class:`~edge_gateway.errors.CorruptData` (and nothing else) on
bad input, with every size checked against a hard limit before anything is
allocated for it; encoders raise :class:`~edge_gateway.errors.InvalidInput`.
"""

from __future__ import annotations

import operator
import struct
import sys
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, islice, pairwise
from typing import Final

import zstandard as zstd

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData, InvalidInput, InvalidName, UnsupportedFormat
from edge_gateway.format import batch as _batch
from edge_gateway.format import entry as _entry
from edge_gateway.format import logobject as _lo
from edge_gateway.format.batch import Record, RecordBatch
from edge_gateway.format.entry import Entry, SourceCoords
from edge_gateway.format.logobject import BlockIndex, StoredBlock
from edge_gateway.names import validate_topic

MAGIC: Final = b"EGWC"
VERSION: Final = 1
#: The journal segment version that may hold :data:`KIND_BLOCK` entries.
WAL_VERSION_BLOCKS: Final = _entry.SEGMENT_VERSION_BLOCKS
#: Journal segment versions a compressed segment may have been rewritten from.
WAL_VERSIONS: Final = (1, 2, WAL_VERSION_BLOCKS)
_WAL_MAGIC: Final = _entry.SEGMENT_MAGIC
#: Journal entry kind: one log-object block mirrored as fetched.
KIND_BLOCK: Final = 4

#: What a frame's batches came from.
ORIGIN_DATA: Final = 1
ORIGIN_MIRROR: Final = 2
#: One :data:`KIND_BLOCK` entry: the block as the source region shipped it.
ORIGIN_BLOCK: Final = 3
_ORIGINS: Final = (ORIGIN_DATA, ORIGIN_MIRROR, ORIGIN_BLOCK)
#: Kinds of the entries an entry table keeps whole: a checkpoint, a mirror marker.
_KEPT_WHOLE: Final = (_entry.KIND_CHECKPOINT, _entry.KIND_MIRROR)
#: A data entry's extras by its flags byte: 16 bytes of producer when flagged (other
#: flags are refused on their own).
_PRODUCER_TAIL: Final = bytes(16 if b == _entry.FLAG_PRODUCER else 0 for b in range(256))
#: The entry kind a frame's origin holds (any other origin: :data:`KIND_BLOCK`).
_KIND_OF_ORIGIN: Final = {ORIGIN_DATA: _entry.KIND_DATA, ORIGIN_MIRROR: _entry.KIND_MIRROR}
#: Frame flag: a batch in the frame has the batch flag NULLS.
FRAME_NULLS: Final = 0x01

#: A frame (block) of a partition is cut at this many raw bytes of batches.
DEFAULT_FRAME_RAW_BYTES: Final = 256 * 1024
#: :func:`iter_compressed` calls its ``tick`` after this many entries (a few
#: milliseconds of encoding: the grain at which a rewriter can pace itself).
TICK_ENTRIES: Final = 256
#: A chunk (an LSN range whose data frames make one log object) is cut past this.
DEFAULT_CHUNK_RAW_BYTES: Final = 8 * 1024 * 1024
MAX_FRAME_RAW_BYTES: Final = _lo.MAX_BLOCK_RAW_BYTES
MAX_CHUNK_RAW_BYTES: Final = 1024 * 1024 * 1024
#: Largest directory a reader accepts (about 1.1 M frames).
MAX_DIRECTORY_BYTES: Final = 64 * 1024 * 1024
#: Largest raw entry table (a checkpoint entry alone may be nearly this big).
MAX_META_RAW_BYTES: Final = _entry.MAX_ENTRY_BYTES + 64 * 1024 * 1024

_NONE: Final = 0xFFFFFFFF
_U32_MAX: Final = 2**32 - 1
_U64_MAX: Final = 2**64 - 1
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_U64_SPAN: Final = 2**64
_I64_SPAN: Final = 2**63

_HEADER = struct.Struct("<4sBB2xQ")
HEADER_SIZE: Final = _HEADER.size  # 16
_WAL_HEADER = struct.Struct("<4sB3xQ")
_TRAILER = struct.Struct("<QI4s")
TRAILER_SIZE: Final = _TRAILER.size  # 16
_DIR_FIXED = struct.Struct("<QQqQIIIB3x")
_PART = struct.Struct("<I")
_CHUNK = struct.Struct("<QQIIQIIBI")
_FRAME = struct.Struct("<IBBqqIqqQIIBII")
_META_HEAD = struct.Struct("<II")
_META_PER_ENTRY: Final = 1 + 1 + 4 + 4 + 4 + 4 + 4 + 8  # 30 raw bytes per entry
_U16 = struct.Struct("<H")
_SOURCE_TAIL = struct.Struct("<QQ")
_BLOCK_DESC = struct.Struct("<BBHIqqI")
BLOCK_DESC_SIZE: Final = _BLOCK_DESC.size  # 28
_BATCH_FLAGS_TS = struct.Struct("<5xB18xqq")  # a batch's flags, min and max timestamps
_BATCH_LEN_BASE_COUNT = struct.Struct("<I4xq4xI")  # a batch's length, base offset and count
_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"

Buffer = bytes | bytearray | memoryview


# --------------------------------------------------------------------------
# the block entry (kind 4): a mirrored log-object block, kept as fetched


@dataclass(frozen=True, slots=True)
class BlockEntry:
    """A decoded :data:`KIND_BLOCK` journal entry: one block of a source's log object."""

    lsn: int
    topic: str
    partition: int
    append_time: int
    source: SourceCoords
    first_offset: int
    record_count: int
    min_ts: int
    max_ts: int
    raw_length: int
    codec: int
    #: CRC-32C of ``stored``
    crc: int
    #: the block's stored bytes (unsealed): one zstd frame, or the raw batches
    stored: bytes
    nulls: bool
    #: bytes of the journal entry
    length: int

    kind: int = field(default=KIND_BLOCK, init=False)

    @property
    def last_offset(self) -> int:
        return self.first_offset + self.record_count - 1

    @property
    def next_offset(self) -> int:
        return self.first_offset + self.record_count

    def header_only(self) -> BlockEntry:
        """This entry without its stored bytes (what a cache of its decompressed batches
        keeps; built directly: ``dataclasses.replace`` costs a cold read 4 us)."""
        return BlockEntry(
            self.lsn,
            self.topic,
            self.partition,
            self.append_time,
            self.source,
            self.first_offset,
            self.record_count,
            self.min_ts,
            self.max_ts,
            self.raw_length,
            self.codec,
            self.crc,
            b"",
            self.nulls,
            self.length,
        )

    def frame_index(self, offset: int = 0) -> FrameIndex:
        """The block as a frame (for :class:`FrameBatches`: a read of the block entry)."""
        return FrameIndex(
            _NONE,
            self.topic,
            self.partition,
            ORIGIN_BLOCK,
            FRAME_NULLS if self.nulls else 0,
            self.first_offset,
            self.last_offset,
            self.record_count,
            self.min_ts,
            self.max_ts,
            offset,
            len(self.stored),
            self.raw_length,
            self.codec,
            self.crc,
            1,
        )

    def block_index(self, offset: int = 0) -> BlockIndex:
        """The block's log-object index entry (at byte ``offset`` of some container)."""
        return BlockIndex(
            self.topic,
            self.partition,
            self.first_offset,
            self.last_offset,
            self.record_count,
            self.min_ts,
            self.max_ts,
            offset,
            len(self.stored),
            self.raw_length,
            self.codec,
            self.crc,
        )


AnyEntry = Entry | BlockEntry


def _source_tail(source: SourceCoords) -> bytes:
    region = source.region.encode("utf-8")
    try:
        return _U16.pack(len(region)) + region + _SOURCE_TAIL.pack(source.seq, source.epoch)
    except struct.error:
        raise InvalidInput(f"source coordinates out of range: {source}") from None


def encode_block_entry(
    *,
    lsn: int,
    topic: str,
    partition: int,
    append_time: int,
    source: SourceCoords,
    index: BlockIndex,
    stored: bytes,
    nulls: bool = False,
) -> bytes:
    """The journal entry that keeps one fetched block as it was shipped.

    ``index`` is the block's entry in the source object's header (its
    offsets, timestamps, sizes and codec; its ``topic``/``partition`` are the
    source's); ``stored`` the block's stored bytes, opened first when the
    object was encrypted (then ``index.stored_length`` counts the 28 bytes of
    nonce and tag the opened bytes no longer have). The CRC kept is that of
    ``stored``, checked here against the block's sizes and codec.
    """
    rest = block_entry_rest(
        lsn=lsn,
        topic=topic,
        partition=partition,
        append_time=append_time,
        source=source,
        index=index,
        stored=stored,
        nulls=nulls,
    )
    length = 8 + len(rest) + len(stored)
    return _entry.ENTRY_LEN_CRC.pack(length, _entry.entry_crc(rest, stored)) + rest + stored


def block_entry_rest(
    *,
    lsn: int,
    topic: str,
    partition: int,
    append_time: int,
    source: SourceCoords,
    index: BlockIndex,
    stored: Buffer,
    nulls: bool = False,
    crc: int | None = None,
) -> bytes:
    """A block entry's bytes after its length and CRC, up to its stored bytes.

    The entry is ``u32 length | u32 CRC-32C(rest + stored) | rest | stored``
    (:func:`encode_block_entry`); the journal's mirror append writes the
    pieces itself (its LSN is patched in at the reservation, the CRC is taken
    by the writing thread). Checks what :func:`encode_block_entry` checks:
    the topic, the block's rules as a log-object index entry, its zstd frame
    header, the entry's size; raises :class:`InvalidInput`.

    ``crc`` is the stored bytes' CRC-32C when the caller has it, checked
    (a mirror's check of the fetched block computed it): computed here
    otherwise. The entry's own CRC, taken when it is written, covers both.
    """
    if crc is None:
        crc = crc32c(stored)
    probe = BlockIndex(
        topic,
        partition,
        index.first_offset,
        index.last_offset,
        index.record_count,
        index.min_ts,
        index.max_ts,
        0,
        len(stored),
        index.raw_length,
        index.codec,
        crc,
    )
    try:
        validate_topic(topic)
        _lo.validate_block(probe, where="block entry")
        _check_frame_magic(probe, stored, "block entry")
    except CorruptData as exc:
        raise InvalidInput(exc.reason) from None
    except InvalidName as exc:
        raise InvalidInput(str(exc)) from None
    t = topic.encode("utf-8")
    flags = _entry.FLAG_END_OF_SOURCE_OBJECT if source.end_of_object else 0
    try:
        rest = _entry.ENTRY_REST.pack(
            lsn,
            KIND_BLOCK,
            flags,
            len(t),
            partition,
            index.first_offset,
            index.record_count,
            append_time,
        )
    except struct.error:
        raise InvalidInput("block entry fields out of range") from None
    rest += (
        t
        + _source_tail(source)
        + _BLOCK_DESC.pack(
            index.codec,
            FRAME_NULLS if nulls else 0,
            0,
            index.raw_length,
            index.min_ts,
            index.max_ts,
            crc,
        )
    )
    length = 8 + len(rest) + len(stored)
    if length > _entry.MAX_ENTRY_BYTES:
        raise InvalidInput(f"block entry of {length} bytes exceeds {_entry.MAX_ENTRY_BYTES}")
    return rest


def check_stored_block(index: BlockIndex, stored: Buffer, *, where: str) -> BlockIndex:
    """Check a fetched block's stored bytes (opened, if its object was encrypted) for a
    block entry, without decompressing them; return its index entry for those bytes.

    ``index`` is the block's entry in the source object (its CRC and sizes are
    those of the bytes as shipped, checked by the caller before opening). The
    entry returned has the opened bytes' length and CRC; it must pass the
    log-object rules (``validate_block``), and a zstd block must start with
    one frame declaring ``raw_length``. Raises :class:`CorruptData`.
    """
    b = BlockIndex(
        index.topic,
        index.partition,
        index.first_offset,
        index.last_offset,
        index.record_count,
        index.min_ts,
        index.max_ts,
        0,
        len(stored),
        index.raw_length,
        index.codec,
        crc32c(stored),
    )
    _lo.validate_block(b, where=where)
    _check_frame_magic(b, stored, where)
    return b


def _check_frame_magic(b: BlockIndex, stored: Buffer, where: str) -> None:
    """A zstd block starts with the frame magic and declares no other size (no decompression)."""
    if b.codec != _lo.CODEC_ZSTD:
        return
    if bytes(stored[:4]) != _ZSTD_MAGIC:
        raise CorruptData("block: not a zstd frame", where=where)
    try:
        size = zstd.get_frame_parameters(stored).content_size
    except zstd.ZstdError as exc:
        raise CorruptData(f"block: zstd: {exc}", where=where) from None
    if size not in (b.raw_length, zstd.CONTENTSIZE_UNKNOWN):
        raise CorruptData(
            f"block: zstd frame declares {size} bytes, raw_length is {b.raw_length}", where=where
        )


def decode_block_entry(
    buf: Buffer, pos: int = 0, *, where: str = "entry", check_block: bool = True
) -> BlockEntry:
    """Decode and check the :data:`KIND_BLOCK` entry at ``buf[pos:]``.

    Checks the entry's length and CRC, its structure, the block's rules as a
    log-object index entry (``validate_block``), the block's own CRC and that a
    zstd block is one frame of the declared size -- everything but
    decompressing it, which a reader does when it reads the records.
    ``check_block=False`` (a reader about to decompress the block, with
    :func:`block_entry_raw`) leaves out the block's own CRC and frame header:
    the entry's CRC covers the same bytes, and the decompression checks the
    frame and its size.
    """
    avail = len(buf) - pos
    if avail < _entry.ENTRY_HEADER_SIZE:
        raise CorruptData(f"truncated entry header ({avail} bytes)", where=where)
    (length, crc, lsn, kind, flags, tlen, partition, base, count, atime) = (
        _entry.ENTRY_HEADER.unpack_from(buf, pos)
    )
    if kind != KIND_BLOCK:
        raise CorruptData(f"entry kind {kind} is not a block entry", where=where)
    if length < _entry.ENTRY_HEADER_SIZE + tlen or length > _entry.MAX_ENTRY_BYTES:
        raise CorruptData(f"bad entry length {length}", where=where)
    if length > avail:
        raise CorruptData(f"truncated entry: {length} bytes, {avail} present", where=where)
    view = memoryview(buf)[pos : pos + length]
    actual = crc32c(view[8:])
    if actual != crc:
        raise CorruptData(
            f"entry CRC mismatch (stored {crc:08x}, computed {actual:08x})", where=where
        )
    if flags & ~_entry.FLAG_END_OF_SOURCE_OBJECT:
        raise CorruptData(f"flags 0x{flags:02x} on a block entry", where=where)
    cur = _entry.ENTRY_HEADER_SIZE
    topic = _utf8(view[cur : cur + tlen], "topic", where)
    cur += tlen
    if cur + 2 > length:
        raise CorruptData("block entry truncated before its source", where=where)
    (rlen,) = _U16.unpack_from(view, cur)
    cur += 2
    if cur + rlen + _SOURCE_TAIL.size + BLOCK_DESC_SIZE > length:
        raise CorruptData("block entry's source and descriptor overrun it", where=where)
    region = _utf8(view[cur : cur + rlen], "source region", where)
    cur += rlen
    seq, epoch = _SOURCE_TAIL.unpack_from(view, cur)
    cur += _SOURCE_TAIL.size
    codec, bflags, zero, raw_length, min_ts, max_ts, bcrc = _BLOCK_DESC.unpack_from(view, cur)
    cur += BLOCK_DESC_SIZE
    if bflags & ~FRAME_NULLS or zero:
        raise CorruptData(f"block flags 0x{bflags:02x}/reserved 0x{zero:04x}", where=where)
    stored = bytes(view[cur:])
    try:
        validate_topic(topic)
    except InvalidName as exc:
        raise CorruptData(f"block entry topic: {exc}", where=where) from None
    b = BlockIndex(
        topic,
        partition,
        base,
        base + count - 1,
        count,
        min_ts,
        max_ts,
        0,
        len(stored),
        raw_length,
        codec,
        bcrc,
    )
    _lo.validate_block(b, where=where)
    if check_block:
        actual = crc32c(stored)
        if actual != bcrc:
            raise CorruptData(
                f"block CRC mismatch (stored {bcrc:08x}, computed {actual:08x})", where=where
            )
        _check_frame_magic(b, stored, where)
    return BlockEntry(
        lsn,
        topic,
        partition,
        atime,
        SourceCoords(region, seq, epoch, bool(flags & _entry.FLAG_END_OF_SOURCE_OBJECT)),
        base,
        count,
        min_ts,
        max_ts,
        raw_length,
        codec,
        bcrc,
        stored,
        bool(bflags & FRAME_NULLS),
        length,
    )


def decode_any_entry(
    buf: Buffer, pos: int = 0, *, where: str = "entry", check_block: bool = True
) -> AnyEntry:
    """The journal entry at ``buf[pos:]``, of any kind a version 3 segment may hold
    (``check_block``: see :func:`decode_block_entry`)."""
    if len(buf) - pos > _entry.KIND_OFFSET and buf[pos + _entry.KIND_OFFSET] == KIND_BLOCK:
        return decode_block_entry(buf, pos, where=where, check_block=check_block)
    return _entry.decode_entry(buf, pos, where=where)


def block_entry_raw(be: BlockEntry, *, where: str) -> bytes:
    """A decoded block entry's raw batches: decompressed (bounded by ``raw_length``),
    with no second CRC of the stored bytes (the entry's, checked when it was
    decoded, covers them)."""
    return _lo.decode_block(be.block_index(), be.stored, where=where, opened=True)


def encode_any_entry(e: AnyEntry) -> bytes:
    """The journal entry bytes of a decoded entry (the inverse of :func:`decode_any_entry`)."""
    if isinstance(e, BlockEntry):
        return encode_block_entry(
            lsn=e.lsn,
            topic=e.topic,
            partition=e.partition,
            append_time=e.append_time,
            source=e.source,
            index=e.block_index(),
            stored=e.stored,
            nulls=e.nulls,
        )
    return _entry.encode_entry(
        lsn=e.lsn,
        kind=e.kind,
        topic=e.topic.encode("utf-8"),
        partition=e.partition,
        base_offset=e.base_offset,
        count=e.count,
        append_time=e.append_time,
        payload=bytes(e.payload),
        source=e.source,
        producer=e.producer,
    )


def _utf8(data: Buffer, what: str, where: str) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptData(f"{what} is not UTF-8", where=where) from None


def _is_batch_entry(e: AnyEntry) -> bool:
    """An entry whose records live in a frame (every other byte of it is in the entry table)."""
    return isinstance(e, BlockEntry) or (
        e.kind in (_entry.KIND_DATA, _entry.KIND_MIRROR) and e.count > 0
    )


# --------------------------------------------------------------------------
# the directory


@dataclass(frozen=True, slots=True)
class FrameIndex:
    """One frame of a compressed segment: a log-object block of one partition."""

    part: int
    topic: str
    partition: int
    origin: int
    flags: int
    first_offset: int
    last_offset: int
    record_count: int
    min_ts: int
    max_ts: int
    #: byte position of the stored frame in the file
    offset: int
    stored_length: int
    raw_length: int
    codec: int
    #: CRC-32C of the stored bytes
    crc: int
    #: journal entries whose batches it holds (1 for :data:`ORIGIN_BLOCK`)
    n_entries: int

    @property
    def end(self) -> int:
        return self.offset + self.stored_length

    @property
    def nulls(self) -> bool:
        return bool(self.flags & FRAME_NULLS)

    def block_index(self) -> BlockIndex:
        """The frame as a log-object index entry (its ``offset`` is the file's)."""
        return BlockIndex(
            self.topic,
            self.partition,
            self.first_offset,
            self.last_offset,
            self.record_count,
            self.min_ts,
            self.max_ts,
            self.offset,
            self.stored_length,
            self.raw_length,
            self.codec,
            self.crc,
        )

    def stored_block(self, stored: bytes) -> StoredBlock:
        """The frame for :meth:`LogObjectBuilder.add_stored` (``stored``: its checked bytes)."""
        return StoredBlock(
            self.first_offset,
            self.last_offset,
            self.min_ts,
            self.max_ts,
            self.raw_length,
            self.codec,
            stored,
            self.n_entries,
            self.nulls,
        )


@dataclass(frozen=True, slots=True)
class ChunkIndex:
    """An LSN range of a compressed segment: its frames and its entry table."""

    first_lsn: int
    last_lsn: int
    first_frame: int
    n_frames: int
    meta_offset: int
    meta_stored: int
    meta_raw: int
    meta_codec: int
    meta_crc: int

    @property
    def n_entries(self) -> int:
        return self.last_lsn - self.first_lsn + 1

    @property
    def frames(self) -> range:
        return range(self.first_frame, self.first_frame + self.n_frames)


@dataclass(frozen=True, slots=True)
class SegmentDirectory:
    """What a compressed segment holds, from its directory: everything but the bytes."""

    version: int
    wal_version: int
    base_lsn: int
    last_lsn: int
    last_append_time: int
    #: bytes of the journal segment this one replaced
    wal_bytes: int
    parts: tuple[tuple[str, int], ...]
    chunks: tuple[ChunkIndex, ...]
    frames: tuple[FrameIndex, ...]
    #: bytes of the whole compressed segment
    file_size: int
    #: (topic, partition) -> its frames in offset order, and their first offsets
    _by_part: dict[tuple[str, int], tuple[list[int], list[int]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def n_entries(self) -> int:
        return self.last_lsn - self.base_lsn + 1

    def frames_of(self, topic: str, partition: int) -> list[FrameIndex]:
        """The partition's frames, in offset order."""
        found = self._by_part.get((topic, partition))
        return [self.frames[i] for i in found[0]] if found else []

    def find_frame(self, topic: str, partition: int, offset: int) -> int | None:
        """The number of the frame that holds ``offset`` of the partition (None: none)."""
        found = self._by_part.get((topic, partition))
        if found is None:
            return None
        numbers, firsts = found
        k = bisect_right(firsts, offset) - 1
        if k < 0:
            return None
        i = numbers[k]
        return i if offset <= self.frames[i].last_offset else None

    def next_offset(self, topic: str, partition: int) -> int | None:
        """The offset after the partition's last record here (None: no records here)."""
        found = self._by_part.get((topic, partition))
        return self.frames[found[0][-1]].last_offset + 1 if found else None

    def chunk_of(self, lsn: int) -> int | None:
        """The number of the chunk that holds ``lsn`` (None: not in this segment)."""
        if not self.base_lsn <= lsn <= self.last_lsn:
            return None
        firsts = [c.first_lsn for c in self.chunks]
        return bisect_right(firsts, lsn) - 1


def decode_header(buf: Buffer, *, where: str) -> tuple[int, int]:
    """``(wal_version, base_lsn)`` from the first :data:`HEADER_SIZE` bytes."""
    if len(buf) < HEADER_SIZE:
        raise CorruptData("compressed segment header truncated", where=where)
    magic, version, wal_version, base_lsn = _HEADER.unpack_from(buf)
    reserved = bytes(buf[6:8])
    if magic != MAGIC:
        raise CorruptData(f"not a compressed segment (magic {bytes(magic)!r})", where=where)
    if version != VERSION:
        raise UnsupportedFormat(
            f"unsupported compressed segment version {version} (this reader knows {VERSION})",
            where=where,
        )
    if wal_version not in WAL_VERSIONS or reserved != b"\0\0":
        raise CorruptData(
            f"journal segment version {wal_version}/reserved {reserved.hex()}", where=where
        )
    if base_lsn < 1:
        raise CorruptData("base_lsn 0", where=where)
    return int(wal_version), int(base_lsn)


def decode_trailer(tail: Buffer, *, file_size: int, where: str) -> tuple[int, int]:
    """``(dir_offset, dir_length)`` from the last :data:`TRAILER_SIZE` bytes of the file."""
    if len(tail) != TRAILER_SIZE:
        raise CorruptData(f"trailer of {len(tail)} bytes", where=where)
    dir_offset, dir_length, magic = _TRAILER.unpack(tail)
    if magic != MAGIC:
        raise CorruptData("no trailer (a compressed segment cut short?)", where=where)
    if not (
        _DIR_FIXED.size + 4 <= dir_length <= MAX_DIRECTORY_BYTES
        and dir_offset >= HEADER_SIZE
        and dir_offset + dir_length + TRAILER_SIZE == file_size
    ):
        raise CorruptData(
            f"directory at {dir_offset} of {dir_length} bytes in a file of {file_size}",
            where=where,
        )
    return int(dir_offset), int(dir_length)


def decode_directory(
    buf: Buffer, *, base_lsn: int, wal_version: int, dir_offset: int, where: str
) -> SegmentDirectory:
    """Decode and check a directory (``buf``: its bytes, ``dir_offset``: where they were).

    Checks the CRC first, then every rule of ``docs/at-rest.md``: counts that
    fit the bytes before anything is allocated for them, chunks contiguous in
    LSNs from ``base_lsn`` and frames back to back with the entry tables from
    byte 16 up to the directory, every frame a valid log-object block, and a
    partition's frames in offset order without overlap.
    """
    n = len(buf)
    if n < _DIR_FIXED.size + 4 or n > MAX_DIRECTORY_BYTES:
        raise CorruptData(f"directory of {n} bytes", where=where)
    view = memoryview(buf)
    (stored_crc,) = _PART.unpack_from(view, n - 4)
    actual = crc32c(view[: n - 4])
    if actual != stored_crc:
        raise CorruptData(
            f"directory CRC mismatch (stored {stored_crc:08x}, computed {actual:08x})",
            where=where,
        )
    (d_base, last_lsn, last_time, wal_bytes, n_parts, n_chunks, n_frames, d_wal_version) = (
        _DIR_FIXED.unpack_from(view, 0)
    )
    if bytes(view[_DIR_FIXED.size - 3 : _DIR_FIXED.size]) != b"\0\0\0":
        raise CorruptData("directory reserved bytes are not zero", where=where)
    if d_base != base_lsn:
        raise CorruptData(f"directory base_lsn {d_base}, the header says {base_lsn}", where=where)
    if d_wal_version != wal_version or last_lsn < base_lsn or n_chunks < 1:
        raise CorruptData(
            f"directory of journal segment version {d_wal_version} (the header says "
            f"{wal_version}), LSNs {base_lsn}..{last_lsn}, {n_chunks} chunks",
            where=where,
        )
    body = n - 4 - _DIR_FIXED.size
    if n_parts * 7 + n_chunks * _CHUNK.size + n_frames * _FRAME.size > body:
        raise CorruptData(
            f"{n_parts} partitions, {n_chunks} chunks and {n_frames} frames "
            f"cannot fit {body} bytes",
            where=where,
        )
    cur = _DIR_FIXED.size
    parts: list[tuple[str, int]] = []
    seen: set[tuple[str, int]] = set()
    for _ in range(n_parts):
        if cur + 2 > n - 4:
            raise CorruptData("partition table overruns the directory", where=where)
        (tlen,) = _U16.unpack_from(view, cur)
        cur += 2
        if cur + tlen + 4 > n - 4:
            raise CorruptData("partition table overruns the directory", where=where)
        topic = _utf8(view[cur : cur + tlen], "topic", where)
        cur += tlen
        (partition,) = _PART.unpack_from(view, cur)
        cur += 4
        try:
            validate_topic(topic)
        except InvalidName as exc:
            raise CorruptData(f"partition table: {exc}", where=where) from None
        if (topic, partition) in seen:
            raise CorruptData(f"partition {topic}/{partition} listed twice", where=where)
        seen.add((topic, partition))
        parts.append((topic, partition))
    if cur + n_chunks * _CHUNK.size + n_frames * _FRAME.size != n - 4:
        raise CorruptData("directory tables do not end at its CRC", where=where)
    chunks = [ChunkIndex(*_CHUNK.unpack_from(view, cur + i * _CHUNK.size)) for i in range(n_chunks)]
    cur += n_chunks * _CHUNK.size
    raw_frames = [_FRAME.unpack_from(view, cur + i * _FRAME.size) for i in range(n_frames)]
    frames: list[FrameIndex] = []
    pos = HEADER_SIZE
    next_lsn = base_lsn
    for ci, c in enumerate(chunks):
        what = f"chunk {ci}"
        if c.first_lsn != next_lsn or c.last_lsn < c.first_lsn or c.last_lsn > last_lsn:
            raise CorruptData(
                f"{what}: LSNs {c.first_lsn}..{c.last_lsn} where {next_lsn} comes next",
                where=where,
            )
        next_lsn = c.last_lsn + 1
        if c.first_frame != len(frames) or c.first_frame + c.n_frames > n_frames:
            raise CorruptData(f"{what}: frames {c.first_frame}+{c.n_frames}", where=where)
        prev_part = -1
        for i in c.frames:
            (part, origin, fflags, first, last, count, min_ts, max_ts, offset, stored, raw, codec,
             fcrc, n_ent) = raw_frames[i]  # fmt: skip
            if part >= n_parts or origin not in _ORIGINS or fflags & ~FRAME_NULLS:
                raise CorruptData(
                    f"frame {i}: partition {part}, origin {origin}, flags 0x{fflags:02x}",
                    where=where,
                )
            if part < prev_part:
                raise CorruptData(f"frame {i}: frames of a chunk not by partition", where=where)
            prev_part = part
            if offset != pos:
                raise CorruptData(f"frame {i} at byte {offset}, expected {pos}", where=where)
            if n_ent < 1 or n_ent > c.n_entries or (origin == ORIGIN_BLOCK and n_ent != 1):
                raise CorruptData(f"frame {i}: {n_ent} entries", where=where)
            topic, partition = parts[part]
            f = FrameIndex(
                part, topic, partition, origin, fflags, first, last, count, min_ts, max_ts,
                offset, stored, raw, codec, fcrc, n_ent,
            )  # fmt: skip
            _lo.validate_block(f.block_index(), where=f"{where} frame {i}")
            frames.append(f)
            pos += stored
        if c.meta_offset != pos:
            raise CorruptData(
                f"{what}: entry table at byte {c.meta_offset}, expected {pos}", where=where
            )
        _check_meta_sizes(c, what, where)
        pos += c.meta_stored
    if len(frames) != n_frames or next_lsn != last_lsn + 1:
        raise CorruptData(
            f"chunks hold {len(frames)} of {n_frames} frames, LSNs up to {next_lsn - 1} "
            f"of {last_lsn}",
            where=where,
        )
    if pos != dir_offset:
        raise CorruptData(f"data ends at byte {pos}, the directory is at {dir_offset}", where=where)
    by_part: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for i, f in enumerate(frames):
        numbers, firsts = by_part.setdefault((f.topic, f.partition), ([], []))
        if numbers and f.first_offset <= frames[numbers[-1]].last_offset:
            raise CorruptData(
                f"frame {i}: offsets {f.first_offset}.. overlap or precede the partition's "
                f"previous frame",
                where=where,
            )
        numbers.append(i)
        firsts.append(f.first_offset)
    return SegmentDirectory(
        VERSION,
        wal_version,
        base_lsn,
        last_lsn,
        last_time,
        wal_bytes,
        tuple(parts),
        tuple(chunks),
        tuple(frames),
        dir_offset + n + TRAILER_SIZE,
        by_part,
    )


def _check_meta_sizes(c: ChunkIndex, what: str, where: str) -> None:
    need = _META_HEAD.size + c.n_entries * _META_PER_ENTRY
    if not (
        need <= c.meta_raw <= MAX_META_RAW_BYTES
        and c.meta_codec in (_lo.CODEC_NONE, _lo.CODEC_ZSTD)
        and 1 <= c.meta_stored <= c.meta_raw
        and (c.meta_codec != _lo.CODEC_NONE or c.meta_stored == c.meta_raw)
    ):
        raise CorruptData(
            f"{what}: entry table of {c.n_entries} entries: stored {c.meta_stored}, "
            f"raw {c.meta_raw}, codec {c.meta_codec}",
            where=where,
        )


# --------------------------------------------------------------------------
# frames: one block decompression, then a record by offset


def decode_frame(frame: FrameIndex, stored: Buffer, *, where: str) -> bytes:
    """A frame's raw batches from its stored bytes (length, CRC, then zstd; bounded)."""
    return _lo.decode_block(frame.block_index(), stored, where=where)


class FrameBatches:
    """The batches of one decompressed frame, found by offset without decoding them all.

    Built from the raw bytes by one walk along the batches' length fields:
    each batch must be at least a header long and lie inside the frame, the
    offsets must run ``first_offset..last_offset`` with no gap and the batches
    fill the frame exactly. Everything else about a batch (version, flags,
    CRC, columns, timestamps) is checked when it is decoded (:meth:`batch`),
    so a lookup pays for the one batch it reads.
    """

    __slots__ = ("_bases", "_positions", "frame", "raw", "where")

    def __init__(self, frame: FrameIndex, raw: bytes, *, where: str) -> None:
        end = len(raw)
        if end != frame.raw_length:
            raise CorruptData(
                f"frame of {end} raw bytes, the index says {frame.raw_length}", where=where
            )
        positions = array("q")
        bases = array("q")
        pos = 0
        expected = frame.first_offset
        unpack = _BATCH_LEN_BASE_COUNT.unpack_from
        limit = end - _batch.HEADER_SIZE
        while pos <= limit:
            length, base, count = unpack(raw, pos)
            if base != expected or length < _batch.HEADER_SIZE or count < 1:
                break
            positions.append(pos)
            bases.append(base)
            expected = base + count
            pos += length
        if pos != end or expected != frame.last_offset + 1:
            raise CorruptData(
                f"batches at byte {pos} of {end}: offsets {frame.first_offset}..{expected - 1} "
                f"where the frame holds {frame.first_offset}..{frame.last_offset}",
                where=where,
            )
        self.frame = frame
        self.raw = raw
        self.where = where
        self._positions = positions
        self._bases = bases

    def __len__(self) -> int:
        return len(self._positions)

    def locate(self, offset: int) -> tuple[int, int]:
        """``(position, length)`` in :attr:`raw` of the batch holding ``offset``."""
        if not self.frame.first_offset <= offset <= self.frame.last_offset:
            raise InvalidInput(f"offset {offset} is not in this frame")
        k = bisect_right(self._bases, offset) - 1
        pos = self._positions[k]
        end = self._positions[k + 1] if k + 1 < len(self._positions) else len(self.raw)
        return pos, end - pos

    def batch(self, offset: int) -> RecordBatch:
        """The decoded (CRC-checked) batch holding ``offset``."""
        pos, length = self.locate(offset)
        where = f"{self.where}+{pos}"
        b = _batch.decode_batch(memoryview(self.raw)[: pos + length], pos, where=where)
        f = self.frame
        if b.header.min_timestamp < f.min_ts or b.header.max_timestamp > f.max_ts:
            raise CorruptData("batch timestamps outside the frame's", where=where)
        return b

    def record(self, offset: int) -> Record:
        b = self.batch(offset)
        return b.records(offset)[0]

    def batches_from(self, offset: int) -> Iterator[memoryview]:
        """The raw batches from the one holding ``offset`` on, as views (a fetch response)."""
        self.locate(offset)  # in this frame, else InvalidInput
        view = memoryview(self.raw)
        positions = self._positions
        k = bisect_right(self._bases, offset) - 1
        for j in range(k, len(positions)):
            end = positions[j + 1] if j + 1 < len(positions) else len(self.raw)
            yield view[positions[j] : end]


class FrameCache:
    """A bounded LRU of decompressed frames (:class:`FrameBatches`), by raw bytes held.

    A reader asks for ``(segment, frame)``; on a miss ``load()`` reads,
    decompresses and walks the frame. At most ``max_bytes`` of raw frames stay
    (one frame larger than that is returned but not kept), so serving one
    record never holds more than one frame beyond the bound.
    """

    def __init__(self, max_bytes: int = 8 * 1024 * 1024) -> None:
        if max_bytes < 0:
            raise InvalidInput("max_bytes must be >= 0")
        self._max = max_bytes
        self._items: OrderedDict[tuple[object, int], FrameBatches] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def bytes(self) -> int:
        return self._bytes

    def peek(self, key: tuple[object, int]) -> FrameBatches | None:
        """The cached frame of ``key`` (counted as a hit, made the most recent), or None
        (not counted: the caller then reads the frame through :meth:`get`)."""
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
            self.hits += 1
        return found

    def get(self, key: tuple[object, int], load: Callable[[], FrameBatches]) -> FrameBatches:
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
            self.hits += 1
            return found
        self.misses += 1
        fb = load()
        size = len(fb.raw)
        if size <= self._max:
            self._items[key] = fb
            self._bytes += size
            while self._bytes > self._max:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old.raw)
        return fb

    def forget(self, segment: object) -> None:
        """Drop every frame of ``segment`` (its file was replaced or deleted)."""
        for key in [k for k in self._items if k[0] == segment]:
            self._bytes -= len(self._items.pop(key).raw)


# --------------------------------------------------------------------------
# the entry table


@dataclass(frozen=True, slots=True)
class ChunkEntries:
    """A chunk's decoded entry table: per LSN what its journal entry holds besides records."""

    chunk: ChunkIndex
    kinds: bytes
    flags: bytes
    parts: array[int]
    frames: array[int]
    counts: array[int]
    raw_lengths: array[int]
    append_times: list[int]
    #: per entry: its base offset and its batch's position in its frame's raw bytes
    base_offsets: list[int]
    raw_positions: list[int]
    extras: bytes
    extra_starts: list[int]
    #: each entry's LSN when these are some of the chunk's entries (one frame's:
    #: :func:`decode_frame_entries`); None: entry ``i`` is LSN ``chunk.first_lsn + i``
    lsns: list[int] | None = None

    def extra_bytes(self, i: int) -> bytes:
        return self.extras[self.extra_starts[i] : self.extra_starts[i + 1]]

    def lsn(self, i: int) -> int:
        return self.chunk.first_lsn + i if self.lsns is None else self.lsns[i]


def _column(typecode: str, data: memoryview, count: int, cur: int) -> tuple[array[int], int]:
    a = array(typecode)
    size = a.itemsize * count
    a.frombytes(data[cur : cur + size])
    if a.itemsize > 1 and struct.pack("=H", 1) != struct.pack("<H", 1):  # pragma: no cover
        a.byteswap()
    return a, cur + size


def decode_entries(
    directory: SegmentDirectory, chunk_no: int, stored: Buffer, *, where: str
) -> ChunkEntries:
    """Decode and check a chunk's entry table from its stored bytes.

    Checks the CRC, decompresses into at most ``meta_raw`` bytes, then every
    rule: kinds and flags, partitions and frames that exist and belong to
    each other, each frame's entries filling its records and raw bytes
    exactly and in order, extras adding up, and append times within i64.
    """
    t = _TableColumns.decode(directory, chunk_no, stored, where=where)
    c = t.chunk
    times = [(x + _I64_SPAN) % _U64_SPAN - _I64_SPAN for x in accumulate(t.deltas)]
    base_offsets, raw_positions = t.walk(range(c.n_entries), c.frames)
    return ChunkEntries(
        c,
        t.kinds,
        t.flags,
        t.parts,
        t.frames,
        t.counts,
        t.raw_lengths,
        times,
        base_offsets,
        raw_positions,
        t.extras,
        list(accumulate(t.extra_lengths, initial=0)),
    )


def decode_frame_entries(
    directory: SegmentDirectory, chunk_no: int, stored: Buffer, frame_no: int, *, where: str
) -> ChunkEntries:
    """The entries of chunk ``chunk_no`` whose batches frame ``frame_no`` holds, and only
    those: what a read by offset needs, without walking every entry of the table.

    A cold read of one record decodes the table of the frame's chunk; with
    one-record entries that is ~26,000 entries of an 8 MiB chunk, tens of
    milliseconds in Python for the ~1,000 of one 256 KiB frame. Here only
    those are walked. The result's entry ``i`` is LSN ``lsns[i]``, its
    columns hold those entries only. Checked as :func:`decode_entries` checks
    them (the CRC and shape of the table, then every rule of these entries,
    and that they fill the frame exactly); the rules that span frames (a
    partition's entries never go back to an earlier frame, every other frame
    filled) are left to the whole table's decode (reads by LSN, verify).
    """
    t = _TableColumns.decode(directory, chunk_no, stored, where=where)
    c = t.chunk
    if not c.first_frame <= frame_no < c.first_frame + c.n_frames:
        raise CorruptData(f"frame {frame_no} is not chunk {chunk_no}'s", where=where)
    frames = t.frames
    # The low byte of every entry's frame number, one byte per entry (a C-speed
    # slice of the column): a search for it finds the candidates, and the whole
    # number confirms each (a chunk of under 256 frames has no false ones).
    lanes = frames.tobytes()
    low = lanes[0::4] if sys.byteorder == "little" else lanes[3::4]
    byte = frame_no & 0xFF
    indexes: list[int] = []
    at = low.find(byte)
    while at >= 0:
        if frames[at] == frame_no:
            indexes.append(at)
        at = low.find(byte, at + 1)
    # The rules of these entries, checked a column at a time (C-speed counts,
    # sums and maps; no Python step per entry): what the whole table's walk
    # checks of them, all entries of one frame.
    f = directory.frames[frame_no]
    m = len(indexes)
    kinds = bytes(_gather(t.kinds, indexes))
    flags = bytes(_gather(t.flags, indexes))
    parts = _gather(t.parts, indexes)
    counts = _gather(t.counts, indexes)
    raw_lengths = _gather(t.raw_lengths, indexes)
    tails = _gather(t.extra_lengths, indexes)
    kind = _KIND_OF_ORIGIN.get(f.origin, KIND_BLOCK)
    ok_flags = (
        _entry.FLAG_PRODUCER if kind == _entry.KIND_DATA else _entry.FLAG_END_OF_SOURCE_OBJECT
    )
    if kind == _entry.KIND_DATA:  # a producer's 16 bytes exactly when flagged
        tails_ok = not any(map(operator.ne, tails, map(_PRODUCER_TAIL.__getitem__, flags)))
    else:  # source coordinates
        tails_ok = not m or min(tails) >= 2 + _SOURCE_TAIL.size
    if (
        m != f.n_entries
        or kinds.count(kind) != m
        or parts.count(f.part) != m
        or any(x & ~ok_flags for x in set(flags))
        or (m and min(counts) < 1)
        or sum(counts) != f.last_offset + 1 - f.first_offset
        or sum(raw_lengths) != f.raw_length
        or not tails_ok
    ):
        raise CorruptData(
            f"{t.what}: the {m} entries of frame {frame_no} break its rules or do not fill it",
            where=where,
        )
    last = indexes[-1] + 1 if indexes else 0
    times = _gather(list(islice(accumulate(t.deltas), last)), indexes)
    if sum(tails):
        starts = _gather(list(islice(accumulate(t.extra_lengths, initial=0), last)), indexes)
        picked = [t.extras[a : a + n] for a, n in zip(starts, tails, strict=True)]
        extras = b"".join(picked)
    else:  # data entries of no producer: no extras
        extras = b""
    return ChunkEntries(
        c,
        kinds,
        flags,
        array("I", parts),
        array("I", (frame_no,) * m),
        array("I", counts),
        array("I", raw_lengths),
        [(x + _I64_SPAN) % _U64_SPAN - _I64_SPAN for x in times],
        list(accumulate(counts[:-1], initial=f.first_offset)) if m else [],
        list(accumulate(raw_lengths[:-1], initial=0)) if m else [],
        extras,
        list(accumulate(tails, initial=0)),
        [c.first_lsn + i for i in indexes],
    )


def _gather(column: Sequence[int], indexes: list[int]) -> list[int]:
    """``[column[i] for i in indexes]`` at C speed."""
    if len(indexes) > 1:
        return list(operator.itemgetter(*indexes)(column))
    return [column[i] for i in indexes]


@dataclass(frozen=True, slots=True)
class _TableColumns:
    """A chunk's entry table as its columns, its CRC and shape checked (not its rules)."""

    directory: SegmentDirectory
    chunk: ChunkIndex
    what: str
    where: str
    kinds: bytes
    flags: bytes
    parts: array[int]
    frames: array[int]
    counts: array[int]
    raw_lengths: array[int]
    extra_lengths: array[int]
    deltas: array[int]
    extras: bytes

    @classmethod
    def decode(
        cls, directory: SegmentDirectory, chunk_no: int, stored: Buffer, *, where: str
    ) -> _TableColumns:
        c = directory.chunks[chunk_no]
        what = f"chunk {chunk_no} entry table"
        probe = BlockIndex(
            "t", 0, 0, 0, 1, 0, 0, c.meta_offset, c.meta_stored, c.meta_raw, c.meta_codec,
            c.meta_crc,
        )  # fmt: skip
        raw = _lo.decode_block(probe, stored, where=f"{where} {what}")
        n = c.n_entries
        view = memoryview(raw)
        count_field, extras_len = _META_HEAD.unpack_from(view, 0)
        if count_field != n or _META_HEAD.size + n * _META_PER_ENTRY + extras_len != len(raw):
            raise CorruptData(
                f"{what}: {count_field} entries and {extras_len} bytes of extras in "
                f"{len(raw)} bytes, for {n} LSNs",
                where=where,
            )
        cur = _META_HEAD.size
        kinds = bytes(view[cur : cur + n])
        cur += n
        flags = bytes(view[cur : cur + n])
        cur += n
        parts, cur = _column("I", view, n, cur)
        frames, cur = _column("I", view, n, cur)
        counts, cur = _column("I", view, n, cur)
        raw_lengths, cur = _column("I", view, n, cur)
        extra_lengths, cur = _column("I", view, n, cur)
        deltas, cur = _column("Q", view, n, cur)
        extras = bytes(view[cur:])
        total = sum(extra_lengths)
        if total != len(extras):
            raise CorruptData(f"{what}: extras add up to {total} bytes", where=where)
        return cls(
            directory, c, what, where, kinds, flags, parts, frames, counts, raw_lengths,
            extra_lengths, deltas, extras,
        )  # fmt: skip

    def walk(self, indexes: Iterable[int], filled: Iterable[int]) -> tuple[list[int], list[int]]:
        """Check the rules of entries ``indexes`` (in LSN order); then that each frame of
        ``filled`` is exactly filled by them. Their base offsets and raw positions."""
        base_offsets: list[int] = []
        raw_positions: list[int] = []
        c, what, where = self.chunk, self.what, self.where
        kinds, flags, parts, frames = self.kinds, self.flags, self.parts, self.frames
        counts, raw_lengths, extra_lengths = self.counts, self.raw_lengths, self.extra_lengths
        first_frame = c.first_frame
        n_frames = c.n_frames
        fr = self.directory.frames
        chunk_frames = [fr[i] for i in c.frames]
        # per frame of the chunk: its partition and the entry kind its origin takes
        frame_parts = [f.part for f in chunk_frames]
        frame_kinds = [_KIND_OF_ORIGIN.get(f.origin, KIND_BLOCK) for f in chunk_frames]
        # running state per frame of the chunk: entries seen, next offset, raw position
        seen = [0] * n_frames
        next_off = [f.first_offset for f in chunk_frames]
        next_pos = [0] * n_frames
        last_frame_of_part: dict[int, int] = {}
        kind_data = _entry.KIND_DATA
        not_data_flags = ~_entry.FLAG_PRODUCER
        not_source_flags = ~_entry.FLAG_END_OF_SOURCE_OBJECT
        min_source_tail = 2 + _SOURCE_TAIL.size
        # One pass in Python per entry (a cold read decodes a whole table, or
        # one frame's entries): the rules as lean as they stay readable, the
        # message built only when one fails.
        for i in indexes:
            kind, fl, part, fno, cnt = kinds[i], flags[i], parts[i], frames[i], counts[i]
            if fno == _NONE:
                # not a batch entry: the whole journal entry is in its extras
                if part != _NONE or cnt or raw_lengths[i] or kind not in _KEPT_WHOLE:
                    raise CorruptData(
                        f"{what}: entry {i} (kind {kind}) without a frame", where=where
                    )
                base_offsets.append(0)
                raw_positions.append(0)
                continue
            k = fno - first_frame
            if not 0 <= k < n_frames or frame_parts[k] != part:
                raise CorruptData(
                    f"{what}: entry {i}: frame {fno} of partition {part} is not this chunk's",
                    where=where,
                )
            if (
                kind != frame_kinds[k]
                or fl & (not_data_flags if kind == kind_data else not_source_flags)
                or cnt < 1
            ):
                raise CorruptData(
                    f"{what}: entry {i}: kind {kind}, flags 0x{fl:02x}, count {cnt} in a frame "
                    f"of origin {fr[fno].origin}",
                    where=where,
                )
            tail_len = extra_lengths[i]
            if kind == kind_data:
                if tail_len != (16 if fl else 0):
                    raise CorruptData(
                        f"{what}: entry {i}: {tail_len} bytes of producer", where=where
                    )
            elif tail_len < min_source_tail:
                raise CorruptData(f"{what}: entry {i}: no source coordinates", where=where)
            if last_frame_of_part.setdefault(part, fno) != fno:
                if last_frame_of_part[part] > fno:
                    raise CorruptData(
                        f"{what}: entry {i} goes back to an earlier frame", where=where
                    )
                last_frame_of_part[part] = fno
            off = next_off[k]
            pos = next_pos[k]
            base_offsets.append(off)
            raw_positions.append(pos)
            next_off[k] = off = off + cnt
            next_pos[k] = pos = pos + raw_lengths[i]
            seen[k] = s = seen[k] + 1
            f = chunk_frames[k]
            if off > f.last_offset + 1 or pos > f.raw_length or s > f.n_entries:
                raise CorruptData(f"{what}: entry {i} overruns frame {fno}", where=where)
        for fno in filled:
            k = fno - first_frame
            f = fr[fno]
            if (seen[k], next_off[k], next_pos[k]) != (
                f.n_entries,
                f.last_offset + 1,
                f.raw_length,
            ):
                raise CorruptData(f"{what}: frame {fno} is not filled by its entries", where=where)
        return base_offsets, raw_positions


def wal_entry(
    directory: SegmentDirectory,
    entries: ChunkEntries,
    i: int,
    frame_raw: Callable[[int], bytes],
    frame_stored: Callable[[int], bytes],
    *,
    where: str,
) -> bytes:
    """The journal entry bytes of entry ``i`` of a chunk, exactly as the journal wrote them.

    ``frame_raw(n)`` gives frame ``n``'s raw batches (a data or mirror
    frame), ``frame_stored(n)`` its stored bytes (a block entry's frame).
    The result is checked as the journal checks an entry (CRC, structure, the
    batch header agreeing with it), so a damaged table cannot make up an entry.
    """
    lsn = entries.lsn(i)
    fno = entries.frames[i]
    kept = entries.extra_bytes(i)
    if fno == _NONE:
        e = decode_any_entry(kept, where=where)
        if e.length != len(kept) or e.lsn != lsn or e.append_time != entries.append_times[i]:
            raise CorruptData(f"LSN {lsn}: its kept entry is of another LSN or size", where=where)
        if e.kind != entries.kinds[i] or _is_batch_entry(e):
            raise CorruptData(f"LSN {lsn}: kept entry of kind {e.kind}", where=where)
        return kept
    f = directory.frames[fno]
    kind = entries.kinds[i]
    if kind == KIND_BLOCK:
        head = memoryview(kept)
        try:
            (rlen,) = _U16.unpack_from(head, 0)
            region = _utf8(head[2 : 2 + rlen], "source region", where)
            seq, epoch = _SOURCE_TAIL.unpack_from(head, 2 + rlen)
        except struct.error:
            raise CorruptData(f"LSN {lsn}: source coordinates truncated", where=where) from None
        if 2 + rlen + _SOURCE_TAIL.size != len(kept):
            raise CorruptData(f"LSN {lsn}: source coordinates of a wrong size", where=where)
        source = SourceCoords(
            region, seq, epoch, bool(entries.flags[i] & _entry.FLAG_END_OF_SOURCE_OBJECT)
        )
        stored = frame_stored(fno)
        actual = crc32c(stored)
        if actual != f.crc:
            # the frame is passed on compressed, so nothing else would look at its bytes
            raise CorruptData(
                f"frame {fno}: CRC mismatch (stored {f.crc:08x}, computed {actual:08x})",
                where=where,
            )
        try:
            return encode_block_entry(
                lsn=lsn,
                topic=f.topic,
                partition=f.partition,
                append_time=entries.append_times[i],
                source=source,
                index=f.block_index(),
                stored=stored,
                nulls=f.nulls,
            )
        except InvalidInput as exc:
            raise CorruptData(f"LSN {lsn}: {exc}", where=where) from None
    raw = frame_raw(fno)
    pos = entries.raw_positions[i]
    payload = memoryview(raw)[pos : pos + entries.raw_lengths[i]]
    t = f.topic.encode("utf-8")
    rest = (
        _entry.ENTRY_REST.pack(
            lsn,
            kind,
            entries.flags[i],
            len(t),
            f.partition,
            entries.base_offsets[i],
            entries.counts[i],
            entries.append_times[i],
        )
        + t
        + kept
    )
    length = 8 + len(rest) + len(payload)
    if length > _entry.MAX_ENTRY_BYTES:
        raise CorruptData(f"LSN {lsn}: an entry of {length} bytes", where=where)
    out = b"".join(
        (_entry.ENTRY_LEN_CRC.pack(length, _entry.entry_crc(rest, payload)), rest, payload)
    )
    e = _entry.decode_entry(out, where=f"{where} LSN {lsn}", verify=False)
    if e.length != length:  # pragma: no cover - decode_entry checks the length
        raise CorruptData(f"LSN {lsn}: entry length", where=where)
    return out


# --------------------------------------------------------------------------
# encoding


@dataclass(slots=True)
class _FrameBuild:
    part: int
    origin: int
    seq: int
    first_offset: int
    next_offset: int
    min_ts: int
    max_ts: int
    raw_length: int = 0
    nulls: bool = False
    n_entries: int = 0
    batches: list[bytes | memoryview] = field(default_factory=list)
    #: ORIGIN_BLOCK: the block as fetched
    block: BlockEntry | None = None


class SegmentEncoder:
    """Builds a compressed segment from the entries of one sealed journal segment.

    Feed every entry in LSN order (:meth:`add`, from ``base_lsn`` on); each
    call returns the bytes to append to the output (the header first, then a
    whole chunk each time one closes, else nothing), and :meth:`finish`
    returns the rest: the last chunk, the directory and the trailer. Memory
    stays at about one chunk of raw entries (``chunk_raw_bytes``) whatever the
    segment's size.

    Batch entries are grouped per partition into frames of at most
    ``frame_raw_bytes`` of raw batches (a run is cut wherever its offsets do
    not continue), compressed with the log object's block encoding at
    ``level``; a :class:`BlockEntry` becomes a frame of its own, kept as
    fetched. A partition's offsets must never go back within a segment.
    """

    def __init__(
        self,
        base_lsn: int,
        *,
        wal_version: int = _entry.SEGMENT_VERSION,
        level: int = _lo.DEFAULT_LEVEL,
        frame_raw_bytes: int = DEFAULT_FRAME_RAW_BYTES,
        chunk_raw_bytes: int = DEFAULT_CHUNK_RAW_BYTES,
    ) -> None:
        if not 1 <= base_lsn <= _U64_MAX:
            raise InvalidInput("base_lsn must be a u64 >= 1")
        if wal_version not in WAL_VERSIONS:
            raise InvalidInput(f"journal segment version {wal_version}")
        if not _batch.HEADER_SIZE <= frame_raw_bytes <= MAX_FRAME_RAW_BYTES:
            raise InvalidInput(f"frame_raw_bytes must be within 40..{MAX_FRAME_RAW_BYTES}")
        if not 1 <= chunk_raw_bytes <= MAX_CHUNK_RAW_BYTES:
            raise InvalidInput(f"chunk_raw_bytes must be within 1..{MAX_CHUNK_RAW_BYTES}")
        with _lo.lend_compressor(level):  # checks the level
            pass
        self._base_lsn = base_lsn
        self._wal_version = wal_version
        self._level = level
        self._frame_max = frame_raw_bytes
        self._chunk_max = chunk_raw_bytes
        self._next_lsn = base_lsn
        self._pos = HEADER_SIZE
        self._started = False
        self._finished = False
        self._parts: dict[tuple[str, int], int] = {}
        self._part_list: list[tuple[str, int]] = []
        self._tlen: list[int] = []
        #: per partition: the offset after its last record so far
        self._part_next: dict[int, int] = {}
        self._chunks: list[bytes] = []
        self._frames: list[bytes] = []
        self._n_frames = 0
        self._last_time = 0
        self._wal_bytes = 0
        self._new_chunk()

    def _new_chunk(self) -> None:
        self._chunk_first = self._next_lsn
        self._chunk_raw = 0
        self._open: dict[int, _FrameBuild] = {}
        self._builds: list[_FrameBuild] = []
        # per entry: kind, flags, part, frame build (or None), count, raw_len, time, extra
        self._rows: list[tuple[int, int, int, _FrameBuild | None, int, int, int, bytes]] = []

    @property
    def wal_bytes(self) -> int:
        """Bytes of the journal entries added so far (with the segment header)."""
        return _entry.SEGMENT_HEADER_SIZE + self._wal_bytes

    def _part(self, topic: str, partition: int) -> int:
        key = (topic, partition)
        p = self._parts.get(key)
        if p is None:
            validate_topic(topic)
            p = self._parts[key] = len(self._part_list)
            self._part_list.append(key)
            self._tlen.append(len(topic.encode("utf-8")))
        return p

    def add(self, e: AnyEntry, raw: bytes | None = None) -> bytes:
        """Add the next entry; the bytes to append to the file (often none).

        ``raw``: the journal bytes ``e`` was decoded from (by ``decode_entry``,
        ``decode_data_entry`` or :func:`decode_any_entry`), which saves
        encoding it again; without them the entry is encoded from its fields.
        """
        if self._finished:
            raise InvalidInput("the segment is finished")
        if e.lsn != self._next_lsn:
            raise InvalidInput(f"entry LSN {e.lsn}, expected {self._next_lsn}")
        out = b""
        if not self._started:
            self._started = True
            out = _HEADER.pack(MAGIC, VERSION, self._wal_version, self._base_lsn)
        # the exact bytes (encoding checks every field's range too)
        wal = encode_any_entry(e) if raw is None else bytes(raw)
        if len(wal) != e.length:
            raise InvalidInput(f"LSN {e.lsn}: an entry of {e.length} bytes in {len(wal)} bytes")
        if raw is None and isinstance(e, Entry) and _is_batch_entry(e):
            try:
                h = _batch.read_header(e.payload, 0, where=f"LSN {e.lsn}")
            except CorruptData as exc:
                raise InvalidInput(exc.reason) from None
            if (h.length, h.base_offset, h.count) != (len(e.payload), e.base_offset, e.count):
                raise InvalidInput(f"LSN {e.lsn}: the entry disagrees with its batch")
        if isinstance(e, BlockEntry):
            self._add_block(e)
        elif _is_batch_entry(e):
            self._add_batches(e, wal)
        else:
            self._rows.append((e.kind, 0, _NONE, None, 0, 0, e.append_time, wal))
        self._next_lsn += 1
        self._wal_bytes += len(wal)
        self._chunk_raw += len(wal)
        self._last_time = e.append_time
        if self._chunk_raw >= self._chunk_max:
            out += self._close_chunk()
        return out

    def _check_offsets(self, part: int, topic: str, partition: int, first: int) -> None:
        prev = self._part_next.get(part)
        if prev is not None and first < prev:
            raise InvalidInput(
                f"{topic}/{partition}: offset {first} after {prev - 1}: offsets go back"
            )

    def _add_batches(self, e: Entry, wal: bytes) -> None:
        # The entry was checked against its batch header when it was decoded (or by
        # add()), so the header's fields are read here without checking them again.
        part = self._part(e.topic, e.partition)
        base, count = e.base_offset, e.count
        prev = self._part_next.get(part)
        if prev is not None and base < prev:
            raise InvalidInput(
                f"{e.topic}/{e.partition}: offset {base} after {prev - 1}: offsets go back"
            )
        size = len(e.payload)
        end = len(wal)
        # the payload as a view of the entry's bytes: no copy
        payload = memoryview(wal)[end - size :]
        bflags, min_ts, max_ts = _BATCH_FLAGS_TS.unpack_from(wal, end - size)
        origin = ORIGIN_DATA if e.kind == _entry.KIND_DATA else ORIGIN_MIRROR
        cur = self._open.get(part)
        if (
            cur is None
            or cur.origin != origin
            or cur.next_offset != base
            or cur.raw_length + size > self._frame_max
        ):
            cur = _FrameBuild(part, origin, len(self._builds), base, base, min_ts, max_ts)
            self._builds.append(cur)
            self._open[part] = cur
        cur.batches.append(payload)
        cur.next_offset = self._part_next[part] = base + count
        cur.min_ts = min(cur.min_ts, min_ts)
        cur.max_ts = max(cur.max_ts, max_ts)
        cur.raw_length += size
        cur.n_entries += 1
        if bflags & _batch.FLAG_NULLS:
            cur.nulls = True
        # the bytes between the topic and the payload: a producer's or a source's
        tail = wal[_entry.ENTRY_HEADER_SIZE + self._tlen[part] : end - size]
        self._rows.append((e.kind, wal[17], part, cur, count, size, e.append_time, tail))

    def _add_block(self, e: BlockEntry) -> None:
        part = self._part(e.topic, e.partition)
        self._check_offsets(part, e.topic, e.partition, e.first_offset)
        self._open.pop(part, None)
        b = _FrameBuild(
            part, ORIGIN_BLOCK, len(self._builds), e.first_offset, e.next_offset, e.min_ts,
            e.max_ts, e.raw_length, e.nulls, 1, [], e,
        )  # fmt: skip
        self._builds.append(b)
        self._part_next[part] = e.next_offset
        flags = _entry.FLAG_END_OF_SOURCE_OBJECT if e.source.end_of_object else 0
        self._rows.append(
            (KIND_BLOCK, flags, part, b, e.record_count, e.raw_length, e.append_time,
             _source_tail(e.source))
        )  # fmt: skip

    def _close_chunk(self) -> bytes:
        if not self._rows:
            return b""
        builds = sorted(self._builds, key=lambda b: (b.part, b.seq))
        number = {id(b): self._n_frames + k for k, b in enumerate(builds)}
        out: list[bytes] = []
        frame_rows: list[bytes] = []
        with _lo.lend_compressor(self._level) as cctx:
            for b in builds:
                if b.block is not None:
                    stored, codec, crc = b.block.stored, b.block.codec, b.block.crc
                else:
                    raw = b"".join(b.batches)
                    stored, codec = _lo.compress_block(cctx, raw)
                    crc = crc32c(stored)
                frame_rows.append(
                    _FRAME.pack(
                        b.part,
                        b.origin,
                        FRAME_NULLS if b.nulls else 0,
                        b.first_offset,
                        b.next_offset - 1,
                        b.next_offset - b.first_offset,
                        b.min_ts,
                        b.max_ts,
                        self._pos,
                        len(stored),
                        b.raw_length,
                        codec,
                        crc,
                        b.n_entries,
                    )
                )
                out.append(stored)
                self._pos += len(stored)
            meta_raw = self._encode_rows(number)
            meta, meta_codec = _lo.compress_block(cctx, meta_raw)
        n = len(self._rows)
        self._chunks.append(
            _CHUNK.pack(
                self._chunk_first,
                self._chunk_first + n - 1,
                self._n_frames,
                len(builds),
                self._pos,
                len(meta),
                len(meta_raw),
                meta_codec,
                crc32c(meta),
            )
        )
        self._frames.extend(frame_rows)
        self._n_frames += len(builds)
        self._pos += len(meta)
        out.append(meta)
        self._new_chunk()
        return b"".join(out)

    def _encode_rows(self, number: dict[int, int]) -> bytes:
        rows = self._rows
        n = len(rows)
        kinds = bytes(r[0] for r in rows)
        flags = bytes(r[1] for r in rows)
        parts = array("I", (r[2] for r in rows))
        frames = array("I", (_NONE if r[3] is None else number[id(r[3])] for r in rows))
        counts = array("I", (r[4] for r in rows))
        raw_lengths = array("I", (r[5] for r in rows))
        extra_lengths = array("I", (len(r[7]) for r in rows))
        times = [r[6] for r in rows]
        # differences modulo 2**64: any i64 times, however far apart, and small numbers
        # (which compress to almost nothing) for the usual ones
        deltas = array(
            "Q", [times[0] % _U64_SPAN, *((b - a) % _U64_SPAN for a, b in pairwise(times))]
        )
        cols = [parts, frames, counts, raw_lengths, extra_lengths, deltas]
        if struct.pack("=H", 1) != struct.pack("<H", 1):  # pragma: no cover - big-endian
            for c in cols:
                c.byteswap()
        extras = b"".join(r[7] for r in rows)
        return b"".join(
            (_META_HEAD.pack(n, len(extras)), kinds, flags, *(c.tobytes() for c in cols), extras)
        )

    def finish(self) -> bytes:
        """The rest of the file: the last chunk, the directory and the trailer."""
        if self._finished:
            raise InvalidInput("the segment is finished")
        if self._next_lsn == self._base_lsn:
            raise InvalidInput("a compressed segment holds at least one entry")
        out = self._close_chunk()
        self._finished = True
        parts = b"".join(
            _U16.pack(len(t.encode())) + t.encode() + _PART.pack(p) for t, p in self._part_list
        )
        body = (
            _DIR_FIXED.pack(
                self._base_lsn,
                self._next_lsn - 1,
                self._last_time,
                self.wal_bytes,
                len(self._part_list),
                len(self._chunks),
                self._n_frames,
                self._wal_version,
            )
            + parts
            + b"".join(self._chunks)
            + b"".join(self._frames)
        )
        directory = body + _PART.pack(crc32c(body))
        if len(directory) > MAX_DIRECTORY_BYTES:
            raise InvalidInput(f"a directory of {len(directory)} bytes")
        trailer = _TRAILER.pack(self._pos, len(directory), MAGIC)
        return out + directory + trailer


# --------------------------------------------------------------------------
# whole files (the rewriter, tools, tests)


def iter_wal_entries(wal: Buffer, *, where: str = "segment") -> Iterator[AnyEntry]:
    """The entries of a journal segment's bytes (versions 1-3), checked, up to a zero tail."""
    if len(wal) < _entry.SEGMENT_HEADER_SIZE:
        raise CorruptData("segment header truncated", where=where)
    magic, version, base_lsn = _WAL_HEADER.unpack_from(wal)
    if magic != _WAL_MAGIC or version not in WAL_VERSIONS:
        raise CorruptData(
            f"not a journal segment ({bytes(magic)!r} version {version})", where=where
        )
    pos = _entry.SEGMENT_HEADER_SIZE
    lsn = base_lsn
    while pos < len(wal) and not _entry.is_zero_tail(wal, pos):
        e = decode_any_entry(wal, pos, where=f"{where}@{pos}")
        if e.lsn != lsn:
            raise CorruptData(f"entry LSN {e.lsn} where {lsn} comes next", where=f"{where}@{pos}")
        if isinstance(e, BlockEntry) and version != WAL_VERSION_BLOCKS:
            raise CorruptData(f"a block entry in a version {version} segment", where=where)
        yield e
        pos += e.length
        lsn += 1


def compress_segment(
    wal: Buffer,
    *,
    level: int = _lo.DEFAULT_LEVEL,
    frame_raw_bytes: int = DEFAULT_FRAME_RAW_BYTES,
    chunk_raw_bytes: int = DEFAULT_CHUNK_RAW_BYTES,
    where: str = "segment",
) -> bytes:
    """The compressed segment of a sealed journal segment's bytes (all in memory)."""
    return b"".join(
        iter_compressed(
            wal,
            level=level,
            frame_raw_bytes=frame_raw_bytes,
            chunk_raw_bytes=chunk_raw_bytes,
            where=where,
        )
    )


def iter_compressed(
    wal: Buffer,
    *,
    level: int = _lo.DEFAULT_LEVEL,
    frame_raw_bytes: int = DEFAULT_FRAME_RAW_BYTES,
    chunk_raw_bytes: int = DEFAULT_CHUNK_RAW_BYTES,
    where: str = "segment",
    tick: Callable[[], None] | None = None,
) -> Generator[bytes, None, None]:
    """The compressed segment of a sealed journal segment, a piece at a time (a chunk
    each): what a rewriter writes to its temporary file, holding about one chunk.

    ``tick`` is called after every :data:`TICK_ENTRIES` entries: the journal's
    rewriter paces itself there (a sleep in its worker thread) and notices a
    cancellation; it may raise, which ends the iteration.
    """
    if len(wal) < _entry.SEGMENT_HEADER_SIZE:
        raise CorruptData("segment header truncated", where=where)
    _, version, base_lsn = _WAL_HEADER.unpack_from(wal)
    enc = SegmentEncoder(
        base_lsn,
        wal_version=version if version in WAL_VERSIONS else 2,
        level=level,
        frame_raw_bytes=frame_raw_bytes,
        chunk_raw_bytes=chunk_raw_bytes,
    )
    for n, (e, raw) in enumerate(_iter_wal(wal, where), 1):
        piece = enc.add(e, raw)
        if piece:
            yield piece
        if tick is not None and not n % TICK_ENTRIES:
            tick()
    yield enc.finish()


def _iter_wal(wal: Buffer, where: str) -> Iterator[tuple[AnyEntry, bytes]]:
    """The entries of a journal segment with the bytes of each (ordinary data entries on
    the journal's fast path, ``decode_data_entry``; anything else as the journal checks it)."""
    # a view, not a copy: the rewriter hands a map of the whole segment
    buf: bytes | memoryview = wal if isinstance(wal, bytes) else memoryview(wal)
    if len(buf) < _entry.SEGMENT_HEADER_SIZE:
        raise CorruptData("segment header truncated", where=where)
    magic, version, base_lsn = _WAL_HEADER.unpack_from(buf)
    if magic != _WAL_MAGIC or version not in WAL_VERSIONS:
        raise CorruptData(
            f"not a journal segment ({bytes(magic)!r} version {version})", where=where
        )
    pos = _entry.SEGMENT_HEADER_SIZE
    lsn = base_lsn
    fast = _entry.decode_data_entry
    while pos < len(buf) and not (buf[pos] == 0 and _entry.is_zero_tail(buf, pos)):
        e: AnyEntry | None = fast(buf, pos)
        if e is None:
            e = decode_any_entry(buf, pos, where=f"{where}@{pos}")
            if isinstance(e, BlockEntry) and version != WAL_VERSION_BLOCKS:
                raise CorruptData(f"a block entry in a version {version} segment", where=where)
        if e.lsn != lsn:
            raise CorruptData(f"entry LSN {e.lsn} where {lsn} comes next", where=f"{where}@{pos}")
        yield e, bytes(buf[pos : pos + e.length])
        pos += e.length
        lsn += 1


class CompressedSegment:
    """A compressed segment held in memory (or mapped): directory, frames, entries.

    The journal reads the same structures with ``pread`` (``docs/at-rest.md``,
    "What the journal needs"); this class is the reference reader for tools,
    tests, the fuzzer and the bench.
    """

    def __init__(
        self, data: Buffer, *, where: str = "compressed segment", cache: FrameCache | None = None
    ) -> None:
        size = len(data)
        if size < HEADER_SIZE + TRAILER_SIZE:
            raise CorruptData(f"{size} bytes cannot be a compressed segment", where=where)
        wal_version, base_lsn = decode_header(data, where=where)
        dir_offset, dir_length = decode_trailer(
            memoryview(data)[size - TRAILER_SIZE :], file_size=size, where=where
        )
        self.data = memoryview(data)
        self.where = where
        self.directory = decode_directory(
            self.data[dir_offset : dir_offset + dir_length],
            base_lsn=base_lsn,
            wal_version=wal_version,
            dir_offset=dir_offset,
            where=where,
        )
        self.cache = cache if cache is not None else FrameCache()

    def stored(self, frame_no: int) -> bytes:
        f = self.directory.frames[frame_no]
        return bytes(self.data[f.offset : f.end])

    def frame(self, frame_no: int) -> FrameBatches:
        """Frame ``frame_no`` decompressed and walked, through the cache."""

        def load() -> FrameBatches:
            f = self.directory.frames[frame_no]
            where = f"{self.where} frame {frame_no}"
            return FrameBatches(f, decode_frame(f, self.stored(frame_no), where=where), where=where)

        return self.cache.get((id(self), frame_no), load)

    def record(self, topic: str, partition: int, offset: int) -> Record | None:
        """The record at ``offset`` of the partition: one lookup, one decompression."""
        i = self.directory.find_frame(topic, partition, offset)
        return None if i is None else self.frame(i).record(offset)

    def chunk_entries(self, chunk_no: int) -> ChunkEntries:
        c = self.directory.chunks[chunk_no]
        stored = self.data[c.meta_offset : c.meta_offset + c.meta_stored]
        return decode_entries(self.directory, chunk_no, stored, where=self.where)

    def iter_wal(self) -> Iterator[bytes]:
        """Every journal entry's bytes, in LSN order, exactly as first written.

        Each frame is decompressed once: a chunk's frames are held while its
        entries are rebuilt (about ``chunk_raw_bytes``), not the whole segment.
        """
        for ci in range(len(self.directory.chunks)):
            ents = self.chunk_entries(ci)
            held: dict[int, bytes] = {}

            def raw_of(n: int, held: dict[int, bytes] = held) -> bytes:
                raw = held.get(n)
                if raw is None:
                    f = self.directory.frames[n]
                    raw = held[n] = decode_frame(f, self.stored(n), where=f"{self.where} frame {n}")
                return raw

            for i in range(ents.chunk.n_entries):
                yield wal_entry(self.directory, ents, i, raw_of, self.stored, where=self.where)

    def entries(self) -> Iterator[AnyEntry]:
        """Every entry, decoded, in LSN order."""
        for raw in self.iter_wal():
            yield decode_any_entry(raw, where=self.where)

    def ship_blocks(self, chunk_no: int) -> list[tuple[str, int, StoredBlock]]:
        """The chunk's local data frames as blocks for ``LogObjectBuilder.add_stored``
        (mirror frames belong to other regions' logs and are not shipped)."""
        out = []
        for i in self.directory.chunks[chunk_no].frames:
            f = self.directory.frames[i]
            if f.origin != ORIGIN_DATA:
                continue
            stored = self.stored(i)
            if crc32c(stored) != f.crc:
                raise CorruptData(f"frame {i}: CRC mismatch", where=self.where)
            out.append((f.topic, f.partition, f.stored_block(stored)))
        return out


def expand_segment(data: Buffer, *, where: str = "compressed segment") -> bytes:
    """The journal segment a compressed segment replaced, byte for byte (a downgrade, a check)."""
    seg = CompressedSegment(data, where=where, cache=FrameCache(0))
    d = seg.directory
    out = [_WAL_HEADER.pack(_WAL_MAGIC, d.wal_version, d.base_lsn), *seg.iter_wal()]
    return b"".join(out)


def parse_entries(data: Buffer, *, where: str = "compressed segment") -> list[AnyEntry]:
    """Every entry of a compressed segment (tests and tools)."""
    return list(CompressedSegment(data, where=where).entries())


__all__ = [
    "BLOCK_DESC_SIZE",
    "DEFAULT_CHUNK_RAW_BYTES",
    "DEFAULT_FRAME_RAW_BYTES",
    "FRAME_NULLS",
    "HEADER_SIZE",
    "KIND_BLOCK",
    "MAGIC",
    "ORIGIN_BLOCK",
    "ORIGIN_DATA",
    "ORIGIN_MIRROR",
    "TICK_ENTRIES",
    "TRAILER_SIZE",
    "VERSION",
    "WAL_VERSION_BLOCKS",
    "AnyEntry",
    "BlockEntry",
    "block_entry_rest",
    "check_stored_block",
    "ChunkEntries",
    "ChunkIndex",
    "CompressedSegment",
    "FrameBatches",
    "FrameCache",
    "FrameIndex",
    "SegmentDirectory",
    "SegmentEncoder",
    "compress_segment",
    "decode_any_entry",
    "decode_block_entry",
    "decode_directory",
    "decode_entries",
    "decode_frame",
    "decode_header",
    "decode_trailer",
    "encode_any_entry",
    "encode_block_entry",
    "expand_segment",
    "iter_compressed",
    "iter_wal_entries",
    "parse_entries",
    "wal_entry",
]
