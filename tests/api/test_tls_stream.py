"""TlsStream (edge_gateway/_tlsstream.py) against trio's own TLS client, over real sockets.

What the builtin server relies on: bytes arrive whole and in order both ways
(also when the socket takes a write only in part), one task may wait to
receive while another sends, an EOF with or without ``close_notify`` ends
the stream, ``aclose`` sends ``close_notify``, and a failed handshake sends
OpenSSL's alert so that the client learns why.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from edge_gateway._tlsstream import TlsStream
from edge_gateway.testing.tls import TlsFiles, make_tls_files

#: Every test is bounded (a hang is a failure, not a stuck run).
DEADLINE_S = 30


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("certs"), names=("127.0.0.1",))


def server_context(certs: TlsFiles, *, require_client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.cert, certs.key)
    if require_client_cert:
        ctx.load_verify_locations(cafile=str(certs.ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@asynccontextmanager
async def pair(
    certs: TlsFiles, server_ctx: ssl.SSLContext | None = None, *, handshake: bool = True
) -> AsyncIterator[tuple[TlsStream, trio.SSLStream[trio.SocketStream]]]:
    """(server side, client side) of one TLS connection on 127.0.0.1."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client_ctx = ssl.create_default_context(cafile=str(certs.ca))
    async with trio.open_nursery() as nursery:
        accepted: list[trio.SocketStream] = []

        async def accept() -> None:
            accepted.append(await listeners[0].accept())

        nursery.start_soon(accept)
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        client = trio.SSLStream(raw, client_ctx, server_hostname="127.0.0.1")
    server = TlsStream(accepted[0], server_ctx or server_context(certs))
    try:
        if handshake:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.do_handshake)
                nursery.start_soon(client.do_handshake)
        yield server, client
    finally:
        await server.aclose()
        await client.transport_stream.aclose()
        for listener in listeners:
            await listener.aclose()


async def read_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    chunks = []
    got = 0
    while got < n:
        data = await stream.receive_some(65536)
        assert data, f"EOF after {got} of {n} bytes"
        chunks.append(data)
        got += len(data)
    out = b"".join(chunks)
    assert len(out) == n
    return out


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


async def test_bytes_arrive_whole_and_in_order_both_ways(certs: TlsFiles) -> None:
    # 8 MiB in writes of varied sizes: far more than the socket buffers take
    # at once, so the stream's partial-write path runs.
    sizes = [1, 100, 65536, 1 << 20, 3, 3 << 20, 17, 4 << 20]
    outbound = [pattern(n, i) for i, n in enumerate(sizes)]
    inbound = pattern(2 << 20, 99)
    with trio.fail_after(DEADLINE_S):
        async with pair(certs) as (server, client), trio.open_nursery() as nursery:

            async def server_sends() -> None:
                for chunk in outbound:
                    await server.send_all(chunk)

            async def client_sends() -> None:
                await client.send_all(inbound)

            nursery.start_soon(server_sends)
            nursery.start_soon(client_sends)
            assert await read_exactly(server, len(inbound)) == inbound
            assert await read_exactly(client, sum(sizes)) == b"".join(outbound)


async def test_one_task_receives_while_another_sends(certs: TlsFiles) -> None:
    # A long poll's disconnect watch waits in receive_some while the
    # connection's task writes a response; then the client goes away.
    big = pattern(2 << 20, 5)
    with trio.fail_after(DEADLINE_S):
        async with pair(certs) as (server, client):
            got: list[bytes] = []
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    got.append(await server.receive_some())

                nursery.start_soon(watch)
                await trio.testing.wait_all_tasks_blocked()
                async with trio.open_nursery() as senders:
                    senders.start_soon(server.send_all, big)
                    assert await read_exactly(client, len(big)) == big
                await client.aclose()  # close_notify, then the socket
            assert got == [b""]


@pytest.mark.parametrize("notify", [True, False])
async def test_eof_ends_the_stream_with_or_without_close_notify(
    certs: TlsFiles, notify: bool
) -> None:
    with trio.fail_after(DEADLINE_S):
        async with pair(certs) as (server, client):
            # The client reads first: closing a socket with unread bytes (the
            # server's session tickets) would reset the connection instead.
            await server.send_all(b"hi")
            assert await read_exactly(client, 2) == b"hi"
            await client.send_all(b"last words")
            if notify:
                await client.aclose()
            else:
                await client.transport_stream.aclose()  # a truncated close
            assert await read_exactly(server, 10) == b"last words"
            assert await server.receive_some() == b""


async def test_aclose_sends_close_notify(certs: TlsFiles) -> None:
    with trio.fail_after(DEADLINE_S):
        async with pair(certs) as (server, client):
            await server.send_all(b"bye")
            await server.aclose()
            assert await read_exactly(client, 3) == b"bye"
            # trio's client (not https_compatible) returns b"" only after a
            # close_notify; a bare EOF would raise BrokenResourceError.
            assert await client.receive_some() == b""
            with pytest.raises(trio.ClosedResourceError):
                await server.send_all(b"more")


async def test_a_failed_handshake_tells_the_client_why(certs: TlsFiles) -> None:
    # The server requires a client certificate; the client has none. The
    # server's alert reaches the client (not just a closed connection).
    ctx = server_context(certs, require_client_cert=True)
    with trio.fail_after(DEADLINE_S):
        async with pair(certs, ctx, handshake=False) as (server, client):
            errors: list[BaseException] = []

            async def server_side() -> None:
                with pytest.raises(trio.BrokenResourceError) as err:
                    await server.do_handshake()
                errors.append(err.value)

            async def client_side() -> None:
                await client.do_handshake()  # TLS 1.3: the client's part succeeds
                await client.send_all(b"GET / HTTP/1.1\r\n\r\n")
                await client.receive_some()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(server_side)
                with pytest.raises(trio.BrokenResourceError) as seen:
                    await client_side()
            assert isinstance(errors[0].__cause__, ssl.SSLError)
            cause = seen.value.__cause__
            assert isinstance(cause, ssl.SSLError)
            assert "CERTIFICATE_REQUIRED" in str(cause).upper().replace(" ", "_")
