"""The shipper with a drop-oldest lane (docs/protocol.md, "Gap markers"), on a local bucket.

What a drop-oldest lane dropped before shipping reaches the log as gap markers
(version 3 objects) naming exactly the dropped ranges: every offset the lane
ever acknowledged is in the log once, as a record or inside a gap, and the
gaps are exactly the journal's ``dropped.log``. A drop of entries that are in
an object being committed (the bucket away) does not report them: they reach
the bucket with that object.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from edge_gateway.bucket import Bucket, FaultyBucket, LocalBucket
from edge_gateway.bucket_log import find_head
from edge_gateway.format import logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.entry import Entry
from edge_gateway.format.logobject import GapRange, LogObjectHeader
from edge_gateway.format.manifest import Manifest, log_key
from edge_gateway.journal import (
    MAIN_LANE,
    Journal,
    JournalConfig,
    Lane,
    Lanes,
    OnFull,
    Priority,
    lane_path,
)
from edge_gateway.shipper import Shipper, ShipperConfig

FAST = ShipperConfig(
    flush_interval_ms=20,
    manifest_every=4,
    retry_base_s=0.01,
    retry_cap_s=0.02,
    max_object_bytes=64 * 1024,
    backlog_object_bytes=64 * 1024,
)
JCFG = JournalConfig(segment_bytes=64 * 1024, max_bytes=512 * 1024, retention_ms=0)
DROP = Lane(Priority.BULK, OnFull.DROP_OLDEST)
LANES = {"telemetry": DROP, "metrics": MAIN_LANE}


def value(topic: str, o: int) -> bytes:
    return f"{topic}-{o}-".encode() * 20


@contextmanager
def open_lanes(tmp_path: Path) -> Iterator[Lanes]:
    main = tmp_path / "journal"
    journals = {
        MAIN_LANE: Journal.open_sync(main, JCFG),
        DROP: Journal.open_sync(lane_path(main, DROP), JCFG, drop_oldest=True),
    }
    try:
        yield Lanes(journals, lambda t: LANES.get(t, MAIN_LANE), JCFG)
    finally:
        for j in journals.values():
            j.close_sync()


def produce(lanes: Lanes, topic: str, n: int) -> None:
    for _ in range(n):
        o = lanes.next_offset(topic, 0)
        lanes.append_nowait(topic, 0, encode_batch([value(topic, o)], timestamps=o))


async def read_log(
    bucket: Bucket,
) -> tuple[list[LogObjectHeader], dict[str, list[int]], list[GapRange]]:
    headers, offsets, gaps = [], {}, []
    for seq in range(1, await find_head(bucket, "", "north") + 1):
        key = log_key("", "north", seq)
        data = (await bucket.get(key)).data
        h = logobject.decode_header(data, where=key, object_size=len(data))
        headers.append(h)
        gaps += h.gaps
        for b in h.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.end], where=key)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                for r in batch.records():
                    assert r.value == value(b.topic, r.offset)
                    offsets.setdefault(b.topic, []).append(r.offset)
    return headers, offsets, gaps


def gap_offsets(gaps: list[GapRange], topic: str) -> list[int]:
    out: list[int] = []
    for g in gaps:
        if g.topic == topic:
            assert g.lane == DROP.id
            assert g.records == g.last_offset - g.first_offset + 1
            out += range(g.first_offset, g.last_offset + 1)
    return out


def journal_dropped(lanes: Lanes) -> list[int]:
    out: list[int] = []
    for d in lanes.journals[DROP].dropped(held=False):
        for r in d.ranges:
            out += range(r.first, r.last + 1)
    return out


@pytest.fixture
async def bucket(tmp_path: Path) -> Bucket:
    return await LocalBucket.open(tmp_path / "bucket", create=True)


async def test_dropped_ranges_ship_as_gap_markers(bucket: Bucket, tmp_path: Path) -> None:
    with open_lanes(tmp_path) as lanes:
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        await s.claim()
        produce(lanes, "telemetry", 300)
        await s.ship_pending()  # some shipped before the outage
        produce(lanes, "metrics", 100)
        produce(lanes, "telemetry", 6000)  # offline: far past the budget
        assert lanes.journals[DROP].statistics().dropped_records > 3000
        await s.ship_pending()
        produce(lanes, "telemetry", 3000)  # a second episode
        await s.ship_pending()
        headers, offsets, gaps = await read_log(bucket)
        n = lanes.next_offset("telemetry", 0)
        shipped, gone = offsets["telemetry"], gap_offsets(gaps, "telemetry")
        # every acknowledged offset once: shipped as a record, or named by a gap
        assert sorted(shipped + gone) == list(range(n))
        assert shipped == sorted(shipped)
        # the gaps are exactly what the journal recorded as dropped
        assert gone == journal_dropped(lanes)
        assert offsets["metrics"] == list(range(100))
        assert {h.version for h in headers if h.gaps} == {3}
        assert {h.version for h in headers if not h.gaps and not h.is_fence} == {2}
        assert s.statistics().gap_records == len(gone)
        # manifests carry the gaps (version 3) and their next offsets jump over them
        infos = await bucket.list("regions/north/manifest/")
        docs = [(await bucket.get(i.key)).data for i in infos]
        ms = [Manifest.decode(d, where="manifest") for d in docs]
        assert sum(g.records for m in ms for e in m.entries for g in e.gaps) == len(gone)
        assert any(b'"version":3' in d for d in docs)


async def _until_it_commits(bucket: FaultyBucket) -> None:
    """Wait until the shipper has read its object and tried to commit it (refused by
    the outage), however slow the machine is."""
    with trio.fail_after(60):
        while not bucket.injected:  # noqa: ASYNC110 - polls the fault counter
            await trio.sleep(0.01)


async def test_a_drop_of_entries_being_committed_is_not_a_gap(tmp_path: Path) -> None:
    inner = await LocalBucket.open(tmp_path / "bucket", create=True)
    bucket = FaultyBucket(inner)
    with open_lanes(tmp_path) as lanes:
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        await s.claim()
        produce(lanes, "telemetry", 200)
        await lanes.flush()
        bucket.outage = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.ship_once)  # reads, then retries its commit
            await _until_it_commits(bucket)
            produce(lanes, "telemetry", 6000)  # drops the entries it is committing
            assert any(d.held for d in lanes.journals[DROP].dropped())
            bucket.outage = False
        await s.ship_pending()
        _, offsets, gaps = await read_log(bucket)
        shipped, gone = offsets["telemetry"], gap_offsets(gaps, "telemetry")
        held = [
            o
            for d in lanes.journals[DROP].dropped()
            if d.held
            for r in d.ranges
            for o in range(r.first, r.last + 1)
        ]
        # the object in flight (its first max_object_bytes) made it, and is not a gap
        assert len(held) > 100
        assert shipped[: len(held)] == held == list(range(len(held)))
        assert not set(held) & set(gone)
        assert sorted(shipped + gone) == list(range(lanes.next_offset("telemetry", 0)))
        assert gone == journal_dropped(lanes)


async def test_held_entries_of_an_object_that_never_committed_are_gaps(tmp_path: Path) -> None:
    """The shipper dies while its object is being committed, after the entries in it
    were dropped: the next shipper's log resumes before them, so they ship as gaps."""
    inner = await LocalBucket.open(tmp_path / "bucket", create=True)
    bucket = FaultyBucket(inner)
    with open_lanes(tmp_path) as lanes:
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        await s.claim()
        produce(lanes, "telemetry", 200)
        await lanes.flush()
        bucket.outage = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.ship_once)
            await _until_it_commits(bucket)
            produce(lanes, "telemetry", 6000)
            nursery.cancel_scope.cancel()  # the process dies before the commit
        drop = lanes.journals[DROP]
        held = [d for d in drop.dropped() if d.held]
        assert held
        counted = drop.statistics().dropped_records
        bucket.outage = False
        s2 = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        await s2.claim()
        await s2.ship_pending()
        _, offsets, gaps = await read_log(bucket)
        shipped, gone = offsets.get("telemetry", []), gap_offsets(gaps, "telemetry")
        assert sorted(shipped + gone) == list(range(lanes.next_offset("telemetry", 0)))
        held_offsets = [o for d in held for r in d.ranges for o in range(r.first, r.last + 1)]
        assert set(held_offsets) <= set(gone)
        assert gone == journal_dropped(lanes)  # counted as dropped now
        assert drop.statistics().dropped_records == counted + len(held_offsets)


async def test_a_drop_while_entries_are_read_reads_them_again(
    bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries are read in a worker thread: the lane can drop them meanwhile (a
    producer fills the disk), and then they must not ship beside the gap
    marker that reports them dropped."""
    with open_lanes(tmp_path) as lanes:
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        await s.claim()
        produce(lanes, "telemetry", 200)
        await lanes.flush()
        drop_lane = lanes.journals[DROP]
        read = drop_lane.read_entries_in_thread
        dropped_during_read: list[int] = []

        async def read_then_drop(*args: Any, **kwargs: Any) -> list[Entry]:
            got = await read(*args, **kwargs)
            if got and not dropped_during_read:
                produce(lanes, "telemetry", 6000)  # far past the budget: drops what was read
                dropped_during_read.append(drop_lane.statistics().dropped_records)
            return got

        monkeypatch.setattr(drop_lane, "read_entries_in_thread", read_then_drop)
        await s.ship_pending()
        await s.ship_pending()  # what the producer appended during the first
        assert dropped_during_read
        assert dropped_during_read[0] > 0
        _, offsets, gaps = await read_log(bucket)
        shipped, gone = offsets["telemetry"], gap_offsets(gaps, "telemetry")
        assert 0 in gone  # the first entries read were dropped before they shipped
        assert not set(shipped) & set(gone)
        assert sorted(shipped + gone) == list(range(lanes.next_offset("telemetry", 0)))
        assert gone == journal_dropped(lanes)
