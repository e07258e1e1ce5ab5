"""The reference metadata server: topic routing, heartbeats and the head relay.

``edgegw metadata serve --db meta.sqlite --listen 127.0.0.1:8471`` runs
:func:`serve_metadata`: a plain ASGI app (:class:`MetadataApp`, routed by
:mod:`edge_gateway.net.asgi`'s route table, as the local API is) served by
edgegw's HTTP/1.1 server (:mod:`edge_gateway.net.http11`; hypercorn with
``--server hypercorn``) on trio, over a
:class:`~edge_gateway.metadata._db.MetadataStore` (SQLite, WAL) or a
:class:`~edge_gateway.metadata._pg.PostgresStore`. Routes, bodies and errors:
``docs/metadata-api.md`` and ``docs/metadata-openapi.json`` (generated from
:mod:`._openapi`).

Who may do what:

* the **admin** token: everything;
* a **region** token (issued by ``POST /v1/regions``): every read, and
  heartbeats and head reports *as that region only* (403 otherwise);
* no token: ``/healthz`` and ``/openapi.json`` only — except in *open mode*
  (no admin token configured, loopback only), where a request without a
  token acts as admin. The server refuses to listen on a non-loopback
  address without an admin token.

The routing table is kept in memory (re-read after each change) and served
with ``ETag: "<version>"``; ``If-None-Match`` with the current version gets
304. The head relay is memory only: it is a hint for idle tailers, never
trusted for correctness, and gateways report again after every commit.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import trio

from edge_gateway import pygc
from edge_gateway.errors import ClosedError, ConfigError, InvalidInput, InvalidName, Unavailable
from edge_gateway.metadata._db import (
    MetadataStore,
    Refused,
    SqlStore,
    hash_token,
    is_legacy_hash,
    split_region_token,
    verify_token,
)
from edge_gateway.metadata._fanout import (
    Admission,
    HeadRelay,
    HeadWatch,
    Heartbeat,
    HeartbeatWriter,
    Overloaded,
)
from edge_gateway.metadata._headstream import (
    HEAD_STREAM_PROTOCOL,
    PROTOCOL_HEADER,
    STREAM_MEDIA_TYPE,
    BadReportLine,
    ReportReader,
    encode_ack,
    encode_error,
)
from edge_gateway.metadata._pg import PostgresStore, is_postgres_url
from edge_gateway.metadata._replicas import ReplicaSync
from edge_gateway.metadata._watch import WATCH_MEDIA_TYPE, encode_heads
from edge_gateway.metadata.routing import (
    TopicRoute,
    parse_bucket_settings,
    validate_bucket_name,
)
from edge_gateway.names import validate_home_topic, validate_region, validate_topic
from edge_gateway.net.asgi import (
    BUFFERED_BODY,
    SEND_NOWAIT,
    JSONResponse,
    Message,
    Receive,
    Request,
    Response,
    Route,
    Router,
    Scope,
    Send,
    serve_lifespan,
)
from edge_gateway.net.http import (
    KEEP_ALIVE_TIMEOUT_S,
    READ_TIMEOUT_S,
    ApiError,
    ListenAddress,
    error_response,
    hypercorn_config,
    receive_body,
)
from edge_gateway.net.listen import bound_address, format_hostport, open_listeners, write_addr_file
from edge_gateway.net.tls import server_context

if TYPE_CHECKING:
    from hypercorn.config import Config as HypercornConfig

__all__ = ["HeadRelay", "MetadataApp", "MetadataServerConfig", "serve_metadata"]

log = logging.getLogger("edgegw.metadata")

DEFAULT_PORT: Final = 8471
GRACEFUL_TIMEOUT_S: Final = 3.0
_GATEWAY_VERSION_MAX: Final = 100
#: A rotated token's grace period by default: a day for every device to get the new one.
DEFAULT_KEEP_PREVIOUS_S: Final = 86_400
#: At most 30 days: a rotation that never ends is no rotation.
MAX_KEEP_PREVIOUS_S: Final = 30 * 86_400
_LAG_FIELDS_MAX: Final = 100
#: Verified tokens remembered at most (two per region during a rotation, and the
#: admin's): past it the cache starts again, and every token costs a check (and a
#: store lookup) again, so it must hold a whole fleet's (10,000 was one fleet's exactly).
_VERIFIED_MAX: Final = 250_000
#: A held heads poll watches for its client's hang-up after this long unanswered.
_UNWATCHED_WAIT_S: Final = 1.0
#: A watch's keep-alive interval when the request names no ``wait_ms``.
_WATCH_KEEPALIVE_MS: Final = 25_000
#: A watch whose line waits this long for the client to read it is dropped:
#: the server holds one line and the socket's buffer per watch, never a queue.
_WATCH_SEND_TIMEOUT_S: Final = 10.0
#: The watches' keep-alive lines are looked for this often (one sweep for all).
_KEEPALIVE_SWEEP_S: Final = 1.0
#: The protocol this server speaks (docs/metadata-api.md, "Protocol versions"),
#: named in the answers a gateway's client learns it from (heartbeats, head
#: reports, heads watches): 3 adds the head stream.
PROTOCOL: Final = HEAD_STREAM_PROTOCOL
_PROTOCOL: Final = (PROTOCOL_HEADER.encode(), b"%d" % PROTOCOL)
#: Heartbeats written to the store per worker-thread hop.
_HEARTBEAT_SLICE: Final = 100
#: How TLS errors name the certificate settings: the serve command's options.
_TLS_OPTIONS: Final = ("--tls-cert", "--tls-key", "--tls-client-ca")


@dataclass(frozen=True, slots=True)
class MetadataServerConfig(ListenAddress):
    """How ``edgegw metadata serve`` runs."""

    #: A SQLite file, or a ``postgresql://`` URL (several replicas may share it).
    db: Path | str
    #: ``host:port`` (``[v6]:port``); port 0 picks a free one.
    listen: str = f"127.0.0.1:{DEFAULT_PORT}"
    #: Stored hashed in the database; given once, it stays valid across restarts.
    admin_token: str | None = field(default=None, repr=False)
    certfile: Path | None = None
    keyfile: Path | None = None
    #: Write the bound URL here once listening (atomically).
    addr_file: Path | None = None
    max_body_bytes: int = 64 << 10
    #: Upper bound on ``GET /v1/heads``'s ``wait_ms``.
    max_wait_ms: int = 60_000
    #: Seconds an idle connection stays open: longer than the gateways' poll
    #: and heartbeat intervals, and than their pools keep a connection (30 s).
    keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S
    #: Seconds each read of a request body may wait for data (408 and close after).
    read_timeout_s: float = READ_TIMEOUT_S
    #: Requests in progress (held long polls apart) past which the server answers
    #: ``503 overloaded`` with ``Retry-After`` at once (docs/metadata.md, "Overload").
    max_inflight: int = 512
    #: Long polls held at once past which a new one gets the 503.
    max_long_polls: int = 50_000
    #: Tokens not seen before that may wait for their check (a store lookup, and
    #: scrypt for a hash an earlier server wrote) at once.
    max_verifying: int = 64
    #: The HTTP server: ``builtin`` (edgegw's own, :mod:`edge_gateway.net.http11`,
    #: as the gateway's local API) or ``hypercorn`` (~2x the CPU per request).
    server: str = "builtin"
    #: PostgreSQL: how often a replica polls for the others' changes (head
    #: reports, routing and token changes) when no notification came first.
    sync_interval_s: float = 1.0
    #: PostgreSQL: LISTEN for the others' notifications (off: poll only).
    sync_notify: bool = True

    def __post_init__(self) -> None:
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit() or int(port) > 65535:
            raise ConfigError(f"--listen: {self.listen!r} is not host:port")
        if (self.certfile is None) != (self.keyfile is None):
            raise ConfigError("TLS needs both a certificate and a key file")
        if self.admin_token is not None and len(self.admin_token) < 16:
            raise ConfigError("the admin token must be at least 16 characters long")
        if self.max_body_bytes < 1024:
            raise ConfigError("max_body_bytes must be at least 1 KiB")
        if self.server not in ("builtin", "hypercorn"):
            raise ConfigError(f"server must be 'builtin' or 'hypercorn', not {self.server!r}")
        for key in ("max_inflight", "max_long_polls", "max_verifying"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be at least 1")
        for key in ("keep_alive_timeout_s", "read_timeout_s"):
            if not 0 < getattr(self, key) < float("inf"):  # also refuses NaN
                raise ConfigError(f"{key} must be a number of seconds > 0")

    # The certificate settings as net.tls.server_context reads them (TlsSettings).
    @property
    def tls_cert(self) -> str:
        return str(self.certfile or "")

    @property
    def tls_key(self) -> str:
        return str(self.keyfile or "")

    @property
    def tls_client_ca(self) -> str:
        return ""  # the metadata server does not ask for client certificates


# -------------------------------------------------------------------- app


@dataclass(frozen=True, slots=True)
class Principal:
    """Who sent a request: the admin, or one region."""

    admin: bool
    region: str | None = None

    def describe(self) -> str:
        return "admin" if self.admin else f"region {self.region!r}"


_ADMIN: Final = Principal(admin=True)
_T = TypeVar("_T")
Handler = Callable[[Request, Principal], Awaitable[Response]]


class MetadataApp:
    """The metadata server's ASGI app over an open :class:`MetadataStore`."""

    def __init__(self, store: SqlStore, config: MetadataServerConfig) -> None:
        self.store = store
        self.config = config
        # Shared: versions are the store's (0: nothing seen yet; the first sync loads them).
        self.heads = HeadRelay(version=0 if store.shared else None)
        self._db_limiter = trio.CapacityLimiter(store.concurrency)
        #: With a shared store: head reports, routing and token changes across replicas.
        self.replicas: ReplicaSync | None = None
        if isinstance(store, PostgresStore):
            self.replicas = ReplicaSync(
                store,
                self.heads,
                run_db=self._db,
                on_routing_version=self._routing_moved,
                on_credentials_version=self._credentials_moved,
                interval_s=config.sync_interval_s,
                notify=config.sync_notify,
            )
        self.admission = Admission(
            max_inflight=config.max_inflight,
            max_long_polls=config.max_long_polls,
            max_verifying=config.max_verifying,
        )
        self.heartbeats = HeartbeatWriter()
        #: Heads watches streaming now; lines written; watches dropped as too slow.
        self.watches = 0
        self.watch_lines = 0
        self.watch_dropped = 0
        #: Head streams open now; their report lines read and ack lines written since the start.
        self.head_streams = 0
        self.stream_lines = 0
        self.stream_acks = 0
        #: Cancel scopes of the open head streams (a shutdown ends them at once).
        self._streams: set[trio.CancelScope] = set()
        # A legacy scrypt check takes 16 MiB and ~40 ms: a bounded number at once.
        self._hash_limiter = trio.CapacityLimiter(2)
        #: sha256(token) -> (principal, valid until ms or None), for tokens verified
        #: since the last credential change.
        self._verified: dict[bytes, tuple[Principal, int | None]] = {}
        self._token_generation = 0
        #: sha256(token) -> set when its check (in progress) ends.
        self._checking: dict[bytes, trio.Event] = {}
        self._admin_hash = store.admin_token_hash()
        self._routing = store.routing()
        #: The table's regions as a set: every region request checks it (a
        #: scan of the table's tuple was ~60 us at 10,000 regions).
        self._active_regions = frozenset(self._routing.regions)
        self._routing_body = _json_bytes(self._routing.to_json())
        self._routing_gzip = _gzip_body(self._routing_body)
        # The hot routes first: the table is matched in order (docs/metadata.md,
        # "What one server process does": most requests are these three).
        self.routes: list[Route] = [
            self._route("/v1/heads", "GET", self.wait_heads),
            self._route("/v1/regions/{region}/head", "POST", self.report_head),
            self._route("/v1/regions/{region}/head-stream", "POST", self.head_stream),
            self._route("/v1/regions/{region}/heartbeat", "POST", self.heartbeat),
            self._route("/v1/routing", "GET", self.get_routing),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            self._route("/v1/topics", "GET", self.list_topics),
            self._route("/v1/topics", "POST", self.create_topic, admin=True),
            self._route("/v1/topics/{topic}", "GET", self.get_topic),
            self._route("/v1/topics/{topic}", "PATCH", self.alter_topic, admin=True),
            self._route("/v1/topics/{topic}", "DELETE", self.delete_topic, admin=True),
            self._route("/v1/regions", "GET", self.list_regions),
            self._route("/v1/regions", "POST", self.add_region, admin=True),
            self._route("/v1/regions/{region}", "GET", self.get_region),
            self._route("/v1/regions/{region}", "DELETE", self.revoke_region, admin=True),
            self._route("/v1/regions/{region}/token", "POST", self.rotate_region_token, admin=True),
            self._route("/v1/buckets", "GET", self.list_buckets),
            self._route("/v1/buckets/{bucket}", "GET", self.get_bucket),
            self._route("/v1/buckets/{bucket}", "PUT", self.put_bucket, admin=True),
            self._route("/v1/buckets/{bucket}", "DELETE", self.delete_bucket, admin=True),
        ]
        self.router = Router(self.routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # hypercorn sends it; nothing to start or stop
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":  # a websocket: not served
            await send({"type": "websocket.close", "code": 1000})
            return
        x = _Exchange(scope, receive, send, self.config.read_timeout_s)
        if scope["path"] == "/healthz":  # never refused: the probe of an overloaded server
            await self._serve(x)
            return
        try:
            self.admission.enter()
        except Overloaded as exc:
            await self._shed(exc, x)
            return
        try:
            await self._serve(x)
        finally:
            self.admission.leave()

    async def _serve(self, x: _Exchange) -> None:
        """Route ``x`` and answer it; every error becomes its JSON answer."""
        method, path = x.scope["method"], x.scope["path"]
        match = self.router.match(method, path)
        try:
            if match.route is None:
                if match.allowed:
                    raise ApiError(
                        405,
                        "method_not_allowed",
                        f"{method} is not allowed on {path}",
                        {"Allow": ", ".join(match.allowed)},
                    )
                raise ApiError(404, "not_found", f"no such route: {path}")
            response = await match.route.endpoint(Request(x.scope, x.receive, match.params))
        except Exception as exc:  # noqa: BLE001 (every error is answered; _error_for logs the unexpected)
            response = self._error_for(exc, method, path)
        if isinstance(response, _HeadStream):
            # It bounds its reads itself: one deadline per stream, not a scope per read.
            await response(x.scope, x.receive_unbounded, x.send)
            return
        await response(x.scope, x.receive, x.send)

    async def _shed(self, exc: Overloaded, x: _Exchange) -> None:
        """Answer 503 before any work; read a small body first so the connection stays usable."""
        size = 0
        while not x.body_done and size <= self.config.max_body_bytes:
            message = await x.receive()
            size += len(message.get("body", b""))
            if message["type"] != "http.request":
                return  # the client went away
        await _overloaded_response(exc)(x.scope, x.receive, x.send)

    @property
    def open_mode(self) -> bool:
        """No admin token: requests without a token act as admin (loopback only)."""
        return self._admin_hash is None

    def begin_shutdown(self) -> None:
        self.heads.close()
        for scope in list(self._streams):
            scope.cancel()

    async def run_background(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The server's own tasks (the heartbeat write-behind, the watches'
        keep-alives) until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sweep_keepalives)
            task_status.started()
            await self.heartbeats.run(self._write_heartbeats)

    async def _sweep_keepalives(self) -> None:
        while True:
            await trio.sleep(_KEEPALIVE_SWEEP_S)
            self.heads.sweep_keepalives(trio.current_time())

    async def _write_heartbeats(self, batch: dict[str, Heartbeat]) -> None:
        # In slices: other store calls (a token's lookup, a topic change) wait
        # for one slice at most, not for a fleet's worth of heartbeats.
        items = list(batch.items())
        for i in range(0, len(items), _HEARTBEAT_SLICE):
            try:
                await self._db(self.write_heartbeats_now, dict(items[i : i + _HEARTBEAT_SLICE]))
            except Unavailable as exc:
                # The database is away (PostgreSQL): the gateways heartbeat again
                # in seconds; the server must not stop for it.
                log.warning("heartbeats of %d regions not written: %s", len(items) - i, exc)
                return

    def write_heartbeats_now(self, batch: dict[str, Heartbeat]) -> None:
        """Store ``batch`` (blocking: a worker thread, or the last flush at shutdown)."""
        self.store.heartbeats(
            [(region, b.gateway_version, b.lag, b.now_ms) for region, b in batch.items()]
        )

    # ------------------------------------------------------------ plumbing

    def _route(self, path: str, method: str, handler: Handler, *, admin: bool = False) -> Route:
        async def endpoint(request: Request) -> Response:
            who = await self._authenticate(request.headers.get("authorization"))
            if admin and not who.admin:
                raise ApiError(
                    403, "forbidden", f"{method} {path} needs the admin token, not {who.describe()}"
                )
            return await handler(request, who)

        endpoint.__name__ = handler.__name__
        return Route(path, endpoint, methods=[method])

    async def _db(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await trio.to_thread.run_sync(
            lambda: fn(*args), limiter=self._db_limiter, abandon_on_cancel=False
        )

    async def _changed(self) -> None:
        """Re-read the routing table after a change (and forget verified tokens)."""
        self._routing = await self._db(self.store.routing)
        self._active_regions = frozenset(self._routing.regions)
        self._routing_body = _json_bytes(self._routing.to_json())
        self._routing_gzip = _gzip_body(self._routing_body)

    async def _routing_moved(self, version: int) -> None:
        """Another replica changed the routing table."""
        if version != self._routing.version:
            await self._changed()

    async def _credentials_moved(self, version: int) -> None:
        """Another replica added, revoked or rotated a token (or the admin token changed)."""
        self._forget_tokens()
        self._admin_hash = await self._db(self.store.admin_token_hash)

    async def _report_head(
        self, region: str, seq: int, received_at: float | None = None
    ) -> tuple[int, int]:
        """(head seq, relay version) after recording ``region``'s head."""
        if self.replicas is not None:
            return await self.replicas.publish(region, seq)
        return self.heads.report(region, seq, received_at)

    async def _authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            if self.open_mode:
                return _ADMIN
            raise _unauthorized("this server needs a bearer token")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > 512:
            raise _unauthorized("send 'Authorization: Bearer <token>'")
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        known = self._verified.get(key)
        if known is not None and (known[1] is None or _now_ms() < known[1]):
            return known[0]
        checking = self._checking.get(key)
        if checking is not None:
            # The same token is being checked for another request (a gateway's
            # first requests, or a fleet sharing one token, after a restart):
            # one lookup (and check) for all of them, then the cache answers.
            await checking.wait()
            return await self._authenticate(authorization)
        generation = self._token_generation
        self.admission.start_verify()
        self._checking[key] = done = trio.Event()
        try:
            verified = await self._verify(token)
        finally:
            del self._checking[key]
            done.set()
            self.admission.end_verify()
        if verified is None:
            raise _unauthorized("unknown or revoked token (or one rotated out)")
        # Remember it only if no region was added, revoked or rotated meanwhile
        # (else a token revoked during the check would stay valid in the cache).
        if generation == self._token_generation:
            if len(self._verified) >= _VERIFIED_MAX:
                self._verified.clear()
            self._verified[key] = verified
        return verified[0]

    async def _verify(self, token: str) -> tuple[Principal, int | None] | None:
        """Who ``token`` is, and until when (ms; None: until revoked or rotated)."""
        token_id = split_region_token(token)
        if token_id is not None:
            found = await self._db(self.store.region_token, token_id, _now_ms())
            if found is not None:
                region, stored, until = found
                if await self._check_hash(token, stored):
                    return Principal(admin=False, region=region), until
            return None
        admin_hash = self._admin_hash
        if admin_hash is not None and await self._check_hash(token, admin_hash):
            return _ADMIN, None
        return None

    async def _check_hash(self, token: str, stored: str) -> bool:
        if not is_legacy_hash(stored):
            return verify_token(token, stored)  # salted SHA-256: ~1 µs, no thread
        if not await trio.to_thread.run_sync(
            verify_token, token, stored, limiter=self._hash_limiter
        ):
            return False
        await self._upgrade_hash(token, stored)
        return True

    async def _upgrade_hash(self, token: str, stored: str) -> None:
        """Replace a verified scrypt hash by a SHA-256 one: the token's next check
        (after a restart, on another replica) costs microseconds, not ~40 ms."""
        new = hash_token(token)
        try:
            upgraded = await self._db(self.store.upgrade_token_hash, stored, new)
        except Unavailable as exc:  # the database is away: the next check upgrades it
            log.debug("token hash not upgraded: %s", exc)
            return
        if upgraded and self._admin_hash == stored:
            self._admin_hash = new

    def _forget_tokens(self) -> None:
        self._token_generation += 1
        self._verified.clear()

    async def _json_body(self, request: Request) -> dict[str, Any]:
        media = request.headers.get("content-type")
        if media is not None and media.split(";", 1)[0].strip().lower() != "application/json":
            raise ApiError(
                415, "unsupported_media_type", f"Content-Type must be application/json, not {media}"
            )
        limit = self.config.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise ApiError(400, "invalid_request", "bad Content-Length")
            if int(length) > limit:
                raise _too_large(int(length), limit)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await request.receive()
            if message["type"] != "http.request":
                raise ApiError(400, "invalid_request", "the client went away mid-body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if not body:
            raise ApiError(400, "invalid_json", "the request needs a JSON object body")
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ApiError(400, "invalid_json", "the body must be a JSON object")
        return doc

    # -------------------------------------------------------------- errors

    def _error_for(self, exc: Exception, method: str, path: str) -> Response:
        """The answer to an exception an endpoint raised (its class decides)."""
        if isinstance(exc, ApiError):
            return error_response(exc.status, exc.code, exc.message, exc.headers)
        if isinstance(exc, Refused):
            return error_response(exc.status, exc.code, str(exc))
        if isinstance(exc, InvalidInput):
            code = "invalid_name" if isinstance(exc, InvalidName) else "invalid_request"
            return error_response(400, code, str(exc))
        if isinstance(exc, Overloaded):
            return _overloaded_response(exc)
        if isinstance(exc, ClosedError):
            return error_response(
                503, "unavailable", "the server is stopping", {"Retry-After": "1"}
            )
        if isinstance(exc, Unavailable):
            log.warning("%s %s: %s", method, path, exc)
            return error_response(
                503, "unavailable", "the metadata database is unavailable", {"Retry-After": "1"}
            )
        log.error("internal error serving %s %s", method, path, exc_info=exc)
        return error_response(500, "internal", "internal error (see the server's log)")

    # ------------------------------------------------------------ endpoints

    async def healthz(self, request: Request) -> Response:
        a = self.admission.statistics()
        return JSONResponse(
            {
                "status": "ok",
                "routing_version": self._routing.version,
                # Held polls and watches: each gateway holds one or the other.
                "long_polls": self.admission.long_polls,
                "watches": self.watches,
                "head_streams": self.head_streams,
                "stream_lines": self.stream_lines,
                "stream_acks": self.stream_acks,
                "inflight": a.inflight,
                "shed": a.shed,
                "watch_lines": self.watch_lines + self.heads.direct_lines,
                "watch_lines_direct": self.heads.direct_lines,
                # Report received -> its line written to a watch (per watch):
                # cumulative counts per bucket of LatencyHistogram.BOUNDS_US.
                "line_latency_counts": self.heads.line_latency.counts,
                "line_latency_p50_ms": _ms(self.heads.line_latency.quantile(0.5)),
                "line_latency_p99_ms": _ms(self.heads.line_latency.quantile(0.99)),
                # The collector's pauses since the server listened (edge_gateway.pygc).
                "python_gc": pygc.statistics(),
                # PostgreSQL replicas: the group commit's and the sync's figures.
                "replica_sync": (
                    None if self.replicas is None else asdict(self.replicas.statistics())
                ),
            }
        )

    async def openapi(self, request: Request) -> Response:
        from edge_gateway.metadata._openapi import openapi_document

        return JSONResponse(openapi_document())

    async def get_routing(self, request: Request, who: Principal) -> Response:
        etag = f'"{self._routing.version}"'
        headers = {"ETag": etag, "Cache-Control": "no-cache"}
        if _etag_matches(request.headers.get("if-none-match"), etag):
            return Response(status_code=304, headers=headers)
        if self._routing_gzip is not None and _accepts_gzip(request.headers.get("accept-encoding")):
            # A fleet fetches the whole table after every change (and each gateway at
            # its start): ~1 MB for 10,000 regions and topics, ~10x less gzipped.
            headers["Content-Encoding"] = "gzip"
            headers["Vary"] = "Accept-Encoding"
            return Response(self._routing_gzip, media_type="application/json", headers=headers)
        return Response(self._routing_body, media_type="application/json", headers=headers)

    async def list_topics(self, request: Request, who: Principal) -> Response:
        return JSONResponse({"topics": [t.to_json() for t in self._routing.topics]})

    async def get_topic(self, request: Request, who: Principal) -> Response:
        topic = await self._db(self.store.topic, request.path_params["topic"])
        return JSONResponse(topic.to_json())

    async def create_topic(self, request: Request, who: Principal) -> Response:
        doc = await self._json_body(request)
        doc.setdefault("partitions", 1)
        doc.setdefault("subscribers", [])
        doc.setdefault("retention_ms", None)
        # Created topics follow the stricter rule for topics homed in a region
        # (no '.'); TopicRoute accepts any topic name, for tables already stored.
        validate_home_topic(doc.get("name"))
        topic = TopicRoute.from_json(doc)
        await self._db(self.store.create_topic, topic, _now_ms())
        await self._changed()
        log.info("topic %s created (home %s) by %s", topic.name, topic.home, who.describe())
        return JSONResponse(topic.to_json(), 201, headers={"Location": f"/v1/topics/{topic.name}"})

    async def alter_topic(self, request: Request, who: Principal) -> Response:
        name = validate_topic(request.path_params["topic"])
        doc = await self._json_body(request)
        topic = await self._db(self.store.alter_topic, name, doc, _now_ms())
        await self._changed()
        return JSONResponse(topic.to_json())

    async def delete_topic(self, request: Request, who: Principal) -> Response:
        name = validate_topic(request.path_params["topic"])
        await self._db(self.store.delete_topic, name)
        await self._changed()
        log.info("topic %s deleted by %s", name, who.describe())
        return Response(status_code=204)

    async def list_regions(self, request: Request, who: Principal) -> Response:
        return JSONResponse({"regions": await self._with_heads(await self._db(self.store.regions))})

    async def get_region(self, request: Request, who: Principal) -> Response:
        region = validate_region(request.path_params["region"])
        row = await self._db(self.store.region, region)
        return JSONResponse((await self._with_heads([row]))[0])

    async def _with_heads(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        heads = self.heads.heads_since(0, None).heads
        out = []
        for r in rows:
            beat = self.heartbeats.pending(r["id"])
            if beat is not None and r["status"] == "active":  # not written to the store yet
                r = {
                    **r,
                    "last_heartbeat_ms": beat.now_ms,
                    "gateway_version": beat.gateway_version,
                    "lag": dict(beat.lag),
                }
            out.append({**r, "head_seq": heads.get(r["id"])})
        return out

    async def add_region(self, request: Request, who: Principal) -> Response:
        doc = await self._json_body(request)
        if set(doc) - {"id"}:
            raise InvalidInput(f"unknown field(s) {sorted(set(doc) - {'id'})}")
        region = validate_region(doc.get("id"))
        token = await self._db(self.store.add_region, region, _now_ms())
        self._forget_tokens()
        await self._changed()
        log.info("region %s added by %s", region, who.describe())
        return JSONResponse(
            {"id": region, "token": token}, 201, headers={"Location": f"/v1/regions/{region}"}
        )

    async def rotate_region_token(self, request: Request, who: Principal) -> Response:
        region = validate_region(request.path_params["region"])
        doc = await self._json_body(request)
        if set(doc) - {"keep_previous_s"}:
            raise InvalidInput(f"unknown field(s) {sorted(set(doc) - {'keep_previous_s'})}")
        keep_s = doc.get("keep_previous_s", DEFAULT_KEEP_PREVIOUS_S)
        if (
            not isinstance(keep_s, int)
            or isinstance(keep_s, bool)
            or not 0 <= keep_s <= MAX_KEEP_PREVIOUS_S
        ):
            raise InvalidInput(
                f"keep_previous_s must be an integer from 0 to {MAX_KEEP_PREVIOUS_S}, "
                f"got {keep_s!r}"
            )
        now = _now_ms()
        token = await self._db(self.store.rotate_region_token, region, now, keep_s * 1000)
        self._forget_tokens()
        log.info(
            "region %s: token rotated by %s (the previous one valid %d s more)",
            region,
            who.describe(),
            keep_s,
        )
        return JSONResponse(
            {
                "id": region,
                "token": token,
                "previous_valid_until_ms": now + keep_s * 1000 if keep_s else None,
            }
        )

    async def revoke_region(self, request: Request, who: Principal) -> Response:
        region = validate_region(request.path_params["region"])
        await self._db(self.store.revoke_region, region, _now_ms())
        self._forget_tokens()
        await self._changed()
        log.info("region %s revoked by %s", region, who.describe())
        return Response(status_code=204)

    def _as_region(self, request: Request, who: Principal) -> str:
        return self._as_region_of(validate_region(request.path_params["region"]), who)

    def _as_region_of(self, region: str, who: Principal) -> str:
        """``region``, if ``who`` may act as it and it is active (else 403 or 404)."""
        if not who.admin and who.region != region:
            raise ApiError(403, "forbidden", f"{who.describe()} cannot act as region {region!r}")
        if region not in self._active_regions:
            raise Refused(404, "unknown_region", f"unknown or revoked region {region!r}")
        return region

    async def heartbeat(self, request: Request, who: Principal) -> Response:
        region = self._as_region(request, who)
        doc = await self._json_body(request)
        extra = set(doc) - {"gateway_version", "lag", "head_seq"}
        if extra:
            raise InvalidInput(f"heartbeat: unknown field(s) {sorted(extra)}")
        version = doc.get("gateway_version", "")
        # Printable: a NUL, say, is no version, and PostgreSQL cannot store it.
        if (
            not isinstance(version, str)
            or len(version) > _GATEWAY_VERSION_MAX
            or not version.isprintable()
        ):
            raise InvalidInput(
                "heartbeat: gateway_version must be a printable string of at most "
                f"{_GATEWAY_VERSION_MAX}"
            )
        lag = _lag(doc.get("lag", {}))
        head = doc.get("head_seq")
        if head is not None:
            await self._report_head(region, _seq(head))
        # Answered from memory; written to the store behind, coalesced (_fanout.HeartbeatWriter).
        self.heartbeats.note(region, Heartbeat(version, lag, _now_ms()))
        return heartbeat_answer(self._routing.version, _now_ms())

    async def report_head(self, request: Request, who: Principal) -> Response:
        received_at = time.perf_counter()
        region = self._as_region(request, who)
        doc = await self._json_body(request)
        if set(doc) != {"seq"}:
            raise InvalidInput('head: the body is {"seq": <latest committed log seq>}')
        seq, version = await self._report_head(region, _seq(doc["seq"]), received_at)
        return head_answer(region, seq, version)

    async def head_stream(self, request: Request, who: Principal) -> Response:
        region = self._as_region(request, who)
        media = request.headers.get("content-type")
        if media is None or media.split(";", 1)[0].strip().lower() != STREAM_MEDIA_TYPE:
            raise ApiError(
                415,
                "unsupported_media_type",
                f"a head stream's Content-Type must be {STREAM_MEDIA_TYPE}, not {media}",
            )
        return _HeadStream(self, region, request.headers.get("authorization"))

    async def wait_heads(self, request: Request, who: Principal) -> Response:
        q = request.query_params
        since = _int_param(q.get("since"), "since", 0, 2**62, default=0)
        wait_ms = _int_param(q.get("wait_ms"), "wait_ms", 0, self.config.max_wait_ms, default=0)
        watch = q.get("watch", "0")
        if watch not in ("0", "1"):
            raise InvalidInput(f"watch must be 0 or 1, not {watch[:30]!r}")
        listed = q.get("regions")
        regions = None
        if listed:
            regions = frozenset(validate_region(r) for r in listed.split(",") if r)
        if self.replicas is not None and since > self.heads.version:
            # A version from a replica ahead of this one: catch up before
            # deciding it comes from the future.
            await self.replicas.catch_up()
        if watch == "1":
            return _HeadsWatch(self, since, regions, (wait_ms or _WATCH_KEEPALIVE_MS) / 1000)
        update = self.heads.heads_since(since, regions)
        if not update.heads and wait_ms > 0:
            # Parked, the poll no longer counts as a request in progress; the
            # check above and the wait's own check run with no checkpoint between.
            self.admission.park()
            try:
                gone = trio.Event()
                wait_s = wait_ms / 1000
                # Most polls of a shipping fleet are answered within a second:
                # they wait without a watcher (a task and a nursery per poll
                # cost ~40 % more CPU per request and ~7 KB per poll, measured).
                quick_s = min(wait_s, _UNWATCHED_WAIT_S)
                update = await self.heads.wait_heads(since, regions, quick_s)
                if not update.heads and wait_s > quick_s:
                    async with trio.open_nursery() as nursery:
                        # A client that hangs up (a gateway restarting, a herd's
                        # timed-out retries) ends its poll at once: it no longer
                        # holds a place, memory and a connection until wait_ms.
                        nursery.start_soon(
                            _wait_disconnect, request.receive, gone, nursery.cancel_scope
                        )
                        # Its own check first: nothing reported meanwhile is missed.
                        update = await self.heads.wait_heads(since, regions, wait_s - quick_s)
                        nursery.cancel_scope.cancel()
            finally:
                self.admission.unpark()
            if gone.is_set():
                # Nobody to answer: the HTTP server sends nothing to a client gone.
                return Response(status_code=204)
        return heads_answer(update.version, update.heads)

    async def list_buckets(self, request: Request, who: Principal) -> Response:
        return JSONResponse({"buckets": [b.to_json() for b in self._routing.buckets]})

    async def get_bucket(self, request: Request, who: Principal) -> Response:
        name = validate_bucket_name(request.path_params["bucket"])
        return JSONResponse((await self._db(self.store.bucket, name)).to_json())

    async def put_bucket(self, request: Request, who: Principal) -> Response:
        name = validate_bucket_name(request.path_params["bucket"])
        settings = parse_bucket_settings(await self._json_body(request))
        created = await self._db(self.store.put_bucket, name, settings)
        await self._changed()
        return JSONResponse({"name": name, **settings}, 201 if created else 200)

    async def delete_bucket(self, request: Request, who: Principal) -> Response:
        name = validate_bucket_name(request.path_params["bucket"])
        await self._db(self.store.delete_bucket, name)
        await self._changed()
        return Response(status_code=204)


def create_app(store: SqlStore, config: MetadataServerConfig) -> MetadataApp:
    return MetadataApp(store, config)


# ---------------------------------------------------------------- helpers


class _Exchange:
    """One request on its way through the app: its body's reads and the response's start.

    Each read of a body still arriving waits at most ``read_timeout``
    (:func:`~edge_gateway.net.http.receive_body`: ``408`` after it). A
    response that starts before the request body was read to the end (a
    refusal, a 413) says ``Connection: close``: hypercorn drops such a
    connection, so the client must not send its next request on it. A body
    the builtin server read with the head (:data:`~edge_gateway.net.asgi.BUFFERED_BODY`)
    is in hand: taken without a read, and the connection stays usable
    whatever the answer.
    """

    __slots__ = ("_buffered", "_receive", "_send", "body_done", "read_timeout", "scope")

    def __init__(self, scope: Scope, receive: Receive, send: Send, read_timeout: float) -> None:
        self.scope = scope
        self._receive = receive
        self._send = send
        self.read_timeout = read_timeout
        extensions = scope.get("extensions")
        #: The whole body, when the server read it with the head (the builtin server).
        self._buffered: bytes | None = extensions.get(BUFFERED_BODY) if extensions else None
        self.body_done = self._buffered is not None or (
            scope["method"] in ("GET", "HEAD", "DELETE")
            and not any(k in (b"content-length", b"transfer-encoding") for k, _ in scope["headers"])
        )

    async def receive(self) -> Message:
        if self._buffered is not None:
            # The server's own receive() would return it first too: a
            # disconnect watcher reading past it skips it.
            body, self._buffered = self._buffered, None
            return {"type": "http.request", "body": body, "more_body": False}
        if self.body_done:  # only a disconnect is left to wait for: no deadline
            return await self._receive()
        try:
            message = await receive_body(self._receive, self.read_timeout)
        except ApiError:
            self.body_done = True  # the 408 says Connection: close already
            raise
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.body_done = True
        return message

    async def receive_unbounded(self) -> Message:
        """:meth:`receive` without its deadline: the caller bounds its reads."""
        if self._buffered is not None or self.body_done:
            return await self.receive()
        message = await self._receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.body_done = True
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and not self.body_done:
            headers = [*message.get("headers", ()), (b"connection", b"close")]
            message = {**message, "headers": headers}
        await self._send(message)


async def _wait_disconnect(receive: Receive, gone: trio.Event, scope: trio.CancelScope) -> None:
    """Set ``gone`` and cancel ``scope`` when the client of a request (``receive``) goes away."""
    while (await receive())["type"] != "http.disconnect":
        pass  # the (empty) body of the GET
    gone.set()
    scope.cancel()


def _held_headers(media_type: str) -> list[tuple[bytes, bytes]]:
    """The head of a held response (a watch, a head stream): framed chunked, never cached."""
    return [(b"content-type", media_type.encode()), (b"cache-control", b"no-store"), _PROTOCOL]


async def _park_or_refuse(app: MetadataApp, scope: Scope, receive: Receive, send: Send) -> bool:
    """Count a held request as a long poll (True), or answer ``503 overloaded`` (False)."""
    try:
        app.admission.park()
    except Overloaded as exc:
        await _overloaded_response(exc)(scope, receive, send)
        return False
    return True


class _HeadsWatch(Response):
    """The answer to ``GET /v1/heads?watch=1``: NDJSON lines of heads until the client leaves.

    One held response per gateway instead of a long poll re-sent after every
    wake (docs/metadata.md, "The heads watch"): each change of the watched
    heads is one line written on it, no request. Lines coalesce by
    construction: the next line is the heads moved since the version of the
    last one written, so changes made while a line is being written (or
    while the task waits for its turn) become one line, and what a watch holds
    is one line, never a queue. A line the client does not take within
    :data:`_WATCH_SEND_TIMEOUT_S` drops the connection (a slow or dead
    reader); its client resumes from the last version it read. After
    ``keepalive_s`` without a change a line with no heads is written, so both
    ends notice a dead connection.
    """

    __slots__ = ("_app", "_keepalive_s", "_regions", "_since")

    def __init__(
        self, app: MetadataApp, since: int, regions: frozenset[str] | None, keepalive_s: float
    ) -> None:
        self.status_code = 200
        self.body = b""
        # No content-length: the server frames the body chunked.
        self.headers = _held_headers(WATCH_MEDIA_TYPE)
        self._app = app
        self._since = since
        self._regions = regions
        self._keepalive_s = keepalive_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self._app
        if not await _park_or_refuse(app, scope, receive, send):
            return
        app.watches += 1
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            finished = True
            gone = trio.Event()
            extensions = scope.get("extensions")
            send_nowait = extensions.get(SEND_NOWAIT) if extensions else None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_wait_disconnect, receive, gone, nursery.cancel_scope)
                finished = await self._stream(send, send_nowait)
                nursery.cancel_scope.cancel()
            if finished and not gone.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            # else: a client gone, or too slow: returning unfinished makes the
            # server drop the connection (there is nobody to end the body for).
        finally:
            app.watches -= 1
            app.admission.unpark()

    async def _stream(self, send: Send, send_nowait: Callable[[bytes], bool] | None) -> bool:
        """Write lines until the server stops (True) or the client is too slow (False).

        The watch stays registered with the relay throughout: while this task
        is parked and in step, reports write their lines themselves
        (:class:`~._fanout.HeadWatch`); this task writes the first line, the
        keep-alives, and whatever a report could not (a socket that did not
        take a whole line, heads from another replica).
        """
        app, relay = self._app, self._app.heads
        watch = HeadWatch(self._regions, self._since, send_nowait, self._keepalive_s)
        relay.add_watch(watch)
        try:
            due = True  # the first line goes at once, heads or not
            while True:
                update = relay.heads_since(watch.since, self._regions)
                # Nothing moved and no keep-alive due: an empty chunk sends
                # what the socket did not take of a report's line (if any).
                line = encode_heads(update.version, update.heads) if update.heads or due else b""
                with trio.move_on_after(_WATCH_SEND_TIMEOUT_S) as timer:
                    await send({"type": "http.response.body", "body": line, "more_body": True})
                if timer.cancelled_caught:
                    app.watch_dropped += 1
                    log.info(
                        "heads watch dropped: its client read nothing for %g s",
                        _WATCH_SEND_TIMEOUT_S,
                    )
                    return False
                if line:
                    app.watch_lines += 1
                    watch.since = update.version
                relay.line_written(watch)
                if relay.closed:
                    return True
                if watch.event.is_set():  # moved while the line was written
                    watch.event = trio.Event()
                    due = False
                    continue
                # No checkpoint from the check above to here: no move falls between.
                # No timer either: the relay's keep-alive sweep wakes the task (or
                # writes the line itself) once keepalive_s passed without a line.
                watch.rearm()
                await watch.event.wait()
                due = not relay.closed and watch.keepalive_due(trio.current_time())
                watch.direct = False
                watch.event = trio.Event()
        finally:
            relay.remove_watch(watch)


class _HeadStream(Response):
    """The answer to ``POST /v1/regions/{region}/head-stream`` (protocol 3): an ack per read.

    Head reports on one long-lived request instead of one request each
    (docs/metadata.md, "The head stream"): each report line costs a piece of
    a chunked body read and a small write, not a request head to read,
    route, authenticate and answer. The lines that arrive together (one read
    of the socket) are applied as one report of the highest seq (heads only
    grow: a lower seq changes nothing) and answered with one ack line; on
    PostgreSQL the report joins the replica's group commit, and the ack is
    written once it committed. The token is checked again whenever tokens
    changed (a region added, revoked or rotated): a revoked one ends the
    stream with an ``unauthorized`` line. A bad line ends the stream with an
    error line (the lines before it were applied). A stream idle for the
    read timeout (60 s; or whose client reads no acks for as long) ends; so
    do all of them when the server stops.
    """

    __slots__ = ("_app", "_authorization", "_region")

    def __init__(self, app: MetadataApp, region: str, authorization: str | None) -> None:
        self.status_code = 200
        self.body = b""
        self.headers = _held_headers(STREAM_MEDIA_TYPE)
        self._app = app
        self._region = region
        self._authorization = authorization

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self._app
        if not await _park_or_refuse(app, scope, receive, send):
            return
        app.head_streams += 1
        try:
            # The head now: the client knows the stream is taken before its first line.
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            await send({"type": "http.response.body", "body": b"", "more_body": True})
            # One scope for the stream: the server's stop cancels it, and its
            # deadline, moved on by each read, ends a stream idle (or whose
            # client reads no acks) for the read timeout.
            with trio.CancelScope() as held:
                app._streams.add(held)
                try:
                    finished = await self._serve_lines(receive, send, held)
                finally:
                    app._streams.discard(held)
            if held.cancelled_caught:
                finished = True  # stopping, or idle: end the response; the client reconnects
            if finished:
                with trio.move_on_after(1.0):  # a client that reads nothing: dropped
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            # else: the client went away (or reads nothing): the server drops the connection.
        finally:
            app.head_streams -= 1
            app.admission.unpark()

    async def _serve_lines(self, receive: Receive, send: Send, held: trio.CancelScope) -> bool:
        """Read, apply and ack until the stream ends (True: end the response; False: drop)."""
        app, region = self._app, self._region
        reader = ReportReader()
        acked = 0
        generation = app._token_generation
        timeout = app.config.read_timeout_s
        held.deadline = trio.current_time() + timeout
        while True:
            message = await receive()
            received_at = time.perf_counter()
            now = trio.current_time()
            if held.deadline - now < timeout / 2:  # moved on now and then, not per read
                held.deadline = now + timeout
            if message["type"] != "http.request":
                return False  # the client went away (a line cut midway is not applied)
            more = message.get("more_body", False)
            error: bytes | None = None
            try:
                seqs = reader.feed(message.get("body", b""))
                if not more:
                    reader.end()
            except BadReportLine as exc:
                seqs = reader.good
                error = encode_error(acked + len(seqs), exc.code, exc.message)
            if seqs and app._token_generation != generation:
                # Tokens changed since this stream's last check: check again.
                generation = app._token_generation
                try:
                    who = await app._authenticate(self._authorization)
                    region = app._as_region_of(region, who)
                except (ApiError, Refused) as exc:
                    text = exc.message if isinstance(exc, ApiError) else str(exc)
                    log.info(
                        "head stream of %s ended: %s (%d %s)", region, text, exc.status, exc.code
                    )
                    return await _end_with(send, encode_error(acked, exc.code, text))
                except Overloaded as exc:
                    line = encode_error(acked, "overloaded", str(exc), exc.retry_after_s)
                    return await _end_with(send, line)
                except Unavailable:
                    line = encode_error(
                        acked, "unavailable", "the metadata database is unavailable", 1
                    )
                    return await _end_with(send, line)
            if seqs:
                try:
                    seq, version = await app._report_head(region, max(seqs), received_at)
                except ClosedError:
                    return True
                except Unavailable as exc:
                    log.warning("head stream of %s: %s", region, exc)
                    line = encode_error(
                        acked, "unavailable", "the metadata database is unavailable", 1
                    )
                    return await _end_with(send, line)
                acked += len(seqs)
                app.stream_lines += len(seqs)
                app.stream_acks += 1
                await _send_line(send, encode_ack(acked, seq, version))
            if error is not None:
                log.info("head stream of %s: bad line: %s", region, error.decode()[:200])
                return await _end_with(send, error)
            if not more:
                return True


async def _send_line(send: Send, line: bytes) -> None:
    """Write ``line`` of a head stream (its deadline bounds a client that reads nothing)."""
    await send({"type": "http.response.body", "body": line, "more_body": True})


async def _end_with(send: Send, line: bytes) -> bool:
    """Write the error line that ends a stream; True: end the response after it."""
    await _send_line(send, line)
    return True


def served_routes(app: MetadataApp) -> set[tuple[str, str]]:
    """(path, method) pairs the app serves (for the OpenAPI check)."""
    return {(r.path, m) for r in app.routes for m in r.methods if m != "HEAD"}


def _json_bytes(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _as_json_response(doc: object) -> bytes:
    """``doc`` rendered as :class:`JSONResponse` renders it (compact UTF-8, no NaN)."""
    return json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


_JSON_TYPE: Final = (b"content-type", b"application/json")


def _json_bytes_response(body: bytes) -> Response:
    return Response.of(body, [(b"content-length", b"%d" % len(body)), _JSON_TYPE])


# The answers of the hot routes (heartbeats, head reports, head polls: nearly
# every request of a fleet), rendered without a dict to render and headers to
# normalise: the same bytes and headers as JSONResponse of the same document
# (tests/metadata/test_hot_answers.py).


def heartbeat_answer(routing_version: int, server_ms: int) -> Response:
    """``{"routing_version": ..., "server_ms": ...}``, naming the server's protocol."""
    body = b'{"routing_version":%d,"server_ms":%d}' % (routing_version, server_ms)
    return Response.of(body, [(b"content-length", b"%d" % len(body)), _JSON_TYPE, _PROTOCOL])


def head_answer(region: str, seq: int, version: int) -> Response:
    """``{"region": ..., "seq": ..., "version": ...}``, naming the server's protocol."""
    body = b'{"region":%b,"seq":%d,"version":%d}' % (_as_json_response(region), seq, version)
    return Response.of(body, [(b"content-length", b"%d" % len(body)), _JSON_TYPE, _PROTOCOL])


def heads_answer(version: int, heads: Mapping[str, int]) -> Response:
    """``{"version": ..., "heads": {region: seq, ...}}``."""
    return _json_bytes_response(b'{"version":%d,"heads":%b}' % (version, _as_json_response(heads)))


#: Routing tables smaller than this are sent as they are (gzip would not pay).
_GZIP_MIN_BYTES: Final = 4096


def _gzip_body(body: bytes) -> bytes | None:
    """``body`` gzipped once per routing version (None when small)."""
    if len(body) < _GZIP_MIN_BYTES:
        return None
    return gzip.compress(body, compresslevel=6, mtime=0)


def _accepts_gzip(header: str | None) -> bool:
    if not header:
        return False
    for item in header.split(","):
        coding, _, params = item.partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            return params.strip().replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


def _etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    for candidate in header.split(","):
        c = candidate.strip()
        if c == "*" or c.removeprefix("W/") == etag:
            return True
    return False


def _overloaded_response(exc: Overloaded) -> Response:
    return error_response(
        503,
        "overloaded",
        f"the metadata server is overloaded ({exc.what}); retry after {exc.retry_after_s} s",
        {"Retry-After": str(exc.retry_after_s)},
    )


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, {"WWW-Authenticate": 'Bearer realm="edgegw"'})


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        413, "body_too_large", f"request body of {size}+ bytes exceeds the limit of {limit}"
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _seq(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidInput(f"seq must be an integer >= 0, not {value!r}")
    return value


def _lag(value: object) -> dict[str, float]:
    if not isinstance(value, dict) or len(value) > _LAG_FIELDS_MAX:
        raise InvalidInput(f"heartbeat: lag must be an object of at most {_LAG_FIELDS_MAX} numbers")
    out: dict[str, float] = {}
    for k, v in value.items():
        if len(k) > 200 or isinstance(v, bool) or not isinstance(v, int | float):
            raise InvalidInput(f"heartbeat: lag[{k[:50]!r}] must be a number")
        if not math.isfinite(v):  # NaN/inf are not JSON
            raise InvalidInput(f"heartbeat: lag[{k[:50]!r}] must be finite")
        out[k] = float(v)
    return out


def _int_param(text: str | None, name: str, lo: int, hi: int, *, default: int) -> int:
    if text is None or text == "":
        return default
    if not text.isdigit() or len(text) > 20 or not lo <= int(text) <= hi:
        raise InvalidInput(f"{name} must be an integer in {lo}..{hi}, not {text[:30]!r}")
    return int(text)


# ---------------------------------------------------------------- serving


def _hypercorn_config(config: MetadataServerConfig) -> HypercornConfig:
    # The keep-alive outlasts the gateways' pooled connections (see
    # edge_gateway.net.http): with hypercorn's default of 5 s, equal to the
    # gateways' poll interval, the server closed connections just as a
    # gateway reused them and the gateway reported the server unreachable.
    cfg = hypercorn_config(
        config.listen,
        errorlog="edgegw.metadata.server",
        graceful_timeout=GRACEFUL_TIMEOUT_S,
        keep_alive_timeout=config.keep_alive_timeout_s,
    )
    if config.certfile is not None and config.keyfile is not None:
        cfg.certfile = str(config.certfile)
        cfg.keyfile = str(config.keyfile)
    return cfg


def open_database(db: Path | str) -> SqlStore:
    """The store at ``db``: a ``postgresql://`` URL or a SQLite file (created, migrated)."""
    if isinstance(db, str) and is_postgres_url(db):
        return PostgresStore(db)
    return MetadataStore(Path(db))


def open_store(config: MetadataServerConfig) -> SqlStore:
    """Open (create, migrate) the database; store the admin token's hash when given.

    Raises :class:`ConfigError` when the server would listen on a
    non-loopback address with no admin token.
    """
    store = open_database(config.db)
    try:
        if config.admin_token is not None:
            stored = store.admin_token_hash()
            if (
                stored is None
                or is_legacy_hash(stored)  # an earlier server's scrypt: rehashed (see _db)
                or not verify_token(config.admin_token, stored)
            ):
                store.set_admin_token_hash(hash_token(config.admin_token))
        if not config.is_loopback and store.admin_token_hash() is None:
            raise ConfigError(
                f"--listen {config.listen} is not a loopback address: an admin token is "
                "required (--admin-token or EDGEGW_METADATA_ADMIN_TOKEN)"
            )
    except BaseException:
        store.close()
        raise
    return store


async def serve_metadata(
    config: MetadataServerConfig,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the metadata API until cancelled; reports ready with the bound URL.

    Cancelling stops gracefully: head long polls end at once, in-flight
    requests get up to :data:`GRACEFUL_TIMEOUT_S`; the address file is removed.
    """
    store = await trio.to_thread.run_sync(open_store, config)
    app: MetadataApp | None = None
    try:
        app = MetadataApp(store, config)
        server_scope = trio.CancelScope(shield=True)
        async with trio.open_nursery() as nursery:
            if app.replicas is not None:
                await nursery.start(app.replicas.run)
            await nursery.start(app.run_background)
            if config.server == "hypercorn":
                url, stop = await _start_hypercorn(nursery, app, config, server_scope)
            else:
                url, stop = await _start_builtin(nursery, app, config, server_scope)
            try:
                if config.addr_file is not None:
                    await trio.to_thread.run_sync(write_addr_file, config.addr_file, url)
                mode = " (open mode: no admin token; loopback only)" if app.open_mode else ""
                log.info("metadata server listening on %s%s", url, mode)
                # (`edgegw metadata serve` settles the collector now: pygc.settle)
                pygc.count_pauses()
                task_status.started(url)
                await trio.sleep_forever()
            finally:
                app.begin_shutdown()
                stop()
                server_scope.deadline = trio.current_time() + GRACEFUL_TIMEOUT_S + 2.0
                if config.addr_file is not None:
                    with contextlib.suppress(OSError):
                        config.addr_file.unlink()
    finally:
        if app is not None:  # every task is done: the last heartbeats go to the store here
            try:
                app.write_heartbeats_now(app.heartbeats.take())
            except Exception:
                log.exception("could not store the last heartbeats")
        store.close()


async def _start_hypercorn(
    nursery: trio.Nursery, app: MetadataApp, config: MetadataServerConfig, scope: trio.CancelScope
) -> tuple[str, Callable[[], None]]:
    """Serve ``app`` on hypercorn in ``nursery``: (its URL, what begins its stop)."""
    from hypercorn.trio import serve

    stop = trio.Event()

    async def run(*, task_status: trio.TaskStatus[list[str]]) -> None:
        with scope:
            await serve(
                cast(Any, app),
                _hypercorn_config(config),
                shutdown_trigger=stop.wait,
                task_status=task_status,
            )

    binds: list[str] = await nursery.start(run)
    return binds[0], stop.set


async def _start_builtin(
    nursery: trio.Nursery, app: MetadataApp, config: MetadataServerConfig, scope: trio.CancelScope
) -> tuple[str, Callable[[], None]]:
    """Serve ``app`` on edgegw's HTTP/1.1 server in ``nursery``: (its URL, what begins its stop).

    The server the gateway's local API runs on (:mod:`edge_gateway.net.http11`):
    each connection is one task that calls the app directly and writes each
    response in one send, where hypercorn starts a task per request and
    feeds it through memory channels (``bench/fleet.py`` measures both).
    """
    from edge_gateway.net.http11 import Http11Server

    tls = server_context(config, names=_TLS_OPTIONS) if config.certfile is not None else None
    listeners = await open_listeners(config.host, config.port)
    hostport = format_hostport(*bound_address(listeners[0]))
    http = Http11Server(
        cast(Any, app),
        log=logging.getLogger("edgegw.metadata.server"),
        keep_alive_timeout=config.keep_alive_timeout_s,
        ssl_context=tls,
    )

    async def run(*, task_status: trio.TaskStatus[None]) -> None:
        with scope:
            await http.serve(listeners, task_status=task_status)

    await nursery.start(run)
    return f"{'https' if tls is not None else 'http'}://{hostport}", http.shutdown
