"""A real ``edgegw serve`` with the Kafka listener on, for the Kafka tests.

:func:`kafka_gateway` writes a config (local directory bucket, the HTTP API
and the Kafka listener on free loopback ports), starts the process and
waits for both address files; :class:`KafkaGateway` knows the bootstrap
address and the HTTP API's URL.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from _serve import EDGEGW

from edge_gateway.client import read_addr_file

__all__ = ["KafkaGateway", "kafka_gateway"]


@dataclass
class KafkaGateway:
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log: Path
    bootstrap: str
    url: str

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


def _config(tmp_path: Path, region: str, topics: str, extra: str, extra_toml: str) -> Path:
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
listen = "127.0.0.1:0"
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
) -> Iterator[KafkaGateway]:
    """A running gateway with ``[kafka]`` on; stopped (SIGTERM) at the end."""
    config = _config(tmp_path, region, topics, extra, extra_toml)
    (tmp_path / "bucket").mkdir(exist_ok=True)
    data = tmp_path / region
    log = tmp_path / f"{region}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(EDGEGW), "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 60
        while not ((data / "kafka.addr").exists() and (data / "api.addr").exists()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"serve did not start: {log.read_text()}")
            time.sleep(0.05)
        bootstrap = (data / "kafka.addr").read_text().strip()
        yield KafkaGateway(proc, data, log, bootstrap, read_addr_file(data))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
