"""A small HTTP/1.1 server for ASGI apps on trio, built on h11.

Why not hypercorn: on the produce hot path (one small request per record,
keep-alive) hypercorn spent ~1 ms of CPU per request on the benchmark
machine, 2.5 times this server (``bench/produce.py``; see
``docs/api.md``, "Server"): it runs every request in a new task fed through
memory channels, restarts an idle-timeout task per request and writes the
response head and body with separate ``send`` calls. This server calls the
app in the connection's own task and writes each response (head, body, end)
with one ``send`` when the app gives the body in one message, which is what
Starlette responses do.

What it does (and what the local API needs): HTTP/1.1 with keep-alive and
pipelining (h11 does the parsing and framing, and refuses malformed or
oversized requests), HTTP/1.0, ``Expect: 100-continue``, request bodies
streamed to the app, ``HEAD``, a keep-alive timeout, and a graceful stop
(:meth:`Http11Server.shutdown`: stop accepting, close idle connections, let
requests in flight finish with ``Connection: close``), and TLS (``ssl_context``: each
accepted connection is wrapped in a :class:`~edge_gateway.net.tlsstream.TlsStream`
once its handshake completes within ``handshake_timeout``; a connection whose first
byte is not a TLS handshake gets a plain-HTTP ``400 tls_required``). Not in
scope: HTTP/2, websockets, the lifespan protocol (the gateway owns the app's
lifecycle).

Timeouts work as hypercorn's do, so that both servers keep the same promises
(docs/api.md, "HTTP"): a connection is closed when ``keep_alive_timeout``
passes, from its start or from the end of its last response, without a
complete request head — idle, or with a head still arriving (bytes of an
unfinished head do not extend it). Request bodies are read when the app
asks, for as long as it waits: the app bounds each read (``api.read_timeout_s``,
:func:`edge_gateway.net.http.receive_body`), as it must with hypercorn, whose
socket read timeout would also cut long polls.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import unquote

import h11
import trio

from edge_gateway.net._chunked import ChunkedDecoder, ChunkedError
from edge_gateway.net.asgi import BUFFERED_BODY, SEND_NOWAIT
from edge_gateway.net.http import KEEP_ALIVE_TIMEOUT_S, MAX_HEAD_BYTES, head_too_large
from edge_gateway.net.tls import TLS_HANDSHAKE_RECORD
from edge_gateway.net.tlsstream import TlsStream

__all__ = ["Http11Server"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]

_READ_SIZE: Final = 64 * 1024
#: Connections taken from the listen queue after each accept(), without a checkpoint.
_ACCEPT_BURST: Final = 256
_ERROR_BODY: Final = b'{"error":{"code":"%s","message":"%s"}}'
_DISCONNECT: Final = {"type": "http.disconnect"}
#: Seconds a closing TLS connection may take to send its close_notify.
_CLOSE_TIMEOUT_S: Final = 1.0
#: The answer to a plain HTTP request on a TLS port (sent unencrypted).
_PLAIN_ON_TLS_BODY: Final = (
    b'{"error":{"code":"tls_required","message":"this port serves HTTPS: use an https:// URL"}}'
)
_NO_CLIENT_CERT_BODY: Final = (
    b'{"error":{"code":"client_certificate_required","message":"this gateway requires a '
    b'client certificate signed by its api.tls_client_ca (client_cert=, --client-cert)"}}'
)
_NO_CLIENT_CERT: Final = (
    b"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%b"
    % (len(_NO_CLIENT_CERT_BODY), _NO_CLIENT_CERT_BODY)
)
_PLAIN_ON_TLS: Final = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%b"
    % (len(_PLAIN_ON_TLS_BODY), _PLAIN_ON_TLS_BODY)
)


class _ClientGone(Exception):
    """The peer closed the connection or broke the protocol mid-request."""


# ------------------------------------------------------------- the fast path
#
# Most requests of the local API are small, plain HTTP/1.1 requests whose
# head and body arrive in one read (a producer posting a record). h11 spends
# ~80 us of CPU on each (parse, validate, state machine, serialise): as much
# as the rest of the produce path. The fast path takes only the strict subset
# that h11 would accept with the same meaning and hands everything else to
# h11, request by request (a fresh h11.Connection fed the buffered bytes):
#
# * request line ``METHOD SP origin-form SP HTTP/1.1`` (visible ASCII target);
# * header lines ``token ":" OWS value OWS`` with a visible-ASCII value (no
#   obs-fold, no obs-text, no control characters);
# * exactly one ``Host``; at most one ``Content-Length``, all digits, or
#   one ``Transfer-Encoding: chunked`` (exactly that, lower case) and no
#   ``Content-Length``; no ``Expect``, ``Connection`` or ``Upgrade``
#   (connection management stays with h11, and either framing is the one
#   h11 would read, so no smuggling ambiguity can arise between the two);
# * a Content-Length body already whole in the buffer (one still arriving
#   is streamed by h11, with the app bounding each read). A chunked body is
#   streamed here, decoded by :class:`~edge_gateway.net._chunked.ChunkedDecoder`
#   (the metadata server's head stream: one long-lived chunked request whose
#   pieces h11 spent half of a report line's cost un-chunking).

_REQUEST_LINE: Final = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (/[\x21-\x7e]*) HTTP/1\.1")
_HEADER_LINE: Final = re.compile(
    rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*((?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?)[ \t]*"
)
_H11_ONLY: Final = frozenset({b"expect", b"connection", b"upgrade"})
_STATUS_LINES: Final = {
    int(s): b"HTTP/1.1 %d %s\r\n" % (int(s), s.phrase.encode("ascii")) for s in HTTPStatus
}


@dataclass(frozen=True, slots=True)
class _Head:
    """A request head the fast path serves (names lower-case, as h11 gives them)."""

    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    end: int  # offset of the body in the buffer
    length: int  # Content-Length (0 without one, and for a chunked body)
    chunked: bool = False  # Transfer-Encoding: chunked


#: :func:`_parse_head`'s answer for a request the fast path leaves to h11.
_DECLINE: Final = _Head(b"", b"", [], 0, 0)
#: :func:`_parse_head`'s answer for a head over the limit (431).
_TOO_LARGE: Final = _Head(b"", b"", [], 0, 0)


def _parse_head(buf: bytes, max_head: int) -> _Head | None:
    """The head at the start of ``buf``; None: incomplete; :data:`_DECLINE`: for h11;
    :data:`_TOO_LARGE`: over ``max_head`` bytes (blank line included).

    Every request passes here first, so the limit holds however the head
    arrives: h11's own bound (``max_incomplete_event_size``) covers only a
    head still arriving, and took a whole one of up to a read's 64 KiB.
    """
    end = buf.find(b"\r\n\r\n", 0, max_head)
    if end < 0:
        return None if len(buf) < max_head else _TOO_LARGE
    lines = buf[:end].split(b"\r\n")
    m = _REQUEST_LINE.fullmatch(lines[0])
    if m is None:
        return _DECLINE
    headers: list[tuple[bytes, bytes]] = []
    length: int | None = None
    chunked = False
    hosts = 0
    for line in lines[1:]:
        h = _HEADER_LINE.fullmatch(line)
        if h is None:
            return _DECLINE
        name = h[1].lower()
        value = h[2]
        if name == b"content-length":
            if length is not None or not value.isdigit() or len(value) > 18:
                return _DECLINE
            length = int(value)
        elif name == b"host":
            hosts += 1
        elif name == b"transfer-encoding":
            if chunked or value != b"chunked":
                return _DECLINE
            chunked = True
        elif name in _H11_ONLY:
            return _DECLINE
        headers.append((name, value))
    if hosts != 1 or (chunked and length is not None):
        return _DECLINE
    return _Head(m[1], m[2], headers, end + 4, length or 0, chunked)


class Http11Server:
    """Serves one ASGI app on trio listeners until :meth:`shutdown`."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        log: logging.Logger,
        max_header_bytes: int = MAX_HEAD_BYTES,
        keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
        handshake_timeout: float = 10.0,
        require_client_cert: bool = False,
    ) -> None:
        self.app = app
        self.log = log
        self.max_header_bytes = max_header_bytes
        self.keep_alive_timeout = keep_alive_timeout
        self.ssl_context = ssl_context
        self.handshake_timeout = handshake_timeout
        #: Refuse (403) a TLS client that presented no certificate; the
        #: context (``CERT_OPTIONAL``) verifies one that is presented.
        self.require_client_cert = require_client_cert
        self._scheme = "https" if ssl_context is not None else "http"
        #: TLS connections closed before their handshake completed (timed out,
        #: refused by either side, or plain HTTP on the TLS port).
        self.tls_handshake_failures = 0
        self._stopping = False
        self._listen_scope: trio.CancelScope | None = None
        #: Cancel scopes of connections waiting for their next request.
        self._idle: set[trio.CancelScope] = set()
        self._connections = 0

    def stopping(self) -> bool:
        """Whether :meth:`shutdown` was called (responses then say ``Connection: close``)."""
        return self._stopping

    @property
    def connections(self) -> int:
        """Open connections right now."""
        return self._connections

    def shutdown(self) -> None:
        """Stop accepting; close idle connections; in-flight requests finish, then close."""
        self._stopping = True
        if self._listen_scope is not None:
            self._listen_scope.cancel()
        for scope in list(self._idle):
            scope.cancel()

    async def serve(
        self,
        listeners: list[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections until :meth:`shutdown`; return when every connection closed."""
        async with trio.open_nursery() as connections:
            with trio.CancelScope() as self._listen_scope:
                if self._stopping:
                    self._listen_scope.cancel()
                async with trio.open_nursery() as accepting:
                    for listener in listeners:
                        accepting.start_soon(self._accept_loop, listener, connections)
                    task_status.started()
            for listener in listeners:
                await listener.aclose()

    async def _accept_loop(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        # trio's accept() takes one connection per pass of its scheduler: with
        # thousands of connections busy, a pass takes tens of milliseconds, and
        # a fleet reconnecting at once (thousands a second) waited in the
        # listen queue until its clients gave up (bench/fleet.py, 5,000
        # gateways: watch opens timed out by the thousand). After each
        # accept() the connections already queued are taken at once, up to
        # _ACCEPT_BURST, from a duplicate of the listening socket (same queue,
        # non-blocking).
        with socket.socket(fileno=os.dup(listener.socket.fileno())) as queued:
            queued.setblocking(False)
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:  # EMFILE and friends: back off, keep serving
                    self.log.warning("accept failed: %s", exc)
                    await trio.sleep(0.1)
                    continue
                connections.start_soon(self._connection, stream)
                for _ in range(_ACCEPT_BURST):
                    try:
                        sock, _ = queued.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as exc:  # the next accept() logs and backs off
                        self.log.debug("accept failed: %s", exc)
                        break
                    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
                    connections.start_soon(self._connection, stream)

    # ------------------------------------------------------------ connections

    async def _connection(self, raw: trio.SocketStream) -> None:
        self._connections += 1
        stream: trio.abc.Stream = raw
        try:
            peer = _addr(raw.socket.getpeername())
            local = _addr(raw.socket.getsockname())
            if self.ssl_context is not None:
                tls = await self._handshake(raw, peer)
                if tls is None:
                    return
                stream = tls
            buf = b""
            while not self._stopping:
                got = await self._next_head(stream, buf)
                if got is None:
                    break
                head, buf = got
                if head is not None:
                    body = buf[head.end : head.end + head.length]
                    keep, buf = await self._fast_exchange(
                        stream, head, body, buf[head.end + head.length :], peer, local
                    )
                    if not keep:
                        break
                    continue
                # Anything else, request by request, through h11.
                conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.max_header_bytes)
                conn.receive_data(buf)
                event = await self._next_request(conn, stream)
                if event is None:
                    break
                await self._exchange(conn, stream, event, peer, local)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                buf, closed = conn.trailing_data
                if closed:
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, _ClientGone):
            pass
        finally:
            self._connections -= 1
            # A TLS stream sends close_notify first: bounded, a peer that reads
            # nothing must not hold the task (trio closes the socket anyway).
            with (
                trio.move_on_after(_CLOSE_TIMEOUT_S),
                contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
            ):
                await stream.aclose()

    async def _handshake(
        self, raw: trio.SocketStream, peer: tuple[str, int] | None
    ) -> TlsStream | None:
        """The TLS stream of a new connection; None when it failed (the caller closes).

        Each connection shakes hands in its own task under its own deadline,
        so a client that stalls or fails its handshake costs the others nothing.
        """
        assert self.ssl_context is not None
        why: str | None = "timed out"  # None: counted and logged already
        with trio.CancelScope() as scope:
            scope.deadline = trio.current_time() + self.handshake_timeout
            self._idle.add(scope)  # a shutdown closes it
            try:
                # Peek: the bytes stay for the TLS layer.
                first = await raw.socket.recv(1, socket.MSG_PEEK)
                if not first:
                    return None  # closed before saying anything (a port probe)
                if first[0] != TLS_HANDSHAKE_RECORD:
                    self.tls_handshake_failures += 1
                    self.log.debug("TLS handshake with %s failed: plain HTTP on the TLS port", peer)
                    why = None
                    # Take the request head off the socket first: closing with
                    # unread bytes would reset the connection before the
                    # client reads the answer.
                    await raw.receive_some(self.max_header_bytes)
                    await raw.send_all(_PLAIN_ON_TLS)
                    with contextlib.suppress(OSError):
                        raw.socket.shutdown(socket.SHUT_WR)
                    # Wait (bounded) for the client to close its side.
                    while await raw.receive_some(_READ_SIZE):
                        pass
                    return None
                tls = TlsStream(raw, self.ssl_context)
                await tls.do_handshake()
                if self.require_client_cert and not tls.getpeercert():
                    self.tls_handshake_failures += 1
                    self.log.debug("TLS client %s presented no certificate: 403", peer)
                    why = None
                    # Read the request (bounded) so that closing does not reset
                    # the connection before the client reads the answer.
                    await tls.receive_some(self.max_header_bytes)
                    await tls.send_all(_NO_CLIENT_CERT)
                    await tls.aclose()
                    return None
                return tls
            except (trio.BrokenResourceError, OSError) as exc:
                if why is not None:
                    why = str(exc.__cause__ or exc)
            finally:
                self._idle.discard(scope)
        if why is not None and not (scope.cancelled_caught and self._stopping):
            self.tls_handshake_failures += 1
            self.log.debug("TLS handshake with %s failed: %s", peer, why)
        return None

    async def _next_head(
        self, stream: trio.abc.Stream, buf: bytes
    ) -> tuple[_Head | None, bytes] | None:
        """Read until ``buf`` holds a request the fast path serves (its head) or
        one it leaves to h11 (None); None when the connection should close (idle
        timeout, shutdown, or the peer closed)."""
        with trio.CancelScope() as idle:
            idle.deadline = trio.current_time() + self.keep_alive_timeout
            self._idle.add(idle)
            try:
                while True:
                    if buf:
                        # A request has begun: a shutdown lets it finish, but the
                        # deadline stays: its head must be complete by then.
                        idle.shield = True
                        head = _parse_head(buf, self.max_header_bytes)
                        if head is _TOO_LARGE:
                            await self._refuse_head(stream)
                            return None
                        if head is _DECLINE:
                            return None, buf
                        if head is not None:
                            if len(buf) >= head.end + head.length:
                                return head, buf
                            return None, buf  # the body is still arriving: h11 streams it
                    data = await stream.receive_some(_READ_SIZE)
                    if not data:
                        return None  # closed between requests, or mid-head
                    buf += data
            finally:
                self._idle.discard(idle)
        return None  # idle timeout or shutdown

    async def _fast_exchange(
        self,
        stream: trio.abc.Stream,
        request: _Head,
        body: bytes,
        rest: bytes,
        peer: tuple[str, int] | None,
        local: tuple[str, int] | None,
    ) -> tuple[bool, bytes]:
        """Serve a request of the fast path; (keep the connection, bytes after it)."""
        raw_path, _, query = request.target.partition(b"?")
        method = request.method.decode("ascii")
        text_path = raw_path.decode("latin-1")
        scope: Scope = {
            "type": "http",
            "asgi": _ASGI_VERSION,
            "http_version": "1.1",
            "method": method,
            "scheme": self._scheme,
            "path": unquote(text_path) if "%" in text_path else text_path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": request.headers,
            "client": peer,
            "server": local,
            # The body is in hand: the app may take it without a read (or a deadline).
            "extensions": {} if request.chunked else {BUFFERED_BODY: body},
        }
        received = False
        reply = _Reply(stream, _RawFraming(self.stopping), head_only=method == "HEAD")
        if method == "GET" and isinstance(stream, trio.SocketStream):
            # A streamed answer (the metadata server's heads watch) may be fed
            # from other tasks: one write per line, no task to wake per line.
            scope["extensions"][SEND_NOWAIT] = reply.send_nowait
        pending: list[bytes] = [rest]
        chunks: ChunkedDecoder | None = None
        if request.chunked:
            chunks = ChunkedDecoder()
            pending = []
            received = not rest  # False: the body's first bytes came with the head

        async def receive_chunks(chunks: ChunkedDecoder) -> Message:
            # As the h11 path: the data decoded from what is buffered, or from
            # the next read when nothing is; no deadline here (the app bounds
            # its body reads: module docstring).
            nonlocal received, rest
            try:
                while True:
                    if received:
                        try:
                            rest = await _receive_now(stream)
                        except (trio.BrokenResourceError, trio.ClosedResourceError):
                            rest = b""
                        if not rest:  # the peer closed mid-body
                            reply.gone = True
                            return _DISCONNECT
                    received = True
                    data = chunks.feed(rest)
                    rest = b""
                    if chunks.done:
                        pending.append(chunks.rest)
                        return {"type": "http.request", "body": data, "more_body": False}
                    if data:
                        return {"type": "http.request", "body": data, "more_body": True}
            except ChunkedError as exc:
                self.log.debug("malformed chunked body from %s: %s", peer, exc)
                reply.gone = True  # nothing more is read; the connection closes after
                return _DISCONNECT

        async def receive() -> Message:
            nonlocal received
            if chunks is not None and not chunks.done and not reply.gone:
                return await receive_chunks(chunks)
            if not received:
                received = True
                return {"type": "http.request", "body": body, "more_body": False}
            # After the body: wait for the client to go away (ASGI). Bytes of a
            # pipelined request are kept for after this one; while they pile up
            # past a request head's size, stop reading and just wait.
            while not reply.gone:
                if sum(map(len, pending)) > self.max_header_bytes + _READ_SIZE:
                    await trio.sleep_forever()
                try:
                    data = bytes(await stream.receive_some(_READ_SIZE))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    reply.gone = True
                else:
                    pending.append(data)
            return _DISCONNECT

        try:
            await self.app(scope, receive, reply)
        except Exception:
            self.log.exception("unhandled error in the ASGI app for %s %s", method, scope["path"])
            await reply.internal_error()
            return False, b""
        if reply.cut:
            self._hung_up(peer, method, scope["path"])
        if not reply.finished:
            raise _ClientGone  # the app ended without a complete response
        if chunks is not None and not chunks.done and not reply.gone:
            # The app answered without reading the whole body: take what is
            # buffered of it; a body still on the wire closes the connection.
            if not chunks.ends_in(rest):
                return False, b""
            pending.append(chunks.rest)
        close = self._stopping or _says_close(reply.headers)
        return not (close or reply.gone), b"".join(pending)

    def _hung_up(self, peer: tuple[str, int] | None, method: str, path: str) -> None:
        where = f"{peer[0]}:{peer[1]}" if peer is not None else "a client"
        self.log.debug("%s hung up during the answer to %s %s", where, method, path)

    async def _next_request(
        self, conn: h11.Connection, stream: trio.abc.Stream
    ) -> h11.Request | None:
        """The next request's head, or None when the connection should close."""
        with trio.CancelScope() as idle:
            idle.deadline = trio.current_time() + self.keep_alive_timeout
            self._idle.add(idle)
            try:
                while True:
                    try:
                        event = conn.next_event()
                    except h11.RemoteProtocolError as exc:
                        await self._refuse(conn, stream, exc)
                        return None
                    if event is h11.NEED_DATA:
                        data = bytes(await stream.receive_some(_READ_SIZE))
                        # A request has begun: a shutdown lets it finish, but the
                        # deadline stays: its head must be complete by then.
                        idle.shield = True
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Request):
                        return event
                    return None  # ConnectionClosed
            finally:
                self._idle.discard(idle)
        return None  # idle timeout or shutdown

    async def _refuse(
        self, conn: h11.Connection, stream: trio.abc.Stream, exc: h11.RemoteProtocolError
    ) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        status = exc.error_status_hint
        if status == 431:
            code, message = "headers_too_large", head_too_large(self.max_header_bytes)
        else:
            code = "invalid_request"
            message = f"malformed HTTP request ({exc}): the client must send valid HTTP/1.1"
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        with contextlib.suppress(h11.LocalProtocolError):
            data = conn.send(
                h11.Response(
                    status_code=status,
                    headers=[
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close"),
                    ],
                )
            )
            data += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
            await stream.send_all(data)

    async def _refuse_head(self, stream: trio.abc.Stream) -> None:
        """Answer 431 to a head over the limit (the connection closes after it)."""
        body = json.dumps(
            {
                "error": {
                    "code": "headers_too_large",
                    "message": head_too_large(self.max_header_bytes),
                }
            }
        ).encode()
        await stream.send_all(
            _STATUS_LINES[431] + b"content-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%b" % (len(body), body)
        )

    # --------------------------------------------------------------- requests

    async def _exchange(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        request: h11.Request,
        peer: tuple[str, int] | None,
        local: tuple[str, int] | None,
    ) -> None:
        target = request.target
        raw_path, _, query = target.partition(b"?")
        method = request.method.decode("ascii")
        scope: Scope = {
            "type": "http",
            "asgi": _ASGI_VERSION,
            "http_version": request.http_version.decode("ascii"),
            "method": method,
            "scheme": self._scheme,
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": list(request.headers),
            "client": peer,
            "server": local,
        }
        body_done = False
        reply = _Reply(stream, _H11Framing(conn, self.stopping), head_only=method == "HEAD")

        async def receive() -> Message:
            nonlocal body_done
            if body_done:
                # After the body: wait for the client to go away (ASGI; a long
                # poll watches for it). h11 keeps the bytes of a pipelined
                # request for after this one; past a head's size, stop reading.
                while not reply.gone and conn.their_state is h11.DONE:
                    if len(conn.trailing_data[0]) > self.max_header_bytes + _READ_SIZE:
                        await trio.sleep_forever()
                    try:
                        data = bytes(await stream.receive_some(_READ_SIZE))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                    conn.receive_data(data)  # b"": the peer closed
                    reply.gone = not data
                return _DISCONNECT
            chunks: list[bytes] = []
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError:
                    body_done = True
                    return _DISCONNECT
                if event is h11.NEED_DATA:
                    if chunks:
                        return {"type": "http.request", "body": b"".join(chunks), "more_body": True}
                    if conn.they_are_waiting_for_100_continue:
                        await stream.send_all(
                            conn.send(h11.InformationalResponse(status_code=100, headers=[]))
                        )
                    # No deadline here: the app bounds its body reads (module docstring).
                    try:
                        conn.receive_data(bytes(await stream.receive_some(_READ_SIZE)))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        conn.receive_data(b"")
                    continue
                if isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    body_done = True
                    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                    return {"type": "http.request", "body": body, "more_body": False}
                else:  # ConnectionClosed mid-body
                    body_done = True
                    return _DISCONNECT

        try:
            await self.app(scope, receive, reply)
        except Exception:
            self.log.exception("unhandled error in the ASGI app for %s %s", method, scope["path"])
            await reply.internal_error()
        if reply.cut:
            self._hung_up(peer, method, scope["path"])
            raise _ClientGone
        if not reply.finished:
            raise _ClientGone  # the app ended without a complete response
        # Consume what is already buffered of the request (a bodyless GET still
        # has its EndOfMessage to take) so that the connection can be reused.
        while conn.their_state is h11.SEND_BODY:
            try:
                if conn.next_event() is h11.NEED_DATA:
                    break  # unread body on the wire: the connection closes
            except h11.RemoteProtocolError:
                break


_ASGI_VERSION: Final = {"version": "3.0", "spec_version": "2.3"}
_ERROR_START: Final = {
    "type": "http.response.start",
    "status": 500,
    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
}
_ERROR_MESSAGE: Final = {
    "type": "http.response.body",
    "body": _ERROR_BODY % (b"internal", b"internal error"),
}


class _RawFraming:
    """HTTP/1.1 framing of the fast path's responses, written by hand."""

    __slots__ = ("_chunked", "_stopping")

    def __init__(self, stopping: Callable[[], bool]) -> None:
        self._stopping = stopping
        self._chunked = False

    def head(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, more: bool
    ) -> bytes:
        """Status line and headers; Content-Length (or chunked) added when missing."""
        names = set()
        lines = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status]
        for name, value in headers:
            if b"\r" in name or b"\n" in name or b"\r" in value or b"\n" in value:
                raise RuntimeError(f"illegal response header {name!r}: {value!r}")
            names.add(name.lower())
            lines.append(b"%b: %b\r\n" % (name, value))
        if b"content-length" not in names and b"transfer-encoding" not in names:
            if more:
                lines.append(b"transfer-encoding: chunked\r\n")
            else:
                lines.append(b"content-length: %d\r\n" % len(body))
        if self._stopping() and b"connection" not in names:
            lines.append(b"connection: close\r\n")
        lines.append(b"\r\n")
        head = b"".join(lines)
        self._chunked = head.find(b"\r\ntransfer-encoding: chunked\r\n") >= 0
        return head

    def data(self, body: bytes) -> bytes:
        return b"%x\r\n%b\r\n" % (len(body), body) if self._chunked else body

    def end(self, head_only: bool) -> bytes:
        return b"0\r\n\r\n" if self._chunked and not head_only else b""


class _H11Framing:
    """HTTP/1.1 framing of the responses to requests h11 parsed, by h11."""

    __slots__ = ("_conn", "_stopping")

    def __init__(self, conn: h11.Connection, stopping: Callable[[], bool]) -> None:
        self._conn = conn
        self._stopping = stopping

    def head(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, more: bool
    ) -> bytes:
        if self._stopping():
            headers = [*headers, (b"connection", b"close")]
        if not more and not any(k.lower() == b"content-length" for k, _ in headers):
            headers = [*headers, (b"content-length", str(len(body)).encode())]
        return self._conn.send(h11.Response(status_code=status, headers=headers))

    def data(self, body: bytes) -> bytes:
        return self._conn.send(h11.Data(data=body))

    def end(self, head_only: bool) -> bytes:
        return self._conn.send(h11.EndOfMessage())


class _Reply:
    """The ASGI ``send`` of one exchange, on either path.

    Checks the order of the app's messages and writes each response (head,
    body, end) with one write when the app gives the body in one message,
    which is what Starlette responses do. ``gone``: the client went away
    (seen by the exchange's ``receive``, or by a write that failed: ``cut``);
    later sends are no-ops, as ASGI says. A client that hangs up in the middle
    of a large answer (``curl ... | head -c 10``) is ordinary, not an error
    of the app.
    """

    __slots__ = (
        "_backlog",
        "_framing",
        "_head_only",
        "_head_sent",
        "_sending",
        "_status",
        "_stream",
        "cut",
        "finished",
        "gone",
        "headers",
        "started",
    )

    def __init__(
        self, stream: trio.abc.Stream, framing: _RawFraming | _H11Framing, *, head_only: bool
    ) -> None:
        self._stream = stream
        self._framing = framing
        self._head_only = head_only
        self._head_sent = False
        self._status = 0
        self.started = False
        self.finished = False
        self.gone = False
        #: A write failed: the client hung up while being answered.
        self.cut = False
        self.headers: list[tuple[bytes, bytes]] = []
        #: Bytes of :meth:`send_nowait` chunks the socket did not take yet: they go first.
        self._backlog = b""
        self._sending = False

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start" and not self.started:
            self.started = True
            self._status = message["status"]
            self.headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
            return
        if kind != "http.response.body" or not self.started or self.finished:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        body = bytes(message.get("body", b""))
        more = message.get("more_body", False)
        if self.gone:  # nobody to answer
            self.finished = not more
            return
        parts = []
        if not self._head_sent:
            self._head_sent = True
            parts.append(self._framing.head(self._status, self.headers, body, more))
        if body and not self._head_only:
            parts.append(self._framing.data(body))
        if not more:
            self.finished = True
            parts.append(self._framing.end(self._head_only))
        if self._backlog:
            parts.insert(0, self._backlog)
            self._backlog = b""
        self._sending = True
        try:
            data = b"".join(parts)
            while data:
                await _send_now(self._stream, data)
                # Chunks given to send_nowait while this write waited come next.
                data, self._backlog = self._backlog, b""
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.gone = self.cut = True
        finally:
            self._sending = False

    def send_nowait(self, body: bytes) -> bool:
        """One more chunk of a started, streamed body, written now (SEND_NOWAIT).

        True: the socket took all of it. False: what it did not take is held
        and goes first with the next ``send`` (which the exchange's task must
        make soon). Chunks stay in order: while bytes are held, a new chunk
        joins them. A client gone takes nothing (True: nothing to send).
        """
        if not self._head_sent or self.finished or self._head_only:
            raise RuntimeError("send_nowait needs a started, streamed response")
        if self.gone:
            return True
        data = self._framing.data(body)
        if self._backlog or self._sending:
            self._backlog += data
            return False
        assert isinstance(self._stream, trio.SocketStream)
        try:
            sent = os.write(self._stream.socket.fileno(), data)
        except BlockingIOError:
            sent = 0
        except OSError:  # EPIPE, ECONNRESET: the exchange's next read or send sees it
            self.gone = self.cut = True
            return True
        if sent == len(data):
            return True
        self._backlog = data[sent:]
        return False

    async def internal_error(self) -> None:
        """Answer 500 for an app that failed; raise :class:`_ClientGone` if it had begun."""
        if self.started:
            raise _ClientGone  # cannot finish the response: drop it
        await self(_ERROR_START)
        await self(_ERROR_MESSAGE)


async def _send_now(stream: trio.abc.Stream, data: bytes) -> None:
    """``stream.send_all(data)`` without its two scheduler round trips when the
    socket takes all of ``data`` at once (a small response: nearly always).

    trio's send checkpoints before and after the write, so every response
    cost this task two trips through the run queue behind every other
    connection's task. The connection task checkpoints anyway at its next
    read; it is the only writer of the stream.
    """
    if not isinstance(stream, trio.SocketStream):  # TLS: the SSL object writes
        await stream.send_all(data)
        return
    try:
        sent = os.write(stream.socket.fileno(), data)
    except BlockingIOError:
        sent = 0
    except OSError as exc:  # EPIPE, ECONNRESET, EBADF (closed)
        raise trio.BrokenResourceError(str(exc)) from exc
    if sent < len(data):
        await stream.send_all(memoryview(data)[sent:])


async def _receive_now(stream: trio.abc.Stream) -> bytes:
    """``stream.receive_some()`` with one scheduler round trip instead of two.

    trio's read tries the socket, parks until it is readable when it was
    empty, reads, and then checkpoints again before returning: two trips
    through the run queue per piece of a long-lived body (the head stream's
    every report line). This waits for readability (the one trip, which is
    also the fairness point: a client that always has data still yields to
    the others each read) and then reads without another. The connection's
    task is the only reader of its socket.
    """
    if not isinstance(stream, trio.SocketStream):  # TLS: the SSL object reads
        return bytes(await stream.receive_some(_READ_SIZE))
    sock = stream.socket
    while True:
        await trio.lowlevel.wait_readable(sock)
        try:
            return os.read(sock.fileno(), _READ_SIZE)
        except BlockingIOError:
            continue  # woken without data after all: wait again
        except OSError as exc:  # ECONNRESET, EBADF (closed)
            raise trio.BrokenResourceError(str(exc)) from exc


def _says_close(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        k.lower() == b"connection" and b"close" in (t.strip() for t in v.lower().split(b","))
        for k, v in headers
    )


def _addr(sockaddr: Any) -> tuple[str, int] | None:
    if isinstance(sockaddr, tuple) and len(sockaddr) >= 2:
        return str(sockaddr[0]), int(sockaddr[1])
    return None
