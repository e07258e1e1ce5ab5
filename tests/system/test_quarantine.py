"""A corrupt object in a source's log: quarantined and reported; everything else flows.

Three regions on moto's S3 server: ``a`` homes ``t`` and ``c`` homes ``u``,
both mirrored by ``b``; ``b`` homes ``v``, mirrored by ``a``. While ``b`` is
stopped, ``a`` produces and one of its log objects that ``b`` has not read
yet is overwritten with a copy that has one byte flipped inside a block (bit
rot, or a hostile writer). When ``b`` starts:

* its mirror of ``a`` stops exactly before that entry, nothing of it applied,
  and ``status`` shows the mirror ``quarantined`` with the object's key;
* the rest keeps flowing: ``c``'s topic reaches ``b``, ``b``'s topic reaches
  ``a``, ``b`` accepts and ships its own records;
* once the object is repaired, the entry is applied on the next retry, the
  quarantine clears and every mirror equals its source.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from _serve import Fleet, Producer, TopicSpec, prefix_mismatches, wait_mirrored, wait_until

from edge_gateway.format import logobject
from edge_gateway.format.manifest import log_key

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

T = TopicSpec("t", "a", partitions=3, subscribers=("b",))
U = TopicSpec("u", "c", partitions=2, subscribers=("b",))
V = TopicSpec("v", "b", partitions=2, subscribers=("a",))


@pytest.mark.slow
def test_corrupt_object_is_quarantined_and_the_rest_flows(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str, s3_admin: S3Client
) -> None:
    fleet = Fleet(
        tmp_path,
        ["a", "b", "c"],
        [T, U, V],
        s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name),
    )
    producers: list[Producer] = []
    try:
        fleet.start()
        a, b, c = fleet["a"], fleet["b"], fleet["c"]
        b.stop()
        seq_before = a.status()["shipper"]["next_seq"]
        producer_a = Producer(a.url, T.name, T.partitions, seed=1, pause=0.01)
        producer_a.start()
        wait_until(
            lambda: a.status()["shipper"]["next_seq"] >= seq_before + 8, 30, "a to ship 8 entries"
        )
        producer_a.stop()
        wait_until(lambda: a.status()["shipper"]["pending_lsns"] == 0, 30, "a to ship all")

        # Flip one byte inside the last block of an entry in the middle of what b has not read.
        bad_seq = seq_before + 4
        key = log_key("", "a", bad_seq)
        original = s3_admin.get_object(Bucket=s3_bucket_name, Key=key)["Body"].read()
        header = logobject.decode_header(original, where=key, object_size=len(original))
        assert header.blocks, "the entry chosen holds no block"
        block = header.blocks[-1]
        corrupt = bytearray(original)
        corrupt[block.offset + block.stored_length // 2] ^= 0x40
        s3_admin.put_object(Bucket=s3_bucket_name, Key=key, Body=bytes(corrupt))

        b.start()
        producers = [
            Producer(c.url, U.name, U.partitions, seed=2, pause=0.02),
            Producer(b.url, V.name, V.partitions, seed=3, pause=0.02),
        ]
        for p in producers:
            p.start()
        m = wait_until(
            lambda: (m := b.mirror("a"))["state"] == "quarantined" and m,
            30,
            "b's mirror of a to be quarantined",
        )
        assert m["next_seq"] == bad_seq
        [q] = m["quarantined"]
        assert (q["key"], q["seq"]) == (key, bad_seq)
        assert "CRC" in q["reason"] or "crc" in q["reason"], q
        assert m["last_error"]
        # nothing of the bad entry applied, everything before it exact
        assert prefix_mismatches(a, T.name, T.partitions, b) == []
        stuck = b.next_offsets("a.t")
        for blk in header.blocks:
            assert stuck[blk.partition] == blk.first_offset, (blk, stuck)

        # The rest flows meanwhile: c -> b, b -> a, and b ships its own topic.
        time.sleep(1.0)
        for p in producers:
            p.stop()
            assert p.error is None, p.error
        wait_until(lambda: b.status()["shipper"]["pending_lsns"] == 0, 30, "b to ship v")
        wait_mirrored(c, U.name, b, 30)
        wait_mirrored(b, V.name, a, 30)
        assert b.mirror("a")["state"] == "quarantined"
        assert b.next_offsets("a.t") == stuck

        # Repaired: the next retry applies it and the quarantine clears.
        s3_admin.put_object(Bucket=s3_bucket_name, Key=key, Body=original)
        fleet.wait_converged(timeout=60)
        assert fleet.mismatches() == []
        m = b.mirror("a")
        assert (m["quarantined"], m["gaps"], m["last_error"]) == ([], [], None), m
    finally:
        for p in producers:
            p.stopping.set()
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
