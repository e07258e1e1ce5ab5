"""A mirror catching up several sources at once takes them in priority order.

Real gateways on a local-directory bucket. Region ``a`` homes ``alarms``
(critical), region ``c`` homes ``logs`` (bulk); region ``b`` mirrors both,
through a capped link (so its catch-up is link-bound) with a small prefetch
window. ``b`` is down while ``a`` and ``c`` ship backlogs of many objects;
then ``b`` starts and catches up both sources side by side.

Measured from ``b``'s journal after it stopped (LSNs, no timings): the bulk
source's objects applied before the last critical record of the other
source are at most those ``b`` had fetched before the critical catch-up
announced itself -- one prefetch window -- and the bulk tailer counted its
holds (``edgegw status``, metrics). Both mirrors end complete, exactly once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from _serve import Fleet, Gateway, TopicSpec

from edge_gateway.api.wire import BATCH_MEDIA_TYPE
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import Journal, JournalConfig

TOPICS = [
    TopicSpec("alarms", "a", partitions=1, subscribers=("b",), priority="critical"),
    TopicSpec("logs", "c", partitions=1, subscribers=("b",), priority="bulk"),
]
KiB = 1024
#: Objects of 64 KiB, four batches of 16 incompressible 1 KiB records each.
OBJECTS = 24
PREFETCH = 2
SOURCE = {
    "shipper": {
        "max_object_bytes": 64 * KiB,
        "backlog_object_bytes": 64 * KiB,
        "manifest_every": 4,
    }
}


def produce(g: Gateway, topic: str) -> None:
    with httpx.Client(base_url=g.url, timeout=30) as c:
        for _ in range(OBJECTS * 4):
            resp = c.post(
                f"/v1/topics/{topic}/partitions/0/batches",
                content=encode_batch([os.urandom(KiB) for _ in range(16)], timestamps=1),
                headers={"content-type": BATCH_MEDIA_TYPE},
            )
            assert resp.status_code == 200, resp.text


def mirror_entries(data_dir: Path, topic: str) -> list[tuple[int, int]]:
    """(LSN in b's journal, source seq) of every entry of mirror topic ``topic``."""
    j = Journal.open_sync(data_dir / "journal", JournalConfig())
    out: list[tuple[int, int]] = []
    try:
        offset = 0
        while offset < j.next_offset(topic, 0):
            for e in j.read(topic, 0, offset, max_records=100_000, max_bytes=8 << 20):
                if e.next_offset > offset:
                    assert e.source is not None
                    out.append((e.lsn, e.source.seq))
                    offset = e.next_offset
    finally:
        j.close_sync()
    return out


@pytest.mark.slow
def test_a_mirror_catches_up_the_critical_source_before_the_bulk_one(tmp_path: Path) -> None:
    fleet = Fleet(
        tmp_path,
        ["a", "b", "c"],
        TOPICS,
        per_region={
            "a": SOURCE,
            "c": SOURCE,
            "b": {
                "link": {"max_bytes_per_s": 1024 * KiB},
                "mirror": {"prefetch": PREFETCH},
            },
        },
    )
    a, b, c = fleet["a"], fleet["b"], fleet["c"]
    try:
        fleet.start(["a", "c"])
        produce(c, "logs")  # the bulk backlog is the older one
        produce(a, "alarms")
        for g in (a, c):
            with g.client() as client:
                client.produce(
                    TOPICS[0].name if g is a else TOPICS[1].name, [b"last"], ack="shipped"
                )

        b.start()
        fleet.wait_converged(timeout=120)
        assert fleet.mismatches() == []
        held = b.mirror("c")
        assert held["priority_holds"] > 0, held
        assert b.mirror("a")["priority_holds"] == 0
        metrics = httpx.get(f"{b.url}/metrics", timeout=30).text
        assert 'edgegw_mirror_priority_holds_total{source="c"}' in metrics
        assert b.stop() == 0

        crit = mirror_entries(b.data_dir, "a.alarms")
        bulk = mirror_entries(b.data_dir, "c.logs")
        last_crit = max(lsn for lsn, _ in crit)
        early = sorted({seq for lsn, seq in bulk if lsn < last_crit})
        figures = {
            "critical_objects": len({s for _, s in crit}),
            "bulk_objects": len({s for _, s in bulk}),
            "bulk_objects_before_last_critical": len(early),
            "prefetch_objects": PREFETCH,
            "bulk_holds": held["priority_holds"],
        }
        print(json.dumps(figures))
        assert figures["critical_objects"] >= OBJECTS, figures
        assert len(early) <= PREFETCH, figures
        b.start()
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
