"""The version 2 index file on its own: round trip through the page cache, damage is CorruptData."""

from __future__ import annotations

import bisect
import tempfile
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_gateway.errors import CorruptData
from edge_gateway.journal._index import PAGE, IndexCache, IndexFile, SegmentIndex


@st.composite
def indexes(draw: st.DrawFn) -> SegmentIndex:
    n = draw(st.integers(1, 1500))
    gaps = draw(st.lists(st.integers(44, 5000), min_size=n, max_size=n))
    positions = array("q", [8])
    for g in gaps[:-1]:
        positions.append(positions[-1] + g)
    base = draw(st.integers(1, 2**40))
    parts: dict[tuple[str, int], tuple[array[int], array[int]]] = {}
    lsn_pool = list(range(base + 1, base + n))
    names = draw(st.lists(st.text(min_size=1, max_size=30), min_size=0, max_size=5))
    if not lsn_pool:  # a segment of its checkpoint only
        names = []
    for k, name in enumerate(names):
        taken = sorted(draw(st.sets(st.sampled_from(lsn_pool), max_size=len(lsn_pool))) or [])
        if not taken:
            continue
        first = draw(st.integers(0, 2**50))
        offsets = array("q")
        o = first
        for _ in taken:
            offsets.append(o)
            o += draw(st.integers(1, 1000))
        parts[(name, k)] = (array("q", taken), offsets)
    return SegmentIndex(
        base, int(positions[-1]) + 100, draw(st.integers(0, 2**45)), positions, parts
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(idx=indexes(), cache_pages=st.integers(0, 20))
def test_round_trip_through_a_small_cache(idx: SegmentIndex, cache_pages: int) -> None:
    data, runs = idx.encode()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "1.idx"
        path.write_bytes(data)
        cache = IndexCache(cache_pages * PAGE)
        f, last_time, opened = IndexFile.open(
            path, cache, base_lsn=idx.base_lsn, segment_size=idx.size
        )
        held = IndexFile.from_bytes(path, cache, data)
        try:
            assert last_time == idx.last_append_time
            assert opened == runs
            assert [(r.topic, r.partition) for r in runs] == list(idx.partitions)
            for source in (f, held):
                assert list(source.positions()) == list(idx.positions)
                for r in runs:
                    lsns, offsets = source.run(r.at, r.count)
                    want_lsns, want_offsets = idx.partitions[(r.topic, r.partition)]
                    assert list(lsns) == list(want_lsns)
                    assert list(offsets) == list(want_offsets)
                    assert r.first_offset == want_offsets[0]
                    probe = want_offsets[len(want_offsets) // 2] + 1
                    assert bisect.bisect_right(offsets, probe) == bisect.bisect_right(
                        want_offsets, probe
                    )
            assert cache.bytes <= cache.capacity
        finally:
            cache.close()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(idx=indexes(), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_any_flipped_bit_or_cut_is_corrupt_data(idx: SegmentIndex, where: float, bit: int) -> None:
    data, _ = idx.encode()
    at = int(where * len(data))
    flipped = bytearray(data)
    flipped[at] ^= 1 << bit
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "1.idx"
        for damaged in (bytes(flipped), data[:at]):
            path.write_bytes(damaged)
            cache = IndexCache(0)
            with pytest.raises(CorruptData):
                IndexFile.open(path, cache, base_lsn=idx.base_lsn, segment_size=idx.size)
            cache.close()


def test_an_index_of_another_segment_is_refused(tmp_path: Path) -> None:
    idx = SegmentIndex(
        10, 1000, 5, array("q", [8, 100]), {("t", 0): (array("q", [11]), array("q", [0]))}
    )
    data, _ = idx.encode()
    path = tmp_path / "10.idx"
    path.write_bytes(data)
    cache = IndexCache(0)
    with pytest.raises(CorruptData, match="does not match"):
        IndexFile.open(path, cache, base_lsn=11, segment_size=1000)
    with pytest.raises(CorruptData, match="does not match"):
        IndexFile.open(path, cache, base_lsn=10, segment_size=999)
    f, _, _ = IndexFile.open(path, cache, base_lsn=10, segment_size=1000)
    assert list(f.positions()) == [8, 100]
    cache.close()
