"""edgegw: a geo-replication gateway for often-disconnected edge clusters.

Layers (imports go one way)::

    format (sans-IO encodings) <- journal / bucket / protocol <- shipper / mirror
        <- gateway <- api / cli

``backoff`` (the one retry wait) sits at the bottom beside ``format``: it
imports nothing of edgegw, so every layer, the public client included, uses it.
``net`` (TLS, the TLS stream, the HTTP server and its helpers, listening) sits
just above it, under every server (api, kafka, metadata) and the config: it
imports none of them (docs/network.md).
"""

from edge_gateway.errors import (
    ClosedError,
    ConfigError,
    CorruptData,
    Denied,
    DiskFull,
    EdgeGatewayError,
    Fenced,
    InvalidInput,
    InvalidName,
    JournalFull,
    ReadOnlyTopic,
    RepairPending,
    Unavailable,
    UnknownTopic,
)

__version__ = "0.1.0"

__all__ = [
    "ClosedError",
    "ConfigError",
    "CorruptData",
    "Denied",
    "DiskFull",
    "EdgeGatewayError",
    "Fenced",
    "InvalidInput",
    "InvalidName",
    "JournalFull",
    "ReadOnlyTopic",
    "RepairPending",
    "Unavailable",
    "UnknownTopic",
    "__version__",
]
