"""The live rewriter (``journal/_rewriter.py``): sealed segments of an OPEN journal rewritten
compressed while it is read, appended to, shipped, retained and dropped.

The journal of ``test_compressed.py`` (every kind of entry) is opened live;
the rewriter runs in the background while the test reads by offset and by
LSN (on the event loop and in worker threads) and appends; every read gives
what it gave before, the shipper ships the same records, and a reopen reads
the same again. Then the edges: a segment deleted by retention while its
rewrite runs is not brought back, ``ENOSPC`` during a rewrite leaves the
entry log in place (and the budget as it was), an append that would be
refused with ``JournalFull`` rewrites first, a version it cannot compress is
skipped, and ``journal.at_rest`` is checked.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
from _faults import FaultyFs
from test_compressed import (
    CFG,
    SMALL,
    _copy,
    _e,
    _es,
    _log_records,
    _reading,
    _sealed,
    written,  # noqa: F401 - the shared fixture
)

from edge_gateway.bucket import LocalBucket
from edge_gateway.errors import ConfigError, JournalFull
from edge_gateway.format.atrest import MAGIC
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.entry import KIND_CHECKPOINT as CHECKPOINT
from edge_gateway.journal import Journal, JournalConfig, _rewriter
from edge_gateway.journal import _fs as fs_module
from edge_gateway.journal._rewriter import Pacer
from edge_gateway.sample_data import TelemetryGenerator
from edge_gateway.shipper import Shipper, ShipperConfig


def _small(j: Journal) -> None:
    """Small frames and chunks: a segment holds many of both."""
    j.rewriter.frame_raw_bytes = SMALL["frame_raw_bytes"]
    j.rewriter.chunk_raw_bytes = SMALL["chunk_raw_bytes"]


def _kinds(root: Path) -> list[bytes]:
    return [(root / f"{b:020d}.wal").read_bytes()[:4] for b in _sealed(root)]


async def test_reads_appends_and_shipping_go_on_while_segments_are_rewritten(
    written: tuple[Path, dict[str, Any]],  # noqa: F811
    tmp_path: Path,
) -> None:
    root, before = _copy(written, tmp_path / "live")
    plain, _ = _copy(written, tmp_path / "plain")
    j = Journal.open_sync(root, CFG)
    _small(j)
    j.rewriter.duty = 1.0  # as fast as it goes: the test wants many swaps under its reads
    entries = before["entries"]
    first = entries[0][0]
    checked = 0
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(j.rewriter.run)
            j.rewriter.sealed()
            for rnd in range(10_000):
                # by LSN, on the event loop and in a worker thread
                lsn = first + (rnd * 37) % len(entries)
                assert _e(j.read_entry(lsn)) == entries[lsn - first]
                start = first + (rnd * 61) % len(entries)
                got = _es(await j.read_entries_in_thread(start, max_bytes=5000))
                assert got
                # (the appends below come after the entries read here: left out)
                got = [x for x in got if x[0] < first + len(entries)]
                assert (
                    got == [x for x in entries[start - first :] if x[1] != CHECKPOINT][: len(got)]
                )
                # appends go on (another topic: the readings above stay as they were)
                j.append_nowait("u", 0, encode_batch([b"during %d" % rnd], timestamps=[rnd]))
                # by offset
                p = rnd % 7
                key = f"read all t/{p}"
                lo = before["offsets"][("t", p)][0]
                assert _es(j.read("t", p, lo, max_records=10**6, max_bytes=1 << 30)) == before[key]
                checked += 1
                if j.rewriter.statistics().pending == 0:
                    break
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()
        stats = j.statistics()
        assert stats.rewrite_pending == 0
        assert stats.rewritten_segments == len(_sealed(root))
        assert stats.compressed_segments == stats.rewritten_segments
        assert stats.rewritten_bytes_after < stats.rewritten_bytes_before
        assert stats.rewrite_failures == 0
        assert not j.rewriter.running
        # the budget counts what is on disk (no .z-tmp, no index of a compressed segment)
        assert not list(root.glob("*.z-tmp"))
        sealed = sum((root / f"{b:020d}.wal").stat().st_size for b in _sealed(root))
        indexes = sum(f.stat().st_size for f in root.glob("*.idx"))
        assert stats.bytes == sealed + indexes + stats.active_segment_bytes
        assert not list(root.glob("*.idx"))  # every sealed segment is compressed
        assert stats.compressed_bytes == sealed
        # the records appended during the rewrites
        during = j.read("u", 0, 0, max_records=10**6)
        assert sum(e.count for e in during) == checked
    finally:
        j.close_sync()
    assert checked > 0
    # every segment sealed before the rewriter finished is compressed
    assert _kinds(root).count(MAGIC) == stats.rewritten_segments
    # the shipper ships the same records from the rewritten journal
    fast = ShipperConfig(
        flush_interval_ms=20, manifest_every=3, retry_base_s=0.01, retry_cap_s=0.05
    )
    shipped = []
    for r in (plain, root):
        bucket = await LocalBucket.open(tmp_path / f"bucket-{r.parent.name}", create=True)
        jj = Journal.open_sync(r, CFG)
        try:
            s = Shipper(jj, bucket, "north", config=fast)
            await s.claim()
            await s.ship_pending()
            shipped.append(await _log_records(bucket))
        finally:
            jj.close_sync()
            await bucket.aclose()
    want, got = shipped
    assert len(got.pop(("u", 0))) == checked
    assert got == want
    # and a reopen reads what the journal read before (and what was appended after it)
    after = await _reading(root)
    assert after["entries"][: len(entries)] == entries
    for p in range(7):
        assert after[f"read all t/{p}"] == before[f"read all t/{p}"]


async def test_a_segment_retention_deletes_during_its_rewrite_stays_deleted(
    written: tuple[Path, dict[str, Any]],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, _ = _copy(written, tmp_path)
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)
    j = Journal.open_sync(root, cfg)
    sealed = _sealed(root)
    real = _rewriter.write_compressed

    def then_retention(path: Path, **kw: Any) -> Any:
        prepared = real(path, **kw)
        # while the worker thread still holds its result: the oldest is shipped and goes
        trio.from_thread.run_sync(j.set_safe_lsn, sealed[1])
        return prepared

    monkeypatch.setattr(_rewriter, "write_compressed", then_retention)
    j.rewriter.in_child = False  # the patch above is seen in this process only
    try:
        seg = j._segment_set.segments[0]
        gone = seg.size + seg.index_path.stat().st_size
        before = j.statistics().bytes
        assert seg.base_lsn == sealed[0]
        assert await j.rewriter.rewrite(seg, paced=False)  # nothing failed: it went
        assert not (root / f"{sealed[0]:020d}.wal").exists()
        assert not list(root.glob("*.z-tmp"))
        stats = j.statistics()
        assert stats.first_lsn == sealed[1]
        assert stats.rewritten_segments == 0
        assert j.rewriter.statistics().skipped == 1
        # the budget lost the segment and its index, and nothing else (the .z-tmp is gone)
        assert stats.bytes == before - gone
    finally:
        j.close_sync()
    assert Journal.open_sync(root, cfg).close_sync() is None


async def test_enospc_during_a_rewrite_backs_off_and_leaves_the_segment(
    written: tuple[Path, dict[str, Any]],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, before = _copy(written, tmp_path)
    fs = FaultyFs()
    monkeypatch.setattr(fs_module, "ops", fs)
    j = Journal.open_sync(root, CFG)
    j.rewriter.in_child = False  # the faulty file operations exist in this process only
    try:
        seg = j._segment_set.segments[0]
        original = seg.path.read_bytes()
        budget = j.statistics().bytes
        for kind in ("write", "fsync", "open", "rename"):
            # every call of the kind on the temporary file fails
            fs.fail(kind, fs.calls[kind] + 1, errno=errno.ENOSPC, only=".z-tmp")
            assert not await j.rewriter.rewrite(seg, paced=False), kind
            assert fs.failures, kind
            fs.heal()
            assert seg.path.read_bytes() == original, kind
            assert seg.compressed is None
            assert not list(root.glob("*.z-tmp")), kind
            assert j.statistics().bytes == budget, kind
            assert _e(j.read_entry(seg.base_lsn + 3)) == before["entries"][3]
        rw = j.rewriter.statistics()
        assert rw.failures == 4
        assert rw.last_error is not None
        assert "No space left" in rw.last_error
        # the space is back: the same segment is rewritten
        assert await j.rewriter.rewrite(seg, paced=False)
        assert seg.path.read_bytes()[:4] == MAGIC
        assert _e(j.read_entry(seg.base_lsn + 3)) == before["entries"][3]
    finally:
        j.close_sync()


async def test_the_background_task_backs_off_after_a_failure(
    written: tuple[Path, dict[str, Any]],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, _ = _copy(written, tmp_path)
    fs = FaultyFs()
    monkeypatch.setattr(fs_module, "ops", fs)
    monkeypatch.setattr(_rewriter, "BACKOFF_S", 0.05)
    fs.fail("write", 1, errno=errno.ENOSPC, only=".z-tmp")  # every write of a .z-tmp
    j = Journal.open_sync(root, CFG)
    j.rewriter.in_child = False  # the faulty file operations exist in this process only
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(j.rewriter.run)
            await trio.sleep(0.5)  # without a backoff: hundreds of tries
            failures = j.rewriter.statistics().failures
            nursery.cancel_scope.cancel()
        # tries at about 0, 0.05, 0.15, 0.35 s (doubling); a loaded machine makes fewer
        assert 1 <= failures <= 5
        assert set(_kinds(root)) == {b"EGWJ"}
        assert not list(root.glob("*.z-tmp"))
    finally:
        j.close_sync()


def test_a_full_budget_hurries_the_rewriter_and_never_blocks_an_append(tmp_path: Path) -> None:
    """At a full budget with sealed segments waiting, appends go on into a slack of
    one segment while the rewriter runs unpaced; they are refused only once nothing
    is left to compress. The journal never goes past budget + one segment."""
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=256 * 1024, reserve_bytes=0)
    values = [r.value for r in TelemetryGenerator(seed=7).take(20_000)]

    async def fill(rewriter_on: bool) -> tuple[int, int, int]:
        j = Journal.open_sync(tmp_path / f"j{rewriter_on}", cfg)
        j.rewriter.in_child = False  # the worker thread: no child start per segment
        j.rewriter.duty = 0.01  # paced almost to a halt: only hurry() makes it keep up

        async def append(batch: bytes, partition: int) -> bool:
            while True:
                try:
                    j.append_nowait("t", partition, batch)
                    return True
                except JournalFull:
                    if not j.rewriter.hurry():
                        return False  # nothing left to compress: really full
                    await trio.sleep(0.01)  # the rewrite under way makes room

        n = peak = 0
        try:
            async with trio.open_nursery() as nursery:
                if rewriter_on:
                    await nursery.start(j.rewriter.run)
                with trio.fail_after(120):
                    for v in values:
                        if not await append(encode_batch([v], timestamps=[n]), n % 4):
                            break
                        assert j.disk_bytes <= cfg.max_bytes + cfg.segment_bytes + 8192
                        peak = max(peak, j.disk_bytes)
                        n += 1
                        if n % 100 == 0:
                            await trio.lowlevel.checkpoint()
                nursery.cancel_scope.cancel()
            return n, peak, j.rewriter.statistics().hurried
        finally:
            j.close_sync()

    without, _, hurried0 = trio.run(fill, False)
    with_, peak, hurried = trio.run(fill, True)
    assert hurried0 == 0
    assert hurried > 0
    assert peak > cfg.max_bytes  # it did use the slack
    assert with_ > 3 * without, (with_, without)


def test_a_segment_version_it_does_not_compress_is_skipped(tmp_path: Path) -> None:
    j = Journal.open_sync(tmp_path / "j", JournalConfig(segment_bytes=64 * 1024))
    try:
        for i in range(2000):
            j.append_nowait("t", 0, encode_batch([b"x" * 100], timestamps=[i]))
        seg = j._segment_set.segments[0]
        data = bytearray(seg.path.read_bytes())
        data[4] = 9  # a segment version this code does not know (a newer gateway's)
        seg.path.write_bytes(bytes(data))
        assert trio.run(lambda: j.rewriter.rewrite(seg, paced=False))
        assert seg.compressed is None
        assert seg.path.read_bytes() == bytes(data)
        rw = j.rewriter.statistics()
        assert (rw.skipped, rw.failures, rw.segments) == (1, 0, 0)
        assert rw.pending == len(j._segment_set.segments) - 2
    finally:
        j.close_sync()


def test_the_pacer_holds_the_thread_to_its_share_of_a_core() -> None:
    slept: list[float] = []
    cpu = iter([0.0, 0.01, 0.01, 0.03, 0.03])
    pacer = Pacer(0.25, sleep=slept.append, cpu=lambda: next(cpu))
    pacer()
    pacer()
    assert slept == pytest.approx([0.03, 0.06])
    assert pacer.busy_s == pytest.approx(0.03)
    with pytest.raises(ValueError, match="duty"):
        Pacer(0)


def test_at_rest_settings_are_checked() -> None:
    assert JournalConfig().at_rest == "compressed"
    assert JournalConfig().at_rest_level == 3
    assert not JournalConfig(at_rest="off").compress_at_rest
    with pytest.raises(ConfigError, match=r"journal\.at_rest"):
        JournalConfig(at_rest="zstd")
    with pytest.raises(ConfigError, match=r"journal\.at_rest_level"):
        JournalConfig(at_rest_level=23)
