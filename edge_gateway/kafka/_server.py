"""Serve the Kafka protocol on trio, as one of the gateway's services (:func:`serve_kafka`).

One task per connection reads frames (bounded by ``kafka.max_request_bytes``),
decodes each with kio, dispatches it to the handler registered for its API
key (:mod:`._registry`) and writes the response. Requests of one connection
are answered one at a time, in order, as Kafka brokers do (a client's
pipelined requests wait in the socket buffer).

Hostile input never reaches a handler: an unknown API key, a version out of
range (except ApiVersions, answered with UNSUPPORTED_VERSION), a truncated or
malformed body or an oversized frame closes the connection, counted in
``edgegw_kafka_protocol_errors_total``; the gateway goes on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import trio
from kio.schema.errors import ErrorCode

from edge_gateway.kafka._core import GatewayCore
from edge_gateway.kafka._data import PRODUCE_KEY, too_large
from edge_gateway.kafka._groups import groups_statistics
from edge_gateway.kafka._handlers import api_versions_body
from edge_gateway.kafka._protocol import (
    API_VERSIONS_KEY,
    FrameReader,
    OversizedProduce,
    ProtocolError,
    UnsupportedVersion,
    api_name,
    build,
    decode_request,
    encode_response,
    response_class,
)
from edge_gateway.kafka._registry import (
    HANDLERS,
    CloseConnection,
    Connection,
    supported_versions,
)
from edge_gateway.net.listen import write_addr_file
from edge_gateway.net.tls import TLS_HANDSHAKE_RECORD, server_context
from edge_gateway.net.tlsstream import TlsStream

__all__ = ["ADDR_FILE", "KafkaServer", "KafkaStats", "kafka_status", "serve_kafka"]

log = logging.getLogger("edgegw.kafka")

#: ``<data_dir>/kafka.addr`` holds ``host:port`` of the running listener.
ADDR_FILE: Final = "kafka.addr"
_READ_SIZE: Final = 64 * 1024
#: Seconds a request in progress gets to be answered once the listener stops.
GRACEFUL_TIMEOUT_S: Final = 3.0


@dataclass(frozen=True, slots=True)
class KafkaStats:
    """What :meth:`KafkaServer.statistics` reports (status ``kafka``, Prometheus)."""

    listen: str
    tls: bool
    connections: int
    connections_total: int
    #: API name -> requests answered (or refused by the handler with an error code).
    requests: dict[str, int]
    #: Kafka error name -> times a response carried it (per partition / topic / request).
    errors: dict[str, int]
    #: Connections closed for a frame that could not be answered.
    protocol_errors: int
    tls_handshake_failures: int

    def to_json(self) -> dict[str, Any]:
        return {
            "listen": self.listen,
            "tls": self.tls,
            "connections": self.connections,
            "connections_total": self.connections_total,
            "requests": dict(sorted(self.requests.items())),
            "errors": dict(sorted(self.errors.items())),
            "protocol_errors": self.protocol_errors,
            "tls_handshake_failures": self.tls_handshake_failures,
        }


@dataclass(eq=False)
class KafkaServer:
    """The listener's counters and open connections (:func:`kafka_status`)."""

    gateway: GatewayCore
    listen: str = ""
    tls: bool = False
    connections: int = 0
    connections_total: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    protocol_errors: int = 0
    tls_handshake_failures: int = 0
    #: Set when the listener stops: connections end after their current request.
    stopping: bool = False
    #: Waits that end at once when the listener stops (idle reads, Fetch long polls).
    _waits: set[trio.CancelScope] = field(default_factory=set)

    @contextlib.contextmanager
    def interruptible(self, deadline: float = math.inf) -> Iterator[trio.CancelScope]:
        """A cancel scope (until ``deadline``) that the listener's stop cancels."""
        scope = trio.CancelScope(deadline=deadline)
        if self.stopping:
            scope.cancel()
        self._waits.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._waits.discard(scope)

    def begin_stop(self) -> None:
        self.stopping = True
        for scope in list(self._waits):
            scope.cancel()

    def count_error(self, code: ErrorCode | int, n: int = 1) -> None:
        """Count ``n`` occurrences of a non-zero error code in responses."""
        if code:
            self.errors[_error_name(code)] += n

    def statistics(self) -> KafkaStats:
        return KafkaStats(
            self.listen,
            self.tls,
            self.connections,
            self.connections_total,
            dict(self.requests),
            dict(self.errors),
            self.protocol_errors,
            self.tls_handshake_failures,
        )


def _error_name(code: ErrorCode | int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error_{int(code)}"


#: The running listener of each gateway.
_SERVERS: weakref.WeakKeyDictionary[GatewayCore, KafkaServer] = weakref.WeakKeyDictionary()


def kafka_status(gateway: GatewayCore) -> dict[str, Any] | None:
    """The ``kafka`` block of the gateway's status (None: no listener running)."""
    server = _SERVERS.get(gateway)
    if server is None:
        return None
    doc: dict[str, Any] = server.statistics().to_json()
    doc["groups"] = groups_statistics(gateway).to_json()
    return doc


async def serve_kafka(
    gateway: GatewayCore,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the Kafka protocol on ``kafka.listen`` until cancelled.

    Reports ready with the bound ``(host, port)`` once the socket listens
    (before the gateway claims its region: a port that cannot be bound
    fences nobody); ``<data_dir>/kafka.addr`` is written once the gateway is
    ready. Requests before then are answered like any request while the
    gateway is not accepting (Produce: a retriable error).
    """
    cfg = gateway.config.kafka
    api = gateway.config.api
    tls = server_context(api) if api.tls else None
    listeners = await trio.open_tcp_listeners(cfg.port, host=cfg.host)
    if cfg.port == 0 and len(listeners) > 1:
        for extra in listeners[1:]:
            await extra.aclose()
        listeners = listeners[:1]
    sockname = listeners[0].socket.getsockname()
    host, port = str(sockname[0]), int(sockname[1])
    text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if cfg.advertised:
        adv_host, _, adv_port = cfg.advertised.rpartition(":")
        advertised = (adv_host.strip("[]"), int(adv_port))
    else:
        advertised = (host, port)
    server = KafkaServer(gateway, listen=text, tls=tls is not None)
    _SERVERS[gateway] = server
    addr_path = gateway.config.data_dir / ADDR_FILE

    async def handle(stream: trio.SocketStream) -> None:
        if server.connections >= cfg.max_connections:
            log.warning("kafka: more than %d connections: closing one", cfg.max_connections)
            await stream.aclose()
            return
        server.connections += 1
        server.connections_total += 1
        try:
            await _serve_connection(server, stream, tls, advertised)
        except Exception:
            # One connection's unexpected failure (a bug, an OS error) ends that
            # connection only; the listener and the other clients go on.
            server.protocol_errors += 1
            log.exception("kafka: a connection failed")
        finally:
            server.connections -= 1

    async def announce() -> None:
        await trio.to_thread.run_sync(write_addr_file, addr_path, text)
        log.info("Kafka listener on %s%s", text, " (TLS)" if tls is not None else "")

    # Stopping (the gateway shuts down): no new connections; idle connections
    # and long polls end at once; a request in progress (a Produce waiting for
    # its fsync) gets up to GRACEFUL_TIMEOUT_S to be answered, so a client is
    # not left to retry what was written. The connections run shielded for
    # that; the deadline is set when the stop begins.
    accepting = trio.CancelScope()
    connections = trio.CancelScope(shield=True)
    graceful = min(GRACEFUL_TIMEOUT_S, gateway.config.shutdown_grace_s)

    async def run(*, task_status: trio.TaskStatus[list[trio.SocketListener]]) -> None:
        with connections:
            async with trio.open_nursery() as conns:
                with accepting:
                    await trio.serve_listeners(
                        handle, listeners, handler_nursery=conns, task_status=task_status
                    )
                for listener in listeners:
                    await listener.aclose()

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(run)
            if gateway.ready:
                await announce()
            else:
                gateway.on_ready(announce)
            task_status.started((host, port))
            try:
                await trio.sleep_forever()
            finally:
                server.begin_stop()
                accepting.cancel()
                connections.deadline = trio.current_time() + graceful
    finally:
        if _SERVERS.get(gateway) is server:
            del _SERVERS[gateway]
        with contextlib.suppress(OSError):
            addr_path.unlink()


async def _serve_connection(
    server: KafkaServer,
    sock: trio.SocketStream,
    tls: Any,
    advertised: tuple[str, int],
) -> None:
    gateway = server.gateway
    cfg = gateway.config.kafka
    peer = _peer(sock)
    stream: trio.abc.Stream = sock
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(sock.aclose)
        if tls is not None:
            tstream = TlsStream(sock, tls)
            try:
                with trio.fail_after(gateway.config.api.tls_handshake_timeout_s):
                    await tstream.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError) as exc:
                server.tls_handshake_failures += 1
                log.info("kafka: %s: TLS handshake failed: %s", peer, exc)
                return
            if gateway.config.api.tls_client_ca and tstream.getpeercert() is None:
                server.tls_handshake_failures += 1
                log.info("kafka: %s: no client certificate (api.tls_client_ca is set)", peer)
                return
            stream = tstream
            stack.push_async_callback(tstream.aclose)
        conn = Connection(
            gateway,
            cfg,
            peer,
            advertised,
            tls=tls is not None,
            authenticated=not gateway.config.api.token,
            server=server,
        )
        reader = FrameReader(cfg.max_request_bytes, supported_versions()[PRODUCE_KEY])
        first = True
        while True:
            reader.read_oversized_produce = conn.authenticated
            try:
                frame = reader.next_frame()
            except ProtocolError as exc:
                server.protocol_errors += 1
                log.info("kafka: %s: closing: %s", peer, exc)
                return
            if frame is None:
                data: bytes | bytearray = b""
                if server.stopping:
                    return
                with server.interruptible(trio.current_time() + cfg.idle_timeout_s):
                    try:
                        data = await stream.receive_some(_READ_SIZE)
                    except trio.BrokenResourceError:
                        return
                if not data:
                    return  # EOF, or idle too long
                if first and tls is None and data[0] == TLS_HANDSHAKE_RECORD:
                    server.protocol_errors += 1
                    log.info("kafka: %s: a TLS client on the plain listener: closing", peer)
                    return
                first = False
                reader.feed(data)
                continue
            if isinstance(frame, OversizedProduce):
                out = _answer_too_large(server, conn, frame)
            else:
                out = await _dispatch(server, conn, frame)
            if out is None:
                continue
            payload, close = out
            if payload:
                try:
                    await stream.send_all(payload)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
            if close:
                return


def _answer_too_large(
    server: KafkaServer, conn: Connection, req: OversizedProduce
) -> tuple[bytes, bool] | None:
    """Answer a Produce over the frame limit (read through) with MESSAGE_TOO_LARGE."""
    server.requests[api_name(PRODUCE_KEY)] += 1
    conn.client_id = req.client_id
    log.info(
        "kafka: %s: produce v%d of %d bytes, over kafka.max_request_bytes (%d): "
        "answered MESSAGE_TOO_LARGE",
        conn.peer,
        req.api_version,
        req.size,
        req.limit,
    )
    response = too_large(conn, req)
    if response is None:
        return None
    _count_errors(server, response)
    return encode_response(req.correlation_id, response), False


async def _dispatch(
    server: KafkaServer, conn: Connection, frame: bytes
) -> tuple[bytes, bool] | None:
    """(response bytes, close after) for one frame; None: nothing to send."""
    try:
        req = decode_request(frame, supported_versions())
    except UnsupportedVersion as exc:
        server.requests[api_name(exc.api_key)] += 1
        if exc.api_key == API_VERSIONS_KEY:
            # KIP-511: answer with v0 and the versions served; the client retries.
            server.count_error(ErrorCode.unsupported_version)
            body = build(
                response_class(API_VERSIONS_KEY, 0),
                api_versions_body(ErrorCode.unsupported_version),
            )
            return encode_response(exc.correlation_id, body), False
        server.protocol_errors += 1
        log.info("kafka: %s: closing: %s", conn.peer, exc)
        return b"", True
    except ProtocolError as exc:
        server.protocol_errors += 1
        log.info("kafka: %s: closing: %s", conn.peer, exc)
        return b"", True
    api = HANDLERS[req.api_key]
    name = api_name(req.api_key)
    server.requests[name] += 1
    conn.client_id = req.client_id
    if not conn.authenticated and not api.before_auth:
        server.protocol_errors += 1
        log.info("kafka: %s: %s before SASL authentication: closing", conn.peer, name)
        return b"", True
    started = time.monotonic()
    try:
        response = await api.handler(conn, req)
    except CloseConnection as exc:
        log.info("kafka: %s: closing: %s", conn.peer, exc)
        if exc.response is None:
            return b"", True
        return encode_response(req.correlation_id, exc.response), True
    except Exception:
        # A bug in a handler: the client gets a closed connection (it
        # reconnects and retries), the gateway goes on.
        log.exception("kafka: %s: %s v%d failed", conn.peer, name, req.api_version)
        server.protocol_errors += 1
        return b"", True
    _count_errors(server, response)
    log.debug(
        "kafka: %s: %s v%d in %.1f ms",
        conn.peer,
        name,
        req.api_version,
        (time.monotonic() - started) * 1000,
    )
    if response is None:
        return None
    return encode_response(req.correlation_id, response), False


def _count_errors(server: KafkaServer, entity: Any, depth: int = 0) -> None:
    """Count every non-zero ``error_code`` in a response (top level and nested)."""
    if entity is None or depth > 4:
        return
    code = getattr(entity, "error_code", None)
    if code:
        server.count_error(code)
    for name in getattr(entity, "__dataclass_fields__", ()):
        if name == "error_code":
            continue
        value = getattr(entity, name)
        if isinstance(value, tuple) and value and hasattr(value[0], "__dataclass_fields__"):
            for item in value:
                _count_errors(server, item, depth + 1)


def _peer(sock: trio.SocketStream) -> str:
    try:
        addr = sock.socket.getpeername()
    except OSError:
        return "?"
    return f"{addr[0]}:{addr[1]}"
