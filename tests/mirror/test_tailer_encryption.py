"""The tailer and encrypted logs: a real shipper seals region ``a``, a tailer in ``b`` opens it.

Buckets: a local directory and S3 over HTTP (moto's server) for the round
trips; the local directory for the failures. What must hold: a mirror with
the key equals the source record for record (from headers and from
manifests); without the key it says ``missing-key`` and applies nothing until
the key is there; a wrong key or forged bytes are corrupt entries,
quarantined like any other, never applied and never a crash.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import crc32c
import pytest
import trio
from _mirror_support import JCFG, QUICK, Key, eventually, mirror_of, produce

from edge_gateway.bucket import Bucket, FaultyBucket
from edge_gateway.bucket_log import find_head
from edge_gateway.errors import MissingKey
from edge_gateway.format import atrest, logobject
from edge_gateway.format.batch import Record
from edge_gateway.format.crypt import Keyring, WriteKey
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import Journal
from edge_gateway.mirror import Tailer
from edge_gateway.shipper import Shipper, ShipperConfig

SHIP = ShipperConfig(flush_interval_ms=20, manifest_every=4, retry_base_s=0.01, retry_cap_s=0.05)
K1 = bytes(range(32))
K2 = bytes(range(1, 33))


def keys(*pairs: tuple[str, bytes]) -> Keyring:
    ring = Keyring()
    for key_id, key in pairs:
        ring.add("a", key_id, key)
    return ring


async def ship_sealed(bucket: Bucket, path: Path, rounds: int, key: WriteKey) -> None:
    """Region ``a`` ships topic t (3 partitions), sealed with ``key``."""
    j = Journal.open_sync(path, JCFG)
    try:
        s = Shipper(j, bucket, "a", config=SHIP, key=key)
        await s.claim()
        for _ in range(rounds):
            produce(j, "t", 3, 2)
            await s.ship_pending()
    finally:
        j.close_sync()


async def sealed_records(bucket: Bucket, ring: Keyring) -> dict[Key, list[Record]]:
    """Every record of region ``a``'s log, opened with ``ring``."""
    head = await find_head(bucket, "", "a", 0)
    out: dict[Key, list[Record]] = {}
    for seq in range(1, head + 1):
        key = log_key("", "a", seq)
        data = (await bucket.get(key)).data
        h = logobject.decode_header(data, where=key, object_size=len(data))
        opener = ring.header_opener(h, where=key)
        for b in h.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.end], where=key, opener=opener)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                out.setdefault((b.topic, b.partition), []).extend(batch.records())
    return out


async def test_sealed_log_mirrors_record_for_record(
    any_bucket: Bucket, journal: Journal, tmp_path: Path
) -> None:
    await ship_sealed(any_bucket, tmp_path / "a", 6, WriteKey("k1", K1))
    ring = keys(("k1", K1))
    tailer = Tailer(journal, any_bucket, "a", None, "b", QUICK, keyring=ring)
    await tailer.catch_up()
    source = await sealed_records(any_bucket, ring)
    assert all(len(v) == 60 for v in source.values())
    assert mirror_of(journal, "a", source) == source
    head = await any_bucket.get(log_key("", "a", 2))
    assert logobject.decode_header(head.data, where="x").key_id == "k1"
    # The mirror keeps each block opened, as the source compressed it: not sealed,
    # not recompressed (docs/at-rest.md, "Encryption").
    opened = await opened_blocks(any_bucket, ring)
    await journal.flush()
    kept = [
        e.stored
        for f in sorted(journal.path.glob("*.wal"))
        for e in atrest.iter_wal_entries(f.read_bytes())
        if isinstance(e, atrest.BlockEntry)
    ]
    assert sorted(kept) == sorted(opened)
    assert tailer.statistics().blocks == len(opened)


async def opened_blocks(bucket: Bucket, ring: Keyring) -> list[bytes]:
    """Every block of region ``a``'s log, authenticated and opened (still compressed)."""
    head = await find_head(bucket, "", "a", 0)
    out: list[bytes] = []
    for seq in range(1, head + 1):
        key = log_key("", "a", seq)
        data = (await bucket.get(key)).data
        h = logobject.decode_header(data, where=key, object_size=len(data))
        opener = ring.header_opener(h, where=key)
        for b in h.blocks:
            out.append(
                bytes(logobject.open_block(b, data[b.offset : b.end], where=key, opener=opener))
            )
    return out


async def test_far_behind_plans_sealed_entries_from_manifests(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    """Manifests carry each entry's key id: planned reads open blocks without their header."""
    await ship_sealed(bucket, tmp_path / "a", 30, WriteKey("k1", K1))
    ring = keys(("k1", K1))
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK, keyring=ring)
    await tailer.catch_up()
    source = await sealed_records(bucket, ring)
    assert mirror_of(journal, "a", source) == source
    stats = tailer.statistics()
    assert stats.planned_entries >= 20
    assert stats.quarantined == ()


async def test_missing_key_waits_applies_nothing_and_resumes_with_the_key(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    await ship_sealed(bucket, tmp_path / "a", 3, WriteKey("k1", K1))
    ring = Keyring()  # holds nothing for a yet
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK, keyring=ring)
    with pytest.raises(MissingKey, match="no decryption key 'k1' for region 'a'"):
        await tailer.catch_up()
    async with trio.open_nursery() as nursery:
        await nursery.start(tailer.run)
        await eventually(lambda: tailer.statistics().state == "missing-key")
        stats = tailer.statistics()
        assert stats.missing_key == "a/k1"
        assert stats.quarantined == ()  # not corrupt: the data is fine
        assert not [t for t, _ in journal.partitions() if t.startswith("a.")]
        ring.add("a", "k1", K1)  # an operator adds the key
        await eventually(lambda: tailer.statistics().state == "idle")
        nursery.cancel_scope.cancel()
    source = await sealed_records(bucket, ring)
    assert mirror_of(journal, "a", source) == source
    assert tailer.statistics().missing_key is None


async def test_wrong_key_is_quarantined_not_applied(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    await ship_sealed(bucket, tmp_path / "a", 2, WriteKey("k1", K1))
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK, keyring=keys(("k1", K2)))
    async with trio.open_nursery() as nursery:
        await nursery.start(tailer.run)
        await eventually(lambda: bool(tailer.statistics().quarantined))
        nursery.cancel_scope.cancel()
    q = tailer.statistics().quarantined[0]
    assert "authentication failed" in q.reason
    assert not [t for t, _ in journal.partitions() if t.startswith("a.")]


async def test_forged_block_is_quarantined_then_the_repaired_entry_applies(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    """An attacker rewrites a sealed byte and fixes every CRC: the tag stops it."""
    await ship_sealed(bucket, tmp_path / "a", 3, WriteKey("k1", K1))
    key = log_key("", "a", 3)
    good = (await bucket.get(key)).data
    h = logobject.decode_header(good, where=key)
    b = h.blocks[-1]
    forged = bytearray(good)
    forged[b.offset + b.stored_length // 2] ^= 0x20
    fixed = dataclasses.replace(b, crc=crc32c.crc32c(bytes(forged[b.offset : b.end])))
    header = logobject.encode_header(dataclasses.replace(h, blocks=(*h.blocks[:-1], fixed)))
    await bucket.delete(key)
    await bucket.put(key, header + bytes(forged[h.header_length :]))
    ring = keys(("k1", K1))
    tailer = Tailer(journal, bucket, "a", None, "b", QUICK, keyring=ring)
    async with trio.open_nursery() as nursery:
        await nursery.start(tailer.run)
        await eventually(lambda: bool(tailer.statistics().quarantined))
        q = tailer.statistics().quarantined[0]
        assert (q.seq, q.key) == (3, key)
        assert "authentication failed" in q.reason
        assert journal.source_progress()["a"].seq == 2
        await bucket.delete(key)
        await bucket.put(key, good)
        await eventually(lambda: tailer.statistics().quarantined == ())
        nursery.cancel_scope.cancel()
    await tailer.catch_up()
    source = await sealed_records(bucket, ring)
    assert mirror_of(journal, "a", source) == source
