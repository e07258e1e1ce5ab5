"""Manifest v1 (``edge_gateway.format.manifest``): round trips, ``Manifest.covering``,
hostile documents, fuzzing, and the bucket keys of a region's log.

``docs/log-object.md`` ("Manifest") is the spec. ``Manifest.decode`` promises
to raise :class:`CorruptData` and nothing else for a malformed document, so the
hostile and fuzz tests catch *every* exception and fail on any other type.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from _fuzz import load as load_fuzz
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_gateway import bucket_log
from edge_gateway.errors import CorruptData, InvalidInput, InvalidName
from edge_gateway.format import manifest as fmanifest
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.logobject import (
    CODEC_NONE,
    CODEC_ZSTD,
    BlockIndex,
    LogObjectBuilder,
    decode_header,
    encode_fence,
    header_size,
    plan_ranges,
)
from edge_gateway.format.manifest import (
    MAX_DOCUMENT_BYTES,
    MAX_ENTRIES,
    Manifest,
    ManifestEntry,
    gc_boundary_key,
    log_key,
    log_prefix,
    manifest_key,
    manifest_prefix,
    parse_log_key,
    parse_manifest_key,
    region_prefix,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEY = "regions/north/manifest/00000000000000000002.json"
U64_MAX = 2**64 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1

#: A manifest of a fence (seq 1) and one entry with one block (seq 2), byte for
#: byte as ``Manifest.encode`` writes it; ``docs/log-object.md`` shows it too.
GOLDEN = (
    b'{"created_ms":1700000000400,"entries":['
    b'{"blocks":[],"epoch":1,"fence":true,"first_lsn":1,"header_length":67,'
    b'"last_lsn":0,"seq":1,"size":67},'
    b'{"blocks":[["telemetry",0,0,1,2,1700000000100,1700000000200,139,56,104,1,2276856629]],'
    b'"epoch":1,"fence":false,"first_lsn":1,"header_length":139,"last_lsn":3,"seq":2,"size":195}'
    b'],"epoch":1,"first_seq":1,"format":"edgegw-manifest","last_seq":2,"low_watermark":1,'
    b'"next_offsets":[["telemetry",0,2]],"region":"north","version":1}'
)


# --------------------------------------------------------------------------
# helpers


def only_corrupt(fn: Callable[[], object]) -> object:
    """Run ``fn``; CorruptData is returned, success passes through, anything
    else fails the test with the offending exception type in the message."""
    try:
        return fn()
    except CorruptData as exc:
        return exc
    except Exception as exc:
        pytest.fail(f"{type(exc).__name__} escaped Manifest.decode: {exc!r}")


def decode_or_corrupt(data: bytes, **kw: Any) -> Manifest | CorruptData:
    got = only_corrupt(lambda: Manifest.decode(data, where=KEY, **kw))
    assert isinstance(got, Manifest | CorruptData)
    return got


def golden_manifest() -> Manifest:
    fence = ManifestEntry(1, 1, 1, 0, True, 67, 67)
    block = BlockIndex(
        "telemetry", 0, 0, 1, 2, 1700000000100, 1700000000200, 139, 56, 104, CODEC_ZSTD, 2276856629
    )
    data = ManifestEntry(2, 1, 1, 3, False, 139, 195, (block,))
    return Manifest.covering(
        region="north", epoch=1, entries=[fence, data], low_watermark=1, created_ms=1700000000400
    )


def golden_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(GOLDEN)
    return doc


def dumps(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def block(
    topic: str,
    partition: int,
    first: int,
    count: int,
    offset: int,
    *,
    raw: int = 1000,
    stored: int = 500,
) -> BlockIndex:
    """A valid index entry: ``count`` records from ``first`` stored at byte ``offset``."""
    codec = CODEC_NONE if stored == raw else CODEC_ZSTD
    return BlockIndex(topic, partition, first, first + count - 1, count, 0, 9, offset, stored, raw,
                      codec, 0xDEADBEEF)  # fmt: skip


def data_entry(
    seq: int, first_lsn: int, last_lsn: int, parts: list[tuple[str, int, int, int]], epoch: int = 1
) -> ManifestEntry:
    """An entry with a block per (topic, partition, first_offset, count), back to back."""
    hlen = header_size("north", (t for t, _, _, _ in parts))
    blocks, pos = [], hlen
    for topic, partition, first, count in sorted(parts):
        b = block(topic, partition, first, count, pos)
        blocks.append(b)
        pos = b.end
    return ManifestEntry(seq, epoch, first_lsn, last_lsn, False, hlen, pos, tuple(blocks))


def fence_entry(seq: int, last_lsn: int, epoch: int = 1) -> ManifestEntry:
    hlen = header_size("north", ())
    return ManifestEntry(seq, epoch, last_lsn + 1, last_lsn, True, hlen, hlen)


# --------------------------------------------------------------------------
# strategies

TOPICS = ["a", "b.c", "t-1", "Z_9", "x" * 200]
REGIONS = ["r1", "north", "R_2-x", "z" * 200]


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    """A valid manifest: entries with contiguous seqs, growing LSNs, gap-free offsets."""
    region = draw(st.sampled_from(REGIONS))
    n = draw(st.integers(1, 6))
    first_seq = draw(st.one_of(st.integers(1, 50), st.integers(1, U64_MAX - n + 1)))
    epoch = draw(st.one_of(st.integers(0, 5), st.just(U64_MAX)))
    lsn = draw(st.one_of(st.integers(0, 1000), st.integers(0, U64_MAX - 10**6)))
    offset_start = st.one_of(st.integers(0, 100), st.integers(I64_MIN, I64_MAX - 1000))
    keys = st.tuples(st.sampled_from(TOPICS), st.integers(0, 3) | st.just(2**32 - 1))
    previous = draw(st.dictionaries(keys, offset_start, max_size=3))
    offsets = dict(previous)
    entries = []
    for i in range(n):
        kind = draw(st.sampled_from(["fence", "nothing", "data", "data"]))
        e_epoch = draw(st.integers(0, epoch))
        first_lsn = lsn + 1 + (0 if kind == "fence" else draw(st.integers(0, 50)))
        if kind == "fence":
            last_lsn = lsn
        elif kind == "nothing":
            last_lsn = first_lsn - 1 + draw(st.integers(0, 10))
        else:
            last_lsn = first_lsn + draw(st.integers(0, 100))
        lsn = max(lsn, last_lsn)
        parts = sorted(draw(st.sets(keys, min_size=1, max_size=4))) if kind == "data" else []
        # a partition may come in two consecutive blocks: count the extra topics
        split = {k: draw(st.integers(1, 2)) for k in parts}
        hlen = header_size(region, (t for (t, p) in parts for _ in range(split[(t, p)])))
        blocks, pos = [], hlen
        for topic, partition in parts:
            for _ in range(split[(topic, partition)]):
                start = offsets.get((topic, partition))
                if start is None:
                    start = draw(offset_start)
                count = draw(st.integers(1, 5))
                raw = draw(st.one_of(st.integers(40 + 12 * count, 5000), st.just(256 * 2**20)))
                codec = draw(st.sampled_from([CODEC_NONE, CODEC_ZSTD]))
                stored = raw if codec == CODEC_NONE else draw(st.integers(1, raw))
                lo = draw(st.integers(I64_MIN, I64_MAX))
                hi = draw(st.integers(lo, I64_MAX))
                b = BlockIndex(topic, partition, start, start + count - 1, count, lo, hi, pos,
                               stored, raw, codec, draw(st.integers(0, 2**32 - 1)))  # fmt: skip
                blocks.append(b)
                pos = b.end
                offsets[(topic, partition)] = b.next_offset
        entries.append(
            ManifestEntry(
                first_seq + i,
                e_epoch,
                first_lsn,
                last_lsn,
                kind == "fence",
                hlen,
                pos,
                tuple(blocks),
            )
        )
    return Manifest.covering(
        region=region,
        epoch=epoch,
        entries=entries,
        low_watermark=draw(st.integers(1, first_seq)),
        created_ms=draw(st.integers(I64_MIN, I64_MAX)),
        previous_offsets=previous,
    )


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["north", "t", "edgegw-manifest", "", "a/b", "..", "\u00e9"])
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)


# --------------------------------------------------------------------------
# round trips


def test_golden_document() -> None:
    m = golden_manifest()
    assert m.encode() == GOLDEN
    assert Manifest.decode(GOLDEN, where=KEY) == m
    assert m.first_seq == 1
    assert m.last_seq == 2
    assert m.next_offsets == {("telemetry", 0): 2}


@FAST
@given(manifests())
def test_round_trip(m: Manifest) -> None:
    data = m.encode()
    back = Manifest.decode(data, where=KEY)
    assert back == m
    assert back.encode() == data
    # compact, sorted keys, plain ASCII: what the spec says a writer produces
    assert json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode() == data
    assert data.isascii()
    # decode takes any buffer
    assert Manifest.decode(memoryview(bytearray(data)), where=KEY) == m
    assert Manifest.decode(data, where=KEY, region=m.region, last_seq=m.last_seq) == m


@FAST
@given(manifests())
def test_next_offsets_follow_the_blocks(m: Manifest) -> None:
    last: dict[tuple[str, int], int] = {}
    for e in m.entries:
        for b in e.blocks:
            last[(b.topic, b.partition)] = b.next_offset
    for key, offset in last.items():
        assert m.next_offsets[key] == offset
    assert [e.seq for e in m.entries] == list(range(m.first_seq, m.last_seq + 1))


def real_objects() -> tuple[str, list[tuple[bytes, Any]]]:
    """A fence and two data objects of region 'north', as the shipper builds them."""
    region = "north"
    fence = encode_fence(region, 2, 5, 10, 1_700_000_000_000)
    b1 = LogObjectBuilder()
    b1.add_batch("orders", 0, encode_batch([b"o%d" % i for i in range(5)], timestamps=100))
    b1.add_batch("telemetry", 3, encode_batch([b"x" * 100] * 8, timestamps=[1, 2] * 4))
    o1 = b1.build(region, 2, 6, 11, 14, 1_700_000_000_100)
    b2 = LogObjectBuilder()
    b2.add_batch("orders", 0, encode_batch([b"p"] * 3, timestamps=200, base_offset=5))
    o2 = b2.build(region, 2, 7, 15, 15, 1_700_000_000_200)
    return region, [(o, decode_header(o, where="o", object_size=len(o))) for o in (fence, o1, o2)]


def test_entries_of_real_objects() -> None:
    region, objects = real_objects()
    entries = [ManifestEntry.from_header(h, len(o)) for o, h in objects]
    m = Manifest.covering(
        region=region,
        epoch=2,
        entries=entries,
        low_watermark=3,
        created_ms=1_700_000_000_300,
        previous_offsets={("orders", 0): 0, ("old", 1): 42},
    )
    back = Manifest.decode(m.encode(), where=KEY, region=region, last_seq=7)
    assert back == m
    assert back.next_offsets == {("orders", 0): 8, ("telemetry", 3): 8, ("old", 1): 42}
    assert back.entries[0].fence
    for entry, (obj, header) in zip(back.entries, objects, strict=True):
        # The entry holds everything of the header but the creation time.
        assert entry.to_header(region, header.created_ms) == header
        assert entry.to_block_index() == header.blocks
        assert entry.total_length == entry.size == len(obj)
        # A reader plans the same ranged GETs from the manifest as from the header.
        for wanted in ({("orders", 0)}, {("telemetry", 3)}, set()):
            for have in (0, header.header_length):
                assert plan_ranges(entry, wanted, have=have) == plan_ranges(
                    header, wanted, have=have
                )


def test_from_header_checks_the_size() -> None:
    _, objects = real_objects()
    obj, header = objects[1]
    with pytest.raises(InvalidInput, match="size"):
        ManifestEntry.from_header(header, len(obj) + 1)


# --------------------------------------------------------------------------
# covering


def test_covering_carries_and_advances_offsets() -> None:
    previous = {("a", 0): 10, ("b", 1): 5, ("c", 0): 7}
    kept = dict(previous)
    entries = [
        data_entry(4, 11, 12, [("a", 0, 10, 3)]),
        fence_entry(5, 12, epoch=2),
        data_entry(6, 13, 20, [("a", 0, 13, 2), ("b", 1, 5, 1), ("new", 2, 0, 4)], epoch=2),
    ]
    m = Manifest.covering(
        region="north",
        epoch=2,
        entries=entries,
        low_watermark=1,
        created_ms=5,
        previous_offsets=previous,
    )
    assert previous == kept, "covering must not modify the caller's mapping"
    assert (m.first_seq, m.last_seq, m.entries) == (4, 6, tuple(entries))
    assert m.next_offsets == {("a", 0): 15, ("b", 1): 6, ("c", 0): 7, ("new", 2): 4}
    assert Manifest.decode(m.encode(), where=KEY) == m


def test_covering_a_partition_split_into_two_blocks() -> None:
    hlen = header_size("north", ["t", "t"])
    b1 = block("t", 0, 0, 3, hlen)
    b2 = block("t", 0, 3, 2, b1.end)
    e = ManifestEntry(1, 1, 1, 1, False, hlen, b2.end, (b1, b2))
    m = Manifest.covering(region="north", epoch=1, entries=[e], low_watermark=1, created_ms=0)
    assert m.next_offsets == {("t", 0): 5}
    assert Manifest.decode(m.encode(), where=KEY) == m


def test_covering_without_previous_offsets_starts_anywhere() -> None:
    # A first manifest after GC, or of a log restored at offset 1000.
    e = data_entry(9, 1, 1, [("t", 0, 1000, 1)])
    m = Manifest.covering(region="north", epoch=1, entries=[e], low_watermark=9, created_ms=0)
    assert m.next_offsets == {("t", 0): 1001}


def test_covering_refuses_what_cannot_be_a_manifest() -> None:
    with pytest.raises(InvalidInput, match="at least one"):
        Manifest.covering(region="north", epoch=1, entries=[], low_watermark=1, created_ms=0)
    e = data_entry(3, 1, 1, [("t", 0, 10, 1)])
    for start in (9, 11):  # a gap, an overlap with the previous manifest
        with pytest.raises(InvalidInput, match="continues at"):
            Manifest.covering(
                region="north",
                epoch=1,
                entries=[e],
                low_watermark=1,
                created_ms=0,
                previous_offsets={("t", 0): start},
            )
    # The remaining rules are the document's: encode refuses to write them.
    bad = [
        [data_entry(3, 1, 1, []), data_entry(5, 2, 2, [])],  # a missing seq
        [data_entry(4, 1, 1, []), data_entry(3, 2, 2, [])],  # out of order
        [data_entry(3, 5, 6, []), data_entry(4, 2, 2, [])],  # LSNs going back
        [data_entry(3, 1, 1, [], epoch=2)],  # an entry above the manifest's epoch
    ]
    for entries in bad:
        m = Manifest.covering(
            region="north", epoch=1, entries=entries, low_watermark=1, created_ms=0
        )
        with pytest.raises(InvalidInput, match="invalid manifest"):
            m.encode()


def test_encode_rejects_invalid_fields() -> None:
    m = golden_manifest()
    for change in (
        {"region": "no/slash"},
        {"epoch": -1},
        {"low_watermark": 0},
        {"low_watermark": 2},
        {"created_ms": 2**63},
        {"next_offsets": {("telemetry", 0): 3}},
        {"next_offsets": {("telemetry", "0"): 2}},
        {"next_offsets": {"telemetry": 2}},
    ):
        bad = Manifest(**{**_fields(m), **change})
        with pytest.raises(InvalidInput):
            bad.encode()


def _fields(m: Manifest) -> dict[str, Any]:
    return {f: getattr(m, f) for f in Manifest.__dataclass_fields__}


def test_next_offset_after_the_last_i64_offset() -> None:
    e = data_entry(1, 1, 1, [("t", 0, I64_MAX, 1)])
    m = Manifest.covering(region="north", epoch=1, entries=[e], low_watermark=1, created_ms=0)
    assert m.next_offsets == {("t", 0): 2**63}
    assert Manifest.decode(m.encode(), where=KEY) == m


# --------------------------------------------------------------------------
# hostile documents


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        node: Any = doc
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value

    return mutate


def _delete(path: tuple[Any, ...]) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        node: Any = doc
        for step in path[:-1]:
            node = node[step]
        del node[path[-1]]

    return mutate


def _apply(fn: Callable[[dict[str, Any]], None]) -> bytes:
    doc = golden_doc()
    fn(doc)
    return dumps(doc)


def _text(old: bytes, new: bytes) -> bytes:
    assert GOLDEN.count(old) >= 1, old
    return GOLDEN.replace(old, new, 1)


def _swap_entries(doc: dict[str, Any]) -> None:
    doc["entries"].reverse()


def _three_entries(third: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Append a copy of entry 2 as seq 3 (LSNs 4..4, offsets 2..3), then change it."""

    def mutate(doc: dict[str, Any]) -> None:
        e = copy.deepcopy(doc["entries"][1])
        e.update(seq=3, first_lsn=4, last_lsn=4)
        e["blocks"][0][2:4] = [2, 3]
        doc["entries"].append(e)
        doc["last_seq"] = 3
        doc["next_offsets"] = [["telemetry", 0, 4]]
        third(e)

    return mutate


def _nested(depth: int) -> bytes:
    return b'{"format":' + b"[" * depth + b"]" * depth + b"}"


BLOCK0 = ("entries", 1, "blocks", 0)

# id -> (document bytes, a fragment the message must contain)
HOSTILE: dict[str, tuple[bytes, str]] = {
    # not a manifest at all
    "empty": (b"", "not valid JSON"),
    "truncated": (GOLDEN[:-1], "not valid JSON"),
    "not utf-8": (b'{"format":"\xff"}', "not valid JSON"),
    "utf-8 bom": (b"\xef\xbb\xbf" + GOLDEN, "not valid JSON"),
    "trailing data": (GOLDEN + b"{}", "not valid JSON"),
    "array": (b"[1, 2]", "must be a JSON object, got array"),
    "string": (b'"edgegw-manifest"', "must be a JSON object, got string"),
    "wrong format": (_apply(_set(("format",), "edgegw-manifesto")), "not a manifest"),
    "format missing": (_apply(_delete(("format",))), "not a manifest (format None)"),
    "format nested": (_nested(100), "not a manifest (format an array)"),
    "deep nesting": (b"[" * 100_000, "not valid JSON"),
    "version 5": (_apply(_set(("version",), 5)), "unsupported manifest version 5"),
    "version 3 without key ids or gaps": (
        _apply(_set(("version",), 3)),
        "neither a key id nor a gap table",
    ),
    "version string": (_apply(_set(("version",), "1")), "unsupported manifest version '1'"),
    "version bool": (_text(b'"version":1', b'"version":true'), "unsupported manifest version"),
    # JSON that is not ours
    "float": (_text(b'"epoch":1,', b'"epoch":1.0,'), "non-integer number '1.0'"),
    "exponent": (_text(b'"epoch":1,', b'"epoch":1e0,'), "non-integer number"),
    "huge exponent": (_text(b'"epoch":1,', b'"epoch":1e999999,'), "non-integer number"),
    "nan": (_text(b'"created_ms":1700000000400', b'"created_ms":NaN'), "NaN is not allowed"),
    "infinity": (_text(b'"created_ms":1700000000400', b'"created_ms":-Infinity'), "Infinity"),
    "duplicate key": (_text(b'{"created_ms"', b'{"epoch":1,"created_ms"'), "duplicate key"),
    "duplicate nested key": (_text(b'{"blocks":[],', b'{"seq":1,"blocks":[],'), "duplicate key"),
    "too many digits": (_text(b'"epoch":1,', b'"epoch":' + b"1" * 5000 + b","), "not valid JSON"),
    # top-level fields
    "missing key": (_apply(_delete(("epoch",))), "missing keys ['epoch']"),
    "unknown key": (_apply(_set(("extra",), 1)), "unknown keys ['extra']"),
    "bool as int": (_apply(_set(("epoch",), True)), "epoch must be an integer, got boolean"),
    "null epoch": (_apply(_set(("epoch",), None)), "epoch must be an integer, got null"),
    "string epoch": (_apply(_set(("epoch",), "1")), "epoch must be an integer, got string"),
    "negative epoch": (_apply(_set(("epoch",), -1)), "epoch -1 out of range"),
    "epoch 2**64": (_apply(_set(("epoch",), 2**64)), "epoch 18446744073709551616 out of range"),
    "huge int": (_apply(_set(("epoch",), 10**400)), "out of range"),
    "region type": (_apply(_set(("region",), 7)), "region: region name must be a string"),
    "region path": (_apply(_set(("region",), "../x")), "region"),
    "region dot": (_apply(_set(("region",), "a.b")), "characters ['.']"),
    "first_seq 0": (_apply(_set(("first_seq",), 0)), "first_seq 0 out of range"),
    "last before first": (_apply(_set(("first_seq",), 3)), "last_seq (>= first_seq) 2"),
    "low_watermark 0": (_apply(_set(("low_watermark",), 0)), "low_watermark (<= first_seq) 0"),
    "low_watermark above": (_apply(_set(("low_watermark",), 2)), "low_watermark (<= first_seq)"),
    "created_ms i64": (_apply(_set(("created_ms",), 2**63)), "created_ms 9223372036854775808"),
    "entries object": (_apply(_set(("entries",), {})), "entries must be an array, got object"),
    "entries missing": (_apply(_set(("last_seq",), 3)), "2 entries for seqs 1..3"),
    "entries extra": (_apply(_set(("last_seq",), 1)), "2 entries for seqs 1..1"),
    # entries
    "entries out of order": (_apply(_swap_entries), "entries[0] has seq 2, expected 1"),
    "entry seq gap": (_apply(_set(("entries", 1, "seq"), 3)), "has seq 3, expected 2"),
    "entry not object": (_apply(_set(("entries", 0), [1])), "entries[0] must be an object"),
    "entry missing key": (_apply(_delete(("entries", 0, "size"))), "missing keys ['size']"),
    "entry epoch above": (_apply(_set(("entries", 1, "epoch"), 2)), "(<= the manifest's)"),
    "fence type": (_apply(_set(("entries", 0, "fence"), 1)), "fence must be a boolean"),
    "fence with lsns": (_apply(_set(("entries", 0, "last_lsn"), 1)), "a fence entry must"),
    "fence with blocks": (
        _apply(_set(("entries", 1, "fence"), True)),
        "a fence entry must have no blocks",
    ),
    "first_lsn 0": (_apply(_set(("entries", 0, "first_lsn"), 0)), "first_lsn is 0"),
    "negative lsn range": (_apply(_set(("entries", 1, "last_lsn"), -1)), "last_lsn -1 out of"),
    "lsn range backwards": (_apply(_set(("entries", 1, "first_lsn"), 5)), "LSN range 5..3"),
    "lsns going back": (
        _apply(_three_entries(lambda e: e.update(first_lsn=3))),
        "starts at LSN 3, but the previous entry shipped up to LSN 3",
    ),
    "header_length": (_apply(_set(("entries", 1, "header_length"), 140)), "header_length 140"),
    "header_length huge": (
        _apply(_set(("entries", 1, "header_length"), 2**40)),
        "header_length 1099511627776 out of range",
    ),
    "size short": (_apply(_set(("entries", 1, "size"), 194)), "size 194, its blocks end at 195"),
    "size of fence": (_apply(_set(("entries", 0, "size"), 68)), "size 68"),
    "blocks not array": (_apply(_set(("entries", 1, "blocks"), "x")), "blocks must be an array"),
    # block rows
    "row short": (_apply(_set(BLOCK0, ["telemetry", 0])), "has 2 fields, expected 12"),
    "row not array": (_apply(_set(BLOCK0, {"topic": "t"})), "blocks[0] must be an array"),
    "row topic": (_apply(_set((*BLOCK0, 0), "a b")), "blocks[0] topic"),
    "row topic type": (_apply(_set((*BLOCK0, 0), None)), "must be a string, got NoneType"),
    "partition negative": (_apply(_set((*BLOCK0, 1), -1)), "partition -1 out of range"),
    "partition float": (
        _text(b'"telemetry",0,0', b'"telemetry",0.5,0'),
        "non-integer number '0.5'",
    ),
    "offsets backwards": (_apply(_set((*BLOCK0, 2), 5)), "first_offset 5 > last_offset"),
    "record count": (_apply(_set((*BLOCK0, 4), 3)), "record_count 3 for offsets 0..1"),
    "timestamps backwards": (_apply(_set((*BLOCK0, 5), 1700000000201)), "min_ts > max_ts"),
    "block overlaps header": (_apply(_set((*BLOCK0, 7), 138)), "at 138, expected at 139"),
    "block after a hole": (_apply(_set((*BLOCK0, 7), 140)), "expected at 139"),
    "stored above raw": (_apply(_set((*BLOCK0, 8), 105)), "stored_length 105 for raw_length"),
    "stored zero": (_apply(_set((*BLOCK0, 8), 0)), "stored_length 0"),
    "raw too small": (_apply(_set((*BLOCK0, 9), 60)), "2 records cannot fit in 60 bytes"),
    "unknown codec": (_apply(_set((*BLOCK0, 10), 2)), "unknown codec 2"),
    "codec 256": (_apply(_set((*BLOCK0, 10), 256)), "codec 256 out of range"),
    "crc u32": (_apply(_set((*BLOCK0, 11), 2**32)), "crc 4294967296 out of range"),
    "offsets overlap across entries": (
        _apply(_three_entries(lambda e: e["blocks"][0].__setitem__(slice(2, 4), [1, 2]))),
        "starts at offset 1, but the previous entries end before 2",
    ),
    "offsets gap across entries": (
        _apply(_three_entries(lambda e: e["blocks"][0].__setitem__(slice(2, 4), [3, 4]))),
        "starts at offset 3",
    ),
    # next offsets
    "next offset wrong": (_apply(_set(("next_offsets", 0, 2), 3)), "next offset of telemetry/0"),
    "next offset missing": (_apply(_set(("next_offsets",), [])), "is None"),
    "next offsets unsorted": (
        _apply(_set(("next_offsets",), [["telemetry", 0, 2], ["a", 0, 1]])),
        "not sorted",
    ),
    "next offsets duplicate": (
        _apply(_set(("next_offsets",), [["telemetry", 0, 2], ["telemetry", 0, 2]])),
        "not sorted",
    ),
    "next offset row": (
        _apply(_set(("next_offsets", 0), ["telemetry", 0])),
        "2 fields, expected 3",
    ),
    "next offset above 2**63": (
        _apply(_set(("next_offsets", 0, 2), 2**63 + 1)),
        "offset 9223372036854775809 out of range",
    ),
    "next offset topic": (_apply(_set(("next_offsets", 0, 0), "")), "must not be empty"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_document(case: str) -> None:
    data, fragment = HOSTILE[case]
    got = decode_or_corrupt(data)
    assert isinstance(got, CorruptData), f"accepted: {got}"
    message = str(got)
    assert fragment in message, message
    assert message.startswith(f"{KEY}: "), message
    assert "\n" not in message
    assert len(message) < 400, message


def test_the_golden_document_itself_is_accepted() -> None:
    # Guards HOSTILE: each case differs from an accepted document in one point.
    assert isinstance(decode_or_corrupt(dumps(golden_doc())), Manifest)
    assert isinstance(decode_or_corrupt(_apply(_three_entries(lambda e: None))), Manifest)


def test_too_many_entries() -> None:
    doc = golden_doc()
    doc["last_seq"] = MAX_ENTRIES + 1
    doc["entries"] = [0] * (MAX_ENTRIES + 1)
    got = decode_or_corrupt(dumps(doc))
    assert isinstance(got, CorruptData)
    assert f"{MAX_ENTRIES + 1} entries exceed the limit of {MAX_ENTRIES}" in str(got)


def test_oversized_document_is_refused_before_parsing() -> None:
    data = b" " * (MAX_DOCUMENT_BYTES + 1)
    got = decode_or_corrupt(data)
    assert isinstance(got, CorruptData)
    assert f"exceeds the limit of {MAX_DOCUMENT_BYTES}" in str(got)


def test_wrong_region_or_seq_for_the_key() -> None:
    got = decode_or_corrupt(GOLDEN, region="south")
    assert isinstance(got, CorruptData)
    assert "manifest of region 'north' under region 'south'" in str(got)
    got = decode_or_corrupt(GOLDEN, region="north", last_seq=3)
    assert isinstance(got, CorruptData)
    assert "ends at seq 2, its key says 3" in str(got)
    assert isinstance(decode_or_corrupt(GOLDEN, region="north", last_seq=2), Manifest)


def test_long_values_are_clipped_in_messages() -> None:
    for data in (
        _apply(_set(("format",), "x" * 100_000)),
        _apply(_set(("version",), "v" * 100_000)),
        _apply(_set(("k" * 100_000,), 1)),
        _apply(_set(("epoch",), 10**4000)),
    ):
        got = decode_or_corrupt(data)
        assert isinstance(got, CorruptData)
        assert len(str(got)) < 300, str(got)[:500]


# --------------------------------------------------------------------------
# fuzzing: whatever the bytes, CorruptData or a manifest that round-trips


def _check_accepted(m: Manifest) -> None:
    again = Manifest.decode(m.encode(), where=KEY)
    assert again == m


@FUZZ
@given(st.binary(max_size=300))
def test_garbage_raises_only_corrupt(data: bytes) -> None:
    got = decode_or_corrupt(data)
    if isinstance(got, Manifest):
        _check_accepted(got)


@FUZZ
@given(json_values)
def test_arbitrary_json_raises_only_corrupt(value: object) -> None:
    data = json.dumps(value).encode()
    got = decode_or_corrupt(data)
    if isinstance(got, Manifest):
        _check_accepted(got)


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i))
    return out


@FUZZ
@given(manifests(), st.data())
def test_mutated_documents_raise_only_corrupt(m: Manifest, data: st.DataObject) -> None:
    doc = json.loads(m.encode())
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        op = data.draw(st.sampled_from(["replace", "replace", "delete", "nudge"]))
        parent: Any = doc
        for step in path[:-1]:
            parent = parent[step]
        old = parent[path[-1]]
        if op == "delete":
            del parent[path[-1]]
        elif op == "nudge" and type(old) is int:
            parent[path[-1]] = old + data.draw(st.sampled_from([-1, 1, 2**32, -(2**63), 2**64]))
        else:
            parent[path[-1]] = data.draw(json_values)
    got = decode_or_corrupt(json.dumps(doc).encode())
    if isinstance(got, Manifest):
        _check_accepted(got)


@FUZZ
@given(manifests(), st.randoms(use_true_random=False))
def test_mutated_bytes_raise_only_corrupt(m: Manifest, rng: random.Random) -> None:
    buf = load_fuzz("_harness").mutate_text(
        rng,
        m.encode(),
        alphabet=b'0123456789-.,:[]{}"eE\\',
        tokens=[b"0", b"1", b"-", b".5", b"e9", b"[", b'"', b",1"],
    )
    got = decode_or_corrupt(buf)
    if isinstance(got, Manifest):
        _check_accepted(got)


# --------------------------------------------------------------------------
# bucket keys


def test_keys() -> None:
    assert log_key("", "north", 7) == "regions/north/log/00000000000000000007.egw"
    assert manifest_key("", "north", 12) == "regions/north/manifest/00000000000000000012.json"
    assert gc_boundary_key("", "north") == "regions/north/gc-boundary.json"
    assert region_prefix("", "north") == "regions/north/"
    assert log_prefix("", "north") == "regions/north/log/"
    assert manifest_prefix("", "north") == "regions/north/manifest/"
    for prefix in ("edge", "edge/"):
        assert log_key(prefix, "n", U64_MAX) == "edge/regions/n/log/18446744073709551615.egw"
        assert manifest_key(prefix, "n", 0) == "edge/regions/n/manifest/00000000000000000000.json"
        assert gc_boundary_key(prefix, "n") == "edge/regions/n/gc-boundary.json"
    # keys sort in seq order: readers LIST a folder and take the last one
    keys = [log_key("", "n", s) for s in (1, 9, 10, 100, 2**40)]
    assert keys == sorted(keys)


@FAST
@given(st.sampled_from(REGIONS), st.integers(0, U64_MAX), st.sampled_from(["", "p", "a/b/"]))
def test_parse_keys_round_trip(region: str, seq: int, prefix: str) -> None:
    assert parse_log_key(log_key(prefix, region, seq), prefix) == (region, seq)
    assert parse_manifest_key(manifest_key(prefix, region, seq), prefix) == (region, seq)


@pytest.mark.parametrize(
    "key",
    [
        "regions/north/log/00000000000000000007.json",
        "regions/north/log/0000000000000000007.egw",
        "regions/north/log/000000000000000000007.egw",
        "regions/north/log/99999999999999999999.egw",
        "regions/no.rth/log/00000000000000000007.egw",
        "regions//log/00000000000000000007.egw",
        "regions/north/manifest/00000000000000000007.egw",
        "x/regions/north/log/00000000000000000007.egw",
        "regions/north/log/00000000000000000007.egw/",
        "regions/north/log/-0000000000000000007.egw",
    ],
)
def test_parse_log_key_refuses(key: str) -> None:
    with pytest.raises(CorruptData):
        parse_log_key(key)


def test_parse_keys_with_prefix() -> None:
    key = "edge/regions/north/manifest/00000000000000000003.json"
    assert parse_manifest_key(key, "edge") == ("north", 3)
    assert parse_manifest_key(key, "edge/") == ("north", 3)
    with pytest.raises(CorruptData, match="not a manifest key under 'other/'"):
        parse_manifest_key(key, "other")
    with pytest.raises(CorruptData, match="not a manifest key"):
        parse_manifest_key(key)
    with pytest.raises(CorruptData, match="not a log key"):
        parse_log_key(key, "edge")


def test_key_arguments_are_checked() -> None:
    for seq in (-1, 2**64, True, "1", 1.0):
        with pytest.raises(InvalidInput, match="seq"):
            log_key("", "north", seq)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="seq"):
            manifest_key("", "north", seq)  # type: ignore[arg-type]
    for region in ("", "a.b", "a/b", None):
        with pytest.raises(InvalidName):
            log_key("", region, 1)  # type: ignore[arg-type]
        with pytest.raises(InvalidName):
            gc_boundary_key("", region)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="prefix"):
        log_key(None, "north", 1)  # type: ignore[arg-type]


def test_one_definition_of_the_key_layout() -> None:
    # bucket_log (the I/O side) uses the sans-IO helpers, not copies of them.
    for name in ("log_key", "gc_boundary_key", "manifest_prefix", "parse_manifest_key"):
        assert getattr(bucket_log, name) is getattr(fmanifest, name)
    assert not hasattr(bucket_log, "manifest_key")
    assert not hasattr(bucket_log, "region_prefix")
