"""The sync client's own HTTP/1.1 connection (``edge_gateway.client._Connection``).

Against a real gateway (its API in a thread): one keep-alive connection is
reused; a connection the server closed while idle is noticed before it is
reused (no request is lost on it, nothing is sent twice); a refused
connection and a gateway that goes away are :class:`Unavailable`; error
responses carry the request's method and URL in their note.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from _api_support import gateway_thread, make_config

from edge_gateway.client import Client
from edge_gateway.errors import Unavailable, UnknownTopic


def test_one_connection_is_reused_and_a_closed_one_replaced(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, api={"listen": "127.0.0.1:0", "keep_alive_timeout_s": 1.0})
    with gateway_thread(cfg) as g, Client(g.url) as client:
        first = client.produce("t", b"a", partition=0)
        conn = client._conn
        assert conn is not None
        sock = conn._sock
        assert client.produce("t", b"b", partition=0).offsets == [first.offsets[0] + 1]
        assert conn._sock is sock  # kept alive
        # The server closes the idle connection after its keep-alive timeout;
        # the next request goes out on a new one and lands exactly once.
        time.sleep(2.5)
        assert client.produce("t", b"c", partition=0).offsets == [first.offsets[0] + 2]
        assert conn._sock is not sock
        page = client.fetch("t", 0, first.offsets[0])
        assert [r.value for r in page.records] == [b"a", b"b", b"c"]


def test_errors_name_the_request(tmp_path: Path) -> None:
    with gateway_thread(make_config(tmp_path)) as g, Client(g.url) as client:
        with pytest.raises(UnknownTopic) as info:
            client.topic("nope")
        assert f"HTTP 404 unknown_topic from GET {g.url}/v1/topics/nope" in info.value.__notes__[0]
        assert client.healthy()  # the connection is still usable after an error


def test_refused_and_gone_are_unavailable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # retry_s: how long a produce retries (idempotently) before it raises
    with Client(f"http://127.0.0.1:{port}", timeout=5, retry_s=0.3) as client:
        with pytest.raises(Unavailable, match="cannot reach the gateway"):
            client.produce("t", b"x")
        assert not client.healthy()
    with gateway_thread(make_config(tmp_path)) as g:
        client = Client(g.url, timeout=5, retry_s=0.3)
        assert client.healthy()
    with pytest.raises(Unavailable):  # the gateway stopped: refused now
        client.produce("t", b"x")
    client.close()
