"""Kafka's record batch format (magic 2), decoded for Produce and encoded for Fetch (sans-IO).

The layout (Kafka's ``DefaultRecordBatch``; all integers big-endian)::

    offset size field
    0      8    base_offset            i64
    8      4    batch_length           i32 bytes after this field
    12     4    partition_leader_epoch i32
    16     1    magic                  i8 = 2
    17     4    crc                    u32 CRC32C of bytes [21, end)
    21     2    attributes             i16 bits 0-2 compression (0 none, 1 gzip,
                                           2 snappy, 3 lz4, 4 zstd), bit 3
                                           timestamp type (LogAppendTime), bit 4
                                           transactional, bit 5 control
    23     4    last_offset_delta      i32
    27     8    base_timestamp         i64
    35     8    max_timestamp          i64
    43     8    producer_id            i64 (-1: not idempotent)
    51     2    producer_epoch         i16
    53     4    base_sequence          i32
    57     4    record_count           i32
    61          records (compressed as a whole when compression != 0)

    record: length varint, attributes i8, timestamp_delta varlong,
            offset_delta varint, key_length varint (-1 null), key,
            value_length varint (-1 null), value, header_count varint,
            headers: key_length varint, key (UTF-8), value_length varint
            (-1 null), value

Varints are zigzag-encoded (protobuf's ``sint``). Every length is checked
against the bytes that remain before anything is allocated, decompression
stops at ``max_bytes`` of output, and any inconsistency raises
:class:`~edge_gateway.errors.CorruptData` (a bad CRC, a truncated record, a
count that disagrees) -- never ``struct.error``, ``IndexError`` or a
decompressor's own exception. A compression this build cannot read raises
:class:`UnsupportedCompression`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import zstandard

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData, InvalidInput

__all__ = [
    "COMPRESSION_NAMES",
    "HEADER_SIZE",
    "KafkaBatch",
    "KafkaRecord",
    "UnsupportedCompression",
    "decode_batches",
    "encode_batch",
]

MAGIC: Final = 2
_HEAD = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE: Final = _HEAD.size  # 61
#: Bytes before ``batch_length`` counts (base_offset, batch_length).
_LOG_OVERHEAD: Final = 12
_CRC_START: Final = 21

COMPRESSION_NONE: Final = 0
COMPRESSION_GZIP: Final = 1
COMPRESSION_SNAPPY: Final = 2
COMPRESSION_LZ4: Final = 3
COMPRESSION_ZSTD: Final = 4
COMPRESSION_NAMES: Final = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_TIMESTAMP_TYPE: Final = 0x08
_TRANSACTIONAL: Final = 0x10
_CONTROL: Final = 0x20

#: Default bound on one batch's records once decompressed.
MAX_RECORDS_BYTES: Final = 64 * 1024 * 1024


class UnsupportedCompression(InvalidInput):
    """The batch is compressed with a codec this build cannot read (``codec`` names it)."""

    def __init__(self, message: str, codec: str) -> None:
        super().__init__(message)
        self.codec = codec


class KafkaRecord(NamedTuple):
    """One record of a batch (a tuple: the decoder makes one per record)."""

    offset_delta: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class KafkaBatch:
    base_offset: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[KafkaRecord]

    @property
    def compression(self) -> str:
        return COMPRESSION_NAMES.get(self.attributes & 0x07, "unknown")

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def control(self) -> bool:
        return bool(self.attributes & _CONTROL)

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & _TIMESTAMP_TYPE)


# ------------------------------------------------------------------ varints


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def write_varint(out: bytearray, n: int) -> None:
    """Append ``n`` (a signed 64-bit int) as a zigzag varint."""
    u = _zigzag(n) & 0xFFFFFFFFFFFFFFFF
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` in ``data``: (value, next position).

    The one definition of the decode: header fields call it, and the record
    loop of :func:`_records` inlines its one- and two-byte forms and calls it
    for longer ones. Reading past ``data`` raises IndexError, which
    :func:`_records` turns into :class:`CorruptData`.
    """
    shift = 0
    u = 0
    while True:
        b = data[pos]
        pos += 1
        u |= (b & 0x7F) << shift
        if not b & 0x80:
            return (u >> 1) ^ -(u & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptData("varint longer than 10 bytes")


# ------------------------------------------------------------------ decode


def _decompress(codec: int, data: bytes | memoryview, max_bytes: int, where: str) -> bytes:
    name = COMPRESSION_NAMES.get(codec)
    try:
        if codec == COMPRESSION_GZIP:
            d = zlib.decompressobj(wbits=47)  # gzip or zlib header
            out = d.decompress(data, max_bytes + 1)
            if len(out) > max_bytes:
                raise CorruptData(f"gzip records exceed {max_bytes} bytes", where=where)
            if not d.eof:
                raise CorruptData("truncated gzip stream", where=where)
            return out
        if codec == COMPRESSION_ZSTD:
            with zstandard.ZstdDecompressor().stream_reader(bytes(data)) as reader:
                out = reader.read(max_bytes + 1)
            if len(out) > max_bytes:
                raise CorruptData(f"zstd records exceed {max_bytes} bytes", where=where)
            return out
        if codec == COMPRESSION_LZ4:
            try:
                import lz4.frame
            except ImportError:
                raise UnsupportedCompression(
                    "lz4-compressed batch: install the lz4 extra (pip install 'edgegw[kafka]')",
                    "lz4",
                ) from None
            dec = lz4.frame.LZ4FrameDecompressor()
            out = dec.decompress(bytes(data), max_length=max_bytes + 1)
            if len(out) > max_bytes:
                raise CorruptData(f"lz4 records exceed {max_bytes} bytes", where=where)
            if not dec.eof:
                raise CorruptData("truncated lz4 frame", where=where)
            return bytes(out)
        if codec == COMPRESSION_SNAPPY:
            return _unsnappy(data, max_bytes, where)
    except (CorruptData, UnsupportedCompression):
        raise
    except (zlib.error, zstandard.ZstdError, RuntimeError, ValueError, OSError) as exc:
        # lz4.frame raises RuntimeError for a bad frame.
        raise CorruptData(f"{name} records do not decompress: {exc}", where=where) from None
    raise UnsupportedCompression(
        f"{name or f'codec {codec}'} compression is not supported "
        "(none, gzip, snappy, lz4, zstd are)",
        name or str(codec),
    )


#: Java clients (snappy-java's SnappyOutputStream) frame snappy: this magic, a
#: big-endian i32 version and i32 compatible version, then blocks of a
#: big-endian u32 length and that many bytes of raw snappy.
_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = 16
_XERIAL_BLOCK = struct.Struct(">I")


def _unsnappy(data: bytes | memoryview, max_bytes: int, where: str) -> bytes:
    """Raw snappy (librdkafka, kafka-python) or xerial-framed snappy (the Java client).

    Every raw block states its uncompressed length up front: that is checked
    against ``max_bytes`` before anything is allocated.
    """
    try:
        import cramjam
    except ImportError:
        raise UnsupportedCompression(
            "snappy-compressed batch: install the kafka extra (pip install 'edgegw[kafka]')",
            "snappy",
        ) from None
    raw = bytes(data)
    blocks: list[bytes] = []
    if raw.startswith(_XERIAL_MAGIC):
        if len(raw) < _XERIAL_HEADER:
            raise CorruptData("truncated xerial snappy header", where=where)
        pos = _XERIAL_HEADER
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise CorruptData("truncated xerial snappy block length", where=where)
            (n,) = _XERIAL_BLOCK.unpack_from(raw, pos)
            pos += 4
            if pos + n > len(raw):
                raise CorruptData("a xerial snappy block overruns the records", where=where)
            blocks.append(raw[pos : pos + n])
            pos += n
    else:
        blocks.append(raw)
    out: list[bytes] = []
    total = 0
    try:
        for block in blocks:
            total += cramjam.snappy.decompress_raw_len(block)
            if total > max_bytes:
                raise CorruptData(f"snappy records exceed {max_bytes} bytes", where=where)
            out.append(bytes(cramjam.snappy.decompress_raw(block)))
    except cramjam.DecompressionError as exc:
        raise CorruptData(f"snappy records do not decompress: {exc}", where=where) from None
    return out[0] if len(out) == 1 else b"".join(out)


def _header_bytes(data: bytes, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    """A header's key or value: a length varint (-1: null) and that many bytes, before ``end``."""
    n, pos = _varint(data, pos)
    if n < 0:
        if n != -1:
            raise CorruptData(f"negative {what} length {n}")
        return None, pos
    if n > end - pos:
        raise CorruptData(f"{what} length {n} runs past the record ({end - pos} bytes left)")
    return data[pos : pos + n], pos + n


def _records(
    buf: bytes | memoryview, count: int, base_ts: int, log_append: int | None, where: str
) -> list[KafkaRecord]:
    # The hot loop of Produce: the six varints of a record are read inline
    # for their common one- and two-byte forms, longer ones by _varint (a
    # ~150-byte record's length and value length take two bytes, and so do
    # offset deltas from 64 and timestamp deltas from 64 ms). This is the one
    # place the decode is written out again, on purpose: a call per field
    # (_varint with these fast paths) decoded 0.85-0.89x as many records a
    # second in bench/kafka_decode.py (issue 43), and a call for every form
    # but the one-byte one 0.73x.
    # Reading past the end raises IndexError (translated below); every
    # length is checked against its record's end before a slice is taken,
    # and each record must end exactly where its length says.
    data = bytes(buf)
    records: list[KafkaRecord] = []
    append = records.append
    pos, total = 0, len(data)
    try:
        for _ in range(count):
            b = data[pos]
            if b < 0x80:
                length, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:
                u = (b & 0x7F) | (data[pos + 1] << 7)
                length, pos = (u >> 1) ^ -(u & 1), pos + 2
            else:
                length, pos = _varint(data, pos)
            if length < 6 or length > total - pos:
                raise CorruptData(f"record length {length} with {total - pos} bytes left")
            end = pos + length
            pos += 1  # attributes: unused in magic 2
            b = data[pos]
            if b < 0x80:
                ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:
                u = (b & 0x7F) | (data[pos + 1] << 7)
                ts_delta, pos = (u >> 1) ^ -(u & 1), pos + 2
            else:
                ts_delta, pos = _varint(data, pos)
            b = data[pos]
            if b < 0x80:
                offset_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:
                u = (b & 0x7F) | (data[pos + 1] << 7)
                offset_delta, pos = (u >> 1) ^ -(u & 1), pos + 2
            else:
                offset_delta, pos = _varint(data, pos)
            b = data[pos]
            if b < 0x80:
                n, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:
                u = (b & 0x7F) | (data[pos + 1] << 7)
                n, pos = (u >> 1) ^ -(u & 1), pos + 2
            else:
                n, pos = _varint(data, pos)
            key: bytes | None = None
            if n >= 0:
                if n > end - pos:
                    raise CorruptData(f"key length {n} runs past the record")
                key = data[pos : pos + n]
                pos += n
            elif n != -1:
                raise CorruptData(f"negative key length {n}")
            b = data[pos]
            if b < 0x80:
                n, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:
                u = (b & 0x7F) | (data[pos + 1] << 7)
                n, pos = (u >> 1) ^ -(u & 1), pos + 2
            else:
                n, pos = _varint(data, pos)
            value: bytes | None = None
            if n >= 0:
                if n > end - pos:
                    raise CorruptData(f"value length {n} runs past the record")
                value = data[pos : pos + n]
                pos += n
            elif n != -1:
                raise CorruptData(f"negative value length {n}")
            b = data[pos]
            if b < 0x80:
                nh, pos = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:
                u = (b & 0x7F) | (data[pos + 1] << 7)
                nh, pos = (u >> 1) ^ -(u & 1), pos + 2
            else:
                nh, pos = _varint(data, pos)
            headers: tuple[tuple[str, bytes | None], ...] = ()
            if nh:
                if nh < 0 or nh > end - pos:
                    raise CorruptData(f"{nh} headers in {end - pos} bytes")
                hs: list[tuple[str, bytes | None]] = []
                for _ in range(nh):
                    hk, pos = _header_bytes(data, pos, end, "header key")
                    if hk is None:
                        raise CorruptData("a header with a null key")
                    hv, pos = _header_bytes(data, pos, end, "header value")
                    try:
                        hs.append((hk.decode("utf-8"), hv))
                    except UnicodeDecodeError:
                        raise CorruptData("a header key is not UTF-8") from None
                headers = tuple(hs)
            if pos != end:
                raise CorruptData(f"{end - pos} bytes after the record's fields")
            ts = log_append if log_append is not None else base_ts + ts_delta
            append(KafkaRecord(offset_delta, ts, key, value, headers))
    except CorruptData as exc:
        raise CorruptData(exc.reason, where=f"{where} record {len(records)}") from None
    except IndexError:
        raise CorruptData("truncated record", where=f"{where} record {len(records)}") from None
    if pos != total:
        raise CorruptData(f"{total - pos} bytes after {count} records", where=where)
    return records


def decode_batches(
    data: bytes | memoryview,
    *,
    max_records_bytes: int = MAX_RECORDS_BYTES,
    where: str = "records",
) -> Iterator[KafkaBatch]:
    """The record batches of a Produce request's ``records`` field, checked.

    A trailing partial batch (which Kafka allows only in Fetch responses) is
    an error here: a producer sends whole batches.
    """
    buf = memoryview(data)
    pos, total = 0, len(buf)
    while pos < total:
        at = f"{where} @{pos}"
        if total - pos < HEADER_SIZE:
            raise CorruptData(f"{total - pos} bytes: shorter than a batch header", where=at)
        (
            base_offset,
            batch_length,
            _epoch,
            magic,
            crc,
            attributes,
            last_delta,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        ) = _HEAD.unpack_from(buf, pos)
        if magic != MAGIC:
            raise CorruptData(
                f"record batch magic {magic}: only magic 2 (Kafka 0.11+) is accepted", where=at
            )
        end = pos + _LOG_OVERHEAD + batch_length
        if batch_length < HEADER_SIZE - _LOG_OVERHEAD or end > total:
            raise CorruptData(
                f"batch length {batch_length} with {total - pos - _LOG_OVERHEAD} bytes left",
                where=at,
            )
        actual = crc32c(buf[pos + _CRC_START : end])
        if actual != crc:
            raise CorruptData(f"CRC32C {actual:#010x} != {crc:#010x}", where=at)
        if count < 0 or last_delta < 0 or (count and last_delta < count - 1):
            raise CorruptData(
                f"record count {count} disagrees with last offset delta {last_delta}",
                where=at,
            )
        body = buf[pos + HEADER_SIZE : end]
        codec = attributes & 0x07
        if codec != COMPRESSION_NONE:
            body = memoryview(_decompress(codec, body, max_records_bytes, at))
        elif len(body) > max_records_bytes:
            raise CorruptData(f"records exceed {max_records_bytes} bytes", where=at)
        if count > len(body) // 7 + 1:  # a record takes at least 7 bytes
            raise CorruptData(f"{count} records in {len(body)} bytes", where=at)
        log_append = max_ts if attributes & _TIMESTAMP_TYPE else None
        records = _records(body, count, base_ts, log_append, at)
        yield KafkaBatch(
            base_offset,
            attributes,
            last_delta,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            records,
        )
        pos = end


# ------------------------------------------------------------------ encode


def _put_bytes(out: bytearray, b: bytes | None) -> None:
    if b is None:
        out.append(1)  # zigzag(-1)
    else:
        write_varint(out, len(b))
        out += b


def encode_batch(
    base_offset: int,
    records: Sequence[tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """One uncompressed batch of ``(timestamp, key, value, headers)`` at consecutive offsets."""
    if not records:
        raise InvalidInput("a record batch holds at least one record")
    base_ts = min(r[0] for r in records)
    max_ts = max(r[0] for r in records)
    body = bytearray()
    rec = bytearray()
    for delta, (ts, key, value, headers) in enumerate(records):
        rec.clear()
        rec.append(0)
        write_varint(rec, ts - base_ts)
        write_varint(rec, delta)
        _put_bytes(rec, key)
        _put_bytes(rec, value)
        write_varint(rec, len(headers))
        for name, hv in headers:
            _put_bytes(rec, name.encode("utf-8"))
            _put_bytes(rec, hv)
        write_varint(body, len(rec))
        body += rec
    n = len(records)
    head = bytearray(
        _HEAD.pack(
            base_offset,
            HEADER_SIZE - _LOG_OVERHEAD + len(body),
            0,
            MAGIC,
            0,
            0,
            n - 1,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            n,
        )
    )
    crc = crc32c(body, value=crc32c(bytes(head[_CRC_START:])))
    struct.pack_into(">I", head, 17, crc)
    return bytes(head) + bytes(body)
