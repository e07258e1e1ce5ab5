"""``edgegw serve``: run the gateway until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import trio
import typer
from rich.markup import escape

from edgegw_cli._common import err_console, fail, leaf, reason

if TYPE_CHECKING:
    from edge_gateway.config import GatewayConfig
    from edge_gateway.gateway import Gateway

log = logging.getLogger("edgegw.serve")

#: Exit codes: 0 clean shutdown, 1 a fatal error, 2 bad config, 3 fenced,
#: 4 the bucket lost this region's log (restarting cannot help: recover first).
EXIT_FATAL, EXIT_CONFIG, EXIT_FENCED, EXIT_BUCKET_LOST = 1, 2, 3, 4


def serve(
    config: Path = typer.Option(
        Path("edgegw.toml"), "--config", "-c", help="The gateway's TOML config file."
    ),
) -> None:
    """Run the gateway: journal, shipper, mirrors and the local API, until SIGTERM.

    Example: edgegw serve --config /etc/edgegw/edgegw.toml
    """
    from edge_gateway.config import load_config
    from edge_gateway.errors import BucketLost, ConfigError, EdgeGatewayError, Fenced
    from edge_gateway.logs import configure_logging

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        err_console.print(f"[red]error:[/red] {config}: {exc}")
        raise typer.Exit(EXIT_CONFIG) from None
    configure_logging(cfg.log.level, cfg.log.format)
    try:
        trio.run(_serve, cfg)
    except* BucketLost as group:
        msg = str(leaf(group))
        log.error("bucket lost: %s", msg)
        err_console.print(f"[red]bucket lost:[/red] {escape(msg)}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BUCKET_LOST) from None
    except* Fenced as group:
        msg = str(leaf(group))
        log.error("fenced: %s", msg)
        err_console.print(f"[red]fenced:[/red] {msg}")
        raise typer.Exit(EXIT_FENCED) from None
    except* ConfigError as group:
        err_console.print(f"[red]config error:[/red] {leaf(group)}")
        raise typer.Exit(EXIT_CONFIG) from None
    except* (EdgeGatewayError, OSError) as group:
        exc = leaf(group)
        assert isinstance(exc, EdgeGatewayError | OSError)
        log.error("fatal: %s", reason(exc))
        raise fail(reason(exc)) from None


async def _serve(cfg: GatewayConfig) -> None:
    from edge_gateway.api import serve_api
    from edge_gateway.gateway import Gateway

    gateway = Gateway(cfg)
    gateway.add_service("api", serve_api)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_on_signals, signals, gateway)

            async def run_gateway(*, task_status: trio.TaskStatus[None]) -> None:
                await gateway.run(task_status=task_status)
                nursery.cancel_scope.cancel()  # stopped: the signal watcher is done too

            await nursery.start(run_gateway)
            addr = gateway.api_address
            log.info(
                "serving region %s on http://%s:%s",
                cfg.region,
                *(addr if addr else ("?", "?")),
            )


async def _on_signals(signals: AsyncIterator[int], gateway: Gateway) -> None:
    async for signum in signals:
        if not gateway.shutdown_requested:
            log.info("%s: shutting down gracefully", signal.Signals(signum).name)
            gateway.request_shutdown()
        else:
            log.warning("second signal: exiting now")
            os._exit(EXIT_FATAL)
