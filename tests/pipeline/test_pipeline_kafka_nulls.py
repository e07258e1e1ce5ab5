"""Kafka records through the journal and the bucket into the analytics table (issue 23).

A real gateway process with its Kafka listener takes records from
confluent-kafka (librdkafka) with keys, a null value (a tombstone), headers
(one with a null value) and timestamps, ships them to its bucket, and the
pipeline (real PySpark, the shared local session) reads them into the table:
the null value is SQL NULL, not an empty binary. The mirror leg of the same
records (a Kafka consumer and the HTTP API at another region) is
``tests/kafka/test_kafka_clients.py::test_mirror_topic_reads_with_the_source_offsets``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "kafka"))

from _kafka_support import kafka_gateway
from _serve import wait_until
from test_pipeline_job import iceberg_rows, iceberg_table, job, spark_rows

from edge_gateway.pipeline.job import run_job

TOPICS = """
[[topics]]
name = "events"
home = "north"
partitions = 1
subscribers = ["*"]
"""
TS0 = 1_763_800_000_000

#: (key, value, headers) of each record; record i has timestamp TS0 + i.
RECORDS: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
    (b"sensor-1", b'{"t":1}', [("trace", b"a"), ("none", None)]),
    (b"sensor-1", None, [("reason", b"deleted")]),  # a tombstone
    (None, b"", []),  # an empty value: not a null
    (b"sensor-2", None, [("none", None)]),
]


def test_kafka_nulls_reach_the_table_as_sql_null(spark: Any, tmp_path: Path) -> None:
    from confluent_kafka import Producer

    with kafka_gateway(tmp_path, topics=TOPICS) as gw:
        p = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all"})
        errors: list[Any] = []
        for i, (key, value, headers) in enumerate(RECORDS):
            p.produce(
                "events",
                key=key,
                value=value,
                headers=headers,
                partition=0,
                timestamp=TS0 + i,
                on_delivery=lambda err, _msg: errors.append(err),
            )
        assert p.flush(30) == 0
        assert errors == [None] * len(RECORDS)
        wait_until(
            lambda: gw.get("/v1/topics/events")["partitions"][0]["shipped_offset"] >= len(RECORDS),
            30,
            "the records shipped to the bucket",
        )
    expected = {
        ("north", "events", 0, i): (TS0 + i, key, value, tuple(headers))
        for i, (key, value, headers) in enumerate(RECORDS)
    }
    wh = tmp_path / "wh"
    plan = run_job(spark, job(tmp_path / "bucket", wh))
    assert plan.topics["events"].committed
    assert iceberg_rows(wh, "events") == expected
    assert spark_rows(spark, wh, "events") == expected
    # and Spark SQL sees NULL, not an empty binary
    with iceberg_table(wh, "events") as table:
        files = [t.file.file_path for t in table.scan().plan_files()]
    df = spark.read.parquet(*files)
    nulls = df.where("value IS NULL").select("offset").collect()
    assert sorted(r["offset"] for r in nulls) == [1, 3]
