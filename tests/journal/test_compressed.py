"""The journal reads compressed sealed segments (``EGWC``, docs/at-rest.md) as it reads entry logs.

A journal of many partitions -- idempotent producer entries, mirror entries
with their source coordinates, markers, a gap, null values, keys and headers
-- is written and closed; a reading of every read API is taken; some sealed
segments are compressed with ``compress_sealed_segment`` (small frames and
chunks, so segments hold many of both); the journal is reopened and every
read must give exactly what it gave before. Then: the shipper ships it, the
verifier passes it, retention deletes compressed segments, crashes mid-swap
reopen, and damage is ``CorruptData`` naming the file.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_gateway.bucket import LocalBucket
from edge_gateway.bucket_log import find_head
from edge_gateway.errors import CorruptData, InUse, InvalidInput
from edge_gateway.format import entry as fentry
from edge_gateway.format import logobject
from edge_gateway.format.atrest import MAGIC, CompressedSegment, expand_segment
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.entry import Entry, ProducerStamp, SourceCoords
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import (
    Journal,
    JournalConfig,
    compress_sealed_segment,
    verify_journal,
)
from edge_gateway.shipper import Shipper, ShipperConfig

CFG = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=10**12)
SMALL = {"frame_raw_bytes": 1500, "chunk_raw_bytes": 9000}
PARTS = 7


def _batch(p: int, first: int, n: int) -> bytes:
    values: list[bytes | None] = [
        None if (first + i) % 11 == 3 else f"v{p}-{first + i}-".encode() * (1 + (i % 4))
        for i in range(n)
    ]
    keys: list[bytes | None] = [None if i % 3 else f"k{first + i}".encode() for i in range(n)]
    headers = [[("h", f"{i}".encode()), ("n", b"")] if i % 2 else [] for i in range(n)]
    return encode_batch(
        values,
        keys=keys,
        timestamps=[1_795_000_000_000 + first + i for i in range(n)],
        headers=headers,
    )


async def _write(root: Path) -> None:
    """A journal with several sealed segments of everything a segment can hold."""
    j = Journal.open_sync(root, CFG)
    try:
        seq = 0
        src_seq = 0
        mirror_next = 0
        for step in range(1500):
            p = step % PARTS
            n = 1 + step % 5
            if p == 1:
                j.append_nowait(
                    "t", p, _batch(p, j.next_offset("t", p), n), ProducerStamp(42, 3, seq)
                )
                seq += n
            else:
                j.append_nowait("t", p, _batch(p, j.next_offset("t", p), n))
            if step % 9 == 4:
                src_seq += 1
                if step % 27 == 13:
                    # a marker: progress through a source entry with nothing subscribed
                    await j.append_mirror(
                        "south.m", 0, None, SourceCoords("south", src_seq, 1, True)
                    )
                else:
                    gap = 5 if step % 45 == 22 else 0
                    base = mirror_next + gap
                    mb = encode_batch(
                        [f"m{base + i}".encode() for i in range(3)],
                        timestamps=1_795_000_000_000 + base,
                        base_offset=base,
                    )
                    await j.append_mirror(
                        "south.m",
                        0,
                        mb,
                        SourceCoords("south", src_seq, 1, True),
                        allow_gap=bool(gap),
                    )
                    mirror_next = base + 3
        await j.flush()
    finally:
        j.close_sync()


def _e(e: Entry) -> tuple[Any, ...]:
    return (
        e.lsn,
        e.kind,
        e.topic,
        e.partition,
        e.base_offset,
        e.count,
        e.append_time,
        e.producer,
        e.source,
        bytes(e.payload),
        e.length,
    )


def _es(entries: list[Entry]) -> list[tuple[Any, ...]]:
    return [_e(e) for e in entries]


async def _reading(root: Path) -> dict[str, Any]:
    """What every read API of the journal gives."""
    j = Journal.open_sync(root, CFG)
    try:
        out: dict[str, Any] = {}
        out["partitions"] = sorted(j.partitions())
        out["offsets"] = {
            (t, p): (j.first_offset(t, p), j.next_offset(t, p)) for t, p in j.partitions()
        }
        out["sources"] = j.source_progress()
        out["producers"] = (j.recovered_producers, _es(j.recovered_producer_entries))
        first, end = j.statistics().first_lsn, j.next_lsn
        out["lsns"] = (first, end)
        out["entries"] = [_e(j.read_entry(lsn)) for lsn in range(first, end)]
        for t, p in j.partitions():
            lo, hi = j.first_offset(t, p), j.next_offset(t, p)
            out[f"read {t}/{p}"] = [
                _es(j.read(t, p, o, max_records=7, max_bytes=700)) for o in range(lo, hi + 1)
            ]
            out[f"read all {t}/{p}"] = _es(j.read(t, p, lo, max_records=10**6, max_bytes=1 << 30))
        for kinds in (None, {fentry.KIND_DATA}):
            for max_bytes in (1, 900, 5000, 70_000, 1 << 30):
                for start in range(first, end, 61):
                    key = f"entries {start} {max_bytes} {kinds}"
                    out[key] = _es(j.read_entries(start, max_bytes=max_bytes, payload_kinds=kinds))
                    got = await j.read_entries_in_thread(
                        start, max_bytes=max_bytes, payload_kinds=kinds
                    )
                    out["thread " + key] = _es(got)
        out["only_checkpoints"] = [j.only_checkpoints(a, a + 3) for a in range(first, end, 5)]
        return out
    finally:
        j.close_sync()


def _sealed(root: Path) -> list[int]:
    names = sorted(f.name for f in root.glob("*.wal"))
    return [int(n.split(".")[0]) for n in names[:-1]]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The journal and its reading before any compression (shared: copied by each test)."""
    root = tmp_path_factory.mktemp("written") / "j"

    async def main() -> dict[str, Any]:
        await _write(root)
        return await _reading(root)

    reading = trio.run(main)
    assert len(_sealed(root)) >= 4
    return root, reading


def _copy(written: tuple[Path, dict[str, Any]], dest: Path) -> tuple[Path, dict[str, Any]]:
    root = dest / "j"
    shutil.copytree(written[0], root, ignore=shutil.ignore_patterns("*.lock", "lock"))
    return root, written[1]


async def test_every_read_is_the_same_after_compressing_sealed_segments(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, before = _copy(written, tmp_path)
    sealed = _sealed(root)
    wal_sizes = {b: (root / f"{b:020d}.wal").stat().st_size for b in sealed}
    # alternate compressed and entry-log segments: every read crosses a boundary of kinds
    chosen = sealed[::2]
    for base in chosen:
        original = (root / f"{base:020d}.wal").read_bytes()
        done = compress_sealed_segment(root, base, **SMALL)
        data = done.path.read_bytes()
        assert data[:4] == MAGIC
        assert expand_segment(data) == original
        assert (done.wal_bytes, done.compressed_bytes) == (len(original), len(data))
        assert not (root / f"{base:020d}.idx").exists()
        assert not list(root.glob("*.z-tmp"))
    after = await _reading(root)
    assert after.keys() == before.keys()
    for key in before:
        assert after[key] == before[key], key

    j = Journal.open_sync(root, CFG)
    try:
        stats = j.statistics()
        sizes = {b: (root / f"{b:020d}.wal").stat().st_size for b in chosen}
        assert stats.compressed_segments == len(chosen)
        assert stats.compressed_bytes == sum(sizes.values())
        assert stats.compressed_wal_bytes == sum(wal_sizes[b] for b in chosen)
        assert stats.compressed_bytes < stats.compressed_wal_bytes
        # the budget counts files on disk: compressed segments by their size, no index file
        # (the active segment's file is preallocated: its entries count)
        sealed_wal = sum((root / f"{b:020d}.wal").stat().st_size for b in sealed)
        indexes = sum(f.stat().st_size for f in root.glob("*.idx"))
        assert stats.bytes == sealed_wal + indexes + stats.active_segment_bytes
        assert j.bytes_from(stats.first_lsn) == sealed_wal + stats.active_segment_bytes
        # from inside a compressed segment: its share of the compressed bytes
        base = chosen[0]
        half = base + (j._segment_set.with_base(base).entries // 2)
        assert j.bytes_from(base) > j.bytes_from(half) > j.bytes_from(base) - sizes[base]
        assert stats.block_cache_misses == 0  # the open read no frame
        j.read("t", 0, 0)
        assert j.statistics().block_cache_misses >= 1
        j.read("t", 0, 0)
        assert j.statistics().block_cache_hits >= 1
    finally:
        j.close_sync()
    assert verify_journal(root).ok


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    which=st.sets(st.integers(0, 7), min_size=1),
    frame=st.sampled_from([200, 800, 4096, 256 * 1024]),
    chunk=st.sampled_from([1, 3000, 20_000, 8 * 1024 * 1024]),
)
def test_any_choice_of_segments_and_sizes_reads_the_same(
    written: tuple[Path, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
    which: set[int],
    frame: int,
    chunk: int,
) -> None:
    root, before = _copy(written, tmp_path_factory.mktemp("any"))
    sealed = _sealed(root)
    for k in sorted(which):
        if k < len(sealed):
            compress_sealed_segment(root, sealed[k], frame_raw_bytes=frame, chunk_raw_bytes=chunk)
    assert trio.run(_reading, root) == before


def test_the_helper_refuses_the_last_segment_an_open_journal_and_twice(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, _ = _copy(written, tmp_path)
    last = sorted(root.glob("*.wal"))[-1]
    with pytest.raises(InvalidInput, match="last segment"):
        compress_sealed_segment(root, int(last.stem))
    with pytest.raises(InvalidInput, match="no segment"):
        compress_sealed_segment(root, 10**9)
    first = _sealed(root)[0]
    j = Journal.open_sync(root, CFG)
    try:
        with pytest.raises(InUse):
            compress_sealed_segment(root, first)
    finally:
        j.close_sync()
    compress_sealed_segment(root, first)
    with pytest.raises(InvalidInput, match="compressed already"):
        compress_sealed_segment(root, first)


async def test_a_crash_mid_swap_reopens_cleanly(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, before = _copy(written, tmp_path)
    a, b = _sealed(root)[:2]
    seg_a, idx_a = root / f"{a:020d}.wal", root / f"{a:020d}.idx"
    # killed while writing the temporary file: the segment is intact, the tmp goes
    (root / f"{a:020d}.wal.z-tmp").write_bytes(MAGIC + b"\1" * 100)
    # killed after the rename, before the unlink of the index: a stale index stays
    idx_b = (root / f"{b:020d}.idx").read_bytes()
    compress_sealed_segment(root, b, **SMALL)
    (root / f"{b:020d}.idx").write_bytes(idx_b)
    assert await _reading(root) == before
    assert not list(root.glob("*.z-tmp"))
    assert not (root / f"{b:020d}.idx").exists()
    assert seg_a.read_bytes()[:4] == b"EGWJ"
    assert idx_a.exists()


async def test_retention_deletes_shipped_compressed_segments(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, _ = _copy(written, tmp_path)
    sealed = _sealed(root)
    for base in sealed[:3]:
        compress_sealed_segment(root, base, **SMALL)
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)
    j = Journal.open_sync(root, cfg)
    try:
        before = j.statistics()
        j.read("t", 2, 0)  # frames of the first segment in the cache
        sizes = [(root / f"{b:020d}.wal").stat().st_size for b in sealed[:2]]
        j.set_safe_lsn(sealed[2])  # the first two are shipped
        after = j.statistics()
        assert after.compressed_segments == before.compressed_segments - 2
        assert after.bytes == before.bytes - sum(sizes)
        assert after.first_lsn == sealed[2]
        assert not (root / f"{sealed[0]:020d}.wal").exists()
        # the partitions' earliest offsets moved to the next segment, which still reads
        first = j.first_offset("t", 2)
        assert first > 0
        assert j.read("t", 2, first)[0].base_offset <= first
        assert j.read_entries(sealed[2])[0].lsn == sealed[2] + 1
    finally:
        j.close_sync()


def test_damage_in_a_compressed_segment_is_corrupt_data_naming_the_file(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, _ = _copy(written, tmp_path)
    base = _sealed(root)[0]
    path = compress_sealed_segment(root, base, **SMALL).path
    good = path.read_bytes()

    # a frame's byte, an entry table's byte: the open reads only the directory,
    # the read that meets the damage says so
    chunk = CompressedSegment(good).directory.chunks[0]
    for at in (40, chunk.meta_offset + chunk.meta_stored // 2):
        bad = bytearray(good)
        bad[at] ^= 0x10
        path.write_bytes(bad)
        j = Journal.open_sync(root, CFG)
        try:
            with pytest.raises(CorruptData) as info:
                _read_everything(j)
            assert str(path) in str(info.value)
            with pytest.raises(CorruptData) as info:
                j.read_entries(base, max_bytes=1 << 30)
            assert str(path) in str(info.value)
        finally:
            j.close_sync()

    # the directory, the trailer: what follows the checkpoint is quarantined (named in
    # lost.log; test_compressed_quarantine.py); a cut file (no directory that checks, so
    # no checkpoint): the open stops, naming the file
    for damaged in (good[:-30] + bytes([good[-30] ^ 1]) + good[-29:], good[:-1] + b"X"):
        path.write_bytes(damaged)
        j = Journal.open_sync(root, CFG)
        try:
            [loss] = j.losses()  # recorded once
            assert (loss.segment, loss.lsn_first) == (base, base + 1)
        finally:
            j.close_sync()
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(CorruptData) as info:
        Journal.open_sync(root, CFG)
    assert str(path) in str(info.value)
    # not a zstd or struct error from deep inside: the journal's own error, with its reason
    assert info.value.reason


async def test_the_shipper_ships_compressed_segments_as_it_ships_entry_logs(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    plain, _ = _copy(written, tmp_path / "plain")
    packed, _ = _copy(written, tmp_path / "packed")
    for base in _sealed(packed)[1::2]:
        compress_sealed_segment(packed, base, **SMALL)
    fast = ShipperConfig(
        flush_interval_ms=20, manifest_every=3, retry_base_s=0.01, retry_cap_s=0.05
    )
    shipped: list[dict[tuple[str, int], list[tuple[Any, ...]]]] = []
    for root in (plain, packed):
        bucket = await LocalBucket.open(tmp_path / f"bucket-{root.parent.name}", create=True)
        j = Journal.open_sync(root, CFG)
        try:
            s = Shipper(j, bucket, "north", config=fast)
            await s.claim()
            await s.ship_pending()
            assert s.shipped_lsn == j.next_lsn - 1
            shipped.append(await _log_records(bucket))
        finally:
            j.close_sync()
            await bucket.aclose()
    assert shipped[0] == shipped[1]
    # and what was shipped is what the journal holds, record for record
    j = Journal.open_sync(packed, CFG)
    try:
        for t, p in j.partitions():
            if t != "t":
                continue
            records = [
                (r.offset, r.key, r.value, r.timestamp, r.headers)
                for e in j.read(t, p, 0, max_records=10**6, max_bytes=1 << 30)
                for r in _records(e)
            ]
            assert shipped[1][(t, p)] == records
        assert ("south.m", 0) not in shipped[1]  # mirror entries belong to other regions' logs
    finally:
        j.close_sync()


def _read_everything(j: Journal) -> None:
    for t, p in j.partitions():
        j.read(t, p, j.first_offset(t, p), max_records=10**6, max_bytes=1 << 30)


def _records(e: Entry) -> list[Any]:
    from edge_gateway.format.batch import decode_batch

    return decode_batch(e.payload).records()


async def _log_records(bucket: LocalBucket) -> dict[tuple[str, int], list[tuple[Any, ...]]]:
    head = await find_head(bucket, "", "north")
    out: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    for seq in range(1, head + 1):
        key = log_key("", "north", seq)
        data = (await bucket.get(key)).data
        header = logobject.decode_header(
            data[: logobject.header_length_hint(data[:12], where=key)], where=key
        )
        for b in header.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.offset + b.stored_length], where=key)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                out.setdefault((b.topic, b.partition), []).extend(
                    (r.offset, r.key, r.value, r.timestamp, r.headers) for r in batch.records()
                )
    return out


def test_a_drop_oldest_lane_drops_a_compressed_segment_as_it_drops_an_entry_log(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    plain, _ = _copy(written, tmp_path / "plain")
    packed, _ = _copy(written, tmp_path / "packed")
    for base in _sealed(packed)[:2]:
        compress_sealed_segment(packed, base, **SMALL)
    dropped = []
    for root in (plain, packed):
        j = Journal.open_sync(root, CFG, drop_oldest=True)
        try:
            j.set_safe_lsn(_sealed(root)[0] + 10)  # part of the first segment is shipped
            assert j.shed(1) > 0
            assert j.shed(1) > 0
            drops = [dataclasses.replace(d, time_ms=0) for d in j.dropped()]
            assert len(drops) == 2
            assert all(d.ranges for d in drops)
            dropped.append((drops, {(t, p): j.first_offset(t, p) for t, p in j.partitions()}))
        finally:
            j.close_sync()
    # the same records, offsets and journal bytes reported (a compressed segment
    # reports the bytes its entries had as journal entries)
    assert dropped[0] == dropped[1]


def test_edgegw_journal_verify_passes_on_a_journal_with_compressed_segments(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    from edgegw_cli.app import app
    from typer.testing import CliRunner

    data = tmp_path / "data"
    root = data / "journal"
    shutil.copytree(written[0], root, ignore=shutil.ignore_patterns("*.lock", "lock"))
    for base in _sealed(root)[::2]:
        compress_sealed_segment(root, base, **SMALL)
    res = CliRunner().invoke(app, ["journal", "verify", "--data-dir", str(data), "--json"])
    assert res.exit_code == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["ok"]
    assert sum("EGWC" in json.dumps(f) for f in report["files"]) == len(_sealed(root)[::2])


def test_the_block_cache_is_the_configured_size(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    from edge_gateway.config import parse_config

    doc = {"region": "north", "journal": {"block_cache_bytes": "8MiB"}}
    assert parse_config(doc, env={}).journal.block_cache_bytes == 8 * 1024 * 1024
    root, _ = _copy(written, tmp_path)
    compress_sealed_segment(root, _sealed(root)[0], **SMALL)
    for size, kept in ((0, False), (1 << 20, True)):
        j = Journal.open_sync(root, dataclasses.replace(CFG, block_cache_bytes=size))
        try:
            first = j.read("t", 3, 0, max_records=1)
            assert j.read("t", 3, 0, max_records=1) == first
            stats = j.statistics()
            assert (stats.block_cache_hits > 0, stats.block_cache_bytes > 0) == (kept, kept)
            assert stats.block_cache_bytes <= size
        finally:
            j.close_sync()


def test_positions_of_compressed_segments_are_loaded_on_demand_and_bounded(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    from edge_gateway.journal._segment_set import POSITIONS_KEPT

    root, _ = _copy(written, tmp_path)
    sealed = _sealed(root)
    for base in sealed:
        compress_sealed_segment(root, base, chunk_raw_bytes=4000)
    assert len(sealed) > POSITIONS_KEPT
    j = Journal.open_sync(root, CFG)
    try:
        files = [s.compressed for s in j._segments if s.compressed is not None]
        assert len(files) == len(sealed)
        assert all(f.positions is None for f in files)  # the open read no entry table
        before = j.index_memory()
        for base in sealed:
            j.read_entry(base + 1)
        assert sum(f.positions is not None for f in files) == POSITIONS_KEPT
        assert j.index_memory() > before
        # reads by offset through every compressed segment keep a few entry tables
        _read_everything(j)
        cache = j._segment_set.chunk_cache
        assert len(cache) > 0
        assert cache.entries <= cache.capacity
    finally:
        j.close_sync()


def test_a_compressed_last_segment_is_expanded_at_open_to_append_to(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, before = _copy(written, tmp_path)
    last_sealed = _sealed(root)[-1]
    original = (root / f"{last_sealed:020d}.wal").read_bytes()
    path = compress_sealed_segment(root, last_sealed, **SMALL).path
    active = sorted(root.glob("*.wal"))[-1]
    active.unlink()  # the segment after it moved aside
    j = Journal.open_sync(root, CFG)
    try:
        # the entry log it replaced, byte for byte (then the active segment's
        # preallocated space): the journal appends after it
        assert path.read_bytes()[: len(original)] == original
        assert not list(root.glob("*.z-tmp"))
        end = j.next_lsn
        for lsn in range(before["lsns"][0], end):
            assert _e(j.read_entry(lsn)) == before["entries"][lsn - before["lsns"][0]]
        res = j.append_nowait("t", 0, _batch(0, j.next_offset("t", 0), 1))
        assert res.lsn == end
    finally:
        j.close_sync()


def test_the_entry_table_cache_is_bounded_by_entries_and_keeps_the_newest() -> None:
    """Many small tables fit where few large ones do; one larger than the bound is kept
    alone (the read that loaded it is served from it), then dropped for the next."""
    from edge_gateway.journal._compressed import ChunkCache, ChunkView

    def view(n: int) -> ChunkView:
        # only the entries' count matters to the cache
        return ChunkView(0, SimpleNamespace(kinds=bytes(n)), [], {})  # type: ignore[arg-type]

    files = [object() for _ in range(40)]
    cache = ChunkCache(capacity=1000)
    loads = 0

    def get(i: int, n: int) -> ChunkView:
        def load() -> ChunkView:
            nonlocal loads
            loads += 1
            return view(n)

        return cache.get(files[i], 0, -1, load)  # type: ignore[arg-type]

    for i in range(30):
        get(i, 30)
    assert (len(cache), cache.entries, loads) == (30, 900, 30)
    for i in range(30):  # all held: no table decoded again
        get(i, 30)
    assert loads == 30
    get(30, 300)  # over the bound: the least recently used go first
    assert cache.entries <= 1000
    assert len(cache) == 1 + 700 // 30
    get(31, 5000)  # larger than the bound: kept alone
    assert (len(cache), cache.entries) == (1, 5000)
    get(32, 10)
    assert (len(cache), cache.entries) == (1, 10)
    cache.forget(files[32])  # type: ignore[arg-type]
    assert (len(cache), cache.entries) == (0, 0)


def test_a_read_that_starts_in_a_frame_decodes_that_frames_entries_only(
    written: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """A cold read by offset walks the entries of the frame it starts in, not the chunk's
    whole table; a read that moves on to the next frame decodes the whole table once.
    Both give exactly what the entry log gave."""
    from edge_gateway.journal._compressed import ChunkCache

    plain, _ = _copy(written, tmp_path / "plain")
    root, _ = _copy(written, tmp_path / "z")
    for base in _sealed(root):
        compress_sealed_segment(root, base, frame_raw_bytes=1500, chunk_raw_bytes=1 << 20)
    j = Journal.open_sync(root, CFG)
    j0 = Journal.open_sync(plain, CFG)
    sset = j._segment_set
    try:
        partial = 0
        for t, p in j.partitions():
            lo, hi = j.first_offset(t, p), j.next_offset(t, p)
            for o in range(lo, hi, 3):
                sset.chunk_cache = cache = ChunkCache()  # cold
                got = j.read(t, p, o, max_records=1, max_bytes=1)
                assert _es(got) == _es(j0.read(t, p, o, max_records=1, max_bytes=1)), (t, p, o)
                cf = sset.locate(got[0].lsn)[0].compressed
                if cf is not None:
                    chunks = range(len(cf.directory.chunks))
                    assert all(cache.peek(cf, ci, -1) is None for ci in chunks)
                    partial += 1
            sset.chunk_cache = cache = ChunkCache()
            everything = j.read(t, p, lo, max_records=10**6, max_bytes=1 << 30)
            assert _es(everything) == _es(j0.read(t, p, lo, max_records=10**6, max_bytes=1 << 30))
            assert any(k[2] == -1 for k in cache._items)  # moved on: whole tables
        assert partial > 50
    finally:
        j.close_sync()
        j0.close_sync()


async def test_a_bounded_number_of_directories_is_kept_and_the_others_are_read_again(
    written: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory costs memory per frame: only the most recently used are kept decoded."""
    from edge_gateway.journal import _compressed

    monkeypatch.setattr(_compressed.DIRECTORIES, "capacity", 2)
    root, before = _copy(written, tmp_path)
    sealed = _sealed(root)
    for base in sealed:
        compress_sealed_segment(root, base, **SMALL)
    assert len(sealed) > 2
    after = await _reading(root)
    for key in before:
        assert after[key] == before[key], key
    j = Journal.open_sync(root, CFG)
    try:
        files = [s.compressed for s in j._segments if s.compressed is not None]
        assert len(files) == len(sealed)
        assert sum(f._loaded is not None for f in files) <= 2
        # sizes, LSNs and the budget come from each segment's summary, not its directory
        assert [s.end_lsn for s in j._segments[:-1]] == [*sealed[1:], j._segments[-1].base_lsn]
        assert sum(f._loaded is not None for f in files) <= 2
        _read_everything(j)
        assert sum(f._loaded is not None for f in files) <= 2
        assert len(_compressed.DIRECTORIES) <= 2
    finally:
        j.close_sync()


def test_a_directory_read_again_from_a_replaced_file_is_corrupt_data(
    written: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge_gateway.journal import _compressed

    monkeypatch.setattr(_compressed.DIRECTORIES, "capacity", 1)
    root, _ = _copy(written, tmp_path)
    sealed = _sealed(root)
    for base in sealed:
        compress_sealed_segment(root, base, **SMALL)
    j = Journal.open_sync(root, CFG)
    try:
        first = j._segments[0].compressed
        assert first is not None
        assert first._loaded is None  # the later segments' directories pushed it out
        path = root / f"{sealed[0]:020d}.wal"
        path.write_bytes((root / f"{sealed[1]:020d}.wal").read_bytes())
        with pytest.raises(CorruptData, match=path.name):
            first.directory  # noqa: B018 - the read is the test
    finally:
        j.close_sync()
