"""The local HTTP API: an ASGI app over a :class:`Gateway` (routes in ``docs/api.md``).

Layers, outermost first:

1. :class:`ApiApp` (plain ASGI): times every request for the latency
   histogram, keeps keep-alive connections usable after a refusal (see
   :class:`_Exchange`), serves the two produce routes itself (the hot path:
   no routing table walk, no request objects) and turns an exception that
   escaped everything else into a logged traceback;
2. a route table (:mod:`._asgi`: Starlette's routing without anyio and
   asyncio) for every other route; :class:`ApiError` and the
   :mod:`edge_gateway.errors` tree become ``{"error": {"code", "message"}}``
   with the status codes of :data:`edge_gateway.api.wire.ERROR_CODES`
   (:meth:`ApiApp._error_for`, shared with the produce routes);
3. the endpoints: each checks the bearer token (unless public), parses its
   input with :mod:`edge_gateway.api._codec` and calls the gateway.

Bodies are read chunk by chunk and refused with 413 as soon as they pass
``api.max_body_bytes`` (or at once when Content-Length says so); each read
waits at most ``api.read_timeout_s``, then the answer is ``408
request_timeout`` and the connection closes (:class:`_Exchange`). Waits that
can last (long-poll fetches, ``ack=shipped``) are registered so that a
shutdown ends them at once instead of holding the graceful stop.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final
from urllib.parse import parse_qsl

import trio

from edge_gateway.api import _codec
from edge_gateway.api._status import status_document
from edge_gateway.api.wire import (
    BATCH_MEDIA_TYPE,
    HIGH_WATERMARK_HEADER,
    JSON_MEDIA_TYPE,
    NEXT_OFFSET_HEADER,
    PRODUCER_EPOCH_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQUENCE_HEADER,
)
from edge_gateway.errors import (
    ClosedError,
    CorruptData,
    DiskFull,
    EdgeGatewayError,
    Fenced,
    InvalidInput,
    InvalidName,
    JournalFull,
    OutOfOrderSequence,
    ProducerFenced,
    ReadOnlyTopic,
    RepairPending,
    Unavailable,
    UnknownProducer,
    UnknownTopic,
    WrongRegion,
)
from edge_gateway.format.batch import decode_batch, read_header
from edge_gateway.gateway import Gateway, ProduceResult
from edge_gateway.journal import OffsetOutOfRange
from edge_gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edge_gateway.metrics import GatewayMetrics, metrics_for
from edge_gateway.net.asgi import (
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
    MAX_HEAD_BYTES,
    ApiError,
    error_response,
    head_bytes,
    head_too_large,
    receive_body,
)

__all__ = ["ApiApp", "ApiError", "create_app"]

log = logging.getLogger("edgegw.api")

MAX_FETCH_RECORDS: Final = 10_000
MAX_FETCH_BYTES: Final = 64 << 20
DEFAULT_FETCH_RECORDS: Final = 500
DEFAULT_FETCH_BYTES: Final = 1 << 20


class ApiApp:
    """The ASGI application of one gateway's local API."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.config = gateway.config.api
        self.metrics: GatewayMetrics = metrics_for(gateway)
        self._token = self.config.token.encode() if self.config.token else None
        #: Check each request head's size here (hypercorn: its h11 bounds only a
        #: head still arriving; the builtin server checks every head itself).
        self.check_head_size = False
        self._stopping = False
        #: Scopes of waits a shutdown interrupts (long polls, ack=shipped).
        self._waits: set[trio.CancelScope] = set()
        # Seconds until a refused produce may succeed: about one shipper flush.
        flush_s = gateway.config.shipper.flush_interval_ms / 1000
        self._retry_after = str(max(1, math.ceil(flush_s)))
        routes = [
            self._route("/healthz", self.healthz, ["GET"], public=True),
            self._route(
                "/metrics", self.metrics_endpoint, ["GET"], public=self.config.public_metrics
            ),
            self._route("/v1/status", self.status, ["GET"]),
            self._route("/v1/topics", self.list_topics, ["GET"]),
            self._route("/v1/topics/{topic}", self.describe_topic, ["GET"]),
            self._route(RECORDS_ROUTE, self.produce, ["POST"]),
            self._route(BATCHES_ROUTE, self.produce_batch, ["POST"]),
            self._route("/v1/topics/{topic}/partitions/{partition}/records", self.fetch, ["GET"]),
            self._route("/v1/groups/{group}/offsets", self.commit_offsets, ["POST"]),
            self._route("/v1/groups/{group}/offsets", self.fetch_offsets, ["GET"]),
            self._route("/v1/sync", self.sync, ["POST"]),
            self._route("/v1/producers", self.init_producer, ["POST"]),
        ]
        self.router = Router(routes)

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":  # a websocket: not served
            await send({"type": "websocket.close", "code": 1000})
            return
        started = time.perf_counter()
        if (
            self.check_head_size
            and str(scope.get("http_version", "")).startswith("1")
            and head_bytes(scope) > MAX_HEAD_BYTES
        ):
            response = error_response(
                431, "headers_too_large", head_too_large(), {"Connection": "close"}
            )
            await response(scope, receive, send)
            return
        x = _Exchange(scope, receive, send, self.config.max_body_bytes, self.config.read_timeout_s)
        route = ""
        try:
            if scope["method"] == "POST":
                route = await self._fast_produce(x)
            if not route:
                route = await self._dispatch(x)
        except Exception:
            log.exception("internal error serving %s %s", scope["method"], scope["path"])
            if not x.responded:
                await error_response(500, "internal", _INTERNAL_MESSAGE)(scope, x.receive, x.send)
        finally:
            self.metrics.observe_request(
                route or "unmatched", scope["method"], x.status, time.perf_counter() - started
            )

    async def _dispatch(self, x: _Exchange) -> str:
        """Serve ``x`` by the route table; returns the route template ("" if none matched)."""
        method, path = x.scope["method"], x.scope["path"]
        match = self.router.match(method, path)
        response: Response
        if match.route is None:
            if match.allowed:
                response = error_response(
                    405,
                    "method_not_allowed",
                    f"{method} is not allowed on {path}",
                    {"Allow": ", ".join(match.allowed)},
                )
            else:
                response = error_response(404, "not_found", f"no such route: {path}")
            await response(x.scope, x.receive, x.send)
            return ""
        try:
            response = await match.route.endpoint(Request(x.scope, x.receive, match.params))
        except (ApiError, EdgeGatewayError) as exc:
            response = self._error_for(exc, path)
        await response(x.scope, x.receive, x.send)
        return match.route.path

    async def _fast_produce(self, x: _Exchange) -> str:
        """The produce routes without the route table and request objects.

        They carry the hot path (one request per record); the answers are the
        same as through the route table, which serves everything else.
        Returns the route template served, or "" when the path is not one of them.
        """
        path = x.scope["path"]
        m = _RECORDS_PATH.fullmatch(path)
        if m is not None:
            template = RECORDS_ROUTE
        else:
            m = _BATCHES_PATH.fullmatch(path)
            if m is None:
                return ""
            template = BATCHES_ROUTE
        headers = _headers_of(x.scope)
        qs = x.scope["query_string"]
        query = dict(parse_qsl(qs.decode("latin-1"), keep_blank_values=True)) if qs else {}
        try:
            self._check_token(headers.get("authorization"))
            if template == RECORDS_ROUTE:
                response = await self._produce(m[1], query, headers, x.receive)
            else:
                response = await self._produce_batch(m[1], m[2], query, headers, x.receive)
        except (ApiError, EdgeGatewayError) as exc:
            response = self._error_for(exc, path)
        await response(x.scope, x.receive, x.send)
        return template

    def _route(
        self,
        path: str,
        handler: Callable[[Request], Awaitable[Response]],
        methods: list[str],
        *,
        public: bool = False,
    ) -> Route:
        if public:
            endpoint = handler
        else:

            async def endpoint(request: Request) -> Response:
                self._check_token(request.headers.get("authorization"))
                return await handler(request)

        return Route(path, endpoint, methods)

    # -------------------------------------------------------------- shutdown

    def begin_shutdown(self) -> None:
        """End long polls and ``ack=shipped`` waits now (the server is stopping)."""
        self._stopping = True
        for scope in list(self._waits):
            scope.cancel()

    @contextlib.asynccontextmanager
    async def _interruptible(self, receive: Receive) -> AsyncIterator[trio.CancelScope]:
        """A scope for a wait that may last (a long poll, ``ack=shipped``, a sync):
        cancelled when the API stops or when the client goes away (``receive()``
        says ``http.disconnect``), so that nobody waits for an answer no one reads."""
        with trio.CancelScope() as scope:
            if self._stopping:
                scope.cancel()
            self._waits.add(scope)
            try:
                async with trio.open_nursery() as watcher:
                    watcher.start_soon(self._cancel_on_disconnect, receive, scope)
                    try:
                        yield scope
                    finally:
                        watcher.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                # The wait's own error (Unavailable, Denied...), not a group of
                # one: the caller maps it to its status.
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise
            finally:
                self._waits.discard(scope)

    async def _cancel_on_disconnect(self, receive: Receive, scope: trio.CancelScope) -> None:
        # Past what is left of the body (the servers hand it over first),
        # receive() returns only when the client has gone.
        while (await receive())["type"] != "http.disconnect":
            pass
        self.metrics.api_waits_abandoned += 1
        scope.cancel()

    # ---------------------------------------------------------------- errors

    def _error_for(self, exc: ApiError | EdgeGatewayError, path: str) -> Response:
        """The error response for ``exc`` (codes and statuses: ``wire.ERROR_CODES``)."""
        if isinstance(exc, ApiError):
            return error_response(exc.status, exc.code, exc.message, exc.headers)
        message = str(exc)
        if isinstance(exc, UnknownProducer):
            return error_response(409, "unknown_producer", message)
        if isinstance(exc, OutOfOrderSequence):
            return error_response(
                409, "out_of_order_sequence", message, expected_sequence=exc.expected
            )
        if isinstance(exc, ProducerFenced):
            return error_response(409, "producer_fenced", message)
        if isinstance(exc, InvalidName):
            return error_response(400, "invalid_name", message)
        if isinstance(exc, UnknownTopic):
            return error_response(404, "unknown_topic", message)
        if isinstance(exc, WrongRegion):
            return error_response(409, "wrong_region", message, home_region=exc.home)
        if isinstance(exc, ReadOnlyTopic):
            return error_response(409, "read_only_topic", message)
        if isinstance(exc, OffsetOutOfRange):
            return error_response(400, "offset_out_of_range", message, earliest_offset=exc.earliest)
        if isinstance(exc, InvalidInput):
            return error_response(400, "invalid_request", message)
        retry = {"Retry-After": self._retry_after}
        if isinstance(exc, JournalFull):
            return error_response(503, "journal_full", message, retry)
        if isinstance(exc, DiskFull):
            return error_response(503, "disk_full", message, retry)
        if isinstance(exc, RepairPending):
            return error_response(503, "repair_pending", message, retry)
        if isinstance(exc, Unavailable | ClosedError):
            return error_response(503, "unavailable", message, retry)
        if isinstance(exc, Fenced):
            return error_response(503, "fenced", message)
        if isinstance(exc, CorruptData):
            log.error("corrupt data serving %s: %s", path, exc)
            return error_response(500, "corrupt_data", message)
        log.error("unexpected gateway error serving %s: %r", path, exc)
        return error_response(500, "internal", _INTERNAL_MESSAGE)

    # ---------------------------------------------------------------- inputs

    def _check_token(self, authorization: str | None) -> None:
        if self._token is None:
            return
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            presented.strip().encode("utf-8", "surrogateescape"), self._token
        ):
            raise ApiError(
                401,
                "unauthorized",
                "missing or wrong bearer token (send 'Authorization: Bearer <api.token>')",
                {"WWW-Authenticate": 'Bearer realm="edgegw"'},
            )

    @staticmethod
    def _require_type(given: str | None, expected: str, *, optional: bool = False) -> None:
        if given is None and optional:
            return
        media = (given or "").split(";", 1)[0].strip().lower()
        if media != expected:
            raise ApiError(
                415,
                "unsupported_media_type",
                f"Content-Type must be {expected}, not {given or 'missing'}",
            )

    async def _body(self, content_length: str | None, receive: Receive) -> bytes:
        """The request body, refused with 413 as soon as it passes ``api.max_body_bytes``."""
        limit = self.config.max_body_bytes
        if content_length is not None:
            if not content_length.isdigit():
                raise ApiError(400, "invalid_request", "bad Content-Length")
            if int(content_length) > limit:
                raise self._too_large(int(content_length))
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ApiError(400, "invalid_request", "the client went away mid-body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise self._too_large(size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _too_large(self, size: int) -> ApiError:
        return ApiError(
            413,
            "body_too_large",
            f"request body of {size}+ bytes exceeds api.max_body_bytes "
            f"({self.config.max_body_bytes}); send smaller batches",
        )

    # ------------------------------------------------------------- endpoints

    async def healthz(self, request: Request) -> Response:
        if self.gateway.accepting and not self._stopping:
            # Degraded tasks are restarting under supervision while intake and
            # reads go on: still 200, so a liveness probe does not restart the
            # process (which would stop intake and cannot fix them sooner).
            degraded = [h.to_json() for h in self.gateway.task_health() if h.degraded]
            return JSONResponse(
                {
                    "status": "degraded" if degraded else "ok",
                    "region": self.gateway.region,
                    "degraded": degraded,
                }
            )
        reason = (
            "the gateway is shutting down" if self._stopping else self.gateway.not_ready_reason()
        )
        return error_response(503, "unavailable", reason, {"Retry-After": "1"})

    async def metrics_endpoint(self, request: Request) -> Response:
        if not self.config.public_metrics:
            self._check_token(request.headers.get("authorization"))
        return Response(self.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def status(self, request: Request) -> Response:
        doc = status_document(self.gateway)
        doc["api"] = self.api_status()
        return JSONResponse(doc)

    def api_status(self) -> dict[str, Any]:
        """The API itself: its URL, TLS, and failed handshakes (``edgegw status``)."""
        cfg = self.config
        addr = self.gateway.api_address
        host = None if addr is None else f"[{addr[0]}]" if ":" in addr[0] else addr[0]
        failures = self.metrics.api_tls_handshake_failures
        return {
            "url": None if addr is None else f"{cfg.scheme}://{host}:{addr[1]}",
            "server": cfg.server,
            "tls": cfg.tls,
            "client_certificates": bool(cfg.tls_client_ca),
            "tls_handshake_failures": failures() if failures is not None else None,
        }

    async def list_topics(self, request: Request) -> Response:
        return JSONResponse({"topics": [t.to_json() for t in self.gateway.topics()]})

    async def describe_topic(self, request: Request) -> Response:
        return JSONResponse(self.gateway.describe_topic(request.path_params["topic"]).to_json())

    async def produce(self, request: Request) -> Response:
        return await self._produce(
            request.path_params["topic"], request.query_params, request.headers, request.receive
        )

    async def produce_batch(self, request: Request) -> Response:
        p = request.path_params
        return await self._produce_batch(
            p["topic"], p["partition"], request.query_params, request.headers, request.receive
        )

    async def _produce(
        self,
        topic: str,
        query: Mapping[str, str],
        headers: Mapping[str, str],
        receive: Receive,
    ) -> Response:
        ack = _codec.ack_param(query)
        producer = _codec.producer_param(headers)
        self._require_type(headers.get("content-type"), JSON_MEDIA_TYPE, optional=True)
        records = _codec.produce_records(await self._body(headers.get("content-length"), receive))
        if producer is None:
            res = await self.gateway.produce(topic, records)
        else:
            # A sequence numbers the records of one partition: an idempotent
            # request names it (the gateway does not choose).
            partitions = {r.partition for r in records}
            partition = partitions.pop() if len(partitions) == 1 else None
            if partition is None:
                raise InvalidInput(
                    "an idempotent produce (EdgeGW-Producer-* headers) writes one partition: "
                    'give every record the same "partition"'
                )
            res = await self.gateway.produce_partition(topic, partition, records, producer=producer)
        return await self._produced(res, ack, receive)

    async def _produce_batch(
        self,
        topic: str,
        partition_text: str,
        query: Mapping[str, str],
        headers: Mapping[str, str],
        receive: Receive,
    ) -> Response:
        ack = _codec.ack_param(query)
        partition = _codec.path_int(partition_text, "partition")
        producer = _codec.producer_param(headers)
        self._require_type(headers.get("content-type"), BATCH_MEDIA_TYPE)
        body = await self._body(headers.get("content-length"), receive)
        try:
            # The journal checks structure only; the CRC and columns are checked here,
            # so that nothing undecodable is ever journaled and shipped.
            batch = decode_batch(body, where="request body")
        except CorruptData as exc:
            raise ApiError(400, "bad_batch", str(exc)) from None
        if batch.header.length != len(body):
            raise ApiError(
                400,
                "bad_batch",
                f"request body: {len(body) - batch.header.length} bytes after the batch "
                "(send exactly one batch per request)",
            )
        res = await self.gateway.produce_batch(topic, partition, body, producer=producer)
        return await self._produced(res, ack, receive)

    async def init_producer(self, request: Request) -> Response:
        self._require_type(request.headers.get("content-type"), JSON_MEDIA_TYPE, optional=True)
        body = await self._body(request.headers.get("content-length"), request.receive)
        producer_id, epoch = _codec.producer_request(body)
        pid, new_epoch = await self.gateway.init_producer(producer_id, epoch)
        return JSONResponse({"producer_id": pid, "epoch": new_epoch})

    async def _produced(self, res: ProduceResult, ack: _codec.Ack, receive: Receive) -> Response:
        if ack != "shipped":
            # The hot path: the JSON of the answer written directly (the same
            # bytes as JSONResponse would render), with precomputed headers.
            body = b'{"topic":%b,"offsets":[%b],"shipped":false%b}' % (
                _json_string(res.topic),
                b",".join(
                    b'{"partition":%d,"offset":%d}' % po
                    for po in zip(res.partitions, res.offsets, strict=True)
                ),
                b',"duplicate":true' if res.duplicate else b"",
            )
            return Response.of(body, [(b"content-length", b"%d" % len(body)), _JSON_TYPE])
        offsets = [
            {"partition": p, "offset": o} for p, o in zip(res.partitions, res.offsets, strict=True)
        ]
        if ack == "shipped":
            done = False
            async with self._interruptible(receive):
                await self.gateway.wait_shipped(res)
                done = True
            if not done:
                return error_response(
                    503,
                    "unavailable",
                    "the gateway is shutting down: the records are journaled (see offsets) "
                    "but not confirmed shipped; they ship when it runs again",
                    {"Retry-After": self._retry_after},
                    offsets=offsets,
                )
        doc: dict[str, Any] = {"topic": res.topic, "offsets": offsets, "shipped": ack == "shipped"}
        if res.duplicate:
            doc["duplicate"] = True
        return JSONResponse(doc)

    async def fetch(self, request: Request) -> Response:
        q = request.query_params
        topic = request.path_params["topic"]
        partition = _codec.path_int(request.path_params["partition"], "partition")
        offset = _codec.int_param(q, "offset")
        max_records = _codec.int_param(
            q, "max_records", DEFAULT_FETCH_RECORDS, lo=1, hi=MAX_FETCH_RECORDS
        )
        max_bytes = _codec.int_param(q, "max_bytes", DEFAULT_FETCH_BYTES, lo=1, hi=MAX_FETCH_BYTES)
        wait_ms = min(_codec.int_param(q, "wait_ms", 0), self.config.max_wait_ms)
        binary = BATCH_MEDIA_TYPE in request.headers.get("accept", "")
        gw = self.gateway
        res = await gw.fetch(topic, partition, offset, max_records=max_records, max_bytes=max_bytes)
        if not res.records and wait_ms > 0:
            async with self._interruptible(request.receive):
                res = await gw.fetch(
                    topic,
                    partition,
                    offset,
                    max_records=max_records,
                    max_bytes=max_bytes,
                    wait_ms=wait_ms,
                )
        if binary:
            # Whole batches: the first may start before ``offset`` and the last may
            # go past max_records; the next offset is where the last batch ends.
            next_offset = read_header(res.batches[-1]).next_offset if res.batches else offset
            return Response(
                b"".join(res.batches),
                media_type=BATCH_MEDIA_TYPE,
                headers={
                    NEXT_OFFSET_HEADER: str(max(next_offset, offset)),
                    HIGH_WATERMARK_HEADER: str(res.high_watermark),
                },
            )
        doc: dict[str, Any] = {
            "records": [_codec.record_json(r) for r in res.records],
            "next_offset": res.next_offset,
            "high_watermark": res.high_watermark,
        }
        if res.gap_end is not None:
            # The offset asked for is in a hole (a source's gap, mirrored):
            # say so, rather than leave the jump to be noticed in the offsets.
            doc["gap"] = {"first_offset": offset, "end_offset": res.gap_end}
        return JSONResponse(doc)

    async def sync(self, request: Request) -> Response:
        # ?pull=false ships only. Ends (503) when the API stops, like a long poll.
        pull = request.query_params.get("pull", "true").lower() not in ("false", "0", "no")
        async with self._interruptible(request.receive) as scope:
            result = await self.gateway.sync_now(pull=pull)
        if scope.cancelled_caught:
            raise Unavailable("the gateway is shutting down")
        return JSONResponse(result)

    async def commit_offsets(self, request: Request) -> Response:
        self._require_type(request.headers.get("content-type"), JSON_MEDIA_TYPE, optional=True)
        group = request.path_params["group"]
        body = await self._body(request.headers.get("content-length"), request.receive)
        rows = _codec.offset_rows(body)
        committed = await self.gateway.commit_offsets(group, rows)
        return JSONResponse({"group": group, "committed": committed})

    async def fetch_offsets(self, request: Request) -> Response:
        group = request.path_params["group"]
        topic = request.query_params.get("topic") or None
        rows = await self.gateway.fetch_offsets(group, topic)
        return JSONResponse(
            {
                "group": group,
                "offsets": [
                    {
                        "topic": r.topic,
                        "partition": r.partition,
                        "offset": r.offset,
                        "metadata": r.metadata,
                        "committed_ms": r.committed_ms,
                    }
                    for r in rows
                ],
            }
        )


class _Exchange:
    """One request/response on its way through the app: status and body accounting.

    When a response starts before the request body was read (a refusal), the
    rest of a small body is read and dropped so the keep-alive connection
    stays usable; otherwise the response says ``Connection: close``, because
    hypercorn drops a connection whose request was not read to the end and a
    client must not send its next request on it.

    Each read of the body waits at most ``read_timeout`` (the servers leave
    that to the app: see :func:`edge_gateway.net.http.receive_body`); a stalled
    body raises the ``408 request_timeout`` :class:`ApiError`, which says
    ``Connection: close``.
    """

    __slots__ = (
        "_buffered",
        "_receive",
        "_send",
        "body_done",
        "limit",
        "read_timeout",
        "received",
        "responded",
        "scope",
        "status",
    )

    #: Seconds to wait for the rest of a refused body before giving up on the connection.
    DRAIN_TIMEOUT_S = 2.0

    def __init__(
        self, scope: Scope, receive: Receive, send: Send, limit: int, read_timeout: float
    ) -> None:
        self.scope = scope
        self._receive = receive
        self._send = send
        self.limit = limit
        self.read_timeout = read_timeout
        self.status = 500
        self.responded = False
        self.received = 0
        self.body_done = not _has_body(scope)
        extensions = scope.get("extensions")
        #: The whole body, when the server read it with the head (the builtin server).
        self._buffered: bytes | None = extensions.get(BUFFERED_BODY) if extensions else None

    async def receive(self) -> Message:
        if self._buffered is not None:
            # In hand already: no read, no deadline. The server's own receive()
            # still returns it first; a disconnect watcher reads past it.
            body, self._buffered = self._buffered, None
            self.received = len(body)
            self.body_done = True
            return {"type": "http.request", "body": body, "more_body": False}
        if self.body_done:  # only a disconnect is left to wait for: no deadline
            return await self._receive()
        try:
            message = await receive_body(self._receive, self.read_timeout)
        except ApiError:
            self.body_done = True  # nothing more will be read; the 408 closes
            raise
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.body_done = not message.get("more_body", False)
        else:  # http.disconnect: nothing more will come
            self.body_done = True
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.responded = True
            if not self.body_done and not await self._drain():
                headers = [*message.get("headers", ()), (b"connection", b"close")]
                message = {**message, "headers": headers}
        await self._send(message)

    async def _drain(self) -> bool:
        if self.status == 413 or _header(self.scope, b"expect") is not None:
            return False  # too large, or a client waiting for "100 Continue"
        with trio.move_on_after(self.DRAIN_TIMEOUT_S):
            while not self.body_done:
                if self.received > self.limit:
                    return False
                try:
                    await self.receive()
                except ApiError:  # the body stalled (a read_timeout below DRAIN_TIMEOUT_S)
                    return False
            return True
        return False


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _json_string(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False).encode("utf-8")


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    if length is not None:
        return length.strip() != b"0"
    return _header(scope, b"transfer-encoding") is not None


#: ASGI scope extension: the complete request body, read by the server with the head.
BUFFERED_BODY: Final = "edgegw.buffered_body"
_JSON_TYPE: Final = (b"content-type", JSON_MEDIA_TYPE.encode("ascii"))
_INTERNAL_MESSAGE: Final = "internal error; the gateway's log has the details"
RECORDS_ROUTE: Final = "/v1/topics/{topic}/records"
BATCHES_ROUTE: Final = "/v1/topics/{topic}/partitions/{partition}/batches"
_RECORDS_PATH: Final = re.compile(r"/v1/topics/([^/]+)/records")
_BATCHES_PATH: Final = re.compile(r"/v1/topics/([^/]+)/partitions/([^/]+)/batches")
_WANTED: Final = frozenset(
    {
        b"authorization",
        b"content-type",
        b"content-length",
        PRODUCER_ID_HEADER.lower().encode(),
        PRODUCER_EPOCH_HEADER.lower().encode(),
        PRODUCER_SEQUENCE_HEADER.lower().encode(),
    }
)


def _headers_of(scope: Scope) -> dict[str, str]:
    """The few request headers the produce routes read (names lower-case, as in ASGI)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _WANTED}


def create_app(gateway: Gateway) -> ApiApp:
    """The ASGI app of ``gateway``'s local API (serve it with :func:`serve_api`)."""
    return ApiApp(gateway)
