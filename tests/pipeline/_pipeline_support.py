"""Shipping known records into real buckets for the pipeline tests.

A :class:`Site` is one region's gateway parts (a journal and a shipper) on a
bucket; :meth:`Site.ship` appends batches and ships them, and remembers every
record shipped, so tests compare the pipeline's tables with :attr:`Site.expected`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import trio

from edge_gateway.bucket import Bucket, LocalBucket, S3Bucket, S3Config
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.crypt import WriteKey
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.shipper import Shipper, ShipperConfig

FAST = ShipperConfig(flush_interval_ms=20, manifest_every=3, retry_base_s=0.01, retry_cap_s=0.05)
JCFG = JournalConfig(segment_bytes=1024 * 1024, max_bytes=256 * 1024 * 1024, retention_ms=0)
T0 = 1_763_800_000_000  # 2025-11-22T08:26:40Z

#: (region, topic, partition, offset) -> (timestamp ms, key, value, headers)
Rows = dict[
    tuple[str, str, int, int], tuple[int, bytes | None, bytes, tuple[tuple[str, bytes], ...]]
]


def telemetry(region: str, topic: str, partition: int, offset: int) -> bytes:
    return json.dumps(
        {"site": region, "sensor": f"{topic}-{partition}", "seq": offset, "temp": offset / 10}
    ).encode()


class Site:
    def __init__(self, region: str, journal_dir: Path, open_bucket: Callable[[], object]) -> None:
        self.region = region
        self.journal_dir = journal_dir
        self._open_bucket = open_bucket
        self.expected: Rows = {}
        #: The region's write key: its objects are sealed with it (None: plaintext).
        self.key: WriteKey | None = None

    def ship(
        self,
        topic: str,
        partitions: int,
        batches: int,
        size: int = 10,
        *,
        value: Callable[[str, str, int, int], bytes] = telemetry,
        day: int = 0,
        headers: bool = False,
    ) -> int:
        """Append ``batches`` batches of ``size`` records to each partition and ship them."""
        return trio.run(self._ship, topic, partitions, batches, size, value, day, headers)

    async def _ship(
        self,
        topic: str,
        partitions: int,
        batches: int,
        size: int,
        value: Callable[[str, str, int, int], bytes],
        day: int,
        headers: bool,
    ) -> int:
        bucket = await self._open_bucket()  # type: ignore[misc]
        assert isinstance(bucket, Bucket)
        j = Journal.open_sync(self.journal_dir, JCFG)
        try:
            for _ in range(batches):
                for p in range(partitions):
                    first = j.next_offset(topic, p)
                    offsets = range(first, first + size)
                    values = [value(self.region, topic, p, o) for o in offsets]
                    keys = [None if o % 3 == 0 else f"k{o}".encode() for o in offsets]
                    stamps = [T0 + day * 86_400_000 + o for o in offsets]
                    hdrs = [(("h", f"{o}".encode()),) if headers and o % 2 else () for o in offsets]
                    j.append_nowait(
                        topic,
                        p,
                        encode_batch(
                            values, keys=keys, timestamps=stamps, headers=hdrs if headers else None
                        ),
                    )
                    for o, v, k, ts, h in zip(offsets, values, keys, stamps, hdrs, strict=True):
                        self.expected[(self.region, topic, p, o)] = (ts, k, v, h)
            s = Shipper(j, bucket, self.region, config=FAST, key=self.key)
            await s.claim()
            return await s.ship_pending()
        finally:
            j.close_sync()
            await bucket.aclose()


def local_site(region: str, root: Path, bucket_dir: Path) -> Site:
    async def open_bucket() -> Bucket:
        return await LocalBucket.open(bucket_dir, create=True)

    return Site(region, root / f"journal-{region}", open_bucket)


def s3_config(endpoint: str, name: str) -> S3Config:
    return S3Config(
        bucket=name,
        endpoint_url=endpoint,
        path_style=True,
        region="us-east-1",
        access_key="testing",
        secret_key="testing",
    )


def s3_site(region: str, root: Path, endpoint: str, name: str) -> Site:
    async def open_bucket() -> Bucket:
        return await S3Bucket.open(s3_config(endpoint, name))

    return Site(region, root / f"journal-{region}", open_bucket)


def merge(*sites: Site) -> Rows:
    out: Rows = {}
    for site in sites:
        out.update(site.expected)
    return out
