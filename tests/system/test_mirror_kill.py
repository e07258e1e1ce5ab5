"""kill -9 of the mirroring gateway at random points while the source keeps producing.

After every restart the mirror must be a prefix of the source with no
duplicate and no gap; at the end, once the producer stops, it must equal
the source record for record. One test kills a gateway that follows a live
source (local-directory bucket); the other kills it while it catches up on a
backlog of small objects through moto's S3 server (manifest-planned,
prefetching, slowed by 20 ms of latency at the proxy), where kills often land
between two batches of one object.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from _serve import Fleet, Gateway, Producer, TopicSpec, check_acknowledged, read_partition

TOPIC = TopicSpec("t", "a", partitions=3, subscribers=("b",))


def kill_and_restart(
    a: Gateway, b: Gateway, rnd: random.Random, kills: int, lo: float, hi: float
) -> None:
    """kill -9 ``b`` after a random time, ``kills`` times; check its mirror after each restart.

    Each check reads the partitions from where the previous one ended (the
    final comparison in :func:`finish` reads everything again).
    """
    verified = [0] * TOPIC.partitions
    for i in range(kills):
        time.sleep(rnd.uniform(lo, hi))
        b.kill()
        b.start()
        for p in range(TOPIC.partitions):
            got = read_partition(b.url, f"a.{TOPIC.name}", p, verified[p])
            want = read_partition(a.url, TOPIC.name, p, verified[p], limit=len(got))
            assert got == want, (
                f"after kill {i + 1}: a.{TOPIC.name}/{p} is not a prefix of the source"
            )
            verified[p] += len(got)


def finish(fleet: Fleet, producer: Producer) -> None:
    producer.stop()
    check_acknowledged(producer, fleet["a"])
    fleet.wait_converged(timeout=90)
    assert fleet.mismatches() == []
    m = fleet["b"].mirror("a")
    assert (m["gaps"], m["quarantined"], m["stopped_by"]) == ([], [], None), m
    # the mirror kept the fetched blocks as block entries (mirror.keep_blocks)
    assert m["blocks"] > 0, m


@pytest.mark.slow
def test_kill_9_while_following_a_live_source(tmp_path: Path) -> None:
    rnd = random.Random(4242)
    fleet = Fleet(tmp_path, ["a", "b"], [TOPIC], sections={"shipper": {"flush_interval_ms": 50}})
    try:
        fleet.start()
        producer = Producer(
            fleet["a"].url, TOPIC.name, TOPIC.partitions, seed=7, pause=0.01, max_batch=10
        )
        producer.start()
        kill_and_restart(fleet["a"], fleet["b"], rnd, kills=6, lo=0.1, hi=0.9)
        finish(fleet, producer)
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


@pytest.mark.slow
def test_kill_9_while_catching_up_through_s3(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    rnd = random.Random(9001)
    fleet = Fleet(
        tmp_path,
        ["a", "b"],
        [TOPIC],
        s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name),
        per_region={
            # many small objects ...
            "a": {"shipper": {"flush_interval_ms": 40, "manifest_every": 20}},
            # ... and an fsync per mirrored batch: kills often land inside an object
            "b": {"journal": {"fsync": "always"}},
        },
    )
    try:
        fleet.start()
        a, b = fleet["a"], fleet["b"]
        producer = Producer(a.url, TOPIC.name, TOPIC.partitions, seed=8, pause=0.0, max_batch=20)
        producer.start()
        time.sleep(0.5)
        b.stop()
        time.sleep(2.0)  # a backlog builds up while b is away
        producer.pause = 0.02
        # a slow link: catch-up lasts across several kills
        fleet.proxies["b"].set_mode("latency", latency=0.02)
        b.start()
        kill_and_restart(a, b, rnd, kills=5, lo=0.2, hi=1.0)
        fleet.proxies["b"].set_mode("pass")
        finish(fleet, producer)
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
