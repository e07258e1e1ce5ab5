"""Kafka record batches (magic 2): decoded as clients write them, encoded as they read them."""

from __future__ import annotations

import gzip
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData
from edge_gateway.format.kafka_batch import (
    HEADER_SIZE,
    KafkaRecord,
    UnsupportedCompression,
    decode_batches,
    encode_batch,
)

RECORDS = [
    (1_700_000_000_000, b"k", b"v" * 50, [("h", b"x"), ("n", None)]),
    (1_699_999_999_999, None, None, []),
    (1_700_000_000_005, b"", b"", [("\u00e9", b"")]),
]


def _client_batch(codec: int, base_sequence: int = -1, producer_id: int = -1) -> bytes:
    """A batch as kafka-python's producer builds it."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for i, (ts, key, value, headers) in enumerate(RECORDS):
        b.append(i, timestamp=ts, key=key, value=value, headers=headers)
    return bytes(b.build())


@pytest.mark.parametrize(("codec", "name"), [(0, "none"), (1, "gzip"), (3, "lz4"), (4, "zstd")])
def test_decodes_what_kafka_python_writes(codec: int, name: str) -> None:
    (batch,) = decode_batches(_client_batch(codec))
    assert batch.compression == name
    assert batch.producer_id == -1
    assert [(r.offset_delta, r.timestamp, r.key, r.value, r.headers) for r in batch.records] == [
        (i, ts, k, v, tuple(h)) for i, (ts, k, v, h) in enumerate(RECORDS)
    ]


def test_idempotence_fields_are_read() -> None:
    (batch,) = decode_batches(_client_batch(0, base_sequence=7, producer_id=42))
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (42, 0, 7)


def test_kafka_python_reads_what_we_encode() -> None:
    from kafka.record.default_records import DefaultRecordBatch

    data = encode_batch(10, RECORDS)
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc()
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    assert got == [(10 + i, ts, k, v, list(h)) for i, (ts, k, v, h) in enumerate(RECORDS)]


def _compressed(codec: int, body: bytes, records: list = RECORDS) -> bytes:  # type: ignore[type-arg]
    """The uncompressed batch of ``records`` with its records section replaced by ``body``."""
    head = bytearray(encode_batch(0, records)[:HEADER_SIZE])
    struct.pack_into(">i", head, 8, HEADER_SIZE - 12 + len(body))
    struct.pack_into(">h", head, 21, codec)
    return _with_crc(head + body)


def _xerial(data: bytes, block: int) -> bytes:
    """Snappy framed as the Java client (snappy-java) writes it."""
    import cramjam

    out = [b"\x82SNAPPY\x00", struct.pack(">ii", 1, 1)]
    for i in range(0, len(data), block):
        raw = bytes(cramjam.snappy.compress_raw(data[i : i + block]))
        out += [struct.pack(">I", len(raw)), raw]
    return b"".join(out)


def test_snappy_raw_and_xerial_framed() -> None:
    """librdkafka writes raw snappy, the Java client xerial-framed snappy: both decode."""
    import cramjam

    records = encode_batch(0, RECORDS)[HEADER_SIZE:]
    want = [KafkaRecord(i, ts, k, v, tuple(h)) for i, (ts, k, v, h) in enumerate(RECORDS)]
    raw = bytes(cramjam.snappy.compress_raw(records))
    for body in (raw, _xerial(records, 16), _xerial(records, 1 << 15)):
        (batch,) = decode_batches(_compressed(2, body))
        assert batch.compression == "snappy"
        assert batch.records == want


def test_snappy_is_bounded_and_corruption_is_corrupt_data() -> None:
    import cramjam

    big = bytes(cramjam.snappy.compress_raw(b"\0" * (4 << 20)))
    with pytest.raises(CorruptData, match="exceed"):
        list(decode_batches(_compressed(2, big), max_records_bytes=1 << 20))
    with pytest.raises(CorruptData, match="exceed"):  # the blocks' lengths add up
        list(
            decode_batches(
                _compressed(2, _xerial(b"\0" * (2 << 20), 1 << 19)), max_records_bytes=1 << 20
            )
        )
    framed = _xerial(encode_batch(0, RECORDS)[HEADER_SIZE:], 16)
    for body, match in [
        (b"not compressed at all", "decompress"),
        (framed[:10], "truncated xerial snappy header"),
        (framed[:18], "truncated xerial snappy block length"),
        (framed[:-1], "overruns"),
        (framed[:16] + struct.pack(">I", 3) + b"\xff\xff\xff", "decompress"),
    ]:
        with pytest.raises(CorruptData, match=match):
            list(decode_batches(_compressed(2, body)))


def test_snappy_without_cramjam_is_unsupported_compression(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    import cramjam

    data = _compressed(2, bytes(cramjam.snappy.compress_raw(b"x")))
    monkeypatch.setitem(sys.modules, "cramjam", None)
    with pytest.raises(UnsupportedCompression, match=r"edgegw\[kafka\]") as info:
        list(decode_batches(data))
    assert info.value.codec == "snappy"


def test_an_unknown_codec_is_refused_by_number() -> None:
    data = bytearray(encode_batch(0, RECORDS))
    struct.pack_into(">h", data, 21, 5)
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    with pytest.raises(UnsupportedCompression, match="codec 5") as info:
        list(decode_batches(bytes(data)))
    assert info.value.codec == "5"


def test_a_flipped_bit_fails_the_crc() -> None:
    data = bytearray(encode_batch(0, RECORDS))
    data[-3] ^= 0x10
    with pytest.raises(CorruptData, match="CRC32C"):
        list(decode_batches(bytes(data)))


def test_every_truncation_is_corrupt_data() -> None:
    data = encode_batch(0, RECORDS) + encode_batch(3, RECORDS[:1])
    first = len(encode_batch(0, RECORDS))
    for cut in range(1, len(data)):
        if cut == first:
            continue  # a whole first batch: valid
        with pytest.raises(CorruptData):
            list(decode_batches(data[:cut]))


def _with_crc(data: bytearray) -> bytes:
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


@pytest.mark.parametrize(
    ("pos", "fmt", "value", "match"),
    [
        (8, ">i", 2**31 - 1, "batch length"),
        (8, ">i", -5, "batch length"),
        (57, ">i", 2**31 - 1, "record count"),
        (57, ">i", -1, "record count"),
        (16, ">b", 1, "magic"),
    ],
)
def test_hostile_header_fields(pos: int, fmt: str, value: int, match: str) -> None:
    data = bytearray(encode_batch(0, RECORDS))
    struct.pack_into(fmt, data, pos, value)
    if pos != 8:
        data = bytearray(_with_crc(data))
    with pytest.raises(CorruptData, match=match):
        list(decode_batches(bytes(data)))


def test_a_huge_record_length_is_refused_without_allocating() -> None:
    data = bytearray(encode_batch(0, RECORDS[:1]))
    # The first record's length varint: 0xFFFFFFFF0F zigzag -> -2**31 ... use a huge positive.
    data[HEADER_SIZE : HEADER_SIZE + 1] = b"\xfe\xff\xff\xff\x0f"
    struct.pack_into(">i", data, 8, len(data) - 12)
    with pytest.raises(CorruptData, match="record length"):
        list(decode_batches(_with_crc(data)))


def test_decompression_is_bounded() -> None:
    body = gzip.compress(b"\0" * (4 << 20))
    head = bytearray(encode_batch(0, RECORDS[:1])[:HEADER_SIZE])
    struct.pack_into(">i", head, 8, HEADER_SIZE - 12 + len(body))
    struct.pack_into(">h", head, 21, 1)
    with pytest.raises(CorruptData, match="exceed"):
        list(decode_batches(_with_crc(head + body), max_records_bytes=1 << 20))


def test_garbage_compressed_records_are_corrupt_data() -> None:
    for codec in (1, 2, 3, 4):
        head = bytearray(encode_batch(0, RECORDS[:1])[:HEADER_SIZE])
        body = b"not compressed at all"
        struct.pack_into(">i", head, 8, HEADER_SIZE - 12 + len(body))
        struct.pack_into(">h", head, 21, codec)
        with pytest.raises(CorruptData, match=r"decompress|truncated"):
            list(decode_batches(_with_crc(head + body)))


_bytes = st.one_of(st.none(), st.binary(max_size=40))
_record = st.tuples(
    st.integers(min_value=0, max_value=2**62),
    _bytes,
    _bytes,
    st.lists(st.tuples(st.text(max_size=8), _bytes), max_size=3),
)


@given(st.integers(min_value=0, max_value=2**62), st.lists(_record, min_size=1, max_size=8))
def test_round_trip(base_offset: int, records: list[tuple]) -> None:  # type: ignore[type-arg]
    (batch,) = decode_batches(encode_batch(base_offset, records))
    assert batch.base_offset == base_offset
    assert batch.records == [
        KafkaRecord(i, ts, k, v, tuple(h)) for i, (ts, k, v, h) in enumerate(records)
    ]


def test_lz4_without_the_extra_is_unsupported_compression(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    data = _client_batch(3)
    monkeypatch.setitem(sys.modules, "lz4", None)
    monkeypatch.setitem(sys.modules, "lz4.frame", None)
    with pytest.raises(UnsupportedCompression, match=r"edgegw\[kafka\]") as info:
        list(decode_batches(data))
    assert info.value.codec == "lz4"


def test_varints_at_the_one_two_and_three_byte_boundaries() -> None:
    """Every varint field of a record read across the sizes the decoder inlines (one and
    two bytes) and the ones it calls for: zigzag 64 and 8192 are the first of two and
    three bytes; 8,200 records take offset deltas past both."""
    sizes = [0, 1, 31, 32, 63, 64, 65, 127, 128, 4095, 4096, 8191, 8192, 9000]
    records = []
    for i in range(8200):
        n = sizes[i % len(sizes)]
        ts = 1_700_000_000_000 + [0, 63, 64, 8191, 8192, -64, -65][i % 7]
        key = None if i % 5 == 0 else b"k" * sizes[(i // 3) % len(sizes)]
        value = None if i % 11 == 0 else bytes([i % 256]) * n
        records.append((ts, key, value, [("h", b"v" * (i % 70))] if i % 13 == 0 else []))
    (batch,) = decode_batches(encode_batch(5, records), max_records_bytes=256 << 20)
    assert batch.records == [
        KafkaRecord(i, ts, k, v, tuple(h)) for i, (ts, k, v, h) in enumerate(records)
    ]
    # and truncated in the middle of a two-byte varint: corrupt, not a crash
    data = encode_batch(0, [(1, None, b"x" * 100, [])])
    body_start = HEADER_SIZE
    cut = bytearray(data[: body_start + 1])  # the record length's first byte only
    struct.pack_into(">i", cut, 8, len(cut) - 12)
    with pytest.raises(CorruptData, match="truncated"):
        list(decode_batches(_with_crc(cut)))


@pytest.mark.parametrize(
    ("header_varints", "match"),
    [
        (b"\x02\x14", r"header key length 10 runs past the record \(\d+ bytes left\)"),
        (b"\x02\x03", "negative header key length -2"),
        (b"\x02\x01", "a header with a null key"),
        (b"\x02\x02h\x05", "negative header value length -3"),
        (b"\x02\x02h" + b"\x80" * 10 + b"\x01", "varint longer than 10 bytes"),
    ],
)
def test_a_bad_header_field_is_corrupt_data_naming_the_field(
    header_varints: bytes, match: str
) -> None:
    """A record whose header count and header fields are ``header_varints`` (the record's
    length re-stated to cover them): refused with a reason that names the field."""
    fields = b"\x00\x00\x00\x01\x01" + header_varints  # attributes, deltas, null key and value
    record = bytearray()
    n = len(fields) << 1  # zigzag of a small positive length
    while n >= 0x80:
        record.append((n & 0x7F) | 0x80)
        n >>= 7
    record.append(n)
    data = bytearray(encode_batch(0, [(1, None, None, [])])[:HEADER_SIZE]) + record + fields
    struct.pack_into(">i", data, 8, len(data) - 12)
    with pytest.raises(CorruptData, match=match) as info:
        list(decode_batches(_with_crc(data)))
    assert "record 0" in str(info.value)
