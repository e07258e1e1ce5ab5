"""Kafka records <-> the gateway's records (sans-IO).

The journal's batch format (docs/format.md) has no null value and no null
header value; Kafka has both (a null value is a tombstone). So a null is
kept as an empty value (or empty header value) plus one reserved header,
:data:`NULL_HEADER`, naming what was null (``value``, or ``h<i>`` for the
header at index ``i``). Fetch over Kafka strips the marker and restores the
nulls, so they round-trip through the journal, the bucket and mirrors; the
HTTP API shows the marker as an ordinary header. A Kafka record whose own
headers use the reserved name is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from edge_gateway.errors import InvalidInput
from edge_gateway.format.batch import Record
from edge_gateway.format.batch import encode_batch as encode_batch_v1
from edge_gateway.format.kafka_batch import KafkaRecord, encode_batch
from edge_gateway.gateway import ProduceRecord

__all__ = ["NULL_HEADER", "encode_fetch_batches", "to_batch", "to_produce_records"]

#: The reserved header that marks nulls (docs/kafka.md, "Null values").
NULL_HEADER: Final = "edgegw.kafka.null"
_NULL_VALUE: Final = b"value"

#: Records per Kafka batch written into a Fetch response.
_BATCH_RECORDS: Final = 1000


def to_produce_records(records: Sequence[KafkaRecord], partition: int) -> list[ProduceRecord]:
    out: list[ProduceRecord] = []
    for r in records:
        headers: list[tuple[str, bytes]] = []
        marks: list[tuple[str, bytes]] = []
        for i, (name, hv) in enumerate(r.headers):
            if name == NULL_HEADER:
                raise InvalidInput(f"record header name {NULL_HEADER!r} is reserved")
            if hv is None:
                marks.append((NULL_HEADER, b"h%d" % i))
                hv = b""
            headers.append((name, hv))
        value = r.value
        if value is None:
            marks.append((NULL_HEADER, _NULL_VALUE))
            value = b""
        out.append(
            ProduceRecord(
                value=value,
                key=r.key,
                headers=tuple(headers + marks),
                timestamp=r.timestamp,
                partition=partition,
            )
        )
    return out


def to_batch(records: Sequence[KafkaRecord]) -> bytes:
    """The journal's batch (docs/format.md) of Kafka records, nulls marked (see above)."""
    values = [r.value for r in records]
    if None in values or any(r.headers for r in records):
        return _batch_of(to_produce_records(records, 0))
    keys = [r.key for r in records]
    return encode_batch_v1(
        values,  # type: ignore[arg-type]  # no None: checked above
        keys=keys if any(k is not None for k in keys) else None,
        timestamps=[r.timestamp for r in records],
    )


def _batch_of(records: Sequence[ProduceRecord]) -> bytes:
    return encode_batch_v1(
        [r.value for r in records],
        keys=[r.key for r in records] if any(r.key is not None for r in records) else None,
        timestamps=[r.timestamp or 0 for r in records],
        headers=[r.headers for r in records] if any(r.headers for r in records) else None,
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
