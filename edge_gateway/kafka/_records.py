"""Kafka records <-> the gateway's records (sans-IO).

Kafka has null values (a tombstone) and null header values; so has the
journal's batch format, under its NULLS flag (docs/format.md), so produce
stores them as they are and Fetch returns them.

Gateways from before NULLS stored a null as an empty value (or empty header
value) plus one reserved header, :data:`NULL_HEADER`, naming what was null
(``value``, or ``h<i>`` for the header at index ``i``). Such records are still
in journals, buckets and mirrors: Fetch keeps stripping the marker and
restoring the nulls, so a Kafka record whose own headers use the reserved name
is still refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from edge_gateway.errors import InvalidInput
from edge_gateway.format.batch import Record
from edge_gateway.format.batch import encode_batch as encode_batch_v1
from edge_gateway.format.kafka_batch import KafkaRecord, encode_batch

__all__ = ["NULL_HEADER", "encode_fetch_batches", "to_batch"]

#: The legacy header that marked nulls (docs/kafka.md, "Null values").
NULL_HEADER: Final = "edgegw.kafka.null"
_NULL_VALUE: Final = b"value"

#: Records per Kafka batch written into a Fetch response.
_BATCH_RECORDS: Final = 1000


def to_batch(records: Sequence[KafkaRecord]) -> bytes:
    """The journal's batch (docs/format.md) of Kafka records, nulls as nulls."""
    keys = [r.key for r in records]
    headers = [r.headers for r in records]
    has_headers = any(headers)
    if has_headers:
        for hs in headers:
            for name, _ in hs:
                if name == NULL_HEADER:
                    raise InvalidInput(f"record header name {NULL_HEADER!r} is reserved")
    return encode_batch_v1(
        [r.value for r in records],
        keys=keys if any(k is not None for k in keys) else None,
        timestamps=[r.timestamp for r in records],
        headers=headers if has_headers else None,
    )


def _to_kafka(
    rec: Record,
) -> tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]:
    headers: Sequence[tuple[str, bytes | None]] = rec.headers
    value: bytes | None = rec.value
    if rec.headers and any(name == NULL_HEADER for name, _ in rec.headers):
        nulls = {hv for name, hv in rec.headers if name == NULL_HEADER}
        kept = [(n, hv) for n, hv in rec.headers if n != NULL_HEADER]
        headers = [(n, None if b"h%d" % i in nulls else hv) for i, (n, hv) in enumerate(kept)]
        if _NULL_VALUE in nulls:
            value = None
    return rec.timestamp, rec.key, value, headers


def encode_fetch_batches(records: Sequence[Record]) -> bytes:
    """Kafka record batches (magic 2, uncompressed) of records in offset order.

    A new batch starts at every offset gap (a mirrored source gap) and every
    :data:`_BATCH_RECORDS` records; within a batch offsets are consecutive.
    """
    parts: list[bytes] = []
    i, n = 0, len(records)
    while i < n:
        j = i + 1
        while j < n and j - i < _BATCH_RECORDS and records[j].offset == records[j - 1].offset + 1:
            j += 1
        parts.append(encode_batch(records[i].offset, [_to_kafka(r) for r in records[i:j]]))
        i = j
    return b"".join(parts)
