"""Idempotent produce in the in-process gateway: the core the HTTP and Kafka front doors call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from edge_gateway.config import parse_config
from edge_gateway.errors import OutOfOrderSequence, ProducerFenced, UnknownProducer
from edge_gateway.format.batch import encode_batch
from edge_gateway.gateway import Gateway, ProduceRecord
from edge_gateway.idempotence import REMEMBERED_BATCHES, ProducerSeq


def config(tmp_path: Path, **extra: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "region": "north",
        "data_dir": str(tmp_path / "data"),
        "shipper": {"flush_interval_ms": 20},
        "shutdown_grace_s": 5.0,
        "topics": [{"name": "t", "home": "north", "partitions": 2}],
    }
    doc.update(extra)
    return doc


def recs(*values: bytes) -> list[ProduceRecord]:
    return [ProduceRecord(v) for v in values]


async def values(gw: Gateway, partition: int) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        got = await gw.fetch("t", partition, offset)
        out += [r.value for r in got.records]
        if got.next_offset >= got.high_watermark:
            return out
        offset = got.next_offset


async def test_duplicates_answer_the_original_offsets(tmp_path: Path) -> None:
    gw = Gateway(parse_config(config(tmp_path)))
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        pid, epoch = await gw.init_producer()
        first = await gw.produce_partition(
            "t", 1, recs(b"a", b"b"), producer=ProducerSeq(pid, epoch, 0)
        )
        assert (first.offsets, first.duplicate) == ([0, 1], False)
        again = await gw.produce_partition(
            "t", 1, recs(b"a", b"b"), producer=ProducerSeq(pid, epoch, 0)
        )
        assert (again.offsets, again.duplicate, again.partitions) == ([0, 1], True, [1, 1])
        # the binary path: a batch of 3 at sequence 2
        batch = encode_batch([b"c", b"d", b"e"], timestamps=5)
        res = await gw.produce_batch("t", 1, batch, producer=ProducerSeq(pid, epoch, 2))
        assert (res.offsets, res.duplicate) == ([2, 3, 4], False)
        res = await gw.produce_batch("t", 1, batch, producer=ProducerSeq(pid, epoch, 2))
        assert (res.offsets, res.duplicate) == ([2, 3, 4], True)
        # ack=shipped on a duplicate waits for the bucket too
        res = await gw.produce_batch(
            "t", 1, batch, producer=ProducerSeq(pid, epoch, 2), ack="shipped"
        )
        assert res.duplicate
        assert res.shipped
        assert await values(gw, 1) == [b"a", b"b", b"c", b"d", b"e"]
        with pytest.raises(OutOfOrderSequence, match="expected 5"):
            await gw.produce_partition("t", 1, recs(b"x"), producer=ProducerSeq(pid, epoch, 6))
        with pytest.raises(UnknownProducer):
            await gw.produce_partition("t", 1, recs(b"x"), producer=ProducerSeq(pid + 50, 0, 0))
        # a new instance bumps the epoch: the old one is fenced
        assert await gw.init_producer(pid, epoch) == (pid, epoch + 1)
        with pytest.raises(ProducerFenced):
            await gw.produce_partition("t", 1, recs(b"x"), producer=ProducerSeq(pid, epoch, 5))
        res = await gw.produce_partition(
            "t", 1, recs(b"f"), producer=ProducerSeq(pid, epoch + 1, 0)
        )
        assert res.offsets == [5]
        # a plain produce beside it is untouched
        assert (await gw.produce_partition("t", 1, recs(b"g"))).offsets == [6]
        stats = gw.producers.statistics()
        assert (stats.producers, stats.duplicates) == (1, 3)
        gw.request_shutdown()


async def test_state_survives_restarts_rolls_and_deleted_segments(tmp_path: Path) -> None:
    """Snapshot (the checkpoint of each new segment) + replay of the entries after it."""
    cfg = parse_config(config(tmp_path, journal={"segment_bytes": 64 * 1024, "retention_ms": 0}))
    big = b"v" * 4000
    sent: list[tuple[int, int, int]] = []  # (sequence, count, first offset) per append
    gw = Gateway(cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        pid, epoch = await gw.init_producer()
        other, _ = await gw.init_producer()
        await gw.produce_partition("t", 0, recs(b"o"), producer=ProducerSeq(other, 0, 0))
        seq = 0
        for _ in range(60):  # ~240 KB: several segments
            res = await gw.produce_partition(
                "t", 1, recs(big, big), producer=ProducerSeq(pid, epoch, seq)
            )
            sent.append((seq, 2, res.offsets[0]))
            seq += 2
        await gw.sync_now(pull=False)
        gw.request_shutdown()
    segments = sorted((tmp_path / "data" / "journal").glob("*.wal"))
    # shipped segments were deleted: the first entries are gone from the journal
    assert int(segments[0].stem) > 1, segments
    for _ in range(2):
        gw = Gateway(cfg)
        async with trio.open_nursery() as nursery:
            await nursery.start(gw.run)
            for s, n, off in sent[-REMEMBERED_BATCHES:]:
                res = await gw.produce_partition(
                    "t", 1, recs(*[big] * n), producer=ProducerSeq(pid, epoch, s)
                )
                assert (res.offsets[0], res.duplicate) == (off, True)
            # the other producer's only append was in a deleted segment: the
            # checkpoints carried it
            res = await gw.produce_partition("t", 0, recs(b"o"), producer=ProducerSeq(other, 0, 0))
            assert (res.offsets, res.duplicate) == ([0], True)
            with pytest.raises(OutOfOrderSequence):
                await gw.produce_partition(
                    "t", 1, recs(big, big), producer=ProducerSeq(pid, epoch, 0)
                )
            # ids are never issued twice, across restarts too
            new, _ = await gw.init_producer()
            assert new > max(pid, other)
            gw.request_shutdown()
    gw = Gateway(cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        res = await gw.produce_partition(
            "t", 1, recs(b"next"), producer=ProducerSeq(pid, epoch, seq)
        )
        assert not res.duplicate
        assert res.offsets == [sent[-1][2] + 2]
        gw.request_shutdown()


async def test_a_bumped_epoch_fences_after_a_restart(tmp_path: Path) -> None:
    cfg = parse_config(config(tmp_path))
    gw = Gateway(cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        pid, epoch = await gw.init_producer()
        await gw.produce_partition("t", 0, recs(b"a"), producer=ProducerSeq(pid, epoch, 0))
        assert await gw.init_producer(pid) == (pid, 1)
        gw.request_shutdown()
    doc = json.loads((tmp_path / "data" / "producers.json").read_text())
    assert doc["epochs"][0][:2] == [pid, 1]
    gw = Gateway(cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        with pytest.raises(ProducerFenced):
            await gw.produce_partition("t", 0, recs(b"b"), producer=ProducerSeq(pid, 0, 1))
        res = await gw.produce_partition("t", 0, recs(b"b"), producer=ProducerSeq(pid, 1, 0))
        assert res.offsets == [1]
        gw.request_shutdown()


async def test_idle_producers_are_forgotten(tmp_path: Path) -> None:
    cfg = parse_config(config(tmp_path, idempotence={"producer_expiry_ms": 1000}))
    gw = Gateway(cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        pid, epoch = await gw.init_producer()
        await gw.produce_partition("t", 0, recs(b"a"), producer=ProducerSeq(pid, epoch, 0))
        await trio.sleep(1.2)
        with pytest.raises(UnknownProducer, match="expired"):
            await gw.produce_partition("t", 0, recs(b"b"), producer=ProducerSeq(pid, epoch, 1))
        assert gw.producers.statistics().expired == 1
        gw.request_shutdown()


async def test_lanes_keep_their_own_producer_state(tmp_path: Path) -> None:
    """Topics of two priorities: each lane's checkpoints and entries restore its batches."""
    cfg = parse_config(
        config(
            tmp_path,
            journal={"segment_bytes": 64 * 1024, "retention_ms": 0},
            topics=[
                {"name": "t", "home": "north", "partitions": 2},
                {"name": "alarms", "home": "north", "partitions": 1, "priority": "critical"},
            ],
        )
    )
    big = b"a" * 4000
    gw = Gateway(cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        assert gw.lanes.multi
        pid, epoch = await gw.init_producer()
        alarms = []
        for seq in range(0, 60, 2):  # several rolls of the critical lane
            res = await gw.produce_partition(
                "alarms", 0, recs(big, big), producer=ProducerSeq(pid, epoch, seq)
            )
            alarms.append(res.offsets)
        plain = await gw.produce_partition("t", 1, recs(b"n"), producer=ProducerSeq(pid, epoch, 0))
        await gw.sync_now(pull=False)
        gw.request_shutdown()
    gw = Gateway(cfg)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        for k, seq in enumerate(range(50, 60, 2)):
            res = await gw.produce_partition(
                "alarms", 0, recs(big, big), producer=ProducerSeq(pid, epoch, seq)
            )
            assert res.duplicate
            assert res.offsets == alarms[25 + k]
            assert res.lane_lsns  # answered from the critical lane
        res = await gw.produce_partition("t", 1, recs(b"n"), producer=ProducerSeq(pid, epoch, 0))
        assert res.duplicate
        assert res.offsets == plain.offsets
        gw.request_shutdown()
