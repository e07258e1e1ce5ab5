"""A small real filesystem for disk-full tests: a tmpfs mounted for one test.

Mounting needs root (as in the project's test containers); elsewhere the
tests that need it are skipped with the reason. A tmpfs reports ENOSPC like
any filesystem, and ``posix_fallocate`` on it reserves pages for real, so
a file can take the space of another process's writes.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (e.g. "20m") at ``path``; skip the test if that is not possible."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs (a real disk-full filesystem)")
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip() or res.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(path: Path, leave: int = 0) -> int:
    """Take the free space of the filesystem of ``path`` (but ``leave`` bytes) in one file.

    Returns the bytes taken. The file is ``path`` itself (delete it to give
    the space back).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        st = os.statvfs(path.parent)
        want = max(0, st.f_bavail * st.f_frsize - leave)
        chunk = max(4096, want)
        while chunk >= 4096 and want > 0:
            try:
                os.posix_fallocate(fd, size, min(chunk, want))
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                chunk //= 2
                continue
            size += min(chunk, want)
            want -= min(chunk, want)
        return size
    finally:
        os.close(fd)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
