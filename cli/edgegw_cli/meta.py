"""``edgegw metadata serve`` (the reference metadata server) and its admin commands.

The admin commands talk to a metadata server (``--metadata URL --token T``,
or ``EDGEGW_METADATA_URL`` / ``EDGEGW_METADATA_TOKEN``): ``edgegw regions
list|add|revoke`` (:data:`regions_app`) and ``edgegw topics
create|alter|delete`` plus ``edgegw topics list|describe --metadata`` (the
topic functions here, mounted by :mod:`edgegw_cli.topics`).
"""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import Any, NoReturn

import trio
import typer
from rich.table import Table

from edge_gateway.errors import InvalidInput
from edge_gateway.metadata.routing import parse_on_full, parse_priority
from edge_gateway.names import validate_home_topic, validate_region, validate_topic
from edge_gateway.net.listen import bind_failure
from edgegw_cli._api import check_name
from edgegw_cli._common import console, fail
from edgegw_cli._errors import leaf, reason

serve_app = typer.Typer(help="The reference metadata server.", no_args_is_help=True)
regions_app = typer.Typer(
    help="Regions of the fleet and their tokens (on the metadata server).", no_args_is_help=True
)

log = logging.getLogger("edgegw.metadata")

#: Exit codes of ``metadata serve``: 0 clean stop, 1 fatal, 2 bad options or database.
EXIT_FATAL, EXIT_CONFIG = 1, 2

METADATA_OPTION = typer.Option(
    ...,
    "--metadata",
    envvar="EDGEGW_METADATA_URL",
    help="The metadata server, e.g. http://127.0.0.1:8471 (or EDGEGW_METADATA_URL).",
)
META_TOKEN_OPTION = typer.Option(
    None,
    "--token",
    envvar="EDGEGW_METADATA_TOKEN",
    help="Admin (or region) bearer token (or EDGEGW_METADATA_TOKEN).",
)


# ------------------------------------------------------------------ serve


@serve_app.command("serve")
def serve(
    db: str = typer.Option(
        "meta.sqlite",
        "--db",
        help="SQLite file (created), or a postgresql:// URL shared by several replicas.",
    ),
    listen: str = typer.Option("127.0.0.1:8471", "--listen", help="host:port (port 0: any)."),
    admin_token: str | None = typer.Option(
        None,
        "--admin-token",
        envvar="EDGEGW_METADATA_ADMIN_TOKEN",
        help="Admin bearer token (stored hashed; or EDGEGW_METADATA_ADMIN_TOKEN).",
    ),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", help="TLS certificate (PEM)."),
    tls_key: Path | None = typer.Option(None, "--tls-key", help="TLS private key (PEM)."),
    addr_file: Path | None = typer.Option(
        None, "--addr-file", help="Write the bound URL here once listening."
    ),
    max_body_bytes: int = typer.Option(64 << 10, "--max-body-bytes", help="Largest body (413)."),
    sync_interval_ms: int = typer.Option(
        1000,
        "--sync-interval-ms",
        min=10,
        max=60_000,
        help="PostgreSQL: how often a replica polls for the others' head reports and "
        "changes when no notification came first.",
    ),
    sync_notify: bool = typer.Option(
        True,
        "--sync-notify/--no-sync-notify",
        help="PostgreSQL: LISTEN for the other replicas' notifications (else poll only).",
    ),
    max_inflight: int = typer.Option(
        512, "--max-inflight", help="Requests in progress before 503 overloaded (Retry-After)."
    ),
    max_long_polls: int = typer.Option(
        50_000, "--max-long-polls", help="Held GET /v1/heads polls before 503 overloaded."
    ),
    max_verifying: int = typer.Option(
        64, "--max-verifying", help="New tokens awaiting their check before 503."
    ),
    server: str = typer.Option(
        "builtin", "--server", help="HTTP server: builtin (edgegw's own) or hypercorn."
    ),
) -> None:
    """Serve topic routing, heartbeats and the head relay until SIGTERM.

    Example: edgegw metadata serve --db meta.sqlite --listen 127.0.0.1:8471
    """
    from edge_gateway.errors import ConfigError, EdgeGatewayError
    from edge_gateway.metadata import is_postgres_url
    from edge_gateway.metadata.server import MetadataServerConfig

    try:
        config = MetadataServerConfig(
            db=db if is_postgres_url(db) else Path(db),
            listen=listen,
            admin_token=admin_token or None,
            certfile=tls_cert,
            keyfile=tls_key,
            addr_file=addr_file,
            max_body_bytes=max_body_bytes,
            sync_interval_s=sync_interval_ms / 1000,
            sync_notify=sync_notify,
            max_inflight=max_inflight,
            max_long_polls=max_long_polls,
            max_verifying=max_verifying,
            server=server,
        )
    except ConfigError as exc:
        raise fail(str(exc), EXIT_CONFIG) from None
    try:
        trio.run(_serve, config)
    except* ConfigError as group:
        raise fail(str(leaf(group)), EXIT_CONFIG) from None
    except* (EdgeGatewayError, OSError) as group:
        exc = leaf(group)
        raise fail(bind_failure(exc, "--listen", listen) or reason(exc), EXIT_FATAL) from None


@serve_app.command("migrate")
def migrate(
    source: Path = typer.Option(..., "--from", help="The SQLite database to copy (unchanged)."),
    target: str = typer.Option(
        ..., "--to", help="A new, empty database: a postgresql:// URL (or a SQLite file)."
    ),
) -> None:
    """Copy a metadata database (tokens, regions, topics, buckets, routing version).

    Stop the server first (a short stop: gateways run from their cached routing),
    then serve the target. Example:
    edgegw metadata migrate --from meta.sqlite --to postgresql://edgegw@db.example/edgegw
    """
    from edge_gateway.errors import ConfigError, Unavailable
    from edge_gateway.metadata import is_postgres_url
    from edge_gateway.metadata.migrate import migrate_database

    try:
        report = migrate_database(source, target if is_postgres_url(target) else Path(target))
    except (ConfigError, Unavailable) as exc:
        raise fail(str(exc), EXIT_CONFIG) from None
    console.print(
        f"copied {report.regions} regions, {report.topics} topics and {report.buckets} "
        f"bucket locations (routing version {report.routing_version}) "
        f"from {report.source} to {report.target}",
        highlight=False,
    )


async def _serve(config: Any) -> None:
    from edge_gateway import pygc
    from edge_gateway.metadata.server import serve_metadata

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_metadata, config)
            # What startup built (the store's tables, the routing table) lives as
            # long as the process: frozen, full collections no longer scan it; and
            # young collections 28x rarer, so far fewer objects of requests in
            # flight reach the old generation, whose full collections scan every
            # held watch (1.2-1.5 s each at 10,000 gateways: docs/metadata.md).
            pygc.settle()
            console.print(f"metadata server listening on {url}", highlight=False)
            async for signum in signals:
                log.info("%s: stopping", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


# ----------------------------------------------------------------- client


class _Admin:
    """A small synchronous client of the metadata API for the CLI."""

    def __init__(self, url: str, token: str | None) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=10.0)
        #: The server's clock (its ``Date`` header) at the last answer, ms; None: not sent.
        self.server_ms: float | None = None

    def __enter__(self) -> _Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def call(self, method: str, path: str, body: object | None = None) -> Any:
        import httpx

        try:
            r = self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            _die(f"metadata server {self.url} is unreachable: {exc}")
        if r.status_code >= 400:
            try:
                err = r.json()["error"]
                _die(f"{err['message']} ({r.status_code} {err['code']})")
            except (ValueError, KeyError, TypeError):
                _die(f"metadata server answered {r.status_code}: {r.text[:200]}")
        self.server_ms = _date_ms(r.headers.get("date"))
        return r.json() if r.content else None


def _date_ms(value: str | None) -> float | None:
    """An HTTP ``Date`` header as ms since the epoch (None when absent or unreadable)."""
    from email.utils import parsedate_to_datetime

    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp() * 1000
    except (TypeError, ValueError):
        return None


def _die(message: str) -> NoReturn:
    raise fail(message)


def _subs(value: object) -> str:
    if value == "*":
        return "* (all)"
    assert isinstance(value, list)
    return ", ".join(value) or "-"


def _parse_subscribers(text: str | None) -> list[str] | str | None:
    if text is None:
        return None
    text = text.strip()
    if text == "*":
        return "*"
    return [s.strip() for s in text.split(",") if s.strip()]


def _topic_table(topics: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    cols = ("topic", "home", "partitions", "retention_ms", "subscribers", "priority", "on_full")
    for col in cols:
        table.add_column(col, justify="right" if col in ("partitions", "retention_ms") else "left")
    for t in topics:
        retention = t["retention_ms"]
        table.add_row(
            t["name"],
            t["home"],
            str(t["partitions"]),
            "-" if retention is None else f"{retention:,}",
            _subs(t["subscribers"]),
            # absent: normal (the server writes it only otherwise; older servers never)
            t.get("priority", "normal"),
            t.get("on_full", "block"),  # likewise: absent is block
        )
    return table


# ----------------------------------------------------------------- topics


def topics_list(metadata: str, token: str | None, as_json: bool) -> None:
    """Print every topic of the fleet, with its home and subscribers (``edgegw topics list``)."""
    with _Admin(metadata, token) as m:
        doc = m.call("GET", "/v1/routing")
    if as_json:
        console.print_json(json.dumps(doc["topics"]))
        return
    console.print(_topic_table(doc["topics"], f"topics (routing version {doc['version']})"))


def topics_describe(topic: str, metadata: str, token: str | None) -> None:
    """Print one topic's routing (``edgegw topics describe --metadata``)."""
    check_name(validate_topic, topic)
    with _Admin(metadata, token) as m:
        t = m.call("GET", f"/v1/topics/{_quote(topic)}")
    console.print(_topic_table([t], t["name"]))


PRIORITY_OPTION = typer.Option(
    None,
    "--priority",
    help="critical, normal or bulk: the topic's journal lane at its home, and so the order "
    "in which backlogs ship after an outage (default normal).",
)


def _check_priority(value: str) -> str:
    try:
        return parse_priority(value)
    except InvalidInput as exc:
        _die(f"--priority: {exc}")


ON_FULL_OPTION = typer.Option(
    None,
    "--on-full",
    help="block or drop-oldest: what the topic's journal lane at its home does when its disk "
    "budget is full (refuse appends, or delete the oldest unshipped records; default block).",
)


def _check_on_full(value: str) -> str:
    try:
        return parse_on_full(value)
    except InvalidInput as exc:
        _die(f"--on-full: {exc}")


def topics_create(
    topic: str = typer.Argument(..., help="Topic name."),
    home: str = typer.Option(..., "--home", help="The region that accepts writes."),
    partitions: int = typer.Option(1, "--partitions", "-p", help="Partition count."),
    subscribers: str | None = typer.Option(
        None, "--subscribers", "-s", help="Comma-separated regions that mirror it, or '*'."
    ),
    retention_ms: int | None = typer.Option(None, "--retention-ms", help="Retention (ms)."),
    priority: str | None = PRIORITY_OPTION,
    on_full: str | None = ON_FULL_OPTION,
    metadata: str = METADATA_OPTION,
    token: str | None = META_TOKEN_OPTION,
) -> None:
    """Create a topic homed in one region.

    Example: edgegw topics create alarms --home north -p 4 -s south,east --priority critical
    """
    check_name(validate_home_topic, topic)
    check_name(validate_region, home)
    body: dict[str, Any] = {"name": topic, "home": home, "partitions": partitions}
    subs = _parse_subscribers(subscribers)
    if subs is not None:
        body["subscribers"] = subs
    if retention_ms is not None:
        body["retention_ms"] = retention_ms
    if priority is not None:
        body["priority"] = _check_priority(priority)
    if on_full is not None:
        body["on_full"] = _check_on_full(on_full)
    with _Admin(metadata, token) as m:
        t = m.call("POST", "/v1/topics", body)
    console.print(_topic_table([t], f"created {t['name']}"))


def topics_alter(
    topic: str = typer.Argument(..., help="Topic name."),
    partitions: int | None = typer.Option(None, "--partitions", "-p", help="More partitions."),
    subscribers: str | None = typer.Option(
        None, "--subscribers", "-s", help="Comma-separated regions, '*', or '' for none."
    ),
    retention_ms: int | None = typer.Option(None, "--retention-ms", help="Retention (ms)."),
    no_retention: bool = typer.Option(
        False, "--no-retention", help="Use each gateway's own retention."
    ),
    priority: str | None = PRIORITY_OPTION,
    on_full: str | None = ON_FULL_OPTION,
    metadata: str = METADATA_OPTION,
    token: str | None = META_TOKEN_OPTION,
) -> None:
    """Change partitions (grow only), subscribers, retention, priority or on_full.

    A new priority moves the topic to that journal lane at its home once the
    old lane has shipped what it holds of it (docs/journal.md, "Lanes").

    Example: edgegw topics alter telemetry -p 8 -s '*' --priority bulk
    """
    check_name(validate_topic, topic)
    body: dict[str, Any] = {}
    if partitions is not None:
        body["partitions"] = partitions
    subs = _parse_subscribers(subscribers)
    if subs is not None:
        body["subscribers"] = subs
    if retention_ms is not None and no_retention:
        _die("give --retention-ms or --no-retention, not both")
    if retention_ms is not None:
        body["retention_ms"] = retention_ms
    if no_retention:
        body["retention_ms"] = None
    if priority is not None:
        body["priority"] = _check_priority(priority)
    if on_full is not None:
        body["on_full"] = _check_on_full(on_full)
    if not body:
        _die(
            "nothing to change: give --partitions, --subscribers, --retention-ms, --priority "
            "or --on-full"
        )
    with _Admin(metadata, token) as m:
        t = m.call("PATCH", f"/v1/topics/{_quote(topic)}", body)
    console.print(_topic_table([t], f"altered {t['name']}"))


def topics_delete(
    topic: str = typer.Argument(..., help="Topic name."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    metadata: str = METADATA_OPTION,
    token: str | None = META_TOKEN_OPTION,
) -> None:
    """Remove a topic from the routing (gateways stop mirroring it; data stays).

    Example: edgegw topics delete telemetry --yes
    """
    check_name(validate_topic, topic)
    if not yes and not typer.confirm(f"delete topic {topic!r} from the routing table?"):
        raise typer.Exit(1)
    with _Admin(metadata, token) as m:
        m.call("DELETE", f"/v1/topics/{_quote(topic)}")
    console.print(f"deleted topic {topic}", highlight=False)


# ---------------------------------------------------------------- regions


@regions_app.command("list")
def regions_list(
    metadata: str = METADATA_OPTION,
    token: str | None = META_TOKEN_OPTION,
) -> None:
    """Every region: status, last heartbeat, gateway version, head and lag.

    Example: edgegw regions list
    """
    import time

    with _Admin(metadata, token) as m:
        regions = m.call("GET", "/v1/regions")["regions"]
        # Heartbeat times are the server's clock: measure their age on it
        # too (this machine's clock may be off), if the server says its time.
        server_ms = m.server_ms
    table = Table(title="regions")
    for col in ("region", "status", "last heartbeat", "version", "head seq", "lag"):
        table.add_column(col)
    now = server_ms if server_ms is not None else time.time() * 1000
    for r in regions:
        beat = r["last_heartbeat_ms"]
        lag = r["lag"] or {}
        table.add_row(
            r["id"],
            r["status"],
            "never" if beat is None else f"{max(0.0, (now - beat) / 1000):.1f} s ago",
            r["gateway_version"] or "-",
            "-" if r.get("head_seq") is None else str(r["head_seq"]),
            ", ".join(f"{k}={v:g}" for k, v in sorted(lag.items())) or "-",
        )
    console.print(table)


@regions_app.command("add")
def regions_add(
    region: str = typer.Argument(..., help="Region name."),
    metadata: str = METADATA_OPTION,
    token: str | None = META_TOKEN_OPTION,
) -> None:
    """Register a region and print its token (shown once: store it now).

    Example: edgegw regions add north
    """
    check_name(validate_region, region)
    with _Admin(metadata, token) as m:
        doc = m.call("POST", "/v1/regions", {"id": region})
    typer.echo(f"region {doc['id']} added; its token (shown once):", err=True)
    typer.echo(doc["token"])


@regions_app.command("rotate")
def regions_rotate(
    region: str = typer.Argument(..., help="Region name."),
    keep_old_hours: float = typer.Option(
        24.0,
        "--keep-old-hours",
        help="How long the current token stays valid beside the new one (0: invalid at once).",
    ),
    metadata: str = METADATA_OPTION,
    token: str | None = META_TOKEN_OPTION,
) -> None:
    """Issue a region a new token; the current one stays valid --keep-old-hours more.

    Put the new token in the gateways' metadata.token_file (read again when
    the server refuses the old token: no restart) before the old one ends.
    --keep-old-hours 0 ends the current token now (a leaked one).

    Example: edgegw regions rotate north --keep-old-hours 24
    """
    import time

    check_name(validate_region, region)
    if not 0 <= keep_old_hours <= 720:
        _die("--keep-old-hours must be from 0 to 720 (30 days)")
    with _Admin(metadata, token) as m:
        doc = m.call(
            "POST",
            f"/v1/regions/{_quote(region)}/token",
            {"keep_previous_s": round(keep_old_hours * 3600)},
        )
    until = doc["previous_valid_until_ms"]
    ends = (
        "the previous token is no longer valid"
        if until is None
        else "the previous token stays valid until "
        + time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(until / 1000))
    )
    typer.echo(f"region {doc['id']}: new token (shown once); {ends}:", err=True)
    typer.echo(doc["token"])


@regions_app.command("revoke")
def regions_revoke(
    region: str = typer.Argument(..., help="Region name."),
    metadata: str = METADATA_OPTION,
    token: str | None = META_TOKEN_OPTION,
) -> None:
    """Revoke a region's token (its topics stay; `regions add` issues a new one).

    Example: edgegw regions revoke north
    """
    check_name(validate_region, region)
    with _Admin(metadata, token) as m:
        m.call("DELETE", f"/v1/regions/{_quote(region)}")
    console.print(f"revoked region {region}", highlight=False)


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")
