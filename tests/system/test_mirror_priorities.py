"""In which order a mirror receives a source's backlogs of three priorities after an outage.

Real gateways on moto's S3 server, each behind a fault proxy. Region ``a``
homes ``crit`` (critical), ``norm`` (normal) and ``bulk`` (bulk); region ``b``
mirrors all three. ``a``'s bucket becomes unreachable; producers fill the
backlogs in the *reverse* order of priority (bulk first, critical last) in
objects of 64 KiB; then the link returns and ``b`` catches up.

What is measured: the LSNs of ``b``'s mirror entries (read from ``b``'s
journal after it stopped, so no timing is involved) and the source seqs
they came from. The guarantee (docs/mirroring.md, "Priorities"): ``b``
applies ``a``'s log in seq order, and ``a`` ships its critical backlog first,
so every critical record of the backlog is in ``b``'s journal before any bulk
record of it, although the bulk records were produced first -- except the
records of the one object whose upload the outage interrupted: ``a`` retries
it as built (its outcome was unknown), so it ships first; the objects ``a``
had built ahead of it are read again in drain order. Normal sits between
(sharing at most a boundary object with each). Nothing is applied twice and
nothing is missing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from _serve import Fleet, TopicSpec, wait_until

from edge_gateway.api.wire import BATCH_MEDIA_TYPE
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import Journal, JournalConfig

TOPICS = [
    TopicSpec("crit", "a", partitions=2, subscribers=("b",), priority="critical"),
    TopicSpec("norm", "a", partitions=2, subscribers=("b",)),
    TopicSpec("bulk", "a", partitions=2, subscribers=("b",), priority="bulk"),
]
KiB = 1024
#: Incompressible backlog per topic: several 64 KiB objects each.
BACKLOG = 320 * KiB


def lanes(status: dict[str, object]) -> dict[str, dict[str, int]]:
    doc = status["lanes"]
    assert isinstance(doc, dict)
    return {lane["lane"]: lane for lane in doc["lanes"]}


def mirror_entries(
    data_dir: Path, marks: dict[str, list[int]]
) -> dict[str, list[tuple[int, int, int]]]:
    """Per topic, (LSN in b's journal, source seq, records) of every mirror entry of the
    backlog (offsets from ``marks`` on), read from b's journal (b is stopped)."""
    j = Journal.open_sync(data_dir / "journal", JournalConfig())
    out: dict[str, list[tuple[int, int, int]]] = {}
    try:
        for topic, starts in marks.items():
            rows = out.setdefault(topic, [])
            for p, start in enumerate(starts):
                offset = start
                while offset < j.next_offset(f"a.{topic}", p):
                    got = j.read(f"a.{topic}", p, offset, max_records=100_000, max_bytes=8 << 20)
                    assert got, f"a.{topic}/{p} ends at {offset}"
                    for e in got:
                        if e.next_offset <= offset:
                            continue
                        assert e.source is not None
                        assert e.source.region == "a"
                        rows.append((e.lsn, e.source.seq, e.count))
                        offset = e.next_offset
    finally:
        j.close_sync()
    return out


@pytest.mark.slow
def test_a_mirror_receives_the_critical_backlog_before_the_bulk_backlog(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    fleet = Fleet(
        tmp_path,
        ["a", "b"],
        TOPICS,
        s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name),
        per_region={
            "a": {"shipper": {"max_object_bytes": 64 * KiB, "backlog_object_bytes": 64 * KiB}}
        },
    )
    a, b = fleet["a"], fleet["b"]
    try:
        fleet.start()
        with httpx.Client(base_url=a.url, timeout=30) as c:
            for t in TOPICS:
                c.post(f"/v1/topics/{t.name}/records", json={"records": [{"value": "x"}]})
        fleet.wait_converged(timeout=60)

        fleet.proxies["a"].set_mode("refuse")
        marks = {t.name: a.next_offsets(t.name) for t in TOPICS}
        # Reverse priority order: the bulk backlog is the oldest.
        with httpx.Client(base_url=a.url, timeout=30) as c:
            for topic in ("bulk", "norm", "crit"):
                for i in range(BACKLOG // (16 * KiB)):
                    resp = c.post(
                        f"/v1/topics/{topic}/partitions/{i % 2}/batches",
                        content=encode_batch(
                            [os.urandom(KiB) for _ in range(16)], timestamps=1_795_380_000_000
                        ),
                        headers={"content-type": BATCH_MEDIA_TYPE},
                    )
                    assert resp.status_code == 200, resp.text
        wait_until(lambda: a.status()["shipper"]["last_error"], 30, "a to see the outage")
        assert all(lane["backlog_bytes"] >= BACKLOG for lane in lanes(a.status()).values())

        fleet.proxies["a"].set_mode("pass")
        wait_until(
            lambda: all(lane["backlog_entries"] == 0 for lane in lanes(a.status()).values()),
            120,
            "a to ship its backlog",
        )
        fleet.wait_converged(timeout=120)
        assert fleet.mismatches() == []
        assert b.stop() == 0

        got = mirror_entries(b.data_dir, marks)
        crit, norm, bulk = got["crit"], got["norm"], got["bulk"]
        for topic, rows in got.items():
            assert sum(n for _, _, n in rows) == BACKLOG // KiB, topic
        lsn = {k: [r[0] for r in rows] for k, rows in got.items()}
        seq = {k: [r[1] for r in rows] for k, rows in got.items()}
        figures = {
            "objects": {k: len(set(v)) for k, v in seq.items()},
            "mirror_lsns": {k: [min(v), max(v)] for k, v in lsn.items()},
            "bulk_before_last_critical": sum(1 for x in lsn["bulk"] if x < max(lsn["crit"])),
            "normal_before_last_critical": sum(1 for x in lsn["norm"] if x < max(lsn["crit"])),
        }
        assert min(len(set(v)) for v in seq.values()) >= 3, figures
        # Every critical record of the backlog reached b before any bulk one,
        # except those of the one object whose upload the outage interrupted
        # (retried as built: its outcome was unknown), which ships first.
        early = {s for x, s, _ in bulk if x < max(lsn["crit"])}
        figures["bulk_objects_before_last_critical"] = len(early)
        assert len(early) <= 1, figures
        assert all(s < min(s for _, s, _ in crit) for s in early), figures
        late_bulk = [(x, s) for x, s, _ in bulk if s not in early]
        assert max(lsn["crit"]) < min(x for x, _ in late_bulk), figures
        # ... and normal in between, sharing at most one boundary object with each.
        assert max(s for _, s, _ in crit) <= min(s for _, s, _ in norm), figures
        assert max(s for _, s, _ in norm) <= min(s for _, s in late_bulk), figures
        print(json.dumps(figures))
        b.start()
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
