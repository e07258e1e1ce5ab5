"""The contract every bucket backend keeps (run once per backend via ``bucket``).

Like litestream's replica-client suite: one set of tests, every backend.
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime

import pytest
import trio
from _bucket_support import MIB, Opener

from edge_gateway.bucket import (
    Bucket,
    BucketUnavailable,
    FaultyBucket,
    InvalidRequest,
    NotFound,
    ObjectInfo,
    PreconditionFailed,
    UnsupportedStore,
    verify_conditional_create,
)
from edge_gateway.errors import ClosedError, InvalidInput

# -- put / get / head ---------------------------------------------------------


async def test_put_then_get_head_agree(bucket: Bucket) -> None:
    info = await bucket.put("regions/r1/log/00000000000000000001.eglog", b"hello edge")
    assert info.key == "regions/r1/log/00000000000000000001.eglog"
    assert info.size == 10
    assert info.etag
    assert info.last_modified.tzinfo is not None

    got = await bucket.get(info.key)
    assert got.data == b"hello edge"
    assert (got.start, got.end, got.size) == (0, 10, 10)
    assert got.is_whole
    assert got.etag == info.etag

    head = await bucket.head(info.key)
    assert (head.key, head.size, head.etag) == (info.key, 10, info.etag)
    assert isinstance(head.last_modified, datetime)
    assert got.info == head


async def test_empty_object(bucket: Bucket) -> None:
    await bucket.put("empty", b"")
    got = await bucket.get("empty")
    assert (got.data, got.size) == (b"", 0)
    assert (await bucket.head("empty")).size == 0
    ranged = await bucket.get("empty", start=0, end=10)
    assert (ranged.data, ranged.start, ranged.size) == (b"", 0, 0)


async def test_unconditional_put_replaces(bucket: Bucket) -> None:
    first = await bucket.put("k", b"one")
    second = await bucket.put("k", b"two, longer")
    assert first.etag != second.etag
    got = await bucket.get("k")
    assert (got.data, got.etag) == (b"two, longer", second.etag)


async def test_missing_key_is_not_found(bucket: Bucket) -> None:
    with pytest.raises(NotFound) as excinfo:
        await bucket.get("regions/r1/log/00000000000000000042.eglog")
    assert excinfo.value.key == "regions/r1/log/00000000000000000042.eglog"
    with pytest.raises(NotFound):
        await bucket.head("nothing/here")
    with pytest.raises(NotFound):
        await bucket.get("nothing/here", start=0, end=5)


async def test_a_prefix_of_keys_is_not_an_object(bucket: Bucket) -> None:
    await bucket.put("dir/child", b"x")
    with pytest.raises(NotFound):
        await bucket.get("dir")
    with pytest.raises(NotFound):
        await bucket.head("dir")
    with pytest.raises(NotFound):
        await bucket.get("dir/child/grandchild")


# -- create-only ----------------------------------------------------------------


@pytest.mark.conditional
async def test_create_only_refuses_existing_key(bucket: Bucket) -> None:
    created = await bucket.put("log/1", b"first", if_none_match=True)
    with pytest.raises(PreconditionFailed) as excinfo:
        await bucket.put("log/1", b"second", if_none_match=True)
    assert excinfo.value.key == "log/1"
    got = await bucket.get("log/1")
    assert (got.data, got.etag) == (b"first", created.etag)


@pytest.mark.conditional
async def test_concurrent_creators_exactly_one_wins(bucket: Bucket) -> None:
    writers = 8
    for round_ in range(3):
        key = f"race/seq-{round_}"
        winners: list[int] = []
        losers: list[int] = []

        async def create(index: int, key: str, winners: list[int], losers: list[int]) -> None:
            try:
                await bucket.put(key, f"writer {index}".encode(), if_none_match=True)
            except PreconditionFailed:
                losers.append(index)
            else:
                winners.append(index)

        async with trio.open_nursery() as nursery:
            for index in range(writers):
                nursery.start_soon(create, index, key, winners, losers)
        assert len(winners) == 1, (key, winners)
        assert len(losers) == writers - 1
        assert (await bucket.get(key)).data == f"writer {winners[0]}".encode()


async def test_create_after_delete_succeeds(bucket: Bucket) -> None:
    await bucket.put("gc/1", b"old", if_none_match=True)
    await bucket.delete("gc/1")
    await bucket.put("gc/1", b"new", if_none_match=True)
    assert (await bucket.get("gc/1")).data == b"new"


# -- compare-and-swap ------------------------------------------------------------


async def test_if_match_replaces_current_version(bucket: Bucket) -> None:
    v1 = await bucket.put("cursors/r2.json", b'{"seq": 1}')
    v2 = await bucket.put("cursors/r2.json", b'{"seq": 2}', if_match=v1.etag)
    assert v2.etag != v1.etag
    assert (await bucket.get("cursors/r2.json")).data == b'{"seq": 2}'


@pytest.mark.conditional
async def test_if_match_with_stale_etag_fails(bucket: Bucket) -> None:
    v1 = await bucket.put("cursors/r2.json", b'{"seq": 1}')
    await bucket.put("cursors/r2.json", b'{"seq": 2}', if_match=v1.etag)
    with pytest.raises(PreconditionFailed):
        await bucket.put("cursors/r2.json", b'{"seq": 3}', if_match=v1.etag)
    assert (await bucket.get("cursors/r2.json")).data == b'{"seq": 2}'


@pytest.mark.conditional
async def test_if_match_on_missing_key_is_not_found(bucket: Bucket) -> None:
    etag = (await bucket.put("other", b"x")).etag
    with pytest.raises(NotFound):
        await bucket.put("cursors/none.json", b"{}", if_match=etag)
    with pytest.raises(NotFound):
        await bucket.head("cursors/none.json")


@pytest.mark.conditional
async def test_concurrent_compare_and_swap_exactly_one_wins(bucket: Bucket) -> None:
    base = await bucket.put("gc-boundary.json", b'{"seq": 0}')
    outcomes: list[bool] = []

    async def swap(index: int) -> None:
        try:
            await bucket.put("gc-boundary.json", f'{{"seq": {index}}}'.encode(), if_match=base.etag)
        except PreconditionFailed:
            outcomes.append(False)
        else:
            outcomes.append(True)

    async with trio.open_nursery() as nursery:
        for index in range(1, 9):
            nursery.start_soon(swap, index)
    assert outcomes.count(True) == 1
    assert outcomes.count(False) == 7


async def test_conditions_are_exclusive(bucket: Bucket) -> None:
    with pytest.raises(InvalidRequest):
        await bucket.put("k", b"x", if_none_match=True, if_match='"abc"')
    with pytest.raises(InvalidRequest):
        await bucket.put("k", b"x", if_match="")


# -- ranged reads -----------------------------------------------------------------

RANGES = [
    (None, None),
    (0, None),
    (3, None),
    (None, 4),
    (0, 1),
    (2, 7),
    (9, 10),
    (5, 100),  # past the end: clipped
    (10, None),  # at the end: nothing
    (10, 20),
    (25, 30),  # beyond the end: nothing
    (4, 4),  # empty range inside
    (0, 0),
]


async def test_ranged_reads_follow_slice_semantics(bucket: Bucket) -> None:
    content = b"0123456789"
    info = await bucket.put("r", content)
    for start, end in RANGES:
        got = await bucket.get("r", start=start, end=end)
        expected = content[start or 0 : end]
        assert got.data == expected, (start, end)
        assert got.start == min(start or 0, len(content)), (start, end)
        assert got.size == len(content), (start, end)
        assert got.etag == info.etag, (start, end)


async def test_invalid_ranges_are_refused(bucket: Bucket) -> None:
    await bucket.put("r", b"0123456789")
    with pytest.raises(InvalidRequest):
        await bucket.get("r", start=-1)
    with pytest.raises(InvalidRequest):
        await bucket.get("r", end=-2)
    with pytest.raises(InvalidRequest):
        await bucket.get("r", start=5, end=4)


# -- large objects (multipart on S3) ----------------------------------------------


@pytest.mark.conditional
async def test_large_object_create_only_and_ranges(bucket: Bucket) -> None:
    # 11 MiB: above the S3 fixture's 5 MiB threshold, so three parts there.
    data = os.urandom(11 * MIB + 123)
    info = await bucket.put("regions/r1/log/big", data, if_none_match=True)
    assert info.size == len(data)

    got = await bucket.get("regions/r1/log/big")
    assert hashlib.sha256(got.data).digest() == hashlib.sha256(data).digest()
    assert got.etag == info.etag
    # A range that straddles the first part boundary.
    boundary = 5 * MIB
    part = await bucket.get("regions/r1/log/big", start=boundary - 10, end=boundary + 10)
    assert part.data == data[boundary - 10 : boundary + 10]
    assert part.size == len(data)

    with pytest.raises(PreconditionFailed):
        await bucket.put("regions/r1/log/big", data[: 6 * MIB], if_none_match=True)
    assert (await bucket.head("regions/r1/log/big")).etag == info.etag


async def test_abort_incomplete_uploads_leaves_objects_alone(bucket: Bucket) -> None:
    # A completed upload (multipart on S3) is an object, not leftover state:
    # a backend aborts only what never completed, here nothing.
    data = os.urandom(6 * MIB)
    await bucket.put("regions/r1/log/big", data, if_none_match=True)
    assert await bucket.abort_incomplete_uploads("regions/r1/log/") == 0
    assert (await bucket.get("regions/r1/log/big")).data == data


# -- list ----------------------------------------------------------------------------


def _keys(infos: list[ObjectInfo]) -> list[str]:
    return [info.key for info in infos]


async def test_list_sorted_with_prefix_start_after_and_limit(bucket: Bucket) -> None:
    keys = [f"regions/r1/log/{seq:020d}.eglog" for seq in range(20)]
    other = ["regions/r1/manifest/00000000000000000000.json", "regions/r2/log/x", "top"]
    async with trio.open_nursery() as nursery:
        for key in reversed(keys + other):
            nursery.start_soon(bucket.put, key, key.encode())

    listed = await bucket.list("regions/r1/log/")
    assert _keys(listed) == keys
    assert all(info.size == len(info.key) for info in listed)
    assert listed[3].etag == (await bucket.head(keys[3])).etag

    assert _keys(await bucket.list()) == sorted(keys + other)
    assert _keys(await bucket.list("regions/r1/log/", start_after=keys[4])) == keys[5:]
    assert _keys(await bucket.list("regions/r1/log/", limit=8)) == keys[:8]
    assert _keys(await bucket.list("regions/r1/log/", start_after=keys[4], limit=9)) == keys[5:14]
    assert _keys(await bucket.list("regions/r1/log/", start_after=keys[-1])) == []
    assert await bucket.list("regions/r1/log/", limit=0) == []
    # A prefix need not end at a '/'.
    assert _keys(await bucket.list("regions/r1/log/0000000000000000001")) == keys[10:]
    assert _keys(await bucket.list("regions/r")) == sorted([*keys, *other[:2]])
    assert await bucket.list("regions/r3/") == []
    # start_after before the prefix, or in another directory.
    assert _keys(await bucket.list("regions/r1/log/", start_after="a")) == keys
    assert _keys(await bucket.list("", start_after="regions/r1/manifest/")) == other


async def test_list_orders_like_s3_across_directories(bucket: Bucket) -> None:
    # '-' < '/' < '0': a per-directory walk would put "p/a/b" first.
    keys = ["p/a0", "p/a/b", "p/a-c"]
    for key in keys:
        await bucket.put(key, b".")
    assert _keys(await bucket.list("p/")) == ["p/a-c", "p/a/b", "p/a0"]
    assert _keys(await bucket.list("p/a")) == ["p/a-c", "p/a/b", "p/a0"]
    assert _keys(await bucket.list("p/a/")) == ["p/a/b"]
    assert _keys(await bucket.list("p/", start_after="p/a-c")) == ["p/a/b", "p/a0"]
    assert _keys(await bucket.list("p/", start_after="p/a/b")) == ["p/a0"]


async def test_list_rejects_impossible_prefixes(bucket: Bucket) -> None:
    for prefix in ("/abs", "a//", "../", "a/../"):
        with pytest.raises(InvalidRequest):
            await bucket.list(prefix)
    with pytest.raises(InvalidRequest):
        await bucket.list("a/", limit=-1)


# -- delete ------------------------------------------------------------------------------


async def test_delete_is_idempotent(bucket: Bucket) -> None:
    await bucket.put("d/x", b"x")
    await bucket.delete("d/x")
    await bucket.delete("d/x")
    await bucket.delete("never/existed")
    with pytest.raises(NotFound):
        await bucket.get("d/x")
    assert await bucket.list("d/") == []
    # Once "d/x" is gone, "d" can be an object (on a directory backend too).
    await bucket.put("d", b"now an object")
    assert (await bucket.get("d")).data == b"now an object"


# -- keys ------------------------------------------------------------------------------------

BAD_KEYS = [
    "",
    "/abs",
    "trailing/",
    "double//slash",
    "..",
    "../escape",
    "a/./b",
    "a/../b",
    "back\\slash",
    "nul\x00",
    "tab\tkey",
    "x" * 1025,
    "\udc80",
]


async def test_invalid_keys_are_refused_before_any_request(bucket: Bucket) -> None:
    for key in BAD_KEYS:
        with pytest.raises(InvalidRequest):
            await bucket.put(key, b"x")
        with pytest.raises(InvalidRequest):
            await bucket.get(key)
        with pytest.raises(InvalidRequest):
            await bucket.head(key)
        with pytest.raises(InvalidRequest):
            await bucket.delete(key)
    assert bucket.statistics().requests == 0
    with pytest.raises(InvalidInput):  # the project-wide base class
        await bucket.put(123, b"x")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        await bucket.put("k", "not bytes")  # type: ignore[arg-type]


async def test_unusual_but_valid_keys_round_trip(bucket: Bucket) -> None:
    for key in ("a b", "ünïcödé/ключ", "dots.../x", ".hidden/y", "-dash", "x" * 200):
        await bucket.put(key, key.encode())
        assert (await bucket.get(key)).data == key.encode()
    assert len(await bucket.list()) == 6


# -- statistics and lifecycle ------------------------------------------------------------------


@pytest.mark.conditional
async def test_statistics_count_calls_bytes_and_answers(bucket: Bucket) -> None:
    await bucket.put("s/1", b"12345", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        await bucket.put("s/1", b"12345", if_none_match=True)
    await bucket.get("s/1", start=1, end=3)
    with pytest.raises(NotFound):
        await bucket.get("s/2")
    await bucket.head("s/1")
    await bucket.list("s/")
    await bucket.delete("s/1")
    stats = bucket.statistics()
    assert (stats.puts, stats.gets, stats.heads, stats.lists, stats.deletes) == (2, 2, 1, 1, 1)
    assert stats.requests == 7
    assert stats.bytes_written == 5
    assert stats.bytes_read == 2
    assert (stats.precondition_failed, stats.not_found, stats.errors) == (1, 1, 0)
    with pytest.raises(AttributeError):
        stats.puts = 0  # type: ignore[misc]


async def test_closed_bucket_refuses_calls(bucket_opener: Opener) -> None:
    async with await bucket_opener() as opened:
        await opened.put("k", b"v")
    assert opened.closed
    with pytest.raises(ClosedError):
        await opened.get("k")
    with pytest.raises(ClosedError):
        await opened.put("k", b"v")
    await opened.aclose()  # idempotent


# -- the conditional-create probe ------------------------------------------------------------


@pytest.mark.conditional
async def test_probe_accepts_real_backend_and_cleans_up(bucket: Bucket) -> None:
    await verify_conditional_create(bucket, "regions/")
    await verify_conditional_create(bucket)
    assert await bucket.list() == []


async def test_probe_refuses_store_ignoring_conditions(bucket: Bucket) -> None:
    ignoring = FaultyBucket(bucket, close_inner=False)
    ignoring.honor_conditions = False
    with pytest.raises(UnsupportedStore) as excinfo:
        await verify_conditional_create(ignoring, "regions")
    message = str(excinfo.value)
    assert bucket.describe() in message
    assert "fenc" in message
    assert await bucket.list() == []


async def test_probe_propagates_outage(bucket: Bucket) -> None:
    down = FaultyBucket(bucket, close_inner=False)
    down.outage = True
    with pytest.raises(BucketUnavailable):
        await verify_conditional_create(down)
