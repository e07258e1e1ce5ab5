"""The shipper with several journal lanes (docs/protocol.md, "Lanes"), on a local bucket.

Drain order (critical, then normal, then bulk), version 2 objects and
manifests with every lane's LSN range, per-lane watermarks restored by the
claim of a restarted shipper (no gap, no duplicate), and a lane held back by
``may_ship``. The real-process version, on S3 behind a fault proxy, is
``tests/system/test_priorities.py``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from edge_gateway.bucket import Bucket, LocalBucket
from edge_gateway.bucket_log import find_head
from edge_gateway.format import logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.logobject import LogObjectHeader
from edge_gateway.format.manifest import Manifest, log_key
from edge_gateway.journal import MAIN_LANE, Journal, JournalConfig, Lane, Lanes, Priority, lane_path
from edge_gateway.shipper import Diverged, Shipper, ShipperConfig

FAST = ShipperConfig(
    flush_interval_ms=20,
    manifest_every=4,
    retry_base_s=0.01,
    retry_cap_s=0.05,
    max_object_bytes=64 * 1024,
    backlog_object_bytes=64 * 1024,
)
JCFG = JournalConfig(segment_bytes=256 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)
CRITICAL, BULK = Lane(Priority.CRITICAL), Lane(Priority.BULK)
TOPICS = {"alarms": Priority.CRITICAL, "metrics": Priority.NORMAL, "logs": Priority.BULK}


def value(topic: str, o: int) -> bytes:
    return f"{topic}-{o}-".encode() * 20


@contextmanager
def open_lanes(tmp_path: Path) -> Iterator[Lanes]:
    main = tmp_path / "journal"
    journals = {
        lane: Journal.open_sync(lane_path(main, lane), JCFG) for lane in (CRITICAL, MAIN_LANE, BULK)
    }
    try:
        yield Lanes(journals, lambda t: TOPICS.get(t, Priority.NORMAL), JCFG)
    finally:
        for j in journals.values():
            j.close_sync()


def produce(lanes: Lanes, topic: str, batches: int, size: int = 10) -> None:
    for _ in range(batches):
        first = lanes.next_offset(topic, 0)
        batch = encode_batch([value(topic, first + i) for i in range(size)], timestamps=first)
        lanes.append_nowait(topic, 0, batch)


async def read_log(bucket: Bucket) -> list[tuple[LogObjectHeader, dict[str, list[int]]]]:
    """Every log object in seq order: its header and the offsets it holds per topic."""
    out = []
    for seq in range(1, await find_head(bucket, "", "north") + 1):
        key = log_key("", "north", seq)
        data = (await bucket.get(key)).data
        header = logobject.decode_header(data, where=key, object_size=len(data))
        offsets: dict[str, list[int]] = {}
        for b in header.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.end], where=key)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                for r in batch.records():
                    assert r.value == value(b.topic, r.offset)
                    offsets.setdefault(b.topic, []).append(r.offset)
        out.append((header, offsets))
    return out


def check_lsns(log: list[tuple[LogObjectHeader, dict[str, list[int]]]]) -> None:
    """Each lane's LSN ranges follow each other along the log: no gap, no overlap."""
    last = {0: 0, 1: 0, 2: 0}
    for h, _ in log:
        ranges = [(0, h.first_lsn, h.last_lsn)] + [
            (r.lane, r.first_lsn, r.last_lsn) for r in h.lanes
        ]
        for lane, first, end in ranges:
            assert first == last[lane] + 1, (h.seq, lane, first, last[lane])
            last[lane] = end


def all_offsets(log: list[tuple[LogObjectHeader, dict[str, list[int]]]], topic: str) -> list[int]:
    return [o for _, offsets in log for o in offsets.get(topic, [])]


@pytest.fixture
async def bucket(tmp_path: Path) -> Bucket:
    return await LocalBucket.open(tmp_path / "bucket", create=True)


async def test_backlog_drains_critical_then_normal_then_bulk(
    bucket: Bucket, tmp_path: Path
) -> None:
    with open_lanes(tmp_path) as lanes:
        # Produced bulk first: LSN or arrival order does not decide, the lane does.
        produce(lanes, "logs", 60)
        produce(lanes, "metrics", 60)
        produce(lanes, "alarms", 60)
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        await s.claim()
        assert await s.ship_pending() > 5
        log = await read_log(bucket)
        assert all(h.version == 2 for h, _ in log)
        check_lsns(log)
        for topic in TOPICS:
            assert all_offsets(log, topic) == list(range(600))
        seqs = {t: [h.seq for h, offsets in log if t in offsets] for t in TOPICS}
        assert max(seqs["alarms"]) <= min(seqs["metrics"])
        assert max(seqs["metrics"]) <= min(seqs["logs"])
        assert s.shipped_lsns() == {lane: j.next_lsn - 1 for lane, j in lanes.journals.items()}
        stats = {ls.lane: ls for ls in s.statistics().lanes}
        assert [ls.lane for ls in s.statistics().lanes] == ["critical", "normal", "bulk"]
        assert all(ls.backlog_entries == 0 for ls in stats.values())
        # The manifests are version 2 and carry the lane tables.
        infos = await bucket.list("regions/north/manifest/")
        m = Manifest.decode((await bucket.get(infos[-1].key)).data, where="m")
        assert all(e.lanes for e in m.entries)


async def test_restart_restores_every_lane_watermark(bucket: Bucket, tmp_path: Path) -> None:
    with open_lanes(tmp_path) as lanes:
        for topic in TOPICS:
            produce(lanes, topic, 10)
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        await s.claim()
        await s.ship_pending()
        shipped = s.shipped_lsns()
        for topic in TOPICS:
            produce(lanes, topic, 5)
    with open_lanes(tmp_path) as lanes:
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        await s.claim()  # a fence carrying every lane's watermark
        assert s.shipped_lsns() == shipped
        head = (await read_log(bucket))[-1][0]
        assert head.is_fence
        assert {r.lane: r.last_lsn for r in head.lanes} == {
            CRITICAL.id: shipped[CRITICAL],
            BULK.id: shipped[BULK],
        }
        assert lanes.journals[BULK].safe_lsn == shipped[BULK] + 1
        await s.ship_pending()
        log = await read_log(bucket)
        check_lsns(log)
        for topic in TOPICS:
            assert all_offsets(log, topic) == list(range(150))


async def test_a_held_lane_waits_and_the_others_ship(bucket: Bucket, tmp_path: Path) -> None:
    with open_lanes(tmp_path) as lanes:
        for topic in TOPICS:
            produce(lanes, topic, 10)
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        allowed = {Priority.CRITICAL, Priority.NORMAL}
        s.may_ship = lambda priority: priority in allowed
        await s.claim()
        await s.ship_pending()
        log = await read_log(bucket)
        assert all_offsets(log, "logs") == []
        assert all_offsets(log, "alarms") == list(range(100))
        assert not s.pending()  # what remains is held: nothing to do now
        bulk = {ls.lane: ls for ls in s.statistics().lanes}["bulk"]
        assert bulk.held
        # the ten batches, and the lane journal's first checkpoint
        assert bulk.backlog_entries == lanes.journals[BULK].next_lsn - 1 == 11
        assert bulk.backlog_bytes > 10 * 100
        allowed.add(Priority.BULK)
        s.policy_changed()
        assert s.pending()
        await s.ship_pending()
        log = await read_log(bucket)
        check_lsns(log)
        assert all_offsets(log, "logs") == list(range(100))


async def test_one_lane_writes_version_1(bucket: Bucket, tmp_path: Path) -> None:
    j = Journal.open_sync(tmp_path / "journal", JCFG)
    try:
        lanes = Lanes({MAIN_LANE: j}, lambda t: Priority.CRITICAL, JCFG)
        assert not lanes.multi
        produce(lanes, "alarms", 3)
        # the only lane open takes every priority
        assert lanes.owner("alarms", 0) == MAIN_LANE
        s = Shipper(j, bucket, "north", config=FAST)
        await s.claim()
        await s.ship_pending()
        log = await read_log(bucket)
        assert [h.version for h, _ in log] == [1, 1]
        assert all_offsets(log, "alarms") == list(range(30))
    finally:
        j.close_sync()


async def test_a_wiped_lane_journal_continues_at_the_heads_lane_lsn(
    bucket: Bucket, tmp_path: Path
) -> None:
    with open_lanes(tmp_path) as lanes:
        for topic in TOPICS:
            produce(lanes, topic, 4)
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        await s.claim()
        await s.ship_pending()
        shipped = s.shipped_lsns()
    # The critical lane's directory is lost (everything in it was shipped).
    shutil.rmtree(lane_path(tmp_path / "journal", CRITICAL))
    with open_lanes(tmp_path) as lanes:
        crit = lanes.journals[CRITICAL]
        assert crit.is_new
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        # A lane it shipped from is empty: the shipper is not ready before it claimed.
        written = s._load_writer_state()
        assert written is not None
        assert s._lost_lane_journals(written) == [CRITICAL]
        await s.claim()
        # LSNs of the lane continue after what the log holds (its checkpoint
        # first), and so do the offsets of its partitions: never reused.
        assert crit.statistics().first_lsn == shipped[CRITICAL] + 1
        assert lanes.owner("alarms", 0) == CRITICAL
        produce(lanes, "alarms", 2)
        await s.ship_pending()
        log = await read_log(bucket)
        check_lsns(log)
        assert all_offsets(log, "alarms") == list(range(60))


async def test_a_lane_journal_behind_the_log_is_refused(bucket: Bucket, tmp_path: Path) -> None:
    with open_lanes(tmp_path) as lanes:
        produce(lanes, "alarms", 4)
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        await s.claim()
        await s.ship_pending()
    # Replaced by a journal that holds less than the log says was shipped from it.
    shutil.rmtree(lane_path(tmp_path / "journal", CRITICAL))
    with open_lanes(tmp_path) as lanes:
        produce(lanes, "alarms", 1)
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        with pytest.raises(Diverged, match="lane critical"):
            await s.claim()


async def test_the_running_shipper_holds_a_lane_until_the_policy_changes(
    bucket: Bucket, tmp_path: Path
) -> None:
    with open_lanes(tmp_path) as lanes:
        s = Shipper(lanes.main, bucket, "north", config=FAST, lanes=lanes)
        allowed = {Priority.CRITICAL, Priority.NORMAL}
        s.may_ship = lambda priority: priority in allowed
        calls = 0
        ship_many = s._ship_many

        async def counted(**kwargs: object) -> int:
            nonlocal calls
            calls += 1
            return await ship_many(**kwargs)  # type: ignore[arg-type]

        s._ship_many = counted  # type: ignore[method-assign]

        async def shipped(lane: Lane) -> None:
            with trio.fail_after(20):
                await s.wait_shipped(lanes.journals[lane].next_lsn - 1, lane)

        async with trio.open_nursery() as nursery:
            await nursery.start(s.run)
            for topic in TOPICS:
                produce(lanes, topic, 3)
            await shipped(CRITICAL)
            await shipped(MAIN_LANE)
            # Idle with a held backlog: the loop waits (it does not spin on it).
            before = calls
            with trio.fail_after(20):  # a spinning loop never lets every task block
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert s.shipped_lsns()[BULK] == 0
            assert calls == before
            allowed.add(Priority.BULK)
            s.policy_changed()
            await shipped(BULK)
            nursery.cancel_scope.cancel()
        log = await read_log(bucket)
        check_lsns(log)
        assert all_offsets(log, "logs") == list(range(30))
