"""The journal lanes (``edge_gateway/journal/_lanes.py``, docs/journal.md "Lanes").

Real journals in temp directories: routing by priority, a partition's lane
pinned until the old lane shipped it, reads across lanes, the shared budget
with reserves, reopen, and a data directory written before lanes existed.
"""

from __future__ import annotations

import itertools
import logging
import tarfile
from pathlib import Path

import pytest
from _journal_support import read_records

from edge_gateway.errors import ConfigError, JournalFull
from edge_gateway.format.batch import encode_record
from edge_gateway.journal import (
    MAIN_LANE,
    JournalConfig,
    Lane,
    Lanes,
    OffsetOutOfRange,
    Priority,
    lane_path,
    lanes_on_disk,
    open_lanes,
)

MiB = 1024 * 1024
CFG = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * MiB)
CRITICAL, BULK = Lane(Priority.CRITICAL), Lane(Priority.BULK)
FIXTURE = Path(__file__).parent / "data" / "journal_v1_index.tar.gz"


class Priorities:
    """A changeable topic -> priority map (the configuration)."""

    def __init__(self, **topics: Priority) -> None:
        self.topics = dict(topics)

    def __call__(self, topic: str) -> Priority:
        return self.topics.get(topic, Priority.NORMAL)


def _records(lanes: Lanes, topic: str, partition: int) -> list[tuple[int, bytes]]:
    return [
        (r.offset, r.value)
        for r in read_records(lanes, topic, partition, max_records=7, max_bytes=512)
    ]


def _value(topic: str, offset: int) -> bytes:
    return f"{topic}@{offset}".encode()


async def _produce(lanes: Lanes, topic: str, n: int, partition: int = 0) -> list[Lane]:
    used = []
    for _ in range(n):
        offset = lanes.next_offset(topic, partition)
        res = await lanes.append(
            topic, partition, encode_record(_value(topic, offset), timestamp=1)
        )
        assert res.base_offset == offset
        used.append(res.lane)
    return used


async def test_appends_go_to_the_lane_of_their_priority(tmp_path: Path) -> None:
    prio = Priorities(alarms=Priority.CRITICAL, logs=Priority.BULK)
    main = tmp_path / "journal"
    async with open_lanes(main, CFG, {Priority.CRITICAL, Priority.BULK}, prio) as lanes:
        assert lanes.multi
        assert list(lanes.journals) == [CRITICAL, MAIN_LANE, BULK]  # drain order
        assert await _produce(lanes, "alarms", 3) == [CRITICAL] * 3
        assert await _produce(lanes, "metrics", 2) == [MAIN_LANE] * 2
        assert await _produce(lanes, "logs", 4) == [BULK] * 4
        # each lane's journal has its own LSNs, starting at 1 after its checkpoint
        assert lanes.journals[CRITICAL].next_offset("alarms", 0) == 3
        assert lanes.main.next_offset("alarms", 0) == 0
        for topic, n in (("alarms", 3), ("metrics", 2), ("logs", 4)):
            assert _records(lanes, topic, 0) == [(o, _value(topic, o)) for o in range(n)]
    assert lanes_on_disk(main) == {MAIN_LANE, CRITICAL, BULK}
    assert lane_path(main, CRITICAL) == tmp_path / "journal-critical"


async def test_a_moved_topic_stays_in_its_lane_until_shipped_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edgegw.journal")
    prio = Priorities()
    async with open_lanes(tmp_path / "journal", CFG, {Priority.CRITICAL}, prio) as lanes:
        await _produce(lanes, "t", 5)
        await _produce(lanes, "t", 2, partition=1)
        prio.topics["t"] = Priority.CRITICAL  # the configuration changes
        lanes.priorities_changed()
        # Not shipped yet from the normal lane: appends stay there (pinned).
        assert await _produce(lanes, "t", 2) == [MAIN_LANE] * 2
        assert lanes.pending_moves == 1
        assert "moves from lane normal to critical once" in caplog.text
        # The normal lane ships up to (not including) the last entry of t/0.
        last = lanes.main.next_lsn - 1
        lanes.main.set_safe_lsn(last)
        assert await _produce(lanes, "t", 1) == [MAIN_LANE]
        # Everything shipped: the next append moves, continuing the offsets.
        await lanes.main.flush()
        lanes.main.set_safe_lsn(lanes.main.next_lsn)
        assert await _produce(lanes, "t", 3) == [CRITICAL] * 3
        assert "t/0 moved from lane normal to critical at offset 8" in caplog.text
        assert lanes.owner("t", 0) == CRITICAL
        assert lanes.journals[CRITICAL].first_offset("t", 0) == 8
        assert lanes.next_offset("t", 0) == 11
        assert lanes.first_offset("t", 0) == 0
        # reads cross the lanes: gap-free, in order
        assert _records(lanes, "t", 0) == [(o, _value("t", o)) for o in range(11)]
        # partition 1 moves on its own next append (all of it shipped)
        assert await _produce(lanes, "t", 1, partition=1) == [CRITICAL]
        assert _records(lanes, "t", 1) == [(o, _value("t", o)) for o in range(3)]
        assert lanes.pending_moves == 0
        assert lanes.moves == 2
        with pytest.raises(OffsetOutOfRange):
            lanes.read("t", 0, -1)
        assert lanes.read("t", 0, 11) == []
    # Reopened: the critical lane holds the partition's head; nothing moves back.
    async with open_lanes(tmp_path / "journal", CFG, set(), prio) as lanes:
        assert lanes.multi  # the critical lane is on disk
        assert lanes.owner("t", 0) == CRITICAL
        assert await _produce(lanes, "t", 1) == [CRITICAL]
        assert _records(lanes, "t", 0) == [(o, _value("t", o)) for o in range(12)]


async def test_a_move_back_waits_for_the_new_lane_to_ship(tmp_path: Path) -> None:
    prio = Priorities(t=Priority.CRITICAL)
    async with open_lanes(tmp_path / "journal", CFG, {Priority.CRITICAL}, prio) as lanes:
        await _produce(lanes, "t", 2)
        prio.topics["t"] = Priority.NORMAL
        lanes.priorities_changed()
        # Reopen-safe bound: unknown last LSN this run would be the lane's last.
        assert await _produce(lanes, "t", 1) == [CRITICAL]
        crit = lanes.journals[CRITICAL]
        await crit.flush()
        crit.set_safe_lsn(crit.next_lsn)
        assert await _produce(lanes, "t", 1) == [MAIN_LANE]
        assert _records(lanes, "t", 0) == [(o, _value("t", o)) for o in range(4)]


async def test_a_topic_moved_away_and_back_reads_gap_free(tmp_path: Path) -> None:
    # Shipped segments stay for retention: the first lane still holds the
    # partition's old entries when the topic comes back to it.
    prio = Priorities()
    async with open_lanes(tmp_path / "journal", CFG, {Priority.CRITICAL}, prio) as lanes:

        async def ship_all() -> None:
            for j in lanes.journals.values():
                await j.flush()
                j.set_safe_lsn(j.next_lsn)

        await _produce(lanes, "t", 3)
        for priority, lane in (
            (Priority.CRITICAL, CRITICAL),
            (Priority.NORMAL, MAIN_LANE),
            (Priority.CRITICAL, CRITICAL),
        ):
            await ship_all()
            prio.topics["t"] = priority
            lanes.priorities_changed()
            assert await _produce(lanes, "t", 3) == [lane] * 3
        # normal holds 0-2 and 6-8, critical 3-5 and 9-11: every read is right
        assert lanes.journals[CRITICAL].first_offset("t", 0) == 3
        assert lanes.main.next_offset("t", 0) == 9
        assert _records(lanes, "t", 0) == [(o, _value("t", o)) for o in range(12)]
        for start in range(12):
            entries = lanes.read("t", 0, start)
            assert entries[0].base_offset == start
            assert all(a.next_offset == b.base_offset for a, b in itertools.pairwise(entries))


async def test_wait_for_wakes_on_an_append_in_any_lane(tmp_path: Path) -> None:
    import trio

    prio = Priorities(t=Priority.CRITICAL)
    async with open_lanes(tmp_path / "journal", CFG, {Priority.CRITICAL}, prio) as lanes:
        woke = trio.Event()

        async def waiter() -> None:
            await lanes.wait_for("t", 0, 0)
            woke.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert not woke.is_set()
            await _produce(lanes, "t", 1)
            with trio.fail_after(10):
                await woke.wait()


def fill(lanes: Lanes, topic: str, record: bytes, n: int) -> None:
    for _ in range(n):
        lanes.append_nowait(topic, 0, record)


async def test_reserve_keeps_room_for_its_lane(tmp_path: Path) -> None:
    cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=1 * MiB, reserve={"critical": 256 << 10})
    prio = Priorities(alarms=Priority.CRITICAL, logs=Priority.BULK)
    pri = {Priority.CRITICAL, Priority.BULK}
    async with open_lanes(tmp_path / "journal", cfg, pri, prio) as lanes:
        budgets = lanes.budgets()
        # Nearly nothing used (each lane's first checkpoint): each lane may
        # take its reserve plus the shared pool the others do not use.
        pool = 1 * MiB - (256 << 10)
        assert (256 << 10) + pool - 1024 < budgets[CRITICAL] <= (256 << 10) + pool
        assert pool - 1024 < budgets[BULK] <= pool
        assert pool - 1024 < budgets[MAIN_LANE] <= pool
        # Bulk fills the shared pool (nothing is shipped) until it is refused ...
        record = encode_record(b"x" * 2000, timestamp=1)
        with pytest.raises(JournalFull):
            fill(lanes, "logs", record, 10_000)
        bulk = lanes.journals[BULK]
        assert bulk.disk_bytes <= 1 * MiB - (256 << 10)
        # ... and the critical lane still has its reserve.
        crit = lanes.journals[CRITICAL]
        n = 0
        while crit.disk_bytes + 4096 < (256 << 10):
            lanes.append_nowait("alarms", 0, record)
            n += 1
        assert n > 100
        total = sum(j.disk_bytes for j in lanes.journals.values())
        assert total <= 1 * MiB
        # the normal lane has no reserve: the pool is gone
        with pytest.raises(JournalFull):
            fill(lanes, "metrics", record, 1000)
        # Bulk shipped: its segments go, and the space is shared again.
        await bulk.flush()
        bulk.set_safe_lsn(bulk.next_lsn)
        lanes.append_nowait("metrics", 0, record)


def test_reserve_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="'urgent' is not one of 'critical', 'normal', 'bulk'"):
        JournalConfig(reserve={"urgent": 1})
    with pytest.raises(ConfigError, match="must be a size >= 0"):
        JournalConfig(reserve={"critical": -1})
    with pytest.raises(ConfigError, match="leave less than two segments"):
        JournalConfig(segment_bytes=64 * MiB, max_bytes=256 * MiB, reserve={"critical": 200 * MiB})
    assert JournalConfig(reserve={"bulk": 5}).reserved(Priority.BULK) == 5
    assert JournalConfig().reserved(Priority.CRITICAL) == 0


async def test_a_data_dir_from_before_lanes_opens_unchanged(tmp_path: Path) -> None:
    # A journal directory written by the code before lanes (and before index
    # files version 2): with no priorities it is the one lane, read as before;
    # adding a critical topic adds a lane beside it and leaves it alone.
    main = tmp_path / "journal"
    main.mkdir()
    with tarfile.open(FIXTURE) as tf:
        tf.extractall(main, filter="data")
    before = sorted(p.name for p in main.iterdir())
    async with open_lanes(main, CFG, set(), Priorities()) as lanes:
        assert not lanes.multi
        assert list(tmp_path.iterdir()) == [main]
        expected = {
            (t, p): [(o, f"{t}/{p}/{o}".encode()) for o in range(lanes.next_offset(t, p))]
            for t in ("a", "bb")
            for p in range(3)
        }
        for (t, p), recs in expected.items():
            assert _records(lanes, t, p) == recs
    prio = Priorities(alarms=Priority.CRITICAL)
    async with open_lanes(main, CFG, {Priority.CRITICAL}, prio) as lanes:
        assert lanes.multi
        for (t, p), recs in expected.items():
            assert _records(lanes, t, p) == recs
        # an old topic stays where it is (normal); the critical topic gets its lane
        assert await _produce(lanes, "a", 1) == [MAIN_LANE]
        assert await _produce(lanes, "alarms", 1) == [CRITICAL]
    assert set(before) <= {p.name for p in main.iterdir()}
