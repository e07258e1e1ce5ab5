"""The metadata server's in-memory parts that carry a fleet: head fan-out, load shedding,
heartbeat write-behind.

* :class:`HeadRelay` — each region's latest log seq and the held ``GET /v1/heads``
  long polls and watches, indexed by the regions they follow: a head report
  wakes only the polls that follow that region (O(its followers), not O(all
  polls)), and a poll woken by several reports before it runs answers once,
  with the latest heads (coalescing). Checking for moved heads and parking the
  waiter happen with no checkpoint between them, so a report can never fall
  between the check and the wait (no lost wake-up). A watch in step (its
  task parked, every move of its regions written) gets the report's line
  written by the report itself (:class:`HeadWatch`): one encoding per report,
  one socket write per follower, no task woken.
* :class:`LatencyHistogram` — report received → its line written, per watch.
* :class:`Admission` — the overload answer: past ``max_inflight`` requests in
  progress, ``max_long_polls`` held polls or ``max_verifying`` tokens waiting
  for their check (a store lookup; ~40 ms of scrypt for a hash an earlier
  server wrote, once), a request gets ``503
  overloaded`` with ``Retry-After`` at once instead of queueing without
  bound; clients back off with jitter (``edge_gateway.metadata.client``).
* :class:`HeartbeatWriter` — heartbeats are answered from memory and written
  to the store behind, coalesced per region (the latest heartbeat of each
  region since the last write), so a fleet's heartbeats cost the database
  what it can take, not one transaction (and fsync) each.

None of this touches the store's internals: the writer calls the store's
``heartbeat`` method and nothing else.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, cast

import trio

from edge_gateway.metadata._watch import encode_heads

__all__ = [
    "Admission",
    "AdmissionStatistics",
    "HeadRelay",
    "HeadWatch",
    "HeadsUpdate",
    "Heartbeat",
    "HeartbeatWriter",
    "LatencyHistogram",
    "Overloaded",
]

#: Retry-After is at least this (seconds; HTTP says whole seconds).
_RETRY_AFTER_MIN_S: Final = 1
#: ... and at most this: a client told to wait longer would look dead to its operator.
_RETRY_AFTER_MAX_S: Final = 30


@dataclass(frozen=True, slots=True)
class HeadsUpdate:
    """An answer of :meth:`HeadRelay.wait_heads`: heads that moved after ``since``."""

    version: int
    heads: dict[str, int]


class LatencyHistogram:
    """Counts of durations in logarithmic buckets (4 per doubling, 16 µs to ~70 s).

    Sans-IO and O(1) per :meth:`observe`; quantiles are read to within a
    bucket (±9 %). :attr:`counts` is cumulative: two snapshots subtracted
    give the figures of the time between them (``bench/fleet.py`` does).
    """

    #: Upper bound of bucket i, in microseconds: 16 * 2 ** (i / 4); the last is unbounded.
    BOUNDS_US: Final = tuple(round(16 * 2 ** (i / 4)) for i in range(89))

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = [0] * (len(self.BOUNDS_US) + 1)

    def observe(self, seconds: float) -> None:
        us = seconds * 1e6
        if us <= 16:
            self.counts[0] += 1
            return
        i = math.ceil(4 * math.log2(us / 16))
        self.counts[min(i, len(self.BOUNDS_US))] += 1

    @property
    def count(self) -> int:
        return sum(self.counts)

    @classmethod
    def quantile_of(cls, counts: list[int], q: float) -> float | None:
        """The ``q`` quantile (0..1) of ``counts``, in seconds (a bucket's upper bound)."""
        total = sum(counts)
        if not total:
            return None
        rank = max(1, math.ceil(q * total))
        seen = 0
        for i, c in enumerate(counts):
            seen += c
            if seen >= rank:
                return cls.BOUNDS_US[min(i, len(cls.BOUNDS_US) - 1)] / 1e6
        return None  # pragma: no cover (rank <= total)

    def quantile(self, q: float) -> float | None:
        return self.quantile_of(self.counts, q)


class _Waiter:
    """One held long poll: woken (its event set) when a region it follows moves."""

    __slots__ = ("direct", "event", "pending_at", "regions")

    def __init__(self, regions: frozenset[str] | None) -> None:
        self.regions = regions
        self.event = trio.Event()
        #: Lines may be written by the relay itself (a :class:`HeadWatch` in step).
        self.direct = False
        #: perf_counter() of the oldest report not yet written to it (None: none).
        self.pending_at: float | None = None


class HeadWatch(_Waiter):
    """One streaming watch, registered with the relay for its whole life.

    Its task writes a line of the heads moved since :attr:`since` whenever
    woken, then parks with :attr:`direct` set when it can write from other
    tasks (``send_nowait``, the HTTP server's SEND_NOWAIT). While it is
    parked and in step, a report writes the report's own line
    (``{"version": V, "heads": {region: seq}}``, encoded once for all its
    followers) straight to the socket: nothing of the watch's regions moved
    since its last line but this, so that line *is* the heads moved after
    :attr:`since`. Heads a replica applies from the database (its own
    batch, another replica's moves: :meth:`HeadRelay.apply`) go the same
    way, one line per move in version order. Anything else — a socket that
    did not take the whole line, a watch without ``send_nowait`` — wakes the
    task, which is the general path.
    """

    __slots__ = ("keepalive_s", "last_line_at", "send_nowait", "since")

    def __init__(
        self,
        regions: frozenset[str] | None,
        since: int,
        send_nowait: Callable[[bytes], bool] | None,
        keepalive_s: float = math.inf,
    ) -> None:
        super().__init__(regions)
        self.since = since
        self.send_nowait = send_nowait
        #: A line with no heads is due this long after the last line
        #: (:meth:`HeadRelay.sweep_keepalives` writes it, or wakes the task).
        self.keepalive_s = keepalive_s
        #: trio.current_time() of the last line written (the keep-alive counts from it).
        self.last_line_at = trio.current_time()

    def keepalive_due(self, now: float) -> bool:
        return now - self.last_line_at >= self.keepalive_s

    def rearm(self) -> None:
        """The task is about to park: a new event, and direct lines if the server offers them."""
        if self.event.is_set():
            self.event = trio.Event()
        self.direct = self.send_nowait is not None


class HeadRelay:
    """Each region's latest committed log seq, with a version that grows on every move.

    Versions start at the server's start time in microseconds, so after a
    restart they are above any version a client saw before: a client's
    ``since`` from the previous run then gets every known head at once.
    """

    def __init__(self, *, version: int | None = None) -> None:
        self.version = time.time_ns() // 1000 if version is None else version
        #: region -> (seq, version at which it last moved)
        self._heads: dict[str, tuple[int, int]] = {}
        #: region -> the polls that follow it; polls of every region apart.
        self._followers: dict[str, set[_Waiter]] = {}
        self._everything: set[_Waiter] = set()
        #: Every registered watch, for the keep-alive sweep.
        self._watches: set[HeadWatch] = set()
        self._held = 0
        self._closed = False
        self.reports = 0
        self.moves = 0
        self.wakeups = 0
        #: Lines the reports wrote to watches themselves (no task woken).
        self.direct_lines = 0
        #: Keep-alive lines the sweep wrote itself (no task woken).
        self.direct_keepalives = 0
        #: Report received → its line written to a watch, per (report, watch).
        self.line_latency = LatencyHistogram()

    @property
    def closed(self) -> bool:
        """The server is stopping: every wait returns at once."""
        return self._closed

    @property
    def held(self) -> int:
        """Long polls waiting now."""
        return self._held

    def report(self, region: str, seq: int, received_at: float | None = None) -> tuple[int, int]:
        """Record ``region``'s head; coalesced: a seq not above the known one changes nothing.

        Returns (head seq, relay version). Writes the move's line to the
        watches in step that follow ``region`` and wakes the other polls and
        watches that do (each answers once, however many reports arrive
        before it runs). ``received_at``: the report's arrival
        (``time.perf_counter()``) for :attr:`line_latency`.
        """
        self.reports += 1
        current = self._heads.get(region)
        if current is not None and seq <= current[0]:
            return current[0], self.version
        self.version += 1
        self.moves += 1
        self._heads[region] = (seq, self.version)
        at = time.perf_counter() if received_at is None else received_at
        followers = self._followers.get(region)
        if followers or self._everything:
            line = encode_heads(self.version, {region: seq})
            if followers:
                self._fan_out(followers, line, at)
            if self._everything:
                self._fan_out(self._everything, line, at)
        return seq, self.version

    def _fan_out(self, waiters: set[_Waiter], line: bytes, at: float) -> None:
        """``line`` (the latest move) to ``waiters``: written to watches in step, else woken."""
        version = self.version
        now = clock = 0.0
        for w in waiters:
            if w.direct:  # only a HeadWatch with send_nowait is ever direct
                watch = cast("HeadWatch", w)
                send_nowait = watch.send_nowait
                assert send_nowait is not None
                watch.since = version
                if not now:
                    now, clock = time.perf_counter(), trio.current_time()
                watch.last_line_at = clock
                if send_nowait(line):
                    self.direct_lines += 1
                    self.line_latency.observe(now - at)
                    continue
                # Part of the line waits in the socket's stead: its task sends it.
                w.direct = False
            if w.pending_at is None:
                w.pending_at = at
            if not w.event.is_set():
                w.event.set()
                self.wakeups += 1

    def head(self, region: str) -> int | None:
        current = self._heads.get(region)
        return None if current is None else current[0]

    def apply(self, heads: list[tuple[str, int, int]]) -> None:
        """Take heads versioned by the shared store: (region, seq, version) each.

        ``heads`` holds every head of a version above :attr:`version` (the
        store's watermark) that the store had: then this relay's version is
        one too. A seq not above the known one changes nothing; a move is
        written to the watches in step that follow its region, and wakes the
        other polls and watches that do, as :meth:`report` does. Taken in
        version order, so a watch written a move's line at version V has had
        every move of its regions up to V (a replica's batch and poll return
        heads in any order).
        """
        now = 0.0
        for region, seq, version in sorted(heads, key=lambda h: h[2]):
            current = self._heads.get(region)
            self.version = max(self.version, version)
            if current is not None and seq <= current[0]:
                continue
            self._heads[region] = (seq, version)
            self.moves += 1
            followers = self._followers.get(region)
            if followers or self._everything:
                # The line's latency counts from here: the batch committed, or the
                # poll found another replica's head.
                now = now or time.perf_counter()
                line = encode_heads(self.version, {region: seq})
                if followers:
                    self._fan_out(followers, line, now)
                if self._everything:
                    self._fan_out(self._everything, line, now)

    def _wake(self, waiters: set[_Waiter] | tuple[()]) -> None:
        for w in waiters:
            w.direct = False  # its task writes what moved (heads from another replica)
            if w.pending_at is None:
                w.pending_at = time.perf_counter()
            if not w.event.is_set():
                w.event.set()
                self.wakeups += 1

    def line_written(self, watch: HeadWatch) -> None:
        """``watch``'s task wrote a line: what was pending for it is out."""
        watch.last_line_at = trio.current_time()
        if watch.pending_at is not None:
            self.line_latency.observe(time.perf_counter() - watch.pending_at)
            watch.pending_at = None

    def add_watch(self, watch: HeadWatch) -> None:
        """Register ``watch`` (counted as held) until :meth:`remove_watch`."""
        self._park(watch)
        self._watches.add(watch)

    def remove_watch(self, watch: HeadWatch) -> None:
        watch.direct = False
        self._watches.discard(watch)
        self._unpark(watch)

    def sweep_keepalives(self, now: float) -> None:
        """Keep-alive lines for the watches without a line for their ``keepalive_s``.

        One sweep a second for all watches (the server's background task)
        instead of a timer per watch: a held watch's task parks on its event
        alone, and at 10,000 watches the timers' expiries (a cancel scope and
        a ``Cancelled`` raised per keep-alive, one a watch every 25-30 s) were
        hundreds a second. A watch in step gets the line written here
        (``{"version": V, "heads": {}}``: nothing of its regions moved since
        its last line, so ``V`` is the relay's version); the others (a task
        busy, no ``send_nowait``, a socket that did not take the line whole)
        are woken, and their task writes it.
        """
        line = b""
        for w in self._watches:
            if now - w.last_line_at < w.keepalive_s:
                continue
            if w.direct and not self._closed:
                assert w.send_nowait is not None
                if not line:
                    line = encode_heads(self.version, {})
                w.since = self.version
                w.last_line_at = now
                if w.send_nowait(line):
                    self.direct_keepalives += 1
                    continue
                w.direct = False  # the rest waits in the socket's stead: its task sends it
            if not w.event.is_set():
                w.event.set()

    def heads_since(self, since: int, regions: frozenset[str] | None) -> HeadsUpdate:
        if since > self.version:  # a version from the future: another server run
            since = 0
        if regions is None or len(regions) * 4 > len(self._heads):
            heads = {
                r: seq
                for r, (seq, v) in self._heads.items()
                if v > since and (regions is None or r in regions)
            }
        else:  # a few regions of many: look them up
            heads = {}
            for r in regions:
                known = self._heads.get(r)
                if known is not None and known[1] > since:
                    heads[r] = known[0]
        return HeadsUpdate(self.version, heads)

    async def wait_heads(
        self, since: int, regions: frozenset[str] | None, timeout_s: float
    ) -> HeadsUpdate:
        """Heads of ``regions`` that moved after ``since``; waits up to ``timeout_s`` for one."""
        update = self.heads_since(since, regions)
        if update.heads or self._closed or timeout_s <= 0:
            return update
        # No checkpoint between the check above and parking the waiter: a
        # report runs only at a checkpoint, so it finds this waiter parked.
        waiter = _Waiter(regions)
        self._park(waiter)
        try:
            with trio.move_on_after(timeout_s):
                await waiter.event.wait()
        finally:
            self._unpark(waiter)
        return self.heads_since(since, regions)

    def _park(self, w: _Waiter) -> None:
        self._held += 1
        if w.regions is None:
            self._everything.add(w)
            return
        for r in w.regions:
            self._followers.setdefault(r, set()).add(w)

    def _unpark(self, w: _Waiter) -> None:
        self._held -= 1
        if w.regions is None:
            self._everything.discard(w)
            return
        for r in w.regions:
            followers = self._followers.get(r)
            if followers is not None:
                followers.discard(w)
                if not followers:
                    del self._followers[r]

    def close(self) -> None:
        """End every wait now (the server is stopping)."""
        self._closed = True
        self._wake(self._everything)
        for followers in list(self._followers.values()):
            self._wake(followers)


# ------------------------------------------------------------- admission


@dataclass(frozen=True, slots=True)
class AdmissionStatistics:
    inflight: int
    long_polls: int
    verifying: int
    #: Requests answered 503 ``overloaded`` since the start.
    shed: int


class Overloaded(Exception):
    """The server is past a limit: answer 503 with ``Retry-After: retry_after_s``."""

    def __init__(self, what: str, retry_after_s: int) -> None:
        super().__init__(what)
        self.what = what
        self.retry_after_s = retry_after_s


class Admission:
    """Bounds on work in progress; past one, requests are refused at once (503).

    Refusing early is what keeps a herd from sinking the server: a request
    queued behind thousands of others is answered after its client gave up
    (and retried, doubling the load); one refused with ``Retry-After`` costs
    microseconds, and the client comes back later, with jitter.
    """

    def __init__(
        self,
        *,
        max_inflight: int,
        max_long_polls: int,
        max_verifying: int,
        verify_cost_s: float = 0.04,
        verify_parallel: int = 2,
    ) -> None:
        self.max_inflight = max_inflight
        self.max_long_polls = max_long_polls
        self.max_verifying = max_verifying
        self._verify_cost_s = verify_cost_s
        self._verify_parallel = verify_parallel
        self.inflight = 0
        self.long_polls = 0
        self.verifying = 0
        self.shed = 0

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(self.inflight, self.long_polls, self.verifying, self.shed)

    def _refuse(self, what: str, backlog_s: float) -> Overloaded:
        self.shed += 1
        after = min(_RETRY_AFTER_MAX_S, max(_RETRY_AFTER_MIN_S, math.ceil(backlog_s)))
        return Overloaded(what, after)

    def enter(self) -> None:
        """A request starts; raises :class:`Overloaded` past ``max_inflight``."""
        if self.inflight >= self.max_inflight:
            # Over the limit by x: come back in a second per limit's worth queued.
            raise self._refuse(
                f"{self.inflight} requests in progress (limit {self.max_inflight})",
                self.inflight / self.max_inflight,
            )
        self.inflight += 1

    def leave(self) -> None:
        self.inflight -= 1

    def park(self) -> None:
        """A request starts holding a long poll (it no longer counts as in progress)."""
        if self.long_polls >= self.max_long_polls:
            raise self._refuse(
                f"{self.long_polls} long polls held (limit {self.max_long_polls})", 5.0
            )
        self.long_polls += 1
        self.inflight -= 1

    def unpark(self) -> None:
        self.long_polls -= 1
        self.inflight += 1

    def start_verify(self) -> None:
        """A token not seen before waits for its check; bounded."""
        if self.verifying >= self.max_verifying:
            drain_s = self.verifying * self._verify_cost_s / self._verify_parallel
            raise self._refuse(
                f"{self.verifying} new tokens being checked (limit {self.max_verifying})",
                drain_s,
            )
        self.verifying += 1

    def end_verify(self) -> None:
        self.verifying -= 1


# ---------------------------------------------------------- heartbeats


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One region's latest heartbeat, not yet in the store."""

    gateway_version: str
    lag: Mapping[str, float]
    now_ms: int


class HeartbeatWriter:
    """Heartbeats answered from memory and written to the store behind, coalesced per region.

    :meth:`note` records a heartbeat (O(1)); :meth:`run` writes what is
    pending every ``interval_s`` — the latest heartbeat of each region, one
    store call each, in one worker-thread hop — so while the store keeps up
    every heartbeat is written within about ``interval_s``, and when it does
    not, a region's rows are simply written less often (never queued without
    bound). :meth:`pending` lets reads of the regions show heartbeats not
    written yet.
    """

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self._pending: dict[str, Heartbeat] = {}
        self._wake = trio.Event()
        self.written = 0
        self.coalesced = 0

    def note(self, region: str, beat: Heartbeat) -> None:
        if region in self._pending:
            self.coalesced += 1
        self._pending[region] = beat
        self._wake.set()

    def pending(self, region: str) -> Heartbeat | None:
        return self._pending.get(region)

    def take(self) -> dict[str, Heartbeat]:
        """Everything pending (now no longer pending)."""
        batch, self._pending = self._pending, {}
        return batch

    async def run(self, write: Callable[[dict[str, Heartbeat]], Awaitable[None]]) -> None:
        """Write pending heartbeats with ``write`` until cancelled."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await trio.sleep(self.interval_s)  # gather more: one hop for many
            batch = self.take()
            if batch:
                await write(batch)
                self.written += len(batch)
