"""FaultyBucket: each fault does what it says, on top of a local bucket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from edge_gateway.bucket import (
    BucketUnavailable,
    FaultyBucket,
    InvalidRequest,
    LocalBucket,
    PreconditionFailed,
)
from edge_gateway.errors import Unavailable as ProjectUnavailable


@pytest.fixture
async def inner(tmp_path: Path) -> AsyncIterator[LocalBucket]:
    bucket = await LocalBucket.open(tmp_path / "bucket", create=True)
    try:
        yield bucket
    finally:
        await bucket.aclose()


@pytest.fixture
def faulty(inner: LocalBucket) -> FaultyBucket:
    return FaultyBucket(inner, seed=1234, close_inner=False)


async def test_outage_fails_every_call_without_reaching_the_store(
    faulty: FaultyBucket, inner: LocalBucket
) -> None:
    await faulty.put("k", b"v")
    before = inner.statistics().requests
    faulty.outage = True
    with pytest.raises(BucketUnavailable, match="injected outage"):
        await faulty.put("k2", b"v")
    with pytest.raises(BucketUnavailable):
        await faulty.get("k")
    with pytest.raises(BucketUnavailable):
        await faulty.head("k")
    with pytest.raises(BucketUnavailable):
        await faulty.list("")
    with pytest.raises(ProjectUnavailable):  # callers catch the project's class
        await faulty.delete("k")
    assert inner.statistics().requests == before
    assert faulty.injected == 5
    assert faulty.statistics().unavailable == 5

    faulty.outage = False
    assert (await faulty.get("k")).data == b"v"


async def test_outage_limited_to_selected_operations(faulty: FaultyBucket) -> None:
    await faulty.put("k", b"v")
    faulty.operations = {"put", "delete"}
    faulty.outage = True
    assert (await faulty.get("k")).data == b"v"
    assert [info.key for info in await faulty.list()] == ["k"]
    with pytest.raises(BucketUnavailable):
        await faulty.put("k", b"w")
    with pytest.raises(BucketUnavailable):
        await faulty.delete("k")
    assert faulty.operations == frozenset({"put", "delete"})


async def test_unknown_operation_names_are_refused(faulty: FaultyBucket) -> None:
    with pytest.raises(InvalidRequest, match="unknown operations"):
        faulty.operations = {"put", "patch"}
    with pytest.raises(InvalidRequest):
        faulty.fail_next(operations=["gets"])


async def test_latency_delays_selected_calls(faulty: FaultyBucket) -> None:
    await faulty.put("k", b"v")
    faulty.latency = 0.05
    faulty.operations = {"get"}
    start = trio.current_time()
    await faulty.get("k")
    assert trio.current_time() - start >= 0.05
    start = trio.current_time()
    await faulty.head("k")
    assert trio.current_time() - start < 0.05


async def test_error_rate_is_seeded_and_reproducible(inner: LocalBucket) -> None:
    await inner.put("k", b"v")

    async def pattern(seed: int) -> list[bool]:
        bucket = FaultyBucket(inner, seed=seed, close_inner=False)
        bucket.error_rate = 0.5
        outcomes = []
        for _ in range(40):
            try:
                await bucket.head("k")
            except BucketUnavailable:
                outcomes.append(False)
            else:
                outcomes.append(True)
        return outcomes

    first = await pattern(7)
    assert first == await pattern(7)
    assert 5 < first.count(False) < 35
    assert first != await pattern(8)


async def test_failure_before_commit_does_not_store(
    faulty: FaultyBucket, inner: LocalBucket
) -> None:
    faulty.fail_next(operations={"put"})
    with pytest.raises(BucketUnavailable, match="scripted failure"):
        await faulty.put("log/1", b"entry", if_none_match=True)
    assert await inner.list() == []
    await faulty.put("log/1", b"entry", if_none_match=True)


async def test_lost_response_after_commit(faulty: FaultyBucket, inner: LocalBucket) -> None:
    # The write lands but the caller sees a failure; its retry of the
    # create-only put then meets its own object (the shipper reads it back).
    faulty.fail_next(after_commit=True, operations={"put"})
    with pytest.raises(BucketUnavailable, match="lost response"):
        await faulty.put("log/1", b"entry", if_none_match=True)
    assert (await inner.get("log/1")).data == b"entry"
    with pytest.raises(PreconditionFailed):
        await faulty.put("log/1", b"entry", if_none_match=True)
    assert (await faulty.get("log/1")).data == b"entry"


async def test_fail_next_counts_down_and_filters(faulty: FaultyBucket) -> None:
    await faulty.put("k", b"v")
    faulty.fail_next(2, operations={"get"})
    await faulty.head("k")  # not selected: does not use up the count
    for _ in range(2):
        with pytest.raises(BucketUnavailable):
            await faulty.get("k")
    assert (await faulty.get("k")).data == b"v"


async def test_random_lost_responses(faulty: FaultyBucket, inner: LocalBucket) -> None:
    faulty.lost_response_rate = 1.0
    faulty.operations = {"put"}
    with pytest.raises(BucketUnavailable):
        await faulty.put("k", b"v")
    assert (await inner.get("k")).data == b"v"


async def test_ignoring_conditions(faulty: FaultyBucket) -> None:
    faulty.honor_conditions = False
    first = await faulty.put("k", b"one", if_none_match=True)
    await faulty.put("k", b"two", if_none_match=True)
    await faulty.put("k", b"three", if_match=first.etag)
    assert (await faulty.get("k")).data == b"three"


async def test_aclose_closes_inner_by_default(tmp_path: Path) -> None:
    inner = await LocalBucket.open(tmp_path / "bucket", create=True)
    async with FaultyBucket(inner) as faulty:
        assert faulty.name == "faulty+" + inner.name
        assert "fault-injecting" in faulty.describe()
    assert inner.closed
