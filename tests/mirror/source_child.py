"""Child process: region ``a`` journals and ships, for the mirroring crash test.

Usage: python source_child.py DATA_DIR BUCKET_DIR SEED [--sync-only]

Appends batches (keys, headers, timestamps; see ``_mirror_support.make_batch``)
to topic ``ship`` (3 partitions) and, now and then, to ``other`` (not
mirrored), while a shipper with a short flush interval ships them.
``--sync-only`` ships what is pending and exits.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).parent))
from _mirror_support import make_batch

from edge_gateway.bucket import LocalBucket
from edge_gateway.journal import JournalConfig, open_journal
from edge_gateway.shipper import Shipper, ShipperConfig

PARTITIONS = 3


async def main(data_dir: str, bucket_dir: str, seed: int, sync_only: bool) -> None:
    cfg = JournalConfig(segment_bytes=256 * 1024, retention_ms=0)
    scfg = ShipperConfig(flush_interval_ms=30, manifest_every=5, retry_base_s=0.01, retry_cap_s=0.1)
    bucket = await LocalBucket.open(Path(bucket_dir), create=True)
    rnd = random.Random(seed)
    try:
        async with open_journal(Path(data_dir) / "journal", cfg) as j:
            shipper = Shipper(j, bucket, "a", config=scfg)
            if sync_only:
                await shipper.claim()
                await shipper.ship_pending()
                return
            async with trio.open_nursery() as nursery:
                await nursery.start(shipper.run)
                while True:
                    topic = "other" if rnd.random() < 0.1 else "ship"
                    p = rnd.randrange(PARTITIONS if topic == "ship" else 1)
                    first = j.next_offset(topic, p)
                    await j.append(topic, p, make_batch(topic, p, first, rnd.randrange(1, 12)))
                    await trio.sleep(rnd.uniform(0, 0.002))
    finally:
        await bucket.aclose()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), "--sync-only" in sys.argv)
