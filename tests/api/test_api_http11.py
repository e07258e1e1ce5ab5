"""The built-in HTTP/1.1 server, on raw sockets: framing, keep-alive, bad input, shutdown.

Also runs the main round trip through hypercorn (``serve_api(server="hypercorn")``).
"""

from __future__ import annotations

import functools
import json
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
import trio
from _api_support import make_config, quiesce, running, url_of

from edge_gateway.api import serve_api
from edge_gateway.client import AsyncClient
from edge_gateway.gateway import Gateway

ONE = b'{"records":[{"value":"x"}]}'


class Raw:
    """A socket to the API that reads whole responses (Content-Length framing only)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    @classmethod
    async def open(cls, gw: Gateway, stack: AsyncExitStack) -> Raw:
        addr = gw.api_address
        assert addr is not None
        stream = await trio.open_tcp_stream(*addr)
        stack.push_async_callback(stream.aclose)
        return cls(stream)

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def response(self, *, head: bool = False) -> tuple[int, dict[str, str], bytes]:
        with trio.fail_after(10):
            while b"\r\n\r\n" not in self.buf:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError(self.buf)
                self.buf += data
            top, _, rest = self.buf.partition(b"\r\n\r\n")
            lines = top.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            n = 0 if head else int(headers.get("content-length", "0"))
            while len(rest) < n:
                data = await self.stream.receive_some(65536)
                if not data:
                    break
                rest += data
            self.buf = rest[n:]
            return status, headers, rest[:n]

    async def closed(self) -> bool:
        """True once the server closed the connection (and sent nothing more)."""
        with trio.fail_after(10):
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                return True
            return data == b"" and self.buf == b""


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n" % (path.encode(), len(body))
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


async def test_keep_alive_pipelining_and_framing(tmp_path: Path) -> None:
    async with (
        running(make_config(tmp_path, api={"server": "builtin"})) as gw,
        AsyncExitStack() as stack,
    ):
        raw = await Raw.open(gw, stack)
        # three pipelined requests in one write, answered in order on one connection
        await raw.send(
            post("/v1/topics/t/records", ONE)
            + b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"
            + post("/v1/topics/t/records?ack=local", b'{"records":[{"value":"y","partition":2}]}')
        )
        s1, h1, b1 = await raw.response()
        s2, _, b2 = await raw.response()
        s3, _, b3 = await raw.response()
        assert (s1, s2, s3) == (200, 200, 200)
        assert h1["content-type"] == "application/json"
        assert json.loads(b1)["topic"] == "t", (h1, b1)
        assert json.loads(b2)["status"] == "ok"
        assert json.loads(b3)["offsets"][0]["partition"] == 2
        # a chunked request body
        await raw.send(
            b"POST /v1/topics/t/records HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n"
            b'5\r\n{"rec\r\n16\r\nords":[{"value":"z"}]}\r\n0\r\n\r\n'
        )
        status, _, body = await raw.response()
        assert status == 200, body
        # Expect: 100-continue: the interim response, then the answer
        await raw.send(
            b"POST /v1/topics/t/records HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(ONE)
        )
        status, _, _ = await raw.response()
        assert status == 100
        await raw.send(ONE)
        status, _, _ = await raw.response()
        assert status == 200
        # HEAD: headers, no body
        await raw.send(b"HEAD /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        status, headers, body = await raw.response(head=True)
        assert status == 200
        assert body == b""
        assert int(headers["content-length"]) > 0
        # still the same connection, still usable
        await raw.send(b"GET /v1/topics/t HTTP/1.1\r\nHost: gw\r\n\r\n")
        status, _, body = await raw.response()
        assert status == 200
        assert sum(p["next_offset"] for p in json.loads(body)["partitions"]) == 4
        # HTTP/1.0: answered, then closed
        raw10 = await Raw.open(gw, stack)
        await raw10.send(b"GET /healthz HTTP/1.0\r\n\r\n")
        status, _, _ = await raw10.response()
        assert status == 200
        assert await raw10.closed()


async def test_chunked_bodies_on_the_fast_path(tmp_path: Path) -> None:
    """Chunked bodies are decoded by the fast path (not h11): in pieces, with a
    request pipelined after them; a malformed one closes the connection."""
    async with (
        running(make_config(tmp_path, api={"server": "builtin"})) as gw,
        AsyncExitStack() as stack,
    ):
        raw = await Raw.open(gw, stack)
        head = (
            b"POST /v1/topics/t/records HTTP/1.1\r\nHost: gw\r\ntransfer-encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n"
        )
        await raw.send(head + b'5\r\n{"rec\r\n')
        await trio.sleep(0.05)  # the rest in another read, with a pipelined request
        await raw.send(
            b'16;ext\r\nords":[{"value":"z"}]}\r\n0\r\nX-Trailer: 1\r\n\r\n'
            b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n"
        )
        status, _, body = await raw.response()
        assert status == 200, body
        assert json.loads(body)["topic"] == "t"
        status, _, body = await raw.response()
        assert status == 200
        assert json.loads(body)["status"] == "ok"
        # a bad chunk end: no answer for a body never read whole, and the connection closes
        await raw.send(head + b'5\r\n{"recXX')
        assert await raw.closed()


async def test_malformed_requests(tmp_path: Path) -> None:
    async with (
        running(make_config(tmp_path, api={"server": "builtin"})) as gw,
        AsyncExitStack() as stack,
    ):
        for junk in (
            b"this is not http\r\n\r\n",
            b"GET / HTTP/1.1\r\nbad header line\r\n\r\n",
            b"POST /v1/topics/t/records HTTP/1.1\r\nHost: gw\r\nContent-Length: nope\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\nHost: gw\r\nHost: two\r\n\r\n",
        ):
            raw = await Raw.open(gw, stack)
            await raw.send(junk)
            status, headers, body = await raw.response()
            assert status == 400, (junk, body)
            assert headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "invalid_request"
            assert await raw.closed()
        # a request head that keeps growing past 16 KiB: 431
        raw = await Raw.open(gw, stack)
        big = b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Big: "
        # one byte over the limit, so the server has read everything when it refuses
        await raw.send(big + b"a" * (16 * 1024 + 1 - len(big)))
        status, _, body = await raw.response()
        assert status == 431
        assert json.loads(body)["error"]["code"] == "headers_too_large"
        # a client that goes away mid-body does not disturb the server
        raw = await Raw.open(gw, stack)
        await raw.send(post("/v1/topics/t/records", ONE)[:-5])
        await raw.stream.aclose()
        async with httpx.AsyncClient(base_url=url_of(gw)) as http:
            assert (await http.get("/healthz")).status_code == 200
            r = await http.get("/v1/topics/t")
            assert sum(p["next_offset"] for p in r.json()["partitions"]) == 0


def _head_of(size: int, *extra: bytes) -> bytes:
    """A GET /healthz head (request line, headers, blank line) of exactly ``size`` bytes."""
    start = b"GET /healthz HTTP/1.1\r\nHost: gw\r\n" + b"".join(h + b"\r\n" for h in extra)
    pad = size - len(start) - len(b"X-Pad: \r\n\r\n")
    head = start + b"X-Pad: " + b"p" * pad + b"\r\n\r\n"
    assert len(head) == size
    return head


@pytest.mark.parametrize("server", ["builtin", "hypercorn"])
async def test_request_heads_are_limited_to_16_kib_however_they_arrive(
    tmp_path: Path, server: str
) -> None:
    # Issue 41, item 9: docs/api.md says heads over 16 KiB get 431, but the
    # builtin server took a whole head of up to 64 KiB that arrived in one read
    # (h11 bounds only a head still arriving). 16 KiB is the limit h11, Node.js
    # and hypercorn default to; a local API's heads are a few hundred bytes.
    async with (
        running(make_config(tmp_path, api={"server": server})) as gw,
        AsyncExitStack() as stack,
    ):
        # The fast path, and h11's (a Connection header goes there).
        for extra in ((), (b"Connection: keep-alive",)):
            raw = await Raw.open(gw, stack)
            await raw.send(_head_of(16 * 1024, *extra))
            status, _, _ = await raw.response()
            assert status == 200, extra
            for size in (16 * 1024 + 1, 60 * 1024):
                raw = await Raw.open(gw, stack)
                await raw.send(_head_of(size, *extra))
                status, headers, body = await raw.response()
                assert status == 431, (size, extra)
                assert json.loads(body)["error"]["code"] == "headers_too_large"
                assert headers["connection"] == "close"


async def test_shutdown_closes_idle_connections_and_finishes_requests(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, api={"server": "builtin"})
    async with running(cfg) as gw, AsyncExitStack() as stack:
        idle = await Raw.open(gw, stack)
        await idle.send(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert (await idle.response())[0] == 200
        # a request whose body is still on its way when the shutdown starts
        busy = await Raw.open(gw, stack)
        request = post("/v1/topics/t/records", ONE)
        await busy.send(request[:-3])
        await trio.sleep(0.1)
        gw.request_shutdown()
        await trio.sleep(0.1)
        await busy.send(request[-3:])
        status, headers, body = await busy.response()
        # it was answered (refused: the gateway no longer accepts), and told to close
        assert status == 503, body
        assert json.loads(body)["error"]["code"] == "unavailable"
        assert headers["connection"] == "close"
        assert await idle.closed()
        assert await busy.closed()


async def test_hypercorn_server_option(tmp_path: Path) -> None:
    """serve_api(server="hypercorn") serves the same app (kept as an alternative)."""
    gw = Gateway(make_config(tmp_path, api={"server": "builtin"}))
    gw.add_service("api", functools.partial(serve_api, server="hypercorn"))
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        try:
            async with AsyncClient(url_of(gw)) as client:
                res = await client.produce("t", ["via hypercorn"], partition=0)
                page = await client.fetch("t", 0, res.offsets[0])
                assert page.records[0].value == b"via hypercorn"
                assert (await client.status())["region"] == "north"
            async with httpx.AsyncClient(base_url=url_of(gw)) as http:
                r = await http.post(
                    "/v1/topics/t/records",
                    content=b"{",
                    headers={"content-type": "application/json"},
                )
                assert r.status_code == 400
                assert r.json()["error"]["code"] == "invalid_request"
            await quiesce(gw)
        finally:
            gw.request_shutdown()
    assert not (tmp_path / "data" / "api.addr").exists()
