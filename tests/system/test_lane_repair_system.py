"""A damaged sealed segment of a priority lane is repaired from the bucket (issue 45 leftovers).

With real processes on moto's S3 server: ``edgegw serve`` with a topic of
priority ``critical`` (its own journal, ``journal-critical/``, shipped in the
same log objects as the normal lane's, its LSNs in their lane tables) and a
normal topic beside it, both produced throughout. Once the critical lane has
shipped a few sealed segments, a byte of one of them is flipped under the
running gateway. The scrub finds it; the gateway rebuilds the segment from
the log objects' critical-lane LSNs (the lane's own shipped watermark says
the bucket holds the whole segment) and swaps it in. Every acknowledged
record of both topics reads back bit for bit, nothing is reported lost, and
the repair is named in the critical lane's ``repaired`` block.

Then the same at a start: the lane's last segment damaged while the gateway
is stopped is rebuilt by the open (``shipper.json``'s ``sent`` mark of the
lane bounds what the bucket may hold; its objects give the rest).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from _serve import Fleet, Gateway, Producer, TopicSpec, check_acknowledged, wait_until

CRIT = "alarms"
NORMAL = "telemetry"


def _fleet(tmp_path: Path, moto_endpoint: str, bucket: str) -> Fleet:
    port = int(moto_endpoint.rsplit(":", 1)[1])
    topics = [
        TopicSpec(CRIT, "north", partitions=2, priority="critical"),
        TopicSpec(NORMAL, "north", partitions=1),
    ]
    sections = {"journal": {"segment_bytes": "64KiB", "at_rest": "off", "scrub_interval": "2s"}}
    return Fleet(tmp_path, ["north"], topics, s3=(port, bucket), sections=sections)


def _lane(g: Gateway, name: str) -> dict[str, object]:
    [lane] = [x for x in g.status()["lanes"]["lanes"] if x["lane"] == name]
    return dict(lane)


def _lane_dir(g: Gateway) -> Path:
    return g.data_dir / "journal-critical"


def _sealed(g: Gateway) -> list[Path]:
    return sorted(_lane_dir(g).glob("*.wal"))[:-1]


def _shipped(g: Gateway) -> int:
    return int(str(_lane(g, "critical")["shipped_lsn"]))


def _flip(path: Path) -> None:
    at = path.stat().st_size // 2
    with path.open("r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x5A]))


def _repairs(g: Gateway) -> list[dict[str, object]]:
    block = _lane(g, "critical").get("repaired")
    return list(block["repairs"]) if isinstance(block, dict) else []


def test_a_damaged_sealed_segment_of_a_priority_lane_is_repaired(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    fleet = _fleet(tmp_path, moto_endpoint, s3_bucket_name)
    g = fleet["north"]
    producers: list[Producer] = []
    try:
        fleet.start()
        producers = [
            Producer(g.url, CRIT, 2, pause=0.002, seed=1),
            Producer(g.url, NORMAL, 1, pause=0.01, seed=2),
        ]
        for p in producers:
            p.start()

        def ready() -> bool:
            sealed = _sealed(g)
            return len(sealed) >= 3 and _shipped(g) >= int(sealed[2].stem) - 1

        wait_until(ready, 120, "three sealed segments of the critical lane, shipped")
        seg = _sealed(g)[1]
        _flip(seg)
        wait_until(lambda: bool(_repairs(g)), 90, "the live repair of the critical lane")
        [one] = _repairs(g)
        assert one["segment"] == int(seg.stem)
        assert all(str(k).startswith("regions/north/log/") for k in one["objects"])  # type: ignore[attr-defined]
        assert {r["topic"] for r in one["ranges"]} == {CRIT}  # type: ignore[attr-defined,index]
        lane = _lane(g, "critical")
        assert "lost" not in lane
        live = lane["live_repair"]
        assert isinstance(live, dict)
        assert live["segments_repaired"] == 1
        assert "repaired from the bucket" in g.tail(400)
        metrics = httpx.get(f"{g.url}/metrics", timeout=10).text
        assert 'edgegw_journal_repaired_ranges_total{lane="critical"} 1.0' in metrics
        time.sleep(0.5)  # produce goes on after the repair
        for p in producers:
            p.stop()
            assert p.error is None, p.error
            check_acknowledged(p, g)  # every acknowledged record, bit for bit
        assert g.stop() == 0
        g.start()  # sound at the next start: nothing lost, nothing repaired again
        for p in producers:
            check_acknowledged(p, g)
        assert len(_repairs(g)) == 1
        assert "lost" not in _lane(g, "critical")
    finally:
        for p in producers:
            if p.is_alive():
                p.stopping.set()
        fleet.close()


def test_damage_in_a_priority_lanes_last_segment_is_repaired_at_start(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    fleet = _fleet(tmp_path, moto_endpoint, s3_bucket_name)
    g = fleet["north"]
    try:
        fleet.start()
        producer = Producer(g.url, CRIT, 2, pause=0.001, seed=3, limit=3000)
        producer.start()
        producer.join(120)
        assert producer.error is None, producer.error
        wait_until(lambda: g.status()["shipper"]["pending_lsns"] == 0, 60, "all shipped")
        next_lsn = int(str(_lane(g, "critical")["next_lsn"]))
        wait_until(lambda: _shipped(g) == next_lsn - 1, 60, "the lane shipped")
        assert g.stop() == 0
        state = json.loads((g.data_dir / "journal/shipper.json").read_text())
        assert int(state["sent"]["1"]) >= next_lsn - 1
        last = sorted(_lane_dir(g).glob("*.wal"))[-1]
        data = bytearray(last.read_bytes())
        end = len(data.rstrip(b"\0"))
        assert end > 8192, "the last segment holds too little to damage its middle"
        at = end // 2
        data[at : at + 4096] = bytes(4096)  # a page of zeros in the middle of the entries
        last.write_bytes(bytes(data))
        g.start()
        check_acknowledged(producer, g)
        [one] = _repairs(g)
        assert one["segment"] == int(last.stem)
        assert "lost" not in _lane(g, "critical")
    finally:
        fleet.close()


def test_a_priority_lanes_range_quarantined_at_start_is_repaired_later(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    """The bucket out of reach at the start: the damage in the lane's last segment is
    quarantined, ``repairable`` (the lane's ``sent`` mark covers it: the bucket may hold
    its records; it used to be ``null`` and never repaired). Once the link heals and the
    segment is sealed and shipped, the live repair rebuilds it from the lane's LSNs in
    the objects, and the loss reads "repaired later"."""
    fleet = _fleet(tmp_path, moto_endpoint, s3_bucket_name)
    g = fleet["north"]
    try:
        fleet.start()
        producer = Producer(g.url, CRIT, 2, pause=0.001, seed=4, limit=3000)
        producer.start()
        producer.join(120)
        assert producer.error is None, producer.error
        wait_until(lambda: g.status()["shipper"]["pending_lsns"] == 0, 60, "all shipped")
        next_lsn = int(str(_lane(g, "critical")["next_lsn"]))
        wait_until(lambda: _shipped(g) == next_lsn - 1, 60, "the lane shipped")
        assert g.stop() == 0
        last = sorted(_lane_dir(g).glob("*.wal"))[-1]
        data = bytearray(last.read_bytes())
        end = len(data.rstrip(b"\0"))
        assert end > 8192, "the last segment holds too little to damage its middle"
        data[end // 2 : end // 2 + 4096] = bytes(4096)
        last.write_bytes(bytes(data))
        fleet.proxies["north"].set_mode("blackhole")
        g.start()
        lost = _lane(g, "critical")["lost"]
        assert isinstance(lost, dict)
        [loss] = lost["losses"]
        assert loss["segment"] == int(last.stem)
        assert loss["repairable"] is True
        assert lost["lsns"] == loss["lsn_last"] - loss["lsn_first"] + 1
        assert "lost" not in _lane(g, "normal")

        fleet.proxies["north"].set_mode("pass")
        more = Producer(g.url, CRIT, 2, pause=0.001, seed=5)
        more.start()  # until the damaged segment is sealed
        wait_until(lambda: sorted(_lane_dir(g).glob("*.wal"))[-1] != last, 120, "a roll")
        more.stop()
        assert more.error is None, more.error

        def repaired() -> bool:
            x = _lane(g, "critical")["lost"]
            return isinstance(x, dict) and x["lsns"] == 0

        wait_until(repaired, 120, "the repair of the quarantined range")
        [one] = _repairs(g)
        assert (one["lsn_first"], one["lsn_last"]) == (loss["lsn_first"], loss["lsn_last"])
        check_acknowledged(producer, g)  # every record, bit for bit
        check_acknowledged(more, g)
        assert g.stop() == 0
        g.start()
        check_acknowledged(producer, g)
        x = _lane(g, "critical")["lost"]
        assert isinstance(x, dict)
        assert x["lsns"] == 0
    finally:
        fleet.close()
