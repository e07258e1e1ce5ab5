"""Catch-up order across sources: a gateway's tailers take turns by priority.

Each source has its own tailer, and each applies its source's log strictly
in seq order (``docs/mirroring.md``, "Priorities"). What a gateway can
order is *which source* uses the link first when several are far behind:
while a tailer catches up (from manifests) a backlog that holds topics of
priority ``p``, every other tailer catching up a backlog whose highest
priority is lower than ``p`` holds its fetches. A tailer that is only
following is never held and holds nobody.

**No deadlock.** A tailer is held only by one that announces a *strictly*
higher priority, and the tailers announcing the highest one are never held:
they go on through every entry of their backlog, in seq order, whatever
each entry holds. When they are done (or stop, or fail), they withdraw and
the next priority goes.

The rule is :meth:`PriorityGate.held`: plain data, no I/O;
:meth:`PriorityGate.wait_turn` waits on it with trio.
"""

from __future__ import annotations

import trio

from edge_gateway.journal import Lane, Priority

__all__ = ["PriorityGate"]


class PriorityGate:
    """Shared by a gateway's tailers; see the module docstring."""

    def __init__(self) -> None:
        #: source -> rank (0: critical) of the backlog it is catching up now.
        self._announced: dict[str, int] = {}
        self._changed = trio.Event()

    def announce(self, source: str, priority: Priority | None) -> None:
        """``source`` catches up a backlog whose highest priority is ``priority``
        (``None``: it is not catching up, or its backlog holds nothing it mirrors)."""
        rank = None if priority is None else Lane(priority).rank
        if self._announced.get(source) == rank:
            return
        if rank is None:
            del self._announced[source]
        else:
            self._announced[source] = rank
        self._changed.set()
        self._changed = trio.Event()

    def held(self, source: str) -> bool:
        """Whether ``source`` must wait: another source catches up a higher priority."""
        mine = self._announced.get(source)
        if mine is None:
            return False
        return any(rank < mine for other, rank in self._announced.items() if other != source)

    def announced(self) -> dict[str, Priority]:
        """Who catches up which priority now (for ``edgegw status``)."""
        by_rank = {Lane(p).rank: p for p in Priority}
        return {source: by_rank[rank] for source, rank in sorted(self._announced.items())}

    async def wait_turn(self, source: str) -> bool:
        """Wait until ``source`` is not held; returns whether it had to wait."""
        waited = False
        while self.held(source):
            waited = True
            await self._changed.wait()
        if not waited:
            await trio.lowlevel.checkpoint()
        return waited
