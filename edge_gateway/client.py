"""Python clients of a gateway's local HTTP API (``docs/api.md``).

:class:`Client` is synchronous, :class:`AsyncClient` async (httpx; it runs
under trio and asyncio alike). Both have the same methods::

    with Client.from_data_dir("/var/lib/edgegw") as gw:     # reads api.addr
        gw.produce("telemetry", [b'{"t": 21.5}'], key="sensor-7")
        page = gw.fetch("telemetry", 0, offset=0, wait_ms=5000)
        for r in page.records: ...
        gw.commit_offsets("dashboards", {("telemetry", 0): page.next_offset})

Errors are edgegw's own classes (:mod:`edge_gateway.errors`), chosen by the
``code`` of the error response: ``unknown_topic`` -> :class:`UnknownTopic`,
``read_only_topic`` -> :class:`ReadOnlyTopic`, ``journal_full`` ->
:class:`JournalFull`, ``disk_full`` -> :class:`DiskFull`, ``repair_pending`` ->
:class:`RepairPending` (damaged entries being rebuilt from the bucket), other 4xx ->
:class:`InvalidInput` (and its subclasses), a refused connection, a
timeout or a 503 -> :class:`Unavailable`. Each error carries a note with
the HTTP status, the code and, when the gateway sent one, ``Retry-After``.
A topic or consumer group name that breaks the naming rules
(:mod:`edge_gateway.names`) raises :class:`InvalidName` /
:class:`InvalidInput` before anything is sent.

How it is built: every request is built, and every response parsed, once
and without I/O (``_*_call`` build a :class:`_Call`, ``_produced`` /
``_fetched`` / ... parse a :class:`_Reply`), and what a failure means is
decided once, too (:class:`_Retry` for a plain request, :class:`_PartitionSend`
for one partition's idempotent produce: wait and send again, get a new
producer id, or give up); the two clients are thin I/O shells around that
core that send, sleep and (the async one) lock. :class:`Client` on ``http://`` talks HTTP/1.1 itself
over one keep-alive socket (:class:`_Connection`: the request's bytes built
once, the response read by ``http.client.HTTPResponse``), which costs a
producer about what a bare ``http.client`` request does; httpx
carries ``https://``, a custom ``transport`` and :class:`AsyncClient`.

TLS (``https://``): the server's certificate is verified against
``ca_file`` (a PEM bundle: the gateway's CA, or its self-signed certificate)
or, without one, the system's trust store; ``verify`` takes a ready
:class:`ssl.SSLContext` instead (or ``False``: no verification, for tests
only); ``client_cert=(cert, key)`` presents a client certificate (the
gateway's ``api.tls_client_ca``). A certificate that does not verify, or a
client certificate the gateway refuses, raises :class:`Denied` naming the
problem (a person must act; retrying cannot help until then); a bad
``ca_file`` raises :class:`InvalidInput` when the client is made.

Produce is idempotent by default (docs/api.md, "Idempotent produce"): on
its first produce a client gets a producer id (``POST /v1/producers``),
numbers its records per (topic, partition), and when a request fails in a way
that leaves its fate unknown -- a cut connection, a timeout, a 503 -- it
sends the same request again, with the same sequence, for up to ``retry_s``
seconds: the gateway writes it once and answers a repeat with the original
offsets. So that every request writes one partition, the client chooses the
partition of a record that names none, as the gateway would: ``crc32c(key) %
partitions`` for a keyed record, one partition per call (round robin) for the
others (the partition count comes from ``GET /v1/topics/<topic>``, read once;
a topic that does not exist yet, which the produce auto-creates, gets its
first call's records in partition 0). ``idempotent=False`` turns all of this
off (one request per call, no retries: a retry of yours may then duplicate).

The client imports neither trio nor boto3: only httpx and the sans-IO
batch encoding (``edge_gateway.format.batch``).
"""

from __future__ import annotations

import base64
import enum
import http.client
import json
import os
import select
import socket
import ssl
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NamedTuple, Self
from urllib.parse import quote, urlencode

import httpx

from edge_gateway._crc import crc32c
from edge_gateway.api.wire import (
    BATCH_MEDIA_TYPE,
    HIGH_WATERMARK_HEADER,
    JSON_MEDIA_TYPE,
    NEXT_OFFSET_HEADER,
    PRODUCER_EPOCH_HEADER,
    PRODUCER_ID_HEADER,
    PRODUCER_SEQUENCE_HEADER,
    error_class,
)
from edge_gateway.backoff import Backoff
from edge_gateway.errors import (
    CorruptData,
    Denied,
    EdgeGatewayError,
    InvalidInput,
    OutOfOrderSequence,
    ProducerFenced,
    Unavailable,
    UnknownProducer,
    UnknownTopic,
    WrongRegion,
)
from edge_gateway.format.batch import Record, encode_batch, iter_batches, read_header
from edge_gateway.names import validate_group, validate_topic
from edge_gateway.net.http import CLIENT_KEEPALIVE_EXPIRY_S

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "Client",
    "FetchResponse",
    "GroupOffset",
    "OffsetOutOfRange",
    "ProduceResponse",
]

DEFAULT_URL = "http://127.0.0.1:8470"
Ack = Literal["local", "shipped"]
Bytesish = bytes | bytearray | memoryview
#: What ``produce`` takes per record: a value (bytes or text), the API's JSON
#: form of a record (``{"value": ..., "key": ...}``), or any object with the
#: attributes ``value`` and optionally ``key``, ``headers``, ``timestamp``,
#: ``partition`` (``edge_gateway.gateway.ProduceRecord``, a fetched ``Record``).
RecordLike = Bytesish | str | Mapping[str, Any] | Any


class OffsetOutOfRange(InvalidInput):
    """The fetch offset is below the earliest one the gateway still holds."""

    def __init__(self, message: str, earliest: int) -> None:
        super().__init__(message)
        #: The first offset the partition still holds (resume from here).
        self.earliest = earliest


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    topic: str
    #: ``partitions[i]``/``offsets[i]``: where record ``i`` landed.
    partitions: list[int]
    offsets: list[int]
    #: True when ``ack="shipped"``: the records are in the bucket.
    shipped: bool
    #: True when the gateway had already written (some of) these records: a
    #: retry answered with the original offsets (idempotent produce).
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class FetchResponse:
    topic: str
    partition: int
    records: list[Record]
    #: The offset to fetch next.
    next_offset: int
    #: The partition's next offset to be written.
    high_watermark: int


@dataclass(frozen=True, slots=True)
class GroupOffset:
    topic: str
    partition: int
    #: The next offset the group will read.
    offset: int
    metadata: str
    committed_ms: int


class _Call(NamedTuple):
    """One HTTP request, built without I/O (shared by both clients)."""

    method: str
    path: str
    params: dict[str, str] | None = None
    headers: dict[str, str] | None = None
    content: bytes | None = None
    timeout: float | None = None


# ---------------------------------------------------------------- requests


def _topic_seg(name: str) -> str:
    """A topic name as a URL path segment; a bad name raises :class:`InvalidName` here.

    Quoting alone is not enough: the server decodes ``%2F`` and resolves
    ``..`` before routing, so ``../x`` would reach another route ("no such
    route") instead of being refused as a name.
    """
    return quote(validate_topic(name), safe="")


def _group_seg(name: str) -> str:
    """A consumer group name as a URL path segment (see :func:`validate_group`)."""
    return quote(validate_group(name), safe="")


def _text_or_b64(data: Bytesish, field: str, doc: dict[str, Any]) -> None:
    raw = bytes(data)
    try:
        doc[field] = raw.decode("utf-8")
    except UnicodeDecodeError:
        doc[f"{field}_b64"] = base64.b64encode(raw).decode("ascii")


def _headers_doc(headers: Iterable[tuple[str, Bytesish | str | None]], doc: dict[str, Any]) -> None:
    text: dict[str, str | None] = {}
    binary: dict[str, str] = {}
    for name, value in headers:
        if value is None or isinstance(value, str):  # None: a null header value
            text[name] = value
            continue
        raw = bytes(value)
        try:
            text[name] = raw.decode("utf-8")
        except UnicodeDecodeError:
            binary[name] = base64.b64encode(raw).decode("ascii")
    if text:
        doc["headers"] = text
    if binary:
        doc["headers_b64"] = binary


def _record_doc(
    item: RecordLike,
    key: Bytesish | str | None,
    partition: int | None,
    headers: Iterable[tuple[str, Bytesish | str | None]] | None,
    timestamp: int | None,
) -> dict[str, Any]:
    doc: dict[str, Any]
    if isinstance(item, str):
        doc = {"value": item}
    elif isinstance(item, bytes | bytearray | memoryview):
        doc = {}
        _text_or_b64(item, "value", doc)
    elif isinstance(item, Mapping):
        doc = dict(item)
    elif hasattr(item, "value"):
        doc = {}
        value = item.value
        if value is None or isinstance(value, str):  # None: a null value (a tombstone)
            doc["value"] = value
        else:
            _text_or_b64(value, "value", doc)
        if getattr(item, "key", None) is not None:
            _text_or_b64(item.key, "key", doc)
        if getattr(item, "headers", None):
            _headers_doc(item.headers, doc)
        if getattr(item, "timestamp", None) is not None:
            doc["timestamp"] = item.timestamp
        if getattr(item, "partition", None) is not None:
            doc["partition"] = item.partition
    else:
        raise InvalidInput(f"cannot produce a {type(item).__name__}: give bytes, str or a record")
    if key is not None and "key" not in doc and "key_b64" not in doc:
        if isinstance(key, str):
            doc["key"] = key
        else:
            _text_or_b64(key, "key", doc)
    if partition is not None and "partition" not in doc:
        doc["partition"] = partition
    if headers and "headers" not in doc and "headers_b64" not in doc:
        _headers_doc(headers, doc)
    if timestamp is not None and "timestamp" not in doc:
        doc["timestamp"] = timestamp
    return doc


def _record_docs(
    records: Iterable[RecordLike] | RecordLike,
    key: Bytesish | str | None,
    partition: int | None,
    headers: Iterable[tuple[str, Bytesish | str | None]] | None,
    timestamp: int | None,
) -> list[dict[str, Any]]:
    if isinstance(records, str | bytes | bytearray | memoryview | Mapping) or hasattr(
        records, "value"
    ):
        records = [records]  # one record given alone
    return [_record_doc(r, key, partition, headers, timestamp) for r in records]


def _produce_call(
    topic: str,
    records: Iterable[RecordLike] | RecordLike,
    key: Bytesish | str | None,
    partition: int | None,
    headers: Iterable[tuple[str, Bytesish | str | None]] | None,
    timestamp: int | None,
    ack: Ack,
) -> _Call:
    return _records_call(topic, _record_docs(records, key, partition, headers, timestamp), ack)


def _records_call(
    topic: str, docs: list[dict[str, Any]], ack: Ack, extra: dict[str, str] | None = None
) -> _Call:
    body = json.dumps({"records": docs}, separators=(",", ":"), ensure_ascii=False)
    return _Call(
        "POST",
        f"/v1/topics/{_topic_seg(topic)}/records",
        {"ack": ack} if ack != "local" else None,
        {"content-type": JSON_MEDIA_TYPE, **(extra or {})},
        body.encode("utf-8"),
    )


def _batch_call(
    topic: str,
    partition: int,
    batch: Bytesish | Sequence[Bytesish | str],
    keys: Sequence[Bytesish | None] | None,
    timestamp: int | None,
    ack: Ack,
) -> _Call:
    if isinstance(batch, bytes | bytearray | memoryview):
        body = bytes(batch)
    else:
        import time

        values = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in batch]
        body = encode_batch(
            values,
            keys=None if keys is None else [None if k is None else bytes(k) for k in keys],
            timestamps=time.time_ns() // 1_000_000 if timestamp is None else timestamp,
        )
    return _Call(
        "POST",
        f"/v1/topics/{_topic_seg(topic)}/partitions/{int(partition)}/batches",
        {"ack": ack} if ack != "local" else None,
        {"content-type": BATCH_MEDIA_TYPE},
        body,
    )


def _fetch_call(
    topic: str,
    partition: int,
    offset: int,
    max_records: int | None,
    max_bytes: int | None,
    wait_ms: int,
    binary: bool,
    timeout: float,
) -> _Call:
    params = {"offset": str(int(offset))}
    if max_records is not None:
        params["max_records"] = str(int(max_records))
    if max_bytes is not None:
        params["max_bytes"] = str(int(max_bytes))
    if wait_ms:
        params["wait_ms"] = str(int(wait_ms))
    return _Call(
        "GET",
        f"/v1/topics/{_topic_seg(topic)}/partitions/{int(partition)}/records",
        params,
        {"accept": BATCH_MEDIA_TYPE} if binary else None,
        None,
        # a long poll must not time out before the gateway answers it
        max(timeout, wait_ms / 1000 + 10.0),
    )


def _commit_call(
    group: str,
    offsets: Mapping[tuple[str, int], int]
    | Iterable[tuple[str, int, int] | tuple[str, int, int, str]],
) -> _Call:
    rows: list[dict[str, Any]] = []
    items: Iterable[tuple[Any, ...]]
    if isinstance(offsets, Mapping):
        items = [(t, p, o) for (t, p), o in offsets.items()]
    else:
        items = offsets
    for row in items:
        doc = {"topic": row[0], "partition": row[1], "offset": row[2]}
        if len(row) > 3:
            doc["metadata"] = row[3]
        rows.append(doc)
    body = json.dumps({"offsets": rows}, separators=(",", ":")).encode("utf-8")
    return _Call(
        "POST",
        f"/v1/groups/{_group_seg(group)}/offsets",
        None,
        {"content-type": JSON_MEDIA_TYPE},
        body,
    )


# ---------------------------------------------------------------- responses


class _Reply(NamedTuple):
    """One HTTP response, whichever shell received it (what the parsers read)."""

    status: int
    #: Header values by lower-case name.
    headers: Mapping[str, str]
    body: bytes
    #: For error notes: the request's method and URL.
    method: str
    url: str

    def json(self) -> Any:
        return json.loads(self.body)


def _reply_of(response: httpx.Response) -> _Reply:
    """An httpx response as a :class:`_Reply` (httpx's headers ignore case already)."""
    return _Reply(
        response.status_code,
        response.headers,
        response.content,
        response.request.method,
        str(response.url),
    )


def _raise_for(response: _Reply) -> None:
    if response.status < 400:
        return
    code, message, extra = "", response.body.decode("utf-8", "replace")[:500], {}
    try:
        doc = response.json()
        err = doc["error"]
        code, message = str(err["code"]), str(err["message"])
        extra = err
    except (ValueError, KeyError, TypeError):
        pass
    status = response.status
    exc: EdgeGatewayError
    if code == "offset_out_of_range" and isinstance(extra.get("earliest_offset"), int):
        exc = OffsetOutOfRange(message, extra["earliest_offset"])
    elif code == "out_of_order_sequence":
        expected = extra.get("expected_sequence")
        exc = OutOfOrderSequence(message, expected=expected if isinstance(expected, int) else None)
    elif code == "wrong_region":
        home = extra.get("home_region")
        exc = WrongRegion(message, home if isinstance(home, str) else None)
    else:
        exc = error_class(code, status)(message)
    note = f"HTTP {status} {code or '(no code)'} from {response.method} {response.url}"
    retry_after = response.headers.get("retry-after")
    if retry_after:
        note += f"; Retry-After: {retry_after} s"
    exc.add_note(note)
    raise exc


def _json(response: _Reply) -> Any:
    _raise_for(response)
    return response.json()


def _produced(response: _Reply) -> ProduceResponse:
    doc = _json(response)
    offsets = doc["offsets"]
    return ProduceResponse(
        doc["topic"],
        [o["partition"] for o in offsets],
        [o["offset"] for o in offsets],
        bool(doc["shipped"]),
        bool(doc.get("duplicate", False)),
    )


# ---------------------------------------------------------------- idempotence


def _key_bytes(doc: Mapping[str, Any]) -> bytes | None:
    if doc.get("key") is not None:
        return str(doc["key"]).encode("utf-8")
    if doc.get("key_b64") is not None:
        return base64.b64decode(doc["key_b64"])
    return None


class _Plan(NamedTuple):
    """One request of an idempotent produce: a partition's records (by index)."""

    partition: int
    indices: list[int]
    call: _Call


class _Idempotence:
    """The client's producer (sans-IO): its id and epoch, and the next sequence per partition.

    ``plan_*`` turn a produce into one request per partition; :meth:`sign`
    adds the ``EdgeGW-Producer-*`` headers and takes the partition's next
    sequences. A request whose fate is unknown is
    sent again unchanged (same sequence) until it is answered; if the client
    gives up on one, the sequences are uncertain and the next produce first
    bumps the epoch (:meth:`needs_init` then returns the bump), which starts
    every sequence at 0 again (Kafka's producer does the same).
    """

    def __init__(self) -> None:
        self.producer_id: int | None = None
        self.epoch = 0
        self.uncertain = False
        self.next_seq: dict[tuple[str, int], int] = {}
        #: the id and epoch headers, made once per id and epoch (:meth:`sign`)
        self._id_headers: dict[str, str] = {}
        #: partitions per topic (None: the topic does not exist yet)
        self.partitions: dict[str, int | None] = {}
        self._round_robin = 0

    def init_call(self) -> _Call | None:
        """The ``POST /v1/producers`` to make before producing, if one is needed."""
        if self.producer_id is None:
            return _Call("POST", "/v1/producers", None, {"content-type": JSON_MEDIA_TYPE}, b"")
        if self.uncertain:
            body = json.dumps({"producer_id": self.producer_id, "epoch": self.epoch})
            return _Call(
                "POST", "/v1/producers", None, {"content-type": JSON_MEDIA_TYPE}, body.encode()
            )
        return None

    def initialized(self, response: _Reply) -> None:
        doc = _json(response)
        self.producer_id, self.epoch = int(doc["producer_id"]), int(doc["epoch"])
        self._id_headers = {
            PRODUCER_ID_HEADER: str(self.producer_id),
            PRODUCER_EPOCH_HEADER: str(self.epoch),
        }
        self.uncertain = False
        self.next_seq.clear()

    def forget(self) -> None:
        """The gateway does not know the id (expired, or issued before it restarted): a new one."""
        self.producer_id = None
        self.uncertain = False
        self.next_seq.clear()

    def unsign(self, topic: str, partition: int, seq: int, count: int) -> None:
        """Give back the sequences :meth:`sign` took, for a request surely not written."""
        key = (topic, partition)
        if self.next_seq.get(key) == (seq + count) % 2**31:
            self.next_seq[key] = seq

    def topic_call(self, topic: str) -> _Call | None:
        """``GET /v1/topics/<topic>`` when the partition count is not known yet."""
        if topic in self.partitions:
            return None
        return _Call("GET", f"/v1/topics/{_topic_seg(topic)}")

    def topic_answered(self, topic: str, response: _Reply) -> None:
        try:
            doc = _json(response)
        except UnknownTopic:
            self.partitions[topic] = None  # auto-created by the produce: partition 0 first
            return
        self.partitions[topic] = len(doc["partitions"])

    def plan_records(self, topic: str, docs: list[dict[str, Any]], ack: Ack) -> list[_Plan]:
        """One request per partition; records without a partition placed as the gateway would."""
        n = self.partitions.get(topic)
        sticky = 0
        if n:
            sticky = self._round_robin % n
            self._round_robin += 1
        first = docs[0].get("partition") if docs else None
        if type(first) is int and all(
            type(p := doc.get("partition")) is int and p == first for doc in docs
        ):
            # The common case (a partition given to produce): one request as is.
            if n is None:
                self.partitions.pop(topic, None)  # learn the count after the topic exists
            return [_Plan(first, list(range(len(docs))), _records_call(topic, docs, ack))]
        groups: dict[int, list[int]] = {}
        for i, doc in enumerate(docs):
            p = doc.get("partition")
            if p is None:
                key = _key_bytes(doc)
                p = int(crc32c(key)) % n if (n and key is not None) else sticky
                doc["partition"] = p
            if not isinstance(p, int) or isinstance(p, bool):
                raise InvalidInput(f"records[{i}].partition: must be an integer")
            groups.setdefault(p, []).append(i)
        if self.partitions.get(topic) is None:
            self.partitions.pop(topic, None)  # learn the count after the topic exists
        return [
            _Plan(p, idx, _records_call(topic, [docs[i] for i in idx], ack))
            for p, idx in groups.items()
        ]

    def sign(self, topic: str, plan: _Plan, count: int) -> tuple[_Call, int]:
        """The plan's request with the producer headers, and the sequence it takes.

        The partition's next ``count`` sequences are taken now: every retry
        of the request is this same call (never signed again, so a retry can
        never become a new write), and a concurrent request to the partition
        gets the sequences after it (the async client sends one partition's
        requests one at a time, so they arrive in order).
        """
        assert self.producer_id is not None
        call = plan.call
        key = (topic, plan.partition)
        seq = self.next_seq.get(key, 0)
        self.next_seq[key] = (seq + count) % 2**31
        headers = {
            **(call.headers or {}),
            **self._id_headers,
            PRODUCER_SEQUENCE_HEADER: str(seq),
        }
        return call._replace(headers=headers), seq


def _retryable(exc: EdgeGatewayError) -> bool:
    """Whether a produce that failed with ``exc`` may have been written, and a retry may help.

    A cut connection, a timeout or a 503 (unavailable, journal or disk full,
    shutting down): yes. A refusal a person must fix (:class:`Denied`): no.
    """
    return isinstance(exc, Unavailable) and not isinstance(exc, Denied)


#: A produce retry waits with full jitter (:mod:`edge_gateway.backoff`) under
#: a ceiling of 50 ms doubling to 1 s: a 503 or a cut connection is retried soon.
_RETRY_BASE_S = 0.05
_RETRY_CAP_S = 1.0


def _retry_backoff() -> Backoff:
    return Backoff(_RETRY_BASE_S, _RETRY_CAP_S)


@dataclass(slots=True)
class _Retry:
    """When a request the gateway did not answer is sent again (sans-IO: the shells send and
    sleep, :class:`Client` with ``time.sleep``, :class:`AsyncClient` with ``anyio.sleep``).

    A cut connection, a timeout or a 503 is retried until ``deadline`` (``time.monotonic``),
    waiting :meth:`next_delay` between tries; anything else is the answer.
    """

    deadline: float
    _backoff: Backoff = field(default_factory=_retry_backoff)

    def answered(self, reply: _Reply) -> bool:
        """Whether ``reply`` is the answer (anything but a 503 with time left to wait it out)."""
        return reply.status != 503 or time.monotonic() >= self.deadline

    def may_retry(self, exc: Unavailable) -> bool:
        """Whether to send again after ``exc`` (else it is raised)."""
        return _retryable(exc) and time.monotonic() < self.deadline

    def next_delay(self) -> float:
        """Seconds to wait before the next try."""
        return self._backoff.next_delay()


class _Then(enum.Enum):
    """What an idempotent send does after an error, when it does not wait and send again."""

    #: Raise the error.
    GIVE_UP = "give up"
    #: Forget the producer id, get a new one and sign the records again under it.
    NEW_PRODUCER_ID = "new producer id"


@dataclass(slots=True)
class _PartitionSend:
    """One partition's idempotent produce, decided without I/O: the request signed with the
    next sequence numbers, and what each error means for it.

    The shells get a producer id while ``idem`` has none, send :meth:`sign`'s request and,
    when it fails, do what :meth:`failed` says: wait that many seconds and send the same
    request again (same sequence: the gateway answers a duplicate with the first answer),
    get a new producer id, or give up.
    """

    idem: _Idempotence
    topic: str
    plan: _Plan
    count: int
    deadline: float
    #: The first sequence of the last :meth:`sign`.
    _seq: int = 0
    #: The producer id was renewed once already.
    _renewed: bool = False
    _backoff: Backoff = field(default_factory=_retry_backoff)

    def sign(self) -> _Call:
        """The request under the current producer id, with this partition's next sequence."""
        call, self._seq = self.idem.sign(self.topic, self.plan, self.count)
        return call

    def failed(self, exc: EdgeGatewayError) -> float | _Then:
        """After the signed request failed with ``exc``: seconds to wait before sending it
        again, or what to do instead."""
        idem = self.idem
        if isinstance(exc, UnknownProducer):
            # Forgotten (idle past the expiry, or issued just before a
            # restart and never used): nothing of this id is remembered,
            # so nothing it sent can be answered as a duplicate. New id, once.
            if self._renewed:
                return _Then.GIVE_UP
            self._renewed = True
            return _Then.NEW_PRODUCER_ID
        if isinstance(exc, OutOfOrderSequence | ProducerFenced):
            idem.uncertain = True
            return _Then.GIVE_UP
        if not _retryable(exc):
            if self._backoff.attempt == 0:  # refused (4xx): not written
                idem.unsign(self.topic, self.plan.partition, self._seq, self.count)
            else:
                idem.uncertain = True
            return _Then.GIVE_UP
        if time.monotonic() >= self.deadline:
            idem.uncertain = True  # written or not: the next produce bumps the epoch
            return _Then.GIVE_UP
        return self._backoff.next_delay()


def _merge(
    topic: str, n: int, plans: list[_Plan], answers: list[ProduceResponse]
) -> ProduceResponse:
    if len(plans) == 1 and len(plans[0].indices) == n:
        return answers[0]  # one request of every record, in order (plan_records' common case)
    partitions = [0] * n
    offsets = [0] * n
    for plan, res in zip(plans, answers, strict=True):
        for k, i in enumerate(plan.indices):
            partitions[i] = res.partitions[k]
            offsets[i] = res.offsets[k]
    return ProduceResponse(
        answers[0].topic if answers else topic,
        partitions,
        offsets,
        all(a.shipped for a in answers),
        any(a.duplicate for a in answers),
    )


def _batch_count(call: _Call) -> int:
    try:
        return read_header(call.content or b"", 0, where="batch").count
    except CorruptData as exc:
        raise InvalidInput(f"bad batch: {exc}") from None


def _bytes_of(doc: Mapping[str, Any], field: str) -> bytes | None:
    text = doc.get(field)
    if text is not None:
        return str(text).encode("utf-8")
    b64 = doc.get(f"{field}_b64")
    if b64 is not None:
        return base64.b64decode(b64)
    return None


def _fetched(response: _Reply, topic: str, partition: int, offset: int) -> FetchResponse:
    _raise_for(response)
    if response.headers.get("content-type", "").startswith(BATCH_MEDIA_TYPE):
        next_offset = int(response.headers[NEXT_OFFSET_HEADER.lower()])
        records = [
            r
            for b in iter_batches(response.body, where="fetch response")
            for r in b.records(offset)
            if r.offset < next_offset
        ]
        return FetchResponse(
            topic,
            partition,
            records,
            next_offset,
            int(response.headers[HIGH_WATERMARK_HEADER.lower()]),
        )
    doc = response.json()
    out = []
    for r in doc["records"]:
        headers: list[tuple[str, bytes | None]] = [
            (k, None if v is None else v.encode("utf-8"))
            for k, v in (r.get("headers") or {}).items()
        ]
        headers += [(k, base64.b64decode(v)) for k, v in (r.get("headers_b64") or {}).items()]
        out.append(
            Record(
                r["offset"],
                r["timestamp"],
                _bytes_of(r, "key"),
                _bytes_of(r, "value"),  # None: a null value
                tuple(headers),
            )
        )
    return FetchResponse(topic, partition, out, doc["next_offset"], doc["high_watermark"])


def _group_offsets(response: _Reply) -> list[GroupOffset]:
    doc = _json(response)
    return [
        GroupOffset(o["topic"], o["partition"], o["offset"], o["metadata"], o["committed_ms"])
        for o in doc["offsets"]
    ]


def read_addr_file(data_dir: str | os.PathLike[str]) -> str:
    """``http(s)://host:port`` of the gateway whose data directory is ``data_dir``.

    The file holds ``host:port`` (HTTP) or ``https://host:port`` (TLS).
    """
    path = Path(data_dir) / "api.addr"
    try:
        addr = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise Unavailable(f"{path} does not exist: is the gateway running?") from None
    if not addr:
        raise Unavailable(f"{path} is empty")
    return addr if "://" in addr else f"http://{addr}"


PathLike = str | os.PathLike[str]


def tls_context(
    ca_file: PathLike | None = None,
    client_cert: tuple[PathLike, PathLike] | None = None,
) -> ssl.SSLContext:
    """A client context verifying with ``ca_file`` (default: the system's CAs);
    :class:`InvalidInput` naming the file when one cannot be loaded."""
    try:
        ctx = ssl.create_default_context(cafile=os.fspath(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidInput(f"CA file {ca_file}: cannot load it: {_ssl_reason(exc)}") from None
    if client_cert is not None:
        load_client_cert(ctx, client_cert)
    return ctx


def load_client_cert(ctx: ssl.SSLContext, client_cert: tuple[PathLike, PathLike]) -> None:
    """Present ``(cert, key)`` from ``ctx``; :class:`InvalidInput` naming a bad file."""
    cert, key = (os.fspath(p) for p in client_cert)
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidInput(
            f"client certificate {cert} with key {key}: cannot load them: {_ssl_reason(exc)}"
        ) from None


def _ssl_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return str(exc.verify_message)
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, ssl.SSLError):
        return exc.strerror
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason.replace("_", " ").lower()
    return str(exc)


def _verify_of(
    verify: ssl.SSLContext | bool,
    ca_file: PathLike | None,
    client_cert: tuple[PathLike, PathLike] | None,
) -> ssl.SSLContext | bool:
    if isinstance(verify, ssl.SSLContext):
        if ca_file or client_cert:
            raise InvalidInput("give either verify=<SSLContext> or ca_file/client_cert, not both")
        return verify
    ctx = tls_context(ca_file, client_cert)
    if not verify:  # tests only: anyone in the path could read and answer
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _base_url(url: str) -> str:
    """``url`` without a trailing ``/``; :class:`InvalidInput` if it is not an http(s) URL."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise InvalidInput(f"{url!r} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidInput(f"{url!r} is not an http:// or https:// URL with a host")
    return url.rstrip("/")


def _client_headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _unavailable(base_url: str, exc: Exception) -> Unavailable:
    """The error for a transport failure; a TLS failure says what it was."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return Denied(
            f"the gateway at {base_url} presented a certificate that does not verify: "
            f"{_ssl_reason(cause)}",
            code="certificate_verify_failed",
            action="give the CA that signed the gateway's certificate (ca_file=, --ca-file) "
            "and connect with the name or address the certificate holds",
        )
    if isinstance(cause, ssl.SSLError):
        reason = _ssl_reason(cause)
        # An alert from the gateway about our (missing) client certificate:
        # "certificate required", "bad certificate", "unknown ca", ...
        if "alert" in reason and any(
            word in reason for word in ("certificate", "unknown ca", "access denied")
        ):
            return Denied(
                f"the gateway at {base_url} refused the TLS connection: {reason}",
                code="client_certificate_refused",
                action="present a client certificate the gateway's api.tls_client_ca "
                "signed (client_cert=, --client-cert/--client-key)",
            )
        return Unavailable(
            f"TLS with the gateway at {base_url} failed: {reason} "
            "(does it serve https on that port?)"
        )
    return Unavailable(f"cannot reach the gateway at {base_url}: {type(exc).__name__}: {exc}")


def _header_line(name: str, value: str) -> bytes:
    if "\r" in value or "\n" in value or "\0" in value:
        raise InvalidInput(f"header {name}: a value must not hold CR, LF or NUL")
    return f"{name}: {value}\r\n".encode("latin-1")


class _Connection:
    """One keep-alive HTTP/1.1 connection to an ``http://`` gateway.

    A request's bytes are built here (the fixed headers once, when the
    client is made: every value checked) and go out in one ``sendall``; the
    response is read by the standard library's
    :class:`http.client.HTTPResponse` (status line, headers, Content-Length,
    chunked and close-delimited bodies; malformed answers raise
    :class:`http.client.HTTPException`). Before a connection is reused it
    must be idle for less than :data:`CLIENT_KEEPALIVE_EXPIRY_S` (below the
    server's keep-alive timeout) and have nothing to read (a server that
    closed it leaves an EOF there): otherwise a new one is opened, so that a
    request is never sent on a connection the server is closing. Not
    thread-safe, like the client that owns it.
    """

    def __init__(self, url: httpx.URL, headers: Mapping[str, str]) -> None:
        self.address = (url.host, url.port or 80)
        self.prefix = url.raw_path.decode("ascii").rstrip("/")
        host = url.netloc.decode("ascii")
        self.origin = f"http://{host}"
        #: host and the client's own headers, as sent with every request
        self.fixed = _header_line("host", host) + b"".join(
            _header_line(k, v) for k, v in headers.items()
        )
        self._sock: socket.socket | None = None
        self._idle_since = 0.0

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None

    def _ready(self, timeout: float) -> socket.socket:
        sock = self._sock
        if sock is not None:
            stale = time.monotonic() - self._idle_since > CLIENT_KEEPALIVE_EXPIRY_S
            if not stale and not select.select([sock], [], [], 0)[0]:
                sock.settimeout(timeout)
                return sock
            self.close()
        sock = socket.create_connection(self.address, timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        return sock

    def request(self, call: _Call, timeout: float) -> _Reply:
        target = self.prefix + call.path
        if call.params:
            target += "?" + urlencode(call.params)
        head = b"%s %s HTTP/1.1\r\n%s" % (
            call.method.encode("ascii"),
            target.encode("ascii"),
            self.fixed,
        )
        if call.headers:
            head += b"".join(_header_line(k, v) for k, v in call.headers.items())
        body = call.content
        if body is not None or call.method == "POST":
            head += b"content-length: %d\r\n" % len(body or b"")
        head += b"\r\n"
        sock = self._ready(timeout)
        try:
            sock.sendall(head + body if body else head)
            response = http.client.HTTPResponse(sock, method=call.method)
            try:
                response.begin()
                data = response.read()
            finally:
                response.close()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        headers: dict[str, str] = {}
        for name, value in response.getheaders():
            headers.setdefault(name.lower(), value)
        if response.will_close:
            self.close()
        self._idle_since = time.monotonic()
        return _Reply(response.status, headers, data, call.method, self.origin + target)


# ------------------------------------------------------------------ clients


class _BaseClient:
    """What both clients hold (httpx's ``BaseClient`` for its two clients, likewise): the
    gateway's URL, the timeouts and this client's producer (:class:`_Idempotence`)."""

    def __init__(self, base_url: str, timeout: float, idempotent: bool, retry_s: float) -> None:
        self.base_url = _base_url(base_url)
        self.timeout = timeout
        #: Produce idempotently, retrying for up to ``retry_s`` (see the module docstring).
        self.idempotent = idempotent
        self.retry_s = retry_s
        self._idem = _Idempotence()

    @classmethod
    def from_data_dir(cls, data_dir: str | os.PathLike[str], **kwargs: Any) -> Self:
        """A client of the gateway running on ``data_dir`` (reads ``<data_dir>/api.addr``)."""
        return cls(read_addr_file(data_dir), **kwargs)


class Client(_BaseClient):
    """Synchronous client of one gateway's local API (one keep-alive connection)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        ca_file: PathLike | None = None,
        verify: ssl.SSLContext | bool = True,
        client_cert: tuple[PathLike, PathLike] | None = None,
        idempotent: bool = True,
        retry_s: float = 30.0,
    ) -> None:
        super().__init__(base_url, timeout, idempotent, retry_s)
        url = httpx.URL(self.base_url)
        self._conn: _Connection | None = None
        self._http: httpx.Client | None = None
        if transport is None and url.scheme == "http":
            self._conn = _Connection(url, _client_headers(token))
        else:
            self._http = httpx.Client(
                base_url=self.base_url,
                headers=_client_headers(token),
                timeout=timeout,
                transport=transport,
                verify=_verify_of(verify, ca_file, client_cert) if url.scheme == "https" else True,
            )

    def _send(self, call: _Call) -> _Reply:
        timeout = call.timeout if call.timeout is not None else self.timeout
        try:
            if self._conn is not None:
                return self._conn.request(call, timeout)
            assert self._http is not None
            return _reply_of(
                self._http.request(
                    call.method,
                    call.path,
                    params=call.params,
                    headers=call.headers,
                    content=call.content,
                    timeout=timeout,
                )
            )
        except (httpx.TransportError, OSError, http.client.HTTPException) as exc:
            raise _unavailable(self.base_url, exc) from exc

    def produce(
        self,
        topic: str,
        records: Iterable[RecordLike] | RecordLike,
        *,
        key: Bytesish | str | None = None,
        partition: int | None = None,
        headers: Iterable[tuple[str, Bytesish | str | None]] | None = None,
        timestamp: int | None = None,
        ack: Ack = "local",
    ) -> ProduceResponse:
        """Produce records (values, or record-like objects); ``key`` etc. apply to all.

        Idempotent (unless the client was made with ``idempotent=False``): one
        request per partition, each retried until answered (see the module
        docstring). If it raises after retrying, the records of some
        partitions may have been written.
        """
        if not self.idempotent:
            call = _produce_call(topic, records, key, partition, headers, timestamp, ack)
            return _produced(self._send(call))
        docs = _record_docs(records, key, partition, headers, timestamp)
        topic_call = self._idem.topic_call(topic)
        if topic_call is not None:
            self._idem.topic_answered(topic, self._retrying(topic_call))
        plans = self._idem.plan_records(topic, docs, ack)
        answers = [self._send_idempotent(topic, plan, len(plan.indices)) for plan in plans]
        return _merge(topic, len(docs), plans, answers)

    def produce_batch(
        self,
        topic: str,
        partition: int,
        batch: Bytesish | Sequence[Bytesish | str],
        *,
        keys: Sequence[Bytesish | None] | None = None,
        timestamp: int | None = None,
        ack: Ack = "local",
    ) -> ProduceResponse:
        """Produce one encoded batch (or values, encoded here) to one partition (idempotent
        like :meth:`produce`)."""
        call = _batch_call(topic, partition, batch, keys, timestamp, ack)
        if not self.idempotent:
            return _produced(self._send(call))
        return self._send_idempotent(topic, _Plan(partition, [], call), _batch_count(call))

    def _retrying(self, call: _Call, deadline: float | None = None) -> _Reply:
        """Send ``call`` again after a cut connection, timeout or 503 until ``deadline``."""
        retry = _Retry(time.monotonic() + self.retry_s if deadline is None else deadline)
        while True:
            try:
                reply = self._send(call)
            except Unavailable as exc:
                if not retry.may_retry(exc):
                    raise
            else:
                if retry.answered(reply):
                    return reply
            time.sleep(retry.next_delay())

    def _send_idempotent(self, topic: str, plan: _Plan, count: int) -> ProduceResponse:
        """Send one partition's request until the gateway answers it, same sequence each time."""
        idem = self._idem
        send = _PartitionSend(idem, topic, plan, count, time.monotonic() + self.retry_s)
        while True:
            init = idem.init_call()
            if init is not None:
                try:
                    idem.initialized(self._retrying(init, send.deadline))
                except UnknownProducer:
                    idem.forget()  # a bump of an id the gateway forgot: a new id
                    continue
            call = send.sign()
            while True:
                try:
                    return _produced(self._send(call))
                except EdgeGatewayError as exc:
                    then = send.failed(exc)
                    if then is _Then.GIVE_UP:
                        raise
                    if then is _Then.NEW_PRODUCER_ID:
                        idem.forget()
                        break
                    time.sleep(then)

    def init_producer(self) -> tuple[int, int]:
        """This client's producer id and epoch (asked for now if it has none)."""
        init = self._idem.init_call()
        if init is not None:
            self._idem.initialized(self._retrying(init))
        assert self._idem.producer_id is not None
        return self._idem.producer_id, self._idem.epoch

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        wait_ms: int = 0,
        binary: bool = False,
    ) -> FetchResponse:
        """Records from ``offset``; ``wait_ms`` long-polls for the first one."""
        call = _fetch_call(
            topic, partition, offset, max_records, max_bytes, wait_ms, binary, self.timeout
        )
        return _fetched(self._send(call), topic, partition, offset)

    def topics(self) -> list[dict[str, Any]]:
        topics: list[dict[str, Any]] = _json(self._send(_Call("GET", "/v1/topics")))["topics"]
        return topics

    def topic(self, name: str) -> dict[str, Any]:
        doc: dict[str, Any] = _json(self._send(_Call("GET", f"/v1/topics/{_topic_seg(name)}")))
        return doc

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = _json(self._send(_Call("GET", "/v1/status")))
        return doc

    def healthy(self) -> bool:
        """True when the gateway answers /healthz with 200."""
        try:
            return self._send(_Call("GET", "/healthz")).status == 200
        except Unavailable:
            return False

    def commit_offsets(
        self,
        group: str,
        offsets: Mapping[tuple[str, int], int]
        | Iterable[tuple[str, int, int] | tuple[str, int, int, str]],
    ) -> int:
        """Store the next offset to read per (topic, partition) for ``group``."""
        committed: int = _json(self._send(_commit_call(group, offsets)))["committed"]
        return committed

    def fetch_offsets(self, group: str, topic: str | None = None) -> list[GroupOffset]:
        params = {"topic": topic} if topic else None
        return _group_offsets(
            self._send(_Call("GET", f"/v1/groups/{_group_seg(group)}/offsets", params))
        )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClient(_BaseClient):
    """Async client of one gateway's local API (httpx; under trio or asyncio)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        ca_file: PathLike | None = None,
        verify: ssl.SSLContext | bool = True,
        client_cert: tuple[PathLike, PathLike] | None = None,
        idempotent: bool = True,
        retry_s: float = 30.0,
    ) -> None:
        super().__init__(base_url, timeout, idempotent, retry_s)
        # created on first use, in the caller's event loop
        self._init_lock: Any = None
        self._partition_locks: dict[tuple[str, int], Any] = {}
        https = httpx.URL(self.base_url).scheme == "https"
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=_client_headers(token),
            timeout=timeout,
            transport=transport,
            verify=_verify_of(verify, ca_file, client_cert) if https else True,
        )

    async def _send(self, call: _Call) -> _Reply:
        try:
            response = await self._http.request(
                call.method,
                call.path,
                params=call.params,
                headers=call.headers,
                content=call.content,
                timeout=call.timeout if call.timeout is not None else self.timeout,
            )
        except httpx.TransportError as exc:
            raise _unavailable(self.base_url, exc) from exc
        return _reply_of(response)

    async def produce(
        self,
        topic: str,
        records: Iterable[RecordLike] | RecordLike,
        *,
        key: Bytesish | str | None = None,
        partition: int | None = None,
        headers: Iterable[tuple[str, Bytesish | str | None]] | None = None,
        timestamp: int | None = None,
        ack: Ack = "local",
    ) -> ProduceResponse:
        """Produce records (values, or record-like objects); ``key`` etc. apply to all.

        Idempotent unless ``idempotent=False`` (see :meth:`Client.produce`).
        """
        if not self.idempotent:
            call = _produce_call(topic, records, key, partition, headers, timestamp, ack)
            return _produced(await self._send(call))
        docs = _record_docs(records, key, partition, headers, timestamp)
        topic_call = self._idem.topic_call(topic)
        if topic_call is not None:
            self._idem.topic_answered(topic, await self._retrying(topic_call))
        plans = self._idem.plan_records(topic, docs, ack)
        answers = [await self._send_idempotent(topic, plan, len(plan.indices)) for plan in plans]
        return _merge(topic, len(docs), plans, answers)

    async def produce_batch(
        self,
        topic: str,
        partition: int,
        batch: Bytesish | Sequence[Bytesish | str],
        *,
        keys: Sequence[Bytesish | None] | None = None,
        timestamp: int | None = None,
        ack: Ack = "local",
    ) -> ProduceResponse:
        """Produce one encoded batch (or values, encoded here) to one partition (idempotent
        like :meth:`produce`)."""
        call = _batch_call(topic, partition, batch, keys, timestamp, ack)
        if not self.idempotent:
            return _produced(await self._send(call))
        return await self._send_idempotent(topic, _Plan(partition, [], call), _batch_count(call))

    async def _retrying(self, call: _Call, deadline: float | None = None) -> _Reply:
        """:meth:`Client._retrying`, async."""
        import anyio

        retry = _Retry(time.monotonic() + self.retry_s if deadline is None else deadline)
        while True:
            try:
                reply = await self._send(call)
            except Unavailable as exc:
                if not retry.may_retry(exc):
                    raise
            else:
                if retry.answered(reply):
                    return reply
            await anyio.sleep(retry.next_delay())

    async def _send_idempotent(self, topic: str, plan: _Plan, count: int) -> ProduceResponse:
        """:meth:`Client._send_idempotent`, async: one partition's requests one at a time."""
        import anyio

        idem = self._idem
        send = _PartitionSend(idem, topic, plan, count, time.monotonic() + self.retry_s)
        key = (topic, plan.partition)
        if self._init_lock is None:
            self._init_lock = anyio.Lock()
        lock = self._partition_locks.get(key)
        if lock is None:
            lock = self._partition_locks[key] = anyio.Lock()
        async with lock:
            while True:
                async with self._init_lock:  # one producer id for all the client's tasks
                    init = idem.init_call()
                    if init is not None:
                        try:
                            idem.initialized(await self._retrying(init, send.deadline))
                        except UnknownProducer:
                            idem.forget()
                            continue
                call = send.sign()
                while True:
                    try:
                        return _produced(await self._send(call))
                    except EdgeGatewayError as exc:
                        then = send.failed(exc)
                        if then is _Then.GIVE_UP:
                            raise
                        if then is _Then.NEW_PRODUCER_ID:
                            async with self._init_lock:
                                sent_id = (call.headers or {}).get(PRODUCER_ID_HEADER)
                                if str(idem.producer_id) == sent_id:
                                    idem.forget()  # not renewed by another task meanwhile
                            break
                        await anyio.sleep(then)

    async def init_producer(self) -> tuple[int, int]:
        """This client's producer id and epoch (asked for now if it has none)."""
        import anyio

        if self._init_lock is None:
            self._init_lock = anyio.Lock()
        async with self._init_lock:
            init = self._idem.init_call()
            if init is not None:
                self._idem.initialized(await self._retrying(init))
        assert self._idem.producer_id is not None
        return self._idem.producer_id, self._idem.epoch

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
        wait_ms: int = 0,
        binary: bool = False,
    ) -> FetchResponse:
        """Records from ``offset``; ``wait_ms`` long-polls for the first one."""
        call = _fetch_call(
            topic, partition, offset, max_records, max_bytes, wait_ms, binary, self.timeout
        )
        return _fetched(await self._send(call), topic, partition, offset)

    async def topics(self) -> list[dict[str, Any]]:
        doc = _json(await self._send(_Call("GET", "/v1/topics")))
        topics: list[dict[str, Any]] = doc["topics"]
        return topics

    async def topic(self, name: str) -> dict[str, Any]:
        doc: dict[str, Any] = _json(
            await self._send(_Call("GET", f"/v1/topics/{_topic_seg(name)}"))
        )
        return doc

    async def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = _json(await self._send(_Call("GET", "/v1/status")))
        return doc

    async def healthy(self) -> bool:
        """True when the gateway answers /healthz with 200."""
        try:
            return (await self._send(_Call("GET", "/healthz"))).status == 200
        except Unavailable:
            return False

    async def commit_offsets(
        self,
        group: str,
        offsets: Mapping[tuple[str, int], int]
        | Iterable[tuple[str, int, int] | tuple[str, int, int, str]],
    ) -> int:
        """Store the next offset to read per (topic, partition) for ``group``."""
        committed: int = _json(await self._send(_commit_call(group, offsets)))["committed"]
        return committed

    async def fetch_offsets(self, group: str, topic: str | None = None) -> list[GroupOffset]:
        params = {"topic": topic} if topic else None
        call = _Call("GET", f"/v1/groups/{_group_seg(group)}/offsets", params)
        return _group_offsets(await self._send(call))

    async def sync(self, *, pull: bool = True, wait_s: float | None = None) -> dict[str, Any]:
        """Ask the gateway to ship everything pending and pull its sources (``edgegw sync``).

        ``wait_s`` None waits as long as it takes (a day: the link may be slow).
        """
        call = _Call(
            "POST",
            "/v1/sync",
            {"pull": "true" if pull else "false"},
            timeout=86400.0 if wait_s is None else wait_s,
        )
        doc: dict[str, Any] = _json(await self._send(call))
        return doc

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
