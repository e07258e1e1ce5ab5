"""``edgegw --help`` and every ``edgegw <command> --help``: they work, and the
top-level help imports no command's heavy dependencies."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from _cli_support import cli_env, invoke
from edgegw_cli.app import app
from rich.errors import MarkupError
from rich.text import Text
from typer.core import TyperGroup

#: Imported by commands that need them, never by ``edgegw --help``.
HEAVY = ("boto3", "botocore", "httpx", "hypercorn", "starlette", "pyarrow", "pyspark", "trio")


#: Runs ``python -m edgegw_cli ARGS`` and then prints the modules it imported.
_PROBE = """
import json, runpy, sys
try:
    runpy.run_module("edgegw_cli", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def _imported_by(*args: str) -> set[str]:
    """The modules a real ``edgegw ARGS`` process has imported when it exits."""
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Usage:" in res.stdout
    modules: list[str] = json.loads(res.stderr.splitlines()[-1])
    return set(modules)


def test_top_level_help_imports_no_command() -> None:
    imported = _imported_by("--help")
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY)
    assert not heavy, f"edgegw --help imports {heavy}"
    commands = sorted(m for m in imported if m.startswith("edgegw_cli."))
    assert commands == ["edgegw_cli.app"], commands


def test_a_command_is_imported_when_it_shows_its_help() -> None:
    imported = _imported_by("produce", "--help")
    assert "edgegw_cli.produce" in imported
    assert "edgegw_cli.consume" not in imported


def _commands() -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every (sub)command of the app, each as (path, click command)."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    for name in root.list_commands(None):  # type: ignore[arg-type]
        command = root.get_command(None, name)  # type: ignore[arg-type]
        yield (name,), command
        if isinstance(command, TyperGroup):
            for sub in command.list_commands(None):  # type: ignore[arg-type]
                yield (name, sub), command.get_command(None, sub)  # type: ignore[arg-type]


def _paths() -> list[tuple[str, ...]]:
    return [path for path, _ in _commands()]


@pytest.mark.parametrize("path", _paths(), ids=" ".join)
def test_every_command_shows_its_help(path: tuple[str, ...]) -> None:
    res = invoke(*path, "--help")
    assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert "Traceback" not in res.stdout + res.stderr
    assert f"Usage: edgegw {' '.join(path)}" in res.stdout


def _help_texts() -> Iterator[tuple[str, str]]:
    for path, command in _commands():
        where = " ".join(path)
        yield where, command.help or ""
        for param in command.params:
            yield f"{where} {param.name}", getattr(param, "help", None) or ""


def test_help_texts_hold_no_rich_markup() -> None:
    # Help is rendered as rich markup: "s3://bucket[/prefix]" crashed
    # `pipeline run --help` (a closing tag), and "[bold]" would vanish.
    eaten = [(where, text) for where, text in _help_texts() if not _renders_as_is(text)]
    assert not eaten


def _renders_as_is(text: str) -> bool:
    try:
        return Text.from_markup(text).plain == text
    except MarkupError:
        return False


def test_the_listing_is_each_commands_own_summary() -> None:
    from edgegw_cli.app import COMMANDS, load_command

    assert list(COMMANDS) == [path[0] for path in _paths() if len(path) == 1]
    for name, lazy in COMMANDS.items():
        own = (load_command(name).help or "").split("\n\n")[0].strip()
        assert lazy.summary == own, name


def test_a_mistyped_command_gets_a_suggestion() -> None:
    res = invoke("serv")
    assert res.exit_code == 2
    assert "Did you mean 'serve'?" in res.stderr
