"""Serve the local API on trio, as one of the gateway's services (:func:`serve_api`)."""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import trio

from edge_gateway._http import hypercorn_config
from edge_gateway._http11 import Http11Server
from edge_gateway._tls import server_context
from edge_gateway.api._app import ApiApp
from edge_gateway.gateway import Gateway

if TYPE_CHECKING:
    from hypercorn.config import Config as HypercornConfig

__all__ = ["ADDR_FILE", "serve_api"]

log = logging.getLogger("edgegw.api")

#: ``<data_dir>/api.addr`` holds ``host:port`` of the running API (``[v6]:port`` for
#: IPv6); ``https://host:port`` when it serves TLS (a plain ``host:port`` is HTTP).
ADDR_FILE = "api.addr"

#: Seconds in-flight requests get to finish once the API stops.
GRACEFUL_TIMEOUT_S = 3.0


def _hypercorn_config(gateway: Gateway, graceful: float) -> HypercornConfig:
    # Limits (docs/api.md, "HTTP"): hypercorn closes a connection that waits
    # api.keep_alive_timeout_s for a complete request head, idle or not; the
    # app bounds each body read by api.read_timeout_s (hypercorn's own
    # read_timeout would also cut long polls: see edge_gateway._http).
    api = gateway.config.api
    cfg = hypercorn_config(
        api.listen,
        errorlog="edgegw.api.server",
        graceful_timeout=graceful,
        keep_alive_timeout=api.keep_alive_timeout_s,
    )
    # Keep-alive connections of busy producers are not recycled every 1000 requests.
    cfg.keep_alive_max_requests = 1 << 30
    if api.tls:
        cfg.certfile = api.tls_cert
        cfg.keyfile = api.tls_key
        cfg.alpn_protocols = ["http/1.1"]
        if api.tls_client_ca:
            # Required in the handshake: hypercorn cannot answer a missing
            # certificate with a 403 as the builtin server does.
            cfg.ca_certs = api.tls_client_ca
            cfg.verify_mode = ssl.CERT_REQUIRED
    return cfg


def _parse_bind(bind: str) -> tuple[str, int]:
    """``http://127.0.0.1:8470`` / ``http://[::1]:8470`` -> (host, port)."""
    hostport = bind.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)


def _format_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _write_addr(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


Server = Literal["builtin", "hypercorn"]


async def serve_api(
    gateway: Gateway,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
    server: Server | None = None,
) -> None:
    """Serve ``gateway``'s local API on ``api.listen`` until cancelled.

    Reports ready (with the bound ``(host, port)``) once the socket listens
    and ``gateway._api_addr`` is set — before the gateway claims its region,
    so a port that cannot be bound fences nobody; ``<data_dir>/api.addr`` is
    written once the whole gateway is ready (requests get 503 until then).
    Cancelling it stops gracefully: long polls and ``ack=shipped`` waits end
    at once, idle keep-alive connections close, in-flight requests get up to
    :data:`GRACEFUL_TIMEOUT_S` to finish; then the address file is removed.

    ``server`` picks the HTTP server (default: ``api.server`` of the
    config): ``builtin`` (the default: :mod:`edge_gateway._http11`, a fast path for plain
    requests and h11 for the rest) or ``hypercorn`` (a general ASGI server,
    ~4x the CPU per small request); see docs/api.md, "Choosing the server".
    """
    server = server or gateway.config.api.server
    api = gateway.config.api
    # Loaded before anything listens: a bad file is a config error at start.
    tls = server_context(api) if api.tls else None
    app = ApiApp(gateway)
    addr_path = gateway.config.data_dir / ADDR_FILE
    graceful = min(GRACEFUL_TIMEOUT_S, gateway.config.shutdown_grace_s)
    # The server runs shielded, so that cancelling serve_api becomes a graceful
    # stop instead of cutting connections mid-response; bounded by the deadline
    # set when the stop begins.
    server_scope = trio.CancelScope(shield=True)
    async with trio.open_nursery() as nursery:
        if server == "hypercorn":
            from hypercorn.trio import serve  # loaded only when chosen

            stop = trio.Event()
            config = _hypercorn_config(gateway, graceful)

            async def run_hypercorn(*, task_status: trio.TaskStatus[list[str]]) -> None:
                with server_scope:
                    # hypercorn's typing wants its own scope TypedDicts; the app is plain ASGI.
                    await serve(
                        cast(Any, app), config, shutdown_trigger=stop.wait, task_status=task_status
                    )

            binds: list[str] = await nursery.start(run_hypercorn)
            host, port = _parse_bind(binds[0])
            begin_stop = stop.set
        else:
            listeners = await _listen(gateway.config.api.host, gateway.config.api.port)
            host, port = _addr_of(listeners[0])
            http = Http11Server(
                cast(Any, app),
                log=log,
                keep_alive_timeout=api.keep_alive_timeout_s,
                ssl_context=tls,
                handshake_timeout=api.tls_handshake_timeout_s,
                require_client_cert=bool(api.tls_client_ca),
            )
            app.metrics.api_connections = lambda: http.connections
            if tls is not None:
                app.metrics.api_tls_handshake_failures = lambda: http.tls_handshake_failures

            async def run_builtin(*, task_status: trio.TaskStatus[None]) -> None:
                with server_scope:
                    await http.serve(listeners, task_status=task_status)

            await nursery.start(run_builtin)
            begin_stop = http.shutdown
        try:
            text = _format_addr(host, port)
            url = f"{api.scheme}://{text}"
            if api.tls:  # a plain host:port stays HTTP, as older clients read it
                text = url
            gateway._api_addr = (host, port)

            # Bound: the gateway goes on starting (it claims the region's
            # epoch only now, so a port that cannot be bound fences nobody);
            # requests get 503 until it is ready. The address file, which
            # clients and `edgegw sync` use to find a running gateway, is
            # written once it is.
            async def announce() -> None:
                await trio.to_thread.run_sync(_write_addr, addr_path, text)
                log.info(
                    "local API listening on %s%s",
                    url,
                    " (client certificates required)" if api.tls_client_ca else "",
                )

            if gateway.ready:  # a restart of the API by the supervisor
                await announce()
            else:
                gateway.on_ready(announce)
            task_status.started((host, port))
            await trio.sleep_forever()
        finally:
            app.metrics.api_connections = None
            app.metrics.api_tls_handshake_failures = None
            app.begin_shutdown()
            begin_stop()
            server_scope.deadline = trio.current_time() + graceful + 2.0
            gateway._api_addr = None
            with contextlib.suppress(OSError):
                addr_path.unlink()


async def _listen(host: str, port: int) -> list[trio.SocketListener]:
    listeners = await trio.open_tcp_listeners(port, host=host)
    if port == 0 and len(listeners) > 1:
        # "localhost" on port 0: each address family got its own free port;
        # serve one, so that api.addr names every listener.
        for extra in listeners[1:]:
            await extra.aclose()
        listeners = listeners[:1]
    return listeners


def _addr_of(listener: trio.SocketListener) -> tuple[str, int]:
    sockaddr = listener.socket.getsockname()
    return str(sockaddr[0]), int(sockaddr[1])
