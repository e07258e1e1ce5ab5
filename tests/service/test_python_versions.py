"""The supported Python versions are stated once in pyproject.toml and repeated consistently."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def supported() -> list[tuple[int, int]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    prefix = "Programming Language :: Python :: 3."
    minors = sorted(int(c.removeprefix(prefix)) for c in project["classifiers"]
                    if c.startswith(prefix) and c.removeprefix(prefix).isdigit())  # fmt: skip
    return [(3, m) for m in minors]


def test_classifiers_requires_python_readme_and_makefile_agree() -> None:
    versions = supported()
    oldest, newest = versions[0], versions[-1]
    # no gap in the classifiers: every minor between the oldest and the newest
    assert versions == [(3, m) for m in range(oldest[1], newest[1] + 1)]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # No upper bound: a newer Python installs (make warns), as the README says.
    assert project["requires-python"] == f">=3.{oldest[1]}"
    readme = (ROOT / "README.md").read_text()
    assert f"with Python 3.{oldest[1]}+ (tested: 3.{oldest[1]} to 3.{newest[1]};" in readme
    listed = ", ".join(f"3.{m}" for _, m in versions[:-1]) + f" and 3.{newest[1]}"
    assert f"Supported Python versions: **{listed}**" in readme
    makefile = (ROOT / "Makefile").read_text()
    assert f"assert v >= (3, {oldest[1]})" in makefile
    assert f"v > (3, {newest[1]}) and print(" in makefile


def test_this_interpreter_is_supported() -> None:
    assert sys.version_info[:2] in supported()
