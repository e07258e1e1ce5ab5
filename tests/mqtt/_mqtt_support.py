"""MQTT devices and subscribers (paho clients) for the MQTT bridge tests.

The broker is :class:`edge_gateway.testing.mosquitto.Mosquitto` (Debian's
mosquitto on a free loopback port); tests skip, saying why, only when the
binary is absent.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from edge_gateway.testing.mosquitto import BINARY, Mosquitto

__all__ = ["Device", "Mosquitto", "Subscriber", "mqtt_client", "needs_mosquitto"]

needs_mosquitto = pytest.mark.skipif(
    BINARY is None,
    reason="mosquitto is not installed (make mosquitto, or apt-get install mosquitto)",
)


def mqtt_client(port: int, client_id: str | None = None, **kwargs: Any) -> Any:
    """A connected paho client (MQTT 5) with its network thread running."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    c = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id or f"test-{uuid.uuid4().hex[:8]}",
        protocol=mqtt.MQTTv5,
        **kwargs,
    )
    c.max_inflight_messages_set(200)
    c.max_queued_messages_set(0)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


class Device:
    """A device publishing at QoS 1; remembers what the broker PUBACKed."""

    def __init__(self, port: int) -> None:
        self._lock = threading.Lock()
        self.sent: dict[int, tuple[str, bytes]] = {}
        self.acked: list[tuple[str, bytes]] = []
        self._early: set[int] = set()
        self.client = mqtt_client(port)

        def on_publish(_c: Any, _u: Any, mid: int, _rc: Any, _p: Any) -> None:
            with self._lock:
                if mid in self.sent:
                    self.acked.append(self.sent.pop(mid))
                else:
                    self._early.add(mid)

        self.client.on_publish = on_publish

    def publish(self, topic: str, payload: bytes, properties: Any = None) -> None:
        info = self.client.publish(topic, payload, qos=1, properties=properties)
        with self._lock:
            if info.mid in self._early:
                self._early.discard(info.mid)
                self.acked.append((topic, payload))
            else:
                self.sent[info.mid] = (topic, payload)

    def wait_acked(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < n:
            assert time.monotonic() < deadline, f"{len(self.acked)} of {n} PUBACKed"
            time.sleep(0.02)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Subscriber:
    """A plain QoS 1 subscriber collecting (topic, payload, user properties)."""

    def __init__(self, port: int, pattern: str) -> None:
        self._lock = threading.Lock()
        self.got: list[tuple[str, bytes, list[tuple[str, str]]]] = []
        self.client = mqtt_client(port)

        def on_message(_c: Any, _u: Any, msg: Any) -> None:
            props = list(getattr(msg.properties, "UserProperty", None) or [])
            with self._lock:
                self.got.append((msg.topic, bytes(msg.payload), props))

        self.client.on_message = on_message
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *a: subscribed.set()
        self.client.subscribe(pattern, qos=1)
        assert subscribed.wait(10), "subscribe not acknowledged"

    def wait_count(self, n: int, timeout: float = 60.0) -> list[tuple[str, bytes, list[Any]]]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if len(self.got) >= n:
                    return list(self.got)
            assert time.monotonic() < deadline, f"{len(self.got)} of {n} messages received"
            time.sleep(0.02)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def mqtt_tables(kind: str, **values: object) -> str:
    """A ``[[mqtt.<kind>]]`` table for a test config."""
    from _serve import _toml_value

    lines = [f"[[mqtt.{kind}]]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"
