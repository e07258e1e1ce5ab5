"""The broker's core APIs: ApiVersions and Metadata (topics, the one broker).

The gateway is the one broker (node 0) of its own cluster: every partition's
leader and only replica. Local topics are listed writable; mirror topics
(``<region>.<topic>``) are listed too (readable; Produce to them is refused).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Final

from kio.schema.errors import ErrorCode

from edge_gateway.errors import EdgeGatewayError
from edge_gateway.kafka._protocol import API_VERSIONS_KEY, RequestFrame
from edge_gateway.kafka._registry import (
    HANDLERS,
    Connection,
    error_for,
    register,
    response_for,
)

__all__ = ["NODE_ID", "api_versions_body", "topic_id"]

log = logging.getLogger("edgegw.kafka")

#: The gateway's broker id: the only node of its cluster.
NODE_ID: Final = 0
METADATA_KEY: Final = 3

_TOPIC_IDS = uuid.UUID("6a1f6c1e-7f3b-4e55-9a39-6b0a4c1f0e23")


def topic_id(region: str, topic: str) -> uuid.UUID:
    """A stable id per (region, topic name): the same at every start, never zero."""
    return uuid.uuid5(_TOPIC_IDS, f"{region}/{topic}")


def api_versions_body(error: ErrorCode = ErrorCode.none) -> dict[str, Any]:
    return {
        "error_code": error,
        "api_keys": [
            {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
            for a in sorted(HANDLERS.values(), key=lambda a: a.key)
        ],
        "throttle_time": 0,
    }


@register(API_VERSIONS_KEY, 0, 4, before_auth=True)
async def api_versions(conn: Connection, req: RequestFrame) -> Any:
    return response_for(req, api_versions_body())


def _partitions(n: int) -> list[dict[str, Any]]:
    return [
        {
            "error_code": ErrorCode.none,
            "partition_index": p,
            "leader_id": NODE_ID,
            "leader_epoch": 0,
            "replica_nodes": (NODE_ID,),
            "isr_nodes": (NODE_ID,),
            "offline_replicas": (),
        }
        for p in range(n)
    ]


def topic_entry(conn: Connection, name: str, *, create: bool) -> dict[str, Any]:
    """One topic of a Metadata response: its partitions, or why there are none."""
    gw = conn.gateway
    try:
        if gw.topic_kind(name) is None and create:
            info = gw.ensure_topic(name)
        else:
            info = gw.describe_topic(name)
    except EdgeGatewayError as exc:
        return {
            "error_code": error_for(exc),
            "name": name,
            "topic_id": uuid.UUID(int=0),
            "is_internal": False,
            "partitions": [],
        }
    return {
        "error_code": ErrorCode.none,
        "name": info.name,
        "topic_id": topic_id(gw.region, info.name),
        "is_internal": False,
        "partitions": _partitions(info.partitions),
    }


@register(METADATA_KEY, 1, 12)
async def metadata(conn: Connection, req: RequestFrame) -> Any:
    gw = conn.gateway
    r = req.request
    if r.topics is None:
        names = [t.name for t in gw.topics()]
        create = False
    else:
        names = [t.name for t in r.topics if t.name is not None]
        create = bool(getattr(r, "allow_auto_topic_creation", True))
    host, port = conn.advertised
    return response_for(
        req,
        {
            "throttle_time": 0,
            "brokers": [{"node_id": NODE_ID, "host": host, "port": port, "rack": None}],
            "cluster_id": f"edgegw-{gw.region}",
            "controller_id": NODE_ID,
            "topics": [topic_entry(conn, n, create=create) for n in names],
            "cluster_authorized_operations": -2147483648,
        },
    )
