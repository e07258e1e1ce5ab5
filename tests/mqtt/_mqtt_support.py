"""A real mosquitto for the MQTT bridge tests, and MQTT devices (paho clients) to drive it.

:class:`Mosquitto` starts ``mosquitto`` (Debian package; ``make mosquitto``
installs it) on a free loopback port with a generated config: persistence on
(so a persistent session and its queued messages survive a broker restart),
listener on 127.0.0.1 only, no limit on the messages queued for a session
that is away. Tests skip, saying why, only when the binary is absent.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

BINARY = shutil.which("mosquitto") or (
    "/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None
)

needs_mosquitto = pytest.mark.skipif(
    BINARY is None,
    reason="mosquitto is not installed (make mosquitto, or apt-get install mosquitto)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Mosquitto:
    """One broker process; :meth:`restart` keeps its port and persistence file."""

    def __init__(self, root: Path, *, password_file: Path | None = None) -> None:
        assert BINARY is not None
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.port = free_port()
        self.log = root / "mosquitto.log"
        auth = (
            f"allow_anonymous false\npassword_file {password_file}\n"
            if password_file
            else "allow_anonymous true\n"
        )
        self.conf = root / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            # Started as root, mosquitto drops to user "mosquitto", which
            # could not write its persistence file here.
            f"user {getpass.getuser()}\n"
            f"{auth}"
            "persistence true\n"
            f"persistence_location {root}/\n"
            "autosave_interval 1\n"
            # Queue everything for a persistent session that is away (the
            # gateway killed): mosquitto's default (1000) drops the rest.
            "max_queued_messages 0\n"
            "max_inflight_messages 0\n"
            "log_type error\nlog_type warning\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        assert BINARY is not None
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [BINARY, "-c", str(self.conf)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"mosquitto exited: {self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("mosquitto did not listen in 20 s") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM: mosquitto saves its persistence file and exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


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
