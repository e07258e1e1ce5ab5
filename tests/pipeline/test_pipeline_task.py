"""One write task (``_task.run_write_task``) on its own, without Spark: chunks, files, row groups.

The job runs these tasks on Spark executors; here they run in the test
process over a real local-directory bucket, with the chunk and row-group
sizes made small so that a few hundred records cross every boundary.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _pipeline_support import Site, local_site

from edge_gateway.pipeline import _task
from edge_gateway.pipeline.bucketspec import BucketSpec
from edge_gateway.pipeline.plan import ObjectSlice, plan_region

SCHEMA_JSON = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "site", "type": "string", "nullable": True, "metadata": {}},
            {"name": "seq", "type": "long", "nullable": True, "metadata": {}},
            {"name": "temp", "type": "double", "nullable": True, "metadata": {}},
        ],
    }
)


def value_with_bad(region: str, topic: str, partition: int, offset: int) -> bytes:
    """Telemetry, except every 7th value (not an object) and every 11th (a string seq)."""
    if offset % 7 == 3:
        return b"[1, 2]"
    seq: object = f"x{offset}" if offset % 11 == 5 else offset
    return json.dumps({"site": region, "seq": seq, "temp": offset / 10}).encode()


def ship_two_days(tmp_path: Path) -> tuple[Path, list[Site]]:
    bucket = tmp_path / "bucket"
    sites = [local_site(r, tmp_path, bucket) for r in ("north", "south")]
    for site in sites:
        site.ship("telemetry", 2, 3, size=40, value=value_with_bad, day=0)
        site.ship("telemetry", 2, 2, size=40, value=value_with_bad, day=1)
    return bucket, sites


def slices_of(bucket: Path, topic: str) -> tuple[ObjectSlice, ...]:
    with BucketSpec(str(bucket)).open() as reader:
        out = []
        for region in ("north", "south"):
            for s in plan_region(reader, region).slices:
                blocks = tuple(b for b in s.blocks if b.topic == topic)
                if blocks:
                    out.append(ObjectSlice(s.region, s.seq, s.key, s.size, blocks))
        return tuple(out)


def make_task(bucket: Path, out: Path, **kw: Any) -> _task.WriteTask:
    kw.setdefault("json_schema", SCHEMA_JSON)
    return _task.WriteTask(
        index=3,
        bucket=BucketSpec(str(bucket)),
        slices=slices_of(bucket, "telemetry"),
        out_dir=str(out / "table"),
        rejects_dir=str(out / "rejects"),
        **kw,
    )


@pytest.fixture
def small_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_task, "CHUNK_BYTES", 2_000)  # a few blocks per chunk
    monkeypatch.setattr(_task, "ROW_GROUP_ROWS", 64)
    monkeypatch.setattr(_task, "MAX_BUFFERED_ROWS", 100)


def read_files(files: tuple[tuple[str, int], ...]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path, count in files:
        table = pq.read_table(path)
        assert table.num_rows == count
        rows.extend(table.to_pylist())
    return rows


def test_task_writes_every_record_once_across_chunks_and_row_groups(
    tmp_path: Path, small_sizes: None
) -> None:
    bucket, sites = ship_two_days(tmp_path)
    expected = {k: v for s in sites for k, v in s.expected.items()}
    result = _task.run_write_task(make_task(bucket, tmp_path / "out"))

    assert result.records == len(expected)
    assert result.cpu_seconds > 0
    # one file per (date, region), each renamed from its temporary name
    folders = {Path(p).parent.relative_to(tmp_path / "out" / "table") for p, _ in result.files}
    assert folders == {
        Path(f"pdate={d}/pregion={r}")
        for d in ("2025-11-22", "2025-11-23")
        for r in ("north", "south")
    }
    assert len(result.files) == 4
    leftovers = [p for p in (tmp_path / "out").rglob("*") if p.is_file() and p.name.startswith(".")]
    assert leftovers == []

    rows = read_files(result.files)
    bad = {k for k, (_, _, v, _) in expected.items() if not v.startswith(b"{") or b'"x' in v}
    assert result.rejected == len(bad) > 0
    assert result.rows == len(rows) == len(expected) - len(bad)
    got = {(r["region"], r["topic"], r["partition"], r["offset"]): r for r in rows}
    assert len(got) == len(rows), "a record was written twice"
    assert set(got) == set(expected) - bad
    for key, row in got.items():
        ts, k, _, _ = expected[key]
        assert row["key"] == k
        assert int(row["timestamp"].timestamp() * 1000) == ts
        assert (row["site"], row["seq"], row["temp"]) == (key[0], key[3], key[3] / 10)
        assert "value" not in row

    # row groups: full ones of ROW_GROUP_ROWS, shorter ones only when buffers were flushed early
    for path, _ in result.files:
        meta = pq.ParquetFile(path).metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert meta.num_row_groups > 1
        assert max(sizes) <= _task.ROW_GROUP_ROWS
        assert sum(sizes) == meta.num_rows

    rejects = read_files(result.reject_files)
    assert {(r["region"], r["partition"], r["offset"]) for r in rejects} == {
        (k[0], k[2], k[3]) for k in bad
    }
    by_reason = {r["offset"] % 7 == 3: r["reason"] for r in rejects}
    assert by_reason[True] == "not a JSON object"
    assert by_reason[False].startswith("does not match the schema struct<site:")


def test_rejects_committed_before_are_not_written_again(tmp_path: Path, small_sizes: None) -> None:
    bucket, _ = ship_two_days(tmp_path)
    first = _task.run_write_task(make_task(bucket, tmp_path / "a"))
    last_north = max(s.seq for s in slices_of(bucket, "telemetry") if s.region == "north")
    again = _task.run_write_task(
        make_task(bucket, tmp_path / "b", rejects_done={"north": last_north})
    )
    assert again.rejected == first.rejected  # counted: the driver checks rows + rejects == read
    regions = {r["region"] for r in read_files(again.reject_files)}
    assert regions == {"south"}


def test_dictionary_encoding_only_for_repetitive_columns(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    local_site("north", tmp_path, bucket).ship("telemetry", 1, 5, size=40)  # one partition
    result = _task.run_write_task(make_task(bucket, tmp_path / "out"))
    meta = pq.ParquetFile(result.files[0][0]).metadata
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    encodings = {n: meta.row_group(0).column(i).encodings for i, n in enumerate(names)}
    for repetitive in ("region", "topic", "partition", "log_seq", "date", "site"):
        assert "RLE_DICTIONARY" in encodings[repetitive], (repetitive, encodings[repetitive])
    for unique in ("offset", "timestamp", "seq"):
        assert "RLE_DICTIONARY" not in encodings[unique], (unique, encodings[unique])


def test_failed_task_leaves_no_files(
    tmp_path: Path, small_sizes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, _ = ship_two_days(tmp_path)
    calls = 0
    real = _task._PartitionWriter.add

    def failing_add(self: Any, table: pa.Table) -> None:
        nonlocal calls
        calls += 1
        if calls == 4:  # after files were opened and row groups written
            raise OSError(28, "No space left on device")
        real(self, table)

    monkeypatch.setattr(_task._PartitionWriter, "add", failing_add)
    with pytest.raises(OSError, match="No space left"):
        _task.run_write_task(make_task(bucket, tmp_path / "out"))
    assert calls == 4
    assert [p for p in (tmp_path / "out").rglob("*") if p.is_file()] == []


def test_plain_parquet_files_drop_partition_columns(tmp_path: Path, small_sizes: None) -> None:
    bucket, _ = ship_two_days(tmp_path)
    result = _task.run_write_task(make_task(bucket, tmp_path / "out", iceberg=False))
    for path, _ in result.files:
        assert "/date=" in path
        assert "/region=" in path
        names = pq.read_schema(path).names
        assert "date" not in names
        assert "region" not in names


def test_a_task_in_a_fresh_process_does_not_import_pandas(tmp_path: Path) -> None:
    """``pa.array`` imports pandas (0.5 s in every fresh Spark worker): the task path avoids it.

    (Rejects do import it, for their reasons: they are rare.)
    """
    bucket = tmp_path / "bucket"
    for region in ("north", "south"):  # two regions and two days: rows split by both
        site = local_site(region, tmp_path, bucket)
        site.ship("telemetry", 2, 3, size=40)
        site.ship("telemetry", 2, 2, size=40, day=1)
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from pathlib import Path
from test_pipeline_task import make_task
from edge_gateway.pipeline import _task
result = _task.run_write_task(make_task(Path({str(bucket)!r}), Path({str(tmp_path / "out")!r})))
assert result.rows == 800 and result.rejected == 0 and len(result.files) == 4, result
print("pandas" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_task_frees_its_memory_without_the_garbage_collector(
    tmp_path: Path, small_sizes: None
) -> None:
    """No reference cycles: a chunk's values and rows are freed when the next one comes."""
    bucket, _ = ship_two_days(tmp_path)
    task = make_task(bucket, tmp_path / "out")
    _task.run_write_task(task)  # first call: imports, caches, opens the bucket (kept)
    again = make_task(bucket, tmp_path / "again")  # planning is not the task's work
    gc.collect()
    gc.disable()
    try:
        before = pa.total_allocated_bytes()
        result = _task.run_write_task(again)
        assert result.rows > 0
        assert result.rejected > 0
        assert pa.total_allocated_bytes() == before
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_json_schema_of_no_fields_drops_the_value(tmp_path: Path) -> None:
    """Values that are all ``{}`` infer a schema of no fields: the rows keep their metadata."""
    bucket = tmp_path / "bucket"
    local_site("north", tmp_path, bucket).ship("telemetry", 1, 2, value=lambda *_: b"{}")
    empty = json.dumps({"type": "struct", "fields": []})
    result = _task.run_write_task(make_task(bucket, tmp_path / "out", json_schema=empty))
    assert (result.rows, result.rejected) == (20, 0)
    names = pq.read_schema(result.files[0][0]).names
    assert "value" not in names
    assert "offset" in names
