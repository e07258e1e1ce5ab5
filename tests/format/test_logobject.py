"""Log object v1 (``edge_gateway.format.logobject``): round trips, ranged reads,
fences, the golden vector, and corrupt or hostile input.

``docs/log-object.md`` is the spec. The decoders promise to raise
:class:`CorruptData` and nothing else for malformed bytes, so the corruption
tests catch *every* exception and fail on any other type. Hostile headers are
packed by :func:`pack_header` here, independently of the module's encoder, with
a valid CRC so that they reach the structure checks behind it.
"""

from __future__ import annotations

import dataclasses
import random
import struct
import threading
import tracemalloc
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

import crc32c
import pytest
import zstandard as zstd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_gateway.errors import CorruptData, InvalidInput, InvalidName
from edge_gateway.format.batch import Record, decode_batch, encode_batch, encode_records
from edge_gateway.format.logobject import (
    CODEC_NONE,
    CODEC_ZSTD,
    FIRST_GET_BYTES,
    FLAG_FENCE,
    MAX_BLOCK_RAW_BYTES,
    MAX_HEADER_BYTES,
    MIN_HEADER_BYTES,
    PREFIX_BYTES,
    BlockIndex,
    LogObjectBuilder,
    LogObjectHeader,
    blocks_for,
    decode_block,
    decode_header,
    encode_fence,
    encode_header,
    header_length_hint,
    iter_block_batches,
    plan_ranges,
    slice_block,
)

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MIB = 1024 * 1024
KEY = "regions/r1/log/00000000000000000007.egw"


# --------------------------------------------------------------------------
# helpers


def only_corrupt(fn: Callable[[], object]) -> object:
    """Run ``fn``; CorruptData is returned, success passes through, anything
    else fails the test with the offending exception type in the message."""
    try:
        return fn()
    except CorruptData as exc:
        return exc
    except Exception as exc:
        pytest.fail(f"{type(exc).__name__} escaped a decoder: {exc!r}")


def read_all(obj: bytes, header: LogObjectHeader) -> dict[tuple[str, int], list[Record]]:
    """Every record of the object, per partition, through decode_block + iter_block_batches."""
    out: dict[tuple[str, int], list[Record]] = {}
    for b in header.blocks:
        raw = decode_block(b, slice_block(b, [(0, obj)], where=KEY), where=KEY)
        records = out.setdefault((b.topic, b.partition), [])
        for batch in iter_block_batches(b, raw, where=KEY):
            records += batch.records()
    return out


def fetch_header(obj: bytes) -> LogObjectHeader:
    """What a reader does: one GET of the first bytes, a second if the header is longer."""
    prefix = obj[:FIRST_GET_BYTES]
    need = header_length_hint(prefix)
    if need > len(prefix):
        prefix += obj[len(prefix) : need]
    return decode_header(prefix, where=KEY)


def pack_header(
    *,
    magic: bytes = b"EGWL",
    version: int = 1,
    flags: int = 0,
    reserved: int = 0,
    header_length: int | None = None,
    epoch: int = 1,
    seq: int = 7,
    first_lsn: int = 1,
    last_lsn: int = 1,
    created_ms: int = 0,
    region: bytes = b"r1",
    region_len: int | None = None,
    n_blocks: int | None = None,
    blocks: Sequence[tuple[Any, ...]] = (),
    extra: bytes = b"",
) -> bytes:
    """A header laid out per the spec, with whatever field values, and a valid CRC.

    ``blocks`` rows are (topic bytes, partition, first_offset, last_offset,
    record_count, min_ts, max_ts, offset, stored_length, raw_length, codec, crc).
    """
    body = struct.pack(
        "<QQQQqH",
        epoch,
        seq,
        first_lsn,
        last_lsn,
        created_ms,
        len(region) if region_len is None else region_len,
    )
    body += region + struct.pack("<I", len(blocks) if n_blocks is None else n_blocks)
    for topic, *fields in blocks:
        body += struct.pack("<H", len(topic)) + topic + struct.pack("<IqqIqqQIIBI", *fields)
    body += extra
    if header_length is None:
        header_length = 12 + len(body) + 4
    head = struct.pack("<4sBBHI", magic, version, flags, reserved, header_length) + body
    return head + struct.pack("<I", crc32c.crc32c(head))


def header_fields(h: LogObjectHeader) -> dict[str, Any]:
    """``pack_header`` arguments that reproduce ``h``."""
    return {
        "flags": h.flags,
        "epoch": h.epoch,
        "seq": h.seq,
        "first_lsn": h.first_lsn,
        "last_lsn": h.last_lsn,
        "created_ms": h.created_ms,
        "region": h.region.encode(),
        "blocks": [(b.topic.encode(), *dataclasses.astuple(b)[1:]) for b in h.blocks],
    }


def sample_object(
    level: int = 3,
) -> tuple[bytes, LogObjectHeader, dict[tuple[str, int], list[Record]]]:
    """Two partitions of one topic and one of another; one partition in two batches."""
    records = {
        ("orders", 0): [
            Record(10 + i, 1000 + i, b"k%d" % i, b"order %d" % i * 3) for i in range(6)
        ],
        ("orders", 1): [Record(0, 5, None, b"x")],
        ("telemetry", 2): [Record(100 + i, 7 - i, None, bytes([i]) * 50) for i in range(4)],
    }
    builder = LogObjectBuilder()
    builder.add(
        "orders",
        0,
        [encode_records(records[("orders", 0)][:2]), encode_records(records[("orders", 0)][2:])],
    )
    builder.add_batch("telemetry", 2, encode_records(records[("telemetry", 2)]))
    builder.add_batch("orders", 1, encode_records(records[("orders", 1)]))
    obj = builder.build("r1", 3, 7, 11, 14, 1_700_000_000_123, level)
    return obj, decode_header(obj, where=KEY, object_size=len(obj)), records


# --------------------------------------------------------------------------
# strategies


@st.composite
def partition_data(draw: st.DrawFn) -> dict[tuple[str, int], list[list[Record]]]:
    """Per (topic, partition): contiguous records cut into batches."""
    keys = draw(
        st.sets(
            st.tuples(st.sampled_from(["a", "b.c", "t-1", "Z_9"]), st.integers(0, 4)),
            min_size=0,
            max_size=5,
        )
    )
    out: dict[tuple[str, int], list[list[Record]]] = {}
    for key in sorted(keys):
        offset = draw(st.one_of(st.integers(0, 100), st.integers(-(2**63), 2**62)))
        batches = []
        for _ in range(draw(st.integers(1, 4))):
            n = draw(st.integers(1, 5))
            value_kind = draw(st.sampled_from(["small", "repeat", "random"]))
            batch = []
            for i in range(n):
                if value_kind == "repeat":
                    value = b"abc" * draw(st.integers(0, 40))
                elif value_kind == "random":
                    value = draw(st.binary(min_size=0, max_size=60))
                else:
                    value = draw(st.binary(max_size=4))
                batch.append(
                    Record(
                        offset + i,
                        draw(st.integers(-3, 3) | st.integers(-(2**63), 2**63 - 1)),
                        draw(st.none() | st.binary(max_size=6)),
                        value,
                        draw(
                            st.lists(
                                st.tuples(st.text(max_size=3), st.binary(max_size=3)), max_size=2
                            ).map(tuple)
                        ),
                    )
                )
            offset += n
            batches.append(batch)
        out[key] = batches
    return out


# --------------------------------------------------------------------------
# 1. round trips


@SLOW
@given(
    partition_data(),
    st.sampled_from([40, 200, 1000, 64 * MIB]),
    st.randoms(use_true_random=False),
    st.sampled_from([1, 3, 19, -5]),
)
def test_round_trip(
    data: dict[tuple[str, int], list[list[Record]]], max_block: int, rnd: random.Random, level: int
) -> None:
    builder = LogObjectBuilder(max_block_bytes=max_block)
    # Interleave the partitions' batches at random, each partition in order.
    queue = [(key, encode_records(batch)) for key, batches in data.items() for batch in batches]
    rnd.shuffle(queue)
    queue.sort(key=lambda item: (item[0], item[1] and 0))  # stable: keep shuffled order per key
    pending = {key: [encode_records(b) for b in batches] for key, batches in data.items()}
    order = [key for key, batches in data.items() for _ in batches]
    rnd.shuffle(order)
    for key in order:
        raw = pending[key].pop(0)
        if rnd.random() < 0.5:
            builder.add_batch(key[0], key[1], raw)
        else:
            builder.add(key[0], key[1], [raw])
    n_records = sum(len(b) for batches in data.values() for b in batches)
    assert builder.record_count == n_records
    assert builder.batch_count == sum(len(batches) for batches in data.values())

    first_lsn, last_lsn = (5, 9) if data else (10, 9)
    obj = builder.build("east-1", 2, 42, first_lsn, last_lsn, -1, level)
    assert builder.build("east-1", 2, 42, first_lsn, last_lsn, -1, level) == obj  # deterministic
    header = fetch_header(obj)
    assert header == decode_header(obj, where=KEY, object_size=len(obj))
    assert (header.version, header.flags, header.epoch, header.seq) == (1, 0, 2, 42)
    assert (header.first_lsn, header.last_lsn, header.created_ms) == (first_lsn, last_lsn, -1)
    assert header.region == "east-1"
    assert not header.is_fence
    assert header.total_length == len(obj)
    assert encode_header(header) == obj[: header.header_length]
    keys = [(b.topic, b.partition) for b in header.blocks]
    assert keys == sorted(keys)
    assert set(keys) == set(data)

    got = read_all(obj, header)
    for key, batches in data.items():
        expected = [r for b in batches for r in b]
        assert got[key] == expected
        blocks = blocks_for(header, *key)
        assert blocks[0].first_offset == expected[0].offset
        assert blocks[-1].last_offset == expected[-1].offset
        assert sum(b.record_count for b in blocks) == len(expected)
        assert min(b.min_ts for b in blocks) == min(r.timestamp for r in expected)
        assert max(b.max_ts for b in blocks) == max(r.timestamp for r in expected)
        assert builder.next_offset(*key) == expected[-1].offset + 1
        for b in blocks:
            assert b.raw_length <= max(max_block, *(len(encode_records(x)) for x in batches))
            assert b.codec in (CODEC_NONE, CODEC_ZSTD)
            assert b.stored_length <= b.raw_length


def test_sample_object_fields() -> None:
    obj, h, records = sample_object()
    assert [(b.topic, b.partition) for b in h.blocks] == [
        ("orders", 0),
        ("orders", 1),
        ("telemetry", 2),
    ]
    o0, o1, t2 = h.blocks
    assert (o0.first_offset, o0.last_offset, o0.record_count, o0.min_ts, o0.max_ts) == (
        10,
        15,
        6,
        1000,
        1005,
    )
    assert (t2.first_offset, t2.last_offset, t2.min_ts, t2.max_ts) == (100, 103, 4, 7)
    assert [o0.offset, o1.offset, t2.offset] == [h.header_length, o0.end, o1.end]
    assert h.header_length == 54 + 2 + 4 + 3 * 63 + 2 * len("orders") + len("telemetry") + 4
    assert read_all(obj, h) == records
    assert o0.next_offset == 16


def test_batches_are_shipped_as_is() -> None:
    # The block's raw content is the journal's batch bytes, concatenated.
    b1 = encode_batch([b"v1", b"v2"], timestamps=[3, 1], base_offset=0)
    b2 = encode_batch([b"v3"], keys=[b"k"], timestamps=2, base_offset=2)
    builder = LogObjectBuilder()
    builder.add("t", 0, [bytearray(b1), memoryview(b2)])
    obj = builder.build("r", 1, 1, 1, 2, 0)
    (block,) = decode_header(obj, where=KEY).blocks
    assert decode_block(block, obj[block.offset : block.end], where=KEY) == b1 + b2
    assert builder.raw_bytes == len(b1) + len(b2)


def test_incompressible_block_is_stored_as_is() -> None:
    rnd = random.Random(7)
    noise = encode_batch([rnd.randbytes(3000)], timestamps=1, base_offset=0)
    text = encode_batch([b"the same words again " * 200], timestamps=1, base_offset=0)
    builder = LogObjectBuilder()
    builder.add_batch("noise", 0, noise)
    builder.add_batch("text", 0, text)
    obj = builder.build("r1", 1, 1, 1, 2, 0)
    h = decode_header(obj, where=KEY, object_size=len(obj))
    n, t = h.blocks
    assert (n.codec, n.stored_length, n.raw_length) == (CODEC_NONE, len(noise), len(noise))
    assert obj[n.offset : n.end] == noise
    assert t.codec == CODEC_ZSTD
    assert t.stored_length < t.raw_length // 10
    assert read_all(obj, h)[("noise", 0)][0].value == decode_records_value(noise)


def decode_records_value(batch: bytes) -> bytes:
    from edge_gateway.format.batch import decode_batch

    return decode_batch(batch).values[0]


def test_big_partition_splits_into_contiguous_blocks() -> None:
    builder = LogObjectBuilder(max_block_bytes=300)
    batches = [encode_batch([b"x" * 50] * 2, timestamps=i, base_offset=2 * i) for i in range(10)]
    builder.add("t", 0, batches)
    obj = builder.build("r1", 1, 1, 1, 10, 0)
    h = decode_header(obj, where=KEY)
    assert len(h.blocks) > 1
    assert all(b.raw_length <= 300 for b in h.blocks)
    assert [r.offset for r in read_all(obj, h)[("t", 0)]] == list(range(20))


def test_views_build_the_same_bytes_and_writable_buffers_are_copied() -> None:
    """Read-only views (the journal's pooled reads) are kept until build and give the
    object bytes gives, byte for byte; a writable buffer is copied at add, so changing
    it afterwards changes nothing. Blocks of several batches are joined in a buffer
    the thread reuses: building again on it leaves the first object as it was."""
    rnd = random.Random(5)
    parts = {
        p: [
            encode_batch(
                [b"reading %d" % rnd.randrange(1000) for _ in range(1 + i % 4)],
                timestamps=i,
                base_offset=sum(1 + k % 4 for k in range(i)),
            )
            for i in range(6 + p)
        ]
        for p in range(3)
    }

    def build(wrap: Callable[[bytes], Any]) -> bytes:
        builder = LogObjectBuilder()
        held = []
        for p, batches in parts.items():
            wrapped = [wrap(b) for b in batches]
            held += wrapped
            builder.add("t", p, wrapped)
        for w in held:  # a caller scribbling over its buffers after add
            if isinstance(w, bytearray):
                w[:] = bytes(len(w))
        return builder.build("r1", 1, 1, 1, 99, 0, level=1)

    plain = build(lambda b: b)
    as_views = build(lambda b: memoryview(bytes(b)))
    pooled = build(lambda b: memoryview(bytearray(b)).toreadonly())
    copied = build(bytearray)
    assert as_views == plain
    assert pooled == plain
    assert copied == plain
    assert build(memoryview) == plain  # built again on the thread's buffer
    header = decode_header(plain, where=KEY)
    records = read_all(plain, header)
    for p, batches in parts.items():
        assert [r.value for r in records[("t", p)]] == [
            v for b in batches for v in decode_batch(b).values
        ]


def test_threads_option_decodes_the_same() -> None:
    builder = LogObjectBuilder()
    builder.add_batch("t", 0, encode_batch([b"abc" * 1000] * 50, timestamps=0))
    obj = builder.build("r1", 1, 1, 1, 1, 0, 3, threads=2)
    h = decode_header(obj, where=KEY)
    assert len(read_all(obj, h)[("t", 0)]) == 50


def test_entry_with_nothing_to_ship() -> None:
    # LSNs that held nothing to ship (or none at all): an entry without blocks.
    for first, last in ((5, 4), (5, 9)):
        obj = LogObjectBuilder().build("r1", 1, 3, first, last, 0)
        h = decode_header(obj, where=KEY, object_size=len(obj))
        assert h.blocks == ()
        assert not h.is_fence
        assert (h.first_lsn, h.last_lsn) == (first, last)
        assert h.total_length == h.header_length == len(obj)


# --------------------------------------------------------------------------
# 2. fences and the golden vector

GOLDEN_FENCE_HEX = (
    "4547574c"  # magic "EGWL"
    "01"  # version
    "01"  # flags: FENCE
    "0000"  # reserved
    "40000000"  # header_length 64
    "0200000000000000"  # epoch 2
    "0700000000000000"  # seq 7
    "2a00000000000000"  # first_lsn 42
    "2900000000000000"  # last_lsn 41
    "0068e5cf8b010000"  # created_ms 1700000000000
    "0200"  # region_len 2
    "7231"  # "r1"
    "00000000"  # n_blocks 0
    "cfb7cb69"  # CRC-32C of the 60 bytes before
)


def test_golden_fence() -> None:
    fence = encode_fence("r1", 2, 7, 41, 1_700_000_000_000)
    assert fence.hex() == GOLDEN_FENCE_HEX
    assert crc32c.crc32c(fence[:-4]) == 0x69CBB7CF
    h = decode_header(bytes.fromhex(GOLDEN_FENCE_HEX), where=KEY, object_size=64)
    assert h == LogObjectHeader(1, FLAG_FENCE, 64, 2, 7, 42, 41, 1_700_000_000_000, "r1", ())
    assert h.is_fence
    assert h.total_length == 64


def test_fence_first_entry_and_errors() -> None:
    h = decode_header(encode_fence("west_2", 1, 1, 0, 0), where=KEY)
    assert (h.first_lsn, h.last_lsn, h.epoch, h.region) == (1, 0, 1, "west_2")
    with pytest.raises(InvalidName):
        encode_fence("../x", 1, 1, 0, 0)
    for args in ((-1, 1, 0, 0), (1, 2**64, 0, 0), (1, 1, 2**64 - 1, 0), (1, 1, 0, 2**63)):
        with pytest.raises(InvalidInput):
            encode_fence("r1", *args)


# --------------------------------------------------------------------------
# 3. header_length_hint and ranged reads


def test_header_length_hint() -> None:
    obj, h, _ = sample_object()
    for n in range(PREFIX_BYTES):
        assert header_length_hint(obj[:n]) == PREFIX_BYTES
    for n in (PREFIX_BYTES, h.header_length, len(obj)):
        assert header_length_hint(obj[:n]) == h.header_length
    for bad in (b"X", b"EGX", b"egwl" + obj[4:12]):
        with pytest.raises(CorruptData, match="not a log object"):
            header_length_hint(bad)
    cases = {
        "version": obj[:4] + b"\x04" + obj[5:12],
        "flags": obj[:5] + b"\x08" + obj[6:12],
        "reserved": obj[:6] + b"\x01\x00" + obj[8:12],
        "small": obj[:8] + struct.pack("<I", MIN_HEADER_BYTES - 1),
        "large": obj[:8] + struct.pack("<I", MAX_HEADER_BYTES + 1),
    }
    for name, prefix in cases.items():
        got = only_corrupt(lambda prefix=prefix: header_length_hint(prefix))
        assert isinstance(got, CorruptData), name


def test_decode_header_needs_the_whole_header() -> None:
    obj, h, _ = sample_object()
    assert decode_header(obj[: h.header_length], where=KEY) == h
    for n in range(h.header_length):
        with pytest.raises(CorruptData, match=r"truncated|not a log object"):
            decode_header(obj[:n], where=KEY)


def test_big_header_takes_a_second_get() -> None:
    builder = LogObjectBuilder()
    one = encode_batch([b""], timestamps=0)
    for p in range(1100):
        builder.add_batch("sensor-readings", p, one)
    obj = builder.build("r1", 1, 1, 1, 1100, 0)
    first = obj[:FIRST_GET_BYTES]
    need = header_length_hint(first)
    assert need > FIRST_GET_BYTES
    with pytest.raises(CorruptData, match="truncated"):
        decode_header(first, where=KEY)
    h = decode_header(first + obj[FIRST_GET_BYTES:need], where=KEY)
    assert len(h.blocks) == 1100
    assert [b.partition for b in h.blocks] == list(range(1100))


def test_ranged_read_decodes_only_wanted_blocks() -> None:
    rnd = random.Random(1)
    builder = LogObjectBuilder()
    expected = {}
    for p in range(12):
        records = [Record(i, i, None, rnd.randbytes(9000)) for i in range(3)]
        builder.add_batch("t", p, encode_records(records))
        expected[("t", p)] = records
    obj = builder.build("r1", 1, 1, 1, 12, 0)
    first = obj[:1024]
    h = decode_header(first, where=KEY)
    wanted = {("t", 2), ("t", 3), ("t", 9)}
    ranges = plan_ranges(h, wanted, coalesce_gap=1000, have=len(first))
    assert len(ranges) == 2  # 2 and 3 are neighbours; 9 is far away
    fetched: list[tuple[int, bytes]] = [(0, first)] + [(a, obj[a:b]) for a, b in ranges]
    assert sum(b - a for a, b in ranges) < len(obj) // 3
    for b in h.blocks:
        if (b.topic, b.partition) not in wanted:
            continue
        raw = decode_block(b, slice_block(b, fetched, where=KEY), where=KEY)
        got = [r for batch in iter_block_batches(b, raw) for r in batch.records()]
        assert got == expected[(b.topic, b.partition)]
    # A range the store cut short: the block is not there.
    b9 = blocks_for(h, "t", 9)[0]
    short = [(a, obj[a : b - 1]) for a, b in ranges]
    with pytest.raises(CorruptData, match="not within the bytes read"):
        slice_block(b9, short, where=KEY)


def synthetic_header(sizes: Sequence[int], header_length: int = 100) -> LogObjectHeader:
    """A header whose blocks have the given stored sizes (for plan_ranges only)."""
    blocks, pos = [], header_length
    for p, size in enumerate(sizes):
        blocks.append(BlockIndex("t", p, 0, 0, 1, 0, 0, pos, size, size, CODEC_NONE, 0))
        pos += size
    return LogObjectHeader(1, 0, header_length, 1, 1, 1, 1, 0, "r", tuple(blocks))


def test_plan_ranges_examples() -> None:
    #            p0   p1       p2  p3  p4
    h = synthetic_header([10, 100_000, 10, 10, 200_000])
    offs = [b.offset for b in h.blocks]
    assert plan_ranges(h, set()) == []
    assert plan_ranges(h, {("t", 0)}) == [(offs[0], offs[1])]
    assert plan_ranges(h, {("u", 0)}) == []
    # p2 and p3 touch; p0 is 100_000 bytes away: two ranges.
    assert plan_ranges(h, {("t", 0), ("t", 2), ("t", 3)}) == [(100, 110), (offs[2], offs[4])]
    # A big enough gap allowance merges them.
    assert plan_ranges(h, lambda t, p: p in (0, 2), coalesce_gap=100_001) == [(100, offs[3])]
    # The gap must be strictly smaller than coalesce_gap.
    assert plan_ranges(h, {("t", 0), ("t", 2)}, coalesce_gap=100_000) == [
        (100, 110),
        (offs[2], offs[3]),
    ]
    # More than half of the object: fetch it whole.
    assert plan_ranges(h, {("t", 4)}) == [(0, h.total_length)]
    assert plan_ranges(h, {("t", 4)}, whole_object_fraction=1.0) == [(offs[4], h.total_length)]
    assert plan_ranges(h, {("t", 0)}, whole_object_fraction=0.0) == [(0, h.total_length)]
    # Bytes already in hand are not fetched again.
    assert plan_ranges(h, {("t", 0), ("t", 1)}, have=105, whole_object_fraction=1.0) == [
        (105, offs[2])
    ]
    assert plan_ranges(h, {("t", 0)}, have=110) == []
    assert plan_ranges(h, {("t", 4)}, have=1000) == [(1000, h.total_length)]
    assert plan_ranges(synthetic_header([]), {("t", 0)}) == []
    for bad in (
        {"coalesce_gap": -1},
        {"whole_object_fraction": 1.5},
        {"whole_object_fraction": float("nan")},
        {"have": -1},
    ):
        with pytest.raises(InvalidInput):
            plan_ranges(h, set(), **bad)


@FAST
@given(
    st.lists(st.integers(1, 5000), max_size=30),
    st.data(),
    st.integers(0, 6000),
    st.floats(0.0, 1.0),
)
def test_plan_ranges_properties(
    sizes: list[int], data: st.DataObject, gap: int, fraction: float
) -> None:
    h = synthetic_header(sizes)
    wanted = data.draw(st.sets(st.integers(0, max(len(sizes) - 1, 0))))
    have = data.draw(st.integers(0, h.total_length + 10))
    ranges = plan_ranges(
        h, {("t", p) for p in wanted}, coalesce_gap=gap, whole_object_fraction=fraction, have=have
    )
    for a, b in ranges:
        assert have <= a < b <= h.total_length
    for (_, b1), (a2, _) in pairwise(ranges):
        assert a2 - b1 >= gap
    for p in wanted & set(range(len(sizes))):
        blk = h.blocks[p]
        start = max(blk.offset, have)
        if start < blk.end:
            assert any(a <= start and blk.end <= b for a, b in ranges)
    if ranges and ranges != [(have, h.total_length)]:
        assert sum(b - a for a, b in ranges) <= fraction * (h.total_length - have)


# --------------------------------------------------------------------------
# 4. encoder input


def test_builder_rejects_bad_batches_and_stays_unchanged() -> None:
    b0 = encode_batch([b"a", b"b"], timestamps=1, base_offset=0)
    b2 = encode_batch([b"c"], timestamps=1, base_offset=2)
    gap = encode_batch([b"d"], timestamps=1, base_offset=4)
    builder = LogObjectBuilder()
    builder.add("t", 0, [b0])
    before = builder.build("r1", 1, 1, 1, 1, 0)
    bad_calls: list[tuple[Callable[[], object], type[Exception]]] = [
        (lambda: builder.add("t", 0, [b2, gap]), InvalidInput),  # gap after a good batch
        (lambda: builder.add_batch("t", 0, gap), InvalidInput),
        (lambda: builder.add_batch("t", 0, b0), InvalidInput),  # going back
        (lambda: builder.add_batch("t", 0, b2 + b"x"), InvalidInput),  # trailing byte
        (lambda: builder.add_batch("t", 0, b2[:-1]), InvalidInput),
        (lambda: builder.add_batch("t", 0, b"garbage" * 10), InvalidInput),
        (lambda: builder.add_batch("t", 0, "text"), InvalidInput),  # type: ignore[arg-type]
        (lambda: builder.add_batch("../t", 0, b2), InvalidName),
        (lambda: builder.add_batch("t", -1, b2), InvalidInput),
        (lambda: builder.add_batch("t", 2**32, b2), InvalidInput),
        (lambda: builder.add_batch("t", True, b2), InvalidInput),
    ]
    for call, exc_type in bad_calls:
        with pytest.raises(exc_type):
            call()
        assert builder.build("r1", 1, 1, 1, 1, 0) == before
        assert builder.next_offset("t", 0) == 2
        assert (builder.batch_count, builder.record_count, builder.raw_bytes) == (1, 2, len(b0))
    builder.add("t", 0, [])
    builder.add("t", 0, [b2, encode_batch([b"d"], timestamps=1, base_offset=3)])
    assert builder.next_offset("t", 0) == 4
    assert builder.next_offset("t", 1) is None


def test_build_rejects_bad_arguments() -> None:
    builder = LogObjectBuilder()
    builder.add_batch("t", 0, encode_batch([b"a"], timestamps=1))
    with pytest.raises(InvalidName):
        builder.build("r.1", 1, 1, 1, 1, 0)
    bad: list[dict[str, Any]] = [
        {"first_lsn": 0},
        {"first_lsn": 2, "last_lsn": 1},  # blocks need a non-empty LSN range
        {"first_lsn": 3, "last_lsn": 1},
        {"epoch": -1},
        {"seq": 2**64},
        {"created_ms": 2**63},
        {"level": 23},
        {"level": "3"},
        {"threads": -2},
    ]
    for kwargs in bad:
        args = {
            "region": "r1",
            "epoch": 1,
            "seq": 1,
            "first_lsn": 1,
            "last_lsn": 1,
            "created_ms": 0,
        } | kwargs
        with pytest.raises(InvalidInput):
            builder.build(**args)
    for limit in (39, MAX_BLOCK_RAW_BYTES + 1, 1.5):
        with pytest.raises(InvalidInput):
            LogObjectBuilder(max_block_bytes=limit)  # type: ignore[arg-type]


def test_encode_header_validates() -> None:
    _, h, _ = sample_object()
    for change in (
        {"header_length": h.header_length + 1},
        {"flags": 2},
        {"version": 2},
        {"region": "bad/region"},
        {"blocks": h.blocks[::-1]},
    ):
        with pytest.raises(InvalidInput):
            encode_header(dataclasses.replace(h, **change))


# --------------------------------------------------------------------------
# 5. corrupt and hostile input


def test_every_header_bit_flip_is_detected() -> None:
    obj, h, _ = sample_object()
    for i in range(h.header_length):
        for bit in (0, 3, 7):
            buf = bytearray(obj)
            buf[i] ^= 1 << bit
            with pytest.raises(CorruptData):
                decode_header(bytes(buf), where=KEY)


@FAST
@given(st.binary(max_size=300))
def test_garbage_header_raises_only_corrupt(data: bytes) -> None:
    only_corrupt(lambda: decode_header(data, where=KEY))
    only_corrupt(lambda: header_length_hint(data))
    only_corrupt(lambda: decode_header(b"EGWL\x01\x00\x00\x00" + data, where=KEY))


@SLOW
@given(st.data())
def test_mutated_headers_with_fixed_crc(data: st.DataObject) -> None:
    obj, h, _ = sample_object()
    buf = bytearray(obj[: h.header_length])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        op = data.draw(st.integers(0, 3))
        if op == 0:
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == 1:
            buf[pos] = data.draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
        elif op == 2 and pos + 4 <= len(buf):
            struct.pack_into(
                "<I", buf, pos, data.draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 64]))
            )
        else:
            del buf[pos : pos + data.draw(st.integers(1, 8))]
    if data.draw(st.booleans()) and len(buf) >= 16:
        hlen = min(struct.unpack_from("<I", buf, 8)[0], len(buf))
        if hlen >= 4:
            struct.pack_into("<I", buf, hlen - 4, crc32c.crc32c(bytes(buf[: hlen - 4])))
    got = only_corrupt(lambda: decode_header(bytes(buf), where=KEY))
    if isinstance(got, LogObjectHeader):
        assert encode_header(got) == bytes(buf[: got.header_length])


def valid_fields() -> tuple[dict[str, Any], LogObjectHeader]:
    _, h, _ = sample_object()
    fields = header_fields(h)
    assert decode_header(pack_header(**fields), where=KEY) == h  # the packer agrees
    return fields, h


def _block(fields: dict[str, Any], i: int, **change: Any) -> dict[str, Any]:
    names = [
        "topic",
        "partition",
        "first_offset",
        "last_offset",
        "record_count",
        "min_ts",
        "max_ts",
        "offset",
        "stored_length",
        "raw_length",
        "codec",
        "crc",
    ]
    rows = [list(r) for r in fields["blocks"]]
    for name, value in change.items():
        rows[i][names.index(name)] = value
    return fields | {"blocks": [tuple(r) for r in rows]}


def _shift(fields: dict[str, Any], delta: int) -> dict[str, Any]:
    """Move every block's offset by ``delta`` (e.g. after changing a name's length)."""
    rows = [(*r[:7], r[7] + delta, *r[8:]) for r in fields["blocks"]]
    return fields | {"blocks": rows}


HOSTILE: dict[str, Callable[[dict[str, Any], LogObjectHeader], dict[str, Any]]] = {
    "huge n_blocks": lambda f, h: f | {"n_blocks": 2**32 - 1},
    "n_blocks one too many": lambda f, h: f | {"n_blocks": 4},
    "n_blocks one too few": lambda f, h: f | {"n_blocks": 2},
    "trailing bytes in header": lambda f, h: _shift(f | {"extra": b"\x00" * 4}, 4),
    "region_len overrun": lambda f, h: f | {"region_len": 60_000},
    "overlapping blocks": lambda f, h: _block(f, 1, offset=h.blocks[0].offset),
    "gap between blocks": lambda f, h: _block(
        _block(f, 1, offset=h.blocks[1].offset + 1), 2, offset=h.blocks[2].offset + 1
    ),
    "blocks not at header end": lambda f, h: _shift(f, 1),
    "raw_length bomb": lambda f, h: _block(f, 0, raw_length=2**32 - 1),
    "raw_length over the limit": lambda f, h: _block(f, 0, raw_length=MAX_BLOCK_RAW_BYTES + 1),
    "raw_length below a batch": lambda f, h: _block(f, 0, raw_length=39),
    "records cannot fit raw_length": lambda f, h: _block(
        f, 0, first_offset=0, last_offset=999_999, record_count=1_000_000
    ),
    "count mismatch": lambda f, h: _block(f, 0, record_count=h.blocks[0].record_count + 1),
    "first after last": lambda f, h: _block(f, 0, first_offset=h.blocks[0].last_offset + 1),
    "min_ts after max_ts": lambda f, h: _block(f, 0, min_ts=h.blocks[0].max_ts + 1),
    "unknown codec": lambda f, h: _block(f, 0, codec=2),
    "uncompressed with stored != raw": lambda f, h: _block(f, 0, codec=CODEC_NONE),
    "stored larger than raw": lambda f, h: _block(f, 2, stored_length=h.blocks[2].raw_length + 1),
    "stored zero": lambda f, h: _block(f, 2, stored_length=0),
    "topic ../x": lambda f, h: _shift(_block(f, 0, topic=b"../x"), -2),
    "topic with slash": lambda f, h: _block(f, 0, topic=b"orde/s"),
    "empty topic": lambda f, h: _shift(_block(f, 0, topic=b""), -6),
    "topic not utf-8": lambda f, h: _block(f, 0, topic=b"orde\xff\xfe"),
    "region ../x": lambda f, h: _shift(f | {"region": b"../x"}, 2),
    "region with a dot": lambda f, h: _shift(f | {"region": b"r.1"}, 1),
    "empty region": lambda f, h: _shift(f | {"region": b""}, -2),
    "unsorted blocks": lambda f, h: (
        f | {"blocks": [_relocate(f["blocks"], [2, 0, 1], h.header_length)][0]}
    ),
    "same partition, offsets not contiguous": lambda f, h: _block(
        _block(f, 1, partition=0), 1, first_offset=20, last_offset=20
    ),
    "same partition, overlapping offsets": lambda f, h: _block(
        _block(f, 1, partition=0), 1, first_offset=15, last_offset=15
    ),
    "fence with blocks": lambda f, h: f | {"flags": FLAG_FENCE},
    "fence with LSNs": lambda f, h: (
        f | {"flags": FLAG_FENCE, "blocks": [], "first_lsn": 1, "last_lsn": 1}
    ),
    "first_lsn zero": lambda f, h: f | {"first_lsn": 0},
    "negative LSN range": lambda f, h: f | {"first_lsn": 20, "last_lsn": 1, "blocks": []},
    "blocks with empty LSN range": lambda f, h: f | {"first_lsn": 15, "last_lsn": 14},
    "version 2": lambda f, h: f | {"version": 2},
    "unknown flag": lambda f, h: f | {"flags": 0x80},
    "reserved": lambda f, h: f | {"reserved": 1},
    "magic": lambda f, h: f | {"magic": b"EGWJ"},
    "header_length too small": lambda f, h: f | {"header_length": MIN_HEADER_BYTES - 1},
    "header_length too large": lambda f, h: f | {"header_length": MAX_HEADER_BYTES + 1},
}


def _relocate(rows: list[tuple[Any, ...]], order: list[int], start: int) -> list[tuple[Any, ...]]:
    """Reorder index rows, keeping the byte layout contiguous."""
    out, pos = [], start
    for i in order:
        row = rows[i]
        out.append((*row[:7], pos, *row[8:]))
        pos += row[8]
    return out


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_header(case: str) -> None:
    fields, h = valid_fields()
    buf = pack_header(**HOSTILE[case](fields, h))
    with pytest.raises(CorruptData) as info:
        decode_header(buf + b"\x00" * 64, where=KEY)
    assert info.value.where == KEY


def test_object_size_must_match_the_index() -> None:
    obj, h, _ = sample_object()
    for size in (len(obj) - 1, len(obj) + 1, h.header_length):
        with pytest.raises(CorruptData, match="index describes"):
            decode_header(obj, where=KEY, object_size=size)


def test_block_corruption() -> None:
    obj, h, _ = sample_object()
    for b in h.blocks:
        stored = obj[b.offset : b.end]
        for i in range(len(stored)):
            buf = bytearray(stored)
            buf[i] ^= 0x10
            with pytest.raises(CorruptData, match="CRC"):
                decode_block(b, bytes(buf), where=KEY)
        for cut in (0, 1, len(stored) - 1):
            with pytest.raises(CorruptData):
                decode_block(b, stored[:cut], where=KEY)
        with pytest.raises(CorruptData):
            decode_block(b, stored + b"\x00", where=KEY)


def with_crc(index: BlockIndex, stored: bytes, **change: Any) -> BlockIndex:
    return dataclasses.replace(
        index, stored_length=len(stored), crc=crc32c.crc32c(stored), **change
    )


def rle_frame(declared: int | None, chunks: int, chunk: int = 1000) -> bytes:
    """A zstd frame of ``chunks`` RLE blocks of ``chunk`` bytes, declaring ``declared``
    bytes of content (or nothing): hand-made, so it can lie."""
    # No content size (with a window descriptor: 1 MiB), or single segment
    # with an 8-byte content size.
    head = b"\x00\x50" if declared is None else b"\xe0" + struct.pack("<Q", declared)
    body = b""
    for i in range(chunks):
        last = 1 if i == chunks - 1 else 0
        body += (chunk << 3 | 1 << 1 | last).to_bytes(3, "little") + b"\x61"
    return b"\x28\xb5\x2f\xfd" + head + body


def test_zstd_frames_that_lie() -> None:
    index = BlockIndex("t", 0, 0, 0, 1, 0, 0, 100, 0, 1000, CODEC_ZSTD, 0)
    # The hand-made frames are valid zstd.
    assert (
        decode_block(with_crc(index, rle_frame(1000, 1)), rle_frame(1000, 1), where=KEY)
        == b"a" * 1000
    )
    assert (
        decode_block(with_crc(index, rle_frame(None, 1)), rle_frame(None, 1), where=KEY)
        == b"a" * 1000
    )
    bomb = rle_frame(200 * MIB, 1)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptData, match="declares"):
            decode_block(with_crc(index, bomb), bomb, where=KEY)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MIB  # refused before allocating the declared size
    bad = {
        "undeclared, longer": rle_frame(None, 2),
        "undeclared, shorter": rle_frame(None, 1, 500),
        "declared, shorter": rle_frame(1000, 1, 500),
        "declared, longer": rle_frame(1000, 2),
        "trailing bytes": rle_frame(1000, 1) + b"\x00",
        "two frames": rle_frame(None, 1, 500) * 2,
        "skippable frame": b"\x50\x2a\x4d\x18" + struct.pack("<I", 1000) + b"\x00" * 1000,
        "not zstd": b"hello, world",
        "truncated frame": rle_frame(1000, 1)[:-1],
        "streamed by zstd, longer": zstd.ZstdCompressor(write_content_size=False).compress(
            b"b" * 1001
        ),
    }
    for name, stored in bad.items():
        got = only_corrupt(
            lambda stored=stored: decode_block(with_crc(index, stored), stored, where=KEY)
        )
        assert isinstance(got, CorruptData), name
    unknown = with_crc(index, b"x" * 1000, codec=7)
    with pytest.raises(CorruptData, match="codec"):
        decode_block(unknown, b"x" * 1000, where=KEY)


def test_iter_block_batches_checks_the_index() -> None:
    obj, h, _ = sample_object()
    o0 = h.blocks[0]  # offsets 10..15, timestamps 1000..1005, two batches
    raw = decode_block(o0, obj[o0.offset : o0.end], where=KEY)
    assert [b.base_offset for b in iter_block_batches(o0, raw)] == [10, 12]
    bad_index = {
        "first_offset": dataclasses.replace(o0, first_offset=9, record_count=7),
        "last_offset short": dataclasses.replace(o0, last_offset=14, record_count=5),
        "last_offset long": dataclasses.replace(o0, last_offset=16, record_count=7),
        "min_ts low": dataclasses.replace(o0, min_ts=999),
        "max_ts high": dataclasses.replace(o0, max_ts=1006),
        "min_ts high": dataclasses.replace(o0, min_ts=1001),
        "raw_length": dataclasses.replace(o0, raw_length=o0.raw_length + 1),
    }
    for name, index in bad_index.items():
        got = only_corrupt(lambda index=index: list(iter_block_batches(index, raw, where=KEY)))
        assert isinstance(got, CorruptData), name
    # A gap between the batches, and a corrupt batch.
    b1 = encode_batch([b"a"], timestamps=1000, base_offset=10)
    b2 = encode_batch([b"b"], timestamps=1000, base_offset=12)
    gap_index = BlockIndex("t", 0, 10, 11, 2, 1000, 1000, 0, 1, len(b1 + b2), 0, 0)
    with pytest.raises(CorruptData, match="offsets"):
        list(iter_block_batches(gap_index, b1 + b2))
    broken = bytearray(raw)
    broken[struct.unpack_from("<I", raw)[0] - 1] ^= 1  # a value byte of the first batch
    with pytest.raises(CorruptData, match="CRC"):
        list(iter_block_batches(o0, bytes(broken)))
    assert len(list(iter_block_batches(o0, bytes(broken), verify=False))) == 2


@FAST
@given(st.data())
def test_mutated_blocks_raise_only_corrupt(data: st.DataObject) -> None:
    obj, h, _ = sample_object()
    b = h.blocks[data.draw(st.integers(0, len(h.blocks) - 1))]
    buf = bytearray(obj[b.offset : b.end])
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(buf)))
        if data.draw(st.booleans()) and buf:
            buf[pos % len(buf)] ^= 1 << data.draw(st.integers(0, 7))
        else:
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
    stored = bytes(buf)
    # With the CRC recomputed the mutation reaches zstd and the batch decoder.
    index = with_crc(b, stored) if data.draw(st.booleans()) else b

    def run() -> object:
        return list(iter_block_batches(index, decode_block(index, stored, where=KEY), where=KEY))

    only_corrupt(run)


@FAST
@given(st.integers(0, 40_000), st.integers(0, 2000))
def test_block_split_by_the_first_get_is_joined(have: int, overlap: int) -> None:
    """A block that straddles the end of the first GET: the planned range starts
    at ``have``, and slice_block joins the two pieces (regression: it used to
    want one range holding the whole block)."""
    rnd = random.Random(3)
    builder = LogObjectBuilder()
    expected = {}
    for p in range(4):
        records = [Record(0, 5, None, rnd.randbytes(9000))]
        builder.add_batch("t", p, encode_records(records))
        expected[p] = records
    obj = builder.build("r1", 1, 1, 1, 4, 0)
    h = decode_header(obj, where=KEY, object_size=len(obj))
    first = obj[: max(have, h.header_length)]
    ranges = plan_ranges(h, lambda t, p: True, coalesce_gap=0, whole_object_fraction=1.0,
                         have=len(first))  # fmt: skip
    # Stores may also answer with overlapping ranges: start some earlier.
    fetched = [(0, first)] + [
        (max(a - overlap, 0), obj[max(a - overlap, 0) : b]) for a, b in ranges
    ]
    for b in h.blocks:
        raw = decode_block(b, slice_block(b, fetched, where=KEY), where=KEY)
        assert [r for batch in iter_block_batches(b, raw) for r in batch.records()] == expected[
            b.partition
        ]
    # A hole between the pieces is still an error.
    split = next((b for b in h.blocks if b.offset < len(first) < b.end), None)
    if split is not None:
        holed = [(0, first), (len(first) + 1, obj[len(first) + 1 :])]
        with pytest.raises(CorruptData, match="not within the bytes read"):
            slice_block(split, holed, where=KEY)


def test_zstd_contexts_outlive_threads_and_stay_few() -> None:
    # Worker threads come and go (trio ends idle ones): the contexts and the
    # join buffer an object was built and read with are kept for the next
    # thread, not made again per thread nor held by each thread that ran.
    from edge_gateway.format import logobject

    b1 = encode_batch([b"x" * 500], timestamps=1, base_offset=0)
    b2 = encode_batch([b"y" * 500], timestamps=1, base_offset=1)

    def build_and_read() -> None:
        builder = LogObjectBuilder()
        builder.add("t", 0, [b1, b2])
        obj = builder.build("r", 1, 1, 1, 2, 0)
        (block,) = decode_header(obj, where=KEY).blocks
        assert decode_block(block, obj[block.offset : block.end], where=KEY) == b1 + b2

    build_and_read()
    pools = [logobject._DECOMPRESSORS, logobject._JOINED, *logobject._COMPRESSORS.values()]
    first = [list(p._idle) for p in pools]
    assert all(first)
    for _ in range(5):
        t = threading.Thread(target=build_and_read)
        t.start()
        t.join()
    assert [list(p._idle) for p in pools] == first  # the same objects, reused

    # Many threads at once: each gets one, and at most `keep` stay afterwards.
    pool: logobject._Pool[object] = logobject._Pool(object, keep=3)
    barrier = threading.Barrier(8)
    lent: list[object] = []

    def hold() -> None:
        with pool.lend() as item:
            lent.append(item)
            barrier.wait()

    threads = [threading.Thread(target=hold) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(x) for x in lent}) == 8
    assert len(pool._idle) == 3


def test_an_opened_block_is_decompressed_without_a_second_check() -> None:
    # decode_block(opened=True): the caller vouches for the stored bytes (a
    # journal block entry's CRC covers them); the frame and its size are
    # still checked, and an opener makes no sense with it.
    b1 = encode_batch([b"x" * 500], timestamps=1, base_offset=0)
    builder = LogObjectBuilder()
    builder.add("t", 0, [b1])
    obj = builder.build("r", 1, 1, 1, 1, 0)
    (block,) = decode_header(obj, where=KEY).blocks
    stored = obj[block.offset : block.end]
    wrong_crc = dataclasses.replace(block, crc=block.crc ^ 1)
    with pytest.raises(CorruptData, match="CRC"):
        decode_block(wrong_crc, stored, where=KEY)
    assert decode_block(wrong_crc, stored, where=KEY, opened=True) == b1
    with pytest.raises(CorruptData):
        decode_block(block, stored[:-1], where=KEY, opened=True)
    with pytest.raises(InvalidInput, match="opener"):
        decode_block(block, stored, where=KEY, opened=True, opener=object())  # type: ignore[arg-type]
