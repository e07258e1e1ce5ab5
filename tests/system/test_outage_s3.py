"""Two gateway processes on moto's S3 server; one loses the bucket for a while.

Region ``a`` homes topic ``t`` and ``b`` mirrors it; each reaches the bucket
through its own TCP fault proxy. While ``a`` keeps producing, ``b``'s proxy
refuses connections, then ``a``'s is blackholed too; when both pass again,
everything converges and the mirror equals the source record for record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from edgegw_cli._fleet import Site, high_watermarks, mirror_mismatches

from edge_gateway.testing.tcpproxy import TcpProxy

BUCKET_OPTS = (
    'region = "us-east-1"\npath_style = true\naccess_key = "testing"\nsecret_key = "testing"'
)


def config(site: Site, proxy: TcpProxy, bucket: str) -> None:
    site.data_dir.mkdir(parents=True, exist_ok=True)
    site.config = site.data_dir.parent / f"{site.region}.toml"
    site.log_path = site.data_dir.parent / f"{site.region}.log"
    site.config.write_text(
        f'region = "{site.region}"\ndata_dir = "{site.data_dir}"\n'
        "[shipper]\nflush_interval_ms = 100\nretry_cap_s = 1.0\n"
        "[mirror]\npoll_interval_ms = 50\n"
        f'[bucket]\ntype = "s3"\nbucket = "{bucket}"\nendpoint_url = "{proxy.url}"\n'
        f"{BUCKET_OPTS}\nconnect_timeout = 1.0\nread_timeout = 2.0\nmax_attempts = 1\n"
        '[api]\nlisten = "127.0.0.1:0"\n'
        '[[topics]]\nname = "t"\nhome = "a"\npartitions = 3\nsubscribers = ["b"]\n'
    )


@pytest.fixture
def sites(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> Iterator[tuple[Site, Site, TcpProxy, TcpProxy]]:
    port = int(moto_endpoint.rsplit(":", 1)[1])
    with TcpProxy("127.0.0.1", port) as pa, TcpProxy("127.0.0.1", port) as pb:
        a, b = Site("a", tmp_path / "a"), Site("b", tmp_path / "b")
        config(a, pa, s3_bucket_name)
        config(b, pb, s3_bucket_name)
        try:
            for s in (a, b):
                s.start()
            for s in (a, b):
                s.wait_ready()
            yield a, b, pa, pb
        finally:
            codes = [s.stop() for s in (a, b)]
            assert codes == [0, 0], f"exit codes {codes}; logs in {tmp_path}"


@pytest.mark.slow
def test_bucket_outage_for_one_then_both_converges(
    sites: tuple[Site, Site, TcpProxy, TcpProxy],
) -> None:
    a, b, pa, pb = sites
    stop = threading.Event()
    acked = [0]

    def produce() -> None:
        with httpx.Client(base_url=a.url, timeout=30) as c:
            while not stop.is_set():
                r = c.post(
                    "/v1/topics/t/records",
                    json={
                        "records": [{"value": f"v{acked[0] + i}", "key": f"k{i}"} for i in range(5)]
                    },
                )
                assert r.status_code == 200, r.text
                acked[0] += 5
                time.sleep(0.01)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        time.sleep(1.0)
        pb.set_mode("refuse")  # b loses the bucket: a keeps shipping
        pb.reset_connections()
        time.sleep(3.0)
        with httpx.Client(base_url=b.url, timeout=30) as c:
            status = c.get("/v1/status").json()
        assert status["mirrors"]["a"]["state"] in {"retrying", "following", "idle", "catching-up"}
        pa.set_mode("blackhole")  # now a cannot ship either: its journal keeps accepting
        time.sleep(3.0)
        with httpx.Client(base_url=a.url, timeout=30) as c:
            topic = c.get("/v1/topics/t").json()
        assert sum(p["unshipped"] for p in topic["partitions"]) > 0
        pa.set_mode("pass")
        pb.set_mode("pass")
        time.sleep(1.0)
    finally:
        stop.set()
        producer.join(timeout=30)
    assert acked[0] > 0
    with (
        httpx.Client(base_url=a.url, timeout=30) as ca,
        httpx.Client(base_url=b.url, timeout=30) as cb,
    ):
        want = high_watermarks(ca, "t")
        assert sum(want) == acked[0]
        deadline = time.monotonic() + 90
        while high_watermarks(cb, "a.t") != want:
            assert time.monotonic() < deadline, "b did not converge after the outage"
            time.sleep(0.1)
    assert mirror_mismatches(a, "t", 3, b) == []
