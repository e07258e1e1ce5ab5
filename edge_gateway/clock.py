"""The bucket's clock as this gateway sees it: the skew, and "now" on the bucket's time.

Edge devices' clocks are often wrong: no battery-backed clock, NTP only while
a link is up, a boot years in the past. So no decision compares this machine's
wall clock with a time another machine wrote (``docs/operations.md``,
"Clocks"):

* **ages of objects in the bucket** (GC) are measured on the bucket's own
  clock: :meth:`BucketClock.now_ms` is the store's time, taken from what the
  store says about the objects this gateway writes (an S3 response's
  ``Date``, a local directory's file modification time) and carried forward
  on the monotonic clock between two writes;
* **the skew** (this machine's wall clock minus the bucket's) is measured on
  every object the shipper writes, the fence of its claim at start included;
  it is reported (``edgegw_clock_skew_seconds``, ``edgegw status``), a
  WARNING is logged past ``clock.warn_skew_ms``, and past
  ``clock.gc_pause_skew_ms`` bucket GC deletes nothing at all
  (:meth:`BucketClock.gc_pause_reason`) until the clock is sane again.

The class is sans-IO: whoever talks to the bucket feeds it samples
(:meth:`BucketClock.begin` before a request, :meth:`BucketClock.observe`
after it). Carrying the bucket's time forward on the monotonic clock errs
only one way: a monotonic clock stopped by a suspend, or a ``Date`` header
truncated to the second, make the bucket's "now" *earlier* than it is, so
objects look younger and GC deletes later, never sooner.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from edge_gateway.errors import ConfigError

__all__ = ["BucketClock", "ClockConfig", "ClockState", "ClockStats", "ClockTicket"]

log = logging.getLogger("edgegw.clock")

#: While the skew stays beyond the warning bound, the WARNING is repeated this often.
REMIND_S: Final = 600.0


@dataclass(frozen=True, slots=True)
class ClockConfig:
    """``[clock]``: how much disagreement with the bucket's clock is tolerated."""

    #: Beyond this skew (either way), a WARNING is logged and status shows it.
    warn_skew_ms: int = 60_000
    #: Beyond this skew, bucket GC deletes nothing until the clock is back within it.
    gc_pause_skew_ms: int = 3_600_000

    def __post_init__(self) -> None:
        if self.warn_skew_ms <= 0:
            raise ConfigError("clock.warn_skew_ms must be > 0")
        if self.gc_pause_skew_ms < self.warn_skew_ms:
            raise ConfigError("clock.gc_pause_skew_ms must be >= clock.warn_skew_ms")


class ClockState(enum.StrEnum):
    """How this gateway's clock compares with the bucket's."""

    #: No sample yet (the bucket has not answered a write).
    UNKNOWN = "unknown"
    #: Within ``warn_skew_ms``.
    OK = "ok"
    #: Beyond ``warn_skew_ms``: a WARNING; everything still runs.
    SKEWED = "skewed"
    #: Beyond ``gc_pause_skew_ms``: bucket GC deletes nothing.
    GC_PAUSED = "gc-paused"


@dataclass(frozen=True, slots=True)
class ClockTicket:
    """This machine's clocks just before a request (see :meth:`BucketClock.begin`)."""

    wall_ms: int
    mono_s: float


@dataclass(frozen=True, slots=True)
class ClockStats:
    """A snapshot of :class:`BucketClock` (``edgegw status`` shows it as ``clock``)."""

    state: ClockState
    #: This machine's wall clock minus the bucket's, in seconds (None: no sample).
    skew_s: float | None
    #: Samples taken (one per object written).
    samples: int
    #: What the last sample was taken on (an object key).
    measured_on: str | None
    #: Seconds since the last sample, on the monotonic clock.
    sample_age_s: float | None
    #: The bucket's time now, ms since the epoch (None: no sample).
    bucket_now_ms: int | None
    warn_skew_s: float
    gc_pause_skew_s: float


@dataclass(frozen=True, slots=True)
class _Sample:
    bucket_ms: int
    mono_s: float
    skew_ms: int
    what: str


class BucketClock:
    """Skew and bucket time of one gateway, fed by the objects it writes.

    ``wall`` and ``mono`` return this machine's wall clock (ms since the
    epoch) and monotonic clock (seconds); tests pass their own.
    """

    def __init__(
        self,
        config: ClockConfig | None = None,
        *,
        wall: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or ClockConfig()
        self._wall = wall
        self._mono = mono
        self._last: _Sample | None = None
        self._samples = 0
        self._state = ClockState.UNKNOWN
        self._logged_skew_ms: int | None = None
        self._logged_at = 0.0

    def begin(self) -> ClockTicket:
        """This machine's clocks just before a request whose answer carries the bucket's time."""
        return ClockTicket(self._wall(), self._mono())

    def observe(self, ticket: ClockTicket, bucket_time: datetime, what: str) -> float:
        """Record the bucket's time ``bucket_time`` from a request begun at ``ticket``.

        The bucket's time is taken as of the middle of the request (a
        request takes milliseconds; the bounds are seconds to hours).
        Returns the skew in seconds.
        """
        wall_ms = (ticket.wall_ms + self._wall()) // 2
        mono_s = (ticket.mono_s + self._mono()) / 2
        bucket_ms = int(bucket_time.timestamp() * 1000)
        sample = _Sample(bucket_ms, mono_s, wall_ms - bucket_ms, what)
        self._last = sample
        self._samples += 1
        self._update_state(sample)
        return sample.skew_ms / 1000

    def now_ms(self) -> int | None:
        """The bucket's time now (ms since the epoch), or None before the first sample.

        The last sample carried forward on the monotonic clock: this
        machine's wall clock plays no part, so setting it (by hand, by NTP,
        by a boot with no clock) changes nothing here.
        """
        last = self._last
        if last is None:
            return None
        elapsed = max(0.0, self._mono() - last.mono_s)
        return last.bucket_ms + int(elapsed * 1000)

    @property
    def skew_s(self) -> float | None:
        """This machine's wall clock minus the bucket's (seconds; positive: ahead)."""
        return None if self._last is None else self._last.skew_ms / 1000

    @property
    def state(self) -> ClockState:
        return self._state

    def gc_pause_reason(self) -> str | None:
        """Why bucket GC must not delete now (the skew is beyond the pause bound), or None."""
        last = self._last
        if self._state is not ClockState.GC_PAUSED or last is None:
            return None
        return (
            f"this gateway's clock is {_describe_skew(last.skew_ms)} the bucket's, beyond "
            f"clock.gc_pause_skew_ms ({self.config.gc_pause_skew_ms} ms): bucket GC deletes "
            "nothing until the clock is set right"
        )

    def statistics(self) -> ClockStats:
        last = self._last
        return ClockStats(
            state=self._state,
            skew_s=self.skew_s,
            samples=self._samples,
            measured_on=None if last is None else last.what,
            sample_age_s=None if last is None else max(0.0, self._mono() - last.mono_s),
            bucket_now_ms=self.now_ms(),
            warn_skew_s=self.config.warn_skew_ms / 1000,
            gc_pause_skew_s=self.config.gc_pause_skew_ms / 1000,
        )

    def _update_state(self, sample: _Sample) -> None:
        skew = abs(sample.skew_ms)
        if skew > self.config.gc_pause_skew_ms:
            state = ClockState.GC_PAUSED
        elif skew > self.config.warn_skew_ms:
            state = ClockState.SKEWED
        else:
            state = ClockState.OK
        before, self._state = self._state, state
        now = sample.mono_s
        if state is ClockState.OK:
            if before in (ClockState.SKEWED, ClockState.GC_PAUSED):
                log.warning(
                    "clock: this gateway's clock is within %.1f s of the bucket's again "
                    "(measured on %s)%s",
                    sample.skew_ms / 1000,
                    sample.what,
                    "; bucket GC resumes" if before is ClockState.GC_PAUSED else "",
                )
            self._logged_skew_ms = None
            return
        # Skewed: say so on a change of state, when the skew moved by more
        # than the warning bound (the clock was set again), and now and then.
        moved = (
            self._logged_skew_ms is None
            or abs(sample.skew_ms - self._logged_skew_ms) > self.config.warn_skew_ms
        )
        if state is before and not moved and now - self._logged_at < REMIND_S:
            return
        self._logged_skew_ms = sample.skew_ms
        self._logged_at = now
        consequence = (
            "; bucket GC is paused (clock.gc_pause_skew_ms) until the clock is set right"
            if state is ClockState.GC_PAUSED
            else ""
        )
        log.warning(
            "clock: this gateway's clock is %s the bucket's (measured on %s, "
            "clock.warn_skew_ms %d): timestamps this gateway gives records are off by as much; "
            "object ages are measured on the bucket's clock%s",
            _describe_skew(sample.skew_ms),
            sample.what,
            self.config.warn_skew_ms,
            consequence,
        )


def _describe_skew(skew_ms: int) -> str:
    """``3456000.0 s (40.0 days) ahead of`` / ``12.5 s behind``."""
    seconds = abs(skew_ms) / 1000
    way = "ahead of" if skew_ms > 0 else "behind"
    if seconds >= 2 * 86400:
        return f"{seconds:.1f} s ({seconds / 86400:.1f} days) {way}"
    if seconds >= 2 * 3600:
        return f"{seconds:.1f} s ({seconds / 3600:.1f} h) {way}"
    return f"{seconds:.1f} s {way}"
