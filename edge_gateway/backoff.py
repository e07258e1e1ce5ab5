"""How long to wait before a retry: one exponential backoff with full jitter.

Every wait before a retry in edgegw is drawn by :class:`Backoff`: the
shipper's uploads and claims, a tailer's reads and its quarantined entries,
the metadata client's polls and reports, the MQTT bridge's connects and
journal refusals, the supervisor's restarts, the Python client's produce
retries. One rule, so that one page (``docs/protocol.md``, "Retry waits")
says how every component behaves while something is away.

The rule, for the ``n``-th consecutive failure (``n`` from 0)::

    ceiling(n) = max(floor_s, min(cap_s, base_s * multiplier ** n))
    delay(n)   = floor_s + (ceiling(n) - floor_s) * u      u uniform in [0, 1)

*Full jitter*: anywhere from the floor up to the ceiling. Of the usual
variants it spreads the retries of many clients that failed together the
widest (the AWS architecture blog's "Exponential Backoff and Jitter"), so a
fleet that lost its bucket, its metadata server or its broker at the same
moment does not come back in waves. ``floor_s`` (0 unless a call site needs
one) is the shortest wait: where "at once" is wrong -- a quarantined entry
re-read a moment after it was refused, a crashing task restarted in a tight
loop -- the floor says so, rather than a second jitter rule. A server's
``Retry-After`` shifts the whole draw (:meth:`Backoff.delay_after`): never
sooner than it asked, and spread after that.

Sans-IO: this computes delays and the caller sleeps. It imports nothing of
edgegw, so every layer may use it -- the public client (``client.py``), the
front doors and the core -- without pulling in anything else. The random
source is injectable (``rng``), and any single draw may be passed in, so
tests and callers that own a seeded stream are deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

__all__ = ["Backoff"]

#: Past this many failures the exponent stops growing: the ceiling reached
#: any cap long before, and the power stays cheap after a week of failures.
_MAX_EXPONENT = 1023


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with full jitter above an optional floor (see the module docstring).

    Call :meth:`next_delay` after each failure and sleep that long; call
    :meth:`reset` after a success. ``attempt`` counts the failures since the
    last reset.
    """

    #: The ceiling of the first wait.
    base_s: float = 0.1
    #: The ceiling never grows past this (unless ``floor_s`` is larger).
    cap_s: float = 30.0
    #: Consecutive failures so far (the next delay is the ``attempt``-th, from 0).
    attempt: int = 0
    _: KW_ONLY
    #: The shortest wait: every delay is at least this (0: full jitter from zero).
    floor_s: float = 0.0
    #: The ceiling grows by this factor per failure.
    multiplier: float = 2.0
    #: Uniform draws in [0, 1); ``random.random`` unless injected.
    rng: Callable[[], float] = field(default=random.random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if min(self.base_s, self.cap_s, self.floor_s) < 0:
            raise ValueError(
                f"backoff times must be >= 0 (base_s={self.base_s}, cap_s={self.cap_s}, "
                f"floor_s={self.floor_s})"
            )
        if self.multiplier < 1:
            raise ValueError(f"backoff multiplier must be >= 1, not {self.multiplier}")
        if self.attempt < 0:
            raise ValueError(f"backoff attempt must be >= 0, not {self.attempt}")

    @property
    def ceiling_s(self) -> float:
        """The longest the next delay can be (it is drawn from ``[floor_s, ceiling_s)``)."""
        try:
            grown = self.base_s * self.multiplier ** min(self.attempt, _MAX_EXPONENT)
        except OverflowError:  # past any cap (a huge multiplier)
            grown = self.cap_s if self.base_s > 0 else 0.0
        return max(self.floor_s, min(self.cap_s, grown))

    def next_delay(self, draw: float | None = None) -> float:
        """The wait before the next attempt; counts a failure.

        ``draw`` is a uniform random number in [0, 1] to use instead of one
        from ``rng`` (a caller that owns a seeded stream; tests).
        """
        u = self.rng() if draw is None else draw
        if not 0.0 <= u <= 1.0:
            raise ValueError(f"a backoff draw is in [0, 1], not {u}")
        ceiling = self.ceiling_s
        self.attempt += 1
        return self.floor_s + (ceiling - self.floor_s) * u

    def delay_after(self, retry_after_s: float | None, draw: float | None = None) -> float:
        """The next delay when the server may have said when to come back (``Retry-After``).

        Never sooner than it asked, and spread over the next backoff window
        after that: a whole fleet told "in 5 s" must not all come back in
        exactly 5 s. Without ``retry_after_s`` it is :meth:`next_delay`; a
        negative one counts as 0.
        """
        delay = self.next_delay(draw)
        if retry_after_s is None:
            return delay
        return max(0.0, retry_after_s) + delay

    def reset(self) -> None:
        """A success: the next failure waits from ``base_s`` again."""
        self.attempt = 0
