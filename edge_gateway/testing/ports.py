"""Loopback ports for tests and benchmarks: one free now, or one where nothing listens."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

__all__ = ["closed_port", "free_port"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 a moment ago, for a server to listen on.

    Not for "a port where nothing listens": a client's own ephemeral port can
    be the same number, and a client connecting to itself there gets a
    connection (TCP self-connect) instead of a refusal. Use :func:`closed_port`.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that refuses connections while the block runs.

    The port stays bound without listening, so a connection to it is refused
    and no other socket (a client's ephemeral port among them) can take it.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
