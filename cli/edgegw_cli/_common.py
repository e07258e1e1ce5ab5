"""Helpers shared by the CLI commands: the consoles, error lines, human units.

Every command prints through :data:`console` (stdout) and :data:`err_console`
(stderr), and every error through :func:`fail`:

* markup is off: text from the outside (an error message that quotes
  ``[[topics]]``, a topic name, a file name) is printed as is; styled parts
  are :class:`rich.text.Text` pieces;
* on a terminal, output fits the terminal's width; piped or redirected (a log,
  ``| grep``) nothing is wrapped, because rich would fold tables at 80 columns
  and split words ("teleme/try"). ``COLUMNS`` still sets a width when given.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console, ConsoleDimensions
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from edgegw_cli._errors import reason

if TYPE_CHECKING:
    from rich.progress import Task

#: The width of output that is not a terminal: wide enough to never wrap a line.
UNWRAPPED_WIDTH = 10_000


class _Console(Console):
    """A rich Console that does not wrap when it does not write to a terminal."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        wrap = self.is_terminal or os.environ.get("COLUMNS", "").isdigit()
        if self._width is None and not wrap:
            return ConsoleDimensions(UNWRAPPED_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


console = _Console(markup=False)
err_console = _Console(stderr=True, markup=False)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: <message>`` (:func:`error`) and return the Exit to raise."""
    error(message)
    return typer.Exit(code)


def error(message: str) -> None:
    """Print ``error: <message>`` on one line of stderr.

    The message is printed as is: never wrapped at the terminal's width (it
    stays one line for logs and scripts), and brackets in it are text, not
    rich markup.
    """
    err_console.print(
        Text.assemble(("error:", "bold red"), " ", " ".join(message.splitlines())),
        highlight=False,
        soft_wrap=True,
    )


def note(message: str) -> None:
    """A one-line remark on stderr (not part of the output a script reads)."""
    err_console.print(Text(message, style="dim"), highlight=False, soft_wrap=True)


def fresh_dir(path: Path) -> None:
    """Empty ``path`` (created if missing), or exit 2 saying why it cannot be."""
    try:
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
    except OSError as exc:
        raise fail(f"cannot use {path} as the work directory: {reason(exc)}", 2) from None


def human_bytes(n: float) -> str:
    """A byte count in binary units: ``512 B``, ``1.5 KiB``, ``4.0 GiB``."""
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"


class BytesColumn(ProgressColumn):
    """Progress column: ``done / total`` in binary units."""

    def render(self, task: Task) -> Text:
        total = "?" if task.total is None else human_bytes(task.total)
        return Text(f"{human_bytes(task.completed)} / {total}", style="progress.download")


class SpeedColumn(ProgressColumn):
    """Progress column: transfer speed in binary units per second."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(
            "?" if speed is None else f"{human_bytes(speed)}/s", style="progress.data.speed"
        )


def journal_in(data: Path, *, code: int = 2) -> Path:
    """The normal lane's journal directory of the data directory ``data`` (exit ``code``
    naming what is missing when it is not a gateway's data directory)."""
    if not data.is_dir():
        raise fail(f"no data directory at {data}", code=code)
    journal = data / "journal"
    if not journal.is_dir():
        raise fail(
            f"no journal in {data} ({journal} does not exist): is this a gateway's data directory?",
            code=code,
        )
    return journal


def check_progress(field: str, *, enabled: bool, speed: bool = False) -> Progress:
    """The progress bar of a long check (``journal verify``, ``bucket verify``): bytes,
    optionally speed, time left and the ``field`` being read; on stderr, since stdout is
    the report (with --json, a document a script parses); hidden off a terminal."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        BytesColumn(),
        *([SpeedColumn()] if speed else []),
        TimeRemainingColumn(),
        TextColumn(f"{{task.fields[{field}]}}"),
        console=err_console,
        transient=True,
        disable=not enabled or not err_console.is_terminal,
    )
