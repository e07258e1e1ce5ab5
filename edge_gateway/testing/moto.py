"""moto's standalone S3 server as a subprocess, for integration tests and benchmarks.

The S3 backend is tested over real HTTP against ``moto.server`` (never an
in-process patch of boto3), so the requests, headers and error bodies that
botocore sees are those of a server. moto itself is a test dependency
(``pip install 'moto[server]'``); this module only starts it as
``python -m moto.server`` and does not import it.

The server writes one line per request to its log file (werkzeug's access
log); :meth:`MotoServer.requests` parses those lines, so a benchmark can
count the requests a component really sent, retries and multipart parts
included::

    server = start_moto_server(Path("moto.log"))
    mark = server.log_position()
    ...                                   # run the component
    writes = [r for r in server.requests(since=mark) if r.is_write]
    server.stop()
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final, Self
from urllib.parse import unquote, urlsplit

from edge_gateway.testing.ports import free_port

#: Dummy credentials: moto accepts any, boto3 insists on having some.
ACCESS_KEY: Final = "testing"
SECRET_KEY: Final = "testing"  # noqa: S105 (moto accepts any)
REGION: Final = "us-east-1"

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client


def s3_client(endpoint: str) -> S3Client:
    """A plain boto3 client on a moto server (or a proxy in front of one), path-style."""
    import boto3
    import botocore.config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=botocore.config.Config(s3={"addressing_style": "path"}),
    )


# werkzeug's access log line; some lines are coloured with ANSI escapes.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_REQUEST_LINE = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d{3}) ')


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """One request as the server logged it (path-style addressing assumed)."""

    method: str
    #: The decoded path without the query string: ``/bucket/key``.
    path: str
    query: str
    status: int

    @property
    def bucket(self) -> str:
        """The bucket the request addressed ("" for service-level requests)."""
        return self.path.lstrip("/").partition("/")[0]

    @property
    def key(self) -> str:
        """The object key ("" for bucket-level requests)."""
        return self.path.lstrip("/").partition("/")[2]

    @property
    def is_write(self) -> bool:
        """A request that writes or deletes: PUT (objects, parts), POST (multipart), DELETE."""
        return self.method in ("PUT", "POST", "DELETE")


def parse_request_line(line: str) -> LoggedRequest | None:
    """The request in one access-log line, or None for any other line."""
    match = _REQUEST_LINE.search(_ANSI.sub("", line))
    if match is None:
        return None
    method, target, status = match.groups()
    parts = urlsplit(target)
    return LoggedRequest(method, unquote(parts.path), parts.query, int(status))


class MotoServer:
    """A running ``moto.server`` process; :meth:`stop` (or leaving ``with``) ends it."""

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

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def log_position(self) -> int:
        """The current end of the log file: pass it to :meth:`requests` as ``since``."""
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def requests(self, *, since: int = 0, until: int | None = None) -> list[LoggedRequest]:
        """Requests logged between two :meth:`log_position` marks, oldest first.

        The server logs a request after answering it, so give it a moment
        (a few ms) after the last response before reading.
        """
        with self.log_path.open("rb") as fh:
            fh.seek(since)
            data = fh.read() if until is None else fh.read(max(0, until - since))
        out = []
        for raw in data.decode("utf-8", "replace").splitlines():
            request = parse_request_line(raw)
            if request is not None:
                out.append(request)
        return out


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


def start_moto_server(
    log_path: Path,
    *,
    timeout: float = 30.0,
    env: Mapping[str, str] | None = None,
    command: Callable[[int], list[str]] | None = None,
) -> MotoServer:
    """Start ``python -m moto.server`` on a free loopback port; return once it answers.

    The port is picked before the server binds it, so another process could
    take it in between; the server then exits at once and we try another.
    The server's output (its access log) goes to ``log_path``. ``env`` adds
    to the server's environment: ``INITIAL_NO_AUTH_ACTION_COUNT=N`` makes it
    enforce authentication after N requests (see :func:`start_auth_moto_server`).
    ``command(port)`` replaces the command line (a wrapper around moto's
    application that serves on ``127.0.0.1:port``, as tests/_quirky_s3.py).
    """
    last_error = "not started"
    for _ in range(3):
        port = free_port()
        with log_path.open("ab") as log:
            argv = (
                command(port)
                if command is not None
                else [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
            )
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env} if env else None,
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
