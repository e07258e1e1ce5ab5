"""The gateway's side of the metadata server: routing, heartbeats and the head relay.

A :class:`~edge_gateway.gateway.Gateway` configured with ``[metadata] url``
owns one :class:`MetadataAgent`, and hands it the few things it needs of the
gateway as :class:`AgentHooks` (imports run one way: the gateway imports the
agent, never the reverse). It

* **starts from the disk cache** (:class:`RoutingCache`, ``<data_dir>/routing.json``)
  when there is one, so a gateway starts and serves while the server is
  away; without a cache it asks the server once (a few seconds at most) and
  otherwise starts with no topics and keeps asking;
* **fetches** ``GET /v1/routing`` with ``If-None-Match`` (a 304 costs
  little), saves every new table to the cache atomically, and hands it to
  ``AgentHooks.apply_routing`` (the gateway's
  :meth:`~edge_gateway.gateway.Gateway.apply_routing`), which applies it
  live. Every heartbeat answer names the server's routing version: one that
  differs from the table's fetches at once, and while heartbeats succeed
  and name the table's version the separate poll is not needed, so it runs
  only every :data:`ROUTING_SAFETY_REFRESH_S`; without such a heartbeat (at
  the start, the server away) it runs every ``poll_interval_ms`` (a
  heartbeat merely late, once, keeps the table confirmed:
  :func:`late_beat_keeps_table`);
* **heartbeats** every ``heartbeat_interval_ms`` with the gateway's version,
  its log head and lag figures (mirror lag per source, shipper backlog);
* **relays heads** (``head_relay``): the shipper calls :meth:`report_head`
  after each commit (fire-and-forget, coalesced by :class:`HeadReporter`);
  one held watch of ``GET /v1/heads?watch=1`` for the sources this region
  mirrors (each change a line on it, no request; an older server answers it
  as a long poll, asked again after each answer) wakes their tailers (:meth:`Tailer.relayed_head
  <edge_gateway.mirror.Tailer.relayed_head>`) and keeps them in relay mode,
  where an idle tailer makes no bucket requests. When the watch fails,
  every tailer is switched back to polling the bucket with its normal
  backoff until the relay answers again. The relay is never trusted for
  correctness: tailers read the log themselves and stop at the first 404.

Nothing here is fatal: an unreachable or refusing server is logged, shown
in the status (``metadata: cached since ...``) and retried. A pooled
connection that died while idle is not "unreachable": the client sends the
request again on a new connection at once (:class:`MetadataClient`), and
only a failure of that counts (``fetch_failures``, ``metadata_live``).
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from edge_gateway.backoff import Backoff
from edge_gateway.errors import ClosedError, CorruptData, InvalidInput, Unavailable
from edge_gateway.metadata.client import (
    HeadReporter,
    MetadataClient,
    MetadataOverloaded,
    MetadataTimedOut,
    RoutingCache,
    retry_after_of,
)

if TYPE_CHECKING:
    from edge_gateway.config import MetadataSettings
    from edge_gateway.metadata.routing import RoutingTable
    from edge_gateway.mirror import Tailer
    from edge_gateway.shipper import ShipperStats
    from edge_gateway.statefile import StateFiles

__all__ = ["AgentHooks", "MetadataAgent", "late_beat_keeps_table"]

log = logging.getLogger("edgegw.metadata.agent")

#: At start without a cache: how long to wait for the server before starting without topics.
START_FETCH_TIMEOUT_S = 5.0
#: The lag object of a heartbeat holds at most this many figures (the server's limit is 100).
_MAX_LAG_FIGURES = 96
#: Backoff of the head long poll while the server is away starts here.
_RELAY_RETRY_BASE_S = 0.2
#: Backoff of the routing poll and the heartbeat while the server is away:
#: from this, doubling, to at most :data:`RETRY_CAP_S`, full jitter (and never
#: sooner than an overloaded server's Retry-After). After an outage, a fleet's
#: first requests are spread over up to the cap instead of arriving together.
_RETRY_BASE_S = 0.5
RETRY_CAP_S = 20.0
#: While heartbeats confirm the table's version, the routing poll runs this
#: seldom (a safety net: the heartbeat's version is what says "changed").
#: Each gateway then asks ~0.1 req/s (its heartbeats) for routing and
#: liveness instead of ~0.3 (docs/metadata.md, "What each gateway sends").
ROUTING_SAFETY_REFRESH_S = 300.0

_ServerTrouble = (Unavailable, InvalidInput, CorruptData)


def late_beat_keeps_table(exc: Exception, failures_in_a_row: int) -> bool:
    """Whether a failed heartbeat leaves the table confirmed (no routing poll yet).

    A heartbeat that was merely late — timed out, or shed by a busy server
    (``503`` with ``Retry-After``) — right after one that succeeded says
    nothing about the table: its retry confirms it (or names a new version)
    a moment later. At 10,000 gateways on a saturated server every late
    heartbeat fetched the table instead, 119-188 routing requests a second
    where 33 is the steady state (docs/metadata.md). A second failure in a
    row, or any other failure (a refused connection: the server is away; a
    4xx; a malformed answer), hands over to the routing poll at once.
    """
    return failures_in_a_row == 1 and isinstance(exc, (MetadataTimedOut, MetadataOverloaded))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ms / 1000))


@dataclass(frozen=True, slots=True)
class AgentHooks:
    """What the agent needs of its gateway: the gateway passes its own methods."""

    #: This gateway's region (named in every request).
    region: str
    #: ``<data_dir>``: the routing cache lives there by default.
    data_dir: Path
    #: Apply a new routing table (``Gateway.apply_routing``).
    apply_routing: Callable[[RoutingTable], Awaitable[None]]
    #: The shipper's figures; raises :class:`ClosedError` while it does not run.
    shipper_statistics: Callable[[], ShipperStats]
    #: Source region -> its running tailer (``Gateway.tailers``).
    tailers: Callable[[], Mapping[str, Tailer]]
    #: Where a damaged routing cache is reported (None: a WARNING only).
    state_files: StateFiles | None = None


class MetadataAgent:
    """The metadata client of one running gateway (see the module docstring)."""

    def __init__(self, hooks: AgentHooks, settings: MetadataSettings) -> None:
        from edge_gateway import __version__

        self.hooks = hooks
        self.settings = settings
        self.version = __version__
        self.cache = RoutingCache(settings.cache_file(hooks.data_dir))
        verify: ssl.SSLContext | bool = True
        if settings.ca_file:
            verify = ssl.create_default_context(cafile=settings.ca_file)
        self.client = MetadataClient(
            settings.url,
            token=settings.token or None,
            token_file=Path(settings.token_file) if settings.token_file else None,
            region=hooks.region,
            timeout_s=settings.timeout_s,
            verify=verify,
        )
        self.reporter = (
            HeadReporter(self.client, retry_cap_s=settings.poll_interval_ms / 1000)
            if settings.head_relay
            else None
        )
        self._rand = random.Random()
        self._table: RoutingTable | None = None
        self._live = False
        #: When the server last confirmed the table we run from (ms), or None.
        self._confirmed_ms: int | None = None
        #: The same moment on the monotonic clock: the table's age does not
        #: jump when the wall clock is set.
        self._confirmed_mono: float | None = None
        self._last_error: str | None = None
        self._poll_now = trio.Event()
        #: The last fetch's failure (None: it succeeded), for the poll's backoff.
        self._fetch_error: Exception | None = None
        self._fetches = self._fetch_failures = self._tables_applied = 0
        self._heartbeats = self._heartbeat_failures = 0
        #: The routing version the last heartbeat answer named (None: the last
        #: heartbeat failed, or none was answered yet).
        self._beat_version: int | None = None
        # head relay
        self._relay_active = False
        self._relay_error: str | None = None
        #: Latest head the relay announced per source region.
        self._heads: dict[str, int] = {}
        self._heads_scope: trio.CancelScope | None = None
        #: The sources the current long poll asks about.
        self._following: list[str] = []
        self._heads_polls = self._heads_failures = 0

    async def aclose(self) -> None:
        await self.client.aclose()

    # ------------------------------------------------------------ routing

    @property
    def table(self) -> RoutingTable | None:
        """The routing table in force (``None`` before the first one)."""
        return self._table

    @property
    def live(self) -> bool:
        """True while the last request for the routing table succeeded."""
        return self._live

    async def load(self) -> RoutingTable | None:
        """The table to start from: the disk cache, else one short try at the server."""
        try:
            cached = await trio.to_thread.run_sync(self.cache.load)
        except CorruptData as exc:
            # Rebuilt from the server: the next table fetched is saved again.
            # Until then (the server away) the gateway starts without topics,
            # as with no cache, rather than trust a table it cannot check.
            action = f"rebuilt from the metadata server {self.settings.url}"
            if self.hooks.state_files is not None:
                self.hooks.state_files.damaged(self.cache.path, exc.reason, action)
            else:
                log.warning("ignoring the routing cache (%s): %s", exc, action)
            cached = None
        if cached is not None:
            self.client.prime(cached.table, cached.etag)
            self._table = cached.table
            self._confirmed_ms = cached.cached_ms
            # Written by an earlier run: only the wall clock can date it.
            age_s = max(0.0, (_now_ms() - cached.cached_ms) / 1000)
            self._confirmed_mono = time.monotonic() - age_s
            log.info(
                "routing: starting from the cached table (version %d, fetched %s); "
                "asking %s for changes",
                cached.table.version,
                _when(cached.cached_ms),
                self.settings.url,
            )
            return self._table
        with trio.move_on_after(min(START_FETCH_TIMEOUT_S, self.settings.timeout_s)):
            await self._fetch()
        if self._table is None:
            log.warning(
                "routing: no cached table and the metadata server %s did not answer: "
                "starting without topics (retrying every %.1fs)",
                self.settings.url,
                self.settings.poll_interval_ms / 1000,
            )
        return self._table

    async def _fetch(self) -> bool:
        """Ask for the routing table; True when a new one is in force (saved to the cache)."""
        try:
            fetch = await self.client.fetch_routing()
        except _ServerTrouble as exc:
            self._fetch_failures += 1
            self._fetch_error = exc
            if self._live or self._last_error is None:
                where = (
                    f"the cached table (version {self._table.version})"
                    if self._table is not None
                    else "no routing table"
                )
                log.warning("metadata server: %s; running from %s", exc, where)
            self._live = False
            self._last_error = str(exc)
            return False
        self._fetches += 1
        self._fetch_error = None
        if not self._live:
            log.info(
                "metadata server %s: live (routing version %d)",
                self.client.url,
                fetch.table.version,
            )
        self._live = True
        self._last_error = None
        self._confirmed_ms = _now_ms()
        self._confirmed_mono = time.monotonic()
        if not fetch.changed or fetch.table == self._table:
            return False
        try:
            await trio.to_thread.run_sync(self.cache.save, fetch.table, fetch.etag)
        except OSError as exc:  # the table still applies; the next start may use an older one
            log.error("routing: cannot save the cache %s: %s", self.cache.path, exc)
        self._table = fetch.table
        return True

    def poll_now(self) -> None:
        """Ask for the routing table at once (not waiting for the poll interval)."""
        self._poll_now.set()

    @property
    def heartbeat_confirms(self) -> bool:
        """True while the last heartbeat succeeded and named the table's routing version."""
        return self._table is not None and self._beat_version == self._table.version

    async def _poll_routing(self) -> None:
        interval = self.settings.poll_interval_ms / 1000
        backoff = Backoff(_RETRY_BASE_S, max(interval, RETRY_CAP_S))
        while True:
            if await self._fetch():
                assert self._table is not None
                await self.hooks.apply_routing(self._table)
                self._tables_applied += 1
            if self._fetch_error is not None:
                delay = backoff.delay_after(retry_after_of(self._fetch_error), self._rand.random())
                await self._wait_poll_now(delay)
                continue
            backoff.reset()
            while True:
                if self.heartbeat_confirms:
                    # Heartbeats say when the table changes (an answer naming
                    # another version calls poll_now); poll only as a safety net.
                    await self._wait_poll_now(max(interval, ROUTING_SAFETY_REFRESH_S))
                    break
                if await self._wait_poll_now(interval) or not self.heartbeat_confirms:
                    break
                # A heartbeat started confirming the table meanwhile: no request now.

    async def _wait_poll_now(self, timeout_s: float) -> bool:
        """Wait ``timeout_s`` or until :meth:`poll_now`; True if poll_now came first."""
        with trio.move_on_after(timeout_s):
            await self._poll_now.wait()
        called = self._poll_now.is_set()
        self._poll_now = trio.Event()
        return called

    # ---------------------------------------------------------- heartbeat

    def lag_figures(self) -> dict[str, float]:
        """What a heartbeat reports: shipper backlog, and per source mirror lag."""
        out: dict[str, float] = {}
        try:
            s = self.hooks.shipper_statistics()
        except ClosedError:
            return out
        out["shipper_pending_entries"] = float(sum(lane.backlog_entries for lane in s.lanes))
        out["shipper_retries"] = float(s.retries)
        for src, tailer in sorted(self.hooks.tailers().items()):
            if len(out) + 2 > _MAX_LAG_FIGURES:
                break
            t = tailer.statistics()
            out[f"mirror.{src}.seconds_behind"] = round(t.seconds_behind, 3)
            out[f"mirror.{src}.entries_behind"] = float(t.entries_behind)
        return out

    def _head_seq(self) -> int | None:
        if self.reporter is None:
            return None
        try:
            s = self.hooks.shipper_statistics()
        except ClosedError:
            return None
        return s.next_seq - 1 if s.claimed else None

    async def _heartbeat(self) -> None:
        interval = self.settings.heartbeat_interval_ms / 1000
        backoff = Backoff(_RETRY_BASE_S, max(interval, RETRY_CAP_S))
        failures_in_a_row = 0
        while True:
            head_seq = self._head_seq()
            try:
                version = await self.client.heartbeat(
                    gateway_version=self.version, lag=self.lag_figures(), head_seq=head_seq
                )
            except _ServerTrouble as exc:
                self._heartbeat_failures += 1
                failures_in_a_row += 1
                log.debug("heartbeat failed: %s", exc)
                if self._beat_version is not None and not late_beat_keeps_table(
                    exc, failures_in_a_row
                ):
                    # Heartbeats no longer vouch for the table: the routing
                    # poll takes over at once (and finds the server away).
                    self._beat_version = None
                    self.poll_now()
                await trio.sleep(backoff.delay_after(retry_after_of(exc), self._rand.random()))
                continue
            backoff.reset()
            failures_in_a_row = 0
            self._heartbeats += 1
            if head_seq is not None and self.reporter is not None:
                self.reporter.sent_elsewhere(head_seq)  # a report of it waiting is not sent
            self._beat_version = version
            if self._table is None or version != self._table.version:
                # Changed (or, a server restored from a backup, went back): fetch it.
                self.poll_now()
            elif self._live:
                # The server confirmed the table we run from, as a 304 would.
                self._confirmed_ms = _now_ms()
                self._confirmed_mono = time.monotonic()
            await trio.sleep(interval)

    # --------------------------------------------------------- head relay

    def report_head(self, seq: int) -> None:
        """The shipper committed ``seq`` (never blocks, never raises)."""
        if self.reporter is not None:
            self.reporter.report_nowait(seq)

    def tailers_changed(self) -> None:
        """The gateway started or stopped tailers: follow the new set of sources."""
        for src, tailer in self.hooks.tailers().items():
            if self._relay_active and src in self._heads:
                tailer.set_relay(True)
                tailer.relayed_head(self._heads[src])
        if self._heads_scope is not None and self._following != sorted(self.hooks.tailers()):
            self._heads_scope.cancel()

    def _relay_up(self) -> None:
        if not self._relay_active:
            log.info("head relay: following relayed heads (idle mirrors stop polling the bucket)")
        self._relay_active = True
        self._relay_error = None

    def _relay_down(self, error: str) -> None:
        if self._relay_active or self._relay_error is None:
            log.warning("head relay unavailable (%s): mirrors poll the bucket", error)
        if self._relay_active and self.heartbeat_confirms:
            # The server may be away: the routing poll checks now rather than
            # after the next heartbeat (the status then says "cached" at once).
            self.poll_now()
        self._relay_active = False
        self._relay_error = error
        for tailer in self.hooks.tailers().values():
            tailer.set_relay(False)

    async def _follow_heads(self) -> None:
        since = 0
        wait_ms = self.settings.relay_wait_ms
        backoff = Backoff(_RELAY_RETRY_BASE_S, self.settings.poll_interval_ms / 1000)
        while True:
            sources = sorted(self.hooks.tailers())
            self._following = sources
            with trio.CancelScope() as scope:
                self._heads_scope = scope
                if not sources:
                    await trio.sleep_forever()  # until tailers_changed() cancels
                try:
                    # One held watch; an older server answers it as one long
                    # poll, and the loop asks again with the answer's version.
                    updates = self.client.watch_heads(since, sources, wait_ms=wait_ms)
                    async with aclosing(updates):
                        async for update in updates:
                            backoff.reset()
                            self._heads_polls += 1
                            since = update.version  # a broken watch resumes from here
                            self._relay_up()
                            self._follow(update.heads)
                except _ServerTrouble as exc:
                    self._heads_failures += 1
                    self._relay_down(str(exc))
                    await trio.sleep(backoff.delay_after(retry_after_of(exc), self._rand.random()))
                    continue
            self._heads_scope = None
            if scope.cancelled_caught:
                since = 0  # new sources: ask for every known head
                continue

    def _follow(self, heads: Mapping[str, int]) -> None:
        """Relayed heads: wake the tailers of the sources that moved."""
        self._heads.update(heads)
        tailers = self.hooks.tailers()
        for src, seq in heads.items():
            tailer = tailers.get(src)
            if tailer is not None:
                tailer.set_relay(True)
                tailer.relayed_head(seq)

    # ----------------------------------------------------------- running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Poll, heartbeat, report and follow heads until cancelled."""
        async with trio.open_nursery() as nursery:
            if self.reporter is not None:
                await nursery.start(self.reporter.run)
                nursery.start_soon(self._follow_heads)
            nursery.start_soon(self._poll_routing)
            nursery.start_soon(self._heartbeat)
            task_status.started()

    # ------------------------------------------------------------ status

    def describe(self) -> str:
        """``metadata: live (version 7)``, ``metadata: cached since ...`` or unavailable."""
        table = self._table
        if table is None:
            return "metadata: unavailable (no routing table yet)"
        if self._live:
            return f"metadata: live (version {table.version})"
        since = _when(self._confirmed_ms) if self._confirmed_ms else "an unknown time"
        return f"metadata: cached since {since} (version {table.version})"

    def status(self) -> dict[str, Any]:
        table = self._table
        mode = "live" if self._live and table is not None else "cached" if table else "unavailable"
        relay: dict[str, Any] = {"enabled": self.reporter is not None}
        if self.reporter is not None:
            r = self.reporter.statistics()
            relay.update(
                active=self._relay_active,
                heads=dict(sorted(self._heads.items())),
                head_polls=self._heads_polls,
                head_poll_failures=self._heads_failures,
                last_error=self._relay_error,
                reported_seq=r.sent,
                reports=r.reports,
                report_failures=r.failures,
            )
        return {
            "mode": mode,
            #: The server in use (of ``urls``, failing over when one is away).
            "url": self.client.url,
            "urls": list(self.client.urls),
            "failovers": self.client.failovers,
            "version": table.version if table is not None else None,
            "confirmed_ms": self._confirmed_ms,
            "confirmed_age_s": (
                None
                if self._confirmed_mono is None
                else round(time.monotonic() - self._confirmed_mono, 3)
            ),
            "describe": self.describe(),
            "last_error": self._last_error,
            "fetches": self._fetches,
            "fetch_failures": self._fetch_failures,
            "tables_applied": self._tables_applied,
            "heartbeats": self._heartbeats,
            "heartbeat_failures": self._heartbeat_failures,
            # Heartbeats confirm the routing version: the poll runs only as a safety net.
            "routing_by_heartbeat": self.heartbeat_confirms,
            # Requests sent again because their pooled connection had died
            # (not failures: see edge_gateway.metadata.client).
            "stale_retries": self.client.stale_retries,
            "relay": relay,
        }
