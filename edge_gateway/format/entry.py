"""Journal entry and segment encodings, version 2 (sans-IO).

A journal segment file is a 16-byte segment header followed by entries::

    segment header: magic "EGWJ" | u8 version (1 or 2) | 3 bytes zero | u64 base_lsn

    entry:
    offset size field
    0      4    length          u32 total bytes of the entry, this field included
    4      4    crc             u32 CRC32C of bytes [8, length)
    8      8    lsn             u64 journal sequence number (global, +1 per entry)
    16     1    kind            u8 1 DATA, 2 MIRROR, 3 CHECKPOINT
    17     1    flags           u8 bit0 END_OF_SOURCE_OBJECT (MIRROR only),
                                   bit1 PRODUCER (DATA only, version 2)
    18     2    topic_len       u16
    20     4    partition       u32
    24     8    base_offset     i64 offset of the first record
    32     4    count           u32 records in the batch (0 for markers/checkpoints)
    36     8    append_time     i64 wall-clock ms at append
    44          topic           utf-8, topic_len bytes
                MIRROR only:    u16 region_len | region | u64 source_seq | u64 source_epoch
                PRODUCER only:  u64 producer_id | u16 epoch | u16 zero | u32 sequence
                                (an idempotent produce, edge_gateway.idempotence)
                payload         DATA/MIRROR: one record batch (empty for a MIRROR marker
                                with count 0); CHECKPOINT: UTF-8 JSON state snapshot

The active (last) segment is preallocated: its entries are followed by zero
bytes up to the preallocated size, and a reader stops where only zeros remain
(:func:`is_zero_tail`). Sealed segments end at their last entry.

Every segment begins with a CHECKPOINT entry holding the next offset of every
partition and the mirror progress of every source region at the moment the
segment was opened, so a journal whose old segments were deleted still knows
where each partition continues. Version 2 checkpoints add the idempotent
producers' state (``ProducerTable.snapshot``), Kafka's producer snapshot.

Versions: version 2 segments may hold PRODUCER entries and version 2
checkpoints; a version 1 segment holds neither and reads as before (the
journal keeps appending to an old active segment without producer entries and
writes version 2 from its next segment). Version 3 segments may also hold
block entries (kind 4, a mirrored log-object block kept as fetched; encoded
and decoded by ``edge_gateway.format.atrest``, which this module does not
know: :func:`decode_entry` refuses kind 4 as an unknown kind). A version 1 reader refuses a version
2 segment ("unsupported segment version") instead of cutting the producer
entries it does not know as a torn tail.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from typing import Any, Final, Protocol

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.format import batch as _batch

SEGMENT_MAGIC: Final = b"EGWJ"
SEGMENT_VERSION: Final = 2
#: The segment version a journal writes from its first block entry on (kind 4,
#: ``format/atrest.py``): older code refuses it as a whole.
SEGMENT_VERSION_BLOCKS: Final = 3
#: Segment versions this code reads.
SEGMENT_VERSIONS: Final = (1, 2, SEGMENT_VERSION_BLOCKS)
_SEGMENT_HEADER = struct.Struct("<4sB3xQ")
SEGMENT_HEADER_SIZE: Final = _SEGMENT_HEADER.size  # 16

KIND_DATA: Final = 1
KIND_MIRROR: Final = 2
KIND_CHECKPOINT: Final = 3
_KINDS: Final = (KIND_DATA, KIND_MIRROR, KIND_CHECKPOINT)
_KIND_NAMES: Final = {KIND_DATA: "data", KIND_MIRROR: "mirror", KIND_CHECKPOINT: "checkpoint"}
FLAG_END_OF_SOURCE_OBJECT: Final = 0x01
FLAG_PRODUCER: Final = 0x02

ENTRY_HEADER = struct.Struct("<IIQBBHIqIq")
ENTRY_HEADER_SIZE: Final = ENTRY_HEADER.size  # 44
_SOURCE_TAIL = struct.Struct("<QQ")
#: producer id, epoch, zero, sequence (after the topic of a PRODUCER entry)
PRODUCER_TAIL = struct.Struct("<QHHI")
PRODUCER_TAIL_SIZE: Final = PRODUCER_TAIL.size  # 16
_U16 = struct.Struct("<H")
#: Largest entry the journal writes or accepts when reading.
MAX_ENTRY_BYTES: Final = _batch.MAX_BATCH_BYTES + 64 * 1024


@dataclass(frozen=True, slots=True)
class SourceCoords:
    """Where a mirrored batch came from: the source region's log entry."""

    region: str
    seq: int
    epoch: int
    #: True on the last journal entry written for this source log entry, so a
    #: reader of the journal knows the whole source entry was applied.
    end_of_object: bool = True


class ProducerFields(Protocol):
    """What a PRODUCER entry stores (``ProducerStamp``, ``idempotence.ProducerSeq``)."""

    @property
    def producer_id(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def sequence(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ProducerStamp:
    """The idempotent producer of a DATA entry (``edge_gateway.idempotence.ProducerSeq``)."""

    producer_id: int
    epoch: int
    sequence: int


@dataclass(frozen=True, slots=True)
class Entry:
    """A decoded journal entry. ``payload`` is the batch (or checkpoint JSON).

    ``payload`` is ``bytes``, or a read-only ``memoryview`` into the buffer
    the entry was decoded from when the decoder was given a view
    (:func:`decode_data_entry`: the shipper's reads, which hand payloads of
    :data:`VIEW_MIN_BYTES` or more to the log-object builder uncopied).
    """

    lsn: int
    kind: int
    topic: str
    partition: int
    base_offset: int
    count: int
    append_time: int
    source: SourceCoords | None
    payload: bytes | memoryview
    length: int
    #: the idempotent producer that wrote a DATA entry, if any
    producer: ProducerStamp | None = None

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count


def encode_segment_header(base_lsn: int, version: int = SEGMENT_VERSION) -> bytes:
    if version not in SEGMENT_VERSIONS:
        raise InvalidInput(f"no segment version {version}")
    return _SEGMENT_HEADER.pack(SEGMENT_MAGIC, version, base_lsn)


def decode_segment_header(buf: bytes, *, where: str) -> int:
    """Check a segment header and return its base LSN."""
    if len(buf) < SEGMENT_HEADER_SIZE:
        raise CorruptData("segment header truncated", where=where)
    magic, version, base_lsn = _SEGMENT_HEADER.unpack_from(buf)
    if magic != SEGMENT_MAGIC:
        raise CorruptData(f"not a journal segment (magic {magic!r})", where=where)
    if version not in SEGMENT_VERSIONS:
        raise CorruptData(f"unsupported segment version {version}", where=where)
    return int(base_lsn)


def segment_version(buf: bytes) -> int:
    """The version byte of a segment header (checked by :func:`decode_segment_header`)."""
    return int(buf[4])


ENTRY_REST = struct.Struct("<QBBHIqIq")  # the entry header after length and crc
_REST = ENTRY_REST
ENTRY_LEN_CRC = struct.Struct("<II")


def _fmt(st: struct.Struct) -> str:
    """A struct's format without its byte-order prefix (to join layouts)."""
    return st.format[1:]


def data_entry_struct(topic_len: int) -> struct.Struct:
    """A DATA entry's start in one struct: its header, its topic, its batch's header.

    What a scan or a decode unpacks at once (``ENTRY_HEADER`` + topic +
    ``batch.HEADER``), for topics of ``topic_len`` bytes.
    """
    return struct.Struct(f"<{_fmt(ENTRY_HEADER)}{topic_len}s{_fmt(_batch.HEADER)}")


def data_head_struct(topic_len: int, *, producer: bool = False) -> struct.Struct:
    """What an append packs of a DATA entry before the rest of its batch.

    ``ENTRY_REST`` (the header after length and CRC), the topic, the
    producer tail if ``producer``, and the batch header up to its base
    offset (``batch.HEADER_TO_BASE``); the batch's bytes from its CRC on
    follow as given.
    """
    tail = _fmt(PRODUCER_TAIL) if producer else ""
    return struct.Struct(f"<{_fmt(ENTRY_REST)}{topic_len}s{tail}{_fmt(_batch.HEADER_TO_BASE)}")


def encode_entry_rest(
    *,
    lsn: int,
    kind: int,
    topic: bytes,
    partition: int,
    base_offset: int,
    count: int,
    append_time: int,
    source: SourceCoords | None = None,
    producer: ProducerFields | None = None,
) -> bytes:
    """The bytes of an entry from offset 8 up to its payload.

    The writer computes the CRC over these bytes followed by the payload and
    prepends :data:`ENTRY_LEN_CRC` ``(length, crc)``, so a large payload is
    never copied (see :func:`encode_entry` for the whole thing at once).
    """
    flags = 0
    rest = _REST.pack(lsn, kind, 0, len(topic), partition, base_offset, count, append_time)
    if kind == KIND_MIRROR:
        if source is None:
            raise InvalidInput("a mirror entry needs source coordinates")
        region = source.region.encode("utf-8")
        if source.end_of_object:
            flags |= FLAG_END_OF_SOURCE_OBJECT
        rest = _REST.pack(lsn, kind, flags, len(topic), partition, base_offset, count, append_time)
        return (
            rest
            + topic
            + _U16.pack(len(region))
            + region
            + _SOURCE_TAIL.pack(source.seq, source.epoch)
        )
    if producer is not None:
        if kind != KIND_DATA:
            raise InvalidInput("only a data entry has a producer")
        rest = _REST.pack(
            lsn, kind, FLAG_PRODUCER, len(topic), partition, base_offset, count, append_time
        )
        return rest + topic + encode_producer(producer)
    return rest + topic


def encode_producer(producer: ProducerFields) -> bytes:
    """The 16 bytes after the topic of a PRODUCER entry."""
    try:
        return PRODUCER_TAIL.pack(producer.producer_id, producer.epoch, 0, producer.sequence)
    except struct.error:
        raise InvalidInput(f"producer fields out of range: {producer}") from None


def entry_crc(rest: bytes, *payload: bytes | memoryview) -> int:
    """The CRC32C an entry stores: over bytes [8, length)."""
    crc = crc32c(rest)
    for part in payload:
        crc = crc32c(part, value=crc)
    return int(crc)


def encode_entry(
    *,
    lsn: int,
    kind: int,
    topic: bytes,
    partition: int,
    base_offset: int,
    count: int,
    append_time: int,
    payload: bytes,
    source: SourceCoords | None = None,
    producer: ProducerFields | None = None,
) -> bytes:
    """A whole entry (for tests, tools and small entries)."""
    rest = encode_entry_rest(
        producer=producer,
        lsn=lsn,
        kind=kind,
        topic=topic,
        partition=partition,
        base_offset=base_offset,
        count=count,
        append_time=append_time,
        source=source,
    )
    length = 8 + len(rest) + len(payload)
    if length > MAX_ENTRY_BYTES:
        raise InvalidInput(f"journal entry of {length} bytes exceeds {MAX_ENTRY_BYTES}")
    return ENTRY_LEN_CRC.pack(length, entry_crc(rest, payload)) + rest + payload


def encode_checkpoint_entry(*, lsn: int, append_time: int, payload: bytes) -> bytes:
    """A checkpoint entry: no topic, partition or records, ``payload`` the encoded checkpoint."""
    return encode_entry(
        lsn=lsn,
        kind=KIND_CHECKPOINT,
        topic=b"",
        partition=0,
        base_offset=0,
        count=0,
        append_time=append_time,
        payload=payload,
    )


_NONZERO = re.compile(rb"[^\x00]")


def is_zero_tail(buf: bytes | bytearray | memoryview, pos: int) -> bool:
    """True if ``buf[pos:]`` holds only zero bytes: the end of a segment's entries.

    The active segment is preallocated, so the entries a crash leaves behind
    are followed by zeros. No entry starts with a zero length field.
    """
    return _NONZERO.search(buf, pos) is None


def peek_length(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """The length field of the entry at ``pos`` (no checks)."""
    return int(struct.unpack_from("<I", buf, pos)[0])


#: Where the kind byte sits in an entry (after length, CRC and LSN).
KIND_OFFSET: Final = 16


def decode_entry_header(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, where: str = "entry"
) -> Entry:
    """The fixed header fields of the entry at ``buf[pos:]``, without its body.

    For a reader that only needs to step over an entry (the shipper over
    mirror entries): ``topic`` is empty, ``source`` is ``None`` and
    ``payload`` is empty -- nothing of the body is parsed or copied. The
    length and the CRC are checked as :func:`decode_entry` checks them, so a
    corrupt entry (a flipped kind byte too) is never stepped over silently.
    """
    avail = len(buf) - pos
    if avail < ENTRY_HEADER_SIZE:
        raise CorruptData(f"truncated entry header ({avail} bytes)", where=where)
    (length, crc, lsn, kind, _flags, topic_len, partition, base_offset, count, append_time) = (
        ENTRY_HEADER.unpack_from(buf, pos)
    )
    if length < ENTRY_HEADER_SIZE + topic_len or length > MAX_ENTRY_BYTES:
        raise CorruptData(f"bad entry length {length}", where=where)
    if length > avail:
        raise CorruptData(f"truncated entry: {length} bytes, {avail} present", where=where)
    actual = crc32c(memoryview(buf)[pos + 8 : pos + length])
    if actual != crc:
        raise CorruptData(
            f"entry CRC mismatch (stored {crc:08x}, computed {actual:08x})", where=where
        )
    if kind not in _KINDS:
        raise CorruptData(f"unknown entry kind {kind}", where=where)
    return Entry(lsn, kind, "", partition, base_offset, count, append_time, None, b"", length)


def decode_entry(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, where: str = "entry", verify: bool = True
) -> Entry:
    """Decode the entry at ``buf[pos:]``; raise :class:`CorruptData` unless whole and valid."""
    avail = len(buf) - pos
    if avail < ENTRY_HEADER_SIZE:
        raise CorruptData(f"truncated entry header ({avail} bytes)", where=where)
    (length, crc, lsn, kind, flags, topic_len, partition, base_offset, count, append_time) = (
        ENTRY_HEADER.unpack_from(buf, pos)
    )
    if length < ENTRY_HEADER_SIZE + topic_len or length > MAX_ENTRY_BYTES:
        raise CorruptData(f"bad entry length {length}", where=where)
    if length > avail:
        raise CorruptData(f"truncated entry: {length} bytes, {avail} present", where=where)
    view = memoryview(buf)[pos : pos + length]
    if verify:
        actual = crc32c(view[8:])
        if actual != crc:
            raise CorruptData(
                f"entry CRC mismatch (stored {crc:08x}, computed {actual:08x})", where=where
            )
    if kind not in _KINDS:
        raise CorruptData(f"unknown entry kind {kind}", where=where)
    cur = ENTRY_HEADER_SIZE
    try:
        topic = bytes(view[cur : cur + topic_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptData("topic is not UTF-8", where=where) from None
    cur += topic_len
    source = None
    if kind == KIND_MIRROR:
        if cur + 2 > length:
            raise CorruptData("mirror entry truncated before its source", where=where)
        (rlen,) = _U16.unpack_from(view, cur)
        cur += 2
        if cur + rlen + _SOURCE_TAIL.size > length:
            raise CorruptData("mirror source overruns the entry", where=where)
        try:
            region = bytes(view[cur : cur + rlen]).decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptData("source region is not UTF-8", where=where) from None
        cur += rlen
        seq, epoch = _SOURCE_TAIL.unpack_from(view, cur)
        cur += _SOURCE_TAIL.size
        source = SourceCoords(region, seq, epoch, bool(flags & FLAG_END_OF_SOURCE_OBJECT))
        if flags & ~FLAG_END_OF_SOURCE_OBJECT:
            raise CorruptData(f"flags 0x{flags:02x} on a mirror entry", where=where)
    producer = None
    if kind == KIND_DATA and flags == FLAG_PRODUCER:
        if cur + PRODUCER_TAIL_SIZE > length:
            raise CorruptData("producer fields overrun the entry", where=where)
        pid, pepoch, zero, pseq = PRODUCER_TAIL.unpack_from(view, cur)
        if zero:
            raise CorruptData("reserved producer bytes are not zero", where=where)
        cur += PRODUCER_TAIL_SIZE
        producer = ProducerStamp(pid, pepoch, pseq)
    elif kind != KIND_MIRROR and flags:
        raise CorruptData(f"flags 0x{flags:02x} on a {_KIND_NAMES[kind]} entry", where=where)
    payload = bytes(view[cur:])
    if kind != KIND_CHECKPOINT and (count > 0 or payload):
        h = _batch.read_header(payload, 0, where=where)
        if h.length != len(payload) or h.count != count or h.base_offset != base_offset:
            raise CorruptData("entry header disagrees with its batch", where=where)
    return Entry(
        lsn,
        kind,
        topic,
        partition,
        base_offset,
        count,
        append_time,
        source,
        payload,
        length,
        producer,
    )


#: Per topic length: the entry header, the topic and the batch header in one struct.
_DATA_STRUCTS: dict[int, struct.Struct] = {}
#: Entries at least this long get their payload as a view when decoded from one
#: (:func:`decode_data_entry`); shorter ones as a copy: a view costs more than
#: copying a few hundred bytes (the garbage collector tracks views, not bytes;
#: a drain of one-record entries took ~20% more CPU with views).
VIEW_MIN_BYTES: Final = 4096

#: Topics as stored -> as str (a drain decodes the same few topics millions of times).
_TOPICS: dict[bytes, str] = {}
_MAX_TOPICS_CACHED: Final = 4096


def decode_data_entry(buf: bytes | memoryview, pos: int = 0) -> Entry | None:
    """The ordinary DATA entry at ``buf[pos:]`` if every check passes, else None.

    The payload is a slice of ``buf``: a copy when ``buf`` is ``bytes``; when
    ``buf`` is a ``memoryview``, a view into it (no copy) for an entry of at
    least :data:`VIEW_MIN_BYTES` -- so its bytes must not change while the
    entry lives -- and a copy for a shorter one.

    The fast path of a drain of one-record entries: one ``struct`` unpack
    (entry header, topic and batch header together), one CRC, no object but
    the :class:`Entry`. It makes exactly the checks :func:`decode_entry` makes
    for a DATA entry with its batch header (``tests/format/test_entry_header.py``
    feeds both the same damaged bytes); on None, :func:`decode_entry` says
    what is wrong (or decodes what is not an ordinary DATA entry).
    """
    avail = len(buf) - pos
    if avail < ENTRY_HEADER_SIZE or buf[pos + KIND_OFFSET] != KIND_DATA:
        return None
    tlen = buf[pos + 18] | buf[pos + 19] << 8
    st = _DATA_STRUCTS.get(tlen)
    if st is None:
        st = _DATA_STRUCTS[tlen] = data_entry_struct(tlen)
    if avail < st.size:
        return None
    fields = st.unpack_from(buf, pos)
    length, stored, lsn, _kind, flags, _tl, partition, base, count, atime, traw = fields[:11]
    blen, ver, bflags, reserved, bbase, _bcrc, bcount, min_ts, max_ts = fields[11:]
    if not (
        not flags
        and blen == length - ENTRY_HEADER_SIZE - tlen
        and _batch.HEADER_SIZE <= blen <= _batch.MAX_BATCH_BYTES
        and length <= MAX_ENTRY_BYTES
        and length <= avail
        and ver == _batch.VERSION
        and not bflags & ~7  # KEYS, HEADERS, NULLS (batch.py)
        and not reserved
        and bbase == base
        and bcount == count
        and count >= 1
        and count * ((bflags & 1) + ((bflags & 2) >> 1) + 3) * 4 <= blen - _batch.HEADER_SIZE
        and min_ts <= max_ts
        and crc32c(memoryview(buf)[pos + 8 : pos + length]) == stored
    ):
        return None
    topic = _TOPICS.get(traw)
    if topic is None:
        try:
            topic = traw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if len(_TOPICS) < _MAX_TOPICS_CACHED:
            _TOPICS[traw] = topic
    start = pos + ENTRY_HEADER_SIZE + tlen
    payload = buf[start : pos + length]
    if type(payload) is memoryview and length < VIEW_MIN_BYTES:
        payload = bytes(payload)
    return Entry(lsn, KIND_DATA, topic, partition, base, count, atime, None, payload, length)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """State at the start of a segment: where every partition and source stands."""

    #: (topic, partition) -> next offset
    next_offsets: dict[tuple[str, int], int]
    #: source region -> coordinates of the last mirror entry applied from it
    sources: dict[str, SourceCoords]
    #: the idempotent producers' state (``ProducerTable.snapshot``) as of the
    #: segment's start; None: none (written as a version 1 checkpoint)
    producers: dict[str, Any] | None = None

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "v": 1 if self.producers is None else 2,
            "partitions": [[t, p, o] for (t, p), o in sorted(self.next_offsets.items())],
            "sources": {
                r: [s.seq, s.epoch, s.end_of_object] for r, s in sorted(self.sources.items())
            },
        }
        if self.producers is not None:
            doc["producers"] = self.producers
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes | memoryview, *, where: str) -> Checkpoint:
        try:
            doc = json.loads(bytes(payload))
            if doc.get("v") not in (1, 2):
                raise CorruptData(f"unsupported checkpoint version {doc.get('v')!r}", where=where)
            producers = doc.get("producers") if doc["v"] == 2 else None
            if producers is not None and not isinstance(producers, dict):
                raise CorruptData("checkpoint producers is not an object", where=where)
            offsets = {(str(t), int(p)): int(o) for t, p, o in doc["partitions"]}
            sources = {
                str(r): SourceCoords(str(r), int(s), int(e), bool(end))
                for r, (s, e, end) in doc["sources"].items()
            }
        except CorruptData:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CorruptData(f"malformed checkpoint: {exc}", where=where) from None
        return cls(offsets, sources, producers)
