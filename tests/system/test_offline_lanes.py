"""`edgegw sync` and `edgegw reship` on a data directory with three lanes (topic priorities),
without the gateway: real `edgegw serve` processes on a local-directory bucket.

Region ``a`` homes one topic per priority (``crit``, ``norm``, ``bulk``);
region ``b`` mirrors all three. ``a``'s flush interval is an hour, so only
an explicit sync ships. Then:

- sync: ``a`` ships a first part through `edgegw sync` (asking the running
  gateway), takes a backlog in every lane, and is killed with SIGKILL.
  `edgegw sync --config` (no gateway) ships every lane, critical first, in
  objects of at most ``--flush-bytes``; a second sync ships nothing;
  ``a`` restarts with nothing pending; ``b`` mirrors every topic record for
  record, and every partition's offsets run gap-free and without a repeat
  along ``a``'s log (exactly once).
- reship: the bucket is wiped while ``a`` is stopped; `edgegw reship`
  re-creates the log of every lane from the journals; offsets continue after
  a restart.

The order is asserted on the log itself, never on timings.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio
from _serve import EDGEGW, Fleet, Gateway, TopicSpec, wait_until

from edge_gateway.bucket import LocalBucket
from edge_gateway.bucket_log import find_head
from edge_gateway.format import logobject
from edge_gateway.format.manifest import log_key

TOPICS = [
    TopicSpec("crit", "a", partitions=2, subscribers=("b",), priority="critical"),
    TopicSpec("norm", "a", partitions=2, subscribers=("b",)),
    TopicSpec("bulk", "a", partitions=2, subscribers=("b",), priority="bulk"),
]
RANK = {"crit": 0, "norm": 1, "bulk": 2}
KiB = 1024
#: Only an explicit sync ships (the flush deadline is an hour away).
SLOW_SHIP = {"shipper": {"flush_interval_ms": 3_600_000, "manifest_interval_ms": 3_600_000}}

Offsets = dict[tuple[str, int], list[int]]


def run(*args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EDGEGW), *(str(a) for a in args)],
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )


def produce(g: Gateway, records: int) -> dict[tuple[str, int, int], bytes]:
    """``records`` incompressible 1 KiB records per partition of every topic, acknowledged
    locally (journaled, not shipped); returns them by (topic, partition, offset)."""
    acked: dict[tuple[str, int, int], bytes] = {}
    with g.client() as c:
        for t in TOPICS:
            for p in range(t.partitions):
                for _ in range(0, records, 10):
                    values = [os.urandom(KiB) for _ in range(10)]
                    res = c.produce_batch(t.name, p, values)
                    for v, o in zip(values, res.offsets, strict=True):
                        acked[(t.name, p, o)] = v
    return acked


def read_log(bucket_dir: Path) -> list[tuple[int, Offsets, dict[tuple[str, int, int], bytes]]]:
    """Every object of ``a``'s log in seq order: seq, offsets per partition, values."""

    async def read() -> list[tuple[int, Offsets, dict[tuple[str, int, int], bytes]]]:
        bucket = await LocalBucket.open(bucket_dir)
        out = []
        try:
            for seq in range(1, await find_head(bucket, "", "a") + 1):
                key = log_key("", "a", seq)
                data = (await bucket.get(key)).data
                header = logobject.decode_header(data, where=key, object_size=len(data))
                offsets: Offsets = {}
                values: dict[tuple[str, int, int], bytes] = {}
                for b in header.blocks:
                    raw = logobject.decode_block(b, data[b.offset : b.end], where=key)
                    for batch in logobject.iter_block_batches(b, raw, where=key):
                        for r in batch.records():
                            offsets.setdefault((b.topic, b.partition), []).append(r.offset)
                            values[(b.topic, b.partition, r.offset)] = r.value
                out.append((seq, offsets, values))
        finally:
            await bucket.aclose()
        return out

    return trio.run(read)


def assert_exactly_once(
    log: list[tuple[int, Offsets, dict[tuple[str, int, int], bytes]]],
    acked: dict[tuple[str, int, int], bytes],
) -> None:
    """Every acknowledged record is in the log at its offset, and every partition's offsets
    run 0, 1, 2, ... along the log: no gap, no repeat."""
    values = {k: v for _, _, vals in log for k, v in vals.items()}
    missing = [k for k, v in acked.items() if values.get(k) != v]
    assert not missing, f"{len(missing)} acknowledged records are not in the log: {missing[:5]}"
    for t in TOPICS:
        for p in range(t.partitions):
            along = [o for _, offsets, _ in log for o in offsets.get((t.name, p), [])]
            n = 1 + max(o for (topic, q, o) in acked if (topic, q) == (t.name, p))
            assert along == list(range(n)), f"{t.name}/{p}: offsets along the log are not 0..{n}"


def lane_backlogs(g: Gateway) -> dict[str, int]:
    return {lane["lane"]: lane["backlog_entries"] for lane in g.status()["lanes"]["lanes"]}


@pytest.mark.slow
def test_offline_sync_ships_every_lane_critical_first_and_mirrors_exactly_once(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path, ["a", "b"], TOPICS, per_region={"a": SLOW_SHIP})
    a, b = fleet["a"], fleet["b"]
    try:
        fleet.start()
        acked = produce(a, 20)
        # Shipped through the running gateway (sync asks it).
        proc = run("sync", "--config", a.config)
        assert proc.returncode == 0, proc.stderr
        assert "the gateway is running" in proc.stderr, proc.stderr
        assert set(lane_backlogs(a).values()) == {0}
        fleet.wait_converged(timeout=60)

        # A backlog in every lane, then kill -9.
        acked |= produce(a, 120)
        backlogs = lane_backlogs(a)
        assert list(backlogs) == ["critical", "normal", "bulk"]
        assert all(n > 0 for n in backlogs.values()), backlogs
        a.kill()
        head_before = len(read_log(fleet.bucket_dir))

        # Offline sync: every lane, in drain order, in small objects.
        proc = run("sync", "--config", a.config, "--ship-only", "--flush-bytes", 64 * KiB)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert "the gateway is running" not in proc.stderr
        assert "lanes shipped through LSN: critical " in proc.stdout, proc.stdout
        log = read_log(fleet.bucket_dir)
        synced = [offsets for seq, offsets, _ in log if seq > head_before and offsets]
        ranks = [sorted({RANK[t] for t, _ in offsets}) for offsets in synced]
        assert len(ranks) >= 6, f"the sync took only {len(ranks)} objects"
        # critical, then normal, then bulk: an object holds the end of one
        # lane's backlog and the start of the next at most.
        for i in range(1, len(ranks)):
            assert ranks[i - 1][-1] <= ranks[i][0], ranks
        assert ranks[0][0] == 0
        assert ranks[-1][-1] == 2
        assert_exactly_once(log, acked)

        # b mirrors the synced backlog while a is still down.
        for t in TOPICS:
            want = [
                1 + max(o for (topic, q, o) in acked if (topic, q) == (t.name, p))
                for p in range(t.partitions)
            ]
            wait_until(
                lambda t=t, want=want: b.next_offsets(f"a.{t.name}") == want,
                60,
                f"b to mirror a.{t.name} up to {want}",
            )

        # A second sync has nothing to ship.
        proc = run("sync", "--config", a.config, "--ship-only")
        assert proc.returncode == 0, proc.stderr
        assert "shipped 0 records" in proc.stdout, proc.stdout

        # The gateway restarts with nothing pending, and ships on from there.
        a.start()
        assert set(lane_backlogs(a).values()) == {0}
        acked |= produce(a, 10)
        proc = run("sync", "--config", a.config)
        assert proc.returncode == 0, proc.stderr
        assert_exactly_once(read_log(fleet.bucket_dir), acked)

        # b mirrors all three topics, record for record.
        fleet.wait_converged(timeout=120)
        assert fleet.mismatches() == []
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


@pytest.mark.slow
def test_reship_recreates_the_log_of_every_lane(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, ["a"], TOPICS)
    a = fleet["a"]
    try:
        a.start()
        acked = produce(a, 30)
        proc = run("sync", "--config", a.config)
        assert proc.returncode == 0, proc.stderr
        assert a.stop() == 0
        assert_exactly_once(read_log(fleet.bucket_dir), acked)

        # The bucket loses everything while the gateway is stopped.
        shutil.rmtree(fleet.bucket_dir)
        fleet.bucket_dir.mkdir()
        proc = run("reship", "--config", a.config, "--new-bucket")
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert "re-created the log of a" in proc.stdout, proc.stdout
        assert "lanes shipped through LSN: critical " in proc.stdout, proc.stdout
        assert_exactly_once(read_log(fleet.bucket_dir), acked)

        # The gateway runs again, and offsets continue.
        a.start()
        assert set(lane_backlogs(a).values()) == {0}
        acked |= produce(a, 10)
        proc = run("sync", "--config", a.config)
        assert proc.returncode == 0, proc.stderr
        assert_exactly_once(read_log(fleet.bucket_dir), acked)
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


@pytest.mark.slow
def test_offline_sync_ships_a_drop_oldest_lane(tmp_path: Path) -> None:
    """A drop-oldest topic has a lane (and journal) of its own: `edgegw sync` without
    the gateway ships its backlog too, and the other region mirrors it exactly once."""
    topics = [
        TopicSpec(
            "tele", "a", partitions=2, subscribers=("b",), priority="bulk", on_full="drop-oldest"
        ),
        TopicSpec("norm", "a", partitions=2, subscribers=("b",)),
    ]
    fleet = Fleet(tmp_path, ["a", "b"], topics, per_region={"a": SLOW_SHIP})
    a, b = fleet["a"], fleet["b"]
    try:
        fleet.start()
        acked: dict[tuple[str, int, int], bytes] = {}
        with a.client() as c:
            for t in topics:
                for p in range(t.partitions):
                    values = [os.urandom(KiB) for _ in range(30)]
                    res = c.produce_batch(t.name, p, values)
                    acked |= {(t.name, p, o): v for v, o in zip(values, res.offsets, strict=True)}
        backlogs = lane_backlogs(a)
        assert len(backlogs) == 2, backlogs
        assert all(n > 0 for n in backlogs.values()), backlogs
        a.kill()
        proc = run("sync", "--config", a.config, "--ship-only")
        assert proc.returncode == 0, proc.stderr + proc.stdout
        values = {k: v for _, _, vals in read_log(fleet.bucket_dir) for k, v in vals.items()}
        assert {k: values.get(k) for k in acked} == acked
        for t in topics:
            wait_until(
                lambda t=t: b.next_offsets(f"a.{t.name}") == [30, 30],
                60,
                f"b to mirror a.{t.name}",
            )
        a.start()
        assert set(lane_backlogs(a).values()) == {0}
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
