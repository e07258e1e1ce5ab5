"""The journal with real files: append/read, recovery, budget, retention, mirror entries."""

from __future__ import annotations

import errno
import itertools
import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from _faults import FaultyFs

from edge_gateway.errors import (
    ClosedError,
    CorruptData,
    DiskFull,
    InvalidInput,
    InvalidName,
    JournalFull,
)
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import decode_batch, encode_batch, encode_record
from edge_gateway.journal import (
    FsyncPolicy,
    Journal,
    JournalConfig,
    OffsetOutOfRange,
    ReadBuffers,
    SourceCoords,
    open_journal,
)
from edge_gateway.journal import _fs as fs_module
from edge_gateway.journal import _journal as journal_module
from edge_gateway.journal import _reads as reads_module

SMALL = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024)


def value(topic: str, partition: int, offset: int) -> bytes:
    return f"{topic}/{partition}/{offset}:".encode() + bytes([offset % 251]) * (offset % 97)


def batch_for(topic: str, partition: int, first: int, n: int) -> bytes:
    return encode_batch(
        [value(topic, partition, first + i) for i in range(n)],
        keys=[None if i % 3 else f"k{i}".encode() for i in range(n)],
        timestamps=[1_700_000_000_000 + first + i for i in range(n)],
    )


def all_records(j: Journal, topic: str, partition: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = j.first_offset(topic, partition)
    while True:
        entries = j.read(topic, partition, offset, max_records=1000)
        if not entries:
            return out
        for e in entries:
            for r in decode_batch(e.payload).records(offset):
                out.append((r.offset, r.value))
                offset = r.offset + 1


def segment_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.wal"))


async def test_append_assigns_gap_free_offsets_per_partition(tmp_path: Path) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        a = await j.append("t", 0, batch_for("t", 0, 0, 5))
        b = await j.append("t", 1, batch_for("t", 1, 0, 3))
        c = await j.append("t", 0, batch_for("t", 0, 5, 2))
        assert (a.base_offset, a.count, b.base_offset, c.base_offset) == (0, 5, 0, 5)
        assert c.lsn == b.lsn + 1 == a.lsn + 2
        assert j.next_offset("t", 0) == 7
        assert j.partitions() == [("t", 0), ("t", 1)]
        recs = all_records(j, "t", 0)
        assert recs == [(o, value("t", 0, o)) for o in range(7)]


async def test_read_honours_limits_and_mid_batch_offsets(tmp_path: Path) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        for first in range(0, 100, 10):
            await j.append("t", 0, batch_for("t", 0, first, 10))
        entries = j.read("t", 0, 35, max_records=12)
        assert [e.base_offset for e in entries] == [30, 40]
        assert decode_batch(entries[0].payload).records(35)[0].offset == 35
        # At least one entry however small max_bytes is.
        assert len(j.read("t", 0, 0, max_bytes=1)) == 1
        assert j.read("t", 0, 100) == []
        assert j.read("other", 0, 0) == []


async def test_reopen_restores_everything_across_segment_rolls(tmp_path: Path) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        for i in range(300):
            await j.append("t", i % 4, batch_for("t", i % 4, j.next_offset("t", i % 4), 7))
        expected = {p: all_records(j, "t", p) for p in range(4)}
        next_lsn = j.next_lsn
    assert len(segment_files(tmp_path)) >= 3
    j2 = Journal.open_sync(tmp_path, SMALL)
    try:
        assert j2.next_lsn == next_lsn
        for p in range(4):
            assert j2.next_offset("t", p) == 525
            assert all_records(j2, "t", p) == expected[p]
        res = j2.append_nowait("t", 0, batch_for("t", 0, 525, 1))
        assert res.base_offset == 525
    finally:
        j2.close_sync()


@pytest.mark.parametrize("damage", ["delete", "garble"])
async def test_index_files_are_rebuilt_when_missing_or_bad(tmp_path: Path, damage: str) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        for i in range(200):
            await j.append("t", i % 2, batch_for("t", i % 2, j.next_offset("t", i % 2), 5))
        expected = all_records(j, "t", 1)
    idx = sorted(tmp_path.glob("*.idx"))
    assert idx
    for f in idx:
        if damage == "delete":
            f.unlink()
        else:
            raw = bytearray(f.read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            f.write_bytes(bytes(raw))
    j2 = Journal.open_sync(tmp_path, SMALL)
    try:
        assert all_records(j2, "t", 1) == expected
    finally:
        j2.close_sync()
    assert len(list(tmp_path.glob("*.idx"))) == len(idx)  # rewritten


@pytest.mark.parametrize("damage", ["truncate", "garble", "zeros"])
async def test_torn_tail_is_truncated_and_appends_continue(tmp_path: Path, damage: str) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        for i in range(10):
            await j.append("t", 0, batch_for("t", 0, i * 3, 3))
        expected = all_records(j, "t", 0)
        await j.append("t", 0, batch_for("t", 0, 30, 3))  # the entry we tear
    last = segment_files(tmp_path)[-1]
    raw = bytearray(last.read_bytes())
    probe = Journal.open_sync(tmp_path, SMALL)
    torn_entry_len = len(raw) - int(probe._segments[-1].positions[-1])
    probe.close_sync()
    good_size = len(raw) - torn_entry_len
    if damage == "truncate":
        raw = raw[: good_size + torn_entry_len // 2]
    elif damage == "garble":
        raw[good_size + 20] ^= 0x55
    else:
        raw += bytes(4096)
    last.write_bytes(bytes(raw))

    j2 = Journal.open_sync(tmp_path, SMALL)
    try:
        stats = j2.statistics()
        if damage == "zeros":
            # A zero-filled tail is what a crash leaves of the preallocated
            # active segment: the end of the data, nothing torn.
            assert stats.truncated_bytes_on_open == 0
            assert j2.next_offset("t", 0) == 33
        else:
            assert stats.truncated_bytes_on_open > 0
            assert j2.next_offset("t", 0) == 30
            assert all_records(j2, "t", 0) == expected
        res = j2.append_nowait("t", 0, batch_for("t", 0, j2.next_offset("t", 0), 2))
        assert res.base_offset == j2.next_offset("t", 0) - 2
        kept = good_size + (torn_entry_len if damage == "zeros" else 0)
        appended = j2.statistics().bytes - stats.bytes
    finally:
        j2.close_sync()
    # A clean close leaves the file ending at its last entry.
    assert last.stat().st_size == kept + appended
    j3 = Journal.open_sync(tmp_path, SMALL)
    try:
        assert j3.statistics().truncated_bytes_on_open == 0
        assert j3.next_offset("t", 0) == (35 if damage == "zeros" else 32)
    finally:
        j3.close_sync()


async def test_corruption_in_the_middle_is_quarantined_and_the_rest_kept(
    tmp_path: Path,
) -> None:
    d = tmp_path / "journal"
    async with open_journal(d, SMALL) as j:
        for i in range(20):
            await j.append("t", 0, batch_for("t", 0, i * 2, 2))
        pos = j._segments[-1].positions[5]
        base = j._segments[-1].base_lsn
        next_lsn = j.statistics().next_lsn
    last = segment_files(d)[-1]
    raw = bytearray(last.read_bytes())
    raw[pos + 30] ^= 0x01
    last.write_bytes(bytes(raw))
    j2 = Journal.open_sync(d, SMALL)
    try:
        # entry 5 (offsets 8-9) is gone; every other record is served as written
        want = [(o, value("t", 0, o)) for o in range(40) if o not in (8, 9)]
        assert all_records(j2, "t", 0) == want
        assert j2.next_offset("t", 0) == 40
        st = j2.statistics()
        assert st.next_lsn == next_lsn  # LSNs are never reused
        assert (st.lost_lsns, st.lost_records, st.truncated_bytes_on_open) == (1, 2, 0)
        [loss] = j2.losses()
        assert (loss.segment, loss.lsn_first, loss.lsn_last) == (base, base + 5, base + 5)
        assert loss.byte_first == pos
        assert [(r.topic, r.partition, r.first, r.last, r.exact) for r in loss.ranges] == [
            ("t", 0, 8, 9, True)
        ]
        copy = tmp_path / loss.copy
        assert copy.read_bytes() == bytes(raw)  # the damaged bytes, as they were
        [report] = (tmp_path / "quarantine").glob("*-report.json")
        assert json.loads(report.read_bytes())["ranges"][0]["last_offset"] == 9
        await j2.append("t", 0, batch_for("t", 0, 40, 1))
        assert j2.next_offset("t", 0) == 41
    finally:
        j2.close_sync()
    # the next open finds a sound segment and the same record of the loss
    j3 = Journal.open_sync(d, SMALL)
    try:
        assert [x.lsn_first for x in j3.losses()] == [base + 5]
        assert all_records(j3, "t", 0)[-1] == (40, value("t", 0, 40))
    finally:
        j3.close_sync()


async def test_corrupt_sealed_segment_is_never_served(tmp_path: Path) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        for i in range(200):
            await j.append("t", 0, batch_for("t", 0, i * 10, 10))
        assert len(j._segments) >= 2
        first_seg = j._segments[0]
        pos = first_seg.entry_positions[3]
    raw = bytearray(first_seg.path.read_bytes())
    raw[pos + 50] ^= 0x10
    first_seg.path.write_bytes(bytes(raw))
    # With its index file the sealed segment is not rescanned at open: the
    # damage is caught by the CRC check on read.
    j2 = Journal.open_sync(tmp_path, SMALL)
    try:
        with pytest.raises(CorruptData, match=first_seg.path.name):
            all_records(j2, "t", 0)
    finally:
        j2.close_sync()
    # Without it, the scan at open finds the damage and quarantines that entry.
    first_seg.path.with_suffix(".idx").unlink()
    j3 = Journal.open_sync(tmp_path, SMALL)
    try:
        [loss] = j3.losses()
        assert loss.byte_first == pos
        [lost] = loss.ranges
        got = [o for o, _ in all_records(j3, "t", 0)]
        assert got == [o for o in range(2000) if not lost.first <= o <= lost.last]
        assert (lost.first, lost.last, lost.exact) == (20, 29, True)
    finally:
        j3.close_sync()


async def test_bad_names_and_partitions_are_refused_before_touching_disk(tmp_path: Path) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        before = {p: p.stat().st_size for p in tmp_path.iterdir()}
        for bad in ["", "a/b", "..", "x" * 201, "sp ace", "a..b"]:
            with pytest.raises(InvalidName):
                await j.append(bad, 0, batch_for("t", 0, 0, 1))
        with pytest.raises(InvalidInput):
            await j.append("t", -1, batch_for("t", 0, 0, 1))
        with pytest.raises(CorruptData):
            await j.append("t", 0, b"not a batch at all, clearly")
        with pytest.raises(InvalidInput):
            await j.append("t", 0, batch_for("t", 0, 0, 1) + b"extra")
        assert {p: p.stat().st_size for p in tmp_path.iterdir()} == before
        assert j.next_lsn == 2


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [("count", 40, "does not fit"), ("min_timestamp", 9, "min_timestamp > max_timestamp")],
)
async def test_append_refuses_batches_that_could_not_be_read_back(
    tmp_path: Path, field: str, value: int, error: str
) -> None:
    # The append checks what a reader checks in a batch header, so an entry
    # that was acknowledged can never stop a reopen as "corrupt".
    raw = bytearray(encode_batch([b"abc", b"de"], timestamps=[5, 7]))
    pos, fmt = {"count": (20, "<I"), "min_timestamp": (24, "<q")}[field]
    struct.pack_into(fmt, raw, pos, value)
    async with open_journal(tmp_path, SMALL) as j:
        with pytest.raises(CorruptData, match=error):
            await j.append("t", 0, bytes(raw))
        assert j.next_lsn == 2
        assert j.next_offset("t", 0) == 0


async def test_journal_full_then_shipping_frees_space(tmp_path: Path) -> None:
    cfg = JournalConfig(
        segment_bytes=64 * 1024, max_bytes=256 * 1024, retention_ms=3_600_000, retention_bytes=0
    )
    acked: list[tuple[int, int]] = []
    async with open_journal(tmp_path, cfg) as j:
        while j.statistics().bytes + 4096 < cfg.max_bytes:
            res = await j.append("t", 0, batch_for("t", 0, j.next_offset("t", 0), 20))
            acked.append((res.base_offset, res.count))
        with pytest.raises(JournalFull, match="budget full"):
            await j.append("t", 0, encode_record(b"x" * 5000, timestamp=1))
        stats = j.statistics()
        assert stats.full_rejections == 1
        assert stats.bytes <= cfg.max_bytes
        # Everything acknowledged is still there, byte for byte.
        assert all_records(j, "t", 0) == [
            (o, value("t", 0, o)) for o in range(sum(c for _, c in acked))
        ]
        # The shipper confirms the first half: those segments go, appends resume.
        half_lsn = j.statistics().next_lsn // 2
        j.set_safe_lsn(half_lsn)
        assert j.statistics().bytes < stats.bytes
        res = await j.append("t", 0, batch_for("t", 0, j.next_offset("t", 0), 20))
        assert res.base_offset == sum(c for _, c in acked)
        first = j.first_offset("t", 0)
        assert first > 0
        with pytest.raises(OffsetOutOfRange):
            j.read("t", 0, 0)
        assert all_records(j, "t", 0)[0][0] == first


async def test_segments_wait_for_both_watermark_and_retention(tmp_path: Path) -> None:
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=10**9)
    async with open_journal(tmp_path, cfg) as j:
        for i in range(300):
            await j.append("t", 0, batch_for("t", 0, i * 10, 10))
        n = len(segment_files(tmp_path))
        assert n >= 4
        j.set_safe_lsn(j.next_lsn)  # shipped, but retention keeps them
        assert len(segment_files(tmp_path)) == n
    cfg0 = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)
    j2 = Journal.open_sync(tmp_path, cfg0)
    try:
        j2.set_safe_lsn(j2._segments[2].base_lsn)  # only the first two are shipped
        assert len(segment_files(tmp_path)) == n - 2
        assert j2.next_offset("t", 0) == 3000
    finally:
        j2.close_sync()


@pytest.mark.parametrize("size", ["small", "large"])
async def test_disk_full_error_rolls_back_the_partial_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: str
) -> None:
    # Without preallocation every entry goes out with one pwritev (with it,
    # small entries are copied into preallocated space and cannot hit ENOSPC,
    # but large ones still can, and must be rolled back the same way).
    n = 3 if size == "small" else 400
    cfg = (
        SMALL
        if size == "large"
        else JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024, preallocate=False)
    )
    fs = FaultyFs()
    monkeypatch.setattr(fs_module, "ops", fs)
    async with open_journal(tmp_path, cfg) as j:
        await j.append("t", 0, batch_for("t", 0, 0, n))
        fs.fail("write", fs.calls["write"] + 1, errno=errno.ENOSPC, count=1)  # half, then ENOSPC
        with pytest.raises(DiskFull, match="disk full"):
            await j.append("t", 0, batch_for("t", 0, n, n))
        assert j.statistics().disk_full
        assert j.statistics().disk_full_rejections == 1
        res = await j.append("t", 0, batch_for("t", 0, n, n))
        assert res.base_offset == n
        res = await j.append("t", 0, batch_for("t", 0, 2 * n, 1))  # a small one after it
    j2 = Journal.open_sync(tmp_path, cfg)
    try:
        assert j2.statistics().truncated_bytes_on_open == 0
        assert all_records(j2, "t", 0) == [(o, value("t", 0, o)) for o in range(2 * n + 1)]
    finally:
        j2.close_sync()


async def test_wait_for_wakes_on_append_without_polling(tmp_path: Path) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        woke: list[int] = []

        async def reader() -> None:
            await j.wait_for("t", 3, 0)
            woke.append(j.next_offset("t", 3))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert woke == []
            await j.append("t", 3, batch_for("t", 3, 0, 2))
        assert woke == [2]


async def test_group_commit_shares_fsyncs(tmp_path: Path) -> None:
    cfg = JournalConfig(fsync=FsyncPolicy.ALWAYS, segment_bytes=1 << 20, max_bytes=1 << 26)
    async with open_journal(tmp_path, cfg) as j:

        async def writer(p: int) -> None:
            for i in range(50):
                res = await j.append("t", p, encode_record(b"x" * 100, timestamp=i))
                assert j.durable_lsn >= res.lsn

        async with trio.open_nursery() as nursery:
            for p in range(8):
                nursery.start_soon(writer, p)
        stats = j.statistics()
        assert stats.appends == 400
        assert stats.fsyncs < stats.appends


async def test_read_entries_in_lsn_order_for_the_shipper(tmp_path: Path) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        for i in range(100):
            await j.append("t", i % 3, batch_for("t", i % 3, j.next_offset("t", i % 3), 4))
        await j.flush()
        entries = j.read_entries(1, max_bytes=1 << 30)
        assert [e.lsn for e in entries] == sorted(e.lsn for e in entries)
        assert sum(e.count for e in entries) == 400
        page = j.read_entries(entries[10].lsn, max_bytes=2000)
        assert page[0].lsn == entries[10].lsn
        assert 1 <= len(page) < 90


@pytest.mark.parametrize("pooled", [False, True])
@pytest.mark.parametrize("runs_per_thread", [2, 1000])
async def test_read_entries_in_thread_reads_what_read_entries_reads(
    tmp_path: Path, runs_per_thread: int, pooled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Many small segments: every one starts with a checkpoint entry, which
    # both leave out; runs cross segment boundaries (in one worker-thread call,
    # or in several of two segments each); mirror entries come with their
    # header only when payload_kinds says so. Read into fresh memory or into
    # the buffers of one ReadBuffers, reused from read to read.
    monkeypatch.setattr(reads_module, "_RUNS_PER_THREAD", runs_per_thread)
    buffers = ReadBuffers() if pooled else None
    if pooled:  # every payload a view into the buffers (not only large ones)
        monkeypatch.setattr(fentry, "VIEW_MIN_BYTES", 0)
    async with open_journal(tmp_path, SMALL) as j:
        for i in range(300):
            await j.append("t", i % 3, batch_for("t", i % 3, j.next_offset("t", i % 3), 30))
            if i % 7 == 0:
                b = encode_batch([b"m"] * 3, timestamps=1, base_offset=3 * (i // 7))
                await j.append_mirror("north.t", 0, b, SourceCoords("north", i + 1, 1))
        await j.flush()
        assert j.statistics().segments > 5
        kinds = {fentry.KIND_DATA}
        everything = j.read_entries(1, max_bytes=1 << 30, payload_kinds=kinds)
        assert await j.read_entries_in_thread(
            1, max_bytes=1 << 30, payload_kinds=kinds, buffers=buffers
        ) == (everything)
        lsns = [e.lsn for e in everything]
        for k in (0, 1, 57, len(everything) - 1):
            for max_bytes in (1, 700, 20_000, 200_000):
                got = await j.read_entries_in_thread(
                    lsns[k], max_bytes=max_bytes, payload_kinds=kinds, buffers=buffers
                )
                # A non-empty run of what follows, in order, about max_bytes long.
                assert got == everything[k : k + len(got)]
                assert got
                assert sum(e.length for e in got[:-1]) < max_bytes
        assert await j.read_entries_in_thread(lsns[-1] + 1) == []


async def test_pooled_reads_never_overwrite_entries_still_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries read into ReadBuffers view their run's buffer: it is reused only once
    none of them is left, so a held entry keeps the bytes it was checked with."""
    buffers = ReadBuffers(keep=2)
    async with open_journal(tmp_path, SMALL) as j:
        for i in range(400):
            await j.append("t", i % 3, batch_for("t", i % 3, j.next_offset("t", i % 3), 20))
        await j.flush()
        everything = j.read_entries(1, max_bytes=1 << 30)
        want = {e.lsn: bytes(e.payload) for e in everything}
        assert all(e.length < fentry.VIEW_MIN_BYTES for e in everything)
        small = await j.read_entries_in_thread(1, max_bytes=3000, buffers=buffers)
        assert all(type(e.payload) is bytes for e in small)  # short: copied
        del small
        monkeypatch.setattr(fentry, "VIEW_MIN_BYTES", 0)  # from here on, views
        kept: list[list[fentry.Entry]] = []
        lsn = 1
        while lsn <= everything[-1].lsn:
            got = await j.read_entries_in_thread(lsn, max_bytes=3000, buffers=buffers)
            assert all(type(e.payload) is memoryview and e.payload.readonly for e in got)
            kept.append(got)
            lsn = got[-1].lsn + 1
        assert len(kept) > 10  # more reads than the buffers kept (2): fresh ones beyond
        # Every entry read still holds its own bytes, after all the reads since.
        held = [e for got in kept for e in got]
        assert [e.lsn for e in held] == [e.lsn for e in everything]
        assert all(bytes(e.payload) == want[e.lsn] for e in held)
        # Once nothing refers into them, the same buffers serve the next reads.
        pool = list(buffers._buffers)
        del kept, held, got
        for _ in range(3):
            again = await j.read_entries_in_thread(1, max_bytes=3000, buffers=buffers)
            assert [bytes(e.payload) for e in again] == [want[e.lsn] for e in again]
            del again
        assert buffers._buffers == pool
        assert all(a is b for a, b in zip(buffers._buffers, pool, strict=True))


def test_read_buffers_hand_a_buffer_to_one_taker_at_a_time() -> None:
    """A taken buffer stays taken while its view, or any view derived from it, lives:
    two reads at once (or one whose entries are still held) never share a buffer."""
    buffers = ReadBuffers(keep=4)
    a = buffers.take(10)
    b = buffers.take(10)
    assert a.obj is not b.obj
    assert len(a) == 10
    assert not a.readonly
    held = a.toreadonly()[2:5]  # what entries keep
    first = a.obj
    del a
    c = buffers.take(10)
    assert c.obj is not first
    del held
    d = buffers.take(300_000)  # larger than the free buffer: a new one
    assert d.obj is not first
    e = buffers.take(10)
    assert e.obj is first  # nothing refers into it any more: reused
    assert len(buffers._buffers) == 4


async def test_pooled_reads_name_a_damaged_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flipped byte read into a pooled buffer: CorruptData naming file and byte,
    and the next read of intact entries through the same buffers is intact."""
    monkeypatch.setattr(fentry, "VIEW_MIN_BYTES", 0)
    buffers = ReadBuffers()
    async with open_journal(tmp_path, SMALL) as j:
        for i in range(600):
            await j.append("t", i % 3, batch_for("t", i % 3, j.next_offset("t", i % 3), 4))
        await j.flush()
        entries = j.read_entries(1, max_bytes=1 << 30)
        victim = entries[len(entries) // 2]
        seg = max((p for p in segment_files(tmp_path) if int(p.stem) <= victim.lsn), key=str)
        raw = seg.read_bytes()
        pos = next(
            k
            for k in range(len(raw) - 16)
            if raw[k + 8 : k + 16] == struct.pack("<Q", victim.lsn)
            and struct.unpack_from("<I", raw, k)[0] == victim.length
        )
        with seg.open("r+b") as f:
            f.seek(pos + victim.length - 1)
            f.write(bytes([raw[pos + victim.length - 1] ^ 1]))
        with pytest.raises(CorruptData, match="CRC mismatch") as info:
            await j.read_entries_in_thread(1, max_bytes=1 << 30, buffers=buffers)
        assert info.value.where == f"{seg}@{pos}"
        before = [e for e in entries if e.lsn < victim.lsn]
        got = await j.read_entries_in_thread(1, max_bytes=100_000, buffers=buffers)
        assert got == before[: len(got)]


async def test_read_entries_in_thread_skips_a_run_of_checkpoints(tmp_path: Path) -> None:
    # The first LSN of a segment is its checkpoint: a read of one byte from
    # there must go on to the data after it rather than report nothing.
    async with open_journal(tmp_path, SMALL) as j:
        while j.statistics().segments < 3:
            await j.append("t", 0, batch_for("t", 0, j.next_offset("t", 0), 50))
        await j.flush()
        everything = j.read_entries(1, max_bytes=1 << 30)
        gap = next(a.lsn + 1 for a, b in itertools.pairwise(everything) if b.lsn != a.lsn + 1)
        assert await j.read_entries_in_thread(gap, max_bytes=1) == [
            e for e in everything if e.lsn == gap + 1
        ]


async def test_read_entries_steps_over_kinds_without_their_payload(tmp_path: Path) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        for i in range(30):
            await j.append("t", 0, batch_for("t", 0, j.next_offset("t", 0), 2))
            b = encode_batch([b"m"] * 3, timestamps=1, base_offset=3 * i)
            await j.append_mirror("north.t", 0, b, SourceCoords("north", i + 1, 1))
        await j.flush()
        full = j.read_entries(1, max_bytes=1 << 30)
        light = j.read_entries(1, max_bytes=1 << 30, payload_kinds={fentry.KIND_DATA})
        # (a mirror entry stepped over carries its LSN, kind and length only:
        # test_mirror_groups.py has runs of them)
        key = [(e.lsn, e.kind, e.length) for e in full]
        assert [(e.lsn, e.kind, e.length) for e in light] == key
        assert {e.kind for e in full} == {fentry.KIND_DATA, fentry.KIND_MIRROR}
        for f, e in zip(full, light, strict=True):
            if e.kind == fentry.KIND_DATA:
                assert e == f
            else:
                assert (e.payload, e.source) == (b"", None)
                assert f.payload
                assert f.source is not None


async def test_read_entries_names_the_segment_and_byte_of_a_damaged_entry(
    tmp_path: Path,
) -> None:
    """A flipped byte in a sealed segment: CorruptData with the file and the entry's position."""
    async with open_journal(tmp_path, SMALL) as j:
        for i in range(600):
            await j.append("t", i % 3, batch_for("t", i % 3, j.next_offset("t", i % 3), 4))
        await j.flush()
        assert len(segment_files(tmp_path)) > 2
        entries = j.read_entries(1, max_bytes=1 << 30)
        victim = entries[len(entries) // 2]
        # The entry's segment (named after its first LSN) and its byte in it.
        seg = max((p for p in segment_files(tmp_path) if int(p.stem) <= victim.lsn), key=str)
        raw = seg.read_bytes()
        pos = next(
            k
            for k in range(len(raw) - 16)
            if raw[k + 8 : k + 16] == struct.pack("<Q", victim.lsn)
            and struct.unpack_from("<I", raw, k)[0] == victim.length
        )
        with seg.open("r+b") as f:  # one bit of the entry's last byte
            f.seek(pos + victim.length - 1)
            f.write(bytes([raw[pos + victim.length - 1] ^ 1]))
        with pytest.raises(CorruptData, match="CRC mismatch") as info:
            j.read_entries(entries[0].lsn, max_bytes=1 << 30)
        assert info.value.where == f"{seg}@{pos}"


async def test_mirror_entries_keep_source_offsets_and_progress(tmp_path: Path) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        src = SourceCoords("north", seq=7, epoch=2)
        b = encode_batch([b"a", b"b"], timestamps=1, base_offset=0)
        res = await j.append_mirror("north.t", 0, b, src)
        assert (res.base_offset, res.count) == (0, 2)
        with pytest.raises(InvalidInput, match="already present"):
            await j.append_mirror("north.t", 0, b, src)
        gap = encode_batch([b"z"], timestamps=1, base_offset=10)
        with pytest.raises(InvalidInput, match="gap"):
            await j.append_mirror("north.t", 0, gap, src)
        await j.append_mirror("north.t", 0, gap, SourceCoords("north", 8, 2), allow_gap=True)
        await j.append_mirror("north.t", 0, None, SourceCoords("north", 9, 3))
        assert j.next_offset("north.t", 0) == 11
        assert j.source_progress()["north"] == SourceCoords("north", 9, 3)
        # a read across the gap skips it
        assert [r.offset for r in decode_batch(j.read("north.t", 0, 5)[0].payload).records()] == [
            10
        ]
    j2 = Journal.open_sync(tmp_path, SMALL)
    try:
        assert j2.source_progress()["north"] == SourceCoords("north", 9, 3)
        e = j2.read("north.t", 0, 0)[0]
        assert e.source == SourceCoords("north", 7, 2)
    finally:
        j2.close_sync()


async def test_progress_survives_deletion_of_old_segments(tmp_path: Path) -> None:
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)
    async with open_journal(tmp_path, cfg) as j:
        await j.append_mirror(
            "south.t", 0, encode_batch([b"m"], timestamps=1), SourceCoords("south", 3, 1)
        )
        for i in range(200):
            await j.append("t", 0, batch_for("t", 0, i * 5, 5))
        await j.flush()
        j.set_safe_lsn(j.next_lsn)
        assert j._segments[0].base_lsn > 1  # the segment with the mirror entry is gone
    j2 = Journal.open_sync(tmp_path, cfg)
    try:
        assert j2.source_progress()["south"].seq == 3
        assert j2.next_offset("south.t", 0) == 1
        assert j2.next_offset("t", 0) == 1000
    finally:
        j2.close_sync()


async def test_closed_journal_refuses_work(tmp_path: Path) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        pass
    with pytest.raises(ClosedError):
        j.append_nowait("t", 0, batch_for("t", 0, 0, 1))
    with pytest.raises(ClosedError):
        j.read("t", 0, 0)


async def test_body_exception_is_not_wrapped_in_a_group(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        async with open_journal(tmp_path, SMALL):
            raise KeyError("mine")


async def _wait_until(cond: Callable[[], bool]) -> None:
    # durable_lsn has no event to wait on: poll it, bounded.
    with trio.fail_after(10):
        while not cond():  # noqa: ASYNC110
            await trio.sleep(0.001)


async def test_interval_flusher_fsyncs_without_being_asked(tmp_path: Path) -> None:
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=1 << 26, fsync_interval_ms=5)
    async with open_journal(tmp_path, cfg) as j:
        for round_ in range(3):  # idle -> dirty -> idle, three times
            res = await j.append("t", 0, encode_record(b"x", timestamp=round_))
            await _wait_until(lambda: j.durable_lsn >= res.lsn)  # noqa: B023
            await trio.sleep(0.02)
        assert j.statistics().fsyncs >= 3


async def test_fsync_bytes_cuts_the_interval_short(tmp_path: Path) -> None:
    # An hour-long interval: only the byte threshold can trigger this fsync.
    cfg = JournalConfig(
        segment_bytes=1 << 22, max_bytes=1 << 26, fsync_interval_ms=3_600_000, fsync_bytes=1 << 16
    )
    async with open_journal(tmp_path, cfg) as j:
        res = await j.append("t", 0, encode_record(b"x", timestamp=1))
        await trio.sleep(0.05)
        assert j.durable_lsn < res.lsn  # nothing forces it yet
        for i in range(10):
            res = await j.append("t", 0, encode_record(b"y" * 10_000, timestamp=i))
        await _wait_until(lambda: j.durable_lsn >= res.lsn - 3)


async def test_append_waiters_wake_and_a_cancelled_one_does_not_block_others(
    tmp_path: Path,
) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        woke: list[str] = []
        start = j.appended_bytes

        async def wait_bytes(name: str, total: int) -> None:
            await j.wait_appended_bytes(total)
            woke.append(name)

        async def wait_lsn(lsn: int) -> None:
            await j.wait_appended(lsn)
            woke.append(f"lsn {lsn}")

        async def doomed(*, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await j.wait_appended_bytes(start + 1)  # the nearest target of all
                woke.append("doomed")

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_bytes, "near", start + 50)
                nursery.start_soon(wait_bytes, "far", start + 5_000)
                nursery.start_soon(wait_lsn, j.next_lsn + 1)
                scope = await nursery.start(doomed)
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()  # its target must not be the only one watched for
                await trio.testing.wait_all_tasks_blocked()
                assert woke == []
                await j.append("t", 0, encode_record(b"a" * 100, timestamp=1))
                await trio.testing.wait_all_tasks_blocked()
                assert woke == ["near"]
                await j.append("t", 0, encode_record(b"b" * 6_000, timestamp=2))
        assert sorted(woke) == sorted(["near", "far", f"lsn {j.next_lsn - 1}"])


async def test_wait_appended_alone_wakes_on_the_entry(tmp_path: Path) -> None:
    # No background flusher (whose idle state would also wake waiters): the
    # waiter alone must make the append notice it.
    j = Journal.open_sync(tmp_path, SMALL)
    try:
        woke: list[int] = []

        async def waiter(lsn: int) -> None:
            await j.wait_appended(lsn)
            woke.append(lsn)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter, j.next_lsn)
                await trio.testing.wait_all_tasks_blocked()
                j.append_nowait("t", 0, encode_record(b"a", timestamp=1))
        assert woke == [j.next_lsn - 1]
    finally:
        j.close_sync()


async def test_a_wall_clock_set_back_does_not_stop_appends_from_yielding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer that never blocks still lets other tasks run once per fsync interval."""
    now_ns = [1_800_000_000_000 * 1_000_000]
    monkeypatch.setattr(journal_module, "_time_ns", lambda: now_ns[0])
    ran = 0

    async def other_task() -> None:
        nonlocal ran
        while True:
            ran += 1
            await trio.lowlevel.checkpoint()

    cfg = JournalConfig(segment_bytes=1 << 20, max_bytes=64 << 20, fsync_interval_ms=5.0)
    async with open_journal(tmp_path / "j", cfg) as j, trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        await j.append("t", 0, batch_for("t", 0, 0, 1))
        now_ns[0] -= 86_400 * 10**9  # the time is set a day back
        await trio.lowlevel.checkpoint()
        before = ran
        for i in range(1, 200):  # 1 ms of wall clock per append: 40 intervals
            now_ns[0] += 1_000_000
            await j.append("t", 0, batch_for("t", 0, i, 1))
        assert ran > before
        nursery.cancel_scope.cancel()


def test_only_checkpoints_counts_segment_bases(tmp_path: Path) -> None:
    j = Journal.open_sync(tmp_path / "j", JournalConfig(segment_bytes=64 * 1024, retention_ms=0))
    try:
        assert j.next_lsn == 2  # a fresh journal: its checkpoint
        assert j.only_checkpoints(1, 1)
        j.append_nowait("t", 0, encode_batch([b"x" * 100], timestamps=1))
        assert not j.only_checkpoints(1, 2)
        assert j.only_checkpoints(3, 2)  # an empty range
        while j.statistics().segments < 2:
            j.append_nowait("t", 0, encode_batch([b"x" * 8000], timestamps=1))
        base = j.next_lsn - 2  # the new segment: its checkpoint, then the entry that rolled
        assert j.only_checkpoints(base, base)
        assert not j.only_checkpoints(base, base + 1)
        assert not j.only_checkpoints(base - 1, base)
    finally:
        j.close_sync()


async def test_a_partition_with_no_entry_after_the_damage_moves_past_a_bound(
    tmp_path: Path,
) -> None:
    """Its lost offsets cannot be counted: the range is the most the lost bytes could
    hold, marked not exact, and no offset inside it is ever handed out."""
    d = tmp_path / "journal"
    async with open_journal(d, SMALL) as j:
        for i in range(10):
            await j.append("t", 0, batch_for("t", 0, i * 2, 2))
        await j.append("t", 1, batch_for("t", 1, 0, 3))
        await j.append("t", 1, batch_for("t", 1, 3, 3))  # t/1's last entry: damaged
        pos = j._segments[-1].positions[-1]
        for i in range(10, 20):
            await j.append("t", 0, batch_for("t", 0, i * 2, 2))
    last = segment_files(d)[-1]
    raw = bytearray(last.read_bytes())
    raw[pos + 30] ^= 0x01
    last.write_bytes(bytes(raw))
    for _ in range(2):  # the quarantine, then an open of the sound segment
        j2 = Journal.open_sync(d, SMALL)
        try:
            [loss] = j2.losses()
            [bound] = loss.ranges  # t/0 lost nothing: its next entry follows on
            assert (bound.topic, bound.partition, bound.first, bound.exact) == ("t", 1, 3, False)
            assert bound.last >= 5  # covers the 3 records lost
            assert j2.next_offset("t", 1) == bound.last + 1
            assert all_records(j2, "t", 1) == [(o, value("t", 1, o)) for o in range(3)]
            assert len(all_records(j2, "t", 0)) == 40
        finally:
            j2.close_sync()
