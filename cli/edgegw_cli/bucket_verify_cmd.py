"""``edgegw bucket verify``: read the region's log back and compare it with the journal.

The checks are :func:`edge_gateway.bucket_verify.verify_replica`
(docs/operations.md, "Verifying the replica"). Read-only on both sides -- the
data directory's lock is not taken, nothing is written to the bucket -- so it
runs beside a serving gateway. Prints each problem (object key, partition,
offsets, what differs) and a summary, or ``--json``; exits 0 when the log is
sound and agrees with the journal, 1 on damage or a mismatch, 2 on a usage or
config error or when the bucket cannot be reached (the convention of
``edgegw journal verify``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import trio
import typer
from rich.text import Text

from edge_gateway.bucket import Bucket
from edge_gateway.bucket_verify import ReplicaReport, verify_replica
from edge_gateway.config import parse_size
from edge_gateway.errors import EdgeGatewayError
from edge_gateway.format.crypt import Keyring
from edgegw_cli._common import check_progress, console, fail, human_bytes, journal_in
from edgegw_cli._errors import reason

#: Exit codes (docs/operations.md, "Verifying the replica").
EXIT_CLEAN = 0
EXIT_DAMAGED = 1
EXIT_USAGE = 2


@dataclass(frozen=True)
class _Target:
    region: str
    journal: Path | None
    keyring: Keyring | None
    open: Callable[[], Awaitable[tuple[Bucket, str]]]
    #: why the journal is not compared (None: it is, or none was named)
    no_journal: str | None = None


def verify(
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help="The gateway's config file: its region, data dir, bucket and encryption keys.",
    ),
    data_dir: Path | None = typer.Option(
        None, help="Without --config: the data directory whose journal to compare with."
    ),
    region: str | None = typer.Option(
        None,
        help="The region whose log to verify (default with --config: the gateway's own). "
        "Another region's log is checked without a journal to compare with.",
    ),
    bucket_dir: Path | None = typer.Option(
        None, help="Without --config: a local-directory bucket."
    ),
    s3_bucket: str | None = typer.Option(None, help="Without --config: an S3 bucket name."),
    s3_endpoint: str | None = typer.Option(None, help="S3 endpoint URL."),
    s3_prefix: str = typer.Option("", help="Key prefix inside the S3 bucket."),
    s3_path_style: bool = typer.Option(False, help="Path-style S3 addressing."),
    key_file: list[Path] = typer.Option(
        [],
        "--key-file",
        help="Without --config: a key file of the region, to open sealed objects "
        "(its id is the file name without .key). Repeatable.",
    ),
    from_seq: int = typer.Option(
        1, min=1, help="Start at this seq of the log (default: its first, after the GC boundary)."
    ),
    rate: str = typer.Option(
        "16MiB",
        help="Read at most this many bytes per second from the bucket, on average "
        "(like 4MiB or 500KB; 0: no bound).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON document."),
) -> None:
    """Read the region's log back from the bucket and compare it with the journal, read-only.

    Checks every object as a mirror would (header, block CRCs, decryption
    tags, index against blocks, seq/epoch/LSN/offset continuity, manifests
    against the objects), then compares the records of every object whose LSNs
    the journal still holds with the journal's (offsets, timestamps, keys,
    values, headers, nulls). Safe while the gateway runs. Exit 0: clean;
    1: damage or a mismatch; 2: usage or config error, or the bucket is
    unreachable.

    Example: edgegw bucket verify --config /etc/edgegw/edgegw.toml
    """
    try:
        bytes_per_s = parse_size(rate.removesuffix("/s"), "--rate")
    except EdgeGatewayError as exc:
        raise fail(str(exc), code=EXIT_USAGE) from None
    target = _target(
        config,
        data_dir,
        region,
        bucket_dir,
        s3_bucket,
        s3_endpoint,
        s3_prefix,
        s3_path_style,
        key_file,
    )

    async def run(update: Callable[[int, int, str], None]) -> ReplicaReport:
        bucket, prefix = await target.open()
        async with bucket:
            return await verify_replica(
                bucket,
                prefix,
                target.region,
                journal=target.journal,
                keyring=target.keyring,
                from_seq=from_seq,
                rate=bytes_per_s,
                progress=update,
            )

    try:
        with check_progress("key", enabled=not as_json, speed=True) as progress:
            task = progress.add_task("verifying", total=None, key="")

            def update(done: int, total: int, key: str) -> None:
                progress.update(task, completed=done, total=total, key=key.rsplit("/", 1)[-1])

            report = trio.run(run, update)
    except typer.Exit:
        raise
    except (EdgeGatewayError, OSError) as exc:
        raise fail(f"could not verify the bucket: {reason(exc)}", code=EXIT_USAGE) from None
    if report.head == 0:
        raise fail(
            f"region {target.region!r} has no log in {report.bucket}: nothing to verify "
            "(a typo in the region, bucket or prefix?)",
            code=EXIT_USAGE,
        )
    if as_json:
        doc = report.to_json()
        doc["journal_note"] = target.no_journal
        console.print_json(json.dumps(doc))
    else:
        _print(report, target.no_journal)
    raise typer.Exit(EXIT_CLEAN if report.ok else EXIT_DAMAGED)


def _target(
    config: Path | None,
    data_dir: Path | None,
    region: str | None,
    bucket_dir: Path | None,
    s3_bucket: str | None,
    s3_endpoint: str | None,
    s3_prefix: str,
    s3_path_style: bool,
    key_files: list[Path],
) -> _Target:
    """What the options name (exit 2 when they name nothing usable)."""
    from edge_gateway.names import validate_region

    bucket_options = bucket_dir is not None or bool(s3_bucket)
    if region is not None:
        try:
            region = validate_region(region)
        except EdgeGatewayError as exc:
            raise fail(str(exc), code=EXIT_USAGE) from None
    if config is not None:
        if data_dir is not None or bucket_options or key_files:
            raise fail(
                "with --config, the data dir, bucket and keys come from the config file; "
                "drop --data-dir, --key-file and the bucket options",
                code=EXIT_USAGE,
            )
        return _from_config(config, region)
    if region is None or not bucket_options:
        raise fail(
            "give --config FILE, or --region with --bucket-dir or --s3-bucket "
            "(and --data-dir to compare with a journal)",
            code=EXIT_USAGE,
        )
    journal = None
    if data_dir is not None:
        journal = journal_in(data_dir, code=EXIT_USAGE)
    keyring = None
    if key_files:
        from edge_gateway.encryption import keyring_from_files

        try:
            keyring = keyring_from_files((region, str(p)) for p in key_files)
        except EdgeGatewayError as exc:
            raise fail(str(exc), code=EXIT_USAGE) from None

    async def open_() -> tuple[Bucket, str]:
        from edgegw_cli._bucket import open_bucket

        return await open_bucket(bucket_dir, s3_bucket, s3_endpoint, s3_prefix, s3_path_style)

    return _Target(region, journal, keyring, open_)


def _from_config(config: Path, region: str | None) -> _Target:
    from edge_gateway.config import load_config
    from edge_gateway.gateway import Gateway

    try:
        cfg = load_config(config)
        own = region is None or region == cfg.region
        keyring = cfg.encryption.load(cfg.region).ring
    except EdgeGatewayError as exc:
        raise fail(str(exc), code=EXIT_USAGE) from None
    gateway = Gateway(cfg)

    async def open_() -> tuple[Bucket, str]:
        # create=False: a mistyped bucket.path is refused, never made.
        return await gateway.wiring.open_store(create=False), gateway.key_prefix

    if not own:
        note = f"the journal is region {cfg.region!r}'s: the log is checked on its own"
        return _Target(region or cfg.region, None, keyring, open_, note)
    journal = cfg.journal_path
    if not journal.is_dir():
        return _Target(cfg.region, None, keyring, open_, f"no journal at {journal}")
    return _Target(cfg.region, journal, keyring, open_)


_STYLES = {
    "damaged": ("DAMAGED", "bold red"),
    "missing": ("MISSING", "bold red"),
    "mismatch": ("MISMATCH", "bold red"),
    "journal": ("JOURNAL", "yellow"),
    "note": ("note", "dim"),
}


def _print(report: ReplicaReport, no_journal: str | None) -> None:
    journal = str(report.journal) if report.journal is not None else f"none ({no_journal})"
    if report.journal is None and no_journal is None:
        journal = "none (give --data-dir to compare)"
    console.print(
        Text(
            f"region {report.region} in {report.bucket}: log seqs {report.first_seq}.."
            f"{report.head} (GC boundary {report.gc_boundary}); journal: {journal}"
        ),
        highlight=False,
        soft_wrap=True,
    )
    for f in report.findings:
        word, style = _STYLES[f.kind]
        console.print(
            Text.assemble((f"{word:<8}", style), " ", f.line()), highlight=False, soft_wrap=True
        )
    doc = report.to_json()["summary"]
    problems = [f"{doc[k]} {k}" for k in ("damaged", "missing", "mismatch", "journal") if doc[k]]
    verdict = (
        Text("OK", style="green")
        if report.ok
        else Text("DAMAGED (" + ", ".join(problems) + ")", style="bold red")
    )
    compared = (
        f"; {doc['compared']} compared with the journal ({doc['compared_records']:,} records"
        + (f"; {doc['partly_held']} in part" if doc["partly_held"] else "")
        + f"), {doc['not_held']} no longer held"
        if report.journal is not None
        else ""
    )
    console.print(
        Text.assemble(
            f"{doc['objects']} objects, {human_bytes(doc['bytes'])}, {doc['records']:,} records, "
            f"{doc['manifests']} manifests{compared}"
            + (f", {doc['stale']} stale" if doc["stale"] else "")
            + ": ",
            verdict,
        ),
        highlight=False,
        soft_wrap=True,
    )
