"""Repair from the bucket in lanes other than the main one (issue 45, leftovers).

A lane's entries are shipped in the region's log objects like the main
lane's; an object names the lane's LSNs in its lane table (log object
version 2), so ``edge_gateway/bucket_repair.py`` finds them there. What the
journal needs besides, kept here so that ``_repair.py`` and
``_live_repair.py`` only call in:

* :func:`bucket_may_hold` -- through which LSN the bucket may hold a lane's
  entries, known without asking it. The main lane's ``shipper.json`` confirms
  its LSNs (``log_lsn``); it records no other lane's confirmed LSN, only each
  lane's ``sent`` mark (written before every create: the bucket holds no LSN
  of the lane above it). So for another lane the mark is an upper bound, and
  the bucket decides the rest: :func:`~edge_gateway.journal._repair.rebuild`
  takes a range only when the lane's objects give every one of its LSNs a
  batch. Asking the bucket for a range above the mark would only cost a
  wait.
* :func:`confirmed_lsn` -- while running, the lane's own shipper watermark
  (its safe LSN: the shipper sets it from what the bucket confirmed of that
  lane), for the live repair's "confirmed whole" rule.
* :func:`lane_partitions` -- which partitions of an object are the lane's:
  an object ships every lane's partitions, and a lane's checkpoint may name
  partitions that live in another lane (a lane journal started from the
  log's offsets), so a partition is the lane's when this segment holds an
  intact entry of it (or the next segment's checkpoint has it further on).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from edge_gateway.format import atrest
from edge_gateway.journal._lane import ALL_LANES, Lane

__all__ = ["bucket_may_hold", "confirmed_lsn", "lane_of_dir", "lane_partitions", "shipped_lsn"]

_STATE = "shipper.json"


def shipped_lsn(journal: Path) -> int | None:
    """The LSN through which the bucket confirmed this journal's entries (the main
    lane's shipper.json), None if unknown."""
    try:
        return int(json.loads((journal / _STATE).read_bytes())["log_lsn"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lane_of_dir(journal: Path) -> tuple[Lane, Path] | None:
    """The lane whose journal directory is ``journal`` and the main lane's directory
    beside it (``journal-critical`` -> critical, ``journal``); None for the main lane's
    own directory or a directory no lane has."""
    for lane in sorted(ALL_LANES, key=lambda x: -len(str(x))):  # "critical-drop" first
        suffix = f"-{lane}"
        if not lane.is_main and journal.name.endswith(suffix) and len(journal.name) > len(suffix):
            main = journal.with_name(journal.name[: -len(suffix)])
            if (main / _STATE).exists():
                return lane, main
    return None


def bucket_may_hold(journal: Path) -> int | None:
    """The LSN through which the bucket may hold ``journal``'s entries (None: unknown,
    nothing is asked of the bucket). The main lane: what it confirmed (``shipper.json``
    ``log_lsn``); another lane: its ``sent`` mark in the main lane's ``shipper.json``."""
    if (journal / _STATE).exists():
        return shipped_lsn(journal)
    found = lane_of_dir(journal)
    if found is None:
        return None
    lane, main = found
    try:
        sent = json.loads((main / _STATE).read_bytes()).get("sent", {})
        return int(sent[str(lane.id)])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def confirmed_lsn(journal: Path, safe_lsn: int) -> int | None:
    """The LSN through which the bucket confirmed a running journal's entries: the main
    lane's ``shipper.json``; for another lane its shipper watermark (``safe_lsn`` - 1)."""
    if (journal / _STATE).exists() or lane_of_dir(journal) is None:
        return shipped_lsn(journal)
    return safe_lsn - 1 if safe_lsn > 1 else None


def lane_partitions(entries: Iterable[atrest.AnyEntry]) -> set[tuple[str, int]]:
    """The partitions that have an entry with records among ``entries``."""
    out: set[tuple[str, int]] = set()
    for e in entries:
        if isinstance(e, atrest.BlockEntry) or e.count:
            out.add((e.topic, e.partition))
    return out
