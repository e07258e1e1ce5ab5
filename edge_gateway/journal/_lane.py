"""Lanes: one journal per topic priority class (``docs/journal.md``, "Lanes").

A lane is what a journal is chosen by. Today its identity is the topic's
:class:`Priority`; a later ``on_full`` policy (``drop-oldest``) becomes a
second field of :class:`Lane`, with its own id and directory, so that lanes
of one priority with different policies never share segments.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
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


#: Drain order after an outage: every lane before the next is touched.
DRAIN_ORDER: Final = (Priority.CRITICAL, Priority.NORMAL, Priority.BULK)

# The lane ids of the log object's lane table (docs/log-object.md, "Version 2").
# 0 is the normal lane: the journal every older gateway has, in the fixed fields.
_IDS: Final = {Priority.NORMAL: 0, Priority.CRITICAL: 1, Priority.BULK: 2}


@dataclass(frozen=True, slots=True, order=True)
class Lane:
    """One journal of a gateway, chosen by a topic's priority."""

    priority: Priority

    @property
    def id(self) -> int:
        """The lane's id in log objects' lane tables (0: the normal lane)."""
        return _IDS[self.priority]

    @property
    def is_main(self) -> bool:
        """The normal lane: today's journal, in today's directory."""
        return self.priority is Priority.NORMAL

    @property
    def rank(self) -> int:
        """Position in :data:`DRAIN_ORDER` (0 ships first)."""
        return DRAIN_ORDER.index(self.priority)

    @property
    def dirname(self) -> str:
        """Directory of the lane's journal beside the normal lane's ``journal``."""
        return "journal" if self.is_main else f"journal-{self.priority.value}"

    def __str__(self) -> str:
        return self.priority.value


MAIN_LANE: Final = Lane(Priority.NORMAL)


def lane_of(priority: Priority) -> Lane:
    return Lane(priority)


def lane_by_id(lane_id: int) -> Lane | None:
    """The lane with id ``lane_id``, or None for an id this gateway does not know."""
    for priority, i in _IDS.items():
        if i == lane_id:
            return Lane(priority)
    return None
