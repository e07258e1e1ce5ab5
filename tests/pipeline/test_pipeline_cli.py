"""``edgegw pipeline`` through the typer app: --dry-run, compact, clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _pipeline_support import local_site
from edgegw_cli.app import app
from test_pipeline_job import iceberg_rows, iceberg_table, job
from typer.testing import CliRunner

from edge_gateway.pipeline.job import run_job


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def test_dry_run_prints_the_plan(tmp_path: Path) -> None:
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    local_site("north", tmp_path, bucket).ship("telemetry", 2, 3)
    res = invoke("pipeline", "run", "--bucket", bucket, "--warehouse", wh, "--dry-run")
    assert res.exit_code == 0, res.output
    assert "telemetry" in res.output
    assert "north 1.." in res.output
    assert "60" in res.output  # records planned
    assert "north: log 1.." in res.output


def test_compact_command(spark: Any, tmp_path: Path) -> None:
    bucket, wh = tmp_path / "bucket", tmp_path / "wh"
    site = local_site("north", tmp_path, bucket)
    for _ in range(3):
        site.ship("t", 1, 1)
        run_job(spark, job(bucket, wh))
    with iceberg_table(wh, "t") as table:
        before = len(list(table.scan().plan_files()))
    assert before >= 3
    res = invoke("pipeline", "compact", "--warehouse", wh)
    assert res.exit_code == 0, res.output
    assert "compaction" in res.output
    with iceberg_table(wh, "t") as table:
        assert len(list(table.scan().plan_files())) == 1
    assert iceberg_rows(wh, "t") == site.expected


def test_bad_bucket_is_a_one_line_error(tmp_path: Path) -> None:
    res = invoke(
        "pipeline", "run", "--bucket", tmp_path / "nothing", "--warehouse", tmp_path / "wh",
        "--dry-run",
    )  # fmt: skip
    assert res.exit_code == 1
    # the bucket package's own refusal (NoSuchBucket), one line naming the directory
    assert f"local bucket directory '{tmp_path / 'nothing'}' does not exist" in res.output


def test_gateway_and_cli_never_import_the_pipeline_stack() -> None:
    import subprocess
    import sys

    code = (
        "import sys, edge_gateway.gateway, edgegw_cli.app\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('pyspark', 'pyarrow', 'pyiceberg', 'edge_gateway.pipeline')]\n"
        "bad += [m for m in sys.modules if m.startswith('edge_gateway.pipeline')]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
