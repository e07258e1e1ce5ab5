"""Client-side encryption with real gateways: nothing readable in the bucket, keys rotate.

Three regions on one local-directory bucket, each an ``edgegw serve``
process. ``a`` and ``b`` seal their log objects (``[encryption]``) and hold
each other's keys; ``c`` ships in clear and holds no key. ``a`` homes ``t``
(mirrored by ``b`` and ``c``), ``b`` homes ``u`` (mirrored by ``a``), ``c``
homes ``v`` (mirrored by ``b``).

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


def _bucket_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def _log_headers(bucket_dir: Path, region: str) -> list[logobject.LogObjectHeader]:
    out = []
    for p in sorted(bucket_dir.rglob("*.egw")):
        if f"regions/{region}/log/" in p.as_posix():
            data = p.read_bytes()
            out.append(logobject.decode_header(data, where=str(p), object_size=len(data)))
    return sorted(out, key=lambda h: h.seq)


@pytest.mark.slow
def test_encrypted_fleet(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    a1, a2, b1 = _key(keys / "a-1.key"), _key(keys / "a-2.key"), _key(keys / "b-1.key")
    fleet = Fleet(
        tmp_path,
        ["a", "b", "c"],
        [T, U, V],
        per_region={
            "a": {"encryption": {"key_file": a1}, "encryption.sources.b": {"key_files": [b1]}},
            # a's next key reaches its readers before a uses it (docs/operations.md).
            "b": {"encryption": {"key_file": b1}, "encryption.sources.a": {"key_files": [a1, a2]}},
        },
    )
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
        raw = _bucket_bytes(fleet.bucket_dir)
        assert CLEAR.encode() in raw
        assert SECRET.encode() not in raw
        assert {h.key_id for h in _log_headers(fleet.bucket_dir, "a") if h.blocks} == {"a-1"}

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
        headers = [h for h in _log_headers(fleet.bucket_dir, "a") if h.blocks]
        assert headers[0].key_id == "a-1"
        assert headers[-1].key_id == "a-2"
        assert a.status()["encryption"]["keys"]["a"] == ["a-1", "a-2"]

        # The pipeline's reader, given both keys, reads a's whole log; with
        # only the new key, the old objects are refused by name.
        pytest.importorskip("pyarrow")
        from edge_gateway.pipeline._arrow import read_blocks
        from edge_gateway.pipeline._store import BucketSpec
        from edge_gateway.pipeline.plan import check_keys, plan_region

        reader = BucketSpec(str(fleet.bucket_dir)).open()
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
        assert SECRET.encode() not in _bucket_bytes(fleet.bucket_dir)
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
