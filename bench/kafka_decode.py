"""Kafka record-batch decoding (the Produce hot path): the current decoder against a baseline.

Usage::

    .venv/bin/python bench/kafka_decode.py [--quick] [--base REV]

The baseline is ``edge_gateway/format/kafka_batch.py`` as it stood at
``BASE`` (issue 43: before the varint decode was folded into one helper),
read with ``git show`` from this repository, loaded beside the current
module and measured in the same run, interleaved. Batches of reference
telemetry records (keys, ~150-200-byte values), uncompressed: 1,000 records
without headers, 1,000 records with two headers each, and 10 records (the
per-batch cost). The last line of output is one JSON object with every figure.
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

from edge_gateway.format import kafka_batch as current

#: main before issue 43's fold of the varint decode.
BASE = "b3906b5ad52d37bb35393f3448527fd3f003f874"
_PASSES = 6


def baseline(rev: str) -> ModuleType:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        ["git", "-C", str(root), "show", f"{rev}:edge_gateway/format/kafka_batch.py"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0:
        sys.exit(f"bench/kafka_decode.py needs the git history for its baseline: {done.stderr!r}")
    path = Path(tempfile.mkdtemp(prefix="edgegw-bench-")) / "kafka_batch_base.py"
    path.write_bytes(done.stdout)
    spec = importlib.util.spec_from_file_location("kafka_batch_base", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def interleaved(fns: dict[str, Callable[[], object]], budget_s: float) -> dict[str, float]:
    """Seconds per call of each, measured in turn in six passes (the fastest round of all:
    the machine is shared, and the fastest round is the one least disturbed)."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(_PASSES):
        for k, fn in fns.items():
            out[k].append(min(timed_rounds(fn, budget_s / (_PASSES * len(fns)))))
    return {k: min(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="about 6 s instead of 24 s")
    ap.add_argument("--base", default=BASE, help=f"the baseline's git revision ({BASE[:10]})")
    args = ap.parse_args()
    budget = 2.0 if args.quick else 8.0
    old = baseline(args.base)
    records = telemetry(1000)
    headers = (("source", b"plc-2"), ("trace", b"0123456789abcdef"))
    figures: dict[str, object] = {"base": args.base}
    rows: list[Row | str] = []
    cases = (
        ("1000 records", [(r.timestamp, r.key, r.value, ()) for r in records]),
        ("1000 records+2 headers", [(r.timestamp, r.key, r.value, headers) for r in records]),
        ("10 records", [(r.timestamp, r.key, r.value, ()) for r in records[:10]]),
    )
    for label, recs in cases:
        raw = current.encode_batch(0, recs, producer_id=7, producer_epoch=0, base_sequence=0)
        (now_batch,) = current.decode_batches(raw)
        (old_batch,) = old.decode_batches(raw)
        assert list(now_batch.records) == list(old_batch.records)
        got = interleaved(
            {
                "decode": lambda raw=raw: list(current.decode_batches(raw)),
                "decode_base": lambda raw=raw: list(old.decode_batches(raw)),
            },
            budget / len(cases),
        )
        n = len(recs)
        now, base = n / got["decode"], n / got["decode_base"]
        rows.append(f"one uncompressed batch, {label} ({len(raw):,} bytes)")
        rows.append(Row("decode_batches", now, "rec/s", f"at {args.base[:10]}", base))
        key = label.replace(" ", "_").replace("+", "_")
        figures[f"{key}_rec_per_s"] = now
        figures[f"{key}_base_rec_per_s"] = base
        figures[f"{key}_ratio"] = now / base
    print(render_table("Kafka record-batch decode: now and at the baseline (same run)", rows))
    emit_json(figures)


if __name__ == "__main__":
    main()
