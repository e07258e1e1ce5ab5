"""Fail the N-th file operation of a kind, for every N (issue 29.5).

As SQLite's I/O-error tests and LevelDB's fault-injection ``Env`` do: a
workload of produces, segment rolls (64 KiB segments), mirror appends (per
batch, and block entries: the first one rolls to a version 3 segment),
shipping with retention 0 (segments deleted), the rewrite of sealed segments
as compressed segments (docs/at-rest.md: its temporary file, fsync, rename,
directory fsync, index unlink) and a kill -9 runs once
without faults to count the calls of each kind; then, for every N, it runs
again with calls N and N+1 of that kind failing with ENOSPC or EIO (a
failing write first writes half its bytes; a failing fsync also loses what
it should have synced, as the kernel's page cache can after a writeback
error). Whatever happens:

* the journal raises only the documented errors (``DiskFull``,
  ``Unavailable``), never an ``OSError`` or anything else;
* after the space is given back and the journal restarted, every
  acknowledged record is there (in the journal, or shipped to the "bucket"
  before its segment was deleted) at the offset it was acknowledged with,
  exactly once; offsets are gap-free; the mirror partition continues its
  source's offsets; nothing that was not produced appears.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from _faults import FaultyFs

from edge_gateway.errors import DiskFull, Unavailable
from edge_gateway.format import atrest
from edge_gateway.format.batch import decode_batch, encode_batch
from edge_gateway.format.logobject import BlockIndex, LogObjectBuilder, decode_header
from edge_gateway.journal import FsyncPolicy, Journal, JournalConfig, MirrorBlock, SourceCoords
from edge_gateway.journal import _fs as fs_module

STEPS = 48
RESTART_AT = 30
MIRROR = "south.t"


@dataclass
class Model:
    """What the workload was told: acknowledged records, and what was shipped."""

    #: value -> (topic, partition, offset) of every acknowledged record
    acked: dict[bytes, tuple[str, int, int]] = field(default_factory=dict)
    #: every value ever offered (acknowledged or not)
    offered: set[bytes] = field(default_factory=set)
    #: (topic, partition, offset) -> value of what the "bucket" holds
    bucket: dict[tuple[str, int, int], bytes] = field(default_factory=dict)
    shipped_from: int = 1
    mirror_seq: int = 0
    errors: list[str] = field(default_factory=list)
    #: sealed segments the rewriter swapped for their compressed form
    rewritten: int = 0


def records_of(topic: str, partition: int, base: int, payload: bytes) -> Iterator[tuple]:
    for r in decode_batch(payload).records():
        yield (topic, partition, r.offset), r.value


def source_block(raw: bytes) -> tuple[BlockIndex, bytes]:
    """The batch as a source's log object holds it: one zstd block (index, stored bytes)."""
    b = LogObjectBuilder()
    b.add_batch("t", 0, raw)
    obj = b.build("south", 1, 1, 1, 1, 0)
    (index,) = decode_header(obj, where="object").blocks
    return index, obj[index.offset : index.end]


def config(preallocate: bool) -> JournalConfig:
    return JournalConfig(
        fsync=FsyncPolicy.ALWAYS,
        segment_bytes=64 * 1024,
        max_bytes=1 << 30,
        retention_ms=0,
        preallocate=preallocate,
        reserve_bytes=0,
    )


async def step(j: Journal, i: int, m: Model) -> None:
    """One step of the workload; raises what the journal raises."""
    what = i % 6
    if what in (0, 1, 2, 3):  # produce 1-40 records of ~100-600 bytes
        partition = i % 2
        n = 1 + (i * 7) % 40
        vals = [f"{i}:{k}:".encode() + b"x" * (100 + (i * 31 + k) % 500) for k in range(n)]
        m.offered.update(vals)
        res = await j.append("t", partition, encode_batch(vals, timestamps=[i] * n))
        for k, v in enumerate(vals):
            m.acked[v] = ("t", partition, res.base_offset + k)
    elif what == 4:  # a mirror append continuing the source's offsets
        base = j.next_offset(MIRROR, 0)
        vals = [f"m{base + k}".encode() + b"y" * 300 for k in range(5)]
        m.offered.update(vals)
        raw = bytearray(encode_batch(vals, timestamps=[i] * 5))
        raw[8:16] = base.to_bytes(8, "little")  # the batch keeps its source base offset
        m.mirror_seq += 1
        coords = SourceCoords("south", seq=m.mirror_seq, epoch=1)
        if m.mirror_seq % 2:
            res = await j.append_mirror(MIRROR, 0, bytes(raw), coords)
        else:  # as a block entry (the first one rolls to a version 3 segment)
            index, stored = source_block(bytes(raw))
            (res,) = await j.append_mirror_blocks(
                [MirrorBlock(MIRROR, 0, index, stored)], coords, coords
            )
        for k, v in enumerate(vals):
            m.acked[v] = (MIRROR, 0, res.base_offset + k)
    else:  # rewrite sealed segments compressed, ship what is durable, let retention delete it
        m.rewritten += await j.rewriter.rewrite_all()
        await j.flush()
        entries = j.read_entries(m.shipped_from, max_bytes=1 << 30)
        for e in entries:
            if e.kind == atrest.KIND_BLOCK:  # its records are read by offset
                got = j.read(e.topic, e.partition, e.base_offset, max_records=e.count)
                payloads = [x.payload for x in got if x.lsn == e.lsn]
            else:
                payloads = [e.payload] if e.count else []
            for payload in payloads:
                for key, v in records_of(e.topic, e.partition, e.base_offset, payload):
                    assert m.bucket.setdefault(key, v) == v, f"{key} shipped twice, differently"
        if entries:
            m.shipped_from = entries[-1].lsn + 1
            j.set_safe_lsn(m.shipped_from)


async def run(path: Path, cfg: JournalConfig, fs: FaultyFs, m: Model) -> None:
    j: Journal | None = None
    i = 0
    healed_at = -1
    while i < STEPS:
        if j is None:
            try:
                j = Journal.open_sync(path, cfg)
                # the rewrite on a thread of this process: the faulty file
                # operations of this sweep exist in this process only
                j.rewriter.in_child = False
            except (DiskFull, Unavailable) as exc:
                m.errors.append(f"open: {exc}")
                fs.heal()  # an operator frees space (or swaps the card) and restarts
                continue
        if i == RESTART_AT and healed_at < i:
            # kill -9: no close (no fsync, no cut of the preallocated tail);
            # the page cache keeps what was written.
            healed_at = i
            j._release_files()
            assert j._lock is not None
            j._lock.release()  # the kernel drops a dead process's lock
            j = None
            continue
        try:
            await step(j, i, m)
        except (DiskFull, Unavailable) as exc:
            m.errors.append(f"step {i}: {type(exc).__name__}: {exc}")
            if j.statistics().failed is not None:
                # Intake stopped for good (a failed fsync, EIO): restart.
                fs.heal()
                j.close_sync()
                j = None
        i += 1
    assert j is not None
    j.close_sync()


def check(path: Path, cfg: JournalConfig, m: Model) -> None:
    """Restart on a healthy disk and compare with what was acknowledged."""
    j = Journal.open_sync(path, cfg)
    try:
        held: dict[tuple[str, int, int], bytes] = {}
        for topic, partition in (("t", 0), ("t", 1), (MIRROR, 0)):
            offset = j.first_offset(topic, partition)
            while True:
                entries = j.read(topic, partition, offset, max_records=100_000)
                if not entries:
                    break
                for e in entries:
                    for r in decode_batch(e.payload).records(offset):
                        assert r.offset == offset, f"{topic}/{partition}: gap or repeat at {offset}"
                        held[(topic, partition, r.offset)] = r.value
                        offset += 1
            assert offset == j.next_offset(topic, partition)
        for key, v in m.bucket.items():
            assert held.setdefault(key, v) == v, f"{key}: the bucket and the journal differ"
        seen: dict[bytes, tuple[str, int, int]] = {}
        for key, v in held.items():
            assert v in m.offered, f"{key}: a record nobody produced"
            assert v not in seen, f"{v[:20]!r} at {seen.get(v)} and {key}: duplicated"
            seen[v] = key
        for v, key in m.acked.items():
            assert seen.get(v) == key, f"acknowledged {v[:20]!r} at {key}: lost or moved"
        mirror = j.source_progress().get("south")
        mirror_acked = [k for k in m.acked.values() if k[0] == MIRROR]
        if mirror_acked:
            assert mirror is not None
            assert j.next_offset(MIRROR, 0) >= max(o for _, _, o in mirror_acked) + 1
        # The journal accepts work again.
        j.append_nowait("t", 0, encode_batch([b"after"], timestamps=[0]))
    finally:
        j.close_sync()


def count_calls(tmp_path: Path, preallocate: bool) -> FaultyFs:
    fs = FaultyFs()
    m = Model()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fs_module, "ops", fs)
        trio.run(run, tmp_path / "count", config(preallocate), fs, m)
    assert not m.errors
    check(tmp_path / "count", config(preallocate), m)
    assert m.rewritten >= 3, "the workload rewrote too few segments"
    return fs


# kind -> run with preallocation (the memory map, fallocate) or without (a pwritev per entry)
KIND_PREALLOCATE = {
    "write": False,
    "fsync": False,
    "open": True,
    "rename": True,
    "resize": True,
}


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
@pytest.mark.parametrize("kind", list(KIND_PREALLOCATE))
def test_fail_the_nth_call_for_every_n(tmp_path: Path, kind: str, error: int) -> None:
    preallocate = KIND_PREALLOCATE[kind]
    total = count_calls(tmp_path, preallocate).calls[kind]
    assert total > 3, f"the workload makes only {total} {kind} calls"
    for n in range(1, total + 1):
        path = tmp_path / f"n{n}"
        fs = FaultyFs()
        fs.drop_unsynced = True
        fs.fail(kind, n, errno=error, count=2)
        m = Model()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fs_module, "ops", fs)
            try:
                trio.run(run, path, config(preallocate), fs, m)
            except Exception as exc:
                raise AssertionError(f"{kind} #{n} failing with {error}: {exc!r}") from exc
        assert fs.failures, f"{kind} #{n} never failed"
        try:
            check(path, config(preallocate), m)
        except AssertionError as exc:
            raise AssertionError(f"{kind} #{n} failing with {error}: {exc}; {m.errors}") from exc
