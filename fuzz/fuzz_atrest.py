"""Fuzz the at-rest decoders (``edge_gateway.format.atrest``).

The property: for any bytes, opening a compressed segment (header, trailer,
directory), decoding its frames and entry tables and expanding it back into
journal entries either succeeds or raises ``CorruptData``; nothing else
escapes. What decodes is a valid journal segment: its entries decode again
and compress to a file that expands to the same bytes. ``decode_block_entry``
is held to the same promise.

With atheris installed this is a libFuzzer target::

    python fuzz/fuzz_atrest.py -max_total_time=60

Without it, a plain mutation loop runs over a seed corpus of valid segments::

    python fuzz/fuzz_atrest.py [iterations] [seed]

The first input byte picks a mode. Bit 0 recomputes the directory's CRC, bit 1
every frame's and entry table's CRC in the directory (then the directory's),
so mutations reach the structure checks behind the CRCs. Bit 2 makes the rest
of the input the *raw* entry table of chunk 0 of seed ``input[1]``: the file
is rebuilt around it (stored uncompressed, positions and CRCs made valid), so
mutations reach the entry table's checks, which sit behind a CRC and zstd.
Bit 3 feeds the input to ``decode_block_entry`` instead (with bit 0, its
block's CRC and its own recomputed first).
"""

from __future__ import annotations

import contextlib
import random
import struct
import sys
from pathlib import Path

import crc32c

from edge_gateway.errors import CorruptData
from edge_gateway.format import atrest
from edge_gateway.format import entry as E
from edge_gateway.format.batch import Record, encode_records
from edge_gateway.format.entry import Checkpoint, ProducerStamp, SourceCoords
from edge_gateway.format.logobject import CODEC_NONE, BlockIndex, LogObjectBuilder, decode_block
from edge_gateway.format.logobject import decode_header as decode_object_header

sys.path.insert(0, str(Path(__file__).parent))
import _harness

_DIR_FIXED = 48
_CHUNK = 45
_FRAME = 67


def _block_entry(lsn: int, base: int) -> bytes:
    b = LogObjectBuilder()
    b.add_batch("t", 0, encode_records([Record(base + i, i, None, b"r" * 30) for i in range(3)]))
    obj = b.build("south", 1, 4, 1, 2, 0)
    h = decode_object_header(obj, where="seed")
    blk = h.blocks[0]
    return atrest.encode_block_entry(
        lsn=lsn,
        topic="south.t",
        partition=0,
        append_time=7,
        source=SourceCoords("south", 4, 1, True),
        index=blk,
        stored=obj[blk.offset : blk.end],
    )


def _wal(version: int = 3) -> bytes:
    out = [
        E.encode_entry(
            lsn=5,
            kind=E.KIND_CHECKPOINT,
            topic=b"",
            partition=0,
            base_offset=0,
            count=0,
            append_time=1,
            payload=Checkpoint({("t", 0): 0}, {}).encode(),
        )
    ]
    lsn = 6
    for i in range(6):
        rec = Record(
            i // 2, 10 + i, b"k" if i % 2 else None, b'{"v":%d}' % i, (("h", None),) * (i % 2)
        )
        out.append(
            E.encode_entry(
                lsn=lsn,
                kind=E.KIND_DATA,
                topic=b"t",
                partition=i % 2,
                base_offset=i // 2,
                count=1,
                append_time=10 + i,
                payload=encode_records([rec]),
                producer=ProducerStamp(3, 1, i) if i == 2 else None,
            )
        )
        lsn += 1
    out.append(
        E.encode_entry(
            lsn=lsn,
            kind=E.KIND_MIRROR,
            topic=b"south.t",
            partition=0,
            base_offset=50,
            count=1,
            append_time=20,
            payload=encode_records([Record(50, 1, None, None)]),
            source=SourceCoords("south", 3, 1, False),
        )
    )
    lsn += 1
    out.append(
        E.encode_entry(
            lsn=lsn,
            kind=E.KIND_MIRROR,
            topic=b"",
            partition=0,
            base_offset=0,
            count=0,
            append_time=21,
            payload=b"",
            source=SourceCoords("south", 3, 1, True),
        )
    )
    lsn += 1
    if version == 3:
        out.append(_block_entry(lsn, 60))
    return struct.pack("<4sB3xQ", b"EGWJ", version, 5) + b"".join(out)


def _seeds() -> list[bytes]:
    w3, w2 = _wal(3), _wal(2)
    return [
        atrest.compress_segment(w3),
        atrest.compress_segment(w3, frame_raw_bytes=60, chunk_raw_bytes=300),
        atrest.compress_segment(w2, chunk_raw_bytes=1, level=-5),
    ]


SEEDS = _seeds()
_SEED_SET = frozenset(SEEDS)
BLOCK_SEEDS = [_block_entry(9, 0), _block_entry(1, 2**40)]


def _metas(z: bytes) -> list[bytes]:
    seg = atrest.CompressedSegment(z)
    out = []
    for c in seg.directory.chunks:
        probe = BlockIndex(
            "t",
            0,
            0,
            0,
            1,
            0,
            0,
            c.meta_offset,
            c.meta_stored,
            c.meta_raw,
            c.meta_codec,
            c.meta_crc,
        )
        out.append(
            decode_block(
                probe, seg.data[c.meta_offset : c.meta_offset + c.meta_stored], where="seed"
            )
        )
    return out


SEED_METAS = [_metas(z)[0] for z in SEEDS]


def _fix_trailer(buf: bytearray) -> None:
    """Point the trailer at a directory of the same length ending where it starts, so
    bytes cut or inserted before the directory do not hide it."""
    if len(buf) < 32:
        return
    (dir_length,) = struct.unpack_from("<I", buf, len(buf) - 8)
    if dir_length <= len(buf) - 16:
        struct.pack_into("<Q", buf, len(buf) - 16, len(buf) - 16 - dir_length)


def _fix_dir_crc(buf: bytearray) -> None:
    if len(buf) < 32:
        return
    dir_offset, dir_length = struct.unpack_from("<QI", buf, len(buf) - 16)
    end = dir_offset + dir_length
    if dir_length >= 4 and end <= len(buf) - 16:
        struct.pack_into("<I", buf, end - 4, crc32c.crc32c(bytes(buf[dir_offset : end - 4])))


def _fix_inner_crcs(buf: bytearray) -> None:
    """Recompute each frame's and entry table's CRC from the bytes where the directory
    says they are, then the directory's CRC."""
    _fix_trailer(buf)
    if len(buf) < 32:
        return
    dir_offset, dir_length = struct.unpack_from("<QI", buf, len(buf) - 16)
    if dir_offset + dir_length > len(buf) - 16 or dir_length < _DIR_FIXED + 4:
        return
    n_parts, n_chunks, n_frames = struct.unpack_from("<III", buf, dir_offset + 32)
    pos = dir_offset + _DIR_FIXED
    try:
        for _ in range(n_parts):
            (tlen,) = struct.unpack_from("<H", buf, pos)
            pos += 2 + tlen + 4
        for _ in range(n_chunks):
            off, stored = struct.unpack_from("<QI", buf, pos + 24)
            struct.pack_into("<I", buf, pos + 41, crc32c.crc32c(bytes(buf[off : off + stored])))
            pos += _CHUNK
        for _ in range(n_frames):
            off, stored = struct.unpack_from("<QI", buf, pos + 42)
            struct.pack_into("<I", buf, pos + 59, crc32c.crc32c(bytes(buf[off : off + stored])))
            pos += _FRAME
    except struct.error:
        return
    _fix_dir_crc(buf)


def _with_meta(z: bytes, raw: bytes) -> bytes:
    """Seed ``z`` with chunk 0's entry table replaced by ``raw`` (stored, codec 0)."""
    seg = atrest.CompressedSegment(z)
    d = seg.directory
    c = d.chunks[0]
    shift = len(raw) - c.meta_stored
    dir_offset, dir_length = struct.unpack_from("<QI", z, len(z) - 16)
    dirb = bytearray(z[dir_offset : dir_offset + dir_length])
    at = _DIR_FIXED + sum(2 + len(t.encode()) + 4 for t, _ in d.parts)
    struct.pack_into("<IIBI", dirb, at + 32, len(raw), len(raw), CODEC_NONE, crc32c.crc32c(raw))
    for k in range(1, len(d.chunks)):
        struct.pack_into("<Q", dirb, at + k * _CHUNK + 24, d.chunks[k].meta_offset + shift)
    frames_at = at + len(d.chunks) * _CHUNK
    for i, f in enumerate(d.frames):
        if f.offset > c.meta_offset:
            struct.pack_into("<Q", dirb, frames_at + i * _FRAME + 42, f.offset + shift)
    dirb[-4:] = struct.pack("<I", crc32c.crc32c(bytes(dirb[:-4])))
    body = z[: c.meta_offset] + raw + z[c.meta_offset + c.meta_stored : dir_offset]
    return body + bytes(dirb) + struct.pack("<QI4s", len(body), len(dirb), b"EGWC")


def _fix_entry_crcs(raw: bytes) -> bytes:
    """A block entry with its block's and its own CRC recomputed (where they would be)."""
    buf = bytearray(raw)
    try:
        length, _, _, _, _, tlen = struct.unpack_from("<IIQBBH", buf, 0)
        (rlen,) = struct.unpack_from("<H", buf, 44 + tlen)
        desc = 44 + tlen + 2 + rlen + 16
        struct.pack_into("<I", buf, desc + 24, crc32c.crc32c(bytes(buf[desc + 28 : length])))
        struct.pack_into("<I", buf, 4, crc32c.crc32c(bytes(buf[8:length])))
    except struct.error:
        pass
    return bytes(buf)


def _frame_entries_agree(data: bytes) -> None:
    """One frame's entries (a read by offset) are CorruptData, or exactly the whole table's
    entries of that frame when the whole table decodes."""
    try:
        seg = atrest.CompressedSegment(data, where="fuzz")
    except CorruptData:
        return
    d = seg.directory
    for ci, c in enumerate(d.chunks):
        stored = bytes(seg.data[c.meta_offset : c.meta_offset + c.meta_stored])
        try:
            whole: atrest.ChunkEntries | None = atrest.decode_entries(d, ci, stored, where="f")
        except CorruptData:
            whole = None
        for fno in c.frames:
            try:
                part = atrest.decode_frame_entries(d, ci, stored, fno, where="f")
            except CorruptData:
                assert whole is None, "a frame of a table that decodes is refused"
                continue
            if whole is not None:
                idx = [i for i in range(c.n_entries) if whole.frames[i] == fno]
                assert [part.lsn(k) for k in range(len(idx))] == [whole.lsn(i) for i in idx]
                assert part.base_offsets == [whole.base_offsets[i] for i in idx]
                assert part.append_times == [whole.append_times[i] for i in idx]
                assert [part.extra_bytes(k) for k in range(len(idx))] == [
                    whole.extra_bytes(i) for i in idx
                ]


def _check_segment(data: bytes, *, crcs_fixed: bool) -> None:
    _frame_entries_agree(data)
    try:
        wal = atrest.expand_segment(data, where="fuzz")
        seg = atrest.CompressedSegment(data, where="fuzz")
        for i in range(len(seg.directory.frames)):
            seg.frame(i)
    except CorruptData:
        return
    # Every byte is under a CRC (or checked against the directory), so bytes changed
    # without recomputing the CRCs never decode.
    assert crcs_fixed or data in _SEED_SET, "damaged bytes decoded"
    # it decoded: what it holds must be a valid journal segment, kept losslessly again
    entries = list(atrest.iter_wal_entries(wal))
    assert len(entries) == seg.directory.n_entries
    again = atrest.compress_segment(wal)
    assert atrest.expand_segment(again) == wal, "a decoded segment does not round-trip"


def fuzz_one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    mode, rest = data[0], data[1:]
    if mode & 8:
        if mode & 1:
            rest = _fix_entry_crcs(rest)
        with contextlib.suppress(CorruptData):
            e = atrest.decode_block_entry(rest, where="fuzz")
            assert atrest.encode_any_entry(e) == rest[: e.length]
            with contextlib.suppress(CorruptData):
                decode_block(e.block_index(), e.stored, where="fuzz")
        return
    if mode & 4:
        _check_segment(_with_meta(SEEDS[rest[0] % len(SEEDS)], rest[1:]), crcs_fixed=True)
        return
    buf = bytearray(rest)
    if mode & 2:
        _fix_inner_crcs(buf)
    if mode & 1:
        _fix_dir_crc(buf)
    _check_segment(bytes(buf), crcs_fixed=bool(mode & 3))


def _mutate(rng: random.Random, data: bytes) -> bytes:
    keep = 2 if data[:1] and data[0] & 4 else 1  # the mode, and a seed number
    head, body = data[:keep], data[keep:]
    mutated = _harness.mutate_binary(
        rng,
        body,
        ints=[0, 1, 2, 0xFF, 2**31 - 1, 2**32 - 1, 2**63 - 1, -(2**63), -1],
        formats=["<Q", "<I", "<B"],
        max_cut=32,
    )
    return head + mutated


def _plain_loop(iterations: int, seed: int) -> None:
    corpus = [bytes([mode]) + s for s in SEEDS for mode in (0, 1, 3)]
    corpus += [bytes([4, k]) + m for k, m in enumerate(SEED_METAS)]
    corpus += [bytes([mode]) + b for b in BLOCK_SEEDS for mode in (8, 9)]
    _harness.plain_loop(
        "fuzz_atrest", fuzz_one_input, corpus, _mutate, iterations, seed, grow_every=4096
    )


if __name__ == "__main__":
    _harness.main(fuzz_one_input, _plain_loop)
