"""Record batch encoding, version 1 (sans-IO).

One encoding is used everywhere records travel: journal entries, blocks of
shipped log objects and the binary produce/fetch API. The layout is
column-wise, so a whole batch encodes and decodes with ``array``/``bytes``
operations instead of a Python loop of small ``struct`` calls. The byte-level
specification is in ``docs/format.md`` ("Record batch"); the short form::

    offset size field
    0      4    length          u32 total bytes of the batch, header included
    4      1    version         u8 = 1
    5      1    flags           u8 bit0 KEYS, bit1 HEADERS, bit2 NULLS; others must be 0
    6      2    reserved        u16 = 0
    8      8    base_offset     i64 offset of the first record (not under the CRC)
    16     4    crc             u32 CRC32C of bytes [4, 8) ++ [20, length)
    20     4    count           u32 number of records, >= 1
    24     8    min_timestamp   i64 ms
    32     8    max_timestamp   i64 ms
    40          columns, little-endian, no padding:
                timestamps      count x i64
                key_lengths     count x i32 (-1 = null key)        if KEYS
                value_lengths   count x i32 (-1 = null value: only under NULLS)
                header_lengths  count x i32 (bytes of header blob) if HEADERS
                key bytes, value bytes, header blobs (each concatenated)

Records in a batch have contiguous offsets ``base_offset .. base_offset +
count - 1`` (offsets are gap-free per partition). The CRC covers version,
flags and reserved and everything from ``count`` on; ``length`` and
``base_offset`` stay outside it (as in Kafka's batch format) so the journal can
assign ``base_offset`` at append without rehashing the batch. ``length`` is
still checked: it bounds the CRC'd range and must equal exactly what the
columns add up to. The flags must be under the CRC: flipping KEYS<->HEADERS
keeps the column count, and with no null keys the column arithmetic still adds
up, so only the CRC tells such a batch from a different, valid one. Every
container (journal entry, log-object block) has a CRC of its own over all of it.

NULLS (a Kafka tombstone, a Kafka null header value) lets a value length be -1
(a null value, no bytes) and a header value length be 0xFFFFFFFF (a null header
value, no bytes). The encoder sets it only for a batch that holds a null, so a
batch without one is byte for byte what a reader from before NULLS wrote and
reads; such a reader refuses a NULLS batch ("unknown flags 0x04"), which is why
a log object carrying one says so in its own header (``logobject.FLAG_NULLS``).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Final

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData, InvalidInput

VERSION: Final = 1
FLAG_KEYS: Final = 0x01
FLAG_HEADERS: Final = 0x02
#: A value may be null (length -1), a header value too (length 0xFFFFFFFF).
FLAG_NULLS: Final = 0x04
_KNOWN_FLAGS: Final = FLAG_KEYS | FLAG_HEADERS | FLAG_NULLS

#: The batch header: length, version, flags, reserved, base offset, CRC, count,
#: min/max timestamp (the one definition: the journal and its scan build theirs
#: from these).
HEADER = struct.Struct("<IBBHqIIqq")
_HEADER = HEADER
HEADER_SIZE: Final = HEADER.size  # 40
#: The header up to the base offset (length, version, flags, reserved, base
#: offset): what a journal entry packs again, with the offsets it assigned.
HEADER_TO_BASE = struct.Struct("<IBBHq")
#: The header's fields but the base offset and the CRC (length, version,
#: flags, reserved, count, min/max timestamp): the quick checks of an append.
HEADER_PEEK = struct.Struct("<IBBH12xIqq")
_COUNT_TS = struct.Struct("<Iqq")  # header bytes [20, 40): count, min/max timestamp
_LENGTH_COUNT = struct.Struct("<I16xI")  # header bytes [0, 24): length ... count
_crc = crc32c
_BASE_OFFSET = struct.Struct("<q")
_CRC = struct.Struct("<I")
_BASE_OFFSET_POS: Final = 8
_CRC_POS: Final = 16
_CRC_END: Final = 20
_VERSION_POS: Final = 4

#: Upper bound of one batch; larger inputs are refused before any allocation.
MAX_BATCH_BYTES: Final = 256 * 1024 * 1024
_MAX_I32: Final = 2**31 - 1
_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1

_BIG_ENDIAN: Final = sys.byteorder == "big"
_HEADER_ENTRY = struct.Struct("<H")
_HEADER_VALUE = struct.Struct("<I")
#: A header value length meaning "null" (under FLAG_NULLS).
_NULL_HEADER_VALUE: Final = 0xFFFFFFFF

Headers = Sequence[tuple[str, bytes | None]]
#: A record's headers as decoded: a value is None only in a NULLS batch.
HeaderTuple = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class Record:
    """One record: the unit producers write and consumers read."""

    offset: int
    timestamp: int
    key: bytes | None
    #: None: a null value (a Kafka tombstone), distinct from an empty one.
    value: bytes | None
    headers: HeaderTuple = ()


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed 40-byte header of a batch, decoded and checked for structure."""

    length: int
    flags: int
    base_offset: int
    crc: int
    count: int
    min_timestamp: int
    max_timestamp: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.count - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count


def _le(arr: array[int]) -> bytes:
    if _BIG_ENDIAN:  # pragma: no cover - little-endian machines only in CI
        arr = array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def _from_le(typecode: str, data: bytes | memoryview) -> array[int]:
    arr = array(typecode)
    arr.frombytes(data)
    if _BIG_ENDIAN:  # pragma: no cover
        arr.byteswap()
    return arr


def _encode_header_blob(headers: Headers, nulls: list[bool]) -> bytes:
    parts: list[bytes] = []
    for pair in headers:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise InvalidInput("record headers must be (str, bytes) pairs")
        name, value = pair
        if value is None and isinstance(name, str):
            nulls.append(True)
            value_len = _HEADER_VALUE.pack(_NULL_HEADER_VALUE)
            value = b""
        elif not isinstance(name, str) or not isinstance(value, bytes | bytearray):
            raise InvalidInput("record headers must be (str, bytes | None) pairs")
        else:
            value_len = _HEADER_VALUE.pack(len(value))
        try:
            raw = name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInput("a record header name is not encodable as UTF-8") from exc
        if len(raw) > 0xFFFF:
            raise InvalidInput("a record header name is longer than 65535 bytes")
        parts += (_HEADER_ENTRY.pack(len(raw)), raw, value_len, value)
    return b"".join(parts)


def _column(items: Sequence[bytes | None], what: str) -> tuple[array[int], bytes, bool]:
    """The lengths (-1 for None) and the joined bytes of a batch's values or keys, and
    whether any is None. Built for thousands of records: the common case (no None)
    is one C-level call each; a None makes the join raise and takes the slower way."""
    try:
        # array() from a list is faster than from an iterator (it sizes once)
        lengths = array("i", list(map(len, items)))  # type: ignore[arg-type]
        return lengths, b"".join(items), False  # type: ignore[arg-type]  # TypeError on None
    except TypeError:
        try:
            lengths = array("i", [-1 if x is None else len(x) for x in items])
            return lengths, b"".join([x for x in items if x is not None]), True
        except TypeError as exc:
            raise InvalidInput(f"record {what}s must be bytes or None") from exc
        except OverflowError as exc:
            raise InvalidInput(f"a record {what} is larger than 2 GiB") from exc
    except OverflowError as exc:
        raise InvalidInput(f"a record {what} is larger than 2 GiB") from exc


def encode_batch(
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    timestamps: Sequence[int] | int,
    headers: Sequence[Headers] | None = None,
    base_offset: int = 0,
) -> bytes:
    """Encode records into one batch.

    ``values[i]``, ``keys[i]``, ``timestamps[i]`` and ``headers[i]`` describe
    record ``i``. ``timestamps`` may be one int shared by all records. Keys
    and headers are optional columns: omitted, they cost nothing. A value or
    a header value may be None (null): the batch then has the NULLS flag.
    """
    # Written for whole batches of thousands of records: every column is
    # built by one C-level call (map/join/array), the CRC is computed piece
    # by piece, and the output is assembled by a single join (one copy).
    count = len(values)
    if count == 0:
        raise InvalidInput("a batch holds at least one record")
    flags = 0
    value_lengths, value_data, nulls = _column(values, "value")
    if nulls:
        flags |= FLAG_NULLS

    if isinstance(timestamps, int):
        if not _I64_MIN <= timestamps <= _I64_MAX:
            raise InvalidInput("timestamps must be 64-bit integers (ms)")
        ts = array("q", (timestamps,)) * count
        min_ts = max_ts = timestamps
    else:
        if len(timestamps) != count:
            raise InvalidInput(f"{len(timestamps)} timestamps for {count} records")
        try:
            ts = array("q", timestamps)
        except (TypeError, OverflowError) as exc:
            raise InvalidInput("timestamps must be 64-bit integers (ms)") from exc
        # min/max of the caller's ints: no int objects are created for them
        min_ts, max_ts = int(min(timestamps)), int(max(timestamps))

    columns = [_le(ts)]
    tail = [value_data]
    if keys is not None:
        if len(keys) != count:
            raise InvalidInput(f"{len(keys)} keys for {count} records")
        key_lengths, key_data, _ = _column(keys, "key")
        flags |= FLAG_KEYS
        columns.append(_le(key_lengths))
        tail.insert(0, key_data)
    columns.append(_le(value_lengths))
    if headers is not None and len(headers) != count:
        raise InvalidInput(f"{len(headers)} header lists for {count} records")
    if headers is not None and any(headers):
        null_headers: list[bool] = []
        blobs = [_encode_header_blob(h, null_headers) if h else b"" for h in headers]
        flags |= FLAG_HEADERS | (FLAG_NULLS if null_headers else 0)
        columns.append(_le(array("i", list(map(len, blobs)))))
        tail.append(b"".join(blobs))

    parts = columns + tail
    length = HEADER_SIZE + sum(map(len, parts))
    if length > MAX_BATCH_BYTES:
        raise InvalidInput(f"batch of {length} bytes exceeds the limit of {MAX_BATCH_BYTES}")
    if not _I64_MIN <= base_offset <= _I64_MAX:
        raise InvalidInput("base_offset out of range")
    # CRC over [4, 8) (a constant per flags) ++ [20, 40) ++ the columns and data
    crc = crc32c(_COUNT_TS.pack(count, min_ts, max_ts), value=_PREFIX_CRC[flags])
    for part in parts:
        crc = crc32c(part, value=crc)
    parts.insert(
        0, _HEADER.pack(length, VERSION, flags, 0, base_offset, crc, count, min_ts, max_ts)
    )
    return b"".join(parts)


_ONE_HEAD = struct.Struct("<IBBHqI")  # the batch header up to the CRC
_ONE_NOKEY = struct.Struct("<Iqqqi")  # count, min/max ts, ts column, value length
_ONE_KEY = struct.Struct("<Iqqqii")  # ... key length, value length
# CRC32C of bytes [4, 8) (version, flags, reserved) by flags, to seed the CRC.
_PREFIX_CRC: Final = {
    f: crc32c(struct.pack("<BBH", VERSION, f, 0)) for f in range(_KNOWN_FLAGS + 1)
}


def encode_record(
    value: bytes | None,
    *,
    timestamp: int,
    key: bytes | None = None,
    headers: Headers | None = None,
    base_offset: int = 0,
) -> bytes:
    """Encode a one-record batch; the same bytes as :func:`encode_batch`, faster."""
    # One record per call is the slowest way to produce: every operation here counts.
    if headers or type(value) is not bytes or (key is not None and type(key) is not bytes):
        return encode_batch(
            [value],
            keys=None if key is None else [key],
            timestamps=[timestamp],
            headers=[headers] if headers else None,
            base_offset=base_offset,
        )
    try:
        if key is None:
            flags = 0
            tail = _ONE_NOKEY.pack(1, timestamp, timestamp, timestamp, len(value)) + value
        else:
            flags = FLAG_KEYS
            tail = _ONE_KEY.pack(1, timestamp, timestamp, timestamp, len(key), len(value))
            tail += key + value
        length = _CRC_END + len(tail)
        if length > MAX_BATCH_BYTES:
            raise InvalidInput(f"batch of {length} bytes exceeds the limit of {MAX_BATCH_BYTES}")
        return (
            _ONE_HEAD.pack(length, VERSION, flags, 0, base_offset, _crc(tail, _PREFIX_CRC[flags]))
            + tail
        )
    except struct.error as exc:
        raise InvalidInput(f"record out of range: {exc}") from None


def encode_records(records: Sequence[Record]) -> bytes:
    """Encode :class:`Record` objects; their offsets must be contiguous."""
    if not records:
        raise InvalidInput("a batch holds at least one record")
    base = records[0].offset
    for i, r in enumerate(records):
        if r.offset != base + i:
            raise InvalidInput("records of one batch must have contiguous offsets")
    keys = [r.key for r in records]
    has_headers = any(r.headers for r in records)
    return encode_batch(
        [r.value for r in records],
        keys=keys if any(k is not None for k in keys) else None,
        timestamps=[r.timestamp for r in records],
        headers=[r.headers for r in records] if has_headers else None,
        base_offset=base,
    )


def batch_crc(buf: bytes | bytearray | memoryview, pos: int, length: int) -> int:
    """CRC32C of the batch at ``buf[pos:pos+length]``: over [4, 8) ++ [20, length)."""
    view = memoryview(buf)
    crc = crc32c(view[pos + _VERSION_POS : pos + _BASE_OFFSET_POS])
    return int(crc32c(view[pos + _CRC_END : pos + length], value=crc))


def peek_count(buf: bytes | bytearray | memoryview) -> int | None:
    """The record count of ``buf`` if its header claims exactly ``len(buf)`` bytes and a record.

    None otherwise (:func:`read_header` says what is wrong). Nothing else is
    checked: a quick look before the checks of whoever writes the batch.
    """
    try:
        length, count = _LENGTH_COUNT.unpack_from(buf)
    except struct.error:
        return None
    return count if length == len(buf) and count >= 1 else None


def read_header(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, where: str = "batch"
) -> BatchHeader:
    """Decode and check the fixed header of the batch at ``buf[pos:]``.

    Checks structure only (lengths, version, flags), not the CRC; the whole
    batch must be present in ``buf``.
    """
    avail = len(buf) - pos
    if avail < HEADER_SIZE:
        raise CorruptData(
            f"truncated: {avail} bytes, a batch header needs {HEADER_SIZE}", where=where
        )
    length, version, flags, reserved, base, crc, count, min_ts, max_ts = _HEADER.unpack_from(
        buf, pos
    )
    if version != VERSION:
        raise CorruptData(
            f"unsupported batch format version {version} (this reader knows {VERSION})",
            where=where,
        )
    if flags & ~_KNOWN_FLAGS or reserved:
        raise CorruptData(f"unknown flags 0x{flags:02x}/reserved 0x{reserved:04x}", where=where)
    if length < HEADER_SIZE or length > MAX_BATCH_BYTES:
        raise CorruptData(f"bad batch length {length}", where=where)
    if length > avail:
        raise CorruptData(f"truncated: batch of {length} bytes, {avail} present", where=where)
    columns = 2 + (flags & FLAG_KEYS) + ((flags & FLAG_HEADERS) >> 1)
    # timestamps take 8 bytes, every other column 4: (columns + 1) * 4 per record
    if count < 1 or HEADER_SIZE + count * (columns + 1) * 4 > length:
        raise CorruptData(
            f"record count {count} does not fit a batch of {length} bytes", where=where
        )
    if min_ts > max_ts:
        raise CorruptData("min_timestamp > max_timestamp", where=where)
    return BatchHeader(length, flags, base, crc, count, min_ts, max_ts)


class RecordBatch:
    """A decoded batch: columns held as arrays, records materialised on demand."""

    __slots__ = (
        "_headers",
        "_key_lengths",
        "_key_start",
        "_keys",
        "_value_lengths",
        "_value_start",
        "_values",
        "header",
        "raw",
        "timestamps",
    )

    def __init__(
        self,
        header: BatchHeader,
        raw: bytes,
        timestamps: array[int],
        key_lengths: array[int] | None,
        key_start: int,
        value_lengths: array[int],
        value_start: int,
        headers: list[HeaderTuple] | None,
    ) -> None:
        # Keys and values are checked by decode_batch but split into bytes
        # objects only when asked for: a reader that forwards whole batches
        # (the mirror, a binary fetch) never pays for one object per record.
        self.header = header
        self.raw = raw
        self.timestamps = timestamps
        self._key_lengths = key_lengths
        self._key_start = key_start
        self._value_lengths = value_lengths
        self._value_start = value_start
        self._keys: list[bytes | None] | None = None
        self._values: list[bytes | None] | None = None
        self._headers = headers

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def count(self) -> int:
        return self.header.count

    @property
    def next_offset(self) -> int:
        return self.header.next_offset

    @property
    def values(self) -> list[bytes | None]:
        if self._values is None:
            lengths = self._value_lengths
            if self.header.flags & FLAG_NULLS and -1 in lengths:
                self._values = _split_nullable(self.raw, lengths, self._value_start)
            else:
                self._values = list(_split(self.raw, lengths, self._value_start))
        return self._values

    @property
    def keys(self) -> list[bytes | None]:
        if self._key_lengths is None:
            return [None] * self.count
        if self._keys is None:
            self._keys = _split_nullable(self.raw, self._key_lengths, self._key_start)
        return self._keys

    @property
    def headers(self) -> list[HeaderTuple]:
        return self._headers if self._headers is not None else [()] * self.count

    def records(self, start_offset: int | None = None) -> list[Record]:
        """The records, optionally only those at or after ``start_offset``."""
        first = 0 if start_offset is None else max(0, start_offset - self.base_offset)
        base = self.base_offset
        keys, values, headers = self.keys, self.values, self.headers
        return [
            Record(base + i, self.timestamps[i], keys[i], values[i], headers[i])
            for i in range(first, self.count)
        ]

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"RecordBatch(base_offset={self.base_offset}, count={self.count})"


def _decode_header_blob(blob: bytes, where: str, nulls: bool) -> HeaderTuple:
    out: list[tuple[str, bytes | None]] = []
    pos, end = 0, len(blob)
    while pos < end:
        if pos + 2 > end:
            raise CorruptData("record header entry truncated", where=where)
        (nlen,) = _HEADER_ENTRY.unpack_from(blob, pos)
        pos += 2
        if pos + nlen + 4 > end:
            raise CorruptData("record header name overruns its blob", where=where)
        try:
            name = blob[pos : pos + nlen].decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptData("record header name is not UTF-8", where=where) from None
        pos += nlen
        (vlen,) = _HEADER_VALUE.unpack_from(blob, pos)
        pos += 4
        if vlen == _NULL_HEADER_VALUE and nulls:
            out.append((name, None))
            continue
        if pos + vlen > end:
            raise CorruptData("record header value overruns its blob", where=where)
        out.append((name, blob[pos : pos + vlen]))
        pos += vlen
    return tuple(out)


def _split(data: bytes, lengths: array[int], start: int) -> list[bytes]:
    ends = list(accumulate(lengths, initial=start))
    return [data[a:b] for a, b in pairwise(ends)]


def _split_nullable(data: bytes, lengths: array[int], start: int) -> list[bytes | None]:
    """Like :func:`_split`, a length of -1 giving None (and no bytes)."""
    present = array("i", [max(n, 0) for n in lengths])
    out: list[bytes | None] = list(_split(data, present, start))
    for i, n in enumerate(lengths):
        if n < 0:
            out[i] = None
    return out


def decode_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, where: str = "batch", verify: bool = True
) -> RecordBatch:
    """Decode the batch at ``buf[pos:]``, checking its CRC unless ``verify=False``.

    Raises :class:`CorruptData` (and nothing else) for any malformed input.
    """
    h = read_header(buf, pos, where=where)
    if verify:
        actual = batch_crc(buf, pos, h.length)
        if actual != h.crc:
            raise CorruptData(
                f"CRC mismatch (stored {h.crc:08x}, computed {actual:08x})", where=where
            )
    raw = bytes(memoryview(buf)[pos : pos + h.length])
    n = h.count
    cur = HEADER_SIZE
    ts = _from_le("q", raw[cur : cur + 8 * n])
    cur += 8 * n
    key_lengths = None
    if h.flags & FLAG_KEYS:
        key_lengths = _from_le("i", raw[cur : cur + 4 * n])
        cur += 4 * n
    value_lengths = _from_le("i", raw[cur : cur + 4 * n])
    cur += 4 * n
    header_lengths = None
    if h.flags & FLAG_HEADERS:
        header_lengths = _from_le("i", raw[cur : cur + 4 * n])
        cur += 4 * n

    nulls = bool(h.flags & FLAG_NULLS)
    null_values = 0
    if min(value_lengths) < 0:
        if not nulls or min(value_lengths) < -1:
            raise CorruptData("negative value length", where=where)
        null_values = value_lengths.count(-1)
    data_len = sum(value_lengths) + null_values
    if key_lengths is not None:
        if min(key_lengths) < -1:
            raise CorruptData("key length below -1", where=where)
        data_len += sum(key_lengths) + key_lengths.count(-1)
    if header_lengths is not None:
        if min(header_lengths) < 0:
            raise CorruptData("negative header length", where=where)
        data_len += sum(header_lengths)
    if cur + data_len != h.length:
        raise CorruptData(
            f"column lengths add up to {cur + data_len} bytes, batch has {h.length}", where=where
        )
    if min(ts) != h.min_timestamp or max(ts) != h.max_timestamp:
        raise CorruptData("timestamps disagree with header min/max", where=where)

    key_start = cur
    if key_lengths is not None:
        cur += sum(key_lengths) + key_lengths.count(-1)
    value_start = cur
    cur += sum(value_lengths) + null_values
    headers = None
    if header_lengths is not None:
        headers = [
            _decode_header_blob(b, where, nulls) if b else ()
            for b in _split(raw, header_lengths, cur)
        ]
    return RecordBatch(h, raw, ts, key_lengths, key_start, value_lengths, value_start, headers)


def with_base_offset(batch: bytes | bytearray | memoryview, base_offset: int) -> bytes:
    """A copy of ``batch`` with its base offset set (the CRC stays valid)."""
    if not _I64_MIN <= base_offset <= _I64_MAX:
        raise InvalidInput("base_offset out of range")
    if len(batch) < HEADER_SIZE:
        raise InvalidInput(f"{len(batch)} bytes cannot be a batch")
    out = bytearray(batch)
    _BASE_OFFSET.pack_into(out, _BASE_OFFSET_POS, base_offset)
    return bytes(out)


def base_offset_bytes(base_offset: int) -> bytes:
    """The 8 bytes that go at ``[8, 16)`` of a batch to set its base offset."""
    if not _I64_MIN <= base_offset <= _I64_MAX:
        raise InvalidInput("base_offset out of range")
    return _BASE_OFFSET.pack(base_offset)


def iter_batches(
    buf: bytes | bytearray | memoryview, *, where: str = "block", verify: bool = True
) -> Iterator[RecordBatch]:
    """Decode a concatenation of batches (a log-object block, a fetch response)."""
    pos, end = 0, len(buf)
    while pos < end:
        batch = decode_batch(buf, pos, where=f"{where}+{pos}", verify=verify)
        pos += batch.header.length
        yield batch


NEED_DATA: Final = object()
"""Returned by :meth:`BatchReader.next_batch` when more bytes are needed."""


class BatchReader:
    """Incremental decoder: feed bytes in any pieces, take whole batches out.

    Like h11's ``receive_data``/``next_event``: :meth:`feed` never raises,
    :meth:`next_batch` returns a :class:`RecordBatch` or :data:`NEED_DATA`, and
    raises :class:`CorruptData` as soon as the bytes seen cannot be a batch
    (so a hostile length cannot make it buffer forever).
    """

    def __init__(self, *, max_batch_bytes: int = MAX_BATCH_BYTES, where: str = "stream") -> None:
        self._buf = bytearray()
        self._max = max_batch_bytes
        self._where = where
        self._consumed = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def next_batch(self) -> RecordBatch | object:
        if len(self._buf) < 8:
            return NEED_DATA
        length, version, flags = struct.unpack_from("<IBB", self._buf)
        where = f"{self._where}+{self._consumed}"
        if version != VERSION:
            raise CorruptData(f"unsupported batch format version {version}", where=where)
        if flags & ~_KNOWN_FLAGS:
            raise CorruptData(f"unknown flags 0x{flags:02x}", where=where)
        if length < HEADER_SIZE or length > self._max:
            raise CorruptData(f"bad batch length {length} (limit {self._max})", where=where)
        if len(self._buf) < length:
            return NEED_DATA
        batch = decode_batch(self._buf, 0, where=where)
        del self._buf[:length]
        self._consumed += length
        return batch

    def at_boundary(self) -> bool:
        """True when no partial batch is buffered (a clean end of stream)."""
        return not self._buf
