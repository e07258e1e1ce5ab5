"""Prometheus metrics of one gateway (served at ``GET /metrics``).

Each :class:`Gateway` gets its own :class:`prometheus_client.CollectorRegistry`
(never the process-global one: tests and embedding programs run several
gateways in one process). The journal and shipper figures are not counted
twice: a custom collector reads their ``statistics()`` at scrape time, so the
hot paths pay nothing for metrics. The API adds one histogram of request
latency by route template, method and status code (:class:`LatencyHistogram`).
prometheus_client, the registry and the exposition load at the first scrape
(:mod:`edge_gateway._metrics_export`), not at every start: the library's
``__init__`` loads ``http.server``, ``wsgiref`` and ``urllib`` (~2.7 MB, ~30 ms;
docs/operations.md, "Footprint").

Families (``_total`` is added to counters by the exposition format):

* ``edgegw_info{region,version}``, ``edgegw_accepting``, ``edgegw_uptime_seconds``
* ``edgegw_clock_skew_seconds`` (this gateway's clock minus the bucket's; absent
  before the first write), ``edgegw_clock_state{state}``, ``edgegw_gc_paused``,
  ``edgegw_gc_store_unsupported`` (the store refuses GC's compare-and-swap)
* ``edgegw_journal_*``: bytes, max_bytes, segments, next_lsn, durable_lsn,
  appends_total, appended_bytes_total, fsyncs_total, fsync_seconds_total,
  fsync_seconds_max, full_rejections_total; the filesystem under it:
  disk_free_bytes, disk_size_bytes, disk_full (0/1), disk_full_rejections_total,
  disk_full_episodes_total, segments_deleted_for_space_total, failed (0/1: intake
  stopped after a failed fsync or EIO); the read index: index_bytes (RAM),
  index_cache_bytes, index_cache_hits_total, index_cache_misses_total
* ``edgegw_shipper_*``: claimed, epoch, next_seq, shipped_lsn, pending_lsns,
  oldest_unshipped_age_seconds, objects_total, fences_total, set_aside_total,
  uploads_aborted_total, heap_trims_total, manifests_total,
  records_total, bytes_total (journal bytes shipped), wire_bytes_total
  (compressed object bytes), retries_total, upload_seconds_total,
  last_ship_timestamp_seconds, state{state} (1 for the one the shipper is in:
  starting, shipping, retrying, denied)
* ``edgegw_state_files_damaged_total{file}``: state files of the data dir found
  damaged in this run, copied to ``quarantine/`` and rebuilt (``edge_gateway.statefile``)
* ``edgegw_link_bytes_total{direction}`` (up, down), ``edgegw_link_bytes_today``,
  ``edgegw_link_bytes_this_month`` (local day and month, kept across restarts),
  ``edgegw_link_cap_bytes_per_second``, ``edgegw_link_wait_seconds_total``; with
  bulk windows or allowances: ``edgegw_link_window_open``,
  ``edgegw_link_allowance_bytes{period}`` and
  ``edgegw_link_allowance_remaining_bytes{period}`` (day, month),
  ``edgegw_link_held_total{priority}`` (objects that waited),
  ``edgegw_link_holding{priority}``, ``edgegw_link_allowed{priority}``
* ``edgegw_bucket_denied{component,code}``: 1 for each component the bucket
  refuses (``shipper``, ``mirror <source>``) with the store's error code
  (``InvalidAccessKeyId``, ``NoSuchBucket``...); absent while none is. A
  person must act: alert on it.
* ``edgegw_mirror_*{source}``: entries_behind, bytes_behind, lag_seconds,
  quarantined_entries, gaps, catch_up_eta_seconds, state{state},
  fetches_in_flight, probe_misses_total, priority_holds_total, priority_held,
  pack_reads_total, pack_entries_total — from the
  gateway's tailers, or from the provider given to
  :meth:`GatewayMetrics.set_mirror_lag_provider`
* ``edgegw_task_failures_total{task}``, ``edgegw_task_restarts_total{task}``,
  ``edgegw_task_degraded{task}`` — the supervised tasks (``edge_gateway.supervisor``)
* ``edgegw_kafka_*`` (docs/kafka.md): connections, connections_accepted_total,
  requests_total{api}, errors_total{error}, protocol_errors_total,
  tls_handshake_failures_total — while the Kafka listener runs
* ``edgegw_mqtt_*`` (docs/mqtt.md): connected{bridge,direction},
  messages_total{bridge,direction}, acked_total{bridge}, redeliveries_total{bridge},
  blocked{bridge}, idle_filters{bridge}, publish_lag_records{bridge}
* ``edgegw_kafka_groups``, ``edgegw_kafka_group_members``,
  ``edgegw_kafka_group_pending_members``, ``edgegw_kafka_group_rebalances_total``,
  ``edgegw_kafka_group_expired_members_total`` (docs/kafka.md), with the Kafka listener on
* ``edgegw_producers_remembered``, ``edgegw_producer_partitions_remembered``,
  ``edgegw_produce_duplicates_total``, ``edgegw_producers_issued_total``,
  ``edgegw_producers_expired_total``, ``edgegw_producers_evicted_total`` — idempotent
  producers (docs/api.md, "Idempotent produce")
* ``edgegw_api_request_seconds{route,method,code}`` (histogram)
* ``edgegw_api_waits_abandoned_total``: long polls, ``ack=shipped`` waits and
  syncs ended because their client disconnected; ``edgegw_api_connections``:
  open connections of the API (the builtin server; absent with hypercorn);
  ``edgegw_api_tls_handshake_failures_total``: connections closed before
  their TLS handshake completed (builtin server with TLS)
"""

from __future__ import annotations

import bisect
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from edge_gateway.gateway import Gateway

__all__ = ["CONTENT_TYPE", "GatewayMetrics", "LatencyHistogram", "MirrorLag", "metrics_for"]

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
    #: The tailer's state (following, idle, catching-up, retrying, denied, missing-key,
    #: quarantined, stopped).
    state: str = ""
    #: Log entries being fetched now (header reads, GETs, decoding).
    fetches_in_flight: int = 0
    #: 404s of entries asked for ahead of the first missing one (probing cost).
    probe_misses: int = 0
    #: ``<region>/<key id>`` an encrypted entry needs and this reader lacks (None: none).
    missing_key: str | None = None
    #: Per source topic, records the source declared dropped (drop-oldest gap markers).
    dropped_gap_records: tuple[tuple[str, int], ...] = ()
    #: Fetches that waited for another source's higher-priority catch-up, and
    #: whether one waits now (docs/mirroring.md, "Priorities").
    priority_holds: int = 0
    priority_held: bool = False
    #: Packs of small entries read catching up, and the entries taken from them.
    pack_reads: int = 0
    pack_entries: int = 0

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
            fetches_in_flight=stats.fetches_in_flight,
            probe_misses=stats.probe_misses,
            missing_key=stats.missing_key,
            dropped_gap_records=tuple(stats.dropped_gap_records),
            priority_holds=stats.priority_holds,
            priority_held=stats.priority_held,
            pack_reads=stats.pack_reads,
            pack_entries=stats.pack_entries,
        )


MirrorLagProvider = Callable[[], Iterable[MirrorLag]]


@dataclass(slots=True)
class _Series:
    """One label set of a :class:`LatencyHistogram`: per-bucket counts (not
    cumulative; the last is +Inf), their sum and when it was first observed."""

    counts: list[int]
    sum: float = 0.0
    created: float = field(default_factory=time.time)


class LatencyHistogram:
    """A Prometheus histogram with labels, counted without prometheus_client.

    The API observes every request here; :mod:`edge_gateway._metrics_export`
    turns it into the exposition at a scrape (and loads prometheus_client then).
    """

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.buckets = tuple(sorted(buckets))
        #: Label values (as strings) -> their series.
        self.series: dict[tuple[str, ...], _Series] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = _Series([0] * (len(self.buckets) + 1))
        # The first bucket whose upper bound is >= value (le: less or equal).
        series.counts[bisect.bisect_left(self.buckets, value)] += 1
        series.sum += value


class GatewayMetrics:
    """The metrics of one gateway; get it with :func:`metrics_for`."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = weakref.ref(gateway)
        self._mirror_lag: MirrorLagProvider | None = None
        self._registry: CollectorRegistry | None = None
        self.api_request_seconds = LatencyHistogram(
            "edgegw_api_request_seconds",
            "Local API request latency (from the request reaching the app to the last byte "
            "of the response), by route template, method and status code. Long-poll fetches "
            "include their wait.",
            ["route", "method", "code"],
            LATENCY_BUCKETS,
        )
        # Label tuples by (route, method, code): no str(code) per request.
        self._labels: dict[tuple[str, str, int], tuple[str, str, str]] = {}
        #: Waits (long polls, ack=shipped, sync) ended by their client's disconnect.
        self.api_waits_abandoned = 0
        #: Open API connections right now, when the server can tell (set by serve_api).
        self.api_connections: Callable[[], int] | None = None
        #: TLS handshakes that failed or timed out (builtin server with TLS; set by serve_api).
        self.api_tls_handshake_failures: Callable[[], int] | None = None

    def observe_request(self, route: str, method: str, code: int, seconds: float) -> None:
        """Record one API request (called by the API for every response)."""
        key = (route, method, code)
        labels = self._labels.get(key)
        if labels is None:
            labels = self._labels[key] = (route, method, str(code))
        self.api_request_seconds.observe(labels, seconds)

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

    @property
    def registry(self) -> CollectorRegistry:
        """A prometheus_client registry of these metrics (loads the library)."""
        if self._registry is None:
            from edge_gateway._metrics_export import registry_for

            gateway = self._gateway()
            if gateway is None:
                raise RuntimeError("the gateway of these metrics is gone")
            self._registry = registry_for(gateway, self)
        return self._registry

    def render(self) -> bytes:
        """The Prometheus text exposition of everything above."""
        from edge_gateway._metrics_export import render

        return render(self.registry)


_BY_GATEWAY: weakref.WeakKeyDictionary[Gateway, GatewayMetrics] = weakref.WeakKeyDictionary()


def metrics_for(gateway: Gateway) -> GatewayMetrics:
    """The :class:`GatewayMetrics` of ``gateway`` (created on first use, one per gateway)."""
    m = _BY_GATEWAY.get(gateway)
    if m is None:
        m = GatewayMetrics(gateway)
        _BY_GATEWAY[gateway] = m
    return m
