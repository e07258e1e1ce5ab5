"""Repair of mirror entries at open: what re-fetching a damaged range from the source costs.

Usage::

    .venv/bin/python bench/mirror_repair.py [--quick] [--dir PATH] [--batches]

Region ``north`` ships a journal of 32 MiB (8 MiB with --quick) of telemetry
JSON (``bench/repair.py``'s ``build``: 16 partitions, batches of 200 records)
into a local-directory bucket; a real :class:`~edge_gateway.mirror.Tailer`
in region ``south`` mirrors it all (blocks kept as fetched, the default;
``--batches``: ``keep_blocks = false``, one entry per batch). Then, per run,
three copies of the mirror's journal are opened, alternating (the best of
each counts):

* ``intact``     the mirror's journal as mirrored: the same run's baseline;
* ``quarantine`` a 4 KiB page of zeros in the middle of its last segment,
                 opened without a source: the range is quarantined;
* ``repair``     the same damage, opened with the gateway's
                 :class:`~edge_gateway.mirror_repair.MirrorRepairSource`: the
                 source objects named by the entries around the damage read,
                 the entries appended again, checked, swapped in, the
                 segment scanned again.

Figures: seconds of each open, ``ratio`` = intact seconds / repair seconds,
``ratio_to_quarantine`` = quarantine seconds / repair seconds, the entries,
records and source objects of the repair. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from repair import CONFIG, MiB, build, progress

from edge_gateway.bucket import LocalBucket
from edge_gateway.journal import Journal
from edge_gateway.mirror import Tailer, TailerConfig
from edge_gateway.mirror_repair import MirrorRepairSource

RUNS = 3
PAGE = 4096


async def mirror(root: Path, bucket_dir: Path, *, keep_blocks: bool) -> Path:
    """``south``'s journal, mirroring all of ``north``'s log."""
    path = root / "mirror"
    async with await LocalBucket.open(bucket_dir) as bucket:
        j = Journal.open_sync(path, CONFIG)
        try:
            config = dataclasses.replace(TailerConfig(), keep_blocks=keep_blocks)
            await Tailer(j, bucket, "north", None, "south", config).catch_up()
        finally:
            j.close_sync()
    return path


def _copy(journal: Path, to: Path, *, damage: bool) -> Path:
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


async def timed_open(path: Path, bucket_dir: Path | None, *, keep_blocks: bool) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        source = None
        if bucket_dir is not None:
            bucket = await stack.enter_async_context(await LocalBucket.open(bucket_dir))
            source = MirrorRepairSource(bucket, "", "south", keep_blocks=keep_blocks)
        t = time.perf_counter()
        j = await trio.to_thread.run_sync(lambda: Journal.open_sync(path, CONFIG, repair=source))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="8 MiB of journal instead of 32")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--batches", action="store_true", help="mirror with keep_blocks = false")
    args = parser.parse_args(argv)
    keep_blocks = not args.batches
    target = (8 if args.quick else 32) * MiB
    runs: dict[str, list[dict[str, Any]]] = {"intact": [], "quarantine": [], "repair": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        progress(f"building a journal of {target // MiB} MiB, shipping and mirroring it ...")
        _, bucket_dir, objects = trio.run(build, root, target)
        journal = trio.run(lambda: mirror(root, bucket_dir, keep_blocks=keep_blocks))
        last = max(journal.glob("*.wal"))
        mirror_bytes = len(last.read_bytes().rstrip(b"\0"))
        for k in range(RUNS):
            progress(f"run {k + 1}/{RUNS}: intact, quarantine, repair")
            for name, done in runs.items():
                path = _copy(journal, root / name / "journal", damage=name != "intact")
                src = bucket_dir if name == "repair" else None
                opened = trio.run(lambda p=path, s=src: timed_open(p, s, keep_blocks=keep_blocks))
                done.append(opened)
    best = {name: min(rs, key=lambda r: r["seconds"]) for name, rs in runs.items()}
    assert best["repair"]["lost_entries"] == 0, best["repair"]
    assert best["repair"]["repaired_entries"] > 0
    assert best["quarantine"]["lost_entries"] > 0
    fig = {
        "keep_blocks": keep_blocks,
        "objects_shipped": objects,
        "mirror_segment_mib": mirror_bytes / MiB,
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
    print(
        f"source {objects} objects; the mirror's last segment {fig['mirror_segment_mib']:.1f} MiB "
        f"({'block entries' if keep_blocks else 'one entry per batch'})\n"
        f"intact      {fig['intact_open_seconds']:6.3f} s  (the open's scan: the baseline)\n"
        f"quarantine  {fig['quarantine_open_seconds']:6.3f} s  "
        f"({fig['quarantined_entries']} entries quarantined)\n"
        f"repair      {fig['repair_open_seconds']:6.3f} s  ({fig['repaired_entries']} entries, "
        f"{fig['repaired_records']:,} records re-fetched from "
        f"{fig['objects_read']} source objects)\n"
        f"ratio       {fig['ratio']:.2f} (intact / repair), "
        f"{fig['ratio_to_quarantine']:.2f} (quarantine / repair)"
    )
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
