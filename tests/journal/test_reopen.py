"""Reopening a journal: the active-segment scan, its preallocated tail, and what it rejects.

The scan of the active segment has a fast path for ordinary DATA entries and
falls back to :func:`edge_gateway.format.entry.decode_entry` for anything
else; these tests pin that both accept and reject exactly the same bytes.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from edge_gateway.errors import CorruptData
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import decode_batch, encode_batch, encode_record
from edge_gateway.journal import Journal, JournalConfig, SourceCoords
from edge_gateway.journal import _fs as fs_module
from edge_gateway.journal._fs import FileOps

# One segment holds everything below, so it is all in the active segment.
BIG = JournalConfig(segment_bytes=16 * 1024 * 1024, max_bytes=64 * 1024 * 1024)
TOPICS = ("t", "telemetry.site-a", "x" * 40)  # different lengths: the scan switches layouts


def _value(topic: str, partition: int, offset: int) -> bytes:
    return f"{topic}:{partition}:{offset}".encode()


async def _fill(j: Journal, n: int) -> None:
    """``n`` one-record entries over 3 topics x 4 partitions, with some keys and a mirror entry."""
    for i in range(n):
        topic, partition = TOPICS[i % 3], i % 4
        value = _value(topic, partition, j.next_offset(topic, partition))
        key = None if i % 5 else f"k{i}".encode()
        j.append_nowait(topic, partition, encode_record(value, timestamp=1_700 + i, key=key))
        if i == n // 2:  # mirror entries take the scan's slow path
            mirrored = encode_batch([b"m1", b"m2"], timestamps=1, base_offset=7)
            await j.append_mirror(
                "south.t", 1, mirrored, SourceCoords("south", 9, 1), allow_gap=True
            )
            await j.append_mirror("north.t", 0, None, SourceCoords("north", 41, 2))


def _state(j: Journal) -> dict[str, object]:
    seg = j._segments[-1]
    return {
        "next_lsn": j.next_lsn,
        "positions": list(seg.positions),
        "size": seg.size,
        "partitions": {
            key: (p.next_offset, list(p.lsns), list(p.offsets)) for key, p in j._partitions.items()
        },
        "sources": j.source_progress(),
        "active_bytes": j.statistics().active_segment_bytes,
    }


def _records(j: Journal, topic: str, partition: int) -> list[tuple[int, bytes, bytes | None]]:
    out = []
    for e in j.read(topic, partition, 0, max_records=1 << 30, max_bytes=1 << 30):
        out += [(r.offset, r.value, r.key) for r in decode_batch(e.payload).records()]
    return out


@pytest.mark.parametrize("preallocate", [True, False])
async def test_active_segment_of_many_small_entries_reopens_exactly(
    tmp_path: Path, preallocate: bool
) -> None:
    cfg = JournalConfig(
        segment_bytes=BIG.segment_bytes, max_bytes=BIG.max_bytes, preallocate=preallocate
    )
    live = tmp_path / "live"
    j = Journal.open_sync(live, cfg)
    try:
        await _fill(j, 12_000)
        assert j.statistics().segments == 1  # everything is in the active segment
        expected = _state(j)
        records = {(t, p): _records(j, t, p) for t in TOPICS for p in range(4)}
        # A copy taken while the journal is open is what a kill -9 leaves
        # behind: with preallocation, the file still has its zero-filled tail.
        shutil.copytree(live, tmp_path / "crashed")
    finally:
        j.close_sync()
    (wal,) = (tmp_path / "crashed").glob("*.wal")
    if preallocate:
        assert wal.stat().st_size == cfg.segment_bytes > expected["size"]  # type: ignore[operator]

    for name in ("crashed", "live"):
        j2 = Journal.open_sync(tmp_path / name, cfg)
        try:
            assert _state(j2) == expected
            assert j2.statistics().truncated_bytes_on_open == 0
            assert sum(len(r) for r in records.values()) == 12_000
            for (t, p), recs in records.items():
                assert _records(j2, t, p) == recs
                assert j2.next_offset(t, p) == len(recs)
            res = j2.append_nowait("t", 0, encode_record(b"after", timestamp=1))
            assert res.lsn == expected["next_lsn"]
        finally:
            j2.close_sync()
        # a clean close leaves the file ending at its last entry
        assert wal.parent.joinpath(wal.name).stat().st_size == j2.statistics().active_segment_bytes


def _crafted_entries() -> dict[str, bytes]:
    """Entries whose CRC is right but which decode_entry rejects (what a buggy writer leaves)."""
    good = encode_batch([b"abc", b"de"], timestamps=[5, 7])

    def batch_with(**change: int) -> bytes:
        fields = dict(
            zip(
                ("length", "version", "flags", "reserved", "base", "crc", "count", "min", "max"),
                struct.unpack_from("<IBBHqIIqq", good),
                strict=True,
            )
        )
        fields.update(change)
        return struct.pack("<IBBHqIIqq", *fields.values()) + good[40:]

    def entry(
        payload: bytes,
        *,
        topic: bytes = b"t",
        count: int = 2,
        base: int = 0,
        kind: int = fentry.KIND_DATA,
        flags: int = 0,
    ) -> bytes:
        raw = bytearray(
            fentry.encode_entry(
                lsn=0,  # set (and the CRC recomputed) by the test
                kind=fentry.KIND_DATA,
                topic=topic,
                partition=0,
                base_offset=base,
                count=count,
                append_time=1,
                payload=payload,
            )
        )
        raw[16:18] = bytes([kind, flags])
        return bytes(raw)

    return {
        "LSN out of sequence": entry(good),  # the test gives it LSN + 5
        "unknown kind": entry(good, kind=7),
        "flags on a data entry": entry(good, flags=1),
        "count above the batch's": entry(good, count=3),
        "count below the batch's": entry(good, count=1),
        "base offset differs from the batch": entry(good, base=4),
        "batch length field wrong": entry(batch_with(length=len(good) + 1)),
        "batch version": entry(batch_with(version=2)),
        "batch flags": entry(batch_with(flags=0x80)),
        "batch reserved": entry(batch_with(reserved=1)),
        "count does not fit": entry(batch_with(count=40), count=40),
        "min > max timestamp": entry(batch_with(min=9)),
        "topic not UTF-8": entry(good, topic=b"\xff\xfe"),
    }


def _with_lsn(entry: bytes, lsn: int) -> bytes:
    rest = bytearray(entry[8:])
    struct.pack_into("<Q", rest, 0, lsn)
    return struct.pack("<II", len(entry), fentry.entry_crc(bytes(rest))) + bytes(rest)


@pytest.mark.parametrize("defect", sorted(_crafted_entries()))
@pytest.mark.parametrize("where", ["tail", "middle"])
def test_scan_rejects_what_decode_entry_rejects(tmp_path: Path, defect: str, where: str) -> None:
    d = tmp_path / "journal"
    j = Journal.open_sync(d, BIG)
    try:
        for i in range(50):
            j.append_nowait("t", 0, encode_record(b"v%d" % i, timestamp=i))
        next_lsn = j.next_lsn
    finally:
        j.close_sync()
    (wal,) = d.glob("*.wal")
    good_size = wal.stat().st_size
    bad = _with_lsn(_crafted_entries()[defect], next_lsn + (5 if "LSN" in defect else 0))
    if "LSN" not in defect:
        with pytest.raises(CorruptData):
            fentry.decode_entry(bad)
    data = wal.read_bytes() + bad
    if where == "middle":  # a valid entry after it: damage, not a torn write
        data += fentry.encode_entry(
            lsn=next_lsn + 1,
            kind=fentry.KIND_DATA,
            topic=b"t",
            partition=0,
            base_offset=50,
            count=1,
            append_time=1,
            payload=encode_record(b"after", timestamp=1, base_offset=50),
        )
    wal.write_bytes(data)
    if where == "middle":
        # damage, quarantined: the entry after it is kept, its LSN held, none reused
        j2 = Journal.open_sync(d, BIG)
        try:
            [loss] = j2.losses()
            assert (loss.byte_first, loss.lsn_first, loss.lsn_last) == (
                good_size,
                next_lsn,
                next_lsn,
            )
            assert j2.next_lsn == next_lsn + 2
            assert j2.next_offset("t", 0) == 51
            assert j2.statistics().truncated_bytes_on_open == 0
        finally:
            j2.close_sync()
        return
    j2 = Journal.open_sync(d, BIG)
    try:
        assert j2.statistics().truncated_bytes_on_open == len(bad)
        assert j2.next_lsn == next_lsn
        assert j2.next_offset("t", 0) == 50
    finally:
        j2.close_sync()
    assert wal.stat().st_size == good_size


def test_zero_tail_with_garbage_after_it_is_not_mistaken_for_the_end(tmp_path: Path) -> None:
    d = tmp_path / "journal"
    j = Journal.open_sync(d, BIG)
    try:
        for i in range(20):
            j.append_nowait("t", 0, encode_record(b"v", timestamp=i))
        next_lsn = j.next_lsn
    finally:
        j.close_sync()
    (wal,) = d.glob("*.wal")
    good = wal.read_bytes()
    valid_later = fentry.encode_entry(
        lsn=next_lsn + 3,
        kind=fentry.KIND_DATA,
        topic=b"t",
        partition=0,
        base_offset=23,
        count=1,
        append_time=1,
        payload=encode_record(b"x", timestamp=1, base_offset=23),
    )
    # zeros, then a whole valid entry far behind them: damage, not a tail
    wal.write_bytes(good + bytes(100_000) + valid_later + bytes(1000))
    j1 = Journal.open_sync(d, BIG)
    try:
        [loss] = j1.losses()  # quarantined, the LSNs and offsets between named
        assert (loss.lsn_first, loss.lsn_last) == (next_lsn, next_lsn + 2)
        assert [(r.first, r.last, r.exact) for r in loss.ranges] == [(20, 22, True)]
        assert j1.next_offset("t", 0) == 24
    finally:
        j1.close_sync()
    for f in (d / "lost.log", *tmp_path.joinpath("quarantine").iterdir()):
        f.unlink()
    # zeros, then garbage that is no entry: a torn tail, cut at the end of the data
    wal.write_bytes(good + bytes(100_000) + b"\x01garbage" + bytes(1000))
    j2 = Journal.open_sync(d, BIG)
    try:
        assert j2.next_lsn == next_lsn
        assert j2.statistics().truncated_bytes_on_open == 100_000 + 8 + 1000
    finally:
        j2.close_sync()
    assert wal.stat().st_size == len(good)


def test_a_segment_must_start_with_its_checkpoint(tmp_path: Path) -> None:
    j = Journal.open_sync(tmp_path, BIG)
    j.close_sync()
    (wal,) = tmp_path.glob("*.wal")
    data_first = fentry.encode_entry(
        lsn=1,
        kind=fentry.KIND_DATA,
        topic=b"t",
        partition=0,
        base_offset=0,
        count=1,
        append_time=1,
        payload=encode_record(b"x", timestamp=1),
    )
    wal.write_bytes(fentry.encode_segment_header(1) + data_first)
    with pytest.raises(CorruptData, match="does not start with a checkpoint"):
        Journal.open_sync(tmp_path, BIG)


def test_map_and_pwrite_interleave_byte_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small entries are copied into the map, except while an fdatasync runs
    # (then pwrite); large ones always use pwritev. Mix all three.
    calls = []

    class Counting(FileOps):
        def pwritev(self, fd: int, parts: list[bytes], pos: int) -> int:  # type: ignore[override]
            calls.append(pos)
            return os.pwritev(fd, parts, pos)

    monkeypatch.setattr(fs_module, "ops", Counting())
    j = Journal.open_sync(tmp_path, BIG)
    try:
        expected = []
        for i in range(300):
            j._durability.syncing = i % 7 < 3  # as if an fdatasync were running
            n = 200 if i % 50 == 0 else 1  # every 50th entry is > 16 KiB
            values = [b"%d/%d" % (i, k) + bytes(100) for k in range(n)]
            j.append_nowait("t", 0, encode_batch(values, timestamps=i))
            expected += values
        j._durability.syncing = False
        assert 0 < len(calls) < 300  # both paths were taken
        before = _state(j)
        assert [v for _, v, _ in _records(j, "t", 0)] == expected
    finally:
        j.close_sync()
    j2 = Journal.open_sync(tmp_path, BIG)
    try:
        assert _state(j2) == before
        assert [v for _, v, _ in _records(j2, "t", 0)] == expected
    finally:
        j2.close_sync()
