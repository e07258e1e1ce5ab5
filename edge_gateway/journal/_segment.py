"""One segment file of the journal: its entries' positions, its memory map, its index file.

A segment holds a contiguous LSN range and is named after its first LSN
(``<base_lsn:020d>.wal``); its first entry is a checkpoint. The active
segment (the last one) is preallocated and written through a shared memory
map (see docs/journal.md, "The append path"), and its index (the position
of every entry) is in memory. A sealed segment has an index file next to it
(``.idx``, see ``_index.py``), and only a summary of it stays in memory:
its LSN range, size, last append time, and the index file to read from. A
sealed segment may instead be compressed (``EGWC``, ``_compressed.py``): the
same name and LSNs, its directory as its summary, no index file.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from edge_gateway.durable import replace_file
from edge_gateway.errors import CorruptData
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.journal import _fs
from edge_gateway.journal._index import IndexFile, IntSequence

if TYPE_CHECKING:
    from edge_gateway.journal._compressed import CompressedFile

log = logging.getLogger("edgegw.journal")

SEGMENT_SUFFIX: Final = ".wal"
INDEX_SUFFIX: Final = ".idx"
#: A live repair's copy of a segment, beside it (``_live_repair.py``; deleted at open).
REPAIR_SUFFIX: Final = ".r-tmp"
#: Written bytes of the active segment's map handed back at a time (``Segment.release_written``).
RELEASE_BYTES: Final = 4 * 1024 * 1024


def segment_name(base_lsn: int) -> str:
    return f"{base_lsn:020d}{SEGMENT_SUFFIX}"


def first_entry_after(path: Path, base: int) -> tuple[Path, atrest.AnyEntry] | None:
    """The segment after ``path`` (base LSN ``base``) in its directory and its first
    entry, an entry log's or a compressed segment's; None if there is no later segment.

    Raises :class:`CorruptData` (or ``OSError``) when that entry does not read.
    """
    later = sorted(
        int(f.stem)
        for f in path.parent.glob(f"*{path.suffix}")
        if f.stem.isdigit() and int(f.stem) > base
    )
    if not later:
        return None
    nxt = path.with_name(segment_name(later[0]))
    data = nxt.read_bytes()
    if data[: len(atrest.MAGIC)] == atrest.MAGIC:
        try:
            return nxt, next(atrest.CompressedSegment(data, where=str(nxt)).entries())
        except StopIteration:
            raise CorruptData("a compressed segment without entries", where=str(nxt)) from None
    return nxt, atrest.decode_any_entry(data, fentry.SEGMENT_HEADER_SIZE, where=str(nxt))


@dataclass(slots=True)
class Segment:
    base_lsn: int
    path: Path
    size: int
    last_append_time: int
    #: entry positions while the index is in memory (the active segment); empty once sealed
    positions: array[int] = field(default_factory=lambda: array("q"))
    #: the index file, once sealed (positions and partition runs are read from it)
    index: IndexFile | None = None
    fd: int | None = None  # the write fd (active segment only)
    #: a shared map of the preallocated file (active segment only, see JournalConfig.preallocate)
    mm: mmap.mmap | None = None
    #: entries that end at or before this byte may be copied into ``mm``
    mm_end: int = 0
    #: the map's pages below this byte were handed back (``release_written``)
    mm_released: int = 0
    #: a sealed segment rewritten compressed (``EGWC``): its directory instead of an
    #: index file; ``size`` is then the compressed file's
    compressed: CompressedFile | None = None

    @property
    def entries(self) -> int:
        """How many entries the segment holds."""
        if self.compressed is not None:
            return self.compressed.n_entries
        return len(self.positions) if self.index is None else self.index.n

    @property
    def end_lsn(self) -> int:
        """One past the last LSN in this segment."""
        return self.base_lsn + self.entries

    @property
    def entry_positions(self) -> IntSequence:
        """Byte position of entry ``base_lsn + i`` (from memory, or from the index file).

        Not for a compressed segment: ``SegmentSet.positions`` gives its entries'
        positions in the segment it replaced.
        """
        assert self.compressed is None
        return self.positions if self.index is None else self.index.positions()

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(INDEX_SUFFIX)

    def map(self, capacity: int) -> None:
        """Preallocate the file to ``capacity`` bytes and map it, so small entries are a memcpy.

        The preallocated tail reads as zeros; a scan stops at a zero length
        field followed by zeros only (see docs/format.md). Anything that
        fails here only costs speed: entries are then written with pwrite.
        """
        if self.fd is None:
            return
        cap = max(capacity, self.size)
        try:
            if os.fstat(self.fd).st_size < cap:
                _fs.ops.posix_fallocate(self.fd, 0, cap)
            self.mm = _fs.ops.mmap(self.fd, cap)
            self.mm_end = cap
            self.mm_released = 0
        except (OSError, ValueError, AttributeError) as exc:
            log.info("journal: writing %s without a memory map: %s", self.path, exc)
            self.mm = None
            self.mm_end = 0
            # A failed fallocate may have allocated part of the space: give it back.
            with contextlib.suppress(OSError):
                if os.fstat(self.fd).st_size > self.size:
                    _fs.ops.ftruncate(self.fd, self.size)

    def release_written(self, min_bytes: int = RELEASE_BYTES) -> int:
        """Drop the map's pages of written bytes from this process (``MADV_DONTNEED``).

        Pages of a shared file map that were written count in the process's
        RSS (``RssFile``) until it lets them go: without this, each lane's
        active segment would add up to ``segment_bytes`` to the RSS. The
        data is not lost: for a shared file mapping the kernel moves a dirty
        page's state to the page cache, and writeback and ``fdatasync`` find
        it there (a later access would fault it in again from the cache).
        Only whole pages wholly below ``size`` go, once at least
        ``min_bytes`` are to go. Returns the bytes released; a kernel or
        Python without ``madvise`` only costs the memory.
        """
        if self.mm is None:
            return 0
        end = min(self.size, self.mm_end) // mmap.PAGESIZE * mmap.PAGESIZE
        n = end - self.mm_released
        if n < max(min_bytes, mmap.PAGESIZE):
            return 0
        try:
            self.mm.madvise(mmap.MADV_DONTNEED, self.mm_released, n)
        except (OSError, ValueError, AttributeError):
            return 0
        self.mm_released = end
        return n

    def unmap(self) -> None:
        """Unmap the segment and cut its preallocated tail (the data stays in the page cache)."""
        if self.mm is not None:
            self.mm.close()
            self.mm = None
            self.mm_end = 0
            self.mm_released = 0
        if self.fd is not None and os.fstat(self.fd).st_size > self.size:
            _fs.ops.ftruncate(self.fd, self.size)


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` by a temporary file, fsync and rename (all or nothing),
    through the journal's fault-injection seam; no directory fsync (the caller's
    next segment roll or checkpoint makes it durable)."""
    replace_file(path, data, sync_dir=False, ops=_fs.ops)
