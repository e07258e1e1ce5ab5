"""The metadata API's OpenAPI 3.1 document, written here and checked against the app.

``docs/metadata-openapi.json`` is generated from it::

    python -m edge_gateway.metadata._openapi > docs/metadata-openapi.json

and a test checks that the file is current and that every route the server
serves is documented (and nothing else).
"""

from __future__ import annotations

import json
from typing import Any

from edge_gateway.metadata.routing import DEFAULT_ON_FULL, DEFAULT_PRIORITY, ON_FULL, PRIORITIES

__all__ = ["openapi_document"]

_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,200}$"}
_TOPIC_NAME = {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,200}$"}
_SUBSCRIBERS = {
    "description": 'Regions that mirror the topic, or "*" for every other region.',
    "oneOf": [
        {"type": "array", "items": _NAME, "uniqueItems": True},
        {"type": "string", "enum": ["*"]},
    ],
}
_PARTITIONS = {"type": "integer", "minimum": 1, "maximum": 100000}
_RETENTION = {
    "description": "Milliseconds records are kept; null: each gateway's own setting.",
    "type": ["integer", "null"],
    "minimum": 1,
}

_PRIORITY: dict[str, Any] = {
    "type": "string",
    "enum": list(PRIORITIES),
    "default": DEFAULT_PRIORITY,
    "description": "The topic's journal lane at its home: the order in which backlogs ship "
    "after an outage (critical first). Absent in answers when normal.",
}

_ON_FULL: dict[str, Any] = {
    "type": "string",
    "enum": list(ON_FULL),
    "default": DEFAULT_ON_FULL,
    "description": "What the topic's journal lane at its home does when its disk budget is "
    "full: block refuses appends (503), drop-oldest deletes the oldest unshipped records "
    "and records the ranges dropped. Absent in answers when block.",
}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            }
        },
    },
    "Topic": {
        "type": "object",
        "required": ["name", "home", "partitions", "retention_ms", "subscribers"],
        "properties": {
            "name": _TOPIC_NAME,
            "home": _NAME,
            "partitions": _PARTITIONS,
            "retention_ms": _RETENTION,
            "subscribers": _SUBSCRIBERS,
            "priority": _PRIORITY,
            "on_full": _ON_FULL,
        },
    },
    "TopicCreate": {
        "type": "object",
        "required": ["name", "home"],
        "additionalProperties": False,
        "properties": {
            "name": _TOPIC_NAME,
            "home": _NAME,
            "partitions": {**_PARTITIONS, "default": 1},
            "retention_ms": _RETENTION,
            "subscribers": _SUBSCRIBERS,
            "priority": _PRIORITY,
            "on_full": _ON_FULL,
        },
    },
    "TopicAlter": {
        "description": "Partitions can only grow; the home region cannot change.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "partitions": _PARTITIONS,
            "retention_ms": _RETENTION,
            "subscribers": _SUBSCRIBERS,
            "priority": _PRIORITY,
            "on_full": _ON_FULL,
        },
    },
    "Topics": {
        "type": "object",
        "required": ["topics"],
        "properties": {
            "topics": {"type": "array", "items": {"$ref": "#/components/schemas/Topic"}}
        },
    },
    "Region": {
        "type": "object",
        "required": ["id", "status"],
        "properties": {
            "id": _NAME,
            "status": {"type": "string", "enum": ["active", "revoked"]},
            "created_ms": {"type": "integer"},
            "revoked_ms": {"type": ["integer", "null"]},
            "last_heartbeat_ms": {"type": ["integer", "null"]},
            "gateway_version": {"type": ["string", "null"]},
            "lag": {"type": ["object", "null"], "additionalProperties": {"type": "number"}},
            "head_seq": {"type": ["integer", "null"]},
        },
    },
    "Regions": {
        "type": "object",
        "required": ["regions"],
        "properties": {
            "regions": {"type": "array", "items": {"$ref": "#/components/schemas/Region"}}
        },
    },
    "RegionCreate": {
        "type": "object",
        "required": ["id"],
        "additionalProperties": False,
        "properties": {"id": _NAME},
    },
    "RegionCreated": {
        "description": "The token is shown once; the server keeps only its hash.",
        "type": "object",
        "required": ["id", "token"],
        "properties": {"id": _NAME, "token": {"type": "string"}},
    },
    "TokenRotation": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "keep_previous_s": {
                "description": "How long the current token stays valid beside the new one "
                "(default 86400; 0: invalid at once, for a leaked token).",
                "type": "integer",
                "minimum": 0,
                "maximum": 30 * 86_400,
            }
        },
    },
    "TokenRotated": {
        "description": "The new token is shown once; the server keeps only its hash.",
        "type": "object",
        "required": ["id", "token", "previous_valid_until_ms"],
        "properties": {
            "id": _NAME,
            "token": {"type": "string"},
            "previous_valid_until_ms": {"type": ["integer", "null"]},
        },
    },
    "Heartbeat": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "gateway_version": {"type": "string", "maxLength": 100},
            "lag": {
                "type": "object",
                "maxProperties": 100,
                "additionalProperties": {"type": "number"},
            },
            "head_seq": {"type": "integer", "minimum": 0},
        },
    },
    "HeartbeatReply": {
        "type": "object",
        "required": ["routing_version", "server_ms"],
        "properties": {
            "routing_version": {"type": "integer"},
            "server_ms": {"type": "integer"},
        },
    },
    "HeadReport": {
        "type": "object",
        "required": ["seq"],
        "additionalProperties": False,
        "properties": {"seq": {"type": "integer", "minimum": 0}},
    },
    "HeadReply": {
        "type": "object",
        "required": ["region", "seq", "version"],
        "properties": {
            "region": _NAME,
            "seq": {"type": "integer"},
            "version": {"type": "integer"},
        },
    },
    "HeadAck": {
        "type": "object",
        "required": ["acked"],
        "properties": {
            "acked": {"type": "integer", "minimum": 0},
            "seq": {"type": "integer"},
            "version": {"type": "integer"},
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            },
            "retry_after_s": {"type": "integer"},
        },
    },
    "Heads": {
        "type": "object",
        "required": ["version", "heads"],
        "properties": {
            "version": {"type": "integer"},
            "heads": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
    },
    "BucketSettings": {
        "type": "object",
        "required": ["type"],
        "additionalProperties": False,
        "properties": {
            "type": {"type": "string", "enum": ["s3", "local", "azure", "gcs"]},
            "bucket": {"type": "string"},
            "container": {"type": "string"},
            "prefix": {"type": "string"},
            "endpoint_url": {"type": "string"},
            "region": {"type": "string"},
            "path_style": {"type": "boolean"},
            "path": {"type": "string"},
        },
    },
    "Bucket": {
        "allOf": [
            {"$ref": "#/components/schemas/BucketSettings"},
            {"type": "object", "required": ["name"], "properties": {"name": _NAME}},
        ]
    },
    "Buckets": {
        "type": "object",
        "required": ["buckets"],
        "properties": {
            "buckets": {"type": "array", "items": {"$ref": "#/components/schemas/Bucket"}}
        },
    },
    "Routing": {
        "type": "object",
        "required": ["version", "regions", "topics", "buckets"],
        "properties": {
            "version": {"type": "integer"},
            "regions": {"type": "array", "items": _NAME},
            "topics": {"type": "array", "items": {"$ref": "#/components/schemas/Topic"}},
            "buckets": {"type": "array", "items": {"$ref": "#/components/schemas/Bucket"}},
        },
    },
}

_ERRORS = {
    "400": "Bad input (malformed JSON, bad name, unknown field, partitions can only grow).",
    "401": "Missing, unknown or revoked token.",
    "403": "The token may not do this (a region acting as another, or changing topics).",
    "404": "No such topic, region or bucket location.",
    "409": "Already exists.",
    "413": "The body is larger than the server's limit.",
    "415": "Content-Type is not application/json.",
}


def _json(schema: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}


def _op(
    summary: str,
    ok: tuple[str, str, str | None],
    *,
    body: str | None = None,
    errors: tuple[str, ...] = ("400", "401", "403"),
    params: list[dict[str, Any]] | None = None,
    public: bool = False,
    who: str = "any token",
) -> dict[str, Any]:
    status, desc, schema = ok
    responses: dict[str, Any] = {status: {"description": desc}}
    if schema:
        responses[status]["content"] = _json(schema)
    for code in errors:
        responses[code] = {"description": _ERRORS[code], "content": _json("Error")}
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if public:
        op["security"] = []
    else:
        op["description"] = f"Allowed: {who}."
    if body:
        op["requestBody"] = {"required": True, "content": _json(body)}
        for code in ("413", "415"):
            responses[code] = {"description": _ERRORS[code], "content": _json("Error")}
    if params:
        op["parameters"] = params
    return op


def _ndjson(op: dict[str, Any]) -> dict[str, Any]:
    """``op`` with NDJSON bodies both ways (the head stream: one document per line)."""
    for content in (op["requestBody"]["content"], op["responses"]["200"]["content"]):
        content["application/x-ndjson"] = content.pop("application/json")
    op["responses"]["415"]["description"] = "Content-Type is not application/x-ndjson."
    return op


def _path_param(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


_ADMIN = "the admin token"
_SELF = "the admin token, or the token of that region"


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the metadata server."""
    topic = [_path_param("topic", _TOPIC_NAME)]
    region = [_path_param("region", _NAME)]
    bucket = [_path_param("bucket", _NAME)]
    paths: dict[str, Any] = {
        "/healthz": {"get": _op("Liveness", ("200", "Up", None), errors=(), public=True)},
        "/openapi.json": {
            "get": _op("This document", ("200", "OpenAPI 3.1", None), errors=(), public=True)
        },
        "/v1/routing": {
            "get": {
                **_op(
                    "The routing table (ETag = its version)",
                    ("200", "The current table", "Routing"),
                    errors=("401",),
                    params=[
                        {
                            "name": "If-None-Match",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string"},
                        }
                    ],
                ),
            }
        },
        "/v1/topics": {
            "get": _op("List topics", ("200", "Every topic", "Topics"), errors=("401",)),
            "post": _op(
                "Create a topic",
                ("201", "Created", "Topic"),
                body="TopicCreate",
                errors=("400", "401", "403", "404", "409"),
                who=_ADMIN,
            ),
        },
        "/v1/topics/{topic}": {
            "get": _op(
                "Describe a topic",
                ("200", "The topic", "Topic"),
                errors=("400", "401", "404"),
                params=topic,
            ),
            "patch": _op(
                "Alter a topic (partitions grow only; home is fixed)",
                ("200", "The altered topic", "Topic"),
                body="TopicAlter",
                errors=("400", "401", "403", "404"),
                params=topic,
                who=_ADMIN,
            ),
            "delete": _op(
                "Delete a topic",
                ("204", "Deleted", None),
                errors=("400", "401", "403", "404"),
                params=topic,
                who=_ADMIN,
            ),
        },
        "/v1/regions": {
            "get": _op("List regions", ("200", "Every region", "Regions"), errors=("401",)),
            "post": _op(
                "Add a region; answers its token (shown once)",
                ("201", "Created", "RegionCreated"),
                body="RegionCreate",
                errors=("400", "401", "403", "409"),
                who=_ADMIN,
            ),
        },
        "/v1/regions/{region}": {
            "get": _op(
                "Describe a region",
                ("200", "The region", "Region"),
                errors=("400", "401", "404"),
                params=region,
            ),
            "delete": _op(
                "Revoke a region's token (its topics stay)",
                ("204", "Revoked", None),
                errors=("400", "401", "403", "404"),
                params=region,
                who=_ADMIN,
            ),
        },
        "/v1/regions/{region}/token": {
            "post": _op(
                "Rotate a region's token: a new one, the current one valid a while longer",
                ("200", "The new token", "TokenRotated"),
                body="TokenRotation",
                errors=("400", "401", "403", "404"),
                params=region,
                who=_ADMIN,
            )
        },
        "/v1/regions/{region}/heartbeat": {
            "post": _op(
                "A gateway's heartbeat with its version and lag figures",
                ("200", "Recorded", "HeartbeatReply"),
                body="Heartbeat",
                errors=("400", "401", "403", "404"),
                params=region,
                who=_SELF,
            )
        },
        "/v1/regions/{region}/head": {
            "post": _op(
                "Report the region's latest committed log seq (coalesced)",
                ("200", "The known head", "HeadReply"),
                body="HeadReport",
                errors=("400", "401", "403", "404"),
                params=region,
                who=_SELF,
            )
        },
        "/v1/regions/{region}/head-stream": {
            "post": _ndjson(
                _op(
                    "Report the region's heads as lines of one long-lived request (protocol 3)",
                    (
                        "200",
                        "application/x-ndjson, chunked, at once: an ack line per read of "
                        "report lines (acked: lines applied so far; seq: the head held), or "
                        "the error line that ends the stream (acked, error)",
                        "HeadAck",
                    ),
                    body="HeadReport",
                    errors=("401", "403", "404"),
                    params=region,
                    who=_SELF,
                )
            )
        },
        "/v1/heads": {
            "get": _op(
                "Long-poll (or, with watch=1, a stream of): heads that moved after version `since`",
                (
                    "200",
                    "Moved heads (empty when wait_ms passed); with watch=1, "
                    "application/x-ndjson: one such document per line, at once, on each "
                    "change (coalesced) and after wait_ms without one (protocol 2)",
                    "Heads",
                ),
                errors=("400", "401"),
                params=[
                    _query(
                        "since",
                        "Relay version already seen (0: all).",
                        {"type": "integer", "minimum": 0},
                    ),
                    _query(
                        "regions", "Comma-separated regions (default: all).", {"type": "string"}
                    ),
                    _query(
                        "wait_ms",
                        "Wait up to this long for a move (capped by the server); "
                        "with watch=1, the keep-alive interval (default 25000).",
                        {"type": "integer", "minimum": 0},
                    ),
                    _query(
                        "watch",
                        "1: stream every change on this response (protocol 2; "
                        "older servers ignore it and answer one long poll).",
                        {"type": "integer", "enum": [0, 1]},
                    ),
                ],
            )
        },
        "/v1/buckets": {
            "get": _op(
                "List bucket locations", ("200", "Every location", "Buckets"), errors=("401",)
            )
        },
        "/v1/buckets/{bucket}": {
            "get": _op(
                "Describe a bucket location",
                ("200", "The location", "Bucket"),
                errors=("400", "401", "404"),
                params=bucket,
            ),
            "put": _op(
                "Create or replace a bucket location (no credentials)",
                ("200", "Replaced (201: created)", "Bucket"),
                body="BucketSettings",
                errors=("400", "401", "403"),
                params=bucket,
                who=_ADMIN,
            ),
            "delete": _op(
                "Delete a bucket location",
                ("204", "Deleted", None),
                errors=("400", "401", "403", "404"),
                params=bucket,
                who=_ADMIN,
            ),
        },
    }
    created = {"description": "Created", "content": _json("Bucket")}
    paths["/v1/buckets/{bucket}"]["put"]["responses"]["201"] = created
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "edgegw metadata server",
            "version": "1",
            "description": (
                "Topic routing, heartbeats and the head relay. See docs/metadata-api.md."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def render() -> str:
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
