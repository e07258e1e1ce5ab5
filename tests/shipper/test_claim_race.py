"""Whose fence is it? A claim that loses its seq to another writer of the same epoch.

Two gateways of one region (a restore while the old one still runs, two
starts at once) can compute the same next epoch from the same log and race
for the same seq. The loser used to recognise the winner's fence as its own
(its write-ahead state named that epoch) and take the winner's shipped LSN
for its journal's: its own unshipped records were then never shipped. The
claim now records the fence's bytes before the PUT and settles whose the
fence is from them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge_gateway.bucket import Bucket, BucketUnavailable, FaultyBucket, LocalBucket, ObjectInfo
from edge_gateway.format import logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.shipper import Diverged, Shipper, ShipperConfig

FAST = ShipperConfig(flush_interval_ms=20, manifest_every=3, retry_base_s=0.01, retry_cap_s=0.05)
JCFG = JournalConfig(segment_bytes=256 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)


class _Crash(Exception):
    """The process dies here."""


class _TwinTakesTheSeq(FaultyBucket):
    """Before the next fence PUT, another writer creates a fence of the same
    epoch at the same seq (saying it shipped through ``twin_lsn``); then the
    PUT goes on (and loses), or the process 'crashes' if ``crash``."""

    def __init__(self, inner: Bucket, twin_lsn: int, *, crash: bool = False) -> None:
        super().__init__(inner, close_inner=False)
        self.twin_lsn = twin_lsn
        self.crash = crash
        self.raced = False

    async def _put(
        self, key: str, data: bytes, *, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo:
        if "/log/" in key and not self.raced:
            self.raced = True
            ours = logobject.decode_header(data, where=key)
            twin = logobject.encode_fence(ours.region, ours.epoch, ours.seq, self.twin_lsn, 1)
            await self.inner.put(key, twin, if_none_match=True)
            if self.crash:
                raise _Crash
        return await super()._put(key, data, if_none_match=if_none_match, if_match=if_match)


class _AnswerLost(FaultyBucket):
    """The first fence lands, but its answer never comes back."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner, close_inner=False)
        self.lost = False

    async def _put(
        self, key: str, data: bytes, *, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo:
        info = await super()._put(key, data, if_none_match=if_none_match, if_match=if_match)
        if "/log/" in key and not self.lost:
            self.lost = True
            raise BucketUnavailable("connection reset (the fence landed)")
        return info


async def _claimed_before(tmp_path: Path) -> tuple[LocalBucket, Journal]:
    """Region north's log with this journal's fence (epoch 1) as its head, and
    five records appended since, not shipped: the journal of a gateway that
    restarts (its next claim is for epoch 2 at seq 2)."""
    bucket = await LocalBucket.open(tmp_path / "b", create=True)
    j = Journal.open_sync(tmp_path / "j", JCFG)
    await Shipper(j, bucket, "north", config=FAST).claim()
    for i in range(5):
        j.append_nowait("t", 0, encode_batch([f"r{i}".encode()], timestamps=i))
    return bucket, j


async def test_a_fence_of_the_same_epoch_by_another_writer_is_not_taken_for_ours(
    tmp_path: Path,
) -> None:
    bucket, j = await _claimed_before(tmp_path)
    racing = _TwinTakesTheSeq(bucket, twin_lsn=5)
    try:
        with pytest.raises(Diverged, match="another writer"):
            await Shipper(j, racing, "north", config=FAST).claim()
        assert racing.raced
        # Nothing of the journal counts as shipped: the records are still to ship.
        assert j.statistics().first_lsn == 1
    finally:
        j.close_sync()
        await racing.aclose()
        await bucket.aclose()


async def test_a_crash_after_losing_the_race_is_settled_at_the_next_start(
    tmp_path: Path,
) -> None:
    bucket, j = await _claimed_before(tmp_path)
    racing = _TwinTakesTheSeq(bucket, twin_lsn=5, crash=True)
    try:
        with pytest.raises(_Crash):
            await Shipper(j, racing, "north", config=FAST).claim()
        state = json.loads((tmp_path / "j" / "shipper.json").read_text())
        assert state["claim"]["seq"] == 2
        assert state["epoch"] == 2
        # The next start finds the other writer's fence of epoch 2 at the
        # seq it recorded: not its own.
        with pytest.raises(Diverged, match="another writer"):
            await Shipper(j, bucket, "north", config=FAST).claim()
        state = json.loads((tmp_path / "j" / "shipper.json").read_text())
        assert "claim" not in state
        assert state["epoch"] == 1
    finally:
        j.close_sync()
        await racing.aclose()
        await bucket.aclose()


async def test_our_own_fence_with_its_answer_lost_is_ours(tmp_path: Path) -> None:
    bucket, j = await _claimed_before(tmp_path)
    lossy = _AnswerLost(bucket)
    try:
        shipper = Shipper(j, lossy, "north", config=FAST)
        with pytest.raises(BucketUnavailable):
            await shipper.claim()
        await shipper.claim()  # the fence at seq 2 is recognised: epoch 3 at seq 3
        assert shipper.statistics().epoch == 3
        await shipper.ship_pending()
        assert shipper.statistics().shipped_lsn == j.next_lsn - 1
    finally:
        j.close_sync()
        await lossy.aclose()
        await bucket.aclose()
