"""Damaged mirror entries re-fetched from the source region's log (``journal/_mirror_repair.py``).

In process, on a local bucket: a real shipper writes region ``a``'s log, a
real tailer mirrors its topic ``t`` into region ``b``'s journal (blocks kept,
and per batch); then entries of the mirror are zeroed. The gateway with real
processes and moto: ``tests/system/test_mirror_repair_system.py``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from edge_gateway.bucket import LocalBucket
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.journal._mirror_repair import mirror_range, rebuild_mirrored
from edge_gateway.journal._recovery import DamagedEntry, next_valid_entry, scan_segment
from edge_gateway.journal._repair import NotRebuilt
from edge_gateway.mirror import Tailer, TailerConfig
from edge_gateway.mirror_repair import MirrorRepairSource, read_mirrored
from edge_gateway.shipper import Shipper, ShipperConfig

BIG = JournalConfig(segment_bytes=16 * 1024 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)
SHIP = ShipperConfig(flush_interval_ms=20, manifest_every=4, retry_base_s=0.01, retry_cap_s=0.05)
QUICK = TailerConfig(poll_interval_s=0.01, max_poll_interval_s=0.05, retry_base_s=0.01)


@pytest.fixture
async def bucket(tmp_path: Path) -> AsyncIterator[LocalBucket]:
    b = await LocalBucket.open(tmp_path / "bucket", create=True)
    try:
        yield b
    finally:
        await b.aclose()


def _batch(partition: int, first: int, n: int, rnd: random.Random) -> bytes:
    offsets = range(first, first + n)
    return encode_batch(
        [None if o % 7 == 3 else rnd.randbytes(rnd.randrange(0, 90)) for o in offsets],
        keys=[None if o % 3 == 0 else b"k%d" % o for o in offsets],
        timestamps=[1_700_000_000_000 + 7 * o + partition for o in offsets],
        headers=[() if o % 2 else (("h", b"%d" % o),) for o in offsets],
        base_offset=first,
    )


async def _mirror(bucket: LocalBucket, tmp_path: Path, *, keep_blocks: bool) -> Path:
    """Region ``a`` ships 12 objects of topic t (3 partitions) and u; ``b`` mirrors t."""
    rnd = random.Random(45)
    src = Journal.open_sync(tmp_path / "a", BIG)
    try:
        s = Shipper(src, bucket, "a", config=SHIP)
        await s.claim()
        for i in range(12):
            for p in range(3):
                for _ in range(1 + (i + p) % 3):
                    first = src.next_offset("t", p)
                    src.append_nowait("t", p, _batch(p, first, 1 + rnd.randrange(6), rnd))
            src.append_nowait("u", 0, _batch(0, src.next_offset("u", 0), 2, rnd))
            await s.ship_pending()
    finally:
        src.close_sync()
    j = Journal.open_sync(tmp_path / "b" / "journal", BIG)
    try:
        cfg = dataclasses.replace(QUICK, keep_blocks=keep_blocks)
        await Tailer(j, bucket, "a", ["t"], "b", cfg).catch_up()
    finally:
        j.close_sync()
    # the last segment (the first block entry rolls to a version 3 segment)
    return sorted((tmp_path / "b" / "journal").glob("*.wal"))[-1]


def _entries(buf: bytes) -> list[tuple[int, atrest.AnyEntry]]:
    out = []
    pos = fentry.SEGMENT_HEADER_SIZE
    while pos < len(buf) and not fentry.is_zero_tail(buf, pos):
        e = atrest.decode_any_entry(buf, pos)
        out.append((pos, e))
        pos += e.length
    return out


def _zero(seg: Path, entries: list[tuple[int, atrest.AnyEntry]], k: int, n: int) -> DamagedEntry:
    """Zero entries ``k..k+n-1`` (all but their length field) and scan."""
    buf = bytearray(seg.read_bytes())
    start = entries[k][0] + 4
    end = entries[k + n - 1][0] + entries[k + n - 1][1].length
    buf[start:end] = bytes(end - start)
    seg.write_bytes(bytes(buf))
    with pytest.raises(DamagedEntry) as got:
        scan_segment(int(seg.stem), seg, last=True)
    return got.value


def _same(e: atrest.AnyEntry) -> atrest.AnyEntry:
    """An entry as a rebuild must give it back: all but its append time."""
    return dataclasses.replace(e, append_time=0)


def _records(j: Journal) -> dict[int, list[tuple[int, bytes]]]:
    return {
        p: [
            (e.base_offset, bytes(e.payload))
            for e in j.read("a.t", p, 0, max_records=100_000, max_bytes=1 << 26)
        ]
        for p in range(3)
    }


def _inside_one_object(entries: list[tuple[int, atrest.AnyEntry]]) -> int:
    """An entry whose neighbours are entries of the same source object."""
    for k in range(2, len(entries) - 1):
        seqs = {getattr(entries[i][1].source, "seq", None) for i in (k - 1, k, k + 1)}
        if len(seqs) == 1 and None not in seqs:
            return k
    raise AssertionError("no object with three entries")


@pytest.mark.parametrize("where", ["across-objects", "inside-one-object"])
@pytest.mark.parametrize("keep_blocks", [True, False], ids=["blocks", "batches"])
async def test_lost_mirror_entries_come_back_as_the_tailer_appended_them(
    bucket: LocalBucket, tmp_path: Path, keep_blocks: bool, where: str
) -> None:
    seg = await _mirror(bucket, tmp_path, keep_blocks=keep_blocks)
    original = seg.read_bytes()
    entries = _entries(original)
    kinds = {type(e).__name__ if isinstance(e, atrest.BlockEntry) else e.kind for _, e in entries}
    assert ("BlockEntry" in kinds) is keep_blocks
    if where == "across-objects":  # from the middle of one object's entries to a later one's
        k, n = 5, len(entries) // 2
    else:  # the source coordinates before and after the damage are the same
        k, n = _inside_one_object(entries), 1
    damage = _zero(seg, entries, k, n)
    buf = seg.read_bytes()
    resync = next_valid_entry(buf, damage.pos, damage.lsn)
    assert resync is not None
    span = mirror_range(buf, damage, resync, last=True, next_checkpoint=None)
    assert span is not None
    assert span.region == "a"
    lost_seqs = {e.source.seq for _, e in entries[k : k + n] if e.source is not None}
    assert set(range(span.first_seq, span.last_seq + 1)) >= lost_seqs
    objects = await read_mirrored(bucket, "", "a", span.first_seq, span.last_seq)
    got = rebuild_mirrored(buf, damage, resync, span, objects, keep_blocks=keep_blocks, last=True)
    assert got is not None
    assert got.entries == n
    back = _entries(buf[: damage.pos] + got.data + buf[resync:])
    assert [_same(e) for _, e in back] == [_same(e) for _, e in entries]
    # the append time: never earlier than the true one (retention keeps them)
    assert all(b.append_time >= e.append_time for (_, b), (_, e) in zip(back, entries, strict=True))
    assert got.objects == tuple(log_key("", "a", s) for s in sorted(lost_seqs))


async def test_an_open_repairs_mirror_entries_and_a_collected_source_object_is_reported_lost(
    bucket: LocalBucket, tmp_path: Path
) -> None:
    seg = await _mirror(bucket, tmp_path, keep_blocks=True)
    path = seg.parent
    j = Journal.open_sync(path, BIG)
    want = _records(j)
    j.close_sync()
    original = seg.read_bytes()
    entries = _entries(original)
    _zero(seg, entries, 4, 6)
    source = MirrorRepairSource(bucket, "", "b", keep_blocks=True)
    j = await trio.to_thread.run_sync(lambda: Journal.open_sync(path, BIG, repair=source))
    try:
        [rep] = j.repairs()
        assert not j.losses()
        assert rep.entries == 6
        assert all(o.startswith("regions/a/log/") for o in rep.objects)
        assert _records(j) == want
    finally:
        j.close_sync()
    # the same damage again, its source object collected: quarantined, the range exact
    seg.write_bytes(original)
    damage = _zero(seg, entries, 4, 6)
    lost_seqs = sorted({e.source.seq for _, e in entries[4:10] if e.source is not None})
    await bucket.delete(log_key("", "a", lost_seqs[-1]))
    buf = seg.read_bytes()
    resync = next_valid_entry(buf, damage.pos, damage.lsn)
    assert resync is not None
    span = mirror_range(buf, damage, resync, last=True, next_checkpoint=None)
    assert span is not None
    with pytest.raises(Exception, match="collected"):
        await read_mirrored(bucket, "", "a", span.first_seq, span.last_seq)
    source = MirrorRepairSource(bucket, "", "b", keep_blocks=True)
    j = await trio.to_thread.run_sync(lambda: Journal.open_sync(path, BIG, repair=source))
    try:
        [loss] = j.losses()
        assert loss.repairable is True
        lost: dict[int, tuple[int, int]] = {}
        for _, e in entries[4:10]:
            assert isinstance(e, atrest.BlockEntry)
            lo, hi = lost.get(e.partition, (e.first_offset, e.last_offset))
            lost[e.partition] = (min(lo, e.first_offset), max(hi, e.last_offset))
        got = {r.partition: (r.first, r.last) for r in loss.ranges if r.records}
        assert got == lost
        assert all(r.exact for r in loss.ranges if r.records)
    finally:
        j.close_sync()


async def test_home_entries_lost_between_mirror_entries_are_not_taken_for_mirror_ones(
    bucket: LocalBucket, tmp_path: Path
) -> None:
    """Damage to home entries alone, with mirror entries of another seq after it: no mirror
    range (the home rebuild's case); damage over home and mirror entries: refused."""
    j = Journal.open_sync(tmp_path / "journal", BIG)
    rnd = random.Random(1)
    for i in range(12):
        if i % 4 == 3:
            mirrored = _batch(0, j.next_offset("a.t", 0), 2, rnd)
            await j.append_mirror("a.t", 0, mirrored, fentry.SourceCoords("a", i, 1))
        else:
            j.append_nowait("t", 0, encode_batch([b"h%d" % i], timestamps=i))
    j.close_sync()
    [seg] = (tmp_path / "journal").glob("*.wal")
    entries = _entries(seg.read_bytes())
    original = seg.read_bytes()
    damage = _zero(seg, entries, 5, 2)  # home entries between seq 3's and seq 7's
    buf = seg.read_bytes()
    resync = next_valid_entry(buf, damage.pos, damage.lsn)
    assert resync is not None
    assert mirror_range(buf, damage, resync, last=True, next_checkpoint=None) is None
    seg.write_bytes(original)
    damage = _zero(seg, entries, 7, 3)  # home, the mirror entry of seq 7, home
    buf = seg.read_bytes()
    resync = next_valid_entry(buf, damage.pos, damage.lsn)
    assert resync is not None
    span = mirror_range(buf, damage, resync, last=True, next_checkpoint=None)
    assert span is not None
    assert (span.first_seq, span.last_seq) == (4, 11)
    with pytest.raises(NotRebuilt):
        rebuild_mirrored(buf, damage, resync, span, [], keep_blocks=True, last=True)
