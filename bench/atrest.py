"""The at-rest format (issue 42): bytes per record at rest, codec speed, one-record lookups.

Usage::

    .venv/bin/python bench/atrest.py [--quick]

Sans-IO: everything is in memory, no disk, no journal -- except the last
section, which reads two real journals in a temporary directory. The workload is the
reference telemetry of WORKLOADS.md (``edge_gateway.sample_data``: drifting
values, deterministic from a seed), key-hash partitioned into 16 partitions,
journaled as today (``format/entry.py``): one record per entry (an HTTP or
MQTT producer's one-record request, the case measured at 335 bytes per
record), and batches of 100 records per entry. Each journal segment is then
rewritten as a compressed segment (``format/atrest.py``) with frames of 64
KiB, 256 KiB (the default) and 1 MiB of raw batches.

Every figure stands beside a baseline measured in the same run:

- bytes per record at rest beside **zstd level 3 of the records' values in 1
  MiB blocks** (what compression alone could reach, FACTS.md's ~11 bytes),
  and beside today's journal bytes;
- encode and decode MB/s (of journal bytes) beside **raw zstd level 3 of the
  same journal bytes** in 1 MiB blocks, compressing and decompressing;
- a one-record lookup with a cold frame cache (one frame decompressed) and a
  warm one, beside decoding the record's entry from the uncompressed journal
  bytes in memory (today's read, without the disk);
- the mirror: log objects built as the shipper does (one per 250 ms at 1,000
  records/s), kept as block entries and rewritten: mirror bytes per bucket byte;
  and the CPU of applying them (MB of bucket bytes per second) beside today's
  path (decompress, decode every batch, one MIRROR entry per batch).

- consume from a mirror's journal (on disk, ``Journal.read`` and the batch
  decode a fetch does): p50 of fetching one record at a random offset, and
  of fetching 10,000 records, from block entries (the frame cache warm, and
  cold, with no cache: every read decompresses its block), beside the same records
  appended as today's MIRROR entries (one per batch, uncompressed) in the same
  run; target <= 1.5x.

The last line is one JSON object with every figure, among them
``bytes_per_record_at_rest`` (one-record entries, default frames) and
``bytes_per_record_today``.
"""

from __future__ import annotations

import argparse
import random
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio
import zstandard as zstd
from _common import MB, MiB, Row, emit_json, median, percentile, progress, render_table

from edge_gateway.format import atrest
from edge_gateway.format import entry as E
from edge_gateway.format.batch import decode_batch, encode_batch
from edge_gateway.format.entry import Checkpoint, SourceCoords
from edge_gateway.format.logobject import (
    LogObjectBuilder,
    decode_block,
    decode_header,
    iter_block_batches,
)
from edge_gateway.journal import Journal, JournalConfig, MirrorBatch, MirrorBlock
from edge_gateway.sample_data import TelemetryGenerator, partition_for

PARTITIONS = 16
TOPIC = "telemetry"
FRAMES = (64 * 1024, atrest.DEFAULT_FRAME_RAW_BYTES, 1024 * 1024)
_WAL_HEADER = struct.Struct("<4sB3xQ")


def journal_segment(n: int, per_entry: int) -> tuple[bytes, list[bytes], list[int]]:
    """``n`` telemetry records journaled as today: the segment, the values, and the byte
    position of every entry (for the baseline reads)."""
    gen = TelemetryGenerator(sensors=200, seed=42)
    nxt = [0] * PARTITIONS
    pending: list[list[tuple[bytes, bytes, int]]] = [[] for _ in range(PARTITIONS)]
    values: list[bytes] = []
    checkpoint = Checkpoint({(TOPIC, p): 0 for p in range(PARTITIONS)}, {}).encode()
    out = [
        _WAL_HEADER.pack(b"EGWJ", 2, 1),
        E.encode_entry(
            lsn=1, kind=E.KIND_CHECKPOINT, topic=b"", partition=0, base_offset=0, count=0,
            append_time=1_795_000_000_000, payload=checkpoint,
        ),
    ]  # fmt: skip
    lsn = 2
    topic = TOPIC.encode()

    def flush(p: int, now: int) -> None:
        nonlocal lsn
        recs = pending[p]
        batch = encode_batch(
            [v for _, v, _ in recs],
            keys=[k for k, _, _ in recs],
            timestamps=[t for _, _, t in recs],
            base_offset=nxt[p],
        )
        out.append(
            E.encode_entry(
                lsn=lsn, kind=E.KIND_DATA, topic=topic, partition=p, base_offset=nxt[p],
                count=len(recs), append_time=now, payload=batch,
            )
        )  # fmt: skip
        nxt[p] += len(recs)
        lsn += 1
        recs.clear()

    for r in gen.take(n):
        p = partition_for(r.key, PARTITIONS)
        values.append(r.value)
        pending[p].append((r.key, r.value, r.timestamp_ms))
        if len(pending[p]) >= per_entry:
            flush(p, r.timestamp_ms + 1)
    for p in range(PARTITIONS):
        if pending[p]:
            flush(p, 1_795_000_000_000 + n)
    positions = []
    pos = 0
    for piece in out:
        positions.append(pos)
        pos += len(piece)
    return b"".join(out), values, positions[2:]  # the data entries


def zstd_blocks(data: bytes, block: int = MiB) -> bytes:
    cctx = zstd.ZstdCompressor(level=3)
    return b"".join(cctx.compress(data[i : i + block]) for i in range(0, len(data), block))


def best_seconds(fn: Callable[[], object], rounds: int) -> float:
    """The best of ``rounds`` timed calls (a loaded 2-core machine: the least disturbed)."""
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def lookups(
    seg: atrest.CompressedSegment, wal: bytes, positions: list[int], offsets: list[int], n: int
) -> dict[str, float]:
    """Latency (us) of reading one record: cold cache, warm cache, and from the journal bytes."""
    rng = random.Random(9)
    # which entry holds which (partition, offset): for the baseline read of today's journal
    where: dict[tuple[int, int], int] = {}
    for pos in positions:
        e = E.decode_entry(wal, pos)
        for k in range(e.count):
            where[(e.partition, e.base_offset + k)] = pos
    picks = []
    for _ in range(n):
        p = rng.randrange(PARTITIONS)
        picks.append((p, rng.randrange(offsets[p])))
    cold, warm, base = [], [], []
    cache_key = id(seg)
    for p, off in picks:
        seg.cache.forget(cache_key)
        t0 = time.perf_counter()
        rec = seg.record(TOPIC, p, off)
        t1 = time.perf_counter()
        again = seg.record(TOPIC, p, off)
        t2 = time.perf_counter()
        e = E.decode_entry(wal, where[(p, off)])
        want = decode_batch(e.payload).records(off)[0]
        t3 = time.perf_counter()
        assert rec == again == want
        cold.append((t1 - t0) * 1e6)
        warm.append((t2 - t1) * 1e6)
        base.append((t3 - t2) * 1e6)
    return {
        "cold_p50_us": median(cold),
        "cold_p99_us": percentile(cold, 99),
        "warm_p50_us": median(warm),
        "journal_p50_us": median(base),
    }


def apply_seconds(objects: list[bytes], rounds: int) -> tuple[float, float]:
    """CPU of applying fetched objects to a mirror's journal, sans-IO: today (check, decompress
    and decode every block, then one MIRROR entry per batch, as ``_decode_blocks`` and
    ``append_mirror_batches`` do) and with block entries (check, keep the block as is)."""
    headers = [decode_header(o, where="apply") for o in objects]

    def today() -> None:
        lsn = 1
        for obj, h in zip(objects, headers, strict=True):
            for k, blk in enumerate(h.blocks):
                raw = decode_block(blk, obj[blk.offset : blk.end], where="apply")
                batches = list(iter_block_batches(blk, raw, where="apply"))
                for j, b in enumerate(batches):
                    E.encode_entry(
                        lsn=lsn, kind=E.KIND_MIRROR, topic=b"south." + blk.topic.encode(),
                        partition=blk.partition, base_offset=b.base_offset, count=b.count,
                        append_time=0, payload=b.raw,
                        source=SourceCoords(
                            "south", h.seq, 1, k == len(h.blocks) - 1 and j == len(batches) - 1
                        ),
                    )  # fmt: skip
                    lsn += 1

    def kept() -> None:
        lsn = 1
        for obj, h in zip(objects, headers, strict=True):
            for k, blk in enumerate(h.blocks):
                atrest.encode_block_entry(
                    lsn=lsn, topic="south." + blk.topic, partition=blk.partition,
                    append_time=0, source=SourceCoords("south", h.seq, 1, k == len(h.blocks) - 1),
                    index=blk, stored=obj[blk.offset : blk.end],
                )  # fmt: skip
                lsn += 1

    return best_seconds(today, rounds), best_seconds(kept, rounds)


def mirror_figures(n: int, rounds: int) -> dict[str, float]:
    """Log objects as the shipper builds them (one per 250 records: 250 ms at 1,000/s),
    mirrored as block entries, then rewritten: bytes kept per bucket byte."""
    wal, _, positions = journal_segment(n, 1)
    bucket = 0
    blocks: list[bytes] = []
    lsn = 1
    per_object = 250
    entries = [E.decode_entry(wal, pos) for pos in positions]
    objects: list[bytes] = []
    for i in range(0, len(entries), per_object):
        b = LogObjectBuilder()
        for e in entries[i : i + per_object]:
            b.add_batch(e.topic, e.partition, e.payload)
        obj = b.build("south", 1, 1 + i // per_object, 1, 1, 0)
        objects.append(obj)
        bucket += len(obj)
        h = decode_header(obj, where="mirror")
        for k, blk in enumerate(h.blocks):
            blocks.append(
                atrest.encode_block_entry(
                    lsn=lsn,
                    topic="south." + blk.topic,
                    partition=blk.partition,
                    append_time=1_795_000_000_000 + i,
                    source=SourceCoords("south", h.seq, 1, k == len(h.blocks) - 1),
                    index=blk,
                    stored=obj[blk.offset : blk.end],
                )
            )
            lsn += 1
    mirror_wal = _WAL_HEADER.pack(b"EGWJ", atrest.WAL_VERSION_BLOCKS, 1) + b"".join(blocks)
    rewritten = atrest.compress_segment(mirror_wal)
    today_s, kept_s = apply_seconds(objects, rounds)
    mb = bucket / MB
    return {
        "mirror_apply_today_mb_s": mb / today_s,
        "mirror_apply_blocks_mb_s": mb / kept_s,
        "mirror_apply_ratio": today_s / kept_s,
        "bucket_bytes": bucket,
        "mirror_journal_bytes": len(mirror_wal),
        "mirror_rewritten_bytes": len(rewritten),
        "mirror_bytes_per_bucket_byte": len(mirror_wal) / bucket,
        "mirror_rewritten_per_bucket_byte": len(rewritten) / bucket,
    }


def consume_figures(n: int, samples: int) -> dict[str, float]:
    """Fetch p50 from a mirror's journal: block entries against one MIRROR entry per batch.

    The same log objects (one per 250 telemetry records, as in
    :func:`mirror_figures`) are appended to one journal as block entries
    (``append_mirror_blocks``) and to another batch by batch
    (``append_mirror_batches``, today's path); a fetch is ``Journal.read``
    from an offset plus decoding the records from it, as the gateway's fetch
    does. Every read is made once before it is timed (the page cache warm,
    as for a journal being read); blocks are read with the default frame
    cache (then warm: a consumer reading again, or on, in a block it read) and
    with none (cold: each read reads, checks and decompresses its block).
    """
    wal, _, positions = journal_segment(n, 1)
    entries = [E.decode_entry(wal, pos) for pos in positions]
    per_object = 250
    objects: list[bytes] = []
    for i in range(0, len(entries), per_object):
        b = LogObjectBuilder()
        for e in entries[i : i + per_object]:
            b.add_batch(e.topic, e.partition, e.payload)
        objects.append(b.build("south", 1, 1 + i // per_object, 1, 1, 0))
    mirror = "south." + TOPIC
    cfg = JournalConfig(max_bytes=1 << 34, reserve_bytes=0)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="atrest-consume-") as tmp:
        root = Path(tmp)

        async def write() -> None:
            blocks_j = Journal.open_sync(root / "blocks", cfg)
            batches_j = Journal.open_sync(root / "batches", cfg)
            try:
                for obj in objects:
                    h = decode_header(obj, where="consume")
                    mid = SourceCoords("south", h.seq, 1, False)
                    last = SourceCoords("south", h.seq, 1, True)
                    await blocks_j.append_mirror_blocks(
                        [
                            MirrorBlock(mirror, blk.partition, blk, obj[blk.offset : blk.end])
                            for blk in h.blocks
                        ],
                        mid,
                        last,
                    )
                    batches = [
                        MirrorBatch(mirror, blk.partition, raw.raw)
                        for blk in h.blocks
                        for raw in iter_block_batches(
                            blk, decode_block(blk, obj[blk.offset : blk.end], where="c"), where="c"
                        )
                    ]
                    await batches_j.append_mirror_batches(batches, mid, last)
            finally:
                blocks_j.close_sync()
                batches_j.close_sync()

        trio.run(write)
        rnd = random.Random(5)
        ends = {}
        j = Journal.open_sync(root / "batches", cfg)
        try:
            for p in range(PARTITIONS):
                ends[p] = j.next_offset(mirror, p)
        finally:
            j.close_sync()
        one = [
            (p, rnd.randrange(ends[p])) for p in (rnd.randrange(PARTITIONS) for _ in range(samples))
        ]
        many = [
            (p, rnd.randrange(max(1, ends[p] - 10_000))) for p, _ in one[: max(20, samples // 10)]
        ]

        def fetch(j: Journal, p: int, offset: int, k: int) -> int:
            got = 0
            for e in j.read(mirror, p, offset, max_records=k, max_bytes=64 * MiB):
                got += len(decode_batch(e.payload).records(offset))
                if got >= k:
                    break
            return got

        def p50(j: Journal, reads: list[tuple[int, int]], k: int) -> float:
            for p, offset in reads:  # warm the page cache (and the frame cache: warm)
                fetch(j, p, offset, k)
            lat = []
            for p, offset in reads:
                t0 = time.perf_counter()
                fetch(j, p, offset, k)
                lat.append((time.perf_counter() - t0) * 1e6)
            return median(lat)

        for name, path, cache in (
            ("batches", "batches", None),
            ("blocks", "blocks", None),
            ("blocks_nocache", "blocks", 0),
        ):
            c = (
                cfg
                if cache is None
                else JournalConfig(max_bytes=1 << 34, reserve_bytes=0, block_cache_bytes=cache)
            )
            j = Journal.open_sync(root / path, c)
            try:
                out[f"consume_one_{name}_p50_us"] = p50(j, one, 1)
                out[f"consume_10k_{name}_p50_us"] = p50(j, many, 10_000)
            finally:
                j.close_sync()
    for k in ("one", "10k"):
        base = out[f"consume_{k}_batches_p50_us"]
        out[f"consume_{k}_blocks_ratio"] = out[f"consume_{k}_blocks_p50_us"] / base
        out[f"consume_{k}_blocks_nocache_ratio"] = out[f"consume_{k}_blocks_nocache_p50_us"] / base
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="about 15 s instead of a minute")
    args = ap.parse_args()
    n = 60_000 if args.quick else 250_000
    rounds = 2 if args.quick else 3
    figures: dict[str, object] = {"records": n, "partitions": PARTITIONS}
    rows: list[Row | str] = []

    progress(f"journaling {n:,} telemetry records as today ...")
    wal1, values, positions1 = journal_segment(n, 1)
    zvalues = zstd_blocks(b"".join(values))
    zwal = zstd_blocks(wal1)
    today = len(wal1) / n
    values_z = len(zvalues) / n
    figures.update(
        bytes_per_record_today=today,
        bytes_per_record_values_raw=sum(map(len, values)) / n,
        bytes_per_record_zstd_values=values_z,
        bytes_per_record_zstd_journal=len(zwal) / n,
    )
    rows.append("bytes per record (one record per entry)")
    rows.append(Row("journal today (format/entry.py)", today, "B", "", None))
    rows.append(Row("zstd-3 of the journal, 1 MiB blocks", len(zwal) / n, "B", "today", today))

    segs: dict[int, tuple[bytes, atrest.CompressedSegment]] = {}
    for frame in FRAMES:
        progress(f"compressing with {frame // 1024} KiB frames ...")
        z = atrest.compress_segment(wal1, frame_raw_bytes=frame)
        assert atrest.expand_segment(z) == wal1
        segs[frame] = (z, atrest.CompressedSegment(z, cache=atrest.FrameCache(32 * MiB)))
        at_rest = len(z) / n
        name = f"at rest, {frame // 1024} KiB frames"
        rows.append(Row(name, at_rest, "B", "zstd-3 of values, 1 MiB", values_z))
        figures[f"bytes_per_record_at_rest_{frame // 1024}k"] = at_rest
    z_default, seg = segs[atrest.DEFAULT_FRAME_RAW_BYTES]
    at_rest = len(z_default) / n
    figures["bytes_per_record_at_rest"] = at_rest
    figures["at_rest_vs_today"] = at_rest / today
    rows.append(
        Row("at rest (default) vs today", at_rest, "B", "today", today, "<= 33 B", at_rest <= 33)
    )
    # where the bytes go: frames (data), entry tables, directory
    d = seg.directory
    frame_bytes = sum(f.stored_length for f in d.frames)
    meta_bytes = sum(c.meta_stored for c in d.chunks)
    figures.update(
        frame_bytes_per_record=frame_bytes / n,
        entry_table_bytes_per_record=meta_bytes / n,
        other_bytes_per_record=(len(z_default) - frame_bytes - meta_bytes) / n,
    )
    rows.append(Row("  of which frames (batches)", frame_bytes / n, "B", "", None))
    rows.append(Row("  of which entry tables", meta_bytes / n, "B", "", None))

    progress("batches of 100 records per entry ...")
    wal100, _, _ = journal_segment(n, 100)
    z100 = atrest.compress_segment(wal100)
    rows.append("bytes per record (100 records per entry)")
    rows.append(Row("journal today", len(wal100) / n, "B", "", None))
    rows.append(Row("at rest (default frames)", len(z100) / n, "B", "zstd-3 of values", values_z))
    figures.update(
        bytes_per_record_today_100=len(wal100) / n, bytes_per_record_at_rest_100=len(z100) / n
    )

    progress("encode / decode speed ...")
    mb = len(wal1) / MB
    enc = best_seconds(lambda: atrest.compress_segment(wal1), rounds)
    zenc = best_seconds(lambda: zstd_blocks(wal1), rounds)
    dctx = zstd.ZstdDecompressor()
    zframes = [zstd_blocks(wal1[i : i + MiB]) for i in range(0, len(wal1), MiB)]
    zdec = best_seconds(lambda: [dctx.decompress(f) for f in zframes], rounds)
    dec = best_seconds(lambda: atrest.expand_segment(z_default), rounds)

    def all_frames() -> None:
        s = atrest.CompressedSegment(z_default, cache=atrest.FrameCache(0))
        for i in range(len(s.directory.frames)):
            s.frame(i)

    frames_dec = best_seconds(all_frames, rounds)
    rows.append("speed (MB of journal bytes per second)")
    rows.append(Row("encode (segment -> compressed)", mb / enc, "MB/s", "zstd-3 of it", mb / zenc))
    rows.append(
        Row("decode (expand to journal bytes)", mb / dec, "MB/s", "zstd -d of it", mb / zdec)
    )
    rows.append(
        Row("decode frames only (a reader)", mb / frames_dec, "MB/s", "zstd -d of it", mb / zdec)
    )
    figures.update(
        encode_mb_s=mb / enc,
        encode_zstd_baseline_mb_s=mb / zenc,
        encode_ratio=zenc / enc,
        decode_mb_s=mb / dec,
        decode_frames_mb_s=mb / frames_dec,
        decode_zstd_baseline_mb_s=mb / zdec,
        decode_ratio=zdec / dec,
        decode_frames_ratio=zdec / frames_dec,
    )

    progress("one-record lookups ...")
    offsets = [0] * PARTITIONS
    for f in seg.directory.frames:
        offsets[f.partition] = max(offsets[f.partition], f.last_offset + 1)
    rows.append("one-record lookup (random offsets; us)")
    for frame in FRAMES:
        lat = lookups(segs[frame][1], wal1, positions1, offsets, 300 if args.quick else 1000)
        k = frame // 1024
        rows.append(
            Row(
                f"cold, {k} KiB frames p50",
                lat["cold_p50_us"],
                "us",
                "journal entry decode",
                lat["journal_p50_us"],
            )
        )
        rows.append(Row(f"cold, {k} KiB frames p99", lat["cold_p99_us"], "us", "", None))
        rows.append(
            Row(
                f"warm, {k} KiB frames p50",
                lat["warm_p50_us"],
                "us",
                "journal entry decode",
                lat["journal_p50_us"],
            )
        )
        for key, value in lat.items():
            figures[f"lookup_{k}k_{key}"] = value

    progress("the mirror's blocks ...")
    mirror = mirror_figures(n // 2, rounds)
    rows.append("mirror (log objects of 250 records kept as block entries)")
    rows.append(
        Row(
            "mirror journal bytes",
            mirror["mirror_journal_bytes"],
            "B",
            "bucket bytes",
            mirror["bucket_bytes"],
            "<= 1.2x",
            mirror["mirror_bytes_per_bucket_byte"] <= 1.2,
        )
    )
    rows.append(
        Row(
            "mirror, rewritten at rest",
            mirror["mirror_rewritten_bytes"],
            "B",
            "bucket bytes",
            mirror["bucket_bytes"],
        )
    )
    rows.append(
        Row(
            "apply fetched objects (sans-IO CPU)",
            mirror["mirror_apply_blocks_mb_s"],
            "MB/s",
            "today: decode + entry per batch",
            mirror["mirror_apply_today_mb_s"],
        )
    )
    figures.update(mirror)

    progress("consume from a mirror's journal: block entries and MIRROR entries ...")
    consume = consume_figures(n // 2, 300 if args.quick else 1000)
    rows.append("consume from a mirror journal (Journal.read + decode, p50 us)")
    for k, what in (("one", "one record, random offset"), ("10k", "10,000 records")):
        base = consume[f"consume_{k}_batches_p50_us"]
        rows.append(
            Row(
                f"{what}, block entries, warm cache",
                consume[f"consume_{k}_blocks_p50_us"],
                "us",
                "MIRROR entry per batch",
                base,
                "<= 1.5x",
                consume[f"consume_{k}_blocks_ratio"] <= 1.5,
            )
        )
        rows.append(
            Row(
                f"{what}, block entries, cold (no cache)",
                consume[f"consume_{k}_blocks_nocache_p50_us"],
                "us",
                "MIRROR entry per batch",
                base,
            )
        )
    figures.update(consume)

    print(render_table("edgegw at-rest format (sans-IO, in memory)", rows))
    emit_json(figures)


if __name__ == "__main__":
    main()
