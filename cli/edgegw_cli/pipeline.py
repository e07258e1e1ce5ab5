"""``edgegw pipeline run|compact``: the analytics pipeline (needs the ``pipeline`` extra).

PySpark, pyarrow and pyiceberg are imported inside the commands only, so the
rest of the CLI starts without them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from edge_gateway.errors import EdgeGatewayError
from edgegw_cli._common import console, error, fail
from edgegw_cli._errors import reason

app = typer.Typer(help="Bucket -> Iceberg/Parquet tables with PySpark.", no_args_is_help=True)


def _imports() -> None:
    try:
        import pyarrow  # noqa: F401
        import pyiceberg  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise fail(
            f"the pipeline needs the 'pipeline' extra (pip install 'edgegw[pipeline]'): {exc}",
            code=2,
        ) from None


def _parse_kv(items: list[str], what: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not key:
            raise fail(f"{what}: {item!r} is not NAME[=VALUE]", code=2)
        out[key.strip()] = value.strip() if sep else None
    return out


@app.command("run")
def run(
    bucket: str = typer.Option(
        ..., help="A local-directory bucket, or s3://BUCKET or s3://BUCKET/PREFIX."
    ),
    warehouse: Path = typer.Option(..., help="Directory of the tables (and the SQLite catalog)."),
    master: str = typer.Option("local[*]", help="Spark master: local[*], spark://host:7077, ..."),
    catalog: str | None = typer.Option(
        None, help="Catalog URL: sqlite:///... (default: <warehouse>/catalog.db) or a REST URL."
    ),
    namespace: str = typer.Option("edgegw", help="Iceberg namespace of the tables."),
    iceberg: bool = typer.Option(True, help="Iceberg tables; --no-iceberg: plain Parquet."),
    region: list[str] = typer.Option([], help="Regions to read (default: all). Repeatable."),
    topic: list[str] = typer.Option([], help="Topics to read (default: all). Repeatable."),
    json_topic: list[str] = typer.Option(
        [],
        "--json",
        help="Decode a topic's JSON values: TOPIC=DDL ('a int, b string') or TOPIC (infer "
        "once). Repeatable.",
    ),
    endpoint_url: str | None = typer.Option(None, help="S3 endpoint (MinIO, R2, moto, ...)."),
    s3_region: str | None = typer.Option(None, help="S3 signing region."),
    access_key: str | None = typer.Option(None, envvar="EDGEGW_S3_ACCESS_KEY"),
    secret_key: str | None = typer.Option(None, envvar="EDGEGW_S3_SECRET_KEY"),
    path_style: bool | None = typer.Option(None, "--path-style/--virtual-host-style"),
    conf: list[str] = typer.Option([], help="Extra Spark conf KEY=VALUE. Repeatable."),
    max_partition_mb: int = typer.Option(128, help="Raw MiB of batches per write task."),
    dry_run: bool = typer.Option(False, help="Print the plan (log ranges to read) and exit."),
    key_file: list[str] = typer.Option(
        [],
        "--key-file",
        help="REGION=PATH: a key file of an encrypted region (id: the file name without "
        ".key); every key still in use by that region's objects. Repeatable. Spark "
        "executors read the same paths.",
    ),
    metrics_file: Path | None = typer.Option(
        None,
        help="Write the run's figures (success, rows, lag per topic and region) to this file "
        "in Prometheus text format, for node_exporter's textfile collector.",
    ),
) -> None:
    """Read every (region, topic)'s new records and commit them to a table per topic, exactly once.

    Example: edgegw pipeline run --bucket /srv/edgegw/bucket --warehouse /srv/tables
    """
    started = time.time()
    plan: Any = None
    try:
        plan = _run_job(
            bucket=bucket, warehouse=warehouse, master=master, catalog=catalog,
            namespace=namespace, iceberg=iceberg, region=region, topic=topic,
            json_topic=json_topic, endpoint_url=endpoint_url, s3_region=s3_region,
            access_key=access_key, secret_key=secret_key, path_style=path_style, conf=conf,
            max_partition_mb=max_partition_mb, dry_run=dry_run, key_file=key_file,
        )  # fmt: skip
    finally:
        if metrics_file is not None and not dry_run:
            _write_metrics(metrics_file, plan, started)
    _summary(plan, dry_run)


def _write_metrics(path: Path, plan: Any, started: float) -> None:
    from edge_gateway.pipeline.report import write_metrics

    try:
        write_metrics(path, plan, ok=plan is not None, started=started, finished=time.time())
    except OSError as exc:
        # said, not raised: the run's own outcome (and exit code) stands
        error(f"cannot write the metrics file {path}: {reason(exc)}")


def _run_job(
    *,
    bucket: str,
    warehouse: Path,
    master: str,
    catalog: str | None,
    namespace: str,
    iceberg: bool,
    region: list[str],
    topic: list[str],
    json_topic: list[str],
    endpoint_url: str | None,
    s3_region: str | None,
    access_key: str | None,
    secret_key: str | None,
    path_style: bool | None,
    conf: list[str],
    max_partition_mb: int,
    dry_run: bool,
    key_file: list[str],
) -> Any:
    _imports()
    from edge_gateway.encryption import parse_key_file_options
    from edge_gateway.pipeline.bucketspec import BucketSpec
    from edge_gateway.pipeline.job import JobConfig, run_job
    from edge_gateway.pipeline.tables import Output

    try:
        cfg = JobConfig(
            bucket=BucketSpec(
                bucket,
                endpoint_url=endpoint_url,
                region=s3_region,
                access_key=access_key,
                secret_key=secret_key,
                path_style=path_style,
            ),
            output=Output(warehouse, iceberg=iceberg, catalog_uri=catalog, namespace=namespace),
            regions=tuple(region) or None,
            topics=tuple(topic) or None,
            json_topics=_parse_kv(json_topic, "--json"),
            max_partition_bytes=max_partition_mb * 1024 * 1024,
            key_files=parse_key_file_options(key_file),
        )
        spark_conf = {k: v or "" for k, v in _parse_kv(conf, "--conf").items()}
        from edge_gateway.pipeline.session import LazySession

        # started only when a topic has records to read
        spark = LazySession(
            master,
            conf=spark_conf,
            on_start=lambda: console.print(f"starting Spark ({master})", highlight=False),
        )
        try:
            plan = run_job(
                spark,
                cfg,
                progress=lambda msg: console.print(msg, highlight=False, soft_wrap=True),
                dry_run=dry_run,
            )
        finally:
            spark.stop()
    except (EdgeGatewayError, OSError) as exc:
        raise fail(reason(exc)) from None
    return plan


def _summary(plan: Any, dry_run: bool) -> None:
    table = Table(title="plan" if dry_run else "pipeline run")
    for column in ("topic", "regions (seqs)", "records", "bytes", "dropped at source"):
        table.add_column(column, overflow="fold")
    if not dry_run:
        for column in ("rows", "rejects", "files", "seconds", "committed"):
            table.add_column(column, overflow="fold")
    for res in plan.topics.values():
        ranges = ", ".join(f"{r} {a}..{b}" for r, (a, b) in sorted(res.ranges.items())) or "-"
        dropped = str(res.gap_records) if res.gaps else "-"
        cells = [res.topic, ranges, str(res.planned_records), str(res.planned_bytes), dropped]
        if not dry_run:
            cells += [
                str(res.rows),
                str(res.rejects),
                str(res.files),
                f"{res.seconds:.1f}",
                "yes" if res.committed else "-",
            ]
        table.add_row(*cells)
    console.print(table)
    for res in plan.topics.values():
        for gap in res.gaps:
            console.print(f"GAP: {gap.describe()}", style="red", highlight=False)
    if dry_run:
        for r, p in sorted(plan.regions.items()):
            console.print(
                f"{r}: log {p.first_seq}..{p.last_seq}, {len(p.slices)} objects, "
                f"{p.records} records, {p.stored_bytes} bytes",
                highlight=False,
            )


@app.command("compact")
def compact(
    warehouse: Path = typer.Option(..., help="Directory of the tables."),
    catalog: str | None = typer.Option(None, help="Catalog URL (default: the warehouse's SQLite)."),
    namespace: str = typer.Option("edgegw", help="Iceberg namespace of the tables."),
    table: list[str] = typer.Option([], help="Tables to compact (default: all). Repeatable."),
    target_file_mb: int = typer.Option(128, help="Files below this size count as small."),
    min_files: int = typer.Option(
        2, help="Rewrite a partition with at least this many small files."
    ),
) -> None:
    """Rewrite small data files of each table partition into larger ones (Iceberg tables).

    Example: edgegw pipeline compact --warehouse /srv/tables
    """
    _imports()
    from edge_gateway.pipeline.compact import compact_table
    from edge_gateway.pipeline.tables import open_catalog, warehouse_lock

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    summary = Table(title="compaction")
    for column in ("table", "partitions", "files before", "files after", "rows"):
        summary.add_column(column)
    try:
        with warehouse_lock(warehouse), open_catalog(warehouse, catalog) as cat:
            names = table or [ident[-1] for ident in cat.list_tables(namespace)]
            for name in names:
                res = compact_table(
                    cat.load_table((namespace, name)),
                    target_bytes=target_file_mb * 1024 * 1024,
                    min_files=min_files,
                    progress=lambda msg: console.print(msg, highlight=False, soft_wrap=True),
                )
                summary.add_row(
                    name, str(res.partitions), str(res.files_before), str(res.files_after),
                    str(res.rows),
                )  # fmt: skip
    except (EdgeGatewayError, OSError) as exc:
        raise fail(reason(exc)) from None
    console.print(summary)
