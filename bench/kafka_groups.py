"""Kafka consumer groups (docs/kafka.md, "Consumer groups") against the HTTP API's commits.

One gateway (``edgegw serve``, a local directory bucket, the Kafka listener
on), one topic of 4 partitions:

(a) baseline: the HTTP API's ``POST /v1/groups/{group}/offsets``, one
    partition's offset per request, one after the other: commits per second
    and p50/p99 latency;
(b) a confluent-kafka (librdkafka) consumer, member of a group, committing
    the same way (``commit(offsets=[...], asynchronous=False)``): the Kafka
    OffsetCommit path, fenced by generation and member, into the same store.
    ``commit_ratio`` = (b) / (a): what the Kafka door costs over HTTP (both
    wait for SQLite's synced commit);
(c) a rebalance: a second member subscribes to a stable group of one; the
    time until both have their partitions (JoinGroup of both, SyncGroup),
    median and max over the trials. No baseline: the figure depends on the
    client's heartbeat interval (set to 100 ms here), which bounds how soon
    the first member learns of the rebalance.

Usage: python bench/kafka_groups.py [--quick]. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    Row,
    emit_json,
    machine_info,
    percentile,
    progress,
    ratio,
    render_table,
    scratch_dir,
)
from edgegw_cli._fleet import FleetTopic, Site

PARTITIONS = 4
TOPIC = "events"


def http_commits(url: str, n: int) -> list[float]:
    """(a): seconds per HTTP commit."""
    out = []
    with httpx.Client(base_url=url, timeout=60) as c:
        for i in range(n):
            body = {"offsets": [{"topic": TOPIC, "partition": i % PARTITIONS, "offset": i}]}
            t0 = time.perf_counter()
            r = c.post("/v1/groups/http-bench/offsets", json=body)
            out.append(time.perf_counter() - t0)
            r.raise_for_status()
    return out


def _consumer(bootstrap: str, group: str, name: str) -> Any:
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": name,
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 100,
        }
    )
    c.subscribe([TOPIC])
    return c


def _wait_assigned(consumers: list[Any], deadline: float) -> None:
    while not all(c.assignment() for c in consumers):
        for c in consumers:
            c.poll(0.01)
        if time.monotonic() > deadline:
            raise RuntimeError("the group did not settle within the deadline")


def kafka_commits(bootstrap: str, n: int) -> list[float]:
    """(b): seconds per Kafka OffsetCommit of a group member."""
    from confluent_kafka import TopicPartition

    c = _consumer(bootstrap, "kafka-bench", "committer")
    try:
        _wait_assigned([c], time.monotonic() + 60)
        out = []
        for i in range(n):
            tp = TopicPartition(TOPIC, i % PARTITIONS, i)
            t0 = time.perf_counter()
            c.commit(offsets=[tp], asynchronous=False)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        c.close()


def rebalances(bootstrap: str, trials: int) -> list[float]:
    """(c): seconds from a second member's subscribe to both members assigned."""
    out = []
    for t in range(trials):
        group = f"rebalance-{t}"
        first = _consumer(bootstrap, group, "first")
        try:
            _wait_assigned([first], time.monotonic() + 60)
            t0 = time.perf_counter()
            second = _consumer(bootstrap, group, "second")
            try:
                deadline = time.monotonic() + 60
                while True:
                    _wait_assigned([first, second], deadline)
                    a = {p.partition for p in first.assignment()}
                    b = {p.partition for p in second.assignment()}
                    if a and b and not a & b:
                        break
                out.append(time.perf_counter() - t0)
            finally:
                second.close()
        finally:
            first.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="fewer commits and trials")
    args = ap.parse_args()
    n = 200 if args.quick else 2000
    trials = 3 if args.quick else 10

    with scratch_dir("kafka-groups") as root:
        site = Site("a", root / "a")
        site.extra_toml = '[log]\nlevel = "warning"\n[kafka]\nlisten = "127.0.0.1:0"\n'
        site.write_config(
            root / "bucket", [FleetTopic(TOPIC, "a", PARTITIONS, ())], flush_ms=250, poll_ms=100
        )
        figures: dict[str, Any] = {"commits": n, "rebalance_trials": trials, **machine_info(root)}
        try:
            site.start()
            site.wait_ready()
            addr = site.data_dir / "kafka.addr"
            deadline = time.monotonic() + 30
            while not addr.exists():  # written once the gateway is ready
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no {addr}; see {site.log_path}")
                time.sleep(0.05)
            bootstrap = addr.read_text().strip()
            progress(f"(a) HTTP commits: {n} ...")
            http = http_commits(site.url, n)
            progress(f"(b) Kafka OffsetCommit of a group member: {n} ...")
            kafka = kafka_commits(bootstrap, n)
            progress(f"(c) rebalances to two members: {trials} ...")
            rebal = rebalances(bootstrap, trials)
        finally:
            code = site.stop()
        if code != 0:
            raise RuntimeError(f"the gateway exited with {code}; see {site.log_path}")

    http_rate = n / sum(http)
    kafka_rate = n / sum(kafka)
    commit_ratio = ratio(kafka_rate, http_rate)
    us = 1e6
    rows: list[Row | str] = [
        "offset commits, one at a time (synced)",
        Row("Kafka OffsetCommit (b)", kafka_rate, "commits/s", "HTTP commit (a)", http_rate),
        Row(
            "p50 (b)",
            percentile(kafka, 50) * us,
            "us",
            "HTTP p50 (a)",
            percentile(http, 50) * us,
        ),
        Row(
            "p99 (b)",
            percentile(kafka, 99) * us,
            "us",
            "HTTP p99 (a)",
            percentile(http, 99) * us,
        ),
        "rebalance: a second member joins a group of one",
        Row("median", statistics.median(rebal) * 1000, "ms"),
        Row("max", max(rebal) * 1000, "ms"),
    ]
    print(render_table(f"Kafka consumer groups ({n:,} commits, {trials} rebalances)", rows))
    figures.update(
        kafka_commit_per_s=kafka_rate,
        http_commit_per_s=http_rate,
        commit_ratio=commit_ratio,
        kafka_commit_p50_us=percentile(kafka, 50) * us,
        kafka_commit_p99_us=percentile(kafka, 99) * us,
        http_commit_p50_us=percentile(http, 50) * us,
        http_commit_p99_us=percentile(http, 99) * us,
        rebalance_median_ms=statistics.median(rebal) * 1000,
        rebalance_max_ms=max(rebal) * 1000,
    )
    emit_json(figures)


if __name__ == "__main__":
    main()
