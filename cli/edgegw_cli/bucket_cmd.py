"""``edgegw bucket check`` and ``edgegw bucket mark``: a store before a rollout.

(``edgegw bucket verify``, the replica against the journal, is in bucket_verify_cmd.py.)

``check`` runs :func:`edge_gateway.bucket.check_store` against the bucket the
options (or ``--config``) name, in a scratch prefix it deletes afterwards,
prints a table and a verdict, and exits 0 only when every requirement holds.

``mark`` writes the fleet marker (``edge_gateway.bucket_log.write_bucket_marker``)
with the admin's credentials: regions' policies do not grant it
(docs/security.md), so one region's key cannot overwrite it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import trio
import typer
from rich.table import Table
from rich.text import Text

from edge_gateway.bucket import (
    FAIL,
    INFO,
    PASS,
    WORKAROUND,
    AzureConfig,
    Bucket,
    GcsConfig,
    LocalBucket,
    StoreReport,
    check_store,
)
from edge_gateway.bucket_log import BUCKET_MARKER, write_bucket_marker
from edge_gateway.errors import EdgeGatewayError
from edgegw_cli._bucket import open_bucket
from edgegw_cli._common import console, fail
from edgegw_cli._errors import reason
from edgegw_cli.bucket_verify_cmd import verify

app = typer.Typer(
    no_args_is_help=True,
    help="Check that a store has what edgegw needs, and mark it as the fleet's, before a "
    "rollout; verify a region's log in it against the journal.",
)
app.command("verify")(verify)

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
    azure_container: str | None = typer.Option(
        None,
        help="An Azure Blob container; credentials from AZURE_STORAGE_CONNECTION_STRING "
        "(or --azure-endpoint with azure-identity's default chain).",
    ),
    azure_endpoint: str | None = typer.Option(
        None, help="The account's blob endpoint (https://<account>.blob.core.windows.net)."
    ),
    gcs_bucket: str | None = typer.Option(
        None, help="A Google Cloud Storage bucket; Application Default Credentials."
    ),
    gcs_endpoint: str | None = typer.Option(None, help="Another GCS API endpoint (an emulator)."),
    prefix: str = typer.Option("", help="Key prefix in the Azure container or GCS bucket."),
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
    (Azure: --azure-container NAME with AZURE_STORAGE_CONNECTION_STRING set;
    GCS: --gcs-bucket NAME with Application Default Credentials.)
    """

    cloud = _cloud_config(azure_container, azure_endpoint, gcs_bucket, gcs_endpoint, prefix)
    if cloud is not None and (config or bucket_dir or s3_bucket):
        raise fail(
            "give one store: --config, --bucket-dir, --s3-bucket, --azure-container "
            "or --gcs-bucket",
            code=2,
        )

    async def run() -> StoreReport:
        if cloud is not None:
            bucket, key_prefix = await _open_cloud(cloud), ""
        else:
            bucket, key_prefix = await _open(
                config, bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style
            )
        async with bucket:
            return await check_store(
                bucket,
                key_prefix,
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


@app.command("mark")
def mark(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="A gateway's config file: mark the bucket it names."
    ),
    bucket_dir: Path | None = typer.Option(None, help="A local-directory bucket."),
    s3_bucket: str | None = typer.Option(None, help="An S3 bucket name."),
    s3_endpoint: str | None = typer.Option(None, help="S3 endpoint URL (MinIO, R2, Ceph, ...)."),
    s3_prefix: str = typer.Option("", help="Key prefix inside the bucket (the fleet's prefix)."),
    s3_path_style: bool = typer.Option(False, help="Path-style S3 addressing."),
) -> None:
    """Write the fleet marker (edgegw-bucket.json): the admin, once per fleet.

    The marker tells edgegw sync, restore and reship that the bucket (under
    the prefix) is the fleet's, not a typo. Regions' policies do not grant
    it (a stolen device's key must not be able to overwrite it), so run this
    with the admin's credentials before the first gateway starts. A valid
    marker is kept; a malformed one is replaced (compare-and-swap), and
    what it held is printed. Exit code 0 when the bucket has a valid marker
    afterwards.

    Example: edgegw bucket mark --s3-bucket fleet-data --s3-prefix plant
    """

    async def run() -> tuple[str, str, bytes]:
        bucket, key_prefix = await _open(
            config, bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style
        )
        async with bucket:
            outcome, old = await write_bucket_marker(
                bucket, key_prefix, time.time_ns() // 1_000_000
            )
            return bucket.describe(), outcome, old

    try:
        where, outcome, old = trio.run(run)
    except typer.Exit:
        raise
    except (EdgeGatewayError, OSError) as exc:
        raise fail(f"could not mark the bucket: {reason(exc)}") from None
    if outcome == "created":
        console.print(f"marked {where} as an edgegw bucket ({BUCKET_MARKER} written)")
    elif outcome == "present":
        held = old.decode(errors="replace")
        console.print(f"{where} is an edgegw bucket already ({BUCKET_MARKER}: {held})")
    else:
        console.print(
            f"replaced a malformed {BUCKET_MARKER} in {where}; it held {old[:200]!r}: find out "
            "who could write it (docs/security.md)"
        )


def _cloud_config(
    azure_container: str | None,
    azure_endpoint: str | None,
    gcs_bucket: str | None,
    gcs_endpoint: str | None,
    prefix: str,
) -> AzureConfig | GcsConfig | None:
    """The Azure or GCS store the options name (``None``: neither)."""
    if azure_container and gcs_bucket:
        raise fail("give --azure-container or --gcs-bucket, not both", code=2)
    try:
        if azure_container:
            return AzureConfig(
                container=azure_container, prefix=prefix, endpoint_url=azure_endpoint
            )
        if gcs_bucket:
            return GcsConfig(bucket=gcs_bucket, prefix=prefix, endpoint_url=gcs_endpoint)
    except EdgeGatewayError as exc:
        raise fail(str(exc), code=2) from None
    if azure_endpoint or gcs_endpoint:
        raise fail("--azure-endpoint needs --azure-container, --gcs-endpoint --gcs-bucket", code=2)
    return None


async def _open_cloud(config: AzureConfig | GcsConfig) -> Bucket:
    from edge_gateway.bucket import open_cloud_bucket

    bucket = await open_cloud_bucket(config)
    try:
        await bucket.check_exists()
    except BaseException:
        await bucket.aclose()
        raise
    return bucket


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
            raise fail(
                "give --config, --bucket-dir, --s3-bucket, --azure-container or --gcs-bucket",
                code=2,
            )
        return await open_bucket(bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style)
    if bucket_dir or s3_bucket:
        raise fail("give --config or bucket options, not both", code=2)
    from edge_gateway.config import load_config

    try:
        cfg = load_config(config)
    except EdgeGatewayError as exc:
        raise fail(str(exc), code=2) from None
    if cfg.bucket.type != "local":
        from edge_gateway.bucket import open_cloud_bucket

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
