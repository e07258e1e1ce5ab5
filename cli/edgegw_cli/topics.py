"""``edgegw topics list|describe``: the gateway's topics."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from edge_gateway.errors import EdgeGatewayError
from edgegw_cli._api import CONFIG_OPTION, TOKEN_OPTION, URL_OPTION, connect
from edgegw_cli._common import console, fail

app = typer.Typer(help="Topics of the running gateway.", no_args_is_help=True)


@app.command("list")
def list_topics(
    config: Path | None = CONFIG_OPTION,
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
) -> None:
    """Every topic: local ones (writable here) and mirrors of other regions' topics.

    Example: edgegw topics list --config edgegw.toml
    """
    with connect(config, url, token) as client:
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
) -> None:
    """Per partition: first and next offset, and (local topics) what is not shipped yet.

    Example: edgegw topics describe telemetry
    """
    with connect(config, url, token) as client:
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
