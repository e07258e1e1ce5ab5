"""The in-process gateway: produce/fetch, topology rules, groups, graceful shutdown."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from edge_gateway.api import status_document
from edge_gateway.config import parse_config
from edge_gateway.errors import InvalidInput, ReadOnlyTopic, Unavailable, UnknownTopic
from edge_gateway.format.batch import encode_batch
from edge_gateway.gateway import Gateway, ProduceRecord


def config(tmp_path: Path, **extra: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "region": "north",
        "data_dir": str(tmp_path / "data"),
        "shipper": {"flush_interval_ms": 20},
        "shutdown_grace_s": 5.0,
        "topics": [
            {"name": "t", "home": "north", "partitions": 3},
            {"name": "s", "home": "south", "partitions": 2, "subscribers": ["north"]},
        ],
    }
    doc.update(extra)
    return doc


async def test_produce_fetch_and_rules(tmp_path: Path) -> None:
    gw = Gateway(parse_config(config(tmp_path)))
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        res = await gw.produce(
            "t",
            [
                ProduceRecord(b"a", key=b"k1"),
                ProduceRecord(b"b", key=b"k1", headers=(("h", b"v"),)),
                ProduceRecord(b"c", partition=2, timestamp=123),
            ],
        )
        assert res.partitions[0] == res.partitions[1]
        assert res.partitions[2] == 2
        p = res.partitions[0]
        got = await gw.fetch("t", p, 0)
        values = [r.value for r in got.records]
        assert values[-2:] == [b"a", b"b"] or values == [b"a", b"b"]
        assert got.records[-1].headers == (("h", b"v"),)
        got2 = await gw.fetch("t", 2, 0)
        assert [(r.value, r.timestamp) for r in got2.records][-1] == (b"c", 123)
        # binary produce
        batch = encode_batch([b"x", b"y"], timestamps=5)
        res = await gw.produce_batch("t", 1, batch)
        assert res.offsets == [0, 1]
        with pytest.raises(ReadOnlyTopic, match="south"):
            await gw.produce("south.s", [ProduceRecord(b"x")])
        with pytest.raises(UnknownTopic):
            await gw.produce("nope", [ProduceRecord(b"x")])
        with pytest.raises(InvalidInput, match=r"partitions 0\.\.2"):
            await gw.produce("t", [ProduceRecord(b"x", partition=3)])
        assert (await gw.fetch("south.s", 0, 0)).records == []
        # ack=shipped waits for the bucket
        res = await gw.produce("t", [ProduceRecord(b"geo")], ack="shipped")
        assert gw.shipper.shipped_lsn >= res.last_lsn
        info = gw.describe_topic("t")
        assert sum(info.next_offsets) == 6

        # long poll: woken by an append
        async def later() -> None:
            await trio.sleep(0.05)
            await gw.produce("t", [ProduceRecord(b"late", partition=0)])

        nursery.start_soon(later)
        first = (await gw.fetch("t", 0, 0)).high_watermark
        got = await gw.fetch("t", 0, first, wait_ms=10_000)
        assert [r.value for r in got.records] == [b"late"]
        await gw.commit_offsets("g1", [("t", 0, 3, "m")])
        assert [(o.topic, o.offset) for o in await gw.fetch_offsets("g1")] == [("t", 3)]
        gw.request_shutdown()
    with pytest.raises(Exception, match="not running"):
        status_document(gw)


async def test_graceful_shutdown_ships_everything(tmp_path: Path) -> None:
    cfg = parse_config(config(tmp_path, shipper={"flush_interval_ms": 60_000}))
    gw = Gateway(cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        for i in range(20):
            await gw.produce("t", [ProduceRecord(f"r{i}".encode(), partition=i % 3)])
        assert gw.shipper.shipped_lsn < gw.journal.next_lsn - 1
        gw.request_shutdown()
        with pytest.raises(Unavailable):
            await gw.produce("t", [ProduceRecord(b"late")])
    # everything shipped by the drain: a new gateway's shipper finds it in the bucket
    gw2 = Gateway(cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw2.run)
        await gw2.shipper.wait_claimed()
        info = gw2.describe_topic("t")
        assert info.shipped_offsets == info.next_offsets
        assert sum(info.next_offsets) == 20
        gw2.request_shutdown()


async def test_auto_create_persists(tmp_path: Path) -> None:
    cfg = parse_config(config(tmp_path, auto_create=True, default_partitions=2))
    gw = Gateway(cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        await gw.produce("fresh", [ProduceRecord(b"x")])
        with pytest.raises(ReadOnlyTopic):
            await gw.produce("south.fresh", [ProduceRecord(b"x")])
        gw.request_shutdown()
    gw = Gateway(cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        assert gw.describe_topic("fresh").partitions == 2
        gw.request_shutdown()


async def test_auto_create_on_a_full_disk_is_refused_then_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from edge_gateway import topics
    from edge_gateway.errors import DiskFull

    gw = Gateway(parse_config(config(tmp_path, auto_create=True)))
    real_save = topics.replace_file
    full = True

    def save(path: Path, data: bytes) -> None:
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(path, data)

    monkeypatch.setattr(topics, "replace_file", save)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        with pytest.raises(DiskFull, match="cannot auto-create topic 'fresh'"):
            await gw.produce("fresh", [ProduceRecord(b"x")])
        assert "fresh" not in [t.name for t in gw.topics()]  # not half created
        full = False
        res = await gw.produce("fresh", [ProduceRecord(b"x")])
        assert res.offsets == [0]
        gw.request_shutdown()
    assert "fresh" in (tmp_path / "data" / "topics.json").read_text()
