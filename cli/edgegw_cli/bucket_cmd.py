"""``edgegw bucket check``: prove a store has what edgegw needs, before a rollout.

Runs :func:`edge_gateway.bucket.check_store` against the bucket the options
(or ``--config``) name, in a scratch prefix it deletes afterwards, prints a
table and a verdict, and exits 0 only when every requirement holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio
import typer
from rich.table import Table
from rich.text import Text

from edge_gateway.bucket import Bucket, LocalBucket, StoreReport, check_store
from edge_gateway.bucket._check import FAIL, INFO, PASS, WORKAROUND
from edge_gateway.errors import EdgeGatewayError
from edgegw_cli._bucket import open_bucket
from edgegw_cli._common import console, fail
from edgegw_cli._errors import reason

app = typer.Typer(
    no_args_is_help=True,
    help="Check that a store has what edgegw needs, before a rollout.",
)

_STYLES = {PASS: "green", FAIL: "bold red", WORKAROUND: "yellow", INFO: ""}


@app.command("check")
def check(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="A gateway's config file: check the bucket it names."
    ),
    bucket_dir: Path | None = typer.Option(None, help="A local-directory bucket."),
    s3_bucket: str | None = typer.Option(None, help="An S3 bucket name."),
    s3_endpoint: str | None = typer.Option(None, help="S3 endpoint URL (MinIO, R2, Ceph, ...)."),
    s3_prefix: str = typer.Option("", help="Key prefix inside the bucket."),
    s3_path_style: bool = typer.Option(False, help="Path-style S3 addressing."),
    racers: int = typer.Option(50, min=2, max=500, help="Concurrent creators of one key."),
    samples: int = typer.Option(20, min=1, max=10_000, help="Small PUTs and GETs timed."),
    throughput_mib: int = typer.Option(
        16, min=0, max=4096, help="MiB written and read back for the throughput figure (0: skip)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
) -> None:
    """Check that a store has what edgegw needs, before a rollout.

    Runs the contract edgegw relies on against the bucket, in a scratch
    prefix (_edgegw-check/) that it deletes afterwards: conditional create
    (new key, existing key, concurrent racers: exactly one wins), conditional
    overwrite (If-Match), conditional multipart complete, ranged GET, GET and
    HEAD of a missing key, LIST by prefix, delete, read-after-write; then the
    latency of small conditional PUTs and GETs and a throughput figure. Says
    whether edgegw can run on the store. Exit code 0 only when every
    requirement holds; 1 when one does not; 2 for bad options.

    Example: edgegw bucket check --config /etc/edgegw/edgegw.toml
    """

    async def run() -> StoreReport:
        bucket, prefix = await _open(
            config, bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style
        )
        async with bucket:
            return await check_store(
                bucket,
                prefix,
                racers=racers,
                samples=samples,
                throughput_bytes=throughput_mib * 1024 * 1024,
            )

    try:
        report = trio.run(run)
    except typer.Exit:
        raise
    except (EdgeGatewayError, OSError) as exc:
        raise fail(f"could not check the store: {reason(exc)}") from None
    if as_json:
        print(json.dumps(report.to_json(), sort_keys=True))
    else:
        _print(report)
    if not report.ok:
        raise typer.Exit(1)


async def _open(
    config: Path | None,
    bucket_dir: Path | None,
    s3_bucket: str | None,
    s3_endpoint: str | None,
    s3_prefix: str,
    s3_path_style: bool,
) -> tuple[Bucket, str]:
    if config is None:
        if not bucket_dir and not s3_bucket:
            raise fail("give --config, --bucket-dir or --s3-bucket", code=2)
        return await open_bucket(bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style)
    if bucket_dir or s3_bucket:
        raise fail("give --config or bucket options, not both", code=2)
    from edge_gateway.config import load_config

    try:
        cfg = load_config(config)
    except EdgeGatewayError as exc:
        raise fail(str(exc), code=2) from None
    if cfg.bucket.type != "local":
        from edge_gateway.bucket._open import open_cloud_bucket

        bucket: Bucket = await open_cloud_bucket(cfg.bucket.cloud_config())
        try:
            await bucket.check_exists()
        except BaseException:
            await bucket.aclose()
            raise
        return bucket, ""
    # A local bucket is checked where the gateway keeps it, under its prefix.
    return await LocalBucket.open(cfg.bucket.local_path(cfg.data_dir)), cfg.bucket.prefix


def _print(report: StoreReport) -> None:
    table = Table(title=f"bucket check: {report.store}")
    for column in ("check", "result", "detail"):
        table.add_column(column)
    for c in report.checks:
        label = c.result.upper() if c.result != INFO else ""
        table.add_row(c.name, Text(label, style=_STYLES[c.result]), c.detail)
    console.print(table)
    if report.leftovers:
        console.print(f"note: could not delete scratch objects: {', '.join(report.leftovers)}")
    if report.ok:
        console.print(Text("edgegw can run on this store.", style="bold green"), soft_wrap=True)
        return
    failed = "; ".join(f"{c.name}: {c.detail}" for c in report.failures)
    # One line whatever the width: scripts and logs read the verdict.
    console.print(
        Text(f"edgegw cannot run on this store: {failed}", style="bold red"), soft_wrap=True
    )
