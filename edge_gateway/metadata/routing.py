"""The routing table: which region is home of which topic and who mirrors it (sans-IO).

The metadata server serves it (``GET /v1/routing``, see ``docs/metadata-api.md``);
the gateway's client caches it and turns it into the gateway's topology with
:func:`topology`. This module only parses, validates and converts: no I/O.

A document looks like::

    {"version": 7,
     "regions": ["north", "south"],
     "topics": [{"name": "telemetry", "home": "north", "partitions": 4,
                 "retention_ms": null, "subscribers": ["south"]}],
     "buckets": [{"name": "default", "type": "s3", "bucket": "fleet", ...}]}

``subscribers`` is a list of region names, or the string ``"*"`` for every
other region. ``priority`` (``"critical"``, ``"normal"`` or ``"bulk"``) is
written only when it is not ``"normal"``: a document without it (an older
server's) means ``"normal"``, and gateways from before priorities, which
refuse unknown fields, read a table whose topics are all normal as before.
``on_full`` (``"block"`` or ``"drop-oldest"``) likewise is written only when it
is not ``"block"``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from edge_gateway.errors import InvalidInput
from edge_gateway.names import validate_region, validate_topic

__all__ = [
    "ALL",
    "DEFAULT_ON_FULL",
    "DEFAULT_PRIORITY",
    "MAX_PARTITIONS",
    "ON_FULL",
    "PRIORITIES",
    "BucketLocation",
    "RoutingTable",
    "TopicRoute",
    "topology",
]

#: ``subscribers`` value meaning "every other region".
ALL: Final = "*"
MAX_PARTITIONS: Final = 100_000
_BUCKET_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: A topic's priority classes, in drain order (``edge_gateway.journal.Priority``'s
#: values; kept here as strings so the metadata server need not import the journal).
PRIORITIES: Final = ("critical", "normal", "bulk")
DEFAULT_PRIORITY: Final = "normal"
#: What a topic's lane does when its disk budget is full (``edge_gateway.journal.OnFull``'s
#: values, as strings for the same reason).
ON_FULL: Final = ("block", "drop-oldest")
DEFAULT_ON_FULL: Final = "block"
#: Fields a bucket location may carry; credentials never go to the metadata server.
BUCKET_FIELDS: Final = frozenset(
    {"type", "bucket", "container", "prefix", "endpoint_url", "region", "path_style", "path"}
)


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """One topic of the routing table."""

    name: str
    home: str
    partitions: int
    #: Milliseconds records are kept; ``None``: the gateways' own setting.
    retention_ms: int | None
    #: Regions that mirror it, or ``"*"`` for every other region.
    subscribers: tuple[str, ...] | Literal["*"]
    #: The journal lane of the topic at its home, and so the order in which its
    #: backlog ships after an outage (one of :data:`PRIORITIES`).
    priority: str = DEFAULT_PRIORITY
    #: The topic's lane's policy when its disk budget is full (one of :data:`ON_FULL`).
    on_full: str = DEFAULT_ON_FULL

    def subscribed_by(self, region: str) -> bool:
        if region == self.home:
            return False
        return self.subscribers == ALL or region in self.subscribers

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "home": self.home,
            "partitions": self.partitions,
            "retention_ms": self.retention_ms,
            "subscribers": self.subscribers if self.subscribers == ALL else list(self.subscribers),
        }
        if self.priority != DEFAULT_PRIORITY:
            # Only when not the default: gateways from before priorities refuse
            # a topic with a field they do not know (see the module docstring).
            doc["priority"] = self.priority
        if self.on_full != DEFAULT_ON_FULL:
            doc["on_full"] = self.on_full  # likewise
        return doc

    @classmethod
    def from_json(cls, doc: object) -> TopicRoute:
        """Parse and validate one topic; raises :class:`InvalidInput` naming the field."""
        d = _mapping(doc, "topic")
        _only(
            d,
            {"name", "home", "partitions", "retention_ms", "subscribers", "priority", "on_full"},
            "topic",
        )
        name = validate_topic(d.get("name"))
        return cls(
            name=name,
            home=validate_region(d.get("home")),
            partitions=parse_partitions(d.get("partitions")),
            retention_ms=parse_retention(d.get("retention_ms")),
            subscribers=parse_subscribers(d.get("subscribers", []), str(d.get("home"))),
            priority=parse_priority(d.get("priority", DEFAULT_PRIORITY)),
            on_full=parse_on_full(d.get("on_full", DEFAULT_ON_FULL)),
        )


@dataclass(frozen=True, slots=True)
class BucketLocation:
    """Where a bucket is (no credentials: each gateway has its own)."""

    name: str
    settings: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **self.settings}


@dataclass(frozen=True, slots=True)
class RoutingTable:
    """A version of the fleet's routing: regions, topics, bucket locations."""

    version: int
    regions: tuple[str, ...]
    topics: tuple[TopicRoute, ...]
    buckets: tuple[BucketLocation, ...] = ()

    def topic(self, name: str) -> TopicRoute | None:
        for t in self.topics:
            if t.name == name:
                return t
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "regions": list(self.regions),
            "topics": [t.to_json() for t in self.topics],
            "buckets": [b.to_json() for b in self.buckets],
        }

    @classmethod
    def from_json(cls, doc: object) -> RoutingTable:
        """Parse a routing document; raises :class:`InvalidInput` when it is malformed."""
        d = _mapping(doc, "routing table")
        version = d.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise InvalidInput("routing table: version must be an integer >= 0")
        regions = d.get("regions", [])
        if not isinstance(regions, list):
            raise InvalidInput("routing table: regions must be a list")
        topics = d.get("topics", [])
        if not isinstance(topics, list):
            raise InvalidInput("routing table: topics must be a list")
        buckets = d.get("buckets", [])
        if not isinstance(buckets, list):
            raise InvalidInput("routing table: buckets must be a list")
        return cls(
            version=version,
            regions=tuple(validate_region(r) for r in regions),
            topics=tuple(TopicRoute.from_json(t) for t in topics),
            buckets=tuple(parse_bucket(b) for b in buckets),
        )


def topology(table: RoutingTable) -> tuple[Any, ...]:
    """The gateway's topology for ``table``: one ``edge_gateway.config.TopicConfig`` per topic.

    The same shape as ``GatewayConfig.topics`` (``subscribers=("*",)`` for
    "every other region"), so the gateway can use a routing table where it
    uses the config's topics today. ``retention_ms`` has no place in
    ``TopicConfig`` yet and is dropped.
    """
    from edge_gateway.config import TopicConfig  # the config pulls in the journal and bucket
    from edge_gateway.journal import OnFull, Priority

    return tuple(
        TopicConfig(
            name=t.name,
            home=t.home,
            partitions=t.partitions,
            subscribers=(ALL,) if t.subscribers == ALL else tuple(t.subscribers),
            priority=Priority(t.priority),
            on_full=OnFull(t.on_full),
        )
        for t in table.topics
    )


# ------------------------------------------------------------ validation
# Shared by the server (request bodies) and the client (documents it reads).


def parse_partitions(value: object, field: str = "partitions") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{field} must be an integer, not {value!r}")
    if not 1 <= value <= MAX_PARTITIONS:
        raise InvalidInput(f"{field} must be 1..{MAX_PARTITIONS}, not {value}")
    return value


def parse_retention(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**62:
        raise InvalidInput(f"retention_ms must be a positive integer or null, not {value!r}")
    return value


def parse_priority(value: object) -> str:
    """One of :data:`PRIORITIES`; :class:`InvalidInput` naming the allowed values."""
    if not isinstance(value, str) or value not in PRIORITIES:
        allowed = ", ".join(repr(p) for p in PRIORITIES)
        raise InvalidInput(f"priority must be one of {allowed}, not {value!r}")
    return value


def parse_on_full(value: object) -> str:
    """One of :data:`ON_FULL`; :class:`InvalidInput` naming the allowed values."""
    if not isinstance(value, str) or value not in ON_FULL:
        allowed = ", ".join(repr(p) for p in ON_FULL)
        raise InvalidInput(f"on_full must be one of {allowed}, not {value!r}")
    return value


def parse_subscribers(value: object, home: str) -> tuple[str, ...] | Literal["*"]:
    """A list of region names (sorted, unique, without ``home``) or ``"*"``."""
    if value in (ALL, [ALL]):
        return ALL
    if not isinstance(value, list):
        raise InvalidInput(f'subscribers must be a list of regions or "*", not {value!r}')
    out = {validate_region(r) for r in value}
    if home in out:
        raise InvalidInput(f"subscribers: {home!r} is the topic's home region")
    return tuple(sorted(out))


def parse_bucket(doc: object) -> BucketLocation:
    d = _mapping(doc, "bucket")
    name = d.get("name")
    if not isinstance(name, str):
        raise InvalidInput("bucket: name must be a string")
    validate_bucket_name(name)
    return BucketLocation(name, parse_bucket_settings({k: v for k, v in d.items() if k != "name"}))


def validate_bucket_name(name: object) -> str:
    """Bucket location names follow the region rules (letters, digits, '_', '-')."""
    if not isinstance(name, str) or _BUCKET_NAME.fullmatch(name) is None:
        raise InvalidInput(f"bucket location name {name!r}: 1..64 letters, digits, '_' and '-'")
    return name


def parse_bucket_settings(doc: object) -> dict[str, Any]:
    d = _mapping(doc, "bucket")
    _only(d, BUCKET_FIELDS, "bucket")
    kind = d.get("type")
    if kind not in ("s3", "local", "azure", "gcs"):
        raise InvalidInput(f"bucket: type must be 's3', 'local', 'azure' or 'gcs', not {kind!r}")
    for key, value in d.items():
        if key == "path_style":
            if not isinstance(value, bool):
                raise InvalidInput("bucket: path_style must be true or false")
        elif not isinstance(value, str) or len(value) > 2048:
            raise InvalidInput(f"bucket: {key} must be a string (at most 2048 characters)")
    if kind in ("s3", "gcs") and not d.get("bucket"):
        raise InvalidInput(f"bucket: 'bucket' is required when type is {kind!r}")
    if kind == "azure" and not d.get("container"):
        raise InvalidInput("bucket: 'container' is required when type is 'azure'")
    return dict(d)


def _mapping(doc: object, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise InvalidInput(f"{what}: expected a JSON object")
    return doc


def _only(
    d: Mapping[str, Any], allowed: Sequence[str] | frozenset[str] | set[str], what: str
) -> None:
    extra = sorted(set(d) - set(allowed))
    if extra:
        raise InvalidInput(f"{what}: unknown field(s) {', '.join(map(repr, extra))}")
