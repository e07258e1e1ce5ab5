"""A corrupt or foreign object where the writer's next entry goes: set aside, not a stop.

Anyone who can write a region's keys (bit rot in the store, a buggy tool, a
compromised credential) can leave garbage at the seq the region's gateway
creates next. The gateway used to stop shipping on it (CorruptData at every
attempt, at every restart), so its disk filled and intake stopped. It now
sets the object aside (a note with the evidence under ``quarantine/``,
then the object deleted) and creates its entry there; a reader that had
quarantined the seq applies that entry. A newer gateway's entry (a version
or flag this one does not know) and a corrupt entry below the head are never
removed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from edge_gateway.bucket import Bucket, NotFound
from edge_gateway.errors import CorruptData, UnsupportedFormat
from edge_gateway.format import logobject
from edge_gateway.format.batch import decode_batch, encode_batch
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.mirror import Tailer, TailerConfig
from edge_gateway.names import mirror_topic
from edge_gateway.shipper import Shipper, ShipperConfig

FAST = ShipperConfig(flush_interval_ms=20, manifest_every=3, retry_base_s=0.01, retry_cap_s=0.05)
JCFG = JournalConfig(segment_bytes=256 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)


def append(j: Journal, *values: bytes) -> None:
    for v in values:
        first = j.next_offset("t", 0)
        j.append_nowait("t", 0, encode_batch([v], timestamps=first))


async def records(bucket: Bucket, region: str = "north") -> list[tuple[int, bytes]]:
    """Every record of the region's log, in log order (every entry must decode)."""
    out: list[tuple[int, bytes]] = []
    seq = 1
    while True:
        key = log_key("", region, seq)
        try:
            data = (await bucket.get(key)).data
        except NotFound:
            return out
        header = logobject.decode_header(data, where=key, object_size=len(data))
        for b in header.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.offset + b.stored_length], where=key)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                out.extend((r.offset, r.value) for r in batch.records())
        seq += 1


async def notes(bucket: Bucket, region: str = "north") -> list[dict[str, object]]:
    found = await bucket.list(f"regions/{region}/quarantine/")
    return [json.loads((await bucket.get(i.key)).data) for i in found]


async def south_entry(tmp_path: Path, bucket: Bucket) -> bytes:
    """A valid entry of region south (seq 2): foreign in north's log."""
    j = Journal.open_sync(tmp_path / "south", JCFG)
    try:
        s = Shipper(j, bucket, "south", config=FAST)
        await s.claim()
        append(j, b"south's record")
        await s.ship_pending()
        return (await bucket.get(log_key("", "south", 2))).data
    finally:
        j.close_sync()


@pytest.mark.parametrize("planted", ["garbage", "truncated", "foreign"])
async def test_an_object_planted_at_the_next_seq_is_set_aside_and_the_entry_created(
    tmp_path: Path, bucket: Bucket, planted: str
) -> None:
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        shipper = Shipper(j, bucket, "north", config=FAST)
        await shipper.claim()
        append(j, b"a")
        await shipper.ship_pending()  # seq 2
        good = (await bucket.get(log_key("", "north", 2))).data
        bad = {
            "garbage": b"\x00garbage" * 50,
            "truncated": good[: len(good) - 7],
            "foreign": await south_entry(tmp_path, bucket),
        }[planted]
        await bucket.put(log_key("", "north", 3), bad, if_none_match=True)
        append(j, b"b", b"c")
        await shipper.ship_pending()
        assert await records(bucket) == [(0, b"a"), (1, b"b"), (2, b"c")]
        assert shipper.statistics().set_aside == 1
        [note] = await notes(bucket)
        assert note["key"] == log_key("", "north", 3)
        assert note["size"] == len(bad)
        assert "region" in str(note["reason"]) or planted != "foreign"
    finally:
        j.close_sync()


async def test_a_corrupt_head_is_set_aside_when_the_gateway_claims(
    tmp_path: Path, bucket: Bucket
) -> None:
    """Planted while the gateway was down: its claim finds it as the log's head."""
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        first = Shipper(j, bucket, "north", config=FAST)
        await first.claim()
        append(j, b"a")
        await first.ship_pending()
        await bucket.put(log_key("", "north", 3), b"not an entry", if_none_match=True)
        append(j, b"b")  # acknowledged while the gateway could not ship
        again = Shipper(j, bucket, "north", config=FAST)
        await again.claim()
        await again.ship_pending()
        assert await records(bucket) == [(0, b"a"), (1, b"b")]
        assert again.statistics().set_aside == 1
    finally:
        j.close_sync()


async def test_a_newer_gateways_entry_is_never_set_aside(tmp_path: Path, bucket: Bucket) -> None:
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        shipper = Shipper(j, bucket, "north", config=FAST)
        await shipper.claim()
        append(j, b"a")
        await shipper.ship_pending()
        newer = bytearray((await bucket.get(log_key("", "north", 2))).data)
        newer[4] = 99  # the version byte of a format this gateway does not know
        await bucket.put(log_key("", "north", 3), bytes(newer), if_none_match=True)
        append(j, b"b")
        with pytest.raises(UnsupportedFormat, match="version 99"):
            await shipper.ship_pending()
        assert (await bucket.get(log_key("", "north", 3))).data == bytes(newer)
        assert await notes(bucket) == []
    finally:
        j.close_sync()


async def test_a_corrupt_entry_below_the_head_is_left_for_the_operator(
    tmp_path: Path, bucket: Bucket
) -> None:
    """In the middle of the log, valid entries follow it: removing it is no repair.

    The writer does not need it (it continues after the head) and keeps
    shipping; readers stop there (quarantine) until an operator repairs it.
    """
    j = Journal.open_sync(tmp_path / "j", JCFG)
    try:
        shipper = Shipper(j, bucket, "north", config=FAST)
        await shipper.claim()
        for v in (b"a", b"b"):
            append(j, v)
            await shipper.ship_pending()  # seqs 2, 3
        await bucket.delete(log_key("", "north", 2))
        await bucket.put(log_key("", "north", 2), b"rotten", if_none_match=True)
        again = Shipper(j, bucket, "north", config=FAST)
        await again.claim()
        append(j, b"c")
        await again.ship_pending()
        assert again.statistics().set_aside == 0
        assert (await bucket.get(log_key("", "north", 2))).data == b"rotten"
        assert await notes(bucket) == []
    finally:
        j.close_sync()


async def test_a_mirror_quarantined_at_the_seq_applies_the_entry_created_there(
    tmp_path: Path, bucket: Bucket
) -> None:
    j = Journal.open_sync(tmp_path / "j", JCFG)
    mirror = Journal.open_sync(tmp_path / "mirror", JCFG)
    try:
        shipper = Shipper(j, bucket, "north", config=FAST)
        await shipper.claim()
        append(j, b"a")
        await shipper.ship_pending()
        await bucket.put(log_key("", "north", 3), b"garbage!" * 4, if_none_match=True)
        tailer = Tailer(
            mirror,
            bucket,
            "north",
            None,
            "south",
            TailerConfig(poll_interval_s=0.01, quarantine_retry_base_s=0.01),
        )
        with pytest.raises(CorruptData):
            await tailer.catch_up()
        assert [q.seq for q in tailer.statistics().quarantined] == [3]
        append(j, b"b")
        await shipper.ship_pending()
        with trio.fail_after(30):
            await tailer.catch_up()
        got = mirror.read(mirror_topic("north", "t"), 0, 0)
        values = [r.value for e in got for r in decode_batch(e.payload).records()]
        assert values == [b"a", b"b"]
        assert tailer.statistics().quarantined == ()
    finally:
        j.close_sync()
        mirror.close_sync()
