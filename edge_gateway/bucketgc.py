"""Bucket GC of this region's log, as a part the gateway composes (``[gc]``).

:class:`BucketGc` runs :func:`edge_gateway.mirror.log_gc.collect_garbage` every
``gc.interval_ms`` (the gateway supervises :meth:`BucketGc.run` as the task
``gc``), keeps its counters and reports them in :meth:`BucketGc.statistics`.
What it needs of the gateway (the bucket, the log's head, the subscribers from
the topology in force) it gets as callables, read at each run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from edge_gateway.bucket import Bucket, UnsupportedStore
from edge_gateway.clock import BucketClock
from edge_gateway.config import GcSettings
from edge_gateway.errors import EdgeGatewayError, Unavailable
from edge_gateway.failpoints import fail_point
from edge_gateway.mirror.log_gc import GcConfig, collect_garbage, register_subscribers

__all__ = ["BucketGc", "GcStats"]

log = logging.getLogger("edgegw.gateway")


@dataclass(frozen=True, slots=True)
class GcStats:
    """:meth:`BucketGc.statistics`: the GC loop's runs since the start."""

    runs: int
    #: Runs that ended in an error (the store away, refusing, ...).
    failed_runs: int
    deleted_entries: int
    last_error: str | None
    #: Why the last run deleted nothing at all (a wrong clock), or None.
    paused: str | None
    #: Why GC cannot advance on this store (it refuses compare-and-swap), or None.
    store_unsupported: str | None


class BucketGc:
    """Deletes this region's log objects that retention and every subscriber allow."""

    def __init__(
        self,
        config: GcSettings,
        region: str,
        *,
        bucket: Callable[[], Bucket],
        prefix: str,
        clock: BucketClock,
        subscribers: Callable[[], list[str] | None],
        head: Callable[[], int | None],
        wait_claimed: Callable[[], Awaitable[None]],
    ) -> None:
        self._config = config
        self._region = region
        #: The gateway's bucket while it runs.
        self._bucket = bucket
        self._prefix = prefix
        self._clock = clock
        #: The regions GC waits for, from the topology in force at each run.
        self._subscribers = subscribers
        #: The last seq this gateway committed to its log (None before its claim).
        self._head = head
        #: Returns once the shipper has claimed the region's log.
        self._wait_claimed = wait_claimed
        self._runs = 0
        #: Runs that ended in an error (the store away, refusing, ...).
        self._failed_runs = 0
        self._deleted = 0
        self._last_error: str | None = None
        #: Why the last run deleted nothing at all (a wrong clock), or None.
        self._paused: str | None = None
        #: Why GC cannot advance on this store (it refuses compare-and-swap), or None.
        self._unsupported: str | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Delete this region's log objects that retention and every subscriber allow."""
        task_status.started()
        g = self._config
        gcfg = GcConfig(retention_ms=g.retention_ms, age_cap_ms=g.age_cap_ms)
        await self._register_subscribers()
        while True:
            await trio.sleep(g.interval_ms / 1000)
            fail_point("gc.run")
            try:
                res = await collect_garbage(
                    self._bucket(),
                    self._region,
                    self._subscribers(),
                    gcfg,
                    prefix=self._prefix,
                    clock=self._clock,
                    head_seq=self._head(),
                )
            except UnsupportedStore as exc:
                # Not contention: the store refuses compare-and-swap (issue 27).
                # Said once; tried again each interval, quietly, in case the
                # store is fixed or replaced under the same name.
                self._failed_runs += 1
                self._last_error = f"{type(exc).__name__}: {exc}"
                if self._unsupported is None:
                    log.error("bucket gc: %s", exc)
                self._unsupported = str(exc)
                continue
            except (Unavailable, EdgeGatewayError) as exc:
                self._failed_runs += 1
                self._last_error = f"{type(exc).__name__}: {exc}"
                log.warning("bucket gc: %s (retrying next interval)", exc)
                continue
            if self._unsupported is not None:
                log.info("bucket gc: the store accepts compare-and-swap now; GC runs again")
                self._unsupported = None
            if res.paused != self._paused:
                if res.paused:
                    log.warning("bucket gc: deleting nothing: %s", res.paused)
                else:
                    log.info("bucket gc: the clock is sane again; deleting as configured")
                self._paused = res.paused
            self._runs += 1
            self._deleted += res.deleted_entries
            self._last_error = None
            if res.deleted_entries or res.overridden:
                log.info(
                    "bucket gc: deleted %d log objects and %d manifests (boundary %d -> %d)%s",
                    res.deleted_entries,
                    res.deleted_manifests,
                    res.boundary_before,
                    res.boundary_after,
                    f"; age cap overrode readers {', '.join(res.overridden)}"
                    if res.overridden
                    else "",
                )

    def statistics(self) -> GcStats:
        """The loop's runs, deletions and state (the status's ``gc`` block)."""
        return GcStats(
            self._runs,
            self._failed_runs,
            self._deleted,
            self._last_error,
            self._paused,
            self._unsupported,
        )

    @property
    def store_unsupported(self) -> str | None:
        """Why bucket GC cannot advance on this store (it refuses compare-and-swap), or None."""
        return self._unsupported

    async def _register_subscribers(self) -> None:
        """At start, record the subscribers GC will meet as subscribed from the log's head on.

        Entries written before a subscriber is recorded count as written
        before it subscribed (``edge_gateway.mirror.log_gc``): the sooner, the
        more exact. Waits for the claim (the head); a failure is logged and
        left to the first GC run, which records them too.
        """
        await self._wait_claimed()
        try:
            await register_subscribers(
                self._bucket(),
                self._region,
                self._subscribers(),
                prefix=self._prefix,
                head_seq=self._head(),
            )
        except (Unavailable, EdgeGatewayError) as exc:
            log.warning("bucket gc: subscribers not recorded yet (%s); next GC run does it", exc)
