"""Durability: group commit and the fsync policy.

What it owns (:class:`Durability`): ``durable_lsn`` (it only moves here, at a
roll, at the open and at close), ``wait_durable`` and ``flush`` (one fsync
covers every entry written before it started; concurrent waiters park and
share it), the fsync itself (``fdatasync``, flagged by :attr:`syncing` so
that appends stop storing into the map while it runs), the descriptors whose
close waits for an fsync in flight, the fsync counters, and the interval
flusher that ``Journal.run`` starts for ``fsync = "interval"``.

It is given the segment set (the active segment is what it fsyncs) and the
log it makes durable as :class:`WrittenLog` (the journal: how far it is
written, and its hooks to stop intake and to re-arm its append watch); it
does not import the journal.
"""

from __future__ import annotations

import contextlib
import time
from typing import Protocol

import trio
import trio.lowlevel

from edge_gateway.errors import Unavailable
from edge_gateway.journal import _fs
from edge_gateway.journal._config import JournalConfig
from edge_gateway.journal._segment_set import SegmentSet


class WrittenLog(Protocol):
    """What durability asks of the log it makes durable (the journal answers)."""

    @property
    def next_lsn(self) -> int:
        """The LSN the next entry will get."""
        ...

    @property
    def appended_bytes(self) -> int:
        """Bytes appended since the open (a running total)."""
        ...

    #: why intake stopped for good, or None
    _broken: str | None

    def _check_open(self) -> None:
        """Raise unless the log is open and intake has not stopped."""

    def _arm(self) -> None:
        """Re-arm the append watch after the flusher's waiting state changed."""

    def _fail(self, what: str, exc: OSError) -> Unavailable:
        """Stop intake for good after a failed fsync; the error to raise."""
        ...


class Durability:
    """How far the journal is on stable storage, and the fsyncs that move it."""

    __slots__ = (
        "_config",
        "_limiter",
        "_log",
        "_segments",
        "deferred_close",
        "dirty_lot",
        "durable_lot",
        "durable_lsn",
        "flusher_idle",
        "flushing",
        "fsync_max",
        "fsync_total",
        "fsyncs",
        "synced_mark",
        "syncing",
        "urgent_lot",
        "urgent_waiting",
    )

    def __init__(self, config: JournalConfig, segments: SegmentSet, log: WrittenLog) -> None:
        self._config = config
        self._segments = segments
        self._log = log
        #: every entry up to this LSN is fsynced
        self.durable_lsn = 0
        #: appended_bytes when the last fsync started (unsynced = appended - this)
        self.synced_mark = 0
        #: an fsync is in flight (its leader runs it; others park on durable_lot)
        self.flushing = False
        #: an fdatasync is running (set on the event loop, cleared by the syncing thread)
        self.syncing = False
        #: the interval flusher waits for the next append (dirty_lot)
        self.flusher_idle = False
        #: the interval flusher waits for the interval or fsync_bytes (urgent_lot)
        self.urgent_waiting = False
        #: write descriptors of sealed segments, closed after the fsync in flight
        self.deferred_close: list[int] = []
        self.durable_lot = trio.lowlevel.ParkingLot()
        self.dirty_lot = trio.lowlevel.ParkingLot()
        self.urgent_lot = trio.lowlevel.ParkingLot()
        self._limiter = trio.CapacityLimiter(1)
        self.fsyncs = 0
        self.fsync_total = 0.0
        self.fsync_max = 0.0

    def synced(self, lsn: int, appended_bytes: int) -> None:
        """Everything up to ``lsn`` was fsynced outside a flush (a roll, the open, close)."""
        self.durable_lsn = lsn
        self.synced_mark = appended_bytes

    def close_after_fsync(self, fd: int) -> None:
        """Close ``fd`` now, or after the fsync in flight (a worker thread may be using it)."""
        if self.flushing:
            self.deferred_close.append(fd)
        else:
            _fs.ops.close(fd)

    def wake_all(self) -> None:
        """Wake every waiter (the journal closes)."""
        for lot in (self.durable_lot, self.dirty_lot, self.urgent_lot):
            lot.unpark_all()

    async def wait_idle(self) -> None:
        """Wait until no fsync is in flight."""
        while self.flushing:
            await self.durable_lot.park()

    async def wait_durable(self, lsn: int) -> None:
        """Wait until entry ``lsn`` is fsynced; concurrent waiters share one fsync."""
        while self.durable_lsn < lsn:
            self._log._check_open()
            if self.flushing:
                await self.durable_lot.park()
            else:
                await self._flush()

    async def flush(self) -> None:
        """Fsync everything appended so far."""
        await self.wait_durable(self._log.next_lsn - 1)

    async def _flush(self) -> None:
        # The leader of a group commit: one fsync covers every entry written
        # before it started; waiters that arrive meanwhile park and the next
        # of them leads the following round.
        log = self._log
        self.flushing = True
        try:
            if self._config.fsync_inline:
                # Let every runnable appender write first, so this one blocking
                # fsync covers them all (with a worker thread the same happens
                # while the thread runs). Inside the try: a leader cancelled
                # here must still hand over (finally) or every waiter hangs.
                await trio.lowlevel.checkpoint()
            target = log.next_lsn - 1
            fd = self._segments.active.fd
            assert fd is not None
            self.synced_mark = log.appended_bytes
            t0 = time.perf_counter()
            self.syncing = True
            if self._config.fsync_inline:
                self.fdatasync(fd)
            else:
                await trio.to_thread.run_sync(self.fdatasync, fd, limiter=self._limiter)
            dt = time.perf_counter() - t0
            self.fsyncs += 1
            self.fsync_total += dt
            self.fsync_max = max(self.fsync_max, dt)
            self.durable_lsn = max(self.durable_lsn, target)
            # Written pages of the map leave the RSS every few MiB (clean now,
            # so nothing is left for writeback to do on their account).
            self._segments.active.release_written()
        except OSError as exc:
            raise log._fail(f"fsync of {self._segments.active.path}", exc) from exc
        finally:
            self.flushing = False
            self.syncing = False  # (if cancelled before the thread started)
            for dfd in self.deferred_close:
                with contextlib.suppress(OSError):
                    _fs.ops.close(dfd)
            self.deferred_close.clear()
            self.durable_lot.unpark_all()

    def fdatasync(self, fd: int) -> None:
        """fdatasync, flagged for the append path (runs in a worker thread, except inline).

        While the flag is up, appends write with pwrite instead of copying
        into the map: measured here, stores into mapped pages during an
        fdatasync made it 5-10x slower, and an append loop that makes no
        system call holds the GIL, so the worker thread waited up to the
        5 ms switch interval at each step (fsyncs of up to 0.7 s under
        load). pwrite releases the GIL on every call. The flag drops as soon
        as the kernel returns, before trio hears of it.
        """
        try:
            _fs.ops.fdatasync(fd)
        finally:
            self.syncing = False

    async def interval_flusher(self) -> None:
        """Fsync every ``fsync_interval_ms``, or once ``fsync_bytes`` are unsynced."""
        log = self._log
        interval = self._config.fsync_interval_ms / 1000
        fsync_bytes = self._config.fsync_bytes
        while True:
            if self.durable_lsn >= log.next_lsn - 1:
                self.flusher_idle = True
                log._arm()
                try:
                    await self.dirty_lot.park()
                finally:
                    self.flusher_idle = False
                    log._arm()
            if log.appended_bytes - self.synced_mark < fsync_bytes:
                # sleep for the interval, or until fsync_bytes are unsynced
                self.urgent_waiting = True
                log._arm()
                try:
                    with trio.move_on_after(interval):
                        await self.urgent_lot.park()
                finally:
                    self.urgent_waiting = False
                    log._arm()
            if log._broken is not None:
                # Intake stopped after a failed fsync: never fsync again (a
                # later success would not cover the dropped pages), and stay
                # out of the way of reads and shipping.
                await trio.sleep_forever()
            if self.durable_lsn < log.next_lsn - 1 and not self.flushing:
                with contextlib.suppress(Unavailable):  # the failure is logged and kept
                    await self._flush()
            else:
                await trio.lowlevel.checkpoint()
