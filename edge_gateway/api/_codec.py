"""JSON bodies and query parameters of the local API <-> gateway objects (no I/O).

Every malformed input raises :class:`InvalidInput` (or :class:`InvalidName`)
naming the offending field, never ``KeyError``, ``TypeError``,
``UnicodeError`` or ``RecursionError``: the API turns those into a 400, and a
500 would be a bug.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from edge_gateway.api import wire
from edge_gateway.errors import InvalidInput
from edge_gateway.format.batch import Record
from edge_gateway.gateway import ProduceRecord
from edge_gateway.idempotence import MAX_EPOCH, MAX_PRODUCER_ID, SEQUENCE_MODULUS, ProducerSeq

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_INT = re.compile(r"[+-]?[0-9]{1,19}")
_RECORD_FIELDS: Final = frozenset(
    {"value", "value_b64", "key", "key_b64", "headers", "headers_b64", "timestamp", "partition"}
)
_OFFSET_FIELDS: Final = frozenset({"topic", "partition", "offset", "metadata"})

Ack = Literal["local", "shipped"]


#: How deep a record's JSON ``value`` may nest arrays and objects (``[[1]]`` is 2).
#: Checked on the raw body before parsing, so the answer is the same on every
#: Python version (the parser's own limit follows the interpreter's recursion
#: limit: 3.11 gave up near 1,000 levels, 3.13 parses far deeper). 64 is far
#: beyond real telemetry and far below where any interpreter's parser (or
#: ``json.dumps``, which re-encodes the value) could run out of recursion.
MAX_VALUE_DEPTH: Final = 64
#: A produce body wraps values in three levels: ``{"records": [{"value": ...}]}``.
MAX_BODY_DEPTH: Final = MAX_VALUE_DEPTH + 3
_NOT_MARKS: Final = bytes(b for b in range(256) if b not in b'"[]{}')
# a string once escapes and everything but quotes and brackets are gone
_STRING = re.compile(rb'"[^"]*"')


def _reject_constant(name: str) -> Any:
    raise InvalidInput(f"{name} is not valid JSON")


_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)


def nesting_refusal(body: bytes, limit: int) -> str | None:
    """Why the JSON text ``body`` may not be parsed: it nests arrays and objects deeper
    than ``limit``, or its quotes and brackets do not pair up; None when neither.

    No recursion whatever the depth, and C speed (``bytes`` methods): the body
    is cut down to its brackets outside strings, then innermost pairs are
    removed one level per pass. Text that passes may still be invalid JSON
    (the parser says why, within ``limit`` levels of recursion).
    """
    if body.count(b"[") + body.count(b"{") <= limit:  # the common case: one look
        return None
    if b"\\" in body:
        # Escaped backslashes first (left to right, a run of them pairs up as
        # JSON reads it), then escaped quotes; other escapes keep no mark.
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = body.translate(None, _NOT_MARKS)
    # Drop strings: quotes alternate open/close, so removing adjacent quotes (an
    # empty string, or the end of one string and the start of the next, with
    # only ``:`` or ``,`` between) keeps that; strings holding brackets are left.
    marks = marks.replace(b'""', b"")
    if b'"' in marks:
        marks = _STRING.sub(b"", marks)
    # One level per pass: innermost pairs become a placeholder, so a pair that
    # only their removal makes adjacent (``{[]}``) waits for the next pass.
    for _ in range(limit):
        if not marks:
            return None
        fewer = marks.replace(b"[]", b"L").replace(b"{}", b"L")
        if fewer == marks:
            return "is not valid JSON: its quotes or brackets do not pair up"
        marks = fewer.replace(b"L", b"")
    if not marks:
        return None
    return f"nests arrays and objects more than {limit} levels deep"


def loads(body: bytes, what: str = "body") -> Any:
    """Parse a JSON request body (strict: no NaN/Infinity, nesting at most MAX_BODY_DEPTH)."""
    refusal = nesting_refusal(body, MAX_BODY_DEPTH)
    if refusal is not None:
        raise InvalidInput(
            f"{what} {refusal} (a record value may nest at most {MAX_VALUE_DEPTH} levels)"
        )
    try:
        # json.loads(body, parse_constant=...) builds a decoder per call (~15 us
        # on the produce path); this is its bytes handling with one decoder.
        return _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
    except InvalidInput as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None


def _utf8(text: str, where: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{where}: not encodable as UTF-8 (lone surrogate?)") from None


def _b64(text: object, where: str) -> bytes:
    if not isinstance(text, str):
        raise InvalidInput(f"{where}: must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{where}: not valid base64") from None


def _compact_json(value: object, where: str) -> bytes:
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError, TypeError) as exc:
        raise InvalidInput(f"{where}: cannot be encoded as JSON: {exc}") from None
    return _utf8(text, where)


def _int(value: object, where: str, *, lo: int = _I64_MIN, hi: int = _I64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{where}: must be an integer, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise InvalidInput(f"{where}: {value} is out of range {lo}..{hi}")
    return value


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{where}: must be a JSON object")
    return value


def _headers(
    doc: dict[str, Any], i: int, field: str, decode: bool, out: list[tuple[str, bytes | None]]
) -> None:
    where = f"records[{i}].{field}"
    for name, value in _object(doc[field], where).items():
        if value is None:  # a null header value (Kafka has them)
            out.append((name, None))
        elif decode:
            out.append((name, _b64(value, f"{where}.{name}")))
        elif isinstance(value, str):
            out.append((name, _utf8(value, f"{where}.{name}")))
        else:
            raise InvalidInput(f"{where}.{name}: header values must be strings or null")


def _record(doc: object, i: int) -> ProduceRecord:
    if type(doc) is dict and len(doc) == 1:  # the common case: {"value": "..."}
        v = doc.get("value")
        if type(v) is str:
            return ProduceRecord(_utf8(v, f"records[{i}].value"))
    r = _object(doc, f"records[{i}]")
    unknown = r.keys() - _RECORD_FIELDS
    if unknown:
        raise InvalidInput(
            f"records[{i}]: unknown fields {sorted(unknown)}; known: {sorted(_RECORD_FIELDS)}"
        )
    value: bytes | None
    if "value_b64" in r:
        if "value" in r:
            raise InvalidInput(f"records[{i}]: give value or value_b64, not both")
        vb = r["value_b64"]
        value = None if vb is None else _b64(vb, f"records[{i}].value_b64")
    elif "value" in r:
        v = r["value"]
        where = f"records[{i}].value"
        if v is None:  # a null value (a Kafka tombstone), not the text "null"
            value = None
        else:
            value = _utf8(v, where) if isinstance(v, str) else _compact_json(v, where)
    else:
        raise InvalidInput(f"records[{i}]: value or value_b64 is required")
    key: bytes | None = None
    if "key_b64" in r:
        if r.get("key") is not None:
            raise InvalidInput(f"records[{i}]: give key or key_b64, not both")
        key = _b64(r["key_b64"], f"records[{i}].key_b64")
    elif r.get("key") is not None:
        k = r["key"]
        if not isinstance(k, str):
            raise InvalidInput(f"records[{i}].key: must be a string or null")
        key = _utf8(k, f"records[{i}].key")
    headers: list[tuple[str, bytes | None]] = []
    if r.get("headers") is not None:
        _headers(r, i, "headers", False, headers)
    if r.get("headers_b64") is not None:
        _headers(r, i, "headers_b64", True, headers)
    timestamp = None
    if r.get("timestamp") is not None:
        timestamp = _int(r["timestamp"], f"records[{i}].timestamp")
    partition = None
    if r.get("partition") is not None:
        partition = _int(r["partition"], f"records[{i}].partition", lo=0, hi=2**31 - 1)
    return ProduceRecord(value, key, tuple(headers), timestamp, partition)


def produce_records(body: bytes) -> list[ProduceRecord]:
    """The records of a JSON produce body ``{"records": [...]}``."""
    doc = _object(loads(body), "body")
    if doc.keys() != {"records"}:
        raise InvalidInput('body must be {"records": [...]} and nothing else')
    records = doc["records"]
    if not isinstance(records, list) or not records:
        raise InvalidInput("records: must be a non-empty array")
    return [_record(r, i) for i, r in enumerate(records)]


def offset_rows(body: bytes) -> list[tuple[str, int, int, str]]:
    """(topic, partition, next offset, metadata) rows of a commit body ``{"offsets": [...]}``."""
    doc = _object(loads(body), "body")
    if doc.keys() != {"offsets"}:
        raise InvalidInput('body must be {"offsets": [...]} and nothing else')
    rows = doc["offsets"]
    if not isinstance(rows, list) or not rows:
        raise InvalidInput("offsets: must be a non-empty array")
    out = []
    for i, row in enumerate(rows):
        r = _object(row, f"offsets[{i}]")
        unknown = r.keys() - _OFFSET_FIELDS
        if unknown:
            raise InvalidInput(f"offsets[{i}]: unknown fields {sorted(unknown)}")
        topic = r.get("topic")
        if not isinstance(topic, str):
            raise InvalidInput(f"offsets[{i}].topic: must be a string")
        metadata = r.get("metadata", "")
        if metadata is None:
            metadata = ""
        if not isinstance(metadata, str):
            raise InvalidInput(f"offsets[{i}].metadata: must be a string")
        out.append(
            (
                topic,
                _int(r.get("partition"), f"offsets[{i}].partition", lo=0, hi=2**31 - 1),
                _int(r.get("offset"), f"offsets[{i}].offset", lo=0),
                metadata,
            )
        )
    return out


def _text_or_b64(data: bytes | None) -> tuple[str | None, str | None]:
    if data is None:
        return None, None
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, base64.b64encode(data).decode("ascii")


def record_json(r: Record) -> dict[str, Any]:
    """A fetched record as JSON: text as ``value``/``key``, other bytes as ``*_b64``.

    A null value has both ``value`` and ``value_b64`` null (an empty value is
    ``""``); a null header value is null under ``headers``.
    """
    key, key_b64 = _text_or_b64(r.key)
    value, value_b64 = _text_or_b64(r.value)
    out: dict[str, Any] = {
        "offset": r.offset,
        "timestamp": r.timestamp,
        "key": key,
        "key_b64": key_b64,
        "value": value,
        "value_b64": value_b64,
        "headers": {},
    }
    if r.headers:
        headers: dict[str, str | None] = {}
        binary: dict[str, str] = {}
        for name, raw in r.headers:
            text, b64 = _text_or_b64(raw)
            if raw is None or text is not None:
                headers[name] = text
            else:
                binary[name] = b64 or ""
        out["headers"] = headers
        if binary:
            out["headers_b64"] = binary
    return out


# ----------------------------------------------------------- query parameters


def int_param(
    params: Mapping[str, str],
    name: str,
    default: int | None = None,
    *,
    lo: int = 0,
    hi: int = _I64_MAX,
) -> int:
    """An integer query parameter in ``lo..hi`` (``default`` None: required)."""
    text = params.get(name)
    if text is None or text == "":
        if default is None:
            raise InvalidInput(f"query parameter {name} is required")
        return default
    if _INT.fullmatch(text) is None:
        raise InvalidInput(f"query parameter {name}={text!r} is not an integer")
    value = int(text)
    if not lo <= value <= hi:
        raise InvalidInput(f"query parameter {name}={value} is out of range {lo}..{hi}")
    return value


def path_int(text: str, name: str, *, hi: int = 2**31 - 1) -> int:
    """An integer path segment (a partition): 400, not 404, when it is not one."""
    if _INT.fullmatch(text) is None or text[0] in "+-":
        raise InvalidInput(f"{name} {text!r} is not a non-negative integer")
    value = int(text)
    if value > hi:
        raise InvalidInput(f"{name} {value} is out of range 0..{hi}")
    return value


_PRODUCER_HEADERS: Final = (
    (wire.PRODUCER_ID_HEADER.lower(), "producer id", MAX_PRODUCER_ID),
    (wire.PRODUCER_EPOCH_HEADER.lower(), "producer epoch", MAX_EPOCH),
    (wire.PRODUCER_SEQUENCE_HEADER.lower(), "producer sequence", SEQUENCE_MODULUS - 1),
)


def producer_param(headers: Mapping[str, str]) -> ProducerSeq | None:
    """The ``EdgeGW-Producer-*`` headers of an idempotent produce (all three), or None."""
    values = [headers.get(name) for name, _, _ in _PRODUCER_HEADERS]
    if values[0] is None and values[1] is None and values[2] is None:
        return None
    out = []
    for (name, what, hi), text in zip(_PRODUCER_HEADERS, values, strict=True):
        if text is None:
            raise InvalidInput(
                f"an idempotent produce needs {wire.PRODUCER_ID_HEADER}, "
                f"{wire.PRODUCER_EPOCH_HEADER} and {wire.PRODUCER_SEQUENCE_HEADER}: "
                f"{name} is missing"
            )
        text = text.strip()
        # ASCII digits only (str.isdigit alone takes "²" and other scripts' digits)
        if not (text.isascii() and text.isdigit() and len(text) <= 19) or (value := int(text)) > hi:
            raise InvalidInput(f"{name}: {text!r} is not a {what} (an integer 0..{hi})")
        out.append(value)
    return ProducerSeq(out[0], out[1], out[2])


def producer_request(body: bytes) -> tuple[int | None, int | None]:
    """``POST /v1/producers``: an empty body (a new id) or ``{"producer_id": N, "epoch": E}``."""
    if not body.strip():
        return None, None
    doc = _object(loads(body), "body")
    unknown = doc.keys() - {"producer_id", "epoch"}
    if unknown:
        raise InvalidInput(f"body: unknown fields {sorted(unknown)}; known: epoch, producer_id")
    pid = doc.get("producer_id")
    epoch = doc.get("epoch")
    if pid is None:
        if epoch is not None:
            raise InvalidInput("body: epoch without producer_id")
        return None, None
    return (
        _int(pid, "producer_id", lo=0, hi=MAX_PRODUCER_ID),
        None if epoch is None else _int(epoch, "epoch", lo=0, hi=MAX_EPOCH),
    )


def ack_param(params: Mapping[str, str]) -> Ack:
    ack = params.get("ack") or "local"
    if ack == "local":
        return "local"
    if ack == "shipped":
        return "shipped"
    raise InvalidInput(f"query parameter ack={ack!r} must be 'local' or 'shipped'")
