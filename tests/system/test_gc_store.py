"""A gateway whose store refuses compare-and-swap (issue 27): real `edgegw serve`.

The store (moto behind ``refuse-if-match``, tests/_quirky_s3.py) answers 412
to every ``If-Match``. Bucket GC creates its boundary once (a create-only
put, which works), then cannot advance it. The gateway must say so once, as
what it is -- a store incompatibility, in the log at ERROR, in
``edgegw_gc_store_unsupported`` and in ``edgegw status`` -- and not as
contention ("the GC boundary kept changing") every interval.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from _quirky_s3 import new_bucket_on
from _serve import EDGEGW, Fleet, Gateway, TopicSpec, wait_until

pytestmark = pytest.mark.slow

TOPIC = TopicSpec("telemetry", "north", partitions=1, subscribers=())


def produce_each(gw: Gateway, count: int, start: int) -> None:
    """``count`` records, each acknowledged once shipped (a log object each)."""
    with gw.client() as c:
        for i in range(start, start + count):
            c.produce(TOPIC.name, [json.dumps({"n": i})], partition=0, ack="shipped")


def metric(gw: Gateway, name: str) -> float | None:
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return None if m is None else float(m.group(1))


def test_a_store_refusing_cas_is_reported_once_as_such(
    tmp_path: Path, quirky_s3: Callable[..., str]
) -> None:
    endpoint = quirky_s3("refuse-if-match")
    fleet = Fleet(
        tmp_path,
        ["north"],
        [TOPIC],
        s3=(int(endpoint.rsplit(":", 1)[1]), new_bucket_on(endpoint)),
        sections={
            "gc": {"enabled": True, "interval_ms": 200, "retention_ms": 0},
            "shipper": {"manifest_every": 2, "manifest_interval_ms": 200},
        },
    )
    try:
        fleet.start()
        north = fleet["north"]
        # The first deletion creates the boundary (create-only: works); the
        # next ones need a compare-and-swap of it.
        produce_each(north, 6, 0)
        wait_until(lambda: north.status()["gc"]["deleted_entries"] > 0, 60, "a first GC deletion")
        produce_each(north, 6, 6)
        wait_until(
            lambda: north.status()["gc"]["store_unsupported"] is not None,
            60,
            "GC to report the store",
        )
        # Several more GC intervals fail the same way: still reported, logged once.
        failed = north.status()["gc"]["failed_runs"]
        wait_until(lambda: north.status()["gc"]["failed_runs"] >= failed + 3, 60, "3 more GC runs")
        doc = north.status()["gc"]
        assert "refuses If-Match" in doc["store_unsupported"]
        assert metric(north, "edgegw_gc_store_unsupported") == 1
        shown = subprocess.run(
            [str(EDGEGW), "status", "--config", str(north.config)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "250"},
            check=True,
        ).stdout
        assert "store unsupported" in shown
        assert "refuses If-Match" in shown
    finally:
        fleet.close()
    log = north.log.read_text()
    assert log.count("refuses If-Match") == 1, log
    assert "kept changing" not in log
