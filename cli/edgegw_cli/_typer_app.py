"""The ``edgegw`` typer application (see :mod:`edgegw_cli.app`, which loads it on demand).

Importing typer costs ~0.1 s and ~10 MB (it loads pydantic for its
adapters), so :func:`edgegw_cli.app.main` runs ``edgegw serve`` without this
module when the command line is a plain ``serve [--config PATH]``.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from edgegw_cli.app import COMMANDS

#: Help is click's plain text, not rich's panels: help texts are plain text
#: (an option's help saying ``s3://BUCKET[/PREFIX]`` crashed rich's markup
#: parser), click never cuts an option's name to fit 80 columns (rich's table
#: showed ``--max-partition-…``), and ``--help`` does not load rich.
PLAIN_HELP = None


def load_command(name: str) -> Any:
    """Import command ``name``'s module and build its click command."""
    module, _, attr = COMMANDS[name].target.partition(":")
    target = getattr(importlib.import_module(module), attr)
    if isinstance(target, typer.Typer):
        target.rich_markup_mode = PLAIN_HELP
        command = typer.main.get_group(target)  # a group even with one command
    else:
        single = typer.Typer(
            add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=PLAIN_HELP
        )
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
    rich_markup_mode=PLAIN_HELP,
)


def _print_version(value: bool) -> None:
    if value:
        from edge_gateway import __version__

        typer.echo(f"edgegw {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level."),
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the version of edgegw and exit.",
    ),
) -> None:
    from edge_gateway.logging_setup import configure_logging

    configure_logging("debug" if verbose else "info", "text")
