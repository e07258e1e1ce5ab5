"""Topic routing: the reference metadata server and the gateway's metadata client.

* :mod:`edge_gateway.metadata.routing` — the routing table (sans-IO) and
  :func:`~edge_gateway.metadata.routing.topology`, which turns it into the
  gateway's topology (``TopicConfig`` tuples);
* :mod:`edge_gateway.metadata.client` — :class:`MetadataClient` (httpx,
  async), :class:`HeadReporter` and :class:`RoutingCache`;
* :class:`WatchDecoder` and :func:`encode_heads` — the heads watch's lines
  (sans-IO; the client, the server and ``bench/fleet.py`` use them);
* :mod:`edge_gateway.metadata.server` — the reference server (SQLite, or
  PostgreSQL for replicas: ``docs/metadata.md``), ``edgegw metadata serve``.

The API is described in ``docs/metadata-api.md`` and
``docs/metadata-openapi.json``. The server parts load on first use, so the
gateway's client does not import Starlette or hypercorn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_gateway._lazy import lazy_attributes
from edge_gateway.metadata.routing import BucketLocation, RoutingTable, TopicRoute, topology

if TYPE_CHECKING:
    from edge_gateway.metadata._pg import is_postgres_url
    from edge_gateway.metadata._watch import WatchDecoder, encode_heads
    from edge_gateway.metadata.client import (
        CachedRouting,
        HeadReporter,
        HeadsUpdate,
        MetadataClient,
        MetadataRefused,
        RoutingCache,
        RoutingFetch,
    )
    from edge_gateway.metadata.server import MetadataServerConfig, serve_metadata

__all__ = [
    "BucketLocation",
    "CachedRouting",
    "HeadReporter",
    "HeadsUpdate",
    "MetadataClient",
    "MetadataRefused",
    "MetadataServerConfig",
    "RoutingCache",
    "RoutingFetch",
    "RoutingTable",
    "TopicRoute",
    "WatchDecoder",
    "encode_heads",
    "is_postgres_url",
    "serve_metadata",
    "topology",
]

__getattr__ = lazy_attributes(
    __name__,
    {
        "CachedRouting": "edge_gateway.metadata.client",
        "HeadReporter": "edge_gateway.metadata.client",
        "HeadsUpdate": "edge_gateway.metadata.client",
        "MetadataClient": "edge_gateway.metadata.client",
        "MetadataRefused": "edge_gateway.metadata.client",
        "RoutingCache": "edge_gateway.metadata.client",
        "RoutingFetch": "edge_gateway.metadata.client",
        "MetadataServerConfig": "edge_gateway.metadata.server",
        "serve_metadata": "edge_gateway.metadata.server",
        "is_postgres_url": "edge_gateway.metadata._pg",
        "WatchDecoder": "edge_gateway.metadata._watch",
        "encode_heads": "edge_gateway.metadata._watch",
    },
)
