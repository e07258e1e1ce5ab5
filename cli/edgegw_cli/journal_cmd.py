"""``edgegw journal verify`` and ``edgegw journal expand``: the journal's files, offline.

``verify`` checks every segment and index file of a data directory. The
checks are :func:`edge_gateway.journal.verify_journal` (pure checks over
each file's bytes; docs/operations.md, "A damaged disk"). It reads the files
without taking the data directory's lock, so it runs beside a gateway that
is serving, prints a line per file (or ``--json``) and exits
0 when nothing is damaged, 1 when something is, 2 on a usage or config error.

``expand`` turns every compressed segment (``EGWC``, docs/at-rest.md) back
into the entry log it replaced, for a downgrade to a gateway from before
compressed segments (docs/operations.md, upgrade order). It writes, so it
takes every lane's lock and refuses while the gateway runs (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.text import Text

from edge_gateway.errors import EdgeGatewayError
from edge_gateway.journal import FileCheck, VerifyReport, verify_journal
from edgegw_cli._common import check_progress, console, fail, human_bytes, journal_in

app = typer.Typer(
    no_args_is_help=True,
    help="The journal's files on disk: check them (verify), expand compressed segments (expand).",
)

#: Exit codes (docs/operations.md, "A damaged disk").
EXIT_CLEAN = 0
EXIT_DAMAGED = 1
EXIT_USAGE = 2


@app.command("verify")
def verify(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="The gateway's config file (the journal is under data_dir)."
    ),
    data_dir: Path | None = typer.Option(
        None, help="Without --config: the data directory (holds journal/)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON document."),
) -> None:
    """Check every segment and index file of every lane's journal, read-only.

    Checks CRCs, LSNs (contiguous within and across segments), entry kinds and
    versions, per-partition offsets, and each index file against its segment;
    compressed segments (EGWC) frame by frame. Safe while the gateway runs: it
    takes no lock and writes nothing. Exit 0: clean; 1: damage found; 2: usage
    or config error.

    Example: edgegw journal verify --config /etc/edgegw/edgegw.toml
    """
    journal = _journal_dir(config, data_dir)
    try:
        with check_progress("file", enabled=not as_json) as progress:
            task = progress.add_task("verifying", total=None, file="")

            def update(done: int, total: int, path: Path) -> None:
                progress.update(task, completed=done, total=total, file=path.name)

            report = verify_journal(journal, progress=update)
    except EdgeGatewayError as exc:
        raise fail(str(exc), code=EXIT_USAGE) from None
    except OSError as exc:
        raise fail(f"cannot read the journal: {exc}", code=EXIT_USAGE) from None
    if as_json:
        console.print_json(json.dumps(report.to_json()))
    else:
        _print(report)
    raise typer.Exit(EXIT_CLEAN if report.ok else EXIT_DAMAGED)


@app.command("expand")
def expand(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="The gateway's config file (the journal is under data_dir)."
    ),
    data_dir: Path | None = typer.Option(
        None, help="Without --config: the data directory (holds journal/)."
    ),
) -> None:
    """Expand every compressed segment of every lane back into an entry log (offline).

    For a downgrade to a gateway from before compressed segments (EGWC),
    which refuses to open them: stop the gateway, run this, start the older
    version (with journal.at_rest = "off" kept, a newer gateway leaves them
    expanded). Each segment is swapped atomically and expands to the very
    bytes it replaced; running it again expands what is left. Refuses while
    the gateway runs (the journal's lock). Exit 0: done; 1: a damaged
    segment (the segments before it are expanded); 2: usage, config error,
    or the gateway is running.

    Example: edgegw journal expand --config /etc/edgegw/edgegw.toml
    """
    from edge_gateway.errors import CorruptData
    from edge_gateway.journal import Expanded, expand_journal

    journal = _journal_dir(config, data_dir)

    def done(e: Expanded) -> None:
        console.print(
            Text(
                f"{e.path.parent.name}/{e.path.name}: expanded "
                f"{human_bytes(e.compressed_bytes)} -> {human_bytes(e.wal_bytes)}"
            ),
            highlight=False,
        )

    try:
        expanded = expand_journal(journal, progress=done)
    except CorruptData as exc:
        raise fail(f"not expanded: {exc}", code=EXIT_DAMAGED) from None
    except EdgeGatewayError as exc:
        raise fail(str(exc), code=EXIT_USAGE) from None
    except OSError as exc:
        raise fail(f"cannot expand the journal: {exc}", code=EXIT_USAGE) from None
    total = sum(e.wal_bytes for e in expanded)
    console.print(
        Text(f"{len(expanded)} compressed segments expanded ({human_bytes(total)} of entry logs)"),
        highlight=False,
    )
    raise typer.Exit(EXIT_CLEAN)


def _journal_dir(config: Path | None, data_dir: Path | None) -> Path:
    """The normal lane's journal directory the options name (exit 2 if they name none)."""
    if config is not None and data_dir is not None:
        raise fail("give --config or --data-dir, not both", code=EXIT_USAGE)
    if config is not None:
        from edge_gateway.config import load_config

        try:
            data = load_config(config).data_dir
        except EdgeGatewayError as exc:
            raise fail(str(exc), code=EXIT_USAGE) from None
    elif data_dir is not None:
        data = data_dir
    else:
        raise fail("give --config FILE or --data-dir DIR", code=EXIT_USAGE)
    return journal_in(data, code=EXIT_USAGE)


_STATUS = {
    "ok": ("OK", "green"),
    "damaged": ("DAMAGED", "bold red"),
    "skipped": ("SKIPPED", "yellow"),
}


def _line(f: FileCheck) -> Text:
    lsns = f"LSN {f.first_lsn}-{f.last_lsn}" if f.first_lsn is not None else "LSN -"
    word, style = _STATUS[f.status]
    text = Text.assemble(
        f"{f.lane:<13} {f.path.name:<25} {f.role:<6} {f.kind:<34} {lsns:<24} "
        f"{f.entries:>9} entries {human_bytes(f.bytes):>10}  ",
        (word, style),
    )
    if f.damage is not None:
        text.append(f" at byte {f.damage.offset}: {f.damage.reason}")
    return text


def _print(report: VerifyReport) -> None:
    console.print(Text(f"journal {report.journal} (lanes: {', '.join(report.lanes)})"))
    for f in report.files:
        console.print(_line(f), highlight=False, soft_wrap=True)
        for note in f.notes:
            console.print(Text(f"    note: {note}", style="dim"), highlight=False, soft_wrap=True)
    doc = report.to_json()["summary"]
    verdict = (
        Text("OK", style="green")
        if report.ok
        else Text(f"DAMAGED ({doc['damaged']} files)", style="bold red")
    )
    console.print(
        Text.assemble(
            f"{doc['files']} files, {doc['entries']} entries, {human_bytes(doc['bytes'])}"
            + (f", {doc['skipped']} skipped" if doc["skipped"] else "")
            + ": ",
            verdict,
        ),
        highlight=False,
        soft_wrap=True,
    )
