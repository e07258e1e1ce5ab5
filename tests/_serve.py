"""A real `edgegw serve` process for tests (the address comes from its api.addr file)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from edge_gateway.config import load_config

EDGEGW = Path(sys.executable).parent / "edgegw"


def write_config(tmp_path: Path, **journal: object) -> Path:
    extra = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in journal.items())
    path = tmp_path / "edgegw.toml"
    path.write_text(
        f"""
region = "north"
data_dir = "{tmp_path / "data"}"
shutdown_grace_s = 20.0
[journal]
{extra}
[shipper]
flush_interval_ms = 50
[api]
listen = "127.0.0.1:0"
[[topics]]
name = "t"
home = "north"
partitions = 3
"""
    )
    return path


class Server:
    def __init__(self, config: Path) -> None:
        self.addr_file = load_config(config, env={}).data_dir / "api.addr"
        self.addr_file.unlink(missing_ok=True)
        # A file, not a pipe: a chatty server must never block on a full pipe.
        self.log = config.parent / "serve.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(EDGEGW), "serve", "--config", str(config)],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while not self.addr_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"serve did not start: {self.log.read_text()}")
            time.sleep(0.05)
        self.url = f"http://{self.addr_file.read_text().strip()}"

    def stop(self, sig: int) -> tuple[int, str]:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        return code, self.log.read_text()
