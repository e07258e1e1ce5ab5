"""Child process for the map test: the active segment's written pages leave the RSS.

Usage::

    python map_rss_child.py DIR MEBIBYTES FSYNC

Appends MEBIBYTES of one-record entries into ONE active segment (64 MiB
segments) of a journal running its background tasks (``open_journal``),
with ``journal.fsync`` = FSYNC (``interval`` or ``never``), and prints one
JSON object: RssFile (``/proc/self/status``) before and after, the bytes
appended, and then the result of reading every entry back after a reopen in
the same process (a page handed back must still hold what was written).
"""

from __future__ import annotations

import json
import sys

import trio

from edge_gateway.format.batch import decode_batch, encode_record
from edge_gateway.journal import FsyncPolicy, Journal, JournalConfig, open_journal

PARTITIONS = 4
VALUE = 400


def rss_file() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssFile in /proc/self/status")


def value(i: int) -> bytes:
    return (b"%d:" % i).ljust(VALUE, b"v")


async def fill(path: str, mib: int, cfg: JournalConfig) -> dict[str, int]:
    async with open_journal(path, cfg) as j:
        before = rss_file()
        i = 0
        while j.statistics().bytes < mib << 20:
            for _ in range(1000):
                j.append_nowait("t", i % PARTITIONS, encode_record(value(i), timestamp=1))
                i += 1
            await trio.sleep(0.002)  # the flusher and the disk watch run meanwhile
        await j.flush()
        await trio.sleep(1.2)  # one tick of the disk watch (fsync = never)
        after = rss_file()
        segments = j.statistics().segments
    return {"before": before, "after": after, "entries": i, "segments": segments}


def check(path: str, cfg: JournalConfig, entries: int) -> int:
    j = Journal.open_sync(path, cfg)
    try:
        seen = 0
        lsn = 1
        while True:
            got = j.read_entries(lsn, max_bytes=1 << 20)
            if not got:
                break
            for e in got:
                (rec,) = decode_batch(e.payload).records()
                if rec.value != value(seen):
                    raise SystemExit(f"entry {seen}: {rec.value[:20]!r}")
                seen += 1
            lsn = got[-1].lsn + 1
    finally:
        j.close_sync()
    if seen != entries:
        raise SystemExit(f"read {seen} entries back, appended {entries}")
    return seen


def main() -> None:
    path, mib, fsync = sys.argv[1], int(sys.argv[2]), FsyncPolicy(sys.argv[3])
    cfg = JournalConfig(fsync=fsync, segment_bytes=64 << 20, max_bytes=1 << 34, reserve_bytes=0)
    result = trio.run(fill, path, mib, cfg)
    result["checked"] = check(path, cfg, result["entries"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
