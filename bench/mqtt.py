"""The MQTT bridge (docs/mqtt.md) against mosquitto on loopback, next to mosquitto itself.

(a) baseline: mosquitto's own QoS 1 throughput: one publisher (QoS 1, a
    window of 1000 messages in flight) to one plain QoS 1 subscriber; messages
    per second from the first publish to the last message received;
(a2) baseline: a plain subscriber with a persistent session drains ``n``
    messages queued for it while it was away (the broker's delivery rate,
    free of the publisher's);
(b) ingest: the same publisher into a broker that gateway ``a`` ingests from
    (``[[mqtt.ingest]]``, journal ``fsync = "always"``: each batch on disk
    before its PUBACKs); messages per second from the first publish until the
    gateway has journaled and PUBACKed them all (its status' ``acked``).
    ``ingest_ratio`` = (b) / (a), target >= 0.5. Publisher and subscriber of
    (a) are paho-mqtt, as the gateway's client is;
(b2) ingest drain: ``a`` stopped, ``n`` messages queued for its session, ``a``
    restarted; messages per second from its API answering until all are
    journaled and PUBACKed, next to (a2);
(c) publish: gateway ``b`` (started once ``a`` shipped everything: ``2 n``
    records) mirrors ``a.t`` and publishes it into its own broker
    (``[[mqtt.publish]]``) to a plain subscriber; messages per second from the
    first to the last message the subscriber receives;
(d) end to end: a device at A publishes one message every 20 ms (its send
    time inside); a subscriber at B's broker receives it through A's journal,
    the bucket (a local directory; flush 250 ms), B's mirror (poll 100 ms) and
    B's publisher; p50/p99 of receive time - send time (one process, one clock);
(e) RSS of gateway ``a`` after the ingest.

Usage: python bench/mqtt.py [--quick]. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import struct
import sys
import threading
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

from edge_gateway.testing.mosquitto import Mosquitto

PAYLOAD = 100
PARTITIONS = 4


def _client(port: int, name: str, *, persistent: bool = False, on_message: Any = None) -> Any:
    """A connected paho client, its network thread running.

    ``on_message`` is installed before connecting: a persistent session's
    queued messages follow CONNACK at once, and paho acknowledges (and drops)
    what arrives while no callback is set.
    """
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=name, protocol=mqtt.MQTTv5)
    c.max_inflight_messages_set(1000)
    c.max_queued_messages_set(0)
    if on_message is not None:
        c.on_message = on_message
    props = None
    if persistent:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        props.ReceiveMaximum = 1000
    c.connect("127.0.0.1", port, clean_start=not persistent, properties=props)
    c.loop_start()
    return c


class Counter:
    """A plain QoS 1 subscriber counting messages (and the first/last arrival)."""

    def __init__(self, port: int, pattern: str, name: str, *, persistent: bool = False) -> None:
        self.n = 0
        self.first = 0.0
        self.last = 0.0
        self.latencies: list[float] = []
        subscribed = threading.Event()

        def on_message(_c: Any, _u: Any, msg: Any) -> None:
            now = time.monotonic()
            if not self.n:
                self.first = now
            self.n += 1
            self.last = now
            if len(msg.payload) >= 8:
                sent = struct.unpack_from(">d", msg.payload)[0]
                if sent > 0:
                    self.latencies.append((time.time() - sent) * 1000)

        self.client = _client(port, name, persistent=persistent, on_message=on_message)
        self.client.on_subscribe = lambda *a: subscribed.set()
        self.client.subscribe(pattern, qos=1)
        if not subscribed.wait(10):
            raise RuntimeError("subscribe not acknowledged")

    def wait(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.n < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.n} of {n} messages received in {timeout:.0f}s")
            time.sleep(0.005)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def publish(port: int, n: int, name: str, prefix: str = "dev") -> float:
    """Publish ``n`` QoS 1 messages of PAYLOAD bytes; returns the start (monotonic)."""
    c = _client(port, name)
    payload = b"\0" * 8 + b"x" * (PAYLOAD - 8)  # send time 0: not a latency sample
    start = time.monotonic()
    infos = [c.publish(f"{prefix}/{i % 16}", payload, qos=1) for i in range(n)]
    for info in infos:
        info.wait_for_publish(120)
    c.disconnect()
    c.loop_stop()
    return start


def acked(site: Site) -> int:
    doc = httpx.get(f"{site.url}/v1/status", timeout=30).json()
    return int(doc["mqtt"]["ingest"][0]["acked"])


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(interval)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="fewer messages (a smoke run)")
    args = ap.parse_args()
    n = 20_000 if args.quick else 100_000
    samples = 100 if args.quick else 500

    with scratch_dir("mqtt") as root:
        broker_a = Mosquitto(root / "mosq-a")
        broker_b = Mosquitto(root / "mosq-b")
        topics = [FleetTopic("t", "a", PARTITIONS, ("b",))]
        a = Site("a", root / "a")
        b = Site("b", root / "b")
        a.extra_toml = (
            '[journal]\nfsync = "always"\n[log]\nlevel = "warning"\n'
            f'[[mqtt.ingest]]\nport = {broker_a.port}\nfilters = ["dev/#"]\ntopic = "t"\n'
        )
        b.extra_toml = (
            '[log]\nlevel = "warning"\n'
            f'[[mqtt.publish]]\nname = "out"\nport = {broker_b.port}\ntopics = ["a.t"]\n'
        )
        bucket = root / "bucket"
        for s in (a, b):
            s.write_config(bucket, topics, flush_ms=250, poll_ms=100)
        figures: dict[str, Any] = {"messages": n, "payload_bytes": PAYLOAD}
        try:
            # (a) mosquitto alone: publisher -> plain subscriber, same broker.
            progress(f"(a) mosquitto QoS 1: {n} messages to a plain subscriber ...")
            base = Counter(broker_a.port, "base/#", "bench-base-sub")
            c = _client(broker_a.port, "bench-base-pub")
            payload = b"\0" * 8 + b"x" * (PAYLOAD - 8)
            start = time.monotonic()
            for i in range(n):
                c.publish(f"base/{i % 16}", payload, qos=1)
            base.wait(n, 300)
            mosq_rate = n / (base.last - start)
            c.disconnect()
            c.loop_stop()
            base.close()

            # (a2) mosquitto alone: a persistent session drains its queue.
            progress(f"(a2) mosquitto: a plain subscriber drains {n} queued messages ...")
            sub = Counter(broker_a.port, "drain/#", "bench-drain-sub", persistent=True)
            sub.close()
            publish(broker_a.port, n, "bench-drain-pub", prefix="drain")
            start = time.monotonic()
            sub = Counter(broker_a.port, "drain/#", "bench-drain-sub", persistent=True)
            sub.wait(n, 300)
            mosq_drain = n / (sub.last - start)
            sub.close()

            # (b) ingest into a's journal.
            progress(f"(b) ingest: {n} messages into gateway a's journal ...")
            a.start()
            a.wait_ready()
            wait_for(
                lambda: httpx.get(f"{a.url}/v1/status", timeout=30).json()["mqtt"]["ingest"][0][
                    "connected"
                ],
                60,
                "a's ingest to connect",
                0.05,
            )
            start = publish(broker_a.port, n, "bench-dev")
            wait_for(lambda: acked(a) >= n, 600, "the ingest", 0.01)
            ingest_rate = n / (time.monotonic() - start)
            assert a.proc is not None
            rss = rss_mb(a.proc.pid)

            # (b2) a stopped, n messages queued for its session, a restarted.
            progress(f"(b2) ingest drain: gateway a restarts and journals {n} queued messages ...")
            a.stop()
            publish(broker_a.port, n, "bench-dev")
            a.start()
            a.wait_ready()
            start = time.monotonic()  # the gateway is up: its start is not the drain's
            wait_for(lambda: acked(a) >= n, 600, "the ingest drain", 0.01)
            ingest_drain = n / (time.monotonic() - start)
            httpx.post(f"{a.url}/v1/sync", params={"pull": "false"}, timeout=300)

            # (c) b mirrors a.t and publishes it.
            progress(f"(c) publish: b mirrors {n} records and publishes them ...")
            out = Counter(broker_b.port, "edgegw/#", "bench-b-sub")
            b.start()
            b.wait_ready()
            out.wait(2 * n, 600)
            publish_rate = (2 * n - 1) / (out.last - out.first) if out.last > out.first else None
            out.close()

            # (d) end to end, one message every 20 ms.
            progress(f"(d) end to end: {samples} messages A -> bucket -> B, one per 20 ms ...")
            e2e = Counter(broker_b.port, "edgegw/a/t/dev/lat", "bench-e2e-sub")
            dev = _client(broker_a.port, "bench-e2e-dev")
            for _ in range(samples):
                msg = struct.pack(">d", time.time()) + b"y" * (PAYLOAD - 8)
                dev.publish("dev/lat", msg, qos=1)
                time.sleep(0.02)
            e2e.wait(samples, 120)
            lat = e2e.latencies
            dev.disconnect()
            dev.loop_stop()
            e2e.close()
        finally:
            for s in (a, b):
                s.stop()
            broker_a.stop()
            broker_b.stop()
        figures.update(
            {
                "ingest_msgs_per_s": ingest_rate,
                "mosquitto_msgs_per_s": mosq_rate,
                "ingest_ratio": ratio(ingest_rate, mosq_rate),
                "ingest_drain_msgs_per_s": ingest_drain,
                "mosquitto_drain_msgs_per_s": mosq_drain,
                "ingest_drain_ratio": ratio(ingest_drain, mosq_drain),
                "publish_msgs_per_s": publish_rate,
                "publish_ratio": ratio(publish_rate, mosq_rate),
                "e2e_p50_ms": percentile(lat, 50),
                "e2e_p99_ms": percentile(lat, 99),
                "e2e_samples": len(lat),
                "rss_mb": rss,
                "machine": machine_info(root),
            }
        )
    ir = figures["ingest_ratio"]
    rows: list[Row | str] = [
        f"QoS 1, {PAYLOAD}-byte payloads, {n:,} messages; mosquitto on loopback",
        Row(
            "(b) ingest into the journal (fsync always)",
            ingest_rate,
            "msg/s",
            "(a) mosquitto QoS 1 to a subscriber",
            mosq_rate,
            ">= 0.5x",
            ir is not None and ir >= 0.5,
        ),
        Row(
            "(b2) drain of a queued session into the journal",
            ingest_drain,
            "msg/s",
            "(a2) a plain subscriber drains its session",
            mosq_drain,
        ),
        Row(
            "(c) publish out of a mirror topic",
            publish_rate,
            "msg/s",
            "(a) mosquitto QoS 1 to a subscriber",
            mosq_rate,
        ),
        f"(d) device at A -> subscriber at B through the bucket (flush 250 ms), {len(lat)} msgs",
        Row("end-to-end p50", figures["e2e_p50_ms"], "ms"),
        Row("end-to-end p99", figures["e2e_p99_ms"], "ms"),
        Row("(e) RSS of gateway a after the ingest", rss, "MB"),
    ]
    print(render_table("edgegw MQTT bridge", rows))
    emit_json(figures)


if __name__ == "__main__":
    main()
