"""`[link] daily_bytes` on a real `edgegw serve` process whose wall clock the test sets.

North has a daily allowance of 1 MiB and takes 1.2 MB of incompressible
records. It ships until the day's usage reaches the allowance (the object
in flight completes), then holds everything else: nothing more reaches the
bucket, and status, metrics and the log say so (the log once). The test
then sets the gateway's wall clock a day ahead (libfaketime's offset file;
the monotonic clock stays real, as when NTP sets the time): past local
midnight the allowance renews and north ships the rest, nothing lost.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from _faketime import settable
from _serve import EDGEGW, Fleet, TopicSpec, read_partition, wait_mirrored, wait_until

from edge_gateway.api.wire import BATCH_MEDIA_TYPE
from edge_gateway.format.batch import encode_batch

pytestmark = pytest.mark.slow

TOPIC = TopicSpec("t", "north", partitions=1)
ALLOWANCE = 1 << 20
VALUE = 4096
BATCHES = 20
PER_BATCH = 15  # 20 x 15 x 4 KiB = 1.2 MB of random bytes: more than the allowance
#: The mirroring test's batches: 30 x 15 x 4 KiB = 1.8 MB, more than the allowance
#: plus what may be under way when it runs out (mirror.prefetch, 8, objects of up
#: to 64 KiB and their framing: 1.6 MB in all), so that some records must wait.
MIRROR_BATCHES = 30


def metric(url: str, name: str, labels: str = "") -> float | None:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return None if m is None else float(m.group(1))


def test_a_used_daily_allowance_holds_shipping_until_local_midnight(tmp_path: Path) -> None:
    offset = tmp_path / "faketime-offset"
    offset.write_text("+0\n")
    fleet = Fleet(
        tmp_path,
        ["north"],
        [TOPIC],
        per_region={
            "north": {
                "link": {"daily_bytes": ALLOWANCE},
                # Small objects: the allowance is overrun by at most one of them.
                "shipper": {"max_object_bytes": 64 * 1024, "backlog_object_bytes": 64 * 1024},
            }
        },
    )
    north = fleet["north"]
    north.env = {**settable(offset), "TZ": "UTC"}
    try:
        fleet.start()
        values = [os.urandom(VALUE) for _ in range(BATCHES * PER_BATCH)]
        with httpx.Client(base_url=north.url, timeout=30) as c:
            for i in range(BATCHES):
                chunk = values[i * PER_BATCH : (i + 1) * PER_BATCH]
                r = c.post(
                    f"/v1/topics/{TOPIC.name}/partitions/0/batches",
                    content=encode_batch(chunk, timestamps=[1_795_000_000_000] * len(chunk)),
                    headers={"content-type": BATCH_MEDIA_TYPE},
                )
                assert r.status_code == 200, r.text

        def policy() -> dict[str, Any]:
            doc: dict[str, Any] = north.status()["link"]["policy"]
            return doc

        wait_until(lambda: policy()["holding"]["normal"], 60, "the shipper held by the allowance")
        st = north.status()
        p, shipper = st["link"]["policy"], st["shipper"]
        assert p["allowed"] == {"critical": True, "normal": False, "bulk": False}
        assert p["day_remaining_bytes"] == 0
        assert 0 < p["opens_in_s"]["normal"] <= 86_400
        # It stopped at the allowance, overrunning it by at most one object (and its framing).
        assert ALLOWANCE <= st["link"]["day_bytes"] <= ALLOWANCE + 64 * 1024 + 8192
        assert shipper["pending_lsns"] > 0
        held_at = shipper["objects"]

        assert metric(north.url, "edgegw_link_allowance_remaining_bytes", '{period="day"}') == 0
        assert metric(north.url, "edgegw_link_holding", '{priority="normal"}') == 1
        assert metric(north.url, "edgegw_link_allowed", '{priority="critical"}') == 1
        assert (metric(north.url, "edgegw_link_held_total", '{priority="normal"}') or 0) >= 1

        out = subprocess.run(
            [str(EDGEGW), "status", "--config", str(north.config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "COLUMNS": "300"},
        )
        assert out.returncode == 0, out.stderr
        assert "USED UP" in out.stdout, out.stdout
        assert "HOLDING normal data" in out.stdout, out.stdout

        # `edgegw sync` says at once why it cannot ship, instead of waiting for midnight.
        r = httpx.post(f"{north.url}/v1/sync", timeout=30)
        assert r.status_code == 503, r.text
        assert "link policy holds normal data" in r.text

        # More data while held: acknowledged (journaled), not shipped.
        with north.client() as c:
            c.produce(TOPIC.name, ["while held"], partition=0)
        wait_until(lambda: north.status()["journal"]["durable_lsn"] > 0, 10, "durable")
        assert north.status()["shipper"]["objects"] == held_at

        # The clock passes midnight: the allowance renews and the backlog ships.
        offset.write_text("+1d\n")
        wait_until(
            lambda: north.status()["shipper"]["pending_lsns"] == 0, 60, "the backlog shipped"
        )
        p = policy()
        assert p["allowed"]["normal"] is True
        assert not p["holding"]["normal"]
        assert p["day_remaining_bytes"] is not None
        assert metric(north.url, "edgegw_link_holding", '{priority="normal"}') == 0
        got = [r.value for r in read_partition(north.url, TOPIC.name, 0)]
        assert got == [*values, b"while held"]

        log = north.log.read_text(errors="replace")
        assert log.count("allowance (1048576 B, link.daily_bytes) is used up") == 1, log
        assert "the daily allowance renewed" in log
    finally:
        codes = fleet.close()
    assert codes == {"north": 0}


def test_a_used_daily_allowance_holds_mirroring_too(tmp_path: Path) -> None:
    """Downloads count against the allowance: south's mirror waits for south's midnight."""
    offset = tmp_path / "faketime-offset"
    offset.write_text("+0\n")
    topic = TopicSpec("t", "north", partitions=1, subscribers=("south",))
    fleet = Fleet(
        tmp_path,
        ["north", "south"],
        [topic],
        per_region={
            "north": {
                "shipper": {"max_object_bytes": 64 * 1024, "backlog_object_bytes": 64 * 1024}
            },
            "south": {"link": {"daily_bytes": ALLOWANCE}},
        },
    )
    south = fleet["south"]
    south.env = {**settable(offset), "TZ": "UTC"}
    try:
        fleet.start()
        north = fleet["north"]
        values = [os.urandom(VALUE) for _ in range(MIRROR_BATCHES * PER_BATCH)]
        with httpx.Client(base_url=north.url, timeout=30) as c:
            for i in range(MIRROR_BATCHES):
                chunk = values[i * PER_BATCH : (i + 1) * PER_BATCH]
                r = c.post(
                    f"/v1/topics/{topic.name}/partitions/0/batches",
                    content=encode_batch(chunk, timestamps=[1_795_000_000_000] * len(chunk)),
                    headers={"content-type": BATCH_MEDIA_TYPE},
                )
                assert r.status_code == 200, r.text
        # North (no allowance) ships everything.
        wait_until(lambda: north.status()["shipper"]["pending_lsns"] == 0, 60, "north shipped")

        def policy() -> dict[str, Any]:
            doc: dict[str, Any] = south.status()["link"]["policy"]
            return doc

        wait_until(lambda: policy()["holding"]["normal"], 60, "south's mirror held")
        link = south.status()["link"]
        assert link["policy"]["day_remaining_bytes"] == 0
        # South stopped at its allowance, over it by at most the downloads already
        # under way (mirror.prefetch, 8, objects of up to 64 KiB and their framing).
        assert link["down_bytes"] <= ALLOWANCE + 8 * (64 * 1024 + 8192)
        mirrored = south.next_offsets("north.t")[0]
        assert mirrored < len(values)

        offset.write_text("+1d\n")
        wait_mirrored(north, topic.name, south, timeout=60)
        got = [r.value for r in read_partition(south.url, "north.t", 0)]
        assert got == values
        assert not policy()["holding"]["normal"]
    finally:
        codes = fleet.close()
    assert codes == {"north": 0, "south": 0}
