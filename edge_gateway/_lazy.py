"""Module attributes imported on first use (PEP 562), for packages with heavy optional parts."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, sources: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``name`` from ``sources[name]`` on first use.

    The value is then stored in the package, so the next access is a plain
    attribute. Usage: ``__getattr__ = lazy_attributes(__name__, {"serve": "pkg._server"})``.
    """

    def __getattr__(name: str) -> Any:
        module = sources.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
