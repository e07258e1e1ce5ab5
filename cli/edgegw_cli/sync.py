"""``edgegw sync``: ship everything pending to the bucket, then exit."""

from __future__ import annotations

from pathlib import Path

import trio
import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from edge_gateway.bucket import Bucket, LocalBucket, S3Bucket, S3Config
from edge_gateway.errors import EdgeGatewayError
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.shipper import Shipper, ShipperConfig
from edgegw_cli._common import console, fail, reason


async def open_bucket(
    bucket_dir: Path | None,
    s3_bucket: str | None,
    s3_endpoint: str | None,
    s3_prefix: str,
    s3_path_style: bool,
) -> tuple[Bucket, str]:
    """The bucket the options name, and the key prefix to use in it."""
    if s3_bucket:
        cfg = S3Config(
            bucket=s3_bucket, endpoint_url=s3_endpoint, path_style=s3_path_style, prefix=s3_prefix
        )
        return await S3Bucket.open(cfg), ""
    if bucket_dir is None:
        raise typer.BadParameter("give --bucket-dir or --s3-bucket")
    return await LocalBucket.open(bucket_dir), ""


def sync(
    data_dir: Path = typer.Option(..., help="The gateway's data directory (holds journal/)."),
    region: str = typer.Option(..., help="This site's region name."),
    bucket_dir: Path | None = typer.Option(None, help="A local-directory bucket."),
    s3_bucket: str | None = typer.Option(None, help="An S3 bucket name."),
    s3_endpoint: str | None = typer.Option(None, help="S3 endpoint URL (MinIO, R2, ...)."),
    s3_prefix: str = typer.Option("", help="Key prefix inside the bucket."),
    s3_path_style: bool = typer.Option(False, help="Path-style S3 addressing."),
    flush_bytes: int = typer.Option(8 * 1024 * 1024, help="Largest object to build."),
) -> None:
    """Ship everything the journal holds that the bucket does not, then exit.

    For sites that connect now and then: run it when the link is up.
    Exit code 0 when everything is shipped; non-zero with a one-line reason.

    Example: edgegw sync --data-dir /var/lib/edgegw --region north --bucket-dir /mnt/shared
    """

    async def run() -> tuple[int, int, int]:
        bucket, prefix = await open_bucket(
            bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style
        )
        journal = await trio.to_thread.run_sync(
            Journal.open_sync, data_dir / "journal", JournalConfig()
        )
        try:
            shipper = Shipper(
                journal,
                bucket,
                region,
                prefix=prefix,
                config=ShipperConfig(max_object_bytes=flush_bytes),
            )
            await shipper.claim()
            first = shipper.shipped_lsn
            target = journal.next_lsn - 1
            with Progress(
                TextColumn("[bold]shipping[/]"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} entries"),
                TextColumn("{task.fields[objects]} objects, {task.fields[mb]:.1f} MB"),
                TimeRemainingColumn(),
                console=console,
                transient=False,
            ) as progress:
                task = progress.add_task("ship", total=max(target - first, 0), objects=0, mb=0.0)

                def update(shipped: int, _target: int) -> None:
                    st = shipper.statistics()
                    progress.update(
                        task,
                        completed=shipped - first,
                        objects=st.objects,
                        mb=st.wire_bytes / 1e6,
                    )

                await shipper.ship_pending(update)
                update(shipper.shipped_lsn, target)
            st = shipper.statistics()
            return st.objects, st.records, st.wire_bytes
        finally:
            journal.close_sync()
            await bucket.aclose()

    try:
        objects, records, wire = trio.run(run)
    except (EdgeGatewayError, OSError) as exc:
        raise fail(reason(exc)) from None
    console.print(
        f"shipped {records:,} records in {objects} objects ({wire / 1e6:.2f} MB on the wire)"
    )
