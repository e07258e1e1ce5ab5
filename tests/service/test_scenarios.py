"""`edgegw scenario run`: a shipped scenario passes; a malformed one is refused clearly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
EDGEGW = Path(sys.executable).parent / "edgegw"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EDGEGW), "scenario", "run", *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.slow
def test_gateway_crashes_scenario_passes(tmp_path: Path) -> None:
    out = run(str(ROOT / "scenarios" / "gateway-crashes.toml"), "--dir", str(tmp_path / "s"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "passed" in out.stdout


def test_malformed_scenarios_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[regions]]\nname = "a"\n[[topics]]\nname = "t"\nhome = "a"\n'
        '[[faults]]\nat_s = 1\naction = "explode"\nregion = "a"\n'
    )
    out = run(str(bad), "--dir", str(tmp_path / "s"))
    assert out.returncode == 2
    assert "explode" in out.stderr
    bad.write_text("regions = 3\n")
    out = run(str(bad), "--dir", str(tmp_path / "s"))
    assert out.returncode == 2
    assert "malformed scenario" in out.stderr
    assert "Traceback" not in out.stderr
