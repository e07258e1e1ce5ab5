"""``on_full = "drop-oldest"`` end to end: real gateways on moto's S3 server behind a fault proxy.

Region ``a`` homes ``alarms`` (``on_full = "block"``) and ``telemetry``
(``priority = "bulk"``, ``on_full = "drop-oldest"``); region ``b`` mirrors both.
``a``'s journal budget is 1 MiB. Then:

1. the bucket becomes unreachable for ``a`` (the proxy refuses) and
   ``telemetry`` gets several times the budget: it is never refused, its
   lane drops its oldest unshipped segments; then ``alarms`` fills the rest
   until ``a`` answers ``503 journal_full`` (the drop-oldest lane gives the
   block topic its room, but never a byte of ``alarms`` is dropped);
2. ``a``'s status, metrics and log name the dropped ranges exactly;
   ``a`` is killed (-9) and restarted, still offline: the record of the
   drops survives;
3. the link returns: ``a``'s log holds every acknowledged ``alarms`` record,
   and for ``telemetry`` every offset once, as a record or inside a gap
   marker, the gap markers naming exactly the ranges ``a`` reported;
4. ``b`` mirrors everything else at the source's offsets, reports the gap
   with those ranges (status, metrics), and a consumer reading across the
   hole is told where the records resume.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from _serve import Fleet, TopicSpec, read_partition, wait_until
from _tmpfs import fill, mounted_tmpfs
from edgegw_cli.status import render

from edge_gateway.api.wire import BATCH_MEDIA_TYPE
from edge_gateway.format import logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.manifest import log_prefix, parse_log_key
from edge_gateway.testing.moto import s3_client

KiB = 1024
MiB = 1024 * KiB
TOPICS = [
    TopicSpec("alarms", "a", partitions=1, subscribers=("b",)),
    TopicSpec(
        "telemetry", "a", partitions=1, subscribers=("b",), priority="bulk", on_full="drop-oldest"
    ),
]
TS = 1_795_380_000_000


def lanes(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {lane["lane"]: lane for lane in status["lanes"]["lanes"]}


def expand(ranges: list[tuple[int, int]]) -> list[int]:
    """Offsets of inclusive ranges, sorted."""
    return sorted(o for a, z in ranges for o in range(a, z + 1))


def read_log(endpoint: str, bucket: str) -> tuple[dict[str, dict[int, bytes]], list[Any]]:
    """``a``'s log in seq order: per topic, offset -> value (each offset once), and the gaps."""
    s3 = s3_client(endpoint)
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=log_prefix("", "a")
    ):
        keys += [o["Key"] for o in page.get("Contents", [])]
    values: dict[str, dict[int, bytes]] = {}
    gaps = []
    for key in sorted(keys, key=lambda k: parse_log_key(k)[1]):
        data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        header = logobject.decode_header(data, where=key, object_size=len(data))
        gaps += header.gaps
        for b in header.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.end], where=key)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                for r in batch.records():
                    got = values.setdefault(b.topic, {})
                    assert r.offset not in got, f"{b.topic}@{r.offset} shipped twice"
                    got[r.offset] = r.value
    return values, gaps


def shipped_after_the_link_returns(
    fleet: Fleet,
    endpoint: str,
    bucket: str,
    alarms: dict[int, bytes],
    telemetry: dict[int, bytes],
    reported: list[int],
) -> tuple[dict[str, dict[int, bytes]], list[int], int]:
    """Let ``a`` ship its backlog, then check its log: every acknowledged alarm at its
    offset, gap-free; every telemetry offset once, as a record or in a gap marker,
    the markers naming exactly ``reported``. Returns (the log's values by topic and
    offset, the telemetry offsets shipped, the telemetry's end offset)."""
    a = fleet["a"]
    fleet.proxies["a"].set_mode("pass")
    wait_until(
        lambda: all(x["backlog_entries"] == 0 for x in lanes(a.status()).values()),
        120,
        "a to ship its backlog",
    )
    values, gaps = read_log(endpoint, bucket)
    assert sorted(values["alarms"]) == list(range(a.next_offsets("alarms")[0]))
    for o, v in alarms.items():
        assert values["alarms"][o] == v
    assert [g for g in gaps if g.topic == "alarms"] == []
    in_gaps = expand([(g.first_offset, g.last_offset) for g in gaps])
    shipped = sorted(values["telemetry"])
    end = a.next_offsets("telemetry")[0]
    assert sorted(shipped + in_gaps) == list(range(end))
    assert in_gaps == reported
    for o in shipped:
        assert values["telemetry"][o] == telemetry[o]
    assert set(telemetry) <= set(shipped) | set(in_gaps)  # nothing acknowledged silently missing
    return values, shipped, end


def post(c: httpx.Client, topic: str, values: list[bytes]) -> httpx.Response:
    return c.post(
        f"/v1/topics/{topic}/partitions/0/batches",
        content=encode_batch(values, timestamps=TS),
        headers={"content-type": BATCH_MEDIA_TYPE},
    )


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(r"([a-z_]+)\{([^}]*)\} (\S+)$", line)
        if m and m.group(1) == name and ",".join(sorted(m.group(2).split(","))) == want:
            return float(m.group(3))
    raise AssertionError(f"no {name}{{{want}}} in the metrics")


@pytest.mark.slow
def test_drop_oldest_topic_reports_exact_gaps_end_to_end(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = Fleet(
        tmp_path,
        ["a", "b"],
        TOPICS,
        s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name),
        per_region={
            "a": {
                "journal": {"segment_bytes": 64 * KiB, "max_bytes": 1 * MiB},
                "shipper": {"max_object_bytes": 64 * KiB, "backlog_object_bytes": 64 * KiB},
            }
        },
    )
    try:
        fleet.start()
        a, b = fleet["a"], fleet["b"]
        assert list(lanes(a.status())) == ["normal", "bulk-drop"]
        telemetry: dict[int, bytes] = {}
        alarms: dict[int, bytes] = {}
        with httpx.Client(base_url=a.url, timeout=30) as c:

            def produce(topic: str, acked: dict[int, bytes], n: int) -> httpx.Response:
                values = [os.urandom(KiB) for _ in range(n)]
                resp = post(c, topic, values)
                if resp.status_code == 200:
                    for v, o in zip(values, resp.json()["offsets"], strict=True):
                        acked[o["offset"]] = v
                return resp

            for _ in range(5):
                assert produce("telemetry", telemetry, 16).status_code == 200
                assert produce("alarms", alarms, 4).status_code == 200
            wait_until(
                lambda: all(x["backlog_entries"] == 0 for x in lanes(a.status()).values()),
                30,
                "a to ship the first records",
            )

            # 1. offline, past the budget
            fleet.proxies["a"].set_mode("refuse")
            assert produce("alarms", alarms, 1).status_code == 200
            wait_until(lambda: a.status()["shipper"]["last_error"], 30, "a to see the outage")
            for _ in range(250):  # ~4 MiB of telemetry into a 1 MiB budget: never refused
                resp = produce("telemetry", telemetry, 16)
                assert resp.status_code == 200, resp.text
            refused = None
            for _ in range(400):
                resp = produce("alarms", alarms, 8)
                if resp.status_code != 200:
                    refused = resp
                    break
            assert refused is not None, "alarms were never refused"
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "journal_full", refused.text
            assert "retry-after" in refused.headers

        # 2. the source reports the dropped ranges: status, metrics, `edgegw status`
        st = a.status()
        drop_lane = lanes(st)["bulk-drop"]
        dropped = drop_lane["dropped"]
        assert dropped["records"] > 1000
        reported = expand(
            [(r["first"], r["last"]) for r in dropped["ranges"] if r["topic"] == "telemetry"]
        )
        assert len(reported) == dropped["records"]
        text = httpx.get(f"{a.url}/metrics", timeout=30).text
        assert (
            metric(
                text, "edgegw_journal_dropped_records_total", lane="bulk-drop", topic="telemetry"
            )
            == dropped["records"]
        )
        capsys.readouterr()
        render(st)
        shown = " ".join(capsys.readouterr().out.split())
        assert "DROPPED unshipped" in shown, shown
        log_text = a.log.read_text()
        assert "dropping unshipped segment" in log_text
        # kill -9 while still offline: the drops survive, and the restarted
        # gateway (its log's head long behind its drop-oldest journal) serves
        a.kill()
        a.start()
        again = lanes(a.status())["bulk-drop"]["dropped"]
        assert again["records"] == dropped["records"]
        assert again["ranges"] == dropped["ranges"]

        # 3. the link returns
        values, shipped, end = shipped_after_the_link_returns(
            fleet, moto_endpoint, s3_bucket_name, alarms, telemetry, reported
        )
        in_gaps = reported  # (checked equal to the log's gap markers)

        # 4. b mirrors everything else, at the source's offsets, and reports the gap
        wait_until(
            lambda: (
                b.next_offsets("a.telemetry") == [end]
                and b.next_offsets("a.alarms") == a.next_offsets("alarms")
            ),
            120,
            "b to mirror a",
        )
        assert [r.value for r in read_partition(b.url, "a.alarms", 0)] == [
            values["alarms"][o] for o in range(len(values["alarms"]))
        ]
        mirrored: dict[int, bytes] = {}
        holes: list[tuple[int, int]] = []
        offset = 0
        with httpx.Client(base_url=b.url, timeout=30) as c:
            while offset < end:
                doc = c.get(
                    "/v1/topics/a.telemetry/partitions/0/records",
                    params={"offset": offset, "max_records": 1000},
                ).json()
                if "gap" in doc:
                    assert doc["gap"]["first_offset"] == offset
                    holes.append((offset, doc["gap"]["end_offset"] - 1))
                for r in doc["records"]:
                    mirrored[r["offset"]] = r["value_b64"]
                offset = doc["next_offset"]
        assert sorted(mirrored) == shipped
        assert expand(holes) == in_gaps
        mirror = b.mirror("a")
        got = expand(
            [
                (g["first_offset"], g["end_offset"] - 1)
                for g in mirror["gaps"]
                if g["kind"] == "dropped" and g["topic"] == "telemetry"
            ]
        )
        assert got == in_gaps
        assert mirror["dropped_gap_records"] == {"telemetry": len(in_gaps)}
        text = httpx.get(f"{b.url}/metrics", timeout=30).text
        assert metric(
            text, "edgegw_mirror_gap_records_total", source="a", topic="telemetry"
        ) == len(in_gaps)
        assert "dropped gap in a:telemetry/0" in b.log.read_text()
        capsys.readouterr()
        render(b.status())
        assert "dropped by the source" in " ".join(capsys.readouterr().out.split())
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


@pytest.mark.slow
def test_a_full_disk_drops_the_oldest_telemetry_and_refuses_alarms(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    # Issue 16: the filesystem fills long before the budget (the default
    # 4 GiB on a 16 MiB card, offline, and another process takes the rest).
    # ``telemetry`` (drop-oldest) is never refused: its lane drops its oldest
    # unshipped segments, recorded exactly; ``alarms`` (block) takes the room
    # telemetry gives up, then answers ``503 disk_full``; not one acknowledged
    # alarm is lost. When space and the link return, the log holds every
    # alarm and every telemetry offset once, as a record or in a gap marker
    # naming exactly the ranges reported.
    root = tmp_path / "fleet"
    root.mkdir()
    topics = [
        TopicSpec("alarms", "a", partitions=1),
        TopicSpec("telemetry", "a", partitions=1, priority="bulk", on_full="drop-oldest"),
    ]
    with mounted_tmpfs(root / "a", "16m") as disk:
        fleet = Fleet(
            root,
            ["a"],
            topics,
            s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name),
            per_region={
                "a": {
                    "journal": {"segment_bytes": 64 * KiB, "reserve_bytes": 256 * KiB},
                    "shipper": {"max_object_bytes": 64 * KiB, "backlog_object_bytes": 64 * KiB},
                }
            },
        )
        try:
            fleet.start()
            a = fleet["a"]
            telemetry: dict[int, bytes] = {}
            alarms: dict[int, bytes] = {}
            codes: dict[str, int] = {}
            with httpx.Client(base_url=a.url, timeout=30) as c:

                def produce(topic: str, acked: dict[int, bytes], n: int) -> httpx.Response:
                    values = [os.urandom(KiB) for _ in range(n)]
                    resp = post(c, topic, values)
                    code = f"{resp.status_code} {topic}"
                    if resp.status_code == 200:
                        for v, o in zip(values, resp.json()["offsets"], strict=True):
                            acked[o["offset"]] = v
                    else:
                        code += " " + resp.json()["error"]["code"]
                    codes[code] = codes.get(code, 0) + 1
                    return resp

                assert produce("alarms", alarms, 4).status_code == 200
                fleet.proxies["a"].set_mode("refuse")
                wait_until(lambda: a.status()["shipper"]["last_error"], 30, "a to see the outage")
                for _ in range(100):  # ~1.6 MiB of unshipped telemetry
                    assert produce("telemetry", telemetry, 16).status_code == 200
                # Another process takes every free byte of the card.
                taken = fill(disk / "filler")
                assert taken > 4 * MiB
                for _ in range(400):  # ~6.4 MiB: telemetry is never refused
                    resp = produce("telemetry", telemetry, 16)
                    assert resp.status_code == 200, resp.text
                refused = None
                for _ in range(2000):
                    resp = produce("alarms", alarms, 8)
                    if resp.status_code != 200:
                        refused = resp
                        break
                assert refused is not None, f"alarms were never refused: {codes}"
                assert refused.status_code == 503
                assert refused.json()["error"]["code"] == "disk_full", refused.text
                assert "retry-after" in refused.headers
                # alarms got the room telemetry gave up (beyond what was free)
                assert len(alarms) * KiB > 1 * MiB, codes
                assert set(codes) == {"200 alarms", "200 telemetry", "503 alarms disk_full"}

            st = a.status()
            dropped = lanes(st)["bulk-drop"]["dropped"]
            assert dropped["records"] > 1000
            reported = expand(
                [(r["first"], r["last"]) for r in dropped["ranges"] if r["topic"] == "telemetry"]
            )
            assert len(reported) == dropped["records"]
            assert st["disk"]["full_rejections"] >= 1
            log_text = a.log.read_text()
            assert "(drop-oldest: the disk is full)" in log_text
            assert "Traceback" not in log_text

            # Space and the link return: everything acknowledged reaches the log.
            (disk / "filler").unlink()
            _, shipped, _ = shipped_after_the_link_returns(
                fleet, moto_endpoint, s3_bucket_name, alarms, telemetry, reported
            )
            # the newest telemetry survived the full disk
            assert max(telemetry) in shipped
            resp = httpx.post(
                f"{a.url}/v1/topics/alarms/records", json={"records": [{"value": "after"}]}
            )
            assert resp.status_code == 200, resp.text
        finally:
            exit_codes = fleet.close()
    assert set(exit_codes.values()) == {0}, f"exit codes {exit_codes}; logs in {root}"
