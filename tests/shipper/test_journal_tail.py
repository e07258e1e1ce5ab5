"""The journal's end against what shipper.json says was shipped, before intake opens (issue 41).

``sent`` (per lane, written before each create) and ``log_lsn`` (confirmed at
claims and manifests) let a start tell, from local state, a journal that
lost entries the bucket holds: ``run`` refuses it (``Diverged``) or holds
intake until the claim compared it with the log's head. And a claim after
``reset`` (the supervisor's restart) resumes the process's epoch.
tests/system/test_journal_tail_lost.py runs the operator's scenario with
real processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from test_shipper import FAST, JCFG, expected, log_records, produce

from edge_gateway.bucket import FaultyBucket, LocalBucket
from edge_gateway.journal import Journal
from edge_gateway.shipper import Diverged, Shipper
from edge_gateway.statefile import seal


def _state(j: Journal) -> dict[str, object]:
    doc: dict[str, object] = json.loads((j.path / "shipper.json").read_text())
    return doc


def _edit_state(j: Journal, **fields: object) -> None:
    doc = _state(j)
    doc.update(fields)
    (j.path / "shipper.json").write_bytes(seal(doc))  # resealed: an edit, not damage


async def _shipped_journal(tmp_path: Path, bucket: FaultyBucket) -> int:
    """A journal with two batches per partition, all shipped; its last LSN."""
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        s = Shipper(j, bucket, "north", config=FAST)
        await s.claim()
        produce(j, "t", 2, 2)
        await s.ship_pending()
        return j.next_lsn - 1
    finally:
        j.close_sync()


async def test_the_lsns_sent_are_recorded_before_the_create(tmp_path: Path) -> None:
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        s = Shipper(j, bucket, "north", config=FAST)
        await s.claim()
        produce(j, "t", 2, 1)
        last = j.next_lsn - 1
        bucket.operations = {"put"}
        bucket.outage = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(s.ship_pending)
            with trio.fail_after(10):
                while s.statistics().retries == 0:  # noqa: ASYNC110 - a statistic, no event
                    await trio.sleep(0.01)
            # The create has not landed, and shipper.json already holds its LSNs.
            assert s.shipped_lsn < last
            assert _state(j)["sent"] == {"0": last}
            bucket.outage = False
        assert s.shipped_lsn == last
    finally:
        j.close_sync()
        await bucket.aclose()


async def test_a_journal_below_what_the_bucket_confirmed_is_refused_without_the_bucket(
    tmp_path: Path,
) -> None:
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    last = await _shipped_journal(tmp_path, bucket)
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        # As if the journal's last entries had gone (a segment moved aside):
        # shipper.json says the bucket confirmed more than the journal holds.
        _edit_state(j, log_lsn=last + 3, sent={"0": last + 3})
        bucket.outage = True  # the check needs no bucket
        before = bucket.statistics()
        s = Shipper(j, bucket, "north", config=FAST)
        with trio.fail_after(10), pytest.raises(Diverged) as refused:
            await s.run()
        assert f"ends at LSN {last}, but the bucket confirmed it through LSN {last + 3}" in str(
            refused.value
        )
        assert "Run `edgegw restore`" in str(refused.value)
        assert bucket.statistics() == before  # not one request, not even a failed one
        assert j.next_lsn == last + 1  # nothing appended
    finally:
        j.close_sync()
        await bucket.aclose()


async def test_a_journal_below_what_it_sent_holds_intake_until_the_claim(
    tmp_path: Path,
) -> None:
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    last = await _shipped_journal(tmp_path, bucket)
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        # Sent beyond the journal's end, not confirmed: those creates may not
        # have landed. Without the bucket, the shipper does not report ready.
        _edit_state(j, sent={"0": last + 3})
        bucket.outage = True
        s = Shipper(j, bucket, "north", config=FAST)
        async with trio.open_nursery() as nursery:
            with trio.move_on_after(0.5) as waited:
                await nursery.start(s.run)
            assert waited.cancelled_caught, "ready before the claim"
            assert s.intake_hold is not None
            assert f"ends at LSN {last} but sent LSNs up to {last + 3}" in s.intake_hold
            # The bucket answers: its head is the journal's end, so those
            # creates never landed, and the start goes on.
            bucket.outage = False
            with trio.fail_after(10):
                await nursery.start(s.run)
            assert s.intake_hold is None
            assert _state(j)["sent"] == {"0": last}  # lined up with the log
            produce(j, "t", 2, 1)
            with trio.fail_after(10):
                await s.wait_shipped(j.next_lsn - 1)
            nursery.cancel_scope.cancel()
        assert await log_records(bucket, "north") == expected(2, 30)
    finally:
        j.close_sync()
        await bucket.aclose()


async def test_a_journal_below_the_logs_head_is_refused_at_the_claim(tmp_path: Path) -> None:
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        s = Shipper(j, bucket, "north", config=FAST)
        await s.claim()
        produce(j, "t", 2, 2)
        await s.ship_pending()
        last = j.next_lsn - 1
    finally:
        j.close_sync()
    # Another journal directory that ends lower, with the first one's shipper.json.
    k = Journal.open_sync(tmp_path / "k", JCFG)
    try:
        produce(k, "t", 2, 1)
        assert k.next_lsn - 1 < last
        (k.path / "shipper.json").write_text((j.path / "shipper.json").read_text())
        _edit_state(k, log_lsn=0)  # only "sent" tells
        s = Shipper(k, bucket, "north", config=FAST)
        with (
            trio.fail_after(10),
            pytest.raises(Diverged, match="the journal lost entries the bucket holds"),
        ):
            await s.run()
        assert s.intake_hold is not None  # held until the claim refused it
    finally:
        k.close_sync()
        await bucket.aclose()


async def test_a_restart_in_the_process_resumes_its_epoch(tmp_path: Path) -> None:
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        s = Shipper(j, bucket, "north", config=FAST)
        await s.claim()
        for _ in range(3):
            produce(j, "t", 2, 1)
            await s.ship_pending()
            s.reset()  # what the supervisor does before a restart
            await s.claim()
        stats = s.statistics()
        assert (stats.epoch, stats.fences) == (1, 1)
        produce(j, "t", 2, 1)
        await s.ship_pending()
        assert await log_records(bucket, "north") == expected(2, 40)
        # A new process (a new shipper) claims a new epoch, with a fence.
        t = Shipper(j, bucket, "north", config=FAST)
        await t.claim()
        assert t.statistics().epoch == 2
    finally:
        j.close_sync()
        await bucket.aclose()
