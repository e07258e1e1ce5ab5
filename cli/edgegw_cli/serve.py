"""``edgegw serve``: run the gateway until SIGTERM/SIGINT (the work is in :mod:`._serve_run`)."""

from __future__ import annotations

from pathlib import Path

import typer

from edgegw_cli._common import fail
from edgegw_cli._serve_run import (
    EXIT_BUCKET_LOST,
    EXIT_CONFIG,
    EXIT_FATAL,
    EXIT_FENCED,
    ServeFailed,
    run_serve,
)

__all__ = ["EXIT_BUCKET_LOST", "EXIT_CONFIG", "EXIT_FATAL", "EXIT_FENCED", "serve"]


def serve(
    config: Path = typer.Option(
        Path("edgegw.toml"), "--config", "-c", help="The gateway's TOML config file."
    ),
) -> None:
    """Run the gateway: journal, shipper, mirrors and the local API, until SIGTERM.

    Example: edgegw serve --config /etc/edgegw/edgegw.toml
    """
    try:
        run_serve(config)
    except ServeFailed as exc:
        raise fail(exc.message, exc.code) from None
