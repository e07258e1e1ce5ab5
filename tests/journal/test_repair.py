"""The rebuild of a damaged range from log objects (``journal/_repair.py``), without a bucket.

The objects are made from the journal's own entries as the shipper makes
them (each partition's batches, byte for byte, and the lane's LSN range);
the real bucket path runs in ``tests/system/test_journal_repair.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import Journal, JournalConfig, ShippedObject, SourceCoords
from edge_gateway.journal._recovery import DamagedEntry, scan_segment
from edge_gateway.journal._repair import NotRebuilt, load_repairs, rebuild, repair_damage

BIG = JournalConfig(segment_bytes=16 * 1024 * 1024, max_bytes=64 * 1024 * 1024)


def _write(tmp_path: Path, plan: Sequence[tuple[str, int]]) -> Path:
    """A journal with one entry per item of ``plan`` (topic, partition); its only segment."""
    j = Journal.open_sync(tmp_path / "journal", BIG)
    for i, (topic, partition) in enumerate(plan):
        values = [f"{topic}/{partition}#{i}-{k}".encode() * 8 for k in range(1 + i % 3)]
        values[0] = b""  # an empty value
        j.append_nowait(topic, partition, encode_batch(values, timestamps=1_000 + i))
    j.close_sync()
    [seg] = (tmp_path / "journal").glob("*.wal")
    return seg


def _entries(buf: bytes) -> list[tuple[int, fentry.Entry]]:
    out = []
    pos = fentry.SEGMENT_HEADER_SIZE
    while pos < len(buf) and not fentry.is_zero_tail(buf, pos):
        e = atrest.decode_any_entry(buf, pos)
        assert isinstance(e, fentry.Entry)
        out.append((pos, e))
        pos += e.length
    return out


def _objects(
    entries: list[tuple[int, fentry.Entry]], splits: Sequence[tuple[int, int]]
) -> list[ShippedObject]:
    """One object per LSN range in ``splits``, holding its DATA entries' batches."""
    out = []
    for first, last in splits:
        batches: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
        for _, e in entries:
            if first <= e.lsn <= last and e.kind == fentry.KIND_DATA:
                batches.setdefault((e.topic, e.partition), []).append(
                    (e.base_offset, bytes(e.payload))
                )
        out.append(ShippedObject(f"obj-{first}", first, last, 0, batches))
    return out


def _damage(
    seg: Path, entries: list[tuple[int, fentry.Entry]], k: int, n: int, *, last: bool = True
) -> DamagedEntry:
    """Zero entries ``k..k+n-1`` (their bytes, all but the first 4) and scan."""
    buf = bytearray(seg.read_bytes())
    start = entries[k][0] + 4
    end = entries[k + n - 1][0] + entries[k + n - 1][1].length
    buf[start:end] = bytes(end - start)
    seg.write_bytes(bytes(buf))
    with pytest.raises(DamagedEntry) as got:
        scan_segment(int(seg.stem), seg, last=last)
    return got.value


def _after(buf: bytes, damage: DamagedEntry, data: bytes, resync: int) -> list[fentry.Entry]:
    return [e for _, e in _entries(buf[: damage.pos] + data + buf[resync:])]


def test_one_partition_comes_back_entry_for_entry(tmp_path: Path) -> None:
    seg = _write(tmp_path, [("t", 0)] * 12)
    entries = _entries(seg.read_bytes())
    objects = _objects(entries, [(2, 6), (7, 13)])
    damage = _damage(seg, entries, 4, 5)
    buf = seg.read_bytes()
    got = rebuild(buf, damage, objects, last=True)
    assert (got.lsn_first, got.lsn_end, got.entries) == (entries[4][1].lsn, entries[9][1].lsn, 5)
    assert got.objects == ("obj-2", "obj-7")
    [r] = got.ranges
    assert (r.topic, r.partition, r.first, r.last) == (
        "t",
        0,
        entries[4][1].base_offset,
        entries[8][1].next_offset - 1,
    )
    for (_, want), back in zip(entries, _after(buf, damage, got.data, got.resync), strict=True):
        assert (back.lsn, back.kind, back.topic, back.partition) == (
            want.lsn,
            want.kind,
            want.topic,
            want.partition,
        )
        assert (back.base_offset, back.count, bytes(back.payload)) == (
            want.base_offset,
            want.count,
            bytes(want.payload),
        )
        assert back.append_time >= want.append_time  # never earlier: retention keeps it


def test_several_partitions_keep_their_records_and_the_objects_lsn_ranges(tmp_path: Path) -> None:
    plan = [("a", 0), ("b", 1), ("a", 0), ("a", 1), ("b", 1), ("a", 0), ("b", 1), ("a", 1)] * 2
    seg = _write(tmp_path, plan)
    entries = _entries(seg.read_bytes())
    objects = _objects(entries, [(2, 9), (10, 17)])
    damage = _damage(seg, entries, 3, 11)
    buf = seg.read_bytes()
    got = rebuild(buf, damage, objects, last=True)
    back = _after(buf, damage, got.data, got.resync)
    assert [e.lsn for e in back] == [e.lsn for _, e in entries]

    def by_partition(es: Sequence[fentry.Entry]) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
        out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
        for e in es:
            if e.kind == fentry.KIND_DATA:
                out.setdefault((e.topic, e.partition), []).append((e.base_offset, bytes(e.payload)))
        return out

    assert by_partition(back) == by_partition([e for _, e in entries])
    # each rebuilt entry sits in the LSN range of the object that shipped it
    for e in back[3:14]:
        obj = objects[0] if e.lsn <= 9 else objects[1]
        assert (e.base_offset, bytes(e.payload)) in obj.batches[(e.topic, e.partition)]


def test_what_the_objects_do_not_give_exactly_is_refused(tmp_path: Path) -> None:
    seg = _write(tmp_path, [("t", 0)] * 10)
    entries = _entries(seg.read_bytes())
    damage = _damage(seg, entries, 4, 3)
    buf = seg.read_bytes()
    missing = _objects(entries, [(2, 11)])
    missing[0].batches[("t", 0)].pop(5)  # one lost batch not in the bucket
    with pytest.raises(NotRebuilt, match="no batch"):
        rebuild(buf, damage, missing, last=True)
    # the lost range shipped in an object whose LSNs are too few for its batches
    few = _objects(entries, [(2, 11)])
    few = [ShippedObject("short", entries[4][1].lsn, entries[4][1].lsn, 0, few[0].batches)]
    with pytest.raises(NotRebuilt, match="more lost batches than LSNs"):
        rebuild(buf, damage, few, last=True)
    # two entries merged into one batch: it straddles the range's edge
    e3, e4 = entries[3][1], entries[4][1]
    merged = encode_batch([b"x"] * (e3.count + e4.count), timestamps=1, base_offset=e3.base_offset)
    straddle = [ShippedObject("merged", 2, 11, 0, {("t", 0): [(e3.base_offset, merged)]})]
    with pytest.raises(NotRebuilt, match="straddles"):
        rebuild(buf, damage, straddle, last=True)


class _Source:
    """Objects made from the journal's entries before the damage (see the module doc)."""

    def __init__(self, objects: list[ShippedObject]) -> None:
        self.objects = objects
        self.asked: list[tuple[int, int]] = []

    def shipped(self, first_lsn: int, last_lsn: int) -> Sequence[ShippedObject]:
        self.asked.append((first_lsn, last_lsn))
        return self.objects


def _shipped_through(seg: Path, lsn: int) -> None:
    (seg.parent / "shipper.json").write_text(json.dumps({"log_seq": 1, "log_lsn": lsn}))


def test_a_journal_open_repairs_shipped_damage_and_records_it_once(tmp_path: Path) -> None:
    seg = _write(tmp_path, [("t", 0)] * 10)
    original = seg.read_bytes()
    entries = _entries(original)
    source = _Source(_objects(entries, [(2, 11)]))
    damage = _damage(seg, entries, 4, 3)
    _shipped_through(seg, entries[-1][1].lsn)
    j = Journal.open_sync(tmp_path / "journal", BIG, repair=source)
    try:
        [rep] = j.repairs()
        assert not j.losses()
        assert source.asked == [(damage.lsn, damage.lsn + 2)]
        assert (rep.lsn_first, rep.lsn_last, rep.entries, rep.records) == (
            damage.lsn,
            damage.lsn + 2,
            3,
            sum(e.count for _, e in entries[4:7]),
        )
        got = j.read("t", 0, 0, max_records=10_000, max_bytes=1 << 24)
        want = [bytes(e.payload) for _, e in entries if e.kind == fentry.KIND_DATA]
        assert [bytes(e.payload) for e in got] == want
    finally:
        j.close_sync()
    assert load_repairs(tmp_path / "journal") == [rep]
    [report] = (tmp_path / "quarantine").glob("*-report.json")
    assert json.loads(report.read_text())["repaired"] is True
    copy = tmp_path / rep.copy
    assert copy.read_bytes() != original  # the damaged bytes, as they were
    # reopened: sound, nothing repaired twice
    j = Journal.open_sync(tmp_path / "journal", BIG, repair=source)
    assert j.repairs() == [rep]
    j.close_sync()
    assert len(source.asked) == 1


def test_an_unshipped_range_is_not_asked_for_and_is_quarantined(tmp_path: Path) -> None:
    seg = _write(tmp_path, [("t", 0)] * 10)
    entries = _entries(seg.read_bytes())
    source = _Source(_objects(entries, [(2, 11)]))
    damage = _damage(seg, entries, 4, 3)
    _shipped_through(seg, damage.lsn + 1)  # not through the range's last LSN
    assert repair_damage(seg, int(seg.stem), damage, last=True, source=source, known=[]) is None
    assert source.asked == []
    j = Journal.open_sync(tmp_path / "journal", BIG, repair=source)
    try:
        [loss] = j.losses()
        assert loss.repairable is False
        assert not j.repairs()
    finally:
        j.close_sync()


def test_a_range_over_an_earlier_loss_is_quarantined_not_rebuilt(tmp_path: Path) -> None:
    """An earlier loss's checkpoint has no batch in the bucket (its offsets are gap
    markers there): a damaged range over it is quarantined, its offsets skipped."""
    seg = _write(tmp_path, [("t", 0)] * 12)
    original = _entries(seg.read_bytes())
    source = _Source(_objects(original, [(2, 13)]))
    lost = original[4][1]
    source.objects[0].batches[("t", 0)].remove((lost.base_offset, bytes(lost.payload)))
    _damage(seg, original, 4, 1)
    Journal.open_sync(tmp_path / "journal", BIG).close_sync()  # no source: quarantined
    entries = _entries(seg.read_bytes())
    assert entries[4][1].kind == fentry.KIND_CHECKPOINT
    damage = _damage(seg, entries, 3, 3)
    _shipped_through(seg, entries[-1][1].lsn)
    with pytest.raises(NotRebuilt):
        rebuild(seg.read_bytes(), damage, source.objects, last=True)
    j = Journal.open_sync(tmp_path / "journal", BIG, repair=source)
    try:
        assert not j.repairs()
        assert [x.lsn_first for x in j.losses()] == [original[4][1].lsn, damage.lsn]
        assert j.next_offset("t", 0) == original[-1][1].next_offset
    finally:
        j.close_sync()


def test_damage_to_the_segment_checkpoint_is_refused(tmp_path: Path) -> None:
    seg = _write(tmp_path, [("t", 0)] * 6)
    entries = _entries(seg.read_bytes())
    damage = _damage(seg, entries, 0, 2)
    with pytest.raises(NotRebuilt, match="checkpoint"):
        rebuild(seg.read_bytes(), damage, _objects(entries, [(1, 7)]), last=True)


SMALL = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024, at_rest="off")


def test_a_sealed_segment_rescanned_is_repaired_up_to_the_next_segments_checkpoint(
    tmp_path: Path,
) -> None:
    """A sealed segment whose index is gone is scanned at open; damage at its end, where
    no later entry of the segment bounds the lost offsets, is bounded by the next
    segment's checkpoint (objects ship LSNs across segments)."""
    j = Journal.open_sync(tmp_path / "journal", SMALL)
    for i in range(900):
        key = ("t", 0) if i % 3 else ("u", 1)
        j.append_nowait(*key, encode_batch([f"{key}-{i}".encode() * 6], timestamps=i))
    want = {
        k: [bytes(e.payload) for e in j.read(*k, 0, max_records=10_000, max_bytes=1 << 24)]
        for k in (("t", 0), ("u", 1))
    }
    j.close_sync()
    segs = sorted((tmp_path / "journal").glob("*.wal"))
    assert len(segs) >= 3
    sealed = segs[0]
    everything = [e for s in segs for e in _entries(s.read_bytes())]
    last_lsn = everything[-1][1].lsn
    source = _Source(_objects(everything, [(a, a + 39) for a in range(1, last_lsn + 1, 40)]))
    entries = _entries(sealed.read_bytes())
    # the 4 entries before its last: one partition's entries after them are in the next
    # segment only
    damage = _damage(sealed, entries, len(entries) - 5, 4, last=False)
    sealed.with_suffix(".idx").unlink()
    _shipped_through(sealed, last_lsn)
    with pytest.raises(NotRebuilt, match="no entry after the damage"):
        rebuild(sealed.read_bytes(), damage, source.objects, last=False)
    j = Journal.open_sync(tmp_path / "journal", SMALL, repair=source)
    try:
        [rep] = j.repairs()
        assert rep.entries == 4
        assert {(r.topic, r.partition) for r in rep.ranges} == {("t", 0), ("u", 1)}
        assert not j.losses()
        for k, payloads in want.items():
            got = j.read(*k, 0, max_records=10_000, max_bytes=1 << 24)
            assert [bytes(e.payload) for e in got] == payloads
    finally:
        j.close_sync()


async def test_home_entries_between_mirror_entries_are_rebuilt_mirror_ones_refused(
    tmp_path: Path,
) -> None:
    """A site that homes ``t`` and mirrors ``south.t``: the region's objects hold ``t``'s
    batches only. Damage to home entries alone is rebuilt; damage that takes a mirror
    entry leaves an LSN without a batch and is refused."""
    j = Journal.open_sync(tmp_path / "journal", BIG)
    for i in range(12):
        if i % 4 == 3:
            mirrored = encode_batch(
                [b"m%d" % i], timestamps=i, base_offset=j.next_offset("south.t", 0)
            )
            await j.append_mirror("south.t", 0, mirrored, SourceCoords("south", i, 1))
        else:
            j.append_nowait("t", 0, encode_batch([b"h%d" % i], timestamps=i))
    j.close_sync()
    [seg] = (tmp_path / "journal").glob("*.wal")
    entries = _entries(seg.read_bytes())
    objects = _objects(entries, [(2, 13)])  # DATA entries only: the home topic's
    assert set(objects[0].batches) == {("t", 0)}
    # entries 1.. are LSNs 2..; entries 4, 8, 12 are mirror entries
    assert [e.kind for _, e in entries[4:7]] == [fentry.KIND_MIRROR, 1, 1]
    original = seg.read_bytes()
    home_only = _damage(seg, entries, 5, 2)
    got = rebuild(seg.read_bytes(), home_only, objects, last=True)
    back = _after(seg.read_bytes(), home_only, got.data, got.resync)
    assert [(e.lsn, bytes(e.payload)) for e in back] == [
        (e.lsn, bytes(e.payload)) for _, e in entries
    ]
    seg.write_bytes(original)
    with_mirror = _damage(seg, entries, 3, 3)
    with pytest.raises(NotRebuilt, match="no batch"):
        rebuild(seg.read_bytes(), with_mirror, objects, last=True)
