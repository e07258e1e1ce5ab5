"""A compressed segment's chunks as the shipper ships them (docs/at-rest.md, "The shipper").

What it owns: :class:`ChunkSpan` (where an LSN lies in a compressed segment)
and :class:`StoredChunk` (one chunk read for shipping: its local data frames as
:class:`~edge_gateway.format.logobject.StoredBlock`\\ s, CRC-checked, never
decompressed), and the reads behind ``Journal.chunk_span``,
``Journal.compressed_from`` and ``Journal.read_chunk_in_thread``.

A chunk's data frames are exactly the blocks of the log object the builder
would make from its LSN range (``format/atrest.py``, "Chunks"), so a shipper
at a chunk's first LSN builds that object with ``LogObjectBuilder.add_stored``
and compresses nothing. A chunk is read with one ``pread`` (its frames and its
entry table lie back to back) through a duplicate of the segment's descriptor,
in a worker thread: a drop-oldest lane or retention may delete the file
meanwhile, and the read still sees the whole chunk (a sealed file is never
rewritten in place; a rewrite renames a new file over the name).

Of the entry table only the kinds and flags columns are used (the journal
bytes of the chunk's DATA entries, for the shipper's statistics): it is
CRC-checked and decompressed, but its rows are not decoded one by one --
that is Python per entry, as slow as the rewrite itself.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Final

import trio

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData, InvalidInput, Unavailable
from edge_gateway.format import atrest, logobject
from edge_gateway.format import entry as fentry
from edge_gateway.format.logobject import BlockIndex, StoredBlock
from edge_gateway.journal._compressed import CompressedFile
from edge_gateway.journal._segment_set import SegmentSet

#: The entry table's head: ``u32 n | u32 extras_length`` (docs/at-rest.md, "The entry table").
_TABLE_HEAD: Final = struct.Struct("<II")
#: kinds -> 0x01 for a DATA entry, 0x00 otherwise; flags -> 0x01 with the producer flag.
_IS_DATA: Final = bytes(1 if b == fentry.KIND_DATA else 0 for b in range(256))
_HAS_PRODUCER: Final = bytes(1 if b & fentry.FLAG_PRODUCER else 0 for b in range(256))
#: Bytes of a producer's stamp in a DATA entry with the producer flag.
_PRODUCER_BYTES: Final = 16


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    """The chunk of a compressed segment that holds an LSN: its LSN range."""

    first_lsn: int
    last_lsn: int


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """One chunk of a compressed segment, read for shipping.

    ``blocks``: its local data frames (origin DATA), in the directory's order,
    as ``(topic, partition, block)`` for ``LogObjectBuilder.add_stored``;
    empty when the chunk holds mirror entries and checkpoints only.
    """

    first_lsn: int
    last_lsn: int
    blocks: tuple[tuple[str, int, StoredBlock], ...]
    #: records in ``blocks``
    records: int
    #: journal bytes of the chunk's DATA entries (what they took as an entry log)
    data_bytes: int
    #: journal bytes of all the chunk's entries
    wal_bytes: int


def chunk_span(segments: SegmentSet, lsn: int) -> ChunkSpan | None:
    """The chunk holding ``lsn`` when a compressed segment holds it (else None). No I/O."""
    if not segments.segments or lsn < segments.first_lsn or lsn >= segments.active.end_lsn:
        return None
    seg, _ = segments.locate(lsn)
    cf = seg.compressed
    if cf is None:
        return None
    ci = cf.directory.chunk_of(lsn)
    assert ci is not None  # the segment holds ``lsn``
    c = cf.directory.chunks[ci]
    return ChunkSpan(c.first_lsn, c.last_lsn)


def compressed_from(segments: SegmentSet, lsn: int) -> int | None:
    """The first LSN at or after ``lsn`` that a compressed segment holds (None: none). No I/O."""
    for seg in segments.segments:
        if seg.end_lsn <= lsn or seg.compressed is None:
            continue
        return max(seg.base_lsn, lsn)
    return None


def chunk_sizes(
    directory: atrest.SegmentDirectory, chunk_no: int, table: bytes, *, where: str
) -> tuple[int, int]:
    """(journal bytes of the chunk's DATA entries, of all its entries), sans-IO.

    ``table``: the chunk's entry table, decompressed. A batch entry is its
    header, its topic, its extras (a producer's stamp, a source's tail) and
    its batch; any other entry is kept whole in the extras. So the frames give
    every batch entry's header, topic and batch bytes, and the table's head the
    extras; a DATA entry's extras are 16 bytes when it has the producer flag.
    """
    c = directory.chunks[chunk_no]
    n = c.n_entries
    if len(table) < _TABLE_HEAD.size + 2 * n:
        raise CorruptData(f"chunk {chunk_no} entry table: {len(table)} bytes", where=where)
    count, extras = _TABLE_HEAD.unpack_from(table, 0)
    if count != n:
        raise CorruptData(
            f"chunk {chunk_no} entry table: {count} entries for {n} LSNs", where=where
        )
    kinds = table[_TABLE_HEAD.size : _TABLE_HEAD.size + n]
    flags = table[_TABLE_HEAD.size + n : _TABLE_HEAD.size + 2 * n]
    # DATA entries with a producer's stamp, counted in C: a byte per entry, 1 or 0, ANDed
    data_mask = int.from_bytes(kinds.translate(_IS_DATA), "little")
    stamped = (data_mask & int.from_bytes(flags.translate(_HAS_PRODUCER), "little")).bit_count()
    head = fentry.ENTRY_HEADER_SIZE
    topic_lengths = [len(t.encode("utf-8")) for t, _ in directory.parts]
    data_bytes = stamped * _PRODUCER_BYTES
    wal_bytes = extras
    for i in c.frames:
        f = directory.frames[i]
        if f.origin == atrest.ORIGIN_BLOCK:
            body = atrest.BLOCK_DESC_SIZE + f.stored_length
        else:
            body = f.raw_length
        size = f.n_entries * (head + topic_lengths[f.part]) + body
        wal_bytes += size
        if f.origin == atrest.ORIGIN_DATA:
            data_bytes += size
    return data_bytes, wal_bytes


def read_chunk(cf: CompressedFile, fd: int, chunk_no: int) -> StoredChunk:
    """Chunk ``chunk_no`` of ``cf`` read through ``fd`` (one ``pread``): blocking, any thread."""
    d = cf.directory
    c = d.chunks[chunk_no]
    where = cf.where
    start = d.frames[c.first_frame].offset if c.n_frames else c.meta_offset
    end = c.meta_offset + c.meta_stored
    try:
        data = os.pread(fd, end - start, start)
    except OSError as exc:
        raise Unavailable(f"journal: cannot read {cf.path}@{start}: {exc}") from exc
    if len(data) != end - start:
        raise CorruptData(
            f"short read: {len(data)} of {end - start} bytes at byte {start}", where=where
        )
    view = memoryview(data)
    blocks: list[tuple[str, int, StoredBlock]] = []
    records = 0
    for i in c.frames:
        f = d.frames[i]
        if f.origin != atrest.ORIGIN_DATA:
            continue  # mirror frames belong to other regions' logs
        stored = bytes(view[f.offset - start : f.end - start])
        if crc32c(stored) != f.crc:
            raise CorruptData(f"frame {i}: CRC mismatch", where=where)
        blocks.append((f.topic, f.partition, f.stored_block(stored)))
        records += f.record_count
    probe = BlockIndex(
        "t", 0, 0, 0, 1, 0, 0, c.meta_offset, c.meta_stored, c.meta_raw, c.meta_codec, c.meta_crc
    )
    table = logobject.decode_block(
        probe, view[c.meta_offset - start :], where=f"{where} chunk {chunk_no} entry table"
    )
    data_bytes, wal_bytes = chunk_sizes(d, chunk_no, table, where=where)
    return StoredChunk(c.first_lsn, c.last_lsn, tuple(blocks), records, data_bytes, wal_bytes)


async def read_chunk_in_thread(segments: SegmentSet, first_lsn: int) -> StoredChunk:
    """The chunk that starts at ``first_lsn`` (see :func:`chunk_span`), read in a worker thread."""
    seg, _ = segments.locate(first_lsn)
    cf = seg.compressed
    ci = None if cf is None else cf.directory.chunk_of(first_lsn)
    if cf is None or ci is None or cf.directory.chunks[ci].first_lsn != first_lsn:
        raise InvalidInput(f"no chunk of a compressed segment starts at LSN {first_lsn}")
    try:
        fd = os.dup(segments.read_fd(seg))
    except OSError as exc:
        raise Unavailable(f"journal: cannot read {seg.path}: {exc}") from exc
    try:
        return await trio.to_thread.run_sync(read_chunk, cf, fd, ci)
    finally:
        os.close(fd)
