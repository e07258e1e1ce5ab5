"""``edgegw produce``: records from stdin or a file, one per line."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

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
from edgegw_cli._common import console, fail
from edgegw_cli._errors import reason


def _batches(
    stream: IO[bytes], size: int, on_bytes: Callable[[int], object] | None
) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for line in stream:
        if on_bytes is not None:
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
    ca_file: Path | None = CA_FILE_OPTION,
    client_cert: Path | None = CLIENT_CERT_OPTION,
    client_key: Path | None = CLIENT_KEY_OPTION,
) -> None:
    """Produce one record per line of stdin (or --file); empty lines are skipped.

    Example: tail -F /var/log/sensor.jsonl | edgegw produce telemetry --key sensor-7
    """
    from edge_gateway.errors import EdgeGatewayError
    from edge_gateway.names import validate_topic

    if ack not in ("local", "shipped"):
        raise fail("--ack must be local or shipped", code=2)
    check_name(validate_topic, topic)
    fh: IO[bytes] = sys.stdin.buffer
    if file is not None:
        try:
            fh = open(file, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise fail(f"--file: {reason(exc)}", code=2) from None
    total = 0
    try:
        with connect(config, url, token, TlsOptions(ca_file, client_cert, client_key)) as client:

            def send(values: list[bytes]) -> None:
                nonlocal total
                res = client.produce(topic, values, key=key, partition=partition, ack=ack)  # type: ignore[arg-type]
                total += len(res.offsets)

            try:
                if file is None:
                    for values in _batches(fh, batch, None):
                        send(values)
                else:
                    _produce_file(fh, file.name, batch, send, lambda: total)
            except EdgeGatewayError as exc:
                raise fail(f"after {total:,} records: {exc}") from None
            except OSError as exc:  # reading the file (an I/O error, a FIFO gone)
                raise fail(f"after {total:,} records: {reason(exc)}") from None
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()
    console.print(f"produced {total:,} records to {topic}", highlight=False)


def _produce_file(
    fh: IO[bytes],
    name: str,
    batch: int,
    send: Callable[[list[bytes]], None],
    total: Callable[[], int],
) -> None:
    from rich.progress import BarColumn, Progress, TextColumn

    from edgegw_cli._common import BytesColumn, SpeedColumn

    size = os.fstat(fh.fileno()).st_size
    with Progress(
        # the name goes through a task field: brackets or braces in it are text
        TextColumn("{task.fields[name]}", style="bold", markup=False),
        BarColumn(),
        BytesColumn(),
        SpeedColumn(),
        TextColumn("{task.fields[records]:,} records", markup=False),
        console=console,
    ) as progress:
        task = progress.add_task("produce", total=size or None, records=0, name=name)
        for values in _batches(fh, batch, lambda n: progress.advance(task, n)):
            send(values)
            progress.update(task, records=total())
