"""Helpers shared by the benchmarks in ``bench/``: workload data, statistics, output.

Every benchmark prints a readable table, each figure next to a baseline measured
in the same run, and ends with exactly one line holding a JSON object with its
figures (so CI and people read the same run). Scratch data goes to a directory
under ``bench/out/`` (git-ignored, on the project's disk, never tmpfs) and is
removed at the end.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
#: Throughputs are reported in MB/s with MB = 10**6 bytes (as disk vendors do).
MB = 1_000_000

BENCH_DIR = Path(__file__).resolve().parent
OUT_DIR = BENCH_DIR / "out"

#: Telemetry timestamps start here, so generated data is the same on every run.
EPOCH_MS = int(datetime(2026, 11, 22, 10, 0, tzinfo=UTC).timestamp() * 1000)
_SITES = ("north", "south", "east", "west")


# ----------------------------------------------------------------- workload


@dataclass(frozen=True, slots=True)
class Telemetry:
    """One reference telemetry record (the workloads guide): key = sensor id."""

    key: bytes
    value: bytes
    timestamp: int


def _iso_ms(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def telemetry(
    n: int, *, seed: int = 42, sensors: int = 64, rate_per_s: float = 1000.0
) -> list[Telemetry]:
    """``n`` reference telemetry records (JSON, ~150-200 bytes), deterministic from ``seed``.

    Each sensor's readings drift slowly (a random walk) with noise on top, so
    compression figures look like a real site's; sensors report round-robin at
    ``rate_per_s`` records per second in total.
    """
    rng = random.Random(seed)
    # per sensor: temperature, humidity, vibration (the slowly drifting level)
    levels = [
        [rng.uniform(17.0, 25.0), rng.uniform(35.0, 60.0), rng.uniform(0.005, 0.02)]
        for _ in range(sensors)
    ]
    step_ms = 1000.0 / rate_per_s
    out: list[Telemetry] = []
    for seq in range(n):
        s = seq % sensors
        level = levels[s]
        level[0] += rng.gauss(0.0, 0.01)
        level[1] = min(95.0, max(5.0, level[1] + rng.gauss(0.0, 0.05)))
        level[2] = max(0.0, level[2] + rng.gauss(0.0, 0.0002))
        ts = EPOCH_MS + int(seq * step_ms)
        sensor_id = f"s-{s:05d}"
        doc = {
            "sensor_id": sensor_id,
            "site": _SITES[s % len(_SITES)],
            "ts": _iso_ms(ts),
            "temperature": round(level[0] + rng.gauss(0.0, 0.05), 2),
            "humidity": round(level[1] + rng.gauss(0.0, 0.3), 1),
            "vibration": round(max(0.0, level[2] + rng.gauss(0.0, 0.002)), 3),
            "seq": seq,
        }
        out.append(Telemetry(sensor_id.encode(), json.dumps(doc).encode(), ts))
    return out


def fixed_size_values(n: int, size: int = 100, *, seed: int = 7) -> list[bytes]:
    """``n`` compact telemetry-like JSON values of exactly ``size`` bytes each.

    The JSON is padded with whitespace before its closing brace, so every value
    is still valid JSON; ``size`` must be at least about 80.
    """
    out = []
    for t in telemetry(n, seed=seed):
        doc = json.loads(t.value)
        compact = json.dumps(
            {
                "id": doc["sensor_id"],
                "ts": t.timestamp,
                "t": doc["temperature"],
                "h": doc["humidity"],
                "seq": doc["seq"],
            },
            separators=(",", ":"),
        ).encode()
        if len(compact) > size:
            raise ValueError(f"values of {size} bytes are too small for a telemetry record")
        out.append(compact[:-1] + b" " * (size - len(compact)) + b"}")
    return out


# --------------------------------------------------------------- statistics


def read_crc_seconds(files: Sequence[Path]) -> float:
    """A plain read + CRC32C of ``files``: the floor of any verifying open."""
    import crc32c

    t0 = time.perf_counter()
    for f in files:
        crc32c.crc32c(f.read_bytes())
    return time.perf_counter() - t0


def timed_rounds(fn: Callable[[], object], budget_s: float, rounds: int = 10) -> list[float]:
    """Seconds per call of ``fn`` in each of ``rounds`` timed rounds of repeated calls,
    within about ``budget_s`` together (one untimed call sizes the rounds)."""
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(budget_s / rounds / one))
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def ratio(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline``, or None when either is missing or the baseline is 0."""
    if value is None or baseline is None or not baseline or math.isnan(value + baseline):
        return None
    return value / baseline


# ------------------------------------------------------------ scratch space


def filesystem_of(path: Path) -> tuple[str, str, str]:
    """(device, filesystem type, mount point) holding ``path``, from /proc/mounts."""
    best = ("?", "?", "/")
    target = str(path.resolve())
    try:
        with open("/proc/mounts", encoding="utf-8") as fh:
            for line in fh:
                dev, mnt, fstype, *_ = line.split()
                inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best[2]):
                    best = (dev, fstype, mnt)
    except OSError:
        pass
    return best


@contextmanager
def scratch_dir(prefix: str, parent: Path | None = None) -> Iterator[Path]:
    """A fresh directory under ``parent`` (default ``bench/out``), removed afterwards.

    Refuses tmpfs/ramfs: a disk benchmark in RAM measures nothing.
    """
    parent = OUT_DIR if parent is None else parent
    parent.mkdir(parents=True, exist_ok=True)
    _, fstype, mnt = filesystem_of(parent)
    if fstype in ("tmpfs", "ramfs"):
        raise SystemExit(f"{parent} is on {fstype} ({mnt}); pick a directory on a real disk")
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------- output


def progress(message: str) -> None:
    """A progress note on stderr (stdout is kept for the table and the JSON line)."""
    print(message, file=sys.stderr, flush=True)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "SHORT"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of a result table: a figure, its baseline and (optionally) a target."""

    name: str
    value: float | None
    unit: str
    baseline_name: str = ""
    baseline: float | None = None
    target: str = ""
    ok: bool | None = None  # None: no target, no verdict
    #: Ratio to show instead of value / baseline (e.g. against twice the baseline).
    ratio_override: float | None = None


def fmt_num(x: float | None) -> str:
    """A number in a compact, readable form: 3,120,000 / 41.7 / 0.0123."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    ax = abs(x)
    if ax >= 100_000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:,.0f}" if ax >= 1000 else f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 0.1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def render_table(title: str, rows: Sequence[Row | str]) -> str:
    """Rows as aligned text; a plain string is a section heading."""
    header = ("figure", "value", "unit", "baseline (same run)", "base", "ratio", "target", "")
    lines: list[tuple[str, ...] | str] = [header]
    for row in rows:
        if isinstance(row, str):
            lines.append(row)
            continue
        r = row.ratio_override if row.ratio_override is not None else ratio(row.value, row.baseline)
        lines.append(
            (
                row.name,
                fmt_num(row.value),
                row.unit,
                row.baseline_name,
                fmt_num(row.baseline) if row.baseline_name else "",
                f"{r:.2f}x" if r is not None else "",
                row.target,
                "" if row.ok is None else verdict(row.ok),
            )
        )
    cells = [ln for ln in lines if isinstance(ln, tuple)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    right = {1, 4, 5}
    out = [title, "=" * len(title)]
    for ln in lines:
        if isinstance(ln, str):
            out.append(f"-- {ln}")
            continue
        out.append(
            "  ".join(
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(ln, widths, strict=True))
            ).rstrip()
        )
    return "\n".join(out)


def _clean(obj: object) -> object:
    if isinstance(obj, float):
        if math.isnan(obj) or math.isinf(obj):
            return None
        return float(f"{obj:.4g}") if abs(obj) < 1000 else round(obj, 1)
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def emit_json(figures: dict[str, object]) -> None:
    """Print ``figures`` as one JSON line (floats rounded, NaN as null); call it last."""
    sys.stderr.flush()
    print(json.dumps(_clean(figures), sort_keys=True, allow_nan=False), flush=True)


def machine_info(path: Path) -> dict[str, object]:
    dev, fstype, mnt = filesystem_of(path)
    return {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "fs": fstype,
        "device": dev,
        "mount": mnt,
    }


# ------------------------------------------------- the same bench, older code


def code_root() -> Path:
    """The source tree a bench imports ``edge_gateway`` from: this checkout, or the
    older tree an A/B run (``--baseline-commit``) points it at."""
    return Path(os.environ.get("BENCH_EDGEGW_CODE") or BENCH_DIR.parent)


def add_baseline_args(parser: Any) -> None:
    """The A/B flags every bench that offers ``--baseline-commit`` shares."""
    parser.add_argument(
        "--baseline-commit",
        default=None,
        metavar="COMMIT",
        help="run this same bench against this tree and against the code at COMMIT, "
        "interleaved (A B, B A, ...), and print each figure's ratio this/COMMIT",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="A/B rounds with --baseline-commit (each runs the bench once per tree)",
    )


def _old_tree(commit: str, into: Path) -> Path:
    """``edge_gateway/`` and ``cli/`` as they were at ``commit``, extracted under ``into``."""
    root = BENCH_DIR.parent
    tar = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", commit, "edge_gateway", "cli"],
        capture_output=True,
        check=False,
        timeout=120,
    )
    if tar.returncode != 0:
        why = tar.stderr.decode().strip()
        raise SystemExit(f"cannot take the code of {commit} from git: {why}")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar.stdout, check=True, timeout=120)
    return into


def _run_on(script: Path, argv: Sequence[str], tree: Path) -> dict[str, Any]:
    """One run of ``script`` importing the gateway's code (and the gateways it starts
    running it) from ``tree``; the figures of its last output line."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'cli'}",
        # Not EDGEGW_*: the gateway refuses environment variables of that
        # prefix that name no config key.
        "BENCH_EDGEGW_CODE": str(tree),
    }
    done = subprocess.run(
        [sys.executable, str(script), *argv],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{script.name} on {tree} failed (exit {done.returncode})")
    figures = json.loads(lines[-1])
    if not isinstance(figures, dict):
        raise SystemExit(f"{script.name} on {tree}: the last line is not a JSON object")
    return figures


def _numbers(figures: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in figures.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def run_baseline_ab(script: Path, argv: Sequence[str], commit: str, rounds: int) -> None:
    """Run ``script`` with ``argv`` on this tree (A) and on the code at ``commit`` (B),
    alternating the order each round so both see the same machine weather; print each
    numeric figure's medians and the ratio A/B, then one JSON object (the last line).

    The bench script is this tree's in both runs: only the code it measures differs.
    """
    if rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    resolved = subprocess.run(
        ["git", "-C", str(BENCH_DIR.parent), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if resolved.returncode != 0:
        raise SystemExit(f"--baseline-commit {commit}: not a commit here")
    full = resolved.stdout.strip()
    runs: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
    with scratch_dir("ab-") as scratch:
        trees = {"this": BENCH_DIR.parent, "baseline": _old_tree(full, scratch / "old")}
        for r in range(rounds):
            order = ("this", "baseline") if r % 2 == 0 else ("baseline", "this")
            for which in order:
                progress(f"A/B round {r + 1}/{rounds}: {script.name} on {which} ({trees[which]})")
                runs[which].append(_numbers(_run_on(script, argv, trees[which])))
    medians = {
        which: {
            k: median([f[k] for f in figs])
            for k in sorted(set().union(*figs))
            if all(k in f for f in figs)
        }
        for which, figs in runs.items()
    }
    keys = [k for k in medians["this"] if k in medians["baseline"]]
    # Each round's two runs ran back to back: their ratio sees the same machine
    # weather, so the median of the rounds' ratios is the figure to read (the
    # range shows the noise); the ratio of the medians is printed beside it.
    pairs: dict[str, list[float]] = {}
    for k in keys:
        rs = [
            ratio(a.get(k), b.get(k)) for a, b in zip(runs["this"], runs["baseline"], strict=True)
        ]
        pairs[k] = [r for r in rs if r is not None]
    ratios = {k: median(v) if v else None for k, v in pairs.items()}
    title = (
        f"{script.name} {' '.join(argv)}: this tree vs {full[:10]} "
        f"({rounds} interleaved rounds; ratio: the median of the rounds' this/baseline, "
        "[lowest, highest])"
    )
    rows: list[Row | str] = [
        Row(
            k,
            medians["this"][k],
            f"[{min(pairs[k]):.2f}, {max(pairs[k]):.2f}]" if pairs[k] else "",
            full[:10],
            medians["baseline"][k],
            ratio_override=ratios[k],
        )
        for k in keys
    ]
    print(render_table(title, rows))
    emit_json(
        {
            "baseline_commit": full,
            "rounds": rounds,
            "argv": list(argv),
            "this": medians["this"],
            "baseline": medians["baseline"],
            "ratio": ratios,
            "ratio_range": {k: [min(v), max(v)] for k, v in pairs.items() if v},
            "runs": runs,
        }
    )


def without_baseline_args(argv: Sequence[str]) -> list[str]:
    """``argv`` less ``--baseline-commit`` and ``--rounds`` (the arguments each run gets)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--baseline-commit", "--rounds"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out
