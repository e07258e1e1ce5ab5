"""The live repair of a damaged sealed segment (``journal/_live_repair.py``), without a bucket.

A running journal; its entries' batches are served back as the shipper
ships them (each partition's batches, byte for byte, per LSN range) by an
in-memory source; the real bucket and processes run in
``tests/system/test_live_repair_system.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from edge_gateway.errors import CorruptData, RepairPending, Unavailable
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import encode_batch, iter_batches
from edge_gateway.journal import Journal, JournalConfig, ShippedObject
from edge_gateway.journal._live_repair import ATTEMPTS_NAME, MAX_ATTEMPTS, load_attempts
from edge_gateway.journal._repair import load_repairs

SMALL = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024)
PARTS = [("a", 0), ("b", 0), ("a", 1)]


class Source:
    """The journal's DATA entries as log objects of ``per`` LSNs each."""

    def __init__(self, entries: Sequence[fentry.Entry], per: int = 7) -> None:
        self.entries = [e for e in entries if e.kind == fentry.KIND_DATA]
        self.per = per
        self.calls = 0

    def shipped(self, first_lsn: int, last_lsn: int) -> Sequence[ShippedObject]:
        self.calls += 1
        out = []
        lo = first_lsn - (first_lsn - 1) % self.per
        while lo <= last_lsn:
            hi = lo + self.per - 1
            batches: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
            for e in self.entries:
                if lo <= e.lsn <= hi:
                    batches.setdefault((e.topic, e.partition), []).append(
                        (e.base_offset, bytes(e.payload))
                    )
            out.append(ShippedObject(f"obj-{lo}", lo, hi, 0, batches))
            lo = hi + 1
        return out


class Refusing:
    def __init__(self) -> None:
        self.calls = 0

    def shipped(self, first_lsn: int, last_lsn: int) -> Sequence[ShippedObject]:
        self.calls += 1
        return []  # the bucket answers, without the range


class Away:
    def shipped(self, first_lsn: int, last_lsn: int) -> Sequence[ShippedObject]:
        raise Unavailable("the bucket is out of reach (test)")


def _fill(j: Journal, n: int = 240) -> dict[tuple[str, int], list[bytes]]:
    """``n`` appends over three partitions; each partition's records' values."""
    values: dict[tuple[str, int], list[bytes]] = {}
    for i in range(n):
        topic, partition = PARTS[i % len(PARTS)]
        vals = [f"{topic}/{partition}#{i}-{k}".encode() * 40 for k in range(1 + i % 4)]
        j.append_nowait(topic, partition, encode_batch(vals, timestamps=1_000 + i))
        values.setdefault((topic, partition), []).extend(vals)
    return values


def _records(j: Journal) -> dict[tuple[str, int], list[bytes]]:
    out: dict[tuple[str, int], list[bytes]] = {}
    for topic, partition in PARTS:
        got: list[bytes] = []
        offset = 0
        while entries := j.read(topic, partition, offset):
            for e in entries:
                for b in iter_batches(e.payload, where="test"):
                    for r in b.records(offset):
                        got.append(bytes(r.value or b""))
                        offset = r.offset + 1
        out[(topic, partition)] = got
    return out


def _all_entries(j: Journal) -> list[fentry.Entry]:
    return j.read_entries(1, max_bytes=1 << 30, durable_only=False)


def _shipped(root: Path, lsn: int) -> None:
    (root / "shipper.json").write_text(json.dumps({"log_lsn": lsn}))


def _flip(path: Path, at: int) -> None:
    buf = bytearray(path.read_bytes())
    buf[at] ^= 0x5A
    path.write_bytes(bytes(buf))


async def _open_damaged(
    tmp_path: Path, *, compressed: bool, at_end: bool = False
) -> tuple[Journal, Source, dict]:
    root = tmp_path / "journal"
    j = Journal.open_sync(root, SMALL)
    values = _fill(j)
    assert len(j._segments) >= 3
    entries = _all_entries(j)
    _shipped(root, j.next_lsn - 1)
    if compressed:
        j.rewriter.in_child = False
        assert await j.rewriter.rewrite_all() >= 2
    seg = j._segments[1]
    assert (seg.compressed is not None) is compressed
    # a byte in the middle of the sealed segment: an entry's payload, or a frame
    at = seg.size // 2
    if seg.compressed is not None and not at_end:  # the middle frame (not the tables)
        frames = seg.compressed.directory.frames
        mid = frames[len(frames) // 2]
        at = mid.offset + mid.stored_length // 2
    if at_end and seg.compressed is not None:  # the last frame (not the directory after it)
        last = seg.compressed.directory.frames[-1]
        at = last.offset + last.stored_length // 2
    elif at_end:
        at = seg.size - 20  # the last entry's payload
    _flip(seg.path, at)
    j._segment_set.close_reads()  # the page cache has the flip; no stale descriptor
    return j, Source(entries), values


@pytest.mark.parametrize("compressed", [False, True])
async def test_damage_is_repair_pending_then_repaired_bit_for_bit(
    tmp_path: Path, compressed: bool
) -> None:
    j, source, values = await _open_damaged(tmp_path, compressed=compressed)
    seg = j._segments[1]
    # without a source the read says what it is: corrupt data
    with pytest.raises(CorruptData) as plain:
        _records(j)
    assert not isinstance(plain.value, RepairPending)
    j.live_repair.attach(lambda: source)
    with pytest.raises(RepairPending):
        _records(j)
    assert j.live_repair.statistics().pending == (seg.base_lsn,)
    assert await j.live_repair.repair(seg.base_lsn)
    assert source.calls >= 1
    stats = j.live_repair.statistics()
    assert (stats.pending, stats.segments_repaired) == ((), 1)
    assert stats.ranges_repaired >= 1
    assert seg.compressed is None
    assert seg.index is not None
    assert _records(j) == values
    assert seg.index_path.exists()
    repairs = load_repairs(j.path)
    assert repairs
    assert repairs == j.repairs()
    assert (j.path.parent / repairs[0].copy).exists()
    copies = sorted(p.name for p in (j.path.parent / "quarantine").glob("*.damaged"))
    assert len(copies) == (2 if compressed else 1)  # a compressed one's file as it was too
    if compressed:  # the rewriter compresses it again
        assert await j.rewriter.rewrite_all() == 1
        assert seg.compressed is not None
        assert _records(j) == values
    await j.aclose()
    # the next open finds every segment sound (no loss, no second repair)
    j = Journal.open_sync(j.path, SMALL)
    try:
        assert _records(j) == values
        assert j.losses() == []
        assert len(j.repairs()) == len(repairs)
    finally:
        j.close_sync()


@pytest.mark.parametrize("compressed", [False, True])
async def test_damage_to_the_end_of_a_sealed_segment_is_bounded_by_the_next(
    tmp_path: Path, compressed: bool
) -> None:
    """The damage takes the segment's last entry (or its one frame): no intact entry
    follows it in the segment, and the next segment's checkpoint bounds the lost offsets."""
    j, source, values = await _open_damaged(tmp_path, compressed=compressed, at_end=True)
    seg = j._segments[1]
    j.live_repair.attach(lambda: source)
    assert j.live_repair.report(seg.path)
    assert await j.live_repair.repair(seg.base_lsn)
    assert j.live_repair.statistics().segments_repaired == 1
    assert _records(j) == values
    await j.aclose()


async def test_a_range_the_bucket_cannot_give_is_tried_a_few_times_then_given_up(
    tmp_path: Path,
) -> None:
    j, _, _ = await _open_damaged(tmp_path, compressed=False)
    seg = j._segments[1]
    refusing = Refusing()
    j.live_repair.attach(lambda: refusing)
    assert j.live_repair.report(seg.path)
    for n in range(1, MAX_ATTEMPTS + 1):
        assert not await j.live_repair.repair(seg.base_lsn)
        assert load_attempts(j.path)[seg.base_lsn].failures == n  # persisted
    assert refusing.calls == MAX_ATTEMPTS
    stats = j.live_repair.statistics()
    assert stats.pending == ()
    assert stats.given_up == (seg.base_lsn,)
    # given up: not pending again, reads say corrupt_data, no new fetch
    assert not j.live_repair.report(seg.path)
    with pytest.raises(CorruptData) as got:
        _records(j)
    assert not isinstance(got.value, RepairPending)
    assert refusing.calls == MAX_ATTEMPTS
    assert not list(j.path.glob("*.r-tmp"))
    await j.aclose()
    # a restart remembers it (the file), so the live repair does not start over
    j = Journal.open_sync(j.path, SMALL, repair=None)
    try:
        assert not (j.path / ATTEMPTS_NAME).exists() or (
            load_attempts(j.path)[seg.base_lsn].failures == MAX_ATTEMPTS
        )
    finally:
        j.close_sync()


async def test_a_bucket_out_of_reach_backs_off_without_giving_up(tmp_path: Path) -> None:
    j, source, values = await _open_damaged(tmp_path, compressed=False)
    seg = j._segments[1]
    j.live_repair.attach(Away)
    assert j.live_repair.report(seg.path)
    for _ in range(MAX_ATTEMPTS + 2):
        assert not await j.live_repair.repair(seg.base_lsn)
    a = load_attempts(j.path)[seg.base_lsn]
    assert (a.failures, a.unavailable) == (0, MAX_ATTEMPTS + 2)
    assert a.next_ms > 0
    assert j.live_repair.statistics().pending == (seg.base_lsn,)
    # the bucket is back
    j.live_repair.attach(lambda: source)
    assert await j.live_repair.repair(seg.base_lsn)
    assert _records(j) == values
    assert seg.base_lsn not in load_attempts(j.path)
    await j.aclose()


def test_a_flipped_digit_in_the_attempts_file_is_found_not_trusted(tmp_path: Path) -> None:
    """The file carries a crc32c (statefile.seal): a digit flipped in valid JSON is not
    read as fewer failures; the file is ignored and the attempts start again."""
    from edge_gateway.journal._live_repair import _Attempts, _save_attempts

    _save_attempts(tmp_path, {7: _Attempts(3, 0, 1234, "no such object")})
    path = tmp_path / ATTEMPTS_NAME
    assert load_attempts(tmp_path)[7].failures == 3
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"failures":3', b'"failures":2'))
    assert path.read_bytes() != data
    assert load_attempts(tmp_path) == {}


async def test_an_unshipped_segment_is_not_pending(tmp_path: Path) -> None:
    j, source, _ = await _open_damaged(tmp_path, compressed=False)
    seg = j._segments[1]
    _shipped(j.path, seg.base_lsn)  # the bucket has not got the whole segment
    j.live_repair.attach(lambda: source)
    assert not j.live_repair.report(seg.path)
    with pytest.raises(CorruptData) as got:
        _records(j)
    assert not isinstance(got.value, RepairPending)
    await j.aclose()


async def test_a_range_quarantined_at_open_is_repaired_once_its_segment_is_sealed(
    tmp_path: Path,
) -> None:
    """Issue 45 step 2: the bucket away at open (no source): the damage in the last
    segment is quarantined, ``repairable``; once the segment is sealed and the bucket
    is back, the checkpoints holding the lost LSNs are replaced by the rebuilt entries."""
    root = tmp_path / "journal"
    j = Journal.open_sync(root, SMALL)
    values = _fill(j)
    entries = _all_entries(j)
    j.close_sync()
    _shipped(root, entries[-1].lsn)
    last = max(root.glob("*.wal"))
    _flip(last, last.stat().st_size // 2)
    j = Journal.open_sync(root, SMALL)  # no repair source: quarantined
    try:
        [loss] = j.losses()
        assert loss.repairable is True
        assert loss.records > 0
        assert _records(j) != values  # a gap
        j.live_repair.attach(lambda: Source(entries))
        j.live_repair._mark_losses()
        assert j.live_repair.statistics().pending == ()  # not sealed yet
        more = _fill(j, 240)  # rolls: the quarantined segment is sealed
        assert int(last.stem) != j._segments[-1].base_lsn
        _shipped(root, j.next_lsn - 1)
        j.live_repair._mark_losses()
        assert j.live_repair.statistics().pending == (loss.segment,)
        assert await j.live_repair.repair(loss.segment)
        want = {k: values[k] + more[k] for k in values}
        assert _records(j) == want
        [rep] = j.repairs()
        assert (rep.segment, rep.lsn_first, rep.lsn_last) == (
            loss.segment,
            loss.lsn_first,
            loss.lsn_last,
        )
        assert rep.records == loss.records
    finally:
        await j.aclose()
    j = Journal.open_sync(root, SMALL)
    try:
        assert _records(j) == want
        j.live_repair.attach(lambda: Source(entries))
        j.live_repair._mark_losses()  # repaired already: not again
        assert j.live_repair.statistics().pending == ()
    finally:
        j.close_sync()
