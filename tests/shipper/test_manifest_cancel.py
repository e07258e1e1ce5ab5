"""A shutdown that cancels the shipper during a manifest write must not re-ship data.

Regression: the manifest used to be written after an object's create but
before the shipped watermark moved, so a cancellation there left a committed
object looking unshipped and the next drain shipped the same LSNs again at
the next seq (a duplicate in the region's log).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from test_shipper import JCFG, expected, log_records, produce

from edge_gateway.bucket import Bucket, LocalBucket
from edge_gateway.journal import Journal
from edge_gateway.shipper import Shipper, ShipperConfig


class StallManifests:
    """Delegates to a bucket, but manifest PUTs hang until cancelled."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.stalled = trio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put(self, key: str, data: bytes, **kwargs: Any) -> Any:
        if "/manifest/" in key:
            self.stalled.set()
            await trio.sleep_forever()
        return await self.inner.put(key, data, **kwargs)


async def test_cancel_during_manifest_write_does_not_reship(tmp_path: Path) -> None:
    inner = await LocalBucket.open(tmp_path / "b", create=True)
    cfg = ShipperConfig(flush_interval_ms=20, manifest_every=1, retry_base_s=0.01)
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        stalling = StallManifests(inner)
        s = Shipper(j, stalling, "north", config=cfg)  # type: ignore[arg-type]
        await s.claim()
        produce(j, "t", 2, 3)
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(s.ship_pending)
                await stalling.stalled.wait()
                nursery.cancel_scope.cancel()  # the shutdown lands mid-manifest
        assert not scope.cancelled_caught
        # the object is committed and counted as shipped
        assert s.shipped_lsn == j.next_lsn - 1
        # the drain that follows (a new shipper at the next start) ships nothing twice
        s2 = Shipper(j, inner, "north", config=cfg)
        await s2.claim()
        await s2.ship_pending()
        assert await log_records(inner, "north") == expected(2, 30)
    finally:
        j.close_sync()
        await inner.aclose()
