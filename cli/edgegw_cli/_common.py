"""Helpers shared by the CLI commands."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from edge_gateway.errors import EdgeGatewayError

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print a one-line reason to stderr and return the Exit to raise.

    The message is printed as is: never wrapped at the terminal's width (it
    stays one line for logs and scripts), and brackets in it are text, not
    rich markup.
    """
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def reason(exc: EdgeGatewayError | OSError) -> str:
    return f"{type(exc).__name__}: {exc}"


def leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
