"""Repair from the bucket at open: what rebuilding a damaged range costs a start.

Usage::

    .venv/bin/python bench/repair.py [--quick] [--dir PATH]

A journal of 32 MiB (8 MiB with --quick; one segment: the last, which an open
scans) of telemetry JSON (16 partitions, batches of 200 records) is shipped by
a real :class:`~edge_gateway.shipper.Shipper` into a local-directory bucket
(moto would measure moto). Then, per run, three copies of the journal are
opened, alternating (the machine's load drifts; the best of each counts):

* ``intact``     the journal as shipped: the same run's baseline (the scan);
* ``quarantine`` a 4 KiB page of zeros in the middle, opened without a
                 source: the range is quarantined (what a start did before);
* ``repair``     the same damage, opened with the gateway's
                 :class:`~edge_gateway.bucket_repair.BucketRepairSource`: the
                 log's head found, the objects searched and read, the range
                 rebuilt, checked and swapped in, the segment scanned again.

Figures: seconds of each open, ``ratio`` = intact seconds / repair seconds
(1.0: a repair costs a start nothing), ``ratio_to_quarantine`` = quarantine
seconds / repair seconds (1.0: a repair costs what the quarantine did: both
rewrite the segment whole and scan it again), the entries and objects of the
repair.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from edge_gateway.bucket import LocalBucket
from edge_gateway.bucket_repair import BucketRepairSource
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import FsyncPolicy, Journal, JournalConfig, RepairSource, open_journal
from edge_gateway.shipper import Shipper, ShipperConfig

MiB = 1024 * 1024
REGION = "north"
TOPIC = "telemetry"
PARTITIONS = 16
BATCH = 200
RUNS = 3
PAGE = 4096
CONFIG = JournalConfig(fsync=FsyncPolicy.NEVER)


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def build(root: Path, target: int) -> tuple[Path, Path, int]:
    """A journal of ``target`` bytes shipped to a local bucket: (journal, bucket, objects)."""
    journal, bucket_dir = root / "journal", root / "bucket"
    async with open_journal(journal, CONFIG) as j:
        n = 0
        while j.statistics().bytes < target:
            for p in range(PARTITIONS):
                values = [
                    b'{"sensor": "s-%d", "t": %d.%d, "seq": %d}' % (p, n % 97, n % 10, n + i)
                    for i in range(BATCH)
                ]
                j.append_nowait(TOPIC, p, encode_batch(values, timestamps=1_700_000_000_000 + n))
                n += BATCH
        async with await LocalBucket.open(bucket_dir, create=True) as bucket:
            config = ShipperConfig(max_object_bytes=MiB, backlog_object_bytes=MiB)
            shipper = Shipper(j, bucket, REGION, config=config)
            await shipper.claim()
            objects = await shipper.ship_pending()
    return journal, bucket_dir, objects


def damaged_copy(journal: Path, to: Path, *, damage: bool) -> Path:
    """A copy of ``journal`` at ``to``; with ``damage``, a 4 KiB page of zeros
    in the middle of its last segment (the one an open scans)."""
    shutil.rmtree(to.parent, ignore_errors=True)
    to.parent.mkdir(parents=True)
    shutil.copytree(journal, to)
    if damage:
        seg = max(to.glob("*.wal"))
        data = bytearray(seg.read_bytes())
        at = len(data.rstrip(b"\0")) // 2 // PAGE * PAGE
        data[at : at + PAGE] = bytes(PAGE)
        seg.write_bytes(bytes(data))
    return to


#: What repairs at an open, given the bucket it reads from.
SourceFactory = Callable[[LocalBucket], RepairSource]


async def timed_open(path: Path, bucket_dir: Path | None, source: SourceFactory) -> dict[str, Any]:
    """Open the journal at ``path`` (repairing from ``bucket_dir`` if given): its figures."""
    async with contextlib.AsyncExitStack() as stack:
        repair = None
        if bucket_dir is not None:
            bucket = await stack.enter_async_context(await LocalBucket.open(bucket_dir))
            repair = source(bucket)
        t = time.perf_counter()
        j = await trio.to_thread.run_sync(lambda: Journal.open_sync(path, CONFIG, repair=repair))
        took = time.perf_counter() - t
    try:
        repairs, losses = j.repairs(), j.losses()
        return {
            "seconds": took,
            "repaired_entries": sum(r.entries for r in repairs),
            "repaired_records": sum(r.records for r in repairs),
            "objects_read": sum(len(r.objects) for r in repairs),
            "lost_entries": sum(x.lsn_last - x.lsn_first + 1 for x in losses),
        }
    finally:
        j.close_sync()


def measure_opens(
    journal: Path, root: Path, bucket_dir: Path, source: SourceFactory
) -> dict[str, Any]:
    """RUNS rounds of the three opens, alternating; the best of each, checked, as figures."""
    runs: dict[str, list[dict[str, Any]]] = {"intact": [], "quarantine": [], "repair": []}
    for k in range(RUNS):
        progress(f"run {k + 1}/{RUNS}: intact, quarantine, repair")
        for name, done in runs.items():
            path = damaged_copy(journal, root / name / "journal", damage=name != "intact")
            src = bucket_dir if name == "repair" else None
            done.append(trio.run(timed_open, path, src, source))
    best = {name: min(rs, key=lambda r: r["seconds"]) for name, rs in runs.items()}
    assert best["repair"]["lost_entries"] == 0, best["repair"]
    assert best["repair"]["repaired_entries"] > 0
    assert best["quarantine"]["lost_entries"] > 0
    return {
        "intact_open_seconds": best["intact"]["seconds"],
        "quarantine_open_seconds": best["quarantine"]["seconds"],
        "repair_open_seconds": best["repair"]["seconds"],
        "repaired_entries": best["repair"]["repaired_entries"],
        "repaired_records": best["repair"]["repaired_records"],
        "objects_read": best["repair"]["objects_read"],
        "quarantined_entries": best["quarantine"]["lost_entries"],
        "ratio": best["intact"]["seconds"] / best["repair"]["seconds"],
        "ratio_to_quarantine": best["quarantine"]["seconds"] / best["repair"]["seconds"],
        "runs": runs,
    }


def report(fig: dict[str, Any], what: str, rebuilt: str) -> None:
    """The figures, then the JSON line."""
    print(
        f"{what}\n"
        f"intact      {fig['intact_open_seconds']:6.3f} s  (the open's scan: the baseline)\n"
        f"quarantine  {fig['quarantine_open_seconds']:6.3f} s  "
        f"({fig['quarantined_entries']} entries quarantined)\n"
        f"repair      {fig['repair_open_seconds']:6.3f} s  ({fig['repaired_entries']} entries, "
        f"{fig['repaired_records']:,} records {rebuilt} {fig['objects_read']} objects)\n"
        f"ratio       {fig['ratio']:.2f} (intact / repair), "
        f"{fig['ratio_to_quarantine']:.2f} (quarantine / repair)"
    )
    print(json.dumps(fig))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="8 MiB of journal instead of 32")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    target = (8 if args.quick else 32) * MiB
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        progress(f"building a journal of {target // MiB} MiB and shipping it ...")
        journal, bucket_dir, objects = trio.run(build, root, target)
        # the shipper's state, where the repair looks for what the bucket confirmed
        assert (journal / "shipper.json").exists()
        journal_bytes = sum(len(f.read_bytes().rstrip(b"\0")) for f in journal.glob("*.wal"))
        opens = measure_opens(
            journal, root, bucket_dir, lambda bucket: BucketRepairSource(bucket, "", REGION)
        )
    fig = {"journal_mib": journal_bytes / MiB, "objects_shipped": objects, **opens}
    report(
        fig,
        f"journal {fig['journal_mib']:.1f} MiB in one segment, {objects} objects shipped",
        "rebuilt from",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
