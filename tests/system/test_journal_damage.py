"""Damage in the middle of the last journal segment is quarantined; the site serves (issue 45).

With real processes: ``edgegw serve`` with a local bucket. A site produces
records of ``t`` and stops; then the middle of its last journal segment is
damaged as an SD card does it: a flipped byte, a whole 4 KiB page of zeros,
or bytes cut out of the middle. Before, ``serve`` refused to start until a
person came. Now it starts:

* every intact record is served bit for bit, before and after the damage;
* the lost entries' offsets are reported exactly (the log's ERROR line,
  ``/v1/status``'s lane ``lost`` block, ``edgegw status``, the metrics and
  ``quarantine/*-report.json``), and the damaged segment's bytes are in
  ``quarantine/`` as they were;
* whether the bucket has them says ``repairable`` (shipped, or not: the
  shipper failing on every run through a fail point); a shipped range is
  rebuilt from the bucket instead (``test_journal_repair.py``), so here the
  bucket's log is out of reach for the repair (fail point ``repair.fetch``);
* new produce is taken at once, at offsets after every one handed out
  before (none reused), and shipped;
* a kill -9 at each step of the quarantine, then a restart, ends in the
  same state with the loss recorded once.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest
from _serve import Fleet, Gateway, TopicSpec, wait_mirrored, wait_until

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))
from _cli_support import run_edgegw

from edge_gateway import failpoints
from edge_gateway.api.wire import BATCH_MEDIA_TYPE, NEXT_OFFSET_HEADER
from edge_gateway.format.batch import iter_batches

TOPIC = "t"
VALUE_BYTES = 900
PAGE = 4096


def _gateway(tmp_path: Path) -> Gateway:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    return Gateway(
        "north",
        tmp_path,
        {"type": "local", "path": str(bucket)},
        [TopicSpec(TOPIC, "north", partitions=1)],
        {"journal": {"segment_bytes": "64KiB"}},
    )


def _value(tag: str, i: int) -> str:
    return f"{tag}-{i:06d}-".ljust(VALUE_BYTES, "x")


def _produce(url: str, values: list[str]) -> dict[int, str]:
    r = httpx.post(
        f"{url}/v1/topics/{TOPIC}/records",
        json={"records": [{"value": v} for v in values]},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return {o["offset"]: v for v, o in zip(values, r.json()["offsets"], strict=True)}


def _served(url: str, topic: str = TOPIC) -> dict[int, str]:
    """Every record of t/0 the gateway serves (offsets may jump: a gap), offset -> value."""
    out: dict[int, str] = {}
    offset = 0
    with httpx.Client(base_url=url, timeout=30) as c:
        while True:
            r = c.get(
                f"/v1/topics/{topic}/partitions/0/records",
                params={"offset": offset, "max_records": 5000, "max_bytes": 8 << 20},
                headers={"accept": BATCH_MEDIA_TYPE},
            )
            assert r.status_code == 200, r.text
            next_offset = int(r.headers[NEXT_OFFSET_HEADER])
            for batch in iter_batches(r.content, where=f"{topic}/0@{offset}"):
                for rec in batch.records():
                    if offset <= rec.offset < next_offset:
                        assert rec.offset not in out, f"offset {rec.offset} served twice"
                        out[rec.offset] = bytes(rec.value or b"").decode()
            if next_offset <= offset:
                return out
            offset = next_offset


def _last_segment(g: Gateway) -> Path:
    return max((g.data_dir / "journal").glob("*.wal"))


def _damage(segment: Path, how: str) -> None:
    """Damage the middle of the segment's data (its preallocated zero tail aside)."""
    data = bytearray(segment.read_bytes())
    end = len(data.rstrip(b"\0"))
    assert end > 6 * PAGE, f"the last segment holds only {end} bytes"
    middle = end // 2
    if how == "flip":
        data[middle] ^= 0xFF
    elif how == "zero-page":
        at = middle // PAGE * PAGE
        data[at : at + PAGE] = bytes(PAGE)
    else:  # cut: 3000 bytes out of the middle, the rest moves up
        del data[middle : middle + 3000]
    segment.write_bytes(bytes(data))


def _metric(text: str, name: str, labels: str) -> float:
    m = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    assert m, f"no {name}{labels} in the metrics"
    return float(m.group(1))


def _fill(g: Gateway, tag: str) -> dict[int, str]:
    """Produce until the journal has rolled and its last segment holds > 6 pages."""
    acked: dict[int, str] = {}
    i = 0
    while True:
        acked |= _produce(g.url, [_value(tag, 10 * i + j) for j in range(10)])
        i += 1
        seg = _last_segment(g)
        if i >= 10 and len(seg.read_bytes().rstrip(b"\0")) > 7 * PAGE:
            return acked


@pytest.mark.parametrize("shipped", [True, False], ids=["shipped", "unshipped"])
@pytest.mark.parametrize("how", ["flip", "zero-page", "cut"])
def test_damage_in_the_last_segment_is_quarantined_and_the_site_serves(
    tmp_path: Path, how: str, *, shipped: bool
) -> None:
    g = _gateway(tmp_path)
    if not shipped:
        g.env = {failpoints.ENV: "shipper.loop=1000000"}
    no_repair = {failpoints.ENV: "repair.fetch=1000"}
    try:
        g.start()
        acked = _fill(g, "before")
        if shipped:
            wait_until(lambda: g.status()["shipper"]["pending_lsns"] == 0, 60, "all shipped")
            state = g.data_dir / "journal/shipper.json"
            next_lsn = g.status()["journal"]["next_lsn"]
            wait_until(
                lambda: json.loads(state.read_text())["log_lsn"] == next_lsn - 1, 60, "a manifest"
            )
            assert g.stop() == 0
        else:
            assert g.status()["shipper"]["pending_lsns"] > 0
            g.kill()  # a graceful stop would ship what it can on the way out
        segment = _last_segment(g)
        _damage(segment, how)

        g.env = no_repair
        g.start()
        lanes = g.status()["lanes"]["lanes"]
        [lane] = [x for x in lanes if x.get("lost")]
        [loss] = lane["lost"]["losses"]
        [lost] = [r for r in loss["ranges"] if r["records"]]
        assert (lost["topic"], lost["partition"], lost["exact"]) == (TOPIC, 0, True)
        lost_offsets = set(range(lost["first_offset"], lost["last_offset"] + 1))
        assert loss["repairable"] is shipped
        # every intact record, bit for bit; the lost ones are exactly the ones named
        served = _served(g.url)
        assert set(served) | lost_offsets == set(acked)
        assert not set(served) & lost_offsets
        assert all(served[o] == acked[o] for o in served)
        assert lost_offsets, "the damage must have cost records"
        assert max(lost_offsets) < max(acked), "the damage must be in the middle"
        # reported: the log, the report file, the copy, the metrics, edgegw status
        log = g.tail(200)
        assert f"t/0 {lost['first_offset']}-{lost['last_offset']}" in log, log
        assert "quarantined to" in log
        [report] = (g.data_dir / "quarantine").glob("*-report.json")
        doc = json.loads(report.read_text())
        assert doc["ranges"] == loss["ranges"]
        assert (g.data_dir / loss["copy"]).stat().st_size > 0
        metrics = httpx.get(f"{g.url}/metrics", timeout=10).text
        lost_n = len(lost_offsets)
        assert _metric(
            metrics, "edgegw_journal_lost_records_total", '{lane="normal",topic="t"}'
        ) == (lost_n)
        out = run_edgegw("status", "--config", g.config)
        assert out.returncode == 0, out.stderr
        assert f"t/0 {lost['first_offset']}-{lost['last_offset']}" in out.stdout, out.stdout
        # new produce is taken at once, after every offset handed out before, and shipped
        more = _produce(g.url, [_value("after", i) for i in range(10)])
        assert min(more) == max(acked) + 1
        wait_until(lambda: g.status()["shipper"]["pending_lsns"] == 0, 60, "shipped after")
        assert g.status()["shipper"]["last_error"] is None
        assert g.stop() == 0
        g.start()  # the next start: nothing more lost, the same record
        assert [x["lost"]["losses"] for x in g.status()["lanes"]["lanes"] if x.get("lost")] == [
            [loss]
        ]
        assert _served(g.url) == served | more
        assert g.stop() == 0
        done = run_edgegw("journal", "verify", "--config", g.config)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        g.kill()


@pytest.mark.parametrize("step", ["quarantine.copied", "quarantine.recorded"])
def test_a_kill_during_the_quarantine_ends_in_the_same_state(tmp_path: Path, step: str) -> None:
    g = _gateway(tmp_path)
    try:
        g.start()
        acked = _fill(g, "before")
        assert g.stop() == 0
        _damage(_last_segment(g), "flip")
        # shipped (a graceful stop): the bucket's log kept out of the repair's reach
        g.env = {failpoints.ENV: f"{step}=kill,repair.fetch=1000"}
        g.spawn()
        assert g.proc is not None
        assert g.proc.wait(timeout=60) == -9
        g.env = {failpoints.ENV: "repair.fetch=1000"}
        g.start()
        [loss] = [x["lost"] for x in g.status()["lanes"]["lanes"] if x.get("lost")]
        assert len(loss["losses"]) == 1  # recorded once, whatever the kill
        [lost] = [r for r in loss["losses"][0]["ranges"] if r["records"]]
        lost_offsets = set(range(lost["first_offset"], lost["last_offset"] + 1))
        served = _served(g.url)
        assert set(served) | lost_offsets == set(acked)
        assert all(served[o] == acked[o] for o in served)
        assert g.stop() == 0
    finally:
        g.kill()


def test_verify_reports_a_quarantined_segment_as_sound(tmp_path: Path) -> None:
    """`edgegw journal verify` names damage before the start, and none after it."""
    g = _gateway(tmp_path)
    try:
        g.start()
        _fill(g, "before")
        assert g.stop() == 0
        _damage(_last_segment(g), "zero-page")
        before = run_edgegw("journal", "verify", "--config", g.config)
        assert before.returncode != 0
        g.start()
        assert g.stop() == 0
        after = run_edgegw("journal", "verify", "--config", g.config)
        assert after.returncode == 0, after.stdout
    finally:
        g.kill()


def test_a_mirror_sees_the_lost_range_as_a_gap(tmp_path: Path) -> None:
    """The unshipped lost range reaches the mirror as a gap marker: it mirrors every
    record the source still serves, and its offsets continue after the gap."""
    spec = TopicSpec(TOPIC, "a", partitions=1, subscribers=("b",))
    fleet = Fleet(tmp_path, ["a", "b"], [spec], sections={"journal": {"segment_bytes": "64KiB"}})
    a, b = fleet["a"], fleet["b"]
    a.env = {failpoints.ENV: "shipper.loop=1000000"}
    try:
        fleet.start()
        acked = _fill(a, "before")
        assert a.status()["shipper"]["pending_lsns"] > 0
        a.kill()
        _damage(_last_segment(a), "zero-page")
        a.env = {}
        a.start()
        served = _served(a.url)
        assert len(served) < len(acked)
        more = _produce(a.url, [_value("after", i) for i in range(10)])
        wait_until(lambda: a.status()["shipper"]["pending_lsns"] == 0, 60, "a to ship")
        wait_mirrored(a, TOPIC, b)  # past the gap: its offsets continue after it
        assert _served(b.url, f"a.{TOPIC}") == served | more
    finally:
        fleet.close()


def test_damage_in_a_mirror_topic_is_quarantined_and_the_mirror_goes_on(tmp_path: Path) -> None:
    """Mirror entries lost on the mirroring site, the source's log out of the repair's
    reach: the mirror starts, serves every intact record of the source bit for bit,
    names the lost offsets, and keeps mirroring. (Re-fetched when the source's log
    answers: ``test_mirror_repair_system.py``.)"""
    spec = TopicSpec(TOPIC, "a", partitions=1, subscribers=("b",))
    fleet = Fleet(tmp_path, ["a", "b"], [spec], sections={"journal": {"segment_bytes": "64KiB"}})
    a, b = fleet["a"], fleet["b"]
    try:
        fleet.start()
        acked: dict[int, str] = {}
        for i in range(1000):
            acked |= _produce(a.url, [_value("m", 10 * i + j) for j in range(10)])
            if i % 10 == 9:
                wait_until(lambda: a.status()["shipper"]["pending_lsns"] == 0, 60, "a ships")
                wait_mirrored(a, TOPIC, b)
                if i > 20 and len(_last_segment(b).read_bytes().rstrip(b"\0")) > 7 * PAGE:
                    break
        assert b.stop() == 0
        _damage(_last_segment(b), "flip")
        b.env = {failpoints.ENV: "repair.fetch=1000"}
        b.start()
        [lost_doc] = [x["lost"] for x in b.status()["lanes"]["lanes"] if x.get("lost")]
        lost = {
            o
            for loss in lost_doc["losses"]
            for r in loss["ranges"]
            for o in range(r["first_offset"], r["last_offset"] + 1)
        }
        assert lost, lost_doc
        assert all(x["repairable"] is True for x in lost_doc["losses"])  # the source has them
        served = _served(b.url, f"a.{TOPIC}")
        assert set(served) | lost == set(acked)
        assert all(served[o] == acked[o] for o in served)
        more = _produce(a.url, [_value("after", i) for i in range(10)])
        wait_until(lambda: a.status()["shipper"]["pending_lsns"] == 0, 60, "a ships")
        wait_mirrored(a, TOPIC, b)
        assert _served(b.url, f"a.{TOPIC}") == served | more
    finally:
        fleet.close()
