"""``edgegw inspect``: print what is inside an edgegw file."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from edge_gateway.errors import CorruptData
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import decode_batch
from edgegw_cli._common import console, fail

_KINDS = {
    fentry.KIND_DATA: "data",
    fentry.KIND_MIRROR: "mirror",
    fentry.KIND_CHECKPOINT: "checkpoint",
}


def inspect(
    path: Path = typer.Argument(..., exists=True, dir_okay=False, help="A journal segment (.wal)."),
    records: bool = typer.Option(False, "--records", help="Also print every record."),
    limit: int = typer.Option(100, help="At most this many entries."),
) -> None:
    """Print the entries of a journal segment, checking every CRC.

    Example: edgegw inspect .edgegw/demo/journal/00000000000000000001.wal --records
    """
    data = path.read_bytes()
    try:
        base = fentry.decode_segment_header(data[: fentry.SEGMENT_HEADER_SIZE], where=str(path))
    except CorruptData as exc:
        raise fail(str(exc)) from None
    table = Table(title=f"{path.name}: journal segment from LSN {base}")
    for col in ("lsn", "kind", "topic/partition", "offsets", "bytes", "source"):
        table.add_column(col)
    pos = fentry.SEGMENT_HEADER_SIZE
    shown = 0
    while pos < len(data) and shown < limit:
        try:
            e = fentry.decode_entry(data, pos, where=f"{path}@{pos}")
        except CorruptData as exc:
            console.print(table)
            raise fail(f"{exc} (entries before it are intact)") from None
        src = f"{e.source.region}#{e.source.seq} epoch {e.source.epoch}" if e.source else ""
        offsets = f"{e.base_offset}..{e.next_offset - 1}" if e.count else ""
        table.add_row(
            str(e.lsn),
            _KINDS[e.kind],
            f"{e.topic}/{e.partition}" if e.topic else "",
            offsets,
            str(e.length),
            src,
        )
        if records and e.count:
            for r in decode_batch(e.payload, where=f"{path}@{pos}").records():
                key = r.key.decode(errors="replace") if r.key is not None else "-"
                table.add_row("", "", "", str(r.offset), "", f"{key}: {r.value[:80]!r}")
        pos += e.length
        shown += 1
    console.print(table)
