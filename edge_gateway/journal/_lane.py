"""Lanes: one journal per topic priority class (``docs/journal.md``, "Lanes").

A lane is what a journal is chosen by: the topic's :class:`Priority` and its
:class:`OnFull` policy. Lanes of one priority with different policies never
share segments, so a ``drop-oldest`` lane deletes whole segments of its own
topics only, never another topic's data.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from edge_gateway.errors import ConfigError


class Priority(enum.StrEnum):
    """A topic's priority class: the order in which backlogs are shipped."""

    CRITICAL = "critical"
    NORMAL = "normal"
    BULK = "bulk"

    @classmethod
    def parse(cls, value: object, key: str) -> Priority:
        """``value`` as a priority; :class:`ConfigError` naming ``key`` and the allowed values."""
        try:
            if not isinstance(value, str):
                raise ValueError(value)
            return cls(value)
        except ValueError:
            allowed = ", ".join(repr(p.value) for p in cls)
            raise ConfigError(f"{key}: {value!r} is not one of {allowed}") from None


class OnFull(enum.StrEnum):
    """What a topic's lane does when its disk budget is full."""

    #: Refuse the append (``JournalFull``: 503 + Retry-After); nothing acknowledged is dropped.
    BLOCK = "block"
    #: Delete the lane's oldest unshipped segments to make room, recording the exact
    #: ranges dropped (docs/journal.md, "Drop-oldest lanes").
    DROP_OLDEST = "drop-oldest"


#: Drain order after an outage: every lane before the next is touched.
DRAIN_ORDER: Final = (Priority.CRITICAL, Priority.NORMAL, Priority.BULK)

# The lane ids of the log object's lane table (docs/log-object.md, "Version 2").
# 0 is the normal lane: the journal every older gateway has, in the fixed fields.
# Drop-oldest lanes: the block lane's id + 3.
_IDS: Final = {Priority.NORMAL: 0, Priority.CRITICAL: 1, Priority.BULK: 2}
_DROP_ID_BASE: Final = 3


@dataclass(frozen=True, slots=True, order=True)
class Lane:
    """One journal of a gateway, chosen by a topic's priority and ``on_full`` policy."""

    priority: Priority
    on_full: OnFull = OnFull.BLOCK

    @property
    def id(self) -> int:
        """The lane's id in log objects' lane tables (0: the normal lane)."""
        base = _IDS[self.priority]
        return base + _DROP_ID_BASE if self.drops else base

    @property
    def drops(self) -> bool:
        """A ``drop-oldest`` lane."""
        return self.on_full is OnFull.DROP_OLDEST

    @property
    def is_main(self) -> bool:
        """The normal block lane: today's journal, in today's directory."""
        return self.priority is Priority.NORMAL and not self.drops

    @property
    def rank(self) -> int:
        """Position in the drain order: by :data:`DRAIN_ORDER`, a priority's block lane
        before its drop-oldest lane (0 ships first)."""
        return 2 * DRAIN_ORDER.index(self.priority) + (1 if self.drops else 0)

    @property
    def dirname(self) -> str:
        """Directory of the lane's journal beside the normal lane's ``journal``."""
        return "journal" if self.is_main else f"journal-{self}"

    def __str__(self) -> str:
        return f"{self.priority.value}-drop" if self.drops else self.priority.value


MAIN_LANE: Final = Lane(Priority.NORMAL)


def lane_of(priority: Priority, on_full: OnFull = OnFull.BLOCK) -> Lane:
    return Lane(priority, on_full)


#: Every lane a gateway may have, in drain order.
ALL_LANES: Final = tuple(
    sorted((Lane(p, o) for p in Priority for o in OnFull), key=lambda lane: lane.rank)
)


def lane_by_id(lane_id: int) -> Lane | None:
    """The lane with id ``lane_id``, or None for an id this gateway does not know."""
    for lane in ALL_LANES:
        if lane.id == lane_id:
            return lane
    return None


def lane_path(main: Path, lane: Lane) -> Path:
    """The journal directory of ``lane``: ``main`` itself for the normal lane, else
    ``<main>-<lane>`` beside it (``journal-critical``, ``journal-bulk``,
    ``journal-bulk-drop``)."""
    return main if lane.is_main else main.with_name(f"{main.name}-{lane}")


def lanes_on_disk(main: Path) -> set[Lane]:
    """The lanes whose journal directory exists beside ``main`` (the normal lane always)."""
    found = {MAIN_LANE}
    for lane in ALL_LANES:
        if lane_path(main, lane).is_dir():
            found.add(lane)
    return found
