"""Null values (issue 23) one level up from the batch: log objects and manifests.

A batch holding a null value or a null header value has the batch flag NULLS
(``tests/format/test_batch.py`` covers the batch). A reader from before nulls
refuses such a batch as corrupt ("unknown flags 0x04"), so a log object that
carries one says so in its own header (FLAG_NULLS) and its manifest entry
makes the manifest version 4: the older reader refuses both as a format it
does not know (``UnsupportedFormat``, which stops a mirror instead of
quarantining), and never reaches the batch.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from _old_code import old_sources, run_old

from edge_gateway.errors import CorruptData, UnsupportedFormat
from edge_gateway.format import logobject
from edge_gateway.format import manifest as fmanifest
from edge_gateway.format.batch import FLAG_NULLS as BATCH_NULLS
from edge_gateway.format.batch import Record, encode_records, read_header
from edge_gateway.format.logobject import (
    FLAG_NULLS,
    LogObjectBuilder,
    decode_block,
    decode_header,
    header_length_hint,
    iter_block_batches,
)
from edge_gateway.format.manifest import Manifest, ManifestEntry

KEY = "regions/north/log/00000000000000000001.egw"
NULL_RECORDS = [
    Record(0, 1000, b"k", None, (("h", None), ("g", b"x"))),
    Record(1, 1001, None, b"", ()),
]
PLAIN_RECORDS = [Record(0, 1000, b"k", b"v", (("g", b"x"),))]


def build(*partitions: list[Record]) -> bytes:
    b = LogObjectBuilder()
    for p, records in enumerate(partitions):
        b.add_batch("t", p, encode_records(records))
    return b.build("north", 1, 1, 1, 5, 0)


def test_an_object_with_nulls_has_the_flag_and_gives_them_back() -> None:
    obj = build(PLAIN_RECORDS, NULL_RECORDS)
    h = decode_header(obj, where=KEY)
    assert h.flags == FLAG_NULLS
    assert h.has_nulls
    got = []
    for b in h.blocks:
        raw = decode_block(b, obj[b.offset : b.end], where=KEY)
        for batch in iter_block_batches(b, raw, where=KEY):
            got.append(batch.records())
    assert got == [PLAIN_RECORDS, NULL_RECORDS]
    assert read_header(encode_records(NULL_RECORDS)).flags & BATCH_NULLS


def test_an_object_without_nulls_is_unchanged() -> None:
    obj = build(PLAIN_RECORDS)
    h = decode_header(obj, where=KEY)
    assert h.flags == 0
    assert not h.has_nulls
    assert obj[5] == 0  # the flags byte older readers read


def test_a_reader_from_before_nulls_refuses_the_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """The previous reader knew FENCE and ENCRYPTED: bit 2 is a format it does not know."""
    with_nulls, plain = build(NULL_RECORDS), build(PLAIN_RECORDS)
    monkeypatch.setattr(logobject, "_KNOWN_FLAGS", logobject.FLAG_FENCE | logobject.FLAG_ENCRYPTED)
    with pytest.raises(UnsupportedFormat, match="unknown flags 0x04"):
        decode_header(with_nulls, where=KEY)
    with pytest.raises(CorruptData, match="unknown flags 0x04"):
        header_length_hint(with_nulls[:12])
    assert not decode_header(plain, where=KEY).has_nulls  # and reads the rest as before


def test_the_nulls_flag_without_blocks_is_corrupt() -> None:
    h = decode_header(logobject.encode_fence("north", 1, 1, 1, 0), where=KEY)
    with pytest.raises(CorruptData, match="NULLS flag has blocks"):
        logobject.validate_header(dataclasses.replace(h, flags=h.flags | FLAG_NULLS), where=KEY)


def _manifest(*objects: bytes) -> Manifest:
    entries = []
    for obj in objects:
        h = decode_header(obj, where=KEY)
        entries.append(ManifestEntry.from_header(h, len(obj)))
    return Manifest.covering(
        region="north", epoch=1, entries=entries, low_watermark=1, created_ms=0
    )


def _objects(with_nulls: bool) -> bytes:
    b = LogObjectBuilder()
    b.add_batch("t", 0, encode_records(NULL_RECORDS if with_nulls else PLAIN_RECORDS))
    return b.build("north", 1, 1, 1, 5, 0)


def test_a_manifest_with_a_nulls_entry_is_version_4() -> None:
    m = _manifest(_objects(True))
    doc = json.loads(m.encode())
    assert doc["version"] == fmanifest.VERSION_NULLS == 4
    assert doc["entries"][0]["nulls"] is True
    back = Manifest.decode(m.encode(), where="m")
    assert back == m
    assert back.entries[0].nulls
    assert back.entries[0].to_header("north").has_nulls
    plain = json.loads(_manifest(_objects(False)).encode())
    assert plain["version"] == 1
    assert "nulls" not in plain["entries"][0]


def test_manifest_nulls_must_be_true() -> None:
    doc = json.loads(_manifest(_objects(True)).encode())
    doc["entries"][0]["nulls"] = False
    with pytest.raises(CorruptData, match="nulls must be true"):
        Manifest.decode(json.dumps(doc).encode(), where="m")
    del doc["entries"][0]["nulls"]
    with pytest.raises(CorruptData, match="version 4 manifest with no entry of null values"):
        Manifest.decode(json.dumps(doc).encode(), where="m")
    doc["version"] = 3
    doc["entries"][0]["nulls"] = True  # an older version has no such key
    with pytest.raises(CorruptData):
        Manifest.decode(json.dumps(doc).encode(), where="m")


def test_a_reader_from_before_nulls_refuses_the_manifest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _manifest(_objects(True)).encode()
    monkeypatch.setattr(fmanifest, "_VERSIONS", (1, 2, 3))
    with pytest.raises(CorruptData, match="unsupported manifest version 4"):
        Manifest.decode(data, where="m")


OLD_READER = """
import sys
from edge_gateway.errors import CorruptData, UnsupportedFormat
from edge_gateway.format.batch import decode_batch
from edge_gateway.format.logobject import decode_header
from edge_gateway.format.manifest import Manifest
obj, manifest, batch = sys.stdin.buffer.read().split(b"\\0SPLIT\\0")
for what, read in (
    ("object", lambda: decode_header(obj, where="k")),
    ("manifest", lambda: Manifest.decode(manifest, where="m")),
    ("batch", lambda: decode_batch(batch)),
):
    try:
        read()
    except UnsupportedFormat as exc:
        print(what, "unsupported:", exc.reason)
    except CorruptData as exc:
        print(what, "corrupt:", exc.reason)
    else:
        print(what, "decoded")
"""

#: The last commit whose readers knew no nulls (this branch's base, 2026-11-26).
BEFORE_NULLS = "4926e61fd99b2fd32ddcd380c911c4eaed7c191f"


def test_the_reader_before_nulls_refuses_them_as_unknown_formats(tmp_path: Path) -> None:
    """The code before nulls (this repository at that commit) refuses the object as an
    unknown format (UnsupportedFormat: a mirror stops and waits for an upgrade instead
    of setting the object aside) and the manifest as an unknown version."""
    old = old_sources(BEFORE_NULLS, tmp_path / "old")
    assert "FLAG_NULLS" not in (old / "edge_gateway/format/batch.py").read_text()
    obj = _objects(True)
    data = b"\0SPLIT\0".join([obj, _manifest(obj).encode(), encode_records(NULL_RECORDS)])
    out = run_old(old, OLD_READER, data)
    assert "object unsupported: unknown flags 0x04" in out, out
    assert "manifest corrupt: unsupported manifest version 4" in out, out
    assert "batch corrupt: unknown flags 0x07" in out, out  # KEYS | HEADERS | NULLS
