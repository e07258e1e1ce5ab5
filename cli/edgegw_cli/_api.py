"""Finding the running gateway's API from CLI options: --url, or --config (its data dir).

An ``https`` gateway is verified with ``--ca-file``; without it, with
``--config``, with the config's ``api.tls_ca``, else with the gateway's own
certificate (``api.tls_cert``) pinned: that exact certificate is trusted and
its names are not checked (``api.addr`` may name ``0.0.0.0``); else with the
system's CAs. ``--client-cert``/``--client-key`` answer a gateway that asks
for client certificates (``api.tls_client_ca``). See docs/security.md, "TLS".

The client (httpx) is imported when a command connects, not when the CLI
starts: ``edgegw --help`` and the other commands do not pay for it.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import typer

from edgegw_cli._common import fail, note

if TYPE_CHECKING:
    from edge_gateway.client import Client
    from edge_gateway.config import GatewayConfig

CONFIG_OPTION = typer.Option(
    None, "--config", "-c", help="The gateway's config file (finds its address and token)."
)
URL_OPTION = typer.Option(None, "--url", help="The gateway's API, e.g. http://127.0.0.1:8470.")
TOKEN_OPTION = typer.Option(
    None, "--token", envvar="EDGEGW_API_TOKEN", help="Bearer token (or EDGEGW_API_TOKEN)."
)

CA_FILE_OPTION = typer.Option(
    None,
    "--ca-file",
    envvar="EDGEGW_CA_FILE",
    help="CA bundle (PEM) to verify an https gateway with (default: with --config, its "
    "api.tls_ca or its own certificate; else the system's CAs).",
)
CLIENT_CERT_OPTION = typer.Option(
    None,
    "--client-cert",
    envvar="EDGEGW_CLIENT_CERT",
    help="Client certificate (PEM) for a gateway that requires one (api.tls_client_ca).",
)
CLIENT_KEY_OPTION = typer.Option(
    None,
    "--client-key",
    envvar="EDGEGW_CLIENT_KEY",
    help="The client certificate's key (PEM; default: in the --client-cert file).",
)


class TlsOptions(NamedTuple):
    """``--ca-file``, ``--client-cert``, ``--client-key``."""

    ca_file: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None


def verify_for(url: str, cfg: GatewayConfig | None, tls: TlsOptions) -> ssl.SSLContext | None:
    """How to verify ``url`` (None: plain http); :class:`InvalidInput` for a bad file."""
    from edge_gateway.client import tls_context

    if not url.startswith("https://"):
        return None
    cert = None
    if tls.client_cert is not None:
        cert = (tls.client_cert, tls.client_key or tls.client_cert)
    if tls.ca_file is not None:
        return tls_context(tls.ca_file, cert)
    if cfg is not None and cfg.api.tls_ca:
        return tls_context(cfg.api.tls_ca, cert)
    if cfg is not None and cfg.api.tls_cert:
        return _pinned(Path(cfg.api.tls_cert), cert)
    return tls_context(None, cert)


def _pinned(cert_file: Path, client_cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    """Trust exactly the first certificate of ``cert_file`` (the gateway's own).

    Only that one: the file may hold the chain too, and trusting an
    intermediate CA without checking names would accept any certificate it
    issued. Its names are not checked: the pin is the identity. No system CAs.
    """
    from edge_gateway.client import load_client_cert
    from edge_gateway.errors import InvalidInput

    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    try:
        text = cert_file.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise InvalidInput(f"api.tls_cert {cert_file}: cannot read it: {exc.strerror}") from None
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise InvalidInput(f"api.tls_cert {cert_file}: no PEM certificate in it")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    try:
        ctx.load_verify_locations(cadata=text[start : stop + len(end)] + "\n")
    except ssl.SSLError as exc:
        raise InvalidInput(f"api.tls_cert {cert_file}: not a PEM certificate ({exc})") from None
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    if client_cert is not None:
        load_client_cert(ctx, client_cert)
    return ctx


#: The config file used when neither --url nor --config is given.
DEFAULT_CONFIG = Path("edgegw.toml")


def connect(
    config: Path | None, url: str | None, token: str | None, tls: TlsOptions | None = None
) -> Client:
    """A client of the gateway the options name (default: ./edgegw.toml, else port 8470).

    Says on stderr which gateway that is and why, so a command run in the
    wrong folder does not silently talk to another gateway.
    """
    from edge_gateway.client import Client, read_addr_file
    from edge_gateway.config import DEFAULT_PORT, load_config
    from edge_gateway.errors import EdgeGatewayError, InvalidInput

    cfg = None
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
                url = (
                    read_addr_file(cfg.data_dir)
                    if addr.exists()
                    else f"{cfg.api.scheme}://{cfg.api.listen}"
                )
                how = f"the gateway of {path}"
                if config is None:
                    how += " in this folder (no --url or --config given)"
        verify = verify_for(url, cfg, tls or TlsOptions())
        client = Client(
            url,
            token=token or os.environ.get("EDGEGW_API_TOKEN"),
            verify=verify if verify is not None else True,
        )
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
