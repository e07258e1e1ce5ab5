"""Bucket outages through TCP fault proxies in front of moto's S3 server.

Regions ``a`` and ``b`` each home a topic the other mirrors, and each
reaches the bucket through its own proxy. While both keep producing:

1. ``b``'s proxy refuses connections: ``b`` keeps accepting records, and its
   status shows the outage — the mirror of ``a`` retrying with the error,
   the shipper's ``last_error``, records piling up unshipped — while ``a``
   ships as usual;
2. then both links are blackholed (requests hang until the read timeout;
   bytes held meanwhile arrive late, after the link heals): ``a`` shows its
   shipper's error and unshipped records;
3. both links heal: everything ships, both mirrors catch up and equal their
   sources record for record, and the errors clear from the status.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _serve import Fleet, Gateway, Producer, TopicSpec, check_acknowledged, wait_until

TOPICS = [TopicSpec("t", "a", partitions=3), TopicSpec("u", "b", partitions=2)]


def unshipped(g: Gateway, topic: str) -> int:
    with g.client() as c:
        return sum(p["unshipped"] for p in c.topic(topic)["partitions"])


@pytest.mark.slow
def test_bucket_outage_for_one_then_both_converges(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    fleet = Fleet(
        tmp_path, ["a", "b"], TOPICS, s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name)
    )
    try:
        fleet.start()
        a, b = fleet["a"], fleet["b"]
        producers = {
            "a": Producer(a.url, "t", 3, seed=1, pause=0.01),
            "b": Producer(b.url, "u", 2, seed=2, pause=0.01),
        }
        for p in producers.values():
            p.start()
        time.sleep(1.0)

        # 1. b loses the bucket
        fleet.proxies["b"].set_mode("refuse")
        mark_a = a.status()["shipper"]["next_seq"]

        def b_shows_outage() -> bool:
            s = b.status()
            m = s["mirrors"]["a"]
            return bool(
                m["state"] == "retrying"
                and m["last_error"]
                and s["shipper"]["last_error"]
                and unshipped(b, "u") > 0
            )

        wait_until(b_shows_outage, 20, "b's status to show the outage")
        assert b.status()["accepting"]
        # a is unaffected: it ships, and b's topic simply stops arriving
        wait_until(lambda: a.status()["shipper"]["next_seq"] > mark_a + 3, 20, "a to keep shipping")
        assert a.status()["shipper"]["last_error"] is None

        # 2. both links are blackholed (b's requests now hang instead of failing fast)
        fleet.proxies["a"].set_mode("blackhole")
        fleet.proxies["b"].set_mode("blackhole")
        wait_until(
            lambda: a.status()["shipper"]["last_error"] and unshipped(a, "t") > 0,
            20,
            "a's status to show its shipper's error",
        )

        # 3. both heal
        fleet.proxies["a"].set_mode("pass")
        fleet.proxies["b"].set_mode("pass")
        time.sleep(1.0)
        for p in producers.values():
            p.stop()
        check_acknowledged(producers["a"], a)
        check_acknowledged(producers["b"], b)
        wait_until(
            lambda: unshipped(a, "t") == 0 and unshipped(b, "u") == 0, 60, "both to ship it all"
        )
        fleet.wait_converged(timeout=60)
        assert fleet.mismatches() == []
        for g, source in ((a, "b"), (b, "a")):
            s = g.status()
            assert s["shipper"]["last_error"] is None, s["shipper"]
            assert s["mirrors"][source]["last_error"] is None, s["mirrors"][source]
            assert s["mirrors"][source]["state"] in ("idle", "following")
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
