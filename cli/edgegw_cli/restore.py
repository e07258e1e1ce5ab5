"""``edgegw restore``: start a gateway's journal from what the bucket holds."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import trio
import typer
from rich.table import Table

from edge_gateway.datadir import lock_directory
from edge_gateway.errors import EdgeGatewayError, InUse
from edge_gateway.format.entry import Checkpoint
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.names import validate_region
from edge_gateway.regionlog import load_log_state
from edgegw_cli._common import console, fail, reason
from edgegw_cli.sync import open_bucket


def restore(
    data_dir: Path = typer.Option(..., help="The gateway's data directory (holds journal/)."),
    region: str = typer.Option(..., help="This site's region name."),
    bucket_dir: Path | None = typer.Option(None, help="A local-directory bucket."),
    s3_bucket: str | None = typer.Option(None, help="An S3 bucket name."),
    s3_endpoint: str | None = typer.Option(None, help="S3 endpoint URL."),
    s3_prefix: str = typer.Option("", help="Key prefix inside the bucket."),
    s3_path_style: bool = typer.Option(False, help="Path-style S3 addressing."),
    yes: bool = typer.Option(False, "--yes", help="Move an existing journal aside without asking."),
) -> None:
    """Rebuild the journal's starting point from the region's log in the bucket.

    For a replaced or wiped machine, or a gateway that was fenced while it held
    unshipped data: an existing journal is moved aside (journal.aside-<time>),
    a new one starts at the log's last LSN + 1 with every partition's next
    offset, so offsets continue without reuse.

    Example: edgegw restore --data-dir /var/lib/edgegw --region north --bucket-dir /mnt/shared
    """
    try:
        validate_region(region)
        lock = lock_directory(data_dir, "restore")
    except InUse as exc:
        raise fail(f"{exc}; stop the gateway first (restore replaces its journal)") from None
    except (EdgeGatewayError, OSError) as exc:
        raise fail(reason(exc)) from None
    try:
        _restore(
            data_dir, region, bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style, yes=yes
        )
    finally:
        lock.release()


def _restore(
    data_dir: Path,
    region: str,
    bucket_dir: Path | None,
    s3_bucket: str | None,
    s3_endpoint: str | None,
    s3_prefix: str,
    s3_path_style: bool,
    *,
    yes: bool,
) -> None:
    journal_dir = data_dir / "journal"
    if journal_dir.exists() and any(journal_dir.iterdir()):
        if not yes and not typer.confirm(
            f"{journal_dir} exists; unshipped records in it will not be shipped. Move it aside?"
        ):
            raise typer.Exit(1)
        aside = data_dir / f"journal.aside-{time.strftime('%Y%m%dT%H%M%S')}"
        shutil.move(journal_dir, aside)
        console.print(f"moved the old journal to {aside}")

    async def run() -> tuple[int, int, int, dict[tuple[str, int], int]]:
        bucket, prefix = await open_bucket(
            bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style
        )
        try:
            state = await load_log_state(bucket, prefix, region)
        finally:
            await bucket.aclose()
        start_lsn = state.head_last_lsn + 1
        j = Journal.open_sync(
            journal_dir,
            JournalConfig(),
            start=Checkpoint(dict(state.next_offsets), {}),
            start_lsn=start_lsn,
        )
        j.close_sync()
        return state.head, state.head_epoch, start_lsn, state.next_offsets

    try:
        head, epoch, start_lsn, offsets = trio.run(run)
    except (EdgeGatewayError, OSError) as exc:
        raise fail(reason(exc)) from None
    table = Table(
        title=(
            f"restored {region}: log head seq {head} (epoch {epoch}), "
            f"journal starts at LSN {start_lsn}"
        )
    )
    table.add_column("topic")
    table.add_column("partition", justify="right")
    table.add_column("next offset", justify="right")
    for (topic, partition), nxt in sorted(offsets.items()):
        table.add_row(topic, str(partition), f"{nxt:,}")
    console.print(table)
