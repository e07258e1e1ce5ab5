"""Mirror appends in groups: reserve on the loop, write in a worker thread, publish in order.

``Journal.append_mirror_batches`` (docs/journal.md, "Mirror appends"): nothing
of a group is visible before its write returned, other writers wait for it,
a failure rolls it back (a full disk is handled as any append's write), a
crash mid-write leaves a tail the open truncates, and the shipper steps over
the runs of mirror entries without reading them.
"""

from __future__ import annotations

import errno
import faulthandler
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing
from _faults import FaultyFs

from edge_gateway import failpoints
from edge_gateway.errors import DiskFull, Unavailable
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import (
    JournalConfig,
    MirrorBatch,
    SourceCoords,
    _mirror_append,
    open_journal,
)
from edge_gateway.journal import _fs as fs_module
from edge_gateway.journal._fs import FileOps

CFG = JournalConfig(segment_bytes=1 << 20, max_bytes=1 << 30, reserve_bytes=0)
TOPIC = "north.t"


def mirrored(partition: int, base: int, n: int, size: int = 200) -> bytes:
    return encode_batch(
        [f"{partition}:{base + i}:".encode() + b"x" * size for i in range(n)],
        timestamps=[1_700_000_000_000 + base + i for i in range(n)],
        base_offset=base,
    )


def group(seq: int, per_partition: int = 3, partitions: int = 2) -> list[MirrorBatch]:
    """The batches of source entry ``seq``: ``per_partition`` batches of 4 records each."""
    out = []
    for p in range(partitions):
        for k in range(per_partition):
            base = ((seq - 1) * per_partition + k) * 4
            out.append(MirrorBatch(TOPIC, p, mirrored(p, base, 4)))
    return out


def coords(seq: int) -> tuple[SourceCoords, SourceCoords]:
    return (
        SourceCoords("north", seq, 1, end_of_object=False),
        SourceCoords("north", seq, 1, end_of_object=True),
    )


@pytest.fixture(autouse=True)
def groups_in_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every group here goes through a worker thread, as a catch-up's large entries do
    (a small one is written on the loop: see the last test)."""
    monkeypatch.setattr(_mirror_append, "_INLINE_BYTES", 0)


def entries_key(entries: Sequence[fentry.Entry]) -> list[tuple[object, ...]]:
    return [
        (e.lsn, e.kind, e.topic, e.partition, e.base_offset, e.count, e.source, e.payload)
        for e in entries
    ]


async def test_a_group_writes_the_entries_appends_one_at_a_time_would(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    async with open_journal(a, CFG) as ja, open_journal(b, CFG) as jb:
        for seq in range(1, 4):
            batches = group(seq)
            mid, last = coords(seq)
            got = await ja.append_mirror_batches(batches, mid, last)
            for i, mb in enumerate(batches):
                await jb.append_mirror(
                    mb.topic, mb.partition, mb.batch, last if i == len(batches) - 1 else mid
                )
            assert [g.lsn for g in got] == list(range(got[0].lsn, got[0].lsn + len(batches)))
            assert ja.next_lsn == jb.next_lsn
        await ja.flush()
        await jb.flush()
        full_a = ja.read_entries(1, max_bytes=1 << 30)
        full_b = jb.read_entries(1, max_bytes=1 << 30)
        # append_time may differ by a millisecond between the journals
        assert entries_key(full_a) == entries_key(full_b)
        assert ja.source_progress() == {"north": coords(3)[1]}
        assert ja.next_offset(TOPIC, 1) == 3 * 3 * 4
    async with open_journal(a, CFG) as ja:
        assert entries_key(ja.read_entries(1, max_bytes=1 << 30)) == entries_key(full_a)
        assert ja.source_progress() == {"north": coords(3)[1]}


class _BlockingFs(FileOps):
    """pwritev blocks (in the worker thread) until released, while ``armed``."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def pwritev(self, fd: int, parts: Sequence[bytes | memoryview], pos: int) -> int:  # type: ignore[override]
        if self.armed:
            self.entered.set()
            self.release.wait(60)
        return os.pwritev(fd, parts, pos)


@pytest.fixture
def blocking(monkeypatch: pytest.MonkeyPatch) -> _BlockingFs:
    fs = _BlockingFs()
    monkeypatch.setattr(fs_module, "ops", fs)
    return fs


async def test_a_group_in_flight_is_invisible_until_published(
    tmp_path: Path, blocking: _BlockingFs
) -> None:
    async with open_journal(tmp_path, CFG) as j:
        await j.append_mirror_batches(group(1), *coords(1))
        await j.flush()
        before = (j.next_lsn, j.durable_lsn, j.next_offset(TOPIC, 0), j.source_progress())
        seen = j.read_entries(1, max_bytes=1 << 30, durable_only=False)
        blocking.armed = True
        done = trio.Event()

        async def writer() -> None:
            await j.append_mirror_batches(group(2), *coords(2))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await trio.to_thread.run_sync(blocking.entered.wait)
            # Reserved, being written: nothing of it shows.
            assert not done.is_set()
            assert (j.next_lsn, j.durable_lsn, j.next_offset(TOPIC, 0), j.source_progress()) == (
                before
            )
            assert j.read_entries(1, max_bytes=1 << 30, durable_only=False) == seen
            assert j.read(TOPIC, 0, before[2]) == []
            await j.flush()  # an fsync meanwhile covers only published entries
            assert j.durable_lsn == before[1]
            blocking.release.set()
        assert j.next_lsn == before[0] + len(group(2))
        assert j.source_progress() == {"north": coords(2)[1]}
        assert [e.base_offset for e in j.read(TOPIC, 0, before[2])][:1] == [before[2]]


async def test_a_local_append_waits_for_the_group_in_flight(
    tmp_path: Path, blocking: _BlockingFs
) -> None:
    async with open_journal(tmp_path, CFG) as j:
        blocking.armed = True
        results = []

        async def writer() -> None:
            results.extend(await j.append_mirror_batches(group(1), *coords(1)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await trio.to_thread.run_sync(blocking.entered.wait)
            blocking.armed = False
            # The local append blocks until the thread's write returns, then
            # lands after the group (it must never be written past an
            # unwritten range: a crash would truncate it with the torn tail).
            threading.Timer(0.1, blocking.release.set).start()
            local = j.append_nowait("local", 0, mirrored(0, 0, 2))
        assert local.lsn == results[-1].lsn + 1
        await j.flush()
        kinds = [(e.lsn, e.kind) for e in j.read_entries(1, max_bytes=1 << 30)]
        assert kinds[-1] == (local.lsn, fentry.KIND_DATA)
        assert [k for _, k in kinds[-7:-1]] == [fentry.KIND_MIRROR] * 6
    async with open_journal(tmp_path, CFG) as j:
        assert j.next_offset("local", 0) == 2
        assert j.next_offset(TOPIC, 1) == 12


async def test_a_writer_does_not_wait_for_a_thread_that_has_not_started(tmp_path: Path) -> None:
    # The group's worker thread waits for a token of trio's thread limiter
    # (all taken here): a local append meanwhile writes the group itself
    # (blocking on the thread would deadlock: it needs the loop to start).
    limiter = trio.to_thread.current_default_thread_limiter()
    held = threading.Event()
    # A regression here is a deadlock of the event loop, which nothing in
    # trio can interrupt: bound it by the process (tracebacks, then exit).
    faulthandler.dump_traceback_later(120, exit=True)
    async with open_journal(tmp_path, CFG) as j:
        old = limiter.total_tokens
        limiter.total_tokens = 1
        try:
            results = []

            async def writer() -> None:
                results.extend(await j.append_mirror_batches(group(1), *coords(1)))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, held.wait)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(writer)
                await trio.testing.wait_all_tasks_blocked()
                assert limiter.statistics().tasks_waiting == 1  # the group's thread
                local = j.append_nowait("local", 0, mirrored(0, 0, 2))
                assert local.lsn == j.next_lsn - 1 == 8  # checkpoint, 6 mirror entries, local
                held.set()
            assert [r.lsn for r in results] == list(range(2, 8))
        finally:
            limiter.total_tokens = old
            held.set()
            faulthandler.cancel_dump_traceback_later()
        assert j.source_progress() == {"north": coords(1)[1]}


async def test_a_failure_between_write_and_publish_leaves_nothing_visible(
    tmp_path: Path,
) -> None:
    async with open_journal(tmp_path, CFG) as j:
        await j.append_mirror_batches(group(1), *coords(1))
        before = (j.next_lsn, j.next_offset(TOPIC, 0), j.source_progress())
        failpoints.arm("journal.mirror_publish")
        with pytest.raises(failpoints.FailPointError):
            await j.append_mirror_batches(group(2), *coords(2))
        assert (j.next_lsn, j.next_offset(TOPIC, 0), j.source_progress()) == before
        # The journal goes on where it was: the same group, the same LSNs.
        got = await j.append_mirror_batches(group(2), *coords(2))
        assert got[0].lsn == before[0]
        j.append_nowait("local", 0, mirrored(0, 0, 1))
    async with open_journal(tmp_path, CFG) as j:
        assert j.statistics().truncated_bytes_on_open == 0
        assert j.source_progress() == {"north": coords(2)[1]}
        assert j.next_offset(TOPIC, 0) == 24
        assert j.next_offset("local", 0) == 1


@pytest.fixture
def faulty(monkeypatch: pytest.MonkeyPatch) -> FaultyFs:
    fs = FaultyFs()
    monkeypatch.setattr(fs_module, "ops", fs)
    return fs


async def test_a_full_disk_mid_group_is_refused_like_any_append(
    tmp_path: Path, faulty: FaultyFs
) -> None:
    async with open_journal(tmp_path, CFG) as j:
        await j.append_mirror_batches(group(1), *coords(1))
        before = (j.next_lsn, j.next_offset(TOPIC, 0), j.source_progress())
        # The group's pwritev fails half way (ENOSPC); nothing is shipped, so
        # nothing can be deleted: DiskFull, as append_mirror raises it.
        faulty.fail("write", faulty.calls["write"] + 1, errno=errno.ENOSPC, count=1)
        with pytest.raises(DiskFull):
            await j.append_mirror_batches(group(2), *coords(2))
        assert faulty.failures == 1
        assert (j.next_lsn, j.next_offset(TOPIC, 0), j.source_progress()) == before
        faulty.heal()
        j.check_disk()  # room again: the episode ends
        got = await j.append_mirror_batches(group(2), *coords(2))
        assert got[0].lsn == before[0]
        assert j.source_progress() == {"north": coords(2)[1]}
        await j.flush()
        expect = entries_key(j.read_entries(1, max_bytes=1 << 30))
    async with open_journal(tmp_path, CFG) as j:
        assert entries_key(j.read_entries(1, max_bytes=1 << 30)) == expect
        assert j.next_offset(TOPIC, 1) == 24


async def test_a_write_error_mid_group_stops_intake_with_nothing_of_it_visible(
    tmp_path: Path, faulty: FaultyFs
) -> None:
    async with open_journal(tmp_path, CFG) as j:
        await j.append_mirror_batches(group(1), *coords(1))
        await j.flush()
        before = (j.next_lsn, j.next_offset(TOPIC, 0), j.source_progress())
        faulty.fail("write", faulty.calls["write"] + 1, errno=errno.EIO, count=1)
        with pytest.raises(Unavailable):
            await j.append_mirror_batches(group(2), *coords(2))
        assert (j.next_lsn, j.next_offset(TOPIC, 0), j.source_progress()) == before
        with pytest.raises(Unavailable):
            j.append_nowait("local", 0, mirrored(0, 0, 1))
        faulty.heal()
    async with open_journal(tmp_path, CFG) as j:
        assert j.source_progress() == {"north": coords(1)[1]}
        assert j.next_offset(TOPIC, 0) == 12


_CRASH_CHILD = """
import os, sys, trio
sys.path[:0] = [sys.argv[2], os.path.dirname(sys.argv[2])]
from test_mirror_groups import CFG, group, coords, mirrored
from edge_gateway.journal import _fs, open_journal

class TornFs(_fs.FileOps):
    armed = False
    def pwritev(self, fd, parts, pos):
        if self.armed:
            data = b"".join(parts)
            os.pwrite(fd, data[: len(data) * 2 // 3 + 7], pos)  # mid-entry
            os._exit(9)  # the process dies mid-write, before the publish
        return os.pwritev(fd, parts, pos)

async def main():
    fs = _fs.ops = TornFs()
    async with open_journal(sys.argv[1], CFG) as j:
        await j.append_mirror_batches(group(1), *coords(1))
        res = j.append_nowait("local", 0, mirrored(0, 0, 3))
        print(res.lsn, flush=True)  # acknowledged
        fs.armed = True
        await j.append_mirror_batches(group(2), *coords(2))
        print("published", flush=True)

trio.run(main)
"""


def test_a_crash_mid_group_write_keeps_what_was_acknowledged(tmp_path: Path) -> None:
    here = Path(__file__).parent
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH_CHILD, str(tmp_path), str(here)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 9, proc.stderr
    acked = proc.stdout.split()
    assert len(acked) == 1  # the local append; the group never returned

    async def check() -> None:
        async with open_journal(tmp_path, CFG) as j:
            assert j.statistics().truncated_bytes_on_open > 0  # the torn tail
            assert j.next_offset("local", 0) == 3
            entries = j.read_entries(1, max_bytes=1 << 30)
            mirror = [e for e in entries if e.kind == fentry.KIND_MIRROR]
            # Group 1 whole, then a prefix of group 2 made of whole entries,
            # each recording the coordinates it was written with.
            assert len(mirror) in range(6, 12)
            assert [e.source for e in mirror[:6]] == [coords(1)[0]] * 5 + [coords(1)[1]]
            assert all(e.source == coords(2)[0] for e in mirror[6:])
            progress = j.source_progress()["north"]
            assert progress == mirror[-1].source
            # The journal appends on after the truncated tail.
            j.append_nowait("local", 0, mirrored(0, 3, 1))
        async with open_journal(tmp_path, CFG) as j:
            assert j.next_offset("local", 0) == 4

    trio.run(check)


async def test_the_shipper_steps_over_runs_of_mirror_entries_unread(tmp_path: Path) -> None:
    async with open_journal(tmp_path, CFG) as j:
        j.append_nowait("local", 0, mirrored(0, 0, 2))
        await j.append_mirror_batches(group(1), *coords(1))
        await j.append_mirror_batches(group(2), *coords(2))
        j.append_nowait("local", 0, mirrored(0, 2, 2))
        await j.append_mirror("", 0, None, coords(3)[1])  # a progress marker
        await j.flush()
        full = j.read_entries(1, max_bytes=1 << 30)
        light = j.read_entries(1, max_bytes=1 << 30, payload_kinds={fentry.KIND_DATA})
        assert [e.kind for e in light] == [
            fentry.KIND_DATA,
            fentry.KIND_MIRROR,
            fentry.KIND_DATA,
            fentry.KIND_MIRROR,
        ]
        # One entry per run: its last LSN and the run's bytes.
        assert [e.lsn for e in light] == [
            full[0].lsn,
            full[12].lsn,
            full[13].lsn,
            full[14].lsn,
        ]
        assert light[1].length == sum(e.length for e in full[1:13])
        assert sum(e.length for e in light) == sum(e.length for e in full)
        assert [e for e in light if e.kind == fentry.KIND_DATA] == [
            e for e in full if e.kind == fentry.KIND_DATA
        ]
        # Paged by max_bytes as before: a read starting inside a run.
        page = j.read_entries(full[3].lsn, max_bytes=1, payload_kinds={fentry.KIND_DATA})
        assert [(e.lsn, e.kind) for e in page] == [(full[3].lsn, fentry.KIND_MIRROR)]
        assert page[0].length == full[3].length
        # The shipper reads in a worker thread: the same runs, stepped over alike.
        data_only = {fentry.KIND_DATA}
        assert await j.read_entries_in_thread(1, max_bytes=1 << 30, payload_kinds=data_only) == (
            light
        )
        assert (
            await j.read_entries_in_thread(full[3].lsn, max_bytes=1, payload_kinds=data_only)
            == page
        )
    async with open_journal(tmp_path, CFG) as j:
        # After a reopen the runs are not known: stepped over by their headers.
        light = j.read_entries(1, max_bytes=1 << 30, payload_kinds={fentry.KIND_DATA})
        assert [e.lsn for e in light] == [e.lsn for e in full]


async def test_a_small_group_is_written_on_the_loop_not_handed_to_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quiet site's entries (a few hundred bytes, replayed from packs by the
    thousand) cost more to hand to a worker thread and back than to write:
    up to ``_INLINE_BYTES`` the group is written and published on the loop,
    with the same bytes and the same visibility as the threaded path."""
    monkeypatch.setattr(_mirror_append, "_INLINE_BYTES", 64 * 1024)
    handed: list[object] = []
    real = trio.to_thread.run_sync

    async def counting(fn: object, *args: object, **kw: object) -> object:
        handed.append(fn)
        return await real(fn, *args, **kw)  # type: ignore[arg-type]

    a, b = tmp_path / "a", tmp_path / "b"
    async with open_journal(a, CFG) as ja, open_journal(b, CFG) as jb:
        monkeypatch.setattr(trio.to_thread, "run_sync", counting)
        for seq in range(1, 4):
            batches = group(seq)
            assert sum(len(mb.batch) for mb in batches) < 64 * 1024
            got = await ja.append_mirror_batches(batches, *coords(seq))
            # Published when the call returns: readers and the offsets see it.
            assert ja.next_lsn == got[-1].lsn + 1
            assert ja.source_progress() == {"north": coords(seq)[1]}
        writes = [fn for fn in handed if getattr(fn, "__name__", "") == "write_in_thread"]
        assert writes == []
        # A large group still goes to a worker thread.
        big = [MirrorBatch(TOPIC, 0, mirrored(0, 3 * 3 * 4, 4, size=20_000))]
        await ja.append_mirror_batches(big, *coords(4))
        assert [getattr(fn, "__name__", "") for fn in handed].count("write_in_thread") == 1
        monkeypatch.setattr(trio.to_thread, "run_sync", real)
        for seq in range(1, 5):
            batches = group(seq) if seq < 4 else big
            mid, last = coords(seq)
            for i, mb in enumerate(batches):
                await jb.append_mirror(
                    mb.topic, mb.partition, mb.batch, last if i == len(batches) - 1 else mid
                )
        await ja.flush()
        await jb.flush()
        assert entries_key(ja.read_entries(1, max_bytes=1 << 30)) == entries_key(
            jb.read_entries(1, max_bytes=1 << 30)
        )
