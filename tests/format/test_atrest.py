"""The at-rest format (``edge_gateway.format.atrest``, ``docs/at-rest.md``): golden vectors,
round trips, record lookups, hostile and damaged input, and the shipper's and mirror's paths.

Decoders promise :class:`CorruptData` and nothing else on bad bytes, so the
damage tests catch every exception and fail on any other type.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.format import atrest
from edge_gateway.format import entry as E
from edge_gateway.format.atrest import (
    BlockEntry,
    CompressedSegment,
    FrameCache,
    compress_segment,
    decode_block_entry,
    encode_block_entry,
    expand_segment,
    iter_wal_entries,
    parse_entries,
)
from edge_gateway.format.batch import Record, decode_batch, encode_records
from edge_gateway.format.crypt import Keyring, WriteKey
from edge_gateway.format.entry import Checkpoint, ProducerStamp, SourceCoords
from edge_gateway.format.logobject import (
    CODEC_NONE,
    BlockIndex,
    LogObjectBuilder,
    StoredBlock,
    block_aad,
    decode_block,
    decode_header,
    iter_block_batches,
)

DATA = Path(__file__).parent / "data"
WAL_HEADER = struct.Struct("<4sB3xQ")


def wal_segment(entries: Sequence[bytes], base_lsn: int, version: int = 3) -> bytes:
    return WAL_HEADER.pack(b"EGWJ", version, base_lsn) + b"".join(entries)


def fetched_block(
    records: Sequence[Record], topic: str = "t", *, level: int = 3
) -> tuple[BlockIndex, bytes]:
    """A block of a source's log object: its index entry and stored bytes."""
    b = LogObjectBuilder()
    b.add_batch(topic, 0, encode_records(records))
    obj = b.build("south", 1, 9, 1, 4, 0, level)
    h = decode_header(obj, where="fetched")
    return h.blocks[0], obj[h.blocks[0].offset : h.blocks[0].end]


# --------------------------------------------------------------------------
# 1. the golden segment: every kind of entry a journal holds


def golden_wal() -> bytes:
    """A version 3 journal segment with a checkpoint (with producers), data entries of two
    partitions (one idempotent), mirror entries with a null value, headers and a gap in
    offsets, a marker and a block entry."""
    out: list[bytes] = []
    lsn = 41
    cp = Checkpoint(
        {("t", 0): 0, ("t", 1): 5},
        {"south": SourceCoords("south", 3, 1, True)},
        {"v": 1, "next_id": 8, "producers": []},
    )
    out.append(
        E.encode_entry(
            lsn=lsn, kind=E.KIND_CHECKPOINT, topic=b"", partition=0, base_offset=0, count=0,
            append_time=1_795_000_000_000, payload=cp.encode(),
        )
    )  # fmt: skip
    nxt = {0: 0, 1: 5}
    for i in range(6):
        lsn += 1
        p = i % 2
        rec = Record(nxt[p], 1_795_000_000_010 + i, b"s-%05d" % p, b'{"t":%d}' % (20 + i))
        out.append(
            E.encode_entry(
                lsn=lsn, kind=E.KIND_DATA, topic=b"t", partition=p, base_offset=nxt[p], count=1,
                append_time=1_795_000_000_010 + i, payload=encode_records([rec]),
                producer=ProducerStamp(7, 0, 3) if i == 3 else None,
            )
        )  # fmt: skip
        nxt[p] += 1
    src = SourceCoords("south", 4, 1, False)
    for base, end in ((100, False), (103, True)):  # 102 is a gap: the source dropped it
        lsn += 1
        recs = [
            Record(base, 1_794_999_999_000, b"k", None, (("h", None), ("x", b"1"))),
            Record(base + 1, 1_794_999_999_001, None, b"v"),
        ]
        out.append(
            E.encode_entry(
                lsn=lsn, kind=E.KIND_MIRROR, topic=b"south.t", partition=0, base_offset=base,
                count=2, append_time=1_795_000_000_100, payload=encode_records(recs),
                source=dataclasses.replace(src, end_of_object=end),
            )
        )  # fmt: skip
    lsn += 1
    out.append(
        E.encode_entry(
            lsn=lsn, kind=E.KIND_MIRROR, topic=b"", partition=0, base_offset=0, count=0,
            append_time=1_795_000_000_101, payload=b"", source=SourceCoords("south", 5, 1, True),
        )
    )  # fmt: skip
    lsn += 1
    index, stored = fetched_block(
        [Record(105 + i, 1_794_999_999_100 + i, None, b"abc" * 30) for i in range(4)], "t"
    )
    out.append(
        encode_block_entry(
            lsn=lsn, topic="south.t", partition=0, append_time=1_795_000_000_102,
            source=SourceCoords("south", 6, 1, True), index=index, stored=stored,
        )
    )  # fmt: skip
    return wal_segment(out, 41)


def compress_golden(wal: bytes) -> bytes:
    return compress_segment(wal, frame_raw_bytes=200, chunk_raw_bytes=600)


def test_golden_segment() -> None:
    wal = golden_wal()
    assert wal == (DATA / "atrest_v1.wal").read_bytes()
    golden = (DATA / "atrest_v1.egwc").read_bytes()
    assert compress_golden(wal) == golden
    # the fixed parts, as docs/at-rest.md shows them
    assert golden[:16].hex() == "45475743010300002900000000000000"
    dir_offset, dir_length, magic = struct.unpack("<QI4s", golden[-16:])
    assert magic == b"EGWC"
    assert dir_offset + dir_length + 16 == len(golden)
    # a reader of the committed bytes gets back the very journal segment
    assert expand_segment(golden) == wal
    seg = CompressedSegment(golden)
    d = seg.directory
    assert (d.base_lsn, d.last_lsn, d.wal_version, d.wal_bytes) == (41, 51, 3, len(wal))
    assert len(d.chunks) >= 2
    assert d.parts[:2] == (("t", 0), ("t", 1))
    origins = {(f.topic, f.origin) for f in d.frames}
    assert origins == {
        ("t", atrest.ORIGIN_DATA),
        ("south.t", atrest.ORIGIN_MIRROR),
        ("south.t", atrest.ORIGIN_BLOCK),
    }
    assert seg.record("south.t", 0, 100) == Record(
        100, 1_794_999_999_000, b"k", None, (("h", None), ("x", b"1"))
    )
    assert seg.record("south.t", 0, 102) is None  # the gap stays a gap
    assert seg.record("south.t", 0, 107) == Record(107, 1_794_999_999_102, None, b"abc" * 30)
    entries = parse_entries(golden)
    assert entries == list(iter_wal_entries(wal))
    stamps = [e.producer for e in entries if not isinstance(e, BlockEntry) and e.producer]
    assert stamps == [ProducerStamp(7, 0, 3)]


def test_golden_data_files_are_current() -> None:
    """Regenerate with ``python tests/format/test_atrest.py`` (only for a new version)."""
    assert (DATA / "atrest_v1.wal").exists()
    assert (DATA / "atrest_v1.egwc").exists()


# --------------------------------------------------------------------------
# 2. round trips (Hypothesis): journal entries -> compressed segment -> the same entries

_values = st.one_of(st.none(), st.binary(max_size=40))
_headers = st.lists(
    st.tuples(st.text(max_size=4), st.one_of(st.none(), st.binary(max_size=6))), max_size=2
).map(tuple)


@st.composite
def _records(draw: st.DrawFn, base: int) -> list[Record]:
    n = draw(st.integers(1, 4))
    ts = draw(st.integers(-(2**40), 2**40))
    return [
        Record(
            base + i,
            ts + draw(st.integers(-5, 5)),
            draw(st.one_of(st.none(), st.binary(max_size=8))),
            draw(_values),
            draw(_headers),
        )
        for i in range(n)
    ]


@st.composite
def wal_segments(draw: st.DrawFn) -> bytes:
    base_lsn = draw(st.integers(1, 2**40))
    lsn = base_lsn
    nxt: dict[tuple[str, int], int] = {}
    out: list[bytes] = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["data", "producer", "mirror", "marker", "block", "cp"]))
        # wall-clock ms, now and then a clock set far off (the extremes of i64 included)
        time = draw(
            st.one_of(
                st.integers(1_795_000_000_000, 1_795_000_001_000), st.integers(-(2**63), 2**63 - 1)
            )
        )
        if kind in ("data", "producer"):
            key = ("t", draw(st.integers(0, 2)))
        else:
            key = (draw(st.sampled_from(["south.t", "west.u"])), draw(st.integers(0, 1)))
        base = nxt.get(key, draw(st.integers(0, 10**12)))
        if kind in ("mirror", "block"):
            base += draw(st.sampled_from([0, 0, 1, 7]))  # a mirror partition may skip forward
        source = SourceCoords(
            draw(st.sampled_from(["south", "west"])),
            draw(st.integers(0, 2**64 - 1)),
            draw(st.integers(0, 2**64 - 1)),
            draw(st.booleans()),
        )
        topic = key[0].encode()
        if kind == "cp":
            payload = Checkpoint({key: base}, {source.region: source}).encode()
            out.append(
                E.encode_entry(
                    lsn=lsn, kind=E.KIND_CHECKPOINT, topic=b"", partition=0, base_offset=0,
                    count=0, append_time=time, payload=payload,
                )
            )  # fmt: skip
        elif kind == "marker":
            out.append(
                E.encode_entry(
                    lsn=lsn, kind=E.KIND_MIRROR, topic=b"", partition=0, base_offset=0, count=0,
                    append_time=time, payload=b"", source=source,
                )
            )  # fmt: skip
        else:
            recs = draw(_records(base))
            if kind == "block":
                index, stored = fetched_block(recs, key[0], level=draw(st.sampled_from([1, 3])))
                out.append(
                    encode_block_entry(
                        lsn=lsn, topic=key[0], partition=key[1], append_time=time,
                        source=source, index=index, stored=stored,
                    )
                )  # fmt: skip
            else:
                producer = None
                if kind == "producer":
                    producer = ProducerStamp(
                        draw(st.integers(0, 2**64 - 1)),
                        draw(st.integers(0, 2**16 - 1)),
                        draw(st.integers(0, 2**32 - 1)),
                    )
                out.append(
                    E.encode_entry(
                        lsn=lsn,
                        kind=E.KIND_MIRROR if kind == "mirror" else E.KIND_DATA,
                        topic=topic,
                        partition=key[1],
                        base_offset=base,
                        count=len(recs),
                        append_time=time,
                        payload=encode_records(recs),
                        source=source if kind == "mirror" else None,
                        producer=producer,
                    )
                )
            nxt[key] = base + len(recs)
        lsn += 1
    return wal_segment(out, base_lsn)


def expected_records(wal: bytes) -> dict[tuple[str, int, int], Record]:
    out: dict[tuple[str, int, int], Record] = {}
    for e in iter_wal_entries(wal):
        if isinstance(e, BlockEntry):
            raw = decode_block(e.block_index(), e.stored, where="test")
            batches = list(iter_block_batches(e.block_index(), raw))
        elif e.count:
            batches = [decode_batch(e.payload)]
        else:
            continue
        for b in batches:
            for r in b.records():
                out[(e.topic, e.partition, r.offset)] = r
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    wal=wal_segments(),
    frame_raw_bytes=st.integers(40, 1500),
    chunk_raw_bytes=st.integers(1, 3000),
    level=st.sampled_from([-5, 1, 3]),
)
def test_round_trip(wal: bytes, frame_raw_bytes: int, chunk_raw_bytes: int, level: int) -> None:
    z = compress_segment(
        wal, frame_raw_bytes=frame_raw_bytes, chunk_raw_bytes=chunk_raw_bytes, level=level
    )
    assert expand_segment(z) == wal
    assert parse_entries(z) == list(iter_wal_entries(wal))
    seg = CompressedSegment(z, cache=FrameCache(4096))
    want = expected_records(wal)
    for (topic, partition, offset), record in want.items():
        assert seg.record(topic, partition, offset) == record
        # one lookup: the frame that holds it, and no other
        f = seg.directory.frames[seg.directory.find_frame(topic, partition, offset) or 0]
        assert f.first_offset <= offset <= f.last_offset
    for topic, partition, offset in list(want)[:20]:
        for gap in (offset - 1, offset + 1):
            if (topic, partition, gap) not in want:
                assert seg.record(topic, partition, gap) is None


# --------------------------------------------------------------------------
# 3. damage: truncation at every byte, every bit flipped, hostile structure


def _read_all(data: bytes) -> None:
    seg = CompressedSegment(data, cache=FrameCache(0))
    for _ in seg.iter_wal():
        pass
    for i in range(len(seg.directory.frames)):
        seg.frame(i)


def _must_be_corrupt(data: bytes, what: str) -> None:
    try:
        _read_all(data)
    except CorruptData:
        return
    except Exception as exc:  # any other type is the failure
        pytest.fail(f"{what}: {type(exc).__name__}: {exc}")
    pytest.fail(f"{what}: damaged bytes decoded")


def test_truncated_at_every_byte() -> None:
    golden = (DATA / "atrest_v1.egwc").read_bytes()
    for n in range(len(golden)):
        _must_be_corrupt(golden[:n], f"cut at {n}")


def test_every_bit_flip_is_detected() -> None:
    golden = (DATA / "atrest_v1.egwc").read_bytes()
    rng = random.Random(5)
    for pos in range(len(golden)):
        for bit in {pos % 8, rng.randrange(8)}:
            bad = bytearray(golden)
            bad[pos] ^= 1 << bit
            _must_be_corrupt(bytes(bad), f"bit {bit} of byte {pos}")


def test_block_entry_truncated_and_flipped() -> None:
    index, stored = fetched_block([Record(5, 1, b"k", b"v" * 50), Record(6, 2, None, None)])
    raw = encode_block_entry(
        lsn=3, topic="south.t", partition=1, append_time=9,
        source=SourceCoords("south", 4, 2, True), index=index, stored=stored,
    )  # fmt: skip
    e = decode_block_entry(raw)
    assert (e.first_offset, e.record_count, e.stored, e.source.seq) == (5, 2, stored, 4)
    assert atrest.encode_any_entry(e) == raw
    for n in range(len(raw)):
        with pytest.raises(CorruptData):
            decode_block_entry(raw[:n])
    for pos in range(len(raw)):
        bad = bytearray(raw)
        bad[pos] ^= 1 << (pos % 8)
        try:
            decode_any_entry_strict(bytes(bad))
        except CorruptData:
            continue
        pytest.fail(f"a flipped bit at {pos} decoded")


def test_block_entry_read_path_refuses_damage_with_one_crc() -> None:
    # The read path (decode with check_block=False, then block_entry_raw) checks
    # the entry's CRC, which covers the block's bytes, and leaves the block's
    # own CRC and frame header to the decompression: every cut and flipped bit
    # is still refused, and decodes to the same batches when intact.
    index, stored = fetched_block([Record(5, 1, b"k", b"v" * 50), Record(6, 2, None, None)])
    raw = encode_block_entry(
        lsn=3, topic="south.t", partition=1, append_time=9,
        source=SourceCoords("south", 4, 2, True), index=index, stored=stored,
    )  # fmt: skip

    def read(buf: bytes) -> bytes:
        e = atrest.decode_any_entry(buf, check_block=False)
        assert isinstance(e, BlockEntry)
        return atrest.block_entry_raw(e, where="t")

    assert read(raw) == decode_block(index, stored, where="t")
    e = decode_block_entry(raw, check_block=False)
    assert e.header_only() == dataclasses.replace(e, stored=b"")
    for n in range(len(raw)):
        with pytest.raises(CorruptData):
            read(raw[:n])
    for pos in range(len(raw)):
        bad = bytearray(raw)
        bad[pos] ^= 1 << (pos % 8)
        with pytest.raises(CorruptData):
            read(bytes(bad))
    # A forged entry (a frame that is not zstd, the entry's CRC made valid): the
    # decompression refuses it where the block CRC no longer looks.
    forged = bytearray(raw)
    forged[-len(stored)] ^= 0xFF
    forged[4:8] = struct.pack("<I", crc32c.crc32c(bytes(forged[8:])))
    with pytest.raises(CorruptData, match="block CRC"):
        decode_block_entry(bytes(forged))
    with pytest.raises(CorruptData, match="zstd"):
        read(bytes(forged))


def decode_any_entry_strict(raw: bytes) -> None:
    e = atrest.decode_any_entry(raw)
    if isinstance(e, BlockEntry):
        decode_block(e.block_index(), e.stored, where="t")


def _parts(z: bytes) -> tuple[int, int, bytearray]:
    dir_offset, dir_length, _ = struct.unpack("<QI4s", z[-16:])
    return dir_offset, dir_length, bytearray(z[dir_offset : dir_offset + dir_length])


def _with_directory(z: bytes, edit: Callable[[bytearray], None]) -> bytes:
    """``z`` with its directory edited and its CRC made valid again (a forger's file)."""
    dir_offset, dir_length, d = _parts(z)
    edit(d)
    d[-4:] = struct.pack("<I", crc32c.crc32c(bytes(d[:-4])))
    return z[:dir_offset] + bytes(d) + z[dir_offset + dir_length :]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        pytest.param(32, 2**32 - 1, "cannot fit", id="n_parts huge"),
        pytest.param(36, 2**32 - 1, "cannot fit", id="n_chunks huge"),
        pytest.param(40, 2**32 - 1, "cannot fit", id="n_frames huge"),
        pytest.param(8, 40, "LSNs", id="last_lsn below base"),
        pytest.param(44, 2, "journal segment version", id="wal_version differs"),
        pytest.param(0, 42, "base_lsn", id="base_lsn differs"),
    ],
)
def test_hostile_directory_fields(field: int, value: int, message: str) -> None:
    golden = (DATA / "atrest_v1.egwc").read_bytes()
    fmt = "<B" if field == 44 else ("<Q" if field < 32 else "<I")
    bad = _with_directory(golden, lambda d: struct.pack_into(fmt, d, field, value))
    with pytest.raises(CorruptData, match=message):
        _read_all(bad)


def test_hostile_frame_placement_and_sizes() -> None:
    golden = (DATA / "atrest_v1.egwc").read_bytes()
    seg = CompressedSegment(golden)
    d = seg.directory
    _, _, raw_dir = _parts(golden)
    frames_at = len(raw_dir) - 4 - len(d.frames) * atrest._FRAME.size
    # each frame field: part, origin, flags, first, last, count, min, max, offset, stored,
    # raw, codec, crc, n_entries; (position in the record, format, value)
    edits = [
        (0, "<I", 999),  # a partition that is not in the table
        (4, "<B", 9),  # an unknown origin
        (5, "<B", 2),  # an unknown frame flag
        (22, "<I", 99),  # a record count that does not match the offsets
        (42, "<Q", 17),  # a frame somewhere else than back to back
        (50, "<I", 2**31),  # stored longer than raw
        (54, "<I", 2**31),  # raw beyond the limit
        (58, "<B", 7),  # an unknown codec
        (63, "<I", 0),  # no entries
        (63, "<I", 4),  # more entries than it holds
        (34, "<q", -(2**63)),  # timestamps its batches do not span
    ]
    for pos, fmt, value in edits:

        def edit(b: bytearray, pos: int = pos, fmt: str = fmt, value: int = value) -> None:
            struct.pack_into(fmt, b, frames_at + pos, value)

        bad = _with_directory(golden, edit)
        _must_be_corrupt(bad, f"frame field at {pos} = {value}")


def test_hostile_entry_table() -> None:
    """An entry table whose CRC and codec are valid but whose contents lie."""
    golden = (DATA / "atrest_v1.egwc").read_bytes()
    seg = CompressedSegment(golden)
    c = seg.directory.chunks[0]
    stored = bytes(seg.data[c.meta_offset : c.meta_offset + c.meta_stored])
    probe = BlockIndex(
        "t", 0, 0, 0, 1, 0, 0, c.meta_offset, c.meta_stored, c.meta_raw, c.meta_codec, c.meta_crc
    )
    raw = decode_block(probe, stored, where="t")
    n = c.n_entries
    kinds_at, frames_at = 8, 8 + 2 * n + 4 * n
    cases: list[tuple[int, str, int]] = [
        (0, "<I", n + 1),  # another entry count
        (4, "<I", 1),  # extras that do not add up
        (kinds_at + 1, "<B", 9),  # an unknown kind where a data entry is
        (kinds_at + n + 1, "<B", 0x80),  # unknown flags on a data entry
        (frames_at + 4, "<I", 2**31),  # a frame that does not exist
        (frames_at + 4, "<I", 0xFFFFFFFF),  # a data entry without a frame
        (frames_at + 4 + 4 * n, "<I", 3),  # a count that overruns the frame
        (frames_at + 4 + 8 * n, "<I", 3),  # a raw length that does not fill the frame
        (frames_at + 16 * n, "<Q", 1),  # the checkpoint's append time changed
    ]
    for pos, fmt, value in cases:
        mutated = bytearray(raw)
        struct.pack_into(fmt, mutated, pos, value)
        bad = _replace_meta(golden, 0, bytes(mutated))
        _must_be_corrupt(bad, f"entry table byte {pos} = {value}")


def _frame_subset(whole: atrest.ChunkEntries, frame_no: int) -> dict[str, list[object]]:
    idx = [i for i in range(len(whole.kinds)) if whole.frames[i] == frame_no]
    return {
        "lsns": [whole.lsn(i) for i in idx],
        "kinds": [whole.kinds[i] for i in idx],
        "flags": [whole.flags[i] for i in idx],
        "parts": [whole.parts[i] for i in idx],
        "counts": [whole.counts[i] for i in idx],
        "raw_lengths": [whole.raw_lengths[i] for i in idx],
        "append_times": [whole.append_times[i] for i in idx],
        "base_offsets": [whole.base_offsets[i] for i in idx],
        "raw_positions": [whole.raw_positions[i] for i in idx],
        "extras": [whole.extra_bytes(i) for i in idx],
    }


def _frame_view(part: atrest.ChunkEntries) -> dict[str, list[object]]:
    m = len(part.kinds)
    return {
        "lsns": [part.lsn(i) for i in range(m)],
        "kinds": list(part.kinds),
        "flags": list(part.flags),
        "parts": list(part.parts),
        "counts": list(part.counts),
        "raw_lengths": list(part.raw_lengths),
        "append_times": list(part.append_times),
        "base_offsets": list(part.base_offsets),
        "raw_positions": list(part.raw_positions),
        "extras": [part.extra_bytes(i) for i in range(m)],
    }


@pytest.mark.parametrize("source", ["golden", "one-record entries, small frames"])
def test_one_frames_entries_are_the_whole_tables_entries_of_that_frame(source: str) -> None:
    """``decode_frame_entries`` (a read by offset) gives, for every frame, exactly the
    entries ``decode_entries`` gives for it, with their LSNs, and serves the same entries."""
    if source == "golden":
        z = (DATA / "atrest_v1.egwc").read_bytes()
    else:
        wal = telemetry_wal(900)
        z = atrest.compress_segment(wal, frame_raw_bytes=2000, chunk_raw_bytes=40_000)
    seg = CompressedSegment(z)
    d = seg.directory
    checked = 0

    def raw_of(n: int) -> bytes:
        return seg.frame(n).raw

    for ci, c in enumerate(d.chunks):
        stored = bytes(seg.data[c.meta_offset : c.meta_offset + c.meta_stored])
        whole = atrest.decode_entries(d, ci, stored, where="t")
        for fno in c.frames:
            part = atrest.decode_frame_entries(d, ci, stored, fno, where="t")
            assert _frame_view(part) == _frame_subset(whole, fno)
            for k in range(len(part.kinds)):
                i = part.lsn(k) - c.first_lsn
                got = atrest.wal_entry(d, part, k, raw_of, seg.stored, where="t")
                assert got == atrest.wal_entry(d, whole, i, raw_of, seg.stored, where="t")
            checked += 1
        with pytest.raises(CorruptData, match="is not chunk"):
            atrest.decode_frame_entries(d, ci, stored, c.first_frame + c.n_frames, where="t")
    assert checked == len(d.frames)


def test_a_hostile_entry_table_is_corrupt_for_the_frame_it_lies_about() -> None:
    """The rules of one frame's entries are checked when only those are decoded."""
    golden = (DATA / "atrest_v1.egwc").read_bytes()
    seg = CompressedSegment(golden)
    d = seg.directory
    c = d.chunks[0]
    stored = bytes(seg.data[c.meta_offset : c.meta_offset + c.meta_stored])
    whole = atrest.decode_entries(d, 0, stored, where="t")
    fno = whole.frames[1]  # the frame of entry 1, which the cases below change
    probe = BlockIndex(
        "t", 0, 0, 0, 1, 0, 0, c.meta_offset, c.meta_stored, c.meta_raw, c.meta_codec, c.meta_crc
    )
    raw = decode_block(probe, stored, where="t")
    n = c.n_entries
    kinds_at, frames_at = 8, 8 + 2 * n + 4 * n
    cases: list[tuple[int, str, int]] = [
        (0, "<I", n + 1),  # another entry count
        (4, "<I", 1),  # extras that do not add up
        (kinds_at + 1, "<B", 9),  # an unknown kind where a data entry is
        (kinds_at + n + 1, "<B", 0x80),  # unknown flags on a data entry
        (frames_at + 4 + 4 * n, "<I", 3),  # a count that overruns the frame
        (frames_at + 4 + 8 * n, "<I", 3),  # a raw length that does not fill the frame
        (frames_at + 4 - 4 * n, "<I", 0xFFFF),  # its partition is not its frame's
    ]
    for pos, fmt, value in cases:
        mutated = bytearray(raw)
        struct.pack_into(fmt, mutated, pos, value)
        bad = CompressedSegment(_replace_meta(golden, 0, bytes(mutated)))
        bc = bad.directory.chunks[0]
        bstored = bytes(bad.data[bc.meta_offset : bc.meta_offset + bc.meta_stored])
        with pytest.raises(CorruptData):
            atrest.decode_frame_entries(bad.directory, 0, bstored, fno, where="t")


def _replace_meta(z: bytes, chunk_no: int, raw: bytes) -> bytes:
    """``z`` with chunk ``chunk_no``'s entry table stored raw (codec 0) as ``raw``, every
    position after it moved and every CRC made valid: a well-formed file that lies."""
    seg = CompressedSegment(z)
    d = seg.directory
    c = d.chunks[chunk_no]
    shift = len(raw) - c.meta_stored
    dir_offset, _, dirb = _parts(z)
    n_parts_bytes = 48 + sum(2 + len(t.encode()) + 4 for t, _ in d.parts)
    chunk_at = n_parts_bytes + chunk_no * atrest._CHUNK.size
    struct.pack_into(
        "<IIBI", dirb, chunk_at + 32, len(raw), len(raw), CODEC_NONE, crc32c.crc32c(raw)
    )
    for k in range(chunk_no + 1, len(d.chunks)):
        at = n_parts_bytes + k * atrest._CHUNK.size + 24
        struct.pack_into("<Q", dirb, at, d.chunks[k].meta_offset + shift)
    frames_at = n_parts_bytes + len(d.chunks) * atrest._CHUNK.size
    for i, f in enumerate(d.frames):
        if f.offset > c.meta_offset:
            struct.pack_into("<Q", dirb, frames_at + i * atrest._FRAME.size + 42, f.offset + shift)
    dirb[-4:] = struct.pack("<I", crc32c.crc32c(bytes(dirb[:-4])))
    body = z[: c.meta_offset] + raw + z[c.meta_offset + c.meta_stored : dir_offset]
    return body + bytes(dirb) + struct.pack("<QI4s", len(body), len(dirb), b"EGWC")


def test_replace_meta_keeps_a_valid_file() -> None:
    """The forger above produces a valid file when it changes nothing (so the hostile
    cases fail on the lie, not on the forgery)."""
    golden = (DATA / "atrest_v1.egwc").read_bytes()
    seg = CompressedSegment(golden)
    c = seg.directory.chunks[0]
    probe = BlockIndex(
        "t", 0, 0, 0, 1, 0, 0, c.meta_offset, c.meta_stored, c.meta_raw, c.meta_codec, c.meta_crc
    )
    raw = decode_block(probe, seg.data[c.meta_offset : c.meta_offset + c.meta_stored], where="t")
    assert expand_segment(_replace_meta(golden, 0, raw)) == golden_wal()


# --------------------------------------------------------------------------
# 4. the shipper and the mirror


def telemetry_wal(n: int, partitions: int = 4, base_lsn: int = 1) -> bytes:
    rng = random.Random(3)
    nxt = [0] * partitions
    out = []
    for i in range(n):
        p = rng.randrange(partitions)
        value = b'{"sensor_id":"s-%05d","temperature":%.2f,"seq":%d}' % (p, 20 + rng.random(), i)
        rec = Record(nxt[p], 1_795_000_000_000 + i, b"s-%05d" % p, value)
        out.append(
            E.encode_entry(
                lsn=base_lsn + i, kind=E.KIND_DATA, topic=b"telemetry", partition=p,
                base_offset=nxt[p], count=1, append_time=1_795_000_000_000 + i,
                payload=encode_records([rec]),
            )
        )  # fmt: skip
        nxt[p] += 1
    return wal_segment(out, base_lsn, version=2)


def test_shipping_stored_blocks_builds_the_same_object() -> None:
    """A log object built from the blocks kept at rest is byte for byte the one the
    builder makes from the same batches: the shipper need not recompress."""
    wal = telemetry_wal(3000)
    z = compress_segment(wal, frame_raw_bytes=16 * 1024, chunk_raw_bytes=100_000)
    seg = CompressedSegment(z)
    entries = list(iter_wal_entries(wal))
    assert len(seg.directory.chunks) > 1
    for ci, c in enumerate(seg.directory.chunks):
        stored = LogObjectBuilder()
        for topic, partition, block in seg.ship_blocks(ci):
            stored.add_stored(topic, partition, block)
        fresh = LogObjectBuilder(max_block_bytes=16 * 1024)
        for e in entries[c.first_lsn - 1 : c.last_lsn]:
            assert not isinstance(e, BlockEntry)
            fresh.add_batch(e.topic, e.partition, e.payload)
        args = ("north", 1, 7 + ci, c.first_lsn, c.last_lsn, 1_795_000_000_000)
        assert stored.build(*args) == fresh.build(*args)
        assert (stored.record_count, stored.batch_count) == (fresh.record_count, fresh.batch_count)


def test_add_stored_refuses_what_is_not_a_block() -> None:
    b = LogObjectBuilder()
    good = StoredBlock(0, 0, 1, 1, 52, CODEC_NONE, b"x" * 52, 1)
    with pytest.raises(InvalidInput):
        b.add_stored("t", 0, dataclasses.replace(good, payload=b"x" * 51))
    with pytest.raises(InvalidInput):
        b.add_stored("t", 0, dataclasses.replace(good, codec=1))
    with pytest.raises(InvalidInput):
        b.add_stored("t", 0, dataclasses.replace(good, batches=0))
    b.add_stored("t", 0, good)
    with pytest.raises(InvalidInput, match="contiguous"):
        b.add_stored("t", 0, good)


def test_mirror_keeps_an_encrypted_block_opened_not_recompressed() -> None:
    """A sealed block is authenticated, opened and kept as its compressed payload."""
    key = WriteKey("k1", bytes(range(32)))
    ring = Keyring({"south": {"k1": bytes(range(32))}})
    b = LogObjectBuilder()
    recs = [Record(i, i, None, b"reading %d" % (i % 3) * 20) for i in range(50)]
    b.add_batch("t", 0, encode_records(recs))
    obj = b.build("south", 1, 9, 1, 4, 0, key=key)
    h = decode_header(obj, where="k")
    index = h.blocks[0]
    opener = ring.header_opener(h, where="k")
    assert opener is not None
    sealed = obj[index.offset : index.end]
    payload = opener.open(block_aad(opener.context, index), sealed)
    assert payload is not None
    raw = encode_block_entry(
        lsn=1, topic="south.t", partition=0, append_time=0,
        source=SourceCoords("south", 9, 1, True), index=index, stored=payload,
    )  # fmt: skip
    e = decode_block_entry(raw)
    assert e.stored == payload
    assert len(e.stored) == index.stored_length - 28  # the nonce and tag are gone, nothing else
    assert decode_block(e.block_index(), e.stored, where="t") == decode_block(
        index, sealed, where="t", opener=opener
    )


def test_encoder_refuses_what_it_cannot_keep() -> None:
    wal = telemetry_wal(10)
    entries = list(iter_wal_entries(wal))
    enc = atrest.SegmentEncoder(1, wal_version=2)
    with pytest.raises(InvalidInput, match="LSN"):
        enc.add(entries[1])
    with pytest.raises(InvalidInput, match="at least one entry"):
        enc.finish()
    enc.add(entries[0])
    second = entries[1]
    assert not isinstance(second, BlockEntry)
    back = dataclasses.replace(second, base_offset=-1)
    with pytest.raises(InvalidInput):
        enc.add(back)
    for bad in (
        {"frame_raw_bytes": 10},
        {"chunk_raw_bytes": 0},
        {"level": 99},
        {"wal_version": 4},
    ):
        with pytest.raises(InvalidInput):
            atrest.SegmentEncoder(1, **bad)


def test_offsets_going_back_are_refused() -> None:
    rec = encode_records([Record(5, 1, None, b"v")])
    out = [
        E.encode_entry(
            lsn=1 + i, kind=E.KIND_DATA, topic=b"t", partition=0, base_offset=5, count=1,
            append_time=0, payload=rec,
        )
        for i in range(2)
    ]  # fmt: skip
    with pytest.raises(InvalidInput, match="go back"):
        compress_segment(wal_segment(out, 1, 2))


def test_frame_cache_is_bounded() -> None:
    wal = telemetry_wal(4000, partitions=8)
    z = compress_segment(wal, frame_raw_bytes=8 * 1024)
    cache = FrameCache(32 * 1024)
    seg = CompressedSegment(z, cache=cache)
    want = expected_records(wal)
    for (topic, partition, offset), rec in list(want.items())[::7]:
        assert seg.record(topic, partition, offset) == rec
        assert cache.bytes <= 32 * 1024
    assert cache.misses > len(seg.directory.frames)  # evicted and loaded again
    before = cache.hits
    seg.record("telemetry", 0, 0)
    seg.record("telemetry", 0, 1)
    assert cache.hits > before
    cache.forget(id(seg))
    assert cache.bytes == 0


def test_lookup_reads_one_frame() -> None:
    """A reader with only ``pread`` finds a record with the header, the trailer, the
    directory and one frame: one index lookup, one block decompression."""
    wal = telemetry_wal(5000, partitions=4)
    z = compress_segment(wal, frame_raw_bytes=16 * 1024, chunk_raw_bytes=200_000)
    reads: list[tuple[int, int]] = []

    def pread(offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return z[offset : offset + length]

    wal_version, base_lsn = atrest.decode_header(pread(0, 16), where="p")
    dir_offset, dir_length = atrest.decode_trailer(
        pread(len(z) - 16, 16), file_size=len(z), where="p"
    )
    d = atrest.decode_directory(
        pread(dir_offset, dir_length),
        base_lsn=base_lsn,
        wal_version=wal_version,
        dir_offset=dir_offset,
        where="p",
    )
    want = expected_records(wal)[("telemetry", 2, 700)]
    i = d.find_frame("telemetry", 2, 700)
    assert i is not None
    f = d.frames[i]
    raw = atrest.decode_frame(f, pread(f.offset, f.stored_length), where="p")
    fb = atrest.FrameBatches(f, raw, where="p")
    assert fb.record(700) == want
    assert len(reads) == 4
    assert reads[-1] == (f.offset, f.stored_length)
    assert sum(n for _, n in reads) < len(z) // 4


if __name__ == "__main__":  # regenerate the golden files (a new format version only)
    DATA.mkdir(exist_ok=True)
    (DATA / "atrest_v1.wal").write_bytes(golden_wal())
    (DATA / "atrest_v1.egwc").write_bytes(compress_golden(golden_wal()))


def test_expanding_checks_a_block_frame_it_does_not_decompress() -> None:
    """A mirrored block is passed on compressed when the segment is expanded: its CRC is
    still checked (found by fuzz/fuzz_atrest.py)."""
    golden = (DATA / "atrest_v1.egwc").read_bytes()
    f = next(f for f in CompressedSegment(golden).directory.frames if f.origin == 3)
    for pos in range(f.offset, f.end):
        bad = bytearray(golden)
        bad[pos] ^= 0x10
        with pytest.raises(CorruptData, match="CRC mismatch"):
            expand_segment(bytes(bad))


def test_a_block_entry_is_read_like_a_frame() -> None:
    """The journal serves a mirrored block from its entry (active segment) as from a frame."""
    recs = [Record(40 + i, 100 + i, None, b"x%d" % i) for i in range(30)]
    index, stored = fetched_block(recs)
    e = decode_block_entry(
        encode_block_entry(
            lsn=1, topic="south.t", partition=0, append_time=0,
            source=SourceCoords("south", 1, 1, True), index=index, stored=stored,
        )
    )  # fmt: skip
    f = e.frame_index()
    fb = atrest.FrameBatches(f, atrest.decode_frame(f, e.stored, where="t"), where="t")
    assert [fb.record(o) for o in (40, 55, 69)] == [recs[0], recs[15], recs[29]]
    assert b"".join(fb.batches_from(40)) == decode_block(index, stored, where="t")


def test_iter_compressed_streams_the_same_bytes() -> None:
    wal = telemetry_wal(2000)
    pieces = list(atrest.iter_compressed(wal, chunk_raw_bytes=50_000))
    assert len(pieces) > 3
    assert b"".join(pieces) == compress_segment(wal, chunk_raw_bytes=50_000)


def test_compressing_a_mapped_segment_with_a_zero_tail() -> None:
    """The rewriter hands a view of the file (a map); the zeros of an interrupted seal's
    preallocation end the entries, as they do for the journal's scan."""
    wal = telemetry_wal(500)
    z = compress_segment(memoryview(bytearray(wal + bytes(4096))))
    assert z == compress_segment(wal)
    assert expand_segment(z) == wal
