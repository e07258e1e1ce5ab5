"""Fuzz the Kafka record batch decoder (``edge_gateway.format.kafka_batch``) and request framing.

The property: for any bytes, ``decode_batches`` either yields batches or
raises ``CorruptData`` / ``UnsupportedCompression``; nothing else escapes,
and the records of what it accepts re-encode and decode to the same
records. ``FrameReader`` + ``decode_request`` (the Kafka listener's front
door) either yield requests or raise ``ProtocolError``.

With atheris installed this is a libFuzzer target::

    python fuzz/fuzz_kafka_batch.py -max_total_time=60

Without it, a plain mutation loop runs over a seed corpus::

    python fuzz/fuzz_kafka_batch.py [iterations] [seed]

The first input byte picks a mode; in CRC mode the harness recomputes the
batch CRC so mutations reach the record structure behind it.
"""

from __future__ import annotations

import contextlib
import gzip
import random
import struct
import sys
from pathlib import Path

import cramjam
import zstandard

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData
from edge_gateway.format.kafka_batch import (
    KafkaBatch,
    UnsupportedCompression,
    decode_batches,
    encode_batch,
)
from edge_gateway.kafka._protocol import (
    FrameReader,
    OversizedProduce,
    ProtocolError,
    decode_request,
)

sys.path.insert(0, str(Path(__file__).parent))
import _harness

_RECORDS = [
    (1000, b"k", b"v", [("h", b"x"), ("n", None)]),
    (999, None, None, []),
    (1002, b"", b"\xff" * 20, [("\u00e9", b"")]),
]


def _compressed(codec: int, data: bytes) -> bytes:
    """``data`` (one uncompressed batch) with its records compressed by ``codec``."""
    head, body = bytearray(data[:61]), data[61:]
    if codec == 1:
        body = gzip.compress(body)
    elif codec == 2:  # raw snappy (librdkafka)
        body = bytes(cramjam.snappy.compress_raw(body))
    elif codec == 0x102:  # xerial-framed snappy (the Java client), blocks of 16 bytes
        blocks = [
            bytes(cramjam.snappy.compress_raw(body[i : i + 16])) for i in range(0, len(body), 16)
        ]
        body = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
        body += b"".join(struct.pack(">I", len(b)) + b for b in blocks)
        codec = 2
    else:
        body = zstandard.ZstdCompressor().compress(body)
    struct.pack_into(">i", head, 8, 49 + len(body))
    struct.pack_into(">h", head, 21, codec)
    struct.pack_into(">I", head, 17, crc32c(bytes(head[21:]) + body))
    return bytes(head) + body


SEEDS = [
    encode_batch(0, _RECORDS),
    encode_batch(7, _RECORDS[:1]) + encode_batch(8, _RECORDS[1:]),
    _compressed(1, encode_batch(0, _RECORDS)),
    _compressed(4, encode_batch(3, _RECORDS)),
    _compressed(2, encode_batch(0, _RECORDS)),
    _compressed(0x102, encode_batch(5, _RECORDS)),
]

#: ApiVersions v3, Metadata v12, Produce v9 and Fetch v12 request frames (size prefix included).
FRAMES = [
    bytes.fromhex("000000110012000300000001000178000261023100"),
    bytes.fromhex("000000230003000c00000002000178000200000000000000000000000000000000027400000000"),
    bytes.fromhex(
        "0000006900000009000000030001780000ffff000003e802027402000000004b000000000000000000"
        "00003e000000000285d4936f00000000000000000000000003e800000000000003e8ffffffffffffff"
        "ffffffffffffff0000000118000000026b02760202680278000000"
    ),
    bytes.fromhex(
        "0000004e0001000c0000000400017800ffffffff00000064000000017fffffff0000000000ffffffff"
        "0202740200000000ffffffff0000000000000000ffffffffffffffffffffffff000003e80000010100"
    ),
]
_SUPPORTED = {18: (0, 4), 3: (1, 12), 0: (3, 12), 1: (4, 12)}


def _fix_crc(buf: bytearray) -> None:
    if len(buf) >= 61:
        (length,) = struct.unpack_from(">i", buf, 8)
        end = 12 + length
        if 61 <= end <= len(buf):
            struct.pack_into(">I", buf, 17, crc32c(bytes(buf[21:end])))


def _check_accepted(batch: KafkaBatch) -> None:
    recs = batch.records
    if not recs or [r.offset_delta for r in recs] != list(range(len(recs))):
        return
    again = list(
        decode_batches(
            encode_batch(
                batch.base_offset, [(r.timestamp, r.key, r.value, r.headers) for r in recs]
            )
        )
    )
    assert [b.records for b in again] == [recs], (again, recs)


def fuzz_one_input(data: bytes) -> None:
    if not data:
        return
    mode, buf = data[0], bytearray(data[1:])
    if mode & 1:
        _fix_crc(buf)
    with contextlib.suppress(CorruptData, UnsupportedCompression):
        for batch in decode_batches(bytes(buf), max_records_bytes=1 << 16):
            _check_accepted(batch)
    step = (mode >> 1) + 1
    # A small limit too: a Produce over it is read through (its outline only).
    for limit in (1 << 16, 64):
        reader = FrameReader(limit)
        with contextlib.suppress(ProtocolError):
            for i in range(0, len(buf), step):
                reader.feed(buf[i : i + step])
                while (frame := reader.next_frame()) is not None:
                    if isinstance(frame, OversizedProduce):
                        assert limit < frame.size <= len(buf), (frame, limit)
                        continue
                    with contextlib.suppress(ProtocolError):
                        decode_request(frame, _SUPPORTED)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    return _harness.mutate_binary(
        rng, data, ints=[-2, -1, 0, 1, 2**31 - 1, -(2**31), 65535], formats=[">i"]
    )


def _plain_loop(iterations: int, seed: int) -> None:
    corpus = [bytes([mode]) + s for s in SEEDS + FRAMES for mode in range(4)]
    _harness.plain_loop(
        "fuzz_kafka_batch", fuzz_one_input, corpus, _mutate, iterations, seed, grow_every=4096
    )


if __name__ == "__main__":
    _harness.main(fuzz_one_input, _plain_loop)
