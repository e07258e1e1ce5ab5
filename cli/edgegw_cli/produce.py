"""``edgegw produce``: records from stdin or a file, one per line."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from edge_gateway.errors import EdgeGatewayError
from edgegw_cli._api import CONFIG_OPTION, TOKEN_OPTION, URL_OPTION, connect
from edgegw_cli._common import console, fail


def _batches(stream: IO[bytes], size: int, on_bytes: object) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for line in stream:
        if callable(on_bytes):
            on_bytes(len(line))
        value = line.rstrip(b"\r\n")
        if not value:
            continue
        batch.append(value)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def produce(
    topic: str = typer.Argument(..., help="Topic to write to (homed in this region)."),
    file: Path | None = typer.Option(None, "--file", "-f", help="Read lines from this file."),
    key: str | None = typer.Option(None, "--key", "-k", help="Key for every record."),
    partition: int | None = typer.Option(None, "--partition", "-p", help="Partition."),
    batch: int = typer.Option(500, min=1, max=100_000, help="Records per request."),
    ack: str = typer.Option("local", help="local (journaled) or shipped (in the bucket)."),
    config: Path | None = CONFIG_OPTION,
    url: str | None = URL_OPTION,
    token: str | None = TOKEN_OPTION,
) -> None:
    """Produce one record per line of stdin (or --file); empty lines are skipped.

    Example: tail -F /var/log/sensor.jsonl | edgegw produce telemetry --key sensor-7
    """
    if ack not in ("local", "shipped"):
        raise fail("--ack must be local or shipped", code=2)
    total = 0
    with connect(config, url, token) as client:
        try:
            if file is None:
                for values in _batches(sys.stdin.buffer, batch, None):
                    res = client.produce(topic, values, key=key, partition=partition, ack=ack)  # type: ignore[arg-type]
                    total += len(res.offsets)
            else:
                size = file.stat().st_size
                with (
                    open(file, "rb") as fh,
                    Progress(
                        TextColumn(f"[bold]{file.name}[/]"),
                        BarColumn(),
                        DownloadColumn(),
                        TransferSpeedColumn(),
                        TextColumn("{task.fields[records]:,} records"),
                        console=console,
                    ) as progress,
                ):
                    task = progress.add_task("produce", total=size, records=0)
                    for values in _batches(fh, batch, lambda n: progress.advance(task, n)):
                        res = client.produce(topic, values, key=key, partition=partition, ack=ack)  # type: ignore[arg-type]
                        total += len(res.offsets)
                        progress.update(task, records=total)
        except EdgeGatewayError as exc:
            raise fail(f"after {total:,} records: {exc}") from None
    console.print(f"produced {total:,} records to {topic}", highlight=False)
