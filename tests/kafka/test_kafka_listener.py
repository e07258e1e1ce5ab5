"""The Kafka listener of a real ``edgegw serve``, with real Kafka clients."""

from __future__ import annotations

from pathlib import Path

from _kafka_support import kafka_gateway

TOPICS = """
[[topics]]
name = "events"
home = "north"
partitions = 3
"""


def test_kafka_python_sees_the_broker_and_its_topics(tmp_path: Path) -> None:
    from kafka import KafkaAdminClient

    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        admin = KafkaAdminClient(bootstrap_servers=gw.bootstrap, request_timeout_ms=10_000)
        try:
            assert admin.list_topics() == ["events"]
            (desc,) = admin.describe_topics(["events"])
            assert desc["error_code"] == 0
            assert sorted(p["partition_index"] for p in desc["partitions"]) == [0, 1, 2]
            assert {p["leader_id"] for p in desc["partitions"]} == {0}
            cluster = admin.describe_cluster()
            host, _, port = gw.bootstrap.rpartition(":")
            assert [(b["host"], b["port"]) for b in cluster["brokers"]] == [(host, int(port))]
        finally:
            admin.close()
        status = gw.get("/v1/status")
        assert status["kafka"]["listen"] == gw.bootstrap
        assert status["kafka"]["requests"]["metadata"] >= 1
        assert gw.proc.poll() is None
