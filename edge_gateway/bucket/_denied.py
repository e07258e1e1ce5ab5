"""Remembering that the store refuses a component, and saying so.

A refusal (:class:`~edge_gateway.bucket.AccessDenied`) is retried like an
outage, but unlike one it does not heal on its own: someone has to rotate a
key, fix a policy or create a bucket. So the components that retry (the
shipper, each mirror tailer) keep a :class:`DenialTracker`: it logs the
refusal at ERROR when it starts (and when its reason changes), reminds at
ERROR every :data:`REMIND_S` while it lasts, logs when access works again,
and holds the :class:`Denial` that ``edgegw status``, ``/v1/status`` and
``/metrics`` show.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from edge_gateway.bucket._errors import AccessDenied

#: While refused, the log repeats the refusal at ERROR this often.
REMIND_S: Final = 300.0


@dataclass(frozen=True, slots=True)
class Denial:
    """A component the store refuses: why, since when, and what to do."""

    #: The store's error code (``InvalidAccessKeyId``, ``NoSuchBucket``...).
    code: str
    #: The last refusal, one line (request, store, answer).
    error: str
    #: What a person does about it.
    action: str
    #: Wall-clock ms of the first refusal of this episode.
    since_ms: int
    #: Refused attempts in this episode.
    refusals: int

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "error": self.error,
            "action": self.action,
            "since_ms": self.since_ms,
            "refusals": self.refusals,
        }


class DenialTracker:
    """The refusal episode of one component (``what`` names it in the log)."""

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        *,
        remind_s: float = REMIND_S,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._log = log
        self._what = what
        self._remind_s = remind_s
        self._clock = clock
        self._wall_ms = wall_ms
        self._current: Denial | None = None
        self._started = 0.0
        self._next_reminder = 0.0

    @property
    def current(self) -> Denial | None:
        """The refusal in force, or ``None`` while the store accepts this component."""
        return self._current

    def refused(self, exc: AccessDenied) -> None:
        """An attempt was refused: log it if it starts an episode or a reminder is due."""
        now = self._clock()
        old = self._current
        if old is None or old.code != exc.code:
            self._log.error(
                "%s: the bucket refuses this gateway (%s): %s -- what to do: %s. "
                "Local intake and reads go on; retrying with backoff.",
                self._what,
                exc.code,
                exc,
                exc.action,
            )
            if old is None:
                self._started = now
            self._next_reminder = now + self._remind_s
            since, before = (self._wall_ms(), 0) if old is None else (old.since_ms, old.refusals)
            self._current = Denial(exc.code, str(exc), exc.action, since, before + 1)
            return
        refusals = old.refusals + 1
        if now >= self._next_reminder:
            self._next_reminder = now + self._remind_s
            self._log.error(
                "%s: still refused by the bucket after %.0f s and %d attempts (%s): %s -- "
                "what to do: %s",
                self._what,
                now - self._started,
                refusals,
                exc.code,
                exc,
                exc.action,
            )
        else:
            self._log.debug("%s: refused again (%s): %s", self._what, exc.code, exc)
        self._current = Denial(exc.code, str(exc), exc.action, old.since_ms, refusals)

    def cleared(self) -> None:
        """An attempt succeeded: the episode (if any) is over."""
        old = self._current
        if old is None:
            return
        self._current = None
        self._log.warning(
            "%s: the bucket accepts this gateway again after %.0f s refused (%s, %d attempts); "
            "resuming",
            self._what,
            self._clock() - self._started,
            old.code,
            old.refusals,
        )
