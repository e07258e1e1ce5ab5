"""The journal on a full or failing disk (issues 14.5, 29.3, 29.4).

A real full filesystem where it matters (a small tmpfs, root only; skipped
elsewhere with the reason) and the fault-injecting file operations of
``_faults.py`` for the failures a tmpfs cannot produce (EIO, a failed fsync,
one failed call in the middle of a roll).
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
import trio
from _faults import FaultyFs
from _tmpfs import fill, free_bytes, mounted_tmpfs

from edge_gateway.errors import DiskFull, Unavailable
from edge_gateway.format.batch import decode_batch, encode_batch
from edge_gateway.journal import FsyncPolicy, Journal, JournalConfig, SourceCoords, open_journal
from edge_gateway.journal import _fs as fs_module
from edge_gateway.journal._journal import RESERVE_NAME

KiB = 1024
MiB = 1024 * KiB


def batch(first: int, n: int = 4, size: int = 1000) -> bytes:
    return encode_batch(
        [f"{first + i}:".encode() + b"v" * size for i in range(n)],
        timestamps=[1_700_000_000_000 + first + i for i in range(n)],
    )


def values(j: Journal, topic: str = "t", partition: int = 0) -> list[bytes]:
    """Every record value still in the journal, checking offsets run without a gap."""
    out: list[bytes] = []
    offset = j.first_offset(topic, partition)
    while True:
        entries = j.read(topic, partition, offset, max_records=10_000)
        if not entries:
            return out
        for e in entries:
            for r in decode_batch(e.payload).records(offset):
                assert r.offset == offset, (r.offset, offset)
                out.append(r.value)
                offset += 1


def reopen_values(path: Path, cfg: JournalConfig) -> tuple[list[bytes], int]:
    j = Journal.open_sync(path, cfg)
    try:
        return values(j), j.statistics().truncated_bytes_on_open
    finally:
        j.close_sync()


def wal_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.glob("*.wal"))


def ship_all(j: Journal) -> None:
    """What the shipper does once the bucket confirmed everything durable."""
    j.set_safe_lsn(j.durable_lsn + 1)


# ---------------------------------------------------------------- a real full disk


async def test_a_small_disk_with_the_default_budget_keeps_accepting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 14.5: a 20 MB disk, the default 4 GiB budget and 24 h retention.
    # The journal used to fill the disk with shipped data and answer
    # journal_full for ever; now it warns at open, rolls segments small
    # enough to delete, and deletes shipped ones (only) to keep room.
    with mounted_tmpfs(tmp_path / "disk", "20m") as disk:
        path = disk / "journal"
        caplog.set_level(logging.INFO, logger="edgegw.journal")
        cfg = JournalConfig()
        async with open_journal(path, cfg) as j:
            assert "exceeds the filesystem" in caplog.text
            n = 0
            while j.statistics().appended_bytes < 3 * 20 * MiB:  # three times the disk
                await j.append("t", 0, batch(n))
                n += 4
                if n % 400 == 0:
                    await j.flush()
                    ship_all(j)
            await j.flush()
            stats = j.statistics()
            assert stats.disk_size_bytes == 20 * MiB
            assert 0 <= stats.disk_free_bytes < 20 * MiB
            assert stats.disk_full_rejections == 0
            assert stats.segments_deleted_for_space > 0
            kept = values(j)
            # What is left is the newest records, gap-free, the last one included.
            assert kept == [f"{i}:".encode() + b"v" * 1000 for i in range(n - len(kept), n)]
        assert reopen_values(path, cfg) == (kept, 0)


async def test_a_disk_filled_by_another_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 29.3: the filesystem fills from outside the journal's budget.
    # Shipped segments go first (within retention too); unshipped data never
    # does; then appends fail with DiskFull (never an OSError, never a dead
    # journal), rolls included; space coming back resumes intake at once.
    with mounted_tmpfs(tmp_path / "disk", "8m") as disk:
        path = disk / "journal"
        cfg = JournalConfig(segment_bytes=128 * KiB, max_bytes=1 << 30, reserve_bytes=0)
        caplog.set_level(logging.INFO, logger="edgegw.journal")
        acked: list[bytes] = []
        async with open_journal(path, cfg) as j:
            first = 0

            async def append() -> None:
                nonlocal first
                await j.append("t", 0, batch(first))
                acked.extend(f"{first + i}:".encode() + b"v" * 1000 for i in range(4))
                first += 4

            for _ in range(200):  # ~800 KiB: six sealed segments
                await append()
            await j.flush()
            ship_all(j)
            shipped_lsn = j.safe_lsn
            for _ in range(100):  # unshipped
                await append()
            caplog.clear()
            fill(disk / "filler")
            refused: list[str] = []
            for _ in range(400):
                try:
                    await append()
                except DiskFull as exc:
                    refused.append(str(exc))
                    if len(refused) >= 5:
                        break
            assert all("disk full writing" in r for r in refused)
            stats = j.statistics()
            assert len(refused) == 5
            assert stats.disk_full
            assert stats.disk_full_rejections == 5
            assert stats.disk_full_episodes == 1
            # Every wholly shipped segment went before the first refusal ...
            assert stats.segments_deleted_for_space > 0
            assert j._segments[0].base_lsn < shipped_lsn < j._segments[0].end_lsn
            # ... and nothing unshipped: every acknowledged record is readable.
            assert values(j)[-len(acked) + 800 :] == acked[800:]
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1, [r.getMessage() for r in warnings]
            assert str(path) in warnings[0].getMessage()
            assert "bytes free" in warnings[0].getMessage()

            (disk / "filler").unlink()  # space returns: the next append goes through
            for _ in range(100):  # rolls again on the way
                await append()
            with trio.fail_after(10):  # the disk watch ends the episode by itself
                while j.statistics().disk_full:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            assert "disk space returned" in caplog.text
            kept = values(j)
        assert kept[-len(acked) + 800 :] == acked[800:]
        assert reopen_values(path, cfg) == (kept, 0)


async def test_a_full_disk_seals_the_active_segment_early_with_the_reserve(
    tmp_path: Path,
) -> None:
    # Everything shipped is in the active segment and the disk has no room
    # for the next one: the reserve file is released, the segment sealed and
    # deleted, and intake resumes without space coming back from outside.
    with mounted_tmpfs(tmp_path / "disk", "32m") as disk:
        path = disk / "journal"
        cfg = JournalConfig(
            segment_bytes=2 * MiB, max_bytes=1 << 30, preallocate=False, reserve_bytes=256 * KiB
        )
        async with open_journal(path, cfg) as j:
            assert (path / RESERVE_NAME).stat().st_size == 256 * KiB
            for i in range(300):  # ~1.2 MB, one segment
                await j.append("t", 0, batch(4 * i))
            await j.flush()
            ship_all(j)
            assert j.statistics().segments == 1
            fill(disk / "filler")
            with pytest.raises(DiskFull):
                await j.append("t", 0, batch(1200))
            res = await j.append("t", 0, batch(1200))  # the early roll made room
            assert res.base_offset == 1200
            assert not (path / RESERVE_NAME).exists()
            assert wal_files(path) == [f"{res.lsn - 1:020d}.wal"]  # the new segment only
            (disk / "filler").unlink()
            j.check_disk()
            assert not j.statistics().disk_full
            assert (path / RESERVE_NAME).stat().st_size == 256 * KiB  # kept again
            kept = values(j)
        assert kept == [f"{1200 + i}:".encode() + b"v" * 1000 for i in range(4)]
        assert reopen_values(path, cfg) == (kept, 0)


# ---------------------------------------------------------------- injected faults


@pytest.fixture
def fs(monkeypatch: pytest.MonkeyPatch) -> FaultyFs:
    faulty = FaultyFs()
    monkeypatch.setattr(fs_module, "ops", faulty)
    return faulty


SMALL = JournalConfig(segment_bytes=64 * KiB, max_bytes=1 << 30, reserve_bytes=0)


@pytest.mark.parametrize("kind", ["open", "write", "fsync"])
async def test_a_roll_that_cannot_create_its_segment_is_undone_and_retried(
    tmp_path: Path, fs: FaultyFs, kind: str
) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        n = 0
        while j.statistics().segments == 1 and j._segments[-1].size < 60 * KiB:
            await j.append("t", 0, batch(n))
            n += 4
        files = sorted(p.name for p in tmp_path.iterdir())
        active = j._segments[-1].base_lsn
        # The roll's first call of this kind after sealing: the new segment's
        # open, its checkpoint write, its fsync (the old segment's fsync is
        # the one before: that would stop intake, see below).
        fs.fail(kind, fs.calls[kind] + (2 if kind == "fsync" else 1), errno=errno.ENOSPC, count=1)
        for _ in range(10):
            try:
                await j.append("t", 0, batch(n))
            except DiskFull:
                break
            n += 4
        assert fs.failures == 1
        # Undone: the old segment is still the active one; no new file is left.
        assert j._segments[-1].base_lsn == active
        assert [f for f in sorted(p.name for p in tmp_path.iterdir()) if f.endswith(".wal")] == [
            f for f in files if f.endswith(".wal")
        ]
        await j.append("t", 0, batch(n))  # retried: this roll works
        n += 4
        assert j._segments[-1].base_lsn > active
        kept = values(j)
    assert kept == [f"{i}:".encode() + b"v" * 1000 for i in range(n)]
    assert reopen_values(tmp_path, SMALL) == (kept, 0)


@pytest.mark.parametrize("kind", ["open", "write", "fsync", "rename"])
async def test_an_index_file_that_cannot_be_written_comes_later(
    tmp_path: Path, fs: FaultyFs, kind: str
) -> None:
    cfg = JournalConfig(segment_bytes=64 * KiB, max_bytes=1 << 30, reserve_bytes=0)
    async with open_journal(tmp_path, cfg) as j:
        n = 0
        fs.fail(kind, 1, errno=errno.ENOSPC, only=".idx")  # every index file's call
        while j.statistics().segments < 3:
            await j.append("t", 0, batch(n))
            n += 4
        assert not list(tmp_path.glob("*.idx"))
        unwritten = values(j)  # read through the index files held in memory
        assert j.statistics().index_memory_bytes > 0
        fs.heal()
        j.check_disk()  # room again: the index files are written from memory
        assert len(list(tmp_path.glob("*.idx"))) == 2
        kept = values(j)
        assert unwritten == kept
    assert reopen_values(tmp_path, cfg) == (kept, 0)
    assert kept == [f"{i}:".encode() + b"v" * 1000 for i in range(n)]


@pytest.mark.parametrize("error", [errno.EIO, errno.ENOSPC])
@pytest.mark.parametrize("policy", [FsyncPolicy.ALWAYS, FsyncPolicy.INTERVAL])
async def test_a_failed_fsync_stops_intake_and_nothing_after_it_counts_as_durable(
    tmp_path: Path, fs: FaultyFs, error: int, policy: FsyncPolicy
) -> None:
    # Issue 29.4 ("fsyncgate"): after a failed fsync the kernel may have
    # dropped the dirty pages and the next fsync can succeed without them.
    # So the journal never fsyncs that file again, durable_lsn stays where
    # the last good fsync left it, and intake stops (503, not an exit);
    # reads and shipping of what is durable go on.
    cfg = JournalConfig(
        fsync=policy, segment_bytes=1 * MiB, max_bytes=1 << 30, preallocate=False, reserve_bytes=0
    )
    fs.drop_unsynced = True  # the lost pages read back as zeros
    async with open_journal(tmp_path, cfg) as j:
        for i in range(10):
            await j.append("t", 0, batch(4 * i))
        await j.flush()
        durable = j.durable_lsn
        fs.fail("fsync", fs.calls["fsync"] + 1, errno=error, count=1)
        if policy is FsyncPolicy.ALWAYS:
            with pytest.raises(Unavailable, match="fsync"):
                await j.append("t", 0, batch(40))  # never acknowledged
        else:
            await j.append("t", 0, batch(40))  # written, not yet durable
            with pytest.raises(Unavailable, match="fsync"):
                await j.flush()
        stats = j.statistics()
        assert stats.failed is not None
        assert "fsync" in stats.failed
        assert j.durable_lsn == durable
        fs.heal()
        with pytest.raises(Unavailable, match="intake stays stopped"):
            await j.append("t", 0, batch(44))
        with pytest.raises(Unavailable):
            await j.append_mirror("south.t", 0, None, SourceCoords("south", seq=1, epoch=1))
        # Reads and the shipper's durable-only reads go on (of the durable
        # entries: the one after them lost its pages and fails its CRC).
        got = [
            r.value
            for e in j.read("t", 0, 0, max_records=40)
            for r in decode_batch(e.payload).records()
        ]
        assert got == [f"{i}:".encode() + b"v" * 1000 for i in range(40)]
        entries = j.read_entries(1, durable_only=True)
        assert entries[-1].lsn == durable
        await trio.sleep(0.05)  # the interval flusher does not die (nor fsync again)
        assert j.statistics().fsyncs == stats.fsyncs
    # Restarted on a healthy disk: everything that was durable is there.
    kept, _ = reopen_values(tmp_path, cfg)
    assert kept[:40] == [f"{i}:".encode() + b"v" * 1000 for i in range(40)]


async def test_eio_on_write_stops_intake_after_undoing_the_write(
    tmp_path: Path, fs: FaultyFs
) -> None:
    cfg = JournalConfig(segment_bytes=1 * MiB, max_bytes=1 << 30, preallocate=False)
    async with open_journal(tmp_path, cfg) as j:
        for i in range(10):
            await j.append("t", 0, batch(4 * i))
        fs.fail("write", fs.calls["write"] + 1, errno=errno.EIO, count=1)
        with pytest.raises(Unavailable, match="Input/output error"):
            await j.append("t", 0, batch(40))
        fs.heal()
        with pytest.raises(Unavailable, match="intake stays stopped"):
            await j.append("t", 0, batch(40))
        assert j.statistics().failed is not None
        assert len(values(j)) == 40
    assert reopen_values(tmp_path, cfg) == ([f"{i}:".encode() + b"v" * 1000 for i in range(40)], 0)


async def test_free_space_is_reported(tmp_path: Path) -> None:
    async with open_journal(tmp_path, SMALL) as j:
        stats = j.statistics()
        assert 0 < stats.disk_free_bytes <= free_bytes(tmp_path) + 64 * MiB
        assert stats.disk_size_bytes >= stats.disk_free_bytes
        assert not stats.disk_full
        assert stats.failed is None
