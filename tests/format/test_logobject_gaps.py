"""Log object and manifest version 3: the gap table (``docs/log-object.md``, "Version 3").

An entry that carries a gap marker (offsets a drop-oldest lane dropped before
they were shipped) is version 3; every other entry keeps its version. A
version 2 reader -- the code before this format, run from the main checkout's
history when it is there -- refuses a version 3 object with a clear message.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from _old_code import old_sources, run_old

from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.logobject import (
    VERSION_GAPS,
    VERSION_LANES,
    GapRange,
    LaneRange,
    LogObjectBuilder,
    decode_header,
    encode_header,
    header_length_hint,
)
from edge_gateway.format.manifest import Manifest, ManifestEntry

KEY = "regions/r1/log/00000000000000000007.egw"
GAP = GapRange(5, "telemetry", 0, 100, 149, 50, 12_345)

GOLDEN_V3_HEX = (
    "4547574c"  # magic "EGWL"
    "03"  # version 3
    "00"  # flags
    "0000"  # reserved
    "86000000"  # header_length 134 = 62 + 2 + (1 + 17) + (4 + 39 + 9)
    "0100000000000000"  # epoch 1
    "0700000000000000"  # seq 7
    "0100000000000000"  # first_lsn 1   (lane 0: empty, nothing shipped)
    "0000000000000000"  # last_lsn 0
    "0068e5cf8b010000"  # created_ms 1700000000000
    "0200"  # region_len 2
    "7231"  # "r1"
    "01"  # n_lanes 1
    "05" "0a00000000000000" "1d00000000000000"  # lane 5 (bulk-drop): LSNs 10..29
    "01000000"  # n_gaps 1
    "05"  # lane 5
    "0900" "74656c656d65747279"  # topic "telemetry"
    "00000000"  # partition 0
    "6400000000000000"  # first_offset 100
    "9500000000000000"  # last_offset 149
    "3200000000000000"  # records 50
    "3930000000000000"  # bytes 12345
    "00000000"  # n_blocks 0
    "517aa682"  # CRC-32C of the 130 bytes before
)  # fmt: skip


def _gap_only() -> bytes:
    return LogObjectBuilder().build(
        "r1", 1, 7, 1, 0, 1_700_000_000_000, lanes=(LaneRange(5, 10, 29),), gaps=(GAP,)
    )


def test_golden_v3_gap_marker() -> None:
    obj = _gap_only()
    body = bytes.fromhex(GOLDEN_V3_HEX)
    assert obj == body
    assert len(obj) == 134
    h = decode_header(obj, where=KEY, object_size=len(obj))
    assert h.version == VERSION_GAPS
    assert h.gaps == (GAP,)
    assert h.blocks == ()
    assert encode_header(h) == obj


def test_v3_with_blocks_round_trips_whole_and_in_pieces() -> None:
    b = LogObjectBuilder()
    b.add_batch("telemetry", 0, encode_batch([b"a", b"b"], timestamps=5, base_offset=150))
    b.add_batch("alarms", 0, encode_batch([b"fire"], timestamps=5))
    gaps = (GapRange(5, "telemetry", 0, 100, 149, 50, 1), GapRange(5, "telemetry", 1, 0, 9, 10, 2))
    obj = b.build("r1", 1, 7, 1, 1, 0, lanes=(LaneRange(5, 10, 29),), gaps=gaps)
    h = decode_header(obj, where=KEY, object_size=len(obj))
    assert h.gaps == gaps
    assert [(x.topic, x.first_offset) for x in h.blocks] == [("alarms", 0), ("telemetry", 150)]
    assert header_length_hint(obj[:12]) == h.header_length
    for n in range(h.header_length):
        with pytest.raises(CorruptData):
            decode_header(obj[:n], where=KEY)


def test_entries_without_gaps_keep_their_version() -> None:
    b = LogObjectBuilder()
    b.add_batch("alarms", 0, encode_batch([b"fire"], timestamps=5))
    obj = b.build("r1", 1, 7, 1, 1, 0, lanes=(LaneRange(5, 1, 0),))
    assert decode_header(obj, where=KEY).version == VERSION_LANES


@pytest.mark.parametrize(
    ("gaps", "lanes", "fragment"),
    [
        ((dataclasses.replace(GAP, records=49),), (LaneRange(5, 10, 29),), "49 records"),
        ((dataclasses.replace(GAP, last_offset=99),), (LaneRange(5, 10, 29),), "records for"),
        ((GAP,), (LaneRange(5, 10, 9),), "ships no LSNs"),
        ((GAP,), (LaneRange(4, 10, 29),), "ships no LSNs"),
        ((GAP, GAP), (LaneRange(5, 10, 29),), "sorted"),
        ((dataclasses.replace(GAP, topic="bad topic"),), (LaneRange(5, 10, 29),), "topic"),
        ((dataclasses.replace(GAP, first_offset=-1),), (LaneRange(5, 10, 29),), "out of range"),
    ],
)
def test_v3_validation(
    gaps: tuple[GapRange, ...], lanes: tuple[LaneRange, ...], fragment: str
) -> None:
    with pytest.raises(InvalidInput, match=fragment):
        LogObjectBuilder().build("r1", 1, 7, 1, 0, 0, lanes=lanes, gaps=gaps)


def test_a_one_lane_gateway_ships_lost_entries_as_lane_0_gaps() -> None:
    """Entries quarantined after damage (docs/operations.md, "A damaged disk"): version 3
    with an empty lane table, the gap in lane 0, whose range is the fixed one."""
    lost = GapRange(0, "telemetry", 0, 100, 149, 50, 0)
    b = LogObjectBuilder()
    b.add_batch("telemetry", 0, encode_batch([b"a", b"b"], timestamps=5, base_offset=150))
    obj = b.build("r1", 1, 7, 11, 29, 0, gaps=(lost,))
    h = decode_header(obj, where=KEY, object_size=len(obj))
    assert (h.version, h.lanes, h.gaps) == (VERSION_GAPS, (), (lost,))
    assert header_length_hint(obj[:12]) == h.header_length
    for n in range(h.header_length):
        with pytest.raises(CorruptData):
            decode_header(obj[:n], where=KEY)
    entry = ManifestEntry.from_header(h, len(obj))
    m = Manifest.covering(region="r1", epoch=1, entries=[entry], low_watermark=1, created_ms=0)
    assert Manifest.decode(m.encode(), where="m") == m
    # lane 0's range must hold LSNs for its gap to belong to the entry
    with pytest.raises(InvalidInput, match="ships no LSNs"):
        LogObjectBuilder().build("r1", 1, 7, 11, 10, 0, gaps=(lost,))


def test_a_gap_overlapping_a_block_is_refused() -> None:
    b = LogObjectBuilder()
    b.add_batch("telemetry", 0, encode_batch([b"a"], timestamps=5, base_offset=120))
    with pytest.raises(InvalidInput, match="overlaps a block"):
        b.build("r1", 1, 7, 1, 0, 0, lanes=(LaneRange(5, 10, 29),), gaps=(GAP,))


def test_hostile_gap_count_is_refused() -> None:
    obj = bytearray(_gap_only())
    at = 54 + 2 + 1 + 17
    obj[at : at + 4] = (10**6).to_bytes(4, "little")
    with pytest.raises(CorruptData):
        decode_header(bytes(obj), where=KEY)


def test_manifest_v3_round_trip_and_offsets_jump_only_over_gaps() -> None:
    b = LogObjectBuilder()
    b.add_batch("telemetry", 0, encode_batch([b"a"] * 100, timestamps=5))
    first = b.build("r1", 1, 1, 1, 0, 0, lanes=(LaneRange(5, 1, 9),))
    b = LogObjectBuilder()
    b.add_batch("telemetry", 0, encode_batch([b"b"], timestamps=5, base_offset=150))
    second = b.build("r1", 1, 2, 1, 0, 0, lanes=(LaneRange(5, 10, 29),), gaps=(GAP,))
    entries = [
        ManifestEntry.from_header(decode_header(o, where="t"), len(o)) for o in (first, second)
    ]
    m = Manifest.covering(region="r1", epoch=1, entries=entries, low_watermark=1, created_ms=0)
    assert m.next_offsets == {("telemetry", 0): 151}
    data = m.encode()
    doc = json.loads(data)
    assert doc["version"] == 3
    assert doc["entries"][1]["gaps"] == [[5, "telemetry", 0, 100, 149, 50, 12345]]
    assert "gaps" not in doc["entries"][0]
    assert Manifest.decode(data, where="m") == m
    # without the gap, the jump from 100 to 150 is refused
    doc["entries"][1].pop("gaps")
    doc["version"] = 2
    with pytest.raises(CorruptData):
        Manifest.decode(json.dumps(doc).encode(), where="m")
    # a gap that does not start where the partition's shipped offsets end
    doc = json.loads(data)
    doc["entries"][1]["gaps"] = [[5, "telemetry", 0, 101, 149, 49, 1]]
    with pytest.raises(CorruptData, match="gap of telemetry/0 starts at offset 101"):
        Manifest.decode(json.dumps(doc).encode(), where="m")


OLD_READER = """
import sys
from edge_gateway.errors import CorruptData
from edge_gateway.format.logobject import decode_header
try:
    decode_header(sys.stdin.buffer.read(), where="k")
except CorruptData as exc:
    print(exc)
else:
    print("decoded")
"""


#: The last commit whose reader knew versions 1 and 2 only (2026-11-25).
BEFORE_VERSION_3 = "103480f7b46a17af76fd84ea6dd02075f78f6a3e"


def test_a_version_2_reader_refuses_version_3(tmp_path: Path) -> None:
    """The reader before version 3 (this repository's code at that commit) refuses it clearly."""
    old = old_sources(BEFORE_VERSION_3, tmp_path / "old")
    assert "VERSION_GAPS" not in (old / "edge_gateway/format/logobject.py").read_text()
    out = run_old(old, OLD_READER, _gap_only())
    assert "unsupported log object version 3" in out, out
