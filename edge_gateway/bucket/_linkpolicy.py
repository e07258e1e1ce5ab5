"""When the site's link may carry which data: bulk windows and byte allowances.

``[link]`` may restrict *when* data moves, on top of how fast
(:class:`~edge_gateway.bucket.LinkMeter`'s cap):

* ``bulk_windows = ["22:00-06:00", ...]``: local times of day when ``bulk``
  data may ship (a window may wrap midnight); outside them, bulk waits.
* ``daily_bytes`` / ``monthly_bytes``: byte allowances per local day and
  month, counted against what the meter counts (object bytes on the wire,
  uploads and downloads together). Once one is used up, ``normal`` and
  ``bulk`` data wait for the next day (month).

``critical`` data always ships. :class:`LinkPolicy` is the rule, sans-IO:
every question takes the time (``now``, seconds since the epoch, UTC) and
the meter's usage, and the time zone is given once (``None``: the system's
local time, as ``time.localtime``). It never reads a clock.
:class:`LinkGate` (below) applies it to a running gateway: it reads the
wall clock and the meter, logs the changes, and counts what it held.

Edge cases, decided once here (and in ``docs/operations.md``):

* **The boundaries are local.** A day is a local calendar day: it ends at
  local midnight, so a DST day lasts 23 or 25 hours; a window is local
  wall-clock time, so ``22:00-06:00`` lasts 9 hours on the night the clocks
  go back. A window boundary that a DST jump skips (``02:30`` on the night
  the clocks go forward) happens at the jump.
* **An object in flight completes.** The gate is asked before each object;
  one that was allowed moves whole even if it takes the usage past the
  allowance. A period's usage can exceed its allowance by about one object
  (plus downloads already under way).
* **A clock set back never frees the allowance.** Usage recorded for a later
  day (month) than the clock now says counts as the current period's: the
  meter carries it back (``LinkMeter``), and the allowance is available again
  only when the clock next *passes* midnight (the 1st of a month). So a
  clock set back spends less, never more; a clock set forward (a boot with
  a date in the future, then corrected) at worst holds data until the next
  local midnight.
"""

from __future__ import annotations

import enum
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, tzinfo
from typing import Final

import trio

from edge_gateway.bucket._base import Bucket, GetResult
from edge_gateway.bucket._delegating import DelegatingBucket
from edge_gateway.errors import ConfigError, InvalidInput

__all__ = [
    "PRIORITIES",
    "HeldBucket",
    "LinkGate",
    "LinkPolicy",
    "LinkPolicyStats",
    "Priority",
    "Usage",
    "Window",
    "parse_window",
]

log = logging.getLogger("edgegw.link")


class Priority(enum.StrEnum):
    """A topic's priority class on the link."""

    CRITICAL = "critical"
    NORMAL = "normal"
    BULK = "bulk"


PRIORITIES: Final = tuple(str(p) for p in Priority)

#: While data is held, the gate looks again at least this often (the wall clock may be set).
RECHECK_S: Final = 5.0

_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")
_DAY_MIN: Final = 24 * 60


@dataclass(frozen=True, slots=True)
class Window:
    """A daily span of local time, ``start`` to ``end`` in minutes after midnight.

    ``end < start`` wraps midnight (``22:00-06:00``); ``end`` may be 1440
    (``24:00``). Never empty, never the whole day (that is no window at all).
    """

    start: int
    end: int

    def __str__(self) -> str:
        return f"{_hhmm(self.start)}-{_hhmm(self.end)}"

    def contains(self, minute: float) -> bool:
        """Whether ``minute`` (after local midnight, fractional) falls in the window."""
        if self.start < self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end


def _hhmm(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


def parse_window(text: object, where: str = "link.bulk_windows") -> Window:
    """``"22:00-06:00"`` → :class:`Window`; :class:`ConfigError` naming ``where`` otherwise."""
    if not isinstance(text, str):
        raise ConfigError(f'{where}: must be a string like "22:00-06:00", not {text!r}')
    m = _WINDOW.match(text)
    if m is None:
        raise ConfigError(f'{where}: {text!r} is not a window like "22:00-06:00" (HH:MM-HH:MM)')
    sh, sm, eh, em = (int(g) for g in m.groups())
    for h, mi, what in ((sh, sm, "start"), (eh, em, "end")):
        if mi > 59 or h > 24 or (h == 24 and mi != 0):
            raise ConfigError(f"{where}: {text!r}: the {what} is not a time of day (00:00-24:00)")
    start, end = sh * 60 + sm, eh * 60 + em
    if start == _DAY_MIN:
        raise ConfigError(f"{where}: {text!r}: a window starts at 23:59 at the latest")
    if start == end or (start == 0 and end == _DAY_MIN):
        raise ConfigError(
            f"{where}: {text!r} is empty or the whole day; leave bulk_windows unset for "
            "'bulk may ship at any time'"
        )
    return Window(start, end % _DAY_MIN if end == _DAY_MIN and start > 0 else end)


@dataclass(frozen=True, slots=True)
class Usage:
    """Bytes the meter counted in a local day and month (``LinkStatistics`` carries them)."""

    day: str  # "YYYY-MM-DD", local
    day_bytes: int
    month: str  # "YYYY-MM", local
    month_bytes: int


@dataclass(frozen=True, slots=True)
class _Decision:
    allowed: bool
    #: Seconds since the epoch when it will next allow (== now when allowed).
    opens_at: float
    #: Why not ("outside bulk_windows", "daily allowance used"), or None.
    reason: str | None


class LinkPolicy:
    """Bulk windows and allowances (see the module docstring). Sans-IO: pass the time in."""

    def __init__(
        self,
        windows: Sequence[Window] = (),
        *,
        daily_bytes: int = 0,
        monthly_bytes: int = 0,
        tz: tzinfo | None = None,
    ) -> None:
        if daily_bytes < 0 or monthly_bytes < 0:
            raise ValueError("allowances must be >= 0 (0: none)")
        self.windows = tuple(windows)
        self.daily_bytes = daily_bytes
        self.monthly_bytes = monthly_bytes
        self.tz = tz

    @property
    def restricts(self) -> bool:
        """Whether anything is restricted at all (else every question answers "yes")."""
        return bool(self.windows or self.daily_bytes or self.monthly_bytes)

    # ------------------------------------------------------------ local time

    def local(self, now: float) -> datetime:
        """``now`` as local wall-clock time (naive for the system's zone, aware for ``tz``)."""
        if self.tz is None:
            return datetime.fromtimestamp(now)
        return datetime.fromtimestamp(now, self.tz)

    def _at(self, day: date, minute: int) -> float:
        """Seconds since the epoch of local ``day`` at ``minute`` after midnight.

        A time a DST jump skips maps to the jump (fold 0: the offset before it).
        """
        naive = datetime(day.year, day.month, day.day) + timedelta(minutes=minute)
        if self.tz is None:
            return naive.timestamp()  # mktime: the system's rules
        return naive.replace(tzinfo=self.tz).timestamp()

    @staticmethod
    def periods(local: datetime) -> tuple[str, str]:
        """The day and month keys of a local time (as ``LinkMeter`` writes them)."""
        return local.strftime("%Y-%m-%d"), local.strftime("%Y-%m")

    # ------------------------------------------------------------ windows

    def window_open(self, now: float) -> bool:
        """Whether bulk data may ship now as far as the windows go (True without windows)."""
        if not self.windows:
            return True
        t = self.local(now)
        minute = t.hour * 60 + t.minute + (t.second + t.microsecond / 1e6) / 60
        return any(w.contains(minute) for w in self.windows)

    def next_window_change(self, now: float) -> float | None:
        """When the windows next open or close (seconds since the epoch); None without windows.

        Adjacent or overlapping windows count as one: a change is a moment
        when :meth:`window_open` answers differently than it does now.
        """
        if not self.windows:
            return None
        state = self.window_open(now)
        today = self.local(now).date()
        edges = sorted(
            {
                self._at(today + timedelta(days=d), m)
                for d in range(3)
                for w in self.windows
                for m in (w.start, w.end)
            }
        )
        before = now
        for t in edges:
            if t <= now:
                continue
            if self.window_open(t) != state:
                return _first_change(before, t, lambda x: self.window_open(x) != state)
            before = t
        # Unreachable with a valid window (each opens and closes daily); be safe.
        return now + 86400.0

    # ------------------------------------------------------------ allowances

    def used(self, now: float, usage: Usage) -> tuple[int, int]:
        """Bytes used in the current local day and month.

        Usage of an earlier period counts as 0 (the period rolled); usage
        recorded for a *later* period than ``now`` (the clock was set back)
        counts as the current one's.
        """
        day, month = self.periods(self.local(now))
        day_used = usage.day_bytes if usage.day >= day else 0
        month_used = usage.month_bytes if usage.month >= month else 0
        return day_used, month_used

    def remaining(self, now: float, usage: Usage) -> tuple[int | None, int | None]:
        """Bytes left today and this month (None: no such allowance)."""
        day_used, month_used = self.used(now, usage)
        day = max(0, self.daily_bytes - day_used) if self.daily_bytes else None
        month = max(0, self.monthly_bytes - month_used) if self.monthly_bytes else None
        return day, month

    def _next_midnight(self, now: float) -> float:
        today = self.local(now).date()
        for d in (1, 2):
            t = self._at(today + timedelta(days=d), 0)
            if t > now:
                return _first_change(now, t, lambda x: self.local(x).date() > today)
        return now + 86400.0  # unreachable

    def _next_month(self, now: float) -> float:
        today = self.local(now).date()
        first = date(today.year + (today.month == 12), today.month % 12 + 1, 1)
        t = max(self._at(first, 0), now)
        return _first_change(now, t, lambda x: self.local(x).date() >= first)

    # ------------------------------------------------------------ the rule

    def decide(self, priority: str, now: float, usage: Usage) -> _Decision:
        """May data of ``priority`` move at ``now``; if not, when and why not."""
        prio = _priority(priority)
        if prio is Priority.CRITICAL:
            return _Decision(True, now, None)
        opens_at, reasons = now, []
        day_left, month_left = self.remaining(now, usage)
        if day_left == 0:
            opens_at = max(opens_at, self._next_midnight(now))
            reasons.append(f"the daily allowance ({self.daily_bytes} B) is used")
        if month_left == 0:
            opens_at = max(opens_at, self._next_month(now))
            reasons.append(f"the monthly allowance ({self.monthly_bytes} B) is used")
        if prio is Priority.BULK and self.windows and not self.window_open(opens_at):
            change = self.next_window_change(opens_at)
            assert change is not None
            opens_at = change
            if not reasons:
                reasons.append("outside link.bulk_windows")
        if not reasons:
            return _Decision(True, now, None)
        return _Decision(False, opens_at, "; ".join(reasons))

    def allows(self, priority: str, now: float, usage: Usage) -> bool:
        """Whether data of ``priority`` may move at ``now``."""
        return self.decide(priority, now, usage).allowed

    def opens_in_s(self, priority: str, now: float, usage: Usage) -> float:
        """Seconds until data of ``priority`` may move (0: now).

        Assumes no more bytes are used meanwhile (held data uses none).
        """
        return max(0.0, self.decide(priority, now, usage).opens_at - now)


def _first_change(before: float, at: float, changed: Callable[[float], bool]) -> float:
    """The first moment in ``(before, at]`` when ``changed`` holds (it holds at ``at``).

    A local time computed for a boundary is exact except when a DST jump
    skips it (``02:30`` the night the clocks go forward maps to ``03:30``):
    then the change happens at the jump, earlier. Bisecting to a millisecond
    finds it; an exact boundary comes back unchanged.
    """
    if not changed(at) or not changed(at - 1e-3):
        return at  # the usual case: the computed boundary is exact
    lo, hi = before, at
    if changed(lo):
        return lo
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        if changed(mid):
            hi = mid
        else:
            lo = mid
    # A jump happens on a whole second: prefer it to a point a hair after.
    whole = float(math.ceil(lo))
    return whole if whole <= hi and changed(whole) else hi


def _priority(priority: str) -> Priority:
    try:
        return Priority(priority)
    except ValueError:
        raise InvalidInput(f"priority {priority!r} is not one of {', '.join(PRIORITIES)}") from None


# ---------------------------------------------------------------- the gate


@dataclass(frozen=True, slots=True)
class LinkPolicyStats:
    """:class:`LinkGate`'s view now, for metrics and ``edgegw status``."""

    windows: tuple[str, ...]
    window_open: bool
    #: Seconds until the windows next open or close (None: no windows).
    window_change_in_s: float | None
    daily_bytes: int
    monthly_bytes: int
    day_used: int
    month_used: int
    #: None: no such allowance.
    day_remaining: int | None
    month_remaining: int | None
    #: Per priority: may it move now, and seconds until it may (0: now).
    allowed: dict[str, bool]
    opens_in_s: dict[str, float]
    #: Per priority: objects that had to wait, and whether one is waiting now.
    held: dict[str, int]
    holding: dict[str, bool]


@dataclass
class _Seen:
    window_open: bool | None = None
    day_out: bool = False
    month_out: bool = False
    holding: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(PRIORITIES, False))


class LinkGate:
    """A :class:`LinkPolicy` applied to a running gateway's meter and wall clock.

    ``usage`` returns the meter's current :class:`Usage`; ``wall`` the wall
    clock (seconds since the epoch; tests pass their own). The gate logs
    once when a window opens or closes and when an allowance runs out or
    comes back, not per object.
    """

    def __init__(
        self,
        policy: LinkPolicy,
        usage: Callable[[], Usage],
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self._usage = usage
        self._wall = wall
        self._held = dict.fromkeys(PRIORITIES, 0)
        self._seen = _Seen()

    @property
    def restricts(self) -> bool:
        return self.policy.restricts

    def may_ship(self, priority: str = "normal") -> bool:
        """Whether data of ``priority`` may go on the link now."""
        now, usage = self._wall(), self._usage()
        self._observe(now, usage)
        return self.policy.allows(priority, now, usage)

    def opens_in_s(self, priority: str = "normal") -> float:
        """Seconds until data of ``priority`` may go on the link (0: now)."""
        now, usage = self._wall(), self._usage()
        self._observe(now, usage)
        return self.policy.opens_in_s(priority, now, usage)

    async def wait_may_ship(self, priority: str = "normal") -> None:
        """Wait until data of ``priority`` may go on the link (returns at once if it may).

        Looks again at least every :data:`RECHECK_S` seconds: the wall clock
        may be set meanwhile, and the wait itself runs on the monotonic clock.
        """
        prio = str(_priority(priority))
        now, usage = self._wall(), self._usage()
        self._observe(now, usage)
        decision = self.policy.decide(prio, now, usage)
        if decision.allowed:
            return
        self._held[prio] += 1
        self._seen.holding[prio] = True
        log.warning(
            "link: holding %s data: %s; it may ship again in %.0f s (at %s local time)",
            prio,
            decision.reason,
            decision.opens_at - now,
            self.policy.local(decision.opens_at).strftime("%Y-%m-%d %H:%M"),
        )
        try:
            while True:
                await trio.sleep(max(0.05, min(RECHECK_S, decision.opens_at - now)))
                now, usage = self._wall(), self._usage()
                self._observe(now, usage)
                decision = self.policy.decide(prio, now, usage)
                if decision.allowed:
                    break
        finally:
            self._seen.holding[prio] = False
        log.info("link: %s data may ship again", prio)

    def note_holding(self, priority: str, holding: bool) -> None:
        """The shipper holds back (or no longer holds) data of ``priority`` waiting to ship.

        For a hold that happens outside :meth:`wait_may_ship` (the shipper
        skips a held lane): counted and logged once per episode, as there.
        """
        prio = str(_priority(priority))
        if holding == self._seen.holding[prio]:
            return
        self._seen.holding[prio] = holding
        if not holding:
            if self.policy.allows(prio, self._wall(), self._usage()):
                log.info("link: %s data may ship again", prio)
            return
        self._held[prio] += 1
        now, usage = self._wall(), self._usage()
        decision = self.policy.decide(prio, now, usage)
        log.warning(
            "link: holding %s data: %s; it may ship again in %.0f s (at %s local time)",
            prio,
            decision.reason,
            max(0.0, decision.opens_at - now),
            self.policy.local(decision.opens_at).strftime("%Y-%m-%d %H:%M"),
        )

    def statistics(self) -> LinkPolicyStats:
        now, usage = self._wall(), self._usage()
        self._observe(now, usage)
        p = self.policy
        change = p.next_window_change(now)
        day_used, month_used = p.used(now, usage)
        day_left, month_left = p.remaining(now, usage)
        decisions = {prio: p.decide(prio, now, usage) for prio in PRIORITIES}
        return LinkPolicyStats(
            windows=tuple(str(w) for w in p.windows),
            window_open=p.window_open(now),
            window_change_in_s=None if change is None else max(0.0, change - now),
            daily_bytes=p.daily_bytes,
            monthly_bytes=p.monthly_bytes,
            day_used=day_used,
            month_used=month_used,
            day_remaining=day_left,
            month_remaining=month_left,
            allowed={k: d.allowed for k, d in decisions.items()},
            opens_in_s={k: max(0.0, d.opens_at - now) for k, d in decisions.items()},
            held=dict(self._held),
            holding=dict(self._seen.holding),
        )

    def _observe(self, now: float, usage: Usage) -> None:
        """Log the changes since the last look: a window, an allowance."""
        p, seen = self.policy, self._seen
        if p.windows:
            is_open = p.window_open(now)
            if seen.window_open is not None and is_open != seen.window_open:
                change = p.next_window_change(now)
                log.info(
                    "link: bulk window %s (link.bulk_windows %s); next change at %s local time",
                    "opened" if is_open else "closed",
                    ", ".join(str(w) for w in p.windows),
                    "?" if change is None else p.local(change).strftime("%Y-%m-%d %H:%M"),
                )
            seen.window_open = is_open
        day_left, month_left = p.remaining(now, usage)
        for out, attr, what, limit in (
            (day_left == 0, "day_out", "daily", p.daily_bytes),
            (month_left == 0, "month_out", "monthly", p.monthly_bytes),
        ):
            if out and not getattr(seen, attr):
                log.warning(
                    "link: the %s allowance (%d B, link.%s_bytes) is used up: only critical "
                    "data ships until it renews",
                    what,
                    limit,
                    what,
                )
            elif not out and getattr(seen, attr):
                log.info("link: the %s allowance renewed", what)
            setattr(seen, attr, out)


# ---------------------------------------------------------------- the hold

_LOG_KEY = re.compile(r"(?:^|/)regions/[^/]+/log/[^/]+$")


class HeldBucket(DelegatingBucket):
    """A bucket whose reads of log objects wait for a :class:`LinkGate` (the mirrors' bucket).

    Mirroring downloads count against the allowance too: each read of a log
    object waits while ``priority`` (``normal``) may not move; every other
    key passes. The gate is asked before the transfer: one that was allowed
    completes. (The shipper is held per lane by :attr:`Shipper.may_ship
    <edge_gateway.shipper.Shipper.may_ship>`, not by a bucket.)
    """

    def __init__(self, inner: Bucket, gate: LinkGate, *, priority: str = "normal"):
        # The inner bucket belongs to the gateway, which closes it.
        super().__init__(inner, close_inner=False)
        self.gate = gate
        self.priority = str(_priority(priority))

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        if _LOG_KEY.search(key):
            await self.gate.wait_may_ship(self.priority)
        return await self.inner.get(key, start=start, end=end)
