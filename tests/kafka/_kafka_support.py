"""A real ``edgegw serve`` with the Kafka listener on, for the Kafka tests.

:func:`kafka_gateway` writes a config (local directory bucket, the HTTP API
and the Kafka listener on loopback ports), starts the process and waits for
both address files; :class:`KafkaGateway` knows the bootstrap address and
the HTTP API's URL, and can be killed (-9) and started again on the same
Kafka port.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from _serve import EDGEGW

from edge_gateway.client import read_addr_file

__all__ = ["KafkaGateway", "kafka_gateway"]


class KafkaGateway:
    def __init__(
        self, config: Path, data_dir: Path, log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.env = env
        self.config = config
        self.data_dir = data_dir
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.bootstrap = ""
        self.url = ""

    def start(self) -> None:
        for name in ("kafka.addr", "api.addr"):
            (self.data_dir / name).unlink(missing_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [str(EDGEGW), "serve", "--config", str(self.config)],
                stdout=subprocess.DEVNULL,
                stderr=out,
                env={**os.environ, **self.env} if self.env else None,
            )
        deadline = time.monotonic() + 60
        data = self.data_dir
        while not ((data / "kafka.addr").exists() and (data / "api.addr").exists()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"serve did not start: {self.tail()}")
            time.sleep(0.05)
        self.bootstrap = (data / "kafka.addr").read_text().strip()
        self.url = read_addr_file(data)

    def kill(self) -> None:
        """kill -9: no flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM and wait (kill -9 after 30 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return 0 if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def get(self, path: str) -> Any:
        """GET ``path`` on the HTTP API: its JSON (or text for /metrics)."""
        with self.http() as c:
            r = c.get(path)
            r.raise_for_status()
            return r.text if path == "/metrics" else r.json()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _config(
    tmp_path: Path, region: str, topics: str, extra: str, extra_toml: str, listen: str
) -> Path:
    path = tmp_path / f"{region}.toml"
    path.write_text(
        f"""
region = "{region}"
data_dir = "{tmp_path / region}"
auto_create = true
default_partitions = 2
shutdown_grace_s = 10.0
[bucket]
path = "{tmp_path / "bucket"}"
[shipper]
flush_interval_ms = 50
[api]
listen = "127.0.0.1:0"
{extra_toml}
[kafka]
listen = "{listen}"
{extra}
{topics}
"""
    )
    return path


@contextmanager
def kafka_gateway(
    tmp_path: Path,
    region: str = "north",
    *,
    topics: str = "",
    extra: str = "",
    extra_toml: str = "",
    listen: str = "127.0.0.1:0",
    env: dict[str, str] | None = None,
) -> Iterator[KafkaGateway]:
    """A running gateway with ``[kafka]`` on; stopped (SIGTERM) at the end."""
    (tmp_path / "bucket").mkdir(exist_ok=True)
    config = _config(tmp_path, region, topics, extra, extra_toml, listen)
    gw = KafkaGateway(config, tmp_path / region, tmp_path / f"{region}.log", env)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()
