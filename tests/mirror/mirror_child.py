"""Child process: region ``b`` mirrors topic ``ship`` of region ``a``, for the crash test.

Usage: python mirror_child.py DATA_DIR BUCKET_DIR [--catch-up]

Runs a tailer into a journal with ``fsync=always`` on a slow disk: the
journal writes a source object's batches with one ``pwritev`` (see
``Journal.append_mirror_batches``), which this disk carries out one entry at
a time, 3 ms apart, so a kill can land between two batches of one object
(a torn group, truncated by the next open). Prints ``<partition> <next offset>`` whenever a
mirror partition grows. ``--catch-up`` pulls up to the head and exits
(status 0), printing ``DONE <next seq>``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import trio

from edge_gateway.bucket import LocalBucket
from edge_gateway.journal import JournalConfig, _fs, open_journal
from edge_gateway.mirror import Tailer, TailerConfig

PARTITIONS = 3


class SlowDisk(_fs.FileOps):
    """A write of several entries (3 iovecs each) goes out entry by entry, slowly."""

    def pwritev(self, fd: int, parts: Sequence[bytes | memoryview], pos: int) -> int:  # type: ignore[override]
        if len(parts) <= 3:
            return os.pwritev(fd, parts, pos)
        done = 0
        for i in range(0, len(parts), 3):
            if i:
                time.sleep(0.003)  # in the journal's worker thread
            done += os.pwritev(fd, parts[i : i + 3], pos + done)
        return done


async def report(j: object, partitions: int) -> None:
    from edge_gateway.journal import Journal

    assert isinstance(j, Journal)
    seen = [0] * partitions
    while True:
        for p in range(partitions):
            n = j.next_offset("a.ship", p)
            if n != seen[p]:
                seen[p] = n
                sys.stdout.write(f"{p} {n}\n")
                sys.stdout.flush()
        await trio.sleep(0.005)


async def main(data_dir: str, bucket_dir: str, catch_up: bool) -> None:
    _fs.ops = SlowDisk()
    cfg = JournalConfig(fsync="always", segment_bytes=256 * 1024)  # type: ignore[arg-type]
    tcfg = TailerConfig(
        poll_interval_s=0.01,
        max_poll_interval_s=0.05,
        retry_base_s=0.01,
        retry_cap_s=0.1,
        catch_up_threshold=8,
        prefetch_objects=4,
        cursor_interval_s=0.2,
        progress_every=4,
    )
    bucket = await LocalBucket.open(Path(bucket_dir), create=True)
    try:
        async with open_journal(Path(data_dir) / "journal", cfg) as j:
            tailer = Tailer(j, bucket, "a", ["ship"], "b", tcfg)
            if catch_up:
                result = await tailer.catch_up()
                sys.stdout.write(f"DONE {result.next_seq}\n")
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(report, j, PARTITIONS)
                await nursery.start(tailer.run)
    finally:
        await bucket.aclose()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], "--catch-up" in sys.argv)
