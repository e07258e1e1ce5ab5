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
requests in flight finish with ``Connection: close``). Not in scope: TLS,
HTTP/2, websockets, the lifespan protocol (the gateway owns the app's
lifecycle).

Timeouts work as hypercorn's do, so that both servers keep the same promises
(docs/api.md, "HTTP"): a connection is closed when ``keep_alive_timeout``
passes, from its start or from the end of its last response, without a
complete request head — idle, or with a head still arriving (bytes of an
unfinished head do not extend it). Request bodies are read when the app
asks, for as long as it waits: the app bounds each read (``api.read_timeout_s``,
:func:`edge_gateway._http.receive_body`), as it must with hypercorn, whose
socket read timeout would also cut long polls.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final
from urllib.parse import unquote

import h11
import trio

from edge_gateway._http import KEEP_ALIVE_TIMEOUT_S

__all__ = ["Http11Server"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]

_READ_SIZE: Final = 64 * 1024
_ERROR_BODY: Final = b'{"error":{"code":"%s","message":"%s"}}'
_DISCONNECT: Final = {"type": "http.disconnect"}


class _ClientGone(Exception):
    """The peer closed the connection or broke the protocol mid-request."""


class Http11Server:
    """Serves one ASGI app on trio listeners until :meth:`shutdown`."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        log: logging.Logger,
        max_header_bytes: int = 16 * 1024,
        keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.log = log
        self.max_header_bytes = max_header_bytes
        self.keep_alive_timeout = keep_alive_timeout
        self._stopping = False
        self._listen_scope: trio.CancelScope | None = None
        #: Cancel scopes of connections waiting for their next request.
        self._idle: set[trio.CancelScope] = set()
        self._connections = 0

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
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # EMFILE and friends: back off, keep serving
                self.log.warning("accept failed: %s", exc)
                await trio.sleep(0.1)
                continue
            connections.start_soon(self._connection, stream)

    # ------------------------------------------------------------ connections

    async def _connection(self, stream: trio.SocketStream) -> None:
        self._connections += 1
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.max_header_bytes)
        try:
            peer = _addr(stream.socket.getpeername())
            local = _addr(stream.socket.getsockname())
            while not self._stopping:
                event = await self._next_request(conn, stream)
                if event is None:
                    break
                await self._exchange(conn, stream, event, peer, local)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, _ClientGone):
            pass
        finally:
            self._connections -= 1
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.aclose()

    async def _next_request(
        self, conn: h11.Connection, stream: trio.SocketStream
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
                        data = await stream.receive_some(_READ_SIZE)
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
        self, conn: h11.Connection, stream: trio.SocketStream, exc: h11.RemoteProtocolError
    ) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        status = exc.error_status_hint
        code = b"invalid_request" if status != 431 else b"headers_too_large"
        body = _ERROR_BODY % (code, b"malformed HTTP request")
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

    # --------------------------------------------------------------- requests

    async def _exchange(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        request: h11.Request,
        peer: tuple[str, int] | None,
        local: tuple[str, int] | None,
    ) -> None:
        target = request.target
        raw_path, _, query = target.partition(b"?")
        method = request.method.decode("ascii")
        head = method == "HEAD"
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode("ascii"),
            "method": method,
            "scheme": "http",
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": list(request.headers),
            "client": peer,
            "server": local,
        }
        body_done = False
        started = False
        head_sent = False
        finished = False
        status = 0
        headers: list[tuple[bytes, bytes]] = []

        async def receive() -> Message:
            nonlocal body_done
            if body_done:
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
                        conn.receive_data(await stream.receive_some(_READ_SIZE))
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

        async def send(message: Message) -> None:
            nonlocal started, head_sent, finished, status, headers
            kind = message["type"]
            if kind == "http.response.start" and not started:
                started = True
                status = message["status"]
                headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
                if self._stopping:
                    headers.append((b"connection", b"close"))
                return
            if kind != "http.response.body" or not started or finished:
                raise RuntimeError(f"unexpected ASGI message {kind!r}")
            body = bytes(message.get("body", b""))
            more = message.get("more_body", False)
            parts = []
            if not head_sent:
                head_sent = True
                if not more and not any(k.lower() == b"content-length" for k, _ in headers):
                    headers.append((b"content-length", str(len(body)).encode()))
                parts.append(conn.send(h11.Response(status_code=status, headers=headers)))
            if body and not head:
                parts.append(conn.send(h11.Data(data=body)))
            if not more:
                finished = True
                parts.append(conn.send(h11.EndOfMessage()))
            # The whole response in one write when the body comes in one message.
            await stream.send_all(b"".join(parts))

        try:
            await self.app(scope, receive, send)
        except Exception:
            self.log.exception("unhandled error in the ASGI app for %s %s", method, scope["path"])
            if started:
                raise _ClientGone from None  # cannot finish the response: drop it
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
                }
            )
            await send(
                {
                    "type": "http.response.body",
                    "body": _ERROR_BODY % (b"internal", b"internal error"),
                }
            )
        if not finished:
            raise _ClientGone  # the app ended without a complete response
        # Consume what is already buffered of the request (a bodyless GET still
        # has its EndOfMessage to take) so that the connection can be reused.
        while conn.their_state is h11.SEND_BODY:
            try:
                if conn.next_event() is h11.NEED_DATA:
                    break  # unread body on the wire: the connection closes
            except h11.RemoteProtocolError:
                break


def _addr(sockaddr: Any) -> tuple[str, int] | None:
    if isinstance(sockaddr, tuple) and len(sockaddr) >= 2:
        return str(sockaddr[0]), int(sockaddr[1])
    return None
