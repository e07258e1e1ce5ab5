"""mosquitto (the Debian package) as a subprocess, for the MQTT bridge's tests and benchmark.

:class:`Mosquitto` starts ``mosquitto`` on a free loopback port with a
generated config: listener on 127.0.0.1 only, persistence on (a persistent
session and the messages queued for it survive a broker restart), and no limit
on what is queued for a session that is away (mosquitto's default keeps 1000
and drops the rest), and no limit on the messages in flight to a client
(``max_inflight_messages 0``) unless the caller keeps mosquitto's default
(``max_inflight_messages=None``: 20). ``make mosquitto`` installs the binary; :data:`BINARY`
is None when it is absent (tests skip, saying so).
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from edge_gateway.testing.ports import free_port

__all__ = ["BINARY", "Mosquitto", "free_port"]

BINARY: str | None = shutil.which("mosquitto") or (
    "/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None
)


class Mosquitto:
    """One broker process; :meth:`restart` keeps its port and persistence file."""

    def __init__(
        self,
        root: Path,
        *,
        password_file: Path | None = None,
        max_inflight_messages: int | None = 0,
    ) -> None:
        if BINARY is None:
            raise RuntimeError("mosquitto is not installed (make mosquitto)")
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.port = free_port()
        self.log = root / "mosquitto.log"
        auth = (
            f"allow_anonymous false\npassword_file {password_file}\n"
            if password_file
            else "allow_anonymous true\n"
        )
        # None: no line, so mosquitto's own default (20) applies.
        inflight = (
            ""
            if max_inflight_messages is None
            else f"max_inflight_messages {max_inflight_messages}\n"
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
            "max_queued_messages 0\n"
            f"{inflight}"
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
                raise RuntimeError(f"mosquitto exited: {self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("mosquitto did not listen in 20 s") from None
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
