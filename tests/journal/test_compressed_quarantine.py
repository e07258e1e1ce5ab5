"""At open, a sealed compressed segment that neither opens nor is rebuilt, quarantined.

``journal/_compressed_quarantine.py``: a damaged trailer, or a damaged
directory with the bucket out of reach (no repair source), no longer stops
the open. Every LSN after the segment's checkpoint is quarantined
(``lost.log``, exact offsets, ``repairable``), the rest is served, and the
live repair rebuilds the range once the bucket answers. The real processes
are in ``tests/system/test_compressed_quarantine_system.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_compressed_repair import _compressed, _damage
from test_live_repair import SMALL, _flip, _records

from edge_gateway.errors import CorruptData
from edge_gateway.format import atrest
from edge_gateway.journal import Journal
from edge_gateway.journal._compressed import is_compressed
from edge_gateway.journal._quarantine import load_losses
from edge_gateway.journal._rewriter import _inode


def _lost(values: dict, have: dict) -> int:
    return sum(len(v) for v in values.values()) - sum(len(v) for v in have.values())


@pytest.mark.parametrize("where", ["trailer", "dir-offset", "dir-topic"])
async def test_quarantined_at_open_then_repaired_when_the_bucket_answers(
    tmp_path: Path, where: str
) -> None:
    j, source, values = await _compressed(tmp_path)
    seg = j._segments[1]
    base, end = seg.base_lsn, seg.end_lsn
    size = seg.path.stat().st_size
    if where == "trailer":  # its magic
        _flip(seg.path, size - 2)
    elif where == "dir-offset":  # where the trailer says the directory is
        _flip(seg.path, size - atrest.TRAILER_SIZE + 1)
    else:
        _damage(j, "dir-topic")
    before = seg.path.read_bytes()
    await j.aclose()
    j = Journal.open_sync(j.path, SMALL)  # no source: the bucket out of reach
    try:
        assert not is_compressed(seg.path)  # an entry log: its checkpoint, then fillers
        [loss] = j.losses()
        assert (loss.segment, loss.lsn_first, loss.lsn_last) == (base, base + 1, end - 1)
        assert loss.repairable is True
        assert all(r.exact for r in loss.ranges)
        have = _records(j)
        assert loss.records == _lost(values, have) > 0  # exactly what is not served
        copy = j.path.parent / loss.copy
        assert copy.read_bytes() == before
        assert j.next_lsn > end
        j.live_repair.attach(lambda: source)
        j.live_repair._mark_losses()
        assert j.live_repair.statistics().pending == (base,)
        assert await j.live_repair.repair(base), j.live_repair.statistics().last_error
        assert _records(j) == values
        [rep] = j.repairs()
        assert (rep.lsn_first, rep.lsn_last, rep.records) == (base + 1, end - 1, loss.records)
    finally:
        await j.aclose()
    j = Journal.open_sync(j.path, SMALL)
    try:
        assert _records(j) == values
        assert len(load_losses(j.path)) == 1  # recorded once
    finally:
        j.close_sync()


async def test_a_kill_before_the_rewrite_records_the_loss_once(tmp_path: Path) -> None:
    """The open died after recording the loss, before the rename: the next open finds
    the damaged compressed segment again, and quarantines it without a second record."""
    j, _, values = await _compressed(tmp_path)
    seg = j._segments[1]
    _flip(seg.path, seg.path.stat().st_size - 2)
    damaged = seg.path.read_bytes()
    await j.aclose()
    Journal.open_sync(j.path, SMALL).close_sync()
    seg.path.write_bytes(damaged)  # as if the rename had not happened
    j = Journal.open_sync(j.path, SMALL)
    try:
        [loss] = j.losses()
        assert loss.records == _lost(values, _records(j))
    finally:
        j.close_sync()


async def test_the_checkpoints_table_damaged_still_refuses_with_the_reason(
    tmp_path: Path,
) -> None:
    """Its checkpoint does not read and its directory does not check: nothing to keep
    the partitions' offsets at the segment's start; the open stops, the file untouched."""
    j, _, _ = await _compressed(tmp_path)
    seg = j._segments[1]
    _damage(j, "first-table")
    _flip(seg.path, seg.path.stat().st_size - 2)
    before = seg.path.read_bytes()
    await j.aclose()
    with pytest.raises(CorruptData, match="not quarantined either: the entry table holding"):
        Journal.open_sync(j.path, SMALL)
    assert seg.path.read_bytes() == before
    assert load_losses(j.path) == []


async def test_a_rewrite_read_before_the_repair_does_not_undo_it(tmp_path: Path) -> None:
    """The rewriter compressed the quarantined entry log (its checkpoints) while the live
    repair rebuilt it: its swap is dropped (the file was replaced since it read it), or
    it would put the lost range back as checkpoints and the records would be gone."""
    j, source, values = await _compressed(tmp_path)
    seg = j._segments[1]
    _flip(seg.path, seg.path.stat().st_size - 2)
    await j.aclose()
    j = Journal.open_sync(j.path, SMALL)
    try:
        seg = j._segments[1]
        assert not is_compressed(seg.path)
        j.rewriter.in_child = False
        ino = _inode(seg.path)
        stale = await j.rewriter._prepare(seg, 1.0)  # the rewrite read the checkpoints
        assert stale is not None
        j.live_repair.attach(lambda: source)
        j.live_repair._mark_losses()
        assert await j.live_repair.repair(seg.base_lsn)
        assert j.rewriter._install(seg, stale, ino) is None  # dropped
        assert not stale.tmp.exists()
        assert _records(j) == values
        assert await j.rewriter.rewrite_all() >= 1  # the repaired log is compressed later
        assert is_compressed(seg.path)
        assert _records(j) == values
    finally:
        await j.aclose()
