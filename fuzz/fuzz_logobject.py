"""Fuzz the log object decoders (``edge_gateway.format.logobject``).

The property: for any bytes, ``header_length_hint``, ``decode_header``,
``slice_block``, ``decode_block`` and ``iter_block_batches`` either succeed or
raise ``CorruptData``; nothing else escapes. A header they accept re-encodes
to the same bytes.

With atheris installed this is a libFuzzer target::

    python fuzz/fuzz_logobject.py -max_total_time=60

Without it, a plain mutation loop runs over a seed corpus of valid objects::

    python fuzz/fuzz_logobject.py [iterations] [seed]

The first input byte picks a mode: bit 0 recomputes the header CRC and bit 1
every block CRC the (parsable) index names, so mutations reach the structure
checks, zstd and the batch decoder behind the CRCs, which a random flip
otherwise never gets past.

Encrypted objects (sealed with the keys of :data:`KEYRING`) are in the seed
corpus too: with the CRCs recomputed, a mutation is an attacker's forgery,
and it must fail the tag as ``CorruptData`` (or name a key id the ring does
not hold: ``MissingKey``); a forged block that decodes is a failure.
"""

from __future__ import annotations

import contextlib
import random
import struct
import sys
from pathlib import Path

import crc32c

from edge_gateway.errors import CorruptData, MissingKey
from edge_gateway.format.batch import Record, encode_batch, encode_records
from edge_gateway.format.crypt import Keyring, WriteKey
from edge_gateway.format.logobject import (
    PREFIX_BYTES,
    LaneRange,
    LogObjectBuilder,
    decode_block,
    decode_header,
    encode_fence,
    encode_header,
    header_length_hint,
    iter_block_batches,
    slice_block,
)

sys.path.insert(0, str(Path(__file__).parent))
import _harness

KEY = "regions/r1/log/00000000000000000007.egw"
_K1 = bytes(range(32))
#: The reader's keys: the seeds' key ``k1`` of both regions, and a second id.
KEYRING = Keyring({"r1": {"k1": _K1, "k2": bytes(32)}, "west_2": {"k1": _K1}})


def _seeds() -> list[bytes]:
    b1 = LogObjectBuilder()
    b1.add_batch("t", 0, encode_batch([b"a", b"bc"], timestamps=[1, 2]))
    b1.add_batch("u.v", 3, encode_batch([b"x" * 200] * 3, keys=[None, b"", b"k"], timestamps=5))
    b2 = LogObjectBuilder(max_block_bytes=64)
    b2.add(
        "t",
        1,
        [
            encode_records([Record(10, 7, b"k", b"v", (("h", b"x"),))]),
            encode_records([Record(11, 9, None, b"w")]),
        ],
    )
    b3 = LogObjectBuilder()  # FLAG_NULLS: a batch with a null value and a null header value
    b3.add_batch(
        "t", 0, encode_records([Record(0, 1, b"k", None, (("h", None),)), Record(1, 2, None, b"")])
    )
    return [
        b3.build("r1", 1, 7, 1, 2, 0),
        b3.build("r1", 1, 7, 1, 2, 0, key=WriteKey("k1", _K1)),
        encode_fence("r1", 2, 7, 41, 1_700_000_000_000),
        b1.build("r1", 1, 7, 1, 2, 0),
        b1.build("r1", 1, 7, 1, 2, 0, level=-5),
        b2.build("west_2", 3, 8, 5, 6, -1),
        # version 2: a lane table (lanes 1 and 2 beside lane 0's fixed range)
        b1.build("r1", 1, 7, 3, 2, 0, lanes=(LaneRange(1, 10, 12), LaneRange(2, 5, 4))),
        encode_fence("r1", 2, 7, 41, 1_700_000_000_000, {1: 9, 2: 0}),
        # encrypted (FLAG_ENCRYPTED, a key id after the region or the lane table)
        b1.build("r1", 1, 7, 1, 2, 0, key=WriteKey("k1", _K1)),
        b2.build("west_2", 3, 8, 5, 6, -1, key=WriteKey("k1", _K1)),
        b1.build("r1", 1, 7, 3, 2, 0, lanes=(LaneRange(1, 10, 12),), key=WriteKey("k1", _K1)),
    ]


SEEDS = _seeds()


def _sealed_blocks() -> dict[tuple[str, int, int, int], bytes]:
    """(region, seq, epoch, offset) -> stored bytes of every sealed block of the seeds."""
    out: dict[tuple[str, int, int, int], bytes] = {}
    for s in SEEDS:
        h = decode_header(s, where=KEY)
        if h.key_id is not None:
            for b in h.blocks:
                out[(h.region, h.seq, h.epoch, b.offset)] = s[b.offset : b.end]
    return out


_SEALED = _sealed_blocks()


def _fix_header_crc(buf: bytearray) -> None:
    if len(buf) >= PREFIX_BYTES:
        (hlen,) = struct.unpack_from("<I", buf, 8)
        if 4 <= hlen <= len(buf):
            struct.pack_into("<I", buf, hlen - 4, crc32c.crc32c(bytes(buf[: hlen - 4])))


def _fix_block_crcs(buf: bytearray) -> None:
    """Recompute each block CRC in the index, then the header CRC over it."""
    try:
        h = decode_header(bytes(buf), where=KEY)
    except CorruptData:
        return
    pos = 54 + len(h.region.encode()) + 4 + (1 + 17 * len(h.lanes) if h.lanes else 0)
    if h.key_id is not None:
        pos += 1 + len(h.key_id.encode())
    for b in h.blocks:
        pos += 2 + len(b.topic.encode())
        stored = bytes(buf[b.offset : b.end])
        struct.pack_into("<I", buf, pos + 57, crc32c.crc32c(stored))
        pos += 61
    _fix_header_crc(buf)


def fuzz_one_input(data: bytes) -> None:
    if not data:
        return
    mode, buf = data[0], bytearray(data[1:])
    if mode & 1:
        _fix_header_crc(buf)
    if mode & 2:
        _fix_block_crcs(buf)
    obj = bytes(buf)
    with contextlib.suppress(CorruptData):
        header_length_hint(obj[: mode % 16])
    try:
        h = decode_header(obj, where=KEY, object_size=len(obj) if mode & 4 else None)
    except CorruptData:
        return
    assert encode_header(h) == obj[: h.header_length]
    try:
        opener = KEYRING.header_opener(h, where=KEY)
    except MissingKey:
        return
    for b in h.blocks:
        with contextlib.suppress(CorruptData):
            stored = slice_block(b, [(0, obj)], where=KEY)
            raw = decode_block(b, stored, where=KEY, opener=opener)
            if opener is not None:
                # Opened: these must be a seed's own bytes at this place.
                assert _SEALED.get((h.region, h.seq, h.epoch, b.offset)) == bytes(stored), (
                    "a forged sealed block decoded"
                )
            for batch in iter_block_batches(b, raw, where=KEY):
                batch.records()


def _mutate(rng: random.Random, data: bytes) -> bytes:
    # Interesting u32/i64 values over a length, offset or count field.
    return _harness.mutate_binary(
        rng,
        data,
        ints=[0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, -(2**63), -1],
        formats=["<Q", "<I"],
        max_cut=64,
    )


def _plain_loop(iterations: int, seed: int) -> None:
    corpus = [bytes([mode]) + s for s in SEEDS for mode in range(8)]
    _harness.plain_loop(
        "fuzz_logobject", fuzz_one_input, corpus, _mutate, iterations, seed, grow_every=4096
    )


if __name__ == "__main__":
    _harness.main(fuzz_one_input, _plain_loop)
