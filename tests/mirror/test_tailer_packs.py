"""Packs in the tailer: a catch-up takes small entries from packs, and trusts none of them.

A real shipper writes region ``a`` (a pack before each manifest); a tailer in
region ``b`` catches up from a local bucket that records every GET.
"""

from __future__ import annotations

import builtins
import os
import sys
import time
from pathlib import Path

import pytest
import trio
from _mirror_support import JCFG, log_records, mirror_of, produce
from _old_code import old_sources

from edge_gateway.bucket import Bucket, FaultyBucket, GetResult, ObjectInfo
from edge_gateway.format.manifest import Manifest, log_key, manifest_prefix
from edge_gateway.format.pack import decode_pack, encode_pack, pack_prefix, parse_pack_key
from edge_gateway.journal import Journal
from edge_gateway.mirror import Tailer, TailerConfig
from edge_gateway.mirror.cursor import Cursor, publish_cursor
from edge_gateway.mirror.log_gc import GcConfig, collect_garbage
from edge_gateway.shipper import Shipper, ShipperConfig

SHIP = ShipperConfig(flush_interval_ms=20, manifest_every=10, retry_base_s=0.01, retry_cap_s=0.05)
CATCH_UP = TailerConfig(catch_up_threshold=8, prefetch_objects=4)


class Recording(FaultyBucket):
    """Records the keys of every GET and LIST."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner, close_inner=False)
        self.keys: list[str] = []

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        self.keys.append(key)
        return await super()._get(key, start, end)

    async def _list(
        self, prefix: str, *, start_after: str | None, limit: int | None
    ) -> builtins.list[ObjectInfo]:
        self.keys.append(f"LIST {prefix}")
        return await super()._list(prefix, start_after=start_after, limit=limit)

    def gets(self, folder: str) -> int:
        return sum(1 for k in self.keys if k.startswith(f"regions/a/{folder}/"))


async def ship(bucket: Bucket, path: Path, rounds: int, config: ShipperConfig = SHIP) -> None:
    """Region ``a``'s shipper running: one entry per round, a manifest every 10."""
    j = Journal.open_sync(path, JCFG)
    try:
        s = Shipper(j, bucket, "a", config=config)
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run)
            for _ in range(rounds):
                produce(j, "t", 3, 2)
                await s.wait_shipped(j.next_lsn - 1)
            await s.ship_pending()  # the last manifest
            nursery.cancel_scope.cancel()
    finally:
        j.close_sync()


async def packs_of(bucket: Bucket) -> list[str]:
    return [o.key for o in await bucket.list(pack_prefix("", "a"))]


async def test_catch_up_takes_small_entries_from_packs(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    await ship(bucket, tmp_path / "a", 50)  # fence + 50 entries, a manifest every 10
    keys = await packs_of(bucket)
    assert len(keys) >= 4
    recording = Recording(bucket)
    tailer = Tailer(journal, recording, "a", None, "b", CATCH_UP)
    await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source
    stats = tailer.statistics()
    assert stats.pack_reads == len(keys)
    assert stats.pack_entries >= 40
    assert stats.pack_fallbacks == 0
    # Every entry a pack held was not fetched on its own.
    assert recording.gets("log") <= 51 - stats.pack_entries + 1
    assert recording.gets("pack") == len(keys)
    assert stats.quarantined == ()


async def test_packs_off_fetches_every_entry(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    await ship(bucket, tmp_path / "a", 30)
    assert await packs_of(bucket)
    recording = Recording(bucket)
    cfg = TailerConfig(catch_up_threshold=8, prefetch_objects=4, packs=False)
    tailer = Tailer(journal, recording, "a", None, "b", cfg)
    await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source
    assert tailer.statistics().pack_reads == 0
    assert recording.gets("pack") == 0
    assert not any(k == "LIST regions/a/pack/" for k in recording.keys)


async def test_no_pack_is_trusted(bucket: FaultyBucket, journal: Journal, tmp_path: Path) -> None:
    """A garbage pack, a pack with a flipped body byte, one whose bodies are swapped."""
    await ship(bucket, tmp_path / "a", 40)
    keys = await packs_of(bucket)
    assert len(keys) >= 3
    await bucket.put(keys[0], b"EGPK not a pack at all")
    data = (await bucket.get(keys[1])).data
    flipped = bytearray(data)
    flipped[-3] ^= 0x5A  # inside the last body's blocks
    await bucket.put(keys[1], bytes(flipped))
    data = (await bucket.get(keys[2])).data
    pack = decode_pack(data)
    bodies = [(e.seq, data[e.offset : e.offset + e.length]) for e in pack.entries]
    seqs = [s for s, _ in bodies]
    swapped = list(zip(seqs, [b for _, b in bodies][::-1], strict=True))
    await bucket.put(keys[2], encode_pack("a", swapped))
    recording = Recording(bucket)
    tailer = Tailer(journal, recording, "a", None, "b", CATCH_UP)
    await tailer.catch_up()
    source = await log_records(bucket, "a")
    assert mirror_of(journal, "a", source) == source
    stats = tailer.statistics()
    assert stats.quarantined == ()
    # the garbage pack; the flipped body; every swapped body but a middle one
    # that stayed in place (an odd count) -- which is the entry's own bytes
    middle = 1 if len(seqs) % 2 else 0
    assert stats.pack_fallbacks == 1 + 1 + len(seqs) - middle


@pytest.mark.parametrize("entry_max", [0, 1])
async def test_the_writer_packs_only_small_entries(
    bucket: FaultyBucket, tmp_path: Path, entry_max: int
) -> None:
    """``pack_max_bytes = 0``: no pack; entries over ``pack_entry_max_bytes`` are not packed."""
    cfg = (
        ShipperConfig(flush_interval_ms=20, manifest_every=10, pack_max_bytes=0)
        if entry_max == 0
        else ShipperConfig(flush_interval_ms=20, manifest_every=10, pack_entry_max_bytes=1)
    )
    await ship(bucket, tmp_path / "a", 30, cfg)
    assert await packs_of(bucket) == []


async def test_pack_bodies_are_the_log_objects_of_a_manifest(
    bucket: FaultyBucket, tmp_path: Path
) -> None:
    await ship(bucket, tmp_path / "a", 25)
    manifests = {}
    for info in await bucket.list(manifest_prefix("", "a")):
        m = Manifest.decode((await bucket.get(info.key)).data, where=info.key)
        manifests[m.last_seq] = m
    for key in await packs_of(bucket):
        _, first, last = parse_pack_key(key)
        data = (await bucket.get(key)).data
        pack = decode_pack(data, where=key)
        assert (pack.first_seq, pack.last_seq) == (first, last)
        m = manifests[last]  # written right before its manifest, for its entries
        assert m.first_seq <= first
        for e in pack.entries:
            own = (await bucket.get(log_key("", "a", e.seq))).data
            assert data[e.offset : e.offset + e.length] == own


async def test_gc_deletes_a_pack_with_the_entries_it_copies(
    bucket: FaultyBucket, journal: Journal, tmp_path: Path
) -> None:
    await ship(bucket, tmp_path / "a", 35)
    before = [parse_pack_key(k)[2] for k in await packs_of(bucket)]
    assert len(before) >= 3
    tailer = Tailer(journal, bucket, "a", None, "b", CATCH_UP)
    result = await tailer.catch_up()
    await publish_cursor(bucket, "", Cursor("a", "b", result.next_seq - 1, 1, 0))
    later = time.time_ns() // 1_000_000 + 1000
    res = await collect_garbage(bucket, "a", ["b"], GcConfig(retention_ms=0), now_ms=later)
    assert res.boundary_after > 0
    after = [parse_pack_key(k)[2] for k in await packs_of(bucket)]
    assert after == [last for last in before if last > res.boundary_after]


#: The last commit before packs: its tailer never heard of them.
BEFORE_PACKS = "60ee123"

OLD_TAILER = """
import sys, trio
from pathlib import Path
from edge_gateway.bucket import LocalBucket
from edge_gateway.format.batch import decode_batch
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.mirror import Tailer, TailerConfig
from edge_gateway.names import mirror_topic

bucket_dir, journal_dir = sys.argv[1], sys.argv[2]

async def main():
    bucket = await LocalBucket.open(Path(bucket_dir))
    cfg = JournalConfig(segment_bytes=256 * 1024, retention_ms=0)
    j = Journal.open_sync(Path(journal_dir), cfg)
    try:
        await Tailer(j, bucket, "a", None, "b", TailerConfig(catch_up_threshold=8)).catch_up()
        for p in range(3):
            topic, offset = mirror_topic("a", "t"), 0
            while entries := j.read(topic, p, offset):
                for e in entries:
                    for r in decode_batch(e.payload).records():
                        if r.offset >= offset:
                            print(p, r.offset, r.value.hex())
                            offset = r.offset + 1
    finally:
        j.close_sync()
        await bucket.aclose()

trio.run(main)
"""


async def test_a_reader_from_before_packs_mirrors_a_log_with_packs(
    bucket: FaultyBucket, tmp_path: Path
) -> None:
    """Mixed fleet: packs are a folder an older reader never looks in."""
    await ship(bucket, tmp_path / "a", 30)
    assert await packs_of(bucket)
    old = old_sources(BEFORE_PACKS, tmp_path / "old")
    assert not (old / "edge_gateway/format/pack.py").exists()
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-c", OLD_TAILER, str(tmp_path / "bucket"), str(tmp_path / "old-j")],
            capture_stdout=True,
            env={**os.environ, "PYTHONPATH": str(old)},
            cwd=old,
        )
    source = await log_records(bucket, "a")
    want = [f"{p} {r.offset} {r.value.hex()}" for (_, p), rs in sorted(source.items()) for r in rs]
    assert len(want) == 30 * 3 * 2 * 5  # rounds x partitions x batches x records
    assert done.stdout.decode().splitlines() == want
