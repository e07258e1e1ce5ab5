"""Gateways whose wall clock is wrong: real `edgegw serve` processes under libfaketime.

Edge devices boot with clocks days or years off and may have them set while
running. Nothing may be deleted on a device's clock alone, the skew must be
visible, and intervals and timeouts must not notice (docs/operations.md,
"Clocks"). The clock is shifted by preloading Debian's libfaketime into the
gateway process itself (no ``faketime`` wrapper, so signals reach the
gateway); the local-directory bucket's file times come from the kernel and
keep the real time, as a store's clock would.

* +40 days, the issue's three steps: ``north`` takes records; restarted 40
  days ahead it reports the skew and GC deletes nothing ``south`` has not
  mirrored, with the default pause and with the pause lifted (ages on the
  bucket's clock); ``south`` then mirrors everything, no gap.
* -10 years: ``north`` runs, ships and mirrors, reports the skew, and with
  the default pause deletes nothing; with the pause lifted it deletes what
  ``south`` mirrored (on the bucket's clock) and keeps what it has not.
* A clock set forward and back while running (faketime's offset file, the
  monotonic clock left real as the kernel keeps it): manifests keep their
  interval, records still ship, uptime does not jump, the skew follows.
* A subscriber that never ran, whose data GC's age cap deleted, stops on the
  gap under ``gap_policy = "fail"``; one added after the data was written
  starts after it without a gap.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest
import trio
from _faketime import settable, shifted
from _serve import EDGEGW, Fleet, Gateway, TopicSpec, wait_until

from edge_gateway.bucket import LocalBucket

pytestmark = pytest.mark.slow

DAY_S = 86_400
TOPIC = TopicSpec("telemetry", "north", partitions=2, subscribers=("south",))
BACK = TopicSpec("readings", "south", partitions=1, subscribers=("north",))
#: GC every 300 ms; the other gateway settings of tests/_serve.py's FAST.
GC = {"enabled": True, "interval_ms": 300}
#: A pause bound no skew here reaches: GC then runs on the bucket's clock alone.
NO_PAUSE = {"gc_pause_skew_ms": 100 * 365 * DAY_S * 1000}


def keys(bucket_dir: Path, folder: str) -> list[str]:
    """Keys under ``folder`` in the local-directory bucket."""

    async def run() -> list[str]:
        bucket = await LocalBucket.open(bucket_dir)
        try:
            return [i.key for i in await bucket.list(folder)]
        finally:
            await bucket.aclose()

    return trio.run(run)


def log_and_manifests(bucket_dir: Path, region: str) -> set[str]:
    return set(keys(bucket_dir, f"regions/{region}/log/")) | set(
        keys(bucket_dir, f"regions/{region}/manifest/")
    )


def produce_each(gw: Gateway, topic: TopicSpec, count: int, start: int = 0) -> None:
    """``count`` records, each acknowledged once shipped (so each is a log object of its own)."""
    with gw.client() as c:
        for i in range(start, start + count):
            c.produce(
                topic.name, [json.dumps({"n": i})], partition=i % topic.partitions, ack="shipped"
            )


def metric(gw: Gateway, name: str) -> float | None:
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return None if m is None else float(m.group(1))


def gc_runs_after(gw: Gateway, runs: int) -> dict[str, object]:
    """Wait for ``runs`` more GC runs of ``gw``; its status after them."""
    first = gw.status()["gc"]["runs"]
    wait_until(lambda: gw.status()["gc"]["runs"] >= first + runs, 60, f"{runs} GC runs")
    doc: dict[str, object] = gw.status()
    return doc


def clock_of(gw: Gateway) -> dict[str, object]:
    doc: dict[str, object] = gw.status()["clock"]
    return doc


def cursor_through(bucket_dir: Path, source: str, reader: str) -> int:
    path = bucket_dir / "objects" / "regions" / source / "cursors" / f"{reader}.json"
    return int(json.loads(path.read_text())["through_seq"]) if path.exists() else 0


# --------------------------------------------------------------------------


@pytest.mark.parametrize("pause", ["default", "lifted"])
def test_a_clock_40_days_ahead_deletes_nothing_a_subscriber_has_not_mirrored(
    tmp_path: Path, pause: str
) -> None:
    env = shifted("+40d")
    fleet = Fleet(
        tmp_path,
        ["north", "south"],
        [TOPIC],
        sections={"gc": GC},
        per_region={
            "north": {
                "shipper": {"manifest_every": 5},
                **({"clock": NO_PAUSE} if pause == "lifted" else {}),
            }
        },
    )
    north, south = fleet["north"], fleet["south"]
    try:
        # 1. north takes 40 records and stops; south has not run yet.
        north.start()
        produce_each(north, TOPIC, 40)
        assert north.stop() == 0
        written = log_and_manifests(fleet.bucket_dir, "north")
        assert len(written) > 40  # 41 entries (a fence first) and 8 manifests

        # 2. north restarts with its clock 40 days ahead and GC runs a few times.
        north.env = env
        north.start()
        status = gc_runs_after(north, 5)
        assert written <= log_and_manifests(fleet.bucket_dir, "north"), "GC deleted data"
        assert status["gc"]["deleted_entries"] == 0  # type: ignore[index]
        clock = clock_of(north)
        assert abs(clock["skew_s"] - 40 * DAY_S) < 600, clock  # type: ignore[operator]
        skew = metric(north, "edgegw_clock_skew_seconds")
        assert skew is not None
        assert abs(skew - 40 * DAY_S) < 600
        log = north.log.read_text()
        assert "WARNING edgegw.clock: clock: this gateway's clock is" in log
        assert "40.0 days) ahead of the bucket's" in log
        shown = subprocess.run(
            [str(EDGEGW), "status", "--config", str(north.config)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "250"},
            check=True,
        ).stdout
        assert "ahead of the bucket's clock (40.0 days)" in shown, shown
        if pause == "default":
            assert "bucket GC deletes nothing" in shown
            assert clock["state"] == "gc-paused"
            assert "clock.gc_pause_skew_ms" in status["gc"]["paused"]  # type: ignore[index]
            assert metric(north, "edgegw_gc_paused") == 1
        else:
            # GC ran and decided on the bucket's clock: everything is minutes old.
            assert clock["state"] == "skewed"
            assert status["gc"]["paused"] is None  # type: ignore[index]
        assert "although south have not mirrored" not in log

        # 3. south starts and mirrors every record, without a gap.
        south.start()
        fleet.wait_converged(timeout=60)
        assert fleet.mismatches() == []
        assert south.mirror("north")["gaps"] == []
    finally:
        fleet.close()


def test_a_clock_10_years_behind_runs_ships_mirrors_and_keeps_what_is_unmirrored(
    tmp_path: Path,
) -> None:
    fleet = Fleet(
        tmp_path,
        ["north", "south"],
        [TOPIC, BACK],
        sections={"gc": {**GC, "retention_ms": 0}, "mirror": {"cursor_interval_ms": 200}},
        per_region={"north": {"shipper": {"manifest_every": 4}}},
    )
    north, south = fleet["north"], fleet["south"]
    north.env = shifted("-10y")
    try:
        fleet.start()
        produce_each(north, TOPIC, 20)
        produce_each(south, BACK, 6)
        fleet.wait_converged(timeout=60)
        assert fleet.mismatches() == []
        clock = clock_of(north)
        assert -3660 * DAY_S < clock["skew_s"] < -3640 * DAY_S, clock  # type: ignore[operator]
        assert clock["state"] == "gc-paused"
        written = log_and_manifests(fleet.bucket_dir, "north")
        status = gc_runs_after(north, 5)
        assert "clock.gc_pause_skew_ms" in status["gc"]["paused"]  # type: ignore[index]
        assert written <= log_and_manifests(fleet.bucket_dir, "north")
        assert "days) behind the bucket's" in north.log.read_text()

        # With the pause lifted, GC deletes on the bucket's clock: what south
        # mirrored goes (retention 0), what it has not stays.
        assert north.stop() == 0
        north.config.write_text(
            north.config.read_text()
            + f"[clock]\ngc_pause_skew_ms = {NO_PAUSE['gc_pause_skew_ms']}\n"
        )
        north.start()
        wait_until(
            lambda: north.status()["gc"]["deleted_entries"] > 0, 60, "GC to delete mirrored data"
        )
        assert south.stop() == 0
        through = cursor_through(fleet.bucket_dir, "north", "south")
        produce_each(north, TOPIC, 12, start=20)
        gc_runs_after(north, 5)
        left = keys(fleet.bucket_dir, "regions/north/log/")
        head = north.status()["shipper"]["next_seq"] - 1
        unmirrored = {f"regions/north/log/{s:020d}.egw" for s in range(through + 1, head + 1)}
        assert unmirrored <= set(left), "GC deleted entries south has not mirrored"
        south.start()
        fleet.wait_converged(timeout=60)
        assert fleet.mismatches() == []
        assert south.mirror("north")["gaps"] == []
    finally:
        fleet.close()


def test_setting_the_clock_while_running_changes_no_interval(tmp_path: Path) -> None:
    offset = tmp_path / "faketime.offset"
    offset.write_text("+0\n")
    fleet = Fleet(
        tmp_path,
        ["north", "south"],
        [TOPIC],
        sections={"gc": GC},
        # manifests by time only: every 300 ms of the monotonic clock
        per_region={"north": {"shipper": {"manifest_interval_ms": 300, "manifest_every": 10_000}}},
    )
    north = fleet["north"]
    north.env = settable(offset)
    try:
        fleet.start()
        produce_each(north, TOPIC, 3)

        def manifest_after_more_records(start: int) -> None:
            before = len(keys(fleet.bucket_dir, "regions/north/manifest/"))
            produce_each(north, TOPIC, 2, start=start)  # ack=shipped: the flush still comes
            wait_until(
                lambda: len(keys(fleet.bucket_dir, "regions/north/manifest/")) > before,
                30,
                "a manifest within its interval",
            )

        for step, (setting, state) in enumerate(
            [("+1d", "gc-paused"), ("-1d", "gc-paused"), ("+0", "ok")]
        ):
            offset.write_text(setting + "\n")
            manifest_after_more_records(10 + 10 * step)
            # a long poll waits its time, whatever the wall clock did
            with north.client() as c:
                fetched = c.fetch("telemetry", 0, offset=10_000, wait_ms=200)
            assert fetched.records == []
            uptime = metric(north, "edgegw_uptime_seconds")
            assert uptime is not None
            assert uptime < 3600, (setting, uptime)
            assert (metric(north, "edgegw_shipper_oldest_unshipped_age_seconds") or 0) < 3600
            clock = clock_of(north)
            assert clock["state"] == state, (setting, clock)
        status = gc_runs_after(north, 2)
        assert status["gc"]["paused"] is None  # type: ignore[index]
        assert "within" in north.log.read_text()  # "... within N s of the bucket's again"
        fleet.wait_converged(timeout=60)
        assert fleet.mismatches() == []
    finally:
        fleet.close()


@pytest.mark.parametrize("when", ["subscribed-before", "added-after"])
def test_a_subscriber_whose_data_the_age_cap_deleted(tmp_path: Path, when: str) -> None:
    """South never ran; north's GC deletes its data at the age cap (1 s here)."""
    subscribers = ("south",) if when == "subscribed-before" else ()
    topic = TopicSpec("telemetry", "north", partitions=2, subscribers=subscribers)
    fleet = Fleet(
        tmp_path,
        ["north", "south"],
        [topic],
        sections={
            "gc": {**GC, "retention_ms": 0, "age_cap_ms": 1000},
            "mirror": {"gap_policy": "fail"},
        },
        per_region={"north": {"shipper": {"manifest_every": 4}}},
    )
    north, south = fleet["north"], fleet["south"]
    try:
        north.start()
        produce_each(north, topic, 16)
        wait_until(lambda: north.status()["gc"]["deleted_entries"] > 0, 60, "the age cap to delete")
        assert north.stop() == 0
        if when == "added-after":
            # south subscribes now; north learns it at its next start
            for g in (north, south):
                g.config.write_text(
                    g.config.read_text().replace("subscribers = []", 'subscribers = ["south"]')
                )
            north.start()
        south.start()
        if when == "subscribed-before":
            wait_until(
                lambda: south.mirror("north")["state"] == "stopped", 60, "the gap to stop it"
            )
            m = south.mirror("north")
            # the seqs written while south was subscribed (the first is a fence)
            assert [g["kind"] for g in m["gaps"]] == ["log"], m
            assert m["gaps"][0]["first_seq"] <= 3
            assert "gap_policy" in m["stopped_by"]
            log = south.log.read_text()
            assert "although it was subscribed when they were written" in log
            assert "WARNING edgegw.mirror" in log
            assert south.next_offsets("north.telemetry") == [0, 0]
            text = httpx.get(f"{south.url}/metrics", timeout=10).text
            assert 'edgegw_mirror_gaps{source="north"} 1.0' in text
        else:
            fleet.wait_converged(timeout=60)
            m = south.mirror("north")
            assert m["state"] != "stopped", m
            assert {g["kind"] for g in m["gaps"]} == {"start"}, m
    finally:
        fleet.close()
