"""The table of Kafka APIs this broker serves: API key -> versions and handler.

A handler module registers its APIs at import with :func:`register`::

    @register(ApiKey.HEARTBEAT, 0, 4)
    async def heartbeat(conn: Connection, req: RequestFrame) -> Any: ...

The server dispatches each decoded request to the handler of its API key;
ApiVersions answers with this table, so registering is all it takes to
advertise an API. A handler returns kio's response entity of the request's
version (:func:`edge_gateway.kafka._protocol.build` and
:func:`response_for` help), or None to send nothing (Produce with
``acks=0``). It may raise :class:`CloseConnection` to end the connection
(after sending ``response`` when the exception carries one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from kio.schema.errors import ErrorCode

from edge_gateway.errors import (
    CorruptData,
    DiskFull,
    InvalidInput,
    InvalidName,
    OutOfOrderSequence,
    ProducerFenced,
    ReadOnlyTopic,
    Unavailable,
    UnknownProducer,
    UnknownTopic,
)
from edge_gateway.kafka._protocol import RequestFrame, build, response_class

if TYPE_CHECKING:
    from edge_gateway.config import KafkaConfig
    from edge_gateway.kafka._core import GatewayCore
    from edge_gateway.kafka._server import KafkaServer

__all__ = [
    "HANDLERS",
    "Api",
    "CloseConnection",
    "Connection",
    "Handler",
    "error_for",
    "register",
    "response_for",
    "supported_versions",
]


@dataclass(eq=False)
class Connection:
    """One client connection's state, shared by the handlers of its requests."""

    gateway: GatewayCore
    config: KafkaConfig
    #: ``host:port`` of the client.
    peer: str
    #: (host, port) clients are told to connect to (Metadata's one broker).
    advertised: tuple[str, int]
    tls: bool = False
    #: The client's ``client.id`` from its last request header.
    client_id: str | None = None
    #: False until SASL succeeds, when ``api.token`` is set; True from the start otherwise.
    authenticated: bool = True
    #: Who authenticated (the SASL user name), when anyone did.
    principal: str | None = None
    #: Per-connection state other modules keep (the SASL handshake's mechanism, ...).
    state: dict[str, Any] = field(default_factory=dict)
    #: The listener the connection came through (its counters).
    server: KafkaServer | None = None


class CloseConnection(Exception):
    """Raised by a handler: close the connection (after sending ``response``, if any)."""

    def __init__(self, reason: str, response: Any = None) -> None:
        super().__init__(reason)
        self.response = response


Handler = Callable[[Connection, RequestFrame], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    min_version: int
    max_version: int
    handler: Handler
    #: Served before SASL authentication (ApiVersions, SaslHandshake, SaslAuthenticate).
    before_auth: bool = False


#: API key -> what serves it. Filled at import by the handler modules.
HANDLERS: dict[int, Api] = {}


def register(
    api_key: int, min_version: int, max_version: int, *, before_auth: bool = False
) -> Callable[[Handler], Handler]:
    """Decorator: serve ``api_key`` versions ``min_version..max_version`` with the function."""

    def deco(fn: Handler) -> Handler:
        if api_key in HANDLERS and HANDLERS[api_key].handler is not fn:
            raise RuntimeError(f"Kafka API key {api_key} is registered twice")
        HANDLERS[api_key] = Api(api_key, min_version, max_version, fn, before_auth)
        return fn

    return deco


def supported_versions() -> dict[int, tuple[int, int]]:
    return {k: (a.min_version, a.max_version) for k, a in HANDLERS.items()}


def response_for(req: RequestFrame, values: Mapping[str, Any]) -> Any:
    """The response entity of ``req``'s API and version, built from ``values``."""
    return build(response_class(req.api_key, req.api_version), values)


#: Gateway errors and the Kafka error codes they are answered with (docs/kafka.md,
#: "Errors"). The first class ``exc`` is an instance of wins: a subclass stands
#: before its base (DiskFull before Unavailable, the producer errors before
#: InvalidInput).
_ERROR_CODES: Final[tuple[tuple[type[Exception], ErrorCode], ...]] = (
    (UnknownProducer, ErrorCode.unknown_producer_id),
    (OutOfOrderSequence, ErrorCode.out_of_order_sequence_number),
    (ProducerFenced, ErrorCode.invalid_producer_epoch),
    (UnknownTopic, ErrorCode.unknown_topic_or_partition),
    # Kafka has no read-only topics; "not authorized to write it" is what a
    # mirror is, and every client treats it as final (no retry loop).
    (ReadOnlyTopic, ErrorCode.topic_authorization_failed),
    (InvalidName, ErrorCode.invalid_topic_exception),
    (CorruptData, ErrorCode.corrupt_message),
    (DiskFull, ErrorCode.kafka_storage_error),
    # Not written; retriable (the journal is full, the gateway is stopping).
    (Unavailable, ErrorCode.not_enough_replicas),
    (InvalidInput, ErrorCode.invalid_request),
)


def error_for(exc: Exception) -> ErrorCode:
    """The Kafka error code for a gateway error (docs/kafka.md, "Errors")."""
    for cls, code in _ERROR_CODES:
        if isinstance(exc, cls):
            return code
    return ErrorCode.unknown_server_error
