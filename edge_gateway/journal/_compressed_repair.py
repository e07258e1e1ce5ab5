"""A compressed segment whose entry tables or directory are damaged, expanded for its repair.

Issue 45 leftovers. The live repair (``_live_repair.py``) works on the entry
log a compressed segment (``EGWC``, docs/at-rest.md) replaced: its
``expand_damaged`` rebuilds every entry from the chunks' entry tables and
frames, and leaves the entries of a frame that does not read back as damage.
It needs every entry table and the directory. When one of them does not
check, :func:`expand_salvaged` is used instead (``expand_for_repair`` tries
the first, then this one):

* **an entry table** (a chunk's, other than the one holding the segment's
  checkpoint): the chunk's entries are unknown, but its LSN range is the
  directory's. The chunk is left as a few bytes of damage in the copy; the
  scan meets it there, re-syncs on the next chunk's first entry (or the
  damage runs to the segment's end, bounded by the next segment's
  checkpoint), and the range is rebuilt from the bucket like any damage.
  Damage in several places is one range, from the first damaged entry to the
  end of the last, as for frames: the rebuild must see where every partition
  goes on after it.
* **the directory** (its CRC fails): nothing it says about partitions or
  frames is trusted -- a flipped byte in a topic's name would make entries
  that check but name another topic. Only the segment's checkpoint is taken,
  and only when it checks on its own: the directory's fields are decoded
  (every structural rule, without the CRC), the first chunk's entry table
  must match its own CRC, and the checkpoint is a whole journal entry kept
  with its CRC in that table. Every LSN after it is left as damage: the
  whole segment is rebuilt from the bucket, bounded by the next segment's
  checkpoint.

Not repaired (``CorruptData``, the live repair counts the attempt): the
checkpoint's entry table damaged (the checkpoint holds the partitions'
offsets, the mirrors' progress and the producers' table at the segment's
start; the bucket has none of it), a directory whose fields do not decode
or whose first entry table does not check, a damaged header or trailer.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.atrest import ChunkEntries, SegmentDirectory
from edge_gateway.journal._checkpoint_derive import derive_checkpoint

__all__ = ["expand_salvaged"]

log = logging.getLogger("edgegw.journal")

#: What stands for a damaged part in the copy: a length field of 0xFFFFFFFF is no
#: entry's, so the scan meets damage there (the live repair's filler).
FILLER: Final = b"\xff"
#: Bytes standing for a chunk whose entry table does not read (its entries'
#: lengths are in that table): enough for the scan to meet one bad entry.
CHUNK_FILLER_BYTES: Final = 16


def _directory(
    view: memoryview, base: int, wal_version: int, where: str
) -> tuple[SegmentDirectory, bool]:
    """The directory, and whether its CRC checked. One whose CRC fails is decoded with
    every structural rule all the same (its CRC recomputed), for the caller to take
    only what checks on its own."""
    size = len(view)
    dir_offset, dir_length = atrest.decode_trailer(
        view[size - atrest.TRAILER_SIZE :], file_size=size, where=where
    )
    raw = view[dir_offset : dir_offset + dir_length]
    try:
        d = atrest.decode_directory(
            raw, base_lsn=base, wal_version=wal_version, dir_offset=dir_offset, where=where
        )
        return d, True
    except CorruptData as exc:
        if "CRC mismatch" not in exc.reason:
            raise
    body = bytes(raw[:-4])
    resealed = body + crc32c(body).to_bytes(4, "little")
    d = atrest.decode_directory(
        resealed, base_lsn=base, wal_version=wal_version, dir_offset=dir_offset, where=where
    )
    return d, False


def _entries(
    view: memoryview, d: SegmentDirectory, chunk_no: int, where: str
) -> ChunkEntries | None:
    c = d.chunks[chunk_no]
    try:
        return atrest.decode_entries(
            d, chunk_no, view[c.meta_offset : c.meta_offset + c.meta_stored], where=where
        )
    except CorruptData:
        return None


def expand_salvaged(path: Path, base: int) -> bytes:
    """The entry log compressed segment ``path`` replaced, for its live repair, with a
    damaged entry table's chunk -- or, with a damaged directory, everything after the
    checkpoint -- left as damage (module docstring). Frames that do not read back
    leave their entries as damage, as ``expand_damaged`` does. Raises
    :class:`CorruptData` when the checkpoint cannot be had."""
    where = str(path)
    data = path.read_bytes()
    view = memoryview(data)
    wal_version, hbase = atrest.decode_header(view, where=where)
    if hbase != base:
        raise CorruptData(f"the header says base LSN {hbase}", where=where)
    d, trusted = _directory(view, base, wal_version, where)
    out = bytearray(fentry.encode_segment_header(base, wal_version))
    first = _entries(view, d, 0, where)
    if first is None and trusted:
        # the checkpoint is in no bucket: derived from the neighbours when proven equal
        # (_checkpoint_derive.py), the rest of the chunk left as damage
        try:
            checkpoint = derive_checkpoint(path, base, d)
        except CorruptData as exc:
            raise CorruptData(
                "the entry table holding the segment's checkpoint is damaged and the "
                f"checkpoint is in no bucket; it cannot be derived: {exc.reason}",
                where=where,
            ) from None
        log.warning(
            "journal: %s: the entry table holding its checkpoint is damaged; the "
            "checkpoint is derived from the neighbouring segments (proven equal)",
            path,
        )
    elif first is None or first.kinds[0] != fentry.KIND_CHECKPOINT:
        raise CorruptData(
            "the entry table holding the segment's checkpoint is damaged: the checkpoint "
            "is in no bucket, the segment is not rebuilt",
            where=where,
        )
    else:
        checkpoint = first.extra_bytes(0)
    e = atrest.decode_any_entry(checkpoint, 0, where=f"{where} checkpoint")  # its own CRC
    if e.lsn != base or e.length != len(checkpoint):
        raise CorruptData(f"the checkpoint is LSN {e.lsn}, not {base}", where=where)
    if not trusted:
        log.warning(
            "journal: %s: its directory is damaged; only the checkpoint is kept, every "
            "entry after it is rebuilt from the bucket",
            path,
        )
        return bytes(out + checkpoint + FILLER * CHUNK_FILLER_BYTES)
    if first is None:
        out += checkpoint  # derived: its chunk's other entries are left as damage below
    stored: dict[int, bytes] = {}
    raws: dict[int, bytes | None] = {}

    def stored_of(n: int) -> bytes:
        if n not in stored:
            f = d.frames[n]
            stored[n] = bytes(view[f.offset : f.end])
        return stored[n]

    def raw_of(n: int) -> bytes:
        if n not in raws:
            try:
                raws[n] = atrest.decode_frame(d.frames[n], stored_of(n), where=where)
            except CorruptData:
                raws[n] = None
        raw = raws[n]
        if raw is None:
            raise CorruptData(f"frame {n} does not read back", where=where)
        return raw

    first_bad = last_end = -1
    for ci in range(len(d.chunks)):
        ents = first if ci == 0 else _entries(view, d, ci, where)
        if ents is None:
            at = len(out)
            out += FILLER * CHUNK_FILLER_BYTES
            first_bad = at if first_bad < 0 else first_bad
            last_end = len(out)
            continue
        for k in range(ents.chunk.n_entries):
            try:
                wal = atrest.wal_entry(d, ents, k, raw_of, stored_of, where=where)
            except CorruptData:
                # (a frame that does not read back: merged into one range below)
                wal = FILLER * CHUNK_FILLER_BYTES
                first_bad = len(out) if first_bad < 0 else first_bad
                out += wal
                last_end = len(out)
                continue
            out += wal
        raws.clear()
        stored.clear()
    if first_bad >= 0:
        out[first_bad:last_end] = FILLER * (last_end - first_bad)
    return bytes(out)
