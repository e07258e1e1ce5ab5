"""A range reported lost that a later repair rebuilt (issue 45 leftovers).

An open quarantines damage it cannot rebuild (``_quarantine.py``): the loss
is recorded in ``lost.log``, append-only and sealed line by line. When the
bucket held the range (``repairable: true``: it was out of reach at that
start), the live repair rebuilds it later, once its segment is sealed and
shipped whole (``_live_repair.py``), and records that in ``repaired.log``
(the same segment and LSNs). ``lost.log`` is not rewritten: the repair's
record supersedes the loss. This module says which losses are superseded,
with no I/O, for the statistics, ``/v1/status``, ``edgegw status`` and the
metrics: a loss is *repaired later* when repairs recorded at or after it
cover every one of its LSNs (LSNs are never reused in a journal, so a repair
of the same LSNs is a repair of the same entries). A repair recorded before
the loss (the same LSNs repaired once, then damaged again) does not count.
"""

from __future__ import annotations

from collections.abc import Sequence

from edge_gateway.journal._quarantine import Loss
from edge_gateway.journal._repair import Repaired

__all__ = ["later_repairs", "still_lost"]


def later_repairs(loss: Loss, repairs: Sequence[Repaired]) -> list[Repaired]:
    """The repairs, recorded at or after ``loss``, that together rebuilt every LSN of it
    (in LSN order); empty when its LSNs are not all rebuilt (it is still lost)."""
    meeting = sorted(
        (
            r
            for r in repairs
            if r.time_ms >= loss.time_ms
            and r.lsn_first <= loss.lsn_last
            and r.lsn_last >= loss.lsn_first
        ),
        key=lambda r: r.lsn_first,
    )
    at = loss.lsn_first  # the first LSN not yet known rebuilt
    used: list[Repaired] = []
    for r in meeting:
        if r.lsn_first > at:
            break
        if r.lsn_last >= at:
            used.append(r)
            at = r.lsn_last + 1
        if at > loss.lsn_last:
            return used
    return []


def still_lost(losses: Sequence[Loss], repairs: Sequence[Repaired]) -> list[Loss]:
    """The losses no later repair superseded, in their order."""
    return [x for x in losses if not later_repairs(x, repairs)]
