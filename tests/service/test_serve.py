"""`edgegw serve` as a real process: SIGTERM and kill -9 under load lose nothing acknowledged."""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import trio
from _serve import Server, write_config

from edge_gateway.config import load_config
from edge_gateway.journal import open_journal


class Producer(threading.Thread):
    """Produces until stopped or the server goes away; remembers what was acknowledged."""

    def __init__(self, url: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.rnd = random.Random(seed)
        self.acked: dict[int, dict[int, str]] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            n = 0
            while not self.stopping.is_set():
                values = [f"v{self.rnd.random()}-{n + i}" for i in range(self.rnd.randrange(1, 20))]
                n += len(values)
                try:
                    r = client.post(
                        "/v1/topics/t/records",
                        json={"records": [{"value": v} for v in values]},
                    )
                except httpx.HTTPError:
                    return
                if r.status_code != 200:
                    return
                for v, o in zip(values, r.json()["offsets"], strict=True):
                    self.acked.setdefault(o["partition"], {})[o["offset"]] = v


def journal_contents(data_dir: Path) -> dict[int, dict[int, bytes]]:
    async def read() -> dict[int, dict[int, bytes]]:
        out: dict[int, dict[int, bytes]] = {}
        cfg = load_config(data_dir.parent / "edgegw.toml", env={})
        async with open_journal(data_dir / "journal", cfg.journal) as j:
            for p in range(3):
                offset = 0
                while offset < j.next_offset("t", p):
                    from edge_gateway.format.batch import iter_batches

                    for e in j.read("t", p, offset):
                        for b in iter_batches(e.payload):
                            for r in b.records(offset):
                                out.setdefault(p, {})[r.offset] = r.value
                                offset = r.offset + 1
        return out

    return trio.run(read)


def check(acked: dict[int, dict[int, str]], stored: dict[int, dict[int, bytes]]) -> None:
    for p, records in acked.items():
        for offset, value in records.items():
            assert stored.get(p, {}).get(offset) == value.encode(), f"lost {p}/{offset}"
    for p, records in stored.items():
        assert sorted(records) == list(range(len(records))), f"gap in partition {p}"


@pytest.mark.slow
def test_sigterm_under_load_exits_0_and_ships_everything(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    server = Server(config)
    producer = Producer(server.url, 1)
    producer.start()
    time.sleep(1.5)
    code, err = server.stop(signal.SIGTERM)
    producer.stopping.set()
    producer.join(timeout=30)
    assert code == 0, err
    assert sum(len(v) for v in producer.acked.values()) > 0
    check(producer.acked, journal_contents(tmp_path / "data"))
    # the drain shipped it all: the shipper state says so after a restart
    server = Server(config)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        deadline = time.monotonic() + 30
        while True:
            topic = client.get("/v1/topics/t").json()
            if all(p["unshipped"] == 0 for p in topic["partitions"]):
                break
            assert time.monotonic() < deadline, topic
            time.sleep(0.1)
    assert server.stop(signal.SIGINT)[0] == 0


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["always", "interval"])
def test_kill_9_under_load_loses_nothing_acknowledged(tmp_path: Path, fsync: str) -> None:
    config = write_config(tmp_path, fsync=fsync)
    acked: dict[int, dict[int, str]] = {}
    rnd = random.Random(fsync)
    for i in range(4):
        server = Server(config)
        producer = Producer(server.url, i)
        producer.start()
        time.sleep(rnd.uniform(0.3, 1.2))
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=30)
        producer.join(timeout=30)
        for p, records in producer.acked.items():
            acked.setdefault(p, {}).update(records)
    check(acked, journal_contents(tmp_path / "data"))


def test_a_client_that_hangs_up_mid_response_is_no_error(tmp_path: Path) -> None:
    # Issue 41, item 7: `curl .../records?...&max_bytes=67108864 | head -c 10`
    # logged "ERROR edgegw.api: internal error serving GET ..." with a
    # traceback ending in trio.BrokenResourceError. A client going away is
    # ordinary: at most a line at INFO/DEBUG, no ERROR, no traceback.
    config = write_config(tmp_path, fsync="never")
    with config.open("a") as f:
        f.write('[log]\nlevel = "debug"\n')
    server = Server(config)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            value = "x" * 2000
            for _ in range(20):  # ~40 MB of JSON to answer: far more than socket buffers
                r = c.post(
                    "/v1/topics/t/records",
                    json={"records": [{"value": value, "partition": 0}] * 500},
                )
                assert r.status_code == 200, r.text
        before = server.log.stat().st_size
        url = urlsplit(server.url)
        for _ in range(3):
            with socket.create_connection((url.hostname, url.port), timeout=10) as s:
                s.sendall(
                    b"GET /v1/topics/t/partitions/0/records?offset=0&max_records=10000"
                    b"&max_bytes=67108864 HTTP/1.1\r\nHost: gw\r\n\r\n"
                )
                assert s.recv(10)  # `head -c 10`: then the pipe closes with the rest unread
        # The gateway goes on serving (the same request read whole, say).
        with httpx.Client(base_url=server.url, timeout=60) as c:
            r = c.get(
                "/v1/topics/t/partitions/0/records",
                params={"offset": 0, "max_records": 10_000, "max_bytes": 67_108_864},
            )
            assert r.status_code == 200
            assert len(r.json()["records"]) == 10_000
    finally:
        code, log = server.stop(signal.SIGTERM)
    assert code == 0, log
    after = log.encode()[before:].decode(errors="replace")
    assert "Traceback" not in after, after
    assert " ERROR " not in after, after
    assert " WARNING " not in after, after
    assert "BrokenResourceError" not in after, after
    # One DEBUG line per hang-up, naming the request.
    about = [line for line in after.splitlines() if "/v1/topics/t/partitions/0/records" in line]
    assert len(about) == 3, after
    assert all(" DEBUG " in line and "hung up" in line for line in about), about
