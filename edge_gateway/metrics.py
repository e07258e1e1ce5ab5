"""Prometheus metrics of one gateway (served at ``GET /metrics``).

Each :class:`Gateway` gets its own :class:`prometheus_client.CollectorRegistry`
(never the process-global one: tests and embedding programs run several
gateways in one process). The journal and shipper figures are not counted
twice: a custom collector reads their ``statistics()`` at scrape time, so the
hot paths pay nothing for metrics. The API adds one histogram of request
latency by route template, method and status code.

Families (``_total`` is added to counters by the exposition format):

* ``edgegw_info{region,version}``, ``edgegw_accepting``, ``edgegw_uptime_seconds``
* ``edgegw_clock_skew_seconds`` (this gateway's clock minus the bucket's; absent
  before the first write), ``edgegw_clock_state{state}``, ``edgegw_gc_paused``
* ``edgegw_journal_*``: bytes, max_bytes, segments, next_lsn, durable_lsn,
  appends_total, appended_bytes_total, fsyncs_total, fsync_seconds_total,
  fsync_seconds_max, full_rejections_total; the filesystem under it:
  disk_free_bytes, disk_size_bytes, disk_full (0/1), disk_full_rejections_total,
  disk_full_episodes_total, segments_deleted_for_space_total, failed (0/1: intake
  stopped after a failed fsync or EIO); the read index: index_bytes (RAM),
  index_cache_bytes, index_cache_hits_total, index_cache_misses_total
* ``edgegw_shipper_*``: claimed, epoch, next_seq, shipped_lsn, pending_lsns,
  oldest_unshipped_age_seconds, objects_total, fences_total, manifests_total,
  records_total, bytes_total (journal bytes shipped), wire_bytes_total
  (compressed object bytes), retries_total, upload_seconds_total,
  last_ship_timestamp_seconds, state{state} (1 for the one the shipper is in:
  starting, shipping, retrying, denied)
* ``edgegw_link_bytes_total{direction}`` (up, down), ``edgegw_link_bytes_today``,
  ``edgegw_link_bytes_this_month`` (local day and month, kept across restarts),
  ``edgegw_link_cap_bytes_per_second``, ``edgegw_link_wait_seconds_total``
* ``edgegw_bucket_denied{component,code}``: 1 for each component the bucket
  refuses (``shipper``, ``mirror <source>``) with the store's error code
  (``InvalidAccessKeyId``, ``NoSuchBucket``...); absent while none is. A
  person must act: alert on it.
* ``edgegw_mirror_*{source}``: entries_behind, bytes_behind, lag_seconds,
  quarantined_entries, gaps, catch_up_eta_seconds, state{state} — from the
  gateway's tailers, or from the provider given to
  :meth:`GatewayMetrics.set_mirror_lag_provider`
* ``edgegw_task_failures_total{task}``, ``edgegw_task_restarts_total{task}``,
  ``edgegw_task_degraded{task}`` — the supervised tasks (``edge_gateway.supervisor``)
* ``edgegw_api_request_seconds{route,method,code}`` (histogram)
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edge_gateway.errors import ClosedError, EdgeGatewayError
from edge_gateway.shipper import SHIPPER_STATES

if TYPE_CHECKING:
    from edge_gateway.gateway import Gateway
    from edge_gateway.journal import JournalStats

__all__ = ["CONTENT_TYPE", "GatewayMetrics", "MirrorLag", "metrics_for"]

log = logging.getLogger("edgegw.metrics")

#: The Content-Type of :meth:`GatewayMetrics.render` output.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Request latency buckets (seconds): sub-millisecond produce acks up to long polls.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


@dataclass(frozen=True, slots=True)
class MirrorLag:
    """How far this gateway's mirror of one source region is behind (one tailer)."""

    source: str
    #: Log entries of the source not applied yet.
    entries_behind: int
    #: Their estimated size.
    bytes_behind: int
    #: Age of the oldest source data not mirrored yet (None: unknown, e.g. idle).
    seconds_behind: float | None
    #: Entries set aside as unreadable (they need an operator).
    quarantined: int
    #: Ranges skipped because the source no longer had them (gap_policy = "skip").
    gaps: int
    #: Seconds to catch up at the recent apply rate (None: unknown or idle).
    catch_up_eta_seconds: float | None = None
    #: The tailer's state (following, idle, catching-up, retrying, denied, quarantined,
    #: stopped).
    state: str = ""

    @classmethod
    def from_tailer_stats(cls, stats: Any) -> MirrorLag:
        """From a ``edge_gateway.mirror.TailerStats``."""
        return cls(
            source=stats.source,
            entries_behind=stats.entries_behind,
            bytes_behind=stats.bytes_behind,
            seconds_behind=stats.seconds_behind,
            quarantined=len(stats.quarantined),
            gaps=len(stats.gaps),
            catch_up_eta_seconds=stats.eta_s,
            state=stats.state,
        )


MirrorLagProvider = Callable[[], Iterable[MirrorLag]]


class GatewayMetrics:
    """The registry of one gateway; get it with :func:`metrics_for`."""

    def __init__(self, gateway: Gateway) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._mirror_lag: MirrorLagProvider | None = None
        self.registry.register(_GatewayCollector(gateway, self))
        self.api_request_seconds = Histogram(
            "edgegw_api_request_seconds",
            "Local API request latency (from the request reaching the app to the last byte "
            "of the response), by route template, method and status code. Long-poll fetches "
            "include their wait.",
            ["route", "method", "code"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        # labels() takes a lock and builds a key per call; requests reuse children.
        self._children: dict[tuple[str, str, int], Callable[[float], None]] = {}

    def observe_request(self, route: str, method: str, code: int, seconds: float) -> None:
        """Record one API request (called by the API for every response)."""
        key = (route, method, code)
        observe = self._children.get(key)
        if observe is None:
            observe = self.api_request_seconds.labels(route, method, str(code)).observe
            self._children[key] = observe
        observe(seconds)

    def set_mirror_lag_provider(self, provider: MirrorLagProvider | None) -> None:
        """Hook for mirror lag: ``provider()`` returns one :class:`MirrorLag` per source.

        By default (``None``) the lag comes from the gateway's tailers
        (``Gateway.tailers``). It is called at every scrape: keep it cheap
        (read counters, no I/O).
        """
        self._mirror_lag = provider

    def mirror_lag(self, gateway: Gateway) -> list[MirrorLag]:
        if self._mirror_lag is not None:
            return list(self._mirror_lag())
        return [MirrorLag.from_tailer_stats(t.statistics()) for t in gateway.tailers.values()]

    def render(self) -> bytes:
        """The Prometheus text exposition of everything above."""
        return generate_latest(self.registry)


_BY_GATEWAY: weakref.WeakKeyDictionary[Gateway, GatewayMetrics] = weakref.WeakKeyDictionary()


def metrics_for(gateway: Gateway) -> GatewayMetrics:
    """The :class:`GatewayMetrics` of ``gateway`` (created on first use, one per gateway)."""
    m = _BY_GATEWAY.get(gateway)
    if m is None:
        m = GatewayMetrics(gateway)
        _BY_GATEWAY[gateway] = m
    return m


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class _GatewayCollector(Collector):
    """Reads the gateway's components at scrape time."""

    def __init__(self, gateway: Gateway, owner: GatewayMetrics) -> None:
        # Weak: the registry must not keep a stopped gateway alive.
        self._gateway = weakref.ref(gateway)
        self._owner = weakref.ref(owner)

    def collect(self) -> Iterator[Metric]:
        gw = self._gateway()
        if gw is None:
            return
        from edge_gateway import __version__

        info = GaugeMetricFamily(
            "edgegw_info", "The gateway's region and version.", labels=["region", "version"]
        )
        info.add_metric([gw.region, __version__], 1)
        yield info
        yield _gauge(
            "edgegw_accepting",
            "1 while the gateway accepts produce requests (0 starting or shutting down).",
            1 if gw.accepting else 0,
        )
        if gw.started_ms:
            yield _gauge(
                "edgegw_uptime_seconds",
                "Seconds since the gateway became ready (monotonic clock).",
                gw.uptime_s,
            )
        yield from self._clock(gw)
        yield from self._link(gw)
        try:
            stats = gw.journal.statistics()
            gw.shipper  # noqa: B018 - raises ClosedError when not running
        except ClosedError:
            return  # not running: nothing else to report
        yield from self._journal(stats)
        yield from self._shipper(gw)
        yield from self._denied(gw)
        yield from self._metadata(gw)
        yield from self._tasks(gw)
        owner = self._owner()
        if owner is not None:
            try:
                lags = owner.mirror_lag(gw)
            except Exception:  # a broken provider must not break the scrape
                log.exception("mirror lag provider failed")
                lags = []
            yield from self._mirror(lags)

    @staticmethod
    def _tasks(gw: Gateway) -> Iterator[Metric]:
        failures = CounterMetricFamily(
            "edgegw_task_failures",
            "Unexpected failures of a supervised task (each is restarted with backoff).",
            labels=["task"],
        )
        restarts = CounterMetricFamily(
            "edgegw_task_restarts", "Restarts of a supervised task.", labels=["task"]
        )
        degraded = GaugeMetricFamily(
            "edgegw_task_degraded",
            "1 while a supervised task is failing or restarting (until it runs stable again).",
            labels=["task"],
        )
        for h in gw.task_health():
            failures.add_metric([h.name], h.failures)
            restarts.add_metric([h.name], h.restarts)
            degraded.add_metric([h.name], 1 if h.degraded else 0)
        yield failures
        yield restarts
        yield degraded

    @staticmethod
    def _journal(j: JournalStats) -> Iterator[Metric]:
        yield _gauge("edgegw_journal_bytes", "Bytes of journal segments on disk.", j.bytes)
        yield _gauge(
            "edgegw_journal_max_bytes",
            "The journal's disk budget (produce gets 503 journal_full beyond it).",
            j.max_bytes,
        )
        yield _gauge("edgegw_journal_segments", "Journal segment files.", j.segments)
        yield _gauge("edgegw_journal_next_lsn", "LSN the next journal entry gets.", j.next_lsn)
        yield _gauge(
            "edgegw_journal_durable_lsn", "Highest LSN known to be fsynced.", j.durable_lsn
        )
        yield _counter(
            "edgegw_journal_appends", "Entries appended since the journal opened.", j.appends
        )
        yield _counter(
            "edgegw_journal_appended_bytes",
            "Bytes appended since the journal opened.",
            j.appended_bytes,
        )
        yield _counter("edgegw_journal_fsyncs", "fsync calls on journal segments.", j.fsyncs)
        yield _counter(
            "edgegw_journal_fsync_seconds",
            "Seconds spent in journal fsyncs.",
            j.fsync_seconds_total,
        )
        yield _gauge(
            "edgegw_journal_fsync_seconds_max", "Longest single journal fsync.", j.fsync_seconds_max
        )
        yield _counter(
            "edgegw_journal_full_rejections",
            "Appends refused because the disk budget was full.",
            j.full_rejections,
        )
        if j.disk_size_bytes >= 0:
            yield _gauge(
                "edgegw_journal_disk_free_bytes",
                "Free bytes on the filesystem under the journal (for the gateway's user).",
                j.disk_free_bytes,
            )
            yield _gauge(
                "edgegw_journal_disk_size_bytes",
                "Size of the filesystem under the journal.",
                j.disk_size_bytes,
            )
        yield _gauge(
            "edgegw_journal_disk_full",
            "1 while the disk under the journal is full (produce gets 503 disk_full "
            "when no shipped segment is left to delete).",
            1 if j.disk_full else 0,
        )
        yield _counter(
            "edgegw_journal_disk_full_rejections",
            "Appends refused because the disk was full (503 disk_full).",
            j.disk_full_rejections,
        )
        yield _counter(
            "edgegw_journal_disk_full_episodes",
            "Times the disk under the journal was found full.",
            j.disk_full_episodes,
        )
        yield _counter(
            "edgegw_journal_segments_deleted_for_space",
            "Shipped segments deleted before their retention ended, to make room on the disk.",
            j.segments_deleted_for_space,
        )
        yield _gauge(
            "edgegw_journal_index_bytes",
            "RAM held by the journal's read index (the active segment's, sealed segments' "
            "summaries, the index cache); bounded by the configuration (docs/journal.md).",
            j.index_memory_bytes,
        )
        yield _gauge(
            "edgegw_journal_index_cache_bytes",
            "Pages of sealed segments' index files in the cache (journal.index_cache_bytes).",
            j.index_cache_bytes,
        )
        yield _counter(
            "edgegw_journal_index_cache_hits",
            "Index page lookups served from the cache.",
            j.index_cache_hits,
        )
        yield _counter(
            "edgegw_journal_index_cache_misses",
            "Index page lookups read from an index file.",
            j.index_cache_misses,
        )
        yield _gauge(
            "edgegw_journal_failed",
            "1 once intake stopped after a failed fsync or a write error (EIO): restart "
            "the gateway after checking the disk.",
            1 if j.failed else 0,
        )

    @staticmethod
    def _shipper(gw: Gateway) -> Iterator[Metric]:
        journal = gw.journal
        s = gw.shipper.statistics()
        next_lsn = journal.next_lsn
        pending = max(0, next_lsn - 1 - s.shipped_lsn)
        yield _gauge(
            "edgegw_shipper_claimed", "1 once this gateway owns its region's log.", s.claimed
        )
        yield _gauge("edgegw_shipper_epoch", "The writer epoch this gateway claimed.", s.epoch)
        yield _gauge(
            "edgegw_shipper_next_seq", "Sequence number of the next log object.", s.next_seq
        )
        yield _gauge(
            "edgegw_shipper_shipped_lsn",
            "Every journal entry up to this LSN is in the bucket.",
            s.shipped_lsn,
        )
        yield _gauge(
            "edgegw_shipper_pending_lsns",
            "Journal entries not yet committed to the bucket.",
            pending,
        )
        age = 0.0
        if pending:
            # One small read of the oldest unshipped entry's header and payload.
            try:
                age = gw.shipper.oldest_pending_age_s()
            except EdgeGatewayError:  # racing a segment deletion: report what we know
                age = 0.0
        yield _gauge(
            "edgegw_shipper_oldest_unshipped_age_seconds",
            "Age of the oldest journal entry not yet in the bucket (0 when none; its append "
            "time, bounded by the monotonic time since everything was shipped).",
            age,
        )
        yield _counter("edgegw_shipper_objects", "Log objects committed.", s.objects)
        yield _counter("edgegw_shipper_fences", "Fence entries written (epoch claims).", s.fences)
        yield _counter("edgegw_shipper_manifests", "Manifests written.", s.manifests)
        yield _counter("edgegw_shipper_records", "Records shipped.", s.records)
        yield _counter(
            "edgegw_shipper_bytes", "Journal bytes shipped (before compression).", s.journal_bytes
        )
        yield _counter(
            "edgegw_shipper_wire_bytes", "Bytes of log objects uploaded (compressed).", s.wire_bytes
        )
        yield _counter(
            "edgegw_shipper_retries", "Bucket operations retried after a failure.", s.retries
        )
        yield _counter(
            "edgegw_shipper_upload_seconds",
            "Seconds spent uploading log objects.",
            s.upload_seconds_total,
        )
        if s.last_ship_ms:
            yield _gauge(
                "edgegw_shipper_last_ship_timestamp_seconds",
                "Unix time of the last committed log object.",
                s.last_ship_ms / 1000,
            )

    @staticmethod
    def _clock(gw: Gateway) -> Iterator[Metric]:
        """This gateway's clock against the bucket's (``edge_gateway.clock``)."""
        c = gw.bucket_clock.statistics()
        if c.skew_s is not None:
            yield _gauge(
                "edgegw_clock_skew_seconds",
                "This gateway's wall clock minus the bucket's (positive: ahead), measured on "
                "the last object it wrote. Beyond clock.warn_skew_ms a WARNING is logged; "
                "beyond clock.gc_pause_skew_ms bucket GC deletes nothing.",
                c.skew_s,
            )
        state = GaugeMetricFamily(
            "edgegw_clock_state",
            "1 for the state of this gateway's clock against the bucket's "
            "(unknown, ok, skewed, gc-paused).",
            labels=["state"],
        )
        state.add_metric([str(c.state)], 1)
        yield state
        yield _gauge(
            "edgegw_gc_paused",
            "1 while bucket GC deletes nothing because this gateway's clock is off "
            "(clock.gc_pause_skew_ms).",
            1 if gw.bucket_clock.gc_pause_reason() else 0,
        )

    @staticmethod
    def _link(gw: Gateway) -> Iterator[Metric]:
        """The site's link to the bucket (``[link]``, ``edge_gateway.bucket.LinkMeter``)."""
        k = gw.link.statistics()
        moved = CounterMetricFamily(
            "edgegw_link_bytes",
            "Object bytes moved to (up) and from (down) the bucket since start.",
            labels=["direction"],
        )
        moved.add_metric(["up"], k.up_bytes)
        moved.add_metric(["down"], k.down_bytes)
        yield moved
        yield _gauge(
            "edgegw_link_bytes_today",
            "Object bytes moved to and from the bucket this local day (kept across restarts).",
            k.day_bytes,
        )
        yield _gauge(
            "edgegw_link_bytes_this_month",
            "Object bytes moved to and from the bucket this local month (kept across restarts).",
            k.month_bytes,
        )
        yield _gauge(
            "edgegw_link_cap_bytes_per_second",
            "link.max_bytes_per_s: the cap on bucket traffic (0: none).",
            k.cap_bytes_per_s,
        )
        yield _counter(
            "edgegw_link_wait_seconds",
            "Seconds transfers waited for their slot under the link cap.",
            k.waited_s,
        )

    @staticmethod
    def _denied(gw: Gateway) -> Iterator[Metric]:
        current = gw.shipper.state
        state = GaugeMetricFamily(
            "edgegw_shipper_state",
            "1 for the state the shipper is in (starting, shipping, retrying: the bucket is "
            "away, denied: the bucket refuses this gateway and a person must act).",
            labels=["state"],
        )
        for name in SHIPPER_STATES:
            state.add_metric([name], 1 if name == current else 0)
        yield state
        denied = GaugeMetricFamily(
            "edgegw_bucket_denied",
            "1 while the bucket refuses a component of this gateway (credentials, policy, "
            "no such bucket, wrong region), with the store's error code; see edgegw status.",
            labels=["component", "code"],
        )
        refusals = [("shipper", gw.shipper.denied)]
        refusals += [(f"mirror {src}", t.statistics().denied) for src, t in gw.tailers.items()]
        for component, refusal in sorted(refusals, key=lambda r: r[0]):
            if refusal is not None:
                denied.add_metric([component, refusal.code], 1)
        yield denied

    @staticmethod
    def _metadata(gw: Gateway) -> Iterator[Metric]:
        """The metadata server's client (nothing in static mode)."""
        if gw.metadata is None:
            return
        m = gw.metadata.status()
        yield _gauge(
            "edgegw_metadata_live",
            "1 while the last request for the routing table succeeded (0: running from the cache).",
            1 if m["mode"] == "live" else 0,
        )
        if m["version"] is not None:
            yield _gauge(
                "edgegw_metadata_routing_version",
                "Version of the routing table in force.",
                m["version"],
            )
        if m.get("confirmed_age_s") is not None:
            yield _gauge(
                "edgegw_metadata_routing_age_seconds",
                "Seconds since the metadata server last confirmed the routing table in force "
                "(monotonic clock; for a table cached by an earlier run, from the cache's time).",
                m["confirmed_age_s"],
            )
        yield _counter(
            "edgegw_metadata_fetch_failures",
            "Requests for the routing table that failed.",
            m["fetch_failures"],
        )
        yield _counter(
            "edgegw_metadata_heartbeat_failures",
            "Heartbeats that failed.",
            m["heartbeat_failures"],
        )
        relay = m["relay"]
        if relay.get("enabled"):
            yield _gauge(
                "edgegw_metadata_relay_active",
                "1 while idle mirrors wait for relayed heads (0: they poll the bucket).",
                1 if relay.get("active") else 0,
            )
            yield _counter(
                "edgegw_metadata_head_reports",
                "Head reports sent to the metadata server.",
                relay.get("reports", 0),
            )

    @staticmethod
    def _mirror(lags: list[MirrorLag]) -> Iterator[Metric]:
        families = {
            "entries_behind": GaugeMetricFamily(
                "edgegw_mirror_entries_behind",
                "Source log entries not mirrored yet.",
                labels=["source"],
            ),
            "bytes_behind": GaugeMetricFamily(
                "edgegw_mirror_bytes_behind",
                "Estimated bytes of source log entries not mirrored yet.",
                labels=["source"],
            ),
            "seconds_behind": GaugeMetricFamily(
                "edgegw_mirror_lag_seconds",
                "Age of the oldest source data not mirrored yet (absent when unknown).",
                labels=["source"],
            ),
            "quarantined": GaugeMetricFamily(
                "edgegw_mirror_quarantined_entries",
                "Source entries set aside as unreadable.",
                labels=["source"],
            ),
            "gaps": GaugeMetricFamily(
                "edgegw_mirror_gaps",
                "Ranges of source data skipped because the source no longer had them.",
                labels=["source"],
            ),
            "catch_up_eta_seconds": GaugeMetricFamily(
                "edgegw_mirror_catch_up_eta_seconds",
                "Seconds to catch up at the recent apply rate (absent when unknown).",
                labels=["source"],
            ),
        }
        state = GaugeMetricFamily(
            "edgegw_mirror_state",
            "1 for the state each source's tailer is in.",
            labels=["source", "state"],
        )
        for lag in lags:
            for attr, family in families.items():
                value = getattr(lag, attr)
                if value is not None:
                    family.add_metric([lag.source], float(value))
            if lag.state:
                state.add_metric([lag.source, lag.state], 1)
        yield from families.values()
        yield state
