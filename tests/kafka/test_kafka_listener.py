"""The Kafka listener of a real ``edgegw serve``, with real Kafka clients."""

from __future__ import annotations

from pathlib import Path

from _kafka_support import kafka_gateway
from _serve import wait_until

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
        assert gw.alive


def test_edgegw_status_shows_the_listener(tmp_path: Path) -> None:
    import subprocess
    import sys

    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        out = subprocess.run(
            [sys.executable, "-m", "edgegw_cli", "status", "--url", gw.url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert out.returncode == 0, out.stderr
    assert f"kafka: {gw.bootstrap}, " in out.stdout


def test_stops_cleanly_with_a_long_poll_open(tmp_path: Path) -> None:
    """SIGTERM while a consumer waits in Fetch: the wait ends, the gateway exits 0."""
    import threading

    from confluent_kafka import Consumer, TopicPartition

    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        consumer = Consumer(
            {
                "bootstrap.servers": gw.bootstrap,
                "group.id": "g",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 30_000,
            }
        )
        consumer.assign([TopicPartition("events", p, 0) for p in range(3)])
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                consumer.poll(0.2)

        thread = threading.Thread(target=poll)
        thread.start()
        try:
            wait_until(
                lambda: gw.get("/v1/status")["kafka"]["requests"].get("fetch", 0),
                30,
                "the consumer's first Fetch",
            )
            assert gw.stop() == 0, gw.tail()
        finally:
            stop.set()
            thread.join(timeout=30)
            consumer.close()
    assert "Traceback" not in gw.log.read_text()
