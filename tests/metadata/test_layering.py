"""Imports run one way: the gateway imports the metadata agent, never the reverse.

Checked on the source (every import statement, also those only for type
checking), so a cycle cannot come back behind ``if TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import edge_gateway.metadata

PACKAGE = Path(edge_gateway.metadata.__file__).parent


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_the_metadata_package_does_not_import_the_gateway() -> None:
    files = sorted(PACKAGE.glob("*.py"))
    assert PACKAGE / "agent.py" in files
    for path in files:
        bad = {
            n for n in _imported(path) if n.startswith(("edge_gateway.gateway", "edge_gateway.api"))
        }
        assert not bad, f"{path.name} imports {sorted(bad)}"
