"""Finding a lane's shipped entries in the region's log (``edge_gateway/bucket_repair.py``).

A real local bucket holding log objects built by the format's own builder:
each object ships two LSNs of the main lane, one batch each; or (the lanes'
test) LSNs of the main lane and of the critical lane, named in its lane table.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from edge_gateway.bucket import FaultyBucket, LocalBucket
from edge_gateway.bucket_log import encode_gc_boundary
from edge_gateway.bucket_repair import BucketRepairSource, find_shipped
from edge_gateway.errors import CorruptData, Unavailable
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.logobject import LaneRange, LogObjectBuilder, encode_fence
from edge_gateway.format.manifest import gc_boundary_key, log_key
from edge_gateway.journal import MAIN_LANE, Lane, Priority

REGION = "north"


def _batch(offset: int) -> bytes:
    return encode_batch([f"v{offset}".encode(), b""], timestamps=offset, base_offset=offset)


async def _log(bucket: LocalBucket, objects: int, *, fence_at: int | None = None) -> None:
    """Seqs 1..objects; seq s ships LSNs 2s..2s+1 (offsets 4(s-1)..4s-1 of t/0)."""
    lsn = 2
    for seq in range(1, objects + 1):
        key = log_key("", REGION, seq)
        if seq == fence_at:
            await bucket.put(key, encode_fence(REGION, 2, seq, lsn - 1, 0))
            continue
        b = LogObjectBuilder()
        for k in range(2):
            b.add_batch("t", 0, _batch(4 * (seq - 1) + 2 * k))
        await bucket.put(
            key,
            b.build(REGION, 1 if fence_at is None or seq < fence_at else 2, seq, lsn, lsn + 1, 7),
        )
        lsn += 2


@pytest.fixture
async def bucket(tmp_path: Path) -> LocalBucket:
    return await LocalBucket.open(tmp_path / "bucket", create=True)


async def test_the_objects_whose_lsns_meet_the_range_in_seq_order(bucket: LocalBucket) -> None:
    await _log(bucket, 20, fence_at=9)
    got = await find_shipped(bucket, "", REGION, 7, 12)
    assert [(o.first_lsn, o.last_lsn) for o in got] == [(6, 7), (8, 9), (10, 11), (12, 13)]
    assert [o.key for o in got] == [log_key("", REGION, s) for s in (3, 4, 5, 6)]
    assert got[0].batches == {("t", 0): [(8, _batch(8)), (10, _batch(10))]}
    assert got[0].created_ms == 7
    assert not got[0].other_lanes
    # past the fence (seq 9 ships nothing): seq 10 ships LSNs 18..19
    [after] = await find_shipped(bucket, "", REGION, 19, 19)
    assert after.key == log_key("", REGION, 10)
    assert await find_shipped(bucket, "", REGION, 100, 120) == []


async def test_lsns_the_logs_gc_collected_are_not_found(bucket: LocalBucket) -> None:
    await _log(bucket, 6)
    for seq in (1, 2, 3):
        await bucket.delete(log_key("", REGION, seq))
    await bucket.put(gc_boundary_key("", REGION), encode_gc_boundary(3))
    with pytest.raises(CorruptData, match="GC"):
        await find_shipped(bucket, "", REGION, 5, 9)
    assert [o.first_lsn for o in await find_shipped(bucket, "", REGION, 8, 9)] == [8]


async def test_an_outage_is_met_once_per_open(bucket: LocalBucket) -> None:
    await _log(bucket, 4)
    faulty = FaultyBucket(bucket, close_inner=False)
    source = BucketRepairSource(faulty, "", REGION, timeout=5)
    got = await trio.to_thread.run_sync(source.shipped, 3, 4)
    assert [o.first_lsn for o in got] == [2, 4]
    faulty.outage = True
    with pytest.raises(Unavailable):
        await trio.to_thread.run_sync(source.shipped, 5, 6)
    met = faulty.injected
    faulty.outage = False
    with pytest.raises(Unavailable, match="was out of reach"):
        await trio.to_thread.run_sync(source.shipped, 5, 6)
    assert faulty.injected == met  # not asked again


async def test_a_silent_bucket_is_waited_for_a_bounded_time(bucket: LocalBucket) -> None:
    await _log(bucket, 4)
    faulty = FaultyBucket(bucket, close_inner=False)
    faulty.latency = 3600
    source = BucketRepairSource(faulty, "", REGION, timeout=0.2)
    with pytest.raises(Unavailable, match="did not answer"):
        await trio.to_thread.run_sync(source.shipped, 3, 4)


def _one(offset: int) -> bytes:
    return encode_batch([f"c{offset}".encode()], timestamps=offset, base_offset=offset)


async def _lane_log(bucket: LocalBucket, objects: int) -> None:
    """Seqs 1..objects of a two-lane writer: seq s ships main-lane LSN s (offset s of
    m/0) and critical-lane LSNs 2s..2s+1 (offsets 2s, 2s+1 of c/0), except every third
    object ships no critical LSN (an empty row), seq 5 is a fence and seqs 7-8 come from
    a writer without the critical lane (no row, version 1: main lane only)."""
    crit = 1
    for seq in range(1, objects + 1):
        key = log_key("", REGION, seq)
        if seq == 5:
            await bucket.put(key, encode_fence(REGION, 2, seq, seq - 1, 0, {1: crit}))
            continue
        b = LogObjectBuilder()
        b.add_batch("m", 0, _batch(seq))
        lanes: tuple[LaneRange, ...] = ()
        if seq not in (7, 8):
            if seq % 3:
                b.add_batch("c", 0, _one(crit + 1))
                b.add_batch("c", 0, _one(crit + 2))
                lanes = (LaneRange(1, crit + 1, crit + 2),)
                crit += 2
            else:
                lanes = (LaneRange(1, crit + 1, crit),)
        await bucket.put(key, b.build(REGION, 2, seq, seq, seq, 7, lanes=lanes))


async def test_a_lanes_lsns_are_found_in_the_lane_tables(bucket: LocalBucket) -> None:
    await _lane_log(bucket, 16)
    # critical LSNs: seq 1: 2-3, 2: 4-5, 4: 6-7, 10: 8-9, 11: 10-11, 13: 12-13, ...
    got = await find_shipped(bucket, "", REGION, 5, 9, lane=1)
    assert [o.key for o in got] == [log_key("", REGION, s) for s in (2, 4, 10)]
    assert [(o.first_lsn, o.last_lsn) for o in got] == [(4, 5), (6, 7), (8, 9)]
    assert all(o.lane == 1 and o.other_lanes for o in got)
    # the object ships the main lane's partition too: rebuild keeps only the lane's
    assert got[2].batches[("c", 0)] == [(8, _one(8)), (9, _one(9))]
    assert ("m", 0) in got[2].batches
    # every start of the search, whatever objects without the row it meets
    for first in range(2, 16):
        found = await find_shipped(bucket, "", REGION, first, first, lane=1)
        assert [(o.first_lsn <= first <= o.last_lsn) for o in found] == [True], first
    assert await find_shipped(bucket, "", REGION, 100, 120, lane=1) == []
    # the main lane is searched as before
    [main] = await find_shipped(bucket, "", REGION, 8, 8)
    assert (main.first_lsn, main.lane) == (8, 0)


async def test_every_lane_has_a_source(bucket: LocalBucket) -> None:
    assert BucketRepairSource.for_lane(MAIN_LANE, bucket, "", REGION, keyring=None).lane == 0
    critical = BucketRepairSource.for_lane(
        Lane(Priority.CRITICAL), bucket, "", REGION, keyring=None
    )
    assert critical.lane == 1
