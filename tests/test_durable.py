"""edge_gateway.durable: a small file replaced whole, or not at all."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from edge_gateway.durable import replace_file


class _Recorder:
    """``os`` with every call recorded and one kind of call failing on demand."""

    def __init__(self, fail: str | None = None, err: int = errno.ENOSPC) -> None:
        self.calls: list[str] = []
        self.fail, self.err = fail, err

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if name == self.fail:
                raise OSError(self.err, os.strerror(self.err))
            return real(*args, **kwargs)

        return call


def test_replaces_the_file_and_syncs_file_then_directory(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    ops = _Recorder()
    replace_file(target, b"new" * 100_000, ops=ops)
    assert target.read_bytes() == b"new" * 100_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    # data fsynced before the rename, the directory after it
    assert ops.calls.index("fsync") < ops.calls.index("replace")
    assert ops.calls[ops.calls.index("replace") :].count("fsync") == 1


def test_no_directory_sync_when_told(tmp_path: Path) -> None:
    ops = _Recorder()
    replace_file(tmp_path / "x.idx", b"index", sync_dir=False, ops=ops)
    assert ops.calls.count("fsync") == 1
    assert (tmp_path / "x.idx").read_bytes() == b"index"


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
def test_a_failed_step_keeps_the_old_file_and_removes_the_temporary(
    tmp_path: Path, step: str
) -> None:
    target = tmp_path / "shipper.json"
    target.write_bytes(b'{"epoch": 3}')
    with pytest.raises(OSError, match="No space") as info:
        replace_file(target, b'{"epoch": 4}', ops=_Recorder(fail=step))
    assert info.value.errno == errno.ENOSPC
    assert target.read_bytes() == b'{"epoch": 3}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shipper.json"]


def test_creates_a_missing_file(tmp_path: Path) -> None:
    replace_file(tmp_path / "new.addr", b"http://127.0.0.1:1\n")
    assert (tmp_path / "new.addr").read_bytes() == b"http://127.0.0.1:1\n"
