"""The shipper with a write key: sealed objects, and manifests that match the bucket.

A sealed object is not a pure function of the journal (random nonces): an
entry built again at the same seq and epoch -- its first PUT landed but the
answer was lost, and the shipper was interrupted before it retried -- differs
from the one in the bucket. The 412 of the second PUT says it is ours; the
manifest must then summarise the bucket's object (its CRCs), or every reader
planning from the manifest would find the entry corrupt.
"""

from __future__ import annotations

from pathlib import Path

import trio

from edge_gateway.bucket import FaultyBucket, LocalBucket
from edge_gateway.format import logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.crypt import WriteKey
from edge_gateway.format.manifest import Manifest, ManifestEntry, log_key
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.shipper import Shipper, ShipperConfig

JCFG = JournalConfig(segment_bytes=256 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)
KEY = WriteKey("north-1", bytes(range(32)))


def produce(j: Journal, partitions: int, size: int = 10) -> None:
    for p in range(partitions):
        first = j.next_offset("t", p)
        values = [b"secret-%d-%d" % (p, first + i) for i in range(size)]
        j.append_nowait("t", p, encode_batch(values, timestamps=first))


async def test_entry_rebuilt_after_a_lost_answer_is_summarised_from_the_bucket(
    tmp_path: Path,
) -> None:
    bucket = FaultyBucket(await LocalBucket.open(tmp_path / "b", create=True))
    j = Journal.open_sync(tmp_path / "j", JCFG)
    config = ShipperConfig(manifest_every=2, retry_base_s=5.0, retry_cap_s=5.0)
    try:
        s = Shipper(j, bucket, "north", config=config, key=KEY)
        await s.claim()  # seq 1: the fence
        produce(j, 2)
        bucket.fail_next(1, after_commit=True, operations=["put"])
        with trio.move_on_after(0.5):  # the PUT lands, its answer is lost; then a long backoff
            await s.ship_pending()
        key = log_key("", "north", 2)
        landed = (await bucket.get(key)).data
        assert b"secret-" not in landed
        await s.ship_pending()  # built again (new nonces): 412, ours
        assert (await bucket.get(key)).data == landed
        assert s.statistics().next_seq == 3
        produce(j, 2)
        await s.ship_pending()  # seq 3, and the manifest of 1..3
        summarised: dict[int, ManifestEntry] = {}
        for info in await bucket.list("regions/north/manifest/"):
            m = Manifest.decode((await bucket.get(info.key)).data, where=info.key)
            summarised.update((e.seq, e) for e in m.entries)
        assert summarised[2].key_id == "north-1"
        for seq, entry in summarised.items():
            data = (await bucket.get(log_key("", "north", seq))).data
            header = logobject.decode_header(data, where="x", object_size=len(data))
            assert entry == ManifestEntry.from_header(header, len(data))
    finally:
        j.close_sync()
        await bucket.aclose()
