"""The shipper's path from stored blocks: a compressed segment ships chunk by chunk.

docs/at-rest.md ("The shipper: objects from stored blocks"): at a chunk's
first LSN the shipper builds one object from the chunk's stored blocks, with
no zstd; the object is byte for byte the one the builder makes from the raw
batches of the chunk's LSN range at the rewrite's level and frame size.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from edge_gateway.bucket import LocalBucket
from edge_gateway.bucket_log import find_head
from edge_gateway.errors import CorruptData
from edge_gateway.format import entry as fentry
from edge_gateway.format import logobject
from edge_gateway.format.atrest import CompressedSegment
from edge_gateway.format.batch import Record, encode_batch
from edge_gateway.format.crypt import Keyring, MissingKey, WriteKey, generate_key
from edge_gateway.format.entry import ProducerStamp
from edge_gateway.format.logobject import LogObjectBuilder, LogObjectHeader
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import (
    MAIN_LANE,
    Journal,
    JournalConfig,
    Lane,
    Lanes,
    Priority,
    compress_sealed_segment,
    lane_path,
)
from edge_gateway.shipper import Shipper

CFG = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=10**12)
FRAME = 1500
SMALL = {"frame_raw_bytes": FRAME, "chunk_raw_bytes": 9000}
LEVEL = 3  # compress_sealed_segment's level
NOW = 1_795_000_000_000
PARTS = 5


def _batch(p: int, first: int, n: int) -> bytes:
    values: list[bytes | None] = [
        None if (first + i) % 7 == 3 else f"v{p}-{first + i}-".encode() * (1 + (i % 4))
        for i in range(n)
    ]
    keys: list[bytes | None] = [None if i % 3 else f"k{first + i}".encode() for i in range(n)]
    headers = [[("h", None), ("n", b"")] if i % 2 else [] for i in range(n)]
    return encode_batch(
        values, keys=keys, timestamps=[NOW + first + i for i in range(n)], headers=headers
    )


def _write(root: Path, steps: int = 1200, start: int = 0) -> None:
    """Local data only: null values and headers, an idempotent producer on partition 1
    (steps ``start`` to ``steps - 1`` of one sequence)."""
    j = Journal.open_sync(root, CFG)
    try:
        seq = 0
        for step in range(steps):
            p = step % PARTS
            n = 1 + step % 5
            if step >= start:
                batch = _batch(p, j.next_offset("t", p), n)
                if p == 1:
                    j.append_nowait("t", p, batch, ProducerStamp(42, 3, seq))
                else:
                    j.append_nowait("t", p, batch)
            if p == 1:
                seq += n
    finally:
        j.close_sync()


def _sealed(root: Path) -> list[int]:
    return [int(f.name.split(".")[0]) for f in sorted(root.glob("*.wal"))[:-1]]


def _compress(root: Path) -> list[tuple[int, int]]:
    """Compress every sealed segment; the chunks' LSN ranges."""
    chunks = []
    for base in _sealed(root):
        c = compress_sealed_segment(root, base, **SMALL)
        d = CompressedSegment(c.path.read_bytes()).directory
        chunks += [(ch.first_lsn, ch.last_lsn) for ch in d.chunks]
    return chunks


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stored") / "j"
    _write(root)
    assert len(_sealed(root)) >= 3
    return root


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.lock", "lock"))
    return dest


async def _objects(bucket: LocalBucket) -> list[tuple[LogObjectHeader, bytes]]:
    out = []
    for seq in range(1, await find_head(bucket, "", "north") + 1):
        key = log_key("", "north", seq)
        data = (await bucket.get(key)).data
        out.append((logobject.decode_header(data, where=key, object_size=len(data)), data))
    return out


def _records(
    objects: list[tuple[LogObjectHeader, bytes]], ring: Keyring | None = None
) -> dict[int, list[Record]]:
    out: dict[int, list[Record]] = {}
    for h, data in objects:
        opener = ring.header_opener(h, where="obj") if ring is not None else None
        for b in h.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.end], where="obj", opener=opener)
            for batch in logobject.iter_block_batches(b, raw, where="obj"):
                out.setdefault(b.partition, []).extend(batch.records())
    return out


def _journal_records(root: Path) -> dict[int, list[Record]]:
    from edge_gateway.format.batch import decode_batch

    j = Journal.open_sync(root, CFG)
    try:
        return {
            p: [
                r
                for e in j.read("t", p, 0, max_records=10**6, max_bytes=1 << 30)
                for r in decode_batch(e.payload).records()
            ]
            for _, p in j.partitions()
        }
    finally:
        j.close_sync()


async def _ship(root: Path, bucket: LocalBucket, **kw: Any) -> Shipper:
    j = Journal.open_sync(root, CFG)
    try:
        s = Shipper(j, bucket, "north", clock=lambda: NOW, **kw)
        await s.claim()
        await s.ship_pending()
        assert s.shipped_lsn == j.next_lsn - 1
        return s
    finally:
        j.close_sync()


async def test_a_chunk_ships_byte_for_byte_as_the_builder_makes_it_from_the_raw_batches(
    written: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = _copy(written, tmp_path / "plain")
    packed = _copy(written, tmp_path / "packed")
    chunks = _compress(packed)
    last_compressed = max(last for _, last in chunks)
    # zstd runs only for what is not compressed at rest (the last segment)
    calls = [0]
    compress = logobject.compress_block

    def counting(cctx: Any, raw: Any) -> tuple[bytes, int]:
        calls[0] += 1
        return compress(cctx, raw)

    monkeypatch.setattr(logobject, "compress_block", counting)
    bucket = await LocalBucket.open(tmp_path / "bucket", create=True)
    try:
        stats = (await _ship(packed, bucket)).statistics()
        monkeypatch.setattr(logobject, "compress_block", compress)
        objects = await _objects(bucket)
    finally:
        await bucket.aclose()
    shipped = [(h.first_lsn, h.last_lsn) for h, _ in objects if h.blocks]
    assert [c for c in shipped if c[1] <= last_compressed] == chunks
    after = [h for h, _ in objects if h.first_lsn > last_compressed]
    assert calls[0] == sum(len(h.blocks) for h in after)
    # each chunk's object, built again from the uncompressed journal's batches
    j = Journal.open_sync(plain, CFG)
    try:
        for h, data in objects:
            if not h.blocks or h.last_lsn > last_compressed:
                continue
            entries = [
                e
                for e in j.read_entries(h.first_lsn, max_bytes=1 << 30)
                if h.first_lsn <= e.lsn <= h.last_lsn and e.kind == fentry.KIND_DATA
            ]
            builder = LogObjectBuilder(max_block_bytes=FRAME)
            for e in entries:
                builder.add_batch(e.topic, e.partition, e.payload)
            again = builder.build(
                "north", h.epoch, h.seq, h.first_lsn, h.last_lsn, NOW, level=LEVEL
            )
            assert again == data, f"seq {h.seq}"
            assert h.flags & logobject.FLAG_NULLS
    finally:
        j.close_sync()
    # the statistics count the chunks' records and journal bytes as the entries' would
    assert stats.records == sum(len(v) for v in _journal_records(plain).values())
    plain_bucket = await LocalBucket.open(tmp_path / "plain-bucket", create=True)
    try:
        plain_stats = (await _ship(plain, plain_bucket)).statistics()
    finally:
        await plain_bucket.aclose()
    assert (stats.records, stats.journal_bytes) == (plain_stats.records, plain_stats.journal_bytes)


async def test_a_shipper_stopped_inside_a_chunk_ships_the_rest_of_it_once_then_chunks(
    written: Path, tmp_path: Path
) -> None:
    root = tmp_path / "j"
    bucket = await LocalBucket.open(tmp_path / "bucket", create=True)
    try:
        # Ship what the first segment holds so far, then append more: the
        # shipped position is inside the first segment, and once it is
        # compressed, inside one of its chunks.
        _write(root, steps=80)
        stopped_at = (await _ship(root, bucket)).shipped_lsn
        _write(root, steps=1200, start=80)
        chunks = _compress(root)
        inside = next(c for c in chunks if c[0] <= stopped_at + 1 <= c[1])
        assert inside[0] != stopped_at + 1, "the test means to stop inside a chunk"
        await _ship(root, bucket)
        objects = await _objects(bucket)
    finally:
        await bucket.aclose()
    ranges = [(h.first_lsn, h.last_lsn) for h, _ in objects if h.blocks]
    # the rest of the chunk, once, rebuilt from its frames; then the chunks that follow
    k = ranges.index((stopped_at + 1, inside[1]))
    following = [c for c in chunks if c[0] > inside[1]]
    assert ranges[k + 1 : k + 1 + len(following)] == following
    # every record exactly once, in order, as the journal holds it
    assert _records(objects) == _journal_records(root)


async def test_an_encrypted_region_seals_the_stored_blocks_at_ship_time(
    written: Path, tmp_path: Path
) -> None:
    plain = _copy(written, tmp_path / "plain")
    packed = _copy(written, tmp_path / "packed")
    chunks = _compress(packed)
    key = WriteKey("k1", generate_key())
    bucket = await LocalBucket.open(tmp_path / "bucket", create=True)
    try:
        await _ship(packed, bucket, key=key)
        objects = await _objects(bucket)
    finally:
        await bucket.aclose()
    assert all(h.key_id == "k1" for h, _ in objects if h.blocks)
    assert [(h.first_lsn, h.last_lsn) for h, _ in objects if h.blocks][: len(chunks)] == chunks
    # without the key nothing opens; with it, every record as the journal holds it
    with pytest.raises(MissingKey):
        _records(objects, Keyring())
    assert _records(objects, Keyring({"north": {"k1": key.key}})) == _journal_records(plain)


LANE_CFG = JournalConfig(segment_bytes=64 * 1024, max_bytes=64 * 1024 * 1024, retention_ms=0)
LANE_TOPICS = {"alarms": Priority.CRITICAL, "metrics": Priority.NORMAL, "logs": Priority.BULK}


def _lane_value(topic: str, o: int) -> bytes:
    return f"{topic}-{o}-".encode() * 20


def _open_lanes(main: Path) -> Lanes:
    journals = {
        lane: Journal.open_sync(lane_path(main, lane), LANE_CFG)
        for lane in (Lane(Priority.CRITICAL), MAIN_LANE, Lane(Priority.BULK))
    }
    return Lanes(journals, lambda t: LANE_TOPICS.get(t, Priority.NORMAL), LANE_CFG)


def _produce(lanes: Lanes, topic: str, batches: int) -> None:
    for _ in range(batches):
        first = lanes.next_offset(topic, 0)
        values = [_lane_value(topic, first + i) for i in range(10)]
        lanes.append_nowait(topic, 0, encode_batch(values, timestamps=NOW + first))


async def test_lanes_drain_in_order_with_compressed_lanes_and_live_critical_entries(
    tmp_path: Path,
) -> None:
    main = tmp_path / "journal"
    lanes = _open_lanes(main)
    try:
        _produce(lanes, "metrics", 150)
        _produce(lanes, "logs", 150)
    finally:
        for j in lanes.journals.values():
            j.close_sync()
    chunks = {}
    for lane in (MAIN_LANE, Lane(Priority.BULK)):
        chunks[lane.id] = _compress(lane_path(main, lane))
        assert len(chunks[lane.id]) >= 10
    lanes = _open_lanes(main)
    bucket = await LocalBucket.open(tmp_path / "bucket", create=True)
    try:
        _produce(lanes, "alarms", 5)  # critical entries pending when the drain starts
        s = Shipper(lanes.main, bucket, "north", lanes=lanes, clock=lambda: NOW)
        await s.claim()
        await s.ship_pending()
        assert s.shipped_lsns() == {lane: j.next_lsn - 1 for lane, j in lanes.journals.items()}
        objects = await _objects(bucket)
    finally:
        for j in lanes.journals.values():
            j.close_sync()
        await bucket.aclose()
    # Every lane's LSN ranges follow each other; the compressed ones are their chunks.
    last: dict[int, int] = {}
    seen: dict[int, list[tuple[int, int]]] = {}
    for h, _ in objects:
        for lane, first, end in [(0, h.first_lsn, h.last_lsn)] + [
            (r.lane, r.first_lsn, r.last_lsn) for r in h.lanes
        ]:
            assert first == last.get(lane, 0) + 1, (h.seq, lane, first, last)
            last[lane] = end
            if first <= end:
                seen.setdefault(lane, []).append((first, end))
    for lane_id, ranges in chunks.items():
        assert [r for r in seen[lane_id] if r[1] <= ranges[-1][1]] == ranges
    # ... and in drain order: critical, then normal, then bulk; each record once, in order
    offsets: dict[str, list[int]] = {}
    seqs: dict[str, list[int]] = {}
    for h, data in objects:
        for b in h.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.end], where="obj")
            for batch in logobject.iter_block_batches(b, raw, where="obj"):
                for r in batch.records():
                    assert r.value == _lane_value(b.topic, r.offset)
                    offsets.setdefault(b.topic, []).append(r.offset)
            seqs.setdefault(b.topic, []).append(h.seq)
    assert offsets == {
        "alarms": list(range(50)),
        "metrics": list(range(1500)),
        "logs": list(range(1500)),
    }
    assert max(seqs["alarms"]) <= min(seqs["metrics"])
    assert max(seqs["metrics"]) <= min(seqs["logs"])


async def test_a_damaged_frame_stops_the_drain_with_corrupt_data_naming_the_file(
    written: Path, tmp_path: Path
) -> None:
    root = _copy(written, tmp_path / "j")
    _compress(root)
    path = root / sorted(f.name for f in root.glob("*.wal"))[1]
    data = bytearray(path.read_bytes())
    frame = next(f for f in CompressedSegment(bytes(data)).directory.frames)
    data[frame.offset + frame.stored_length // 2] ^= 0x10
    path.write_bytes(bytes(data))
    bucket = await LocalBucket.open(tmp_path / "bucket", create=True)
    j = Journal.open_sync(root, CFG)  # the open reads the directory only
    try:
        s = Shipper(j, bucket, "north")
        await s.claim()
        with pytest.raises(CorruptData) as info:
            await s.ship_pending()
        assert str(path) in str(info.value)
        assert "CRC" in info.value.reason
        # nothing of the damaged chunk, nor after it, was shipped
        assert s.shipped_lsn < int(path.name.split(".")[0])
    finally:
        j.close_sync()
        await bucket.aclose()
