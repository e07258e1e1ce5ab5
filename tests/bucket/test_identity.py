"""Telling an edgegw bucket from any other (``edge_gateway.bucket_log.is_edgegw_bucket``),
on every backend: its marker, or -- for buckets written before the marker existed,
and when the marker is malformed -- objects of the layout under ``regions/``."""

from __future__ import annotations

import json
import logging

import pytest

from edge_gateway.bucket import Bucket
from edge_gateway.bucket_log import (
    bucket_marker_key,
    is_edgegw_bucket,
    mark_bucket,
    write_bucket_marker,
)


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


_MALFORMED = [
    pytest.param(b'{"format": "something-else", "version": 1}', id="another-format"),
    pytest.param(b"\x00garbage from a stolen key", id="garbage"),
    pytest.param(b"", id="empty"),
    pytest.param(b'["format", "edgegw-bucket"]', id="not-an-object"),
]


@pytest.mark.parametrize("content", _MALFORMED)
@pytest.mark.parametrize("prefix", ["", "fleet/a"])
async def test_a_malformed_marker_degrades_to_the_layout_check_with_a_warning(
    bucket: Bucket, prefix: str, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 41.3: whoever overwrote the marker must not stop sync/restore/reship at every site."""
    key = bucket_marker_key(prefix)
    await bucket.put(key, content)
    with caplog.at_level(logging.WARNING, logger="edgegw.regionlog"):
        # Only a malformed marker: an empty layout is no edgegw bucket (a typo is still caught)...
        assert not await is_edgegw_bucket(bucket, prefix)
        # ... and the region logs make it one.
        await bucket.put(f"{prefix}/regions/north/log/{1:020d}.egw".lstrip("/"), b"x")
        assert await is_edgegw_bucket(bucket, prefix)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, caplog.text
    text = warnings[0].getMessage()
    assert key in text, text
    assert bucket.describe() in text, text
    assert "malformed" in text, text
    assert "edgegw bucket mark" in text, text  # what to do


async def test_the_admin_writes_the_marker_and_replaces_only_a_malformed_one(
    bucket: Bucket,
) -> None:
    key = bucket_marker_key("fleet")
    assert await write_bucket_marker(bucket, "fleet", 1_700_000_000_000) == ("created", b"")
    first = (await bucket.get(key)).data
    assert json.loads(first)["created_by"] == "admin"
    # A valid marker is kept as it is.
    assert await write_bucket_marker(bucket, "fleet", 1_700_000_000_001) == ("present", first)
    assert (await bucket.get(key)).data == first
    # A malformed one is replaced, and what it held comes back as evidence.
    await bucket.put(key, b"overwritten")
    assert await write_bucket_marker(bucket, "fleet", 1_700_000_000_002) == (
        "replaced",
        b"overwritten",
    )
    doc = json.loads((await bucket.get(key)).data)
    assert doc["created_ms"] == 1_700_000_000_002
    assert await is_edgegw_bucket(bucket, "fleet")
