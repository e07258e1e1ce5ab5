"""The data-directory and journal locks (edge_gateway.datadir)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_gateway.datadir import LOCK_FILE, holder_of, lock_directory
from edge_gateway.errors import InUse
from edge_gateway.journal import Journal


def test_a_second_lock_is_refused_naming_the_holder(tmp_path: Path) -> None:
    lock = lock_directory(tmp_path, "gateway")
    try:
        with pytest.raises(
            InUse, match=rf"in use by another edgegw process: pid {os.getpid()} "
        ) as e:
            lock_directory(tmp_path, "sync")
        assert e.value.holder is not None
        assert e.value.holder.role == "gateway"
        holder = holder_of(tmp_path)
        assert holder is not None
        assert holder.pid == os.getpid()
    finally:
        lock.release()
    assert holder_of(tmp_path) is None
    lock_directory(tmp_path, "sync").release()  # free again
    assert (tmp_path / LOCK_FILE).exists()  # never deleted (see the module docstring)


def test_holder_of_creates_nothing(tmp_path: Path) -> None:
    assert holder_of(tmp_path / "nope") is None
    assert not (tmp_path / "nope").exists()


def test_a_journal_cannot_be_opened_twice(tmp_path: Path) -> None:
    j = Journal.open_sync(tmp_path / "journal")
    try:
        with pytest.raises(InUse, match="journal"):
            Journal.open_sync(tmp_path / "journal")
    finally:
        j.close_sync()
    Journal.open_sync(tmp_path / "journal").close_sync()


def test_kill_9_of_the_holder_frees_the_lock(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from edge_gateway.datadir import lock_directory\n"
            f"lock_directory({str(tmp_path)!r}, 'gateway')\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(InUse, match=f"pid {child.pid} "):
            lock_directory(tmp_path, "serve")
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    deadline = time.monotonic() + 10
    while holder_of(tmp_path) is not None:  # the kernel releases it with the process
        assert time.monotonic() < deadline
        time.sleep(0.01)
    lock_directory(tmp_path, "serve").release()
