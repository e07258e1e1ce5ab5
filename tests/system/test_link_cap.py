"""`[link] max_bytes_per_s` on real `edgegw serve` processes and moto's S3 server.

North's link is capped; it takes a burst of incompressible records at once
(the journal acknowledges them at disk speed) and must not put them on the
link faster than the cap. No timing can flake here: the cap only ever makes
things slower, so the test asserts a lower bound on how long the drain took
(what a slow machine only lengthens), and exact byte counts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
from _serve import EDGEGW, Fleet, TopicSpec, read_partition, wait_mirrored

from edge_gateway.api.wire import BATCH_MEDIA_TYPE
from edge_gateway.format.batch import encode_batch

CAP = 200_000  # bytes/s
OBJECT = 64 * 1024  # shipper.max_object_bytes: the smallest allowed
BATCHES = 20
VALUES_PER_BATCH = 15
VALUE = 4096  # bytes: 20 x 15 x 4 KiB = 1.2 MB of random bytes


def test_a_capped_link_drains_a_burst_no_faster_than_the_cap(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    port = int(moto_endpoint.rsplit(":", 1)[1])
    fleet = Fleet(
        tmp_path,
        ["north", "south"],
        [TopicSpec("t", "north", partitions=1, subscribers=("south",))],
        s3=(port, s3_bucket_name),
        per_region={
            "north": {
                "link": {"max_bytes_per_s": CAP},
                "shipper": {"max_object_bytes": OBJECT, "backlog_object_bytes": 2 * OBJECT},
            }
        },
    )
    try:
        fleet.start()
        north, south = fleet["north"], fleet["south"]
        assert north.status()["link"]["cap_bytes_per_s"] == CAP
        values = [os.urandom(VALUE) for _ in range(BATCHES * VALUES_PER_BATCH)]
        began = time.monotonic()
        with httpx.Client(base_url=north.url, timeout=30) as c:
            for i in range(BATCHES):
                chunk = values[i * VALUES_PER_BATCH : (i + 1) * VALUES_PER_BATCH]
                r = c.post(
                    "/v1/topics/t/partitions/0/batches",
                    content=encode_batch(chunk, timestamps=[1_795_000_000_000] * len(chunk)),
                    headers={"content-type": BATCH_MEDIA_TYPE},
                )
                assert r.status_code == 200, r.text
        wait_mirrored(north, "t", south, timeout=120)
        took = time.monotonic() - began

        link = north.status()["link"]
        shipped = north.status()["shipper"]["wire_bytes"]
        # Every object payload went through the meter (fences and manifests too).
        assert link["up_bytes"] >= shipped >= len(values) * VALUE
        assert link["day_bytes"] >= link["up_bytes"] + link["down_bytes"] - 1
        assert link["waited_s"] > 0
        # From the first upload's start to the last one's, the link carried all
        # but the last object at no more than CAP. A backlog object here holds
        # up to 2 * OBJECT of entries plus the entry that crosses that line
        # (a journal read stops after it); 4 KiB covers framing and what went
        # before `began`.
        last_object = 2 * OBJECT + VALUES_PER_BATCH * VALUE + 4096
        assert took >= (link["up_bytes"] - last_object) / CAP
        mirrored = [r.value for r in read_partition(south.url, "north.t", 0)]
        assert mirrored == values

        # The CLI shows it; the month's usage survives a restart.
        out = _status_text(north.config)
        assert "capped at 0.2 MB/s" in out, out
        before = link["month_bytes"]
        assert north.stop() == 0
        usage = json.loads((north.data_dir / "link-usage.json").read_text())
        assert usage["month_bytes"] >= before  # (a last manifest at shutdown adds a little)
        north.start()
        assert north.status()["link"]["month_bytes"] >= before
    finally:
        codes = fleet.close()
    assert codes == {"north": 0, "south": 0}


def _status_text(config: Path) -> str:
    import subprocess

    r = subprocess.run(
        [str(EDGEGW), "status", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("cap", ["4MB", "0"])
def test_the_link_section_in_a_config_file(tmp_path: Path, cap: str) -> None:
    from edge_gateway.config import load_config

    path = tmp_path / "edgegw.toml"
    path.write_text(f'region = "r"\n[link]\nmax_bytes_per_s = "{cap}"\n')
    assert load_config(path).link.max_bytes_per_s == (4_000_000 if cap == "4MB" else 0)
