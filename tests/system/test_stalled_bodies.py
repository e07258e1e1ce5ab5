"""A mirror whose bucket answers stall half way through their bodies (issue 29).

Region ``b`` mirrors ``a``'s topic through moto's S3 server; ``b`` reaches
the bucket through a fault proxy in ``stall-body`` mode: every answer comes
with its status line, its headers and half its body, then nothing, for far
longer than ``bucket.read_timeout`` (2 s in the fleet). First while ``b`` is
caught up, so the answers that stall are the 404s to its polls for the next
entry (the body of an *error* answer, which botocore reads outside its own
exception handling: the gateway exited 1 on it); then while ``a`` produces,
so they are the 206s of entries' header reads. ``b`` must ride both out:
no exit, its mirror retrying with the error in its status, and once the link
heals it converges with the source record for record.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _serve import Fleet, Gateway, Producer, TopicSpec, check_acknowledged, wait_until

from edge_gateway.testing import ProxyMode

TOPIC = TopicSpec("t", "a", partitions=3, subscribers=("b",))


def alive(*gateways: Gateway) -> None:
    for g in gateways:
        assert g.running, f"{g.region} exited ({g.proc and g.proc.returncode}):\n{g.tail()}"


@pytest.mark.slow
def test_mirror_rides_out_answers_stalled_mid_body(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    fleet = Fleet(
        tmp_path, ["a", "b"], [TOPIC], s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name)
    )
    a, b = fleet["a"], fleet["b"]
    proxy = fleet.proxies["b"]
    producers: list[Producer] = []

    def produce_for(seconds: float, seed: int) -> None:
        p = Producer(a.url, TOPIC.name, TOPIC.partitions, seed=seed, pause=0.01)
        producers.append(p)
        p.start()
        time.sleep(seconds)
        p.stop()

    def stalled(status: int) -> bool:
        alive(a, b)
        return proxy.statistics().stalled.get(status, 0) >= 2

    def retrying() -> bool:
        alive(a, b)
        return "ReadTimeoutError" in (b.mirror("a")["last_error"] or "")

    try:
        fleet.start()
        produce_for(1.0, seed=1)
        fleet.wait_converged(timeout=60)

        # 1. b is caught up: its polls for the next entry are answered 404,
        #    and each of those answers stalls in its body.
        proxy.set_mode(ProxyMode.STALL_BODY)
        wait_until(lambda: stalled(404), 60, "404 answers to b's polls to stall mid-body")
        wait_until(retrying, 30, "b's mirror to show it is retrying")

        # 2. a produces: b's reads of new entries (206 answers) stall as well.
        producer = Producer(a.url, TOPIC.name, TOPIC.partitions, seed=2, pause=0.01)
        producers.append(producer)
        producer.start()
        wait_until(lambda: stalled(206), 60, "b's reads of entries to stall mid-body")
        # Stalls for several read timeouts in a row, while b keeps serving.
        time.sleep(5.0)
        alive(a, b)
        assert b.status()["accepting"]
        producer.stop()

        # 3. the link heals: b converges, with no gap, quarantine or error left.
        proxy.set_mode(ProxyMode.PASS)
        for p in producers:
            check_acknowledged(p, a)
        fleet.wait_converged(timeout=90)
        assert fleet.mismatches() == []
        m = b.mirror("a")
        assert (m["gaps"], m["quarantined"], m["stopped_by"]) == ([], [], None), m
        wait_until(lambda: b.mirror("a")["last_error"] is None, 30, "b's mirror error to clear")
        alive(a, b)
        assert (a.starts, b.starts) == (1, 1)
    finally:
        for p in producers:
            p.stopping.set()
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
