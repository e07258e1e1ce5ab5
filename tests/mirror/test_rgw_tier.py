"""edgegw on a real Ceph RGW 16.2 (``-m rgw``; ``make test-stores``): fencing,
multipart-sized log objects, mirroring and bucket GC (issues 20 and 27).

RGW compares ``If-Match`` with the bare ETag and ignores ``If-None-Match`` on
CompleteMultipartUpload; edgegw learns the first and works around the second
(docs/bucket.md). These tests run the real shipper, tailer and GC against it.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from _mirror_support import log_records, mirror_of, produce
from _rgw import ACCESS_KEY, SECRET_KEY

from edge_gateway.bucket import PreconditionFailed, S3Bucket, S3Config
from edge_gateway.errors import Fenced
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.mirror import Tailer, TailerConfig
from edge_gateway.mirror.log_gc import GcConfig, collect_garbage, read_gc_state
from edge_gateway.shipper import Shipper, ShipperConfig

pytestmark = pytest.mark.rgw

MIB = 1024 * 1024
SHIP = ShipperConfig(flush_interval_ms=20, manifest_every=3, retry_base_s=0.01, retry_cap_s=0.05)
JCFG = JournalConfig(segment_bytes=8 * MIB, max_bytes=256 * MIB, retention_ms=0)
NO_RETENTION = GcConfig(retention_ms=0, age_cap_ms=3_600_000)


@pytest.fixture
async def rgw(rgw_endpoint: str, rgw_bucket_name: str) -> AsyncIterator[S3Bucket]:
    bucket = await S3Bucket.open(
        S3Config(
            bucket=rgw_bucket_name,
            endpoint_url=rgw_endpoint,
            region="us-east-1",
            path_style=True,
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            multipart_threshold=5 * MIB,
            part_size=5 * MIB,
        )
    )
    try:
        yield bucket
    finally:
        await bucket.aclose()


def later() -> int:
    return time.time_ns() // 1_000_000 + 1000


async def test_a_large_log_object_stays_create_only_on_rgw(rgw: S3Bucket) -> None:
    # RGW 16.2 replaces an object on a CompleteMultipartUpload with
    # If-None-Match: * -- edgegw must not rely on it for log objects.
    assert not await rgw.multipart_create_is_conditional()
    key = log_key("", "a", 1)
    data = os.urandom(6 * MIB)
    info = await rgw.put(key, data, if_none_match=True)
    assert "-" not in info.etag  # one PUT, not a multipart upload
    with pytest.raises(PreconditionFailed):
        await rgw.put(key, os.urandom(6 * MIB), if_none_match=True)
    assert (await rgw.get(key)).data == data


async def test_ship_fence_mirror_and_gc_on_rgw(rgw: S3Bucket, tmp_path: Path) -> None:
    ja = Journal.open_sync(tmp_path / "a", JCFG)
    jb = Journal.open_sync(tmp_path / "b", JCFG)
    jm = Journal.open_sync(tmp_path / "mirror", JCFG)
    try:
        a = Shipper(ja, rgw, "a", config=SHIP)
        await a.claim()
        for _ in range(6):
            produce(ja, "t", 3, 2)
            await a.ship_pending()
        # An entry above the multipart threshold: incompressible records.
        ja.append_nowait("t", 0, _big_batch(ja.next_offset("t", 0)))
        await a.ship_pending()
        # A second writer for region a claims the next epoch; a's next create fails.
        b = Shipper(jb, rgw, "a", config=SHIP)
        await b.claim()
        assert b.statistics().epoch == a.statistics().epoch + 1
        produce(ja, "t", 3, 1)
        with pytest.raises(Fenced):
            await a.ship_pending()
        for _ in range(4):
            produce(jb, "t", 3, 1)
            await b.ship_pending()

        tailer = Tailer(jm, rgw, "a", None, "m", TailerConfig(cursor_interval_s=0.01))
        await tailer.catch_up()
        source = await log_records(rgw, "a")
        assert mirror_of(jm, "a", source) == source
        assert tailer.statistics().fences == 2

        # GC advances its boundary run after run: the compare-and-swap works.
        boundaries = []
        for _ in range(3):
            res = await collect_garbage(rgw, "a", ["m"], NO_RETENTION, now_ms=later())
            boundaries.append(res.boundary_after)
            for _ in range(3):
                produce(jb, "t", 3, 1)
                await b.ship_pending()
            await tailer.catch_up()
        assert boundaries == sorted(boundaries)
        assert len(set(boundaries)) == 3, boundaries
        assert rgw.if_match_form == "bare"
        assert (await read_gc_state(rgw, "", "a")).highest_deleted_seq == boundaries[-1]
        await trio.lowlevel.checkpoint()
    finally:
        for j in (ja, jb, jm):
            j.close_sync()


def _big_batch(first: int) -> bytes:
    """96 incompressible records of 64 KiB: a ~6 MiB log object, above the threshold."""
    from edge_gateway.format.batch import encode_batch

    values = [os.urandom(64 * 1024) for _ in range(96)]
    return encode_batch(values, timestamps=time.time_ns() // 1_000_000, base_offset=first)
