"""The status document (``GET /v1/status``, ``edgegw status``), built from statistics.

:func:`status_document` reads the gateway core's statistics, its components'
(journal, shipper, tailers, link, clock, producers, GC) and the blocks of the
services attached to it (``kafka``, ``mqtt``: :meth:`Gateway.service_status`),
and builds the JSON-ready document. The gateway itself builds no document.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_gateway import __version__, heap, pygc
from edge_gateway.gateway import mirror_task
from edge_gateway.journal import later_repairs

if TYPE_CHECKING:
    from edge_gateway.gateway import Gateway
    from edge_gateway.journal import Journal, JournalStats, Loss
    from edge_gateway.mirror import Gap, Tailer
    from edge_gateway.shipper import ShipperStats

__all__ = ["status_document"]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _link_json(gw: Gateway) -> dict[str, Any]:
    k = gw.link.statistics()
    return {
        "cap_bytes_per_s": k.cap_bytes_per_s,
        "up_bytes": k.up_bytes,
        "down_bytes": k.down_bytes,
        "waited_s": round(k.waited_s, 3),
        "day": k.day,
        "day_bytes": k.day_bytes,
        "month": k.month,
        "month_bytes": k.month_bytes,
        "policy": _link_policy_json(gw),
    }


def _link_policy_json(gw: Gateway) -> dict[str, Any] | None:
    """``[link]``'s windows and allowances now (None: none configured)."""
    gate = gw.link_gate
    if not gate.restricts:
        return None
    p = gate.statistics()
    return {
        "bulk_windows": list(p.windows),
        "window_open": p.window_open,
        "window_change_in_s": _round(p.window_change_in_s),
        "daily_bytes": p.daily_bytes,
        "day_used_bytes": p.day_used,
        "day_remaining_bytes": p.day_remaining,
        "monthly_bytes": p.monthly_bytes,
        "month_used_bytes": p.month_used,
        "month_remaining_bytes": p.month_remaining,
        "allowed": p.allowed,
        "opens_in_s": {k: round(v, 1) for k, v in p.opens_in_s.items()},
        "held_objects": p.held,
        "holding": p.holding,
    }


def _metadata_json(gw: Gateway) -> dict[str, Any]:
    """Where the topology comes from: ``static``, or the metadata server's state."""
    if gw.metadata is None:
        return {
            "mode": "static",
            "describe": "metadata: static (topics from the config file)",
        }
    return gw.metadata.status()


def _scrub_json(gw: Gateway) -> dict[str, Any] | None:
    """The journal scrub's block (None: ``journal.scrub_interval`` is off)."""
    if gw.scrub is None:
        return None
    sc = gw.scrub.statistics()
    return {
        "interval_s": sc.interval_s,
        "passes": sc.passes,
        "bytes": sc.bytes_scrubbed,
        "segments_checked": sc.segments_checked,
        "segments_skipped": sc.segments_skipped,
        "rate_bytes_per_s": sc.rate_bytes_per_s,
        "last_pass_ms": sc.last_pass_ms,
        "last_pass_s": sc.last_pass_s,
        "last_pass_bytes": sc.last_pass_bytes,
        "last_pass_segments": sc.last_pass_segments,
        "damaged": [f.to_json() for f in sc.damaged],
    }


def _at_rest_json(gw: Gateway, j: JournalStats) -> dict[str, Any]:
    """Sealed segments rewritten compressed (``journal.at_rest``, docs/at-rest.md)."""
    return {
        "mode": gw.config.journal.at_rest,
        "running": j.rewriter_running,
        "compressed_segments": j.compressed_segments,
        "compressed_bytes": j.compressed_bytes,
        "compressed_wal_bytes": j.compressed_wal_bytes,
        "rewritten_segments": j.rewritten_segments,
        "rewrite_failures": j.rewrite_failures,
        "pending_segments": j.rewrite_pending,
        "child_max_rss_bytes": j.rewrite_child_max_rss_bytes,
    }


def status_document(gw: Gateway) -> dict[str, Any]:
    """Everything ``edgegw status`` shows, as JSON-ready data (``GET /v1/status`` adds ``api``).

    Built from the gateway's and its components' statistics and the attached
    services' blocks (:meth:`Gateway.service_status`).
    """
    j = gw.journal.statistics()
    s = gw.shipper.statistics()
    health = gw.task_health()
    gc = gw.gc.statistics()
    # Every component the bucket refuses, with what to do: needs a person.
    denied = {"shipper": s.denied.to_json()} if s.denied is not None else {}
    for src, t in sorted(gw.tailers.items()):
        refusal = t.statistics().denied
        if refusal is not None:
            denied[mirror_task(src)] = refusal.to_json()
    return {
        "region": gw.region,
        "version": __version__,
        "started_ms": gw.started_ms,
        "accepting": gw.accepting,
        "bucket": gw.config.bucket.describe(gw.config.data_dir),
        "producers": _producers_json(gw),
        # Damaged state files found in this run: each copied to quarantine/ and rebuilt.
        "state_files": {"damaged": [d.to_json() for d in gw.state_files.statistics()]},
        "python_gc": pygc.statistics(),
        "heap": heap.statistics(),
        "journal": {
            "bytes": j.bytes,
            "max_bytes": j.max_bytes,
            "segments": j.segments,
            "next_lsn": j.next_lsn,
            "durable_lsn": j.durable_lsn,
            "appends": j.appends,
            "fsyncs": j.fsyncs,
            "full_rejections": j.full_rejections,
            "index_bytes": j.index_memory_bytes,
            "index_cache_bytes": j.index_cache_bytes,
            "index_cache_capacity_bytes": j.index_cache_capacity_bytes,
            "scrub": _scrub_json(gw),
            "at_rest": _at_rest_json(gw, j),
        },
        "shipper": {
            "state": s.state,
            "denied": s.denied.to_json() if s.denied is not None else None,
            "claimed": s.claimed,
            "epoch": s.epoch,
            "next_seq": s.next_seq,
            "shipped_lsn": s.shipped_lsn,
            "pending_lsns": sum(lane.backlog_entries for lane in s.lanes),
            "objects": s.objects,
            "manifests": s.manifests,
            "packs": s.packs,
            "pack_bytes": s.pack_bytes,
            "wire_bytes": s.wire_bytes,
            "retries": s.retries,
            "uploads_aborted": s.uploads_aborted,
            "heap_trims": s.heap_trims,
            "last_ship_ms": s.last_ship_ms,
            "last_error": s.last_error,
            "failures": s.failures,
            "intake_hold": gw.shipper.intake_hold,
        },
        "lanes": _lanes_json(gw, s),
        "encryption": _encryption_json(gw),
        "mirrors": {src: _tailer_json(t) for src, t in sorted(gw.tailers.items())},
        "link": _link_json(gw),
        "metadata": _metadata_json(gw),
        "gc": {
            "runs": gc.runs,
            "failed_runs": gc.failed_runs,
            "deleted_entries": gc.deleted_entries,
            "last_error": gc.last_error,
            "paused": gc.paused,
            "store_unsupported": gc.store_unsupported,
        },
        "clock": _clock_json(gw),
        # The supervised tasks; "errors" keeps, per degraded task, its last error.
        "tasks": [h.to_json() for h in health],
        "errors": {h.name: h.last_error or "" for h in health if h.degraded},
        "denied": denied,
        "topics": [t.to_json() for t in gw.topics()],
        "disk": _disk_json(j, gw.config.journal_path),
        "mqtt": gw.service_status("mqtt"),
        "kafka": gw.service_status("kafka"),
    }


def _encryption_json(gw: Gateway) -> dict[str, Any]:
    """Which keys this gateway holds, by id (never the keys)."""
    ring = gw.keys.ring
    return {
        "enabled": gw.keys.write is not None,
        "key_id": gw.keys.write.key_id if gw.keys.write is not None else None,
        "keys": {region: list(ring.key_ids(region)) for region in ring.regions()},
    }


def _lanes_json(gw: Gateway, s: ShipperStats) -> dict[str, Any]:
    """The ``lanes`` block of the status: per priority lane, its journal and backlog."""
    lanes = gw.lanes
    journals = {str(lane): (lane, j) for lane, j in lanes.journals.items()}
    cfg = gw.config.journal
    out = []
    for ls in s.lanes:
        lane, j = journals[ls.lane]
        row: dict[str, Any] = {
            "lane": ls.lane,
            "shipped_lsn": ls.shipped_lsn,
            "next_lsn": ls.next_lsn,
            "backlog_entries": ls.backlog_entries,
            "backlog_bytes": ls.backlog_bytes,
            "held": ls.held,
            "journal_bytes": j.disk_bytes,
            "budget_bytes": j.budget_bytes,
            "reserve_bytes": 0 if lane.drops else cfg.reserved(lane.priority),
            "on_full": str(lane.on_full),
        }
        if lane.drops:
            row["dropped"] = _dropped_json(j)
        if j.losses():
            row["lost"] = _lost_json(j)
        if j.repairs():
            row["repaired"] = _repaired_json(j)
        live = j.live_repair.statistics()
        if live.pending or live.failures or live.segments_repaired:
            # the repair while running (journal/_live_repair.py)
            row["live_repair"] = live.to_json()
        out.append(row)
    return {"pending_moves": lanes.pending_moves, "lanes": out}


def _clock_json(gw: Gateway) -> dict[str, Any]:
    """The ``clock`` block of the status: this gateway's clock against the bucket's."""
    c = gw.bucket_clock.statistics()
    return {
        "state": str(c.state),
        "skew_s": None if c.skew_s is None else round(c.skew_s, 3),
        "local_ms": _now_ms(),
        "bucket_ms": c.bucket_now_ms,
        "measured_on": c.measured_on,
        "sample_age_s": None if c.sample_age_s is None else round(c.sample_age_s, 3),
        "samples": c.samples,
        "warn_skew_s": c.warn_skew_s,
        "gc_pause_skew_s": c.gc_pause_skew_s,
    }


def _producers_json(gw: Gateway) -> dict[str, Any]:
    """The ``producers`` block of the status."""
    p = gw.producers.statistics()
    cfg = gw.config.idempotence
    return {
        "remembered": p.producers,
        "partitions": p.partitions,
        "max_producers": cfg.max_producers,
        "expiry_ms": cfg.producer_expiry_ms,
        "duplicates": p.duplicates,
        "issued": p.issued,
        "expired": p.expired,
        "evicted": p.evicted,
        "next_id": p.next_id,
    }


def _dropped_json(j: Journal) -> dict[str, Any]:
    """What a drop-oldest lane deleted unshipped: totals, and per partition the exact
    ranges, adjacent ones merged (the last 50; ``dropped.log`` in the lane's
    directory has every drop)."""
    merged: list[dict[str, Any]] = []
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for d in j.dropped(held=False):
        for r in d.ranges:
            prev = last.get((r.topic, r.partition))
            if prev is not None and prev["last"] + 1 == r.first:
                prev["last"] = r.last
                prev["records"] += r.records
                prev["bytes"] += r.bytes
                prev["time_ms"] = d.time_ms
                continue
            row = {
                "topic": r.topic,
                "partition": r.partition,
                "first": r.first,
                "last": r.last,
                "records": r.records,
                "bytes": r.bytes,
                "time_ms": d.time_ms,
            }
            merged.append(row)
            last[(r.topic, r.partition)] = row
    st = j.statistics()
    return {
        "segments": st.dropped_segments,
        "records": st.dropped_records,
        "bytes": st.dropped_bytes,
        "ranges": merged[-50:],
    }


def _lost_json(j: Journal) -> dict[str, Any]:
    """The ``lost`` block of a lane: entries lost to damage and quarantined (lost.log;
    docs/operations.md, "A damaged disk"), each loss as recorded (the last 50)."""
    losses = j.losses()
    repairs = j.repairs()
    st = j.statistics()

    def one(x: Loss) -> dict[str, Any]:
        # a later repair of every LSN of it supersedes the loss (lost.log stays as it is)
        later = later_repairs(x, repairs)
        doc = x.to_json()
        doc["repaired_later"] = (
            {
                "time_ms": later[-1].time_ms,
                "repairs": [
                    {"segment": r.segment, "lsn_first": r.lsn_first, "lsn_last": r.lsn_last}
                    for r in later
                ],
            }
            if later
            else None
        )
        return doc

    return {
        # still lost: what no later repair rebuilt
        "lsns": st.lost_lsns - st.lost_repaired_lsns,
        "records": st.lost_records - st.lost_repaired_records,
        "repaired_later_lsns": st.lost_repaired_lsns,
        "repaired_later_records": st.lost_repaired_records,
        "losses": [one(x) for x in losses[-50:]],
    }


def _repaired_json(j: Journal) -> dict[str, Any]:
    """The ``repaired`` block of a lane: damaged ranges rebuilt from the bucket
    (repaired.log; docs/operations.md, "A damaged disk"), the last 50 as recorded."""
    repairs = j.repairs()
    return {
        "ranges": len(repairs),
        "entries": sum(x.entries for x in repairs),
        "records": sum(x.records for x in repairs),
        "repairs": [x.to_json() for x in repairs[-50:]],
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _disk_json(j: JournalStats, path: Path) -> dict[str, Any]:
    """The filesystem under the journal (docs/operations.md, "Disk full")."""
    return {
        "path": str(path),
        "state": "failed" if j.failed else "full" if j.disk_full else "ok",
        "free_bytes": j.disk_free_bytes,
        "size_bytes": j.disk_size_bytes,
        "full_rejections": j.disk_full_rejections,
        "full_episodes": j.disk_full_episodes,
        "segments_deleted_for_space": j.segments_deleted_for_space,
        "error": j.failed,
    }


def _tailer_json(t: Tailer) -> dict[str, Any]:
    s = t.statistics()
    return {
        "state": s.state,
        "next_seq": s.next_seq,
        "known_head": s.known_head,
        "entries_behind": s.entries_behind,
        "bytes_behind": s.bytes_behind,
        "seconds_behind": round(s.seconds_behind, 3),
        "eta_s": s.eta_s,
        "entries": s.entries,
        "records": s.records,
        "accepted_epoch": s.accepted_epoch,
        "gaps": [_gap_json(g) for g in s.gaps],
        "dropped_gap_records": dict(s.dropped_gap_records),
        "quarantined": [
            {"key": q.key, "seq": q.seq, "reason": q.reason, "attempts": q.attempts}
            for q in s.quarantined
        ],
        "last_error": s.last_error,
        "denied": s.denied.to_json() if s.denied is not None else None,
        "missing_key": s.missing_key,
        "stopped_by": s.stopped_by,
        "relay": s.relay,
        "relay_head": s.relay_head,
        "relay_wakeups": s.relay_wakeups,
        "fetches_in_flight": s.fetches_in_flight,
        "fetches_in_flight_peak": s.fetches_in_flight_peak,
        "probe_misses": s.probe_misses,
        "catching_up_priority": s.catching_up_priority,
        "priority_held": s.priority_held,
        "priority_holds": s.priority_holds,
        "priority_held_s": round(s.priority_held_s, 3),
        "pack_reads": s.pack_reads,
        "pack_entries": s.pack_entries,
        "pack_fallbacks": s.pack_fallbacks,
        "blocks": s.blocks,
        "prefetch_peak_objects": s.prefetch_peak_objects,
        "prefetch_peak_bytes": s.prefetch_peak_bytes,
    }


def _gap_json(g: Gap) -> dict[str, Any]:
    return {
        "kind": str(g.kind),
        "source": g.source,
        "first_seq": g.first_seq,
        "last_seq": g.last_seq,
        "topic": g.topic,
        "partition": g.partition,
        "first_offset": g.first_offset,
        "end_offset": g.end_offset,
        "description": g.describe(),
    }
