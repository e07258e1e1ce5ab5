"""Log object and manifest version 2: the lane table (``docs/log-object.md``, "Version 2").

A gateway with several journal lanes writes one LSN range per lane; with one
lane it writes version 1, byte for byte as before (the version 1 golden
vectors in ``test_logobject.py`` and ``test_manifest.py`` pin that).
"""

from __future__ import annotations

import dataclasses
import json
import struct

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.logobject import (
    FLAG_FENCE,
    VERSION,
    VERSION_LANES,
    LaneRange,
    LogObjectBuilder,
    LogObjectHeader,
    decode_block,
    decode_header,
    encode_fence,
    encode_header,
    header_length_hint,
    iter_block_batches,
    slice_block,
)
from edge_gateway.format.manifest import Manifest, ManifestEntry

KEY = "regions/r1/log/00000000000000000007.egw"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

GOLDEN_V2_FENCE_HEX = (
    "4547574c"  # magic "EGWL"
    "02"  # version 2
    "01"  # flags: FENCE
    "0000"  # reserved
    "63000000"  # header_length 99 = 63 + 1 + 2 * 17
    "0200000000000000"  # epoch 2
    "0700000000000000"  # seq 7
    "2a00000000000000"  # first_lsn 42  (lane 0: empty, 41 shipped)
    "2900000000000000"  # last_lsn 41
    "0068e5cf8b010000"  # created_ms 1700000000000
    "0200"  # region_len 2
    "7231"  # "r1"
    "02"  # n_lanes 2
    "01" "0a00000000000000" "0900000000000000"  # lane 1: 10..9 (empty, 9 shipped)
    "02" "0100000000000000" "0000000000000000"  # lane 2: 1..0 (empty, nothing shipped)
    "00000000"  # n_blocks 0
    "261e69d5"  # CRC-32C of the 95 bytes before
)  # fmt: skip


def _two_lane_object() -> tuple[bytes, LogObjectHeader]:
    b = LogObjectBuilder()
    b.add_batch("alarms", 0, encode_batch([b"fire"], timestamps=5, base_offset=3))
    b.add_batch("metrics", 1, encode_batch([b"x" * 50] * 4, timestamps=6))
    lanes = (LaneRange(1, 20, 20), LaneRange(2, 8, 7))
    obj = b.build("r1", 3, 7, 11, 11, 1_700_000_000_000, lanes=lanes)
    return obj, decode_header(obj, where=KEY, object_size=len(obj))


def test_golden_v2_fence() -> None:
    fence = encode_fence("r1", 2, 7, 41, 1_700_000_000_000, {2: 0, 1: 9})
    assert fence.hex() == GOLDEN_V2_FENCE_HEX
    assert crc32c.crc32c(fence[:-4]) == 0xD5691E26
    h = decode_header(bytes.fromhex(GOLDEN_V2_FENCE_HEX), where=KEY, object_size=99)
    assert h == LogObjectHeader(
        2,
        FLAG_FENCE,
        99,
        2,
        7,
        42,
        41,
        1_700_000_000_000,
        "r1",
        (),
        (LaneRange(1, 10, 9), LaneRange(2, 1, 0)),
    )
    assert h.is_fence
    assert all(r.is_empty for r in h.lanes)


def test_one_lane_stays_version_1() -> None:
    assert encode_fence("r1", 2, 7, 41, 0, {}) == encode_fence("r1", 2, 7, 41, 0)
    assert encode_fence("r1", 2, 7, 41, 0)[4] == VERSION
    b = LogObjectBuilder()
    b.add_batch("t", 0, encode_batch([b"a"], timestamps=1))
    assert b.build("r1", 1, 7, 1, 1, 0, lanes=()) == b.build("r1", 1, 7, 1, 1, 0)


def test_v2_round_trip_and_blocks() -> None:
    obj, h = _two_lane_object()
    assert h.version == VERSION_LANES
    assert (h.first_lsn, h.last_lsn) == (11, 11)
    assert h.lanes == (LaneRange(1, 20, 20), LaneRange(2, 8, 7))
    assert header_length_hint(obj[:12]) == h.header_length
    assert encode_header(h) == obj[: h.header_length]
    offsets = {}
    for b in h.blocks:
        raw = decode_block(b, slice_block(b, [(0, obj)], where=KEY), where=KEY)
        offsets[b.topic] = [r.offset for x in iter_block_batches(b, raw) for r in x.records()]
    assert offsets == {"alarms": [3], "metrics": [0, 1, 2, 3]}


def test_v2_entry_without_data_in_lane_0() -> None:
    # Everything shipped from lane 1: lane 0's range is empty, the entry has blocks.
    b = LogObjectBuilder()
    b.add_batch("alarms", 0, encode_batch([b"fire"], timestamps=5))
    obj = b.build("r1", 1, 2, 1, 0, 0, lanes=(LaneRange(1, 1, 1),))
    h = decode_header(obj, where=KEY, object_size=len(obj))
    assert (h.first_lsn, h.last_lsn, h.lanes) == (1, 0, (LaneRange(1, 1, 1),))
    # ... but some lane's range must be non-empty when there are blocks.
    with pytest.raises(InvalidInput, match="empty LSN range"):
        b.build("r1", 1, 2, 1, 0, 0, lanes=(LaneRange(1, 2, 1),))


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"lanes": ()}, "lane table of at least one lane"),
        ({"version": 1}, "version 1 entry has no lane table"),
        ({"lanes": (LaneRange(0, 1, 0),)}, "out of range"),
        ({"lanes": (LaneRange(256, 1, 0),)}, "out of range"),
        ({"lanes": (LaneRange(2, 1, 0), LaneRange(1, 1, 0))}, "ascending"),
        ({"lanes": (LaneRange(1, 1, 0), LaneRange(1, 1, 0))}, "ascending"),
        ({"lanes": (LaneRange(1, 0, 0),)}, "out of range"),
        ({"lanes": (LaneRange(1, 5, 3),)}, "negative"),
        ({"version": 4}, "unsupported log object version 4"),
    ],
)
def test_v2_header_validation(change: dict[str, object], fragment: str) -> None:
    h = decode_header(encode_fence("r1", 2, 7, 41, 0, {1: 9}), where=KEY)
    bad = dataclasses.replace(h, **change)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match=fragment):
        encode_header(bad)


def test_v2_fence_with_lane_lsns_refused() -> None:
    h = decode_header(encode_fence("r1", 2, 7, 41, 0, {1: 9}), where=KEY)
    with pytest.raises(InvalidInput, match="fence"):
        encode_header(dataclasses.replace(h, lanes=(LaneRange(1, 10, 10),)))


def _recrc(buf: bytearray) -> bytes:
    (hlen,) = struct.unpack_from("<I", buf, 8)
    struct.pack_into("<I", buf, hlen - 4, crc32c.crc32c(bytes(buf[: hlen - 4])))
    return bytes(buf)


def test_v2_decoder_refuses_hostile_tables() -> None:
    good = bytearray(bytes.fromhex(GOLDEN_V2_FENCE_HEX))
    lane_table = 54 + 2
    cases = {
        "n_lanes overruns": (lane_table, b"\xff", "lane table overruns"),
        "n_lanes too small": (lane_table, b"\x01", "index entries cannot fit"),
        "zero lanes": (lane_table, b"\x00", "index entries cannot fit"),
        "lane 0 in the table": (lane_table + 1, b"\x00", "out of range"),
        "descending": (lane_table + 1, b"\x03", "ascending"),
    }
    for name, (at, data, fragment) in cases.items():
        buf = bytearray(good)
        buf[at : at + len(data)] = data
        with pytest.raises(CorruptData, match=fragment):
            decode_header(_recrc(buf), where=KEY)
        del name
    # A version 1 object relabelled version 2 (and the reverse) never decodes.
    v1 = bytearray(encode_fence("r1", 2, 7, 41, 0))
    v1[4] = 2
    with pytest.raises(CorruptData):
        decode_header(_recrc(v1), where=KEY)
    v2 = bytearray(good)
    v2[4] = 1
    with pytest.raises(CorruptData):
        decode_header(_recrc(v2), where=KEY)


def test_v2_decoded_whole_and_in_pieces() -> None:
    obj, h = _two_lane_object()
    for n in range(h.header_length):
        with pytest.raises(CorruptData):
            decode_header(obj[:n], where=KEY)
    assert decode_header(obj[: h.header_length], where=KEY) == h


_lane_sets = st.lists(
    st.tuples(st.integers(1, 255), st.integers(1, 2**64 - 1), st.integers(0, 3)),
    min_size=1,
    max_size=6,
    unique_by=lambda t: t[0],
)


@FAST
@given(lanes=_lane_sets, main=st.integers(0, 2**40), epoch=st.integers(0, 2**64 - 1))
def test_v2_round_trip_property(lanes: list[tuple[int, int, int]], main: int, epoch: int) -> None:
    table = tuple(
        LaneRange(lane, first, min(first + length - 1, 2**64 - 1))
        for lane, first, length in sorted(lanes)
    )
    b = LogObjectBuilder()
    b.add_batch("t", 0, encode_batch([b"v"], timestamps=1))
    if all(r.is_empty for r in table):
        table = (*table[:-1], LaneRange(table[-1].lane, table[-1].first_lsn, table[-1].first_lsn))
    obj = b.build("r1", epoch, 1, main + 1, main, 0, lanes=table)
    h = decode_header(obj, where=KEY, object_size=len(obj))
    assert h.lanes == table
    assert encode_header(h) == obj[: h.header_length]


# --------------------------------------------------------------------------
# manifest version 2


def _entries(objs: list[bytes]) -> list[ManifestEntry]:
    return [ManifestEntry.from_header(decode_header(o, where="t"), len(o)) for o in objs]


def _v2_manifest() -> Manifest:
    b = LogObjectBuilder()
    b.add_batch("alarms", 0, encode_batch([b"fire"], timestamps=5))
    objs = [
        encode_fence("r1", 1, 1, 0, 0),  # a version 1 entry before lanes were in use
        encode_fence("r1", 2, 2, 0, 0, {1: 0}),
        b.build("r1", 2, 3, 1, 0, 0, lanes=(LaneRange(1, 1, 1),)),
    ]
    return Manifest.covering(
        region="r1", epoch=2, entries=_entries(objs), low_watermark=1, created_ms=0
    )


def test_manifest_v2_round_trip() -> None:
    m = _v2_manifest()
    data = m.encode()
    doc = json.loads(data)
    assert doc["version"] == 2
    assert "lanes" not in doc["entries"][0]
    assert doc["entries"][2]["lanes"] == [[1, 1, 1]]
    back = Manifest.decode(data, where="m")
    assert back == m
    assert back.entries[2].to_header("r1").version == VERSION_LANES
    assert back.entries[0].to_header("r1").version == VERSION


def test_manifest_without_lanes_stays_version_1() -> None:
    m = Manifest.covering(
        region="r1",
        epoch=1,
        entries=_entries([encode_fence("r1", 1, 1, 0, 0)]),
        low_watermark=1,
        created_ms=0,
    )
    assert json.loads(m.encode())["version"] == 1


def _tamper(data: bytes, edit: object) -> bytes:
    doc = json.loads(data)
    edit(doc)  # type: ignore[operator]
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda d: d["entries"][2].__setitem__("lanes", []), "is empty"),
        (lambda d: d["entries"][2].__setitem__("lanes", [[0, 1, 1]]), "lane 0 out of range"),
        (lambda d: d["entries"][2].__setitem__("lanes", [[1, 1]]), "expected 3"),
        (lambda d: d.__setitem__("version", 1), "unknown keys"),
        (
            lambda d: d["entries"][2].__setitem__("lanes", [[1, 1, 1], [1, 2, 2]]),
            "ascending",
        ),
        # Lane 1's LSNs go backwards between entries 1 and 2.
        (lambda d: d["entries"][1].__setitem__("lanes", [[1, 5, 4]]), "of lane 1"),
        # Without its lane table, the entry shipping lane 1 ships nothing.
        (lambda d: d["entries"][2].pop("lanes"), "empty LSN range"),
    ],
)
def test_manifest_v2_refuses(edit: object, fragment: str) -> None:
    data = _tamper(_v2_manifest().encode(), edit)
    with pytest.raises(CorruptData, match=fragment):
        Manifest.decode(data, where="m")


def test_manifest_v2_without_any_lane_table_refused() -> None:
    m = Manifest.covering(
        region="r1",
        epoch=1,
        entries=_entries([encode_fence("r1", 1, 1, 0, 0)]),
        low_watermark=1,
        created_ms=0,
    )
    data = _tamper(m.encode(), lambda d: d.__setitem__("version", 2))
    with pytest.raises(CorruptData, match="no lane table in any entry"):
        Manifest.decode(data, where="m")
