"""A compressed segment's checkpoint derived from its neighbours, only when proven equal.

``journal/_checkpoint_derive.py``: the previous segment's checkpoint and
entries give the partitions' offsets, checked against this segment's
directory and the next segment's checkpoint; the mirror sources and the
producers' table only when both neighbours' checkpoints hold the same.
(The live repair that uses it: ``test_compressed_repair.py``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_compressed_repair import _compressed

from edge_gateway.errors import CorruptData
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.entry import Checkpoint, SourceCoords
from edge_gateway.journal._checkpoint_derive import derive_checkpoint


def _first(path: Path) -> fentry.Entry:
    data = path.read_bytes()
    if data[:4] == atrest.MAGIC:
        e = next(atrest.CompressedSegment(data).entries())
    else:
        e = atrest.decode_any_entry(data, fentry.SEGMENT_HEADER_SIZE)
    assert isinstance(e, fentry.Entry)
    return e


def _replace_next(path: Path, base: int, cp: Checkpoint) -> None:
    """The next segment as an entry log holding only its checkpoint ``cp``."""
    entry = fentry.encode_entry(
        lsn=base,
        kind=fentry.KIND_CHECKPOINT,
        topic=b"",
        partition=0,
        base_offset=0,
        count=0,
        append_time=1,
        payload=cp.encode(),
    )
    path.write_bytes(fentry.encode_segment_header(base) + entry)


async def test_derived_equals_the_lost_checkpoint(tmp_path: Path) -> None:
    j, _, _ = await _compressed(tmp_path)
    seg = j._segments[1]
    assert seg.compressed is not None
    got = atrest.decode_any_entry(
        derive_checkpoint(seg.path, seg.base_lsn, seg.compressed.directory)
    )
    want = _first(seg.path)
    assert (got.lsn, got.kind, got.payload) == (want.lsn, want.kind, want.payload)
    await j.aclose()


async def test_not_derived_when_not_proven(tmp_path: Path) -> None:
    j, _, _ = await _compressed(tmp_path)
    first, seg, nxt = j._segments[0], j._segments[1], j._segments[2]
    assert first.compressed is not None
    assert seg.compressed is not None
    d = seg.compressed.directory
    await j.aclose()
    with pytest.raises(CorruptData, match="no previous segment"):
        derive_checkpoint(first.path, first.base_lsn, first.compressed.directory)
    end = Checkpoint.decode(_first(nxt.path).payload, where="test")
    # a mirror source moved on between the neighbours: this checkpoint's is unknown
    moved = Checkpoint(
        end.next_offsets, {"south": SourceCoords("south", 7, 1, True)}, end.producers
    )
    _replace_next(nxt.path, nxt.base_lsn, moved)
    with pytest.raises(CorruptData, match="mirror sources or the producers' table changed"):
        derive_checkpoint(seg.path, seg.base_lsn, d)
    # a partition the next checkpoint has where neither neighbour says it was
    offsets = dict(end.next_offsets)
    offsets[("elsewhere", 0)] = 5
    _replace_next(nxt.path, nxt.base_lsn, Checkpoint(offsets, end.sources, end.producers))
    with pytest.raises(CorruptData, match="names partitions unknown here"):
        derive_checkpoint(seg.path, seg.base_lsn, d)
