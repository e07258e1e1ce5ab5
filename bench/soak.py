"""Soak: three regions on moto behind capped, jittery links, a fault every 30 s, for 20 minutes.

Usage::

    .venv/bin/python bench/soak.py [--quick | --minutes M] [--no-restarts] [--seed N] [--dir DIR]

Built on the scenario runner (``edgegw scenario run``), not a second harness:
it writes a scenario file and runs it. Three regions (``alpha``, ``beta``,
``gamma``), each on its own capped link with jitter (``gamma``'s journal on a
small disk budget, ``beta``'s clock three hours fast), routing from the
metadata server, one topic per region mirrored everywhere, steady load; from
t = 30 s a fault every 30 s, rotating through the kinds (bucket link down,
blackholed, answers lost, slow, lossy, capped; metadata server down and
blackholed; kill -9 and restart; a frozen gateway; a split brain from
``edgegw restore``) and through the regions. 20 minutes; ``--quick`` 2;
``--minutes M`` another length. ``--no-restarts`` puts a link down where
the kills and split brains were, so each region's gateway is one process
for the whole run: what its heap does over a life longer than the ~15
minutes the kills leave one.

The runner checks everything at the end (lost, duplicated, reordered, mirror
divergence); this script adds the soak's figures. Replication lag is the
region's (from the most its mirrors held, by any of its gateways): a gateway
restored from the bucket replays the homes' history, whose age is reported
apart (``restore_replay_max_s``) next to each split brain's catch-up time
(``restore_catch_up_s``: until every mirror holds what the homes held when
the restored gateway took over). RSS growth is the slope of
a least-squares line through each gateway process's resident set (sampled
every 5 s) after the first quarter of the run, over the longest-lived
process of each region, in MB per hour; the largest over the regions
(``rss_anon_growth_mb_per_hour``: the same of the anonymous part, the
heap, without the journal's file pages mapped in, which the kernel takes
back under pressure; ``rss_anon_growth_by_region``: that slope per region,
a shrinking heap negative).

The last line is one JSON object: ``acked``, ``lost``, ``duplicates``,
``reordered``, ``mirror_mismatches``, ``faults``, ``kills``, ``max_lag_s``,
``p99_lag_s``, ``peak_rss_mb``, ``rss_growth_mb_per_hour``, and what they
are judged against (``longest_fault_s``; ``targets_met``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REGIONS = ("alpha", "beta", "gamma")
#: (action, for_s) in rotation; "kill" is followed by a start 3 s later.
KINDS: tuple[tuple[str, float], ...] = (
    ("link_down", 10),
    ("kill", 0),
    ("blackhole", 10),
    ("metadata_down", 10),
    ("drop_responses", 5),
    ("pause", 5),
    ("slow", 10),
    ("metadata_blackhole", 10),
    ("lossy", 10),
    ("split_brain", 0),
    ("cap", 10),
)
PARAMS = {
    "slow": "latency_ms = 300\njitter_ms = 100\n",
    "lossy": "resets_per_min = 30\n",
    "cap": "up_mbit = 0.5\ndown_mbit = 1\n",
}


def scenario_toml(duration_s: float, restarts: bool = True) -> str:
    """The soak's scenario; without ``restarts``, no kill and no split brain
    (each gateway process then lives the whole run: its heap's course)."""
    out = [
        'name = "soak"',
        'description = "three regions, capped jittery links, a fault every 30 s"',
        f"duration_s = {duration_s:g}",
        'bucket = "s3"',
        "metadata = true",
        "converge_timeout_s = 180",
    ]
    for r in REGIONS:
        out += ["[[regions]]", f'name = "{r}"']
        if r == "gamma":
            out.append("journal_max_mb = 32")
        if r == "beta":
            out.append("clock_skew_h = 3")
        out += ["[regions.link]", "up_mbit = 8", "down_mbit = 16"]
        out += ["latency_ms = 30", "jitter_ms = 10"]
    for r in REGIONS:
        out += ["[[topics]]", f'name = "{r}-data"', f'home = "{r}"', "partitions = 2"]
        out += ['subscribers = ["*"]']
    for r in REGIONS:
        out += ["[[workload]]", f'region = "{r}"', f'topic = "{r}-data"', "rate = 300"]
        out += ["batch = 20"]
    split_done: set[str] = set()
    for i, at in enumerate(range(30, int(duration_s) - 10, 30)):
        action, for_s = KINDS[i % len(KINDS)]
        region = REGIONS[i % len(REGIONS)]
        if not restarts and action in ("kill", "split_brain"):
            action, for_s = "link_down", 10
        if action == "split_brain":
            # One split brain per region: a second one would restore the restored.
            if region in split_done:
                action, for_s = "link_down", 10
            split_done.add(region)
        out += ["[[faults]]", f"at_s = {at}", f'action = "{action}"', f'region = "{region}"']
        if for_s:
            out.append(f"for_s = {for_s:g}")
        out.append(PARAMS.get(action, "").rstrip("\n"))
        if action == "kill":
            out += ["[[faults]]", f"at_s = {at + 3}", 'action = "start"', f'region = "{region}"']
    return "\n".join(line for line in out if line) + "\n"


def region_slope(
    series: list[list[float]], duration_s: float, column: int
) -> tuple[float, float] | None:
    """One region's least-squares slope of RSS after the first quarter, over its
    longest-lived process: (MB per hour, seconds fitted over), or None with
    fewer than three samples.

    ``column`` 2 is VmRSS, 3 RssAnon (the heap, without the journal's file
    pages mapped in).
    """
    by_pid: dict[int, list[tuple[float, float]]] = {}
    for s in series:
        if s[0] >= duration_s / 4:
            value = s[column] if len(s) > column else s[2]
            by_pid.setdefault(int(s[1]), []).append((s[0], value / 2**20))
    points = max(by_pid.values(), key=len, default=[])
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return None
    slope = sum((t - mx) * (v - my) for t, v in points) / var  # MB per second
    return slope * 3600, points[-1][0] - points[0][0]


def rss_growth_by_region(
    samples: dict[str, list[list[float]]], duration_s: float, column: int = 3
) -> dict[str, float]:
    """Each region's slope in MB per hour, negative when it shrank (0 without samples)."""
    out = {}
    for region, series in sorted(samples.items()):
        fitted = region_slope(series, duration_s, column)
        out[region] = round(fitted[0], 2) if fitted is not None else 0.0
    return out


def rss_growth_mb_per_hour(
    samples: dict[str, list[list[float]]], duration_s: float, column: int = 2
) -> tuple[float, float]:
    """The largest region's slope, at least 0, and the shortest window it was
    fitted over in seconds: a slope over two minutes says little about an hour.
    """
    fitted = [
        f for f in (region_slope(v, duration_s, column) for v in samples.values()) if f is not None
    ]
    worst = max([0.0] + [slope for slope, _ in fitted])
    window = min((w for _, w in fitted), default=0.0)
    return round(worst, 2), round(window, 1)


def summarise(doc: dict[str, Any], toml: str, duration_s: float) -> dict[str, Any]:
    lags = doc["replication_lag"].values()
    faults = toml.count("[[faults]]") - toml.count('action = "start"')
    longest = max(
        [float(line.split("=")[1]) for line in toml.splitlines() if line.startswith("for_s")],
        default=0.0,
    )
    growth, window = rss_growth_mb_per_hour(doc["rss_samples"], duration_s)
    anon_growth, _ = rss_growth_mb_per_hour(doc["rss_samples"], duration_s, column=3)
    out = {
        "acked": doc["acknowledged"],
        "lost": doc["lost"],
        "duplicates": doc["duplicated"],
        "reordered": doc["reordered"],
        "mirror_mismatches": doc["mirror_divergence"],
        "acked_by_fenced_writer": doc.get("acked_by_fenced_writer", 0),
        "faults": faults,
        "kills": toml.count('action = "kill"'),
        "max_lag_s": max((v["max_s"] for v in lags), default=0.0),
        "p99_lag_s": max((v["p99_s"] for v in lags), default=0.0),
        # A restored gateway's mirrors replaying the homes' history: how far
        # behind they were at worst (the history's age), judged apart.
        "restore_replay_max_s": max((v.get("replay_max_s", 0.0) for v in lags), default=0.0),
        "catch_up_max_s": max(
            (c["seconds"] for c in doc["catch_up"] if c["seconds"] is not None), default=0.0
        ),
        "restore_catch_up_s": [
            c["seconds"] for c in doc["catch_up"] if str(c["fault"]).startswith("split brain")
        ],
        "not_caught_up": sum(1 for c in doc["catch_up"] if c["seconds"] is None),
        "peak_rss_mb": round(max(v["peak_rss_bytes"] for v in doc["regions"].values()) / 2**20, 1),
        "rss_growth_mb_per_hour": growth,
        "rss_growth_window_s": window,
        "rss_anon_growth_mb_per_hour": anon_growth,
        "rss_anon_growth_by_region": rss_growth_by_region(doc["rss_samples"], duration_s),
        "longest_fault_s": longest,
        "duration_s": duration_s,
        "runner_passed": doc["passed"],
        "failures": doc["failures"][:5],
    }
    out["targets_met"] = (
        doc["passed"]
        and out["lost"] == out["duplicates"] == out["reordered"] == 0
        and out["mirror_mismatches"] == 0
        and out["max_lag_s"] <= longest + 5
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="2 minutes instead of 20")
    ap.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="run this long instead (the heap's growth needs hours to settle)",
    )
    ap.add_argument(
        "--no-restarts",
        action="store_true",
        help="no kill -9 and no split brain (a link down instead): one process per region",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (a temporary one)")
    args = ap.parse_args()
    duration = 120.0 if args.quick else 1200.0
    if args.minutes is not None:
        duration = args.minutes * 60
    work = args.dir or Path(tempfile.mkdtemp(prefix="edgegw-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    toml = scenario_toml(duration, restarts=not args.no_restarts)
    scenario = work / "soak.toml"
    scenario.write_text(toml)
    report = work / "report.json"
    argv = [sys.executable, "-m", "edgegw_cli", "scenario", "run", str(scenario)]
    argv += ["--seed", str(args.seed), "--dir", str(work / "run"), "--report", str(report)]
    print(f"soak: {duration:g}s, scenario {scenario}, work {work / 'run'}", flush=True)
    proc = subprocess.run(argv, check=False, env=os.environ.copy())
    if not report.exists():
        print(
            json.dumps({"error": f"the scenario runner exited {proc.returncode} without a report"})
        )
        return 1
    out = summarise(json.loads(report.read_text()), toml, duration)
    print(json.dumps(out))
    return 0 if out["targets_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
