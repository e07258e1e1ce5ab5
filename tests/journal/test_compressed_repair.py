"""A compressed segment's damaged entry table or directory, repaired while running.

``journal/_compressed_repair.py``: the live repair's copy of a compressed
segment whose entry table (a chunk's) or directory does not check. A running
journal, its sealed segments compressed (small chunks, so a segment has
several), its entries served back by the in-memory source of
``test_live_repair.py``; the real processes are in
``tests/system/test_compressed_repair_system.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_live_repair import SMALL, Source, _all_entries, _fill, _flip, _records, _shipped

from edge_gateway.format import atrest
from edge_gateway.journal import Journal
from edge_gateway.journal._compressed import is_compressed
from edge_gateway.journal._live_repair import load_attempts

_DIR_FIXED = 48  # u64 u64 i64 u64 u32 u32 u32 u8 3x (docs/at-rest.md, "Directory")


async def _compressed(tmp_path: Path) -> tuple[Journal, Source, dict]:
    root = tmp_path / "journal"
    j = Journal.open_sync(root, SMALL)
    values = _fill(j)
    assert len(j._segments) >= 3
    entries = _all_entries(j)
    _shipped(root, j.next_lsn - 1)
    j.rewriter.in_child = False
    j.rewriter.chunk_raw_bytes = 16 * 1024  # four chunks to a 64 KiB segment
    assert await j.rewriter.rewrite_all() >= 2
    return j, Source(entries), values


def _damage(j: Journal, where: str) -> int:
    """Flip one byte of the second segment's ``where``; the byte's position."""
    seg = j._segments[1]
    assert seg.compressed is not None
    d = seg.compressed.directory
    assert len(d.chunks) >= 3
    size = seg.path.stat().st_size
    last = d.chunks[-1]
    dir_offset = last.meta_offset + last.meta_stored  # the directory follows the last table
    if where == "table":  # the middle chunk's entry table
        c = d.chunks[len(d.chunks) // 2]
        at = c.meta_offset + c.meta_stored // 2
    elif where == "last-table":  # the damage runs to the segment's end
        c = d.chunks[-1]
        at = c.meta_offset + c.meta_stored // 2
    elif where == "first-table":  # the table holding the checkpoint
        c = d.chunks[0]
        at = c.meta_offset + c.meta_stored // 2
    elif where == "dir-crc":  # the directory's own CRC: every field intact
        at = size - atrest.TRAILER_SIZE - 2
    else:  # "dir-topic": a topic's name, a field that decodes either way
        at = dir_offset + _DIR_FIXED + 2
    _flip(seg.path, at)
    j._segment_set.close_reads()
    return at


@pytest.mark.parametrize("where", ["table", "last-table", "dir-crc", "dir-topic"])
async def test_a_damaged_table_or_directory_is_rebuilt_bit_for_bit(
    tmp_path: Path, where: str
) -> None:
    j, source, values = await _compressed(tmp_path)
    seg = j._segments[1]
    _damage(j, where)
    j.live_repair.attach(lambda: source)
    assert j.live_repair.report(seg.path)
    assert await j.live_repair.repair(seg.base_lsn), j.live_repair.statistics().last_error
    stats = j.live_repair.statistics()
    assert (stats.pending, stats.segments_repaired) == ((), 1)
    assert seg.compressed is None
    assert _records(j) == values
    [one] = j.repairs()
    if where.startswith("dir"):  # everything after the checkpoint came from the bucket
        assert (one.lsn_first, one.lsn_last) == (seg.base_lsn + 1, seg.end_lsn - 1)
    else:
        assert seg.base_lsn < one.lsn_first <= one.lsn_last < seg.end_lsn
    copies = sorted(p.name for p in (j.path.parent / "quarantine").glob("*compressed.damaged"))
    assert copies == [f"journal-{seg.path.stem}-compressed.damaged"]
    assert await j.rewriter.rewrite_all() == 1  # compressed again
    await j.aclose()
    j = Journal.open_sync(j.path, SMALL)
    try:
        assert _records(j) == values
        assert j.losses() == []
    finally:
        j.close_sync()


async def test_the_checkpoints_table_damaged_is_rebuilt_with_a_derived_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first chunk's table holds the segment's checkpoint, which no bucket has: it is
    derived from the neighbours (_checkpoint_derive.py), the chunk's entries rebuilt."""
    j, source, values = await _compressed(tmp_path)
    seg = j._segments[1]
    cp_before = next(atrest.CompressedSegment(seg.path.read_bytes()).entries())
    _damage(j, "first-table")
    j.live_repair.attach(lambda: source)
    assert j.live_repair.report(seg.path)
    assert await j.live_repair.repair(seg.base_lsn), j.live_repair.statistics().last_error
    assert _records(j) == values
    with seg.path.open("rb") as f:
        f.seek(16)
        cp_after = atrest.decode_any_entry(f.read(cp_before.length + 64), 0)
    assert (cp_after.lsn, cp_after.payload) == (cp_before.lsn, cp_before.payload)
    assert "checkpoint is derived from the neighbouring segments" in caplog.text
    await j.aclose()


async def test_the_checkpoints_table_damaged_is_not_rebuilt_and_says_why(tmp_path: Path) -> None:
    """The first segment's first table: no previous segment to derive the checkpoint
    from (it is in no bucket): refused, with the reason."""
    j, source, _ = await _compressed(tmp_path)
    seg = j._segments[0]
    assert seg.compressed is not None
    c = seg.compressed.directory.chunks[0]
    _flip(seg.path, c.meta_offset + c.meta_stored // 2)
    j._segment_set.close_reads()
    j.live_repair.attach(lambda: source)
    assert j.live_repair.report(seg.path)
    assert not await j.live_repair.repair(seg.base_lsn)
    assert "cannot be derived: no previous segment" in str(j.live_repair.statistics().last_error)
    assert load_attempts(j.path)[seg.base_lsn].failures == 1
    assert seg.compressed is not None  # untouched
    assert not list(j.path.glob("*.r-tmp"))
    await j.aclose()


async def test_at_open_a_damaged_directory_is_rebuilt_or_the_open_refuses(tmp_path: Path) -> None:
    """The open loads a sealed compressed segment from its directory alone: one whose CRC
    fails is rebuilt from the bucket (``_compressed_open.py``)."""
    j, source, values = await _compressed(tmp_path)
    seg = j._segments[1]
    _damage(j, "dir-topic")
    await j.aclose()
    # (no source: quarantined instead, test_compressed_quarantine.py)
    j = Journal.open_sync(j.path, SMALL, repair=source)
    try:
        assert not is_compressed(seg.path)  # an entry log again
        assert _records(j) == values
        [one] = j.repairs()
        assert (one.lsn_first, one.lsn_last) == (seg.base_lsn + 1, seg.end_lsn - 1)
        assert j.losses() == []
    finally:
        j.close_sync()
    j = Journal.open_sync(j.path, SMALL)  # sound now, without a source
    try:
        assert _records(j) == values
    finally:
        j.close_sync()
