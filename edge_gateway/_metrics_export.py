"""The Prometheus text exposition of a gateway's metrics (:meth:`GatewayMetrics.render`).

Kept apart from :mod:`edge_gateway.metrics` because it needs prometheus_client,
whose ``__init__`` loads ``http.server``, ``wsgiref`` and ``urllib`` (~2.7 MB
and ~30 ms of a gateway's start): the library loads at the first scrape, not
at every start (docs/operations.md, "Footprint"). Until then the API's latency
histogram counts in :class:`edge_gateway.metrics.LatencyHistogram`.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from edge_gateway import pygc
from edge_gateway.errors import ClosedError, EdgeGatewayError
from edge_gateway.journal import later_repairs
from edge_gateway.metrics import GatewayMetrics, LatencyHistogram, MirrorLag
from edge_gateway.shipper import SHIPPER_STATES, LaneShipStats
from edge_gateway.statefile import STATE_FILES

if TYPE_CHECKING:
    from edge_gateway.gateway import Gateway
    from edge_gateway.journal import JournalStats

__all__ = ["registry_for"]

log = logging.getLogger("edgegw.metrics")


def registry_for(gateway: Gateway, owner: GatewayMetrics) -> CollectorRegistry:
    """A registry of ``gateway``'s figures, read at each scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_GatewayCollector(gateway, owner))
    registry.register(_HistogramCollector(owner.api_request_seconds))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


class _HistogramCollector(Collector):
    """:class:`LatencyHistogram` as a Prometheus histogram (with ``_created``, as
    prometheus_client's own ``Histogram`` has)."""

    def __init__(self, histogram: LatencyHistogram) -> None:
        self._histogram = histogram
        # ``le`` as prometheus_client writes these bounds ("0.0001", "1.0", "+Inf").
        self._bounds = [repr(float(b)) for b in histogram.buckets] + ["+Inf"]

    def collect(self) -> Iterator[Metric]:
        h = self._histogram
        family = HistogramMetricFamily(h.name, h.documentation, labels=list(h.labelnames))
        for labels, series in h.series.items():
            cumulative, running = [], 0
            for bound, count in zip(self._bounds, series.counts, strict=True):
                running += count
                cumulative.append((bound, float(running)))
            family.add_metric(list(labels), cumulative, series.sum)
            family.add_sample(
                h.name + "_created", dict(zip(h.labelnames, labels, strict=True)), series.created
            )
        yield family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _lanes(gw: Gateway, lanes: Sequence[LaneShipStats]) -> Iterator[Metric]:
    """Per journal lane (label ``lane``: critical, normal, bulk): its shipping and budget."""
    families = {
        "shipped_lsn": GaugeMetricFamily(
            "edgegw_lane_shipped_lsn",
            "Every entry of the lane's journal up to this LSN is in the bucket.",
            labels=["lane"],
        ),
        "backlog_entries": GaugeMetricFamily(
            "edgegw_lane_backlog_entries",
            "Entries of the lane's journal not yet in the bucket.",
            labels=["lane"],
        ),
        "backlog_bytes": GaugeMetricFamily(
            "edgegw_lane_backlog_bytes",
            "Bytes of the lane's journal not yet in the bucket.",
            labels=["lane"],
        ),
        "held": GaugeMetricFamily(
            "edgegw_lane_held",
            "1 while the link policy holds the lane back.",
            labels=["lane"],
        ),
    }
    for lane in lanes:
        for key, family in families.items():
            family.add_metric([lane.lane], float(getattr(lane, key)))
    yield from families.values()
    budget = GaugeMetricFamily(
        "edgegw_lane_journal_budget_bytes",
        "The lane's share of journal.max_bytes now (its reserve plus what the others leave).",
        labels=["lane"],
    )
    used = GaugeMetricFamily(
        "edgegw_lane_journal_bytes", "Bytes of the lane's journal on disk.", labels=["lane"]
    )
    dropped = CounterMetricFamily(
        "edgegw_journal_dropped_records",
        "Records a drop-oldest lane deleted before they were shipped (exact ranges: "
        "edgegw status, the lane's dropped.log), per topic.",
        labels=["lane", "topic"],
    )
    dropped_bytes = CounterMetricFamily(
        "edgegw_journal_dropped_bytes",
        "Journal bytes a drop-oldest lane deleted before they were shipped, per topic.",
        labels=["lane", "topic"],
    )
    lost = CounterMetricFamily(
        "edgegw_journal_lost_records",
        "Records lost to damage in the middle of a journal segment and quarantined "
        "(exact ranges: edgegw status, the lane's lost.log, quarantine/*-report.json), per "
        "topic; a range whose end is not known counts at its bound.",
        labels=["lane", "topic"],
    )
    lost_entries = CounterMetricFamily(
        "edgegw_journal_lost_entries",
        "Journal entries (LSNs) lost to damage and quarantined.",
        labels=["lane"],
    )
    still_entries = GaugeMetricFamily(
        "edgegw_journal_lost_unrepaired_entries",
        "Journal entries (LSNs) lost to damage and not rebuilt since: the lost entries "
        "less those a later repair rebuilt from the bucket (it falls when one does).",
        labels=["lane"],
    )
    still_records = GaugeMetricFamily(
        "edgegw_journal_lost_unrepaired_records",
        "Records lost to damage and not rebuilt since, per topic (it falls when a later "
        "repair rebuilds them).",
        labels=["lane", "topic"],
    )
    repaired_entries = CounterMetricFamily(
        "edgegw_journal_repaired_entries",
        "Journal entries of damaged ranges rebuilt from the bucket's log objects "
        "(repaired.log, quarantine/*-report.json).",
        labels=["lane"],
    )
    repaired_ranges = CounterMetricFamily(
        "edgegw_journal_repaired_ranges",
        "Damaged journal ranges rebuilt from the bucket's log objects.",
        labels=["lane"],
    )
    for name, j in gw.lanes.journals.items():
        budget.add_metric([str(name)], j.budget_bytes)
        repairs = j.repairs()
        repaired_entries.add_metric([str(name)], sum(x.entries for x in repairs))
        repaired_ranges.add_metric([str(name)], len(repairs))
        losses = j.losses()
        lost_entries.add_metric([str(name)], sum(x.lsn_last - x.lsn_first + 1 for x in losses))
        lost_per_topic: dict[str, int] = {}
        for x in losses:
            for lr in x.ranges:
                lost_per_topic[lr.topic] = lost_per_topic.get(lr.topic, 0) + lr.records
        for topic, records in sorted(lost_per_topic.items()):
            lost.add_metric([str(name), topic], records)
        still = [x for x in losses if not later_repairs(x, repairs)]
        still_entries.add_metric([str(name)], sum(x.lsn_last - x.lsn_first + 1 for x in still))
        still_per_topic = dict.fromkeys(lost_per_topic, 0)
        for x in still:
            for lr in x.ranges:
                still_per_topic[lr.topic] += lr.records
        for topic, records in sorted(still_per_topic.items()):
            still_records.add_metric([str(name), topic], records)
        used.add_metric([str(name)], j.disk_bytes)
        per_topic: dict[str, list[int]] = {}
        for d in j.dropped(held=False):
            for r in d.ranges:
                t = per_topic.setdefault(r.topic, [0, 0])
                t[0] += r.records
                t[1] += r.bytes
        for topic, (records, nbytes) in sorted(per_topic.items()):
            dropped.add_metric([str(name), topic], records)
            dropped_bytes.add_metric([str(name), topic], nbytes)
    yield budget
    yield used
    yield dropped
    yield dropped_bytes
    yield lost
    yield lost_entries
    yield still_entries
    yield still_records
    yield repaired_entries
    yield repaired_ranges


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
        owner = self._owner()
        if owner is not None:
            yield from self._api(owner)
        yield from self._clock(gw)
        yield from self._link(gw)
        yield from self._producers(gw)
        yield from self._state_files(gw)
        yield from self._gc()
        try:
            stats = gw.journal.statistics()
            gw.shipper  # noqa: B018 - raises ClosedError when not running
        except ClosedError:
            return  # not running: nothing else to report
        yield from self._journal(stats)
        yield from self._scrub(gw)
        yield from self._shipper(gw)
        yield from self._denied(gw)
        yield from self._metadata(gw)
        yield from self._tasks(gw)
        yield from self._mqtt(gw)
        yield from self._kafka(gw)
        yield from self._kafka_groups(gw)
        owner = self._owner()
        if owner is not None:
            try:
                lags = owner.mirror_lag(gw)
            except Exception:  # a broken provider must not break the scrape
                log.exception("mirror lag provider failed")
                lags = []
            yield from self._mirror(lags)

    @staticmethod
    def _kafka(gw: Gateway) -> Iterator[Metric]:
        doc = gw.service_status("kafka")
        if doc is None:
            return
        yield GaugeMetricFamily(
            "edgegw_kafka_connections", "Open Kafka client connections.", value=doc["connections"]
        )
        yield CounterMetricFamily(
            "edgegw_kafka_connections_accepted",
            "Kafka client connections accepted.",
            value=doc["connections_total"],
        )
        requests = CounterMetricFamily(
            "edgegw_kafka_requests", "Kafka requests by API (produce, fetch, ...).", labels=["api"]
        )
        for api, n in doc["requests"].items():
            requests.add_metric([api], n)
        yield requests
        errors = CounterMetricFamily(
            "edgegw_kafka_errors",
            "Kafka error codes in responses (per topic or partition), by Kafka error name.",
            labels=["error"],
        )
        for name, n in doc["errors"].items():
            errors.add_metric([name], n)
        yield errors
        yield CounterMetricFamily(
            "edgegw_kafka_protocol_errors",
            "Kafka connections closed for a request that could not be answered (unknown API "
            "or version, malformed or oversized frame, a request before SASL).",
            value=doc["protocol_errors"],
        )
        yield CounterMetricFamily(
            "edgegw_kafka_tls_handshake_failures",
            "Kafka connections closed before their TLS handshake completed.",
            value=doc["tls_handshake_failures"],
        )

    @staticmethod
    def _kafka_groups(gw: Gateway) -> Iterator[Metric]:
        """The Kafka listener's consumer groups (docs/kafka.md, "Consumer groups")."""
        doc = gw.service_status("kafka")
        if doc is None:
            return
        g = doc["groups"]
        yield _gauge("edgegw_kafka_groups", "Kafka consumer groups with members.", g["groups"])
        yield _gauge(
            "edgegw_kafka_group_members", "Members of the Kafka consumer groups.", g["members"]
        )
        yield _gauge(
            "edgegw_kafka_group_pending_members",
            "Member ids handed out (JoinGroup MEMBER_ID_REQUIRED) not yet joined.",
            g["pending_members"],
        )
        yield _counter(
            "edgegw_kafka_group_rebalances",
            "Join phases completed (each a new generation of a group).",
            g["rebalances_total"],
        )
        yield _counter(
            "edgegw_kafka_group_expired_members",
            "Members removed for a session timeout or for missing a rebalance.",
            g["expired_members_total"],
        )

    @staticmethod
    def _gc() -> Iterator[Metric]:
        """The collector's pauses (``edgegw serve`` settles it: edge_gateway.pygc)."""
        doc = pygc.statistics()
        if not doc["settled"]:
            return
        collections = CounterMetricFamily(
            "edgegw_gc_collections",
            "Garbage collections since the gateway became ready, by generation.",
            labels=["generation"],
        )
        pauses = CounterMetricFamily(
            "edgegw_gc_pause_seconds",
            "Seconds the event loop stood still in garbage collections, by generation.",
            labels=["generation"],
        )
        longest = GaugeMetricFamily(
            "edgegw_gc_max_pause_seconds",
            "The longest garbage collection since the gateway became ready, by generation.",
            labels=["generation"],
        )
        for gen in range(3):
            collections.add_metric([str(gen)], doc["collections"][gen])
            pauses.add_metric([str(gen)], doc["pause_seconds"][gen])
            longest.add_metric([str(gen)], doc["max_pause_ms"][gen] / 1e3)
        yield collections
        yield pauses
        yield longest

    @staticmethod
    def _producers(gw: Gateway) -> Iterator[Metric]:
        p = gw.producers.statistics()
        yield _gauge(
            "edgegw_producers_remembered",
            "Idempotent producers whose last appends the gateway remembers.",
            p.producers,
        )
        yield _gauge(
            "edgegw_producer_partitions_remembered",
            "(producer, partition) pairs with remembered appends.",
            p.partitions,
        )
        yield _counter(
            "edgegw_produce_duplicates",
            "Idempotent produce requests answered as duplicates (nothing appended).",
            p.duplicates,
        )
        yield _counter(
            "edgegw_producers_issued", "Producer ids issued since the gateway started.", p.issued
        )
        yield _counter(
            "edgegw_producers_expired",
            "Producers forgotten after idempotence.producer_expiry_ms idle, since the start.",
            p.expired,
        )
        yield _counter(
            "edgegw_producers_evicted",
            "Producers forgotten beyond idempotence.max_producers since the start.",
            p.evicted,
        )

    @staticmethod
    def _mqtt(gw: Gateway) -> Iterator[Metric]:
        doc = gw.service_status("mqtt")
        if doc is None:
            return
        labels = ["bridge", "direction"]
        connected = GaugeMetricFamily(
            "edgegw_mqtt_connected", "1 while the bridge is connected to its broker.", labels=labels
        )
        messages = CounterMetricFamily(
            "edgegw_mqtt_messages",
            "Messages taken from the broker (ingest) or published and acknowledged (publish).",
            labels=labels,
        )
        acked = CounterMetricFamily(
            "edgegw_mqtt_acked",
            "Ingested messages journaled durably and then PUBACKed.",
            labels=["bridge"],
        )
        redeliveries = CounterMetricFamily(
            "edgegw_mqtt_redeliveries",
            "Messages the broker redelivered (DUP flag): they may be in the journal twice.",
            labels=["bridge"],
        )
        blocked = GaugeMetricFamily(
            "edgegw_mqtt_blocked",
            "1 while the journal refuses an ingest's messages (it stops reading; the broker "
            "queues).",
            labels=["bridge"],
        )
        idle = GaugeMetricFamily(
            "edgegw_mqtt_idle_filters",
            "Subscribed filters that matched no message for idle_warning_s.",
            labels=["bridge"],
        )
        lag = GaugeMetricFamily(
            "edgegw_mqtt_publish_lag_records",
            "Records of the published topics not yet published and acknowledged.",
            labels=["bridge"],
        )
        for b in doc["ingest"]:
            name = b["name"]
            connected.add_metric([name, "ingest"], 1 if b["connected"] else 0)
            messages.add_metric([name, "ingest"], b["messages_in"])
            acked.add_metric([name], b["acked"])
            redeliveries.add_metric([name], b["redeliveries"])
            blocked.add_metric([name], 1 if b["blocked"] else 0)
            idle.add_metric([name], sum(1 for f in b["filters"] if f["idle"]))
        for b in doc["publish"]:
            name = b["name"]
            connected.add_metric([name, "publish"], 1 if b["connected"] else 0)
            messages.add_metric([name, "publish"], b["messages_out"])
            lag.add_metric([name], b["lag_records"])
        yield from (connected, messages, acked, redeliveries, blocked, idle, lag)

    @staticmethod
    def _api(owner: GatewayMetrics) -> Iterator[Metric]:
        yield _counter(
            "edgegw_api_waits_abandoned",
            "Long polls, ack=shipped waits and syncs ended because their client disconnected.",
            owner.api_waits_abandoned,
        )
        if owner.api_connections is not None:
            yield _gauge(
                "edgegw_api_connections",
                "Open connections of the local API (builtin server).",
                owner.api_connections(),
            )
        if owner.api_tls_handshake_failures is not None:
            yield _counter(
                "edgegw_api_tls_handshake_failures",
                "Connections to the local API closed before their TLS handshake completed "
                "(timed out, refused certificate, or plain HTTP on the TLS port).",
                owner.api_tls_handshake_failures(),
            )

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
            "edgegw_journal_compressed_segments",
            "Sealed journal segments stored compressed (journal.at_rest).",
            j.compressed_segments,
        )
        yield _gauge(
            "edgegw_journal_compressed_bytes",
            "Bytes on disk of the compressed sealed segments.",
            j.compressed_bytes,
        )
        yield _gauge(
            "edgegw_journal_compressed_wal_bytes",
            "Bytes the compressed sealed segments had as entry logs (before their rewrite).",
            j.compressed_wal_bytes,
        )
        yield _counter(
            "edgegw_journal_rewritten_segments",
            "Sealed segments the rewriter rewrote compressed since the journal opened.",
            j.rewritten_segments,
        )
        yield _counter(
            "edgegw_journal_rewritten_bytes_before",
            "Bytes of the entry logs the rewriter rewrote (since the journal opened).",
            j.rewritten_bytes_before,
        )
        yield _counter(
            "edgegw_journal_rewritten_bytes_after",
            "Bytes of the compressed segments the rewriter wrote in their place.",
            j.rewritten_bytes_after,
        )
        yield _counter(
            "edgegw_journal_rewrite_failures",
            "Rewrites that failed (ENOSPC, EIO; the segment stays uncompressed, retried later).",
            j.rewrite_failures,
        )
        yield _gauge(
            "edgegw_journal_rewrite_pending_segments",
            "Sealed segments waiting for their compressed rewrite.",
            j.rewrite_pending,
        )
        yield _gauge(
            "edgegw_journal_rewrite_child_max_rss_bytes",
            "The largest peak resident memory of a rewrite's child process (0: none ran yet).",
            j.rewrite_child_max_rss_bytes,
        )
        yield _gauge(
            "edgegw_journal_block_cache_bytes",
            "Bytes of decompressed frames the frame cache holds (journal.block_cache_bytes).",
            j.block_cache_bytes,
        )
        yield _counter(
            "edgegw_journal_block_cache_hits",
            "Reads of a compressed frame served from the frame cache.",
            j.block_cache_hits,
        )
        yield _counter(
            "edgegw_journal_block_cache_misses",
            "Reads of a compressed frame that read and decompressed it.",
            j.block_cache_misses,
        )
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
        s = gw.shipper.statistics()
        pending = sum(lane.backlog_entries for lane in s.lanes)
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
            "Journal entries not yet committed to the bucket (all lanes).",
            pending,
        )
        yield from _lanes(gw, s.lanes)
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
        yield _counter(
            "edgegw_shipper_set_aside",
            "Corrupt or foreign objects set aside from where the next log entry went.",
            s.set_aside,
        )
        yield _counter(
            "edgegw_shipper_uploads_aborted",
            "Unfinished multipart uploads of log objects aborted at a claim (crash leftovers).",
            s.uploads_aborted,
        )
        yield _counter(
            "edgegw_shipper_heap_trims",
            "Drains after which the C heap's free pages went back to the kernel (malloc_trim).",
            s.heap_trims,
        )
        yield _counter("edgegw_shipper_manifests", "Manifests written.", s.manifests)
        yield _counter(
            "edgegw_shipper_packs", "Packs of small log entries written (format/pack.py).", s.packs
        )
        yield _counter(
            "edgegw_shipper_pack_bytes", "Bytes of packs uploaded (entry copies).", s.pack_bytes
        )
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
    def _state_files(gw: Gateway) -> Iterator[Metric]:
        """Damaged state files found in this run (``edge_gateway.statefile``)."""
        family = CounterMetricFamily(
            "edgegw_state_files_damaged",
            "State files of the data dir found damaged in this run (copied to quarantine/ and "
            "rebuilt): edgegw status names each, with the reason and what was done.",
            labels=["file"],
        )
        counts = dict.fromkeys(STATE_FILES, 0)
        for d in gw.state_files.statistics():
            counts[d.file] = counts.get(d.file, 0) + 1
        for name, n in sorted(counts.items()):
            family.add_metric([name], n)
        yield family

    @staticmethod
    def _scrub(gw: Gateway) -> Iterator[Metric]:
        """The background scrub of the journal's sealed segments (``journal.scrub_interval``)."""
        if gw.scrub is None:
            return
        sc = gw.scrub.statistics()
        yield _counter(
            "edgegw_journal_scrub_bytes",
            "Bytes of sealed segments and their index files the scrub re-read.",
            sc.bytes_scrubbed,
        )
        yield _counter(
            "edgegw_journal_scrub_passes",
            "Full passes of the scrub over every lane's sealed segments.",
            sc.passes,
        )
        yield _gauge(
            "edgegw_journal_scrub_damaged_segments",
            "Journal files (sealed segments, index files) the scrub found damaged and that "
            "are still there: edgegw status names each, with the byte and the reason.",
            len(sc.damaged),
        )
        if sc.last_pass_ms is not None:
            yield _gauge(
                "edgegw_journal_scrub_last_pass_timestamp_seconds",
                "Unix time the scrub's last full pass ended.",
                sc.last_pass_ms / 1000,
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
        yield _gauge(
            "edgegw_gc_store_unsupported",
            "1 while bucket GC cannot advance because the store answers 412 to a "
            "compare-and-swap with the object's current ETag (it refuses If-Match).",
            1 if gw.gc.store_unsupported else 0,
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
        gate = gw.link_gate
        if not gate.restricts:
            return
        p = gate.statistics()
        yield _gauge(
            "edgegw_link_window_open",
            "1 while bulk data may ship by link.bulk_windows (1 when none are set).",
            1 if p.window_open else 0,
        )
        left = GaugeMetricFamily(
            "edgegw_link_allowance_remaining_bytes",
            "Bytes left of link.daily_bytes / link.monthly_bytes this local day / month "
            "(only periods with an allowance).",
            labels=["period"],
        )
        for period, remaining in (("day", p.day_remaining), ("month", p.month_remaining)):
            if remaining is not None:
                left.add_metric([period], remaining)
        yield left
        allowance = GaugeMetricFamily(
            "edgegw_link_allowance_bytes",
            "link.daily_bytes / link.monthly_bytes (only periods with an allowance).",
            labels=["period"],
        )
        for period, limit in (("day", p.daily_bytes), ("month", p.monthly_bytes)):
            if limit:
                allowance.add_metric([period], limit)
        yield allowance
        held = CounterMetricFamily(
            "edgegw_link_held",
            "Objects whose transfer waited for the link policy (a window or an allowance).",
            labels=["priority"],
        )
        holding = GaugeMetricFamily(
            "edgegw_link_holding",
            "1 while data of this priority waits for the link policy.",
            labels=["priority"],
        )
        allowed = GaugeMetricFamily(
            "edgegw_link_allowed",
            "1 while data of this priority may move by the link policy.",
            labels=["priority"],
        )
        for prio in p.held:
            held.add_metric([prio], p.held[prio])
            holding.add_metric([prio], 1 if p.holding[prio] else 0)
            allowed.add_metric([prio], 1 if p.allowed[prio] else 0)
        yield held
        yield holding
        yield allowed

    @staticmethod
    def _denied(gw: Gateway) -> Iterator[Metric]:
        current = gw.shipper.state
        state = GaugeMetricFamily(
            "edgegw_shipper_state",
            "1 for the state the shipper is in (starting, shipping, retrying: the bucket is "
            "away, denied: the bucket refuses this gateway and a person must act, failing: "
            "its runs end with an unexpected error and nothing ships; see edgegw status).",
            labels=["state"],
        )
        for name in SHIPPER_STATES:
            state.add_metric([name], 1 if name == current else 0)
        yield state
        yield _gauge(
            "edgegw_shipper_failed_runs",
            "Shipper runs in a row that ended with an unexpected error (0 once it catches up).",
            gw.shipper.statistics().failures,
        )
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
        in_flight = GaugeMetricFamily(
            "edgegw_mirror_fetches_in_flight",
            "Source log entries being fetched now (header reads, GETs, decoding).",
            labels=["source"],
        )
        misses = CounterMetricFamily(
            "edgegw_mirror_probe_misses",
            "404s of source log entries asked for ahead of the first missing one "
            "(the cost of fetching ahead while following).",
            labels=["source"],
        )
        dropped = CounterMetricFamily(
            "edgegw_mirror_gap_records",
            "Records of a source topic that the source dropped before shipping them "
            "(on_full = drop-oldest), as its gap markers say; exact ranges in edgegw status.",
            labels=["source", "topic"],
        )
        pack_reads = CounterMetricFamily(
            "edgegw_mirror_pack_reads",
            "Packs of a source's small log entries read while catching up (one GET each).",
            labels=["source"],
        )
        pack_entries = CounterMetricFamily(
            "edgegw_mirror_pack_entries",
            "Source log entries taken from packs instead of their own objects.",
            labels=["source"],
        )
        holds = CounterMetricFamily(
            "edgegw_mirror_priority_holds",
            "Fetches that waited while another source caught up a higher priority.",
            labels=["source"],
        )
        held = GaugeMetricFamily(
            "edgegw_mirror_priority_held",
            "1 while the source's catch-up waits for another source's higher priority.",
            labels=["source"],
        )
        state = GaugeMetricFamily(
            "edgegw_mirror_state",
            "1 for the state each source's tailer is in.",
            labels=["source", "state"],
        )
        missing = GaugeMetricFamily(
            "edgegw_mirror_missing_key",
            "1 while a source's encrypted entry names a key this gateway was not given "
            "([encryption.sources.<region>]); the source waits, the others go on.",
            labels=["source", "key"],
        )
        for lag in lags:
            if lag.missing_key is not None:
                missing.add_metric([lag.source, lag.missing_key], 1)
            for attr, family in families.items():
                value = getattr(lag, attr)
                if value is not None:
                    family.add_metric([lag.source], float(value))
            if lag.state:
                state.add_metric([lag.source, lag.state], 1)
            in_flight.add_metric([lag.source], float(lag.fetches_in_flight))
            misses.add_metric([lag.source], float(lag.probe_misses))
            for topic, records in lag.dropped_gap_records:
                dropped.add_metric([lag.source, topic], float(records))
            holds.add_metric([lag.source], float(lag.priority_holds))
            pack_reads.add_metric([lag.source], float(lag.pack_reads))
            pack_entries.add_metric([lag.source], float(lag.pack_entries))
            held.add_metric([lag.source], 1.0 if lag.priority_held else 0.0)
        yield from families.values()
        yield in_flight
        yield misses
        yield dropped
        yield holds
        yield pack_reads
        yield pack_entries
        yield held
        yield state
        yield missing
