"""Run test processes with a wrong wall clock: Debian's libfaketime, preloaded.

The library is preloaded into the process itself (no ``faketime`` wrapper),
so a signal sent to the process reaches it. Files the kernel stamps keep the
real time, as a store's clock would. ``make test`` installs the package when
it runs as root; elsewhere the tests that need it skip, saying why.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def libfaketime() -> str:
    """Path of libfaketime.so.1 from Debian's packages; skips the test when missing."""
    if shutil.which("faketime") is None or shutil.which("dpkg") is None:
        pytest.skip(
            "faketime is not installed (Debian package faketime; `make test` installs it "
            "when run as root)"
        )
    listed = subprocess.run(
        ["dpkg", "-L", "faketime", "libfaketime"], capture_output=True, text=True, check=False
    ).stdout
    for line in listed.splitlines():
        if line.endswith("/libfaketime.so.1"):
            return line
    pytest.skip("dpkg -L faketime libfaketime lists no libfaketime.so.1")


def shifted(offset: str) -> dict[str, str]:
    """Environment of a process whose wall clock is ``offset`` off (``+40d``, ``-10y``).

    As with ``faketime -f '+40d' CMD``, the monotonic clock is shifted by the
    same constant (intervals are unchanged).
    """
    return {"LD_PRELOAD": libfaketime(), "FAKETIME": offset}


def settable(offset_file: Path) -> dict[str, str]:
    """Environment of a process whose wall clock is set by writing ``offset_file`` (``+1d``).

    The monotonic clock stays real, as the kernel keeps it when the time is
    set. (In this mode libfaketime breaks Python's ``time.sleep``, EINVAL:
    the gateway's serving path does not call it.)
    """
    return {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
