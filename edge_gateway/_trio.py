"""Small helpers over trio."""

from __future__ import annotations

import trio

__all__ = ["wait_set"]


async def wait_set(event: trio.Event) -> None:
    """Wait for ``event``; at once, without a checkpoint, if it is already set.

    ``Event.wait`` yields to the scheduler even when the event is set. A
    catch-up waits on several events per log entry that are nearly always set
    already (the entry fetched, the budget handed on, the pack loaded); those
    trips through the scheduler were 3-12% of a small entry's CPU in a
    replay (``bench/replay.py``, runs alternated with plain waits). The
    caller must yield elsewhere often enough (a catch-up's launcher does at
    its count, its consumer at its channel's receive: once per entry each).
    """
    if not event.is_set():
        await event.wait()
