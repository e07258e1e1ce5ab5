"""``edge_gateway._crc``: the crc32c package's C function, loaded without the package."""

from __future__ import annotations

import json
import subprocess
import sys

import crc32c as package

from edge_gateway._crc import crc32c


def test_the_same_function_as_the_package() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    for data in (b"", b"x", bytes(range(256)) * 17, memoryview(b"abcdef")[1:4]):
        assert crc32c(data) == package.crc32c(data)
        assert crc32c(data, value=12345) == package.crc32c(data, value=12345)


def test_loading_it_runs_not_the_package() -> None:
    code = (
        "import json, sys; from edge_gateway._crc import crc32c; crc32c(b'x');"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    modules = set(json.loads(out.stdout))
    assert "crc32c._crc32c" in modules
    assert not modules & {"crc32c", "importlib.metadata", "argparse"}
