"""Two and three gateway processes on one bucket mirror each other exactly.

Every region homes a topic that every other region mirrors. Each home
produces a varied workload (keys, binary values, text and binary headers,
explicit timestamps, JSON and binary batches) for a couple of seconds; then
every mirror must equal its source record for record: offsets, keys, values,
headers and timestamps, with no duplicate and no gap. Runs on a
local-directory bucket, on moto's S3 server (each gateway through its own
TCP proxy) and on an Azure Blob container on Azurite.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _serve import Fleet, Producer, TopicSpec, check_acknowledged

from edge_gateway.testing.emulators import azurite_connection_string

REGIONS = ("a", "b", "c")


@pytest.mark.parametrize(
    ("bucket_kind", "regions"),
    # two regions on S3 are also in test_bucket_outage (both ways, with outages)
    [("local", 2), ("local", 3), ("s3", 3), ("azure", 2)],
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
    bucket = None
    if bucket_kind == "azure":
        azurite: str = request.getfixturevalue("azurite_endpoint")
        bucket = {
            "type": "azure",
            "container": request.getfixturevalue("azure_container_name"),
            "prefix": "fleet",
            "connection_string": azurite_connection_string(azurite),
            "connect_timeout": 1.0,
            "read_timeout": 2.0,
            "max_attempts": 1,
        }
    fleet = Fleet(tmp_path, names, topics, s3=s3, bucket=bucket)
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
        if bucket is not None:
            # The regions' logs are in the container, under the prefix.
            from azure.storage.blob import ContainerClient

            container = ContainerClient.from_connection_string(
                str(bucket["connection_string"]), str(bucket["container"])
            )
            with container:
                blobs = [b.name for b in container.list_blobs(name_starts_with="fleet/regions/")]
            for region in ("a", "b"):
                assert any(n.startswith(f"fleet/regions/{region}/log/") for n in blobs), blobs
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
