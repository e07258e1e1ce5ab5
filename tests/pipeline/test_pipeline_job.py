"""``edgegw pipeline run`` in-process on the shared session: Iceberg and Parquet, incremental."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from _fds import no_gc, open_paths
from _pipeline_support import T0, Rows, Site, local_site, merge

from edge_gateway.errors import InvalidInput
from edge_gateway.pipeline.bucketspec import BucketSpec
from edge_gateway.pipeline.compact import compact_table
from edge_gateway.pipeline.job import JobConfig, run_job
from edge_gateway.pipeline.tables import POSITIONS, Output, open_catalog


def job(bucket: Path, warehouse: Path, **kw: Any) -> JobConfig:
    iceberg = kw.pop("iceberg", True)
    return JobConfig(BucketSpec(str(bucket)), Output(warehouse, iceberg=iceberg), **kw)


@contextlib.contextmanager
def iceberg_table(warehouse: Path, topic: str) -> Iterator[Any]:
    """The topic's table, its catalog closed on leaving (3.13 warns on unclosed SQLite)."""
    with open_catalog(warehouse, None) as cat:
        yield cat.load_table(("edgegw", topic))


def iceberg_rows(warehouse: Path, topic: str) -> Rows:
    with iceberg_table(warehouse, topic) as table:
        data = table.scan().to_arrow().to_pylist()
    return _rows(data)


def _rows(data: list[dict[str, Any]]) -> Rows:
    out: Rows = {}
    for r in data:
        key = (r["region"], r["topic"], r["partition"], r["offset"])
        assert key not in out, f"duplicate row {key}"
        ts = r["timestamp"]
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=UTC)
        out[key] = (
            round(ts.timestamp() * 1000),
            r["key"],
            r["value"],
            tuple((h["key"], h["value"]) for h in r["headers"]),
        )
    return out


def spark_rows(spark: Any, warehouse: Path, topic: str) -> Rows:
    """The table read back by Spark itself, from the data files the catalog lists."""
    with iceberg_table(warehouse, topic) as table:
        files = [t.file.file_path for t in table.scan().plan_files()]
    df = spark.read.parquet(*files)
    return _rows([r.asDict(recursive=True) for r in df.collect()])


def test_round_trip_and_incremental_iceberg(spark: Any, tmp_path: Path) -> None:
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    north = local_site("north", tmp_path, bucket)
    south = local_site("south", tmp_path, bucket)
    north.ship("telemetry", 2, 3, headers=True)
    south.ship("telemetry", 1, 2, day=1)
    north.ship("events", 1, 1)
    plan = run_job(spark, job(bucket, wh))
    assert {t: r.committed for t, r in plan.topics.items()} == {"events": True, "telemetry": True}
    expected = merge(north, south)
    for topic in ("telemetry", "events"):
        want = {k: v for k, v in expected.items() if k[1] == topic}
        assert iceberg_rows(wh, topic) == want
        assert spark_rows(spark, wh, topic) == want
    with iceberg_table(wh, "telemetry") as table:
        assert [f.name for f in table.spec().fields] == ["date", "region"]
        files = [t.file for t in table.scan().plan_files()]
        positions = json.loads(table.properties[POSITIONS])
        snapshots = len(table.snapshots())
    assert {(f.partition[0], f.partition[1]) for f in files} == {
        (T0 // 86_400_000, "north"),
        (T0 // 86_400_000 + 1, "south"),
    }
    # timestamps are microseconds in the files, not INT96
    schema = pq.read_schema(files[0].file_path.removeprefix("file://"))
    assert str(schema.field("timestamp").type) == "timestamp[us, tz=UTC]"
    assert set(positions) == {"north", "south"}

    # nothing new: nothing appended
    again = run_job(spark, job(bucket, wh))
    assert all(r.rows == 0 for r in again.topics.values())
    assert iceberg_rows(wh, "telemetry") == {
        k: v for k, v in expected.items() if k[1] == "telemetry"
    }

    # ship more: only the new rows are read and appended
    north.ship("telemetry", 2, 2)
    third = run_job(spark, job(bucket, wh))
    assert third.topics["telemetry"].rows == 2 * 2 * 10
    assert third.topics["telemetry"].ranges["north"][0] == positions["north"] + 1
    want = {k: v for k, v in merge(north, south).items() if k[1] == "telemetry"}
    assert iceberg_rows(wh, "telemetry") == want
    with iceberg_table(wh, "telemetry") as table:
        assert len(table.snapshots()) > snapshots

        # compaction: fewer files, same rows, positions kept
        before = len(list(table.scan().plan_files()))
        res = compact_table(table, min_files=2)
    assert res.partitions >= 1
    with iceberg_table(wh, "telemetry") as table:
        assert len(list(table.scan().plan_files())) < before
        assert json.loads(table.properties[POSITIONS])["north"] >= positions["north"]
    assert iceberg_rows(wh, "telemetry") == want


def test_dry_run_reads_nothing(spark: Any, tmp_path: Path) -> None:
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    north = local_site("north", tmp_path, bucket)
    north.ship("t", 1, 2)
    plan = run_job(spark, job(bucket, wh), dry_run=True)
    assert plan.topics["t"].planned_records == 20
    assert plan.topics["t"].ranges["north"][0] == 1
    assert not plan.topics["t"].committed
    assert not (wh / "edgegw").exists()


def test_runs_leave_no_catalog_connection_open(spark: Any, tmp_path: Path) -> None:
    """A process running the job again and again (a scheduler) holds no SQLite connection."""
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    north = local_site("north", tmp_path, bucket)
    north.ship("t", 1, 1)
    with no_gc():
        for dry_run in (True, False, False):  # an early return, a commit, nothing to read
            run_job(spark, job(bucket, wh), dry_run=dry_run)
            assert open_paths(wh / "catalog.db") == []
        with pytest.raises(InvalidInput, match="clashes with the rejects table"):
            run_job(spark, job(bucket, wh, topics=("_rejects",)))
        assert open_paths(wh / "catalog.db") == []
    assert iceberg_rows(wh, "t") == north.expected


def test_json_decode_with_schema_and_rejects(spark: Any, tmp_path: Path) -> None:
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    site = local_site("north", tmp_path, bucket)

    def value(region: str, topic: str, p: int, o: int) -> bytes:
        if o % 7 == 3:
            return b"{not json"
        if o % 7 == 5:
            return json.dumps({"sensor": "s", "temp": "hot"}).encode()
        return json.dumps({"sensor": f"s{p}", "temp": o / 2}).encode()

    site.ship("telemetry", 2, 2, value=value)
    ddl = "sensor string, temp double"
    plan = run_job(spark, job(bucket, wh, json_topics={"telemetry": ddl}))
    good = {k: v for k, v in site.expected.items() if k[3] % 7 not in (3, 5)}
    bad = {k: v for k, v in site.expected.items() if k[3] % 7 in (3, 5)}
    assert plan.topics["telemetry"].rows == len(good)
    assert plan.topics["telemetry"].rejects == len(bad)
    with iceberg_table(wh, "telemetry") as table:
        rows = table.scan().to_arrow().to_pylist()
    assert {(r["region"], r["topic"], r["partition"], r["offset"]) for r in rows} == set(good)
    for r in rows:
        assert r["sensor"] == f"s{r['partition']}"
        assert r["temp"] == r["offset"] / 2
        assert "value" not in r
    with iceberg_table(wh, "_rejects") as table:
        rejects = table.scan().to_arrow().to_pylist()
    assert {(r["region"], r["topic"], r["partition"], r["offset"]) for r in rejects} == set(bad)
    for r in rejects:
        assert r["value"] == bad[(r["region"], r["topic"], r["partition"], r["offset"])][2]
        if r["offset"] % 7 == 3:
            assert r["reason"] == "not a JSON object"
        else:
            assert r["reason"].startswith("does not match the schema")
    # the schema is fixed once: a second run with new records uses the stored one
    site.ship("telemetry", 1, 1, value=value)
    second = run_job(spark, job(bucket, wh, json_topics={"telemetry": None}))
    assert second.topics["telemetry"].rows + second.topics["telemetry"].rejects == 10
    with iceberg_table(wh, "_rejects") as table:
        rejects = table.scan().to_arrow()
    columns = [rejects.column(c).to_pylist() for c in ("region", "partition", "offset")]
    keys = list(zip(*columns, strict=True))
    assert len(keys) == len(set(keys))


def test_json_schema_clashing_with_a_column_is_refused(spark: Any, tmp_path: Path) -> None:
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    site = local_site("north", tmp_path, bucket)
    site.ship("telemetry", 1, 1, value=lambda *_: b'{"offset": 1}')
    with pytest.raises(InvalidInput, match=r"named like the table's own columns \(offset\)"):
        run_job(spark, job(bucket, wh, json_topics={"telemetry": "offset bigint, note string"}))
    # nothing was committed: a fixed schema then runs from the start
    plan = run_job(spark, job(bucket, wh, json_topics={"telemetry": "reading bigint"}))
    assert plan.topics["telemetry"].rows == 10


def test_plain_parquet_with_committed_markers(spark: Any, tmp_path: Path) -> None:
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    site: Site = local_site("north", tmp_path, bucket)
    site.ship("t", 2, 2)
    run_job(spark, job(bucket, wh, iceberg=False))
    site.ship("t", 2, 1)
    # an uncommitted run's leftovers are removed by the next run
    stale = wh / "t" / "_staging" / "run-stale" / "date=2020-01-01"
    stale.mkdir(parents=True)
    (stale / "part-0.parquet").write_bytes(b"junk")
    run_job(spark, job(bucket, wh, iceberg=False))
    assert not (wh / "t" / "_staging" / "run-stale").exists()
    assert sorted(p.name for p in (wh / "t" / "_committed").iterdir()) == ["1.json", "2.json"]
    df = spark.read.parquet(str(wh / "t"))
    got = _rows([r.asDict(recursive=True) for r in df.drop("date").collect()])
    assert got == site.expected


def test_another_job_on_the_warehouse_is_refused(spark: Any, tmp_path: Path) -> None:
    from edge_gateway.errors import InvalidInput
    from edge_gateway.pipeline.tables import warehouse_lock

    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    local_site("north", tmp_path, bucket).ship("t", 1, 1)
    with warehouse_lock(wh), pytest.raises(InvalidInput, match="another pipeline job"):
        run_job(spark, job(bucket, wh))


def test_expiring_old_snapshots_never_loses_their_files(spark: Any, tmp_path: Path) -> None:
    """Standard Iceberg maintenance (expire snapshots) must not make the job delete live data.

    A run's files stay where it wrote them (``data/run-<id>/``); a run folder
    that no snapshot names is what a crashed run leaves. Once old snapshots
    are expired, their runs are no longer named either, yet their files are
    still in the table.
    """
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    north = local_site("north", tmp_path, bucket)
    north.ship("telemetry", 2, 2)
    run_job(spark, job(bucket, wh))
    north.ship("telemetry", 2, 2)
    run_job(spark, job(bucket, wh))
    with iceberg_table(wh, "telemetry") as table:
        current = table.current_snapshot()
        assert current is not None
        old = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current.snapshot_id]
        table.maintenance.expire_snapshots().by_ids(old).commit()
    with iceberg_table(wh, "telemetry") as table:
        assert len(table.snapshots()) == 1

    north.ship("telemetry", 2, 1)
    plan = run_job(spark, job(bucket, wh))
    assert plan.topics["telemetry"].rows == 2 * 10
    want = {k: v for k, v in north.expected.items() if k[1] == "telemetry"}
    assert iceberg_rows(wh, "telemetry") == want


def _files(wh: Path, topic: str) -> dict[str, int]:
    with iceberg_table(wh, topic) as table:
        return {t.file.file_path: t.file.file_size_in_bytes for t in table.scan().plan_files()}


def test_compaction_rewrites_small_files_in_groups_and_leaves_large_ones(
    spark: Any, tmp_path: Path
) -> None:
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    north = local_site("north", tmp_path, bucket)
    north.ship("telemetry", 1, 40, size=50)  # one large file
    run_job(spark, job(bucket, wh))
    (large,) = _files(wh, "telemetry")
    for _ in range(5):  # five small ones
        north.ship("telemetry", 1, 1)
        run_job(spark, job(bucket, wh))
    files = _files(wh, "telemetry")
    small = sorted(size for path, size in files.items() if path != large)
    assert len(small) == 5
    assert files[large] > 3 * max(small)
    target = 2 * max(small) + 1  # two small files per group at most, the large one too big
    want = {k: v for k, v in north.expected.items() if k[1] == "telemetry"}

    with iceberg_table(wh, "telemetry") as table:
        res = compact_table(table, target_bytes=target, min_files=2)
    after = _files(wh, "telemetry")
    assert large in after  # not rewritten
    assert (res.partitions, res.files_before, res.files_after) == (1, 4, 2)
    assert len(after) == 1 + 2 + 1  # the large file, two groups of two, one small file left
    assert res.rows == 4 * 10
    assert iceberg_rows(wh, "telemetry") == want
    assert spark_rows(spark, wh, "telemetry") == want
    # the rewritten files are in log order, like the job's
    for path in set(after) - set(files):
        assert "/data/run-compact-" in path
        seqs = pq.read_table(path.removeprefix("file://"), columns=["log_seq"]).column(0)
        assert seqs.to_pylist() == sorted(seqs.to_pylist())


def test_killed_compaction_leaves_nothing_the_next_run_keeps(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge_gateway.pipeline import compact

    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    north = local_site("north", tmp_path, bucket)
    for _ in range(3):
        north.ship("telemetry", 1, 1)
        run_job(spark, job(bucket, wh))
    files = _files(wh, "telemetry")

    def killed(*_args: Any) -> None:
        raise KeyboardInterrupt  # as if killed between the rewrite and the commit

    monkeypatch.setattr(compact, "_commit", killed)
    with iceberg_table(wh, "telemetry") as table, pytest.raises(KeyboardInterrupt):
        compact_table(table)
    (left,) = list((wh / "edgegw" / "telemetry" / "data").glob("run-compact-*"))
    assert list(left.rglob("*.parquet"))  # the rewritten file, never committed
    assert _files(wh, "telemetry") == files

    north.ship("telemetry", 1, 1)
    run_job(spark, job(bucket, wh))  # deletes the folder of the uncommitted compaction
    assert not left.exists()
    want = {k: v for k, v in north.expected.items() if k[1] == "telemetry"}
    assert iceberg_rows(wh, "telemetry") == want


def _prom(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(path.read_text())
        for s in family.samples
    }


def test_metrics_file_reports_rows_positions_and_lag(spark: Any, tmp_path: Path) -> None:
    from edge_gateway.pipeline.report import write_metrics

    bucket, wh, prom = tmp_path / "bucket", tmp_path / "wh", tmp_path / "m" / "pipeline.prom"
    north = local_site("north", tmp_path, bucket)
    south = local_site("south", tmp_path, bucket)
    north.ship("telemetry", 2, 2)
    south.ship("telemetry", 1, 1)
    plan = run_job(spark, job(bucket, wh))
    write_metrics(prom, plan, ok=True, started=100.0, finished=160.0)
    m = _prom(prom)
    heads = {r: p.last_seq for r, p in plan.regions.items()}
    assert m[("edgegw_pipeline_last_run_success", ())] == 1
    assert m[("edgegw_pipeline_last_run_duration_seconds", ())] == 60
    assert m[("edgegw_pipeline_last_success_timestamp_seconds", ())] == 160
    assert m[("edgegw_pipeline_rows", (("topic", "telemetry"),))] == 2 * 2 * 10 + 10
    for region, head in heads.items():
        assert m[("edgegw_pipeline_log_head_seq", (("region", region),))] == head
        key = (("region", region), ("topic", "telemetry"))
        assert m[("edgegw_pipeline_committed_seq", key)] == head
        assert m[("edgegw_pipeline_lag_entries", key)] == 0

    # new entries in north, not read yet (a dry run plans without committing): north lags
    north.ship("telemetry", 2, 1)
    pending = run_job(spark, job(bucket, wh), dry_run=True)
    write_metrics(prom, pending, ok=True, started=200.0, finished=201.0)
    m = _prom(prom)
    lag_north = m[("edgegw_pipeline_lag_entries", (("region", "north"), ("topic", "telemetry")))]
    assert lag_north == pending.regions["north"].last_seq - heads["north"] > 0
    assert m[("edgegw_pipeline_lag_entries", (("region", "south"), ("topic", "telemetry")))] == 0

    # a failed run: success 0, the last success carried over
    write_metrics(prom, None, ok=False, started=300.0, finished=305.0)
    m = _prom(prom)
    assert m[("edgegw_pipeline_last_run_success", ())] == 0
    assert m[("edgegw_pipeline_last_run_timestamp_seconds", ())] == 305
    assert m[("edgegw_pipeline_last_success_timestamp_seconds", ())] == 201
    assert not any(name == "edgegw_pipeline_rows" for name, _ in m)
