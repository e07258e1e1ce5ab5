"""The in-process gateway with topic priorities: lanes, ack=shipped, a priority change.

docs/journal.md "Lanes": a gateway without priorities has one lane and writes
version 1 objects; with priorities, one journal per priority, version 2
objects, and a topic whose priority changes keeps its offsets gap-free.
"""

from __future__ import annotations

from pathlib import Path

import trio

from edge_gateway.api import status_document
from edge_gateway.bucket import LocalBucket
from edge_gateway.bucket_log import find_head
from edge_gateway.config import parse_config
from edge_gateway.format import logobject
from edge_gateway.format.manifest import log_key
from edge_gateway.gateway import Gateway, ProduceRecord
from edge_gateway.journal import MAIN_LANE, Lane, Priority

CRITICAL = Lane(Priority.CRITICAL)


def config(tmp_path: Path, priority: str | None) -> dict[str, object]:
    topic: dict[str, object] = {"name": "t", "home": "north", "partitions": 2}
    if priority is not None:
        topic["priority"] = priority
    return {
        "region": "north",
        "data_dir": str(tmp_path / "data"),
        "shipper": {"flush_interval_ms": 20},
        "shutdown_grace_s": 5.0,
        "topics": [topic, {"name": "m", "home": "north"}],
    }


async def versions(tmp_path: Path) -> list[int]:
    bucket = await LocalBucket.open(tmp_path / "data" / "bucket")
    try:
        out = []
        for seq in range(1, await find_head(bucket, "", "north") + 1):
            data = (await bucket.get(log_key("", "north", seq))).data
            out.append(logobject.decode_header(data, where=str(seq)).version)
        return out
    finally:
        await bucket.aclose()


async def run_once(tmp_path: Path, priority: str | None, values: list[bytes]) -> dict[str, object]:
    gw = Gateway(parse_config(config(tmp_path, priority)))
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        for v in values:
            res = await gw.produce("t", [ProduceRecord(v, partition=0)], ack="shipped")
            lane = CRITICAL if priority == "critical" else MAIN_LANE
            shipped = gw.shipper.shipped_lsns()
            assert all(shipped[k] >= lsn for k, lsn in res.lane_lsns.items())
            if not res.lane_lsns:
                assert lane == MAIN_LANE
                assert gw.shipper.shipped_lsn >= res.last_lsn
        # A consumer's reads: each continues at the previous one's next offset
        # (one read returns one lane's entries).
        records = []
        offset = 0
        while offset < gw.describe_topic("t").next_offsets[0]:
            got = await gw.fetch("t", 0, offset, max_records=1000)
            records += got.records
            offset = got.next_offset
        status = status_document(gw)
        gw.request_shutdown()
    return {"values": [r.value for r in records], "offsets": [r.offset for r in records],
            "status": status}  # fmt: skip


async def test_priorities_change_lanes_and_offsets_stay_gap_free(tmp_path: Path) -> None:
    # No priority: one lane, version 1 objects, as before lanes.
    first = await run_once(tmp_path, None, [b"a", b"b"])
    assert [lane["lane"] for lane in first["status"]["lanes"]["lanes"]] == ["normal"]  # type: ignore[index]
    assert set(await versions(tmp_path)) == {1}
    assert not (tmp_path / "data" / "journal-critical").exists()
    # The topic becomes critical: a lane beside the journal, version 2 objects;
    # everything of t was shipped, so it moves at once and continues its offsets.
    second = await run_once(tmp_path, "critical", [b"c", b"d"])
    assert second["values"] == [b"a", b"b", b"c", b"d"]
    assert second["offsets"] == [0, 1, 2, 3]
    lanes = second["status"]["lanes"]  # type: ignore[index]
    assert [lane["lane"] for lane in lanes["lanes"]] == ["critical", "normal"]
    assert (tmp_path / "data" / "journal-critical").is_dir()
    assert (await versions(tmp_path))[-1] == 2
    # Back to normal: the critical lane stays open (it is on disk) and t moves back.
    third = await run_once(tmp_path, None, [b"e"])
    assert third["values"] == [b"a", b"b", b"c", b"d", b"e"]
    assert third["offsets"] == [0, 1, 2, 3, 4]
