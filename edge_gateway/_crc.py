"""CRC32C (Castagnoli) of a buffer: the ``crc32c`` package's C function, loaded alone.

The package's ``__init__`` imports :mod:`importlib.metadata` (for its
``__version__``) and :mod:`argparse` (for its command line): ~2 MB of a
gateway's ~35 MB idle and tens of ms of its start (docs/operations.md,
"Footprint"), for the one function edgegw calls. So this module loads the
package's C extension (``crc32c._crc32c``) by itself, from the package's
directory, without running the package. Should that fail (another layout
of the package), it imports the package as usual: the function is the same.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["crc32c"]


class _Crc32c(Protocol):
    def __call__(self, data: Buffer, value: int = 0, gil_release_mode: int = -1) -> int: ...


_EXTENSION = "crc32c._crc32c"


def _load() -> _Crc32c:
    loaded = sys.modules.get(_EXTENSION)
    if loaded is None:
        loaded = _load_extension()
    if loaded is None:
        import crc32c as package

        return package.crc32c
    function: _Crc32c = loaded.crc32c
    return function


def _load_extension() -> ModuleType | None:
    try:
        package = importlib.util.find_spec("crc32c")  # finds it without running it
    except (ImportError, ValueError):
        return None
    for directory in (package and package.submodule_search_locations) or ():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(directory, "_crc32c" + suffix)
            if not os.path.exists(path):
                continue
            spec = importlib.util.spec_from_file_location(_EXTENSION, path)
            if spec is None or spec.loader is None:
                return None
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except ImportError:
                return None
            # The package, if something imports it later, uses this one.
            sys.modules[_EXTENSION] = module
            return module
    return None


crc32c: _Crc32c = _load()
