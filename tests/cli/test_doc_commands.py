"""Every ``edgegw ...`` command line quoted in README.md and docs/ is one the CLI accepts.

Docs drift: `edgegw restore --config FILE` was documented before restore had
the option, and `edgegw inspect journal DATA_DIR/journal` names a directory
where the command wants a segment file. This test collects every command
line from fenced code blocks and inline code spans, and has the real click
parser take each one — subcommands, options, option values, argument counts
and path types (paths named in a line are created under a scratch root, as
directories unless they have a file suffix, so "a directory where a file is
wanted" fails here as it would for a user). Nothing is executed; what can run
on its own (the README's "Use it" walk-through) runs for real in
test_readme_walkthrough.py.

Inline spans written as prose shorthand (``<key>``, ``list|describe``,
``--access-key/--secret-key``, ``...``) are not command lines and are skipped.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

try:  # typer 0.2x vendors its own click; older ones use click itself
    from typer._click.core import Exit
    from typer._click.exceptions import MissingParameter, NoArgsIsHelpError, UsageError
except ImportError:
    from click.exceptions import Exit, MissingParameter, NoArgsIsHelpError, UsageError

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_PROGRAM = re.compile(r"(?:^|\s|/)edgegw\s")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"`([^`\n]*\bedgegw [^`\n]*)`")
_SHORTHAND = re.compile(r"[<>|…]|\.\.\.|\w/--")
#: File suffixes that make a placeholder path a file (else it is a directory).
_FILE_SUFFIXES = {".toml", ".wal", ".json", ".egw", ".sqlite", ".prom", ".crt", ".key", ".py"}


def _command_lines() -> Iterator[tuple[str, str, str, bool]]:
    """(where, command line, environment, inline?) for every edgegw invocation in the docs.

    The environment is what ``export NAME=...`` lines before it in the same
    code block set (``NAME=value`` words, space-separated).
    """
    for doc in DOCS:
        text = doc.read_text()
        name = doc.relative_to(ROOT)
        for block in _FENCE.finditer(text):
            body = block.group(1).replace("\\\n", " ")
            line_no = text[: block.start()].count("\n") + 2
            exported: list[str] = []
            for i, line in enumerate(body.splitlines()):
                if line.startswith("export "):
                    exported += [w for w in shlex.split(line[7:], comments=True) if "=" in w]
                cmd = _edgegw_part(line)
                if cmd is not None:
                    yield f"{name}:{line_no + i}", cmd, " ".join(exported), False
        for span in _INLINE.finditer(text):
            if _SHORTHAND.search(span.group(1)):
                continue
            cmd = _edgegw_part(span.group(1))
            if cmd is not None:
                yield f"{name}:{text[: span.start()].count(chr(10)) + 1}", cmd, "", True


def _edgegw_part(line: str) -> str | None:
    """The ``edgegw ...`` command in a shell line: after a pipe, without the
    program's path, environment assignments or a trailing comment."""
    for part in line.split("|"):
        part = part.strip()
        if not _PROGRAM.search(f" {part} "):
            continue
        if part.startswith(("#", "python")):
            return None
        try:
            words = shlex.split(part, comments=True)
        except ValueError:
            return None
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            words.pop(0)
        # "--access-key ..." elides a value: any value will do. "run ... --dry-run"
        # elides options shown elsewhere: not a whole command line.
        for i, w in enumerate(words):
            if w == "...":
                if not words[i - 1].startswith("-"):
                    return None
                words[i] = "X"
        if not words or not (words[0] == "edgegw" or words[0].endswith("/edgegw")):
            return None
        return shlex.join(["edgegw", *words[1:]])
    return None


COMMANDS = sorted(set(_command_lines()))


def test_the_docs_quote_commands() -> None:
    # The collector works: the README alone quotes a dozen.
    assert len([c for c in COMMANDS if c[0].startswith("README")]) >= 10
    assert any("restore" in c[1] for c in COMMANDS)


def _rebase(arg: str, root: Path) -> str:
    """A path-like word of a doc line, made real under ``root``."""
    if arg.startswith(("-", "http://", "https://", "s3://", "postgresql://")) or "=" in arg:
        return arg
    if not ("/" in arg or Path(arg).suffix in _FILE_SUFFIXES):
        return arg
    path = root / arg.lstrip("./")
    if Path(arg).suffix in _FILE_SUFFIXES:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    else:
        path.mkdir(parents=True, exist_ok=True)
    return str(path)


def _parse(command: Any, args: list[str], parent: Any) -> None:
    ctx = command.make_context(command.name or "edgegw", args, parent=parent)
    if hasattr(command, "resolve_command"):  # a group
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return
        _name, sub, sub_args = command.resolve_command(ctx, rest)
        assert sub is not None
        _parse(sub, sub_args, ctx)


@pytest.mark.parametrize(
    ("where", "line", "exported", "inline"), COMMANDS, ids=[c[0] for c in COMMANDS]
)
def test_quoted_command_line_parses(
    where: str, line: str, exported: str, inline: bool, tmp_path: Path
) -> None:
    from edgegw_cli.app import app

    words = shlex.split(line)[1:]
    args = [_rebase(w, tmp_path) for w in words]
    cli = typer.main.get_command(app)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEGW_")}
    env.update(w.split("=", 1) for w in exported.split())
    old = os.environ.copy()
    os.environ.clear()
    os.environ.update(env)
    try:
        _parse(cli, args, None)
    except (Exit, NoArgsIsHelpError):
        pass  # --help, or a group named alone (it shows its help)
    except MissingParameter:
        if not inline:
            raise
        # An inline span may name a command without all its options
        # ("run `edgegw restore` first"); what it does name must be right.
    except UsageError as exc:
        pytest.fail(f"{where}: `{line}` is refused by the CLI: {exc.format_message()}")
    finally:
        os.environ.clear()
        os.environ.update(old)
