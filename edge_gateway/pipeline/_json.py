"""JSON record values into typed Arrow columns, in bulk, with a reason for each record that fails.

The pipeline's tasks decode a whole task's values at once with Arrow's C++
JSON reader (no Python object per record), which runs about 4x faster than
Spark's ``from_json`` on this machine. The reader parses a stream of
documents, so the values are joined with newlines and the reader must return
exactly one row per value; what makes that safe:

* **The guard.** Only values that start with ``{`` and end with ``}`` and are
  valid UTF-8 go to the bulk parse (the reader neither checks UTF-8 nor
  survives a top-level ``null`` as the first document of its input: pyarrow
  26 crashes the process). Each such value is then at least one document,
  and two values can never merge into one: a value's final ``}`` is followed
  by a newline, which JSON forbids inside a string, and by the next value's
  ``{``, which cannot follow a ``}`` inside an unfinished object or array. So
  the reader returns one row per value exactly when every value is one
  object; any other count, or an error, means some value is bad.
* **Splitting.** A chunk that fails is cut in 16 pieces, recursively, until
  the bad values are isolated in pieces of at most 16 values, which are
  decided value by value; the good pieces keep their rows.
* **One value alone** (one that failed, or failed the guard) is decided by
  Python's ``json``: not JSON or not an object → ``not a JSON object``;
  otherwise it is re-serialised compactly and parsed alone by the reader
  with the schema → its row, or ``does not match the schema ...``.

So a value is accepted if and only if it is one JSON object whose fields
have the schema's JSON types (missing fields are null, unknown fields are
ignored), whether it was decoded in bulk or alone: ``decode`` returns the
same rows however the values are batched (tested, and fuzzed in
``fuzz/fuzz_json_values.py``).

Types (Spark DDL → Arrow → what the JSON must hold): ``string`` (any
value: a string as it is, anything else as its compact JSON text, like
Spark's ``from_json``; values that need this are decided alone, so they are
slow in bulk), ``tinyint``/``smallint``/
``int``/``bigint`` (an integer in range), ``float``/``double`` (any number,
``NaN``/``Infinity`` too), ``boolean``, ``decimal(p,s)``, ``timestamp`` (an
ISO 8601 string; UTC unless it names an offset), ``date`` (an ISO date
string, top level only), ``array<…>``, ``struct<…>``. ``map`` and ``binary``
are refused when the schema is given, with a message naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from edge_gateway.errors import InvalidInput
from edge_gateway.pipeline._arrow import from_numpy

NOT_AN_OBJECT: Final = "not a JSON object"
_OPEN, _CLOSE = ord("{"), ord("}")
#: chunks above this are parsed in pieces (bounded memory for the joined text)
_MAX_CHUNK_BYTES: Final = 64 * 1024 * 1024
#: a failed chunk is cut in this many pieces; one of at most _LEAF values is decided value by value
_FANOUT: Final = 16
#: the separator of joined values (an Arrow scalar made without ``pa.scalar``: see ``from_numpy``)
_NEWLINE: Final = pa.Array.from_buffers(
    pa.binary(), 1, [None, pa.py_buffer(np.array([0, 1], np.int32)), pa.py_buffer(b"\n")]
)[0]
_LEAF: Final = 16

_SIMPLE: Final[dict[str, pa.DataType]] = {
    "string": pa.string(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}


def _arrow_type(spark_type: Any, path: str, *, top: bool) -> tuple[pa.DataType, pa.DataType]:
    """(the type the reader parses, the column's final type) of a Spark type in JSON form."""
    if isinstance(spark_type, str):
        if spark_type in _SIMPLE:
            t = _SIMPLE[spark_type]
            return t, t
        if spark_type == "date" and top:
            # the reader has no date parser: parse as a timestamp, cast afterwards
            return pa.timestamp("us", tz="UTC"), pa.date32()
        if spark_type.startswith("decimal(") and spark_type.endswith(")"):
            precision, scale = (int(x) for x in spark_type[8:-1].split(","))
            t = pa.decimal128(precision, scale)
            return t, t
    elif isinstance(spark_type, dict):
        kind = spark_type.get("type")
        if kind == "array":
            inner, _ = _arrow_type(spark_type["elementType"], f"{path}[]", top=False)
            return pa.list_(inner), pa.list_(inner)
        if kind == "struct":
            fields = [
                pa.field(f["name"], _arrow_type(f["type"], f"{path}.{f['name']}", top=False)[0])
                for f in spark_type["fields"]
            ]
            return pa.struct(fields), pa.struct(fields)
    shown = spark_type if isinstance(spark_type, str) else spark_type.get("type")
    where = "" if top else " (inside a struct or array)"
    raise InvalidInput(
        f"JSON field {path!r}: type {shown!r}{where} is not supported by the pipeline's JSON "
        "decoder; use string, integer types, float, double, boolean, decimal, timestamp, "
        "date (top level), array or struct"
    )


@dataclass(frozen=True, slots=True)
class Decoded:
    """The outcome of :meth:`JsonDecoder.decode` for ``n`` values."""

    #: one row per accepted value, in input order, columns as :attr:`JsonDecoder.schema`
    table: pa.Table
    #: indices of the accepted values (ascending), aligned with ``table``
    accepted: np.ndarray[Any, np.dtype[np.int64]]
    #: indices of the rejected values (ascending) and why each was rejected
    rejected: np.ndarray[Any, np.dtype[np.int64]]
    reasons: list[str]


class JsonDecoder:
    """Decodes JSON object values with a fixed schema (a Spark ``StructType`` in JSON form)."""

    def __init__(self, spark_schema: dict[str, Any], *, simple_string: str = "") -> None:
        if spark_schema.get("type") != "struct":
            raise InvalidInput("a JSON schema must be a struct")
        parse_fields, final_fields = [], []
        for f in spark_schema["fields"]:
            parse_t, final_t = _arrow_type(f["type"], f["name"], top=True)
            parse_fields.append(pa.field(f["name"], parse_t))
            final_fields.append(pa.field(f["name"], final_t))
        self._spark_schema = spark_schema
        self.parse_schema = pa.schema(parse_fields)
        #: the decoded columns
        self.schema = pa.schema(final_fields)
        self._casts = [i for i, f in enumerate(final_fields) if f.type != parse_fields[i].type]
        self._options = pj.ParseOptions(
            explicit_schema=self.parse_schema, unexpected_field_behavior="ignore"
        )
        self.mismatch = f"does not match the schema {simple_string or self._describe()}"

    def _describe(self) -> str:
        return "struct<" + ",".join(f"{f.name}:{f.type}" for f in self.schema) + ">"

    # ------------------------------------------------------------------

    def _parse(self, text: pa.Buffer | bytes, longest: int) -> pa.Table:
        # blocks of 4 MiB, no bigger than the text (a small parse must not
        # allocate a big block), and never smaller than the longest value
        block = max(min(1 << 22, len(text) + 2), longest + 2)
        return pj.read_json(
            pa.BufferReader(text),
            read_options=pj.ReadOptions(use_threads=False, block_size=block),
            parse_options=self._options,
        )

    def _parse_chunk(self, values: pa.BinaryArray, longest: int) -> pa.Table | None:
        """The rows of ``values`` (each guarded) if each is exactly one good object, else None."""
        lists = pa.ListArray.from_arrays(from_numpy(np.array([0, len(values)], np.int32)), values)
        text = pc.binary_join(lists, _NEWLINE)[0].as_buffer()
        try:
            table = self._parse(text, longest)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        return table if table.num_rows == len(values) else None

    def _decode_one(self, value: bytes) -> pa.Table | str:
        """One value alone: its row, or the reason it is rejected."""
        try:
            # decode first: json.loads(bytes) would also take UTF-16 and UTF-32
            doc = json.loads(value.decode("utf-8"))
        except (ValueError, RecursionError):
            return NOT_AN_OBJECT
        if not isinstance(doc, dict):
            return NOT_AN_OBJECT
        doc = _texts(self._spark_schema, doc)
        try:
            canonical = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
        except (UnicodeEncodeError, ValueError, RecursionError):
            return NOT_AN_OBJECT  # e.g. an escaped lone surrogate: not valid Unicode text
        try:
            table = self._parse(canonical, len(canonical))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return self.mismatch
        return table if table.num_rows == 1 else self.mismatch

    def decode(self, values: pa.Array) -> Decoded:
        """Decode ``values`` (binary, no nulls expected; a null is rejected as not an object)."""
        values = values.cast(pa.binary()) if values.type != pa.binary() else values
        n = len(values)
        offsets = _offsets(values)
        lengths = np.diff(offsets)
        guarded = _guard(values, offsets)
        parts: list[tuple[np.ndarray[Any, np.dtype[np.int64]], pa.Table]] = []
        alone: list[int] = list(np.flatnonzero(~guarded))

        # a work list, not a recursive closure: a nested function that calls itself is a
        # reference cycle, which kept every chunk's values and rows alive until the
        # garbage collector ran (memory grew with the task, not the chunk)
        pending = _chunks(np.flatnonzero(guarded).astype(np.int64), lengths, _MAX_CHUNK_BYTES)
        while pending:
            idx = pending.pop()
            first, count = int(idx[0]), len(idx)
            if int(idx[-1]) - first + 1 == count:  # contiguous: no copy
                chunk = values.slice(first, count)
            else:
                chunk = values.take(from_numpy(idx))
            table = self._parse_chunk(chunk, int(lengths[idx].max()))
            if table is not None:
                parts.append((idx, table))
            elif len(idx) <= _LEAF:
                alone.extend(int(i) for i in idx)
            else:
                # many bad values cost log_16 levels of parses, not log_2
                pending.extend(np.array_split(idx, _FANOUT))
        rejected: list[int] = []
        reasons: list[str] = []
        for i in sorted(alone):
            value = values[i].as_py()
            outcome = NOT_AN_OBJECT if value is None else self._decode_one(value)
            if isinstance(outcome, str):
                rejected.append(i)
                reasons.append(outcome)
            else:
                parts.append((np.array([i], dtype=np.int64), outcome))
        return self._assemble(parts, n, rejected, reasons)

    def _assemble(
        self,
        parts: list[tuple[np.ndarray[Any, np.dtype[np.int64]], pa.Table]],
        n: int,
        rejected: list[int],
        reasons: list[str],
    ) -> Decoded:
        if parts:
            parts.sort(key=lambda p: int(p[0][0]))
            accepted = np.concatenate([p[0] for p in parts])
            table = pa.concat_tables([p[1] for p in parts])
            order = np.argsort(accepted, kind="stable")
            if not np.all(order[:-1] < order[1:]):
                table, accepted = table.take(from_numpy(order)), accepted[order]
        else:
            accepted = np.zeros(0, dtype=np.int64)
            table = self.parse_schema.empty_table()
        for i in self._casts:
            column = table.column(i).cast(self.schema.field(i).type)
            table = table.set_column(i, self.schema.field(i), column)
        assert len(accepted) + len(rejected) == n
        return Decoded(table, accepted, np.array(rejected, dtype=np.int64), reasons)


def _text(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _texts(kind: Any, value: Any) -> Any:
    """``value`` with the non-string values of ``string`` fields as their JSON text.

    Spark's ``from_json`` keeps any value of a string field as text (which is
    what a schema inferred from values of mixed types asks for); the reader
    refuses them, so values that hold such fields are decided alone, here.
    Containers are changed in place.
    """
    if kind == "string":
        return _text(value)
    if isinstance(kind, dict):
        if kind.get("type") == "struct" and isinstance(value, dict):
            for f in kind["fields"]:
                if f["name"] in value:
                    value[f["name"]] = _texts(f["type"], value[f["name"]])
        elif kind.get("type") == "array" and isinstance(value, list):
            value[:] = [_texts(kind["elementType"], item) for item in value]
    return value


def _offsets(values: pa.BinaryArray) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The Arrow offsets of a binary array (``n + 1`` of them)."""
    n = len(values)
    return np.frombuffer(values.buffers()[1], np.int32, n + 1, values.offset * 4).astype(np.int64)


def _guard(
    values: pa.BinaryArray, offsets: np.ndarray[Any, np.dtype[np.int64]]
) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Which values may go to the bulk parse: ``{…}``, valid UTF-8, not null."""
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=bool)
    data_buf = values.buffers()[2]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    ok = ends > starts
    first = np.zeros(n, dtype=np.uint8)
    last = np.zeros(n, dtype=np.uint8)
    first[ok] = data[starts[ok]]
    last[ok] = data[ends[ok] - 1]
    ok &= (first == _OPEN) & (last == _CLOSE)
    if values.null_count:
        ok &= np.asarray(values.is_valid())
    try:
        values.cast(pa.string())  # validates UTF-8 of every value at C speed
    except pa.ArrowInvalid:
        ok &= np.array([_utf8(v) for v in values.to_pylist()], dtype=bool)
    return ok


def _utf8(value: bytes | None) -> bool:
    if value is None:
        return False
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _chunks(
    idx: np.ndarray[Any, np.dtype[np.int64]],
    lengths: np.ndarray[Any, np.dtype[np.int64]],
    limit: int,
) -> list[np.ndarray[Any, np.dtype[np.int64]]]:
    if len(idx) == 0:
        return []
    sizes = np.cumsum(lengths[idx] + 1)
    cuts = np.searchsorted(sizes, np.arange(limit, int(sizes[-1]), limit))
    return [c for c in np.split(idx, cuts) if len(c)]


def decoder_for(schema_json: str, simple_string: str = "") -> JsonDecoder:
    """A decoder for a schema stored as Spark's ``StructType.json()``."""
    return JsonDecoder(json.loads(schema_json), simple_string=simple_string)
