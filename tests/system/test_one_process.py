"""One process per data directory, proven with real processes (issue 14, items 1 and 2).

Before the lock, `edgegw sync --config` run beside `edgegw serve` claimed a
new epoch, the gateway died at its next upload and an acknowledged record
was lost; a second `edgegw serve` on one config did the same damage. Now the
second process is refused with a one-line error that names the first one's
pid, and `edgegw sync` asks the running gateway to ship and pull instead.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
from _serve import Fleet, TopicSpec, read_partition, wait_until

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))
from _cli_support import assert_one_line_failure, run_edgegw

TOPICS = [TopicSpec("t-a", "a", partitions=2), TopicSpec("t-b", "b", partitions=2)]

#: Region a ships only when asked (or when an object is full) and polls its
#: source once a minute: what arrives on `edgegw sync` came because of it.
SLOW_A = {
    "a": {
        "shipper": {"flush_interval_ms": 600_000},
        "mirror": {"poll_interval_ms": 60_000, "max_poll_interval_ms": 60_000},
    }
}


def _produce(url: str, topic: str, n: int, tag: str) -> list[str]:
    values = [f"{tag}-{i}" for i in range(n)]
    with httpx.Client(base_url=url, timeout=30) as c:
        for v in values:
            r = c.post(f"/v1/topics/{topic}/records", json={"records": [{"value": v}]})
            assert r.status_code == 200, r.text
    return values


def _values(url: str, topic: str, partitions: int) -> list[str]:
    out: list[str] = []
    for p in range(partitions):
        out += [r.value.decode() for r in read_partition(url, topic, p)]
    return sorted(out)


def _pid(fleet: Fleet, region: str) -> int:
    proc = fleet[region].proc
    assert proc is not None
    return proc.pid


def test_sync_beside_a_running_gateway_asks_it_and_loses_nothing(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, ["a", "b"], TOPICS, per_region=SLOW_A)
    try:
        fleet.start()
        a, b = fleet["a"], fleet["b"]
        sent_a = _produce(a.url, "t-a", 20, "a")
        sent_b = _produce(b.url, "t-b", 15, "b")
        wait_until(lambda: b.status()["shipper"]["pending_lsns"] == 0, 30, "b to ship")
        before = a.status()
        (t_a,) = [t for t in before["topics"] if t["name"] == "t-a"]
        assert sum(p["unshipped"] for p in t_a["partitions"]) == 20  # none shipped on its own

        done = run_edgegw("sync", "--config", a.config, timeout=120)
        assert done.returncode == 0, done.stderr
        assert f"pid {_pid(fleet, 'a')}" in done.stderr  # it says whom it asked
        assert "shipped 20 records" in done.stdout, done.stdout
        assert re.search(r"pulled 15 records in \d+ entries from b", done.stdout), done.stdout

        after = a.status()
        assert a.running
        assert after["shipper"]["epoch"] == before["shipper"]["epoch"]  # nobody claimed
        (t_a,) = [t for t in after["topics"] if t["name"] == "t-a"]
        assert [p["unshipped"] for p in t_a["partitions"]] == [0, 0]
        assert _values(a.url, "b.t-b", 2) == sorted(sent_b)

        # The loss the issue saw: a record acknowledged after the sync, then kill -9.
        late = _produce(a.url, "t-a", 1, "late")
        a.kill()
        a.start()
        assert _values(a.url, "t-a", 2) == sorted(sent_a + late)
        assert a.status()["errors"] == {}
    finally:
        codes = fleet.close()
    assert codes["b"] == 0, fleet["b"].tail()


def test_second_process_on_a_data_dir_is_refused(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, ["a"], TOPICS[:1])
    try:
        fleet.start()
        a = fleet["a"]
        pid = _pid(fleet, "a")
        sent = _produce(a.url, "t-a", 5, "x")

        second = run_edgegw("serve", "--config", a.config, timeout=60)
        line = assert_one_line_failure(second.returncode, second.stderr, "in use")
        assert f"pid {pid}" in line
        assert "serve" in line

        restore = run_edgegw(
            "restore",
            "--data-dir",
            a.data_dir,
            "--region",
            "a",
            "--bucket-dir",
            fleet.bucket_dir,
            "--yes",
            timeout=60,
        )
        line = assert_one_line_failure(restore.returncode, restore.stderr, "in use")
        assert f"pid {pid}" in line
        assert "stop the gateway first" in line
        assert not list(a.data_dir.glob("journal.aside-*"))  # nothing was moved

        # The first gateway never noticed: it serves, and everything is there.
        assert a.running
        sent += _produce(a.url, "t-a", 5, "y")
        a.kill()
        a.start()
        assert _values(a.url, "t-a", 2) == sorted(sent)
    finally:
        fleet.close()


def test_sync_without_a_gateway_still_runs_on_its_own(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, ["a"], TOPICS[:1], per_region=SLOW_A)
    try:
        fleet.start()
        a = fleet["a"]
        _produce(a.url, "t-a", 7, "x")
        assert fleet.close()["a"] in (0, -9)
        done = run_edgegw("sync", "--config", a.config, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "asking it" not in done.stderr
        # SIGTERM shipped what was pending; the one-shot sync had nothing left.
        assert "shipped 0 records" in done.stdout or "shipped 7 records" in done.stdout
        # It released the lock: the gateway starts again.
        a.start()
        assert a.status()["shipper"]["pending_lsns"] == 0
    finally:
        fleet.close()


def test_a_port_that_cannot_be_bound_fences_nobody(tmp_path: Path) -> None:
    """The API binds before the shipper claims: a gateway that cannot serve exits
    without writing a fence entry (which would have fenced the region's real writer)."""
    import socket

    fleet = Fleet(tmp_path, ["a"], TOPICS[:1])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        a = fleet["a"]
        a.config.write_text(
            a.config.read_text().replace('listen = "127.0.0.1:0"', f'listen = "127.0.0.1:{port}"')
        )
        done = run_edgegw("serve", "--config", a.config, timeout=60)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    log_dir = fleet.bucket_dir / "regions" / "a" / "log"
    assert not log_dir.exists() or not any(log_dir.iterdir()), "an epoch was claimed"


def test_demo_and_scenario_refuse_a_dir_a_gateway_still_uses(tmp_path: Path) -> None:
    from edge_gateway.datadir import lock_directory

    work = tmp_path / "work"
    lock = lock_directory(work / "north", "gateway")  # a gateway left running there
    try:
        done = run_edgegw(
            "scenario",
            "run",
            Path(__file__).parents[2] / "scenarios" / "lte-blips.toml",
            "--dir",
            work,
            timeout=60,
        )
        line = assert_one_line_failure(done.returncode, done.stderr, "in use")
        assert "another --dir" in line
        assert (work / "north" / "edgegw.lock").exists()  # nothing was wiped
    finally:
        lock.release()


def test_first_start_offline_answers_healthz_and_stops_on_sigterm(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    """A first start waits for the bucket (it must learn the region's offsets), but its
    API answers at once with the reason, and SIGTERM ends the wait promptly."""
    import signal

    from edge_gateway.testing.ports import free_port
    from edge_gateway.testing.tcpproxy import ProxyMode

    port = free_port()
    fleet = Fleet(
        tmp_path,
        ["a"],
        TOPICS[:1],
        s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name),
        per_region={"a": {"api": {"listen": f"127.0.0.1:{port}"}}},
    )
    fleet.proxies["a"].set_mode(ProxyMode.REFUSE)
    a = fleet["a"]
    try:
        a.spawn()

        def starting() -> str:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
            except httpx.TransportError:
                return ""
            return r.json()["error"]["message"] if r.status_code == 503 else ""

        reason = wait_until(starting, 60, "/healthz to answer while starting offline")
        assert "first start" in reason
        assert a.running
        assert a.proc is not None
        a.proc.send_signal(signal.SIGTERM)
        # Promptly (systemd would SIGKILL after 90 s); before, SIGTERM was ignored here.
        assert a.proc.wait(timeout=30) == 0, a.tail()
    finally:
        fleet.close()


def test_sync_beside_a_fresh_gateway_that_holds_nothing_returns(tmp_path: Path) -> None:
    # A fresh journal's only entry is the checkpoint that starts its segment:
    # nothing to ship. `edgegw sync` asked the gateway and waited for it for ever.
    fleet = Fleet(tmp_path, ["a"], TOPICS[:1], per_region=SLOW_A)
    try:
        fleet.start()
        a = fleet["a"]
        done = run_edgegw("sync", "--config", a.config, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "shipped 0 records" in done.stdout, done.stdout
        assert a.status()["shipper"]["pending_lsns"] == 0
    finally:
        codes = fleet.close()
    assert codes["a"] == 0, fleet["a"].tail()
