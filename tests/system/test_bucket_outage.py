"""Bucket outages through a TCP fault proxy per region, on S3 (moto) and Azure (Azurite).

Regions ``a`` and ``b`` each home a topic the other mirrors, and each
reaches the store through its own proxy. While both keep producing:

1. ``b``'s proxy refuses connections: ``b`` keeps accepting records, and its
   status shows the outage — the mirror of ``a`` retrying with the error,
   the shipper's ``last_error`` naming the store, records piling up
   unshipped — while ``a`` ships as usual;
2. then both links are blackholed (requests hang until the read timeout;
   bytes held meanwhile arrive late, after the link heals): ``a`` shows its
   shipper's error and unshipped records, and both keep accepting;
3. both links heal: everything ships, both mirrors catch up and equal their
   sources record for record, and the errors clear from the status.

Each SDK's connection errors and timeouts must come out as
``BucketUnavailable`` (retried), never as a failure that stops the gateway.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from _serve import Fleet, Gateway, Producer, TopicSpec, check_acknowledged, wait_until

from edge_gateway.testing.emulators import azurite_connection_string
from edge_gateway.testing.tcpproxy import TcpProxy

MakeFleet = Callable[[pytest.FixtureRequest, Path], tuple[Fleet, str]]
TOPICS = [TopicSpec("t", "a", partitions=3), TopicSpec("u", "b", partitions=2)]


def unshipped(g: Gateway, topic: str) -> int:
    with g.client() as c:
        return sum(p["unshipped"] for p in c.topic(topic)["partitions"])


def s3_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Fleet, str]:
    endpoint: str = request.getfixturevalue("moto_endpoint")
    name: str = request.getfixturevalue("s3_bucket_name")
    port = int(endpoint.rsplit(":", 1)[1])
    return Fleet(tmp_path, ["a", "b"], TOPICS, s3=(port, name)), "on S3 bucket"


def azure_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Fleet, str]:
    endpoint: str = request.getfixturevalue("azurite_endpoint")
    container: str = request.getfixturevalue("azure_container_name")
    parts = urlsplit(endpoint)  # http://127.0.0.1:PORT/devstoreaccount1
    port, account = parts.port, parts.path.strip("/")
    assert port is not None
    proxies = {r: TcpProxy("127.0.0.1", port).start() for r in ("a", "b")}

    def bucket(region: str) -> dict[str, object]:
        return {
            "type": "azure",
            "container": container,
            "prefix": "fleet",
            "connection_string": azurite_connection_string(f"{proxies[region].url}/{account}"),
            "connect_timeout": 1.0,
            "read_timeout": 2.0,
            "max_attempts": 1,
        }

    fleet = Fleet(tmp_path, ["a", "b"], TOPICS, bucket=bucket)
    fleet.proxies.update(proxies)  # healed and stopped by fleet.close()
    return fleet, "on Azure container"


@pytest.mark.parametrize(
    "make_fleet",
    [
        pytest.param(s3_fleet, id="s3", marks=pytest.mark.slow),
        pytest.param(azure_fleet, id="azure"),
    ],
)
def test_bucket_outage_for_one_then_both_converges(
    request: pytest.FixtureRequest, tmp_path: Path, make_fleet: MakeFleet
) -> None:
    fleet, names_store = make_fleet(request, tmp_path)
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
        assert names_store in str(b.status()["shipper"]["last_error"])
        assert b.status()["accepting"]
        # a is unaffected: it ships, and b's topic simply stops arriving
        wait_until(lambda: a.status()["shipper"]["next_seq"] > mark_a + 3, 20, "a to keep shipping")
        assert a.status()["shipper"]["last_error"] is None

        # 2. both links are blackholed (b's requests now hang instead of failing fast)
        fleet.proxies["a"].set_mode("blackhole")
        fleet.proxies["b"].set_mode("blackhole")
        wait_until(
            lambda: a.status()["shipper"]["last_error"] and unshipped(a, "t") > 0,
            30,
            "a's status to show its shipper's error",
        )
        assert a.status()["accepting"]
        assert b.status()["accepting"]

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
