"""Fuzz the pipeline's bulk JSON decoder (``edge_gateway.pipeline._json``).

The input is split into record values at ``0xFE`` bytes. The properties:
``JsonDecoder.decode`` never raises and never crashes the process (pyarrow's
JSON reader crashes on some inputs: the guard must keep them away), every
value is either accepted or rejected, and every value gets the outcome it
gets when decoded alone (bulk parsing and splitting change nothing).

With atheris installed this is a libFuzzer target::

    python fuzz/fuzz_json_values.py -max_total_time=60

Without it, a plain mutation loop runs over a seed corpus of telemetry values::

    python fuzz/fuzz_json_values.py [iterations] [seed]
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pyarrow as pa

from edge_gateway.pipeline._json import JsonDecoder

sys.path.insert(0, str(Path(__file__).parent))
import _harness


def _field(name: str, kind: object) -> dict[str, object]:
    return {"name": name, "type": kind, "nullable": True, "metadata": {}}


DECODER = JsonDecoder(
    {
        "type": "struct",
        "fields": [
            _field("sensor_id", "string"),
            _field("ts", "timestamp"),
            _field("temperature", "double"),
            _field("seq", "long"),
            _field("ok", "boolean"),
            _field("tags", {"type": "array", "elementType": "string", "containsNull": True}),
            _field("pos", {"type": "struct", "fields": [_field("x", "integer")]}),
        ],
    }
)
SEP = b"\xfe"
SEEDS = [
    SEP.join(
        [
            b'{"sensor_id":"s-00042","ts":"2026-11-22T10:15:30.123Z","temperature":21.37,'
            b'"seq":123456,"ok":true,"tags":["a",null],"pos":{"x":3}}',
            b'{"sensor_id":"s-1","temperature":-0.5e3,"seq":-1,"other":{"deep":[1,{}]}}',
            b"{}",
            b'{"ts":"2026-11-22 10:15:30","temperature":NaN}',
            b'{"sensor_id":"\\u00e9\\ud83d\\ude00","pos":{"x":2147483647}}',
        ]
    ),
    SEP.join([b"null", b'{"seq":1}{"seq":2}', b'{"sensor_id":"}', b'{"}', b"{}{}"]),
]


def _rows(out: object, n: int) -> list[object]:
    result: list[object] = [None] * n
    for i, row in zip(out.accepted.tolist(), out.table.to_pylist(), strict=True):  # type: ignore[attr-defined]
        result[i] = repr(row)
    for i, reason in zip(out.rejected.tolist(), out.reasons, strict=True):  # type: ignore[attr-defined]
        result[i] = reason
    return result


def fuzz_one_input(data: bytes) -> None:
    values = data.split(SEP)
    out = DECODER.decode(pa.array(values, pa.binary()))
    assert sorted([*out.accepted.tolist(), *out.rejected.tolist()]) == list(range(len(values)))
    together = _rows(out, len(values))
    alone = [_rows(DECODER.decode(pa.array([v], pa.binary())), 1)[0] for v in values]
    assert together == alone, (values, together, alone)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    return _harness.mutate_text(
        rng,
        data,
        alphabet=b'0123456789-.,:[]{}"eE\\\n\xfe\x00\xff',
        tokens=[b"null", b"{", b"}", b'"', b"\n", b"\\u", b"\xfe{}", b"NaN", b"1e999", b"\xc3"],
        max_ops=6,
        splice=True,
    )


def _plain_loop(iterations: int, seed: int) -> None:
    _harness.plain_loop("fuzz_json_values", fuzz_one_input, SEEDS, _mutate, iterations, seed)


if __name__ == "__main__":
    _harness.main(fuzz_one_input, _plain_loop)
