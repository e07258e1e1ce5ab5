"""The gateway's client of the metadata server (httpx, async; runs under trio).

* :class:`MetadataClient` — one method per call: :meth:`~MetadataClient.fetch_routing`
  (ETag: answers *unchanged* on 304), :meth:`~MetadataClient.heartbeat`,
  :meth:`~MetadataClient.report_head`, :meth:`~MetadataClient.wait_heads`,
  :meth:`~MetadataClient.watch_heads` (one held response streaming every change);
* :class:`HeadReporter` — fire-and-forget head reports: ``report_nowait(seq)``
  right after each commit never blocks or fails; a background task sends the
  latest seq, one request at a time (coalesced), and retries with backoff;
* :class:`RoutingCache` — the last routing table on disk (written atomically),
  loaded when the server is unreachable; :func:`refresh_routing` combines both.

Errors (``edge_gateway.errors``): a refused connection, a timeout or a 5xx
→ :class:`Unavailable` (retry later, run from the cache); a ``503`` or ``429``
with ``Retry-After`` (the server is overloaded) → :class:`MetadataOverloaded`,
an :class:`Unavailable` carrying ``retry_after_s``, which every retry loop
honours (``Backoff.delay_after``: never sooner, then jittered); a timeout →
:class:`MetadataTimedOut`, an :class:`Unavailable` (the server may be there,
only late); a 4xx →
:class:`MetadataRefused` (an :class:`InvalidInput` carrying the HTTP status
and the server's error code); a malformed answer → :class:`CorruptData`.

Pooled connections: the client keeps an idle connection for
:data:`~edge_gateway.net.http.CLIENT_KEEPALIVE_EXPIRY_S` (30 s), less than the
server keeps it (:data:`~edge_gateway.net.http.KEEP_ALIVE_TIMEOUT_S`, 75 s), so
it never reuses one the server is closing. A connection can still die while
idle without the client noticing (a server restart, a NAT or proxy that
timed the flow out, a server with a shorter keep-alive): a request that
fails on a *reused* connection with a reset or close before any answer is
sent again (every call is idempotent: reads, and reports the server keeps
the latest of); only a failure on a new connection counts.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import random
import ssl
import time
from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping, Sequence
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self, cast
from urllib.parse import quote

import h11
import httpx
import trio

from edge_gateway.backoff import Backoff
from edge_gateway.durable import replace_file
from edge_gateway.errors import CorruptData, InvalidInput, Unavailable
from edge_gateway.metadata._headstream import (
    HEAD_STREAM_PROTOCOL,
    PROTOCOL_HEADER,
    Ack,
    AckDecoder,
    encode_report,
    protocol_of,
    stream_request_headers,
)
from edge_gateway.metadata._watch import WatchDecoder, parse_heads
from edge_gateway.metadata.routing import RoutingTable
from edge_gateway.names import validate_region
from edge_gateway.net.http import CLIENT_KEEPALIVE_EXPIRY_S
from edge_gateway.statefile import seal, unseal

__all__ = [
    "CachedRouting",
    "HeadReporter",
    "HeadStream",
    "HeadsUpdate",
    "MetadataClient",
    "MetadataOverloaded",
    "MetadataRefused",
    "MetadataTimedOut",
    "RoutingCache",
    "RoutingFetch",
    "RoutingSnapshot",
    "refresh_routing",
]

log = logging.getLogger("edgegw.metadata.client")

CACHE_FORMAT = 1
#: Idle connections kept for reuse: one per concurrent caller of a gateway's
#: client (routing poll, heartbeat, head report, heads long poll). Also bounds
#: how many pooled connections one request may find dead (see ``_send``).
_POOLED = 4


class MetadataRefused(InvalidInput):
    """The metadata server refused a request (4xx); ``status`` and ``code`` say why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"metadata server: {message} ({status} {code})")
        self.status = status
        self.code = code


class MetadataTimedOut(Unavailable):
    """No answer within the client's timeout: the server may be there, only late (busy)."""


class MetadataOverloaded(Unavailable):
    """The server is overloaded (503/429) and said when to come back: ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


#: The longest Retry-After taken from a server (a confused one must not park a gateway).
MAX_RETRY_AFTER_S: Final = 300.0


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), or None.

    Bounded to [0, :data:`MAX_RETRY_AFTER_S`]; anything unreadable is None.
    """
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return min(max(0.0, when.timestamp() - time.time()), MAX_RETRY_AFTER_S)


def retry_after_of(exc: BaseException) -> float | None:
    """The ``Retry-After`` an overloaded server gave with ``exc``, if any."""
    return exc.retry_after_s if isinstance(exc, MetadataOverloaded) else None


@dataclass(frozen=True, slots=True)
class RoutingFetch:
    """An answer of :meth:`MetadataClient.fetch_routing`."""

    #: False when the server answered 304 (``table`` is the one held before).
    changed: bool
    table: RoutingTable
    etag: str | None


@dataclass(frozen=True, slots=True)
class HeadsUpdate:
    """Heads that moved after ``since`` (empty when the wait ran out)."""

    #: Pass as ``since`` to the next :meth:`MetadataClient.wait_heads`.
    version: int
    heads: dict[str, int]


#: The largest answer read from the server (a routing table of thousands of topics is ~2 MB).
MAX_ANSWER_BYTES: Final = 16 << 20
#: A token file larger than this is not a token.
_TOKEN_FILE_MAX = 4096


def _read_token(path: Path) -> str:
    """The token in ``path`` (surrounding whitespace dropped); InvalidInput if none."""
    try:
        with open(path, "rb") as f:
            data = f.read(_TOKEN_FILE_MAX + 1)
    except OSError as exc:
        raise InvalidInput(f"metadata.token_file {path}: {exc.strerror or exc}") from None
    if len(data) > _TOKEN_FILE_MAX:
        raise InvalidInput(f"metadata.token_file {path}: larger than {_TOKEN_FILE_MAX} bytes")
    token = data.decode("utf-8", "replace").strip()
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        raise InvalidInput(f"metadata.token_file {path}: holds no token (one line, no spaces)")
    return token


class MetadataClient:
    """Calls of one gateway (or tool) to the metadata server.

    ``region`` is needed for heartbeats and head reports (a region token may
    only act as its own region). The client remembers the last routing table
    and its ETag, so :meth:`fetch_routing` is one cheap 304 while nothing
    changes; :meth:`prime` seeds both from a :class:`RoutingCache`.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        token: str | None = None,
        region: str | None = None,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
        token_file: Path | None = None,
    ) -> None:
        urls = url.split(",") if isinstance(url, str) else list(url)
        #: The servers (replicas) in order; :attr:`url` is the one in use.
        self.urls = tuple(u.strip().rstrip("/") for u in urls)
        if not self.urls or not all(self.urls):
            raise InvalidInput(f"MetadataClient: no server URL in {url!r}")
        self._current = 0
        #: Times a call went on to the next server (:meth:`_request_failover`).
        self.failovers = 0
        self.region = validate_region(region) if region is not None else None
        self._timeout_s = timeout_s
        #: Where the token is read from again after a 401 (a rotated token).
        self._token_file = token_file
        if token_file is not None:
            if token:
                raise InvalidInput("MetadataClient: token or token_file, not both")
            token = _read_token(token_file)
        self._token = token
        #: Tokens taken up from the token file after a refusal.
        self.token_reloads = 0
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(
                max_keepalive_connections=_POOLED, keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY_S
            ),
            transport=transport,
            verify=verify,
        )
        self._verify = verify
        #: A transport of the caller's (a test's MockTransport): no head stream,
        #: which needs a socket of its own.
        self._own_transport = transport is None
        #: Base URL -> the protocol its answers named (PROTOCOL_HEADER; 0: none).
        self._protocols: dict[str, int] = {}
        self._table: RoutingTable | None = None
        self._etag: str | None = None
        #: Requests sent again after their reused connection broke (see the module docstring).
        self.stale_retries = 0

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    @property
    def url(self) -> str:
        """The server in use (the last one that answered)."""
        return self.urls[self._current]

    @property
    def table(self) -> RoutingTable | None:
        """The last routing table fetched (or primed)."""
        return self._table

    @property
    def streams_heads(self) -> bool:
        """Whether the server in use takes head reports on a stream (protocol 3,
        learnt from its answers: :meth:`open_head_stream`)."""
        return self._own_transport and self._protocols.get(self.url, 0) >= HEAD_STREAM_PROTOCOL

    def head_stream_refused(self) -> None:
        """The server in use refused a head stream (404: a replica behind the same
        URL that is older): per-request reports until an answer says otherwise."""
        self._protocols[self.url] = 0

    def _note_protocol(self, base: str, r: httpx.Response, *, always: bool) -> None:
        """Learn ``base``'s protocol from an answer that names it; ``always``: an
        answer of a route every server names it in (so its absence says "older")."""
        value = r.headers.get(PROTOCOL_HEADER)
        if value is not None or always:
            self._protocols[base] = protocol_of(value)

    def prime(self, table: RoutingTable, etag: str | None) -> None:
        """Start from a cached table: the next fetch answers *unchanged* if it still holds."""
        self._table = table
        self._etag = etag

    # ---------------------------------------------------------------- calls

    async def fetch_routing(self) -> RoutingFetch:
        """The routing table; sends ``If-None-Match`` when a table is held."""
        headers = {"If-None-Match": self._etag} if self._etag and self._table else {}
        r = await self._request("GET", "/v1/routing", headers=headers)
        if r.status_code == 304 and self._table is not None:
            return RoutingFetch(False, self._table, self._etag)
        table = _parse(RoutingTable.from_json, self._json(r), self.url + "/v1/routing")
        self._table = table
        self._etag = r.headers.get("etag")
        return RoutingFetch(True, table, self._etag)

    async def heartbeat(
        self,
        *,
        gateway_version: str,
        lag: Mapping[str, float] | None = None,
        head_seq: int | None = None,
    ) -> int:
        """Report liveness and lag figures; returns the server's routing version.

        A routing version above :attr:`table`'s says a fetch will find changes.
        """
        body: dict[str, Any] = {"gateway_version": gateway_version, "lag": dict(lag or {})}
        if head_seq is not None:
            body["head_seq"] = head_seq
        r = await self._request("POST", self._region_path("heartbeat"), json=body)
        self._note_protocol(self.url, r, always=False)
        doc = self._json(r)
        version = doc.get("routing_version")
        if not isinstance(version, int):
            raise CorruptData("heartbeat answer without routing_version", where=self.url)
        return version

    async def report_head(self, seq: int) -> int:
        """Report this region's latest committed log seq; returns the head the server holds."""
        r = await self._request("POST", self._region_path("head"), json={"seq": seq})
        self._note_protocol(self.url, r, always=True)
        head = self._json(r).get("seq")
        if not isinstance(head, int):
            raise CorruptData("head answer without seq", where=self.url)
        return head

    async def wait_heads(
        self, since: int, regions: Iterable[str] | None = None, wait_ms: int = 0
    ) -> HeadsUpdate:
        """Heads of ``regions`` (default all) that moved after version ``since``.

        The server answers as soon as one moves, or after ``wait_ms`` with no
        heads. Start with ``since=0`` (every known head), then pass the
        answer's ``version``.
        """
        params: dict[str, str] = {"since": str(since), "wait_ms": str(wait_ms)}
        if regions is not None:
            params["regions"] = ",".join(validate_region(r) for r in regions)
        r = await self._request(
            "GET",
            "/v1/heads",
            params=params,
            timeout=httpx.Timeout(self._timeout_s + wait_ms / 1000),
        )
        version, heads = parse_heads(self._json(r), self.url + "/v1/heads")
        return HeadsUpdate(version, heads)

    async def watch_heads(
        self, since: int, regions: Iterable[str] | None = None, wait_ms: int = 25_000
    ) -> AsyncGenerator[HeadsUpdate, None]:
        """Every change of the heads of ``regions`` (default all) after ``since``, as it comes.

        One held response (``GET /v1/heads?watch=1``, docs/metadata-api.md,
        protocol 2): the first update at once (the heads moved after ``since``,
        possibly none), then one per change (a burst of changes is one), and
        one with no heads after ``wait_ms`` without a change (the keep-alive:
        a connection silent for ``wait_ms`` plus the timeout is dead, and
        raises :class:`Unavailable`). Resume a broken watch with ``since`` =
        the last update's ``version``: heads only grow, so nothing is lost.

        The generator ends when the server ends the stream: a server that is
        stopping, or an older server, which answers the same request as one
        long poll (one update; ask again with its version). Use it under
        ``contextlib.aclosing``.
        """
        params: dict[str, str] = {"since": str(since), "wait_ms": str(wait_ms), "watch": "1"}
        if regions is not None:
            params["regions"] = ",".join(validate_region(r) for r in regions)
        r = await self._request(
            "GET",
            "/v1/heads",
            params=params,
            timeout=httpx.Timeout(self._timeout_s + wait_ms / 1000),
            keep_open=True,
        )
        base = self.url
        self._note_protocol(base, r, always=False)
        decoder = WatchDecoder(base + "/v1/heads")
        chunks = cast(AsyncGenerator[bytes, None], r.aiter_bytes())
        ended = False
        try:
            while True:
                with _unavailable(base):
                    chunk = await anext(chunks, None)
                if chunk is None:
                    ended = True
                    break
                for version, heads in decoder.feed(chunk):
                    yield HeadsUpdate(version, heads)
            last = decoder.end()
            if last is not None:
                yield HeadsUpdate(*last)
        finally:
            with trio.CancelScope(shield=True):  # closing a socket: quick
                await r.aclose()
                if not ended:
                    # httpx's body is a chain of async generators: closing the
                    # outer one leaves the inner ones suspended (and garbage
                    # collected unclosed). A read of the closed connection fails
                    # through all of them instead, and ends each one.
                    with contextlib.suppress(httpx.HTTPError, trio.ClosedResourceError):
                        await anext(chunks, None)
                await chunks.aclose()

    async def open_head_stream(self) -> HeadStream:
        """A head stream to the server in use (``POST .../head-stream``, protocol 3).

        Its own connection (httpx sends a request's whole body before it reads
        the answer; a stream reads acks while its body goes on), speaking
        HTTP/1.1 through h11, over TLS for an ``https://`` URL with the
        client's ``verify``. Refusals raise as every call does
        (:class:`MetadataRefused`: a 404 from an older server behind the URL;
        :class:`MetadataOverloaded`, :class:`Unavailable`); a 401 takes up a
        new token from the token file first, as every call does.
        """
        try:
            return await self._open_head_stream()
        except MetadataRefused as exc:
            if exc.status != 401 or not self._reload_token():
                raise
        return await self._open_head_stream()

    async def _open_head_stream(self) -> HeadStream:
        base = self.url
        url = httpx.URL(base + self._region_path("head-stream"))
        where = str(url)
        stream: trio.abc.Stream | None = None
        try:
            with _stream_errors(where), trio.fail_after(self._timeout_s):
                port = url.port or (443 if url.scheme == "https" else 80)
                tcp = await trio.open_tcp_stream(url.host, port)
                stream = tcp
                if url.scheme == "https":
                    verify = self._verify
                    context = (
                        verify
                        if isinstance(verify, ssl.SSLContext)
                        else httpx.create_ssl_context(verify=verify)
                    )
                    tls = trio.SSLStream(tcp, context, server_hostname=url.host)
                    stream = tls
                    await tls.do_handshake()
                conn = h11.Connection(h11.CLIENT)
                headers = stream_request_headers(url.netloc, self._token)
                request = h11.Request(method=b"POST", target=url.raw_path, headers=headers)
                await stream.send_all(conn.send(request))
                head = HeadStream(stream, conn, where, self._timeout_s)
                status, answer_headers, body = await head._response()
            if status != 200:
                raise _refusal(base, status, answer_headers, body)
            self._protocols[base] = protocol_of(answer_headers.get(PROTOCOL_HEADER))
            stream = None  # the HeadStream owns it now
            return head
        finally:
            if stream is not None:
                with trio.CancelScope(shield=True):
                    await _close_quietly(stream)

    # ------------------------------------------------------------- plumbing

    def _region_path(self, what: str) -> str:
        if self.region is None:
            raise InvalidInput(f"MetadataClient needs region= to send a {what}")
        return f"/v1/regions/{quote(self.region, safe='')}/{what}"

    async def _request(
        self, method: str, path: str, *, keep_open: bool = False, **kwargs: Any
    ) -> httpx.Response:
        """The answer; with ``keep_open``, a ``200``'s body is left to the caller
        to read (and the response to close), every other answer is read whole."""
        r = await self._request_failover(method, path, keep_open=keep_open, **kwargs)
        if r.status_code == 401 and self._reload_token():
            r = await self._request_failover(method, path, keep_open=keep_open, **kwargs)
        if r.status_code >= 400:
            code, message = "error", r.text[:200]
            try:
                err = r.json()["error"]
                code, message = str(err["code"]), str(err["message"])
            except (ValueError, KeyError, TypeError):
                pass
            raise MetadataRefused(r.status_code, code, message)
        return r

    def _reload_token(self) -> bool:
        """Read the token file again; True if it holds a new token (now in use)."""
        if self._token_file is None:
            return False
        try:
            token = _read_token(self._token_file)
        except InvalidInput as exc:
            log.warning("metadata server %s refused the token; %s", self.url, exc)
            return False
        if token == self._token:
            return False
        self._token = token
        self._http.headers["Authorization"] = f"Bearer {token}"
        self.token_reloads += 1
        log.info("metadata: took up a new token from %s", self._token_file)
        return True

    async def _request_failover(
        self, method: str, path: str, *, keep_open: bool = False, **kwargs: Any
    ) -> httpx.Response:
        """Send to the server in use; while it is :class:`Unavailable`, to the next ones.

        Each server is tried once per call, starting with the one that last
        answered (so a healthy server keeps the traffic); when all are away
        the first error is raised, and the caller retries with its backoff as
        with one server. Every call is idempotent, so sending it again to
        another replica is safe.
        """
        first: Unavailable | None = None
        start = self._current
        for i in range(len(self.urls)):
            self._current = (start + i) % len(self.urls)
            try:
                r = await self._request_once(method, path, keep_open=keep_open, **kwargs)
            except Unavailable as exc:
                first = first or exc
                continue
            if self._current != start:
                self.failovers += 1
                log.warning(
                    "metadata: %s is away (%s); now using %s", self.urls[start], first, self.url
                )
            return r
        self._current = start
        assert first is not None
        raise first

    async def _request_once(
        self, method: str, path: str, *, keep_open: bool = False, **kwargs: Any
    ) -> httpx.Response:
        base = self.url  # fixed for this call: a concurrent call may fail over meanwhile
        with _unavailable(base):
            r = await self._send(base, method, path, keep_open=keep_open, **kwargs)
        if r.status_code in (429, 503):
            retry_after = parse_retry_after(r.headers.get("retry-after"))
            if retry_after is not None:
                raise MetadataOverloaded(
                    f"metadata server {base} is overloaded ({r.status_code}); "
                    f"retry after {retry_after:g} s",
                    retry_after,
                )
        if r.status_code >= 500:
            raise Unavailable(f"metadata server {base} answered {r.status_code}")
        return r

    async def _send(
        self, base: str, method: str, path: str, *, keep_open: bool = False, **kwargs: Any
    ) -> httpx.Response:
        """Send; again while it failed on a reused connection before any answer.

        httpcore reports opening a connection through the ``trace`` request
        extension (``connection.connect_tcp.*``); no such event means the
        request went out on a pooled connection. On that connection the
        server may have closed (or a middlebox dropped) the flow just as the
        request left: the request then ends in ``RemoteProtocolError``
        ("Server disconnected without sending a response"), ``ReadError``
        (``ECONNRESET``) or ``WriteError``, unanswered. httpcore retries none
        of those (only connects, with ``retries=``); we send again, and as
        the broken connection is dropped from the pool, the last try is on a
        new connection: the error reported is always that of a new one.
        More than one try on pooled connections happens only when several
        died at once (connections opened together, such as the first poll
        and heartbeat, expire together). Timeouts are not retried: they
        already took their time.
        """
        for _ in range(_POOLED):
            opened = False

            async def trace(event: str, info: Mapping[str, Any]) -> None:
                nonlocal opened
                if event.startswith("connection.connect_"):
                    opened = True

            try:
                return await self._bounded(
                    base, method, path, keep_open=keep_open, extensions={"trace": trace}, **kwargs
                )
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                if opened:
                    raise
                self.stale_retries += 1
                log.debug("metadata server %s: %r on a reused connection; retrying", base, exc)
        return await self._bounded(base, method, path, keep_open=keep_open, **kwargs)

    async def _bounded(
        self, base: str, method: str, path: str, *, keep_open: bool = False, **kwargs: Any
    ) -> httpx.Response:
        """Send, and read at most :data:`MAX_ANSWER_BYTES` of the (decoded) answer.

        A server that answers without end (a broken proxy, a hostile server,
        a compression bomb) is :class:`CorruptData`, not a gateway out of memory.
        """
        request = self._http.build_request(method, base + path, **kwargs)
        r = await self._http.send(request, stream=True)
        if keep_open and r.status_code == 200:
            return r  # a stream: the caller reads it (bounded per line) and closes it
        try:
            body = bytearray()
            # An async generator (typed as an iterator): closed at once when refused.
            stream = cast(AsyncGenerator[bytes, None], r.aiter_bytes())
            async with aclosing(stream) as chunks:
                async for chunk in chunks:
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        raise CorruptData(
                            f"answer larger than {MAX_ANSWER_BYTES >> 20} MiB: refused",
                            where=f"{base}{path}",
                        )
            # What Response.aread() does, with the bound above.
            r._content = bytes(body)
        finally:
            await r.aclose()
        return r

    def _json(self, r: httpx.Response) -> dict[str, Any]:
        try:
            doc = r.json()
        except ValueError:
            raise CorruptData("answer is not JSON", where=str(r.url)) from None
        if not isinstance(doc, dict):
            raise CorruptData("answer is not a JSON object", where=str(r.url))
        return doc


@contextmanager
def _unavailable(base: str) -> Iterator[None]:
    """httpx's errors of a broken link, as :class:`Unavailable` (retry later)."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise MetadataTimedOut(f"metadata server {base}: timed out ({exc!r})") from None
    except httpx.TransportError as exc:
        raise Unavailable(f"metadata server {base} is unreachable: {exc}") from None
    except httpx.RequestError as exc:
        # Not the link itself, but what a broken one delivers: a body that
        # does not decode (DecodingError), a redirect loop. Transient too.
        raise Unavailable(f"metadata server {base}: {type(exc).__name__}: {exc}") from None


def _parse(fn: Any, doc: object, where: str) -> Any:
    try:
        return fn(doc)
    except InvalidInput as exc:
        raise CorruptData(str(exc), where=where) from None


# ------------------------------------------------------------ head reporter


@dataclass(frozen=True, slots=True)
class HeadReporterStatistics:
    latest: int | None
    sent: int | None
    reports: int
    failures: int
    #: Of ``reports``, those sent on a head stream; head streams opened.
    streamed: int = 0
    streams_opened: int = 0


class HeadReporter:
    """Fire-and-forget, coalesced head reports.

    :meth:`report_nowait` is called right after each commit: it only records
    the seq (O(1), never raises, never blocks). :meth:`run` (a long-lived
    task) sends the latest recorded seq, one at a time (the next once the
    last is acknowledged), so a burst of commits becomes one report; failures
    are logged and retried with a jittered backoff capped at ``retry_cap_s``
    (never sooner than an overloaded server's ``Retry-After``), with the
    latest seq by then. The relay is a hint: nothing depends on a report
    arriving.

    Against a server of protocol 3 (its answers say so: the first report
    goes as a request, as to any server) the reports go as lines of one
    head stream (:meth:`MetadataClient.open_head_stream`), opened when
    needed and closed after :data:`~edge_gateway.net.http.CLIENT_KEEPALIVE_EXPIRY_S`
    without a report. A stream that breaks is dropped; the report is retried
    with the backoff, on a new stream, or as a request (which also goes on
    to the next server of the list, and says whether that one streams).
    Heads only grow, so a report sent twice (its ack lost with the
    connection) changes nothing.
    """

    def __init__(self, client: MetadataClient, *, retry_cap_s: float = 5.0) -> None:
        self.client = client
        self.retry_cap_s = retry_cap_s
        self._latest: int | None = None
        self._sent: int | None = None
        self._wake = trio.Event()
        self._reports = 0
        self._failures = 0
        self._streamed = 0
        self._streams_opened = 0
        self._rand = random.Random()
        self._stream: HeadStream | None = None

    def report_nowait(self, seq: int) -> None:
        if self._latest is None or seq > self._latest:
            self._latest = seq
            self._wake.set()

    def sent_elsewhere(self, seq: int) -> None:
        """A heartbeat carried ``seq`` to the server: a report of it (or of an
        older seq) waiting to be sent is superseded, and not sent."""
        if self._sent is None or seq > self._sent:
            self._sent = seq

    def statistics(self) -> HeadReporterStatistics:
        return HeadReporterStatistics(
            self._latest,
            self._sent,
            self._reports,
            self._failures,
            self._streamed,
            self._streams_opened,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        backoff = Backoff(0.1, self.retry_cap_s)
        try:
            while True:
                with trio.move_on_after(CLIENT_KEEPALIVE_EXPIRY_S) as idle:
                    await self._wake.wait()
                if idle.cancelled_caught:
                    await self._drop_stream()  # idle: the server need not hold it
                    continue
                self._wake = trio.Event()
                seq = self._latest
                if seq is None or (self._sent is not None and seq <= self._sent):
                    continue
                try:
                    await self._send(seq)
                except (Unavailable, InvalidInput, CorruptData) as exc:
                    self._failures += 1
                    log.debug("head report of seq %d failed: %s", seq, exc)
                    self._wake.set()  # try again (with the latest seq by then)
                    await trio.sleep(backoff.delay_after(retry_after_of(exc), self._rand.random()))
                    continue
                backoff.reset()
                self.sent_elsewhere(seq)  # never back: a heartbeat may have carried a newer one
                self._reports += 1
        finally:
            with trio.CancelScope(shield=True):
                await self._drop_stream()

    async def _send(self, seq: int) -> None:
        """Report ``seq`` on the head stream when the server takes one, else as a request."""
        client = self.client
        if self._stream is None and client.streams_heads:
            try:
                self._stream = await client.open_head_stream()
                self._streams_opened += 1
            except MetadataRefused as exc:
                if exc.status not in (404, 405):
                    raise
                client.head_stream_refused()
            except Unavailable as exc:
                # Away, or overloaded: the request below goes on to the next
                # server of the list, or fails and is retried with the backoff.
                if isinstance(exc, MetadataOverloaded):
                    raise
                log.debug("head stream to %s: %s", client.url, exc)
        if self._stream is not None:
            try:
                await self._stream.report(seq)
            except BaseException:
                await self._drop_stream()
                raise
            self._streamed += 1
            return
        await client.report_head(seq)

    async def _drop_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.aclose()


# --------------------------------------------------------------- head stream


class HeadStream:
    """One open head stream (protocol 3): :meth:`report` writes a line and waits for its ack.

    Made by :meth:`MetadataClient.open_head_stream`. One report at a time (the
    reporter's way); each waits at most the client's timeout for its ack. An
    error line from the server raises as the same refusal of a request would
    (:class:`MetadataRefused` for a revoked token or a bad line,
    :class:`MetadataOverloaded`/:class:`Unavailable`); so does a stream that
    breaks or that the server ends (it stops, or the stream was idle). After
    any error the stream is unusable: close it.
    """

    def __init__(
        self, stream: trio.abc.Stream, conn: h11.Connection, where: str, timeout_s: float
    ) -> None:
        self._stream = stream
        self._conn = conn
        self.where = where
        self._timeout_s = timeout_s
        self._decoder = AckDecoder(where)
        self._acks: list[Ack] = []
        self._broken = False
        #: Lines sent, and acknowledged, on this stream.
        self.sent = 0
        self.acked = 0
        #: The head the server held at the last ack.
        self.head: int | None = None

    async def _response(self) -> tuple[int, dict[str, str], bytes]:
        """The answer's status and headers; a refusal's body read whole (bounded)."""
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Response):
                break
            if not isinstance(event, h11.InformationalResponse):
                raise Unavailable(f"metadata server {self.where}: no answer to the head stream")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
        if event.status_code == 200:
            return 200, headers, b""
        body = bytearray()
        while True:
            part = await self._next_event()
            if isinstance(part, h11.Data):
                body += part.data
                if len(body) > _MAX_REFUSAL_BYTES:
                    break
            else:
                break
        return event.status_code, headers, bytes(body)

    async def report(self, seq: int) -> int:
        """Send ``seq``; once acknowledged, the head the server holds."""
        if self._broken:
            raise Unavailable(f"head stream to {self.where} is closed")
        self._broken = True  # until the ack: a cancelled or failed report leaves it unusable
        with _stream_errors(self.where), trio.fail_after(self._timeout_s):
            await self._stream.send_all(self._conn.send(h11.Data(data=encode_report(seq))))
            self.sent += 1
            while self.acked < self.sent:
                ack = await self._next_ack()
                if ack.error is not None:
                    raise _stream_refusal(self.where, ack)
                self.acked = ack.acked
                self.head = ack.seq
        self._broken = False
        assert self.head is not None
        return self.head

    async def _next_ack(self) -> Ack:
        while not self._acks:
            event = await self._next_event()
            if isinstance(event, h11.Data):
                self._acks += self._decoder.feed(bytes(event.data))
            else:  # EndOfMessage, ConnectionClosed: the server ended it
                raise Unavailable(f"metadata server {self.where} ended the head stream")
        return self._acks.pop(0)

    async def _next_event(self) -> Any:
        while True:
            event = self._conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self._conn.receive_data(bytes(await self._stream.receive_some(64 * 1024)))

    async def aclose(self) -> None:
        """End the stream (its body's end, when it is in step) and close the connection."""
        stream = self._stream
        with trio.move_on_after(1.0) as scope:
            scope.shield = True
            if not self._broken and self._conn.our_state is h11.SEND_BODY:
                with contextlib.suppress(
                    trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError
                ):
                    await stream.send_all(self._conn.send(h11.EndOfMessage()))
            self._broken = True
        await _close_quietly(stream)


#: A refusal's body read before a head stream's connection is closed.
_MAX_REFUSAL_BYTES: Final = 64 * 1024
#: Error codes of a head stream's error line -> the status a request's refusal would have.
_STREAM_ERROR_STATUS: Final = {
    "unauthorized": 401,
    "forbidden": 403,
    "unknown_region": 404,
    "invalid_json": 400,
    "invalid_request": 400,
}


def _stream_refusal(where: str, ack: Ack) -> Exception:
    """The error a head stream's error line stands for."""
    assert ack.error is not None
    code, message = ack.error
    if code in ("overloaded", "unavailable"):
        text = f"metadata server {where}: {message} ({code})"
        if ack.retry_after_s is not None:
            return MetadataOverloaded(text, min(ack.retry_after_s, MAX_RETRY_AFTER_S))
        return Unavailable(text)
    return MetadataRefused(_STREAM_ERROR_STATUS.get(code, 400), code, message)


def _refusal(base: str, status: int, headers: Mapping[str, str], body: bytes) -> Exception:
    """What :meth:`MetadataClient._request` raises for the same answer."""
    if status in (429, 503):
        retry_after = parse_retry_after(headers.get("retry-after"))
        if retry_after is not None:
            return MetadataOverloaded(
                f"metadata server {base} is overloaded ({status}); retry after {retry_after:g} s",
                retry_after,
            )
    if status >= 500:
        return Unavailable(f"metadata server {base} answered {status}")
    code, message = "error", body[:200].decode("utf-8", "replace")
    try:
        err = json.loads(body)["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        pass
    return MetadataRefused(status, code, message)


@contextmanager
def _stream_errors(where: str) -> Iterator[None]:
    """A head stream's broken link (socket, TLS, HTTP framing, timeout) as :class:`Unavailable`."""
    try:
        yield
    except trio.TooSlowError:
        raise Unavailable(f"metadata server {where}: timed out") from None
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise Unavailable(f"metadata server {where} is unreachable: {exc}") from None
    except (h11.RemoteProtocolError, h11.LocalProtocolError) as exc:
        raise Unavailable(f"metadata server {where}: broken HTTP ({exc})") from None


async def _close_quietly(stream: trio.abc.Stream) -> None:
    with trio.move_on_after(1.0) as scope:
        scope.shield = True
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await stream.aclose()


# --------------------------------------------------------------- the cache


@dataclass(frozen=True, slots=True)
class CachedRouting:
    table: RoutingTable
    etag: str | None
    #: When it was fetched from the server (ms since the epoch).
    cached_ms: int


#: The routing cache's fields as written before it had a checksum.
_CACHE_KEYS = frozenset({"format", "cached_ms", "etag", "table"})


class RoutingCache:
    """The last routing table on disk, so a gateway starts and runs while the server is away.

    :meth:`save` writes a temporary file, fsyncs it and renames it over the
    old one (then fsyncs the directory): a crash leaves the old or the new
    table, never a torn one. The calls block briefly; call them from a
    worker thread in async code.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def save(self, table: RoutingTable, etag: str | None, *, now_ms: int | None = None) -> None:
        doc = {
            "format": CACHE_FORMAT,
            "cached_ms": int(time.time() * 1000) if now_ms is None else now_ms,
            "etag": etag,
            "table": table.to_json(),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(self.path, seal(doc))

    def load(self) -> CachedRouting | None:
        """The cached table, or None when there is none; :class:`CorruptData` if unreadable."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        where = str(self.path)
        try:
            doc = unseal(data, where=where, legacy_keys=_CACHE_KEYS)
        except CorruptData as exc:
            raise CorruptData(f"routing cache: {exc.reason}", where=where) from None
        if doc.get("format") != CACHE_FORMAT:
            raise CorruptData("routing cache has an unknown format", where=where)
        cached_ms, etag = doc.get("cached_ms"), doc.get("etag")
        if not isinstance(cached_ms, int) or not (etag is None or isinstance(etag, str)):
            raise CorruptData("routing cache: bad cached_ms or etag", where=where)
        return CachedRouting(
            _parse(RoutingTable.from_json, doc.get("table"), where), etag, cached_ms
        )


@dataclass(frozen=True, slots=True)
class RoutingSnapshot:
    """What :func:`refresh_routing` found."""

    table: RoutingTable
    #: True when the table differs from the one the client held before.
    changed: bool
    #: None when it came from the server now; else when the cached table was fetched.
    cached_ms: int | None
    #: Why the server was not used (when running from the cache).
    error: str | None = None

    def describe(self) -> str:
        """``metadata: version 7`` or ``metadata: cached since 2026-11-23 10:00:00Z (...)``."""
        if self.cached_ms is None:
            return f"metadata: version {self.table.version}"
        when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(self.cached_ms / 1000))
        return f"metadata: cached since {when} (version {self.table.version})"


async def refresh_routing(client: MetadataClient, cache: RoutingCache) -> RoutingSnapshot:
    """Fetch the routing table (saving changes to ``cache``), or fall back to ``cache``.

    On the first call the client is primed from the cache, so an unchanged
    table costs one 304. Raises :class:`Unavailable` only when the server is
    unreachable *and* there is no cache; :class:`MetadataRefused` (a bad
    token, say) is never hidden behind the cache.
    """
    if client.table is None:
        cached = await trio.to_thread.run_sync(cache.load)
        if cached is not None:
            client.prime(cached.table, cached.etag)
    before = client.table
    try:
        fetch = await client.fetch_routing()
    except Unavailable as exc:
        cached = await trio.to_thread.run_sync(cache.load)
        if cached is None:
            raise
        changed = before is None or cached.table != before
        return RoutingSnapshot(cached.table, changed, cached.cached_ms, str(exc))
    if fetch.changed:
        await trio.to_thread.run_sync(cache.save, fetch.table, fetch.etag)
    changed = before is None or fetch.table != before
    return RoutingSnapshot(fetch.table, changed, None)
