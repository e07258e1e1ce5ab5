"""Idempotent produce against real `edgegw serve` processes.

* a produce whose answer is lost (the fault proxy drops the gateway's
  responses, so the client times out and sends the request again) is written
  once, and the retry is answered with the original offsets;
* a producer (the Python client, idempotent by default) producing through
  repeated kill -9 of the gateway: every acknowledged record is there, at its
  acknowledged offset (zero losses), and no record is there twice (zero
  duplicates); the producers' state comes back from the journal's checkpoints
  and entries at each restart (small segments: several rolls between kills).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from _serve import Server, wait_until, write_config

from edge_gateway.client import Client, ProduceResponse
from edge_gateway.testing.ports import free_port
from edge_gateway.testing.tcpproxy import TcpProxy


def _read_all(client: Client, partition: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        page = client.fetch("t", partition, offset, max_records=5000)
        out += [(r.offset, r.value) for r in page.records]
        if page.next_offset >= page.high_watermark:
            return out
        offset = page.next_offset


def test_a_produce_retried_after_a_cut_connection_is_written_once(tmp_path: Path) -> None:
    server = Server(write_config(tmp_path))
    try:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with (
            TcpProxy(host, int(port)) as proxy,
            Client(proxy.url, timeout=1.0, retry_s=60) as client,
            Client(server.url, idempotent=False) as direct,
        ):
            client.produce("t", ["warm-up"], partition=0)  # gets its producer id
            proxy.set_mode("drop-responses")
            accepted = proxy.statistics().accepted
            result: dict[str, ProduceResponse | BaseException] = {}

            def produce() -> None:
                try:
                    result["res"] = client.produce("t", ["x1", "x2"], partition=1)
                except BaseException as exc:  # reported below
                    result["res"] = exc

            thread = threading.Thread(target=produce, daemon=True)
            thread.start()
            # the request reached the gateway and was written; its answer never came
            wait_until(lambda: direct.fetch("t", 1, 0).high_watermark == 2, 30, "the write")
            # the client timed out and sent it again on a new connection
            wait_until(lambda: proxy.statistics().accepted >= accepted + 2, 30, "a retry")
            proxy.set_mode("pass")
            thread.join(60)
            res = result["res"]
            assert isinstance(res, ProduceResponse), res
            assert res.duplicate
            assert (res.partitions, res.offsets) == ([1, 1], [0, 1])
            assert _read_all(direct, 1) == [(0, b"x1"), (1, b"x2")]
            assert direct.status()["producers"]["duplicates"] >= 1
    finally:
        server.stop(signal.SIGTERM)


class _Producer(threading.Thread):
    """Produces numbered records (keyed, 1-5 per call) until stopped; remembers each ack."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = Client(url, timeout=2.0, retry_s=120)
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.duplicates = 0

    def run(self) -> None:
        rnd = random.Random(5)
        i = 0
        try:
            while not self.stopping.is_set():
                values = [f"r{i}-{k}-{'v' * rnd.randrange(200)}" for k in range(rnd.randint(1, 5))]
                res = self.client.produce("t", values, key=f"k{i % 7}")
                self.duplicates += res.duplicate
                for v, p, o in zip(values, res.partitions, res.offsets, strict=True):
                    self.acked[v.encode()] = (p, o)
                i += 1
        except BaseException as exc:  # reported to the test
            self.error = exc
        finally:
            self.client.close()


def _written(url: str) -> int:
    with Client(url, idempotent=False) as c:
        return sum(p["next_offset"] for p in c.topic("t")["partitions"])


def test_an_idempotent_producer_through_repeated_kill_9(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, segment_bytes=64 * 1024)
    config.write_text(config.read_text().replace("127.0.0.1:0", f"127.0.0.1:{port}"))
    server = Server(config)
    # The producer talks through the fault proxy: before each kill the proxy
    # holds the gateway's answers, so the kill lands between a write and its
    # answer (the case idempotence exists for) every time, not by luck.
    proxy = TcpProxy("127.0.0.1", port).start()
    producer = _Producer(proxy.url)
    producer.start()
    kills = 4
    try:
        for _ in range(kills):
            before = len(producer.acked)
            wait_until(lambda b=before: len(producer.acked) >= b + 200, 60, "progress")
            proxy.set_mode("drop-responses")
            # Every record is written once and acknowledged once: more written
            # than acknowledged is a write whose answer the proxy holds (checked
            # twice, so that an answer already on its way is not taken for one).
            url = server.url
            for _ in range(2):
                wait_until(
                    lambda u=url: _written(u) > len(producer.acked), 30, "a write left unanswered"
                )
                time.sleep(0.3)
            # the connection is cut (its held answer lost) as the gateway dies
            proxy.set_mode("refuse")
            server.stop(signal.SIGKILL)
            server = Server(config)
            proxy.set_mode("pass")
        before = len(producer.acked)
        wait_until(lambda: len(producer.acked) >= before + 200, 60, "progress after restarts")
    finally:
        producer.stopping.set()
        producer.join(120)
        proxy.stop()
    assert producer.error is None, repr(producer.error)
    # each unanswered write was retried after the restart and answered as a duplicate
    assert producer.duplicates >= kills
    try:
        with Client(server.url, idempotent=False) as direct:
            seen: dict[bytes, tuple[int, int]] = {}
            for p in range(3):
                for offset, value in _read_all(direct, p):
                    assert value not in seen, f"{value[:12]!r} written twice: {seen[value]}"
                    seen[value] = (p, offset)
            assert {v: seen.get(v) for v in producer.acked} == producer.acked  # none lost
            status = direct.status()
            assert status["producers"]["remembered"] >= 1
    finally:
        server.stop(signal.SIGTERM)


def test_producer_state_across_restarts_then_expiry(tmp_path: Path) -> None:
    """A real process: duplicates, fencing and gaps after SIGTERM and kill -9 restarts; expiry."""
    config = write_config(tmp_path, segment_bytes=64 * 1024)
    config.write_text(config.read_text() + "[idempotence]\nproducer_expiry_ms = 6000\n")
    server = Server(config)
    try:
        issued = [_init(server.url)["producer_id"] for _ in range(3)]
        pid = issued[0]
        big = "v" * 3000
        sent = []
        for seq in range(0, 80, 2):  # ~240 KB: several segment rolls
            sent.append(_post(server.url, pid, 0, seq, [big, big]))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            server.stop(sig)
            server = Server(config)
            # the last five appends are remembered: answered with their offsets
            for seq in range(70, 80, 2):
                again = _post(server.url, pid, 0, seq, [big, big])
                assert again == {**sent[seq // 2], "duplicate": True}
            assert _post(server.url, pid, 0, 90, ["gap"], 409)["code"] == "out_of_order_sequence"
        # ids issued before the restarts (two never used) are not issued again
        assert _init(server.url)["producer_id"] > max(issued)
        assert _init(server.url, {"producer_id": pid, "epoch": 0}) == {
            "producer_id": pid,
            "epoch": 1,
        }
        server.stop(signal.SIGKILL)
        server = Server(config)
        # the bump survived the kill: epoch 0 is fenced
        assert _post(server.url, pid, 0, 80, ["z"], 409)["code"] == "producer_fenced"
        assert _post(server.url, pid, 1, 0, ["e1"])["offsets"][0]["offset"] == 80
        # idle past idempotence.producer_expiry_ms: forgotten
        time.sleep(6.5)
        assert _post(server.url, pid, 1, 1, ["late"], 409)["code"] == "unknown_producer"
    finally:
        server.stop(signal.SIGTERM)


def _init(url: str, body: dict[str, int] | None = None) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/producers", json=body, timeout=30)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _post(
    url: str, pid: int, epoch: int, seq: int, values: list[str], status: int = 200
) -> dict[str, Any]:
    r = httpx.post(
        f"{url}/v1/topics/t/records",
        json={"records": [{"value": v, "partition": 1} for v in values]},
        headers={
            "EdgeGW-Producer-Id": str(pid),
            "EdgeGW-Producer-Epoch": str(epoch),
            "EdgeGW-Producer-Sequence": str(seq),
        },
        timeout=30,
    )
    assert r.status_code == status, r.text
    doc: dict[str, Any] = r.json()
    return doc["error"] if status != 200 else doc
