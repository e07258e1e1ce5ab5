"""Test and benchmark helpers that ship with the library (like ``trio.testing``).

* :mod:`edge_gateway.testing.moto` starts moto's standalone S3 server in a
  subprocess and reads its request log (moto is a test dependency; it is
  started as ``python -m moto.server``, never imported).
* :mod:`edge_gateway.testing.ports`: a free port, or one where nothing listens.
* :mod:`edge_gateway.testing.tcpproxy` is a TCP fault proxy (pass, latency,
  refuse, blackhole, reset, drop-responses, stall-body) for outage tests,
  benchmarks and scenarios, with a link shape (caps per direction, latency
  with jitter, random resets, slow start) on top of any mode.

Nothing in the gateway imports this package.
"""

from edge_gateway.testing.moto import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    LoggedRequest,
    MotoServer,
    start_moto_server,
)
from edge_gateway.testing.ports import closed_port, free_port
from edge_gateway.testing.tcpproxy import LinkShape, ProxyMode, ProxyStats, TcpProxy

__all__ = [
    "ACCESS_KEY",
    "REGION",
    "SECRET_KEY",
    "LinkShape",
    "LoggedRequest",
    "MotoServer",
    "ProxyMode",
    "ProxyStats",
    "TcpProxy",
    "closed_port",
    "free_port",
    "start_moto_server",
]
