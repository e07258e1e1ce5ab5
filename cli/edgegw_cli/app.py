"""The ``edgegw`` typer application: one module per command, imported when used.

A command's module (and what it imports: boto3, httpx, trio, hypercorn,
pyarrow ...) is imported only when that command runs or shows its own help.
``edgegw --help`` lists the commands from :data:`COMMANDS` alone, so it
starts in about a tenth of a second; tests/cli/test_help.py checks that each
summary here is the first paragraph of its command's own help.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

import typer
from typer.core import TyperCommand, TyperGroup


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
    "inspect": _Lazy(
        "edgegw_cli.inspect_cmd:app",
        "Print what is inside a journal segment, a log object or a manifest.",
    ),
    "pipeline": _Lazy("edgegw_cli.pipeline:app", "Bucket -> Iceberg/Parquet tables with PySpark."),
    "metadata": _Lazy("edgegw_cli.meta:serve_app", "The reference metadata server."),
    "regions": _Lazy(
        "edgegw_cli.meta:regions_app",
        "Regions of the fleet and their tokens (on the metadata server).",
    ),
}


def load_command(name: str) -> Any:
    """Import command ``name``'s module and build its click command."""
    module, _, attr = COMMANDS[name].target.partition(":")
    target = getattr(importlib.import_module(module), attr)
    if isinstance(target, typer.Typer):
        command = typer.main.get_group(target)  # a group even with one command
    else:
        single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


class _Summary(TyperCommand):
    """Stands for a command not imported yet: its name and summary only."""

    def __init__(self, name: str) -> None:
        super().__init__(name, help=COMMANDS[name].summary)


class _LazyGroup(TyperGroup):
    """A TyperGroup whose commands (from :data:`COMMANDS`) are imported on first use.

    While the group formats its own help, :meth:`get_command` answers with
    :class:`_Summary` stand-ins, so listing the commands imports none of them.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name in COMMANDS:
            self.commands.setdefault(name, _Summary(name))
        self._listing = False

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = self.commands.get(cmd_name)
        if isinstance(command, _Summary) and not self._listing:
            command = self.commands[cmd_name] = load_command(cmd_name)
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="edgegw",
    cls=_LazyGroup,
    help="Geo-replication gateway for often-disconnected edge clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level."),
) -> None:
    from edge_gateway.logs import configure_logging

    configure_logging("debug" if verbose else "info", "text")


def main() -> None:
    app()
