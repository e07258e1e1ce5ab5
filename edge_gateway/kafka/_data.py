"""The data path: Produce, Fetch, ListOffsets, CreateTopics, DescribeConfigs, InitProducerId.

Offsets are the gateway's own (the HTTP API's): a record produced over Kafka
at offset N is record N of the HTTP API's fetch, and a mirror topic read
over Kafka has the offsets of its source. ``acks`` (docs/kafka.md, "acks"):
0 sends no response; 1 and all answer once the records are in the journal
(as the HTTP API's ``ack=local``); with ``kafka.acks_all = "shipped"``,
``acks=all`` waits until the records are committed to the bucket.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final, Literal

import trio
from kio.schema.errors import ErrorCode

from edge_gateway.errors import CorruptData, EdgeGatewayError, InvalidInput
from edge_gateway.failpoints import fail_point
from edge_gateway.format.kafka_batch import KafkaRecord, UnsupportedCompression, decode_batches
from edge_gateway.idempotence import ProducerSeq
from edge_gateway.kafka._handlers import topic_id
from edge_gateway.kafka._protocol import OversizedProduce, RequestFrame, build, response_class
from edge_gateway.kafka._records import encode_fetch_batches, to_batch
from edge_gateway.kafka._registry import Connection, error_for, register, response_for

__all__: list[str] = []

log = logging.getLogger("edgegw.kafka")

PRODUCE_KEY: Final = 0
FETCH_KEY: Final = 1
LIST_OFFSETS_KEY: Final = 2
CREATE_TOPICS_KEY: Final = 19
INIT_PRODUCER_ID_KEY: Final = 22
DESCRIBE_CONFIGS_KEY: Final = 32

_EARLIEST: Final = -2
_LATEST: Final = -1
_MAX_TIMESTAMP: Final = -3
#: Bytes read per step while ListOffsets looks for a timestamp.
_SCAN_BYTES: Final = 4 << 20


def _ms(value: Any) -> int:
    """kio's timedelta fields (``timeout``, ``max_wait``) as milliseconds."""
    try:
        return int(value.total_seconds() * 1000)
    except AttributeError:
        return int(value)


# ------------------------------------------------------------------ Produce


def _partition_error(index: int, code: ErrorCode, message: str | None) -> dict[str, Any]:
    return {
        "index": index,
        "error_code": code,
        "base_offset": -1,
        "log_append_time": None,
        "log_start_offset": -1,
        "record_errors": [],
        "error_message": message,
    }


async def _produce_topic(
    conn: Connection, name: str, partitions: Sequence[Any], acks: int
) -> list[dict[str, Any]]:
    """Journal one topic's partitions: one journal entry each, appended concurrently.

    Each partition's append waits for its own durability; waiting together
    lets one fsync cover them all (group commit). A batch with a producer id
    goes through the idempotent append (a retry answers with the original
    offsets).
    """
    gw = conn.gateway
    out: dict[int, dict[str, Any]] = {}
    work: list[tuple[int, list[KafkaRecord], ProducerSeq | None]] = []
    for pd in partitions:
        p = int(pd.index)
        try:
            if pd.records is None:
                raise InvalidInput(f"partition {p}: no records")
            records: list[KafkaRecord] = []
            seqs: list[ProducerSeq] = []
            for batch in decode_batches(
                pd.records,
                max_records_bytes=conn.config.max_request_bytes * 4,
                where=f"{name}/{p}",
            ):
                if batch.transactional or batch.control:
                    raise InvalidInput("transactions are not supported")
                if batch.producer_id != -1:
                    if records:
                        # Kafka producers send one batch per partition and request.
                        raise InvalidInput("idempotent produce: one record batch per partition")
                    seqs.append(
                        ProducerSeq(batch.producer_id, batch.producer_epoch, batch.base_sequence)
                    )
                elif seqs:
                    raise InvalidInput("idempotent produce: one record batch per partition")
                records += batch.records
            if not records:
                raise InvalidInput(f"partition {p}: no records")
            if seqs:
                seqs[0].check()
        except UnsupportedCompression as exc:
            out[p] = _partition_error(p, ErrorCode.unsupported_compression_type, str(exc))
            continue
        except CorruptData as exc:
            out[p] = _partition_error(p, ErrorCode.corrupt_message, str(exc))
            continue
        except InvalidInput as exc:
            out[p] = _partition_error(p, ErrorCode.invalid_record, str(exc))
            continue
        work.append((p, records, seqs[0] if seqs else None))
    ack: Literal["local", "shipped"] = (
        "shipped" if acks == -1 and conn.config.acks_all == "shipped" else "local"
    )

    async def append(p: int, records: list[KafkaRecord], seq: ProducerSeq | None) -> None:
        try:
            # With ``seq``, a retry of a batch already written answers with its
            # original offsets (Gateway.produce_batch, edge_gateway.idempotence).
            res = await gw.produce_batch(name, p, to_batch(records), ack=ack, producer=seq)
        except EdgeGatewayError as exc:
            out[p] = _partition_error(p, error_for(exc), str(exc))
            return
        out[p] = {
            "index": p,
            "error_code": ErrorCode.none,
            "base_offset": res.offsets[0],
            "log_append_time": None,
            "log_start_offset": gw.lanes.first_offset(name, p),
            "record_errors": [],
            "error_message": None,
        }

    async with trio.open_nursery() as nursery:
        for p, records, seq in work:
            nursery.start_soon(append, p, records, seq)
    return [out[int(pd.index)] for pd in partitions]


@register(PRODUCE_KEY, 3, 12)
async def produce(conn: Connection, req: RequestFrame) -> Any:
    r = req.request
    acks = int(r.acks)
    if r.transactional_id is not None:
        body = [
            {
                "name": t.name,
                "partition_responses": [
                    _partition_error(
                        int(pd.index),
                        ErrorCode.transactional_id_authorization_failed,
                        "transactions are not supported",
                    )
                    for pd in t.partition_data
                ],
            }
            for t in r.topic_data
        ]
    elif acks not in (0, 1, -1):
        body = [
            {
                "name": t.name,
                "partition_responses": [
                    _partition_error(int(pd.index), ErrorCode.invalid_required_acks, f"acks={acks}")
                    for pd in t.partition_data
                ],
            }
            for t in r.topic_data
        ]
    else:
        body = []
        for t in r.topic_data:
            body.append(
                {
                    "name": t.name,
                    "partition_responses": await _produce_topic(
                        conn, t.name, t.partition_data, acks
                    ),
                }
            )
    response = response_for(req, {"responses": body, "throttle_time": 0})
    # Tests: the records are durable, the response is lost (the client retries).
    fail_point("kafka.produce_before_response")
    if acks == 0:
        # No response at all (Kafka's acks=0); errors are only counted.
        server = conn.gateway.kafka_server
        if server is not None:
            for t in body:
                for pr in t["partition_responses"]:
                    server.count_error(pr["error_code"])
        return None
    return response


def too_large(conn: Connection, req: OversizedProduce) -> Any:
    """The answer to a Produce over ``kafka.max_request_bytes``: ``MESSAGE_TOO_LARGE``
    for each of its partitions, as a Kafka broker answers a batch over
    ``message.max.bytes`` (None for ``acks=0``, whose errors are only counted)."""
    message = (
        f"the produce request is {req.size} bytes, over this gateway's limit of {req.limit} "
        "(kafka.max_request_bytes): send smaller batches (the producer's message.max.bytes, "
        "batch.size or max.request.size below the limit), or raise kafka.max_request_bytes"
    )
    body = [
        {
            "name": name,
            "partition_responses": [
                _partition_error(p, ErrorCode.message_too_large, message) for p in partitions
            ],
        }
        for name, partitions in req.topics
    ]
    if req.acks == 0:
        server = conn.gateway.kafka_server
        if server is not None:
            for _ in range(sum(len(partitions) for _, partitions in req.topics)):
                server.count_error(ErrorCode.message_too_large)
        return None
    return build(
        response_class(PRODUCE_KEY, req.api_version), {"responses": body, "throttle_time": 0}
    )


# ------------------------------------------------------------------ Fetch


def _offsets(conn: Connection, topic: str, p: int) -> tuple[int, int]:
    lanes = conn.gateway.lanes
    nxt = lanes.next_offset(topic, p)
    return (lanes.first_offset(topic, p) if nxt else 0), nxt


async def _read_partition(
    conn: Connection, topic: str, p: int, offset: int, max_bytes: int
) -> dict[str, Any]:
    gw = conn.gateway
    base: dict[str, Any] = {
        "partition_index": p,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        "aborted_transactions": None,
        "preferred_read_replica": -1,
        "records": None,
    }
    try:
        kind = gw.topic_kind(topic)
        if kind is None:
            return {**base, "error_code": ErrorCode.unknown_topic_or_partition}
        info_parts = gw.describe_topic(topic).partitions
        if not 0 <= p < info_parts:
            return {**base, "error_code": ErrorCode.unknown_topic_or_partition}
        first, nxt = _offsets(conn, topic, p)
        base.update(high_watermark=nxt, last_stable_offset=nxt, log_start_offset=first)
        if offset > nxt or offset < 0:
            return {**base, "error_code": ErrorCode.offset_out_of_range}
        if offset == nxt:
            return {**base, "error_code": ErrorCode.none, "records": b""}
        res = await gw.fetch(
            topic, p, offset, max_records=100_000, max_bytes=max(1, max_bytes), wait_ms=0
        )
    except EdgeGatewayError as exc:
        return {**base, "error_code": error_for(exc)}
    return {
        **base,
        "error_code": ErrorCode.none,
        "high_watermark": res.high_watermark,
        "last_stable_offset": res.high_watermark,
        "records": encode_fetch_batches(res.records),
    }


async def _wait_any(conn: Connection, wanted: Sequence[tuple[str, int, int]]) -> None:
    """Return once any (topic, partition) holds its offset (the caller bounds the wait)."""
    lanes = conn.gateway.lanes
    async with trio.open_nursery() as nursery:

        async def one(topic: str, p: int, offset: int) -> None:
            await lanes.wait_for(topic, p, offset)
            nursery.cancel_scope.cancel()

        for topic, p, offset in wanted:
            nursery.start_soon(one, topic, p, offset)


@register(FETCH_KEY, 4, 12)
async def fetch(conn: Connection, req: RequestFrame) -> Any:
    r = req.request
    max_wait = min(max(_ms(r.max_wait), 0), conn.config.max_wait_ms)
    min_bytes = max(int(r.min_bytes), 0)
    total_max = min(
        int(getattr(r, "max_bytes", conn.config.max_fetch_bytes)), conn.config.max_fetch_bytes
    )
    deadline = trio.current_time() + max_wait / 1000
    wanted = [
        (t.topic, int(p.partition), int(p.fetch_offset), int(p.partition_max_bytes))
        for t in r.topics
        for p in t.partitions
    ]
    while True:
        results: dict[tuple[str, int], dict[str, Any]] = {}
        size = 0
        for topic, p, offset, pmax in wanted:
            budget = min(pmax, total_max - size)
            if budget <= 0 and size:
                part = await _read_partition(conn, topic, p, offset, 0)
                part["records"] = b"" if part["error_code"] == ErrorCode.none else None
            else:
                part = await _read_partition(conn, topic, p, offset, max(budget, 1))
            size += len(part["records"] or b"")
            results[(topic, p)] = part
        errors = any(part["error_code"] != ErrorCode.none for part in results.values())
        if size >= max(min_bytes, 1) or errors or trio.current_time() >= deadline:
            break
        waiting = [
            (topic, p, offset)
            for topic, p, offset, _ in wanted
            if results[(topic, p)]["error_code"] == ErrorCode.none
        ]
        if not waiting:
            break
        server = conn.gateway.kafka_server
        if server is None:
            break
        with server.interruptible(deadline) as scope:
            await _wait_any(conn, waiting)
        if scope.cancelled_caught and server.stopping:
            break
    topics: dict[str, list[dict[str, Any]]] = {}
    for topic, p, _, _ in wanted:
        topics.setdefault(topic, []).append(results[(topic, p)])
    return response_for(
        req,
        {
            "throttle_time": 0,
            "error_code": ErrorCode.none,
            "session_id": 0,
            "responses": [{"topic": t, "partitions": parts} for t, parts in topics.items()],
        },
    )


# ------------------------------------------------------------------ ListOffsets


async def _offset_for_time(conn: Connection, topic: str, p: int, ts: int) -> tuple[int, int]:
    """(offset, timestamp) of the first record at or after ``ts`` still in the journal.

    A scan of the partition from its first retained offset, :data:`_SCAN_BYTES`
    at a time; (-1, -1) when no record is that late.
    """
    gw = conn.gateway
    offset, nxt = _offsets(conn, topic, p)
    while offset < nxt:
        res = await gw.fetch(topic, p, offset, max_records=100_000, max_bytes=_SCAN_BYTES)
        if not res.records:
            break
        for rec in res.records:
            if rec.timestamp >= ts:
                return rec.offset, rec.timestamp
        offset = res.next_offset
        await trio.lowlevel.checkpoint()
    return -1, -1


async def _max_timestamp(conn: Connection, topic: str, p: int) -> tuple[int, int]:
    gw = conn.gateway
    offset, nxt = _offsets(conn, topic, p)
    best = (-1, -1)
    while offset < nxt:
        res = await gw.fetch(topic, p, offset, max_records=100_000, max_bytes=_SCAN_BYTES)
        if not res.records:
            break
        for rec in res.records:
            if rec.timestamp > best[1]:
                best = (rec.offset, rec.timestamp)
        offset = res.next_offset
        await trio.lowlevel.checkpoint()
    return best


@register(LIST_OFFSETS_KEY, 1, 7)
async def list_offsets(conn: Connection, req: RequestFrame) -> Any:
    gw = conn.gateway
    topics = []
    for t in req.request.topics:
        parts = []
        for lp in t.partitions:
            p = int(lp.partition_index)
            ts = int(lp.timestamp)
            entry: dict[str, Any] = {
                "partition_index": p,
                "error_code": ErrorCode.none,
                "timestamp": -1,
                "offset": -1,
                "leader_epoch": 0,
            }
            try:
                info = gw.describe_topic(t.name)
                if not 0 <= p < info.partitions:
                    entry["error_code"] = ErrorCode.unknown_topic_or_partition
                elif ts == _EARLIEST:
                    entry["offset"] = _offsets(conn, t.name, p)[0]
                elif ts == _LATEST:
                    entry["offset"] = _offsets(conn, t.name, p)[1]
                elif ts == _MAX_TIMESTAMP:
                    entry["offset"], entry["timestamp"] = await _max_timestamp(conn, t.name, p)
                elif ts < 0:
                    entry["error_code"] = ErrorCode.invalid_request
                else:
                    entry["offset"], entry["timestamp"] = await _offset_for_time(
                        conn, t.name, p, ts
                    )
            except EdgeGatewayError as exc:
                entry["error_code"] = error_for(exc)
            parts.append(entry)
        topics.append({"name": t.name, "partitions": parts})
    return response_for(req, {"throttle_time": 0, "topics": topics})


# ------------------------------------------------------------------ topics


@register(CREATE_TOPICS_KEY, 2, 7)
async def create_topics(conn: Connection, req: RequestFrame) -> Any:
    gw = conn.gateway
    r = req.request
    default = gw.config.default_partitions
    results = []
    for t in r.topics:
        res: dict[str, Any] = {
            "name": t.name,
            "topic_id": topic_id(gw.region, t.name),
            "error_code": ErrorCode.none,
            "error_message": None,
            "num_partitions": default,
            "replication_factor": 1,
            "configs": None,
        }
        try:
            if gw.topic_kind(t.name) is not None:
                res.update(
                    error_code=ErrorCode.topic_already_exists,
                    error_message=f"topic {t.name!r} exists",
                )
            elif not gw.config.auto_create:
                res.update(
                    error_code=ErrorCode.policy_violation,
                    error_message="topics are created in the gateway's config or on the "
                    "metadata server here (auto_create is off)",
                )
            elif int(t.num_partitions) not in (-1, default):
                res.update(
                    error_code=ErrorCode.invalid_partitions,
                    error_message=f"topics created here have default_partitions = {default} "
                    "partitions (num_partitions -1 or that)",
                )
            elif int(t.replication_factor) not in (-1, 1):
                res.update(
                    error_code=ErrorCode.invalid_replication_factor,
                    error_message="the gateway is the only broker: replication factor 1",
                )
            elif not r.validate_only:
                gw.ensure_topic(t.name)
        except EdgeGatewayError as exc:
            res.update(error_code=error_for(exc), error_message=str(exc))
        results.append(res)
    return response_for(req, {"throttle_time": 0, "topics": results})


_TOPIC_RESOURCE: Final = 2
_BROKER_RESOURCE: Final = 4
_TOPIC_CONFIGS: Final = {
    "cleanup.policy": "delete",
    "compression.type": "producer",
    "message.timestamp.type": "CreateTime",
    "min.insync.replicas": "1",
}


@register(DESCRIBE_CONFIGS_KEY, 1, 4)
async def describe_configs(conn: Connection, req: RequestFrame) -> Any:
    gw = conn.gateway
    results = []
    for res in req.request.resources:
        rtype = int(res.resource_type)
        entry: dict[str, Any] = {
            "error_code": ErrorCode.none,
            "error_message": None,
            "resource_type": rtype,
            "resource_name": res.resource_name,
            "configs": [],
        }
        configs: dict[str, str] = {}
        if rtype == _TOPIC_RESOURCE:
            if gw.topic_kind(res.resource_name) is None:
                entry.update(
                    error_code=ErrorCode.unknown_topic_or_partition,
                    error_message=f"unknown topic {res.resource_name!r}",
                )
            else:
                configs = dict(_TOPIC_CONFIGS)
        elif rtype == _BROKER_RESOURCE:
            configs = {
                "auto.create.topics.enable": str(gw.config.auto_create).lower(),
                "num.partitions": str(gw.config.default_partitions),
                "message.max.bytes": str(conn.config.max_request_bytes),
            }
        else:
            entry.update(
                error_code=ErrorCode.invalid_request,
                error_message=f"resource type {rtype} is not described here",
            )
        keys = res.configuration_keys
        entry["configs"] = [
            {
                "name": k,
                "value": v,
                "read_only": True,
                "config_source": 5,  # DEFAULT_CONFIG
                "is_default": True,
                "is_sensitive": False,
                "synonyms": [],
                "config_type": 0,
                "documentation": None,
            }
            for k, v in sorted(configs.items())
            if keys is None or k in keys
        ]
        results.append(entry)
    return response_for(req, {"throttle_time": 0, "results": results})


# ------------------------------------------------------------------ producers


@register(INIT_PRODUCER_ID_KEY, 0, 4)
async def init_producer_id(conn: Connection, req: RequestFrame) -> Any:
    """A producer id and epoch (idempotence; edge_gateway.idempotence). No transactions."""
    r = req.request
    body: dict[str, Any] = {"throttle_time": 0, "producer_id": -1, "producer_epoch": -1}
    if r.transactional_id is not None:
        body["error_code"] = ErrorCode.transactional_id_authorization_failed
        return response_for(req, body)
    pid = int(getattr(r, "producer_id", -1))
    epoch = int(getattr(r, "producer_epoch", -1))
    try:
        if pid == -1:
            got = await conn.gateway.init_producer()
        else:
            # KIP-360: a producer that lost track of its sequences bumps its epoch.
            got = await conn.gateway.init_producer(pid, None if epoch == -1 else epoch)
    except EdgeGatewayError as exc:
        code = error_for(exc)
        if code == ErrorCode.unknown_producer_id:
            code = ErrorCode.invalid_producer_id_mapping
        elif code == ErrorCode.invalid_producer_epoch:
            code = ErrorCode.producer_fenced
        body["error_code"] = code
        return response_for(req, body)
    body.update(error_code=ErrorCode.none, producer_id=got[0], producer_epoch=got[1])
    return response_for(req, body)
