"""Error helpers of the CLI that need neither typer nor rich (``edgegw serve`` runs
without them)."""

from __future__ import annotations

import errno
import socket

__all__ = ["bind_failure", "leaf", "reason"]


def reason(exc: BaseException) -> str:
    """``Type: message``; for an OSError ``file: strerror`` without ``[Errno N]``."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename is not None else ""
        return f"{where}{exc.strerror}"
    return f"{type(exc).__name__}: {exc}"


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


def leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
