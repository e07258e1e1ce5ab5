"""The MQTT bridge end to end: real mosquitto, real `edgegw serve` processes (docs/mqtt.md).

Ingest: devices publish at QoS 1 into the site's broker; the gateway journals
what its filters match and PUBACKs only after the append is durable, so a
gateway killed mid-stream loses nothing the devices got a PUBACK for (the
broker redelivers; duplicates are counted, and marked). Publish: a topic is
published into a broker in offset order, progress kept as a consumer group,
resumed after kill -9 without a gap. Two regions: a device at site A reaches a
subscriber at site B's broker through the bucket.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _mqtt_support import Device, Mosquitto, Subscriber, mqtt_tables, needs_mosquitto
from _serve import EDGEGW, Fleet, Gateway, TopicSpec, read_partition, wait_until

from edge_gateway.testing.ports import closed_port

pytestmark = needs_mosquitto


def _with_mqtt(g: Gateway, *tables: str) -> None:
    g.config.write_text(g.config.read_text() + "".join(tables))


def _records(g: Gateway, topic: str, partitions: int) -> list[Any]:
    out = []
    for p in range(partitions):
        out += read_partition(g.url, topic, p)
    return out


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    b = Mosquitto(tmp_path / "mosquitto")
    yield b
    b.stop()


def _fleet(tmp_path: Path, regions: list[str], topics: list[TopicSpec]) -> Fleet:
    return Fleet(tmp_path / "fleet", regions, topics)


def test_ingest_round_trip_filters_payloads_and_properties(
    tmp_path: Path, broker: Mosquitto
) -> None:
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    fleet = _fleet(tmp_path, ["a"], [TopicSpec("telemetry", "a", partitions=3)])
    g = fleet["a"]
    _with_mqtt(
        g,
        mqtt_tables(
            "ingest",
            port=broker.port,
            filters=["sensors/+/temp", "plc/#"],
            topic="telemetry",
            idle_warning_s=2.0,
        ),
    )
    fleet.start()
    device = Device(broker.port)
    try:
        wait_until(
            lambda: g.status()["mqtt"]["ingest"][0]["connected"], 30, "the ingest to connect"
        )
        # Subscriptions are made by the time status says connected + a round trip;
        # a retained-free warm-up message proves the subscription is live.
        wait_until(
            lambda: device.publish("plc/warmup", b"w") or _count(g, "telemetry") >= 1,
            30,
            "the subscription to be live",
            interval=0.5,
        )
        warm = _count(g, "telemetry")
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("msg-id", "42"), ("unit", "C")]
        sent = [
            ("sensors/dev1/temp", b"21.5", props),
            ("sensors/dev2/temp", bytes(range(256)), None),  # binary
            ("plc/line1/state", b"", None),  # empty
            ("plc/line1/blob", os.urandom(256 * 1024), None),  # 256 KiB
            ("sensors/dev1/humidity", b"not matched", None),
            ("other/x", b"not matched", None),
        ]
        for i in range(200):
            sent.append((f"plc/bulk/{i % 7}", f"m{i}".encode(), None))
        base = len(device.acked)
        for topic, payload, p in sent:
            device.publish(topic, payload, p)
        device.wait_acked(base + len(sent))
        want = [(t, v) for t, v, _ in sent if not v.startswith(b"not matched")]
        wait_until(lambda: _count(g, "telemetry") - warm >= len(want), 60, "every matching message")
        recs = [r for r in _records(g, "telemetry", 3) if r.value != b"w"]
        got = collections.Counter((r.key.decode(), r.value) for r in recs)
        assert got == collections.Counter(want)
        by_key = {r.key: r for r in recs}
        assert dict(by_key[b"sensors/dev1/temp"].headers) == {"msg-id": b"42", "unit": b"C"}
        st = g.status()["mqtt"]["ingest"][0]
        assert st["acked"] == st["messages_in"] >= len(want)
        assert st["redeliveries"] == 0
        filters = {f["filter"]: f["messages"] for f in st["filters"]}
        assert filters["sensors/+/temp"] == 2
        # metrics
        import httpx

        text = httpx.get(f"{g.url}/metrics").text
        assert 'edgegw_mqtt_connected{bridge="telemetry",direction="ingest"} 1.0' in text
        assert 'edgegw_mqtt_messages_total{bridge="telemetry",direction="ingest"}' in text
        # A filter that gets nothing is warned about (idle_warning_s = 2 here).
        wait_until(lambda: "matched no message" in g.tail(200), 30, "the idle-filter warning")
    finally:
        device.close()
        fleet.close()


def _values(g: Gateway, topic: str, partitions: int) -> set[bytes]:
    return {r.value for r in _records(g, topic, partitions)}


def _count(g: Gateway, topic: str) -> int:
    with g.client() as c:
        return sum(p["next_offset"] for p in c.topic(topic)["partitions"])


def test_kill9_mid_stream_loses_no_acknowledged_message(tmp_path: Path, broker: Mosquitto) -> None:
    fleet = _fleet(tmp_path, ["a"], [TopicSpec("telemetry", "a", partitions=2)])
    g = fleet["a"]
    _with_mqtt(g, mqtt_tables("ingest", port=broker.port, filters=["dev/#"], topic="telemetry"))
    fleet.start()
    device = Device(broker.port)
    try:
        wait_until(lambda: g.status()["mqtt"]["ingest"][0]["connected"], 30, "ingest connected")
        total = 6000
        for i in range(total // 2):
            device.publish(f"dev/{i % 13}", f"msg-{i}".encode())
        # Kill while the gateway is mid-stream (some journaled, some not).
        wait_until(lambda: _count(g, "telemetry") > 200, 60, "ingest under way", interval=0.01)
        g.kill()
        for i in range(total // 2, total):
            device.publish(f"dev/{i % 13}", f"msg-{i}".encode())
        device.wait_acked(total)
        g.start()
        acked = {p for _, p in device.acked}
        wait_until(
            lambda: len({r.value for r in _records(g, "telemetry", 2)} & acked) == len(acked),
            120,
            "every PUBACKed message in the journal",
            interval=0.5,
        )
        recs = _records(g, "telemetry", 2)
        counts = collections.Counter(r.value for r in recs)
        dups = sum(n - 1 for n in counts.values() if n > 1)
        assert set(counts) == acked  # nothing lost, nothing invented
        # Every duplicate is one the broker redelivered after the kill, and it is marked.
        dup_marked = sum(1 for r in recs if ("mqtt-dup", b"1") in r.headers)
        assert dups <= dup_marked
        print(f"kill -9 mid-stream: {total} messages, {dups} duplicates, {dup_marked} redelivered")
    finally:
        device.close()
        fleet.close()


def test_failure_between_append_and_puback_gives_marked_duplicates(
    tmp_path: Path, broker: Mosquitto
) -> None:
    """Journaled but not PUBACKed: the broker redelivers, the copy says mqtt-dup."""
    fleet = _fleet(tmp_path, ["a"], [TopicSpec("telemetry", "a", partitions=1)])
    g = fleet["a"]
    g.env["EDGEGW_FAILPOINTS"] = "mqtt.before_ack=1"
    _with_mqtt(g, mqtt_tables("ingest", port=broker.port, filters=["dev/#"], topic="telemetry"))
    fleet.start()
    device = Device(broker.port)
    try:
        wait_until(lambda: g.status()["mqtt"]["ingest"][0]["connected"], 30, "ingest connected")
        for i in range(300):
            device.publish("dev/x", f"m{i}".encode())
        device.wait_acked(300)
        want = {f"m{i}".encode() for i in range(300)}
        wait_until(
            lambda: want <= {r.value for r in read_partition(g.url, "telemetry", 0)},
            60,
            "every message after the ingest's restart",
            interval=0.2,
        )
        recs = read_partition(g.url, "telemetry", 0)
        counts = collections.Counter(r.value for r in recs)
        dups = [v for v, n in counts.items() if n > 1]
        assert dups, "the failed batch was journaled, so its redelivery is a duplicate"
        assert all(n == 2 for n in counts.values() if n > 1)
        # The second copy of each is marked as a redelivery.
        seen: set[bytes] = set()
        for r in recs:
            if r.value in seen:
                assert ("mqtt-dup", b"1") in r.headers
            seen.add(r.value)
        st = g.status()
        assert st["mqtt"]["ingest"][0]["redeliveries"] >= len(dups)
        assert any(t["name"] == "mqtt ingest telemetry" and t["failures"] == 1 for t in st["tasks"])
    finally:
        device.close()
        fleet.close()


def test_broker_restart_mid_stream(tmp_path: Path, broker: Mosquitto) -> None:
    fleet = _fleet(tmp_path, ["a"], [TopicSpec("telemetry", "a", partitions=1)])
    g = fleet["a"]
    _with_mqtt(g, mqtt_tables("ingest", port=broker.port, filters=["dev/#"], topic="telemetry"))
    fleet.start()
    device = Device(broker.port)
    try:
        wait_until(lambda: g.status()["mqtt"]["ingest"][0]["connected"], 30, "ingest connected")
        for i in range(500):
            device.publish("dev/a", f"before-{i}".encode())
        device.wait_acked(500)
        device.close()
        broker.restart()
        wait_until(
            lambda: g.status()["mqtt"]["ingest"][0]["connects"] >= 2, 60, "the ingest to reconnect"
        )
        device = Device(broker.port)
        for i in range(500):
            device.publish("dev/a", f"after-{i}".encode())
        device.wait_acked(500)
        want = {f"before-{i}".encode() for i in range(500)} | {
            f"after-{i}".encode() for i in range(500)
        }
        wait_until(
            lambda: want <= {r.value for r in read_partition(g.url, "telemetry", 0)},
            60,
            "every message across the broker restart",
            interval=0.5,
        )
    finally:
        device.close()
        fleet.close()


def test_publish_resumes_after_kill9_without_gaps(tmp_path: Path, broker: Mosquitto) -> None:
    fleet = _fleet(tmp_path, ["a"], [TopicSpec("cmds", "a", partitions=2)])
    g = fleet["a"]
    _with_mqtt(
        g,
        mqtt_tables(
            "publish",
            name="out",
            port=broker.port,
            topics=["cmds"],
            template="site/{region}/{topic}/{partition}/{key}",
        ),
    )
    fleet.start()
    sub = Subscriber(broker.port, "site/#")
    try:
        with g.client() as c:
            for i in range(0, 3000, 100):
                c.produce(
                    "cmds", [{"key": f"k{j % 5}", "value": f"v{j}"} for j in range(i, i + 100)]
                )
        wait_until(lambda: len(sub.got) > 300, 60, "publishing under way", interval=0.01)
        g.kill()
        g.start()
        # Duplicates (the round in flight at the kill) count too: wait for every value.
        want = {f"v{j}".encode() for j in range(3000)}
        wait_until(
            lambda: want <= {v for _, v, _ in sub.wait_count(0)}, 120, "every record published"
        )
        wait_until(
            lambda: g.status()["mqtt"]["publish"][0]["lag_records"] == 0, 60, "lag 0", interval=0.2
        )
        got = sub.got
        values = collections.Counter(v for _, v, _ in got)
        assert set(values) == {f"v{j}".encode() for j in range(3000)}  # no gap
        # Per MQTT topic (one key of one partition), values come in offset order,
        # a resumed run repeating at most the round it had not committed.
        by_topic: dict[str, list[int]] = collections.defaultdict(list)
        for t, v, _ in got:
            by_topic[t].append(int(v[1:]))
        for t, seq in by_topic.items():
            assert t.startswith("site/a/cmds/")
            firsts = [x for i, x in enumerate(seq) if x not in seq[:i]]
            assert firsts == sorted(firsts), f"{t}: out of order"
        with g.client() as c:
            committed = {o.partition: o.offset for o in c.fetch_offsets("mqtt-publish-out")}
        assert committed == dict(enumerate(g.next_offsets("cmds")))
    finally:
        sub.close()
        fleet.close()


def test_two_regions_device_at_a_reaches_subscriber_at_b(tmp_path: Path) -> None:
    broker_a = Mosquitto(tmp_path / "mosq-a")
    broker_b = Mosquitto(tmp_path / "mosq-b")
    fleet = _fleet(
        tmp_path, ["a", "b"], [TopicSpec("telemetry", "a", partitions=2, subscribers=("b",))]
    )
    _with_mqtt(
        fleet["a"],
        mqtt_tables("ingest", port=broker_a.port, filters=["dev/#"], topic="telemetry"),
    )
    _with_mqtt(
        fleet["b"],
        mqtt_tables("publish", name="from-a", port=broker_b.port, topics=["a.telemetry"]),
    )
    device = sub = None
    try:
        fleet.start()
        sub = Subscriber(broker_b.port, "edgegw/#")
        device = Device(broker_a.port)
        wait_until(
            lambda: fleet["a"].status()["mqtt"]["ingest"][0]["connected"], 30, "ingest connected"
        )
        for i in range(100):
            device.publish(f"dev/{i % 3}", f"reading-{i}".encode())
        device.wait_acked(100)
        got = sub.wait_count(100, timeout=120)
        assert {(t, v) for t, v, _ in got} == {
            (f"edgegw/a/telemetry/dev/{i % 3}", f"reading-{i}".encode()) for i in range(100)
        }
    finally:
        for x in (device, sub):
            if x is not None:
                x.close()
        fleet.close()
        broker_a.stop()
        broker_b.stop()


@pytest.fixture
def nobody() -> Iterator[int]:
    """A port where nothing listens (held closed: see ``closed_port``)."""
    with closed_port() as port:
        yield port


def test_bad_address_and_refused_credentials_are_clear_errors(tmp_path: Path, nobody: int) -> None:
    """The gateway serves meanwhile; status and the log say what is wrong and where."""
    import shutil
    import subprocess

    passwd = shutil.which("mosquitto_passwd")
    if passwd is None:
        pytest.skip("mosquitto_passwd (package mosquitto) is not installed")
    pw_file = tmp_path / "broker.passwd"
    subprocess.run([passwd, "-c", "-b", str(pw_file), "gw", "right-password"], check=True)
    broker = Mosquitto(tmp_path / "mosq", password_file=pw_file)
    wrong = tmp_path / "wrong.txt"
    wrong.write_text("wrong-password\n")
    right = tmp_path / "right.txt"
    right.write_text("right-password\n")
    fleet = _fleet(tmp_path, ["a"], [TopicSpec("t1", "a", partitions=1)])
    g = fleet["a"]
    g.env["BROKER_PASSWORD"] = "right-password"
    _with_mqtt(
        g,
        mqtt_tables("ingest", name="nobody", port=nobody, filters=["x/#"], topic="t1"),
        mqtt_tables(
            "ingest",
            name="refused",
            port=broker.port,
            filters=["x/#"],
            topic="t1",
            username="gw",
            password_file=str(wrong),
        ),
        mqtt_tables(
            "ingest",
            name="file",
            port=broker.port,
            filters=["x/#"],
            topic="t1",
            username="gw",
            password_file=str(right),
        ),
        mqtt_tables(
            "publish",
            name="env",
            port=broker.port,
            topics=["t1"],
            username="gw",
            password_env="BROKER_PASSWORD",
        ),
    )
    try:
        fleet.start()

        def bridges() -> dict[str, dict[str, Any]]:
            doc = g.status()["mqtt"]
            return {b["name"]: b for b in doc["ingest"] + doc["publish"]}

        wait_until(
            lambda: bridges()["nobody"]["last_error"] and bridges()["refused"]["last_error"],
            30,
            "both errors",
        )
        b = bridges()
        assert b["nobody"]["last_error"].startswith(
            f"cannot connect to the MQTT broker mqtt://127.0.0.1:{nobody}: "
        )
        assert "refused" in b["nobody"]["last_error"].lower()
        assert "the broker refused the connection" in b["refused"]["last_error"]
        assert (
            "Not authorized" in b["refused"]["last_error"]
            or "Bad user name or password" in b["refused"]["last_error"]
        )
        assert not b["refused"]["connected"]
        wait_until(lambda: bridges()["file"]["connected"], 30, "the right password to connect")
        wait_until(lambda: bridges()["env"]["connected"], 30, "the password from env to connect")
        log = g.tail(400)
        assert (
            f"mqtt.ingest[nobody]: cannot connect to the MQTT broker mqtt://127.0.0.1:{nobody}"
            in log
        )
        with g.client() as c:  # the gateway serves all along
            c.produce("t1", ["still taking records"])
        out = subprocess.run(
            [str(EDGEGW), "status", "--config", str(g.config)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "250"},
            check=False,
        )
        assert out.returncode == 0, out.stderr
        assert "ingest nobody -> t1" in out.stdout
        assert "cannot connect to the MQTT broker" in out.stdout
        assert "Not authorized" in out.stdout or "Bad user name" in out.stdout
        assert "publish env <- t1" in out.stdout
    finally:
        fleet.close()
        broker.stop()


def test_a_full_journal_stops_the_ingest_and_loses_nothing(
    tmp_path: Path, broker: Mosquitto, moto_endpoint: str, s3_bucket_name: str
) -> None:
    """The bucket away, the journal's budget fills: the ingest stops reading (the
    broker queues), then drains everything once shipping frees space."""
    port = int(moto_endpoint.rsplit(":", 1)[1])
    fleet = Fleet(
        tmp_path / "fleet",
        ["a", "b"],
        [TopicSpec("telemetry", "a", partitions=2, subscribers=("b",))],
        s3=(port, s3_bucket_name),
        # at_rest off: compressed, these repetitive messages would never fill the budget
        per_region={
            "a": {
                "journal": {"segment_bytes": 64 * 1024, "max_bytes": 128 * 1024, "at_rest": "off"}
            }
        },
    )
    g = fleet["a"]
    _with_mqtt(g, mqtt_tables("ingest", port=broker.port, filters=["dev/#"], topic="telemetry"))
    device = Device(broker.port)
    try:
        fleet.start()
        wait_until(lambda: g.status()["mqtt"]["ingest"][0]["connected"], 30, "ingest connected")
        fleet.proxies["a"].set_mode("refuse")  # nothing ships: nothing can be deleted
        total = 400
        for i in range(total):
            device.publish(f"dev/{i % 5}", f"{i:06d}".encode() + b"x" * 1000)
        device.wait_acked(total)

        def ingest() -> dict[str, Any]:
            doc: dict[str, Any] = g.status()["mqtt"]["ingest"][0]
            return doc

        wait_until(lambda: ingest()["blocked"], 60, "the ingest to stop on a full journal")
        st = ingest()
        assert st["state"] == "blocked"
        assert "journal" in st["blocked"]
        assert st["acked"] < total
        import httpx

        assert 'edgegw_mqtt_blocked{bridge="telemetry"} 1.0' in httpx.get(f"{g.url}/metrics").text
        fleet.proxies["a"].set_mode("pass")
        wait_until(lambda: ingest()["acked"] >= total, 120, "the ingest to drain", interval=0.2)
        assert ingest()["blocked"] is None
        # Every message reached b's mirror through the bucket, none twice.
        fleet.wait_converged(120)
        values = [r.value[:6] for r in _records(fleet["b"], "a.telemetry", 2)]
        assert sorted(values) == [f"{i:06d}".encode() for i in range(total)]
    finally:
        device.close()
        fleet.close()


def test_retained_messages_are_journaled_once_and_marked(tmp_path: Path, broker: Mosquitto) -> None:
    """The documented choice (docs/mqtt.md, "Retained messages"): a filter's retained
    messages come when its subscription is new, marked ``mqtt-retain: 1``; a restart
    of the gateway (the session persists) does not journal them again."""
    from _mqtt_support import mqtt_client

    setter = mqtt_client(broker.port)
    try:  # a setpoint retained before the gateway ever subscribed
        setter.publish("config/line1/setpoint", b"42", qos=1, retain=True).wait_for_publish(30)
    finally:
        setter.disconnect()
        setter.loop_stop()
    fleet = _fleet(tmp_path, ["a"], [TopicSpec("settings", "a", partitions=1)])
    g = fleet["a"]
    _with_mqtt(g, mqtt_tables("ingest", port=broker.port, filters=["config/#"], topic="settings"))
    fleet.start()
    device = Device(broker.port)
    try:
        wait_until(lambda: _count(g, "settings") >= 1, 60, "the retained setpoint")
        [retained] = _records(g, "settings", 1)
        assert (retained.key, retained.value) == (b"config/line1/setpoint", b"42")
        assert ("mqtt-retain", b"1") in retained.headers
        assert g.status()["mqtt"]["ingest"][0]["retained"] == 1
        g.stop()
        g.start()  # the same session: the subscription is not new
        wait_until(lambda: g.status()["mqtt"]["ingest"][0]["connected"], 30, "ingest connected")
        device.publish("config/line1/mode", b"auto")
        device.wait_acked(1)
        wait_until(lambda: _count(g, "settings") >= 2, 60, "the live message")
        recs = _records(g, "settings", 1)
        assert [(r.key, r.value) for r in recs] == [
            (b"config/line1/setpoint", b"42"),
            (b"config/line1/mode", b"auto"),
        ]
        assert ("mqtt-retain", b"1") not in recs[1].headers
    finally:
        device.close()
        fleet.close()


class _SessionSubscriber:
    """A subscriber with a persistent session (clean_start false, one hour's
    expiry): what it missed while the broker restarted is kept for it."""

    def __init__(self, port: int, pattern: str) -> None:
        import threading

        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self._lock = threading.Lock()
        self.got: list[tuple[str, bytes]] = []
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id="persistent-sub", protocol=mqtt.MQTTv5
        )
        self.client.reconnect_delay_set(0.1, 1)

        def on_message(_c: Any, _u: Any, msg: Any) -> None:
            with self._lock:
                self.got.append((msg.topic, bytes(msg.payload)))

        subscribed = threading.Event()
        self.client.on_message = on_message
        self.client.on_subscribe = lambda *a: subscribed.set()
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect("127.0.0.1", port, clean_start=False, properties=props)
        self.client.loop_start()
        self.client.subscribe(pattern, qos=1)
        assert subscribed.wait(10), "subscribe not acknowledged"

    def values(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self.got)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_publish_goes_on_across_a_broker_restart(tmp_path: Path, broker: Mosquitto) -> None:
    """The broker restarts mid-stream: the round it broke is published again after
    the reconnect, nothing is skipped, and the group's offsets end at the head."""
    fleet = _fleet(tmp_path, ["a"], [TopicSpec("cmds", "a", partitions=1)])
    g = fleet["a"]
    _with_mqtt(
        g,
        mqtt_tables(
            "publish", name="out", port=broker.port, topics=["cmds"], template="site/{topic}/{key}"
        ),
    )
    fleet.start()
    sub = _SessionSubscriber(broker.port, "site/#")
    try:
        with g.client() as c:  # about three seconds of publishing
            for i in range(0, 20_000, 500):
                c.produce("cmds", [{"key": "k", "value": f"v{j}"} for j in range(i, i + 500)])
        wait_until(lambda: len(sub.values()) > 300, 60, "publishing under way", interval=0.01)
        broker.restart()
        assert len(sub.values()) < 20_000, "published everything before the restart"
        wait_until(
            lambda: g.status()["mqtt"]["publish"][0]["connects"] >= 2, 60, "the publish reconnect"
        )
        with g.client() as c:  # and after it
            c.produce("cmds", [{"key": "k", "value": f"v{j}"} for j in range(20_000, 21_000)])
        want = [f"v{j}".encode() for j in range(21_000)]
        wait_until(lambda: set(want) <= {v for _, v in sub.values()}, 120, "every record published")
        wait_until(
            lambda: g.status()["mqtt"]["publish"][0]["lag_records"] == 0, 60, "lag 0", interval=0.2
        )
        # In offset order, a repeated round aside: first occurrences are sorted.
        seen: set[int] = set()
        firsts = []
        for _, v in sub.values():
            if int(v[1:]) not in seen:
                seen.add(int(v[1:]))
                firsts.append(int(v[1:]))
        assert firsts == sorted(firsts)
        with g.client() as c:
            committed = {o.partition: o.offset for o in c.fetch_offsets("mqtt-publish-out")}
        assert committed == dict(enumerate(g.next_offsets("cmds")))
    finally:
        sub.close()
        fleet.close()


@pytest.mark.parametrize("max_inflight", [None, 20], ids=["receive-max-default", "receive-max-20"])
def test_queued_session_burst_after_connect_is_acked_once(
    tmp_path: Path, max_inflight: int | None
) -> None:
    """Issue 41 (2): the gateway restarts to a persistent session that holds
    queued messages, and the broker sends them in a burst right after CONNACK,
    before trio has run anything of the new connection. Every one is PUBACKed,
    journaled exactly once, and none comes again on a later reconnect.

    The broker keeps mosquitto's default inflight window (20); the gateway asks
    for its own in CONNECT (MQTT 5 receive maximum: the ingest's
    ``max_inflight``, 1000 by default), which mosquitto 2.0 applies. Either
    way a message stamped with the previous connection was never acked
    (before the fix: "messages_in 3000, acked 2970"), stayed in flight, and
    would come again on the next connection; 20 of them (the window, with
    ``max_inflight = 20``) stop the session's delivery altogether."""
    broker = Mosquitto(tmp_path / "mosq", max_inflight_messages=None)
    assert "max_inflight_messages" not in broker.conf.read_text()  # mosquitto's default: 20
    fleet = _fleet(tmp_path, ["a"], [TopicSpec("telemetry", "a", partitions=2)])
    g = fleet["a"]
    extra = {} if max_inflight is None else {"max_inflight": max_inflight}
    _with_mqtt(
        g,
        mqtt_tables("ingest", port=broker.port, filters=["dev/#"], topic="telemetry", **extra),
    )
    device = None

    def ingest() -> dict[str, Any]:
        doc: dict[str, Any] = g.status()["mqtt"]["ingest"][0]
        return doc

    def queued_values() -> collections.Counter[bytes]:
        return collections.Counter(
            r.value for r in _records(g, "telemetry", 2) if r.value.startswith(b"q-")
        )

    try:
        fleet.start()
        device = Device(broker.port)
        # The first start makes the session and its subscription. A warm-up
        # message journaled proves it live (those published before it are
        # dropped by the broker or journaled before it); once it is acked,
        # nothing of this first run is left for the broker to send again.
        warm = iter(range(1_000_000))

        def subscription_live() -> bool:
            value = f"warm-{next(warm)}".encode()
            device.publish("dev/warm", value)
            try:
                wait_until(lambda: value in _values(g, "telemetry", 2), 1, "the warm-up")
            except AssertionError:
                return False
            return True

        wait_until(subscription_live, 30, "the subscription to be live", interval=0)
        wait_until(
            lambda: (st := ingest())["acked"] == st["messages_in"], 10, "the warm-up's PUBACK"
        )
        g.stop()
        total = 3000
        base = len(device.acked)
        for i in range(total):
            device.publish(f"dev/{i % 16}", f"q-{i:05d}".encode())
        device.wait_acked(base + total)  # all queued by the broker for the gateway's session
        g.start()
        try:
            wait_until(
                lambda: ingest()["acked"] >= total,
                60,
                "every queued message PUBACKed",
                interval=0.2,
            )
        except AssertionError as exc:
            st = ingest()
            raise AssertionError(
                f"{exc}: messages_in {st['messages_in']}, acked {st['acked']}, "
                f"journaled {sum(queued_values().values())} of {total}"
            ) from None
        st = ingest()
        assert st["acked"] == st["messages_in"] == total
        assert st["redeliveries"] == 0
        want = collections.Counter({f"q-{i:05d}".encode(): 1 for i in range(total)})
        assert queued_values() == want  # each journaled exactly once

        # A later reconnect (the same session): nothing was left unacknowledged,
        # so the broker redelivers nothing; a live message comes through after it.
        g.stop()
        g.start()
        wait_until(lambda: ingest()["connected"], 30, "the ingest to reconnect")
        device.publish("dev/after", b"after-reconnect")
        wait_until(
            lambda: any(r.value == b"after-reconnect" for r in _records(g, "telemetry", 2)),
            30,
            "the live message after the reconnect",
        )
        st = ingest()
        assert (st["messages_in"], st["acked"], st["redeliveries"]) == (1, 1, 0)
        assert queued_values() == want
        recs = _records(g, "telemetry", 2)
        assert max(collections.Counter(r.value for r in recs).values()) == 1
        assert not [r for r in recs if ("mqtt-dup", b"1") in r.headers]
    finally:
        if device is not None:
            device.close()
        fleet.close()
        broker.stop()
