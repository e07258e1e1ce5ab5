"""Kill -9 a process that appends, reopen, and check every acknowledged record.

The child (``crash_child.py``) prints a line after each append returns; the
parent kills it at a random moment, reopens the journal in the same directory
and checks, for every partition, that offsets run gap-free from 0, that every
acknowledged record is present byte-identical, and that reading everything
serves no corrupt entry. The same directory is reused across kills, so
recovery runs on top of recovery (torn tails, rolls cut short).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_gateway.format.batch import decode_batch
from edge_gateway.journal import Journal, JournalConfig

sys.path.insert(0, str(Path(__file__).parent))
from crash_child import PARTITIONS, record_value

CHILD = Path(__file__).parent / "crash_child.py"


def run_and_kill(path: Path, policy: str, seed: int, run_for: float) -> dict[int, int]:
    """Start the child, kill -9 it after ``run_for`` s; return acked next offset per partition."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(path), policy, str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    acked: dict[int, int] = {}
    deadline = time.monotonic() + run_for + 5  # start-up time
    started = None
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            p, first, count = map(int, line.split())
            acked[p] = max(acked.get(p, 0), first + count)
            if started is None:
                started = time.monotonic()
                deadline = started + run_for
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
        proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
    assert started is not None, f"child never acknowledged anything: {err}"
    return acked


def verify(path: Path, acked: dict[int, int]) -> dict[int, int]:
    j = Journal.open_sync(path, JournalConfig(segment_bytes=128 * 1024, max_bytes=1 << 30))
    try:
        found: dict[int, int] = {}
        for p in range(PARTITIONS):
            offset = 0
            for_lookup = j.next_offset("crash", p)
            while offset < for_lookup:
                entries = j.read("crash", p, offset, max_records=5000)
                assert entries, f"partition {p}: nothing at offset {offset} < {for_lookup}"
                for e in entries:
                    for r in decode_batch(e.payload).records(offset):
                        assert r.offset == offset, f"partition {p}: gap at {offset}"
                        assert r.value == record_value(p, offset), f"{p}/{offset} differs"
                        offset += 1
            found[p] = offset
            assert offset >= acked.get(p, 0), (
                f"partition {p}: acknowledged up to {acked[p]}, journal has {offset}"
            )
        return found
    finally:
        j.close_sync()


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "kills"), [("always", 20), ("interval", 6)])
def test_acknowledged_records_survive_kill_9(tmp_path: Path, policy: str, kills: int) -> None:
    rnd = random.Random(20261122)
    acked: dict[int, int] = {}
    for i in range(kills):
        new = run_and_kill(tmp_path, policy, seed=i, run_for=rnd.uniform(0.05, 0.4))
        for p, o in new.items():
            acked[p] = max(acked.get(p, 0), o)
        found = verify(tmp_path, acked)
        # offsets continue after a crash: nothing acknowledged is reused
        acked = {p: max(acked.get(p, 0), found[p]) for p in found}
    assert sum(acked.values()) > 0
    assert len(list(tmp_path.glob("*.wal"))) > 1  # rolls happened along the way
