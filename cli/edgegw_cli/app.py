"""The ``edgegw`` typer application: registers one module per command."""

from __future__ import annotations

import logging
import sys

import typer

from edgegw_cli import demo, init_cmd, inspect_cmd, restore, serve, sync

app = typer.Typer(
    name="edgegw",
    help="Geo-replication gateway for often-disconnected edge clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("serve")(serve.serve)
app.command("init")(init_cmd.init)
app.command("demo")(demo.demo)
app.add_typer(inspect_cmd.app, name="inspect")
app.command("sync")(sync.sync)
app.command("restore")(restore.restore)


@app.callback()
def _main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level."),
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main() -> None:
    app()
