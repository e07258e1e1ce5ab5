"""The pipeline's bulk JSON decoder (``edge_gateway.pipeline._json``), without Spark.

The decoder parses many values in one call of Arrow's JSON reader, so what
must hold is that batching changes nothing: every value gets the outcome it
would get alone, and that outcome follows the documented type rules. A
reference model written in plain Python (``json`` plus the type rules) is
the oracle; Hypothesis feeds valid, ill-typed, whitespace-laden,
newline-laden and hostile values, in batches.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import math
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_gateway.errors import InvalidInput
from edge_gateway.pipeline._json import NOT_AN_OBJECT, JsonDecoder


def _field(name: str, kind: Any) -> dict[str, Any]:
    return {"name": name, "type": kind, "nullable": True, "metadata": {}}


def struct(*fields: tuple[str, Any]) -> dict[str, Any]:
    return {"type": "struct", "fields": [_field(n, k) for n, k in fields]}


SCHEMA = struct(
    ("s", "string"),
    ("i", "long"),
    ("n", "integer"),
    ("d", "double"),
    ("b", "boolean"),
    ("l", {"type": "array", "elementType": "long", "containsNull": True}),
    ("st", struct(("a", "integer"), ("z", "string"))),
)
DECODER = JsonDecoder(SCHEMA)
MISMATCH = DECODER.mismatch
I64 = (-(2**63), 2**63 - 1)
I32 = (-(2**31), 2**31 - 1)


# --------------------------------------------------------------------------
# the reference model


def _is_int(v: Any, bounds: tuple[int, int]) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and bounds[0] <= v <= bounds[1]


def _check(kind: Any, v: Any) -> bool:
    if v is None:
        return True
    if kind == "string":
        return True  # anything else becomes its JSON text
    if kind == "long":
        return _is_int(v, I64)
    if kind == "integer":
        return _is_int(v, I32)
    if kind == "double":
        return isinstance(v, int | float) and not isinstance(v, bool)
    if kind == "boolean":
        return isinstance(v, bool)
    if kind["type"] == "array":
        return isinstance(v, list) and all(_check(kind["elementType"], x) for x in v)
    assert kind["type"] == "struct"
    return isinstance(v, dict) and all(_check(f["type"], v.get(f["name"])) for f in kind["fields"])


def _normal(kind: Any, v: Any) -> Any:
    if v is None:
        return None
    if kind == "double":
        return repr(float(v))  # NaN compares equal as text
    if kind == "string" and not isinstance(v, str):
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    if isinstance(kind, dict) and kind["type"] == "array":
        return [_normal(kind["elementType"], x) for x in v]
    if isinstance(kind, dict) and kind["type"] == "struct":
        return {f["name"]: _normal(f["type"], v.get(f["name"])) for f in kind["fields"]}
    return v


def reference(value: bytes | None) -> dict[str, Any] | str:
    """The row a value must give, or the reason it must be rejected."""
    if value is None:
        return NOT_AN_OBJECT
    try:
        doc = json.loads(value.decode("utf-8"))
        json.dumps(doc, ensure_ascii=False).encode()  # lone surrogates are not text
    except (ValueError, RecursionError):
        return NOT_AN_OBJECT
    if not isinstance(doc, dict):
        return NOT_AN_OBJECT
    if not _check(SCHEMA, doc):
        return MISMATCH
    return _normal(SCHEMA, doc)  # type: ignore[no-any-return]


def decode_rows(values: list[bytes | None]) -> list[dict[str, Any] | str]:
    out = DECODER.decode(pa.array(values, pa.binary()))
    assert sorted([*out.accepted.tolist(), *out.rejected.tolist()]) == list(range(len(values)))
    assert out.table.num_rows == len(out.accepted)
    result: list[dict[str, Any] | str] = [""] * len(values)
    for i, row in zip(out.accepted.tolist(), out.table.to_pylist(), strict=True):
        result[i] = _normal(SCHEMA, row)
    for i, reason in zip(out.rejected.tolist(), out.reasons, strict=True):
        result[i] = reason
    return result


# --------------------------------------------------------------------------
# examples


GOOD = b'{"s":"x","i":1,"n":2,"d":1.5,"b":true,"l":[1,null],"st":{"a":3,"z":"q","extra":1}}'


@pytest.mark.parametrize(
    ("value", "outcome"),
    [
        (GOOD, "row"),
        (b"{}", "row"),
        (b'{"unknown": [1, {"x": 2}]}', "row"),
        (b'{"d": 5}', "row"),  # an integer is a number for a double
        (b'{"d": NaN}', "row"),
        (b' {"i": 1} ', "row"),  # whitespace around: decided alone, same answer
        (b'{"i":\n1}', "row"),  # a newline inside: decided alone
        (b'{"i": 1, "i": 2}', "row"),  # duplicate key: the last one counts, as in Python
        (b'{"i": 1.5}', MISMATCH),
        (b'{"i": 1e2}', MISMATCH),
        (b'{"i": 9223372036854775808}', MISMATCH),
        (b'{"n": 2147483648}', MISMATCH),
        (b'{"s": 5}', "row"),  # anything else becomes its JSON text, as in Spark
        (b'{"s": {"a": [1, 2.5, null]}, "st": {"z": true}}', "row"),
        (b'{"b": 1}', MISMATCH),
        (b'{"st": {"a": "x"}}', MISMATCH),
        (b'{"l": [1, "a"]}', MISMATCH),
        (b"null", NOT_AN_OBJECT),
        (b"[1]", NOT_AN_OBJECT),
        (b'"text"', NOT_AN_OBJECT),
        (b"", NOT_AN_OBJECT),
        (b'{"i":1}{"i":2}', NOT_AN_OBJECT),
        (b'{"i":1} }', NOT_AN_OBJECT),
        (b'{"s":"}', NOT_AN_OBJECT),
        (b'{"s":"\xff"}', NOT_AN_OBJECT),  # not UTF-8
        (b'{"s":"\\ud800"}', NOT_AN_OBJECT),  # a lone surrogate is not text
        ('{"s":"x"}'.encode("utf-16"), NOT_AN_OBJECT),
        (None, NOT_AN_OBJECT),
    ],
)
def test_examples(value: bytes | None, outcome: str) -> None:
    expected = reference(value)
    assert (outcome == "row") == isinstance(expected, dict)
    if outcome != "row":
        assert expected == outcome
    # alone, first, last and in the middle of good values
    assert decode_rows([value]) == [expected]
    batch = [GOOD, value, GOOD, b'{"i": 7}']
    assert decode_rows(batch) == [reference(v) for v in batch]


def test_values_that_would_merge_are_each_rejected() -> None:
    # joined by newlines, '{"s":"}' and '{"}' would read as one object {"s": "}\n{"}
    # if a newline were allowed in a string; with '{}{}' the count would match again
    batch = [b'{"s":"}', b'{"}', b"{}{}", GOOD]
    assert decode_rows(batch) == [NOT_AN_OBJECT, NOT_AN_OBJECT, NOT_AN_OBJECT, reference(GOOD)]


def test_a_null_first_does_not_crash_the_reader() -> None:
    # pyarrow 26's JSON reader crashes the process on a top-level null first
    assert decode_rows([b"null", b"null\n{}", GOOD]) == [
        NOT_AN_OBJECT,
        NOT_AN_OBJECT,
        reference(GOOD),
    ]


def test_timestamps_dates_decimals() -> None:
    decoder = JsonDecoder(struct(("t", "timestamp"), ("day", "date"), ("x", "decimal(10,2)")))
    out = decoder.decode(
        pa.array(
            [
                b'{"t": "2026-11-22T10:15:30.123Z", "day": "2026-11-22", "x": "12.34"}',
                b'{"t": "2026-11-22T10:15:30+01:00", "x": 1.5}',
                b'{"t": 1763800000}',
                b'{"day": "2026-13-01"}',
                b'{"x": 12.345}',
            ],
            pa.binary(),
        )
    )
    assert out.accepted.tolist() == [0, 1]
    assert out.rejected.tolist() == [2, 3, 4]
    assert out.table.schema.field("day").type == pa.date32()
    rows = out.table.to_pylist()
    utc = dt.UTC
    assert rows[0]["t"] == dt.datetime(2026, 11, 22, 10, 15, 30, 123000, tzinfo=utc)
    assert rows[0]["day"] == dt.date(2026, 11, 22)
    assert str(rows[0]["x"]) == "12.34"
    assert rows[1]["t"] == dt.datetime(2026, 11, 22, 9, 15, 30, tzinfo=utc)


@pytest.mark.parametrize(
    "kind",
    [
        {"type": "map", "keyType": "string", "valueType": "string", "valueContainsNull": True},
        "binary",
        {"type": "array", "elementType": "date", "containsNull": True},
    ],
)
def test_unsupported_types_are_refused_by_name(kind: Any) -> None:
    with pytest.raises(InvalidInput, match="JSON field 'm"):
        JsonDecoder(struct(("m", kind)))


def test_large_batches_parse_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    import edge_gateway.pipeline._json as mod

    monkeypatch.setattr(mod, "_MAX_CHUNK_BYTES", 200)
    batch = [b'{"i": %d, "s": "%s"}' % (i, b"x" * (i % 50)) for i in range(300)]
    batch[123] = b'{"i": "bad"}'
    assert decode_rows(batch) == [reference(v) for v in batch]


# --------------------------------------------------------------------------
# batches of generated values against the reference


_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=False),
    st.text(max_size=8),
)
_json = st.recursive(
    _scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
_typed = {
    "s": st.text(max_size=10) | _json,
    "i": st.integers(min_value=I64[0], max_value=I64[1]) | _json,
    "n": st.integers(min_value=I32[0], max_value=I32[1]) | _json,
    "d": st.floats(allow_infinity=False) | st.integers(-(2**53), 2**53) | _json,
    "b": st.booleans() | _json,
    "l": st.lists(st.integers(I64[0], I64[1]) | st.none(), max_size=4) | _json,
    "st": st.fixed_dictionaries(
        {}, optional={"a": st.integers(I32[0], I32[1]) | _json, "z": st.text(max_size=4)}
    )
    | _json,
}
_objects = st.fixed_dictionaries({}, optional={**_typed, "other": _json})


@st.composite
def _rendered(draw: st.DrawFn) -> bytes:
    doc = draw(_objects | _json)
    style = draw(st.sampled_from(["compact", "spaced", "indented", "ascii"]))
    if style == "compact":
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    elif style == "spaced":
        text = " " + json.dumps(doc, ensure_ascii=False) + " "
    elif style == "indented":
        text = json.dumps(doc, indent=1, ensure_ascii=False)
    else:
        text = json.dumps(doc)
    return text.encode("utf-8", "surrogatepass")


_hostile = st.one_of(
    st.binary(max_size=24),
    st.binary(max_size=12).map(lambda b: b"{" + b + b"}"),
    st.sampled_from([b"null", b"{}{}", b'{"s":"}', b'{"}', b"{", b"}", b'{"i":1}\n{"i":2}']),
)
_values = st.lists(st.one_of(_rendered(), _rendered(), _hostile, st.none()), max_size=30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values)
def test_batches_agree_with_the_reference(values: list[bytes | None]) -> None:
    assert decode_rows(values) == [reference(v) for v in values]


def test_reference_model_sanity() -> None:
    assert reference(b'{"d": NaN}') == {**_normal(SCHEMA, {}), "d": repr(math.nan)}


def test_decode_leaves_no_reference_cycles() -> None:
    """Memory is freed when the result is dropped, not at the next garbage collection.

    A recursive closure once made every decode a reference cycle holding its
    values and rows: a write task's memory grew with its size, not its chunk.
    """
    good = [json.dumps({"s": f"v{i}", "i": i}).encode() for i in range(500)]
    values = pa.array([*good[:200], b"[1]", b'{"i": "x"}', *good[200:]], pa.binary())
    gc.collect()
    gc.disable()
    try:
        before = pa.total_allocated_bytes()
        decoded = DECODER.decode(values)  # bad values: the failed chunk is split
        assert len(decoded.rejected) == 2
        del decoded
        assert pa.total_allocated_bytes() == before
        assert gc.collect() == 0
    finally:
        gc.enable()
