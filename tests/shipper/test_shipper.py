"""The shipper against real buckets: local directory and S3 over HTTP (moto's server)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trio

from edge_gateway.bucket import (
    Bucket,
    FaultyBucket,
    LocalBucket,
    ObjectInfo,
    UnsupportedStore,
)
from edge_gateway.bucket._delegating import DelegatingBucket
from edge_gateway.bucket_log import find_head, read_header
from edge_gateway.errors import BucketLost, Fenced
from edge_gateway.format import logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.manifest import Manifest, log_key
from edge_gateway.journal import Journal, JournalConfig, SourceCoords
from edge_gateway.shipper import Diverged, Shipper, ShipperConfig

FAST = ShipperConfig(flush_interval_ms=20, manifest_every=3, retry_base_s=0.01, retry_cap_s=0.05)
JCFG = JournalConfig(segment_bytes=256 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)


def value(p: int, o: int) -> bytes:
    return f"rec-{p}-{o}".encode() * 3


def produce(j: Journal, topic: str, partitions: int, batches: int, size: int = 10) -> None:
    for _ in range(batches):
        for p in range(partitions):
            first = j.next_offset(topic, p)
            j.append_nowait(
                topic,
                p,
                encode_batch([value(p, first + i) for i in range(size)], timestamps=first),
            )


async def log_records(
    bucket: Bucket, region: str
) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    """Every record in the region's log, by partition, in log order (checks everything)."""
    head = await find_head(bucket, "", region)
    out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    epochs: list[int] = []
    for seq in range(1, head + 1):
        key = log_key("", region, seq)
        data = (await bucket.get(key)).data
        header = logobject.decode_header(
            data[: logobject.header_length_hint(data[:12], where=key)], where=key
        )
        assert header.seq == seq
        epochs.append(header.epoch)
        for b in header.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.offset + b.stored_length], where=key)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                out.setdefault((b.topic, b.partition), []).extend(
                    (r.offset, r.value) for r in batch.records()
                )
    assert epochs == sorted(epochs), "epochs went down"
    return out


def expected(
    partitions: int, count: int, topic: str = "t"
) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    return {(topic, p): [(o, value(p, o)) for o in range(count)] for p in range(partitions)}


async def test_ship_round_trip_with_manifests(bucket: Bucket, tmp_path: Path) -> None:
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        produce(j, "t", 4, 5)
        s = Shipper(j, bucket, "north", config=FAST)
        await s.claim()
        assert await s.ship_pending() >= 1
        assert await log_records(bucket, "north") == expected(4, 50)
        assert s.shipped_lsn == j.next_lsn - 1
        assert j.safe_lsn == j.next_lsn
        infos = await bucket.list("regions/north/manifest/")
        assert infos
        m = Manifest.decode((await bucket.get(infos[-1].key)).data, where="m")
        assert m.last_seq == await find_head(bucket, "", "north")
        assert m.next_offsets[("t", 0)] == 50
    finally:
        j.close_sync()


async def test_restart_continues_without_gap_or_duplicate(bucket: Bucket, tmp_path: Path) -> None:
    for round_ in range(3):
        j = Journal.open_sync(tmp_path / "j", JCFG)
        try:
            produce(j, "t", 3, 2)
            s = Shipper(j, bucket, "north", config=FAST)
            await s.claim()
            assert s.statistics().epoch == round_ + 1
            await s.ship_pending()
        finally:
            j.close_sync()
    assert await log_records(bucket, "north") == expected(3, 60)


async def test_lost_response_counts_as_committed(tmp_path: Path) -> None:
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        s = Shipper(j, bucket, "north", config=FAST)
        await s.claim()
        produce(j, "t", 2, 1)
        bucket.fail_next(1, after_commit=True, operations=["put"])
        await s.ship_pending()
        assert s.statistics().retries == 1
        produce(j, "t", 2, 1)
        await s.ship_pending()
        assert await log_records(bucket, "north") == expected(2, 20)
    finally:
        j.close_sync()
        await bucket.aclose()


async def test_outage_then_everything_arrives_in_order(tmp_path: Path) -> None:
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        s = Shipper(j, bucket, "north", config=FAST)
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run)
            produce(j, "t", 2, 3)
            with trio.fail_after(10):
                await s.wait_shipped(j.next_lsn - 1)
            bucket.outage = True
            produce(j, "t", 2, 5)  # the journal keeps accepting
            with trio.fail_after(10):
                while s.statistics().retries == 0:  # noqa: ASYNC110 - a statistic, no event
                    await trio.sleep(0.01)
            assert s.shipped_lsn < j.next_lsn - 1
            bucket.outage = False
            with trio.fail_after(10):
                await s.wait_shipped(j.next_lsn - 1)
            nursery.cancel_scope.cancel()
        assert await log_records(bucket, "north") == expected(2, 80)
    finally:
        j.close_sync()
        await bucket.aclose()


async def test_idle_shipper_makes_no_requests(tmp_path: Path) -> None:
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        s = Shipper(j, bucket, "north", config=FAST)
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run)
            produce(j, "t", 1, 1)
            with trio.fail_after(10):
                await s.wait_shipped(j.next_lsn - 1)
            await trio.sleep(0.1)
            before = bucket.statistics().requests
            await trio.sleep(0.5)
            assert bucket.statistics().requests == before
            nursery.cancel_scope.cancel()
    finally:
        j.close_sync()
        await bucket.aclose()


async def test_an_idle_shipper_writes_the_due_manifest_once(tmp_path: Path) -> None:
    # Manifests by time only: what shipped since the last one is summarised
    # when the interval is up, although nothing more is produced; then silence.
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    j = Journal.open_sync(tmp_path / "j", JCFG)
    cfg = dataclasses.replace(FAST, manifest_every=10_000, manifest_interval_ms=300)
    try:
        s = Shipper(j, bucket, "north", config=cfg)
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run)
            produce(j, "t", 1, 1)
            with trio.fail_after(10):
                await s.wait_shipped(j.next_lsn - 1)
            with trio.fail_after(30):
                while s.statistics().manifests == 0:  # noqa: ASYNC110 - polling a counter
                    await trio.sleep(0.05)
            infos = await bucket.list("regions/north/manifest/")
            assert len(infos) == 1
            before = bucket.statistics().requests
            await trio.sleep(1.0)  # three intervals: nothing pending, nothing sent
            assert bucket.statistics().requests == before
            nursery.cancel_scope.cancel()
    finally:
        j.close_sync()
        await bucket.aclose()


async def test_mirror_entries_are_not_shipped(tmp_path: Path) -> None:
    bucket = await LocalBucket.open(tmp_path / "b", create=True)
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        s = Shipper(j, bucket, "north", config=FAST)
        await s.claim()
        await j.append_mirror(
            "south.t", 0, encode_batch([b"m"], timestamps=1), SourceCoords("south", 1, 1)
        )
        produce(j, "t", 1, 1)
        await s.ship_pending()
        assert await log_records(bucket, "north") == expected(1, 10)
        assert s.shipped_lsn == j.next_lsn - 1
    finally:
        j.close_sync()
        await bucket.aclose()


async def test_second_writer_fences_the_first(tmp_path: Path) -> None:
    bucket = await LocalBucket.open(tmp_path / "b", create=True)
    ja = Journal.open_sync(tmp_path / "a", JCFG)
    jb = Journal.open_sync(tmp_path / "bj", JCFG)
    try:
        a = Shipper(ja, bucket, "north", config=FAST)
        await a.claim()
        produce(ja, "t", 2, 2)
        await a.ship_pending()
        # A new, empty gateway for the same region continues the log ...
        b = Shipper(jb, bucket, "north", config=FAST)
        await b.claim()
        assert jb.next_offset("t", 0) == 20
        produce(jb, "t", 2, 1)
        await b.ship_pending()
        # ... and the old one is fenced at its next commit.
        produce(ja, "t", 2, 1)
        with pytest.raises(Fenced):
            await a.ship_pending()
        records = await log_records(bucket, "north")
        assert records == expected(2, 30)
        # The fenced journal cannot simply come back: it holds unshipped data.
        with pytest.raises(Diverged):
            await Shipper(ja, bucket, "north", config=FAST).claim()
    finally:
        ja.close_sync()
        jb.close_sync()
        await bucket.aclose()


async def test_store_without_conditional_create_is_refused(tmp_path: Path) -> None:
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    bucket.honor_conditions = False
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        with pytest.raises(UnsupportedStore, match="cannot be fenced"):
            await Shipper(j, bucket, "north", config=FAST).claim()
    finally:
        j.close_sync()
        await bucket.aclose()


async def test_header_is_read_with_one_ranged_get(tmp_path: Path) -> None:
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        s = Shipper(j, bucket, "north", config=FAST)
        await s.claim()
        produce(j, "t", 50, 1)
        await s.ship_pending()
        before = bucket.statistics().gets
        read = await read_header(bucket, log_key("", "north", 2))
        assert bucket.statistics().gets == before + 1
        assert len(read.header.blocks) == 50
    finally:
        j.close_sync()
        await bucket.aclose()


class _LiveWriterWins(FaultyBucket):
    """The new writer's bucket: before each of its next ``races`` log creates,
    the live writer commits an entry first, taking the seq the fence was for."""

    def __init__(self, inner: Bucket, races: int, live_writer_commits: object) -> None:
        super().__init__(inner, close_inner=False)
        self.races = races
        self.commit = live_writer_commits
        self.listed: list[str] = []

    async def _put(
        self, key: str, data: bytes, *, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo:
        if "/log/" in key and self.races:
            self.races -= 1
            assert callable(self.commit)
            await self.commit()
        return await super()._put(key, data, if_none_match=if_none_match, if_match=if_match)

    async def _list(
        self, prefix: str, *, start_after: str | None, limit: int | None
    ) -> list[ObjectInfo]:
        self.listed.append(prefix)
        return await super()._list(prefix, start_after=start_after, limit=limit)


async def test_a_claim_racing_a_live_writer_lands_then_reads_what_it_skipped(
    tmp_path: Path,
) -> None:
    """A restore while the old gateway still ships: after a lost race the claim goes
    straight to the new head and reads what it skipped once its fence has landed.

    Reading the log again (or even just the new entries) before each retry
    took longer, on a slow or busy link, than the live writer took to commit
    its next entry: the claim did not land for minutes (found by the
    split-brain scenario).
    """
    shared = await LocalBucket.open(tmp_path / "b", create=True)
    ja = Journal.open_sync(tmp_path / "a", JCFG)
    jb = Journal.open_sync(tmp_path / "bj", JCFG)

    async def live_writer_commits() -> None:
        for _ in range(2):  # two entries: the claim skips one it has not read
            produce(ja, "t", 2, 1)
            await a.ship_pending()

    racing = _LiveWriterWins(shared, 3, live_writer_commits)
    try:
        a = Shipper(ja, shared, "north", config=FAST)
        await a.claim()
        produce(ja, "t", 2, 2)
        await a.ship_pending()
        b = Shipper(jb, racing, "north", config=FAST)
        await b.claim()
        assert racing.races == 0
        # The log was loaded once (one LIST of the manifest folder), not after each race.
        assert sum("/manifest/" in p for p in racing.listed) == 1, racing.listed
        # The claim continues after everything the live writer committed ...
        assert jb.next_offset("t", 0) == 80
        produce(jb, "t", 2, 1)
        await b.ship_pending()
        # ... which is fenced at its next commit; nothing it committed is lost.
        produce(ja, "t", 2, 1)
        with pytest.raises(Fenced):
            await a.ship_pending()
        assert await log_records(shared, "north") == expected(2, 90)
    finally:
        ja.close_sync()
        jb.close_sync()
        await racing.aclose()
        await shared.aclose()


async def test_a_journal_of_only_its_first_checkpoint_counts_as_shipped(tmp_path: Path) -> None:
    # A fresh journal holds one entry, the checkpoint that starts its segment:
    # nothing to ship, yet `edgegw sync` waits for it (it once waited for ever).
    bucket = await LocalBucket.open(tmp_path / "b", create=True)
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        assert j.next_lsn - 1 >= 1
        s = Shipper(j, bucket, "north", config=FAST)
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run)
            with trio.fail_after(10):
                await s.wait_shipped(j.next_lsn - 1)
            assert not s.pending()
            assert s.statistics().objects == 0  # nothing went to the bucket for it
            produce(j, "t", 1, 1)
            with trio.fail_after(10):
                await s.wait_shipped(j.next_lsn - 1)
            nursery.cancel_scope.cancel()
        assert await log_records(bucket, "north") == expected(1, 10)
    finally:
        j.close_sync()
        await bucket.aclose()


class _WipedAfterTheCheck(DelegatingBucket):
    """Empties itself right after the shipper's first log-still-there HEAD
    (before the manifest it checks for lands): a bucket wiped in that window."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner)
        self.armed = False
        self.wiped = False

    async def _head(self, key: str) -> ObjectInfo:
        info = await self.inner.head(key)
        if self.armed and not self.wiped and "/log/" in key:
            self.wiped = True
            for o in await self.inner.list("regions/"):
                await self.inner.delete(o.key)
        return info


async def test_a_bucket_wiped_between_the_check_and_the_manifest_is_lost_at_the_next_one(
    tmp_path: Path,
) -> None:
    # The manifest written right after the wipe lands in the empty bucket; it
    # must not vouch for the log at the next check: the entries it covers are
    # gone (they were created before the check).
    bucket = _WipedAfterTheCheck(await LocalBucket.open(tmp_path / "b", create=True))
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        s = Shipper(j, bucket, "north", config=FAST)
        await s.claim()
        produce(j, "t", 1, 2)
        bucket.armed = True
        await s.ship_pending()  # its entries, the check, the wipe, then its manifest
        assert bucket.wiped
        left = [o.key for o in await bucket.list("regions/")]
        assert left == [o.key for o in await bucket.list("regions/north/manifest/")]
        assert len(left) == 1
        produce(j, "t", 1, 1)
        with pytest.raises(BucketLost, match="is gone"):
            await s.ship_pending()
    finally:
        j.close_sync()
        await bucket.aclose()
