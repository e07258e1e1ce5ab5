"""Gap policy end to end: the source deletes log objects a lagging mirror still needs.

Region ``a`` homes ``t``; ``b`` mirrors it, then stops (it lags) while ``a``
produces more. The test then runs the home-side GC on ``a``'s log with an age
cap of 0 (as an operator's tight ``gc.age_cap_ms`` would), which advances
``gc-boundary.json`` past ``b``'s position and deletes the entries. ``a``
produces a little more, ``b`` restarts:

* ``gap_policy = "fail"``: ``b`` keeps running and serving, its mirror of
  ``a`` is ``stopped`` with the error naming the deleted range, and nothing
  after the gap is applied;
* ``gap_policy = "skip"``: ``b`` goes on after the gap, and its status
  reports the exact missing range: the deleted entries, and per partition the
  missing offsets, which are exactly what the mirror lacks (checked against
  the objects still in the bucket).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
import trio
from _serve import Fleet, Gateway, Producer, TopicSpec, read_partition, wait_until
from edgegw_cli.status import render

from edge_gateway.bucket import LocalBucket, NotFound
from edge_gateway.bucket_log import read_header
from edge_gateway.format.manifest import log_key
from edge_gateway.mirror.log_gc import GcConfig, GcResult, collect_garbage

TOPIC = TopicSpec("t", "a", partitions=3, subscribers=("b",))


def produce_for(gw: Gateway, seconds: float, seed: int) -> None:
    producer = Producer(gw.url, TOPIC.name, TOPIC.partitions, seed=seed, pause=0.01)
    producer.start()
    time.sleep(seconds)
    producer.stop()
    assert producer.error is None, producer.error
    # everything is in the bucket before anyone looks at it
    wait_until(
        lambda: all(p["unshipped"] == 0 for p in gw.status()["topics"][0]["partitions"]),
        30,
        "a to ship everything",
    )


def collect(bucket_dir: Path) -> GcResult:
    """The home-side GC of region a, with an age cap of 0: deletes all it may, cursors or not."""

    async def run() -> GcResult:
        bucket = await LocalBucket.open(bucket_dir, create=True)
        try:
            return await collect_garbage(
                bucket,
                "a",
                ["b"],
                GcConfig(retention_ms=0, age_cap_ms=0),
                now_ms=time.time_ns() // 1_000_000 + 60_000,
            )
        finally:
            await bucket.aclose()

    return trio.run(run)


def first_offsets_after(bucket_dir: Path, seq: int) -> dict[int, int]:
    """Per partition of ``t``: its first offset in the entries after ``seq`` (in the bucket)."""

    async def run() -> dict[int, int]:
        out: dict[int, int] = {}
        bucket = await LocalBucket.open(bucket_dir, create=True)
        try:
            for s in itertools.count(seq + 1):
                try:
                    header = (await read_header(bucket, log_key("", "a", s))).header
                except NotFound:
                    return out
                for b in header.blocks:
                    if b.topic == TOPIC.name:
                        out.setdefault(b.partition, b.first_offset)
        finally:
            await bucket.aclose()
        raise AssertionError("unreachable")

    return trio.run(run)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_deleted_entries_before_a_lagging_mirror_reads_them(tmp_path: Path, policy: str) -> None:
    fleet = Fleet(
        tmp_path,
        ["a", "b"],
        [TOPIC],
        sections={"mirror": {"gap_policy": policy}},
        # a manifest every 3 entries: GC deletes in whole manifests
        per_region={"a": {"shipper": {"manifest_every": 3, "manifest_interval_ms": 200}}},
    )
    try:
        fleet.start()
        a, b = fleet["a"], fleet["b"]
        produce_for(a, 0.5, seed=1)
        fleet.wait_converged(timeout=30)
        lag_offsets = a.next_offsets(TOPIC.name)
        lag_seq = b.mirror("a")["next_seq"]
        assert b.stop() == 0
        produce_for(a, 1.5, seed=2)  # b misses these ...
        res = collect(fleet.bucket_dir)  # ... and then they are gone
        assert res.boundary_after >= lag_seq, f"GC stopped early: {res}"
        assert res.overridden == ("b",)
        produce_for(a, 0.5, seed=3)  # the log goes on after the gap
        after_gap = first_offsets_after(fleet.bucket_dir, res.boundary_after)
        assert sorted(after_gap) == [0, 1, 2]
        b.start()

        log_gap = {
            "kind": "log",
            "first_seq": lag_seq,
            "last_seq": res.boundary_after,
            "topic": None,
            "partition": None,
            "first_offset": None,
            "end_offset": None,
        }
        if policy == "fail":
            m = wait_until(
                lambda: (m := b.mirror("a"))["state"] == "stopped" and m,
                30,
                "b's mirror of a to stop at the gap",
            )
            assert f"entries {lag_seq}..{res.boundary_after} are gone" in m["stopped_by"]
            assert [_fields(g) for g in m["gaps"]] == [log_gap]
            # nothing after the gap was applied; b itself runs on
            assert b.next_offsets("a.t") == lag_offsets
            assert b.running
            with b.client() as c:
                assert c.healthy()
                assert c.status()["errors"] == {}
            time.sleep(1.0)
            assert b.next_offsets("a.t") == lag_offsets
            assert b.mirror("a")["state"] == "stopped"
            render(b.status())  # `edgegw status` shows it
        else:
            fleet.wait_converged(timeout=30)
            m = b.mirror("a")
            assert m["state"] in ("idle", "following"), m
            assert m["stopped_by"] is None
            want_partition_gaps = sorted(
                (p, lag_offsets[p], after_gap[p])
                for p in range(TOPIC.partitions)
                if after_gap[p] > lag_offsets[p]
            )
            assert want_partition_gaps, "the deleted entries held no records"
            gaps = [_fields(g) for g in m["gaps"]]
            assert gaps[0] == log_gap
            got_partition_gaps = sorted(
                (g["partition"], g["first_offset"], g["end_offset"])
                for g in gaps[1:]
                if g["kind"] == "partition" and g["topic"] == TOPIC.name
            )
            assert got_partition_gaps == want_partition_gaps
            assert len(gaps) == 1 + len(want_partition_gaps)
            render(b.status())  # `edgegw status` shows them
            # the mirror holds exactly the source minus the reported ranges
            for p in range(TOPIC.partitions):
                source = read_partition(a.url, TOPIC.name, p)
                kept = [r for r in source if not lag_offsets[p] <= r.offset < after_gap[p]]
                mirror = read_partition(b.url, "a.t", p, 0, limit=lag_offsets[p])
                mirror += read_partition(b.url, "a.t", p, after_gap[p])
                assert mirror == kept, f"a.t/{p} differs from the source minus the gap"
                # a consumer reading through the gap is not stuck in it
                with b.client() as c:
                    page = c.fetch("a.t", p, lag_offsets[p], max_records=1)
                assert [r.offset for r in page.records] == [after_gap[p]], page
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


def _fields(gap: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in gap.items() if k not in ("source", "description")}
