"""Listening sockets of edgegw's servers: bind, name the bound address, say why a bind failed.

* :func:`open_listeners` — trio's TCP listeners for ``host:port``, one when
  the port is 0 (so that the address file names every listener);
* :func:`bound_address` and :func:`format_hostport` — the ``(host, port)`` a
  listener got and its ``host:port`` (``[v6]:port``) spelling;
* :func:`write_addr_file` — ``<data_dir>/<service>.addr``, written whole
  (temporary name, fsync, rename, directory fsync);
* :func:`bind_failure` — one line that says why ``<key>`` cannot listen on
  ``<listen>`` and what to do, for a bind that cannot succeed (``edgegw serve``
  for ``api.listen`` and ``kafka.listen``, ``edgegw metadata serve``).
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import trio

from edge_gateway.durable import replace_file

__all__ = [
    "bind_failure",
    "bound_address",
    "format_hostport",
    "open_listeners",
    "write_addr_file",
]


async def open_listeners(host: str, port: int) -> list[trio.SocketListener]:
    """Listen on ``host:port``: one listener per address of ``host``, one only on port 0."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    if port == 0 and len(listeners) > 1:
        # "localhost" on port 0: each address family got its own free port;
        # serve one, so that the address file names every listener.
        for extra in listeners[1:]:
            await extra.aclose()
        listeners = listeners[:1]
    return listeners


def bound_address(listener: trio.SocketListener) -> tuple[str, int]:
    """The ``(host, port)`` that ``listener`` is bound to."""
    sockaddr = listener.socket.getsockname()
    return str(sockaddr[0]), int(sockaddr[1])


def format_hostport(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets (``[::1]:8470``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def write_addr_file(path: Path, text: str) -> None:
    """Write ``text`` and a newline to ``path`` whole: readers see the old file or the new one."""
    replace_file(path, (text + "\n").encode())


#: errno values of a bind that cannot succeed on this address (now).
_BIND_ERRORS = {
    errno.EADDRINUSE: "the address is already in use (another process listens on it): "
    "stop that process, or choose another port",
    errno.EADDRNOTAVAIL: "no interface of this machine has that address: "
    "use one of its addresses (or 0.0.0.0)",
    errno.EACCES: "permission denied (ports below 1024 need privileges): choose a port above 1023",
}


def bind_failure(exc: BaseException, key: str, listen: str) -> str | None:
    """``<key>: cannot listen on <listen>: <why>`` when ``exc`` is a failed bind
    (address in use, not on this machine, a host that does not resolve), else None."""
    if isinstance(exc, socket.gaierror):
        why = f"cannot resolve the host: {exc.strerror or exc}"
    elif isinstance(exc, OSError) and exc.errno in _BIND_ERRORS:
        why = _BIND_ERRORS[exc.errno]
    else:
        return None
    return f"{key}: cannot listen on {listen}: {why}"
