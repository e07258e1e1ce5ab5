"""``edgegw bucket verify`` speed: a region's log read back and compared with its journal.

Usage::

    .venv/bin/python bench/bucket_verify.py [--quick] [--dir PATH]

A journal of 64 MiB (16 MiB with --quick) of telemetry JSON (16 partitions,
batches of 200 records) is shipped by a real :class:`~edge_gateway.shipper.Shipper`
into a local-directory bucket (moto would measure moto). Then, twice each,
alternating (the machine's load drifts; the best of each counts):

* ``verify``   :func:`~edge_gateway.bucket_verify.verify_replica` with the journal,
               no rate bound: every object read and checked, every manifest,
               every record compared with the journal;
* ``baseline`` the same run's floor: every log object and manifest read with
               the same bucket (no checks), plus ``edgegw journal verify``'s
               check of the same journal (:func:`~edge_gateway.journal.verify_journal`:
               every file read and its CRCs checked) -- reading both sides and
               checking one of them.

Figures: seconds, journal MiB/s and bucket MiB/s of each, ``ratio`` =
baseline seconds / verify seconds (1.0: verifying costs no more than reading
both sides and checking the journal's CRCs). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from edge_gateway.bucket import LocalBucket
from edge_gateway.bucket_verify import verify_replica
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.manifest import log_prefix, manifest_prefix
from edge_gateway.journal import FsyncPolicy, JournalConfig, open_journal, verify_journal
from edge_gateway.shipper import Shipper, ShipperConfig

MiB = 1024 * 1024
REGION = "north"
TOPIC = "telemetry"
PARTITIONS = 16
BATCH = 200
RUNS = 2


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def build(root: Path, target: int) -> tuple[Path, Path, int]:
    """A journal of ``target`` bytes shipped to a local bucket: (journal, bucket, objects)."""
    journal, bucket_dir = root / "journal", root / "bucket"
    cfg = JournalConfig(fsync=FsyncPolicy.NEVER)
    async with open_journal(journal, cfg) as j:
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
            # Small objects and a manifest every 4: many objects and manifests to check.
            config = ShipperConfig(max_object_bytes=MiB, backlog_object_bytes=MiB, manifest_every=4)
            shipper = Shipper(j, bucket, REGION, config=config, state_path=root / "shipper.json")
            await shipper.claim()
            objects = await shipper.ship_pending()
    return journal, bucket_dir, objects


async def timed_verify(journal: Path, bucket_dir: Path) -> dict[str, Any]:
    async with await LocalBucket.open(bucket_dir, create=False) as bucket:
        t = time.perf_counter()
        report = await verify_replica(bucket, "", REGION, journal=journal, rate=0)
        took = time.perf_counter() - t
    assert report.ok, report.findings[:3]
    assert report.compared_records == report.records, "not every record was compared"
    return {
        "seconds": took,
        "objects": report.objects,
        "bucket_bytes": report.bytes,
        "records": report.records,
        "manifests": report.manifests,
    }


async def timed_baseline(journal: Path, bucket_dir: Path) -> dict[str, Any]:
    async with await LocalBucket.open(bucket_dir, create=False) as bucket:
        t = time.perf_counter()
        read = 0
        for folder in (log_prefix("", REGION), manifest_prefix("", REGION)):
            for info in await bucket.list(folder):
                read += len((await bucket.get(info.key)).data)
        get_s = time.perf_counter() - t
    t = time.perf_counter()
    checked = verify_journal(journal)
    journal_s = time.perf_counter() - t
    assert checked.ok
    return {"seconds": get_s + journal_s, "get_seconds": get_s, "journal_verify_seconds": journal_s,
            "bucket_bytes": read}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="16 MiB of journal instead of 64")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    target = (16 if args.quick else 64) * MiB
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        progress(f"building a journal of {target // MiB} MiB and shipping it ...")
        journal, bucket_dir, objects = trio.run(build, root, target)
        journal_bytes = sum(f.stat().st_size for f in journal.glob("*.wal"))
        verify_runs: list[dict[str, Any]] = []
        base_runs: list[dict[str, Any]] = []
        for k in range(RUNS):
            progress(f"run {k + 1}/{RUNS}: verify, then the baseline")
            verify_runs.append(trio.run(timed_verify, journal, bucket_dir))
            base_runs.append(trio.run(timed_baseline, journal, bucket_dir))
    v = min(verify_runs, key=lambda r: r["seconds"])
    b = min(base_runs, key=lambda r: r["seconds"])
    fig = {
        "journal_mib": journal_bytes / MiB,
        "bucket_mib": v["bucket_bytes"] / MiB,
        "objects": objects,
        "records": v["records"],
        "verify_seconds": v["seconds"],
        "verify_journal_mib_per_s": journal_bytes / MiB / v["seconds"],
        "verify_bucket_mib_per_s": v["bucket_bytes"] / MiB / v["seconds"],
        "verify_records_per_s": v["records"] / v["seconds"],
        "baseline_seconds": b["seconds"],
        "baseline_get_seconds": b["get_seconds"],
        "baseline_journal_verify_seconds": b["journal_verify_seconds"],
        "ratio": b["seconds"] / v["seconds"],
        "verify_runs": verify_runs,
        "baseline_runs": base_runs,
    }
    print(
        f"journal {fig['journal_mib']:.1f} MiB, bucket {fig['bucket_mib']:.1f} MiB in "
        f"{objects} objects, {fig['records']:,} records\n"
        f"verify    {v['seconds']:7.2f} s  {fig['verify_journal_mib_per_s']:7.1f} journal MiB/s  "
        f"{fig['verify_bucket_mib_per_s']:6.1f} bucket MiB/s  "
        f"{fig['verify_records_per_s']:,.0f} records/s\n"
        f"baseline  {b['seconds']:7.2f} s  (GETs {b['get_seconds']:.2f} s + journal verify "
        f"{b['journal_verify_seconds']:.2f} s)\n"
        f"ratio     {fig['ratio']:.2f} (baseline / verify)"
    )
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
