"""Client-side encryption with real gateways: nothing readable in the bucket, keys rotate.

Three regions on one bucket (a local directory, and moto's S3 server over
HTTP), each an ``edgegw serve`` process. ``a`` and ``b`` seal their log
objects (``[encryption]``) and hold each other's keys; ``c`` ships in clear
and holds no key. ``a`` homes ``t`` (mirrored by ``b`` and ``c``), ``b``
homes ``u`` (mirrored by ``a``), ``c`` homes ``v`` (mirrored by ``b``).

* Every record reaches its mirrors through sealed objects, and no byte of
  the bucket holds a record value of ``a`` or ``b`` (``c``'s plaintext
  marker is found, so the scan would see one).
* ``c`` has no key for ``a``: its mirror of ``a`` says ``missing-key``
  (status, metric) and waits, while ``c`` still ships and ``b`` mirrors it.
* ``a`` rotates to a new key (readers got it first, the old one stays
  decrypt-only): new objects name the new key, the old ones stay readable
  (the pipeline's reader reads the whole log with both keys, and refuses
  the old objects with only the new key).
* ``c`` is given ``a``'s keys and restarted: it catches up on everything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from _serve import Fleet, Gateway, TopicSpec, wait_mirrored, wait_until

from edge_gateway.encryption import keyring_from_files, write_key_file
from edge_gateway.errors import MissingKey
from edge_gateway.format import logobject
from edge_gateway.format.crypt import generate_key

T = TopicSpec("t", "a", partitions=2, subscribers=("b", "c"))
U = TopicSpec("u", "b", partitions=2, subscribers=("a",))
V = TopicSpec("v", "c", partitions=1, subscribers=("b",))
SECRET = "SEALED-MARKER-93c1"
CLEAR = "CLEAR-MARKER-5e07"


def _key(path: Path) -> str:
    write_key_file(path, generate_key())
    return str(path)


def _produce(g: Gateway, topic: str, marker: str, n: int, start: int = 0) -> None:
    with g.client() as c:
        for i in range(start, start + n):
            c.produce(topic, [f"{marker} {topic} #{i}"], partition=i % 2 if topic != "v" else 0)


class RawBucket:
    """Every object of the fleet's bucket as stored bytes: files, or S3 objects."""

    def __init__(self, root: Path, s3: tuple[Any, str] | None) -> None:
        self.root = root
        self.s3 = s3

    def objects(self) -> dict[str, bytes]:
        if self.s3 is None:
            return {
                p.relative_to(self.root).as_posix(): p.read_bytes()
                for p in sorted(self.root.rglob("*"))
                if p.is_file()
            }
        client, name = self.s3
        out: dict[str, bytes] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            for o in page.get("Contents", []):
                out[o["Key"]] = client.get_object(Bucket=name, Key=o["Key"])["Body"].read()
        return out

    def raw(self) -> bytes:
        return b"".join(self.objects().values())

    def log_headers(self, region: str) -> list[logobject.LogObjectHeader]:
        out = [
            logobject.decode_header(data, where=key, object_size=len(data))
            for key, data in self.objects().items()
            if f"regions/{region}/log/" in key and key.endswith(".egw")
        ]
        return sorted(out, key=lambda h: h.seq)

    def spec(self) -> Any:
        from edge_gateway.pipeline.bucketspec import BucketSpec

        if self.s3 is None:
            return BucketSpec(str(self.root))
        client, name = self.s3
        return BucketSpec(
            f"s3://{name}",
            endpoint_url=client.meta.endpoint_url,
            region="us-east-1",
            access_key="testing",
            secret_key="testing",
            path_style=True,
        )


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Any]:
    if request.param == "local":
        return "local", None
    endpoint = request.getfixturevalue("moto_endpoint")
    name = request.getfixturevalue("s3_bucket_name")
    return "s3", (int(endpoint.rsplit(":", 1)[1]), name, request.getfixturevalue("s3_admin"))


@pytest.mark.slow
def test_encrypted_fleet(tmp_path: Path, store: tuple[str, Any]) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    a1, a2, b1 = _key(keys / "a-1.key"), _key(keys / "a-2.key"), _key(keys / "b-1.key")
    s3 = store[1]
    fleet = Fleet(
        tmp_path,
        ["a", "b", "c"],
        [T, U, V],
        s3=(s3[0], s3[1]) if s3 else None,
        per_region={
            "a": {"encryption": {"key_file": a1}, "encryption.sources.b": {"key_files": [b1]}},
            # a's next key reaches its readers before a uses it (docs/operations.md).
            "b": {"encryption": {"key_file": b1}, "encryption.sources.a": {"key_files": [a1, a2]}},
        },
    )
    bucket = RawBucket(fleet.bucket_dir, (s3[2], s3[1]) if s3 else None)
    try:
        fleet.start()
        a, b, c = fleet["a"], fleet["b"], fleet["c"]
        _produce(a, "t", SECRET, 40)
        _produce(b, "u", SECRET, 40)
        _produce(c, "v", CLEAR, 10)
        wait_mirrored(a, "t", b, 30)
        wait_mirrored(b, "u", a, 30)
        wait_mirrored(c, "v", b, 30)

        # c cannot open a's objects: it says so and waits; the rest flows.
        m = wait_until(
            lambda: (m := c.mirror("a"))["state"] == "missing-key" and m,
            30,
            "c's mirror of a to report the missing key",
        )
        assert m["missing_key"] == "a/a-1", m
        assert "no decryption key 'a-1' for region 'a'" in m["last_error"]
        assert c.next_offsets("a.t") == [0, 0]
        metrics = httpx.get(f"{c.url}/metrics", timeout=10).text
        assert 'edgegw_mirror_missing_key{key="a/a-1",source="a"} 1.0' in metrics, metrics
        assert 'edgegw_mirror_state{source="a",state="missing-key"} 1.0' in metrics
        enc = a.status()["encryption"]
        assert enc == {"enabled": True, "key_id": "a-1", "keys": {"a": ["a-1"], "b": ["b-1"]}}
        assert c.log.read_text().count("no decryption key 'a-1'") >= 1

        # The bucket holds no plaintext of a's or b's records (c's are in clear).
        raw = bucket.raw()
        assert CLEAR.encode() in raw
        assert SECRET.encode() not in raw
        assert {h.key_id for h in bucket.log_headers("a") if h.blocks} == {"a-1"}

        # Rotation: a seals with a-2 from now on; a-1 stays decrypt-only.
        a.stop()
        text = a.config.read_text().replace(
            f'key_file = "{a1}"', f'key_file = "{a2}"\ndecrypt_keys = ["{a1}"]'
        )
        assert text != a.config.read_text()
        a.config.write_text(text)
        a.start()
        _produce(a, "t", SECRET, 40, start=40)
        wait_mirrored(a, "t", b, 30)
        headers = [h for h in bucket.log_headers("a") if h.blocks]
        assert headers[0].key_id == "a-1"
        assert headers[-1].key_id == "a-2"
        assert a.status()["encryption"]["keys"]["a"] == ["a-1", "a-2"]

        # The pipeline's reader, given both keys, reads a's whole log; with
        # only the new key, the old objects are refused by name.
        pytest.importorskip("pyarrow")
        from edge_gateway.pipeline._arrow import read_blocks
        from edge_gateway.pipeline.plan import check_keys, plan_region

        reader = bucket.spec().shared()
        plan = plan_region(reader, "a")
        both = keyring_from_files([("a", a1), ("a", a2)])
        check_keys([plan], both)
        values = [
            v.as_py().decode()
            for batch in read_blocks(reader, plan.slices, keyring=both)
            for v in batch.column("value")
        ]
        assert sorted(values) == sorted(f"{SECRET} t #{i}" for i in range(80))
        with pytest.raises(MissingKey, match="'a-1'"):
            check_keys([plan], keyring_from_files([("a", a2)]))

        # c is given a's keys: it catches up from where it waited.
        c.stop()
        with c.config.open("a") as f:
            f.write(f'[encryption.sources.a]\nkey_files = ["{a1}", "{a2}"]\n')
        c.start()
        wait_mirrored(a, "t", c, 30)
        m = c.mirror("a")
        assert (m["missing_key"], m["quarantined"]) == (None, []), m
        assert fleet.mismatches() == []
        assert SECRET.encode() not in bucket.raw()
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
