"""Drop-oldest lanes (docs/journal.md, "Drop-oldest lanes"): a journal over its
budget deletes its oldest unshipped segments, after recording exactly what they
held in ``dropped.log``; a crash between the record and the unlink is completed
at the next open; a block lane beside it is never touched.

Real journals in temp directories; the dropped ranges are checked against the
records actually read back (what is still there plus what was reported dropped
must be every offset ever acknowledged, each once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from pathlib import Path

import pytest
from _tmpfs import fill, free_bytes, mounted_tmpfs

from edge_gateway.errors import CorruptData, DiskFull, JournalFull
from edge_gateway.format.batch import decode_batch, encode_batch, encode_record
from edge_gateway.journal import (
    MAIN_LANE,
    Journal,
    JournalConfig,
    Lane,
    Lanes,
    MirrorBatch,
    OffsetOutOfRange,
    OnFull,
    Priority,
    SourceCoords,
    lane_path,
    lanes_on_disk,
    open_journal,
    open_lanes,
)
from edge_gateway.journal._dropped import DROPPED_NAME, load_drops
from edge_gateway.journal._journal import RESERVE_NAME

KiB = 1024
CFG = JournalConfig(segment_bytes=64 * KiB, max_bytes=384 * KiB, fsync="never")
BULK_DROP = Lane(Priority.BULK, OnFull.DROP_OLDEST)


def _append(j: Journal, topic: str, partition: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        off = j.next_offset(topic, partition)
        j.append_nowait(topic, partition, encode_record(b"v%d-" % off + b"x" * 200, timestamp=1))
        out.append(off)
    return out


def _held(j: Journal, topic: str, partition: int) -> list[int]:
    offsets: list[int] = []
    offset = j.first_offset(topic, partition)
    while True:
        entries = j.read(topic, partition, offset)
        if not entries:
            return offsets
        for e in entries:
            for r in decode_batch(e.payload).records(offset):
                assert r.value.startswith(b"v%d-" % r.offset)
                offsets.append(r.offset)
                offset = r.offset + 1


def _reported(j: Journal, topic: str, partition: int) -> list[int]:
    out: list[int] = []
    for d in j.dropped():
        for r in d.ranges:
            if (r.topic, r.partition) == (topic, partition):
                assert r.records == r.last - r.first + 1
                out += range(r.first, r.last + 1)
    return out


def test_block_journal_refuses_when_full(tmp_path: Path) -> None:
    j = Journal.open_sync(tmp_path / "j", CFG)
    try:
        with pytest.raises(JournalFull):
            _append(j, "t", 0, 5000)
        assert j.dropped() == []
        assert not (tmp_path / "j" / DROPPED_NAME).exists()
    finally:
        j.close_sync()


def test_drop_oldest_reports_exactly_what_it_deleted(tmp_path: Path) -> None:
    j = Journal.open_sync(tmp_path / "j", CFG, drop_oldest=True)
    try:
        acked = {p: _append(j, "t", p, 0) for p in (0, 1)}
        for _ in range(1000):  # interleave two partitions, ~8x the budget
            for p in (0, 1):
                acked[p] += _append(j, "t", p, 3)
        st = j.statistics()
        assert st.bytes <= CFG.max_bytes
        assert st.dropped_segments >= 5
        for p in (0, 1):
            held, gone = _held(j, "t", p), _reported(j, "t", p)
            # what is left and what was reported: every acked offset, once, in order
            assert sorted(gone + held) == acked[p]
            assert gone == list(range(len(gone)))  # the oldest went first
            assert held[0] == len(gone)
            with pytest.raises(OffsetOutOfRange):
                j.read("t", p, 0)
        assert st.dropped_records == sum(len(_reported(j, "t", p)) for p in (0, 1))
        # bytes are the entries' bytes: ~one segment each
        assert sum(r.bytes for d in j.dropped() for r in d.ranges) == st.dropped_bytes
        assert all(not d.held for d in j.dropped())
        # the safe LSN moved past what was dropped
        assert j.safe_lsn >= j.dropped()[-1].lsn_last + 1
        drops_on_disk = load_drops(tmp_path / "j")
        assert drops_on_disk == j.dropped()
    finally:
        j.close_sync()
    j = Journal.open_sync(tmp_path / "j", CFG, drop_oldest=True)
    try:
        assert j.dropped() == drops_on_disk
        for p in (0, 1):
            assert sorted(_reported(j, "t", p) + _held(j, "t", p)) == acked[p]
    finally:
        j.close_sync()


async def test_shipped_entries_are_never_reported(tmp_path: Path) -> None:
    async with open_journal(tmp_path / "j", CFG, drop_oldest=True) as j:
        _append(j, "t", 0, 600)
        await j.flush()
        j.set_safe_lsn(j.next_lsn)  # all shipped so far
        shipped_to = j.next_offset("t", 0)
        _append(j, "t", 0, 4000)
        gone = _reported(j, "t", 0)
        # the segment that held the last shipped entries held unshipped ones too:
        # exactly those are reported, from the first unshipped offset on
        assert gone == list(range(shipped_to, shipped_to + len(gone)))
        assert sorted(gone + _held(j, "t", 0)) == list(range(shipped_to, 4600))


def test_drop_of_entries_being_shipped_is_marked_held(tmp_path: Path) -> None:
    j = Journal.open_sync(tmp_path / "j", CFG, drop_oldest=True)
    try:
        _append(j, "t", 0, 300)
        first_seg_end = j.read_entries(1, max_bytes=1)[0].lsn + 20
        j.take(first_seg_end)  # the shipper commits LSNs below this
        _append(j, "t", 0, 4000)
        drops = j.dropped()
        assert drops[0].held
        assert drops[0].lsn_last == first_seg_end - 1
        assert not drops[1].held
        assert drops[1].lsn_first == first_seg_end
        # the shipper's next object starts at first_seg_end: the held part is not a gap
        assert j.drops_from(first_seg_end)[0] == drops[1]
        # after a crash before that commit, the next object starts lower: both are gaps
        assert j.drops_from(drops[0].lsn_first)[:2] == drops[:2]
    finally:
        j.close_sync()


def test_a_crash_between_record_and_unlink_completes_the_drop(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = Journal.open_sync(path, CFG, drop_oldest=True)
    real_unlink = os.unlink
    try:
        _append(j, "t", 0, 1000)
        segs_before = sorted(path.glob("*.wal"))
        # The unlink of the first unshipped segment fails: a crash at that point.
        from edge_gateway.journal import _fs

        def no_unlink(p: str | os.PathLike[str]) -> None:
            if str(p).endswith(".wal") and Path(p).exists():
                raise OSError(5, "simulated crash before unlink")
            real_unlink(p)

        _fs.ops.unlink = no_unlink  # type: ignore[method-assign]
        with pytest.raises(JournalFull):
            _append(j, "t", 0, 2000)
        recorded = j.dropped()
        assert len(recorded) == 1
        assert segs_before[0].exists()  # recorded but still on disk
    finally:
        _fs.ops.unlink = real_unlink  # type: ignore[method-assign]
        j.close_sync()
    j = Journal.open_sync(path, CFG, drop_oldest=True)
    try:
        assert not segs_before[0].exists()  # the open completed the drop
        assert j.dropped() == recorded
        gone = _reported(j, "t", 0)
        held = _held(j, "t", 0)
        assert gone + held == list(range(j.next_offset("t", 0)))
    finally:
        j.close_sync()


def test_a_torn_record_is_cut_and_a_corrupt_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = Journal.open_sync(path, CFG, drop_oldest=True)
    try:
        _append(j, "t", 0, 3000)
        n = len(j.dropped())
    finally:
        j.close_sync()
    log = path / DROPPED_NAME
    good = log.read_bytes()
    log.write_bytes(good + b'0badc0de {"v": 1, "segm')  # torn: a drop that never unlinked
    assert len(load_drops(path)) == n
    assert log.read_bytes() == good
    log.write_bytes(good[:20] + b"X" + good[21:])
    with pytest.raises(CorruptData, match=r"dropped\.log"):
        load_drops(path)


async def test_lanes_drop_only_in_the_drop_oldest_lane(tmp_path: Path) -> None:
    cfg = JournalConfig(segment_bytes=64 * KiB, max_bytes=768 * KiB, fsync="never")
    lanes_of = {"alarms": Lane(Priority.NORMAL), "telemetry": BULK_DROP}

    def lane_of(topic: str) -> Lane:
        return lanes_of.get(topic, MAIN_LANE)

    main = tmp_path / "journal"
    async with open_lanes(main, cfg, set(lanes_of.values()), lane_of) as lanes:
        assert isinstance(lanes, Lanes)
        assert lane_path(main, BULK_DROP).name == "journal-bulk-drop"
        assert lanes.journals[BULK_DROP].drop_oldest
        assert not lanes.main.drop_oldest
        for _ in range(4000):  # alone past the whole budget: it drops, never refuses
            await lanes.append("telemetry", 0, encode_record(b"t" * 200, timestamp=1))
        dropped = lanes.journals[BULK_DROP].statistics().dropped_records
        assert dropped > 0
        acked = refused = 0
        for _ in range(6000):
            try:
                lanes.append_nowait("alarms", 0, encode_record(b"a" * 200, timestamp=1))
                acked += 1
            except JournalFull:
                refused += 1
                break
            # the drop-oldest lane gives its room to the block lane (it drops
            # its own oldest segments) and takes what is left
            with contextlib.suppress(JournalFull):
                lanes.append_nowait("telemetry", 0, encode_record(b"t" * 200, timestamp=1))
        assert refused == 1
        # the block lane got (nearly) the whole budget, then refused; telemetry
        # dropped its own segments to make that room
        assert acked * 300 > cfg.max_bytes * 3 // 4
        assert lanes.main.dropped() == []
        alarms = lanes.main
        assert alarms.first_offset("alarms", 0) == 0
        assert alarms.next_offset("alarms", 0) == acked
        assert lanes.journals[BULK_DROP].statistics().dropped_records > dropped
    assert lanes_on_disk(main) == {MAIN_LANE, BULK_DROP}


def test_lane_identity() -> None:
    assert BULK_DROP.id == 5
    assert str(BULK_DROP) == "bulk-drop"
    assert Lane(Priority.NORMAL, OnFull.DROP_OLDEST).dirname == "journal-normal-drop"
    assert not Lane(Priority.NORMAL, OnFull.DROP_OLDEST).is_main
    ids = {lane.id for p in Priority for lane in (Lane(p), Lane(p, OnFull.DROP_OLDEST))}
    assert ids == {0, 1, 2, 3, 4, 5}
    assert Lane(Priority.BULK).rank < BULK_DROP.rank


# ------------------------------------------------- a real full disk (issue 16)
#
# The filesystem fills before the budget does (a small card shared with logs,
# or a budget set too high): a drop-oldest lane makes room as it does over its
# budget; a block lane beside it takes the room the drop-oldest lane gives up
# and then refuses with DiskFull, never dropping a byte of its own. A small
# tmpfs filled by another file (root only; skipped elsewhere, saying so).

DISK_CFG = JournalConfig(
    segment_bytes=128 * KiB, max_bytes=1 << 30, reserve_bytes=64 * KiB, fsync="never"
)


async def test_a_full_disk_makes_a_drop_oldest_journal_drop_its_oldest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with mounted_tmpfs(tmp_path / "disk", "8m") as disk:
        path = disk / "j"
        caplog.set_level(logging.INFO, logger="edgegw.journal")
        async with open_journal(path, DISK_CFG, drop_oldest=True) as j:
            assert (path / RESERVE_NAME).exists()
            acked = _append(j, "t", 0, 2000)  # ~450 KiB, nothing shipped
            # Another process takes every byte left (the budget is far away).
            fill(disk / "filler")
            assert free_bytes(disk) < 4 * KiB
            for _ in range(200):  # ~7 MiB more: about the whole disk, twice over
                acked += _append(j, "t", 0, 100)  # never refused
            st = j.statistics()
            assert st.disk_full_episodes >= 1
            assert st.disk_full_rejections == 0
            assert st.dropped_segments >= 5
            held, gone = _held(j, "t", 0), _reported(j, "t", 0)
            assert sorted(gone + held) == acked  # every acked offset once: kept or reported
            assert gone == list(range(len(gone)))  # the oldest went first
            assert held[-1] == acked[-1]  # the newest are kept
            # The first drop on the full disk was paid for by the reserve file.
            assert "released the reserve file to record a drop" in caplog.text
            assert "(drop-oldest: the disk is full)" in caplog.text
            assert "This drop-oldest lane keeps accepting" in caplog.text
            assert load_drops(path) == j.dropped()
            drops = j.dropped()
        # The record of the drops survives a reopen (the filler still there).
        j2 = Journal.open_sync(path, DISK_CFG, drop_oldest=True)
        try:
            assert j2.dropped() == drops
            assert sorted(_reported(j2, "t", 0) + _held(j2, "t", 0)) == acked
        finally:
            j2.close_sync()


async def test_no_room_for_the_record_drops_nothing(tmp_path: Path) -> None:
    # Without a reserve file, on a disk full to the last byte, the record of a
    # drop cannot be written: then nothing is dropped (a drop is never
    # unrecorded) and the append fails with DiskFull, as in a block journal.
    with mounted_tmpfs(tmp_path / "disk", "8m") as disk:
        path = disk / "j"
        cfg = dataclasses.replace(DISK_CFG, reserve_bytes=0)
        async with open_journal(path, cfg, drop_oldest=True) as j:
            acked = _append(j, "t", 0, 2000)
            fill(disk / "filler")
            refused = 0
            for _ in range(1000):
                try:
                    acked += _append(j, "t", 0, 1)
                except DiskFull:
                    refused += 1
                    break
            assert refused == 1
            assert j.dropped() == []
            assert not (path / DROPPED_NAME).exists() or load_drops(path) == []
            assert _held(j, "t", 0) == acked
            # Space returns: the next append goes in, nothing was lost.
            (disk / "filler").unlink()
            acked += _append(j, "t", 0, 1)
            assert _held(j, "t", 0) == acked


async def test_a_full_disk_with_only_the_active_segment_seals_it_and_drops_it(
    tmp_path: Path,
) -> None:
    # Everything unshipped is in the active segment (the disk filled within
    # one segment): the reserve file pays for a new segment, the old one is
    # sealed and dropped, and appends go on.
    with mounted_tmpfs(tmp_path / "disk", "4m") as disk:
        path = disk / "j"
        cfg = dataclasses.replace(DISK_CFG, segment_bytes=1024 * KiB, reserve_bytes=128 * KiB)
        async with open_journal(path, cfg, drop_oldest=True) as j:
            acked = _append(j, "t", 0, 10)
            fill(disk / "filler")
            refused = 0
            for _ in range(3000):  # ~700 KiB: more than the segment's preallocated tail
                try:
                    acked += _append(j, "t", 0, 1)
                except DiskFull:
                    refused += 1  # (the first write past the tail, at most once)
            assert refused <= 1
            assert j.statistics().dropped_segments >= 1
            assert sorted(_reported(j, "t", 0) + _held(j, "t", 0)) == acked
            assert _held(j, "t", 0)[-1] == acked[-1]


async def test_a_full_disk_under_lanes_drops_only_drop_oldest_data(tmp_path: Path) -> None:
    lanes_of = {"alarms": MAIN_LANE, "telemetry": BULK_DROP}

    def lane_of(topic: str) -> Lane:
        return lanes_of.get(topic, MAIN_LANE)

    def record(offset: int) -> bytes:
        return encode_record(b"v%d-" % offset + b"x" * 200, timestamp=1)

    with mounted_tmpfs(tmp_path / "disk", "8m") as disk:
        main = disk / "journal"
        async with open_lanes(main, DISK_CFG, set(lanes_of.values()), lane_of) as lanes:
            tele = lanes.journals[BULK_DROP]
            telemetry = [
                lanes.append_nowait("telemetry", 0, record(lanes.next_offset("telemetry", 0)))
                for _ in range(8000)  # ~2.5 MiB, unshipped
            ]
            fill(disk / "filler")
            # telemetry alone on the full disk: it drops, never refuses
            for _ in range(2000):
                telemetry.append(
                    lanes.append_nowait("telemetry", 0, record(lanes.next_offset("telemetry", 0)))
                )
            assert tele.statistics().dropped_records > 0
            # a mirror (into the normal lane) takes telemetry's room as well
            dropped = tele.statistics().dropped_records
            for seq in range(1, 301):  # ~270 KiB: past the preallocated segment
                mirrored = encode_batch(
                    [b"m" * 200] * 4, timestamps=[1] * 4, base_offset=(seq - 1) * 4
                )
                await lanes.main.append_mirror_batches(
                    [MirrorBatch("north.m", 0, mirrored)],
                    SourceCoords("north", seq, 1, end_of_object=False),
                    SourceCoords("north", seq, 1),
                )
            assert lanes.main.next_offset("north.m", 0) == 1200
            assert tele.statistics().dropped_records > dropped
            # alarms (block) takes the room telemetry gives up, then is refused
            acked = refused = 0
            for _ in range(50_000):
                try:
                    lanes.append_nowait("alarms", 0, record(acked))
                except DiskFull:
                    refused += 1
                    break
                acked += 1
            assert refused == 1
            assert acked * 300 > 2 * 1024 * KiB  # most of telemetry's room
            assert lanes.main.dropped() == []
            assert not (main / DROPPED_NAME).exists()
            assert _held(lanes.main, "alarms", 0) == list(range(acked))
            assert lanes.main.statistics().disk_full_rejections == 1
            # every telemetry offset acknowledged: kept, or reported dropped
            offsets = [o for a in telemetry for o in range(a.base_offset, a.next_offset)]
            assert sorted(_reported(tele, "telemetry", 0) + _held(tele, "telemetry", 0)) == offsets
            assert tele.statistics().dropped_segments > 0
