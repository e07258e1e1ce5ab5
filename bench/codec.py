"""JSON produce-body decoding: what the nesting check costs next to parsing the body.

Usage::

    .venv/bin/python bench/codec.py [--quick]

The API measures how deep a JSON body nests before it parses it
(``edge_gateway.api._codec.nesting_refusal``; docs/api.md, "Nesting limit").
Each figure is printed next to ``json.loads`` of the same body, measured in
the same run, interleaved: the check's cost as a fraction of the parse, and
the whole decode (check + parse + records) as a multiple of it. Bodies: one
record; 1,000 reference telemetry records as strings; the same as JSON
objects; and one value nested to the limit. The last line of output is one
JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from _common import Row, emit_json, median, render_table, telemetry, timed_rounds

from edge_gateway.api._codec import (
    MAX_BODY_DEPTH,
    MAX_VALUE_DEPTH,
    nesting_refusal,
    produce_records,
)


def bodies() -> dict[str, bytes]:
    records = telemetry(1000)
    as_text = [{"value": r.value.decode(), "key": r.key.decode()} for r in records]
    as_json = [{"value": json.loads(r.value), "key": r.key.decode()} for r in records]
    deep: object = 1
    for i in range(MAX_VALUE_DEPTH):
        deep = [deep] if i % 2 else {"k": deep}
    return {
        "one_record": json.dumps({"records": as_text[:1]}).encode(),
        "text_values_1000": json.dumps({"records": as_text}).encode(),
        "json_values_1000": json.dumps({"records": as_json}).encode(),
        "deepest_value": json.dumps({"records": [{"value": deep}] * 100}).encode(),
    }


def seconds_per_call(fn: Callable[[], object], budget_s: float) -> float:
    """The median of timed rounds of repeated calls, within about ``budget_s``."""
    return median(timed_rounds(fn, budget_s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="about 5 s instead of 20 s")
    args = ap.parse_args()
    budget = 0.4 if args.quick else 1.6
    figures: dict[str, object] = {"max_body_depth": MAX_BODY_DEPTH}
    rows: list[Row | str] = []
    for name, body in bodies().items():
        assert nesting_refusal(body, MAX_BODY_DEPTH) is None
        # interleaved, twice, so both see the same machine weather
        loads, check, decode = [], [], []
        for _ in range(2):
            loads.append(seconds_per_call(lambda b=body: json.loads(b), budget / 6))
            check.append(
                seconds_per_call(lambda b=body: nesting_refusal(b, MAX_BODY_DEPTH), budget / 6)
            )
            decode.append(seconds_per_call(lambda b=body: produce_records(b), budget / 6))
        base, chk, dec = min(loads), min(check), min(decode)
        mib = len(body) / (1 << 20)
        figures[name] = {
            "bytes": len(body),
            "loads_us": base * 1e6,
            "check_us": chk * 1e6,
            "decode_us": dec * 1e6,
            "check_vs_loads": chk / base,
            "decode_vs_loads": dec / base,
        }
        rows.append(f"{name} ({len(body):,} bytes)")
        rows.append(Row("nesting check", chk * 1e6, "us", "json.loads", base * 1e6))
        rows.append(Row("whole decode", dec * 1e6, "us", "json.loads", base * 1e6))
        rows.append(Row("whole decode", mib / dec, "MiB/s", "json.loads", mib / base))
    print(render_table("JSON produce bodies: nesting check and decode", rows))
    emit_json(figures)


if __name__ == "__main__":
    main()
