"""``bench/fleet.py --quick`` runs end to end and ends with its JSON figures.

A few hundred simulated gateways against a real server, a stop and a
restart. Timings are the bench's business, not this test's (the machine is
shared): it checks the last line's shape and that the figures are sane —
every operation was served, every gateway held a long poll, every report
woke its followers, and every gateway came back after the restart.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = (
    "gateways",
    "heartbeat_per_s",
    "head_report_per_s",
    "long_polls_held",
    "wake_p99_ms",
    "server_rss_mb",
    "server_cpu_pct",
    "reconnect_all_s",
    "requests_per_gateway_s",
)


@pytest.mark.slow
def test_fleet_bench_quick() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cli")])}
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fleet.py"), "--quick", "--gateways", "120"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(res.stdout.strip().splitlines()[-1])
    for key in KEYS:
        assert key in figures, key
    n = figures["gateways"]
    assert n == 120
    assert figures["heartbeat_per_s"] > 0
    assert figures["head_report_per_s"] > 0
    # Heartbeats stand in for the routing poll (each gateway fetched its table
    # before the window, and its heartbeats confirm it since).
    assert figures["routing_per_s"] < figures["heartbeat_per_s"] / 10
    assert figures["requests_per_gateway_s"] > 0
    # Every gateway holds one poll (a few may be between answer and next poll).
    assert 0.8 * n <= figures["long_polls_held"] <= n
    assert figures["wake_reports"] > 0
    assert figures["wake_missed"] == 0
    assert 0 < figures["wake_p50_ms"] <= figures["wake_p99_ms"]
    assert 10 < figures["server_rss_mb"] < 4096
    assert 0 < figures["server_cpu_pct"] < 400
    assert figures["reconnect_complete"] == n
    assert figures["reconnect_all_s"] is not None
    assert figures["reconnect_all_s"] > 0
    assert figures["herd_healthz_failures"] == 0
    assert set(figures["errors"]) == {"head_report", "heads_poll", "heartbeat", "routing"}
    assert sum(figures["errors"].values()) <= 5  # a timeout or two on a very busy machine
    base = figures["baseline"]
    assert base["rps"] > 0
    assert math.isfinite(base["p99_ms"])
    # The table names each figure beside its same-run baseline.
    assert "baseline (same run)" in res.stdout
