"""Finding the running gateway's API from CLI options: --url, or --config (its data dir)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from edge_gateway.client import Client, read_addr_file
from edge_gateway.errors import EdgeGatewayError
from edgegw_cli._common import fail

CONFIG_OPTION = typer.Option(
    None, "--config", "-c", help="The gateway's config file (finds its address and token)."
)
URL_OPTION = typer.Option(None, "--url", help="The gateway's API, e.g. http://127.0.0.1:8470.")
TOKEN_OPTION = typer.Option(
    None, "--token", envvar="EDGEGW_API_TOKEN", help="Bearer token (or EDGEGW_API_TOKEN)."
)


def connect(config: Path | None, url: str | None, token: str | None) -> Client:
    """A client of the gateway the options name (default: ./edgegw.toml, else port 8470)."""
    from edge_gateway.config import DEFAULT_PORT, load_config

    try:
        if url is None:
            path = config or (Path("edgegw.toml") if Path("edgegw.toml").exists() else None)
            if path is None:
                url = f"http://127.0.0.1:{DEFAULT_PORT}"
            else:
                cfg = load_config(path)
                token = token or cfg.api.token or None
                addr = cfg.data_dir / "api.addr"
                url = read_addr_file(cfg.data_dir) if addr.exists() else f"http://{cfg.api.listen}"
        return Client(url, token=token or os.environ.get("EDGEGW_API_TOKEN"))
    except EdgeGatewayError as exc:
        raise fail(str(exc)) from None
