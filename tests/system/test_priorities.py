"""Topic priorities after an outage: real gateways on moto's S3 server behind a fault proxy.

Region ``a`` homes three topics, one per priority (``critical``, ``normal``,
``bulk``); region ``b`` mirrors all three. ``a``'s link to the bucket is
capped (so a drain takes a while) and its objects are small (so it takes many
objects). Then:

1. the bucket becomes unreachable for ``a`` (the proxy refuses) while
   producers fill backlogs in all three topics, the bulk one with a few MiB
   of incompressible records;
2. the link comes back. Reading ``a``'s log in seq order afterwards: among
   the objects built after the link returned, every object with critical
   backlog comes before any with bulk backlog (and normal before bulk);
   critical records produced once the bulk drain had begun are in an object
   created before the last object of the bulk backlog -- they did not wait
   for the drain;
3. nothing acknowledged is lost, every partition's offsets are gap-free along
   the log, and ``b`` mirrors all three topics record for record.

Ordering is asserted on the log itself, never on timings.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from _serve import Fleet, Producer, TopicSpec, check_acknowledged, wait_until
from edgegw_cli.status import render

from edge_gateway.api.wire import BATCH_MEDIA_TYPE
from edge_gateway.format import logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.manifest import log_prefix, parse_log_key
from edge_gateway.testing.moto import s3_client

TOPICS = [
    TopicSpec("crit", "a", partitions=2, subscribers=("b",), priority="critical"),
    TopicSpec("norm", "a", partitions=2, subscribers=("b",)),
    TopicSpec("bulk", "a", partitions=2, subscribers=("b",), priority="bulk"),
]
KiB = 1024
#: Incompressible bulk backlog: with the cap below, a drain of several seconds.
BULK_BACKLOG = 2 * 1024 * KiB
CAP = 256 * KiB


def lanes(status: dict[str, object]) -> dict[str, dict[str, int]]:
    doc = status["lanes"]
    assert isinstance(doc, dict)
    return {lane["lane"]: lane for lane in doc["lanes"]}


def read_log(endpoint: str, bucket: str) -> list[tuple[logobject.LogObjectHeader, dict]]:
    """Every object of ``a``'s log in seq order: its header, and the offsets per partition."""
    s3 = s3_client(endpoint)
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=log_prefix("", "a")
    ):
        keys += [o["Key"] for o in page.get("Contents", [])]
    out = []
    for key in sorted(keys, key=lambda k: parse_log_key(k)[1]):
        data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        header = logobject.decode_header(data, where=key, object_size=len(data))
        offsets: dict[tuple[str, int], list[int]] = {}
        for b in header.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.end], where=key)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                offsets.setdefault((b.topic, b.partition), []).extend(
                    r.offset for r in batch.records()
                )
        out.append((header, offsets))
    return out


@pytest.mark.slow
def test_after_an_outage_critical_drains_first_and_live_critical_is_not_held(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = Fleet(
        tmp_path,
        ["a", "b"],
        TOPICS,
        s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name),
        per_region={
            "a": {
                "shipper": {"max_object_bytes": 64 * KiB, "backlog_object_bytes": 64 * KiB},
                "link": {"max_bytes_per_s": CAP},
            }
        },
    )
    producers: dict[str, Producer] = {}
    try:
        fleet.start()
        a = fleet["a"]
        assert list(lanes(a.status())) == ["critical", "normal", "bulk"]
        producers = {
            t.name: Producer(a.url, t.name, 2, seed=i, pause=0.02, max_batch=10)
            for i, t in enumerate(TOPICS)
        }
        for p in producers.values():
            p.start()
        wait_until(lambda: lanes(a.status())["bulk"]["shipped_lsn"] > 1, 30, "a to ship")

        # 1. the bucket is unreachable: backlogs in all three lanes
        fleet.proxies["a"].set_mode("refuse")
        wait_until(lambda: a.status()["shipper"]["last_error"], 30, "a to see the outage")
        rnd = os.urandom
        bulk_acked: dict[tuple[int, int], bytes] = {}
        with httpx.Client(base_url=a.url, timeout=30) as c:
            for i in range(BULK_BACKLOG // (32 * KiB)):
                values = [rnd(KiB) for _ in range(32)]
                resp = c.post(
                    f"/v1/topics/bulk/partitions/{i % 2}/batches",
                    content=encode_batch(values, timestamps=1_795_380_000_000),
                    headers={"content-type": BATCH_MEDIA_TYPE},
                )
                assert resp.status_code == 200, resp.text
                for v, o in zip(values, resp.json()["offsets"], strict=True):
                    bulk_acked[(i % 2, o["offset"])] = v
        wait_until(
            lambda: all(lane["backlog_entries"] > 3 for lane in lanes(a.status()).values()),
            30,
            "a backlog in every lane",
        )

        # The backlogs are in the metrics, per lane.
        metrics = httpx.get(f"{a.url}/metrics", timeout=30).text
        for lane in ("critical", "normal", "bulk"):
            line = next(
                x
                for x in metrics.splitlines()
                if x.startswith(f'edgegw_lane_backlog_bytes{{lane="{lane}"}}')
            )
            assert float(line.split()[-1]) > 0, line
        assert lanes(a.status())["bulk"]["backlog_bytes"] >= BULK_BACKLOG
        capsys.readouterr()
        render(a.status())  # `edgegw status` shows every lane
        shown = " ".join(capsys.readouterr().out.split())
        for lane in ("critical", "normal", "bulk"):
            assert f"lane {lane}" in shown, shown
        assert "entries (" in shown

        # 2. the link returns (capped); marks of the backlogs first
        marks = {t.name: a.next_offsets(t.name) for t in TOPICS}
        bulk_lane = lanes(a.status())["bulk"]
        bulk_start, bulk_end = bulk_lane["shipped_lsn"], bulk_lane["next_lsn"] - 1
        heal_ms = time.time_ns() // 1_000_000
        fleet.proxies["a"].set_mode("pass")

        def bulk_draining() -> bool:
            bulk = lanes(a.status())["bulk"]
            return bulk["shipped_lsn"] > bulk_start and bulk["backlog_bytes"] > 256 * KiB

        wait_until(bulk_draining, 60, "the bulk backlog to start draining")
        during = a.next_offsets("crit")  # critical records from here on came during the drain
        wait_until(
            lambda: min(a.next_offsets("crit")) > max(during) + 5, 30, "critical during the drain"
        )
        wait_until(
            lambda: lanes(a.status())["bulk"]["shipped_lsn"] >= bulk_end, 120, "the drain to end"
        )
        for p in producers.values():
            p.stop()
        for p in producers.values():
            check_acknowledged(p, a)
        wait_until(
            lambda: all(lane["backlog_entries"] == 0 for lane in lanes(a.status()).values()),
            60,
            "a to ship everything",
        )

        log = read_log(moto_endpoint, s3_bucket_name)
        # Offsets gap-free along the log, every acknowledged bulk record there.
        for t in TOPICS:
            for p, end in enumerate(a.next_offsets(t.name)):
                along = [o for _, offsets in log for o in offsets.get((t.name, p), [])]
                assert along == list(range(end)), f"{t.name}/{p} is not gap-free along the log"
        assert all(h.version == 2 for h, _ in log)

        # Drain order among the objects built once the link was back.
        def backlog(topic: str) -> list[int]:
            found: set[int] = set()
            for p, mark in enumerate(marks[topic]):
                found |= {
                    h.seq
                    for h, offsets in log
                    if h.created_ms >= heal_ms
                    and any(o < mark for o in offsets.get((topic, p), []))
                }
            return sorted(found)

        crit, norm, bulk = backlog("crit"), backlog("norm"), backlog("bulk")
        assert bulk, "no bulk backlog shipped after the link returned"
        assert len(bulk) > 10, f"the bulk drain took only {len(bulk)} objects"
        assert max(crit, default=0) <= min(bulk), (crit, bulk)
        assert max(norm, default=0) <= min(bulk), (norm, bulk)
        assert max(crit, default=0) <= min(norm, default=max(crit, default=0)), (crit, norm)
        # Critical records produced during the drain did not wait for its end.
        live = sorted(
            h.seq
            for h, offsets in log
            for p, mark in enumerate(during)
            if any(o >= mark for o in offsets.get(("crit", p), []))
        )
        assert live, "no critical record was produced during the drain"
        assert live[0] < max(bulk), f"live critical first in seq {live[0]}, drain ended {max(bulk)}"

        # 3. b mirrors all three topics, record for record
        fleet.wait_converged(timeout=120)
        assert fleet.mismatches() == []
        b = fleet["b"]
        with b.client() as c:
            for (p, offset), value in list(bulk_acked.items())[:: max(1, len(bulk_acked) // 50)]:
                got = c.fetch("a.bulk", p, offset, max_records=1).records
                assert got[0].value == value
    finally:
        for p in producers.values():
            if p.is_alive():
                p.stop()
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
