"""``[encryption]`` without the ``cryptography`` package stops the load (issue 41.5).

configuration.md: loading "stops the gateway before it touches disk or
network". The extra is installed here, so a child process blocks it
(``sys.modules["cryptography"] = None``: every import of it raises
ImportError, as on a device installed without ``edgegw[encryption]``) and
runs the real ``edgegw serve``. It must exit 2 at once with a message naming
the package and the extra, and leave no data directory behind -- not start,
accept a write and die at its first ship.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_gateway.encryption import write_key_file

#: ``edgegw ARGS`` in a process where ``cryptography`` cannot be imported.
BLOCKED = """
import sys
sys.modules["cryptography"] = None
try:
    import cryptography.hazmat.primitives.ciphers.aead
except ImportError:
    pass
else:
    raise SystemExit("cryptography is not blocked")
sys.argv = ["edgegw", *sys.argv[1:]]
from edgegw_cli.app import main
main()
"""


def _config(tmp_path: Path, section: str) -> Path:
    path = tmp_path / "edgegw.toml"
    path.write_text(
        f"""
region = "north"
data_dir = "{tmp_path / "data"}"
[api]
listen = "127.0.0.1:0"
[[topics]]
name = "t"
home = "north"
partitions = 1
{section}
"""
    )
    return path


@pytest.mark.parametrize(
    "section",
    [
        pytest.param('[encryption]\nkey_file = "{keys}/north-1.key"\n', id="write-key"),
        pytest.param(
            '[encryption.sources.south]\nkey_files = ["{keys}/south-1.key"]\n', id="source-keys"
        ),
    ],
)
def test_serve_without_cryptography_stops_at_load(tmp_path: Path, section: str) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("north-1", "south-1"):
        write_key_file(keys / f"{name}.key", os.urandom(32))
    config = _config(tmp_path, section.format(keys=keys))
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED, "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,  # a config error exits in about a second; a serving gateway never does
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "cryptography" in out, out
    assert "pip install 'edgegw[encryption]'" in out, out
    assert str(config) in out, out  # a config error: it names the file
    # Before disk: no data directory (journal, lock, bucket) was made.
    assert not (tmp_path / "data").exists(), sorted(p.name for p in (tmp_path / "data").iterdir())


def test_serve_without_cryptography_and_without_encryption_starts(tmp_path: Path) -> None:
    """The check is for [encryption] only: a gateway that does not encrypt needs no extra."""
    config = _config(tmp_path, "")
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOCKED, "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        addr = tmp_path / "data" / "api.addr"
        for _ in range(600):
            if addr.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert addr.exists(), proc.poll()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
