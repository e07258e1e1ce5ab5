"""A compressed sealed segment (``EGWC``, docs/at-rest.md) as the journal reads it.

What it owns: :class:`CompressedFile`, one compressed segment's directory
(read at open with three ``pread``s: header, trailer, directory; never the
data) and, while it is read by LSN, its entries' positions; and
:class:`ChunkCache`, the journal's decoded entry tables (bounded by the
entries they hold). It reads through a ``pread(n, pos)`` it is given, so the
segment set's cached descriptor serves the event loop and a duplicated
descriptor a worker thread.

Two ways in, as for an entry log (``_reads.py``):

- **by offset** (:meth:`CompressedFile.entries_from`): the directory's frames
  of the partition (one bisect), each frame decompressed once through the
  journal's :class:`FrameCache`, and from the chunk's entry table what the
  journal entry holds besides its batch (LSN, append time, producer, source):
  the entries of the frame a read starts in alone, the whole table once a
  read moves on;
- **by LSN** (:meth:`CompressedFile.read_wal`): the compressed segment stands
  for the journal segment it replaced. Its entries keep their positions in
  that segment (:meth:`CompressedFile.load_positions`, from the entry tables'
  sizes), so the read path plans runs exactly as over the entry log, and a
  run's bytes are rebuilt (``wal_entry``) byte for byte.

Everything decoded is checked (``format/atrest.py``); damage is ``CorruptData``
naming the file, never a zstd or struct error.
"""

from __future__ import annotations

import bisect
import operator
import os
import struct
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Final

from edge_gateway.errors import CorruptData, UnsupportedFormat
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.atrest import ChunkEntries, FrameBatches, FrameCache, SegmentDirectory
from edge_gateway.format.entry import Entry, SourceCoords
from edge_gateway.journal import _fs
from edge_gateway.journal._index import IntSequence

#: ``pread(n, pos)``: ``n`` bytes of the file from byte ``pos`` (fewer at its end).
Pread = Callable[[int, int], bytes]

#: Magic of a compressed segment (the first four bytes; an entry log's are ``EGWJ``).
MAGIC: Final = atrest.MAGIC
#: Suffix of a rewrite's temporary file (``<lsn>.wal.z-tmp``), deleted at open.
TMP_SUFFIX: Final = ".z-tmp"
#: Entries of decoded entry tables a journal keeps (:class:`ChunkCache`): a
#: table's Python objects cost ~100 bytes per entry, so ~10 MB. Bounded by
#: entries, not by tables: one table of an 8 MiB chunk of one-record entries
#: holds ~26,000 entries (four such tables fit), a table of a 4 MiB segment of
#: batched entries a few hundred (hundreds fit, so a consumer's random reads
#: over a few GB of batched records find theirs decoded once).
CHUNK_ENTRIES_KEPT: Final = 100_000
_NONE: Final = 0xFFFFFFFF
_BATCH_BASE_COUNT: Final = struct.Struct("<8xq4xI")  # a batch's base offset and count


def block_batch_entries(frame: FrameBatches, be: atrest.BlockEntry, offset: int) -> Iterator[Entry]:
    """The batches of block entry ``be`` from the one holding ``offset`` on, one ``Entry`` each.

    A reader by offset gets exactly what the mirror's per-batch path wrote
    (a MIRROR entry per source batch): the same batches, offsets and source,
    END_OF_SOURCE_OBJECT on the last batch of the entry that had it, all
    under the block entry's LSN and append time. ``frame`` is the block's
    decompressed batches (from the journal's :class:`FrameCache`).
    """
    if offset > be.last_offset:
        return
    src = be.source
    mid = src if not src.end_of_object else SourceCoords(src.region, src.seq, src.epoch, False)
    # lazily, one batch ahead (a one-record read takes one batch of a large block)
    batches = frame.batches_from(max(offset, be.first_offset))
    view = next(batches, None)
    while view is not None:
        ahead = next(batches, None)
        base, count = _BATCH_BASE_COUNT.unpack_from(view)
        yield Entry(
            be.lsn,
            fentry.KIND_MIRROR,
            be.topic,
            be.partition,
            base,
            count,
            be.append_time,
            mid if ahead is not None else src,
            bytes(view),
            len(view),
        )
        view = ahead


def is_compressed(path: Path) -> bool:
    """Whether the file at ``path`` starts with the compressed segment's magic."""
    with path.open("rb") as f:
        return f.read(len(MAGIC)) == MAGIC


@dataclass(frozen=True, slots=True)
class ChunkView:
    """A chunk's decoded entry table, with what reads derive from it."""

    number: int
    entries: ChunkEntries
    #: per entry: its length as a journal entry
    lengths: list[int]
    #: frame number -> the chunk's entries (indexes) whose batches it holds, in order
    by_frame: dict[int, list[int]]

    @property
    def first_lsn(self) -> int:
        return self.entries.chunk.first_lsn


def _pread_exact(pread: Pread, n: int, pos: int, where: str) -> bytes:
    data = pread(n, pos)
    if len(data) != n:
        raise CorruptData(f"short read: {len(data)} of {n} bytes at byte {pos}", where=where)
    return data


class ChunkCache:
    """The journal's decoded entry tables, of any compressed segment: an LRU bounded by
    the entries they hold (the most recent table is kept whatever its size).

    Event-loop reads only: a worker thread decodes the tables it needs itself.
    """

    __slots__ = ("_entries", "_items", "capacity")

    def __init__(self, capacity: int = CHUNK_ENTRIES_KEPT) -> None:
        #: entries held at most, over every table kept
        self.capacity = capacity
        self._entries = 0
        #: (file, chunk, frame or -1 for the whole table) -> the decoded entries
        self._items: OrderedDict[tuple[CompressedFile, int, int], ChunkView] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def entries(self) -> int:
        """Entries of the tables held."""
        return self._entries

    def get(
        self, cf: CompressedFile, chunk_no: int, frame_no: int, load: Callable[[], ChunkView]
    ) -> ChunkView:
        """Chunk ``chunk_no``'s entries of frame ``frame_no`` (-1: all of them), loaded once."""
        key = (cf, chunk_no, frame_no)
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
            return found
        view = self._items[key] = load()
        self._entries += len(view.entries.kinds)
        while self._entries > self.capacity and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self._entries -= len(old.entries.kinds)
        return view

    def peek(self, cf: CompressedFile, chunk_no: int, frame_no: int) -> ChunkView | None:
        """What :meth:`get` holds for these, or None (nothing loaded, no order changed)."""
        return self._items.get((cf, chunk_no, frame_no))

    def forget(self, cf: CompressedFile) -> None:
        """Drop the tables of ``cf`` (its file is deleted or replaced)."""
        for key in [k for k in self._items if k[0] is cf]:
            self._entries -= len(self._items.pop(key).entries.kinds)


class _Loaded:
    """A compressed segment's decoded directory and what reads derive from it.

    Its size grows with the segment's frames (~540 bytes a frame as Python
    objects: ~140 KB for a 64 MiB segment of one-record entries), so a
    journal keeps at most :data:`DIRECTORIES_KEPT` of them (:class:`_Directories`).
    """

    __slots__ = ("chunk_first_frames", "directory", "frames_of", "lasts_of", "topic_lengths")

    def __init__(self, directory: SegmentDirectory) -> None:
        self.directory = directory
        frames_of: dict[tuple[str, int], list[int]] = {}
        for i, f in enumerate(directory.frames):
            frames_of.setdefault((f.topic, f.partition), []).append(i)
        #: (topic, partition) -> its frames' numbers, in offset order (the directory's rule)
        self.frames_of = frames_of
        self.lasts_of = {
            key: [directory.frames[i].last_offset for i in numbers]
            for key, numbers in frames_of.items()
        }
        self.chunk_first_frames = [c.first_frame for c in directory.chunks]
        self.topic_lengths = [len(t.encode("utf-8")) for t, _ in directory.parts]


#: Compressed segments whose directory a process keeps decoded (the most recently
#: used, over every journal): what the directories cost does not grow with the
#: backlog. A segment whose directory was dropped reads it again (three preads).
DIRECTORIES_KEPT: Final = 32


class _Directories:
    """The decoded directories kept, least recently used first (thread-safe)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._items: OrderedDict[CompressedFile, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def used(self, cf: CompressedFile) -> None:
        with self._lock:
            items = self._items
            if cf in items:
                items.move_to_end(cf)
                return
            items[cf] = None
            while len(items) > self.capacity:
                old, _ = items.popitem(last=False)
                old.drop_directory()

    def discard(self, cf: CompressedFile) -> None:
        with self._lock:
            self._items.pop(cf, None)


DIRECTORIES = _Directories(DIRECTORIES_KEPT)


class CompressedFile:
    """One compressed segment at rest: its directory, and reads of its frames and entries.

    The directory is decoded at open and kept while the segment is among the
    :data:`DIRECTORIES_KEPT` most recently used; otherwise it is read again
    from the file when needed. What every segment keeps is its summary
    (sizes, LSNs, last append time), which does not grow with its frames.
    """

    __slots__ = (
        "_loaded",
        "base_lsn",
        "last_append_time",
        "n_entries",
        "path",
        "positions",
        "size",
        "wal_bytes",
        "where",
    )

    def __init__(self, path: Path, directory: SegmentDirectory) -> None:
        self.path = path
        self.where = str(path)
        self.base_lsn = directory.base_lsn
        #: entries (LSNs) it holds
        self.n_entries = directory.n_entries
        #: bytes of the compressed file
        self.size = directory.file_size
        #: bytes of the journal segment it replaced
        self.wal_bytes = directory.wal_bytes
        self.last_append_time = directory.last_append_time
        self._loaded: _Loaded | None = _Loaded(directory)
        DIRECTORIES.used(self)
        #: each entry's position in the journal segment it replaced (loaded on demand)
        self.positions: array[int] | None = None

    def _dir(self) -> _Loaded:
        loaded = self._loaded
        if loaded is None:
            again = CompressedFile.open(self.path, self.base_lsn)
            d = again.directory
            DIRECTORIES.discard(again)
            if (d.file_size, d.wal_bytes, d.n_entries) != (
                self.size,
                self.wal_bytes,
                self.n_entries,
            ):
                raise CorruptData(
                    "the compressed segment changed under the journal: "
                    f"{d.file_size} bytes for {d.n_entries} entries, was {self.size} for "
                    f"{self.n_entries}",
                    where=self.where,
                )
            loaded = self._loaded = _Loaded(d)
        DIRECTORIES.used(self)
        return loaded

    def drop_directory(self) -> None:
        """Let go of the decoded directory (read again when next needed)."""
        self._loaded = None

    @property
    def directory(self) -> SegmentDirectory:
        """The segment's directory (read from the file again if it was dropped)."""
        return self._dir().directory

    @classmethod
    def open(cls, path: Path, base_lsn: int) -> CompressedFile:
        """Read the header, the trailer and the directory (checked); not the data."""
        where = str(path)
        fd = _fs.ops.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size

            def pread(n: int, pos: int) -> bytes:
                return os.pread(fd, n, pos)

            if size < atrest.HEADER_SIZE + atrest.TRAILER_SIZE:
                raise CorruptData(f"{size} bytes cannot be a compressed segment", where=where)
            head = _pread_exact(pread, atrest.HEADER_SIZE, 0, where)
            wal_version, base = atrest.decode_header(head, where=where)
            if base != base_lsn:
                raise CorruptData(
                    f"compressed segment of base LSN {base} under the name of {base_lsn}",
                    where=where,
                )
            if wal_version not in fentry.SEGMENT_VERSIONS:
                raise UnsupportedFormat(
                    f"a compressed segment of journal segment version {wal_version} "
                    "(this journal reads versions "
                    f"{', '.join(map(str, sorted(fentry.SEGMENT_VERSIONS)))})",
                    where=where,
                )
            tail = _pread_exact(pread, atrest.TRAILER_SIZE, size - atrest.TRAILER_SIZE, where)
            dir_offset, dir_length = atrest.decode_trailer(tail, file_size=size, where=where)
            directory = atrest.decode_directory(
                _pread_exact(pread, dir_length, dir_offset, where),
                base_lsn=base,
                wal_version=wal_version,
                dir_offset=dir_offset,
                where=where,
            )
        finally:
            _fs.ops.close(fd)
        return cls(path, directory)

    # ------------------------------------------------------------ frames

    def partitions(self) -> Iterator[tuple[str, int, int]]:
        """(topic, partition, first offset here) of every partition with records here."""
        loaded = self._dir()
        frames = loaded.directory.frames
        for (topic, partition), numbers in loaded.frames_of.items():
            yield topic, partition, frames[numbers[0]].first_offset

    def stored(self, pread: Pread, frame_no: int) -> bytes:
        f = self.directory.frames[frame_no]
        return _pread_exact(pread, f.stored_length, f.offset, self.where)

    def _load_frame(self, pread: Pread, frame_no: int) -> FrameBatches:
        f = self.directory.frames[frame_no]
        where = f"{self.where} frame {frame_no}"
        raw = atrest.decode_frame(f, self.stored(pread, frame_no), where=where)
        return FrameBatches(f, raw, where=where)

    def frame(self, cache: FrameCache, pread: Pread, frame_no: int) -> FrameBatches:
        """Frame ``frame_no`` decompressed and walked, through the journal's cache."""
        return cache.get((self, frame_no), lambda: self._load_frame(pread, frame_no))

    # ------------------------------------------------------------ entry tables

    def load_chunk(self, pread: Pread, chunk_no: int) -> ChunkView:
        """Chunk ``chunk_no``'s entry table, decoded and checked (not kept: thread-safe)."""
        return self._view(chunk_no, self._load_entries(pread, chunk_no))

    def _view(self, chunk_no: int, ents: ChunkEntries) -> ChunkView:
        loaded = self._dir()
        d = loaded.directory
        lengths: list[int] = []
        by_frame: dict[int, list[int]] = {}
        head = fentry.ENTRY_HEADER_SIZE
        topic_lengths = loaded.topic_lengths
        frames = d.frames
        block_desc = atrest.BLOCK_DESC_SIZE
        kind_block = atrest.KIND_BLOCK
        for i, (fno, kind, part, n_extra, raw_length) in enumerate(
            zip(
                ents.frames,
                ents.kinds,
                ents.parts,
                map(operator.sub, ents.extra_starts[1:], ents.extra_starts),
                ents.raw_lengths,
                strict=True,
            )
        ):
            if fno == _NONE:
                lengths.append(n_extra)  # the whole entry is kept
                continue
            members = by_frame.get(fno)
            if members is None:
                by_frame[fno] = [i]
            else:
                members.append(i)
            # a block entry keeps the frame's stored bytes behind its descriptor
            body = block_desc + frames[fno].stored_length if kind == kind_block else raw_length
            lengths.append(head + topic_lengths[part] + n_extra + body)
        return ChunkView(chunk_no, ents, lengths, by_frame)

    def chunk(self, cache: ChunkCache, pread: Pread, chunk_no: int) -> ChunkView:
        """:meth:`load_chunk`, its table through the journal's cache (the event loop's reads
        only)."""
        return cache.get(self, chunk_no, -1, lambda: self.load_chunk(pread, chunk_no))

    def _load_entries(self, pread: Pread, chunk_no: int) -> ChunkEntries:
        d = self._dir().directory
        c = d.chunks[chunk_no]
        return atrest.decode_entries(
            d, chunk_no, _pread_exact(pread, c.meta_stored, c.meta_offset, self.where),
            where=self.where,
        )  # fmt: skip

    def frame_entries(
        self, cache: ChunkCache, pread: Pread, chunk_no: int, frame_no: int
    ) -> ChunkView:
        """The entries of frame ``frame_no`` (of chunk ``chunk_no``) alone, through the
        journal's cache: a read by offset walks those, not the whole table
        (``atrest.decode_frame_entries``); the whole table when it is held already.
        Only ``entries`` and ``by_frame[frame_no]`` of the view are set."""
        whole = cache.peek(self, chunk_no, -1)
        if whole is not None:
            return whole

        def load() -> ChunkView:
            d = self._dir().directory
            c = d.chunks[chunk_no]
            stored = _pread_exact(pread, c.meta_stored, c.meta_offset, self.where)
            ents = atrest.decode_frame_entries(d, chunk_no, stored, frame_no, where=self.where)
            return ChunkView(chunk_no, ents, [], {frame_no: list(range(len(ents.kinds)))})

        return cache.get(self, chunk_no, frame_no, load)

    def forget(self) -> None:
        """Drop the positions and the directory it holds (its file is deleted or replaced)."""
        self.positions = None
        DIRECTORIES.discard(self)

    def load_positions(self, pread: Pread) -> array[int]:
        """Each entry's position in the journal segment it replaced (every entry table read).

        The compressed segment then stands for that segment in the read path's
        plans of runs (``_reads.py``). Checked: the sizes must add up to the
        directory's ``wal_bytes``.
        """
        if self.positions is not None:
            return self.positions
        d = self.directory
        positions = array("q")
        pos = fentry.SEGMENT_HEADER_SIZE
        for ci in range(len(d.chunks)):
            view = self.load_chunk(pread, ci)
            starts = list(accumulate(view.lengths, initial=pos))
            pos = starts.pop()
            positions.extend(starts)
        if pos != d.wal_bytes:
            raise CorruptData(
                f"entries of {pos - fentry.SEGMENT_HEADER_SIZE} bytes in a journal segment "
                f"of {d.wal_bytes}",
                where=self.where,
            )
        self.positions = positions
        return positions

    # ------------------------------------------------------------ reads

    def read_wal(
        self,
        pread: Pread,
        positions: IntSequence,
        pos: int,
        n: int,
        raw_of: Callable[[int], bytes] | None = None,
        chunk: Callable[[int], ChunkView] | None = None,
    ) -> bytes:
        """Bytes ``[pos, pos + n)`` of the journal segment it replaced (whole entries).

        ``raw_of(frame)``/``chunk(number)`` read through caches on the event
        loop; without them (a worker thread) frames and tables are decoded
        here and dropped after.
        """
        d = self.directory
        i = bisect.bisect_left(positions, pos)
        if n <= 0 or i >= len(positions) or positions[i] != pos:
            raise CorruptData(f"no entry starts at byte {pos}", where=self.where)
        held: dict[int, bytes] = {}
        if raw_of is None:

            def raw_of(fno: int) -> bytes:
                raw = held.get(fno)
                if raw is None:
                    f = d.frames[fno]
                    raw = held[fno] = atrest.decode_frame(
                        f, self.stored(pread, fno), where=f"{self.where} frame {fno}"
                    )
                return raw

        if chunk is None:

            def chunk(chunk_no: int) -> ChunkView:
                return self.load_chunk(pread, chunk_no)

        def stored(fno: int) -> bytes:
            return self.stored(pread, fno)

        out: list[bytes] = []
        got = 0
        lsn = d.base_lsn + i
        while got < n:
            ci = d.chunk_of(lsn)
            if ci is None:
                raise CorruptData(f"read past the end at byte {pos + got}", where=self.where)
            view = chunk(ci)
            k = lsn - view.first_lsn
            while k < view.entries.chunk.n_entries and got < n:
                e = atrest.wal_entry(d, view.entries, k, raw_of, stored, where=self.where)
                out.append(e)
                got += len(e)
                k += 1
            lsn = view.first_lsn + k
        if got != n:
            raise CorruptData(
                f"entries of {got} bytes where {n} were read from byte {pos}", where=self.where
            )
        return b"".join(out)

    def entries_from(
        self,
        cache: FrameCache,
        chunks: ChunkCache,
        pread: Pread,
        topic: str,
        partition: int,
        offset: int,
    ) -> Iterator[Entry]:
        """The partition's entries here from the one holding ``offset`` (or the next), in order.

        One bisect over the partition's frames, each frame through ``cache``,
        each entry's header from its chunk's entry table (the frame's entries
        alone for a read that starts there, :meth:`frame_entries`); an entry is
        rebuilt as its journal bytes and decoded as the journal decodes one
        (CRC and all), so it is the very ``Entry`` the entry log gave.
        """
        loaded = self._dir()
        numbers = loaded.frames_of.get((topic, partition))
        if not numbers:
            return
        d = loaded.directory
        first_frames = loaded.chunk_first_frames
        k = bisect.bisect_left(loaded.lasts_of[(topic, partition)], offset)

        def raw_of(fno: int) -> bytes:
            return self.frame(cache, pread, fno).raw

        def stored(fno: int) -> bytes:
            return self.stored(pread, fno)

        for j in range(k, len(numbers)):
            fno = numbers[j]
            ci = bisect.bisect_right(first_frames, fno) - 1
            if j > k or (j and chunks.peek(self, ci, numbers[j - 1]) is not None):
                # A reader moving on through the partition (this read, or the one
                # before it ended in the previous frame): the whole table, once,
                # serves every frame of the chunk after this one.
                view = self.chunk(chunks, pread, ci)
            else:
                # One frame's entries: a random read walks ~1/frames of the table.
                view = self.frame_entries(chunks, pread, ci, fno)
            ents = view.entries
            for i in view.by_frame.get(fno, ()):
                if ents.base_offsets[i] + ents.counts[i] <= offset:
                    continue
                data = atrest.wal_entry(d, ents, i, raw_of, stored, where=self.where)
                where = f"{self.where} LSN {ents.lsn(i)}"
                if ents.kinds[i] == atrest.KIND_BLOCK:
                    be = atrest.decode_block_entry(data, where=where)
                    yield from block_batch_entries(self.frame(cache, pread, fno), be, offset)
                    continue
                yield fentry.decode_entry(data, where=where)

    def partition_runs(self, pread: Pread) -> dict[tuple[str, int], tuple[array[int], array[int]]]:
        """Per partition, the LSNs and base offsets of its entries here (every table read)."""
        runs: dict[tuple[str, int], tuple[array[int], array[int]]] = {}
        parts = self.directory.parts
        for ci in range(len(self.directory.chunks)):
            ents = self.load_chunk(pread, ci).entries
            for i in range(ents.chunk.n_entries):
                if ents.frames[i] == _NONE:
                    continue
                lsns, offsets = runs.setdefault(parts[ents.parts[i]], (array("q"), array("q")))
                lsns.append(ents.lsn(i))
                offsets.append(ents.base_offsets[i])
        return runs
