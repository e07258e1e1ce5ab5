"""``edgegw topics``: the fleet's topics on the metadata server, and one gateway's topics.

``create``, ``alter`` and ``delete`` change the routing table on the metadata
server (``--metadata URL --token T``, or ``EDGEGW_METADATA_URL`` /
``EDGEGW_METADATA_TOKEN``; see :mod:`edgegw_cli.meta`). ``list`` and
``describe`` show the fleet's routing with ``--metadata`` (or
``EDGEGW_METADATA_URL``), else what one running gateway holds (its offsets,
what is not shipped yet).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from edge_gateway.errors import EdgeGatewayError
from edge_gateway.names import validate_topic
from edgegw_cli._api import (
    CA_FILE_OPTION,
    CLIENT_CERT_OPTION,
    CLIENT_KEY_OPTION,
    CONFIG_OPTION,
    TOKEN_OPTION,
    URL_OPTION,
    TlsOptions,
    check_name,
    connect,
)
from edgegw_cli._common import console, fail
from edgegw_cli.meta import topics_alter, topics_create, topics_delete, topics_describe, topics_list

app = typer.Typer(
    help="Topics: the fleet's routing on the metadata server, or a running gateway's topics.",
    no_args_is_help=True,
)
app.command("create")(topics_create)
app.command("alter")(topics_alter)
app.command("delete")(topics_delete)

FLEET_OPTION = typer.Option(
    None,
    "--metadata",
    envvar="EDGEGW_METADATA_URL",
    help="Show the fleet's routing from this metadata server (or EDGEGW_METADATA_URL) "
    "instead of the gateway's topics.",
)
FLEET_TOKEN_OPTION = typer.Option(
    None,
    "--metadata-token",
    envvar="EDGEGW_METADATA_TOKEN",
    help="Bearer token for --metadata (or EDGEGW_METADATA_TOKEN).",
)


@app.command("list")
def list_topics(
    config: Path | None = CONFIG_OPTION,
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    ca_file: Path | None = CA_FILE_OPTION,
    client_cert: Path | None = CLIENT_CERT_OPTION,
    client_key: Path | None = CLIENT_KEY_OPTION,
    metadata: str | None = FLEET_OPTION,
    metadata_token: str | None = FLEET_TOKEN_OPTION,
    as_json: bool = typer.Option(False, "--json", help="With --metadata: print JSON."),
) -> None:
    """Every topic: local ones (writable here) and mirrors of other regions' topics.

    With --metadata: every topic of the fleet, with its home and subscribers.

    Example: edgegw topics list --config edgegw.toml
    """
    if metadata:
        topics_list(metadata, metadata_token, as_json)
        return
    with connect(config, url, token, TlsOptions(ca_file, client_cert, client_key)) as client:
        try:
            topics = client.topics()
        except EdgeGatewayError as exc:
            raise fail(str(exc)) from None
    table = Table(title="topics")
    for col in ("topic", "kind", "home", "partitions", "records", "unshipped", "subscribers"):
        table.add_column(col)
    for t in topics:
        parts = t["partitions"]
        table.add_row(
            t["name"],
            t["kind"],
            t["home"],
            str(len(parts)),
            f"{sum(p['next_offset'] - p['first_offset'] for p in parts):,}",
            str(sum(p.get("unshipped", 0) for p in parts)) if t["kind"] == "local" else "-",
            ", ".join(t["subscribers"]) or "-",
        )
    console.print(table)


@app.command("describe")
def describe(
    topic: str = typer.Argument(..., help="Topic name."),
    config: Path | None = CONFIG_OPTION,
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    ca_file: Path | None = CA_FILE_OPTION,
    client_cert: Path | None = CLIENT_CERT_OPTION,
    client_key: Path | None = CLIENT_KEY_OPTION,
    metadata: str | None = FLEET_OPTION,
    metadata_token: str | None = FLEET_TOKEN_OPTION,
) -> None:
    """Per partition: first and next offset, and (local topics) what is not shipped yet.

    With --metadata: the topic's routing (home, partitions, retention, subscribers).

    Example: edgegw topics describe telemetry
    """
    if metadata:
        topics_describe(topic, metadata, metadata_token)
        return
    check_name(validate_topic, topic)
    with connect(config, url, token, TlsOptions(ca_file, client_cert, client_key)) as client:
        try:
            t = client.topic(topic)
        except EdgeGatewayError as exc:
            raise fail(str(exc)) from None
    title = f"{t['name']} ({t['kind']}, home {t['home']})"
    if t["kind"] == "mirror":
        title += f", mirror of {t['source_topic']}"
    table = Table(title=title)
    for col in ("partition", "first offset", "next offset", "unshipped"):
        table.add_column(col, justify="right")
    for p in t["partitions"]:
        table.add_row(
            str(p["partition"]),
            str(p["first_offset"]),
            str(p["next_offset"]),
            str(p.get("unshipped", "-")),
        )
    console.print(table)
