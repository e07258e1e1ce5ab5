"""Small helpers over trio."""

from __future__ import annotations

import trio

__all__ = ["wait_set"]


async def wait_set(event: trio.Event) -> None:
    """Wait for ``event``; at once, without a checkpoint, if it is already set.

    ``Event.wait`` yields to the scheduler even when the event is set. A
    catch-up waits on several events per log entry that are nearly always set
    already (the entry fetched, the budget handed on, the pack loaded), and
    those trips through the scheduler were a sixth of a small entry's cost on
    the loop. The caller must yield elsewhere often enough (the catch-up's
    consumer does, once per entry, at its channel's receive).
    """
    if not event.is_set():
        await event.wait()
