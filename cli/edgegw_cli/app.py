"""The ``edgegw`` command line: one module per command, imported when used.

A command's module (and what it imports: boto3, httpx, trio, hypercorn,
pyarrow ...) is imported only when that command runs or shows its own help.
``edgegw --help`` lists the commands from :data:`COMMANDS` alone, so it
starts in about a tenth of a second; tests/cli/test_help.py checks that each
summary here is the first paragraph of its command's own help.

The typer application itself (:data:`app`, in :mod:`edgegw_cli._typer_app`)
loads on first use: :func:`main` starts ``edgegw serve --config PATH``
without typer, rich or pydantic, which a gateway does not need (a reboot
serves again sooner, and the process idles smaller; docs/operations.md,
"Footprint"). Any other command line, ``serve --help`` and a mistyped
``serve`` included, goes through typer as before.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NamedTuple


class _Lazy(NamedTuple):
    #: ``module:attribute`` of a command function or a typer sub-app.
    target: str
    #: What ``edgegw --help`` shows for the command.
    summary: str


#: Every command, in the order ``edgegw --help`` lists them.
COMMANDS: dict[str, _Lazy] = {
    "serve": _Lazy(
        "edgegw_cli.serve:serve",
        "Run the gateway: journal, shipper, mirrors and the local API, until SIGTERM.",
    ),
    "init": _Lazy(
        "edgegw_cli.init_cmd:init",
        "Write a commented starter config with every key at its default.",
    ),
    "status": _Lazy(
        "edgegw_cli.status:status",
        "Per topic: head offsets, what is shipped, mirror lag; the shipper and each mirror.",
    ),
    "produce": _Lazy(
        "edgegw_cli.produce:produce",
        "Produce one record per line of stdin (or --file); empty lines are skipped.",
    ),
    "consume": _Lazy(
        "edgegw_cli.consume:consume",
        "Print records as JSON lines (or raw values), optionally following new ones.",
    ),
    "demo": _Lazy(
        "edgegw_cli.demo:demo",
        "Run two regions on this machine, mirroring each other, and print what happened.",
    ),
    "sync": _Lazy(
        "edgegw_cli.sync:sync",
        "Ship everything pending, pull every subscribed source up to its head, then exit.",
    ),
    "restore": _Lazy(
        "edgegw_cli.restore:restore",
        "Rebuild the journal's starting point from the region's log in the bucket.",
    ),
    "reship": _Lazy(
        "edgegw_cli.reship:reship",
        "Re-create this region's log in the bucket from the journal, after the bucket lost it.",
    ),
    "topics": _Lazy(
        "edgegw_cli.topics:app",
        "Topics: the fleet's routing on the metadata server, or a running gateway's topics.",
    ),
    "scenario": _Lazy("edgegw_cli.scenario:app", "Multi-region scenarios with faults."),
    "bucket": _Lazy(
        "edgegw_cli.bucket_cmd:app",
        "Check that a store has what edgegw needs, and mark it as the fleet's, before a "
        "rollout; verify a region's log in it against the journal.",
    ),
    "inspect": _Lazy(
        "edgegw_cli.inspect_cmd:app",
        "Print what is inside a journal segment, a log object or a manifest.",
    ),
    "journal": _Lazy(
        "edgegw_cli.journal_cmd:app",
        "The journal's files on disk: check them (verify), expand compressed segments (expand).",
    ),
    "iam": _Lazy(
        "edgegw_cli.iam_cmd:app",
        "IAM policies for the fleet's bucket: one per region, the pipeline's, an admin's.",
    ),
    "encryption": _Lazy(
        "edgegw_cli.encryption_cmd:app",
        "Keys for client-side encryption of log objects (AES-256-GCM).",
    ),
    "pipeline": _Lazy("edgegw_cli.pipeline:app", "Bucket -> Iceberg/Parquet tables with PySpark."),
    "metadata": _Lazy("edgegw_cli.meta:serve_app", "The reference metadata server."),
    "regions": _Lazy(
        "edgegw_cli.meta:regions_app",
        "Regions of the fleet and their tokens (on the metadata server).",
    ),
}


def serve_arguments(argv: Sequence[str]) -> tuple[bool, str] | None:
    """``(verbose, config path)`` when ``argv`` is ``[-v] serve [--config PATH]``, else None.

    Only these plain forms: anything else (``--help``, an unknown option, a
    missing value) is left to typer, which explains it.
    """
    args = list(argv)
    verbose = False
    while args and args[0] in ("-v", "--verbose"):
        verbose, args = True, args[1:]
    if not args or args[0] != "serve":
        return None
    rest = args[1:]
    if not rest:
        return verbose, "edgegw.toml"
    if len(rest) == 2 and rest[0] in ("--config", "-c") and not rest[1].startswith("-"):
        return verbose, rest[1]
    if len(rest) == 1 and rest[0].startswith("--config=") and len(rest[0]) > len("--config="):
        return verbose, rest[0].partition("=")[2]
    return None


def main() -> None:
    """The ``edgegw`` console script."""
    plain_serve = serve_arguments(sys.argv[1:])
    if plain_serve is not None:
        from edgegw_cli._serve_run import main_serve

        verbose, config = plain_serve
        sys.exit(main_serve(config, verbose=verbose))
    from edgegw_cli._typer_app import app

    app()


def __getattr__(name: str) -> Any:
    # ``app`` and ``load_command`` live with typer; loaded on first use.
    if name in ("app", "load_command"):
        from edgegw_cli import _typer_app

        return getattr(_typer_app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
