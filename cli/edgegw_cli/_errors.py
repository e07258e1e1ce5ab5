"""Error helpers of the CLI that need neither typer nor rich (``edgegw serve`` runs
without them)."""

from __future__ import annotations

__all__ = ["leaf", "reason"]


def reason(exc: BaseException) -> str:
    """``Type: message``; for an OSError ``file: strerror`` without ``[Errno N]``."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename is not None else ""
        return f"{where}{exc.strerror}"
    return f"{type(exc).__name__}: {exc}"


def leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
