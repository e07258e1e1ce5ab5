"""A flipped byte in a sealed journal segment, end to end (issue 41, item 9).

docs/operations.md said that corruption in the middle of a segment stops the
gateway at start, while the open scans only the last segment (docs/journal.md,
"Opening"): a sealed segment is opened from its index file, and damage in it
is found by the CRC check of the read that meets it (and, shipped, repaired
from the bucket while it runs: 503 repair_pending meanwhile). The docs say
what the gateway does; this test holds both to it.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import trio
from _api_support import make_config, quiesce, running, url_of

from edge_gateway.journal._lane_repair import shipped_lsn

DOCS = Path(__file__).parents[2] / "docs"


async def test_a_flipped_byte_in_a_sealed_segment_is_found_on_read(tmp_path: Path) -> None:
    # Sealed segments stay entry logs: this is the damage of an entry log (a
    # compressed segment's is CorruptData naming its frame: tests/journal/test_compressed.py).
    cfg = make_config(tmp_path, journal={"segment_bytes": 64 * 1024, "at_rest": "off"})
    value = "v" * 1000
    async with running(cfg) as gw, httpx.AsyncClient(base_url=url_of(gw)) as http:
        for _ in range(20):  # ~200 KiB: a few sealed segments
            r = await http.post(
                "/v1/topics/t/records",
                json={"records": [{"value": value, "partition": 0}] * 10},
            )
            assert r.status_code == 200, r.text
        # The repair below needs the bucket to hold the segment: every entry
        # shipped and confirmed before the stop, however loaded the machine.
        await quiesce(gw, within=60, must=True)
    segments = sorted((tmp_path / "data" / "journal").glob("*.wal"))
    assert len(segments) >= 3, segments
    sealed = segments[0]
    assert sealed.with_suffix(".idx").exists()
    raw = bytearray(sealed.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    sealed.write_bytes(bytes(raw))

    # The gateway starts (only the last segment is scanned) ...
    async with running(cfg) as gw, httpx.AsyncClient(base_url=url_of(gw)) as http:
        assert (await http.get("/healthz")).status_code == 200
        # shipper.json confirms the LSNs of the last object created before a
        # create (here: none, one object took them all); the started shipper
        # writes what the bucket confirms once it has found its place in the
        # log. Until then the live repair does not know the bucket holds the
        # segment, and a read of the damage answers 500 corrupt_data.
        journal = tmp_path / "data" / "journal"
        with trio.fail_after(60):
            while (shipped_lsn(journal) or 0) < gw.journal.next_lsn - 1:  # noqa: ASYNC110
                await trio.sleep(0.05)
        # ... and the read that meets the damage refuses it, naming the place: the
        # bucket holds the segment (shipped before the stop), so it is being repaired
        # (503 repair_pending, retry), then the records come back.
        params = {"offset": 0, "max_records": 10_000, "max_bytes": 64 << 20}
        r = await http.get("/v1/topics/t/partitions/0/records", params=params)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "repair_pending"
        assert "entry CRC mismatch" in err["message"]
        assert sealed.name in err["message"]
        assert int(r.headers["retry-after"]) >= 1
        with trio.fail_after(60):
            while r.status_code == 503:
                await trio.sleep(0.1)
                r = await http.get("/v1/topics/t/partitions/0/records", params=params)
        assert r.status_code == 200, r.text
        assert len(r.json()["records"]) == 200
        # Appends go on.
        r = await http.post("/v1/topics/t/records", json={"records": [{"value": "after"}]})
        assert r.status_code == 200, r.text

    # What the operations guide says about it is what happened.
    ops = " ".join((DOCS / "operations.md").read_text().split())
    assert "corruption in the middle of a segment stops the gateway" not in ops
    assert "a flipped byte in a sealed segment does not stop the start" in ops
    assert "answers `500 corrupt_data`" in ops
    journal = " ".join((DOCS / "journal.md").read_text().split())
    assert "It scans only the last segment" in journal
    assert "a sealed segment's damage is found by the read that meets it" in journal
