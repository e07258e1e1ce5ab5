"""The sync client's own HTTP/1.1 connection (``edge_gateway.client._Connection``).

Against a real gateway (its API in a thread): one keep-alive connection is
reused; a connection the server closed while idle is noticed before it is
reused (no request is lost on it, nothing is sent twice); a refused
connection and a gateway that goes away are :class:`Unavailable`; error
responses carry the request's method and URL in their note.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from _api_support import gateway_thread, make_config

from edge_gateway.client import Client
from edge_gateway.errors import InvalidInput, Unavailable, UnknownTopic


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


def test_header_values_with_line_breaks_are_refused() -> None:
    with pytest.raises(InvalidInput, match="CR, LF or NUL"):
        Client("http://127.0.0.1:9", token="abc\r\nX-Injected: 1")


def test_client_reads_chunked_and_close_delimited_responses() -> None:
    """The I/O shell against a server that answers chunked, then close-delimited."""
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        b'\r\n4\r\n{"a"\r\n3\r\n:1}\r\n0\r\n\r\n',
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"b":2}',
    ]
    requests: list[bytes] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(10)
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            conn.settimeout(10)
            with conn:
                for i, answer in enumerate(answers):
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    requests.append(data)
                    conn.sendall(answer)
                    if i == 1:
                        conn.shutdown(socket.SHUT_WR)  # the end of the body

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        with Client(f"http://127.0.0.1:{port}", timeout=10, token="tok") as client:
            assert client.status() == {"a": 1}
            sock = client._conn._sock if client._conn else None
            assert sock is not None  # kept alive after a chunked answer
            assert client.status() == {"b": 2}
            assert client._conn is not None
            assert client._conn._sock is None  # closed after it
        server.join(10)
    assert requests[0].startswith(b"GET /v1/status HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"\r\nauthorization: Bearer tok\r\n" in requests[0]


def _answering(answers: list[bytes]) -> tuple[int, threading.Thread]:
    """A raw server that sends each answer, in turn, to one request per connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(10)

    def serve() -> None:
        with listener:
            for answer in answers:
                conn, _ = listener.accept()
                conn.settimeout(10)
                with conn:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    conn.sendall(answer)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    return listener.getsockname()[1], server


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"",
    ],
)
def test_a_malformed_or_cut_response_is_unavailable_and_the_next_call_reconnects(
    answer: bytes,
) -> None:
    port, server = _answering([answer, b'HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{"b":2}'])
    with Client(f"http://127.0.0.1:{port}", timeout=10) as client:
        with pytest.raises(Unavailable, match="cannot reach the gateway"):
            client.status()
        assert client.status() == {"b": 2}
    server.join(10)
