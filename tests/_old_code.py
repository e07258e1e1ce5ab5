"""The gateway's code at an earlier commit, for tests that prove an older reader refuses
what a newer writer makes (docs/operations.md, upgrade order)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def old_sources(commit: str, into: Path) -> Path:
    """``edge_gateway/`` as it was at ``commit``, extracted under ``into`` (returned).

    Skips the test in a copy of the sources without their history.
    """
    done = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "edge_gateway"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0:
        pytest.skip(f"no git history here to take the code of {commit[:10]} from: {done.stderr!r}")
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=done.stdout, check=True, timeout=60)
    return into


def run_old(old: Path, script: str, data: bytes) -> str:
    """Run ``script`` (Python, reading ``data`` on stdin) on the old code; its stdout."""
    return subprocess.run(
        [sys.executable, "-c", script],
        input=data,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(old)},
        cwd=old,
        timeout=60,
        check=True,
    ).stdout.decode()
