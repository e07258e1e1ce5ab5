"""Azurite (Azure Blob Storage) and gcp-storage-emulator (GCS) as subprocesses, for
integration tests and benchmarks.

Azurite comes from npm (``make azurite`` installs it into ``.tools/azurite``;
an ``azurite-blob`` on PATH also works); its tests skip, saying why, only
when node is missing. gcp-storage-emulator is a PyPI test dependency. Both
start in about a second on a free loopback port, in memory or in a scratch
directory, and :meth:`Emulator.stop` ends exactly the process started.
"""

from __future__ import annotations

import http.client
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from edge_gateway.testing.ports import free_port

#: The checkout: ``make azurite`` installs Azurite under it.
ROOT: Final = Path(__file__).resolve().parents[2]
AZURITE_BIN: Final = ROOT / ".tools" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
#: Azurite's well-known development account (public, documented by Microsoft).
AZURITE_ACCOUNT: Final = "devstoreaccount1"
AZURITE_KEY: Final = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@dataclass
class Emulator:
    """A running emulator process; ``endpoint`` is its base URL."""

    process: subprocess.Popen[bytes]
    endpoint: str
    log_path: Path

    def stop(self) -> None:
        """Terminate and reap (kill after 5 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def azurite_command() -> str | None:
    """The ``azurite-blob`` to run, or ``None`` when it is not installed."""
    if AZURITE_BIN.exists():
        return str(AZURITE_BIN)
    return shutil.which("azurite-blob")


def azurite_missing_reason() -> str | None:
    """Why Azurite cannot run here (``None``: it can)."""
    if shutil.which("node") is None:
        return "node is not installed: the Azure Blob tests need Azurite (npm package azurite)"
    return None


def _wait_answering(process: subprocess.Popen[bytes], port: int, path: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"emulator exited with {process.returncode}: {log.read_text()}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", path)
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.1)
        finally:
            conn.close()
    process.kill()
    process.wait()
    raise RuntimeError(f"emulator did not answer on port {port} within 30 s: {log.read_text()}")


def start_azurite(root: Path) -> Emulator:
    """Start ``azurite-blob`` on a free loopback port with its data under ``root``."""
    command = azurite_command()
    if command is None:
        raise RuntimeError(
            "Azurite is not installed: run `make azurite` (npm install --prefix .tools/azurite "
            "azurite@3)"
        )
    port = free_port()
    log = root / "azurite.log"
    argv = [
        command,
        "--blobHost",
        "127.0.0.1",
        "--blobPort",
        str(port),
        "--location",
        str(root / "data"),
        "--skipApiVersionCheck",
        "--loose",
        "--disableTelemetry",
        "--silent",
    ]
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    _wait_answering(process, port, f"/{AZURITE_ACCOUNT}?comp=list", log)
    return Emulator(process, f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}", log)


def azurite_connection_string(endpoint: str) -> str:
    """The connection string of Azurite's development account at ``endpoint``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
        f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
    )


def start_gcs_emulator(root: Path) -> Emulator:
    """Start gcp-storage-emulator (in memory) on a free loopback port."""
    port = free_port()
    log = root / "gcs-emulator.log"
    argv = [
        sys.executable,
        "-c",
        "from gcp_storage_emulator.__main__ import main; main()",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--in-memory",
    ]
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    _wait_answering(process, port, "/storage/v1/b", log)
    return Emulator(process, f"http://127.0.0.1:{port}", log)
