"""HTTP pieces shared by edgegw's servers (the local API, the metadata server) and clients.

* :class:`ListenAddress`: ``host``, ``port`` and ``is_loopback`` of a
  ``listen = "host:port"`` setting (a mixin for the settings dataclasses);
* :class:`ApiError` and :func:`error_response`: a refusal with a stable code,
  answered as ``{"error": {"code": ..., "message": ..., ...}}``;
* the connection limits both servers share: :func:`hypercorn_config` (the
  idle keep-alive) and :func:`receive_body` (each read of a request body
  within a deadline, else ``408 request_timeout``).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Final

import trio

if TYPE_CHECKING:
    from hypercorn.config import Config as HypercornConfig

    from edge_gateway.net.asgi import JSONResponse

__all__ = [
    "CLIENT_KEEPALIVE_EXPIRY_S",
    "KEEP_ALIVE_TIMEOUT_S",
    "MAX_HEAD_BYTES",
    "READ_TIMEOUT_S",
    "ApiError",
    "ListenAddress",
    "error_response",
    "head_bytes",
    "head_too_large",
    "hypercorn_config",
    "receive_body",
    "request_timeout",
]

#: Seconds a server keeps an idle connection open (the local API's default
#: ``api.keep_alive_timeout_s``; the metadata server's). Well above every
#: interval at which edgegw's own clients come back (metadata poll 5 s,
#: heartbeat 10 s) and above their pools' idle expiry (httpx: 5 s;
#: the metadata client: :data:`CLIENT_KEEPALIVE_EXPIRY_S`), so that a server
#: never closes a connection a client is about to reuse.
KEEP_ALIVE_TIMEOUT_S: Final = 75.0
#: Seconds each read of a request body may wait for data.
READ_TIMEOUT_S: Final = 60.0
#: Seconds edgegw's HTTP clients keep an idle pooled connection: shorter than
#: :data:`KEEP_ALIVE_TIMEOUT_S`, so the client drops it before the server does.
CLIENT_KEEPALIVE_EXPIRY_S: Final = 30.0
#: Largest request head (request line, headers and the blank line), however it
#: arrives: 16 KiB, as h11, Node.js and hypercorn bound a head still arriving.
#: A local API's heads are a few hundred bytes; data goes in bodies.
MAX_HEAD_BYTES: Final = 16 * 1024


def head_too_large(limit: int = MAX_HEAD_BYTES) -> str:
    """The message of the ``431 headers_too_large`` answer."""
    return (
        f"the request head (request line and headers) is over {limit} bytes: "
        "send shorter headers and URL (large data goes in the body)"
    )


def head_bytes(scope: Mapping[str, Any]) -> int:
    """The size of an HTTP/1.x request's head as a client sends it (``Name: value``
    lines): for a server that bounds only a head still arriving (hypercorn)."""
    target = len(scope.get("raw_path") or b"") + (
        len(scope["query_string"]) + 1 if scope.get("query_string") else 0
    )
    line = len(scope["method"]) + 1 + target + len(" HTTP/1.1\r\n")
    return line + sum(len(k) + len(v) + 4 for k, v in scope["headers"]) + 2


class ListenAddress:
    """``host``/``port``/``is_loopback`` derived from a ``listen`` attribute (``host:port``)."""

    __slots__ = ()
    listen: str

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class ApiError(Exception):
    """An HTTP-level refusal with a stable code (401, 413, 415, ...)."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_response(
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    """``{"error": {"code": ..., "message": ..., **extra}}`` with ``status``."""
    # Imported here: the config uses this module's settings and loads nothing more.
    from edge_gateway.net.asgi import JSONResponse

    return JSONResponse(
        {"error": {"code": code, "message": message, **extra}}, status, headers=headers
    )


def request_timeout(timeout_s: float) -> ApiError:
    """The 408 for a request body that stalled (the connection is closed after it)."""
    return ApiError(
        408,
        "request_timeout",
        f"no request body data arrived for {timeout_s:g} s; the connection is closed",
        {"Connection": "close"},
    )


Message = MutableMapping[str, Any]


async def receive_body(receive: Callable[[], Awaitable[Message]], timeout_s: float) -> Message:
    """One ASGI ``receive()`` of a request body; a 408 :class:`ApiError` after ``timeout_s``.

    Call it only while the body is incomplete: after the body, ``receive()``
    waits for a disconnect, which may rightly take as long as a long poll.
    Servers cannot do this themselves: hypercorn's ``read_timeout`` bounds
    *every* socket read of a connection, also while the app works on a
    request whose body was read in full (a long poll, an ``ack=shipped``
    wait), when a client rightly sends nothing; it would cut those. So the
    apps bound their own body reads, under a trio deadline, and answer
    ``408 request_timeout`` with ``Connection: close``.
    """
    with trio.move_on_after(timeout_s):
        return await receive()
    raise request_timeout(timeout_s)


def hypercorn_config(
    bind: str,
    *,
    errorlog: str,
    graceful_timeout: float,
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT_S,
) -> HypercornConfig:
    """hypercorn's settings for edgegw's servers (trio worker, quiet access log).

    What hypercorn 0.18's trio worker does with its timeouts (read in
    ``hypercorn/trio/tcp_server.py`` and ``protocol/h11.py``):

    * ``keep_alive_timeout`` runs whenever the connection has no request in
      progress: from the connection's start and from the end of each
      response until the next request's head is complete (it is not reset by
      bytes of a head still arriving). So it bounds both an idle keep-alive
      connection and a slow or stalled request head. hypercorn's default
      (5 s) equals the metadata client's poll interval and raced it: the
      server closed a pooled connection just as the client reused it
      ("Connection reset by peer"). edgegw's is :data:`KEEP_ALIVE_TIMEOUT_S`.
    * ``read_timeout`` bounds every single socket read, including while the
      app works on a request the client finished sending (see
      :func:`receive_body`): left unset; the apps bound body reads themselves.
    * ``h11_max_incomplete_size`` (16 KiB) limits a request head still
      arriving (431); a whole head that came in one read passes, so the local
      API checks :func:`head_bytes` itself (:data:`MAX_HEAD_BYTES`).
    """
    from hypercorn.config import Config

    cfg = Config()
    cfg.bind = [bind]
    cfg.worker_class = "trio"
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger(errorlog)
    cfg.graceful_timeout = graceful_timeout
    cfg.keep_alive_timeout = keep_alive_timeout
    cfg.read_timeout = None
    cfg.include_server_header = False
    return cfg
