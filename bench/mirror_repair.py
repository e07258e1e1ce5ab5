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
import dataclasses
import sys
import tempfile
from pathlib import Path

import trio
from repair import CONFIG, MiB, build, measure_opens, progress, report

from edge_gateway.bucket import LocalBucket
from edge_gateway.journal import Journal
from edge_gateway.mirror import Tailer, TailerConfig
from edge_gateway.mirror_repair import MirrorRepairSource


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="8 MiB of journal instead of 32")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--batches", action="store_true", help="mirror with keep_blocks = false")
    args = parser.parse_args(argv)
    keep_blocks = not args.batches
    target = (8 if args.quick else 32) * MiB
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        progress(f"building a journal of {target // MiB} MiB, shipping and mirroring it ...")
        _, bucket_dir, objects = trio.run(build, root, target)
        journal = trio.run(lambda: mirror(root, bucket_dir, keep_blocks=keep_blocks))
        last = max(journal.glob("*.wal"))
        mirror_bytes = len(last.read_bytes().rstrip(b"\0"))
        opens = measure_opens(
            journal,
            root,
            bucket_dir,
            lambda bucket: MirrorRepairSource(bucket, "", "south", keep_blocks=keep_blocks),
        )
    fig = {
        "keep_blocks": keep_blocks,
        "objects_shipped": objects,
        "mirror_segment_mib": mirror_bytes / MiB,
        **opens,
    }
    report(
        fig,
        f"source {objects} objects; the mirror's last segment {fig['mirror_segment_mib']:.1f} MiB "
        f"({'block entries' if keep_blocks else 'one entry per batch'})",
        "re-fetched from",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
