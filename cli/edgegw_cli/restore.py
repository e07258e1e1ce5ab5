"""``edgegw restore``: start a gateway's journal from what the bucket holds."""

from __future__ import annotations

import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
import typer
from rich.table import Table

from edge_gateway.bucket import Bucket
from edge_gateway.bucket_log import LogState, load_log_state
from edge_gateway.datadir import lock_directory
from edge_gateway.errors import EdgeGatewayError, InUse
from edge_gateway.format.entry import Checkpoint
from edge_gateway.journal import MAIN_LANE, Journal, JournalConfig, lane_path, lanes_on_disk
from edge_gateway.names import validate_region
from edgegw_cli._bucket import open_bucket, open_edgegw_bucket
from edgegw_cli._common import console, fail
from edgegw_cli._errors import reason


def restore(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="The gateway's config file (region, data dir, bucket)."
    ),
    data_dir: Path | None = typer.Option(
        None, help="Without --config: the gateway's data directory (holds journal/)."
    ),
    region: str | None = typer.Option(None, help="Without --config: this site's region name."),
    bucket_dir: Path | None = typer.Option(None, help="A local-directory bucket."),
    s3_bucket: str | None = typer.Option(None, help="An S3 bucket name."),
    s3_endpoint: str | None = typer.Option(None, help="S3 endpoint URL."),
    s3_prefix: str = typer.Option("", help="Key prefix inside the bucket."),
    s3_path_style: bool = typer.Option(False, help="Path-style S3 addressing."),
    new_bucket: bool = typer.Option(
        False,
        "--new-bucket",
        help="Accept a bucket, or a region, that holds no edgegw data yet: the journal "
        "then starts at offset 0. Without it both are refused as a likely typo.",
    ),
    yes: bool = typer.Option(False, "--yes", help="Move an existing journal aside without asking."),
) -> None:
    """Rebuild the journal's starting point from the region's log in the bucket.

    For a replaced or wiped machine, or a gateway that was fenced while it held
    unshipped data: an existing journal is moved aside (journal.aside-<time>),
    a new one starts at the log's last LSN + 1 with every partition's next
    offset, so offsets continue without reuse. It restores offsets, not
    records: old records stay in the bucket (mirrors and the pipeline read
    them there); the local journal starts empty.

    The bucket must be an edgegw bucket and hold a log of the region: a typo
    would otherwise restart the region's offsets at 0, the reuse restore
    exists to prevent. --new-bucket accepts an empty bucket or region.

    Example: edgegw restore --config /etc/edgegw/edgegw.toml
    """
    from edge_gateway.config import load_config
    from edge_gateway.gateway import Gateway

    bucket_options = bucket_dir is not None or bool(s3_bucket)
    if config is not None:
        if data_dir is not None or region is not None or bucket_options:
            raise fail(
                "with --config, the data dir, region and bucket come from the config file; "
                "drop --data-dir, --region and the bucket options",
                code=2,
            )
        try:
            cfg = load_config(config)
        except EdgeGatewayError as exc:
            raise fail(str(exc), code=2) from None
        gateway = Gateway(cfg)
        the_region, journal_dir, jcfg = cfg.region, cfg.journal_path, cfg.journal
        local = cfg.bucket.type == "local"

        async def open_(create: bool) -> tuple[Bucket, str]:
            return await gateway.wiring.open_bucket(create=create), gateway.key_prefix

    elif data_dir is not None and region is not None and bucket_options:
        try:
            the_region = validate_region(region)
        except EdgeGatewayError as exc:
            raise fail(reason(exc)) from None
        journal_dir, jcfg, local = data_dir / "journal", JournalConfig(), not s3_bucket

        async def open_(create: bool) -> tuple[Bucket, str]:
            return await open_bucket(
                bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style, create=create
            )

    else:
        raise fail(
            "give --config, or --data-dir and --region with --bucket-dir or --s3-bucket", code=2
        )

    async def read_log() -> LogState:
        bucket, prefix = await open_edgegw_bucket(
            open_, local=local, region=the_region, new_bucket=new_bucket
        )
        try:
            state = await load_log_state(bucket, prefix, the_region)
        finally:
            await bucket.aclose()
        if state.head == 0 and not new_bucket:
            raise fail(
                f"region {the_region!r} has no log in {bucket.describe()}: there is nothing to "
                "restore (a typo in the region, bucket or prefix?). A region that never "
                "shipped needs no restore: start the gateway on an empty data dir. Or pass "
                "--new-bucket to start its journal at offset 0 anyway"
            )
        return state

    # One process per data directory: the gateway must be stopped first.
    try:
        lock = lock_directory(journal_dir.parent if config is None else cfg.data_dir, "restore")
    except InUse as exc:
        raise fail(f"{exc}; stop the gateway first (restore replaces its journal)") from None
    except OSError as exc:
        raise fail(reason(exc)) from None
    try:
        _restore(read_log, journal_dir, jcfg, the_region, yes=yes)
    finally:
        lock.release()


def _restore(
    read_log: Callable[[], Awaitable[LogState]],
    journal_dir: Path,
    jcfg: JournalConfig,
    the_region: str,
    *,
    yes: bool,
) -> None:
    # Everything is checked before the journal is touched: a refused restore
    # leaves the data directory as it was.
    try:
        state = trio.run(read_log)
    except (EdgeGatewayError, OSError) as exc:
        raise fail(reason(exc)) from None
    # The journals of every lane (docs/journal.md, "Lanes"): the lanes other
    # than the normal one start again from the log's head when the gateway claims.
    others = [
        lane_path(journal_dir, lane) for lane in sorted(lanes_on_disk(journal_dir) - {MAIN_LANE})
    ]
    old = [d for d in (journal_dir, *others) if d.exists() and any(d.iterdir())]
    if old:
        names = ", ".join(str(d) for d in old)
        if not yes and not typer.confirm(
            f"{names} exist; unshipped records in them will not be shipped. Move them aside?"
        ):
            raise typer.Exit(1)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for d in old:
            aside = d.parent / f"{d.name}.aside-{stamp}"
            shutil.move(d, aside)
            console.print(f"moved the old journal {d.name} to {aside}")
    start_lsn = state.head_last_lsn + 1
    try:
        j = Journal.open_sync(
            journal_dir, jcfg, start=Checkpoint(dict(state.next_offsets), {}), start_lsn=start_lsn
        )
        j.close_sync()
    except (EdgeGatewayError, OSError) as exc:
        raise fail(reason(exc)) from None
    table = Table(
        title=(
            f"restored {the_region}: log head seq {state.head} (epoch {state.head_epoch}), "
            f"journal starts at LSN {start_lsn}"
        )
    )
    table.add_column("topic")
    table.add_column("partition", justify="right")
    table.add_column("next offset", justify="right")
    for (topic, partition), nxt in sorted(state.next_offsets.items()):
        table.add_row(topic, str(partition), f"{nxt:,}")
    console.print(table)
    console.print(
        "offsets continue from the bucket; old records stay there (the journal starts empty)"
    )
