"""Fuzz the record batch decoders (``edge_gateway.format.batch``).

The property: for any bytes, ``decode_batch``, ``iter_batches`` and
``BatchReader`` either succeed or raise ``CorruptData``; nothing else escapes,
and whatever they accept materialises and re-encodes to the same records.

With atheris installed this is a libFuzzer target::

    python fuzz/fuzz_batch.py -max_total_time=60

Without it, a plain mutation loop runs over a seed corpus of valid batches::

    python fuzz/fuzz_batch.py [iterations] [seed]

The first input byte picks a mode; in CRC mode the harness recomputes the
batch CRC so mutations reach the structure checks behind it, which a random
flip otherwise never gets past.
"""

from __future__ import annotations

import contextlib
import random
import struct
import sys
from pathlib import Path

from edge_gateway.errors import CorruptData
from edge_gateway.format.batch import (
    HEADER_SIZE,
    NEED_DATA,
    BatchReader,
    Record,
    RecordBatch,
    batch_crc,
    decode_batch,
    encode_batch,
    encode_records,
    iter_batches,
)

sys.path.insert(0, str(Path(__file__).parent))
import _harness

SEEDS = [
    encode_batch([b""], timestamps=0),
    encode_batch([b"a", b"bc"], timestamps=[1, -1], base_offset=7),
    encode_batch([b"v"] * 3, keys=[None, b"", b"k"], timestamps=5),
    encode_records(
        [
            Record(5, 1000, b"k", b"v1", (("h", b"x"),)),
            Record(6, 1002, None, b"", ()),
            Record(7, 999, b"", b"\xff", (("", b""), ("\u00e9", b"yz"))),
        ]
    ),
    # NULLS: a null value (length -1) and a null header value (length 0xFFFFFFFF)
    encode_batch([None, b"v", None], timestamps=[3, 1, 2]),
    encode_records(
        [
            Record(0, 5, b"k", None, (("h", None), ("g", b"x"))),
            Record(1, 6, None, b"", (("n", None),)),
        ]
    ),
]


def _fix_crc(buf: bytearray) -> None:
    if len(buf) >= HEADER_SIZE:
        (length,) = struct.unpack_from("<I", buf)
        if HEADER_SIZE <= length <= len(buf):
            struct.pack_into("<I", buf, 16, batch_crc(buf, 0, length))


def _check_accepted(batch: RecordBatch) -> None:
    records = batch.records()
    assert len(records) == batch.count
    again = decode_batch(encode_records(records)).records()
    assert again == records, (again, records)


def fuzz_one_input(data: bytes) -> None:
    if not data:
        return
    mode, buf = data[0], bytearray(data[1:])
    if mode & 1:
        _fix_crc(buf)
    with contextlib.suppress(CorruptData):
        _check_accepted(decode_batch(buf, verify=bool(mode & 2)))
    with contextlib.suppress(CorruptData):
        for batch in iter_batches(bytes(buf)):
            _check_accepted(batch)
    reader = BatchReader(max_batch_bytes=1 << 16)
    step = (mode >> 2) + 1
    with contextlib.suppress(CorruptData):
        for i in range(0, len(buf), step):
            reader.feed(buf[i : i + step])
            while (got := reader.next_batch()) is not NEED_DATA:
                assert isinstance(got, RecordBatch)
                _check_accepted(got)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    # An interesting i32 over a length column or header field.
    return _harness.mutate_binary(
        rng, data, ints=[-2, -1, 0, 1, 2**31 - 1, -(2**31), 65535], formats=["<i"]
    )


def _plain_loop(iterations: int, seed: int) -> None:
    corpus = [bytes([mode]) + s for s in SEEDS for mode in range(4)]
    _harness.plain_loop(
        "fuzz_batch", fuzz_one_input, corpus, _mutate, iterations, seed, grow_every=4096
    )


if __name__ == "__main__":
    _harness.main(fuzz_one_input, _plain_loop)
