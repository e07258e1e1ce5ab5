"""kill -9 of a gateway draining a compressed backlog (real processes, moto).

Region ``a`` journals a backlog while its bucket is unreachable; it is
stopped, its sealed segments are rewritten compressed (small chunks, so the
drain takes many objects), and it drains them -- one object per chunk, from
the stored blocks -- through a slow link while it is killed with SIGKILL and
restarted. Region ``b`` mirrors the topic. At the end every acknowledged
record is at home, ``b``'s mirror equals it record for record (no duplicate,
no gap), and the log holds each LSN exactly once: the objects of the
compressed range are exactly its chunks, back to back.
"""

from __future__ import annotations

import random
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from _serve import Fleet, Producer, TopicSpec, check_acknowledged, wait_until

from edge_gateway.format import logobject
from edge_gateway.format.atrest import CompressedSegment
from edge_gateway.format.manifest import log_prefix, parse_log_key
from edge_gateway.journal import compress_sealed_segment

TOPIC = TopicSpec("t", "a", partitions=3, subscribers=("b",))


def _log_ranges(s3_admin: Any, bucket: str) -> list[tuple[int, int, int]]:
    """(seq, first_lsn, last_lsn) of region a's log objects, in seq order."""
    out = []
    prefix = log_prefix("", "a")
    paginator = s3_admin.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            _, seq = parse_log_key(item["Key"])
            data = s3_admin.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            h = logobject.decode_header(
                data[: logobject.header_length_hint(data[:12], where=item["Key"])],
                where=item["Key"],
            )
            out.append((seq, h.first_lsn, h.last_lsn))
    return sorted(out)


@pytest.mark.slow
def test_kill_9_while_draining_a_compressed_backlog(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str, s3_admin: Any
) -> None:
    rnd = random.Random(4711)
    fleet = Fleet(
        tmp_path,
        ["a", "b"],
        [TOPIC],
        s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name),
        # at_rest off: the test compresses the backlog itself, in small chunks
        per_region={"a": {"journal": {"segment_bytes": 64 * 1024, "at_rest": "off"}}},
    )
    try:
        fleet.start()
        a, b = fleet["a"], fleet["b"]
        # 1. a backlog while the bucket is away
        fleet.proxies["a"].set_mode("refuse")
        producer = Producer(a.url, TOPIC.name, TOPIC.partitions, seed=11, pause=0.0, limit=9000)
        producer.start()
        producer.join(timeout=120)
        assert producer.error is None, producer.error
        a.kill()
        # 2. its sealed segments rewritten compressed, in small chunks
        journal = a.data_dir / "journal"
        segments = sorted(journal.glob("*.wal"))
        assert len(segments) >= 5, segments
        chunks: set[tuple[int, int]] = set()
        for seg in segments[:-1]:
            compress_sealed_segment(
                journal, int(seg.name.split(".")[0]), frame_raw_bytes=4096, chunk_raw_bytes=12_000
            )
            d = CompressedSegment(seg.read_bytes()).directory
            chunks |= {(c.first_lsn, c.last_lsn) for c in d.chunks}
        first_c = min(f for f, _ in chunks)
        last_c = max(last for _, last in chunks)
        assert len(chunks) >= 15
        # 3. the drain, over a slow link, killed and restarted: the first kill
        # once the drain has shipped part of the compressed range (whatever the
        # machine's load), the others at random
        fleet.proxies["a"].set_mode("latency", latency=0.1)
        a.start()
        wait_until(
            lambda: int(a.status()["shipper"]["shipped_lsn"]) >= first_c, 60, "the drain to begin"
        )
        a.kill()
        a.start()
        fleet.proxies["a"].set_mode("latency", latency=0.03)
        for _ in range(3):
            time.sleep(rnd.uniform(0.3, 1.2))
            a.kill()
            a.start()
        fleet.proxies["a"].set_mode("pass")
        end = int(a.status()["journal"]["next_lsn"]) - 1
        wait_until(lambda: a.status()["shipper"]["shipped_lsn"] >= end, 90, "a to drain")
        check_acknowledged(producer, a)
        fleet.wait_converged(timeout=90)
        assert fleet.mismatches() == []
        m = b.mirror("a")
        assert (m["gaps"], m["quarantined"], m["stopped_by"]) == ([], [], None), m
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
    # Each LSN is in the log once, and the compressed range shipped chunk by chunk.
    ranges = _log_ranges(s3_admin, s3_bucket_name)
    assert [s for s, _, _ in ranges] == list(range(1, len(ranges) + 1))
    for (_, _, last), (_, first, _) in pairwise(ranges):
        assert first == last + 1, ranges
    # (every chunk holds local data: a is no mirror, and a chunk is 12 KB of entries)
    inside = [(f, last) for _, f, last in ranges if f >= first_c and last <= last_c and f <= last]
    assert sorted(inside) == sorted(chunks), (ranges, sorted(chunks))
    # the kills landed inside the drain: a restart's claim (an empty entry) among the chunks
    assert any(first_c < f <= last_c and f > last for _, f, last in ranges), ranges
