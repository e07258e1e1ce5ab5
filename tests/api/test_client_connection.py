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
from typing import Any

import h11
import pytest
from _api_support import gateway_thread, make_config
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_gateway.client import Client, _BadResponse, _ResponseParser
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


# ------------------------------------------------ the response parser (sans-IO)


def _parse(data: bytes, *, step: int = 0, head_only: bool = False, eof: bool = False) -> Any:
    """Feed ``data`` whole (step 0) or ``step`` bytes at a time; then EOF if ``eof``."""
    parser = _ResponseParser(head_only=head_only)
    parts = [data] if step == 0 else [data[i : i + step] for i in range(0, len(data), step)]
    done = False
    for part in parts:
        assert not done, "complete before the last byte"
        done = parser.feed(part)
    if eof:
        done = parser.feed(b"")
    assert done
    return parser


@pytest.mark.parametrize("step", [0, 1, 7])
def test_parser_content_length(step: int) -> None:
    p = _parse(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-A: 1\r\nx-a: 2\r\n"
        b'Content-Length: 11\r\n\r\n{"ok":true}',
        step=step,
    )
    assert (p.status, p.body, p.keep_alive) == (200, b'{"ok":true}', True)
    assert p.headers["content-type"] == "application/json"
    assert p.headers["x-a"] == "1"  # the first of repeated headers


@pytest.mark.parametrize("step", [0, 1, 5])
def test_parser_chunked_with_extensions_and_trailers(step: int) -> None:
    p = _parse(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n",
        step=step,
    )
    assert p.body == b"hello 0123456789"
    assert p.keep_alive


def test_parser_interim_responses_bodyless_and_close() -> None:
    p = _parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nX: y\r\n\r\n")
    assert (p.status, p.body, p.headers) == (204, b"", {"x": "y"})
    head = _parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", head_only=True)
    assert head.body == b""
    closing = _parse(
        b"HTTP/1.1 503 x\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n"
    )
    assert (closing.status, closing.keep_alive) == (503, False)
    old = _parse(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi")
    assert (old.body, old.keep_alive) == (b"hi", False)
    # No length: the body runs to the end of the connection, which is then closed.
    until_eof = _parse(b"HTTP/1.1 200 OK\r\n\r\nall of it", eof=True)
    assert (until_eof.body, until_eof.keep_alive) == (b"all of it", False)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"HTTP/2 200 OK\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 2x0 OK\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 200OK\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "bad header line"),
        (b"HTTP/1.1 200 OK\r\n name: v\r\n\r\n", "bad header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad content-length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n", "bad content-length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported transfer-encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "not followed by CRLF"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab", "bytes after the end"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000, "response head too long"),
    ],
)
def test_parser_refuses_malformed_responses(data: bytes, message: str) -> None:
    with pytest.raises(_BadResponse, match=message):
        _ResponseParser().feed(data)


def test_parser_eof_mid_response() -> None:
    for data in (b"", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"):
        parser = _ResponseParser()
        if data:
            assert not parser.feed(data)
        with pytest.raises(_BadResponse, match="closed the connection mid-response"):
            parser.feed(b"")


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


@settings(max_examples=200, deadline=None)
@given(
    status=st.sampled_from([200, 201, 204, 400, 404, 409, 503]),
    headers=st.lists(
        st.tuples(
            st.from_regex(r"x-[a-z]{1,8}", fullmatch=True),
            st.from_regex(r"[!-~]([ -~]{0,20}[!-~])?", fullmatch=True),
        ),
        max_size=5,
    ),
    chunks=st.lists(st.binary(min_size=1, max_size=300), max_size=4),
    chunked=st.booleans(),
    cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=20),
)
def test_parser_reads_what_h11_writes(
    status: int,
    headers: list[tuple[str, str]],
    chunks: list[bytes],
    chunked: bool,
    cuts: list[int],
) -> None:
    """Whatever h11 (the server side's reference) writes, the parser reads the same."""
    body = b"" if status == 204 else b"".join(chunks)
    framing = (
        []
        if status == 204
        else (
            [("transfer-encoding", "chunked")] if chunked else [("content-length", str(len(body)))]
        )
    )
    server = h11.Connection(h11.SERVER)
    server.receive_data(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    server.next_event()
    server.next_event()
    wire = server.send(h11.Response(status_code=status, headers=[*headers, *framing]))
    assert wire is not None
    if status != 204:
        for chunk in chunks:
            wire += server.send(h11.Data(data=chunk)) or b""
    wire += server.send(h11.EndOfMessage()) or b""
    parser = _ResponseParser()
    pos, done = 0, False
    for cut in [*cuts, len(wire)]:
        if pos >= len(wire):
            break
        assert not done
        done = parser.feed(wire[pos : pos + cut])
        pos += cut
    assert done
    assert parser.status == status
    assert parser.body == body
    assert parser.keep_alive
    expected: dict[str, str] = {}
    for name, value in [*headers, *framing]:
        expected.setdefault(name, value)
    for name, value in expected.items():
        assert parser.headers[name] == value
