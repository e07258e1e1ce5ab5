"""Home-side bucket GC (``edge_gateway.mirror.log_gc``) and the cursors it relies on."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from _mirror_support import JCFG, HandLog, log_records, mirror_of, produce
from _quirky_s3 import new_bucket_on

from edge_gateway.bucket import (
    Bucket,
    BucketUnavailable,
    FaultyBucket,
    LocalBucket,
    NotFound,
    S3Bucket,
    S3Config,
    UnsupportedStore,
)
from edge_gateway.bucket_log import encode_gc_boundary, read_gc_boundary
from edge_gateway.errors import ConfigError, CorruptData, Unavailable
from edge_gateway.format.manifest import gc_boundary_key, log_key, parse_manifest_key
from edge_gateway.journal import Journal
from edge_gateway.mirror import GapKind, GapPolicy, SourceGap, Tailer, TailerConfig
from edge_gateway.mirror.cursor import Cursor, cursor_key, publish_cursor, read_cursor, read_cursors
from edge_gateway.mirror.log_gc import (
    GcConfig,
    ManifestAge,
    collect_garbage,
    plan_gc,
    read_gc_state,
)
from edge_gateway.shipper import Shipper, ShipperConfig
from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY

SHIP = ShipperConfig(flush_interval_ms=20, manifest_every=4, retry_base_s=0.01, retry_cap_s=0.05)
NOW = 1_000_000_000
H = 3_600_000
NO_RETENTION = GcConfig(retention_ms=0, age_cap_ms=10 * H)


# --------------------------------------------------------------------------
# the decision (sans-IO)


def ages(*pairs: tuple[int, int]) -> list[ManifestAge]:
    return [ManifestAge(last, f"m{last}", NOW - age) for last, age in pairs]


def test_plan_deletes_whole_manifests_mirrored_by_all_and_keeps_the_newest() -> None:
    ms = ages((5, 5 * H), (9, 4 * H), (12, 3 * H), (20, 2 * H))
    plan = plan_gc(ms, {"b": 12, "c": 15}, boundary=0, now_ms=NOW, config=GcConfig())
    assert plan.boundary == 12
    assert [m.last_seq for m in plan.manifests] == [5, 9, 12]
    everything = plan_gc(ms, {"b": 99}, boundary=0, now_ms=NOW, config=GcConfig())
    assert everything.boundary == 12  # never the newest manifest (20)
    assert "newest" in everything.stopped_by


def test_plan_waits_for_the_slowest_reader_and_for_retention() -> None:
    ms = ages((5, 5 * H), (9, 4 * H), (12, 3 * H), (20, 2 * H))
    slow = plan_gc(ms, {"b": 12, "c": 7}, boundary=0, now_ms=NOW, config=GcConfig())
    assert slow.boundary == 5
    assert "'c'" in slow.stopped_by
    young = plan_gc(
        ms, {"b": 99}, boundary=0, now_ms=NOW, config=GcConfig(retention_ms=int(3.5 * H))
    )
    assert young.boundary == 9
    assert "retention" in young.stopped_by
    no_cursor = plan_gc(ms, {"b": 0}, boundary=0, now_ms=NOW, config=GcConfig())
    assert no_cursor.boundary == 0
    assert no_cursor.manifests == ()


def test_plan_age_cap_overrides_lagging_readers() -> None:
    ms = ages((5, 5 * H), (9, 4 * H), (12, 3 * H), (20, 2 * H))
    cfg = GcConfig(retention_ms=H, age_cap_ms=int(3.5 * H))
    plan = plan_gc(ms, {"b": 0, "c": 9}, boundary=0, now_ms=NOW, config=cfg)
    assert plan.boundary == 9
    assert plan.overridden == ("b",)


def test_plan_never_lowers_the_boundary() -> None:
    plan = plan_gc(ages((5, 5 * H), (9, H)), {}, boundary=7, now_ms=NOW, config=GcConfig())
    assert plan.boundary == 7


def test_gc_config_is_checked() -> None:
    with pytest.raises(ConfigError):
        GcConfig(retention_ms=2 * H, age_cap_ms=H)
    with pytest.raises(ConfigError):
        GcConfig(concurrency=0)


# --------------------------------------------------------------------------
# cursors


async def test_cursor_round_trip_and_hostile_documents(tmp_path: Path) -> None:
    bucket = await LocalBucket.open(tmp_path / "b", create=True)
    try:
        assert await read_cursor(bucket, "", "a", "b") is None
        await publish_cursor(bucket, "", Cursor("a", "b", 7, 2, 123))
        assert await read_cursor(bucket, "", "a", "b") == Cursor("a", "b", 7, 2, 123)
        assert await read_cursors(bucket, "", "a") == {"b": Cursor("a", "b", 7, 2, 123)}
        # another reader's cursor copied under b's key is refused
        await bucket.put(cursor_key("", "a", "b"), Cursor("a", "c", 99, 2, 1).encode())
        with pytest.raises(CorruptData, match="stored under this key"):
            await read_cursor(bucket, "", "a", "b")
        for bad in (b"", b"[]", b'{"format": "edgegw-cursor", "version": 2}', b"x" * 5000):
            await bucket.put(cursor_key("", "a", "b"), bad)
            with pytest.raises(CorruptData):
                await read_cursor(bucket, "", "a", "b")
    finally:
        await bucket.aclose()


# --------------------------------------------------------------------------
# against a bucket


async def ship(j: Journal, bucket: FaultyBucket, rounds: int) -> Shipper:
    s = Shipper(j, bucket, "a", config=SHIP)
    await s.claim()
    for _ in range(rounds):
        produce(j, "t", 2, 1)
        await s.ship_pending()  # one entry and one manifest per round
    return s


def later() -> int:
    return time.time_ns() // 1_000_000 + 1000


async def test_gc_deletes_what_every_subscriber_mirrored(
    bucket: FaultyBucket, source: Journal, tmp_path: Path
) -> None:
    await ship(source, bucket, 10)  # seqs 1..11
    jb = Journal.open_sync(tmp_path / "b", JCFG)
    try:
        tb = Tailer(jb, bucket, "a", None, "b", TailerConfig(cursor_interval_s=1))
        await tb.catch_up()
        assert (await read_cursor(bucket, "", "a", "b")).through_seq == 11  # type: ignore[union-attr]
        # c subscribes but never mirrored: nothing goes
        res = await collect_garbage(bucket, "a", ["b", "c"], NO_RETENTION, now_ms=later())
        assert (res.deleted_entries, res.boundary_after) == (0, 0)
        assert "'c'" in res.stopped_by
        # only b: everything but the newest manifest's entries
        res = await collect_garbage(bucket, "a", ["b"], NO_RETENTION, now_ms=later())
        manifests = [parse_manifest_key(i.key)[1] for i in await bucket.list("regions/a/manifest/")]
        assert manifests == [11]
        assert res.boundary_after == 10
        assert res.deleted_entries == 10
        assert await read_gc_boundary(bucket, "", "a") == 10
        assert [i.key for i in await bucket.list("regions/a/log/")] == [log_key("", "a", 11)]
        # the writer goes on; so does the mirror
        s = Shipper(source, bucket, "a", config=SHIP)
        await s.claim()
        produce(source, "t", 2, 2)
        await s.ship_pending()
        await tb.catch_up()
        expected = await log_records(bucket, "a", from_seq=11)
        mirrored = mirror_of(jb, "a", expected)
        assert {k: v[-len(expected[k]) :] for k, v in mirrored.items()} == expected
        assert all(len(v) == 60 for v in mirrored.values())
        # a new reader starts at the oldest entry left (a start, not a gap)
        jc = Journal.open_sync(tmp_path / "c", JCFG)
        try:
            tc = Tailer(jc, bucket, "a", None, "c", TailerConfig())
            await tc.catch_up()
            assert next(g.kind for g in tc.statistics().gaps) is GapKind.START
            assert jc.first_offset("a.t", 0) == 45  # entry 11 holds 45..49
        finally:
            jc.close_sync()
    finally:
        jb.close_sync()


async def test_gc_run_with_nothing_to_do_makes_no_writes(
    bucket: FaultyBucket, source: Journal
) -> None:
    await ship(source, bucket, 3)
    before = bucket.statistics()
    res = await collect_garbage(bucket, "a", ["b"], GcConfig(), now_ms=later())
    after = bucket.statistics()
    assert res.deleted_entries == 0
    assert after.puts == before.puts + 1  # the first run records subscriber b, once
    assert (await read_gc_state(bucket, "", "a")).subscribers == {"b": 5}  # head 4 + 1
    before = after
    await collect_garbage(bucket, "a", ["b"], GcConfig(), now_ms=later())
    after = bucket.statistics()
    assert after.puts == before.puts
    assert after.deletes == before.deletes


async def test_age_cap_gap_for_a_lagging_reader(
    bucket: FaultyBucket, source: Journal, tmp_path: Path
) -> None:
    await ship(source, bucket, 4)  # 1..5
    jb = Journal.open_sync(tmp_path / "b", JCFG)
    jc = Journal.open_sync(tmp_path / "c", JCFG)
    try:
        await Tailer(jb, bucket, "a", None, "b").catch_up()
        await Tailer(jc, bucket, "a", None, "c").catch_up()
        s = Shipper(source, bucket, "a", config=SHIP)
        await s.claim()  # 6
        for _ in range(4):
            produce(source, "t", 2, 1)
            await s.ship_pending()  # 7..10
        await Tailer(jb, bucket, "a", None, "b").catch_up()  # b is at 10, c at 5
        res = await collect_garbage(
            bucket, "a", ["b", "c"], GcConfig(retention_ms=0, age_cap_ms=1), now_ms=later() + 10
        )
        assert res.overridden == ("c",)
        assert res.boundary_after == 9
        with pytest.raises(SourceGap) as info:
            await Tailer(jc, bucket, "a", None, "c").catch_up()
        assert (info.value.gap.first_seq, info.value.gap.last_seq) == (6, 9)
        skip = TailerConfig(gap_policy=GapPolicy.SKIP)
        tc = Tailer(jc, bucket, "a", None, "c", skip)
        await tc.catch_up()
        kinds = {g.kind for g in tc.statistics().gaps}
        assert kinds == {GapKind.LOG, GapKind.PARTITION}
        assert jc.next_offset("a.t", 0) == source.next_offset("t", 0)
    finally:
        jb.close_sync()
        jc.close_sync()


async def test_interrupted_gc_is_finished_by_the_next_run(
    bucket: FaultyBucket, source: Journal
) -> None:
    await ship(source, bucket, 8)  # 1..9
    await publish_cursor(bucket, "", Cursor("a", "b", 9, 1, 0))
    bucket.fail_next(1, operations=["delete"])
    with pytest.raises(BucketUnavailable):
        await collect_garbage(bucket, "a", ["b"], NO_RETENTION, now_ms=later())
    # the boundary moved first; some entries may be gone, all manifests are still there
    assert await read_gc_boundary(bucket, "", "a") == 8
    res = await collect_garbage(bucket, "a", ["b"], NO_RETENTION, now_ms=later())
    assert res.boundary_after == 8
    assert [i.key for i in await bucket.list("regions/a/log/")] == [log_key("", "a", 9)]
    assert len(await bucket.list("regions/a/manifest/")) == 1


async def test_boundary_is_never_lowered_by_a_slower_gc(
    bucket: FaultyBucket, source: Journal
) -> None:
    await ship(source, bucket, 5)  # 1..6
    await publish_cursor(bucket, "", Cursor("a", "b", 6, 1, 0))
    await bucket.put(gc_boundary_key("", "a"), encode_gc_boundary(100))  # someone went further
    await collect_garbage(bucket, "a", ["b"], NO_RETENTION, now_ms=later())
    assert await read_gc_boundary(bucket, "", "a") == 100


async def test_gc_on_a_hand_made_log_keeps_a_manifest_covering_the_oldest_entry(
    bucket: FaultyBucket,
) -> None:
    log = HandLog(bucket, "a")
    await log.fence()
    for _ in range(3):
        await log.entry({("t", 0): [1]})
    await log.manifest()  # 1..4
    for _ in range(3):
        await log.entry({("t", 0): [1]})
    await log.manifest()  # 5..7
    await log.entry({("t", 0): [1]})  # 8, not in a manifest yet
    await publish_cursor(bucket, "", Cursor("a", "b", 8, 1, 0))
    res = await collect_garbage(bucket, "a", None, NO_RETENTION, now_ms=later())
    assert res.boundary_after == 4
    assert res.cursors == {"b": 8}
    with pytest.raises(NotFound):
        await bucket.head(log_key("", "a", 4))
    await bucket.head(log_key("", "a", 5))
    await trio.lowlevel.checkpoint()


# --------------------------------------------------------------------------
# stores whose compare-and-swap differs (issue 27)


async def _hand_log_with_manifests(bucket: Bucket, manifests: int) -> HandLog:
    log = HandLog(bucket, "a")
    await log.fence()
    for _ in range(manifests):
        await _grow(log)
    return log


async def _grow(log: HandLog) -> None:
    for _ in range(3):
        await log.entry({("t", 0): [1]})
    await log.manifest()


async def test_gc_names_a_store_that_refuses_compare_and_swap(bucket: FaultyBucket) -> None:
    log = await _hand_log_with_manifests(bucket, 2)
    await publish_cursor(bucket, "", Cursor("a", "b", log.seq, 1, 0))
    res = await collect_garbage(bucket, "a", None, NO_RETENTION, now_ms=later())
    assert res.boundary_after == 4  # the boundary was created (if_none_match): no CAS yet
    await _grow(log)
    await publish_cursor(bucket, "", Cursor("a", "b", log.seq, 1, 0))
    bucket.refuse_if_match = True
    with pytest.raises(UnsupportedStore, match="refuses If-Match") as excinfo:
        await collect_garbage(bucket, "a", None, NO_RETENTION, now_ms=later())
    assert "kept changing" not in str(excinfo.value)
    assert bucket.injected == 1  # told at the first refusal, not after 5 attempts
    assert await read_gc_boundary(bucket, "", "a") == 4
    bucket.refuse_if_match = False
    res = await collect_garbage(bucket, "a", None, NO_RETENTION, now_ms=later())
    assert res.boundary_after == 7


async def test_gc_contention_is_not_a_store_refusal(bucket: FaultyBucket) -> None:
    # A rival swaps the boundary between our read and our write every time:
    # that is "kept changing" (retried next interval), never UnsupportedStore.
    log = await _hand_log_with_manifests(bucket, 3)
    await publish_cursor(bucket, "", Cursor("a", "b", log.seq, 1, 0))
    await collect_garbage(bucket, "a", None, NO_RETENTION, now_ms=later())
    inner = bucket.inner
    real_put = inner.put

    async def racing_put(key: str, data: bytes, **kw: object) -> object:
        if kw.get("if_match") is not None:
            # The rival rewrites what was there (one more space: a new ETag).
            old = (await inner.get(key)).data
            await real_put(key, old + b" ")
        return await real_put(key, data, **kw)  # type: ignore[arg-type]

    inner.put = racing_put  # type: ignore[method-assign]
    await _grow(log)
    await publish_cursor(bucket, "", Cursor("a", "b", log.seq, 1, 0))
    with pytest.raises(Unavailable, match="kept changing"):
        await collect_garbage(bucket, "a", None, NO_RETENTION, now_ms=later())


async def test_gc_advances_run_after_run_on_rgw_etags(quirky_s3: Callable[..., str]) -> None:
    # Acceptance of issue 27, on a store that compares If-Match with the bare ETag.
    endpoint = quirky_s3("bare-if-match")
    config = S3Config(
        bucket=new_bucket_on(endpoint),
        endpoint_url=endpoint,
        region=REGION,
        path_style=True,
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
    )
    async with await S3Bucket.open(config) as s3:
        log = await _hand_log_with_manifests(s3, 2)
        boundaries = []
        for _ in range(4):
            await publish_cursor(s3, "", Cursor("a", "b", log.seq, 1, 0))
            res = await collect_garbage(s3, "a", None, NO_RETENTION, now_ms=later())
            boundaries.append(res.boundary_after)
            await _grow(log)
        assert boundaries == [4, 7, 10, 13]
        assert s3.if_match_form == "bare"
        assert await read_gc_boundary(s3, "", "a") == 13
