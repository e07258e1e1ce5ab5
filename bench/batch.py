"""Record batch codec: batches without nulls as fast as before nulls existed, and what nulls cost.

Usage::

    .venv/bin/python bench/batch.py [--quick]

The baseline is the batch module from before null values (issue 23; the
commit ``BEFORE_NULLS``, read with ``git show`` from this repository),
loaded beside the current one and measured in the same run, interleaved.
Batches of 1,000 reference telemetry records (keys, ~180-byte values), with
and without headers: encode, decode (CRC checked) with the values split out,
and one-record encodes. Then the same batch with every tenth value null
(NULLS flag), against the current code's batch without nulls. The last
line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from _common import Row, emit_json, render_table, telemetry, timed_rounds

from edge_gateway.format import batch as current

_PASSES = 6

#: The last commit whose batch format had no NULLS flag.
BEFORE_NULLS = "4926e61fd99b2fd32ddcd380c911c4eaed7c191f"


def before_nulls() -> ModuleType:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        ["git", "-C", str(root), "show", f"{BEFORE_NULLS}:edge_gateway/format/batch.py"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0:
        sys.exit(f"bench/batch.py needs the git history for its baseline: {done.stderr!r}")
    path = Path(tempfile.mkdtemp(prefix="edgegw-bench-")) / "batch_before_nulls.py"
    path.write_bytes(done.stdout)
    spec = importlib.util.spec_from_file_location("batch_before_nulls", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    assert not hasattr(module, "FLAG_NULLS")
    return module


def seconds_per_call(fn: Callable[[], object], budget_s: float) -> float:
    """The fastest of timed rounds of repeated calls, within about ``budget_s`` (the
    machine is shared: the fastest round is the one least disturbed)."""
    return min(timed_rounds(fn, budget_s))


def interleaved(fns: dict[str, Callable[[], object]], budget_s: float) -> dict[str, float]:
    """Seconds per call of each, measured in turn in six passes (the best of them)."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(_PASSES):
        for k, fn in fns.items():
            out[k].append(seconds_per_call(fn, budget_s / (_PASSES * len(fns))))
    return {k: min(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="about 8 s instead of 30 s")
    args = ap.parse_args()
    budget = 1.0 if args.quick else 4.0
    old = before_nulls()
    records = telemetry(1000)
    values = [r.value for r in records]
    keys: list[bytes | None] = [r.key for r in records]
    ts = [r.timestamp for r in records]
    headers = [(("source", b"plc-2"), ("trace", b"%d" % i)) for i in range(len(records))]
    n = len(records)
    figures: dict[str, object] = {"records": n}
    rows: list[Row | str] = []

    for label, hs in (("keys", None), ("keys+headers", headers)):
        raw = current.encode_batch(values, keys=keys, timestamps=ts, headers=hs)
        assert raw == old.encode_batch(values, keys=keys, timestamps=ts, headers=hs)
        got = interleaved(
            {
                "encode": lambda hs=hs: current.encode_batch(
                    values, keys=keys, timestamps=ts, headers=hs
                ),
                "encode_base": lambda hs=hs: old.encode_batch(
                    values, keys=keys, timestamps=ts, headers=hs
                ),
                "decode": lambda raw=raw: current.decode_batch(raw).records(),
                "decode_base": lambda raw=raw: old.decode_batch(raw).records(),
            },
            budget / 3,
        )
        rows.append(f"batch of {n} records, {label}, no null ({len(raw):,} bytes)")
        for op in ("encode", "decode"):
            now, base = n / got[op], n / got[f"{op}_base"]
            rows.append(Row(op, now, "rec/s", "before nulls", base))
            figures[f"{label}_{op}_rec_per_s"] = now
            figures[f"{label}_{op}_base_rec_per_s"] = base
            figures[f"{label}_{op}_ratio"] = now / base

    one = values[0]
    got = interleaved(
        {
            "one": lambda: current.encode_record(one, timestamp=1, key=b"k"),
            "one_base": lambda: old.encode_record(one, timestamp=1, key=b"k"),
        },
        budget / 6,
    )
    rows.append("one-record batch (encode_record)")
    rows.append(Row("encode", 1 / got["one"], "rec/s", "before nulls", 1 / got["one_base"]))
    figures["one_record_ratio"] = got["one_base"] / got["one"]

    nulls = [None if i % 10 == 0 else v for i, v in enumerate(values)]
    raw_nulls = current.encode_batch(nulls, keys=keys, timestamps=ts)
    raw_plain = current.encode_batch(values, keys=keys, timestamps=ts)
    got = interleaved(
        {
            "encode": lambda: current.encode_batch(nulls, keys=keys, timestamps=ts),
            "encode_base": lambda: current.encode_batch(values, keys=keys, timestamps=ts),
            "decode": lambda: current.decode_batch(raw_nulls).records(),
            "decode_base": lambda: current.decode_batch(raw_plain).records(),
        },
        budget / 3,
    )
    rows.append(f"batch of {n} records, every tenth value null (NULLS)")
    for op in ("encode", "decode"):
        now, base = n / got[op], n / got[f"{op}_base"]
        rows.append(Row(op, now, "rec/s", "same batch, no null", base))
        figures[f"nulls_{op}_rec_per_s"] = now
        figures[f"nulls_{op}_ratio"] = now / base
    print(render_table("Record batch codec: before and after NULLS (same run)", rows))
    emit_json(figures)


if __name__ == "__main__":
    main()
