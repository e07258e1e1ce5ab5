"""Block entries (kind 4, version 3 segments): a mirror keeps fetched blocks as shipped.

``Journal.append_mirror_blocks`` (docs/at-rest.md, "The block entry") against
``append_mirror_batches`` on the same source data: every read by offset
returns the very entries (batches, offsets, timestamps, keys, headers, nulls,
gaps, sources) the per-batch path returns, before and after a reopen and a
roll; progress is recovered at open; reads by LSN give the header fields; the
segment version is 3 only once a block entry is written.
"""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
from _journal_support import read_records
from _old_code import old_sources, run_old

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import decode_batch, encode_batch
from edge_gateway.format.entry import Checkpoint
from edge_gateway.format.logobject import (
    CODEC_NONE,
    BlockIndex,
    LogObjectBuilder,
    decode_header,
)
from edge_gateway.journal import (
    Journal,
    JournalConfig,
    MirrorBatch,
    MirrorBlock,
    SourceCoords,
    compress_sealed_segment,
    open_journal,
)
from edge_gateway.journal._verify import check_segment

CFG = JournalConfig(segment_bytes=64 * 1024, max_bytes=1 << 30, reserve_bytes=0)
SRC_TOPIC = "t"
TOPIC = "north.t"


def batch(partition: int, base: int, n: int, *, nulls: bool = False) -> bytes:
    """``n`` records with keys, headers (one null header value) and, with ``nulls``, a
    null value."""
    return encode_batch(
        [
            None
            if nulls and i == 1
            else f"{partition}:{base + i}:".encode() + random.Random(base + i).randbytes(100)
            for i in range(n)
        ],
        keys=[None if i % 3 == 0 else f"k{i}".encode() for i in range(n)],
        timestamps=[1_795_000_000_000 + base + i for i in range(n)],
        headers=[[("h", b"x"), ("n", None if nulls else b"y")] for _ in range(n)],
        base_offset=base,
    )


def source_object(
    seq: int, batches: Sequence[tuple[int, bytes]], *, max_block_bytes: int = 4096
) -> tuple[bytes, list[BlockIndex]]:
    """A source's log object holding ``batches`` (partition, batch), several blocks each."""
    b = LogObjectBuilder(max_block_bytes=max_block_bytes)
    for p, raw in batches:
        b.add_batch(SRC_TOPIC, p, raw)
    obj = b.build("north", 1, seq, seq, seq, 0)
    return obj, list(decode_header(obj, where="object").blocks)


def coords(seq: int) -> tuple[SourceCoords, SourceCoords]:
    return (
        SourceCoords("north", seq, 1, end_of_object=False),
        SourceCoords("north", seq, 1, end_of_object=True),
    )


def entry_batches(
    seq: int, firsts: dict[int, int], *, nulls: bool = False, gap: bool = False
) -> list[tuple[int, bytes]]:
    """Source entry ``seq``'s batches: per partition (0, 1) five batches of 1-7 records
    from ``firsts[p]`` (updated; with ``gap``, partition 1 first jumps over 10 offsets)."""
    out = []
    for p in (0, 1):
        base = firsts.get(p, 0) + (10 if gap and p == 1 else 0)
        for k in range(5):
            n = 1 + (k * 3 + seq) % 7
            out.append((p, batch(p, base, n, nulls=nulls and k == 2)))
            base += n
        firsts[p] = base
    return out


async def append_both(
    blocks_j: Journal, batches_j: Journal, seq: int, batches: list[tuple[int, bytes]], gap: bool
) -> None:
    """Source entry ``seq`` into one journal as block entries, into the other per batch."""
    obj, index = source_object(seq, batches)
    mid, last = coords(seq)
    nulls = any(raw[5] & 4 for _, raw in batches)
    await blocks_j.append_mirror_blocks(
        [
            MirrorBlock(TOPIC, b.partition, b, obj[b.offset : b.end], nulls, allow_gap=gap)
            for b in index
        ],
        mid,
        last,
    )
    await batches_j.append_mirror_batches(
        [MirrorBatch(TOPIC, p, raw, allow_gap=gap) for p, raw in batches], mid, last
    )


def read_key(j: Journal, partition: int, offset: int, **kw: int) -> list[tuple[object, ...]]:
    return [
        (e.kind, e.topic, e.partition, e.base_offset, e.count, bytes(e.payload))
        for e in j.read(TOPIC, partition, offset, **kw)
    ]


def assert_same_reads(a: Journal, b: Journal) -> None:
    for p in (0, 1):
        assert a.first_offset(TOPIC, p) == b.first_offset(TOPIC, p)
        assert a.next_offset(TOPIC, p) == b.next_offset(TOPIC, p)
        assert read_records(a, TOPIC, p) == read_records(b, TOPIC, p)
        first, end = b.first_offset(TOPIC, p), b.next_offset(TOPIC, p)
        for offset in range(first, end + 2):
            kws: list[dict[str, int]] = [{"max_records": 3}, {"max_bytes": 1}, {"max_bytes": 700}]
            if offset % 50 == 0:
                kws.append({})  # everything from here
            for kw in kws:
                assert read_key(a, p, offset, **kw) == read_key(b, p, offset, **kw), (p, offset, kw)
    assert a.source_progress() == b.source_progress()


def segment_versions(path: Path) -> list[int]:
    return [f.read_bytes()[4] for f in sorted(path.glob("*.wal"))]


async def test_reads_are_those_of_the_per_batch_path(tmp_path: Path) -> None:
    async with (
        open_journal(tmp_path / "blocks", CFG) as a,
        open_journal(tmp_path / "batches", CFG) as b,
    ):
        firsts: dict[int, int] = {}
        for seq in range(1, 50):
            batches = entry_batches(seq, firsts, nulls=seq % 4 == 0, gap=seq == 7)
            await append_both(a, b, seq, batches, gap=seq == 7)
        assert len(list((tmp_path / "blocks").glob("*.wal"))) >= 3  # sealed ones read too
        assert_same_reads(a, b)
        # blocks: one entry each, not one per batch
        assert a.next_lsn < b.next_lsn
    versions = segment_versions(tmp_path / "blocks")
    assert versions[0] == 2
    assert versions[1:] == [3] * (len(versions) - 1)
    assert set(segment_versions(tmp_path / "batches")) == {2}
    async with (
        open_journal(tmp_path / "blocks", CFG) as a,
        open_journal(tmp_path / "batches", CFG) as b,
    ):
        assert_same_reads(a, b)
        # after the reopen, appends go on in version 3 segments and continue the partitions
        firsts = {p: a.next_offset(TOPIC, p) for p in (0, 1)}
        await append_both(a, b, 50, entry_batches(50, firsts), gap=False)
        assert_same_reads(a, b)
    for f in sorted((tmp_path / "blocks").glob("*.wal")):
        facts = check_segment(f.read_bytes(), base_lsn=int(f.stem))
        assert facts.damage is None, facts.damage


async def test_version_2_until_the_first_block(tmp_path: Path) -> None:
    async with open_journal(tmp_path, CFG) as j:
        mid, last = coords(1)
        await j.append_mirror_batches([MirrorBatch(TOPIC, 0, batch(0, 0, 3))], mid, last)
        await j.append("local", 0, batch(0, 0, 1))
        assert segment_versions(tmp_path) == [2]
        obj, index = source_object(2, [(0, batch(0, 3, 4))])
        mid, last = coords(2)
        appended = await j.append_mirror_blocks(
            [MirrorBlock(TOPIC, 0, index[0], obj[index[0].offset : index[0].end])], mid, last
        )
        assert segment_versions(tmp_path) == [2, 3]
        assert [(x.base_offset, x.count) for x in appended] == [(3, 4)]
        # a read by LSN: the block entry's header fields and source, no payload
        e = j.read_entry(appended[0].lsn)
        assert (e.kind, e.topic, e.base_offset, e.count, e.source, e.payload) == (
            atrest.KIND_BLOCK, TOPIC, 3, 4, last, b"",
        )  # fmt: skip
        got = j.read_entries(1, durable_only=False)
        assert [x.kind for x in got] == [
            fentry.KIND_MIRROR, fentry.KIND_DATA, atrest.KIND_BLOCK,
        ]  # fmt: skip
        shipped = j.read_entries(1, durable_only=False, payload_kinds={fentry.KIND_DATA})
        assert [x.kind for x in shipped if x.kind == fentry.KIND_DATA] == [fentry.KIND_DATA]
        await j.flush()
        in_thread = await j.read_entries_in_thread(1, payload_kinds={fentry.KIND_DATA})
        assert [x.kind for x in in_thread if x.kind == fentry.KIND_DATA] == [fentry.KIND_DATA]
        assert j.source_progress()["north"] == last
    async with open_journal(tmp_path, CFG) as j:
        assert j.source_progress()["north"] == last  # recovered from the block entry
        assert j.next_offset(TOPIC, 0) == 7
        assert [r.offset for r in read_records(j, TOPIC, 0)] == list(range(7))


async def test_blocks_are_checked_before_anything_is_written(tmp_path: Path) -> None:
    async with open_journal(tmp_path, CFG) as j:
        obj, index = source_object(1, [(0, batch(0, 5, 4))])
        b = index[0]
        stored = obj[b.offset : b.end]
        mid, last = coords(1)
        lsn = j.next_lsn
        with pytest.raises(InvalidInput, match="leaves a gap"):
            await j.append_mirror_blocks([MirrorBlock(TOPIC, 0, b, stored)], mid, last)
        await j.append_mirror_blocks([MirrorBlock(TOPIC, 0, b, stored, allow_gap=True)], mid, last)
        with pytest.raises(InvalidInput, match="already present"):
            await j.append_mirror_blocks([MirrorBlock(TOPIC, 0, b, stored)], mid, last)
        # a zstd frame that declares another size than the block's raw length
        obj2, index2 = source_object(2, [(0, batch(0, 9, 4))])
        b2 = index2[0]
        wrong = BlockIndex(
            b2.topic, b2.partition, b2.first_offset, b2.last_offset, b2.record_count,
            b2.min_ts, b2.max_ts, b2.offset, b2.stored_length, b2.raw_length + 1, b2.codec, b2.crc,
        )  # fmt: skip
        with pytest.raises(InvalidInput, match="declares"):
            await j.append_mirror_blocks(
                [MirrorBlock(TOPIC, 0, wrong, obj2[b2.offset : b2.end])], mid, last
            )
        assert j.next_lsn == lsn + 2  # the roll's checkpoint and the one good block


async def test_a_block_entry_in_a_version_2_segment_is_damage(tmp_path: Path) -> None:
    """Older code cannot write one; a version 2 segment that holds one is corrupt."""
    async with open_journal(tmp_path, CFG) as j:
        obj, index = source_object(1, [(0, batch(0, 0, 4))])
        mid, last = coords(1)
        await j.append_mirror_blocks(
            [MirrorBlock(TOPIC, 0, index[0], obj[index[0].offset : index[0].end])], mid, last
        )
    seg = sorted(tmp_path.glob("*.wal"))[-1]
    data = bytearray(seg.read_bytes())
    assert data[4] == 3
    data[4] = 2
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptData, match="block entry in a version 2 segment"):
        async with open_journal(tmp_path, CFG):
            pass


def test_verify_checks_the_records_inside_a_block_entry() -> None:
    """`edgegw journal verify` (and the scrub) decode a block entry's batches: a batch
    whose own CRC is wrong inside a block whose CRC is right is damage at that entry."""
    raw = bytearray(batch(0, 0, 3))
    raw[60] ^= 0x01  # a timestamp byte: the batch CRC no longer matches
    index = BlockIndex(
        SRC_TOPIC, 0, 0, 2, 3, 1_795_000_000_000, 1_795_000_000_002, 0,
        len(raw), len(raw), CODEC_NONE, crc32c(bytes(raw)),
    )  # fmt: skip
    checkpoint = fentry.encode_entry(
        lsn=1, kind=fentry.KIND_CHECKPOINT, topic=b"", partition=0, base_offset=0, count=0,
        append_time=0, payload=Checkpoint({}, {}).encode(),
    )  # fmt: skip
    block = atrest.encode_block_entry(
        lsn=2, topic=TOPIC, partition=0, append_time=0, source=coords(1)[1], index=index,
        stored=bytes(raw),
    )  # fmt: skip
    segment = fentry.encode_segment_header(1, 3) + checkpoint + block
    facts = check_segment(segment, base_lsn=1)
    assert facts.damage is not None
    assert facts.damage.offset == fentry.SEGMENT_HEADER_SIZE + len(checkpoint)
    assert "block entry at LSN 2" in facts.damage.reason
    assert "CRC" in facts.damage.reason
    good = atrest.encode_block_entry(
        lsn=2, topic=TOPIC, partition=0, append_time=0, source=coords(1)[1], index=index,
        stored=batch(0, 0, 3),
    )  # fmt: skip
    assert check_segment(segment[: -len(block)] + good, base_lsn=1).damage is None


async def test_compressed_version_3_segments_read_the_same(tmp_path: Path) -> None:
    """A sealed version 3 segment rewritten compressed (``EGWC``): each block entry a frame
    of its own, as fetched; every read by offset and by LSN is the same as before."""
    async with (
        open_journal(tmp_path / "blocks", CFG) as a,
        open_journal(tmp_path / "batches", CFG) as b,
    ):
        firsts: dict[int, int] = {}
        for seq in range(1, 40):
            batches = entry_batches(seq, firsts, nulls=seq % 5 == 0, gap=seq == 11)
            await append_both(a, b, seq, batches, gap=seq == 11)
        await a.flush()
        by_lsn = [
            (e.lsn, e.kind, e.topic, e.partition, e.base_offset, e.count, e.source, e.length)
            for e in a.read_entries(1, max_bytes=1 << 30)
        ]
    sealed = sorted(int(f.stem) for f in (tmp_path / "blocks").glob("*.wal"))[:-1]
    assert len(sealed) >= 2
    for base in sealed:
        compress_sealed_segment(tmp_path / "blocks", base)
    for base in sealed:
        assert (tmp_path / "blocks" / f"{base:020d}.wal").read_bytes()[:4] == atrest.MAGIC
    async with (
        open_journal(tmp_path / "blocks", CFG) as a,
        open_journal(tmp_path / "batches", CFG) as b,
    ):
        assert_same_reads(a, b)
        assert [
            (e.lsn, e.kind, e.topic, e.partition, e.base_offset, e.count, e.source, e.length)
            for e in a.read_entries(1, max_bytes=1 << 30)
        ] == by_lsn
        got = await a.read_entries_in_thread(1, max_bytes=1 << 30)
        assert [(e.lsn, e.kind, e.source) for e in got] == [(x[0], x[1], x[6]) for x in by_lsn]
    for f in sorted((tmp_path / "blocks").glob("*.wal")):
        facts = check_segment(f.read_bytes(), base_lsn=int(f.stem))
        assert facts.damage is None, facts.damage


OLD_OPEN = """
import sys
from edge_gateway.errors import CorruptData
from edge_gateway.journal import Journal, JournalConfig
cfg = JournalConfig(segment_bytes=64 * 1024, max_bytes=1 << 30, reserve_bytes=0)
for path in sys.stdin.read().split():
    try:
        j = Journal.open_sync(path, cfg)
    except CorruptData as exc:
        print(path, "refused:", exc)
    else:
        print(path, "opened, next offset", j.next_offset("north.t", 0))
        j.close_sync()
"""

#: The last commit before block entries (this branch's base, 2026-11-28).
BEFORE_BLOCKS = "8000db79cd3dfbe190d4177d136632a0575a111e"


async def test_the_code_before_block_entries_refuses_a_version_3_segment(tmp_path: Path) -> None:
    """docs/operations.md, upgrade order: a journal that holds block entries cannot be
    opened by the gateway before them, which says so (and cuts nothing); a journal whose
    mirror never kept a block (``mirror.keep_blocks = false``) still opens there."""
    async with (
        open_journal(tmp_path / "blocks", CFG) as a,
        open_journal(tmp_path / "batches", CFG) as b,
    ):
        await append_both(a, b, 1, entry_batches(1, {}), gap=False)
    before = {f.name: f.read_bytes() for f in (tmp_path / "blocks").glob("*.wal")}
    old = old_sources(BEFORE_BLOCKS, tmp_path / "old")
    assert "SEGMENT_VERSION_BLOCKS" not in (old / "edge_gateway/format/entry.py").read_text()
    out = run_old(old, OLD_OPEN, f"{tmp_path / 'blocks'} {tmp_path / 'batches'}".encode())
    assert f"{tmp_path / 'blocks'} refused:" in out, out
    assert "unsupported segment version 3" in out, out
    assert f"{tmp_path / 'batches'} opened, next offset" in out, out
    assert {f.name: f.read_bytes() for f in (tmp_path / "blocks").glob("*.wal")} == before


def blocks_of(seq: int, batches: list[tuple[int, bytes]]) -> list[MirrorBlock]:
    """Source entry ``seq``'s blocks for ``append_mirror_blocks`` (one per 4 KiB of batches)."""
    obj, index = source_object(seq, batches)
    return [MirrorBlock(TOPIC, b.partition, b, obj[b.offset : b.end]) for b in index]


_CRASH_CHILD = """
import os, sys, trio
sys.path[:0] = [sys.argv[2], os.path.dirname(sys.argv[2])]
from test_block_entries import CFG, batch, blocks_of, coords, entry_batches
from edge_gateway.journal import _fs, open_journal

class TornFs(_fs.FileOps):
    armed = False
    def pwritev(self, fd, parts, pos):
        if self.armed:
            data = b"".join(parts)
            os.pwrite(fd, data[: int(len(data) * float(sys.argv[3]))], pos)
            os._exit(9)  # the process dies mid-write (or after it), before the publish
        return os.pwritev(fd, parts, pos)

async def main():
    fs = _fs.ops = TornFs()
    firsts = {}
    async with open_journal(sys.argv[1], CFG) as j:
        await j.append_mirror_blocks(blocks_of(1, entry_batches(1, firsts)), *coords(1))
        res = j.append_nowait("local", 0, batch(0, 0, 3))
        await j.flush()
        print(res.lsn, flush=True)  # acknowledged
        fs.armed = True
        await j.append_mirror_blocks(blocks_of(2, entry_batches(2, firsts)), *coords(2))
        print("published", flush=True)

trio.run(main)
"""


@pytest.mark.parametrize("written", [0.0, 0.3, 0.7, 1.0])
def test_kill_9_mid_block_group_keeps_what_was_acknowledged(tmp_path: Path, written: float) -> None:
    """kill -9 while a group of block entries is being written (``written``: the share of
    its bytes on disk): the open cuts the torn entry; the acknowledged entries, the
    group's whole entries before it and their source progress are there; appends go on."""
    here = Path(__file__).parent
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH_CHILD, str(tmp_path), str(here), str(written)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 9, proc.stderr
    assert len(proc.stdout.split()) == 1  # the local append; the group never returned
    firsts: dict[int, int] = {}
    entry1 = blocks_of(1, entry_batches(1, firsts))
    entry2 = blocks_of(2, entry_batches(2, firsts))

    async def check() -> None:
        async with open_journal(tmp_path, CFG) as j:
            stats = j.statistics()
            assert (stats.truncated_bytes_on_open > 0) == (0.0 < written < 1.0)
            assert j.next_offset("local", 0) == 3
            got = [e for e in j.read_entries(1, max_bytes=1 << 30) if e.kind == atrest.KIND_BLOCK]
            assert [e.source for e in got[: len(entry1)]] == [coords(1)[0]] * (len(entry1) - 1) + [
                coords(1)[1]
            ]
            rest = got[len(entry1) :]
            assert len(rest) <= len(entry2)
            assert (len(rest) == len(entry2)) == (written == 1.0)
            expect2 = [coords(2)[0]] * (len(entry2) - 1) + [coords(2)[1]]
            assert [e.source for e in rest] == expect2[: len(rest)]
            assert j.source_progress()["north"] == got[-1].source
            # every block entry kept reads back as its source's records
            for e, b in zip(got, entry1 + entry2, strict=False):
                records = [
                    r for x in j.read(TOPIC, b.partition, e.base_offset, max_records=e.count)
                    if x.lsn == e.lsn for r in decode_batch(x.payload).records()
                ]  # fmt: skip
                assert [r.offset for r in records] == list(
                    range(b.block.first_offset, b.block.last_offset + 1)
                )
            j.append_nowait("local", 0, batch(0, 3, 1))
        async with open_journal(tmp_path, CFG) as j:
            assert j.next_offset("local", 0) == 4

    trio.run(check)


def test_a_crc_the_caller_has_makes_the_same_header() -> None:
    """The mirror passes the block's checked CRC-32C (not taken again on the loop):
    the block entry's header is the one computed from the bytes."""
    obj, index = source_object(1, entry_batches(1, {}))
    mid, _ = coords(1)
    for b in index:
        stored = obj[b.offset : b.end]
        kw = {
            "lsn": 7,
            "topic": TOPIC,
            "partition": b.partition,
            "append_time": 1,
            "source": mid,
            "index": b,
            "stored": stored,
        }
        computed = atrest.block_entry_rest(**kw)  # type: ignore[arg-type]
        assert atrest.block_entry_rest(**kw, crc=crc32c(stored)) == computed  # type: ignore[arg-type]
        assert atrest.block_entry_rest(**kw, crc=b.crc) == computed  # type: ignore[arg-type]
