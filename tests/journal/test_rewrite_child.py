"""The rewrite's child process (``journal/_rewrite_child.py``): deaths, its parent's, priority.

A live journal's rewriter runs steps 1-3 of a segment's rewrite (write the
``.z-tmp``, fsync, verify) in a child process so that the gateway's event
loop never waits for the GIL. These tests run real child processes: one
killed with SIGKILL mid-rewrite (the ``.z-tmp`` goes, the segment stays, the
failure is counted and the next rewrite succeeds), a rewrite cancelled (the
child is killed and reaped: no process outlives it), a parent killed with
SIGKILL (the child sees its stdin end and exits), and the child's priority
and reported memory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

from edge_gateway.format.atrest import MAGIC
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import Journal, JournalConfig

CFG = JournalConfig(segment_bytes=1024 * 1024, max_bytes=256 * 1024 * 1024)
#: A duty this small makes a rewrite of a 1 MiB segment last seconds: time to act on its child.
SLOW = 0.01


def _fill(root: Path) -> Journal:
    """A journal with at least one sealed entry log of ~1 MiB (~9,000 entries)."""
    j = Journal.open_sync(root, CFG)
    i = 0
    while len(j._segment_set.segments) < 2:
        value = b'{"sensor": %d, "reading": %d.%03d}' % (i % 97, i, i % 1000) + b" " * 40
        j.append_nowait("t", i % 8, encode_batch([value], timestamps=[i]))
        i += 1
    return j


def _state(pid: int) -> str | None:
    """The process's state letter (``Z`` a zombie), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _gone(pid: int) -> bool:
    return _state(pid) in (None, "Z")


async def _child_of(j: Journal, tmp_present: Path | None = None) -> int:
    """The pid of the rewrite's child, once it runs (and once its ``.z-tmp`` exists)."""
    with trio.fail_after(60):
        while True:
            pid = j.rewriter.statistics().child_pid
            if pid is not None and (tmp_present is None or list(tmp_present.glob("*.z-tmp"))):
                return pid
            await trio.sleep(0.01)


async def test_a_child_killed_mid_rewrite_leaves_the_segment_and_is_retried(
    tmp_path: Path,
) -> None:
    root = tmp_path / "j"
    j = _fill(root)
    try:
        seg = j._segment_set.segments[0]
        original = seg.path.read_bytes()
        budget = j.statistics().bytes
        j.rewriter.duty = SLOW
        async with trio.open_nursery() as nursery:
            result: list[bool] = []

            async def rewrite() -> None:
                result.append(await j.rewriter.rewrite(seg))

            nursery.start_soon(rewrite)
            pid = await _child_of(j, root)
            # low priority: nice 19 (field 19 of /proc/PID/stat), SCHED_IDLE where allowed
            assert int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16]) == 19
            os.kill(pid, signal.SIGKILL)
        assert result == [False]
        assert _gone(pid)
        rw = j.rewriter.statistics()
        assert rw.failures == 1
        assert rw.child_pid is None
        assert rw.last_error is not None
        assert "SIGKILL" in rw.last_error
        assert seg.compressed is None
        assert seg.path.read_bytes() == original
        assert not list(root.glob("*.z-tmp"))
        assert j.statistics().bytes == budget  # the .z-tmp's estimate is given back
        # tried again: it goes through, and reads the same
        j.rewriter.duty = 1.0
        before = j.read("t", 3, 0, max_records=10**6)
        assert await j.rewriter.rewrite(seg)
        assert seg.path.read_bytes()[:4] == MAGIC
        assert j.read("t", 3, 0, max_records=10**6) == before
        rw = j.rewriter.statistics()
        assert rw.segments == 1
        # the child's peak memory is reported: Python, a map of the segment, its output
        assert 5 * 1024 * 1024 < rw.child_max_rss_bytes < 200 * 1024 * 1024
        assert j.statistics().rewrite_child_max_rss_bytes == rw.child_max_rss_bytes
    finally:
        j.close_sync()


async def test_a_cancelled_rewrite_kills_and_reaps_its_child(tmp_path: Path) -> None:
    root = tmp_path / "j"
    j = _fill(root)
    try:
        j.rewriter.duty = SLOW
        async with trio.open_nursery() as nursery:
            await nursery.start(j.rewriter.run)
            j.rewriter.sealed()
            pid = await _child_of(j, root)
            nursery.cancel_scope.cancel()
        # reaped, not a zombie: the rewrite waited for it
        assert _state(pid) is None
        assert j.rewriter.statistics().child_pid is None
        assert not list(root.glob("*.z-tmp"))
        assert j._segment_set.segments[0].compressed is None
        assert j.rewriter.statistics().failures == 0
    finally:
        j.close_sync()


async def test_the_child_ignores_a_shutdown_signal_meant_for_its_group(tmp_path: Path) -> None:
    root = tmp_path / "j"
    j = _fill(root)
    try:
        j.rewriter.duty = 0.5
        seg = j._segment_set.segments[0]
        async with trio.open_nursery() as nursery:
            result: list[bool] = []

            async def rewrite() -> None:
                result.append(await j.rewriter.rewrite(seg))

            nursery.start_soon(rewrite)
            pid = await _child_of(j, root)
            # systemd's stop and Ctrl-C signal every process of the group
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGINT)
        assert result == [True]
        assert j.rewriter.statistics().failures == 0
        assert seg.path.read_bytes()[:4] == MAGIC
    finally:
        j.close_sync()


PARENT = """
import sys, trio
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from test_rewrite_child import _child_of, _fill

async def main() -> None:
    root = Path(sys.argv[1])
    j = _fill(root)
    j.rewriter.duty = %r
    async with trio.open_nursery() as nursery:
        await nursery.start(j.rewriter.run)
        j.rewriter.sealed()
        print(await _child_of(j, root), flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


def test_the_child_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    root = tmp_path / "j"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT % SLOW, str(root), str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line.strip().isdigit(), line
        pid = int(line)
        assert not _gone(pid)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(pid), "the rewrite's child outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    # the .z-tmp it left is deleted by the next open, which reads everything
    j = Journal.open_sync(root, CFG)
    try:
        assert not list(root.glob("*.z-tmp"))
        assert j._segment_set.segments[0].path.read_bytes()[:4] != MAGIC
    finally:
        j.close_sync()


async def test_the_child_compresses_what_the_thread_compresses(tmp_path: Path) -> None:
    _fill(tmp_path / "j").close_sync()
    out = {}
    for in_child in (True, False):
        root = tmp_path / f"j{in_child}"
        shutil.copytree(tmp_path / "j", root)
        j = Journal.open_sync(root, CFG)
        try:
            j.rewriter.in_child = in_child
            assert await j.rewriter.rewrite_all() == len(j._segment_set.segments) - 1
            out[in_child] = j._segment_set.segments[0].path.read_bytes()
        finally:
            j.close_sync()
    assert out[True][:4] == MAGIC
    assert out[True] == out[False]
