"""A reader far behind a log of small entries catches up from packs, through moto's S3 server.

Region ``a`` flushes every 5 ms, so each record it takes is a log entry of
its own (a quiet site), while ``b`` is down. Its shipper writes a pack
(``format/pack.py``: verbatim copies of a manifest's small entries) before
each manifest. Then ``b`` starts with an empty data dir and mirrors the whole
log. Real ``edgegw serve`` processes; the GETs are counted in moto's request
log (only this test's bucket).

* Packs intact: ``b``'s mirror equals ``a``'s topic record for record
  (values, keys, headers, timestamps, offsets), it GETs only a few log
  entries (the packs serve the rest), and its status counts the entries
  served from packs.
* Packs tampered with before ``b`` starts -- one with a flipped header byte
  (it does not decode), one holding two entries' bodies swapped (each a valid
  log object of *another* seq), one with a flipped byte inside a body: ``b``
  still mirrors everything exactly, fetching those entries from their own
  objects; the disagreements are counted as fallbacks; nothing is
  quarantined and no gap is recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from _serve import Fleet, Gateway, Producer, TopicSpec, check_acknowledged, wait_until

from edge_gateway.format.manifest import log_key, log_prefix, manifest_prefix, parse_manifest_key
from edge_gateway.format.pack import decode_pack, encode_pack, pack_prefix, parse_pack_key
from edge_gateway.testing.moto import LoggedRequest, MotoServer

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

TOPIC = TopicSpec("t", "a", partitions=3, subscribers=("b",))
#: Log entries ``a`` writes while ``b`` is down.
ENTRIES = 240


def keys(s3: S3Client, bucket: str, prefix: str) -> list[str]:
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return sorted(out)


def log_head(s3: S3Client, bucket: str) -> int:
    return len(keys(s3, bucket, log_prefix("", "a")))


def manifested(s3: S3Client, bucket: str) -> int:
    """The highest log seq a manifest of ``a`` covers (0: none yet)."""
    return max(
        (parse_manifest_key(k)[1] for k in keys(s3, bucket, manifest_prefix("", "a"))), default=0
    )


def backlog_at_a(fleet: Fleet, s3: S3Client, bucket: str) -> Producer:
    """``a`` alone takes single records until its log holds ENTRIES, all under manifests."""
    fleet.start(["a"])
    a = fleet["a"]
    producer = Producer(a.url, TOPIC.name, TOPIC.partitions, seed=17, pause=0.008, max_batch=1)
    producer.start()
    wait_until(lambda: log_head(s3, bucket) >= ENTRIES, 60, f"a to write {ENTRIES} entries")
    producer.stop()
    check_acknowledged(producer, a)

    # The last manifest follows within manifest_interval_ms (1 s): then the
    # reader's whole backlog is planned from manifests, and packed. The head
    # is read again each time: records acknowledged just before the producer
    # stopped may still be shipping (a head read once can be passed, and a
    # manifest covering the next seq never equals it).
    def covered() -> bool:
        head = log_head(s3, bucket)
        return manifested(s3, bucket) >= head

    wait_until(covered, 30, "a's manifests to cover its log head")
    return producer


def catch_up(
    fleet: Fleet, moto: MotoServer, bucket: str
) -> tuple[dict[str, Any], list[LoggedRequest]]:
    """``b`` starts empty and mirrors a's log; its mirror status and its requests to the bucket."""
    mark = moto.log_position()
    fleet.start(["b"])
    b: Gateway = fleet["b"]
    fleet.wait_converged(timeout=45)
    assert fleet.mismatches() == []
    m = b.mirror("a")
    # moto logs a request once it has answered it: the fetches that built the
    # mirror were answered before the comparison above read it back.
    return m, [r for r in moto.requests(since=mark) if r.bucket == bucket]


def entry_gets(reqs: list[LoggedRequest]) -> list[str]:
    """Keys of a's log entries that ``b`` fetched (not the 404s of polling past the head)."""
    return [
        r.key
        for r in reqs
        if r.method == "GET" and r.key.startswith(log_prefix("", "a")) and r.status != 404
    ]


def make_fleet(tmp_path: Path, moto: MotoServer, bucket: str) -> Fleet:
    return Fleet(
        tmp_path,
        ["a", "b"],
        [TOPIC],
        s3=(moto.port, bucket),
        per_region={"a": {"shipper": {"flush_interval_ms": 5, "manifest_every": 40}}},
    )


def test_catch_up_from_packs(
    tmp_path: Path, moto_server: MotoServer, s3_admin: S3Client, s3_bucket_name: str
) -> None:
    fleet = make_fleet(tmp_path, moto_server, s3_bucket_name)
    try:
        backlog_at_a(fleet, s3_admin, s3_bucket_name)
        entries = log_head(s3_admin, s3_bucket_name)
        packs = keys(s3_admin, s3_bucket_name, pack_prefix("", "a"))
        assert len(packs) >= entries // 40 - 1, f"{len(packs)} packs for {entries} entries"
        assert fleet["a"].status()["shipper"]["packs"] == len(packs)

        m, reqs = catch_up(fleet, moto_server, s3_bucket_name)
        fetched = entry_gets(reqs)
        # The packs held almost every entry: b fetched only a few on their own
        # (those of a last manifest too small to get a pack; the fence at
        # seq 1 holds nothing to fetch).
        assert len(fetched) <= entries // 10, (len(fetched), entries, fetched[:20])
        pack_gets = [r for r in reqs if r.method == "GET" and r.key in packs]
        assert 1 <= len(pack_gets) <= len(packs) + 1
        assert m["pack_entries"] >= entries - len(fetched) - 1, m
        assert m["pack_reads"] >= 1, m
        assert m["pack_fallbacks"] == 0, m
        assert (m["gaps"], m["quarantined"], m["stopped_by"]) == ([], [], None), m
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


def _put(s3: S3Client, bucket: str, key: str, data: bytes) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=data)


def test_tampered_packs_fall_back_to_the_entries(
    tmp_path: Path, moto_server: MotoServer, s3_admin: S3Client, s3_bucket_name: str
) -> None:
    fleet = make_fleet(tmp_path, moto_server, s3_bucket_name)
    bucket = s3_bucket_name
    try:
        backlog_at_a(fleet, s3_admin, bucket)
        packs = keys(s3_admin, bucket, pack_prefix("", "a"))
        assert len(packs) >= 4, packs

        def read(key: str) -> bytes:
            return s3_admin.get_object(Bucket=bucket, Key=key)["Body"].read()

        # 1. A flipped byte in the header: the pack does not decode.
        broken = bytearray(read(packs[0]))
        broken[20] ^= 0xFF
        _put(s3_admin, bucket, packs[0], bytes(broken))
        _, first, last = parse_pack_key(packs[0])
        undecodable = set(range(first, last + 1))
        # 2. Two bodies swapped: a valid pack whose entries are valid log
        #    objects, each of another seq.
        data = read(packs[1])
        index = decode_pack(data)
        bodies = [(e.seq, data[e.offset : e.offset + e.length]) for e in index.entries]
        (s1, b1), (s2, b2) = bodies[1], bodies[2]
        bodies[1], bodies[2] = (s1, b2), (s2, b1)
        _put(s3_admin, bucket, packs[1], encode_pack("a", bodies))
        # 3. A flipped byte inside one body (its last byte: block data).
        data = read(packs[2])
        index = decode_pack(data)
        e = index.entries[len(index.entries) // 2]
        flipped = bytearray(data)
        flipped[e.offset + e.length - 1] ^= 0x01
        _put(s3_admin, bucket, packs[2], bytes(flipped))
        disagreeing = {s1, s2, e.seq}

        m, reqs = catch_up(fleet, moto_server, bucket)
        fetched = set(entry_gets(reqs))
        # Every entry of a pack that is off, and each body that disagrees,
        # came from the entry's own object ...
        for seq in sorted(undecodable | disagreeing):
            assert log_key("", "a", seq) in fetched, f"seq {seq} was not fetched on its own"
        # ... and the packs left intact still served theirs.
        assert len(fetched) < log_head(s3_admin, bucket) // 2, len(fetched)
        assert m["pack_fallbacks"] >= len(disagreeing), m
        assert m["pack_entries"] > 0, m
        assert (m["gaps"], m["quarantined"], m["stopped_by"]) == ([], [], None), m
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
