"""The Kafka protocol listener: Kafka clients produce to and consume from the gateway.

``[kafka] listen`` turns it on (docs/kafka.md): the gateway is the one broker
of its cluster; local topics are writable, mirror topics readable with the
same offsets as the HTTP API. Messages are kio's types (generated from
Kafka's schemas); record batches are :mod:`edge_gateway.format.kafka_batch`.

Layout: :mod:`._protocol` (framing, headers, versions; sans-IO),
:mod:`._registry` (the API table handler modules register into),
:mod:`._server` (the listener), one module per group of APIs
(:mod:`._handlers`: ApiVersions, Metadata, ...).
"""

from __future__ import annotations

# Handler modules register their APIs when imported.
from edge_gateway.kafka import _data as _data
from edge_gateway.kafka import _groups as _groups
from edge_gateway.kafka import _handlers as _handlers
from edge_gateway.kafka._core import GatewayCore
from edge_gateway.kafka._registry import HANDLERS, Connection, register
from edge_gateway.kafka._server import (
    ADDR_FILE,
    KafkaServer,
    KafkaStats,
    kafka_status,
    serve_kafka,
)

__all__ = [
    "ADDR_FILE",
    "HANDLERS",
    "Connection",
    "GatewayCore",
    "KafkaServer",
    "KafkaStats",
    "kafka_status",
    "register",
    "serve_kafka",
]
