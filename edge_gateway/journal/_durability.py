"""Durability: group commit and the fsync policy.

What it owns: ``wait_durable`` and ``flush`` (one fsync covers every entry
written before it started; concurrent waiters park and share it), the fsync
itself (``_fdatasync``, flagged so that appends stop storing into the map
while it runs), and the interval flusher that ``run`` starts for
``fsync = "interval"``. ``durable_lsn`` only moves here. The functions here
are the Journal's methods (bound in its class body: ``Journal.flush =
_durability.flush``).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import trio
import trio.lowlevel

from edge_gateway.errors import Unavailable
from edge_gateway.journal import _fs

if TYPE_CHECKING:
    from edge_gateway.journal._journal import Journal


async def wait_durable(self: Journal, lsn: int) -> None:
    """Wait until entry ``lsn`` is fsynced; concurrent waiters share one fsync."""
    while self._durable_lsn < lsn:
        self._check_open()
        if self._flushing:
            await self._durable_lot.park()
        else:
            await self._flush()


async def flush(self: Journal) -> None:
    """Fsync everything appended so far."""
    await self.wait_durable(self._next_lsn - 1)


async def _flush(self: Journal) -> None:
    # The leader of a group commit: one fsync covers every entry written
    # before it started; waiters that arrive meanwhile park and the next
    # of them leads the following round.
    self._flushing = True
    try:
        if self.config.fsync_inline:
            # Let every runnable appender write first, so this one blocking
            # fsync covers them all (with a worker thread the same happens
            # while the thread runs). Inside the try: a leader cancelled
            # here must still hand over (finally) or every waiter hangs.
            await trio.lowlevel.checkpoint()
        target = self._next_lsn - 1
        fd = self._segments[-1].fd
        assert fd is not None
        self._synced_mark = self._appended_bytes
        t0 = time.perf_counter()
        self._syncing = True
        if self.config.fsync_inline:
            self._fdatasync(fd)
        else:
            await trio.to_thread.run_sync(self._fdatasync, fd, limiter=self._fsync_limiter)
        dt = time.perf_counter() - t0
        self._fsyncs += 1
        self._fsync_total += dt
        self._fsync_max = max(self._fsync_max, dt)
        self._durable_lsn = max(self._durable_lsn, target)
        # Written pages of the map leave the RSS every few MiB (clean now,
        # so nothing is left for writeback to do on their account).
        self._segments[-1].release_written()
    except OSError as exc:
        raise self._fail(f"fsync of {self._segments[-1].path}", exc) from exc
    finally:
        self._flushing = False
        self._syncing = False  # (if cancelled before the thread started)
        for dfd in self._deferred_close:
            with contextlib.suppress(OSError):
                _fs.ops.close(dfd)
        self._deferred_close.clear()
        self._durable_lot.unpark_all()


def _fdatasync(self: Journal, fd: int) -> None:
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
        self._syncing = False


async def _interval_flusher(self: Journal) -> None:
    interval = self.config.fsync_interval_ms / 1000
    while True:
        if self._durable_lsn >= self._next_lsn - 1:
            self._flusher_idle = True
            self._arm()
            try:
                await self._dirty_lot.park()
            finally:
                self._flusher_idle = False
                self._arm()
        if self._appended_bytes - self._synced_mark < self._fsync_bytes:
            # sleep for the interval, or until fsync_bytes are unsynced
            self._urgent_waiting = True
            self._arm()
            try:
                with trio.move_on_after(interval):
                    await self._urgent_lot.park()
            finally:
                self._urgent_waiting = False
                self._arm()
        if self._broken is not None:
            # Intake stopped after a failed fsync: never fsync again (a
            # later success would not cover the dropped pages), and stay
            # out of the way of reads and shipping.
            await trio.sleep_forever()
        if self._durable_lsn < self._next_lsn - 1 and not self._flushing:
            with contextlib.suppress(Unavailable):  # the failure is logged and kept
                await self._flush()
        else:
            await trio.lowlevel.checkpoint()
