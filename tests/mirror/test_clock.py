"""The bucket's clock as a gateway sees it (``edge_gateway.clock``), and GC on it.

The clock is sans-IO: these tests feed it samples with hand-set wall and
monotonic clocks. GC runs against a local bucket whose file times are the
bucket's clock; the gateway's own clock is whatever the test says.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from _mirror_support import JCFG, produce

from edge_gateway.bucket import FaultyBucket
from edge_gateway.clock import BucketClock, ClockConfig, ClockState
from edge_gateway.errors import ConfigError, CorruptData
from edge_gateway.format.manifest import gc_boundary_key
from edge_gateway.journal import Journal
from edge_gateway.mirror import GapKind, GapPolicy, SourceGap, Tailer, TailerConfig
from edge_gateway.mirror.log_gc import GcConfig, GcState, collect_garbage, read_gc_state
from edge_gateway.shipper import Shipper, ShipperConfig

DAY_MS = 86_400_000
T0 = 1_800_000_000_000  # the bucket's time at the first sample, ms


class Clocks:
    """Hand-set wall (ms) and monotonic (s) clocks of one machine."""

    def __init__(self, wall_ms: int) -> None:
        self.wall_ms = wall_ms
        self.mono_s = 1000.0

    def wall(self) -> int:
        return self.wall_ms

    def mono(self) -> float:
        return self.mono_s

    def tick(self, seconds: float) -> None:
        self.wall_ms += int(seconds * 1000)
        self.mono_s += seconds


def at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def sample(clock: BucketClock, bucket_ms: int) -> float:
    return clock.observe(clock.begin(), at(bucket_ms), "regions/a/log/1")


def test_skew_and_states_follow_the_samples(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="edgegw.clock")
    m = Clocks(T0)
    c = BucketClock(ClockConfig(), wall=m.wall, mono=m.mono)
    assert (c.state, c.skew_s, c.now_ms(), c.gc_pause_reason()) == (
        ClockState.UNKNOWN,
        None,
        None,
        None,
    )
    assert sample(c, T0 - 500) == 0.5
    assert c.state is ClockState.OK
    assert not caplog.records
    m.wall_ms += 40 * DAY_MS  # the time is set 40 days ahead
    assert sample(c, T0) == pytest.approx(40 * 86_400)
    assert c.state is ClockState.GC_PAUSED
    reason = c.gc_pause_reason()
    assert reason is not None
    assert "40.0 days) ahead of" in reason
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "bucket GC is paused" in caplog.records[0].getMessage()
    # the same skew again: no new line (until the reminder interval)
    sample(c, T0)
    assert len(caplog.records) == 1
    m.wall_ms = T0 - 90_000  # now 90 s behind: skewed, GC allowed
    assert sample(c, T0) == -90.0
    assert c.state is ClockState.SKEWED
    assert c.gc_pause_reason() is None
    assert "90.0 s behind the bucket's" in caplog.records[-1].getMessage()
    m.wall_ms = T0
    sample(c, T0)
    assert c.state is ClockState.OK
    assert "within 0.0 s of the bucket's again" in caplog.records[-1].getMessage()
    assert c.statistics().samples == 5


def test_bucket_time_runs_on_the_monotonic_clock_alone() -> None:
    m = Clocks(T0)
    c = BucketClock(wall=m.wall, mono=m.mono)
    sample(c, T0 + 5000)  # the bucket is 5 s ahead of this machine
    m.tick(10)
    assert c.now_ms() == T0 + 15_000
    m.wall_ms -= 10 * 365 * DAY_MS  # setting the wall clock changes nothing here
    assert c.now_ms() == T0 + 15_000
    m.mono_s = 0.0  # a clock before the sample: never earlier than the sample
    assert c.now_ms() == T0 + 5000


def test_clock_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="warn_skew_ms"):
        ClockConfig(warn_skew_ms=0)
    with pytest.raises(ConfigError, match="gc_pause_skew_ms"):
        ClockConfig(warn_skew_ms=10_000, gc_pause_skew_ms=5_000)


# --------------------------------------------------------------------------
# GC on the bucket's clock

SHIP = ShipperConfig(flush_interval_ms=20, manifest_every=2, retry_base_s=0.01, retry_cap_s=0.05)


async def shipped_with(
    j: Journal, bucket: FaultyBucket, wall_offset_ms: int, rounds: int
) -> BucketClock:
    """Ship ``rounds`` entries (a manifest every two) from a gateway whose clock is off."""
    clock = BucketClock(wall=lambda: time.time_ns() // 1_000_000 + wall_offset_ms)
    s = Shipper(j, bucket, "a", config=SHIP, bucket_clock=clock)
    await s.claim()
    for _ in range(rounds):
        produce(j, "t", 1, 1)
        await s.ship_pending()
    return clock


@pytest.mark.parametrize("offset_days", [40, -3650])
async def test_gc_ages_are_on_the_bucket_clock_not_the_gateways(
    bucket: FaultyBucket, source: Journal, offset_days: int
) -> None:
    """A device clock weeks ahead or years behind: ages are still minutes, on the bucket."""
    clock = await shipped_with(source, bucket, offset_days * DAY_MS, 6)
    assert clock.state is ClockState.GC_PAUSED
    assert abs(clock.skew_s or 0) > 30 * 86_400
    before = len(await bucket.list("regions/a/"))
    # paused: nothing happens, and the result says why
    res = await collect_garbage(bucket, "a", ["b"], GcConfig(retention_ms=0), clock=clock)
    assert res.paused is not None
    assert "gc_pause_skew_ms" in res.paused
    assert res.deleted_entries == 0
    # the pause lifted: the age cap (1 day) is far from reached on the bucket's clock
    lifted = BucketClock(ClockConfig(gc_pause_skew_ms=100 * 365 * DAY_MS))
    ticket = lifted.begin()
    lifted.observe(ticket, (await bucket.put("probe", b"")).last_modified, "probe")
    cfg = GcConfig(retention_ms=0, age_cap_ms=DAY_MS)
    res = await collect_garbage(bucket, "a", ["b"], cfg, clock=lifted)
    assert (res.paused, res.deleted_entries, res.overridden) == (None, 0, ())
    assert "'b'" in res.stopped_by
    assert len(await bucket.list("regions/a/")) >= before


async def test_gc_without_a_clock_dates_nothing_past_the_newest_manifest(
    bucket: FaultyBucket, source: Journal
) -> None:
    """No sample and no ``now_ms``: "now" is the newest manifest's time on the bucket."""
    await shipped_with(source, bucket, 0, 6)
    res = await collect_garbage(bucket, "a", ["b"], GcConfig(retention_ms=3_600_000))
    assert res.deleted_entries == 0
    assert "retention" in res.stopped_by


async def test_lost_entries_are_recorded_for_subscribers_only_from_when_they_subscribed(
    bucket: FaultyBucket, source: Journal
) -> None:
    clock = await shipped_with(source, bucket, 0, 4)  # seqs 1..5, manifests ..2, ..3/4, ..5
    state = await read_gc_state(bucket, "", "a")
    assert state == type(state)()  # nothing recorded before the first GC run
    cfg = GcConfig(retention_ms=0, age_cap_ms=0)
    # b subscribed from seq 4 on (head 3 when GC first saw it); c is new at head 5
    res = await collect_garbage(bucket, "a", ["b"], cfg, now_ms=clock.now_ms(), head_seq=3)
    assert res.overridden == ("b",)
    assert res.lost == {"b": (4, res.boundary_after)}
    state = await read_gc_state(bucket, "", "a")
    assert state.subscribers == {"b": 4}
    assert state.lost == {"b": (4, res.boundary_after)}
    res = await collect_garbage(bucket, "a", ["b", "c"], cfg, now_ms=clock.now_ms(), head_seq=5)
    state = await read_gc_state(bucket, "", "a")
    assert state.subscribers == {"b": 4, "c": 6}
    # dropping b from the routing forgets it: subscribing again starts anew
    await collect_garbage(bucket, "a", ["c"], cfg, now_ms=clock.now_ms(), head_seq=5)
    state = await read_gc_state(bucket, "", "a")
    assert (state.subscribers, state.lost) == ({"c": 6}, {})


def test_boundary_document_round_trip_and_hostile_documents() -> None:
    state = GcState(32, {"south": 2}, {"south": (2, 32)})
    data = state.encode()
    assert data == (
        b'{"highest_deleted_seq":32,"lost":{"south":[2,32]},"subscribers":{"south":2},"version":1}'
    )
    assert GcState.decode(data, where="k") == state
    assert GcState.decode(b'{"version": 1, "highest_deleted_seq": 7}', where="k") == GcState(7)
    for bad in (
        b"",
        b"[]",
        b'{"version": 2, "highest_deleted_seq": 1}',
        b'{"version": 1, "highest_deleted_seq": -1}',
        b'{"version": 1, "highest_deleted_seq": 1, "lost": {"south": [5, 2]}}',
        b'{"version": 1, "highest_deleted_seq": 1, "lost": {"south": 3}}',
        b'{"version": 1, "highest_deleted_seq": 1, "subscribers": {"no/pe": 3}}',
        b'{"version": 1, "highest_deleted_seq": 1, "subscribers": {"south": true}}',
        b'{"version": 1, "highest_deleted_seq": 1, "subscribers": []}',
        b"[" * 100_000,
    ):
        with pytest.raises(CorruptData):
            GcState.decode(bad, where="k")


@pytest.mark.parametrize("since_head", [0, 9])
async def test_a_fresh_reader_meets_its_loss_as_a_gap_and_a_later_subscriber_a_start(
    bucket: FaultyBucket, source: Journal, tmp_path: Path, since_head: int
) -> None:
    """b never mirrored; the age cap deleted entries written while it was (or before it was)
    subscribed."""
    await shipped_with(source, bucket, 0, 8)  # seqs 1..9
    res = await collect_garbage(
        bucket,
        "a",
        ["b"],
        GcConfig(retention_ms=0, age_cap_ms=0),
        now_ms=2**62,
        head_seq=since_head,
    )
    assert res.boundary_after == 8
    jb = Journal.open_sync(tmp_path / "b", JCFG)
    try:
        if since_head == 0:  # subscribed from the start: entries 1..8 are its loss
            with pytest.raises(SourceGap) as info:
                await Tailer(jb, bucket, "a", None, "b").catch_up()
            assert (info.value.gap.kind, info.value.gap.first_seq) == (GapKind.LOG, 1)
            skip = Tailer(jb, bucket, "a", None, "b", TailerConfig(gap_policy=GapPolicy.SKIP))
            await skip.catch_up()
            assert next(g.kind for g in skip.statistics().gaps) is GapKind.LOG
        else:  # subscribed after they were written: a start
            t = Tailer(jb, bucket, "a", None, "b")
            await t.catch_up()
            assert {g.kind for g in t.statistics().gaps} == {GapKind.START}
        assert jb.next_offset("a.t", 0) == source.next_offset("t", 0)
    finally:
        jb.close_sync()
    await bucket.put(gc_boundary_key("", "a"), b'{"version": 1, "highest_deleted_seq": "x"}')
    with pytest.raises(CorruptData):
        await read_gc_state(bucket, "", "a")
