"""Child process for the index memory test: fill a journal, or reopen and read it, measuring RSS.

Usage::

    python index_memory_child.py fill DIR ENTRIES SEGMENT_BYTES CACHE_BYTES
    python index_memory_child.py reopen DIR ENTRIES SEGMENT_BYTES CACHE_BYTES SEED

``fill`` appends ENTRIES one-record entries round-robin to PARTITIONS
partitions of topic ``t`` (record value: a function of partition and
offset) through the Journal API, no HTTP. ``reopen`` opens the journal and
reads 2,000 random offsets (and runs of the shipper's LSN reads), checking
each record. Both print one JSON object: VmRSS (from /proc/self/status) at
each step, the journal's own figures, and the number of checks made.
"""

from __future__ import annotations

import gc
import json
import random
import sys

from edge_gateway.format.batch import decode_batch, encode_record
from edge_gateway.journal import FsyncPolicy, Journal, JournalConfig

PARTITIONS = 8


def record_value(partition: int, offset: int) -> bytes:
    return f"{partition}:{offset}".encode()


def rss() -> int:
    """Resident set size of this process in bytes (VmRSS)."""
    gc.collect()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def config(segment_bytes: int, cache_bytes: int) -> JournalConfig:
    return JournalConfig(
        fsync=FsyncPolicy.NEVER,
        segment_bytes=segment_bytes,
        max_bytes=1 << 40,
        retention_ms=1 << 40,
        index_cache_bytes=cache_bytes,
        reserve_bytes=0,
    )


def fill(path: str, entries: int, cfg: JournalConfig) -> dict[str, object]:
    j = Journal.open_sync(path, cfg)
    try:
        after_open = rss()
        ts = 1_700_000_000_000
        for i in range(entries):
            p = i % PARTITIONS
            off = i // PARTITIONS
            j.append_nowait("t", p, encode_record(record_value(p, off), timestamp=ts))
        after_fill = rss()
        st = j.statistics()
    finally:
        j.close_sync()
    return {
        "rss_after_open": after_open,
        "rss_after_fill": after_fill,
        "segments": st.segments,
        "bytes": st.bytes,
        "index_memory_bytes": st.index_memory_bytes,
        "partitions": st.partitions,
    }


def reopen(path: str, entries: int, cfg: JournalConfig, seed: int) -> dict[str, object]:
    before_open = rss()
    j = Journal.open_sync(path, cfg)
    try:
        after_open = rss()
        rnd = random.Random(seed)
        checks = 0
        per_partition = entries // PARTITIONS
        for _ in range(2000):
            p = rnd.randrange(PARTITIONS)
            off = rnd.randrange(per_partition)
            got = j.read("t", p, off, max_records=3)
            recs = [r for e in got for r in decode_batch(e.payload).records(off)]
            want = [(o, record_value(p, o)) for o in range(off, min(off + 3, per_partition))]
            if [(r.offset, r.value) for r in recs][: len(want)] != want:
                raise AssertionError(f"t/{p}@{off}: {recs[:3]} != {want}")
            checks += 1
        # the shipper's reads: runs of LSNs from random points
        for _ in range(50):
            lsn = rnd.randrange(1, j.next_lsn)
            run = j.read_entries(lsn, max_bytes=64 * 1024)
            for e in run:
                value = decode_batch(e.payload).records()[0].value
                if value != record_value(e.partition, e.base_offset):
                    raise AssertionError(f"LSN {e.lsn}: {value!r}")
                checks += 1
            if run and run[0].lsn < lsn:
                raise AssertionError(f"read_entries({lsn}) started at {run[0].lsn}")
        after_reads = rss()
        st = j.statistics()
    finally:
        j.close_sync()
    return {
        "rss_before_open": before_open,
        "rss_after_open": after_open,
        "rss_after_reads": after_reads,
        "open_seconds": st.open_seconds,
        "segments": st.segments,
        "bytes": st.bytes,
        "index_memory_bytes": st.index_memory_bytes,
        "index_cache_bytes": st.index_cache_bytes,
        "checks": checks,
    }


def main(argv: list[str]) -> None:
    mode, path, entries, segment_bytes, cache_bytes = argv[:5]
    cfg = config(int(segment_bytes), int(cache_bytes))
    if mode == "fill":
        out = fill(path, int(entries), cfg)
    else:
        out = reopen(path, int(entries), cfg, int(argv[5]))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
