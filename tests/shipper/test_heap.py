"""The C heap after a burst of big buffers in worker threads (``edge_gateway.heap``).

A drain reads and compresses buffers of a few MiB in worker threads. With
glibc's dynamic thresholds, one big buffer freed makes the next ones come
from the thread's heap, whose free top ``malloc_trim`` does not give back:
a real process (a child, measured by its ``RssAnon``) keeps them after the
trim; with :func:`edge_gateway.heap.tune`, as ``edgegw serve`` calls it at
start, it does not.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import trio

from edge_gateway import heap

MiB = 1024 * 1024

# A drain in miniature: one 16 MiB buffer freed (it raises glibc's dynamic
# thresholds), then 24 MiB in 4 MiB buffers freed, in a worker thread, a
# small block kept; then the trim the shipper does after a drain.
CHILD = """
import sys, threading
from edge_gateway import heap
if sys.argv[1] == "tune":
    assert heap.tune(), "mallopt refused"
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
kept = []
def drain():
    big = bytearray(16 << 20)
    del big
    buffers = [bytearray(4 << 20) for _ in range(6)]
    kept.append(bytearray(64))
    buffers.clear()
before = anon()
t = threading.Thread(target=drain)
t.start()
t.join()
assert heap.trim()
print(anon() - before)
"""


def run_child(code: str, mode: str) -> int:
    """The number ``code`` prints, run in a child without the environment's malloc settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("GLIBC_TUNABLES", None)
    out = subprocess.run(
        [sys.executable, "-c", code, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    return int(out.stdout)


def kept_after_drain(mode: str) -> int:
    return run_child(CHILD, mode)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc only")
def test_tuned_thresholds_give_a_drains_buffers_back() -> None:
    # Without the tuning the buffers stay (this is what the tuning is for:
    # if glibc ever stops doing this, the tuning may go).
    assert kept_after_drain("default") >= 16 * MiB
    assert kept_after_drain("tune") <= 4 * MiB


def test_the_operators_own_thresholds_win() -> None:
    # (with the operator's arena cap too, so that this process stays as it is)
    own = {"MALLOC_ARENA_MAX": "4"}
    assert heap.tune({**own, "MALLOC_MMAP_THRESHOLD_": "65536"}) is False
    assert heap.tune({**own, "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}) is False
    tunables = "glibc.malloc.arena_max=4:glibc.malloc.mmap_threshold=65536"
    assert heap.tune({"GLIBC_TUNABLES": tunables}) is False
    assert heap.statistics()["arena_max"] is None


# Eight threads alive at once, each allocating from the C heap (blocks below
# the mmap threshold): glibc gives each a heap of its own, up to 8 per core,
# each a 64 MiB-aligned mapping; capped, they share.
ARENAS = """
import sys, threading
from edge_gateway import heap
if sys.argv[1] == "tune":
    assert heap.tune(), "mallopt refused"
    assert heap.statistics()["arena_max"] == heap.ARENA_MAX
barrier = threading.Barrier(8)
kept = []
def work():
    barrier.wait()
    kept.append([bytearray(100_000) for _ in range(4)])
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
heaps = 0
for line in open("/proc/self/maps"):
    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
    fields = line.split()
    if len(fields) == 5 and lo % (64 << 20) == 0 and "rw" in fields[1]:
        heaps += 1
print(heaps)
"""


def thread_heaps(mode: str) -> int:
    return run_child(ARENAS, mode)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc only")
def test_tuned_threads_share_few_heaps() -> None:
    # glibc's own limit is 8 per core: eight threads get eight heaps (if
    # this stops being so, the cap may go).
    assert thread_heaps("default") >= 4
    # The cap counts the main heap (brk, not 64 MiB-aligned) too.
    assert thread_heaps("tune") <= heap.ARENA_MAX - 1


async def test_keep_trimmed_trims_every_interval() -> None:
    before = heap.statistics()["trims"]
    with trio.move_on_after(0.5):
        await heap.keep_trimmed(0.05)
    assert heap.statistics()["trims"] - before >= 3
