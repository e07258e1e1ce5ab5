"""Backlogs ship as larger objects (``backlog_object_bytes``), built in parallel, in order.

Live traffic keeps objects of at most ``max_object_bytes``; only objects
shipped back to back behind a full one grow. Every test reads the whole log
back: contiguous seqs, LSN ranges that follow each other, every record of
every partition exactly once, in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from edge_gateway import shipper as shipper_module
from edge_gateway.bucket import Bucket, LocalBucket
from edge_gateway.bucket_log import find_head
from edge_gateway.errors import ConfigError, Fenced
from edge_gateway.format import logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.logobject import LogObjectHeader
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import Journal, JournalConfig, open_journal
from edge_gateway.shipper import Shipper, ShipperConfig

KIB = 1024
MIB = 1024 * KIB
OBJECT = 64 * KIB  # max_object_bytes: the smallest allowed
BACKLOG = 256 * KIB  # backlog_object_bytes
CFG = ShipperConfig(
    flush_interval_ms=20,
    max_object_bytes=OBJECT,
    backlog_object_bytes=BACKLOG,
    manifest_every=4,
    retry_base_s=0.01,
    retry_cap_s=0.05,
)
JCFG = JournalConfig(segment_bytes=256 * KIB, max_bytes=64 * MIB, retention_ms=0)
TOPIC = "t"
REGION = "north"


def value(p: int, o: int) -> bytes:
    head = f'{{"p":{p},"o":{o},"v":"'.encode()
    return head + b"x" * (200 - len(head) - 2) + b'"}'


def produce(j: Journal, partitions: int, rounds: int, per_batch: int = 10) -> None:
    """``rounds`` batches of ``per_batch`` records (~2 KiB) to each partition."""
    for _ in range(rounds):
        for p in range(partitions):
            first = j.next_offset(TOPIC, p)
            batch = encode_batch([value(p, first + i) for i in range(per_batch)], timestamps=first)
            j.append_nowait(TOPIC, p, batch)


@dataclass
class Entry:
    header: LogObjectHeader
    #: Journal bytes of the object's batches (what max/backlog_object_bytes count,
    #: less the entries' own headers).
    raw_bytes: int


async def read_log(bucket: Bucket, j: Journal, partitions: int) -> list[Entry]:
    """Every log entry, checked: seqs, LSN continuity, every record once in order."""
    head = await find_head(bucket, "", REGION)
    entries: list[Entry] = []
    records: dict[int, list[tuple[int, bytes]]] = {}
    prev: LogObjectHeader | None = None
    for seq in range(1, head + 1):
        key = log_key("", REGION, seq)
        data = (await bucket.get(key)).data
        h = logobject.decode_header(
            data[: logobject.header_length_hint(data[:12], where=key)], where=key
        )
        assert h.seq == seq
        if prev is not None:
            assert h.first_lsn == prev.last_lsn + 1, f"LSN gap or overlap at seq {seq}"
            assert h.epoch >= prev.epoch
        for b in h.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.end], where=key)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                records.setdefault(b.partition, []).extend(
                    (r.offset, r.value) for r in batch.records()
                )
        entries.append(Entry(h, sum(b.raw_length for b in h.blocks)))
        prev = h
    for p in range(partitions):
        got = records.get(p, [])
        assert [o for o, _ in got] == list(range(j.next_offset(TOPIC, p))), f"partition {p}"
        assert all(v == value(p, o) for o, v in got), f"partition {p}: wrong content"
    return entries


@pytest.fixture(params=[1, 2], ids=["1-build-thread", "2-build-threads"])
def build_threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run with one and with two objects compressed at once, whatever the CPU count."""
    threads: int = request.param
    monkeypatch.setattr(shipper_module, "_BUILD_THREADS", threads)
    return threads


# The entry framing around each batch (LSN, topic, CRC, ...) counts toward the
# limits but not toward raw_bytes; one more batch may overshoot a limit.
SLACK = 4 * KIB


async def test_backlog_ships_as_larger_objects_in_order(
    bucket: Bucket, build_threads: int, tmp_path: Path
) -> None:
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, bucket, REGION, config=CFG)
        await s.claim()
        produce(j, 4, 200)  # ~1.6 MiB: the first object, then backlog objects
        shipped = await s.ship_pending()
        assert s.shipped_lsn == j.next_lsn - 1
        entries = await read_log(bucket, j, 4)
    data = [e for e in entries if not e.header.is_fence]
    assert len(data) == shipped == s.statistics().objects
    sizes = [e.raw_bytes for e in data]
    # The first object is a normal flush; the ones behind it grow.
    assert OBJECT * 0.9 <= sizes[0] <= OBJECT + SLACK
    assert all(BACKLOG * 0.9 <= n <= BACKLOG + SLACK for n in sizes[1:-1]), sizes
    assert sizes[-1] <= BACKLOG + SLACK
    # Fewer objects than at max_object_bytes each.
    assert len(data) <= 2 + (sum(sizes) - sizes[0]) // int(BACKLOG * 0.9)
    assert len(data) < sum(sizes) // OBJECT


async def test_backlog_object_bytes_at_most_max_object_bytes_keeps_objects_small(
    tmp_path: Path,
) -> None:
    cfg = ShipperConfig(max_object_bytes=OBJECT, backlog_object_bytes=1)
    async with open_journal(tmp_path / "j", JCFG) as j:
        bucket = await LocalBucket.open(tmp_path / "bucket", create=True)
        s = Shipper(j, bucket, REGION, config=cfg)
        await s.claim()
        produce(j, 4, 60)
        await s.ship_pending()
        entries = await read_log(bucket, j, 4)
        await bucket.aclose()
    sizes = [e.raw_bytes for e in entries if not e.header.is_fence]
    assert len(sizes) > 3
    assert all(n <= OBJECT + SLACK for n in sizes), sizes


async def test_live_traffic_keeps_small_objects_and_a_burst_grows_them(
    bucket: Bucket, build_threads: int, tmp_path: Path
) -> None:
    """Under ``run``: a trickle ships small objects; a burst behind one ships larger ones."""
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, bucket, REGION, config=CFG)
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run)
            for _ in range(10):
                produce(j, 2, 1)  # ~4 KiB per round, far below max_object_bytes
                await trio.sleep(0.03)
            with trio.fail_after(30):
                await s.wait_shipped(j.next_lsn - 1)
            trickle_objects = s.statistics().objects
            # A burst: about six backlog objects' worth, appended at once.
            produce(j, 4, 800)
            with trio.fail_after(60):
                await s.wait_shipped(j.next_lsn - 1)
            nursery.cancel_scope.cancel()
        entries = await read_log(bucket, j, 4)
    sizes = [e.raw_bytes for e in entries if not e.header.is_fence]
    trickle, burst = sizes[:trickle_objects], sizes[trickle_objects:]
    assert all(n <= OBJECT + SLACK for n in trickle), trickle
    # The burst ships as a full object, then backlog objects (or, if it landed
    # while the last flush was reading ahead, backlog objects at once).
    assert max(burst) > OBJECT + SLACK, burst
    assert all(n <= BACKLOG + SLACK for n in burst), burst


async def test_fenced_during_a_parallel_drain_lands_nothing_built_ahead(
    build_threads: int, tmp_path: Path
) -> None:
    bucket = await LocalBucket.open(tmp_path / "bucket", create=True)
    async with (
        open_journal(tmp_path / "a", JCFG) as ja,
        open_journal(tmp_path / "b", JCFG) as jb,
    ):
        a = Shipper(ja, bucket, REGION, config=CFG)
        await a.claim()
        produce(ja, 3, 2)
        assert await a.ship_pending() == 1
        produce(ja, 3, 300)  # several backlog objects, built ahead in parallel
        b = Shipper(jb, bucket, REGION, config=CFG)
        await b.claim()
        with pytest.raises(Fenced):
            await a.ship_pending()
        assert a.shipped_lsn < ja.next_lsn - 1
        produce(jb, 3, 1)
        await b.ship_pending()
        head = await find_head(bucket, "", REGION)
        headers = []
        for seq in range(1, head + 1):
            key = log_key("", REGION, seq)
            data = (await bucket.get(key)).data
            headers.append(
                logobject.decode_header(
                    data[: logobject.header_length_hint(data[:12], where=key)], where=key
                )
            )
    await bucket.aclose()
    # A's fence and first entry, B's fence and entry: nothing of A's backlog.
    assert [(h.epoch, h.is_fence) for h in headers] == [
        (1, True),
        (1, False),
        (2, True),
        (2, False),
    ]


async def test_a_drain_resumes_after_a_restart_without_gap_or_duplicate(
    bucket: Bucket, tmp_path: Path
) -> None:
    """Cancelled in the middle of a drain (objects built ahead dropped), then restarted."""
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, bucket, REGION, config=CFG)
        await s.claim()
        produce(j, 4, 300)
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(s.ship_pending)
                while s.statistics().objects < 2:  # noqa: ASYNC110 (no event for this)
                    await trio.sleep(0.001)
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught, "the drain did not make progress"
        assert s.shipped_lsn < j.next_lsn - 1
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, bucket, REGION, config=CFG)
        await s.claim()
        await s.ship_pending()
        assert s.shipped_lsn == j.next_lsn - 1
        await read_log(bucket, j, 4)


@pytest.mark.parametrize("bad", [0, -1, 1024 * MIB + 1])
def test_backlog_object_bytes_is_checked(bad: int) -> None:
    with pytest.raises(ConfigError, match="backlog_object_bytes"):
        ShipperConfig(backlog_object_bytes=bad)


async def test_a_drain_trims_the_c_heap_once_and_a_live_flush_does_not(
    bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a backlog of many objects the heap's free pages go back (edge_gateway.heap)."""
    calls: list[int] = []
    monkeypatch.setattr(shipper_module.heap, "trim", lambda: calls.append(1) or True)
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, bucket, REGION, config=CFG)
        await s.claim()
        produce(j, 1, 1)
        assert await s.ship_pending() == 1  # a live flush: one object, no trim
        assert calls == []
        produce(j, 4, 200)
        shipped = await s.ship_pending()
        assert shipped >= shipper_module.TRIM_AFTER_OBJECTS
        assert calls == [1]
        assert s.statistics().heap_trims == 1
        await read_log(bucket, j, 4)


def test_the_heap_trim_works_on_this_machine() -> None:
    """glibc (the images and CI here): the trim is real, not a silent no-op."""
    assert shipper_module.heap.trim() is True


async def test_a_built_object_waiting_for_its_upload_holds_no_entries(
    bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory of a drain: once built, an object keeps only its compressed bytes.

    At every commit of the drain, the objects already built (the one being
    committed and any built ahead) hold none of the entries they were built
    from: they used to hold them until their own commit, so objects built
    ahead kept theirs while they waited for the link.
    """
    held: list[int] = []
    slots: list[shipper_module._Building] = []
    real_building = shipper_module._Building

    def building(read: shipper_module._Read) -> shipper_module._Building:
        slot = real_building(read)
        slots.append(slot)
        return slot

    monkeypatch.setattr(shipper_module, "_Building", building)
    async with open_journal(tmp_path / "j", JCFG) as j:
        s = Shipper(j, bucket, REGION, config=CFG)
        await s.claim()
        real_commit = s._commit

        async def commit(obj: bytes, seq: int, first: dict, last: dict) -> None:  # type: ignore[type-arg]
            # Objects still being read or built hold theirs (up to _BUILD_THREADS).
            held.append(sum(len(slot.read.data) for slot in slots if slot.done.is_set()))
            await real_commit(obj, seq, first, last)

        monkeypatch.setattr(s, "_commit", commit)
        produce(j, 4, 200)
        shipped = await s.ship_pending()
        await read_log(bucket, j, 4)
    assert shipped == len(held) > 3
    assert held == [0] * len(held)
