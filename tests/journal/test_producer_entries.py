"""Journal entries of idempotent producers (segment version 2), and old segments still opening.

* a DATA entry with the PRODUCER flag carries (producer id, epoch, sequence);
  decoded whole, truncated at every byte, and with bad flags or bytes;
* checkpoints: version 2 carries the producers' state, version 1 still reads;
* a journal written by the previous code (version 1 segments, the fixture
  ``data/journal_v1_index.tar.gz``) opens, keeps appending plain entries to its
  version 1 active segment, starts a version 2 segment for the first producer
  entry, and after a reopen reports that entry for the producers' table.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import decode_batch, encode_batch
from edge_gateway.format.entry import Checkpoint, ProducerStamp, SourceCoords
from edge_gateway.journal import Journal, JournalConfig, MirrorBatch

FIXTURE = Path(__file__).parent / "data" / "journal_v1_index.tar.gz"
MiB = 1024 * 1024


def _entry(producer: ProducerStamp | None, kind: int = fentry.KIND_DATA) -> bytes:
    batch = encode_batch([b"a", b"bc"], timestamps=5, base_offset=7)
    return fentry.encode_entry(
        lsn=3,
        kind=kind,
        topic=b"t",
        partition=1,
        base_offset=7,
        count=2,
        append_time=9,
        payload=batch,
        producer=producer,
    )


def test_a_producer_entry_round_trips() -> None:
    stamp = ProducerStamp(2**40 + 5, 3, 2**31 - 1)
    data = _entry(stamp)
    assert len(data) == len(_entry(None)) + fentry.PRODUCER_TAIL_SIZE
    e = fentry.decode_entry(data)
    assert e.producer == stamp
    assert (e.topic, e.partition, e.base_offset, e.count) == ("t", 1, 7, 2)
    assert [r.value for r in decode_batch(e.payload).records()] == [b"a", b"bc"]
    assert fentry.decode_entry(_entry(None)).producer is None
    # the header-only decode steps over it like any entry
    assert fentry.decode_entry_header(data).length == len(data)
    for cut in range(len(data)):
        with pytest.raises(CorruptData):
            fentry.decode_entry(data[:cut])


def test_bad_producer_fields_are_refused() -> None:
    data = bytearray(_entry(ProducerStamp(1, 0, 0)))
    tail = fentry.ENTRY_HEADER_SIZE + 1  # after the one-byte topic
    bad = bytearray(data)
    bad[tail + 10] = 1  # the reserved u16
    with pytest.raises(CorruptData, match="reserved producer bytes"):
        fentry.decode_entry(_with_crc(bad), verify=True)
    bad = bytearray(data)
    bad[17] = 0x03  # PRODUCER plus END_OF_SOURCE_OBJECT on a data entry
    with pytest.raises(CorruptData, match="flags 0x03 on a data entry"):
        fentry.decode_entry(_with_crc(bad))
    with pytest.raises(InvalidInput, match="only a data entry"):
        _entry(ProducerStamp(1, 0, 0), kind=fentry.KIND_CHECKPOINT)
    with pytest.raises(InvalidInput, match="out of range"):
        _entry(ProducerStamp(1, 2**16, 0))


def _with_crc(buf: bytearray) -> bytes:
    buf[4:8] = fentry.entry_crc(bytes(buf[8:])).to_bytes(4, "little")
    return bytes(buf)


def test_checkpoint_versions() -> None:
    offsets = {("t", 0): 5}
    sources = {"south": SourceCoords("south", 3, 1)}
    v1 = Checkpoint(offsets, sources).encode()
    assert b'"v":1' in v1
    assert Checkpoint.decode(v1, where="cp").producers is None
    state = {"v": 1, "next_id": 9, "producers": [[1, 0, 5, [["t", 0, [[0, 0, 2, 3, 4]]]]]]}
    v2 = Checkpoint(offsets, sources, state).encode()
    assert b'"v":2' in v2
    back = Checkpoint.decode(v2, where="cp")
    assert (back.next_offsets, back.sources, back.producers) == (offsets, sources, state)
    with pytest.raises(CorruptData, match="producers is not an object"):
        Checkpoint.decode(Checkpoint(offsets, sources, [1]).encode(), where="cp")  # type: ignore[arg-type]
    with pytest.raises(CorruptData, match="unsupported checkpoint version 3"):
        Checkpoint.decode(v2.replace(b'"v":2', b'"v":3'), where="cp")


def _version(seg: Path) -> int:
    return seg.read_bytes()[4]


def test_a_version_1_journal_opens_and_takes_producer_entries(tmp_path: Path) -> None:
    with tarfile.open(FIXTURE) as tf:
        tf.extractall(tmp_path, filter="data")
    segments = sorted(tmp_path.glob("*.wal"))
    assert [_version(s) for s in segments] == [1, 1, 1]
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * MiB)
    j = Journal.open_sync(tmp_path, cfg)
    try:
        assert j.recovered_producers is None
        assert j.recovered_producer_entries == []
        before = {p: j.next_offset("a", p) for p in range(3)}
        # a plain entry goes on in the version 1 segment
        j.append_nowait("a", 0, encode_batch([b"plain"], timestamps=1))
        assert len(sorted(tmp_path.glob("*.wal"))) == 3
        # the first producer entry starts a version 2 segment
        j.producer_snapshot = lambda: {"v": 1, "next_id": 8, "producers": []}
        res = j.append_nowait("a", 1, encode_batch([b"idem"], timestamps=1), ProducerStamp(7, 0, 0))
        assert res.base_offset == before[1]
        j.append_nowait("a", 1, encode_batch([b"idem2"], timestamps=1), ProducerStamp(7, 0, 1))
    finally:
        j.close_sync()
    segments = sorted(tmp_path.glob("*.wal"))
    assert [_version(s) for s in segments] == [1, 1, 1, 2]
    j = Journal.open_sync(tmp_path, cfg)
    try:
        assert j.recovered_producers == {"v": 1, "next_id": 8, "producers": []}
        got = [(e.producer, e.base_offset) for e in j.recovered_producer_entries]
        assert got == [
            (ProducerStamp(7, 0, 0), before[1]),
            (ProducerStamp(7, 0, 1), before[1] + 1),
        ]
        # every record of the old segments still reads, and the new ones after them
        offset = j.first_offset("a", 1)
        values = []
        while True:
            entries = j.read("a", 1, offset)
            if not entries:
                break
            for e in entries:
                for r in decode_batch(e.payload).records(offset):
                    values.append((r.offset, r.value))
                    offset = r.offset + 1
        assert values[-2:] == [(before[1], b"idem"), (before[1] + 1, b"idem2")]
        assert [v for _, v in values[:-2]] == [f"a/1/{o}".encode() for o in range(before[1])]
        # the shipper's read path decodes them too
        shipped = j.read_entries(1, max_bytes=1 << 30, durable_only=False)
        assert [e.producer for e in shipped if e.producer is not None] == [
            ProducerStamp(7, 0, 0),
            ProducerStamp(7, 0, 1),
        ]
    finally:
        j.close_sync()


@settings(max_examples=200, deadline=None)
@given(
    producer_id=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**16 - 1),
    sequence=st.integers(0, 2**32 - 1),
    topic=st.text(min_size=1, max_size=20).filter(lambda t: len(t.encode()) < 200),
    values=st.lists(st.binary(max_size=50), min_size=1, max_size=5),
)
def test_producer_entries_round_trip_and_never_decode_flipped(
    producer_id: int, epoch: int, sequence: int, topic: str, values: list[bytes]
) -> None:
    stamp = ProducerStamp(producer_id, epoch, sequence)
    data = fentry.encode_entry(
        lsn=9,
        kind=fentry.KIND_DATA,
        topic=topic.encode(),
        partition=2,
        base_offset=40,
        count=len(values),
        append_time=1,
        payload=encode_batch(values, timestamps=3, base_offset=40),
        producer=stamp,
    )
    e = fentry.decode_entry(data)
    assert (e.producer, e.topic, e.count) == (stamp, topic, len(values))
    # any single flipped byte is caught (by the CRC or a check), never misread
    for pos in range(0, len(data), 7):
        bad = bytearray(data)
        bad[pos] ^= 0x20
        with pytest.raises(CorruptData):
            fentry.decode_entry(bytes(bad))


def _v1_journal(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURE) as tf:
        tf.extractall(tmp_path, filter="data")
    assert [_version(s) for s in sorted(tmp_path.glob("*.wal"))] == [1, 1, 1]
    return tmp_path


def _all_records(j: Journal, topic: str, partition: int) -> list[tuple[bytes | None, tuple]]:
    offset = j.first_offset(topic, partition)
    out = []
    while entries := j.read(topic, partition, offset):
        for e in entries:
            for r in decode_batch(e.payload).records(offset):
                out.append((r.value, r.headers))
                offset = r.offset + 1
    return out


def test_null_values_go_only_into_version_2_segments(tmp_path: Path) -> None:
    """A batch with nulls (batch flag NULLS) in an older gateway's version 1 active
    segment starts a version 2 segment first: a gateway from before version 2
    segments refuses the segment rather than meet a batch it takes for corrupt.
    The reopen's scan (its fast path) takes such entries, and they read back."""
    _v1_journal(tmp_path)
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * MiB)
    nulls = encode_batch([None, b""], timestamps=1, headers=[(("h", None),), ()])
    j = Journal.open_sync(tmp_path, cfg)
    try:
        j.append_nowait("a", 0, encode_batch([b"plain"], timestamps=1))
        assert len(sorted(tmp_path.glob("*.wal"))) == 3  # still the version 1 segment
        j.append_nowait("a", 0, nulls)
        j.append_nowait("a", 0, nulls)  # the version 2 segment goes on
    finally:
        j.close_sync()
    assert [_version(s) for s in sorted(tmp_path.glob("*.wal"))] == [1, 1, 1, 2]
    j = Journal.open_sync(tmp_path, cfg)
    try:
        got = _all_records(j, "a", 0)
        tail = [(None, (("h", None),)), (b"", ())]
        assert got[-5:] == [(b"plain", ()), *tail, *tail]
    finally:
        j.close_sync()


async def test_mirrored_null_values_go_only_into_version_2_segments(tmp_path: Path) -> None:
    _v1_journal(tmp_path)
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * MiB)
    j = Journal.open_sync(tmp_path, cfg)
    src = SourceCoords("south", 1, 1, True)
    try:
        await j.append_mirror("south.x", 0, encode_batch([b"v"], timestamps=1), src)
        assert len(sorted(tmp_path.glob("*.wal"))) == 3
        await j.append_mirror("south.x", 0, encode_batch([None], timestamps=1, base_offset=1), src)
        await j.append_mirror_batches(
            [MirrorBatch("south.y", 0, encode_batch([b"", None], timestamps=1))],
            SourceCoords("south", 2, 1, False),
            SourceCoords("south", 2, 1, True),
        )
    finally:
        j.close_sync()
    assert [_version(s) for s in sorted(tmp_path.glob("*.wal"))] == [1, 1, 1, 2]
    j = Journal.open_sync(tmp_path, cfg)
    try:
        assert _all_records(j, "south.x", 0) == [(b"v", ()), (None, ())]
        assert _all_records(j, "south.y", 0) == [(b"", ()), (None, ())]
    finally:
        j.close_sync()
