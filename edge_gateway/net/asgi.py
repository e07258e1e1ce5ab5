"""The few ASGI pieces edgegw's apps need: requests, responses and a route table.

The local API (its only user so far) used Starlette for these; Starlette brings
anyio and asyncio with it (~4.5 MB of a gateway's ~40 MB idle, and ~40 ms of its
start; docs/operations.md, "Footprint"), for a dozen fixed routes. This module
keeps what the API used of it, with the same answers: path parameters (``{name}``
matches one path segment), ``HEAD`` wherever ``GET`` is allowed, 404 for an
unknown path, 405 with ``Allow`` for a known path and another method, and the
lifespan protocol (hypercorn sends it). Responses carry ``content-length`` and
``content-type`` (``; charset=utf-8`` added to ``text/*``), and JSON bodies are
compact UTF-8.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

__all__ = [
    "BUFFERED_BODY",
    "SEND_NOWAIT",
    "JSONResponse",
    "Match",
    "Receive",
    "Request",
    "Response",
    "Route",
    "Router",
    "Scope",
    "Send",
    "parse_query",
    "serve_lifespan",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: ASGI scope extension (``scope["extensions"]``): the complete request body,
#: read by the builtin server (:mod:`edge_gateway.net.http11`) with the head.
#: An app may take it without a ``receive()`` (and so without a read deadline).
BUFFERED_BODY: Final = "edgegw.buffered_body"
#: ASGI scope extension: ``send_nowait(body) -> bool``, another chunk of a
#: streamed response body (``more_body``) written from *any* task, without a
#: checkpoint, once the response has started. It takes the chunk whole: what
#: the socket does not take at once is held and goes first with the
#: exchange's next ``send``; False says so (the exchange's own task must send
#: next, soon: an empty body will do). Only the builtin server offers it, on
#: plain TCP; an app must work without it (TLS, hypercorn).
SEND_NOWAIT: Final = "edgegw.send_nowait"


class Request:
    """What an endpoint reads of a request: method, path, its parameters, query and headers."""

    __slots__ = ("_headers", "_query", "path_params", "receive", "scope")

    def __init__(self, scope: Scope, receive: Receive, path_params: Mapping[str, str]) -> None:
        self.scope = scope
        self.receive = receive
        self.path_params = dict(path_params)
        self._headers: dict[str, str] | None = None
        self._query: dict[str, str] | None = None

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    @property
    def path(self) -> str:
        return str(self.scope["path"])

    @property
    def headers(self) -> Mapping[str, str]:
        """Request headers by lower-case name (the first one of a repeated header)."""
        if self._headers is None:
            headers: dict[str, str] = {}
            for key, value in self.scope["headers"]:
                headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
            self._headers = headers
        return self._headers

    @property
    def query_params(self) -> Mapping[str, str]:
        """Query parameters (the last one of a repeated name; blank values kept)."""
        if self._query is None:
            self._query = parse_query(self.scope.get("query_string", b""))
        return self._query


def parse_query(qs: bytes) -> dict[str, str]:
    """``dict(parse_qsl(qs, keep_blank_values=True))``, without its cost for a plain query.

    A query with nothing to decode (no ``%``, no ``+``) is split on ``&`` and
    ``=`` here: ``parse_qsl`` spent ~40 us on a three-parameter long poll
    (``/v1/heads``) under the profiler, as much as the route table and the
    token check together. Anything else goes through ``parse_qsl``.
    """
    text = qs.decode("latin-1")
    if "%" in text or "+" in text:
        return dict(parse_qsl(text, keep_blank_values=True))
    out: dict[str, str] = {}
    for item in text.split("&"):
        if item:
            name, _, value = item.partition("=")
            out[name] = value
    return out


class Response:
    """A whole response: status, headers and body, sent in one ``http.response.body``."""

    __slots__ = ("body", "headers", "status_code")

    media_type: str | None = None

    def __init__(
        self,
        content: Any = b"",
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        self.status_code = status_code
        self.body = self.render(content)
        media = media_type or self.media_type
        raw = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]
        names = {k for k, _ in raw}
        if b"content-length" not in names:
            raw.append((b"content-length", str(len(self.body)).encode("latin-1")))
        if media is not None and b"content-type" not in names:
            if media.startswith("text/") and "charset=" not in media.lower():
                media += "; charset=utf-8"
            raw.append((b"content-type", media.encode("latin-1")))
        self.headers = raw

    @classmethod
    def of(
        cls, body: bytes, headers: list[tuple[bytes, bytes]], status_code: int = 200
    ) -> Response:
        """A response of ready bytes: ``headers`` (lower-case names) must hold
        ``content-length`` and ``content-type`` already (a hot path's precomputed ones)."""
        self = cls.__new__(cls)
        self.status_code = status_code
        self.body = body
        self.headers = headers
        return self

    def render(self, content: Any) -> bytes:
        return content if isinstance(content, bytes) else str(content).encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.headers}
        )
        await send({"type": "http.response.body", "body": self.body})


class JSONResponse(Response):
    """``content`` as compact UTF-8 JSON (``application/json``); NaN is refused."""

    __slots__ = ()

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode("utf-8")


Endpoint = Callable[[Request], Awaitable[Response]]

_PARAM: Final = re.compile(r"{([A-Za-z_][A-Za-z0-9_]*)}")


@dataclass(frozen=True, slots=True)
class Route:
    """``path`` (``{name}`` is one segment), the methods it answers and its endpoint."""

    path: str
    endpoint: Endpoint
    methods: Sequence[str]

    def pattern(self) -> re.Pattern[str]:
        parts = _PARAM.split(self.path)  # literal, name, literal, name, ...
        regex = "".join(
            f"(?P<{part}>[^/]+)" if i % 2 else re.escape(part) for i, part in enumerate(parts)
        )
        return re.compile(regex)


@dataclass(frozen=True, slots=True)
class Match:
    """What :meth:`Router.match` found: a route to call, or the methods a known path allows."""

    route: Route | None
    params: Mapping[str, str]
    allowed: Sequence[str]


class Router:
    """A fixed table of routes, matched in order."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self._routes = [(route, route.pattern(), _with_head(route.methods)) for route in routes]

    def match(self, method: str, path: str) -> Match:
        """The route for ``method path``; else ``allowed`` lists the methods of
        the routes whose path matched (empty: no such path)."""
        allowed: list[str] = []
        for route, pattern, methods in self._routes:
            m = pattern.fullmatch(path)
            if m is None:
                continue
            if method in methods:
                return Match(route, m.groupdict(), methods)
            allowed += [x for x in methods if x not in allowed]
        return Match(None, {}, allowed)


def _with_head(methods: Sequence[str]) -> list[str]:
    out = [m.upper() for m in methods]
    if "GET" in out and "HEAD" not in out:
        out.append("HEAD")
    return out


async def serve_lifespan(receive: Receive, send: Send) -> None:
    """Answer the lifespan protocol: nothing to start or stop (the gateway owns that)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
