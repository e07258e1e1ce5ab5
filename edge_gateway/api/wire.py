"""What the local HTTP API puts on the wire: media types, headers, error codes.

Shared by the server (``edge_gateway.api``) and the client
(``edge_gateway.client``), and light on purpose: importing it pulls in
neither Starlette nor trio. The routes themselves are documented in
``docs/api.md``.

Every error response has the body ``{"error": {"code": ..., "message": ...}}``
(sometimes with more fields, see :data:`ERROR_CODES`); ``code`` is one of the
stable snake-case names below and says what the caller should do, like the
exception classes of :mod:`edge_gateway.errors` it maps to.
"""

from __future__ import annotations

from typing import Final

from edge_gateway.errors import (
    CorruptData,
    DiskFull,
    EdgeGatewayError,
    Fenced,
    InvalidInput,
    InvalidName,
    JournalFull,
    OutOfOrderSequence,
    ProducerFenced,
    ReadOnlyTopic,
    RepairPending,
    Unavailable,
    UnknownProducer,
    UnknownTopic,
    WrongRegion,
)

__all__ = [
    "BATCH_MEDIA_TYPE",
    "ERROR_CODES",
    "HIGH_WATERMARK_HEADER",
    "JSON_MEDIA_TYPE",
    "NEXT_OFFSET_HEADER",
    "PRODUCER_EPOCH_HEADER",
    "PRODUCER_ID_HEADER",
    "PRODUCER_SEQUENCE_HEADER",
    "error_class",
]

#: The binary record batch encoding (``docs/format.md``, "Record batch").
BATCH_MEDIA_TYPE: Final = "application/vnd.edgegw.batch"
JSON_MEDIA_TYPE: Final = "application/json"
#: Binary fetch responses: the offset to fetch next and the partition's high watermark.
NEXT_OFFSET_HEADER: Final = "EdgeGW-Next-Offset"
HIGH_WATERMARK_HEADER: Final = "EdgeGW-High-Watermark"
#: An idempotent produce (docs/api.md, "Idempotent produce"): all three or none.
PRODUCER_ID_HEADER: Final = "EdgeGW-Producer-Id"
PRODUCER_EPOCH_HEADER: Final = "EdgeGW-Producer-Epoch"
#: The sequence number of the request's first record for its (topic, partition).
PRODUCER_SEQUENCE_HEADER: Final = "EdgeGW-Producer-Sequence"

#: code -> (HTTP status, the edgegw exception class a client raises for it).
ERROR_CODES: Final[dict[str, tuple[int, type[EdgeGatewayError]]]] = {
    # 400: the request is wrong; do not retry it unchanged
    "invalid_request": (400, InvalidInput),
    "invalid_name": (400, InvalidName),
    "bad_batch": (400, InvalidInput),
    #: fetch below the earliest offset still held; the body adds ``earliest_offset``
    "offset_out_of_range": (400, InvalidInput),
    "unauthorized": (401, InvalidInput),
    "unknown_topic": (404, UnknownTopic),
    "not_found": (404, InvalidInput),
    "method_not_allowed": (405, InvalidInput),
    "read_only_topic": (409, ReadOnlyTopic),
    #: an idempotent produce names a producer id the gateway does not remember
    #: (expired, evicted, never issued): get a new id (POST /v1/producers)
    "unknown_producer": (409, UnknownProducer),
    #: an idempotent produce's sequence is not the next; the body adds ``expected_sequence``
    "out_of_order_sequence": (409, OutOfOrderSequence),
    #: a newer instance bumped this producer's epoch: this one stops
    "producer_fenced": (409, ProducerFenced),
    #: produce to a topic homed in another region; the body adds ``home_region``
    "wrong_region": (409, WrongRegion),
    #: a request body stalled for ``api.read_timeout_s``; the connection is closed
    "request_timeout": (408, Unavailable),
    "body_too_large": (413, InvalidInput),
    "unsupported_media_type": (415, InvalidInput),
    #: the request head (line and headers) is over 16 KiB
    "headers_too_large": (431, InvalidInput),
    # 5xx: the gateway cannot serve it now
    "internal": (500, EdgeGatewayError),
    #: the journal holds bytes that fail a check (a server-side problem)
    "corrupt_data": (500, CorruptData),
    #: the disk budget is full until the shipper frees space; honour Retry-After
    "journal_full": (503, JournalFull),
    #: the disk under the journal is full (not the budget); honour Retry-After
    "disk_full": (503, DiskFull),
    #: the entries asked for are damaged on disk and being rebuilt from the bucket
    #: (docs/operations.md, "A damaged disk"); honour Retry-After
    "repair_pending": (503, RepairPending),
    #: starting, shutting down, or a dependency is away; retry later
    "unavailable": (503, Unavailable),
    #: another gateway took over this region; this one is stopping
    "fenced": (503, Fenced),
}


def error_class(code: str, status: int) -> type[EdgeGatewayError]:
    """The exception class for an error ``code`` (falling back on the HTTP status)."""
    known = ERROR_CODES.get(code)
    if known is not None:
        return known[1]
    if status == 503:
        return Unavailable
    if 400 <= status < 500:
        return InvalidInput
    return EdgeGatewayError
