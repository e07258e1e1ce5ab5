"""``edgegw consume``: print a topic's records."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

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
from edgegw_cli._common import fail

if TYPE_CHECKING:
    from edge_gateway.format.batch import Record


def _text(data: bytes | None) -> dict[str, str | None]:
    if data is None:
        return {"": None}
    try:
        return {"": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"_b64": base64.b64encode(data).decode()}


def _json_line(topic: str, partition: int, r: Record) -> str:
    doc: dict[str, object] = {
        "topic": topic,
        "partition": partition,
        "offset": r.offset,
        "timestamp": r.timestamp,
    }
    for name, data in (("key", r.key), ("value", r.value)):
        for suffix, v in _text(data).items():
            doc[name + suffix] = v
    if r.headers:
        doc["headers"] = {  # a null header value prints as null
            k: None if v is None else v.decode("utf-8", "replace") for k, v in r.headers
        }
    return json.dumps(doc, ensure_ascii=False)


def consume(
    topic: str = typer.Argument(..., help="Topic (or mirror topic <region>.<topic>)."),
    partition: list[int] = typer.Option(
        None, "--partition", "-p", help="Partition(s); default all."
    ),
    from_beginning: bool = typer.Option(
        False, "--from-beginning", help="Start at the oldest record (default: the end)."
    ),
    offset: int | None = typer.Option(None, "--offset", help="Start at this offset."),
    follow: bool = typer.Option(False, "--follow", "-F", help="Keep waiting for new records."),
    group: str | None = typer.Option(
        None, "--group", "-g", help="Consumer group: start at its offsets, commit as you go."
    ),
    max_records: int | None = typer.Option(None, "--max", help="Stop after this many records."),
    raw: bool = typer.Option(False, "--raw", help="Print values only, one per line."),
    config: Path | None = CONFIG_OPTION,
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    ca_file: Path | None = CA_FILE_OPTION,
    client_cert: Path | None = CLIENT_CERT_OPTION,
    client_key: Path | None = CLIENT_KEY_OPTION,
) -> None:
    """Print records as JSON lines (or raw values), optionally following new ones.

    Example: edgegw consume south.telemetry --from-beginning --follow --group dashboard
    """
    from edge_gateway.errors import EdgeGatewayError
    from edge_gateway.names import validate_group, validate_topic

    check_name(validate_topic, topic)
    if group is not None:
        check_name(validate_group, group)
    out = sys.stdout.buffer
    printed = 0
    with connect(config, url, token, TlsOptions(ca_file, client_cert, client_key)) as client:
        try:
            info = client.topic(topic)
            parts = partition or [p["partition"] for p in info["partitions"]]
            for p in set(parts) - {p["partition"] for p in info["partitions"]}:
                # No such partition: let the gateway say so (400, with the
                # partition count), instead of silently reading nothing.
                client.fetch(topic, p, 0)
                raise fail(f"topic {topic!r} has no partition {p}", 2)
            committed = {}
            if group:
                committed = {o.partition: o.offset for o in client.fetch_offsets(group, topic)}
            pos: dict[int, int] = {}
            for p in info["partitions"]:
                n = p["partition"]
                if n not in parts:
                    continue
                if offset is not None:
                    pos[n] = offset
                elif n in committed:
                    pos[n] = committed[n]
                else:
                    pos[n] = p["first_offset"] if from_beginning else p["next_offset"]
            while True:
                progressed = False
                wait = 1000 if follow and len(pos) == 1 else 0
                for p, at in pos.items():
                    res = client.fetch(topic, p, at, wait_ms=wait)
                    for r in res.records:
                        if max_records is not None and printed >= max_records:
                            break
                        out.write(
                            # --raw: a null value (a tombstone) prints as an empty line
                            (r.value or b"") + b"\n"
                            if raw
                            else _json_line(topic, p, r).encode() + b"\n"
                        )
                        printed += 1
                        pos[p] = r.offset + 1
                        progressed = True
                    if group and res.records:
                        client.commit_offsets(group, {(topic, p): pos[p]})
                out.flush()
                if max_records is not None and printed >= max_records:
                    break
                if not progressed and not follow:
                    break
                if not progressed and len(pos) > 1:
                    import time

                    time.sleep(0.2)
        except EdgeGatewayError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            pass
