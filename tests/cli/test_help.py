"""``edgegw --help`` and every ``edgegw <command> --help``: they work, and the
top-level help imports no command's heavy dependencies."""

from __future__ import annotations

import json
import os
import re
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
from typer.testing import CliRunner

#: Imported by commands that need them, never by ``edgegw --help``.
HEAVY = (
    *("boto3", "botocore", "httpx", "hypercorn", "starlette", "pyarrow", "pyspark", "trio"),
    *("rich", "pydantic"),  # help is plain text (see _typer_app.PLAIN_HELP)
)


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
    assert commands == ["edgegw_cli._typer_app", "edgegw_cli.app"], commands


def test_a_command_is_imported_when_it_shows_its_help() -> None:
    imported = _imported_by("produce", "--help")
    assert "edgegw_cli.produce" in imported
    assert "edgegw_cli.consume" not in imported


def _commands() -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and sub-command of the app, at any depth, each as (path, click command).

    Walked from the app itself, so a command added later is covered too.
    """
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)

    def walk(path: tuple[str, ...], group: TyperGroup) -> Iterator[tuple[tuple[str, ...], Any]]:
        ctx = typer.Context(group, info_name=path[-1] if path else "edgegw")
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None, (*path, name)
            yield (*path, name), command
            if isinstance(command, TyperGroup):
                yield from walk((*path, name), command)

    return walk((), root)


def _paths() -> list[tuple[str, ...]]:
    return [path for path, _ in _commands()]


def _command(path: tuple[str, ...]) -> Any:
    return dict(_commands())[path]


#: The width of a plain terminal: help must show every option's name in it.
NARROW = "80"


@pytest.mark.parametrize("path", _paths(), ids=" ".join)
def test_every_command_shows_its_help(path: tuple[str, ...]) -> None:
    env = {**cli_env(), "COLUMNS": NARROW}
    unset: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    res = CliRunner().invoke(app, [*path, "--help"], env={**unset, **env})
    out = res.stdout + res.stderr
    assert res.exit_code == 0, (out, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in out
    assert f"Usage: edgegw {' '.join(path)}" in res.stdout
    command = _command(path)
    # Every option by each of its names, whole (a rich table cut long names
    # to fit 80 columns: "--max-partition-…"), and every sub-command.
    # (typer 0.29 brings its own copy of click: params are not click.Option.)
    options = [p for p in command.params if p.param_type_name == "option"]
    names = [n for p in options for n in (*p.opts, *p.secondary_opts)] + ["--help"]
    assert len(names) > 1 or not command.params, command.params
    if isinstance(command, TyperGroup):
        names += command.list_commands(typer.Context(command))
    missing = [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", res.stdout)]
    assert not missing, f"edgegw {' '.join(path)} --help does not show {missing}:\n{res.stdout}"


def test_the_walk_reaches_nested_commands() -> None:
    # The walk itself: groups and their commands are both in it.
    paths = _paths()
    assert ("pipeline",) in paths
    assert ("pipeline", "run") in paths
    assert ("serve",) in paths


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
