"""The journal's segments at rest: which segment holds an LSN, and how its bytes are read.

What it owns: the segments in LSN order (sealed ones first, the active one
last) with their base LSNs for the bisect, and the read descriptors of
sealed segments (a small LRU cache; the active segment is read through its
write descriptor). Everything that asks where an LSN is stored, or reads a
segment's bytes, asks here: the read path (``_reads.py``), retention
(``_retention.py``, which takes the oldest segment off with
:meth:`SegmentSet.pop_oldest`) and the open (``_open.py``).

It is the one place that knows what a segment at rest is. A sealed segment
is an entry log (``EGWJ``) or a compressed segment (``EGWC``,
``_compressed.py``); for reads by LSN a compressed one stands for the entry
log it replaced (:meth:`SegmentSet.positions`, :meth:`SegmentSet.pread` give
that log's positions and bytes), and reads by offset go through its frames
and the journal's :class:`FrameCache` (:meth:`SegmentSet.entries_from`).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Iterator
from typing import Final

from edge_gateway.errors import InvalidInput, Unavailable
from edge_gateway.format.atrest import FrameCache
from edge_gateway.format.entry import Entry
from edge_gateway.journal import _fs
from edge_gateway.journal._compressed import ChunkCache, CompressedFile
from edge_gateway.journal._index import IntSequence
from edge_gateway.journal._segment import Segment

log = logging.getLogger("edgegw.journal")

#: Read descriptors of sealed segments kept open (least recently used closed first).
READ_FD_CACHE: Final = 32
#: Compressed segments whose entries' positions are kept (8 bytes per entry; a
#: drain reads them in order, so it needs one or two at a time).
POSITIONS_KEPT: Final = 4


class SegmentSet:
    """The journal's segments in LSN order (the active one last) and their read descriptors."""

    __slots__ = ("_positions", "_read_fds", "bases", "chunk_cache", "frame_cache", "segments")

    def __init__(self, frame_cache: FrameCache | None = None) -> None:
        #: oldest first; contiguous LSN ranges; the last one is the active segment
        self.segments: list[Segment] = []
        #: each segment's base LSN (``segments[i].base_lsn``), for the bisect of :meth:`locate`
        self.bases: list[int] = []
        self._read_fds: OrderedDict[int, int] = OrderedDict()
        #: decompressed frames of compressed segments (``journal.block_cache_bytes``)
        self.frame_cache = frame_cache if frame_cache is not None else FrameCache()
        #: decoded entry tables of compressed segments (the last few)
        self.chunk_cache = ChunkCache()
        #: compressed segments whose positions are loaded, least recently used first
        self._positions: OrderedDict[int, CompressedFile] = OrderedDict()

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def active(self) -> Segment:
        """The segment appends go to (the last one)."""
        return self.segments[-1]

    @property
    def first_lsn(self) -> int:
        """The first LSN still in the journal (0 when it holds no segment)."""
        return self.segments[0].base_lsn if self.segments else 0

    def add(self, seg: Segment) -> None:
        """Add ``seg`` as the new active segment (its LSNs follow the last one's)."""
        self.segments.append(seg)
        self.bases.append(seg.base_lsn)

    def pop_active(self) -> Segment:
        """Take the active segment off (a reset of an empty journal)."""
        self.bases.pop()
        return self.segments.pop()

    def pop_oldest(self) -> Segment:
        """Take the oldest segment off (retention deleted its file); closes its read descriptor."""
        self.bases.pop(0)
        seg = self.segments.pop(0)
        fd = self._read_fds.pop(seg.base_lsn, None)
        if fd is not None:
            os.close(fd)
        self.frame_cache.forget(seg.base_lsn)  # its block entries' frames (``_reads.py``)
        if seg.compressed is not None:
            self._positions.pop(seg.base_lsn, None)
            self.frame_cache.forget(seg.compressed)
            self.chunk_cache.forget(seg.compressed)
            seg.compressed.forget()
        return seg

    def holds(self, seg: Segment) -> bool:
        """Whether ``seg`` is (still) one of the journal's segments (not deleted)."""
        i = bisect.bisect_left(self.bases, seg.base_lsn)
        return i < len(self.segments) and self.segments[i] is seg

    def swap_compressed(self, seg: Segment, cf: CompressedFile) -> None:
        """``seg``'s file was just replaced by its compressed form ``cf`` (the rewriter).

        The cached read descriptor reads the old file: it is closed (a worker
        thread's duplicate keeps reading the old file, whose entries are the
        same). The partitions' runs of ``seg`` keep their base and first offset;
        their index positions are not used for a compressed segment.
        """
        fd = self._read_fds.pop(seg.base_lsn, None)
        if fd is not None:
            os.close(fd)
        seg.compressed = cf
        seg.size = cf.size
        seg.index = None

    def swap_entry_log(self, seg: Segment, size: int) -> None:
        """``seg``'s file was just replaced by a repaired entry log of ``size`` bytes
        (``_live_repair.py``): its cached descriptor, frames and positions go.

        The caller gives it its new index (its entries' positions may differ).
        """
        fd = self._read_fds.pop(seg.base_lsn, None)
        if fd is not None:
            os.close(fd)
        self.frame_cache.forget(seg.base_lsn)  # block entries' frames, by position
        cf = seg.compressed
        if cf is not None:
            self._positions.pop(seg.base_lsn, None)
            self.frame_cache.forget(cf)
            self.chunk_cache.forget(cf)
            cf.forget()
        seg.compressed = None
        seg.index = None
        seg.size = size

    def delete_oldest(self) -> tuple[Segment, int] | None:
        """Delete the oldest segment's files and take it off: (it, the bytes freed).

        None if its file cannot be removed: it is kept, since deleting a
        later one would leave a hole the next open refuses (segments must be
        contiguous). Which segment may go, and when, is retention's to say.
        """
        seg = self.segments[0]
        try:
            _fs.ops.unlink(seg.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("journal: could not delete segment %s: %s", seg.path, exc)
            return None
        self.pop_oldest()
        freed = seg.size
        with contextlib.suppress(OSError):
            freed += seg.index_path.stat().st_size
            _fs.ops.unlink(seg.index_path)
        return seg, freed

    def locate(self, lsn: int) -> tuple[Segment, int]:
        """The segment holding ``lsn``, and its place in :attr:`segments`."""
        i = bisect.bisect_right(self.bases, lsn) - 1
        if i < 0 or lsn >= self.segments[i].end_lsn:
            raise InvalidInput(f"LSN {lsn} is not in the journal")
        return self.segments[i], i

    def with_base(self, base_lsn: int) -> Segment:
        """The segment whose first LSN is ``base_lsn`` (it must be there)."""
        return self.segments[bisect.bisect_left(self.bases, base_lsn)]

    def read_fd(self, seg: Segment) -> int:
        """A descriptor to read ``seg`` through (cached; owned by the set)."""
        if seg.fd is not None:
            return seg.fd
        fd = self._read_fds.get(seg.base_lsn)
        if fd is None:
            try:
                fd = _fs.ops.open(seg.path, os.O_RDONLY)
            except OSError as exc:
                raise Unavailable(f"journal: cannot open {seg.path} to read: {exc}") from exc
            self._read_fds[seg.base_lsn] = fd
            if len(self._read_fds) > READ_FD_CACHE:
                _, old = self._read_fds.popitem(last=False)
                os.close(old)
        else:
            self._read_fds.move_to_end(seg.base_lsn)
        return fd

    def file_pread(self, seg: Segment, n: int, pos: int) -> bytes:
        """``n`` bytes of ``seg``'s file from byte ``pos``."""
        try:
            return os.pread(self.read_fd(seg), n, pos)
        except OSError as exc:
            raise Unavailable(f"journal: cannot read {seg.path}@{pos}: {exc}") from exc

    def pread(self, seg: Segment, n: int, pos: int) -> bytes:
        """``n`` bytes of ``seg``'s entries from byte ``pos`` (whole entries).

        Of a compressed segment: the bytes of the entry log it replaced,
        rebuilt (its frames through :attr:`frame_cache`).
        """
        cf = seg.compressed
        if cf is None:
            return self.file_pread(seg, n, pos)

        def pread(k: int, at: int) -> bytes:
            return self.file_pread(seg, k, at)

        cache = self.frame_cache
        return cf.read_wal(
            pread,
            self.positions(seg),
            pos,
            n,
            raw_of=lambda fno: cf.frame(cache, pread, fno).raw,
            chunk=lambda ci: cf.chunk(self.chunk_cache, pread, ci),
        )

    def positions(self, seg: Segment) -> IntSequence:
        """Byte position of entry ``base_lsn + i`` of ``seg`` (of a compressed one: in
        the entry log it replaced, loaded from its entry tables and kept for a few)."""
        cf = seg.compressed
        if cf is None:
            return seg.entry_positions
        kept = self._positions
        if seg.base_lsn in kept:
            kept.move_to_end(seg.base_lsn)
        else:
            kept[seg.base_lsn] = cf
            if len(kept) > POSITIONS_KEPT:
                _, old = kept.popitem(last=False)
                old.positions = None
        return cf.load_positions(lambda k, at: self.file_pread(seg, k, at))

    @staticmethod
    def entries_size(seg: Segment) -> int:
        """Bytes of ``seg`` as an entry log (of a compressed one: the log it replaced)."""
        return seg.size if seg.compressed is None else seg.compressed.wal_bytes

    def entries_from(
        self, seg: Segment, topic: str, partition: int, offset: int
    ) -> Iterator[Entry]:
        """A compressed segment's entries of the partition from ``offset`` (its frames)."""
        cf = seg.compressed
        assert cf is not None
        return cf.entries_from(
            self.frame_cache,
            self.chunk_cache,
            lambda k, at: self.file_pread(seg, k, at),
            topic,
            partition,
            offset,
        )

    def close_reads(self) -> None:
        """Close every read descriptor (the journal closes)."""
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()
        for seg in self.segments:
            if seg.compressed is not None:
                self.frame_cache.forget(seg.compressed)
                self.chunk_cache.forget(seg.compressed)
                seg.compressed.forget()
        self._positions.clear()

    def bytes_from(self, lsn: int) -> int:
        """Bytes of the entries from ``lsn`` on."""
        total = 0
        for seg in reversed(self.segments):
            if seg.end_lsn <= lsn:
                break
            if seg.base_lsn >= lsn:
                total += seg.size
            elif seg.compressed is not None:
                # the compressed bytes, in proportion to the entry bytes from ``lsn``
                wal = seg.compressed.wal_bytes
                from_pos = self.positions(seg)[lsn - seg.base_lsn]
                total += seg.size * (wal - from_pos) // wal
            else:
                total += seg.size - seg.entry_positions[lsn - seg.base_lsn]
        return total

    def only_checkpoints(self, first_lsn: int, last_lsn: int) -> bool:
        """Whether every entry from ``first_lsn`` to ``last_lsn`` is a checkpoint.

        A checkpoint is only ever the first entry of a segment, so this is a
        count of segment bases in the range (no read).
        """
        if last_lsn < first_lsn:
            return True
        bases = self.bases
        inside = bisect.bisect_right(bases, last_lsn) - bisect.bisect_left(bases, first_lsn)
        return inside == last_lsn - first_lsn + 1
