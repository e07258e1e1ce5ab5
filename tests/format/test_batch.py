"""Record batch v1 (``edge_gateway.format.batch``): round trips, incremental
decoding, corruption and bad encoder input.

The module docstring of ``batch.py`` is the spec these tests hold it to. The
decoders promise to raise :class:`CorruptData` and nothing else for malformed
bytes, so the corruption tests catch *every* exception and fail on any other
type, instead of letting an ``IndexError`` look like a crash of the test.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from functools import partial
from itertools import pairwise

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import edge_gateway.format.batch as batch_mod
from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.format.batch import (
    FLAG_HEADERS,
    FLAG_KEYS,
    FLAG_NULLS,
    HEADER_SIZE,
    NEED_DATA,
    BatchReader,
    Record,
    RecordBatch,
    base_offset_bytes,
    batch_crc,
    decode_batch,
    encode_batch,
    encode_records,
    iter_batches,
    read_header,
    with_base_offset,
)

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

# The machine is shared; these sizes keep the whole module to about ten seconds.
FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------
# strategies and helpers

timestamps_st = st.integers(I64_MIN, I64_MAX)
# Mostly small values so neighbouring timestamps collide and min/max ties occur.
any_timestamp = st.one_of(st.integers(-3, 3), timestamps_st)
keys_st = st.one_of(st.none(), st.binary(max_size=12))
headers_st = st.lists(st.tuples(st.text(max_size=6), st.binary(max_size=6)), max_size=3).map(tuple)
# Under the NULLS flag: a header value may be None.
null_headers_st = st.lists(
    st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=6))), max_size=3
).map(tuple)


@st.composite
def record_lists(draw: st.DrawFn, max_records: int = 12) -> list[Record]:
    """Contiguous records; some batches without keys or headers at all."""
    n = draw(st.integers(1, max_records))
    base = draw(st.one_of(st.integers(0, 1000), st.integers(I64_MIN, I64_MAX - n + 1)))
    with_keys = draw(st.booleans())
    with_headers = draw(st.booleans())
    # A third of the lists may hold null values and null header values.
    with_nulls = draw(st.integers(0, 2)) == 0
    values = st.one_of(st.none(), st.binary(max_size=24)) if with_nulls else st.binary(max_size=24)
    hs = null_headers_st if with_nulls else headers_st
    return [
        Record(
            offset=base + i,
            timestamp=draw(any_timestamp),
            key=draw(keys_st) if with_keys else None,
            value=draw(values),
            headers=draw(hs) if with_headers else (),
        )
        for i in range(n)
    ]


# The batch of test_golden_vector; TAMPERS index into its bytes (see GOLDEN_HEX).
GOLDEN_RECORDS = [
    Record(5, 1000, b"k", b"v1", (("h", b"x"),)),
    Record(6, 1002, None, b"", ()),
]

batches_st = record_lists().map(encode_records)
batch_lists = st.lists(record_lists(max_records=5).map(encode_records), min_size=1, max_size=4)


def check_header(b: RecordBatch, records: list[Record], raw: bytes) -> None:
    h = b.header
    assert h.length == len(raw) == len(b.raw)
    assert b.raw == raw
    assert b.count == len(b) == h.count == len(records)
    assert b.base_offset == h.base_offset == records[0].offset
    assert b.next_offset == h.next_offset == records[-1].offset + 1
    assert h.last_offset == records[-1].offset
    assert h.min_timestamp == min(r.timestamp for r in records)
    assert h.max_timestamp == max(r.timestamp for r in records)
    assert h.crc == batch_crc(raw, 0, len(raw))


def only_corrupt(fn: Callable[[], object]) -> object:
    """Run ``fn``; CorruptData is returned, success passes through, anything
    else fails the test with the offending exception type in the message."""
    try:
        return fn()
    except CorruptData as exc:
        return exc
    except Exception as exc:
        pytest.fail(f"{type(exc).__name__} escaped a decoder: {exc!r}")


def drain(reader: BatchReader) -> list[RecordBatch]:
    out = []
    while True:
        got = reader.next_batch()
        if got is NEED_DATA:
            return out
        assert isinstance(got, RecordBatch)
        out.append(got)


def fix_crc(buf: bytearray) -> bytearray:
    """Recompute the CRC of the batch that fills ``buf`` (after tampering)."""
    struct.pack_into("<I", buf, 16, batch_crc(buf, 0, len(buf)))
    return buf


def pieces(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in pairwise(points)]


# --------------------------------------------------------------------------
# 1. round trips


@SLOW
@given(record_lists())
def test_encode_records_round_trip(records: list[Record]) -> None:
    raw = encode_records(records)
    b = decode_batch(raw)
    assert b.records() == records
    check_header(b, records, raw)
    has_keys = any(r.key is not None for r in records)
    has_headers = any(r.headers for r in records)
    assert bool(b.header.flags & FLAG_KEYS) == has_keys
    assert bool(b.header.flags & FLAG_HEADERS) == has_headers
    has_nulls = any(r.value is None or any(v is None for _, v in r.headers) for r in records)
    assert bool(b.header.flags & FLAG_NULLS) == has_nulls
    assert b.header.flags & ~(FLAG_KEYS | FLAG_HEADERS | FLAG_NULLS) == 0


@SLOW
@given(record_lists(), st.booleans(), st.booleans())
def test_encode_batch_round_trip(records: list[Record], keys_col: bool, headers_col: bool) -> None:
    # Explicit columns: a keys column of all-None and a headers column of
    # empty lists are allowed and must decode the same as leaving them out.
    raw = encode_batch(
        [r.value for r in records],
        keys=[r.key for r in records] if keys_col else None,
        timestamps=[r.timestamp for r in records],
        headers=[r.headers for r in records] if headers_col else None,
        base_offset=records[0].offset,
    )
    b = decode_batch(raw)
    expected = [
        Record(
            r.offset,
            r.timestamp,
            r.key if keys_col else None,
            r.value,
            r.headers if headers_col else (),
        )
        for r in records
    ]
    assert b.records() == expected
    check_header(b, expected, raw)
    assert b.values == [r.value for r in expected]
    assert b.keys == [r.key for r in expected]
    assert b.headers == [r.headers for r in expected]
    assert list(b.timestamps) == [r.timestamp for r in expected]


def test_none_and_empty_key_stay_distinct() -> None:
    records = [Record(0, 1, None, b""), Record(1, 1, b"", b""), Record(2, 1, b"k", b"")]
    b = decode_batch(encode_records(records))
    assert b.keys == [None, b"", b"k"]
    assert b.records() == records


def test_null_and_empty_values_stay_distinct() -> None:
    # A null value (a Kafka tombstone) and a null header value are not empty ones.
    records = [
        Record(0, 1, b"k", None, (("a", None), ("b", b""))),
        Record(1, 1, None, b"", (("a", b""),)),
        Record(2, 1, None, b"v", ()),
    ]
    raw = encode_records(records)
    b = decode_batch(raw)
    assert b.header.flags == FLAG_KEYS | FLAG_HEADERS | FLAG_NULLS
    assert b.values == [None, b"", b"v"]
    assert b.records() == records
    # The fast one-record path hands a null value to encode_batch: the same bytes.
    assert batch_mod.encode_record(None, timestamp=1) == encode_batch([None], timestamps=1)
    assert decode_batch(batch_mod.encode_record(None, timestamp=1)).values == [None]


def test_batches_without_nulls_keep_their_bytes() -> None:
    # The golden bytes of a batch with no null did not change (NULLS is not set).
    raw = encode_records(GOLDEN_RECORDS)
    assert raw.hex() == GOLDEN_HEX
    assert not decode_batch(raw).header.flags & FLAG_NULLS


def test_null_lengths_without_the_flag_are_corrupt() -> None:
    # -1 as a value length, or 0xFFFFFFFF as a header value length, means null
    # only under NULLS: without the flag the batch is corrupt, not misread.
    raw = bytearray(encode_batch([None, b"ab"], timestamps=0))
    raw[5] &= ~FLAG_NULLS
    err = only_corrupt(lambda: decode_batch(fix_crc(raw)))
    assert isinstance(err, CorruptData)
    assert "negative value length" in str(err)
    raw = bytearray(encode_batch([b"x"], timestamps=0, headers=[(("h", None),)]))
    raw[5] &= ~FLAG_NULLS
    err = only_corrupt(lambda: decode_batch(fix_crc(raw)))
    assert isinstance(err, CorruptData)
    # -2 is never a length, NULLS or not
    raw = bytearray(encode_batch([None], timestamps=0))
    struct.pack_into("<i", raw, HEADER_SIZE + 8, -2)
    assert isinstance(only_corrupt(lambda: decode_batch(fix_crc(raw))), CorruptData)


def test_all_empty_values_decode() -> None:
    # The smallest batches: no value bytes at all (40-byte header + columns).
    for n in (1, 2, 7):
        raw = encode_batch([b""] * n, timestamps=0)
        assert len(raw) == HEADER_SIZE + n * 12
        assert decode_batch(raw).values == [b""] * n
        raw = encode_batch([b""] * n, keys=[None] * n, timestamps=0)
        assert len(raw) == HEADER_SIZE + n * 16
        assert decode_batch(raw).keys == [None] * n


@FAST
@given(
    st.lists(st.binary(max_size=8), min_size=1, max_size=8),
    timestamps_st,
    st.integers(I64_MIN, I64_MAX),
)
def test_shared_timestamp(values: list[bytes], ts: int, base: int) -> None:
    b = decode_batch(encode_batch(values, timestamps=ts, base_offset=base))
    assert list(b.timestamps) == [ts] * len(values)
    assert b.header.min_timestamp == b.header.max_timestamp == ts
    assert b.base_offset == base
    assert b.values == values


def test_extreme_values_round_trip() -> None:
    records = [
        Record(I64_MAX - 1, I64_MIN, b"\x00", b"\xff" * 3, (("", b""),)),
        Record(I64_MAX, I64_MAX, None, b"", (("\U0001f600é", b"\x00"), ("", b""))),
    ]
    b = decode_batch(encode_records(records))
    assert b.records() == records
    assert b.header.min_timestamp == I64_MIN
    assert b.header.max_timestamp == I64_MAX


@FAST
@given(record_lists(), st.integers(-5, 20))
def test_records_from_start_offset(records: list[Record], skip: int) -> None:
    b = decode_batch(encode_records(records))
    start = records[0].offset + skip
    assert b.records(start) == [r for r in records if r.offset >= start]


@FAST
@given(batches_st, st.binary(max_size=10), st.binary(max_size=10))
def test_decode_at_position_and_buffer_types(raw: bytes, before: bytes, after: bytes) -> None:
    expected = decode_batch(raw).records()
    buf = before + raw + after
    for view in (buf, bytearray(buf), memoryview(buf)):
        b = decode_batch(view, len(before))
        assert b.records() == expected
        assert b.raw == raw
        assert read_header(view, len(before)).length == len(raw)


_encode_record = getattr(batch_mod, "encode_record", None)


@pytest.mark.skipif(_encode_record is None, reason="no encode_record fast path")
@FAST
@given(
    st.binary(max_size=24),
    keys_st,
    st.one_of(st.none(), headers_st),
    timestamps_st,
    st.integers(I64_MIN, I64_MAX),
)
def test_encode_record_matches_encode_batch(
    value: bytes,
    key: bytes | None,
    headers: tuple[tuple[str, bytes], ...] | None,
    ts: int,
    base: int,
) -> None:
    # The one-record fast path must produce exactly the encode_batch bytes.
    assert _encode_record is not None
    fast = _encode_record(value, timestamp=ts, key=key, headers=headers, base_offset=base)
    slow = encode_batch(
        [value],
        keys=None if key is None else [key],
        timestamps=[ts],
        headers=None if headers is None else [headers],
        base_offset=base,
    )
    assert fast == slow
    assert decode_batch(fast).records() == [Record(base, ts, key, value, headers or ())]


@pytest.mark.skipif(_encode_record is None, reason="no encode_record fast path")
@pytest.mark.parametrize(
    ("value", "kwargs"),
    [
        (b"x", {"timestamp": 2**63}),
        (b"x", {"timestamp": I64_MIN - 1}),
        (b"x", {"timestamp": 0, "base_offset": 2**63}),
        (b"x", {"timestamp": 1.5}),
        (b"x", {"timestamp": 0, "key": "k"}),
        (b"x", {"timestamp": 0, "key": ""}),
        ("x", {"timestamp": 0}),
    ],
)
def test_encode_record_rejects(value: object, kwargs: dict[str, object]) -> None:
    assert _encode_record is not None
    with pytest.raises(InvalidInput):
        _encode_record(value, **kwargs)


# --------------------------------------------------------------------------
# 2. with_base_offset


@FAST
@given(record_lists(), st.integers(I64_MIN, I64_MAX))
def test_with_base_offset(records: list[Record], new_base: int) -> None:
    raw = encode_records(records)
    moved = with_base_offset(raw, new_base)
    assert len(moved) == len(raw)
    # Only bytes [8, 16) change, and the stored CRC still matches.
    assert moved[:8] == raw[:8]
    assert moved[16:] == raw[16:]
    assert moved[8:16] == base_offset_bytes(new_base)
    b = decode_batch(moved)
    assert b.base_offset == new_base
    assert b.next_offset == new_base + len(records)
    assert [(r.timestamp, r.key, r.value, r.headers) for r in b.records()] == [
        (r.timestamp, r.key, r.value, r.headers) for r in records
    ]
    assert [r.offset for r in b.records()] == [new_base + i for i in range(len(records))]
    # bytearray and memoryview inputs too, and a second move back.
    assert with_base_offset(bytearray(moved), records[0].offset) == raw
    assert with_base_offset(memoryview(moved), records[0].offset) == raw


# --------------------------------------------------------------------------
# 3. BatchReader


def test_reader_whole() -> None:
    raws = [encode_batch([b"a" * i], timestamps=i, base_offset=i) for i in range(1, 5)]
    reader = BatchReader()
    assert reader.at_boundary()
    assert reader.next_batch() is NEED_DATA
    reader.feed(b"".join(raws))
    got = drain(reader)
    assert [b.raw for b in got] == raws
    assert reader.at_boundary()
    assert reader.buffered == 0


@FAST
@given(batch_lists)
def test_reader_one_byte_at_a_time(raws: list[bytes]) -> None:
    boundaries = set()
    total = 0
    for r in raws:
        total += len(r)
        boundaries.add(total)
    data = b"".join(raws)
    reader = BatchReader()
    got: list[RecordBatch] = []
    last_end = 0
    for i in range(len(data)):
        reader.feed(data[i : i + 1])
        got += drain(reader)
        if i + 1 in boundaries:
            last_end = i + 1
        # A partial batch is buffered everywhere except right after a batch end.
        assert reader.at_boundary() == (i + 1 == last_end)
        assert reader.buffered == i + 1 - last_end
        assert len(got) == sum(1 for e in boundaries if e <= i + 1)
    assert [b.raw for b in got] == raws
    assert [b.records() for b in got] == [decode_batch(r).records() for r in raws]


@SLOW
@given(batch_lists, st.lists(st.integers(0, 10_000), max_size=12))
def test_reader_random_pieces(raws: list[bytes], cuts: list[int]) -> None:
    data = b"".join(raws)
    reader = BatchReader(where="peer")
    got: list[RecordBatch] = []
    for piece in pieces(data, cuts):
        reader.feed(piece)
        got += drain(reader)
    assert [b.raw for b in got] == raws
    assert reader.at_boundary()


@FAST
@given(batch_lists, st.lists(st.integers(0, 10_000), max_size=6))
def test_reader_feed_types(raws: list[bytes], cuts: list[int]) -> None:
    data = b"".join(raws)
    reader = BatchReader()
    for i, piece in enumerate(pieces(data, cuts)):
        reader.feed((bytes, bytearray, memoryview)[i % 3](piece))
    assert [b.raw for b in drain(reader)] == raws


def test_reader_truncated_stream_is_not_at_boundary() -> None:
    raw = encode_batch([b"hello"], timestamps=0)
    for cut in range(1, len(raw)):
        reader = BatchReader()
        reader.feed(raw[:cut])
        assert reader.next_batch() is NEED_DATA
        assert not reader.at_boundary()
        assert reader.buffered == cut


@pytest.mark.parametrize(
    ("length", "max_batch_bytes"),
    [
        (0xFFFFFFFF, batch_mod.MAX_BATCH_BYTES),
        (batch_mod.MAX_BATCH_BYTES + 1, batch_mod.MAX_BATCH_BYTES),
        (1000, 999),
        (HEADER_SIZE - 1, batch_mod.MAX_BATCH_BYTES),
        (0, batch_mod.MAX_BATCH_BYTES),
    ],
)
def test_reader_hostile_length_fails_fast(length: int, max_batch_bytes: int) -> None:
    # Only the first 8 bytes are fed: the reader must refuse rather than wait
    # for `length` bytes that would never be allowed anyway.
    reader = BatchReader(max_batch_bytes=max_batch_bytes, where="peer")
    reader.feed(struct.pack("<IBBH", length, 1, 0, 0))
    with pytest.raises(CorruptData, match="length") as exc_info:
        reader.next_batch()
    assert exc_info.value.where == "peer+0"
    # Like h11: the error leaves the state as it was, and repeats.
    assert reader.buffered == 8
    with pytest.raises(CorruptData):
        reader.next_batch()


@pytest.mark.parametrize(
    ("head", "match"),
    [
        (struct.pack("<IBBH", 100, 2, 0, 0), "version"),
        (struct.pack("<IBBH", 100, 0, 0, 0), "version"),
        (struct.pack("<IBBH", 100, 1, 0x08, 0), "flags"),
        (struct.pack("<IBBH", 100, 1, 0x80, 0), "flags"),
    ],
)
def test_reader_bad_prefix_fails_fast(head: bytes, match: str) -> None:
    reader = BatchReader()
    reader.feed(head)
    with pytest.raises(CorruptData, match=match):
        reader.next_batch()


def test_reader_needs_eight_bytes_before_judging() -> None:
    reader = BatchReader()
    reader.feed(b"\xff" * 7)
    assert reader.next_batch() is NEED_DATA
    reader.feed(b"\xff")
    with pytest.raises(CorruptData):
        reader.next_batch()


def test_reader_reports_position_of_corrupt_batch() -> None:
    good = encode_batch([b"one"], timestamps=1)
    bad = bytearray(encode_batch([b"two"], timestamps=2))
    bad[-1] ^= 0x01
    reader = BatchReader(where="peer")
    reader.feed(good + bad)
    first = reader.next_batch()
    assert isinstance(first, RecordBatch)
    assert first.values == [b"one"]
    with pytest.raises(CorruptData, match="CRC") as exc_info:
        reader.next_batch()
    assert exc_info.value.where == f"peer+{len(good)}"
    assert reader.buffered == len(bad)


def test_reader_limit_smaller_than_batch() -> None:
    raw = encode_batch([b"x" * 100], timestamps=0)
    reader = BatchReader(max_batch_bytes=len(raw) - 1)
    reader.feed(raw)
    with pytest.raises(CorruptData):
        reader.next_batch()
    reader = BatchReader(max_batch_bytes=len(raw))
    reader.feed(raw)
    assert isinstance(reader.next_batch(), RecordBatch)


# --------------------------------------------------------------------------
# 4. iter_batches


@FAST
@given(batch_lists)
def test_iter_batches(raws: list[bytes]) -> None:
    data = b"".join(raws)
    for view in (data, bytearray(data), memoryview(data)):
        got = list(iter_batches(view))
        assert [b.raw for b in got] == raws
        assert [b.records() for b in got] == [decode_batch(r).records() for r in raws]


def test_iter_batches_empty() -> None:
    assert list(iter_batches(b"")) == []


@FAST
@given(batch_lists, st.binary(min_size=1, max_size=60))
def test_iter_batches_trailing_garbage(raws: list[bytes], tail: bytes) -> None:
    data = b"".join(raws)
    it = iter_batches(data + tail, where="blk")
    for raw in raws:
        assert next(it).raw == raw
    with pytest.raises(CorruptData) as exc_info:
        next(it)
    assert exc_info.value.where == f"blk+{len(data)}"


# --------------------------------------------------------------------------
# 5. corruption


@SLOW
@given(batches_st, st.data())
def test_single_byte_flip(raw: bytes, data: st.DataObject) -> None:
    pos = data.draw(st.integers(0, len(raw) - 1), label="pos")
    mask = data.draw(st.integers(1, 255), label="mask")
    bad = bytearray(raw)
    bad[pos] ^= mask
    original = decode_batch(raw)

    if 8 <= pos < 16:
        # base_offset is deliberately outside the CRC: the flip moves the
        # batch and changes nothing else.
        b = decode_batch(bad)
        assert b.base_offset == struct.unpack_from("<q", bad, 8)[0] != original.base_offset
        assert b.header.count == original.header.count
        assert b.values == original.values
        assert b.keys == original.keys
        assert b.headers == original.headers
        assert b.timestamps == original.timestamps
        return

    assert isinstance(only_corrupt(lambda: decode_batch(bad)), CorruptData)
    assert isinstance(only_corrupt(lambda: list(iter_batches(bad))), CorruptData)
    reader = BatchReader()
    reader.feed(bad)
    # A flipped length may ask for more bytes than exist; waiting is fine,
    # handing out the batch is not.
    got = only_corrupt(reader.next_batch)
    assert got is NEED_DATA or isinstance(got, CorruptData)
    # Structure checks alone (CRC skipped) never raise anything but CorruptData,
    # and what they accept can be fully materialised.
    decoded = only_corrupt(lambda: decode_batch(bad, verify=False))
    if isinstance(decoded, RecordBatch):
        only_corrupt(decoded.records)


@pytest.mark.parametrize(
    "records",
    [
        pytest.param(GOLDEN_RECORDS, id="golden"),
        pytest.param([Record(0, 1, b"k", b""), Record(1, 2, b"", b"")], id="keys-no-values"),
        pytest.param([Record(0, 0, None, b"")], id="smallest"),
    ],
)
def test_every_single_bit_flip(records: list[Record]) -> None:
    # Exhaustive over bits: outside base_offset each flip must be refused, in
    # a stream too (where a longer length may also just wait for more bytes).
    raw = encode_records(records)
    for pos in range(len(raw)):
        for bit in range(8):
            bad = bytearray(raw)
            bad[pos] ^= 1 << bit
            if 8 <= pos < 16:
                assert decode_batch(bad).values == [r.value for r in records]
                continue
            assert isinstance(only_corrupt(partial(decode_batch, bad)), CorruptData), (pos, bit)
            reader = BatchReader()
            reader.feed(bad + raw)
            first = only_corrupt(reader.next_batch)
            assert first is NEED_DATA or isinstance(first, CorruptData), (pos, bit)


@SLOW
@given(batch_lists, st.data())
def test_truncation(raws: list[bytes], data: st.DataObject) -> None:
    full = b"".join(raws)
    cut = data.draw(st.integers(0, len(full) - 1), label="cut")
    short = full[:cut]
    ends = [sum(map(len, raws[: i + 1])) for i in range(len(raws))]
    whole = sum(1 for e in ends if e <= cut)

    # decode_batch reads the first batch only: it fails unless that is whole.
    for verify in (True, False):
        got = only_corrupt(partial(decode_batch, short, verify=verify))
        if cut < ends[0]:
            assert isinstance(got, CorruptData)
        else:
            assert isinstance(got, RecordBatch)
            assert got.raw == raws[0]

    it = iter_batches(short)
    for raw in raws[:whole]:
        assert next(it).raw == raw
    if cut in ends or cut == 0:
        assert list(it) == []
    else:
        assert isinstance(only_corrupt(lambda: list(it)), CorruptData)

    reader = BatchReader()
    reader.feed(short)
    assert [b.raw for b in drain(reader)] == raws[:whole]
    assert reader.at_boundary() == (cut == 0 or cut in ends)


@SLOW
@given(st.binary(max_size=200))
def test_random_garbage(garbage: bytes) -> None:
    for verify in (True, False):
        only_corrupt(partial(decode_batch, garbage, verify=verify))
        only_corrupt(partial(lambda v: list(iter_batches(garbage, verify=v)), verify))
    reader = BatchReader()
    reader.feed(garbage)
    only_corrupt(lambda: drain(reader))


@st.composite
def plausible_batches(draw: st.DrawFn) -> bytes:
    """Random bodies behind a header that passes the cheap checks, with a
    correct CRC: everything hinges on the structure validation."""
    flags = draw(st.integers(0, 3))
    count = draw(st.integers(1, 4))
    columns = 2 + (flags & 1) + (flags >> 1)
    n_lengths = count * (columns - 1)
    lengths = draw(st.lists(st.integers(0, 6), min_size=n_lengths, max_size=n_lengths))
    # Now and then one length is odd: a null key (-1 is valid for keys only),
    # another negative, or anything an i32 can hold.
    if draw(st.booleans()):
        odd = st.sampled_from([-1, -2]) | st.integers(-(2**31), 2**31 - 1)
        lengths[draw(st.integers(0, n_lengths - 1))] = draw(odd)
    ts = draw(st.lists(st.integers(-2, 2), min_size=count, max_size=count))
    # Often exactly as many data bytes as the lengths claim, so decoding gets
    # past the column arithmetic into the key, value and header-blob splits.
    claimed = sum(max(n, 0) for n in lengths)
    tail_size = st.just(claimed) if claimed <= 64 else st.integers(0, 40)
    tail = draw(
        st.one_of(
            st.binary(max_size=40), tail_size.flatmap(lambda n: st.binary(min_size=n, max_size=n))
        )
    )
    body = struct.pack(f"<{count}q", *ts) + struct.pack(f"<{len(lengths)}i", *lengths) + tail
    min_ts = draw(st.sampled_from([min(ts), min(ts), max(ts), -3]))
    max_ts = draw(st.sampled_from([max(ts), max(ts), min(ts), 3]))
    head = struct.pack(
        "<IBBHqIIqq", HEADER_SIZE + len(body), 1, flags, 0, 0, 0, count, min_ts, max_ts
    )
    return bytes(fix_crc(bytearray(head + body)))


@SLOW
@given(plausible_batches())
def test_structure_validation_fuzz(raw: bytes) -> None:
    got = only_corrupt(lambda: decode_batch(raw))
    if isinstance(got, RecordBatch):
        # Accepted input is internally consistent: it materialises and
        # re-encodes to records that decode the same.
        records = got.records()
        assert decode_batch(encode_records(records)).records() == records


def _u32(pos: int, value: int) -> Callable[[bytearray], None]:
    return lambda b: struct.pack_into("<I", b, pos, value & 0xFFFFFFFF)


def _i32s(pos: int, *values: int) -> Callable[[bytearray], None]:
    return lambda b: struct.pack_into(f"<{len(values)}i", b, pos, *values)


def _i64(pos: int, value: int) -> Callable[[bytearray], None]:
    return lambda b: struct.pack_into("<q", b, pos, value)


def _byte(pos: int, value: int) -> Callable[[bytearray], None]:
    def f(b: bytearray) -> None:
        b[pos] = value

    return f


def _grow_header_blob(b: bytearray) -> None:
    # One dangling byte after the last header entry of record 0.
    b.append(0)
    struct.pack_into("<I", b, 0, len(b))
    struct.pack_into("<i", b, 72, 9)


def _swap_min_max(b: bytearray) -> None:
    struct.pack_into("<qq", b, 24, 1002, 1000)


def _shrink(b: bytearray) -> None:
    del b[-1]
    struct.pack_into("<I", b, 0, len(b))


TAMPERS: list[tuple[str, Callable[[bytearray], None], str]] = [
    ("version 0", _byte(4, 0), "version"),
    ("version 2", _byte(4, 2), "version"),
    ("unknown flag", _byte(5, 0x0F), "flags"),
    ("reserved", _byte(6, 1), "reserved"),
    ("length below header", _u32(0, HEADER_SIZE - 1), "length"),
    ("length past buffer", _u32(0, 92), "truncated"),
    ("length beyond limit", _u32(0, 2**32 - 1), "length"),
    ("last byte missing", _shrink, "column lengths"),
    ("count zero", _u32(20, 0), "count"),
    ("count one short", _u32(20, 1), "column lengths"),
    ("count one over", _u32(20, 3), "count"),
    ("count huge", _u32(20, 2**32 - 1), "count"),
    ("min > max", _swap_min_max, "min_timestamp"),
    ("min too low", _i64(24, 999), "timestamps"),
    ("max too high", _i64(32, 1003), "timestamps"),
    ("min too high", _i64(24, 1001), "timestamps"),
    ("timestamp column", _i64(48, 1001), "timestamps"),
    ("value lengths sum", _i32s(64, 3, 0), "column lengths"),
    ("negative value length", _i32s(64, -1, 3), "negative value"),
    ("huge value length", _i32s(64, 2**31 - 1, 0), "column lengths"),
    ("key lengths sum", _i32s(56, 2, -1), "column lengths"),
    ("key length below -1", _i32s(56, -2, 3), "key length"),
    ("null key with bytes", _i32s(56, -1, -1), "column lengths"),
    ("negative header length", _i32s(72, -1, 9), "negative header"),
    ("header lengths sum", _i32s(72, 8, 1), "column lengths"),
    ("header name not UTF-8", _byte(85, 0xFF), "UTF-8"),
    ("header name overruns", lambda b: struct.pack_into("<H", b, 83, 5), "name overruns"),
    ("header value overruns", _u32(86, 2), "value overruns"),
    ("header value huge", _u32(86, 2**32 - 1), "value overruns"),
    ("header entry truncated", _grow_header_blob, "entry truncated"),
    ("header blob split", _i32s(72, 4, 4), "overruns"),
]


@pytest.mark.parametrize(
    ("tamper", "match"), [pytest.param(t, m, id=name) for name, t, m in TAMPERS]
)
def test_structural_corruption_with_valid_crc(
    tamper: Callable[[bytearray], None], match: str
) -> None:
    raw = encode_records(GOLDEN_RECORDS)
    bad = bytearray(raw)
    tamper(bad)
    assert bad != raw
    length = struct.unpack_from("<I", bad)[0]
    if HEADER_SIZE <= length <= len(bad):
        struct.pack_into("<I", bad, 16, batch_crc(bad, 0, length))
    for verify in (True, False):
        with pytest.raises(CorruptData, match=match):
            decode_batch(bad, verify=verify)
    with pytest.raises(CorruptData, match=match):
        list(iter_batches(bytes(bad)))
    reader = BatchReader()
    reader.feed(bad)
    try:
        got = reader.next_batch()
    except CorruptData:
        pass
    else:
        assert got is NEED_DATA


def test_tamper_helper_keeps_valid_edits_valid() -> None:
    # Guards the test above: recomputing the CRC after a harmless edit decodes.
    bad = bytearray(encode_records(GOLDEN_RECORDS))
    bad[82] = ord("2")  # value b"v1" -> b"v2"
    with pytest.raises(CorruptData, match="CRC"):
        decode_batch(bad)
    assert decode_batch(fix_crc(bad)).values == [b"v2", b""]


@pytest.mark.parametrize("mask", [0x01, 0x02, 0x03])
@pytest.mark.parametrize(
    "records",
    [
        pytest.param([Record(0, 1, b"k", b""), Record(1, 2, b"", b"")], id="keys"),
        pytest.param([Record(0, 1, None, b"", (("h", b""),))], id="headers"),
        pytest.param([Record(0, 1, None, b"")], id="plain"),
        pytest.param([Record(0, 1, b"", b"", (("", b""),))], id="keys-headers"),
    ],
)
def test_flags_flip_is_detected(records: list[Record], mask: int) -> None:
    # Flipping KEYS<->HEADERS keeps the column count, so with no null keys
    # and empty values the column arithmetic still adds up: only a CRC that
    # covers the flags byte tells this batch from a different, valid one.
    bad = bytearray(encode_records(records))
    bad[5] ^= mask
    with pytest.raises(CorruptData):
        decode_batch(bad)


def test_crc_field_flip_is_detected() -> None:
    raw = bytearray(encode_records(GOLDEN_RECORDS))
    raw[16] ^= 0x01
    with pytest.raises(CorruptData, match="CRC"):
        decode_batch(raw)
    assert decode_batch(raw, verify=False).records() == GOLDEN_RECORDS


def test_read_header_rejects_beyond_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = encode_records(GOLDEN_RECORDS)
    monkeypatch.setattr(batch_mod, "MAX_BATCH_BYTES", len(raw) - 1)
    with pytest.raises(CorruptData, match="length"):
        read_header(raw)


def test_corrupt_data_names_the_place() -> None:
    with pytest.raises(CorruptData) as exc_info:
        decode_batch(b"\x00" * 10, where="seg-7+128")
    assert exc_info.value.where == "seg-7+128"
    assert str(exc_info.value).startswith("seg-7+128: ")


# --------------------------------------------------------------------------
# 6. bad encoder input


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"values": [], "timestamps": 0}, id="empty"),
        pytest.param({"values": [], "timestamps": []}, id="empty-ts-list"),
        pytest.param({"values": [b"a", b"b"], "timestamps": [1]}, id="too-few-timestamps"),
        pytest.param({"values": [b"a"], "timestamps": [1, 2]}, id="too-many-timestamps"),
        pytest.param({"values": [b"a", b"b"], "keys": [b"k"], "timestamps": 0}, id="few-keys"),
        pytest.param({"values": [b"a"], "keys": [None, None], "timestamps": 0}, id="many-keys"),
        pytest.param(
            {"values": [b"a", b"b"], "headers": [(("h", b"v"),)], "timestamps": 0},
            id="few-headers",
        ),
        pytest.param({"values": [b"a", b"b"], "headers": [()], "timestamps": 0}, id="few-empty"),
        pytest.param({"values": [b"a"], "headers": [(), ()], "timestamps": 0}, id="many-empty"),
        pytest.param({"values": [b"a"], "headers": [], "timestamps": 0}, id="no-header-lists"),
        pytest.param({"values": ["text"], "timestamps": 0}, id="str-value"),
        pytest.param({"values": [""], "timestamps": 0}, id="empty-str-value"),
        pytest.param({"values": [1], "timestamps": 0}, id="int-value"),
        pytest.param({"values": b"abc", "timestamps": 0}, id="bytes-as-values"),
        pytest.param({"values": [b"a"], "keys": ["k"], "timestamps": 0}, id="str-key"),
        pytest.param({"values": [b"a"], "keys": [""], "timestamps": 0}, id="empty-str-key"),
        pytest.param({"values": [b"a"], "keys": [1], "timestamps": 0}, id="int-key"),
        pytest.param({"values": [b"a"], "timestamps": 2**63}, id="ts-int-high"),
        pytest.param({"values": [b"a"], "timestamps": I64_MIN - 1}, id="ts-int-low"),
        pytest.param({"values": [b"a"], "timestamps": [2**63]}, id="ts-high"),
        pytest.param({"values": [b"a"], "timestamps": [I64_MIN - 1]}, id="ts-low"),
        pytest.param({"values": [b"a"], "timestamps": [1.5]}, id="ts-float"),
        pytest.param({"values": [b"a"], "timestamps": ["1"]}, id="ts-str"),
        pytest.param({"values": [b"a"], "timestamps": [None]}, id="ts-none"),
        pytest.param({"values": [b"a"], "timestamps": 0, "base_offset": 2**63}, id="base-high"),
        pytest.param(
            {"values": [b"a"], "timestamps": 0, "base_offset": I64_MIN - 1}, id="base-low"
        ),
        pytest.param({"values": [b"a"], "headers": [(("h", "v"),)], "timestamps": 0}, id="h-str"),
        pytest.param(
            {"values": [b"a"], "headers": [((b"h", b"v"),)], "timestamps": 0}, id="h-bytes-name"
        ),
        pytest.param({"values": [b"a"], "headers": [(("h",),)], "timestamps": 0}, id="h-1-tuple"),
        pytest.param(
            {"values": [b"a"], "headers": [(("h", b"v", b"w"),)], "timestamps": 0}, id="h-3-tuple"
        ),
        pytest.param({"values": [b"a"], "headers": [(1,)], "timestamps": 0}, id="h-int"),
        pytest.param(
            {"values": [b"a"], "headers": [(("\ud800", b""),)], "timestamps": 0}, id="h-surrogate"
        ),
        pytest.param(
            {"values": [b"a"], "headers": [(("n" * 65536, b""),)], "timestamps": 0},
            id="h-name-too-long",
        ),
    ],
)
def test_encode_batch_rejects(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        encode_batch(**kwargs)  # type: ignore[arg-type]


def test_encode_batch_accepts_limits() -> None:
    raw = encode_batch(
        [b"a", b"b"],
        keys=[b"", None],
        timestamps=[I64_MIN, I64_MAX],
        headers=[(("n" * 65535, b""),), ()],
        base_offset=I64_MIN,
    )
    b = decode_batch(raw)
    assert b.headers[0] == (("n" * 65535, b""),)
    assert b.base_offset == I64_MIN
    assert list(b.timestamps) == [I64_MIN, I64_MAX]


def test_encode_batch_rejects_oversized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_mod, "MAX_BATCH_BYTES", 100)
    encode_batch([b"x" * (100 - HEADER_SIZE - 12)], timestamps=0)
    with pytest.raises(InvalidInput, match="exceeds"):
        encode_batch([b"x" * (101 - HEADER_SIZE - 12)], timestamps=0)


@pytest.mark.parametrize(
    "offsets",
    [[0, 2], [1, 0], [0, 0], [5, 6, 8], [3, 2, 1]],
)
def test_encode_records_rejects_gaps(offsets: list[int]) -> None:
    records = [Record(o, 0, None, b"") for o in offsets]
    with pytest.raises(InvalidInput, match="contiguous"):
        encode_records(records)


def test_encode_records_rejects_empty_and_bad_offset() -> None:
    with pytest.raises(InvalidInput):
        encode_records([])
    with pytest.raises(InvalidInput):
        encode_records([Record(2**63, 0, None, b"")])
    with pytest.raises(InvalidInput):
        encode_records([Record(0, 0, "key", b"")])  # type: ignore[arg-type]


@pytest.mark.parametrize("base", [2**63, I64_MIN - 1])
def test_with_base_offset_rejects_out_of_range(base: int) -> None:
    raw = encode_records(GOLDEN_RECORDS)
    with pytest.raises(InvalidInput):
        with_base_offset(raw, base)
    with pytest.raises(InvalidInput):
        base_offset_bytes(base)


def test_with_base_offset_rejects_short_buffer() -> None:
    with pytest.raises(InvalidInput):
        with_base_offset(b"\x00" * 12, 0)


# --------------------------------------------------------------------------
# 7. golden vector

# Two records with keys and headers (flags 0x03), base_offset 5. Any change
# to these bytes is a change of the wire format: the journal and objects in
# the bucket already hold batches like this one.
GOLDEN_HEX = (
    "5b000000"  # 0   length 91
    "01"  # 4   version 1
    "03"  # 5   flags KEYS|HEADERS
    "0000"  # 6   reserved
    "0500000000000000"  # 8   base_offset 5 (outside the CRC)
    "7f721cd5"  # 16  crc32c of [4, 8) ++ [20, 91)
    "02000000"  # 20  count 2
    "e803000000000000"  # 24  min_timestamp 1000
    "ea03000000000000"  # 32  max_timestamp 1002
    "e803000000000000"  # 40  timestamps[0] 1000
    "ea03000000000000"  # 48  timestamps[1] 1002
    "01000000"  # 56  key_lengths[0] 1
    "ffffffff"  # 60  key_lengths[1] -1 (null key)
    "02000000"  # 64  value_lengths[0] 2
    "00000000"  # 68  value_lengths[1] 0
    "08000000"  # 72  header_lengths[0] 8
    "00000000"  # 76  header_lengths[1] 0
    "6b"  # 80  key bytes "k"
    "7631"  # 81  value bytes "v1"
    "0100"  # 83  header blob: name length u16 1
    "68"  # 85    name "h"
    "01000000"  # 86    value length u32 1
    "78"  # 90    value "x"
)


def _crc32c_reference(data: bytes) -> int:
    # Bitwise CRC-32C (Castagnoli, reflected 0x82F63B78), independent of the
    # crc32c package, so a wrong polynomial there could not go unnoticed.
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_golden_vector() -> None:
    raw = encode_records(GOLDEN_RECORDS)
    assert raw.hex() == GOLDEN_HEX
    golden = bytes.fromhex(GOLDEN_HEX)
    assert decode_batch(golden).records() == GOLDEN_RECORDS
    assert _crc32c_reference(b"123456789") == 0xE3069283
    assert struct.unpack_from("<I", golden, 16)[0] == _crc32c_reference(golden[4:8] + golden[20:])
    assert crc32c.crc32c(b"123456789") == 0xE3069283


def test_golden_vector_without_optional_columns() -> None:
    # flags 0: no key or header columns, so no bytes are spent on them.
    raw = encode_batch([b"ab"], timestamps=-1, base_offset=-2)
    assert raw.hex() == (
        "36000000"  # 0   length 54
        "01"  # 4   version 1
        "00"  # 5   flags: none
        "0000"  # 6   reserved
        "feffffffffffffff"  # 8   base_offset -2
        "76d56448"  # 16  crc32c of [4, 8) ++ [20, 54)
        "01000000"  # 20  count 1
        "ffffffffffffffff"  # 24  min_timestamp -1
        "ffffffffffffffff"  # 32  max_timestamp -1
        "ffffffffffffffff"  # 40  timestamps[0] -1
        "02000000"  # 48  value_lengths[0] 2
        "6162"  # 52  value bytes "ab"
    )
    assert struct.unpack_from("<I", raw, 16)[0] == _crc32c_reference(raw[4:8] + raw[20:])
