"""Helpers shared by the CLI commands."""

from __future__ import annotations

import typer
from rich.console import Console

from edge_gateway.errors import EdgeGatewayError

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print a one-line reason to stderr and return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(code)


def reason(exc: EdgeGatewayError | OSError) -> str:
    return f"{type(exc).__name__}: {exc}"
