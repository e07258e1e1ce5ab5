"""A compressed segment that does not open, with the bucket out of reach: the site starts.

Issue 45: "if the bucket is unreachable, the gateway starts serving new
produce and the undamaged ranges, and repairs when the bucket returns." With
real processes: ``edgegw serve`` on moto's S3 server behind a TCP proxy,
``journal.at_rest = "compressed"`` and small segments. Three segments are
sealed, shipped and compressed; the gateway stops; one byte of the second
segment's trailer (or of a topic's name in its directory) is flipped; the
link is cut and the gateway started. It starts (it used to stop: the open
could not read the segment), the segment's entries after its checkpoint are
reported lost with exact offsets (``repairable``), the rest is served and
new produce is taken. Once the link heals the live repair rebuilds the range
from the region's log: every acknowledged record reads back exactly, the
loss reads "repaired later", and a restart says the same.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from _serve import Fleet, Gateway, TopicSpec, wait_until
from test_journal_damage import _served
from test_journal_repair import _ship_all_and_stop

from edge_gateway import failpoints
from edge_gateway.format import atrest

TOPIC = "t"
VALUE_BYTES = 4096
_DIR_FIXED = 48  # the directory's fixed fields (docs/at-rest.md, "Directory")


def _site(tmp_path: Path, moto_endpoint: str, s3_bucket_name: str) -> Fleet:
    port = int(moto_endpoint.rsplit(":", 1)[1])
    spec = TopicSpec(TOPIC, "north", partitions=1)
    sections = {"journal": {"segment_bytes": "256KiB", "at_rest": "compressed"}}
    return Fleet(tmp_path, ["north"], [spec], s3=(port, s3_bucket_name), sections=sections)


def _produce(url: str, first: int, n: int) -> dict[int, str]:
    values = [f"{i:08d}-".ljust(VALUE_BYTES, "abcdefgh"[i % 8]) for i in range(first, first + n)]
    r = httpx.post(
        f"{url}/v1/topics/{TOPIC}/records",
        json={"records": [{"value": v} for v in values]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return {o["offset"]: v for v, o in zip(values, r.json()["offsets"], strict=True)}


def _sealed(g: Gateway) -> list[Path]:
    return sorted((g.data_dir / "journal").glob("*.wal"))[:-1]


def _compressed(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(atrest.MAGIC)) == atrest.MAGIC


def _lane(g: Gateway) -> dict[str, object]:
    [lane] = [x for x in g.status()["lanes"]["lanes"] if x["lane"] == "normal"]
    return dict(lane)


def _flip(seg: Path, where: str) -> None:
    data = seg.read_bytes()
    if where == "trailer":  # its magic
        at = len(data) - 2
    else:  # the first character of the topic's name in the directory
        d = atrest.CompressedSegment(data).directory
        last = d.chunks[-1]
        at = last.meta_offset + last.meta_stored + _DIR_FIXED + 2
    with seg.open("r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0x01]))


@pytest.mark.parametrize("where", ["trailer", "directory"])
def test_a_compressed_segment_that_does_not_open_is_quarantined_then_repaired(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str, where: str
) -> None:
    fleet = _site(tmp_path, moto_endpoint, s3_bucket_name)
    g = fleet["north"]
    try:
        fleet.start()
        acked: dict[int, str] = {}
        while len(_sealed(g)) < 3:
            acked |= _produce(g.url, len(acked), 32)
        wait_until(lambda: _compressed(_sealed(g)[1]), 120, "the second segment compressed")
        _ship_all_and_stop(g)
        seg = _sealed(g)[1]
        base = int(seg.stem)
        end = int(_sealed(g)[2].stem)
        _flip(seg, where)
        fleet.proxies["north"].set_mode("blackhole")
        g.start()  # it used to stop here
        [loss] = _lane(g)["lost"]["losses"]  # type: ignore[index]
        assert (loss["segment"], loss["lsn_first"], loss["lsn_last"]) == (base, base + 1, end - 1)
        assert loss["repairable"] is True
        [r] = loss["ranges"]
        assert r["exact"] is True
        lost = set(range(r["first_offset"], r["last_offset"] + 1))
        assert lost
        assert lost < set(acked)
        served = _served(g.url)
        assert served == {o: v for o, v in acked.items() if o not in lost}  # the rest, exact
        assert (g.data_dir / loss["copy"]).exists()
        assert "quarantined" in g.tail(400)
        acked |= _produce(g.url, len(acked), 32)  # new produce, the bucket still away

        fleet.proxies["north"].set_mode("pass")
        wait_until(lambda: _lane(g)["lost"]["lsns"] == 0, 120, "the repair of the range")  # type: ignore[index]
        assert _served(g.url) == acked  # every record, exactly
        [rep] = _lane(g)["repaired"]["repairs"]  # type: ignore[index]
        assert (rep["lsn_first"], rep["lsn_last"]) == (base + 1, end - 1)
        assert g.stop() == 0
        g.start()
        assert _served(g.url) == acked
        assert _lane(g)["lost"]["lsns"] == 0  # type: ignore[index]
    finally:
        fleet.close()


@pytest.mark.parametrize("step", ["quarantine.copied", "quarantine.recorded"])
def test_a_kill_during_the_quarantine_of_a_compressed_segment(tmp_path: Path, step: str) -> None:
    """A kill -9 while the open quarantines the segment (the copy made; the loss
    recorded, the segment not yet rewritten): the next start does it again, records the
    loss once, and the live repair rebuilds it (``repair.fetch``: the bucket as if out
    of reach until then)."""
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    g = Gateway(
        "north",
        tmp_path,
        {"type": "local", "path": str(bucket)},
        [TopicSpec(TOPIC, "north", partitions=1)],
        {"journal": {"segment_bytes": "256KiB", "at_rest": "compressed"}},
    )
    try:
        g.start()
        acked: dict[int, str] = {}
        while len(_sealed(g)) < 3:
            acked |= _produce(g.url, len(acked), 32)
        wait_until(lambda: _compressed(_sealed(g)[1]), 120, "the second segment compressed")
        _ship_all_and_stop(g)
        seg = _sealed(g)[1]
        _flip(seg, "trailer")
        g.env = {failpoints.ENV: f"{step}=kill,repair.fetch=1000"}
        g.spawn()
        assert g.proc is not None
        assert g.proc.wait(timeout=60) == -9
        assert _compressed(seg)  # not rewritten yet
        g.env = {failpoints.ENV: "repair.fetch=2"}  # the open's try, the first live one
        g.start()
        [loss] = _lane(g)["lost"]["losses"]  # type: ignore[index]
        assert loss["segment"] == int(seg.stem)
        wait_until(lambda: _lane(g)["lost"]["lsns"] == 0, 120, "the repair of the range")  # type: ignore[index]
        assert _served(g.url) == acked
        assert len(_lane(g)["lost"]["losses"]) == 1  # type: ignore[index]
        assert g.stop() == 0
    finally:
        g.kill()
