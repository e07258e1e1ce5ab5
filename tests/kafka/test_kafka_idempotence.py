"""Idempotent produce over Kafka (librdkafka ``enable.idempotence``) through kill -9 of the gateway.

Every acknowledged record is in the partition exactly once: retries of
batches the gateway wrote before it died are answered with their original
offsets (the producers' state lives in the journal), not appended again.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from _kafka_support import kafka_gateway

from edge_gateway.testing.ports import free_port

TOPICS = """
[[topics]]
name = "events"
home = "north"
partitions = 2
"""


def _read_all(gw: Any, partitions: int) -> list[bytes]:
    values: list[bytes] = []
    with gw.http() as c:
        for p in range(partitions):
            offset = 0
            while True:
                doc = c.get(
                    f"/v1/topics/events/partitions/{p}/records",
                    params={"offset": offset, "max_records": 5000},
                ).json()
                if not doc["records"]:
                    break
                values += [r["value"].encode() for r in doc["records"]]
                offset = doc["next_offset"]
    return values


def test_idempotent_producer_through_kill_9(tmp_path: Path) -> None:
    from confluent_kafka import Producer

    listen = f"127.0.0.1:{free_port()}"
    with kafka_gateway(tmp_path, topics=TOPICS, listen=listen) as gw:
        producer = Producer(
            {
                "bootstrap.servers": gw.bootstrap,
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 120_000,
                "reconnect.backoff.max.ms": 200,
            }
        )
        acked: list[bytes] = []
        failed: list[Any] = []
        stop = threading.Event()

        def on_delivery(err: Any, msg: Any) -> None:
            (failed if err else acked).append(err if err else msg.value())

        def produce() -> None:
            i = 0
            while not stop.is_set():
                try:
                    producer.produce(
                        "events", value=b"r%d" % i, partition=i % 2, on_delivery=on_delivery
                    )
                    i += 1
                except BufferError:
                    producer.poll(0.05)
                producer.poll(0)
                if i % 50 == 0:
                    time.sleep(0.005)

        thread = threading.Thread(target=produce)
        thread.start()
        try:
            for _ in range(3):
                deadline = time.monotonic() + 30
                before = len(acked)
                while len(acked) < before + 300:
                    assert time.monotonic() < deadline, gw.tail()
                    time.sleep(0.02)
                gw.kill()
                time.sleep(0.2)
                gw.start()
        finally:
            stop.set()
            thread.join(timeout=30)
        assert producer.flush(90) == 0
        assert failed == []
        values = _read_all(gw, 2)
    assert len(values) == len(set(values)), "duplicates in the partitions"
    assert set(acked) <= set(values), "acknowledged records lost"
    assert len(acked) >= 900


def test_lost_responses_are_answered_with_the_original_offsets(tmp_path: Path) -> None:
    """The gateway journals a Produce and drops the connection before answering, 5 times.

    librdkafka retries each on a new connection; the retries must not append
    again. (The same producer without idempotence duplicates them: the
    check below that the fail point fired keeps this test honest.)
    """
    from confluent_kafka import Producer

    env = {"EDGEGW_FAILPOINTS": "kafka.produce_before_response=5"}
    with kafka_gateway(tmp_path, topics=TOPICS, env=env) as gw:
        producer = Producer(
            {"bootstrap.servers": gw.bootstrap, "enable.idempotence": True, "linger.ms": 2}
        )
        acked: list[bytes] = []
        for i in range(2000):
            producer.produce(
                "events",
                value=b"r%d" % i,
                partition=i % 2,
                on_delivery=lambda err, msg: acked.append(msg.value()) if err is None else None,
            )
            if i % 100 == 0:
                producer.poll(0.01)
        assert producer.flush(60) == 0
        values = _read_all(gw, 2)
        fired = gw.log.read_text().count("FailPointError: fail point kafka.produce_before_response")
    assert fired == 5
    assert len(acked) == 2000
    assert sorted(values) == sorted(acked)
