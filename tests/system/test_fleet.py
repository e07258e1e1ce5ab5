"""Two and three gateway processes on one bucket mirror each other exactly.

Every region homes a topic that every other region mirrors. Each home
produces a varied workload (keys, binary values, text and binary headers,
explicit timestamps, JSON and binary batches) for a couple of seconds; then
every mirror must equal its source record for record: offsets, keys, values,
headers and timestamps, with no duplicate and no gap. Runs on a
local-directory bucket and on moto's S3 server (each gateway through its own
TCP proxy).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _serve import Fleet, Producer, TopicSpec, check_acknowledged

REGIONS = ("a", "b", "c")


@pytest.mark.parametrize(
    ("bucket_kind", "regions"),
    # two regions on S3 are also in test_outage_s3 (both ways, with outages)
    [("local", 2), ("local", 3), ("s3", 3)],
)
def test_every_mirror_equals_its_source(
    tmp_path: Path, bucket_kind: str, regions: int, request: pytest.FixtureRequest
) -> None:
    names = REGIONS[:regions]
    topics = [TopicSpec(f"t-{r}", r, partitions=2 + i) for i, r in enumerate(names)]
    s3 = None
    if bucket_kind == "s3":
        endpoint: str = request.getfixturevalue("moto_endpoint")
        s3 = (int(endpoint.rsplit(":", 1)[1]), request.getfixturevalue("s3_bucket_name"))
    fleet = Fleet(tmp_path, names, topics, s3=s3)
    try:
        fleet.start()
        producers = [
            Producer(fleet[t.home].url, t.name, t.partitions, seed=i, pause=0.02)
            for i, t in enumerate(topics)
        ]
        for p in producers:
            p.start()
        time.sleep(2.5)
        for p in producers:
            p.stop()
        for p, t in zip(producers, topics, strict=True):
            check_acknowledged(p, fleet[t.home])
        fleet.wait_converged(timeout=60)
        assert fleet.mismatches() == []
        for g in fleet.gateways.values():
            status = g.status()
            assert status["errors"] == {}
            assert sorted(status["mirrors"]) == sorted(r for r in names if r != g.region)
            for source, m in status["mirrors"].items():
                assert (m["gaps"], m["quarantined"]) == ([], []), (g.region, source, m)
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
