"""Damage in a shipped range is rebuilt from the bucket at the next start (issue 45, item 3).

With real processes: ``edgegw serve`` with a local bucket. A site produces
records of ``t``, ships them all and stops; then the middle of its last
journal segment is damaged (a flipped byte, a 4 KiB page of zeros, bytes cut
out). At the next start the journal rebuilds the damaged entries from the
region's log objects:

* every acknowledged record is served again bit for bit, at its offset;
* nothing is reported lost; the repair is named (the log's WARNING,
  ``/v1/status``'s lane ``repaired`` block, ``edgegw status``, the metrics
  and ``quarantine/*-report.json`` with ``"repaired": true``), and the damaged
  segment's bytes are in ``quarantine/`` as they were;
* new produce is taken at once and continues the offsets;
* a kill -9 at each step of the repair, then a restart, ends repaired, the
  repair recorded once.

The unshipped case (quarantined, reported lost) is ``test_journal_damage.py``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest
from _serve import Fleet, Gateway, TopicSpec, wait_until
from test_journal_damage import (
    _damage,
    _fill,
    _gateway,
    _last_segment,
    _produce,
    _served,
    _value,
)

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))
from _cli_support import run_edgegw

from edge_gateway import failpoints
from edge_gateway.encryption import write_key_file
from edge_gateway.format.crypt import generate_key

TOPIC = "t"


def _ship_all_and_stop(g: Gateway) -> None:
    wait_until(lambda: g.status()["shipper"]["pending_lsns"] == 0, 60, "all shipped")
    state = g.data_dir / "journal/shipper.json"
    next_lsn = g.status()["journal"]["next_lsn"]
    wait_until(lambda: json.loads(state.read_text())["log_lsn"] == next_lsn - 1, 60, "a manifest")
    assert g.stop() == 0


def _metric(text: str, name: str) -> float:
    m = re.search(rf'^{name}{{lane="normal"}} (\S+)$', text, re.MULTILINE)
    assert m, f"no {name} in the metrics"
    return float(m.group(1))


def _repaired(g: Gateway) -> dict[str, object]:
    lanes = g.status()["lanes"]["lanes"]
    assert not [x for x in lanes if x.get("lost")], lanes
    [lane] = [x for x in lanes if x.get("repaired")]
    return dict(lane["repaired"])


@pytest.mark.parametrize("how", ["flip", "zero-page", "cut"])
def test_damage_in_a_shipped_range_is_rebuilt_from_the_bucket(tmp_path: Path, how: str) -> None:
    g = _gateway(tmp_path)
    try:
        g.start()
        acked = _fill(g, "before")
        _ship_all_and_stop(g)
        segment = _last_segment(g)
        _damage(segment, how)
        damaged = segment.read_bytes()

        g.start()
        # every acknowledged record, bit for bit, at its offset; nothing lost
        assert _served(g.url) == acked
        rep = _repaired(g)
        [one] = rep["repairs"]  # type: ignore[misc]
        assert rep["ranges"] == 1
        assert one["entries"] >= 1
        [r] = one["ranges"]
        assert (r["topic"], r["partition"]) == ("t", 0)
        assert 0 < r["first_offset"] <= r["last_offset"] < max(acked)
        # named: the log, the report, the copy, the metrics, edgegw status
        log = g.tail(200)
        assert "repaired from the bucket" in log, log
        assert f"t/0 {r['first_offset']}-{r['last_offset']}" in log
        [report] = (g.data_dir / "quarantine").glob("*-report.json")
        doc = json.loads(report.read_text())
        assert doc["repaired"] is True
        assert doc["ranges"] == one["ranges"]
        assert (g.data_dir / one["copy"]).read_bytes() == damaged
        assert not (g.data_dir / "journal/lost.log").exists()
        metrics = httpx.get(f"{g.url}/metrics", timeout=10).text
        assert _metric(metrics, "edgegw_journal_repaired_entries_total") == one["entries"]
        assert _metric(metrics, "edgegw_journal_repaired_ranges_total") == 1
        assert _metric(metrics, "edgegw_journal_lost_entries_total") == 0
        out = run_edgegw("status", "--config", g.config)
        assert out.returncode == 0, out.stderr
        assert "rebuilt from the bucket" in out.stdout, out.stdout
        # new produce continues the offsets, and ships
        more = _produce(g.url, [_value("after", i) for i in range(10)])
        assert min(more) == max(acked) + 1
        wait_until(lambda: g.status()["shipper"]["pending_lsns"] == 0, 60, "shipped after")
        assert g.status()["shipper"]["last_error"] is None
        assert g.stop() == 0
        g.start()  # the next start: sound, the same record
        assert _repaired(g)["repairs"] == [one]
        assert _served(g.url) == acked | more
        assert g.stop() == 0
        done = run_edgegw("journal", "verify", "--config", g.config)
        assert done.returncode == 0, done.stdout + done.stderr
        replica = run_edgegw("bucket", "verify", "--config", g.config)
        assert replica.returncode == 0, replica.stdout + replica.stderr
    finally:
        g.kill()


@pytest.mark.parametrize("step", ["repair.copied", "repair.recorded"])
def test_a_kill_during_the_repair_ends_repaired(tmp_path: Path, step: str) -> None:
    g = _gateway(tmp_path)
    try:
        g.start()
        acked = _fill(g, "before")
        _ship_all_and_stop(g)
        _damage(_last_segment(g), "zero-page")
        g.env = {failpoints.ENV: f"{step}=kill"}
        g.spawn()
        assert g.proc is not None
        assert g.proc.wait(timeout=60) == -9
        g.env = {}
        g.start()
        assert _served(g.url) == acked
        assert len(_repaired(g)["repairs"]) == 1  # type: ignore[arg-type]
        assert g.stop() == 0
    finally:
        g.kill()


def _s3_site(tmp_path: Path, moto_endpoint: str, s3_bucket_name: str) -> Fleet:
    port = int(moto_endpoint.rsplit(":", 1)[1])
    spec = TopicSpec(TOPIC, "north", partitions=1)
    sections = {"journal": {"segment_bytes": "64KiB"}}
    return Fleet(tmp_path, ["north"], [spec], s3=(port, s3_bucket_name), sections=sections)


def test_on_s3_the_repair_reads_the_log_over_http(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    fleet = _s3_site(tmp_path, moto_endpoint, s3_bucket_name)
    g = fleet["north"]
    try:
        fleet.start()
        acked = _fill(g, "before")
        _ship_all_and_stop(g)
        _damage(_last_segment(g), "zero-page")
        g.start()
        assert _served(g.url) == acked
        [one] = _repaired(g)["repairs"]  # type: ignore[misc]
        assert all(k.startswith("regions/north/log/") for k in one["objects"])
    finally:
        fleet.close()


def test_with_the_bucket_out_of_reach_the_site_starts_and_quarantines(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    """The start does not wait for the bucket: the range is quarantined (``repairable``),
    the intact records are served and new produce is taken; it ships once the link heals.
    (Its repair once the segment is sealed: ``test_live_repair_system.py``.)"""
    fleet = _s3_site(tmp_path, moto_endpoint, s3_bucket_name)
    g = fleet["north"]
    try:
        fleet.start()
        acked = _fill(g, "before")
        _ship_all_and_stop(g)
        _damage(_last_segment(g), "flip")
        fleet.proxies["north"].set_mode("blackhole")
        g.start()
        lanes = g.status()["lanes"]["lanes"]
        [lane] = [x for x in lanes if x.get("lost")]
        [loss] = lane["lost"]["losses"]
        assert loss["repairable"] is True
        assert not [x for x in lanes if x.get("repaired")]
        assert "were not rebuilt" in g.tail(200)
        served = _served(g.url)
        lost = {o for r in loss["ranges"] for o in range(r["first_offset"], r["last_offset"] + 1)}
        assert set(served) | lost == set(acked)
        assert all(served[o] == acked[o] for o in served)
        more = _produce(g.url, [_value("offline", i) for i in range(10)])
        assert min(more) == max(acked) + 1
        fleet.proxies["north"].set_mode("pass")
        wait_until(lambda: g.status()["shipper"]["pending_lsns"] == 0, 90, "shipped after")
    finally:
        fleet.close()


def test_sealed_objects_are_opened_with_the_gateways_key(tmp_path: Path) -> None:
    """With ``[encryption]`` the log's blocks are sealed: the repair opens them with the
    region's own key (the keyring the gateway loaded)."""
    key = tmp_path / "north-1.key"
    write_key_file(key, generate_key())
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    g = Gateway(
        "north",
        tmp_path,
        {"type": "local", "path": str(bucket)},
        [TopicSpec(TOPIC, "north", partitions=1)],
        {"journal": {"segment_bytes": "64KiB"}, "encryption": {"key_file": str(key)}},
    )
    try:
        g.start()
        assert g.status()["encryption"]["enabled"]
        acked = _fill(g, "sealed")
        _ship_all_and_stop(g)
        _damage(_last_segment(g), "zero-page")
        g.start()
        assert _served(g.url) == acked
        assert len(_repaired(g)["repairs"]) == 1  # type: ignore[arg-type]
    finally:
        g.kill()


def test_a_sealed_segment_rescanned_at_start_is_repaired(tmp_path: Path) -> None:
    """The operator's way for damage the scrub or a read found in a sealed entry log:
    stop, delete its index file, start. The open scans it and rebuilds the damage;
    the entries after the damage in the next segment bound the lost offsets."""
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    g = Gateway(
        "north",
        tmp_path,
        {"type": "local", "path": str(bucket)},
        [TopicSpec(TOPIC, "north", partitions=1)],
        {"journal": {"segment_bytes": "64KiB", "at_rest": "off"}},
    )
    try:
        g.start()
        acked = _fill(g, "sealed")
        _ship_all_and_stop(g)
        sealed = min((g.data_dir / "journal").glob("*.wal"))
        assert sealed != _last_segment(g)
        _damage(sealed, "zero-page")
        before = run_edgegw("journal", "verify", "--config", g.config)
        assert before.returncode == 1, before.stdout
        sealed.with_suffix(".idx").unlink()
        g.start()
        assert _served(g.url) == acked
        [one] = _repaired(g)["repairs"]  # type: ignore[misc]
        assert one["segment"] == int(sealed.stem)
        assert g.stop() == 0
        after = run_edgegw("journal", "verify", "--config", g.config)
        assert after.returncode == 0, after.stdout
    finally:
        g.kill()
