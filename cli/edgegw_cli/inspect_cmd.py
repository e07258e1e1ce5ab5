"""``edgegw inspect``: print what is inside an edgegw file or bucket object.

Two subcommands::

    edgegw inspect journal SEGMENT.wal [--records]     a journal segment
    edgegw inspect object FILE-OR-KEY [bucket options] a log object or a manifest

``edgegw inspect SEGMENT.wal`` (no subcommand) still means ``journal``. A
bucket object is read the way every reader reads it (``docs/log-object.md``):
one ranged GET for the header, then only the ranges of the blocks to print.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import trio
import typer
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from edge_gateway.bucket import Bucket, NotFound
from edge_gateway.errors import CorruptData, EdgeGatewayError
from edge_gateway.format import atrest, logobject
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import Record, decode_batch
from edge_gateway.format.logobject import BlockIndex, LogObjectHeader
from edge_gateway.format.manifest import VERSION as MANIFEST_VERSION
from edge_gateway.format.manifest import Manifest, parse_log_key, parse_manifest_key
from edgegw_cli._common import console, fail
from edgegw_cli._errors import reason
from edgegw_cli.sync import open_bucket

_KINDS = {
    atrest.KIND_BLOCK: "block",
    fentry.KIND_DATA: "data",
    fentry.KIND_MIRROR: "mirror",
    fentry.KIND_CHECKPOINT: "checkpoint",
}
_CODECS = {logobject.CODEC_NONE: "none", logobject.CODEC_ZSTD: "zstd"}
_PREVIEW = 48


class _InspectGroup(TyperGroup):
    """``edgegw inspect <path>`` without a subcommand inspects a journal segment,
    as it did before ``object`` existed."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["journal", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_InspectGroup,
    no_args_is_help=True,
    help="Print what is inside a journal segment, a log object or a manifest.",
)


# --------------------------------------------------------------------------
# journal segments


@app.command("journal")
def journal(
    path: Path = typer.Argument(..., exists=True, dir_okay=False, help="A journal segment (.wal)."),
    records: bool = typer.Option(False, "--records", help="Also print every record."),
    limit: int = typer.Option(100, help="At most this many entries."),
) -> None:
    """Print the entries of a journal segment, checking every CRC.

    Example: edgegw inspect journal .edgegw/demo/journal/00000000000000000001.wal --records
    """
    data = path.read_bytes()
    try:
        base = fentry.decode_segment_header(data[: fentry.SEGMENT_HEADER_SIZE], where=str(path))
    except CorruptData as exc:
        raise fail(str(exc)) from None
    table = Table(title=f"{path.name}: journal segment from LSN {base}")
    for col in ("lsn", "kind", "topic/partition", "offsets", "bytes", "source / producer"):
        table.add_column(col)
    pos = fentry.SEGMENT_HEADER_SIZE
    shown = 0
    while pos < len(data) and shown < limit:
        if fentry.is_zero_tail(data, pos):  # the preallocated tail of an active segment
            break
        try:
            any_e = atrest.decode_any_entry(data, pos, where=f"{path}@{pos}")
            if isinstance(any_e, atrest.BlockEntry):  # a mirrored block, kept as fetched
                _block_rows(table, any_e, records, where=f"{path}@{pos}")
                pos += any_e.length
                shown += 1
                continue
            e = any_e
        except CorruptData as exc:
            console.print(table)
            raise fail(f"{exc} (entries before it are intact)") from None
        src = f"{e.source.region}#{e.source.seq} epoch {e.source.epoch}" if e.source else ""
        if e.producer is not None:  # an idempotent produce (docs/api.md)
            pr = e.producer
            src = f"producer {pr.producer_id} epoch {pr.epoch} seq {pr.sequence}"
        offsets = f"{e.base_offset}..{e.next_offset - 1}" if e.count else ""
        table.add_row(
            str(e.lsn),
            _KINDS[e.kind],
            Text(f"{e.topic}/{e.partition}" if e.topic else ""),
            offsets,
            str(e.length),
            Text(src),
        )
        if records and e.count:
            for r in decode_batch(e.payload, where=f"{path}@{pos}").records():
                table.add_row("", "", "", str(r.offset), "", _record_text(r))
        pos += e.length
        shown += 1
    console.print(table)


def _block_rows(table: Table, e: atrest.BlockEntry, records: bool, *, where: str) -> None:
    """A block entry's row (its block's codec and sizes) and, with ``records``, its records."""
    s = e.source
    codec = "zstd" if e.codec == logobject.CODEC_ZSTD else "raw"
    table.add_row(
        str(e.lsn),
        "block",
        Text(f"{e.topic}/{e.partition}"),
        f"{e.first_offset}..{e.last_offset}",
        f"{e.length} ({codec}, {e.raw_length} raw)",
        Text(f"{s.region}#{s.seq} epoch {s.epoch}"),
    )
    if records:
        frame = e.frame_index()
        batches = atrest.FrameBatches(
            frame, atrest.decode_frame(frame, e.stored, where=where), where=where
        )
        offset = e.first_offset
        while offset <= e.last_offset:
            b = batches.batch(offset)
            for r in b.records():
                table.add_row("", "", "", str(r.offset), "", _record_text(r))
            offset = b.next_offset


# --------------------------------------------------------------------------
# log objects and manifests


@dataclass(frozen=True, slots=True)
class _Source:
    """Where an object comes from: a local file, or a key in a bucket."""

    label: str
    #: the bucket key, or the key a local file's path ends with (None if it names none)
    key: str | None
    bucket: Bucket | None = None
    path: Path | None = None


@dataclass(slots=True)
class _Fetched:
    """What has been read of an object so far: ``(start, bytes)`` ranges, the first from 0."""

    ranges: list[tuple[int, bytes]]

    @property
    def have(self) -> int:
        return len(self.ranges[0][1])


@app.command("object")
def object_(
    target: str = typer.Argument(
        ...,
        help="A local file, or a bucket key (regions/<region>/log/<seq>.egw or "
        "regions/<region>/manifest/<seq>.json) with --bucket-dir or --s3-bucket.",
    ),
    bucket_dir: Path | None = typer.Option(
        None, help="Read TARGET from this local-directory bucket."
    ),
    s3_bucket: str | None = typer.Option(None, help="Read TARGET from this S3 bucket."),
    s3_endpoint: str | None = typer.Option(None, help="S3 endpoint URL (MinIO, R2, ...)."),
    s3_prefix: str = typer.Option("", help="Key prefix inside the bucket."),
    s3_path_style: bool = typer.Option(False, help="Path-style S3 addressing."),
    records: bool = typer.Option(False, "--records", help="Also print the records of the blocks."),
    topic: str | None = typer.Option(None, help="Only blocks (and records) of this topic."),
    partition: int | None = typer.Option(None, min=0, help="Only blocks of this partition."),
    limit: int = typer.Option(100, min=1, help="At most this many records or table rows."),
    key_file: list[Path] = typer.Option(
        [],
        "--key-file",
        help="A key file of the object's region, for --records of an encrypted object "
        "(its id is the file name without .key). Repeatable.",
    ),
) -> None:
    """Print a log object's header and block index, or a manifest's entries.

    Every CRC and rule of docs/log-object.md is checked; a corrupt object
    exits non-zero with the reason.

    Examples:

      edgegw inspect object regions/north/log/00000000000000000007.egw --bucket-dir /mnt/shared

      edgegw inspect object ./00000000000000000007.egw --records --topic telemetry --partition 3

      edgegw inspect object ./00000000000000000100.json
    """
    use_bucket = bucket_dir is not None or bool(s3_bucket)
    if bucket_dir is not None and not s3_bucket and not (bucket_dir / "objects").is_dir():
        raise fail(f"{bucket_dir} is not a bucket directory (it has no objects/)")
    if not use_bucket:
        path = Path(target)
        if not path.is_file():
            hint = (
                " (a bucket key? add --bucket-dir or --s3-bucket)" if "regions/" in target else ""
            )
            raise fail(f"no such file: {target}{hint}")

    async def run() -> None:
        if not use_bucket:
            source = _Source(str(path), _key_in_path(path), path=path)
            await _show(source, records, topic, partition, limit, key_file)
            return
        bucket, _ = await open_bucket(bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style)
        try:
            source = _Source(f"{target} in {bucket.name}", target, bucket=bucket)
            await _show(source, records, topic, partition, limit, key_file)
        finally:
            await bucket.aclose()

    try:
        trio.run(run)
    except NotFound as exc:
        raise fail(f"not found: {exc}") from None
    except (EdgeGatewayError, OSError) as exc:
        raise fail(reason(exc)) from None


def _key_in_path(path: Path) -> str | None:
    """``regions/...`` at the end of a local path (a file of a local bucket), if any."""
    parts = PurePosixPath(path.resolve().as_posix()).parts
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "regions":
            return "/".join(parts[i:])
    return None


async def _read(source: _Source, start: int, end: int | None) -> tuple[bytes, int]:
    """Bytes ``[start, end)`` of the object and its whole size."""
    if source.bucket is not None:
        assert source.key is not None
        res = await source.bucket.get(source.key, start=start, end=end)
        return res.data, res.size
    assert source.path is not None
    data = await trio.Path(source.path).read_bytes()
    return data[start:end], len(data)


async def _show(
    source: _Source,
    records: bool,
    topic: str | None,
    partition: int | None,
    limit: int,
    key_files: Sequence[Path] = (),
) -> None:
    # The first GET of every reader (docs/log-object.md); a local file is read whole.
    first_end = logobject.FIRST_GET_BYTES if source.bucket is not None else None
    data, size = await _read(source, 0, first_end)
    if data.lstrip()[:1] == b"{":
        if len(data) < size:
            data, size = await _read(source, 0, None)
        if records:
            raise CorruptData("is a manifest; --records applies to log objects", where=source.label)
        _print_manifest(source, data, topic, partition, limit)
        return
    need = logobject.header_length_hint(data[: logobject.PREFIX_BYTES], where=source.label)
    if need > len(data):
        more, _ = await _read(source, len(data), need)
        data += more
    header = logobject.decode_header(data, where=source.label, object_size=size)
    if source.key is not None:
        _check_log_key(source, header)
    fetched = _Fetched([(0, data)])
    selected = [b for b in header.blocks if _matches(b, topic, partition)]
    _print_header(source, header, size, selected, topic, partition, limit)
    if records:
        await _print_records(source, header, fetched, selected, limit, key_files)


def _check_log_key(source: _Source, header: LogObjectHeader) -> None:
    assert source.key is not None
    try:
        region, seq = parse_log_key(source.key)
    except CorruptData:
        return  # not under a log key: nothing to compare with
    if (header.region, header.seq) != (region, seq):
        raise CorruptData(
            f"entry claims seq {header.seq} of region {header.region!r}, its key says "
            f"seq {seq} of {region!r}",
            where=source.label,
        )


def _matches(b: BlockIndex, topic: str | None, partition: int | None) -> bool:
    return (topic is None or b.topic == topic) and (partition is None or b.partition == partition)


def _filter_note(topic: str | None, partition: int | None) -> str:
    parts = []
    if topic is not None:
        parts.append(f"topic {topic}")
    if partition is not None:
        parts.append(f"partition {partition}")
    return " and ".join(parts)


def _print_header(
    source: _Source,
    h: LogObjectHeader,
    size: int,
    selected: Sequence[BlockIndex],
    topic: str | None,
    partition: int | None,
    limit: int,
) -> None:
    raw = sum(b.raw_length for b in h.blocks)
    stored = sum(b.stored_length for b in h.blocks)
    lsns = _lsn_range(h.first_lsn, h.last_lsn)
    if h.lanes:
        # Version 2: lane 0 (normal) in the fixed fields, the others in the lane table.
        names = {1: "critical", 2: "bulk"}
        lsns = "; ".join(
            [f"normal {lsns}"]
            + [
                f"{names.get(r.lane, f'lane {r.lane}')} {_lsn_range(r.first_lsn, r.last_lsn)}"
                for r in h.lanes
            ]
        )
    kind = "fence entry" if h.is_fence else "log object"
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column(overflow="fold")
    for name, value in (
        ("object", source.label),
        ("kind", f"{kind} v{h.version}, flags 0x{h.flags:02x}"),
        ("region", h.region),
        ("seq", str(h.seq)),
        ("epoch", str(h.epoch)),
        ("LSNs", lsns),
        ("created", _time(h.created_ms)),
        *(
            [("encryption", f"AES-256-GCM blocks, key id {h.key_id}")]
            if h.key_id is not None
            else []
        ),
        ("size", f"{size:,} bytes (header {h.header_length:,})"),
        (
            "blocks",
            f"{len(h.blocks)} in {len({(b.topic, b.partition) for b in h.blocks})} partitions, "
            f"{sum(b.record_count for b in h.blocks):,} records",
        ),
        (
            "bytes",
            f"{raw:,} raw, {stored:,} stored" + (f" ({raw / stored:.1f}x)" if stored else ""),
        ),
    ):
        summary.add_row(name, Text(value))
    console.print(summary)
    if not h.blocks:
        return
    note = _filter_note(topic, partition)
    title = "block index" + (f" ({len(selected)} of {len(h.blocks)}: {note})" if note else "")
    table = _table(
        title,
        "#",
        ("partition", True),
        "offsets",
        "records",
        ("bytes, stored/raw", True),
        "crc",
        "timestamps (min, max)",
    )
    shown = 0
    for i, b in enumerate(h.blocks):
        if not _matches(b, topic, partition):
            continue
        if shown == limit:
            table.add_row("…", Text(f"{len(selected) - shown} more blocks"))
            break
        table.add_row(
            str(i),
            Text(f"{b.topic}/{b.partition}"),
            f"{b.first_offset}..{b.last_offset}",
            str(b.record_count),
            f"[{b.offset}, {b.end})\n"
            f"{b.stored_length:,}/{b.raw_length:,} {_CODECS.get(b.codec, str(b.codec))}",
            f"{b.crc:08x}",
            f"{_time(b.min_ts)}\n{_time(b.max_ts)}",
        )
        shown += 1
    console.print(table)
    if not selected:
        console.print(Text(f"no block of {note} in this object"))


async def _print_records(
    source: _Source,
    header: LogObjectHeader,
    fetched: _Fetched,
    selected: Sequence[BlockIndex],
    limit: int,
    key_files: Sequence[Path] = (),
) -> None:
    if not selected:
        return
    from edge_gateway.encryption import keyring_from_files

    # Raises MissingKey (a clear error) for an encrypted object without its key.
    keyring = keyring_from_files((header.region, str(p)) for p in key_files)
    opener = keyring.header_opener(header, where=source.label)
    # Only the blocks needed for `limit` records, fetched as a reader would.
    needed: list[BlockIndex] = []
    count = 0
    for b in selected:
        needed.append(b)
        count += b.record_count
        if count >= limit:
            break
    wanted = {(b.topic, b.partition, b.offset) for b in needed}
    ranges = logobject.plan_ranges(
        _Blocks(tuple(b for b in header.blocks if (b.topic, b.partition, b.offset) in wanted),
                header.total_length),
        lambda _t, _p: True,
        have=fetched.have,
    )  # fmt: skip
    for start, end in ranges:
        data, _ = await _read(source, start, end)
        fetched.ranges.append((start, data))
    total = sum(b.record_count for b in selected)
    table = _table(
        f"records ({min(limit, total)} of {total})",
        ("partition", True),
        "offset",
        "timestamp",
        ("key", True),
        ("value", True),
    )
    shown = 0
    try:
        for b in needed:
            stored = logobject.slice_block(b, fetched.ranges, where=source.label)
            raw = logobject.decode_block(b, stored, where=source.label, opener=opener)
            for batch in logobject.iter_block_batches(b, raw, where=source.label):
                for r in batch.records():
                    if shown == limit:
                        break
                    table.add_row(
                        Text(f"{b.topic}/{b.partition}"),
                        str(r.offset),
                        _time(r.timestamp),
                        _preview(r.key),
                        _preview(r.value),
                    )
                    shown += 1
    finally:
        # The records before a corrupt block are intact: show them, then the error.
        console.print(table)


@dataclass(frozen=True, slots=True)
class _Blocks:
    """Some blocks of an object, for :func:`logobject.plan_ranges`."""

    blocks: tuple[BlockIndex, ...]
    total_length: int


def _print_manifest(
    source: _Source, data: bytes, topic: str | None, partition: int | None, limit: int
) -> None:
    region = last_seq = None
    if source.key is not None:
        # Not under a manifest key (a file copied elsewhere): nothing to compare with.
        with contextlib.suppress(CorruptData):
            region, last_seq = parse_manifest_key(source.key)
    m = Manifest.decode(data, where=source.label, region=region, last_seq=last_seq)
    blocks = [b for e in m.entries for b in e.blocks]
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column(overflow="fold")
    for name, value in (
        ("object", source.label),
        ("kind", f"manifest v{MANIFEST_VERSION}"),
        ("region", m.region),
        ("epoch", str(m.epoch)),
        ("seqs", f"{m.first_seq}..{m.last_seq} ({len(m.entries)} entries)"),
        ("low watermark", str(m.low_watermark)),
        ("created", _time(m.created_ms)),
        ("fences", str(sum(e.fence for e in m.entries))),
        (
            "blocks",
            f"{len(blocks)}, {sum(b.record_count for b in blocks):,} records, "
            f"{sum(e.size for e in m.entries):,} bytes of log objects",
        ),
        ("partitions", str(len(m.next_offsets))),
    ):
        summary.add_row(name, Text(value))
    console.print(summary)
    note = _filter_note(topic, partition)
    table = _table(
        "entries" + (f" with blocks of {note}" if note else ""),
        "seq",
        "epoch",
        "kind",
        "LSNs",
        "size",
        "blocks",
        "records",
        ("partitions", True),
    )
    shown = 0
    for e in m.entries:
        mine = [b for b in e.blocks if _matches(b, topic, partition)]
        if note and not mine:
            continue
        if shown == limit:
            table.add_row("…", Text("more entries"))
            break
        lsns = f"{e.first_lsn}..{e.last_lsn}" if e.first_lsn <= e.last_lsn else f"- ({e.last_lsn})"
        parts = ", ".join(
            f"{b.topic}/{b.partition} {b.first_offset}..{b.last_offset}" for b in mine
        )
        table.add_row(
            str(e.seq),
            str(e.epoch),
            "fence" if e.fence else "data",
            lsns,
            f"{e.size:,}",
            str(len(mine)),
            str(sum(b.record_count for b in mine)),
            Text(_clip(parts, 120)),
        )
        shown += 1
    console.print(table)
    offsets = _table("next offsets", ("partition", True), "next offset")
    rows = [(t, p, o) for (t, p), o in sorted(m.next_offsets.items())]
    rows = [row for row in rows if (topic is None or row[0] == topic)]
    rows = [row for row in rows if (partition is None or row[1] == partition)]
    for t, p, o in rows[:limit]:
        offsets.add_row(Text(f"{t}/{p}"), str(o))
    if len(rows) > limit:
        offsets.add_row("…", f"{len(rows) - limit} more")
    console.print(offsets)


# --------------------------------------------------------------------------
# formatting


def _table(title: str, *columns: str | tuple[str, bool]) -> Table:
    """A table whose columns are ``name`` (kept on one line) or ``(name, True)``
    (may wrap: long names, text); nothing is ever cut off."""
    table = Table(title=title, title_justify="left")
    for col in columns:
        name, wraps = (col, False) if isinstance(col, str) else col
        table.add_column(name, overflow="fold", no_wrap=not wraps)
    return table


def _lsn_range(first: int, last: int) -> str:
    if first <= last:
        return f"{first}..{last} ({last - first + 1} entries)"
    return f"empty (shipped through {last})"


def _time(ms: int) -> str:
    """``ms`` as UTC ISO 8601 with milliseconds, or the bare number if out of range."""
    try:
        when = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    except (OverflowError, ValueError, OSError):
        return str(ms)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


_PRINTABLE = re.compile(r"[^\x00-\x1f\x7f-\x9f]*")


def _preview(data: bytes | None) -> Text:
    """A key or value for a table cell: text if it is printable UTF-8, else bytes."""
    if data is None:
        return Text("null", style="dim")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and _PRINTABLE.fullmatch(text):
        return Text(_clip(text, _PREVIEW) + f" ({len(data)} B)" * (len(data) > _PREVIEW))
    shown = repr(data[:_PREVIEW]) + ("…" if len(data) > _PREVIEW else "")
    return Text(shown + f" ({len(data)} B)" * (len(data) > _PREVIEW))


def _record_text(r: Record) -> Text:
    key = _preview(r.key) if r.key is not None else Text("-")
    return Text.assemble(key, ": ", _preview(r.value))
