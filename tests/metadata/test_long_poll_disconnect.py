"""A held ``GET /v1/heads`` whose client hangs up is dropped at once, not held until wait_ms.

A real server process (its ``/healthz`` counts the held polls); clients on raw
sockets, so that a hang-up is exactly a closed socket.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
from _meta_support import ADMIN_TOKEN, MetaServer, admin, http

STORES = ("sqlite", "postgres")


def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def _held(url: str) -> int:
    with http(url, None) as c:
        return int(c.get("/healthz").json()["long_polls"])


@pytest.fixture
def polls(server: MetaServer) -> Iterator[Callable[[], socket.socket]]:
    """Opens a raw connection holding a heads poll of region ``north`` (60 s)."""
    admin(server.url, "POST", "/v1/regions", {"id": "north"})
    version = admin(server.url, "GET", "/v1/heads?since=0")["version"]
    parts = urlsplit(server.url)
    opened: list[socket.socket] = []

    def open_poll() -> socket.socket:
        assert parts.hostname is not None
        assert parts.port is not None
        s = socket.create_connection((parts.hostname, parts.port), timeout=30)
        opened.append(s)
        s.sendall(
            f"GET /v1/heads?since={version}&regions=north&wait_ms=60000 HTTP/1.1\r\n"
            f"Host: meta\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n".encode()
        )
        return s

    try:
        yield open_poll
    finally:
        for s in opened:
            s.close()


def test_a_poll_whose_client_hung_up_is_dropped(
    server: MetaServer, polls: Callable[[], socket.socket]
) -> None:
    staying, leaving = polls(), polls()
    _until(lambda: _held(server.url) == 2, "two held polls")
    leaving.close()
    # Long before its 60 s wait_ms: the server noticed the hang-up.
    _until(lambda: _held(server.url) == 1, "the hung-up poll to be dropped")
    # The poll whose client stayed is still held, and answered when the head moves.
    admin(server.url, "POST", "/v1/regions/north/head", {"seq": 5})
    answer = b""
    while b'"heads"' not in answer or not answer.endswith(b"}"):
        data = staying.recv(65536)
        assert data, answer
        answer += data
    assert answer.startswith(b"HTTP/1.1 200")
    assert b'"north":5' in answer.replace(b" ", b"")
    _until(lambda: _held(server.url) == 0, "no held polls")
