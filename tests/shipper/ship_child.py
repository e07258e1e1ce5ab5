"""Child process for the shipping crash and fencing tests.

Usage: python ship_child.py DATA_DIR BUCKET_DIR REGION SEED [--sync-only]

Journals records (fsync=always) to topic ``ship`` while a shipper runs with a
short flush interval; prints ``<partition> <first offset> <count>`` after each
append returns (an acknowledgement). Record content is a function of
(region, partition, offset). ``--sync-only`` ships what is pending and exits.
Exits 3 with ``FENCED <reason>`` on stderr when fenced.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import trio

from edge_gateway.bucket import LocalBucket
from edge_gateway.errors import Fenced
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import JournalConfig, open_journal
from edge_gateway.shipper import Shipper, ShipperConfig

PARTITIONS = 3


def record_value(region: str, partition: int, offset: int) -> bytes:
    rnd = random.Random(f"{region}/{partition}/{offset}")
    return f"{region}:{partition}:{offset}:".encode() + rnd.randbytes(rnd.randrange(0, 200))


async def main(data_dir: str, bucket_dir: str, region: str, seed: int, sync_only: bool) -> None:
    cfg = JournalConfig(fsync="always", segment_bytes=256 * 1024, retention_ms=0)  # type: ignore[arg-type]
    scfg = ShipperConfig(flush_interval_ms=30, manifest_every=5, retry_base_s=0.01, retry_cap_s=0.1)
    bucket = await LocalBucket.open(Path(bucket_dir), create=True)
    rnd = random.Random(seed)
    fenced: list[Fenced] = []
    try:
        async with open_journal(Path(data_dir) / "journal", cfg) as j:
            shipper = Shipper(j, bucket, region, config=scfg)
            if sync_only:
                await shipper.claim()
                await shipper.ship_pending()
                return
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(shipper.run)
                    while True:
                        p = rnd.randrange(PARTITIONS)
                        n = rnd.randrange(1, 15)
                        first = j.next_offset("ship", p)
                        batch = encode_batch(
                            [record_value(region, p, first + i) for i in range(n)],
                            timestamps=[first + i for i in range(n)],
                        )
                        res = await j.append("ship", p, batch)
                        sys.stdout.write(f"{p} {res.base_offset} {res.count}\n")
                        sys.stdout.flush()
                        await trio.sleep(rnd.uniform(0, 0.003))
            except* Fenced as group:
                fenced.extend(e for e in group.exceptions if isinstance(e, Fenced))
    finally:
        await bucket.aclose()
    if fenced:
        sys.stderr.write(f"FENCED {fenced[0]}\n")
        sys.stderr.flush()
        sys.exit(3)


if __name__ == "__main__":
    trio.run(
        main, sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), "--sync-only" in sys.argv
    )
