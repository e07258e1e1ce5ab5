"""The journal's read path: entries by LSN, by partition offset, and in LSN order.

What it owns: :class:`Reads`, the journal's reads -- ``read_entry``, ``read``
(a partition from an offset, through each segment's index run),
``read_entries`` and ``read_entries_in_thread`` (the shipper's drain in LSN
order, stepping over runs of mirror entries when asked) -- and what a
reader lends them (:class:`ReadBuffers`). It changes no state: it is given
what it reads (the segment set, the partitions' indexes, the mirror runs,
and the log's ends: how far it is written and fsynced) and reads the bytes
through the segment set (``_segment_set.py``). A compressed sealed segment
(``_compressed.py``) is read by LSN as the entry log it replaced (the segment
set gives that log's positions and bytes, so runs are planned as before) and
by offset through its frames.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Container, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol

import trio

from edge_gateway.errors import ClosedError, CorruptData, InvalidInput, Unavailable
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.atrest import BlockEntry, FrameBatches
from edge_gateway.format.entry import Entry
from edge_gateway.journal._compressed import block_batch_entries
from edge_gateway.journal._segment import Segment
from edge_gateway.journal._segment_set import SegmentSet
from edge_gateway.journal._state import MirrorRuns, _Partition

if TYPE_CHECKING:
    from edge_gateway.journal._compressed import CompressedFile
    from edge_gateway.journal._index import IntSequence


class OffsetOutOfRange(InvalidInput):
    """The requested offset is below the earliest one the journal still holds."""

    def __init__(self, topic: str, partition: int, offset: int, earliest: int) -> None:
        self.earliest = earliest
        super().__init__(
            f"{topic}/{partition}: offset {offset} is no longer in the journal "
            f"(earliest available {earliest})"
        )


#: Runs read by one worker-thread call of ``read_entries_in_thread`` (a file
#: descriptor duplicated for each while it runs).
_RUNS_PER_THREAD: Final = 16
#: Bytes of one ``pread`` there: the buffer lives beside the entries copied out
#: of it until they are decoded (the shipper's objects are 16 MiB of entries).
_RUN_BYTES: Final = 4 * 1024 * 1024


#: A block entry's kind (a mirrored block: read by LSN as its header fields only).
_BLOCK: Final = atrest.KIND_BLOCK

#: Read buffers are allocated in steps of this (so that the runs of a drain,
#: each just under :data:`_RUN_BYTES`, fit the buffers of the runs before).
_BUFFER_STEP: Final = 256 * 1024


class ReadBuffers:
    """Buffers a caller lends :meth:`Journal.read_entries_in_thread`, to read runs into.

    Without them every run is read into fresh memory, and fresh memory costs
    the kernel a page fault per 4 KiB the first time it is touched
    (``edgegw serve``'s heap settings, ``heap.tune``, map every buffer above
    256 KiB afresh): ``bench/ship.py`` measured 558-685 faults per journal
    MiB of a drain and 3.4-4.1 ms of CPU, ~90 and 2.0-2.4 ms with them. With
    them the runs of a drain land in the same few buffers again and again.

    A buffer is reused only once nothing refers into it: entries read into
    it hold read-only views of it (their payloads), and a ``bytearray``
    with a live view refuses to be resized -- the check (:meth:`_unviewed`)
    -- so the bytes an entry was checked with never change under it. The
    caller owns the buffers (the shipper: one set per drain) and lets go of
    them when it is done; at most ``keep`` are kept, so memory is bounded by
    what the caller holds of its entries plus ``keep`` buffers.
    """

    def __init__(self, keep: int = 24) -> None:
        self._keep = keep
        self._buffers: list[bytearray] = []
        self._lock = threading.Lock()  # reads run in worker threads

    def take(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes of a buffer that nothing refers into.

        The view itself marks the buffer taken (it is made under the lock), so
        two reads at once never get the same buffer; views derived from it
        (``toreadonly``, slices) keep it taken after the view is dropped.
        """
        with self._lock:
            for buf in self._buffers:
                if len(buf) >= size and self._unviewed(buf):
                    return memoryview(buf)[:size]
            buf = bytearray(-(-size // _BUFFER_STEP) * _BUFFER_STEP)
            if len(self._buffers) < self._keep:
                self._buffers.append(buf)
            return memoryview(buf)[:size]

    @staticmethod
    def _unviewed(buf: bytearray) -> bool:
        # Shrinking a bytearray by one byte and growing it back moves nothing
        # (it keeps its allocation), but raises while any view of it lives.
        try:
            last = buf.pop()
        except BufferError:
            return False
        buf.append(last)
        return True


class _Run(NamedTuple):
    """A run of consecutive entries of one segment file, to read in a worker thread.

    ``fd`` -1: a run of mirror entries stepped over unread (``last_lsn`` is its last).
    """

    fd: int  # a duplicate, closed by the caller after the read
    path: Path
    start: int
    length: int
    entries: int
    last_lsn: int = 0
    #: a run of a compressed segment: the file and the positions of the entry
    #: log it replaced (``start``/``length`` are in that log)
    compressed: tuple[CompressedFile, IntSequence] | None = None


def _run_end(
    positions: IntSequence, seg: Segment, i: int, limit: int, last: int
) -> tuple[int, int]:
    """The run of ``seg``'s entries from index ``i`` (at least one, up to index
    ``last``) that starts before byte ``limit``: (the index after it, its end byte).
    ``positions``: the segment set's, for a compressed segment those of the
    entry log it replaced."""
    j = bisect.bisect_left(positions, limit, i + 1, last)
    return j, positions[j] if j < seg.entries else SegmentSet.entries_size(seg)


class _BlockFrame(FrameBatches):
    """A block entry's decompressed batches in the frame cache, with the entry (less its
    stored bytes): a read by offset that finds it cached reads nothing from the file."""

    __slots__ = ("entry",)

    def __init__(self, be: BlockEntry, *, where: str) -> None:
        super().__init__(be.frame_index(), atrest.block_entry_raw(be, where=where), where=where)
        self.entry = be.header_only()


def block_header_entry(be: BlockEntry) -> Entry:
    """What a read by LSN returns for a block entry: its header fields, kind
    :data:`atrest.KIND_BLOCK`, its source, no payload (its records are read by offset)."""
    return Entry(
        be.lsn,
        atrest.KIND_BLOCK,
        be.topic,
        be.partition,
        be.first_offset,
        be.record_count,
        be.append_time,
        be.source,
        b"",
        be.length,
    )


def _mirror_run_entry(last_lsn: int, length: int) -> Entry:
    """What a read returns for a run of mirror entries it stepped over: one
    entry with the run's last LSN, kind mirror and total length, nothing else."""
    return Entry(last_lsn, fentry.KIND_MIRROR, "", 0, 0, 0, 0, None, b"", length)


def _decode_run(
    data: bytes | memoryview,
    count: int,
    path: Path,
    start: int,
    payload_kinds: Container[int] | None,
    out: list[Entry],
) -> int:
    """Decode ``count`` entries from ``data`` (read at ``start`` of ``path``) into ``out``,
    checkpoints left out; return the bytes of the entries kept. Given a view
    of ``bytes``, ordinary DATA entries' payloads are views into it."""
    size = cur = 0
    decode, decode_header = fentry.decode_entry, fentry.decode_entry_header
    data_too = payload_kinds is None or fentry.KIND_DATA in payload_kinds
    fast = fentry.decode_data_entry if data_too else None
    for _ in range(count):
        # An ordinary DATA entry takes the fast path (one unpack, one CRC);
        # anything else, or anything it doubts, the full decode.
        if fast is not None and (e := fast(data, cur)) is not None:
            cur += e.length
            out.append(e)
            size += e.length
            continue
        # ``where`` is made only for an error: formatting it for every entry
        # cost ~5% of a drain of one-record entries.
        try:
            if len(data) - cur > fentry.KIND_OFFSET and data[cur + fentry.KIND_OFFSET] == _BLOCK:
                e = block_header_entry(atrest.decode_block_entry(data, cur))
            elif (
                payload_kinds is not None
                and len(data) - cur > fentry.KIND_OFFSET
                and data[cur + fentry.KIND_OFFSET] not in payload_kinds
            ):
                e = decode_header(data, cur)
            else:
                e = decode(data, cur)
        except CorruptData as exc:
            raise type(exc)(exc.reason, where=f"{path}@{start + cur}") from None
        cur += e.length
        if e.kind != fentry.KIND_CHECKPOINT:
            out.append(e)
            size += e.length
    return size


def _read_compressed(run: _Run) -> bytes:
    """A run of a compressed segment's entries, rebuilt (frames decoded here, not cached)."""
    assert run.compressed is not None
    cf, positions = run.compressed
    fd = run.fd

    def pread(n: int, pos: int) -> bytes:
        return os.pread(fd, n, pos)

    return cf.read_wal(pread, positions, run.start, run.length)


def _read_runs(
    runs: list[_Run], payload_kinds: Container[int] | None, buffers: ReadBuffers | None
) -> list[Entry]:
    """Read and decode ``runs`` (blocking: runs in a worker thread).

    DATA entries' payloads are read-only views into each run's buffer, not
    copies: the log-object builder copies them once, into its blocks. A
    run's buffer lives while any of its entries does (an object's worth: the
    shipper drops them once built); from ``buffers``, it is reused after.
    """
    out: list[Entry] = []
    for run in runs:
        if run.fd < 0:
            out.append(_mirror_run_entry(run.last_lsn, run.length))
            continue
        data: bytes | memoryview
        try:
            if run.compressed is not None:
                data = _read_compressed(run)
                got = len(data)
            elif buffers is None:
                data = os.pread(run.fd, run.length, run.start)
                got = len(data)
            else:
                target = buffers.take(run.length)
                got = os.preadv(run.fd, [target], run.start)
                data = target.toreadonly()  # keeps the buffer taken while entries view it
                del target
        except OSError as exc:
            raise Unavailable(f"journal: cannot read {run.path}@{run.start}: {exc}") from exc
        if got != run.length:
            raise CorruptData(
                f"short read: {got} of {run.length} bytes", where=f"{run.path}@{run.start}"
            )
        _decode_run(memoryview(data), run.entries, run.path, run.start, payload_kinds, out)
    return out


class LogEnds(Protocol):
    """What reads ask of the log they read (the journal answers)."""

    @property
    def next_lsn(self) -> int:
        """The LSN the next entry will get."""
        ...

    @property
    def durable_lsn(self) -> int:
        """Every entry up to this LSN is fsynced."""
        ...

    @property
    def closed(self) -> bool:
        """The log is closed: reads raise ``ClosedError``."""
        ...


class Reads:
    """The journal's reads (see :class:`~edge_gateway.journal.Journal`, which delegates here).

    Given, not owned: ``segments`` (where each LSN is at rest, and the
    descriptors to read it), ``partitions`` (each partition's index: the
    active segment's LSNs and offsets in memory, sealed segments' runs in
    their index files), ``mirror_runs`` (runs of mirror LSNs to step over)
    and ``log`` (how far the log is written and fsynced, whether it is
    open). Reads change none of them but the segment set's descriptor cache.
    """

    __slots__ = ("log", "mirror_runs", "partitions", "segments")

    def __init__(
        self,
        segments: SegmentSet,
        partitions: dict[tuple[str, int], _Partition],
        mirror_runs: MirrorRuns,
        log: LogEnds,
    ) -> None:
        self.segments = segments
        self.partitions = partitions
        self.mirror_runs = mirror_runs
        self.log = log

    def _check_readable(self) -> None:
        # Reads go on after intake stopped (a failed fsync), not after close.
        if self.log.closed:
            raise ClosedError("journal is closed")

    def read_entry(self, lsn: int) -> Entry:
        """Read and verify the entry with this LSN.

        A block entry (kind 4, a mirrored block) comes with its header fields
        and source only (:func:`block_header_entry`): its records are read by
        offset (:meth:`read`).
        """
        self._check_readable()
        e = self._read_any(lsn)
        return block_header_entry(e) if isinstance(e, BlockEntry) else e

    def _locate(self, lsn: int) -> tuple[Segment, int, int]:
        """The segment holding ``lsn`` and the entry's byte range in it."""
        seg, _ = self.segments.locate(lsn)
        i = lsn - seg.base_lsn
        positions = self.segments.positions(seg)
        pos = positions[i]
        end = positions[i + 1] if i + 1 < seg.entries else SegmentSet.entries_size(seg)
        return seg, pos, end

    def _read_any(
        self, lsn: int, at: tuple[Segment, int, int] | None = None, *, check_block: bool = True
    ) -> atrest.AnyEntry:
        seg, pos, end = at or self._locate(lsn)
        data = self.segments.pread(seg, end - pos, pos)
        e = atrest.decode_any_entry(data, where=f"{seg.path}@{pos}", check_block=check_block)
        if e.lsn != lsn:  # an index that does not match its segment
            raise CorruptData(
                f"entry has LSN {e.lsn}, the index says {lsn}", where=f"{seg.path}@{pos}"
            )
        return e

    def _entries_at(self, lsn: int, offset: int) -> Iterator[Entry]:
        """The entry with this LSN; a block entry as its batches from ``offset`` on
        (decompressed through the journal's frame cache, key: the segment's base LSN
        and the entry's position)."""
        at = self._locate(lsn)
        seg, pos, _ = at
        key = (seg.base_lsn, pos)  # a base LSN names one segment for the journal's life
        cache = self.segments.frame_cache
        cached = cache.peek(key)
        if cached is None:
            # A block entry is decompressed next (_BlockFrame), which checks its
            # frame; the entry's CRC covers the block's bytes: no second CRC.
            e = self._read_any(lsn, at, check_block=False)
            if not isinstance(e, BlockEntry):
                yield e
                return
            where = f"{seg.path}@{pos}"
            cached = cache.get(key, lambda: _BlockFrame(e, where=where))
        assert isinstance(cached, _BlockFrame)
        yield from block_batch_entries(cached, cached.entry, offset)

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 10_000,
        max_bytes: int = 1024 * 1024,
    ) -> list[Entry]:
        """Entries of one partition from ``offset`` on, oldest first.

        The first entry may start before ``offset`` (batches are not split;
        see :meth:`RecordBatch.records`). At least one entry is returned when
        data exists at ``offset``, however large. An empty list means nothing
        at or after ``offset`` yet (see :meth:`Journal.wait_for`).
        """
        self._check_readable()
        p = self.partitions.get((topic, partition))
        if p is None or offset >= p.next_offset:
            return []
        if offset < p.first_offset:
            raise OffsetOutOfRange(topic, partition, offset, p.first_offset)
        out: list[Entry] = []
        records = size = 0
        for e in self._entries_from(p, offset):
            if e.next_offset <= offset:  # a mirror gap before ``offset``
                continue
            out.append(e)
            records += e.next_offset - max(offset, e.base_offset)
            size += len(e.payload)
            if records >= max_records or size >= max_bytes:
                return out
        return out

    def _entries_from(self, p: _Partition, offset: int) -> Iterator[Entry]:
        """The partition's entries from the one holding ``offset``, oldest first.

        Entry logs are read by LSN through their partition runs (sealed
        segments' from their index files, the active segment's from memory);
        a compressed segment through its frames (``SegmentSet.entries_from``).
        """
        active = p.offsets
        if not p.seg_first or (active and offset >= active[0]):
            i = max(bisect.bisect_right(active, offset) - 1, 0)
            yield from self._entries_of(p.lsns, i, offset)
            return
        first = max(bisect.bisect_right(p.seg_first, offset) - 1, 0)
        for k in range(first, len(p.seg_bases)):
            seg = self.segments.with_base(p.seg_bases[k])
            if seg.compressed is not None:
                yield from self.segments.entries_from(seg, p.topic, p.partition, offset)
                continue
            assert seg.index is not None
            lsns, offsets = seg.index.run(p.seg_at[k], p.seg_count[k])
            i = max(bisect.bisect_right(offsets, offset) - 1, 0) if k == first else 0
            yield from self._entries_of(lsns, i, offset)
        yield from self._entries_of(p.lsns, 0, offset)

    def _entries_of(self, lsns: IntSequence, i: int, offset: int) -> Iterator[Entry]:
        self._check_readable()
        for k in range(i, len(lsns)):
            yield from self._entries_at(lsns[k], offset)

    def read_entries(
        self,
        from_lsn: int,
        *,
        max_bytes: int = 8 * 1024 * 1024,
        durable_only: bool = True,
        payload_kinds: Container[int] | None = None,
    ) -> list[Entry]:
        """Entries in LSN order from ``from_lsn`` (for the shipper), up to ``max_bytes``.

        Checkpoint entries are skipped. With ``durable_only`` only fsynced
        entries are returned, so nothing leaves the machine that a power loss
        could take back. With ``payload_kinds``, entries of other kinds come
        with their header fields only (``fentry.decode_entry_header``: no
        body, no CRC check): the shipper steps over mirror entries that way
        instead of checking and copying every mirrored byte again; and when
        ``payload_kinds`` leaves mirror entries out, a run of mirror entries
        the journal appended since it opened comes back as **one** such entry
        without reading them at all: the run's last LSN, kind mirror, its
        total length, nothing else (mirror runs written before the open are
        stepped over by their headers).
        """
        self._check_readable()
        segments = self.segments
        end_lsn = (self.log.durable_lsn + 1) if durable_only else self.log.next_lsn
        out: list[Entry] = []
        lsn = max(from_lsn, segments.first_lsn)
        size = 0
        skip = self._mirror_runs_from(lsn, payload_kinds)
        while lsn < end_lsn and (size < max_bytes or not out):
            seg, _ = segments.locate(lsn)
            i = lsn - seg.base_lsn
            last = min(seg.end_lsn, end_lsn) - seg.base_lsn
            positions = segments.positions(seg)
            start = positions[i]
            if skip:
                inside, last = self.mirror_runs.at(lsn, seg.base_lsn, last)
                if inside:  # step over the run unread
                    j, end = _run_end(positions, seg, i, start + max_bytes - size, last)
                    out.append(_mirror_run_entry(seg.base_lsn + j - 1, end - start))
                    size += end - start
                    lsn = seg.base_lsn + j
                    continue
            # one pread for a run of entries (at least one), bounded by max_bytes
            j, stop = _run_end(positions, seg, i, start + max_bytes - size, last)
            data = segments.pread(seg, stop - start, start)
            size += _decode_run(data, j - i, seg.path, start, payload_kinds, out)
            lsn = seg.base_lsn + j
        return out

    def _mirror_runs_from(self, lsn: int, payload_kinds: Container[int] | None) -> bool:
        """Whether a read from ``lsn`` of ``payload_kinds`` steps over mirror runs
        unread (the shipper's reads); forgets the runs it has passed."""
        if payload_kinds is None or fentry.KIND_MIRROR in payload_kinds:
            return False
        return self.mirror_runs.any_from(lsn)

    async def read_entries_in_thread(
        self,
        from_lsn: int,
        *,
        max_bytes: int = 8 * 1024 * 1024,
        payload_kinds: Container[int] | None = None,
        buffers: ReadBuffers | None = None,
        through_lsn: int | None = None,
    ) -> list[Entry]:
        """:meth:`read_entries` of durable entries, the reading and checking in a worker thread.

        Reading a backlog object's entries (a ``pread`` of many MB, a CRC32C
        and a copy of every payload) costs about as much CPU as compressing
        them; done on the event loop it stalls local produce and consume and
        keeps a second core idle. Only the lookup of the byte runs happens
        here; each run is read through a duplicate of its segment's file
        descriptor, so a segment that is closed or deleted meanwhile (a
        drop-oldest lane under disk pressure, the read-fd cache) is still read
        whole -- durable entries are never rewritten in place. A caller that
        must not ship entries dropped meanwhile compares
        :meth:`Journal.drops_from` before and after. ``max_bytes`` counts the
        runs' bytes (checkpoint entries included), so a read may end a
        checkpoint earlier than :meth:`read_entries`'. Runs are read
        :data:`_RUN_BYTES` at most at a time, and at most
        :data:`_RUNS_PER_THREAD` descriptors are duplicated at once. Unlike
        :meth:`read_entries`, ordinary DATA entries come with their payload
        as a read-only view into their run's buffer (not a copy each); the
        runs are read into ``buffers`` (:class:`ReadBuffers`) when given,
        else into fresh memory. ``through_lsn``: no entry after it (the shipper
        stops where a compressed segment's chunks ship from stored blocks).
        """
        segments = self.segments
        out: list[Entry] = []
        size = 0
        lsn = from_lsn
        while True:
            self._check_readable()
            end_lsn = self.log.durable_lsn + 1
            if through_lsn is not None:
                end_lsn = min(end_lsn, through_lsn + 1)
            lsn = max(lsn, segments.first_lsn)
            skip = self._mirror_runs_from(lsn, payload_kinds)
            runs: list[_Run] = []
            try:
                while (
                    lsn < end_lsn
                    and (size < max_bytes or not (out or runs))
                    and len(runs) < _RUNS_PER_THREAD
                ):
                    seg, _ = segments.locate(lsn)
                    i = lsn - seg.base_lsn
                    last = min(seg.end_lsn, end_lsn) - seg.base_lsn
                    positions = segments.positions(seg)
                    start = positions[i]
                    if skip:
                        inside, last = self.mirror_runs.at(lsn, seg.base_lsn, last)
                        if inside:  # step over the run unread
                            j, end = _run_end(positions, seg, i, start + max_bytes - size, last)
                            runs.append(
                                _Run(-1, seg.path, start, end - start, j - i, seg.base_lsn + j - 1)
                            )
                            size += end - start
                            lsn = seg.base_lsn + j
                            continue
                    step = min(max_bytes - size, _RUN_BYTES)
                    j, stop = _run_end(positions, seg, i, start + step, last)
                    try:
                        fd = os.dup(segments.read_fd(seg))
                    except OSError as exc:
                        raise Unavailable(f"journal: cannot read {seg.path}: {exc}") from exc
                    compressed = None if seg.compressed is None else (seg.compressed, positions)
                    runs.append(_Run(fd, seg.path, start, stop - start, j - i, 0, compressed))
                    size += stop - start
                    lsn = seg.base_lsn + j
                if not runs:
                    return out
                out += await trio.to_thread.run_sync(_read_runs, runs, payload_kinds, buffers)
            finally:
                for run in runs:
                    if run.fd >= 0:
                        os.close(run.fd)
            # Go on after runs of checkpoint entries only, or past the cap on runs.
            if lsn >= end_lsn or (out and size >= max_bytes):
                return out
