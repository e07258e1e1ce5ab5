"""A bounded hand-off from a foreign thread (paho's network thread) to one trio task.

``trio.from_thread.run(channel.send, item)`` per message costs the producing
thread a round trip through trio's loop for every message: the thread waits
for a loop turn, so a consumer that journals (and fsyncs) between turns gets
one message per batch. :class:`Handoff` lets the thread append to a deque
under a lock and wake the trio side only when the deque was empty, so the
consumer takes everything that arrived during its last append as one batch.
The thread blocks when ``maxsize`` items wait (backpressure: it stops
reading its socket) until the consumer takes some, or until :meth:`close`.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

__all__ = ["Handoff"]

T = TypeVar("T")


class Handoff(Generic[T]):
    """Items from any thread (:meth:`put`) to one trio task (:meth:`get_batch`)."""

    def __init__(self, maxsize: int, token: trio.lowlevel.TrioToken) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be >= 1")
        self._maxsize = maxsize
        self._token = token
        self._items: collections.deque[T] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._wakeup = trio.Event()
        #: Times :meth:`put` waited for room (the consumer was behind).
        self.full_waits = 0

    def put(self, item: T) -> bool:
        """Add ``item`` (from a thread that is not trio's); block while full.

        Returns False, dropping nothing the caller does not know about, once
        the hand-off is closed (the caller leaves the item unacknowledged).
        """
        with self._cond:
            if len(self._items) >= self._maxsize and not self._closed:
                self.full_waits += 1
                while len(self._items) >= self._maxsize and not self._closed:
                    self._cond.wait()
            if self._closed:
                return False
            self._items.append(item)
            wake = len(self._items) == 1
        if wake:
            try:
                self._token.run_sync_soon(self._wake)
            except trio.RunFinishedError:
                return False
        return True

    def _wake(self) -> None:
        self._wakeup.set()

    async def get_batch(
        self, max_items: int, weigh: Callable[[T], int], max_weight: int
    ) -> list[T]:
        """Wait for at least one item; take up to ``max_items`` / ``max_weight`` of them."""
        while True:
            with self._cond:
                if self._closed:
                    raise trio.ClosedResourceError("the hand-off is closed")
                if self._items:
                    batch = [self._items.popleft()]
                    weight = weigh(batch[0])
                    while self._items and len(batch) < max_items and weight < max_weight:
                        item = self._items.popleft()
                        batch.append(item)
                        weight += weigh(item)
                    self._cond.notify_all()
                    return batch
                # Under the lock: a put after this sees an empty deque and
                # wakes exactly this event.
                self._wakeup = trio.Event()
                wakeup = self._wakeup
            await wakeup.wait()

    def close(self) -> None:
        """Refuse further items and release a blocked :meth:`put` (from any thread)."""
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
