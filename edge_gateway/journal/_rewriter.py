"""The rewriter: sealed segments of a LIVE journal rewritten compressed, in the background.

docs/at-rest.md ("The atomic swap", "Increment 2"). What it owns: which sealed
entry log (``EGWJ``) is rewritten next (the oldest not yet compressed; never
the active segment), the rewrite's temporary file ``<lsn>.wal.z-tmp`` and its
share of the budget, the swap of the segment in memory, and the counters of
:meth:`Rewriter.statistics`. ``compress_sealed_segment`` (``_compress.py``,
a closed journal) runs the same steps through the same functions
(:func:`write_compressed`, :func:`fsync_dir`).

The steps, and where each runs:

1. write ``<lsn>.wal.z-tmp`` (``iter_compressed``), 2. fsync it, 3. verify it
   (it expands to the segment's bytes, byte for byte): :func:`write_compressed`
   in a child process (:func:`rewrite_in_child`, ``_rewrite_child.py``), so
   that Python's encoding never holds this process's GIL while a request
   waits; the child runs at nice 19 / ``SCHED_IDLE`` and is paced by
   :class:`Pacer` to at most :data:`DUTY` of one core. A child that dies
   leaves the segment untouched (its ``.z-tmp`` unlinked, a failure, the
   backoff); a child whose parent dies exits (its stdin ends). With
   ``Rewriter.in_child = False`` the same function runs on a worker thread
   instead: for the tests that replace ``_fs.ops``, which a child cannot see;
4. rename it over ``<lsn>.wal`` and swap the segment in memory
   (:meth:`SegmentSet.swap_compressed`): on the event loop, in one step with no
   checkpoint between. Reads (``read``, ``read_entry``, ``read_entries``) are
   synchronous on the event loop, so none sees half a swap; a worker thread's
   read holds a duplicate of the old descriptor, which keeps reading the old
   file. Retention and drop-oldest are never held up: they run on the event
   loop too, so a segment they delete while its rewrite runs is simply not
   there any more at step 4, and the rewrite is dropped (its ``.z-tmp``
   unlinked) instead of bringing the deleted segment back;
5. fsync the directory, 6. unlink ``<lsn>.idx`` (the entry log's index, last:
   until the rename is durable a crash may bring the entry log back, and it
   wants its index).

A crash at any step leaves a journal the next open reads: it deletes a
``.z-tmp``, and an ``.idx`` beside a compressed segment.

Budget (``journal.max_bytes`` counts compressed bytes): a rewrite starts only
if the budget has room for its temporary file (estimated at a tenth of the
segment, :data:`TMP_ESTIMATE`), which counts while the rewrite runs. When an
append finds the budget full while sealed segments wait for their rewrite, the
journal lets it into a slack of one segment (``journal.segment_bytes`` over
``journal.max_bytes``) and calls :meth:`Rewriter.hurry`: the rewriter then runs
unpaced (still at low priority, in its child) until the journal is back under
its budget. The append never waits for a rewrite, and the event loop never
runs one; only when the slack is used up too is the append refused
(``JournalFull``) or, in a drop-oldest lane, old data dropped.

Failures of a rewrite (``ENOSPC``, ``EIO`` writing the temporary file, a
verify that does not match) never touch the segment: the ``.z-tmp`` is
unlinked, the failure counted and logged, and the rewriter backs off
(:data:`BACKOFF_S`, doubling up to :data:`BACKOFF_MAX_S`). A segment of a
version this journal cannot compress (one it does not know) is skipped, not
failed; versions 1-3 are compressed (a version 3 segment's block entries
become frames of their own, as fetched).
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import trio

import edge_gateway
from edge_gateway.errors import CorruptData
from edge_gateway.failpoints import ENV as FAILPOINTS_ENV
from edge_gateway.failpoints import fail_point
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.atrest import SegmentDirectory
from edge_gateway.journal import _fs
from edge_gateway.journal._compressed import TMP_SUFFIX, CompressedFile
from edge_gateway.journal._fs import fsync_dir
from edge_gateway.journal._index import IndexCache
from edge_gateway.journal._segment import INDEX_SUFFIX, Segment
from edge_gateway.journal._segment_set import SegmentSet

__all__ = [
    "BACKOFF_MAX_S",
    "BACKOFF_S",
    "DUTY",
    "TMP_ESTIMATE",
    "Pacer",
    "Prepared",
    "RewriteStats",
    "Rewriter",
    "rewrite_in_child",
    "expand_file",
    "expand_in_place",
    "fsync_dir",
    "write_compressed",
]

log = logging.getLogger("edgegw.journal")

#: Share of one core the background rewrite takes at most (its worker thread
#: sleeps after each slice of work for the rest; see :class:`Pacer`).
DUTY: Final = 0.25
#: The temporary file is counted in the budget as this share of the segment
#: (telemetry compresses 10-14x; the file's real size replaces it at the swap).
TMP_ESTIMATE: Final = 0.1
#: After a failed rewrite the rewriter waits this long, doubling up to the max.
BACKOFF_S: Final = 1.0
BACKOFF_MAX_S: Final = 60.0
#: Without a roll to wake it, the rewriter looks again this often (room in the
#: budget, a segment retention took away).
IDLE_S: Final = 5.0
#: The module the rewrite's child process runs (``python -m``).
CHILD_MODULE: Final = "edge_gateway.journal._rewrite_child"
#: How long the parent waits for a child to exit once its pipes are closed.
CHILD_EXIT_S: Final = 10.0
#: A journal segment's header (format.md): magic, version, 3 zero, base LSN.
_WAL_HEADER: Final = struct.Struct("<4sB3xQ")


# ---------------------------------------------------------------- the file steps


@dataclass(frozen=True, slots=True)
class Prepared:
    """A verified temporary file, ready to be renamed over its segment (steps 1-3 done)."""

    tmp: Path
    directory: SegmentDirectory
    #: bytes of the entry log and of the compressed file
    wal_bytes: int
    size: int


def write_compressed(
    path: Path,
    *,
    level: int,
    frame_raw_bytes: int = atrest.DEFAULT_FRAME_RAW_BYTES,
    chunk_raw_bytes: int = atrest.DEFAULT_CHUNK_RAW_BYTES,
    tick: Callable[[], None] | None = None,
    step: Callable[[str], None] = fail_point,
) -> Prepared | None:
    """Steps 1-3 of the swap for the sealed entry log at ``path``: write, fsync, verify.

    Blocking (the rewrite's child process, ``_rewrite_child.py``; or the
    caller's thread). None: a segment this journal does not
    compress (its version; the file untouched, nothing written). On any
    failure the temporary file is unlinked and the error raised (``OSError``,
    ``CorruptData`` when the file does not expand to the segment's bytes).
    ``tick`` is called every few milliseconds of work (:class:`Pacer`);
    ``step`` with the name of each step done (``rewriter.written``,
    ``rewriter.verified``: the fail points; the child reports them to its
    parent instead).
    """
    where = str(path)
    fd = _fs.ops.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, fentry.SEGMENT_HEADER_SIZE, 0)
        if head[: len(atrest.MAGIC)] == atrest.MAGIC:
            return None  # compressed already (a rewrite whose swap a crash cut short)
        if len(head) == fentry.SEGMENT_HEADER_SIZE and (
            fentry.segment_version(head) not in fentry.SEGMENT_VERSIONS
        ):
            return None  # a version this code does not know: not compressed
        fentry.decode_segment_header(head, where=where)
        wal = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        _fs.ops.close(fd)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    view = memoryview(wal)
    pieces = atrest.iter_compressed(
        view,
        level=level,
        frame_raw_bytes=frame_raw_bytes,
        chunk_raw_bytes=chunk_raw_bytes,
        where=where,
        tick=tick,
    )
    try:
        out = _fs.ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for piece in pieces:
                _fs.write_all(_fs.ops, out, piece)
            _fs.ops.fsync(out)
        finally:
            _fs.ops.close(out)
        step("rewriter.written")
        written = tmp.read_bytes()
        directory = _verify(written, wal, str(tmp), tick)
        step("rewriter.verified")
    except BaseException:
        with contextlib.suppress(OSError):
            _fs.ops.unlink(tmp)
        raise
    finally:
        # the map closes only once no view of it is left (the generator holds one)
        pieces.close()
        view.release()
        wal.close()
    return Prepared(tmp, directory, size, len(written))


def _verify(
    written: bytes, wal: mmap.mmap, where: str, tick: Callable[[], None] | None
) -> SegmentDirectory:
    """The compressed file read back expands to the segment, byte for byte (paced too)."""
    seg = atrest.CompressedSegment(written, where=where, cache=atrest.FrameCache(0))
    d = seg.directory
    pos = fentry.SEGMENT_HEADER_SIZE
    ok = wal[:pos] == _WAL_HEADER.pack(fentry.SEGMENT_MAGIC, d.wal_version, d.base_lsn)
    for n, raw in enumerate(seg.iter_wal(), 1):
        if not ok:
            break
        end = pos + len(raw)
        ok = wal[pos:end] == raw
        pos = end
        if tick is not None and not n % atrest.TICK_ENTRIES:
            tick()
    if not ok or pos != len(wal):
        raise CorruptData(
            "the compressed segment does not expand to the segment "
            "(a zero-filled tail, or a bug): not swapped",
            where=where,
        )
    return d


def expand_in_place(path: Path) -> None:
    """Turn the compressed segment at ``path`` back into the entry log it replaced.

    For the open, when a compressed segment is the journal's last (the
    segment after it was moved aside): the journal appends to an entry log.
    The steps are :func:`expand_file`'s.
    """
    before, after = expand_file(path)
    log.warning(
        "journal: %s was the last segment and compressed (the segment after it is gone); "
        "expanded back into an entry log (%d -> %d bytes) to append to",
        path.name,
        before,
        after,
    )


def expand_file(path: Path) -> tuple[int, int]:
    """Rewrite the compressed segment at ``path`` as the entry log it replaced, atomically.

    The same atomic steps as a rewrite: ``<lsn>.wal.z-tmp`` written and
    fsynced, renamed over ``path``, the directory fsynced; an index file
    beside it (of the entry log it once was) is deleted first. Damage is
    ``CorruptData`` naming the file (nothing is changed then). Returns the
    bytes of the compressed file and of the entry log.
    """
    data = path.read_bytes()
    wal = atrest.expand_segment(data, where=str(path))
    with contextlib.suppress(FileNotFoundError):
        _fs.ops.unlink(path.with_suffix(INDEX_SUFFIX))
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        out = _fs.ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _fs.write_all(_fs.ops, out, wal)
            _fs.ops.fsync(out)
        finally:
            _fs.ops.close(out)
        _fs.ops.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            _fs.ops.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return len(data), len(wal)


class Pacer:
    """Holds a worker thread to ``duty`` of one core: a sleep after each slice of work.

    Called between slices (``iter_compressed``'s ``tick``): the thread's CPU
    time since the last call is the slice; it then sleeps ``slice * (1 -
    duty) / duty``. CPU time, not wall time: time spent waiting for the GIL
    (the event loop running) does not count as work, so a busy event loop
    slows the rewrite further. ``check`` (``trio.from_thread.check_cancelled``)
    lets a cancellation end the rewrite at the next slice.
    """

    def __init__(
        self,
        duty: float = DUTY,
        *,
        check: Callable[[], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        if not 0 < duty <= 1:
            raise ValueError(f"duty must be in (0, 1], not {duty}")
        self.duty = duty
        self._check = check
        self._sleep = sleep
        self._cpu = cpu
        self._since = cpu()
        #: CPU seconds of work and seconds slept so far
        self.busy_s = 0.0
        self.slept_s = 0.0

    def __call__(self) -> None:
        if self._check is not None:
            self._check()
        now = self._cpu()
        busy = now - self._since
        self.busy_s += busy
        if self.duty < 1 and busy > 0:
            pause = busy * (1 - self.duty) / self.duty
            self._sleep(pause)
            self.slept_s += pause
        self._since = self._cpu()
        if self._check is not None:
            self._check()


# ---------------------------------------------------------------- the child process


@dataclass(frozen=True, slots=True)
class ChildRun:
    """What one rewrite's child process did: :func:`write_compressed`'s result and its costs."""

    prepared: Prepared | None
    #: the child's CPU seconds of work and seconds slept by its pacer
    busy_s: float
    paced_s: float
    #: the child's peak resident memory (its ``ru_maxrss``)
    max_rss_bytes: int


class _Lines:
    """JSON objects, one a line, from a child's stdout (None at its end)."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buf = bytearray()

    async def receive(self) -> dict[str, Any] | None:
        while b"\n" not in self._buf:
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                return None
            self._buf += chunk
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise ValueError(f"the rewrite's child wrote {line!r}")
        return msg


def _child_env() -> dict[str, str]:
    """The gateway's environment; the child imports this very ``edge_gateway`` first."""
    env = dict(os.environ)
    here = str(Path(edge_gateway.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    env.pop(FAILPOINTS_ENV, None)  # the parent runs the fail points at the child's steps
    return env


async def rewrite_in_child(
    path: Path,
    base_lsn: int,
    *,
    level: int,
    frame_raw_bytes: int,
    chunk_raw_bytes: int,
    duty: float,
    started: Callable[[int | None], None] | None = None,
) -> ChildRun:
    """Steps 1-3 of the swap for ``path`` in a child process (``_rewrite_child.py``).

    Raises as :func:`write_compressed` does (``OSError``, ``CorruptData``),
    and ``OSError`` when the child dies without a result (a kill -9, out of
    memory): the ``.z-tmp`` it left is unlinked then, the segment untouched.
    Cancelled, it kills the child and waits for it. Every path waits for
    the child's exit: no process outlives the call. ``started`` is told the
    child's pid, then None once it is gone (tests, statistics).
    """
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", CHILD_MODULE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=_child_env(),
    )
    if started is not None:
        started(proc.pid)
    result: dict[str, Any] | None = None
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        request = {
            "path": str(path),
            "level": level,
            "frame_raw_bytes": frame_raw_bytes,
            "chunk_raw_bytes": chunk_raw_bytes,
            "duty": duty,
        }
        lines = _Lines(proc.stdout)
        with contextlib.suppress(trio.BrokenResourceError):  # it died: its end tells
            await proc.stdin.send_all(json.dumps(request).encode() + b"\n")
        while result is None:
            msg = await lines.receive()
            if msg is None:
                break
            if "step" in msg:
                # the child waits for "go": a fail point here is exactly that step
                fail_point(str(msg["step"]))
                with contextlib.suppress(trio.BrokenResourceError):
                    await proc.stdin.send_all(b"go\n")
            else:
                result = msg
    finally:
        with trio.CancelScope(shield=True):
            if result is None and proc.returncode is None:
                proc.kill()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    await pipe.aclose()  # stdin closed: the child exits (its docstring)
            with trio.move_on_after(CHILD_EXIT_S) as waited:
                await proc.wait()
            if waited.cancelled_caught:
                proc.kill()
                await proc.wait()
            if started is not None:
                started(None)
            if result is None or not result.get("ok"):
                with contextlib.suppress(OSError):
                    _fs.ops.unlink(tmp)
    if result is None:
        code = proc.returncode
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else code
        raise OSError(f"the rewrite's child process {proc.pid} ended without a result ({how})")
    if not result["ok"]:
        if result["kind"] == "corrupt":
            raise CorruptData(str(result["error"]), where=str(path))
        if result["errno"] is None:
            raise OSError(str(result["error"]))
        raise OSError(int(result["errno"]), str(result["error"]))
    stats = (float(result.get("busy_s", 0)), float(result.get("paced_s", 0)))
    if result.get("skip"):
        return ChildRun(None, *stats, 0)
    written = Path(result["tmp"])
    try:
        opened = await trio.to_thread.run_sync(CompressedFile.open, written, base_lsn)
    except BaseException:
        with contextlib.suppress(OSError):
            _fs.ops.unlink(written)
        raise
    prepared = Prepared(written, opened.directory, int(result["wal_bytes"]), int(result["size"]))
    return ChildRun(prepared, *stats, int(result["max_rss_bytes"]))


# ---------------------------------------------------------------- the live rewriter


class Host(Protocol):
    """What the rewriter needs of its journal (the budget, and whether it is open)."""

    @property
    def closed(self) -> bool: ...

    @property
    def disk_bytes(self) -> int: ...

    @property
    def budget_bytes(self) -> int: ...

    def account_bytes(self, delta: int) -> None:
        """Add ``delta`` to the bytes counted against the budget."""


@dataclass(frozen=True, slots=True)
class RewriteStats:
    """:meth:`Rewriter.statistics`: the background rewrite since the journal opened."""

    #: ``journal.at_rest = "compressed"`` and the task is running
    running: bool
    #: segments rewritten and swapped in, with the bytes of their entry logs and
    #: of the compressed files
    segments: int
    bytes_before: int
    bytes_after: int
    #: rewrites that failed (the segment stayed as it was), and the last reason
    failures: int
    last_error: str | None
    #: segments skipped: a version it does not compress, or deleted mid-rewrite
    skipped: int
    #: sealed entry logs waiting for their rewrite
    pending: int
    #: times an append found the budget full with segments waiting for their
    #: rewrite (it went into the slack; the rewriter ran unpaced)
    hurried: int
    #: CPU seconds of the rewrites (the child processes' or the worker thread's),
    #: and seconds slept to pace them
    busy_seconds: float
    paced_seconds: float
    #: the pid of the rewrite's child process while one runs, and the largest
    #: peak resident memory a child reported
    child_pid: int | None
    child_max_rss_bytes: int


class Rewriter:
    """Rewrites a live journal's sealed entry logs as compressed segments (module docstring)."""

    def __init__(
        self,
        root: Path,
        segments: SegmentSet,
        index_cache: IndexCache,
        unindexed: list[Segment],
        host: Host,
        *,
        level: int = 3,
        duty: float = DUTY,
        frame_raw_bytes: int = atrest.DEFAULT_FRAME_RAW_BYTES,
        chunk_raw_bytes: int = atrest.DEFAULT_CHUNK_RAW_BYTES,
    ) -> None:
        self._root = root
        self._segments = segments
        self._index_cache = index_cache
        #: the journal's sealed segments whose index file is not written yet
        self._unindexed = unindexed
        self._host = host
        self.level = level
        self.duty = duty
        self.frame_raw_bytes = frame_raw_bytes
        self.chunk_raw_bytes = chunk_raw_bytes
        #: one worker thread at most: the rewrite never takes more (the gateway
        #: gives every lane's rewriter the same one: one rewrite at a time in all)
        self.limiter = trio.CapacityLimiter(1)
        self._wake = trio.Event()
        #: the segment being rewritten
        self._busy: Segment | None = None
        #: an append is in the slack over the budget: rewrite unpaced (:meth:`hurry`)
        self._hurry = False
        #: base LSNs of segments it does not compress (their version)
        self._skip: set[int] = set()
        self.running = False
        self._segments_done = 0
        self._before = 0
        self._after = 0
        self._failures = 0
        self._last_error: str | None = None
        self._skipped = 0
        self._hurried = 0
        self._busy_s = 0.0
        self._paced_s = 0.0
        #: steps 1-3 in a child process (module docstring); False: on a worker
        #: thread of this process, for the fault sweep over ``_fs.ops`` (tests)
        self.in_child = True
        self._child_pid: int | None = None
        self._child_rss = 0

    # ------------------------------------------------------------ queries

    def statistics(self) -> RewriteStats:
        return RewriteStats(
            self.running,
            self._segments_done,
            self._before,
            self._after,
            self._failures,
            self._last_error,
            self._skipped,
            sum(1 for s in self._segments.segments[:-1] if self._wants(s)),
            self._hurried,
            self._busy_s,
            self._paced_s,
            self._child_pid,
            self._child_rss,
        )

    def _wants(self, seg: Segment) -> bool:
        return seg.compressed is None and seg.base_lsn not in self._skip

    def _next(self) -> Segment | None:
        """The oldest sealed entry log not yet rewritten (never the active segment)."""
        for seg in self._segments.segments[:-1]:
            if self._wants(seg) and seg is not self._busy:
                return seg
        return None

    def sealed(self) -> None:
        """A segment was sealed (the journal rolled): there is work."""
        self._wake.set()

    # ------------------------------------------------------------ background

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Rewrite sealed segments, oldest first, as they seal; for as long as it runs."""
        self.running = True
        task_status.started()
        backoff = BACKOFF_S
        try:
            while not self._host.closed:
                seg = self._next()
                if seg is None:
                    self._hurry = False
                if seg is None or not (self._hurry or self._room_for(seg)):
                    with trio.move_on_after(IDLE_S):
                        await self._wake.wait()
                    self._wake = trio.Event()
                    continue
                ok = await self.rewrite(seg, paced=not self._hurry)
                if self._host.disk_bytes <= self._host.budget_bytes:
                    self._hurry = False
                if ok:
                    backoff = BACKOFF_S
                else:
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
        finally:
            self.running = False

    def _room_for(self, seg: Segment) -> bool:
        return self._host.disk_bytes + self._estimate(seg) <= self._host.budget_bytes

    @staticmethod
    def _estimate(seg: Segment) -> int:
        return int(seg.size * TMP_ESTIMATE)

    async def rewrite(self, seg: Segment, *, paced: bool = True) -> bool:
        """Rewrite ``seg`` (steps 1-3 in a child process) and swap it in; False if that failed.

        True also when there was nothing to do (compressed already, a version
        it skips, deleted meanwhile).
        """
        if not self._wants(seg) or seg is self._busy:
            return True
        estimate = self._estimate(seg)
        ino = _inode(seg.path)
        self._busy = seg
        self._host.account_bytes(estimate)  # the temporary file counts while it exists
        prepared: Prepared | None = None
        try:
            try:
                prepared = await self._prepare(seg, 1.0 if not paced else self.duty)
            except (OSError, CorruptData) as exc:
                self._failed(seg, exc)
                return False
            if prepared is None:
                self._skip_version(seg)
                return True
            swapped = self._install(seg, prepared, ino)
            prepared = None
            if swapped is None:
                return True
            if swapped is False:
                return False
            try:
                await trio.to_thread.run_sync(fsync_dir, self._root, limiter=self.limiter)
            except OSError as exc:
                self._keep_index(seg, exc)
                return True
            self._unlink_index(seg)
            return True
        finally:
            if prepared is not None:  # cancelled between the thread and the swap
                with contextlib.suppress(OSError):
                    _fs.ops.unlink(prepared.tmp)
            self._host.account_bytes(-estimate)
            self._busy = None

    async def _prepare(self, seg: Segment, duty: float) -> Prepared | None:
        """Steps 1-3: in a child process, or on a worker thread (``in_child``)."""
        async with self.limiter:
            if self.in_child:
                run = await rewrite_in_child(
                    seg.path,
                    seg.base_lsn,
                    level=self.level,
                    frame_raw_bytes=self.frame_raw_bytes,
                    chunk_raw_bytes=self.chunk_raw_bytes,
                    duty=duty,
                    started=self._child_started,
                )
                self._busy_s += run.busy_s
                self._paced_s += run.paced_s
                self._child_rss = max(self._child_rss, run.max_rss_bytes)
                return run.prepared
            pacer = Pacer(duty, check=trio.from_thread.check_cancelled)
            try:
                return await trio.to_thread.run_sync(
                    lambda: write_compressed(
                        seg.path,
                        level=self.level,
                        frame_raw_bytes=self.frame_raw_bytes,
                        chunk_raw_bytes=self.chunk_raw_bytes,
                        tick=pacer,
                    )
                )
            finally:
                self._busy_s += pacer.busy_s
                self._paced_s += pacer.slept_s

    def _child_started(self, pid: int | None) -> None:
        self._child_pid = pid

    async def rewrite_all(self, *, paced: bool = False) -> int:
        """Rewrite every sealed entry log now (tests, tools); how many were swapped in."""
        done = self._segments_done
        while (seg := self._next()) is not None:
            if not await self.rewrite(seg, paced=paced):
                break
        return self._segments_done - done

    # ------------------------------------------------------------ a full budget

    def hurry(self) -> bool:
        """An append found the budget full: rewrite unpaced until it is not.

        True if sealed segments wait for their rewrite (or one is being
        rewritten) and the background task runs: the rewrite will make room,
        so the journal lets the append into its slack. False: nothing to
        rewrite, the append must be refused or drop data. Never blocks.
        """
        if not self.running or (self._busy is None and self._next() is None):
            return False
        if not self._hurry:
            self._hurried += 1
            log.info(
                "journal %s: budget full with %d sealed segments not yet compressed: "
                "rewriting them unpaced",
                self._root.name,
                sum(1 for s in self._segments.segments[:-1] if self._wants(s)),
            )
        self._hurry = True
        self._wake.set()
        return True

    # ------------------------------------------------------------ the swap

    def _install(self, seg: Segment, prepared: Prepared, ino: int | None) -> bool | None:
        """Step 4 on the event loop: rename and swap in memory, with no checkpoint between.

        None: the segment went meanwhile (retention, a drop), was swapped
        already, or its file was replaced since the rewrite read it (``ino``:
        the live repair renamed a rebuilt entry log over it -- the compressed
        copy of the old file must not undo the repair); the temporary file is
        unlinked. False: the rename failed.
        """
        if (
            seg.compressed is not None
            or not self._segments.holds(seg)
            or ino is None
            or _inode(seg.path) != ino
        ):
            with contextlib.suppress(OSError):
                _fs.ops.unlink(prepared.tmp)
            self._skipped += 1
            log.info("journal: %s went during its rewrite; rewrite dropped", seg.path.name)
            return None
        try:
            _fs.ops.replace(prepared.tmp, seg.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                _fs.ops.unlink(prepared.tmp)
            self._failed(seg, exc)
            return False
        old_size = seg.size
        index = seg.index
        if index is not None:
            self._index_cache.forget(index)
        if seg in self._unindexed:
            self._unindexed.remove(seg)  # its index is not needed any more
        self._segments.swap_compressed(seg, CompressedFile(seg.path, prepared.directory))
        self._host.account_bytes(prepared.size - old_size)
        fail_point("rewriter.renamed")
        self._segments_done += 1
        self._before += prepared.wal_bytes
        self._after += prepared.size
        log.info(
            "journal: %s rewritten compressed: %d -> %d bytes (%.1fx)",
            seg.path.name,
            prepared.wal_bytes,
            prepared.size,
            prepared.wal_bytes / max(prepared.size, 1),
        )
        return True

    def _unlink_index(self, seg: Segment) -> None:
        """Step 6: the entry log's index file goes (and its bytes leave the budget)."""
        fail_point("rewriter.synced")
        idx = seg.index_path
        try:
            size = idx.stat().st_size
            _fs.ops.unlink(idx)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("journal: could not delete %s (the next open does): %s", idx, exc)
            return
        self._host.account_bytes(-size)

    def _keep_index(self, seg: Segment, exc: OSError) -> None:
        # Not durable yet: a crash may bring the entry log back, which wants its
        # index; the next open deletes the index beside a compressed segment.
        log.warning(
            "journal: fsync of %s after rewriting %s failed (%s); its index file is kept "
            "until the next open",
            self._root,
            seg.path.name,
            exc,
        )

    def _failed(self, seg: Segment, exc: Exception) -> None:
        self._failures += 1
        self._last_error = f"{seg.path.name}: {exc}"
        log.warning(
            "journal: rewriting %s compressed failed (%s); the segment stays as it is "
            "and the rewrite is tried again later",
            seg.path.name,
            exc,
        )

    def _skip_version(self, seg: Segment) -> None:
        if seg.compressed is None:
            self._skip.add(seg.base_lsn)
            self._skipped += 1
            log.info(
                "journal: %s is not rewritten compressed (a segment version this "
                "journal does not compress yet)",
                seg.path.name,
            )


def _inode(path: Path) -> int | None:
    """Which file ``path`` names now (None: none)."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None
