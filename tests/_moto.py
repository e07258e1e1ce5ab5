"""moto's standalone S3 server as a subprocess, for integration tests.

The S3 backend is tested over real HTTP against ``moto.server`` (never an
in-process patch of boto3), so the requests, headers and error bodies that
botocore sees are those of a server.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
from pathlib import Path

#: Dummy credentials: moto accepts any, boto3 insists on having some.
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class MotoServer:
    """A running ``moto.server`` process; :meth:`stop` ends it."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.process = process
        self.port = port
        self.log_path = log_path
        self.endpoint = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        """Terminate the server and reap it (kill if it does not exit in 5 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _answers(port: int) -> bool:
    # http.client rather than urllib: no proxy settings can get in the way.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", "/")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def start_moto_server(log_path: Path, *, timeout: float = 30.0) -> MotoServer:
    """Start ``python -m moto.server`` on a free loopback port; return once it answers.

    The port is picked before the server binds it, so another process could
    take it in between; the server then exits at once and we try another.
    """
    last_error = "not started"
    for _ in range(3):
        port = free_port()
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        server = MotoServer(process, port, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                last_error = f"exited with status {process.returncode}"
                break
            if _answers(port):
                return server
            time.sleep(0.05)
        else:
            last_error = f"did not answer within {timeout} s"
        server.stop()
    raise RuntimeError(f"moto server {last_error}; see {log_path}")
