"""The mirror append path: entries copied from another site's journal.

What it owns (:class:`MirrorAppends`, a part the journal composes):
``append`` (one batch, on the loop), ``append_blocks`` (fetched log-object
blocks kept as shipped, one block entry each: kind 4, version 3 segments,
docs/at-rest.md) and ``append_batches`` (a group: its space and LSNs
reserved at the end of the active segment on the loop, its CRCs computed
and its bytes written by a worker thread, then published on the loop — or
settled by the loop when the thread never ran); the ``_Reserved`` group in
flight (:attr:`MirrorAppends.inflight`, which every other writer settles
first), and the runs of mirror LSNs it notes for ``read_entries`` to step
over.

It writes through the journal's append path, given as :class:`AppendPath`
(``_reserve``, ``_write``, ``_emit``, ``_index``) and, for a full disk, the
journal's :class:`Retention`;
it does not import the journal.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple, Protocol

import trio
import trio.lowlevel

from edge_gateway._crc import crc32c
from edge_gateway.errors import InvalidInput, Unavailable
from edge_gateway.failpoints import fail_point
from edge_gateway.format import atrest
from edge_gateway.format import batch as fbatch
from edge_gateway.format import entry as fentry
from edge_gateway.format.entry import SourceCoords
from edge_gateway.format.logobject import BlockIndex
from edge_gateway.journal import _fs
from edge_gateway.journal._retention import Retention
from edge_gateway.journal._segment import Segment
from edge_gateway.journal._state import Appended, MirrorRuns, _Partition, _Topic

_LEN_CRC = fentry.ENTRY_LEN_CRC
_crc = crc32c
_time_ns = time.time_ns
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled


_LSN_FIELD = struct.Struct("<Q")


#: iovecs per pwritev (IOV_MAX is 1024 on Linux)
_MAX_IOV: Final = 1020
#: a group up to this many bytes is written on the event loop: its CRC and
#: copy take less than handing it to a worker thread and back (a quiet
#: site's entries, replayed from packs, are a few hundred bytes each)
_INLINE_BYTES: Final = 64 * 1024


class MirrorBatch(NamedTuple):
    """One batch of :meth:`Journal.append_mirror_batches`."""

    topic: str
    partition: int
    batch: bytes | bytearray | memoryview
    #: the batch may skip forward over offsets the source no longer has
    allow_gap: bool = False


class MirrorBlock(NamedTuple):
    """One block of :meth:`Journal.append_mirror_blocks`: a fetched log-object block, as shipped."""

    #: the local (mirror) topic and partition
    topic: str
    partition: int
    #: the block's entry in the source object's header (offsets, timestamps, sizes, codec)
    block: BlockIndex
    #: its stored bytes, opened first if the object was encrypted: one zstd frame or raw batches
    stored: bytes
    #: a batch in it may hold a null (the source object's NULLS flag)
    nulls: bool = False
    #: the block may skip forward over offsets the source no longer has
    allow_gap: bool = False
    #: the CRC-32C of ``stored`` when the caller has it, checked (None: computed
    #: here, on the event loop, for the block entry's header)
    crc: int | None = None


class _Reserved:
    """Entries whose space and LSNs are reserved at the end of the active segment.

    Written by a worker thread, published on the event loop (see
    :meth:`Journal.append_mirror_batches`). Until then nothing of them is
    visible: not ``next_lsn``, not the segment's size or positions, not the
    partitions' offsets, not the source progress, not ``durable_lsn``.
    """

    __slots__ = (
        "appended",
        "claim_lock",
        "claimed",
        "done",
        "error",
        "failure",
        "heads",
        "keys",
        "length",
        "lsn",
        "now",
        "parts",
        "pos",
        "seg",
        "sizes",
        "source",
        "state",
    )

    def __init__(self, seg: Segment, lsn: int, now: int, source: SourceCoords) -> None:
        self.seg = seg
        self.pos = seg.size
        self.lsn = lsn
        self.now = now
        self.source = source
        self.length = 0
        #: per entry: its header (without length and CRC), its batch, its length
        self.heads: list[bytes] = []
        self.parts: list[memoryview] = []
        self.sizes: list[int] = []
        #: per entry: (partition, base offset, next offset)
        self.keys: list[tuple[_Partition, int, int]] = []
        self.appended: list[Appended] = []
        #: set by the write; made (with the lock) only for a group handed to
        #: a worker thread (:meth:`handed`): a small group is written on the
        #: loop, where nothing else can claim it, and most groups are small
        self.done: threading.Event | None = None
        #: whoever claims the group writes it: the worker thread, or a settler
        #: on the loop when the thread has not started (it waits for a
        #: limiter token, or its start was cancelled): never both, never neither
        self.claim_lock: threading.Lock | None = None
        self.claimed = False
        #: what the write raised (set by the worker thread)
        self.error: BaseException | None = None
        #: the error for the owner after a rollback (None: retry on the synchronous path)
        self.failure: BaseException | None = None
        #: "reserved", then "published" or "failed"
        self.state = "reserved"

    def handed(self) -> None:
        """The group goes to a worker thread: from now on it is claimed under a lock."""
        self.done = threading.Event()
        self.claim_lock = threading.Lock()

    def claim(self) -> bool:
        """Take the write on (True once: for the first caller)."""
        if self.claim_lock is None:  # never handed to a thread: only the loop sees it
            return self._take()
        with self.claim_lock:
            return self._take()

    def _take(self) -> bool:
        if self.claimed:
            return False
        self.claimed = True
        return True

    def write_in_thread(self) -> None:
        """The worker thread's part: write, unless a settler already did."""
        if self.claim():
            self.write()

    def write(self) -> None:
        """Compute the entries' CRCs and write them with pwritev (in a worker thread)."""
        try:
            iov: list[bytes | memoryview] = []
            pack = _LEN_CRC.pack
            for head, body, size in zip(self.heads, self.parts, self.sizes, strict=True):
                iov.append(pack(size, _crc(body, _crc(head))))
                iov.append(head)
                iov.append(body)
            fd = self.seg.fd
            assert fd is not None
            pos = self.pos
            for i in range(0, len(iov), _MAX_IOV):
                chunk = iov[i : i + _MAX_IOV]
                want = sum(len(c) for c in chunk)
                n = _fs.ops.pwritev(fd, chunk, pos)
                if n != want:  # a short write: finish it byte-exactly
                    rest = b"".join(chunk)[n:]
                    at = pos + n
                    while rest:
                        k = _fs.ops.pwrite(fd, rest, at)
                        rest = rest[k:]
                        at += k
                pos += want
            fail_point("journal.mirror_publish")
        except BaseException as exc:  # noqa: BLE001 - handed to the event loop
            self.error = exc
        finally:
            if self.done is not None:
                self.done.set()


def _check_mirrored(
    topic: str,
    partition: int,
    batch: bytes | bytearray | memoryview,
    next_offset: int,
    allow_gap: bool,
) -> fbatch.BatchHeader:
    h = fbatch.read_header(batch, 0, where=f"mirror to {topic}/{partition}")
    if h.length != len(batch):
        raise InvalidInput(f"batch length field {h.length} but {len(batch)} bytes given")
    if h.base_offset < next_offset:
        raise InvalidInput(
            f"{topic}/{partition}: mirrored offset {h.base_offset} is already present "
            f"(next is {next_offset})"
        )
    if h.base_offset > next_offset and not allow_gap:
        raise InvalidInput(
            f"{topic}/{partition}: mirrored offset {h.base_offset} leaves a gap after {next_offset}"
        )
    return h


def _check_block(b: MirrorBlock, next_offset: int) -> None:
    """A block continues its partition at ``next_offset`` (or skips forward with ``allow_gap``)."""
    first = b.block.first_offset
    where = f"{b.topic}/{b.partition}"
    if first < next_offset:
        raise InvalidInput(
            f"{where}: mirrored offset {first} is already present (next is {next_offset})"
        )
    if first > next_offset and not b.allow_gap:
        raise InvalidInput(f"{where}: mirrored offset {first} leaves a gap after {next_offset}")


def _block_rest(b: MirrorBlock, lsn: int, now: int, source: SourceCoords) -> bytes:
    return atrest.block_entry_rest(
        lsn=lsn,
        topic=b.topic,
        partition=b.partition,
        append_time=now,
        source=source,
        index=b.block,
        stored=b.stored,
        nulls=b.nulls,
        crc=b.crc,
    )


class AppendPath(Protocol):
    """What the mirror appends ask of the append path they write through (the journal)."""

    _next_lsn: int
    _now: int
    _total_bytes: int
    _appended_bytes: int
    _notify_at: int
    #: the active segment's version (block entries need 3, nulls 2)
    _active_version: int
    #: each source region's progress, as the entries record it
    _sources: dict[str, SourceCoords]

    @property
    def _active(self) -> Segment:
        """The segment appends go to."""
        ...

    def _check_open(self) -> None:
        """For writes: the journal is open and intake has not stopped."""

    def _topic(self, topic: str) -> _Topic: ...

    def _new_partition(self, t: _Topic, partition: int) -> _Partition: ...

    def _roll_for_producers(self) -> None: ...

    def _roll_for_blocks(self) -> None: ...

    def _reserve(self, length: int) -> None:
        """Make room for an entry of ``length`` bytes (roll, budget, a full disk)."""

    def _write(
        self,
        kind: int,
        topic_raw: bytes,
        partition: int,
        base_offset: int,
        count: int,
        payload: tuple[bytes | memoryview, ...],
        payload_len: int,
        source: SourceCoords | None,
    ) -> int:
        """Encode and write one entry; its LSN."""
        ...

    def _emit(self, parts: list[bytes | memoryview], length: int, now: int) -> None:
        """Write one encoded entry at the end of the active segment and account for it."""

    def _index(self, p: _Partition, lsn: int, base: int, next_offset: int) -> None: ...

    def _notify(self) -> None: ...

    async def _after_append(self, lsn: int) -> None:
        """What an append waits for after its write (the fsync policy)."""

    def _write_failed(self, seg: Segment, exc: OSError) -> None:
        """Roll back a partly written entry; returns only if the disk is full."""

    def _fail(self, what: str, exc: OSError) -> Unavailable: ...


class MirrorAppends:
    """The mirror append path of one journal, and the group it has in flight."""

    __slots__ = ("_lot", "_room", "_runs", "_writer", "groups", "inflight")

    def __init__(self, journal: AppendPath, room: Retention, runs: MirrorRuns) -> None:
        #: the journal's append path (``w`` in the methods)
        self._writer = journal
        #: a full disk: delete a shipped segment, or make drop-oldest lanes give way
        self._room = room
        #: LSN runs of mirror entries appended since the open (the journal's
        #: hint for read_entries to step over them)
        self._runs = runs
        #: mirror entries reserved and being written by a worker thread (at most one group)
        self.inflight: _Reserved | None = None
        self._lot = trio.lowlevel.ParkingLot()
        #: groups reserved since the open
        self.groups = 0

    async def append(
        self,
        topic: str,
        partition: int,
        batch: bytes | bytearray | memoryview | None,
        source: SourceCoords,
        *,
        allow_gap: bool = False,
    ) -> Appended:
        """Append a batch mirrored from another region, keeping its source offsets.

        ``batch`` keeps the base offset it had at the source; it must continue
        the local partition exactly (or, with ``allow_gap``, skip forward over
        data the source no longer has). ``batch=None`` writes a marker that
        only records progress through ``source`` (an entry with nothing
        subscribed, a fence entry). The entry records ``source`` so mirror
        progress is recovered from the journal with the data, atomically.
        """
        w = self._writer
        await _checkpoint_if_cancelled()
        await self.wait_idle()
        res = self.append_sync(topic, partition, batch, source, allow_gap)
        await w._after_append(res.lsn)
        return res

    def append_sync(
        self,
        topic: str,
        partition: int,
        batch: bytes | bytearray | memoryview | None,
        source: SourceCoords,
        allow_gap: bool,
    ) -> Appended:
        w = self._writer
        w._check_open()
        if batch is None:
            lsn = w._write(fentry.KIND_MIRROR, b"", 0, 0, 0, (), 0, source)
            w._sources[source.region] = source
            self._runs.note(lsn, lsn + 1)
            return Appended(lsn, 0, 0)
        t = w._topic(topic)
        p = t.partitions.get(partition) or w._new_partition(t, partition)
        h = _check_mirrored(topic, partition, batch, p.next_offset, allow_gap)
        if h.flags & fbatch.FLAG_NULLS and w._active_version < 2:
            w._roll_for_producers()  # nulls only in version 2 segments (see append_nowait)
        lsn = w._write(
            fentry.KIND_MIRROR,
            t.raw,
            partition,
            h.base_offset,
            h.count,
            (memoryview(batch),),
            len(batch),
            source,
        )
        w._sources[source.region] = source
        w._index(p, lsn, h.base_offset, h.next_offset)
        self._runs.note(lsn, lsn + 1)
        return Appended(lsn, h.base_offset, h.count)

    async def append_batches(
        self, batches: Sequence[MirrorBatch], source: SourceCoords, last: SourceCoords
    ) -> list[Appended]:
        """Append the mirrored batches of one source entry, as :meth:`append` would
        one by one (every entry records ``source``, the last one ``last``), with
        one write from a worker thread.

        Reserve, write, publish: on the event loop the batches are checked and
        their space at the end of the active segment and their LSNs are
        reserved (so order and LSN assignment stay serial); a worker thread
        computes the entries' CRCs and writes them with one ``pwritev``; back
        on the loop they are published in order (readers, the shipper,
        durability waiters and the source progress see them only then). A
        reserved range that is not written yet is never visible: any other
        write to the journal first waits for it (a synchronous append blocks
        until the thread's write returns, which is the copy it would have
        made itself). A crash before the publish leaves a torn or unused tail,
        which the open truncates, with the source progress of the entries
        before. A write that fails is rolled back (the segment is cut back to
        its published end); a full disk is handled as any append's write is
        (a shipped segment deleted and the batches written again one at a
        time on the loop, or ``DiskFull``).

        A cancelled call raises before it reserves anything, or after the
        batches are published (like ``fsync=always`` appends).
        """
        n = len(batches)

        def one(k: int) -> Appended:
            b = batches[k]
            src = last if k == n - 1 else source
            return self.append_sync(b.topic, b.partition, b.batch, src, b.allow_gap)

        return await self._append_groups(
            n, lambda i: self._reserve_mirror(batches, i, source, last), one
        )

    async def append_blocks(
        self, blocks: Sequence[MirrorBlock], source: SourceCoords, last: SourceCoords
    ) -> list[Appended]:
        """Append fetched log-object blocks of one source entry, each as one block entry.

        The mirror's compressed append (docs/at-rest.md, "The block entry"): each
        block's stored bytes are kept as shipped (opened, if the source object
        was encrypted, by the caller), never decompressed or re-encoded here.
        The same steps and checks as :meth:`append_batches`: every entry
        records ``source``, the last one ``last`` (its END_OF_SOURCE_OBJECT); a
        block continues its partition exactly, or with ``allow_gap`` skips
        forward; space and LSNs are reserved on the loop, the CRCs and the
        write done by a worker thread for a large group, the entries published
        in order. Each block is checked before anything is reserved: its index
        entry's rules (``validate_block``), and for zstd that its bytes start
        with one frame declaring ``raw_length`` (``block_entry_rest``); the
        caller checked its CRC and tag against the source's index. The first
        block entry of a journal rolls to a version 3 segment (older code
        refuses it whole, instead of reading kind 4 as a torn tail).
        """
        n = len(blocks)

        def one(k: int) -> Appended:
            return self._append_block_sync(blocks[k], last if k == n - 1 else source)

        return await self._append_groups(
            n, lambda i: self._reserve_blocks(blocks, i, source, last), one
        )

    async def _append_groups(
        self,
        n: int,
        reserve: Callable[[int], tuple[_Reserved | None, int]],
        one: Callable[[int], Appended],
    ) -> list[Appended]:
        """Append items ``0..n-1`` in reserved groups (``reserve(i)``), or one at a time
        (``one(k)``: an item too large for a group, a full disk)."""
        w = self._writer
        await _checkpoint_if_cancelled()
        out: list[Appended] = []
        i = 0
        while i < n:
            await self.wait_idle()
            w._check_open()
            res, i = reserve(i)
            if res is None:  # one item too large for a group: the general path
                out.append(one(i))
                i += 1
                continue
            if res.length <= _INLINE_BYTES:
                self.settle()  # a small group: written here, cheaper than a hand-off
            else:
                res.handed()
                try:
                    await trio.to_thread.run_sync(res.write_in_thread)
                finally:
                    self.settle()
            if res.state == "published":
                out += res.appended
                continue
            if res.failure is not None:
                raise res.failure
            # A full disk, handled as _put handles it: note the episode, delete
            # a shipped segment (or make drop-oldest lanes give way) or refuse;
            # then the items again, one at a time (each makes room or raises
            # DiskFull).
            assert isinstance(res.error, OSError)
            room = self._room
            error = room.disk_full(res.seg.path, res.error, res.length)
            if not (
                room.delete_segments(force=True, limit=1) or room.make_room_unshipped(res.length)
            ):
                room.refused()
                raise error from res.error
            first = i - len(res.sizes)
            for k in range(first, i):
                out.append(one(k))
        if out:
            await w._after_append(out[-1].lsn)
        return out

    def _append_block_sync(self, b: MirrorBlock, source: SourceCoords) -> Appended:
        """One block entry, written on the loop (a block too large for a group, a full disk)."""
        w = self._writer
        w._check_open()
        if self.inflight is not None:
            self.settle()
        t = w._topic(b.topic)
        p = t.partitions.get(b.partition) or w._new_partition(t, b.partition)
        _check_block(b, p.next_offset)
        now = _time_ns() // 1_000_000
        length = 8 + len(_block_rest(b, 0, now, source)) + len(b.stored)  # checks the block
        if w._active_version < fentry.SEGMENT_VERSION_BLOCKS:
            w._roll_for_blocks()
        w._reserve(length)
        lsn = w._next_lsn
        rest = _block_rest(b, lsn, now, source)
        head = _LEN_CRC.pack(length, fentry.entry_crc(rest, b.stored))
        w._emit([head, rest, b.stored], length, now)
        w._sources[source.region] = source
        first, count = b.block.first_offset, b.block.record_count
        w._index(p, lsn, first, first + count)
        self._runs.note(lsn, lsn + 1)
        return Appended(lsn, first, count)

    def _reserve_blocks(
        self, blocks: Sequence[MirrorBlock], i: int, source: SourceCoords, last: SourceCoords
    ) -> tuple[_Reserved | None, int]:
        """Reserve space and LSNs for blocks ``i``... (as :meth:`_reserve_mirror` for batches)."""
        w = self._writer
        now = _time_ns() // 1_000_000
        n = len(blocks)
        lsn0 = w._next_lsn
        planned: list[tuple[_Partition, bytes, int, int, int, memoryview, int]] = []
        expected: dict[tuple[str, int], int] = {}
        total = 0
        j = i
        while j < n:
            b = blocks[j]
            t = w._topic(b.topic)
            p = t.partitions.get(b.partition) or w._new_partition(t, b.partition)
            key = (b.topic, b.partition)
            _check_block(b, expected.get(key, p.next_offset))
            head = _block_rest(b, lsn0 + (j - i), now, last if j == n - 1 else source)
            size = 8 + len(head) + len(b.stored)
            if total + size > fentry.MAX_ENTRY_BYTES:
                break
            total += size
            first, count = b.block.first_offset, b.block.record_count
            expected[key] = first + count
            planned.append((p, head, size, first, first + count, memoryview(b.stored), count))
            j += 1
        if not planned:
            return None, i
        if w._active_version < fentry.SEGMENT_VERSION_BLOCKS:
            w._roll_for_blocks()  # block entries only in version 3 segments
        return self._reserve_planned(planned, total, now, lsn0, last if j == n else source), j

    def _reserve_planned(
        self,
        planned: list[tuple[_Partition, bytes, int, int, int, memoryview, int]],
        total: int,
        now: int,
        lsn0: int,
        source: SourceCoords,
    ) -> _Reserved:
        """Reserve ``total`` bytes for the planned entries (headers made for LSNs from ``lsn0``)."""
        w = self._writer
        w._reserve(total)  # may roll the segment: the LSNs move with it
        seg = w._active
        lsn0b = w._next_lsn
        res = _Reserved(seg, lsn0b, now, source)
        for k, (p, head, size, base, nxt, body, count) in enumerate(planned):
            if lsn0b != lsn0:
                head = _LSN_FIELD.pack(lsn0b + k) + head[8:]
            res.heads.append(head)
            res.parts.append(body)
            res.sizes.append(size)
            res.keys.append((p, base, nxt))
            res.appended.append(Appended(lsn0b + k, base, count))
        res.length = total
        self.inflight = res
        self.groups += 1
        return res

    def _reserve_mirror(
        self, batches: Sequence[MirrorBatch], i: int, source: SourceCoords, last: SourceCoords
    ) -> tuple[_Reserved | None, int]:
        """Reserve space and LSNs for batches ``i``... (as many as one group holds).

        Returns the reservation (now in flight) and the index after its last
        batch, or ``(None, i)`` when batch ``i`` alone is over a group's size.
        """
        w = self._writer
        now = _time_ns() // 1_000_000
        n = len(batches)
        lsn0 = w._next_lsn
        planned: list[tuple[_Partition, bytes, int, int, int, memoryview, int]] = []
        expected: dict[tuple[str, int], int] = {}
        total = 0
        nulls = False
        j = i
        while j < n:
            b = batches[j]
            t = w._topic(b.topic)
            p = t.partitions.get(b.partition) or w._new_partition(t, b.partition)
            key = (b.topic, b.partition)
            h = _check_mirrored(
                b.topic, b.partition, b.batch, expected.get(key, p.next_offset), b.allow_gap
            )
            src = last if j == n - 1 else source
            head = fentry.encode_entry_rest(
                lsn=lsn0 + (j - i),
                kind=fentry.KIND_MIRROR,
                topic=t.raw,
                partition=b.partition,
                base_offset=h.base_offset,
                count=h.count,
                append_time=now,
                source=src,
            )
            size = 8 + len(head) + len(b.batch)
            if total + size > fentry.MAX_ENTRY_BYTES:
                break
            total += size
            expected[key] = h.next_offset
            nulls = nulls or bool(h.flags & fbatch.FLAG_NULLS)
            planned.append(
                (p, head, size, h.base_offset, h.next_offset, memoryview(b.batch), h.count)
            )
            j += 1
        if not planned:
            return None, i
        if nulls and w._active_version < 2:
            w._roll_for_producers()  # nulls only in version 2 segments (see append_nowait)
        return self._reserve_planned(planned, total, now, lsn0, last if j == n else source), j

    def settle(self) -> None:
        """Finish the reserved group in flight, if any: publish it, or roll it back.

        Blocks until the worker thread's write returns (called by every other
        writer before it touches the journal); if the thread has not started
        yet (it needs the loop to start), writes the group itself. Never raises: a failure is
        left in the group for its owner.
        """
        w = self._writer
        res = self.inflight
        if res is None:
            return
        if res.claim():  # the thread has not started: write here (no deadlock)
            res.write()
        if res.done is not None:
            res.done.wait()
        self.inflight = None
        self._lot.unpark_all()
        if res.error is None:
            self._publish(res)
            return
        res.state = "failed"
        seg = res.seg
        exc = res.error
        try:
            if isinstance(exc, OSError):
                # Cut back to the published end; raises unless the disk is full.
                w._write_failed(seg, exc)
                res.failure = None
                return
            if seg.mm is not None:
                seg.mm.close()
                seg.mm = None
                seg.mm_end = 0
            assert seg.fd is not None
            try:
                _fs.ops.ftruncate(seg.fd, seg.size)
            except OSError as exc2:
                raise w._fail(f"{seg.path}: rollback of a failed write", exc2) from exc
            res.failure = exc
        except Unavailable as failed:
            res.failure = failed

    def _publish(self, res: _Reserved) -> None:
        """Make a written group visible, in LSN order (on the event loop)."""
        w = self._writer
        seg = res.seg
        pos = res.pos
        for size in res.sizes:
            seg.positions.append(pos)
            pos += size
        seg.size = pos
        w._now = res.now
        w._total_bytes += res.length
        n = len(res.sizes)
        w._next_lsn = res.lsn + n
        w._appended_bytes += res.length
        for (p, base, nxt), a in zip(res.keys, res.appended, strict=True):
            w._index(p, a.lsn, base, nxt)
        w._sources[res.source.region] = res.source
        self._runs.note(res.lsn, res.lsn + n)
        res.state = "published"
        if w._appended_bytes >= w._notify_at:
            w._notify()

    async def wait_idle(self) -> None:
        """Wait (without blocking the loop) until no group is in flight."""
        while self.inflight is not None:
            await self._lot.park()
