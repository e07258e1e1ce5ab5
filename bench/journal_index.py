"""Journal index memory and reopen time with millions of one-record entries.

Usage::

    .venv/bin/python bench/journal_index.py [--quick] [--dir PATH]

A child process (a fresh interpreter, so nothing else is in its heap) fills
a journal with the default configuration (64 MiB segments, 1 MiB index
cache) with one-record entries of 100-byte values over 8 partitions, through
``Journal.append_nowait`` (no HTTP): 2 M entries with ``--quick``, 5 M
otherwise. It reads its VmRSS (``/proc/self/status``) right after a roll at
the first and at the last million, so the active segment (its index and its
memory map, fixed costs of at most ``segment_bytes`` each) is nearly empty
at both points:

* ``rss_mb_per_million_entries``: RSS growth between the two points per
  million entries: what a backlog costs. Baseline, measured in the same
  child: three ``array('q')`` slots per entry, the in-memory index of the
  journal before the disk-resident index (a position, an LSN and an offset).
* ``rss_growth_mb``: RSS after the fill minus after the open, and the
  journal's own ``index_memory_bytes`` against its documented bound
  (``JournalConfig.index_memory_bound``).
* ``reopen_s_per_gib``: a second child opens the journal (files in the page
  cache) and reads 2,000 random offsets; baseline: read + CRC32C of the
  files a verifying open must touch (the index files and the active
  segment).

The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time
from array import array
from pathlib import Path

from _common import (
    GiB,
    MiB,
    Row,
    emit_json,
    fixed_size_values,
    machine_info,
    progress,
    read_crc_seconds,
    render_table,
    scratch_dir,
)

from edge_gateway.format.batch import decode_batch, encode_record
from edge_gateway.journal import FsyncPolicy, Journal, JournalConfig

TOPIC = "bench.telemetry"
PARTITIONS = 8
TARGET_RSS_MB_PER_MILLION = 5.0
TARGET_REOPEN_S_PER_GIB = 2.0


def _rss() -> int:
    gc.collect()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _config() -> JournalConfig:
    return JournalConfig(fsync=FsyncPolicy.NEVER, max_bytes=64 * GiB, reserve_bytes=0)


def child_fill(path: str, entries: int) -> dict[str, object]:
    values = fixed_size_values(4096, 100)
    j = Journal.open_sync(path, _config())
    try:
        after_open = _rss()
        marks: list[tuple[int, int]] = []  # (entries, rss) right after a roll
        want = 1_000_000
        segments = j.statistics().segments
        t0 = time.perf_counter()
        i = 0
        while True:
            for _ in range(256):
                p = i % PARTITIONS
                j.append_nowait(TOPIC, p, encode_record(values[i % 4096], timestamp=1_700_000_000))
                i += 1
            st = j.statistics()
            if st.segments != segments:
                segments = st.segments
                if i >= want:
                    marks.append((i, _rss()))
                    if i >= entries:
                        break
                    want = entries
        fill_s = time.perf_counter() - t0
        after_fill = _rss()
        st = j.statistics()
        bound = j.config.index_memory_bound(st.segments, st.partitions)
    finally:
        j.close_sync()
    # the baseline: the index the journal kept before (3 x i64 per entry)
    before = _rss()
    old_index = array("q", bytes(8 * 3 * i))
    old_rss = _rss() - before
    del old_index
    (n1, r1), (n2, r2) = marks[0], marks[-1]
    return {
        "entries": i,
        "fill_s": fill_s,
        "segments": st.segments,
        "journal_bytes": st.bytes,
        "rss_after_open": after_open,
        "rss_after_fill": after_fill,
        "rss_marks": marks,
        "rss_per_million": (r2 - r1) / ((n2 - n1) / 1e6),
        "baseline_rss_per_million": old_rss / (i / 1e6),
        "index_memory_bytes": st.index_memory_bytes,
        "index_memory_bound": bound,
    }


def child_reopen(path: str, entries: int) -> dict[str, object]:
    t0 = time.perf_counter()
    j = Journal.open_sync(path, _config())
    open_s = time.perf_counter() - t0
    try:
        rnd = random.Random(3)
        per = entries // PARTITIONS
        t0 = time.perf_counter()
        for _ in range(2000):
            p, off = rnd.randrange(PARTITIONS), rnd.randrange(per)
            e = j.read(TOPIC, p, off, max_records=1)[0]
            assert decode_batch(e.payload).records()[0].offset == off
        read_us = (time.perf_counter() - t0) / 2000 * 1e6
        st = j.statistics()
    finally:
        j.close_sync()
    return {
        "open_s": open_s,
        "read_us": read_us,
        "cache_hits": st.index_cache_hits,
        "cache_misses": st.index_cache_misses,
    }


def _run_child(*args: object) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 M entries instead of 5 M")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the scratch directory")
    parser.add_argument(
        "--child", nargs=3, metavar=("MODE", "PATH", "ENTRIES"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        mode, path, entries = args.child
        fn = child_fill if mode == "fill" else child_reopen
        print(json.dumps(fn(path, int(entries))))
        return 0
    entries = 2_000_000 if args.quick else 5_000_000
    started = time.perf_counter()
    fig: dict[str, object] = {"quick": args.quick}
    with scratch_dir("journal-index-", args.dir) as root:
        fig.update(machine_info(root))
        path = root / "j"
        progress(f"journal index bench: filling {entries:,} one-record entries (child process)")
        filled = _run_child("fill", path, entries)
        size = sum(f.stat().st_size for f in path.iterdir() if f.suffix in (".wal", ".idx"))
        gib = size / GiB
        progress(f"  {filled['entries']:,} entries, {gib:.2f} GiB in {filled['segments']} segments")
        reopens = [_run_child("reopen", path, filled["entries"]) for _ in range(3)]
        open_s = sorted(float(str(r["open_s"])) for r in reopens)[1]
        touched = [*path.glob("*.idx"), max(path.glob("*.wal"))]
        crc_s = sorted(read_crc_seconds(touched) for _ in range(3))[1]
    fig.update(
        entries=filled["entries"],
        journal_gib=gib,
        segments=filled["segments"],
        fill_s=filled["fill_s"],
        rss_mb_per_million_entries=float(str(filled["rss_per_million"])) / MiB,
        baseline_rss_mb_per_million_entries=float(str(filled["baseline_rss_per_million"])) / MiB,
        rss_growth_mb=(int(str(filled["rss_after_fill"])) - int(str(filled["rss_after_open"])))
        / MiB,
        index_memory_mb=int(str(filled["index_memory_bytes"])) / MiB,
        index_memory_bound_mb=int(str(filled["index_memory_bound"])) / MiB,
        reopen_s=open_s,
        reopen_s_per_gib=open_s / gib,
        reopen_read_crc_s=crc_s,
        read_us=reopens[1]["read_us"],
        seconds=time.perf_counter() - started,
    )
    g = fig.get
    rss_pm = float(str(g("rss_mb_per_million_entries")))
    reopen = float(str(g("reopen_s_per_gib")))
    targets = {
        "rss_mb_per_million_entries": rss_pm <= TARGET_RSS_MB_PER_MILLION,
        "reopen_s_per_gib": reopen <= TARGET_REOPEN_S_PER_GIB,
    }
    rows: list[Row | str] = [
        f"memory ({fig['entries']:,} one-record entries, 64 MiB segments, 1 MiB index cache)",
        Row(
            "RSS per million entries (backlog)",
            rss_pm,
            "MB",
            "3 x i64 per entry",
            float(str(g("baseline_rss_mb_per_million_entries"))),
            f"<= {TARGET_RSS_MB_PER_MILLION:g}",
            targets["rss_mb_per_million_entries"],
        ),
        Row("RSS growth, open to end of fill", float(str(g("rss_growth_mb"))), "MB"),
        Row(
            "index memory (journal's count)",
            float(str(g("index_memory_mb"))),
            "MB",
            "documented bound",
            float(str(g("index_memory_bound_mb"))),
        ),
        f"reopen ({gib:.2f} GiB, {fig['segments']} segments, files in page cache)",
        Row(
            "clean reopen",
            open_s,
            "s",
            "read+crc idx+active",
            crc_s,
        ),
        Row(
            "clean reopen per GiB",
            reopen,
            "s/GiB",
            "",
            None,
            f"<= {TARGET_REOPEN_S_PER_GIB:g}",
            targets["reopen_s_per_gib"],
        ),
        Row("read at a random offset (after reopen)", float(str(g("read_us"))), "us"),
    ]
    fig["targets"] = targets
    fig["targets_met"] = all(targets.values())
    title = (
        f"edgegw journal index bench ({'quick' if args.quick else 'full'}; "
        f"{fig['fs']} on {fig['device']}, {fig['cpus']} CPUs, Python {fig['python']}; "
        f"MB = MiB here; {fig['seconds']:.0f} s)"
    )
    print(render_table(title, rows))
    print()
    print("targets: " + ", ".join(f"{k} {'PASS' if v else 'SHORT'}" for k, v in targets.items()))
    emit_json(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
