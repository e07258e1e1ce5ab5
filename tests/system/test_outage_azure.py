"""A bucket outage on Azure Blob Storage (Azurite behind a TCP fault proxy per region).

Regions ``a`` and ``b`` each home a topic the other mirrors, each reaching
Azurite through its own proxy. While both keep producing, ``b``'s link first
refuses connections, then hangs (blackhole): ``b`` keeps accepting records and
its status shows the outage (the Azure SDK's connection errors and timeouts
are ``BucketUnavailable``, retried), while ``a`` ships as usual. When the link
heals, everything ships and both mirrors equal their sources record for
record: nothing acknowledged is lost.
"""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit

from _serve import Fleet, Gateway, Producer, TopicSpec, check_acknowledged, wait_until

from edge_gateway.testing.emulators import azurite_connection_string
from edge_gateway.testing.tcpproxy import TcpProxy

TOPICS = [TopicSpec("t", "a", partitions=3), TopicSpec("u", "b", partitions=2)]


def unshipped(g: Gateway, topic: str) -> int:
    with g.client() as c:
        return sum(p["unshipped"] for p in c.topic(topic)["partitions"])


def test_an_azure_outage_for_one_region_converges(
    tmp_path: Path, azurite_endpoint: str, azure_container_name: str
) -> None:
    parts = urlsplit(azurite_endpoint)  # http://127.0.0.1:PORT/devstoreaccount1
    port, account = parts.port, parts.path.strip("/")
    assert port is not None
    proxies = {r: TcpProxy("127.0.0.1", port).start() for r in ("a", "b")}

    def bucket(region: str) -> dict[str, object]:
        return {
            "type": "azure",
            "container": azure_container_name,
            "prefix": "fleet",
            "connection_string": azurite_connection_string(f"{proxies[region].url}/{account}"),
            "connect_timeout": 1.0,
            "read_timeout": 2.0,
            "max_attempts": 1,
        }

    fleet = Fleet(tmp_path, ["a", "b"], TOPICS, bucket=bucket)
    fleet.proxies.update(proxies)  # healed and stopped by fleet.close()
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

        proxies["b"].set_mode("refuse")
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
        error = str(b.status()["shipper"]["last_error"])
        assert "on Azure container" in error
        assert "Connection refused" in error
        assert b.status()["accepting"]
        wait_until(lambda: a.status()["shipper"]["next_seq"] > mark_a + 3, 20, "a to keep shipping")
        assert a.status()["shipper"]["last_error"] is None

        proxies["b"].set_mode("blackhole")
        time.sleep(3.0)  # requests hang until the 2 s read timeout
        assert b.status()["accepting"]

        proxies["b"].set_mode("pass")
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
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
