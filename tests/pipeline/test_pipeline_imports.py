"""One way to the bucket: the import contract that keeps boto3 inside the S3 backend.

``make lint`` runs every contract of pyproject.toml on the tree (``lint-imports``).
Here the ``one-way-to-the-bucket`` contract runs on a copy of the code, as it
is and with ``import boto3`` added to the pipeline (at module level, and inside
a function, the way the old ``pipeline/_store.py`` did it): the contract must
break, naming the import, or it proves nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "one-way-to-the-bucket"


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    tool = Path(sys.executable).with_name("lint-imports")
    if not tool.exists():
        pytest.fail(f"{tool} is missing: pip install -e '.[dev]'", pytrace=False)
    return subprocess.run(
        [str(tool), "--no-cache", "--contract", CONTRACT, "--config", str(tree / "pyproject.toml")],
        cwd=tree,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tree}:{tree / 'cli'}"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the code and its pyproject.toml (what lint-imports reads)."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "edge_gateway", tmp_path / "edge_gateway", ignore=ignore)
    shutil.copytree(ROOT / "cli" / "edgegw_cli", tmp_path / "cli" / "edgegw_cli", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def test_the_code_keeps_boto3_in_the_s3_backend(tree: Path) -> None:
    result = _lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "KEPT" in result.stdout


@pytest.mark.parametrize(
    "added",
    [
        "import boto3\n",
        "def _client() -> object:\n    import botocore.config\n\n    return botocore.config\n",
    ],
    ids=["module-level", "inside-a-function"],
)
def test_boto3_in_the_pipeline_breaks_the_contract(tree: Path, added: str) -> None:
    plan = tree / "edge_gateway" / "pipeline" / "plan.py"
    plan.write_text(plan.read_text() + "\n\n" + added)
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert "edge_gateway.pipeline.plan" in result.stdout
