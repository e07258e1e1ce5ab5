"""Fuzz the pack decoder (``edge_gateway.format.pack``).

The property: for any bytes, ``decode_pack`` either succeeds or raises
``CorruptData``; nothing else escapes. A pack it accepts tiles the object
exactly (the bodies back to back after the header, none empty, seqs
ascending) and encodes back to the same bytes.

With atheris installed this is a libFuzzer target::

    python fuzz/fuzz_pack.py -max_total_time=60

Without it, a plain mutation loop runs over a seed corpus of valid packs::

    python fuzz/fuzz_pack.py [iterations] [seed]

The first input byte picks a mode: bit 0 recomputes the header CRC (when the
header length field points inside the input), so mutations reach the table
checks behind it, which a random flip otherwise never gets past.
"""

from __future__ import annotations

import random
import struct
import sys
from pathlib import Path

import crc32c

from edge_gateway.errors import CorruptData
from edge_gateway.format.logobject import encode_fence
from edge_gateway.format.pack import decode_pack, encode_pack

sys.path.insert(0, str(Path(__file__).parent))
import _harness

KEY = "regions/r1/pack/00000000000000000009-00000000000000000002.pack"


def _seeds() -> list[bytes]:
    fence = encode_fence("r1", 3, 2, 1, 0)
    return [
        encode_pack("r1", [(2, fence)]),
        encode_pack("r1", [(2, fence), (3, b"x" * 40), (9, b"yz")]),
        encode_pack("west_2", [(i, bytes([i]) * i) for i in range(1, 30)]),
    ]


SEEDS = _seeds()


def _fix_crc(buf: bytes) -> bytes:
    if len(buf) < 12:
        return buf
    (header_length,) = struct.unpack_from("<I", buf, 8)
    if not 16 <= header_length <= len(buf):
        return buf
    b = bytearray(buf)
    struct.pack_into("<I", b, header_length - 4, crc32c.crc32c(bytes(b[: header_length - 4])))
    return bytes(b)


def fuzz_one_input(data: bytes) -> None:
    if not data:
        return
    mode, buf = data[0], bytes(data[1:])
    if mode & 1:
        buf = _fix_crc(buf)
    try:
        pack = decode_pack(buf, where=KEY)
    except CorruptData:
        return
    end = pack.entries[0].offset
    for e in pack.entries:
        assert e.offset == end, (e, end)
        assert e.length > 0, e
        end += e.length
    assert end == len(buf) == pack.size
    bodies = [(e.seq, buf[e.offset : e.offset + e.length]) for e in pack.entries]
    assert encode_pack(pack.region, bodies) == buf


def _mutate(rng: random.Random, data: bytes) -> bytes:
    body = _harness.mutate_binary(
        rng, data[1:], ints=[0, 1, 2, 12, 16, 35, 2**31, 2**32 - 1], formats=["<I", "<Q", "<H"]
    )
    return bytes([rng.randrange(2)]) + body


def _plain_loop(iterations: int, seed: int) -> None:
    _harness.plain_loop(
        "fuzz_pack",
        fuzz_one_input,
        [bytes([mode]) + s for s in SEEDS for mode in (0, 1)],
        _mutate,
        iterations,
        seed,
        grow_every=1024,
    )


if __name__ == "__main__":
    _harness.main(fuzz_one_input, _plain_loop)
