"""The standalone fuzz harnesses (``fuzz/``) as modules, for tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

FUZZ_DIR = Path(__file__).resolve().parents[1] / "fuzz"


def load(name: str) -> ModuleType:
    """``fuzz/<name>.py`` as a module (``_harness`` or a harness)."""
    spec = importlib.util.spec_from_file_location(f"_fuzz_{name}", FUZZ_DIR / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def harnesses() -> list[str]:
    return sorted(p.stem for p in FUZZ_DIR.glob("fuzz_*.py"))
