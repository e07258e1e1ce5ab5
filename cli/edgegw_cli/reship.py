"""``edgegw reship``: re-create a region's lost log in the bucket from the journal."""

from __future__ import annotations

from pathlib import Path

import trio
import typer

from edge_gateway.bucket import Bucket
from edge_gateway.datadir import lock_directory
from edge_gateway.errors import EdgeGatewayError, InUse
from edgegw_cli._bucket import open_edgegw_bucket
from edgegw_cli._common import console, fail
from edgegw_cli._errors import leaf, reason


def reship(
    config: Path = typer.Option(
        Path("edgegw.toml"), "--config", "-c", help="The gateway's TOML config file."
    ),
    new_bucket: bool = typer.Option(
        False,
        "--new-bucket",
        help="The bucket was lost entirely: accept one that holds no edgegw data (and make a "
        "missing local directory).",
    ),
) -> None:
    """Re-create this region's log in the bucket from the journal, after the bucket lost it.

    When the gateway stops because the bucket lost the region's log (exit
    code 4: the bucket was wiped, or replaced by an older copy), this ships
    the journal again from the bucket's head, as new log entries after a new
    fence, with the same offsets. It works only while the journal still holds
    every entry after the bucket's head (shipped segments are kept for
    journal.retention_ms); otherwise it refuses, and `edgegw restore` is the
    way out. The gateway must not be running. Then start it as usual.

    Example: edgegw reship --config /etc/edgegw/edgegw.toml
    """
    from edge_gateway.config import load_config
    from edge_gateway.gateway import Gateway
    from edge_gateway.shipper import Shipper
    from edgegw_cli.sync import _ship

    try:
        cfg = load_config(config)
    except EdgeGatewayError as exc:
        raise fail(str(exc), code=2) from None
    try:
        lock = lock_directory(cfg.data_dir, "reship")
    except InUse as exc:
        raise fail(f"{exc}; stop the gateway first (reship ships its journal)") from None
    except OSError as exc:
        raise fail(reason(exc)) from None
    gateway = Gateway(cfg)

    async def open_(create: bool) -> tuple[Bucket, str]:
        return await gateway.wiring.open_bucket(create=create), gateway.key_prefix

    async def run() -> tuple[Shipper, str]:
        bucket, prefix = await open_edgegw_bucket(
            open_, local=cfg.bucket.type == "local", region=cfg.region, new_bucket=new_bucket
        )
        try:
            # Every lane on disk, re-shipped in drain order from its own
            # watermark in the surviving head's lane table.
            async with gateway.wiring.open_lanes() as lanes:
                shipper = Shipper(
                    lanes.main,
                    bucket,
                    cfg.region,
                    prefix=prefix,
                    config=cfg.shipper,
                    reship=True,
                    lanes=lanes if lanes.multi else None,
                )
                await _ship(shipper)
                await lanes.flush()
        finally:
            await bucket.aclose()
        return shipper, bucket.describe()

    try:
        shipper, where = trio.run(run)
    except* (EdgeGatewayError, OSError) as group:
        exc = leaf(group)
        assert isinstance(exc, EdgeGatewayError | OSError)
        raise fail(reason(exc)) from None
    finally:
        lock.release()
    st = shipper.statistics()
    if shipper.recreated_from_lsn is None:
        console.print(
            f"the log of {cfg.region} in {where} was not lost: shipped what was pending; "
            f"head seq {st.next_seq - 1}"
        )
    else:
        console.print(
            f"re-created the log of {cfg.region} in {where} from the journal (LSNs "
            f"{shipper.recreated_from_lsn}-{st.shipped_lsn}): head seq {st.next_seq - 1}. "
            "Start the gateway as usual."
        )
