"""The head relay: an idle two-region fleet on S3 makes no bucket requests at all.

Two ``edgegw serve`` processes on moto's S3 server, each through its own TCP
proxy (which counts the bytes each gateway sends to the bucket), with a real
metadata server relaying heads. Once both mirrors are caught up and follow
relayed heads, a window of ~10 s passes with zero bytes sent to the bucket
by either gateway; a record produced at one region still arrives at the
other (woken by the relayed head). With the metadata server down, mirroring
goes on by polling the bucket. ``bench/replication.py`` measures a longer
window and the latency with the relay on.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from _meta_support import MetaServer, http
from _serve import Fleet, Gateway, mirror_mismatches, wait_until

from edge_gateway.testing.tcpproxy import TcpProxy

DEADLINE = 60.0
#: The window with no bucket request (the bench measures 30 s).
IDLE_WINDOW_S = 10.0


def _sent(proxy: TcpProxy) -> int:
    return proxy.statistics().bytes_to_upstream


def _wait_quiet(proxies: dict[str, TcpProxy], quiet_s: float, timeout: float) -> None:
    """Wait until no proxy has forwarded a byte to the bucket for ``quiet_s``."""
    deadline = time.monotonic() + timeout
    last = {r: _sent(p) for r, p in proxies.items()}
    since = time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "the gateways never stopped talking to the bucket"
        time.sleep(0.1)
        now = {r: _sent(p) for r, p in proxies.items()}
        if now != last:
            last, since = now, time.monotonic()


@pytest.mark.slow
def test_idle_fleet_makes_no_bucket_requests(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    server = MetaServer(tmp_path / "meta.sqlite")
    with http(server.url) as c:
        tokens = {r: c.post("/v1/regions", json={"id": r}).json()["token"] for r in ("a", "b")}
        for r in ("a", "b"):
            body = {"name": f"t-{r}", "home": r, "partitions": 2, "subscribers": "*"}
            assert c.post("/v1/topics", json=body).status_code == 201
    meta = {"url": server.url, "poll_interval_ms": 500, "heartbeat_interval_ms": 1000}
    # Cursors and the safety poll would be requests too: keep them out of the window.
    sections = {
        "metadata": meta,
        "mirror": {"cursor_interval_ms": 600_000, "max_poll_interval_ms": 300},
    }
    per_region = {r: {"metadata": {"token": tok}} for r, tok in tokens.items()}
    port = int(moto_endpoint.rsplit(":", 1)[1])
    s3 = (port, s3_bucket_name)
    fleet = Fleet(tmp_path, ["a", "b"], [], s3=s3, sections=sections, per_region=per_region)
    a, b = fleet["a"], fleet["b"]
    try:
        fleet.start()

        def produce(home: str, n: int) -> None:
            g = fleet[home]
            records = [{"value": f"{home}-{i}", "key": f"k{i}"} for i in range(n)]
            r = httpx.post(f"{g.url}/v1/topics/t-{home}/records", json={"records": records})
            assert r.status_code == 200, r.text

        def converged() -> bool:
            return a.next_offsets("b.t-b") == b.next_offsets("t-b") and b.next_offsets(
                "a.t-a"
            ) == a.next_offsets("t-a")

        def relayed() -> bool:
            return all(
                g.status()["metadata"]["relay"]["active"]
                and all(m["relay"] for m in g.status()["mirrors"].values())
                for g in (a, b)
            )

        for home in ("a", "b"):
            produce(home, 20)
        wait_until(lambda: _exists(a, "b.t-b") and _exists(b, "a.t-a"), DEADLINE, "mirrors")
        wait_until(converged, DEADLINE, "both mirrors to catch up")
        wait_until(relayed, DEADLINE, "both gateways to follow relayed heads")

        # Idle: not one byte to the bucket from either gateway.
        _wait_quiet(fleet.proxies, 2.0, DEADLINE)
        before = {r: _sent(p) for r, p in fleet.proxies.items()}
        time.sleep(IDLE_WINDOW_S)
        after = {r: _sent(p) for r, p in fleet.proxies.items()}
        assert after == before, f"bytes sent to the bucket while idle: {before} -> {after}"

        # A record produced at a still arrives at b, woken by the relayed head.
        wakeups = b.mirror("a")["relay_wakeups"]
        produce("a", 1)
        wait_until(converged, DEADLINE, "the new record to reach b")
        assert b.mirror("a")["relay_wakeups"] > wakeups
        assert a.status()["metadata"]["relay"]["reports"] > 0

        # The metadata server goes away: mirroring goes on by polling the bucket.
        server.stop()
        wait_until(lambda: not b.status()["metadata"]["relay"]["active"], DEADLINE, "b to notice")
        assert not any(m["relay"] for m in b.status()["mirrors"].values())
        produce("a", 5)
        produce("b", 5)
        wait_until(converged, DEADLINE, "mirroring by polling the bucket")
        assert mirror_mismatches(a, "t-a", 2, b) == []
        assert mirror_mismatches(b, "t-b", 2, a) == []
        for g in (a, b):
            # Noticed by the failed long poll or, at the latest, the next heartbeat.
            wait_until(lambda g=g: g.status()["metadata"]["mode"] == "cached", DEADLINE, "cached")
            assert g.status()["errors"] == {}
    finally:
        codes = fleet.close()
        server.stop()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


def _exists(g: Gateway, topic: str) -> bool:
    return httpx.get(f"{g.url}/v1/topics/{topic}", timeout=30).status_code == 200
