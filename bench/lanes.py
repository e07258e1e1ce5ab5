"""What the journal lanes cost on the append path (docs/journal.md, "Lanes").

Appends of one-record entries (100-byte values), measured three ways in one
run, each in a fresh journal directory:

* baseline: ``Journal.append_nowait`` on the journal itself (the gateway
  before lanes);
* one lane: ``Lanes.append_nowait`` with no priority configured (the
  gateway's path today without priorities: must cost next to nothing);
* three lanes: ``Lanes.append_nowait`` over three topics of priorities
  critical/normal/bulk in turn (routing, the budget split, three journals);
  its own baseline is the same appends straight into three journals, so the
  facade's cost shows apart from the cost of writing three journals.

``fsync = "never"`` so the figures are the CPU cost of the path, not the
disk's. Usage: ``python bench/lanes.py [--quick]``; the last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Row, emit_json, machine_info, progress, render_table, scratch_dir

from edge_gateway.format.batch import encode_record
from edge_gateway.journal import (
    MAIN_LANE,
    FsyncPolicy,
    Journal,
    JournalConfig,
    Lane,
    Lanes,
    Priority,
    lane_path,
)

CFG = JournalConfig(fsync=FsyncPolicy.NEVER, segment_bytes=64 << 20, max_bytes=8 << 30)
TOPICS = {"alarms": Priority.CRITICAL, "metrics": Priority.NORMAL, "logs": Priority.BULK}


def _batches(n: int) -> list[bytes]:
    return [encode_record(b"%099d" % i, timestamp=1_795_380_000_000 + i) for i in range(n)]


def _open(root: Path, lanes: tuple[Lane, ...]) -> dict[Lane, Journal]:
    return {lane: Journal.open_sync(lane_path(root / "journal", lane), CFG) for lane in lanes}


def bench_journal(root: Path, batches: list[bytes]) -> float:
    j = Journal.open_sync(root / "journal", CFG)
    try:
        topics = list(TOPICS)
        t0 = time.perf_counter()
        for i, b in enumerate(batches):
            j.append_nowait(topics[i % 3], 0, b)
        return len(batches) / (time.perf_counter() - t0)
    finally:
        j.close_sync()


def bench_three_journals(root: Path, batches: list[bytes], lanes: tuple[Lane, ...]) -> float:
    journals = _open(root, lanes)
    try:
        by_topic = {t: journals[Lane(p)] for t, p in TOPICS.items()}
        order = [(t, by_topic[t]) for t in TOPICS]
        t0 = time.perf_counter()
        for i, b in enumerate(batches):
            topic, j = order[i % 3]
            j.append_nowait(topic, 0, b)
        return len(batches) / (time.perf_counter() - t0)
    finally:
        for j in journals.values():
            j.close_sync()


def bench_lanes(root: Path, batches: list[bytes], lanes: tuple[Lane, ...]) -> float:
    journals = _open(root, lanes)
    try:
        facade = Lanes(journals, TOPICS.__getitem__, CFG)
        topics = list(TOPICS)
        t0 = time.perf_counter()
        for i, b in enumerate(batches):
            facade.append_nowait(topics[i % 3], 0, b)
        return len(batches) / (time.perf_counter() - t0)
    finally:
        for j in journals.values():
            j.close_sync()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100k appends instead of 500k")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the scratch directory")
    args = parser.parse_args(argv)
    n = 100_000 if args.quick else 500_000
    batches = _batches(n)
    three = (Lane(Priority.CRITICAL), MAIN_LANE, Lane(Priority.BULK))
    runs: dict[str, list[float]] = {
        "journal": [],
        "one_lane": [],
        "three_journals": [],
        "three_lanes": [],
    }
    fig: dict[str, object] = {"quick": args.quick, "appends": n}
    with scratch_dir("lanes-") as root:
        fig.update(machine_info(root))
        for r in range(3):  # interleaved rounds: drift of the machine hits all three alike
            progress(f"lanes bench: round {r + 1}/3, {n:,} appends each")
            for name, figures in runs.items():
                d = root / f"{name}-{r}"
                d.mkdir()
                if name == "journal":
                    figures.append(bench_journal(d, batches))
                elif name == "one_lane":
                    figures.append(bench_lanes(d, batches, (MAIN_LANE,)))
                elif name == "three_journals":
                    figures.append(bench_three_journals(d, batches, three))
                else:
                    figures.append(bench_lanes(d, batches, three))
    best = {name: max(v) for name, v in runs.items()}
    base = best["journal"]
    rows = [
        "appends of one-record entries (100-byte values), best of 3, fsync never",
        Row("Journal.append_nowait", base, "appends/s"),
        Row("Lanes, one lane", best["one_lane"], "appends/s", "journal", base),
        Row("three journals, direct", best["three_journals"], "appends/s", "journal", base),
        Row(
            "Lanes, three lanes",
            best["three_lanes"],
            "appends/s",
            "three journals",
            best["three_journals"],
        ),
    ]
    print(render_table(f"edgegw lanes bench ({'quick' if args.quick else 'full'})", rows))
    fig.update(
        journal_appends_per_s=base,
        one_lane_appends_per_s=best["one_lane"],
        three_lanes_appends_per_s=best["three_lanes"],
        one_lane_ratio=best["one_lane"] / base,
        three_journals_appends_per_s=best["three_journals"],
        three_lanes_ratio=best["three_lanes"] / best["three_journals"],
    )
    emit_json(fig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
