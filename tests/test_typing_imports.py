"""Typing stubs are imported for the type checker only (issue 41, item 10).

``tests/pipeline/test_pipeline_store.py`` imported ``mypy_boto3_s3`` at run
time, so the suite needed the ``dev`` extra (boto3-stubs) just to collect. The
stub packages (``mypy-boto3-*``, ``*-stubs``, ``types-*``) are the type
checker's: every import of one, in the library, the CLI and the tests, must sit
under ``if TYPE_CHECKING:``. Checked on the source (AST), so it fails whether
or not the stubs happen to be installed.
"""

from __future__ import annotations

import ast
import re
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("edge_gateway", "cli", "tests", "fuzz", "bench", "scenarios")

_STUB_DIST = re.compile(r"(types-.+|.+-stubs|mypy-boto3-.+)")
_STUB_MODULE = re.compile(r"(mypy_boto3_\w+|\w+_stubs|types_\w+|\w+-stubs)")


def stub_modules() -> set[str]:
    """Top-level modules that only typing-stub distributions provide (installed ones)."""
    return {
        module
        for module, dists in packages_distributions().items()
        if dists and all(_STUB_DIST.fullmatch(d.lower()) for d in dists)
    }


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level module) of every import outside ``if TYPE_CHECKING:`` blocks."""
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the `else:` of TYPE_CHECKING runs
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name.split(".")[0]) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module.split(".")[0]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def test_the_checker_sees_through_type_checking_blocks() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import typing\n"
        "if TYPE_CHECKING:\n    from mypy_boto3_s3.client import S3Client\n"
        "if typing.TYPE_CHECKING:\n    import types_x\nelse:\n    import json\n"
        "def f():\n    import mypy_boto3_sqs\n"
    )
    assert runtime_imports(tree) == [
        (1, "typing"),
        (2, "typing"),
        (8, "json"),
        (10, "mypy_boto3_sqs"),
    ]


def test_typing_stubs_are_imported_only_for_the_type_checker() -> None:
    stubs = stub_modules()
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for line, module in runtime_imports(tree):
                if module in stubs or _STUB_MODULE.fullmatch(module):
                    found.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not found, "import these under `if TYPE_CHECKING:`:\n" + "\n".join(found)
