"""What dropping costs a drop-oldest lane on the append path (docs/journal.md,
"Drop-oldest lanes").

One-record entries (100-byte values) appended far past the journal's budget
(``max_bytes`` 32 MiB, 4 MiB segments), measured two ways in one run, each
in a fresh journal directory, in interleaved rounds:

* baseline: a block journal whose shipped watermark keeps up (the safe LSN
  moves to the end after every 1,000 appends), so it stays within its budget
  by deleting *shipped* segments -- what a journal over budget costs when
  the link is up;
* drop-oldest: a drop-oldest journal that never ships (the link is down), so
  it stays within its budget by dropping unshipped segments: per segment, the
  ranges are computed from its index, appended to ``dropped.log`` and
  fsynced before the unlink.

Also: the time of one drop (record + fsync + unlink; median and max), and a
check that the recorded ranges plus what is left are exactly every offset
appended. ``fsync = "never"`` for the entries, so the figures are the path's
cost, not the disk's (the drop's own fsync of ``dropped.log`` is counted).
Usage: ``python bench/drop_oldest.py [--quick]``; the last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Row, emit_json, machine_info, median, progress, render_table, scratch_dir

from edge_gateway.format.batch import encode_record
from edge_gateway.journal import FsyncPolicy, Journal, JournalConfig

MiB = 1 << 20
CFG = JournalConfig(fsync=FsyncPolicy.NEVER, segment_bytes=4 * MiB, max_bytes=32 * MiB)
TOPICS = ("t", "u", "v", "w")


def _batches(n: int) -> list[bytes]:
    return [encode_record(b"%099d" % i, timestamp=1_795_380_000_000 + i) for i in range(n)]


def bench_shipped(root: Path, batches: list[bytes]) -> float:
    j = Journal.open_sync(root / "journal", CFG)
    try:
        t0 = time.perf_counter()
        for i, b in enumerate(batches):
            j.append_nowait(TOPICS[i % 4], 0, b)
            if i % 1000 == 999:
                j.set_safe_lsn(j.next_lsn)
        return len(batches) / (time.perf_counter() - t0)
    finally:
        j.close_sync()


def bench_drop(root: Path, batches: list[bytes]) -> tuple[float, list[float], bool]:
    j = Journal.open_sync(root / "journal", CFG, drop_oldest=True)
    times: list[float] = []
    inner = j._retention.drop_unshipped

    def timed() -> bool:
        t = time.perf_counter()
        try:
            return inner()
        finally:
            times.append(time.perf_counter() - t)

    j._retention.drop_unshipped = timed  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        for i, b in enumerate(batches):
            j.append_nowait(TOPICS[i % 4], 0, b)
        rate = len(batches) / (time.perf_counter() - t0)
        exact = True
        for t in TOPICS:
            gone = [
                o
                for d in j.dropped()
                for r in d.ranges
                if r.topic == t
                for o in range(r.first, r.last + 1)
            ]
            held = list(range(j.first_offset(t, 0), j.next_offset(t, 0)))
            exact = exact and gone + held == list(range(j.next_offset(t, 0)))
        return rate, times, exact
    finally:
        j.close_sync()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="600k appends instead of 2M")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the scratch directory")
    args = parser.parse_args(argv)
    # One WARNING per drop is the product's; here it would drown the figures.
    logging.getLogger("edgegw.journal").setLevel(logging.ERROR)
    n = 600_000 if args.quick else 2_000_000
    batches = _batches(n)
    shipped: list[float] = []
    dropped: list[float] = []
    drop_times: list[float] = []
    exact = True
    fig: dict[str, object] = {"quick": args.quick, "appends": n}
    with scratch_dir("drop-oldest-", args.dir) as root:
        fig.update(machine_info(root))
        for r in range(3):
            progress(f"drop-oldest bench: round {r + 1}/3, {n:,} appends each")
            d = root / f"shipped-{r}"
            d.mkdir()
            shipped.append(bench_shipped(d, batches))
            d = root / f"drop-{r}"
            d.mkdir()
            rate, times, ok = bench_drop(d, batches)
            dropped.append(rate)
            drop_times += times
            exact = exact and ok
    base, drop = max(shipped), max(dropped)
    drop_ms = [t * 1000 for t in drop_times]
    rows = [
        "one-record entries (100-byte values) into a 32 MiB budget, 4 MiB segments, best of 3",
        Row("block journal, shipped segments deleted", base, "appends/s"),
        Row("drop-oldest journal, offline (drops)", drop, "appends/s", "block", base),
        Row("one drop (record + fsync + unlink), median", median(drop_ms), "ms"),
        Row("one drop, max", max(drop_ms), "ms"),
    ]
    print(render_table(f"edgegw drop-oldest bench ({'quick' if args.quick else 'full'})", rows))
    print(f"dropped ranges exact: {exact} ({len(drop_times)} drops)")
    fig.update(
        shipped_appends_per_s=base,
        drop_appends_per_s=drop,
        drop_ratio=drop / base,
        drops=len(drop_times),
        drop_ms_median=median(drop_ms),
        drop_ms_max=max(drop_ms),
        ranges_exact=exact,
    )
    emit_json(fig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
