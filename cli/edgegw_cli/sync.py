"""``edgegw sync``: ship everything pending to the bucket, then exit."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from edge_gateway.bucket import Bucket
from edge_gateway.datadir import lock_directory
from edge_gateway.errors import EdgeGatewayError, InUse
from edge_gateway.mirror import CatchUpResult, Tailer
from edge_gateway.shipper import Shipper, ShipperConfig
from edgegw_cli._api import (
    CA_FILE_OPTION,
    CLIENT_CERT_OPTION,
    CLIENT_KEY_OPTION,
    TlsOptions,
    verify_for,
)
from edgegw_cli._bucket import open_bucket, open_edgegw_bucket
from edgegw_cli._common import console, err_console, fail
from edgegw_cli._errors import leaf, reason

if TYPE_CHECKING:
    from edge_gateway.config import GatewayConfig

__all__ = ["open_bucket", "sync"]


def sync(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="The gateway's config file (the usual way)."
    ),
    data_dir: Path | None = typer.Option(
        None, help="Without --config: the data directory (holds journal/)."
    ),
    region: str | None = typer.Option(None, help="Without --config: this site's region."),
    bucket_dir: Path | None = typer.Option(None, help="A local-directory bucket."),
    s3_bucket: str | None = typer.Option(None, help="An S3 bucket name."),
    s3_endpoint: str | None = typer.Option(None, help="S3 endpoint URL (MinIO, R2, ...)."),
    s3_prefix: str = typer.Option("", help="Key prefix inside the bucket."),
    s3_path_style: bool = typer.Option(False, help="Path-style S3 addressing."),
    flush_bytes: int | None = typer.Option(
        None,
        help="Largest object to build (default: the shipper's max_object_bytes, "
        "and backlog_object_bytes behind a full object).",
    ),
    ship_only: bool = typer.Option(False, help="Ship, but do not pull the mirrored sources."),
    new_bucket: bool = typer.Option(
        False,
        "--new-bucket",
        help="Accept a bucket that holds no edgegw data yet (and make a missing local "
        "directory); without it such a bucket is refused as a likely typo.",
    ),
    ca_file: Path | None = CA_FILE_OPTION,
    client_cert: Path | None = CLIENT_CERT_OPTION,
    client_key: Path | None = CLIENT_KEY_OPTION,
) -> None:
    """Ship everything pending, pull every subscribed source up to its head, then exit.

    For sites that connect now and then: run it when the link comes up. When
    the gateway is running on the data directory, sync asks it (through its
    local API) to ship and pull now, and shows the same progress; otherwise
    it opens the journal itself. With --config, the sources to pull come
    from the topology; with --data-dir/--region and a bucket option, it only
    ships. A bucket that holds no edgegw data is refused (a typo would start
    the region's log anew) unless --new-bucket. Exit code 0 when done;
    non-zero with a one-line reason.

    Example: edgegw sync --config /etc/edgegw/edgegw.toml
    """
    from edge_gateway.config import GatewayConfig, load_config
    from edge_gateway.gateway import Gateway

    if config is not None:
        try:
            cfg = load_config(config)
        except EdgeGatewayError as exc:
            raise fail(str(exc), code=2) from None
    elif data_dir is not None and region is not None:
        try:
            cfg = GatewayConfig(region=region, data_dir=data_dir)
        except EdgeGatewayError as exc:
            raise fail(str(exc), code=2) from None
    else:
        raise fail("give --config, or --data-dir and --region with a bucket option", code=2)
    try:
        lock = lock_directory(cfg.data_dir, "sync")
    except InUse as exc:
        if exc.holder is not None and exc.holder.role == "gateway":
            if flush_bytes is not None:
                err_console.print("note: --flush-bytes is ignored: the gateway ships as configured")
            _sync_through_gateway(
                cfg,
                exc,
                pull=config is not None and not ship_only,
                tls=TlsOptions(ca_file, client_cert, client_key),
            )
            return
        raise fail(f"{exc}; wait for it to finish, then run sync again") from None
    except (EdgeGatewayError, OSError) as exc:
        raise fail(reason(exc)) from None
    gateway = Gateway(cfg)

    async def open_(create: bool) -> tuple[Bucket, str]:
        if config is None:
            return await open_bucket(
                bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style, create=create
            )
        return await gateway.wiring.open_bucket(create=create), gateway.key_prefix

    local = cfg.bucket.type == "local" if config is not None else not s3_bucket

    async def run() -> None:
        bucket, prefix = await open_edgegw_bucket(
            open_, local=local, region=cfg.region, new_bucket=new_bucket
        )
        try:
            # Every lane (topic priority) on disk, shipped in drain order by
            # the gateway's own shipper, with the same per-lane watermarks.
            async with gateway.wiring.open_lanes() as lanes:
                shipper = Shipper(
                    lanes.main,
                    bucket,
                    cfg.region,
                    prefix=prefix,
                    config=ShipperConfig()
                    if flush_bytes is None
                    else ShipperConfig(
                        max_object_bytes=flush_bytes, backlog_object_bytes=flush_bytes
                    ),
                    lanes=lanes if lanes.multi else None,
                )
                await _ship(shipper)
                if config is not None and not ship_only:
                    await _pull(gateway.wiring.tailers(lanes.main, bucket))
                await lanes.flush()
        finally:
            await bucket.aclose()

    try:
        trio.run(run)
    except* (EdgeGatewayError, OSError) as group:
        exc = leaf(group)
        assert isinstance(exc, EdgeGatewayError | OSError)
        raise fail(reason(exc)) from None
    finally:
        lock.release()


def _sync_through_gateway(cfg: GatewayConfig, busy: InUse, *, pull: bool, tls: TlsOptions) -> None:
    """``edgegw sync`` while the gateway runs: ask it, through its local API."""
    from edge_gateway.client import read_addr_file

    try:
        url = read_addr_file(cfg.data_dir)
    except EdgeGatewayError as exc:
        raise fail(
            f"{busy}, but its API address is unknown ({exc}); is it still starting?"
        ) from None
    token = cfg.api.token or os.environ.get("EDGEGW_API_TOKEN") or None
    try:
        verify = verify_for(url, cfg, tls)
    except EdgeGatewayError as exc:
        raise fail(str(exc), 2) from None
    err_console.print(f"the gateway is running ({busy.holder_text}): asking it at {url}")
    try:
        trio.run(_ask_gateway, url, token, pull, verify)
    except* (EdgeGatewayError, OSError) as group:
        exc = leaf(group)
        assert isinstance(exc, EdgeGatewayError | OSError)
        raise fail(reason(exc)) from None


async def _ask_gateway(
    url: str, token: str | None, pull: bool, verify: ssl.SSLContext | None
) -> None:
    from edge_gateway.client import AsyncClient

    tls = verify if verify is not None else True
    async with (
        AsyncClient(url, token=token, verify=tls) as client,
        AsyncClient(url, token=token, verify=tls) as watch,
    ):
        st = await watch.status()
        # Entries over every lane (LSNs are per lane); a gateway without a
        # ``lanes`` block (an older one) has the normal lane only.
        first = _lane_sum(st, "shipped_lsn", st["shipper"]["shipped_lsn"])
        target = _lane_sum(st, "next_lsn", st["journal"]["next_lsn"]) - _lane_count(st)
        # The bar counts what this sync ships, as the summary does, not every
        # object since the gateway started.
        objects0, wire0 = st["shipper"]["objects"], st["shipper"]["wire_bytes"]
        result: dict[str, Any] = {}
        with _progress("syncing") as progress:
            ship = progress.add_task(
                f"ship {st['region']}", total=max(target - first, 0), detail=""
            )
            pulls = (
                {
                    src: progress.add_task(f"pull {src}", total=None, detail="")
                    for src in st["mirrors"]
                }
                if pull
                else {}
            )

            def show(st: dict[str, Any], done: bool = False) -> None:
                s = st["shipper"]
                progress.update(
                    ship,
                    completed=min(_lane_sum(st, "shipped_lsn", s["shipped_lsn"]), target) - first,
                    detail=_shipped_detail(s["objects"] - objects0, s["wire_bytes"] - wire0),
                )
                for src, task in pulls.items():
                    m = st["mirrors"].get(src)
                    if m is None:
                        continue
                    behind = 0 if done else m["entries_behind"]
                    progress.update(
                        task,
                        completed=m["entries"],
                        total=m["entries"] + behind if m["known_head"] or done else None,
                        detail=f"{m['records']:,} records",
                    )

            async with trio.open_nursery() as nursery:

                async def ask() -> None:
                    result.update(await client.sync(pull=pull))
                    nursery.cancel_scope.cancel()

                nursery.start_soon(ask)
                while True:
                    show(await watch.status())
                    await trio.sleep(0.2)
            show(await watch.status(), done=True)
            # The last word is the gateway's count of this sync (the summary's).
            shipped = result["shipped"]
            progress.update(ship, detail=_shipped_detail(shipped["objects"], shipped["wire_bytes"]))
    console.print(
        f"shipped {shipped['records']:,} records in {shipped['objects']} objects "
        f"({shipped['wire_bytes'] / 1e6:.2f} MB on the wire)"
    )
    for src, res in sorted(result["pulled"].items()):
        console.print(
            f"pulled {res['records']:,} records in {res['entries']} entries from {src} "
            f"(next seq {res['next_seq']})"
        )


def _shipped_detail(objects: int, wire_bytes: int) -> str:
    return f"{objects} objects, {wire_bytes / 1e6:.1f} MB"


def _lane_sum(status: dict[str, Any], field: str, single: int) -> int:
    """``field`` summed over the lanes of a gateway's status (``single`` without lanes)."""
    lanes = status.get("lanes", {}).get("lanes")
    return sum(int(lane[field]) for lane in lanes) if lanes else single


def _lane_count(status: dict[str, Any]) -> int:
    return len(status.get("lanes", {}).get("lanes") or [None])


def _progress(label: str) -> Progress:
    return Progress(
        TextColumn(f"[bold]{label:<8}[/]"),
        TextColumn("{task.description:<10}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} entries"),
        TextColumn("{task.fields[detail]}"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


async def _ship(shipper: Shipper) -> None:
    """Claim the region's log and ship every lane's pending entries (in drain order)."""
    await shipper.claim()
    # Progress counts entries over every lane: LSNs are per lane, so the sums.
    first = sum(shipper.shipped_lsns().values())
    target = sum(lane.next_lsn - 1 for lane in shipper.statistics().lanes)
    with _progress("shipping") as progress:
        task = progress.add_task(shipper.region, total=max(target - first, 0), detail="")

        def update(shipped: int, _target: int) -> None:
            st = shipper.statistics()
            progress.update(
                task,
                completed=shipped - first,
                detail=_shipped_detail(st.objects, st.wire_bytes),
            )

        # The bucket away mid-way ends the sync at the first failed attempt,
        # as it does at the start (and as a sync through the gateway does),
        # instead of retrying for as long as the outage lasts.
        failures = shipper.failed_attempts
        async with trio.open_nursery() as nursery:

            async def give_up_on_outage() -> None:
                await shipper.wait_failed_attempt(failures)
                raise shipper.cannot_ship()

            nursery.start_soon(give_up_on_outage)
            await shipper.ship_pending(update)
            nursery.cancel_scope.cancel()
        update(sum(shipper.shipped_lsns().values()), target)
    st = shipper.statistics()
    console.print(
        f"shipped {st.records:,} records in {st.objects} objects "
        f"({st.wire_bytes / 1e6:.2f} MB on the wire)"
    )
    if len(st.lanes) > 1:
        console.print(
            "lanes shipped through LSN: "
            + ", ".join(f"{lane.lane} {lane.shipped_lsn}" for lane in st.lanes)
        )


async def _pull(tailers: dict[str, Tailer]) -> None:
    if not tailers:
        return
    with _progress("pulling") as progress:
        tasks = {src: progress.add_task(src, total=None, detail="") for src in tailers}
        results: dict[str, CatchUpResult] = {}

        async def one(src: str, tailer: Tailer) -> None:
            results[src] = await tailer.catch_up()

        async def watch() -> None:
            while True:
                for src, tailer in tailers.items():
                    st = tailer.statistics()
                    progress.update(
                        tasks[src],
                        completed=st.entries,
                        total=st.entries + st.entries_behind if st.known_head else None,
                        detail=f"{st.records:,} records",
                    )
                await trio.sleep(0.1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            async with trio.open_nursery() as pulls:
                for src, tailer in tailers.items():
                    pulls.start_soon(one, src, tailer)
            nursery.cancel_scope.cancel()
        for src, tailer in tailers.items():
            st = tailer.statistics()
            progress.update(
                tasks[src], completed=st.entries, total=st.entries, detail=f"{st.records:,} records"
            )
    for src, res in sorted(results.items()):
        console.print(
            f"pulled {res.records:,} records in {res.entries} entries from {src} "
            f"(next seq {res.next_seq})"
        )
