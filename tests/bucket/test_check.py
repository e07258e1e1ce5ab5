"""``check_store`` (what ``edgegw bucket check`` runs) on every backend, and on
stores that lack what edgegw needs."""

from __future__ import annotations

import pytest

from edge_gateway.bucket import (
    INFO,
    PASS,
    WORKAROUND,
    Bucket,
    BucketUnavailable,
    FaultyBucket,
    check_store,
)


@pytest.mark.conditional
async def test_every_backend_passes_and_is_left_clean(bucket: Bucket) -> None:
    await bucket.put("regions/r1/log/1", b"user data")  # not touched by the check
    report = await check_store(
        bucket, "", racers=12, samples=5, throughput_bytes=1 << 20, object_bytes=256 * 1024
    )
    assert report.ok, report.failures
    multipart = "conditional multipart complete"
    assert {c.result for c in report.checks if c.name != multipart} <= {PASS, INFO}
    # Ceph RGW 16.2 ignores the condition there; edgegw works around it.
    assert next(c for c in report.checks if c.name == multipart).result in {PASS, WORKAROUND}
    assert [c.name for c in report.checks][:3] == [
        "conditional create: new key",
        "conditional create: existing key",
        "conditional create: 12 racers",
    ]
    assert report.figures["samples"] == 5
    assert report.figures["put_p50_ms"] > 0
    assert report.figures["write_mb_s"] > 0
    assert report.leftovers == ()
    assert [i.key for i in await bucket.list()] == ["regions/r1/log/1"]
    doc = report.to_json()
    assert doc["ok"] is True
    assert len(doc["checks"]) == len(report.checks)


async def test_a_store_ignoring_conditions_fails_by_name(bucket: Bucket) -> None:
    ignoring = FaultyBucket(bucket, close_inner=False)
    ignoring.honor_conditions = False
    report = await check_store(ignoring, "p", racers=5, samples=2, throughput_bytes=0)
    assert not report.ok
    failed = {c.name: c.detail for c in report.failures}
    assert "ignores If-None-Match" in failed["conditional create: existing key"]
    assert "5 of 5 concurrent creators succeeded" in failed["conditional create: 5 racers"]
    assert "stale ETag succeeded" in failed["conditional overwrite (If-Match)"]
    assert report.checks[0].result == PASS  # a first create works anywhere
    assert await bucket.list() == []


@pytest.mark.conditional
async def test_a_store_refusing_cas_fails_by_name(bucket: Bucket) -> None:
    refusing = FaultyBucket(bucket, close_inner=False)
    refusing.refuse_if_match = True
    report = await check_store(refusing, racers=3, samples=1, throughput_bytes=0)
    failed = {c.name: c.detail for c in report.failures}
    assert set(failed) == {"conditional overwrite (If-Match)", "conditional overwrite: 3 racers"}
    assert "GC cannot advance" in failed["conditional overwrite (If-Match)"]
    assert next(c for c in report.checks if c.name.endswith("existing key")).result == PASS
    assert await bucket.list() == []


async def test_an_outage_is_not_a_verdict(bucket: Bucket) -> None:
    down = FaultyBucket(bucket, close_inner=False)
    down.outage = True
    with pytest.raises(BucketUnavailable):
        await check_store(down, samples=1, throughput_bytes=0)
