"""A damaged sealed segment is repaired from the bucket while the gateway runs (issue 45, item 3).

With real processes: ``edgegw serve`` with a local bucket, a producer
producing throughout. Once the journal has shipped a few sealed segments, a
byte of one of them is flipped on disk under the running gateway (an entry
log with ``at_rest = "off"``, a compressed segment with the default). Then:

* a read of the damaged range answers ``503 repair_pending`` with
  ``Retry-After`` (never ``500``), or the data once it is repaired;
* the repair is found by a read, or by the scrub alone (no read until it is
  done), rebuilt from the region's log objects and swapped in; every
  acknowledged record reads back bit for bit, and produce goes on throughout;
* the repair is named (the WARNING, the lane's ``repaired`` block, the
  report in ``quarantine/``);
* a kill -9 at each step of the live repair, then a restart, loses nothing.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest
from _serve import Gateway, Producer, TopicSpec, check_acknowledged, wait_until

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))
from _cli_support import run_edgegw

from edge_gateway import failpoints
from edge_gateway.api.wire import BATCH_MEDIA_TYPE, NEXT_OFFSET_HEADER
from edge_gateway.format import atrest
from edge_gateway.format.batch import iter_batches

#: real gateways killed and restarted: handed out first on xdist workers (tests/conftest.py)
pytestmark = pytest.mark.slow

TOPIC = "t"


def _gateway(tmp_path: Path, *, at_rest: str, scrub: str) -> Gateway:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    return Gateway(
        "north",
        tmp_path,
        {"type": "local", "path": str(bucket)},
        [TopicSpec(TOPIC, "north", partitions=1)],
        {"journal": {"segment_bytes": "64KiB", "at_rest": at_rest, "scrub_interval": scrub}},
    )


def _sealed(g: Gateway) -> list[Path]:
    return sorted((g.data_dir / "journal").glob("*.wal"))[:-1]


def _shipped_through(g: Gateway) -> int:
    try:
        return int(json.loads((g.data_dir / "journal/shipper.json").read_text())["log_lsn"])
    except (OSError, ValueError, KeyError):
        return 0


def _compressed(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(atrest.MAGIC)) == atrest.MAGIC


def _ready_to_damage(g: Gateway, *, compressed: bool) -> Path:
    """The second sealed segment, once it is shipped (and compressed, if asked)."""

    def ready() -> bool:
        sealed = _sealed(g)
        if len(sealed) < 3:
            return False
        seg = sealed[1]
        end = int(sealed[2].stem) - 1
        return _shipped_through(g) >= end and (not compressed or _compressed(seg))

    wait_until(ready, 120, "three sealed segments, shipped")
    return _sealed(g)[1]


def _flip(path: Path) -> None:
    """One byte in the middle of the entries (of a compressed segment: of its middle
    frame, not its entry table or directory), written in place: the gateway runs on."""
    at = path.stat().st_size // 2
    if _compressed(path):
        frames = atrest.CompressedSegment(path.read_bytes()).directory.frames
        frame = frames[len(frames) // 2]
        at = frame.offset + frame.stored_length // 2
    with path.open("r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x5A]))


def _read_all(url: str) -> tuple[int, int]:
    """Read t/0 from offset 0 to its end: (records, 503 repair_pending answers met).

    Any other error (a 500 corrupt_data) fails.
    """
    offset = n = pending = 0
    with httpx.Client(base_url=url, timeout=30) as c:
        while True:
            r = c.get(
                f"/v1/topics/{TOPIC}/partitions/0/records",
                params={"offset": offset, "max_records": 5000, "max_bytes": 8 << 20},
                headers={"accept": BATCH_MEDIA_TYPE},
            )
            if r.status_code == 503:
                assert r.json()["error"]["code"] == "repair_pending", r.text
                assert int(r.headers["retry-after"]) >= 1
                pending += 1
                time.sleep(0.2)
                continue
            assert r.status_code == 200, r.text
            next_offset = int(r.headers[NEXT_OFFSET_HEADER])
            for batch in iter_batches(r.content, where=f"{TOPIC}/0@{offset}"):
                n += sum(1 for rec in batch.records() if offset <= rec.offset < next_offset)
            if next_offset <= offset:
                return n, pending
            offset = next_offset


def _lane(g: Gateway) -> dict[str, object]:
    [lane] = [x for x in g.status()["lanes"]["lanes"] if x["lane"] == "normal"]
    return dict(lane)


def _repaired(g: Gateway) -> list[dict[str, object]]:
    lane = _lane(g)
    block = lane.get("repaired")
    return list(block["repairs"]) if isinstance(block, dict) else []


@pytest.mark.parametrize(
    ("at_rest", "found_by"), [("off", "read"), ("compressed", "scrub")], ids=["wal", "egwc"]
)
def test_a_damaged_sealed_segment_is_repaired_while_producing(
    tmp_path: Path, at_rest: str, found_by: str
) -> None:
    g = _gateway(tmp_path, at_rest=at_rest, scrub="2s")
    producer: Producer | None = None
    try:
        g.start()
        producer = Producer(g.url, TOPIC, 1, pause=0.002)
        producer.start()
        seg = _ready_to_damage(g, compressed=at_rest == "compressed")
        _flip(seg)
        if found_by == "read":
            n, _ = _read_all(g.url)  # 503 repair_pending until it is repaired, then the data
            assert n > 0
        wait_until(lambda: bool(_repaired(g)), 90, "the live repair")
        [one] = _repaired(g)
        assert one["segment"] == int(seg.stem)
        assert "repaired from the bucket" in g.tail(400)
        assert (g.data_dir / str(one["copy"])).exists()
        reports = list((g.data_dir / "quarantine").glob("*-report.json"))
        assert [json.loads(r.read_text())["repaired"] for r in reports] == [True]
        live = _lane(g)["live_repair"]
        assert isinstance(live, dict)
        assert live["segments_repaired"] == 1
        assert live["pending"] == []
        assert "lost" not in _lane(g)
        metrics = httpx.get(f"{g.url}/metrics", timeout=10).text
        assert 'edgegw_journal_repaired_ranges_total{lane="normal"} 1.0' in metrics
        out = run_edgegw("status", "--config", g.config)
        assert out.returncode == 0, out.stderr
        assert "1 segments repaired while running" in out.stdout, out.stdout
        if at_rest == "compressed":  # the rewriter compresses it again
            wait_until(lambda: _compressed(seg), 60, "compressed again")
        time.sleep(0.5)  # produce goes on after the repair
        producer.stop()
        assert producer.error is None, producer.error
        check_acknowledged(producer, g)  # every acknowledged record, bit for bit
        assert g.stop() == 0
        g.start()  # the next start finds it sound: nothing lost, nothing repaired again
        check_acknowledged(producer, g)
        assert len(_repaired(g)) == 1
        assert "lost" not in _lane(g)
    finally:
        if producer is not None and producer.is_alive():
            producer.stopping.set()
        g.kill()


@pytest.mark.parametrize("step", ["live_repair.prepared", "live_repair.renamed"])
def test_a_kill_during_the_live_repair_loses_nothing(tmp_path: Path, step: str) -> None:
    g = _gateway(tmp_path, at_rest="off", scrub="off")
    producer: Producer | None = None
    try:
        g.env = {failpoints.ENV: f"{step}=kill"}
        g.start()
        producer = Producer(g.url, TOPIC, 1, pause=0.002)
        producer.start()
        seg = _ready_to_damage(g, compressed=False)
        _flip(seg)
        # the read reports the damage; the repair's step kills the gateway
        with pytest.raises(httpx.HTTPError):
            _read_all(g.url)
        assert g.proc is not None
        assert g.proc.wait(timeout=60) == -9
        producer.stop()
        acked = dict(producer.acked)
        assert acked
        g.env = {}
        g.start()
        # killed before the rename: the segment is still damaged (the open loads it from its
        # index: reads find it and the live repair runs again); after it: sound
        n, pending = _read_all(g.url)
        assert n >= len(acked)
        assert (pending > 0) == (step == "live_repair.prepared")
        producer.error = None  # it ended on the killed gateway
        check_acknowledged(producer, g)
        assert len(_repaired(g)) == 1  # recorded once
        assert "lost" not in _lane(g)
        assert not list((g.data_dir / "journal").glob("*.r-tmp"))
    finally:
        if producer is not None and producer.is_alive():
            producer.stopping.set()
        g.kill()


def test_a_range_quarantined_with_the_bucket_away_is_repaired_when_it_returns(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    """Issue 45 step 2 on S3 behind a TCP proxy: the bucket is out of reach at the start,
    so the damage in the last segment is quarantined (``repairable: true``) and the site
    serves the rest; once the link heals and the segment is sealed, the live repair
    rebuilds the quarantined range: every acknowledged record is served again."""
    from test_journal_damage import _damage, _fill, _last_segment, _produce, _served, _value
    from test_journal_repair import _s3_site, _ship_all_and_stop

    fleet = _s3_site(tmp_path, moto_endpoint, s3_bucket_name)
    g = fleet["north"]
    try:
        fleet.start()
        acked = _fill(g, "before")
        _ship_all_and_stop(g)
        damaged = _last_segment(g)
        _damage(damaged, "flip")
        fleet.proxies["north"].set_mode("blackhole")
        g.start()
        [loss] = _lane(g)["lost"]["losses"]  # type: ignore[index]
        assert loss["repairable"] is True
        served = _served(g.url)
        assert len(served) < len(acked)  # the quarantined range is a gap for now
        fleet.proxies["north"].set_mode("pass")
        i = 0
        while _last_segment(g) == damaged:  # produce until the damaged segment is sealed
            acked |= _produce(g.url, [_value("after", 10 * i + k) for k in range(10)])
            i += 1
        wait_until(lambda: bool(_repaired(g)), 120, "the repair of the quarantined range")
        [one] = _repaired(g)
        assert (one["segment"], one["lsn_first"], one["lsn_last"]) == (
            loss["segment"],
            loss["lsn_first"],
            loss["lsn_last"],
        )
        assert _served(g.url) == acked  # every record, the quarantined ones too
        assert g.stop() == 0
        g.start()
        assert _served(g.url) == acked
        assert len(_repaired(g)) == 1
    finally:
        fleet.close()
