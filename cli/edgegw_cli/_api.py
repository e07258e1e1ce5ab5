"""Finding the running gateway's API from CLI options: --url, or --config (its data dir).

The client (httpx) is imported when a command connects, not when the CLI
starts: ``edgegw --help`` and the other commands do not pay for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from edgegw_cli._common import fail, note

if TYPE_CHECKING:
    from edge_gateway.client import Client

CONFIG_OPTION = typer.Option(
    None, "--config", "-c", help="The gateway's config file (finds its address and token)."
)
URL_OPTION = typer.Option(None, "--url", help="The gateway's API, e.g. http://127.0.0.1:8470.")
TOKEN_OPTION = typer.Option(
    None, "--token", envvar="EDGEGW_API_TOKEN", help="Bearer token (or EDGEGW_API_TOKEN)."
)

#: The config file used when neither --url nor --config is given.
DEFAULT_CONFIG = Path("edgegw.toml")


def connect(config: Path | None, url: str | None, token: str | None) -> Client:
    """A client of the gateway the options name (default: ./edgegw.toml, else port 8470).

    Says on stderr which gateway that is and why, so a command run in the
    wrong folder does not silently talk to another gateway.
    """
    from edge_gateway.client import Client, read_addr_file
    from edge_gateway.config import DEFAULT_PORT, load_config
    from edge_gateway.errors import EdgeGatewayError, InvalidInput

    try:
        if url is not None:
            how = "--url"
        else:
            path = config or (DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None)
            if path is None:
                url = f"http://127.0.0.1:{DEFAULT_PORT}"
                how = "the default address: no --url, no --config and no ./edgegw.toml"
            else:
                cfg = load_config(path)
                token = token or cfg.api.token or None
                addr = cfg.data_dir / "api.addr"
                url = read_addr_file(cfg.data_dir) if addr.exists() else f"http://{cfg.api.listen}"
                how = f"the gateway of {path}"
                if config is None:
                    how += " in this folder (no --url or --config given)"
        client = Client(url, token=token or os.environ.get("EDGEGW_API_TOKEN"))
    except InvalidInput as exc:  # the config file, or --url
        raise fail(str(exc), 2) from None
    except EdgeGatewayError as exc:  # no api.addr: the gateway is not running
        raise fail(str(exc)) from None
    note(f"gateway {url} ({how})")
    return client


def check_name(validate: Callable[[object], str], name: str) -> str:
    """``validate(name)``, or exit 2 with its one-line reason (before any request)."""
    from edge_gateway.errors import InvalidInput

    try:
        return validate(name)
    except InvalidInput as exc:
        raise fail(str(exc), 2) from None
