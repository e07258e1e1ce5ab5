"""Replay: a mirror catching up on a log of small entries, CPU per entry, in-process.

Usage::

    .venv/bin/python bench/replay.py [--quick] [--entries N] [--dir PATH]

What a restored gateway does first (``edgegw restore``, then ``serve``): its
mirrors replay the other regions' logs from the start, entry by entry, and a
quiet site's log is thousands of small entries (one per flush). With packs
(docs/mirroring.md, "Small entries") a replay is no longer bound by round
trips but by the CPU the loop spends per entry: plan, decode, check, append,
publish. This bench measures that cost with nothing else in the way -- no
HTTP, no link, a local-directory bucket (the files in the page cache) --
so the figure moves only with the code.

Region ``a``'s shipper writes ``--entries`` entries (3,000; ``--quick`` 600)
of two single-record batches each, ~0.4 KB, a manifest and a pack every 40
entries, into a local bucket. A fresh journal's ``Tailer.catch_up()`` then
mirrors the whole log, three times (a fresh journal each), the median
reported: seconds, entries/s and CPU per entry (the process's user + system
time, worker threads included).

Baselines, in the same run and process:

* ``journal_append_us_per_entry``: appending the same batches, one entry's
  at a time, to a fresh journal with ``Journal.append_nowait`` -- what
  writing the records locally costs, without reading, checking or ordering
  anything; ``cpu_ratio_vs_append`` is the replay's CPU per entry over it.
* ``read_crc_us_per_entry``: reading and CRC32C-checking every file the
  replay reads (packs, manifests), per entry.

The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import trio
from _common import (
    Row,
    emit_json,
    machine_info,
    progress,
    read_crc_seconds,
    render_table,
    scratch_dir,
)

from edge_gateway.bucket import LocalBucket
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.mirror import Tailer
from edge_gateway.shipper import Shipper, ShipperConfig

JCFG = JournalConfig(segment_bytes=16 * 1024 * 1024, retention_ms=0)
SHIP = ShipperConfig(flush_interval_ms=1, manifest_every=40)
PARTITIONS = 2
RUNS = 3


def entry_batches(i: int) -> list[tuple[int, bytes]]:
    """Entry ``i``'s batches: one per partition, two ~100-byte records each."""
    out = []
    for p in range(PARTITIONS):
        base = 2 * i
        values = [f"site-{p} reading {base + k} temp=21.{k} rh=40".encode() * 2 for k in range(2)]
        out.append((p, encode_batch(values, timestamps=[1_700_000_000_000 + base] * 2)))
    return out


async def ship(root: Path, entries: int) -> None:
    bucket = await LocalBucket.open(root / "bucket", create=True)
    journal = Journal.open_sync(root / "a", JCFG)
    try:
        shipper = Shipper(journal, bucket, "a", config=SHIP)
        async with trio.open_nursery() as nursery:
            await nursery.start(shipper.run)
            for i in range(entries):
                for p, batch in entry_batches(i):
                    journal.append_nowait("t", p, batch)
                await shipper.wait_shipped(journal.next_lsn - 1)
                if i % 500 == 0:
                    progress(f"  shipped {i}/{entries} entries")
            await shipper.ship_pending()  # the last manifest and its pack
            nursery.cancel_scope.cancel()
    finally:
        journal.close_sync()
        await bucket.aclose()


async def replay(root: Path, run: int) -> dict[str, float]:
    bucket = await LocalBucket.open(root / "bucket")
    journal = Journal.open_sync(root / f"mirror-{run}", JCFG)
    try:
        tailer = Tailer(journal, bucket, "a", None, "b")
        t0, c0 = time.perf_counter(), time.process_time()
        result = await tailer.catch_up()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        stats = tailer.statistics()
    finally:
        journal.close_sync()
        await bucket.aclose()
    return {
        "entries": result.entries,
        "seconds": seconds,
        "cpu_s": cpu,
        "pack_entries": stats.pack_entries,
        "pack_reads": stats.pack_reads,
    }


def append_baseline(root: Path, entries: int) -> float:
    """CPU seconds to append every entry's batches to a fresh journal."""
    batches = [entry_batches(i) for i in range(entries)]
    journal = Journal.open_sync(root / "baseline", JCFG)
    try:
        c0 = time.process_time()
        for entry in batches:
            for p, batch in entry:
                journal.append_nowait("t", p, batch)
        return time.process_time() - c0
    finally:
        journal.close_sync()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="600 entries instead of 3,000")
    ap.add_argument("--entries", type=int, default=None, help="entries in the log")
    ap.add_argument("--dir", type=Path, default=None, help="scratch parent directory")
    args = ap.parse_args()
    entries = args.entries or (600 if args.quick else 3000)
    with scratch_dir("replay", args.dir) as root:
        progress(f"shipping {entries} small entries of region a into a local bucket ...")
        trio.run(ship, root, entries)
        runs = []
        for run in range(RUNS):
            progress(f"replay {run + 1}/{RUNS} ...")
            runs.append(trio.run(replay, root, run))
        append_cpu = append_baseline(root, entries)
        read_files = sorted(
            p
            for folder in ("pack", "manifest")
            for p in (root / "bucket" / "objects" / "regions" / "a" / folder).iterdir()
        )
        read_s = read_crc_seconds(read_files)
        info = machine_info(root)
    applied = int(runs[0]["entries"])
    cpu_us = statistics.median(r["cpu_s"] for r in runs) / applied * 1e6
    seconds = statistics.median(r["seconds"] for r in runs)
    append_us = append_cpu / applied * 1e6
    read_us = read_s / applied * 1e6
    rows = [
        Row("replay CPU per entry", cpu_us, "us", "journal append of the same", append_us),
        Row("replay CPU per entry", cpu_us, "us", "read + CRC32C of its files", read_us),
        Row("replay rate", applied / seconds, "entries/s"),
        Row("entries from packs", runs[0]["pack_entries"], "", "pack reads", runs[0]["pack_reads"]),
    ]
    title = f"Replay of {applied} small entries (median of {RUNS} runs, in-process, local bucket)"
    print(render_table(title, rows))
    fig: dict[str, object] = {
        "entries": applied,
        "replay_s": seconds,
        "replay_entries_per_s": applied / seconds,
        "replay_cpu_us_per_entry": cpu_us,
        "replay_cpu_us_per_entry_runs": [r["cpu_s"] / applied * 1e6 for r in runs],
        "pack_entries": runs[0]["pack_entries"],
        "pack_reads": runs[0]["pack_reads"],
        "journal_append_us_per_entry": append_us,
        "read_crc_us_per_entry": read_us,
        "cpu_ratio_vs_append": cpu_us / append_us,
        "quick": args.quick,
        **info,
    }
    emit_json(fig)


if __name__ == "__main__":
    main()
