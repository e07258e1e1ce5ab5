"""`edgegw demo` (what `make run` runs) works end to end: two real gateway processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_two_regions(tmp_path: Path) -> None:
    edgegw = Path(sys.executable).parent / "edgegw"
    out = subprocess.run(
        [
            str(edgegw),
            "demo",
            "--dir",
            str(tmp_path / "demo"),
            "--records",
            "3000",
            "--probes",
            "40",
        ],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "mirrors equal their sources record for record" in " ".join(out.stdout.split())
    assert "Traceback" not in out.stderr
