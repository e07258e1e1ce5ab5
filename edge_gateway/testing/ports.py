"""Loopback ports for tests and benchmarks: one free now, or one where nothing listens.

Ports handed out by :func:`free_port` lie below Linux's ephemeral range
(32768-60999 by default): a port the kernel picks from that range can be
taken by any outgoing connection in the moment between :func:`free_port`
and the server's own bind. Under pytest-xdist each worker picks from a slice
of its own (``PYTEST_XDIST_WORKER`` is ``gwN`` of
``PYTEST_XDIST_WORKER_COUNT``; the processes a test starts inherit both), so
two workers never start servers on the same port, and within a process the
ports are handed out in turn, not at random, so two calls in a row never
return the same one.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
from collections.abc import Iterator
from typing import Final

__all__ = ["PORT_RANGE", "closed_port", "free_port", "port_range"]

#: Where :func:`free_port` (and :class:`~edge_gateway.testing.TcpProxy`) pick
#: ports: below the ephemeral range, above the well-known services.
PORT_RANGE: Final = (20_000, 32_000)

_lock = threading.Lock()
_next: int | None = None  # the next candidate of this process (None: not started)


def port_range() -> tuple[int, int]:
    """``(low, high)``, high excluded: the part of :data:`PORT_RANGE` this process picks from.

    All of it outside pytest-xdist; the worker's slice under it.
    """
    low, high = PORT_RANGE
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return low, high
    index, workers = int(worker[2:]), int(count)
    if workers < 1 or index >= workers:
        return low, high
    size = (high - low) // workers
    return low + index * size, low + (index + 1) * size


def _bindable(port: int) -> bool:
    # No SO_REUSEADDR: a port with a connection in TIME_WAIT is refused too,
    # as it would be to a server that does not set it.
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 a moment ago, for a server to listen on.

    Picked in turn from :func:`port_range` (below the ephemeral range, so
    no client's own port takes it before the server binds it). Still not the
    way to get "a port where nothing listens" (the next test may start a
    server on it): use :func:`closed_port`.
    """
    global _next  # noqa: PLW0603 (one cursor per process, by design)
    low, high = port_range()
    with _lock:
        if _next is None or not low <= _next < high:
            _next = random.randrange(low, high)
        for _ in range(high - low):
            port = _next
            _next = low if _next + 1 >= high else _next + 1
            if _bindable(port):
                return port
    # The whole slice is busy (never seen): let the kernel pick one.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        picked: int = s.getsockname()[1]
        return picked


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that refuses connections while the block runs.

    The port stays bound without listening, so a connection to it is refused
    and no other socket (a client's ephemeral port among them) can take it.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
