"""Telling an edgegw bucket from any other (``edge_gateway.regionlog.is_edgegw_bucket``),
on every backend: its marker, or -- for buckets written before the marker existed --
objects of the layout under ``regions/``."""

from __future__ import annotations

import json

import pytest

from edge_gateway.bucket import Bucket
from edge_gateway.errors import CorruptData
from edge_gateway.regionlog import BUCKET_MARKER, bucket_marker_key, is_edgegw_bucket, mark_bucket


@pytest.mark.parametrize("prefix", ["", "fleet/a"])
async def test_empty_and_foreign_buckets_are_not_edgegws(bucket: Bucket, prefix: str) -> None:
    assert not await is_edgegw_bucket(bucket, prefix)
    await bucket.put("photos/cat.jpg", b"\xff\xd8")
    await bucket.put(f"{prefix}/regions/notes.txt".lstrip("/"), b"not a layout key")
    assert not await is_edgegw_bucket(bucket, prefix)


@pytest.mark.parametrize("prefix", ["", "fleet/a"])
async def test_the_marker_makes_an_edgegw_bucket_once(bucket: Bucket, prefix: str) -> None:
    assert await mark_bucket(bucket, prefix, "north", 1_700_000_000_000)
    assert await is_edgegw_bucket(bucket, prefix)
    # Create-only: a second first user does not replace it.
    assert not await mark_bucket(bucket, prefix, "south", 1_700_000_000_001)
    doc = json.loads((await bucket.get(bucket_marker_key(prefix))).data)
    assert doc["created_by"] == "north"
    # Under another prefix it is another bucket.
    assert not await is_edgegw_bucket(bucket, "elsewhere")


@pytest.mark.parametrize(
    "key",
    [
        "regions/north/log/00000000000000000001.egw",
        "regions/north/manifest/00000000000000000100.json",
        "regions/north/gc-boundary.json",
        "regions/north/cursors/south.json",
    ],
)
async def test_buckets_without_marker_count_by_their_layout(bucket: Bucket, key: str) -> None:
    await bucket.put(key, b"x")
    assert await is_edgegw_bucket(bucket, "")


async def test_a_foreign_file_under_the_marker_name_is_refused(bucket: Bucket) -> None:
    await bucket.put(BUCKET_MARKER, b'{"format": "something-else", "version": 1}')
    with pytest.raises(CorruptData, match="malformed bucket marker"):
        await is_edgegw_bucket(bucket, "")
