"""Damaged mirror entries are re-fetched from the source region's log (issue 45, item 3).

Real processes on moto's S3 server: region ``a`` homes ``t`` (1 partition),
region ``b`` mirrors it (``a.t``, blocks kept as fetched: the default). The
mirror's journal on ``b`` is damaged as an SD card does it -- a flipped
byte, a 4 KiB page of zeros -- in its last segment (found by the next
start's scan) and in a sealed segment while ``b`` runs (an entry log, and a
compressed one found by the scrub). Then:

* the damaged mirror entries are rebuilt from ``regions/a/log/...`` (the
  objects the entries' source coordinates name), sealed objects opened with
  the keys ``b``'s tailer uses; every record of ``a.t`` reads back bit for
  bit, nothing is reported lost, the repair is named (``repaired`` block,
  report, WARNING);
* produce on ``a`` and mirroring to ``b`` go on;
* a kill -9 at each step of the repair, then a restart, loses nothing;
* a source object that ``a``'s GC collected cannot be fetched: the range is
  quarantined and reported lost (``repairable: true``), the lost offsets
  exactly those of the damaged entries.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from _serve import Fleet, Gateway, TopicSpec, wait_mirrored, wait_until
from test_journal_damage import PAGE, _damage, _produce, _value
from test_live_repair_system import _compressed, _flip

from edge_gateway import failpoints
from edge_gateway.api.wire import BATCH_MEDIA_TYPE, NEXT_OFFSET_HEADER
from edge_gateway.encryption import write_key_file
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import iter_batches
from edge_gateway.format.crypt import generate_key
from edge_gateway.format.manifest import log_key
from edge_gateway.testing.moto import s3_client

#: real gateways killed and restarted: handed out first on xdist workers (tests/conftest.py)
pytestmark = pytest.mark.slow

TOPIC = "t"
MIRROR = f"a.{TOPIC}"


def _fleet(
    tmp_path: Path,
    moto_endpoint: str,
    bucket: str,
    *,
    at_rest: str = "compressed",
    scrub: str = "24h",
    sealed: bool = False,
) -> Fleet:
    port = int(moto_endpoint.rsplit(":", 1)[1])
    spec = TopicSpec(TOPIC, "a", partitions=1, subscribers=("b",))
    journal = {"segment_bytes": "64KiB", "at_rest": at_rest, "scrub_interval": scrub}
    per_region: dict[str, dict[str, object]] = {}
    if sealed:
        key = tmp_path / "a-1.key"
        write_key_file(key, generate_key())
        per_region = {
            "a": {"encryption": {"key_file": str(key)}},
            "b": {"encryption.sources.a": {"key_files": [str(key)]}},
        }
    return Fleet(
        tmp_path,
        ["a", "b"],
        [spec],
        s3=(port, bucket),
        sections={"journal": journal},
        per_region=per_region,
    )


def _journal(g: Gateway) -> Path:
    return g.data_dir / "journal"


def _last_segment(g: Gateway) -> Path:
    return max(_journal(g).glob("*.wal"))


def _sealed(g: Gateway) -> list[Path]:
    return sorted(_journal(g).glob("*.wal"))[:-1]


def _mirror_until(a: Gateway, b: Gateway, done: object) -> dict[int, str]:
    """Produce to ``a`` in rounds, every tenth waiting until ``b`` mirrored it all, until
    ``done()``; the acknowledged records, offset -> value."""
    assert callable(done)
    acked: dict[int, str] = {}
    for i in range(3000):
        acked |= _produce(a.url, [_value("m", 10 * i + j) for j in range(10)])
        if i % 10 == 9:
            wait_until(lambda: a.status()["shipper"]["pending_lsns"] == 0, 60, "a ships")
            wait_mirrored(a, TOPIC, b)
            if i > 20 and done():
                return acked
    raise AssertionError("never ready")


def _served(url: str) -> dict[int, str]:
    """Every record of a.t/0 the gateway serves, offset -> value (waiting out
    ``503 repair_pending``; any other error fails)."""
    out: dict[int, str] = {}
    offset = 0
    with httpx.Client(base_url=url, timeout=30) as c:
        while True:
            r = c.get(
                f"/v1/topics/{MIRROR}/partitions/0/records",
                params={"offset": offset, "max_records": 5000, "max_bytes": 8 << 20},
                headers={"accept": BATCH_MEDIA_TYPE},
            )
            if r.status_code == 503:
                assert r.json()["error"]["code"] == "repair_pending", r.text
                time.sleep(0.2)
                continue
            assert r.status_code == 200, r.text
            next_offset = int(r.headers[NEXT_OFFSET_HEADER])
            for batch in iter_batches(r.content, where=f"{MIRROR}/0@{offset}"):
                for rec in batch.records():
                    if offset <= rec.offset < next_offset:
                        assert rec.offset not in out, f"offset {rec.offset} served twice"
                        out[rec.offset] = bytes(rec.value or b"").decode()
            if next_offset <= offset:
                return out
            offset = next_offset


def _lane(g: Gateway) -> dict[str, object]:
    [lane] = [x for x in g.status()["lanes"]["lanes"] if x["lane"] == "normal"]
    return dict(lane)


def _repairs(g: Gateway) -> list[dict[str, object]]:
    block = _lane(g).get("repaired")
    return list(block["repairs"]) if isinstance(block, dict) else []


def _entries(data: bytes) -> list[tuple[int, atrest.AnyEntry]]:
    out = []
    pos = fentry.SEGMENT_HEADER_SIZE
    while pos < len(data) and not fentry.is_zero_tail(data, pos):
        e = atrest.decode_any_entry(data, pos)
        out.append((pos, e))
        pos += e.length
    return out


def _hit(before: bytes, after: bytes) -> list[atrest.AnyEntry]:
    """The entries of a segment whose bytes the damage changed."""
    return [
        e
        for pos, e in _entries(before)
        if before[pos : pos + e.length] != after[pos : pos + e.length]
    ]


def _check_mirror_goes_on(a: Gateway, b: Gateway, acked: dict[int, str]) -> dict[int, str]:
    more = _produce(a.url, [_value("after", i) for i in range(10)])
    wait_until(lambda: a.status()["shipper"]["pending_lsns"] == 0, 60, "a ships")
    wait_mirrored(a, TOPIC, b)
    acked = acked | more
    assert _served(b.url) == acked
    return acked


@pytest.mark.parametrize(
    ("how", "sealed"),
    [("flip", False), ("zero-page", False), ("zero-page", True)],
    ids=["flip", "zero-page", "zero-page-sealed-objects"],
)
def test_damaged_mirror_entries_in_the_last_segment_are_refetched_at_start(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str, how: str, sealed: bool
) -> None:
    fleet = _fleet(tmp_path, moto_endpoint, s3_bucket_name, sealed=sealed)
    a, b = fleet["a"], fleet["b"]
    try:
        fleet.start()
        if sealed:
            assert a.status()["encryption"]["enabled"]
        acked = _mirror_until(
            a, b, lambda: len(_last_segment(b).read_bytes().rstrip(b"\0")) > 7 * PAGE
        )
        assert b.stop() == 0
        segment = _last_segment(b)
        intact = segment.read_bytes()
        _damage(segment, how)
        hit = _hit(intact, segment.read_bytes())
        assert hit
        assert all(isinstance(e, atrest.BlockEntry) for e in hit)  # mirror entries, kept whole
        b.start()
        assert _served(b.url) == acked  # every record, bit for bit, at its offset
        lane = _lane(b)
        assert "lost" not in lane, lane
        [one] = _repairs(b)
        seqs = sorted({e.source.seq for e in hit})
        assert set(one["objects"]) >= {log_key("", "a", s) for s in seqs}  # type: ignore[arg-type]
        assert all(str(k).startswith("regions/a/log/") for k in one["objects"])  # type: ignore[attr-defined]
        [r] = one["ranges"]  # type: ignore[misc]
        assert (r["topic"], r["partition"]) == (MIRROR, 0)
        assert "repaired from the bucket" in b.tail(400)
        [report] = (b.data_dir / "quarantine").glob("*-report.json")
        assert json.loads(report.read_text())["repaired"] is True
        _check_mirror_goes_on(a, b, acked)
    finally:
        fleet.close()


@pytest.mark.parametrize(
    ("at_rest", "found_by"), [("off", "read"), ("compressed", "scrub")], ids=["wal", "egwc"]
)
def test_a_damaged_sealed_mirror_segment_is_refetched_while_running(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str, at_rest: str, found_by: str
) -> None:
    fleet = _fleet(tmp_path, moto_endpoint, s3_bucket_name, at_rest=at_rest, scrub="2s")
    a, b = fleet["a"], fleet["b"]

    def ready() -> bool:
        # b ships nothing of its own (mirror entries only): its segments are repaired from
        # a's log whatever its shipper.json says
        sealed = _sealed(b)
        return len(sealed) >= 3 and (at_rest != "compressed" or _compressed(sealed[1]))

    try:
        fleet.start()
        acked = _mirror_until(a, b, ready)
        seg = _sealed(b)[1]
        _flip(seg)
        if found_by == "read":
            assert _served(b.url) == acked  # 503 repair_pending, then the data
        wait_until(lambda: bool(_repairs(b)), 90, "the live repair")
        [one] = _repairs(b)
        assert one["segment"] == int(seg.stem)
        assert all(str(k).startswith("regions/a/log/") for k in one["objects"])  # type: ignore[attr-defined]
        live = _lane(b)["live_repair"]
        assert isinstance(live, dict)
        assert (live["segments_repaired"], live["pending"], live["failures"]) == (1, [], 0)
        assert "lost" not in _lane(b)
        assert _served(b.url) == acked
        if at_rest == "compressed":  # the rewriter compresses it again
            wait_until(lambda: _compressed(seg), 60, "compressed again")
        acked = _check_mirror_goes_on(a, b, acked)
        assert b.stop() == 0
        b.start()  # sound: nothing repaired again, nothing lost
        assert _served(b.url) == acked
        assert len(_repairs(b)) == 1
        assert "lost" not in _lane(b)
    finally:
        fleet.close()


@pytest.mark.parametrize("step", ["repair.copied", "repair.recorded"])
def test_a_kill_during_the_mirror_repair_loses_nothing(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str, step: str
) -> None:
    fleet = _fleet(tmp_path, moto_endpoint, s3_bucket_name)
    a, b = fleet["a"], fleet["b"]
    try:
        fleet.start()
        acked = _mirror_until(
            a, b, lambda: len(_last_segment(b).read_bytes().rstrip(b"\0")) > 7 * PAGE
        )
        assert b.stop() == 0
        _damage(_last_segment(b), "zero-page")
        b.env = {failpoints.ENV: f"{step}=kill"}
        b.spawn()
        assert b.proc is not None
        assert b.proc.wait(timeout=60) == -9
        b.env = {}
        b.start()
        assert _served(b.url) == acked
        assert len(_repairs(b)) == 1  # recorded once
        assert "lost" not in _lane(b)
        _check_mirror_goes_on(a, b, acked)
    finally:
        fleet.close()


def test_a_source_object_already_collected_is_reported_lost_exactly(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    fleet = _fleet(tmp_path, moto_endpoint, s3_bucket_name)
    a, b = fleet["a"], fleet["b"]
    try:
        fleet.start()
        acked = _mirror_until(
            a, b, lambda: len(_last_segment(b).read_bytes().rstrip(b"\0")) > 7 * PAGE
        )
        assert b.stop() == 0
        segment = _last_segment(b)
        intact = segment.read_bytes()
        _damage(segment, "zero-page")
        hit = _hit(intact, segment.read_bytes())
        assert hit
        # a's GC took the objects the damaged entries came from
        s3 = s3_client(moto_endpoint)
        for seq in sorted({e.source.seq for e in hit}):
            s3.delete_object(Bucket=s3_bucket_name, Key=log_key("", "a", seq))
        b.start()
        lane = _lane(b)
        assert "repaired" not in lane, lane
        [loss] = lane["lost"]["losses"]  # type: ignore[index]
        assert loss["repairable"] is True
        lost = {
            o
            for r in loss["ranges"]
            for o in range(r["first_offset"], r["last_offset"] + 1)
            if r["topic"] == MIRROR
        }
        want = {
            o
            for e in hit
            if isinstance(e, atrest.BlockEntry)
            for o in range(e.first_offset, e.next_offset)
        }
        assert lost == want  # exactly the damaged entries' offsets
        assert all(r["exact"] for r in loss["ranges"] if r["records"])
        assert "were not rebuilt" in b.tail(400)
        served = _served(b.url)
        assert set(served) | lost == set(acked)
        assert all(served[o] == acked[o] for o in served)
        more = _produce(a.url, [_value("after", i) for i in range(10)])
        wait_until(lambda: a.status()["shipper"]["pending_lsns"] == 0, 60, "a ships")
        wait_mirrored(a, TOPIC, b)
        assert _served(b.url) == served | more
    finally:
        fleet.close()


def test_a_range_quarantined_with_the_source_away_is_refetched_once_sealed(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    """The source's log out of reach at the start (once: fail point ``repair.fetch=1``):
    the damage is quarantined (``repairable: true``), the rest served; once the segment
    is sealed the live repair re-fetches the quarantined range from ``a``'s log, and every
    record of ``a.t`` is served again."""
    fleet = _fleet(tmp_path, moto_endpoint, s3_bucket_name)
    a, b = fleet["a"], fleet["b"]
    try:
        fleet.start()
        acked = _mirror_until(
            a, b, lambda: len(_last_segment(b).read_bytes().rstrip(b"\0")) > 7 * PAGE
        )
        assert b.stop() == 0
        damaged = _last_segment(b)
        _damage(damaged, "flip")
        b.env = {failpoints.ENV: "repair.fetch=1"}
        b.start()
        [loss] = _lane(b)["lost"]["losses"]  # type: ignore[index]
        assert loss["repairable"] is True
        assert len(_served(b.url)) < len(acked)  # a gap for now
        i = 0
        while _last_segment(b) == damaged:  # until the damaged segment is sealed
            acked |= _produce(a.url, [_value("after", 10 * i + k) for k in range(10)])
            i += 1
            if i % 10 == 0:
                wait_mirrored(a, TOPIC, b)
        wait_mirrored(a, TOPIC, b)
        wait_until(lambda: bool(_repairs(b)), 120, "the repair of the quarantined range")
        [one] = _repairs(b)
        assert (one["segment"], one["lsn_first"], one["lsn_last"]) == (
            loss["segment"],
            loss["lsn_first"],
            loss["lsn_last"],
        )
        assert _served(b.url) == acked  # the quarantined records too
        b.env = {}
        assert b.stop() == 0
        b.start()
        assert _served(b.url) == acked
        assert len(_repairs(b)) == 1
        _check_mirror_goes_on(a, b, acked)
    finally:
        fleet.close()


@pytest.mark.parametrize("step", ["live_repair.prepared", "live_repair.renamed"])
def test_a_kill_during_the_live_mirror_repair_loses_nothing(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str, step: str
) -> None:
    fleet = _fleet(tmp_path, moto_endpoint, s3_bucket_name, at_rest="off", scrub="off")
    a, b = fleet["a"], fleet["b"]
    try:
        b.env = {failpoints.ENV: f"{step}=kill"}
        fleet.start()
        acked = _mirror_until(a, b, lambda: len(_sealed(b)) >= 3)
        _flip(_sealed(b)[1])
        # the read reports the damage; the repair's step kills the gateway
        with pytest.raises(httpx.HTTPError):
            _served(b.url)
        assert b.proc is not None
        assert b.proc.wait(timeout=60) == -9
        b.env = {}
        b.start()
        # killed before the rename: still damaged (a read finds it, the repair runs
        # again); after it: sound
        assert _served(b.url) == acked
        live = _lane(b).get("live_repair")
        assert not live or not live["pending"]  # type: ignore[index]
        assert len(_repairs(b)) == 1  # recorded once
        assert "lost" not in _lane(b)
        assert not list(_journal(b).glob("*.r-tmp"))
        _check_mirror_goes_on(a, b, acked)
    finally:
        fleet.close()
