"""Pack objects: layout, keys and hostile bytes (edge_gateway/format/pack.py)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.format.pack import (
    MAGIC,
    decode_pack,
    encode_pack,
    pack_key,
    pack_list_start,
    pack_prefix,
    parse_pack_key,
)

ENTRIES = [(5, b"five" * 10), (6, b"six"), (9, b"nine" * 3)]


def test_round_trip_slices_each_body() -> None:
    data = encode_pack("r1", ENTRIES)
    pack = decode_pack(data, where="k")
    assert pack.region == "r1"
    assert (pack.first_seq, pack.last_seq, pack.size) == (5, 9, len(data))
    for seq, body in ENTRIES:
        e = pack.find(seq)
        assert e is not None
        assert data[e.offset : e.offset + e.length] == body
    assert pack.find(7) is None
    assert pack.find(4) is None
    assert pack.find(10) is None


def test_layout_is_the_documented_one() -> None:
    data = encode_pack("r", [(1, b"x")])
    assert data[:4] == MAGIC
    assert data[4] == 1
    assert data[5:8] == b"\0\0\0"
    header_length = struct.unpack_from("<I", data, 8)[0]
    # fixed 14 + region 1 + count 4 + one entry 12 + crc 4
    assert header_length == 35
    assert data[header_length:] == b"x"


@pytest.mark.parametrize(
    "entries",
    [[], [(2, b"a"), (2, b"b")], [(3, b"a"), (1, b"b")], [(1, b"")], [(-1, b"a")]],
)
def test_bad_entries_are_refused(entries: list[tuple[int, bytes]]) -> None:
    with pytest.raises(InvalidInput):
        encode_pack("r", entries)


def test_truncated_or_padded_is_corrupt() -> None:
    data = encode_pack("r", ENTRIES)
    for bad in (data[:-1], data + b"\0", data[:20], b"", b"EGPK"):
        with pytest.raises(CorruptData):
            decode_pack(bad, where="k")


def test_flipped_header_byte_is_corrupt() -> None:
    data = encode_pack("r", ENTRIES)
    header_length = struct.unpack_from("<I", data, 8)[0]
    for i in range(header_length):
        bad = bytearray(data)
        bad[i] ^= 0x41
        with pytest.raises(CorruptData):
            decode_pack(bytes(bad), where="k")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 120), st.binary(max_size=8))
def test_mutations_raise_only_corrupt_data(junk: bytes, at: int, patch: bytes) -> None:
    data = bytearray(encode_pack("r", ENTRIES))
    data[at : at + len(patch)] = patch
    for candidate in (bytes(data), junk, bytes(data) + junk):
        try:
            pack = decode_pack(candidate, where="k")
        except CorruptData:
            continue
        # What decodes is self-consistent: bodies tile the object exactly.
        end = pack.entries[0].offset
        for e in pack.entries:
            assert e.offset == end
            assert e.length > 0
            end += e.length
        assert end == len(candidate)


def test_keys_sort_by_last_seq_and_list_start_skips_older_packs() -> None:
    keys = sorted(
        pack_key("p", "r", first, last)
        for first, last in [(1, 9), (10, 99), (100, 100), (101, 250)]
    )
    assert [parse_pack_key(k, "p")[1:] for k in keys] == [(1, 9), (10, 99), (100, 100), (101, 250)]
    for seq, want in [
        (0, 0),
        (1, 0),
        (9, 0),
        (10, 1),
        (99, 1),
        (100, 2),
        (101, 3),
        (250, 3),
        (251, 4),
    ]:
        start = pack_list_start("p", "r", seq)
        assert [k for k in keys if k > start] == keys[want:], seq
    assert all(k.startswith(pack_prefix("p", "r")) for k in keys)


@pytest.mark.parametrize(
    "key",
    [
        "p/regions/r/pack/00000000000000000009-00000000000000000010.pack",  # first > last
        "p/regions/r/pack/9-1.pack",
        "p/regions/r/log/00000000000000000009.egw",
        "q/regions/r/pack/00000000000000000009-00000000000000000001.pack",
        "p/regions/r/pack/00000000000000000009-00000000000000000001.pack.tmp",
    ],
)
def test_not_a_pack_key(key: str) -> None:
    with pytest.raises(CorruptData):
        parse_pack_key(key, "p")
