"""Recovery: find the segment files, scan a segment entry by entry, cut a torn tail.

Opening a journal loads sealed segments from their index files and scans
the last one (or any segment whose index file is missing or unusable),
verifying every entry's CRC, LSN and structure. A torn tail of the last
segment is cut; damage anywhere else stops the open with an error naming
the segment and byte (docs/format.md, "Recovery rules").
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import struct
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData
from edge_gateway.format import atrest
from edge_gateway.format import batch as fbatch
from edge_gateway.format import entry as fentry
from edge_gateway.format.entry import Checkpoint, Entry, SourceCoords
from edge_gateway.journal import _fs
from edge_gateway.journal._compressed import TMP_SUFFIX
from edge_gateway.journal._segment import INDEX_SUFFIX, REPAIR_SUFFIX, SEGMENT_SUFFIX, Segment

log = logging.getLogger("edgegw.journal")

_MAX_BATCH = fbatch.MAX_BATCH_BYTES
_MAX_ENTRY = fentry.MAX_ENTRY_BYTES
_NONZERO = re.compile(rb"[^\x00]")
_crc = crc32c


_scan_struct = fentry.data_entry_struct


@dataclass(slots=True)
class ScannedPartition:
    """The data entries of one partition in a scanned segment."""

    lsns: array[int] = field(default_factory=lambda: array("q"))
    offsets: array[int] = field(default_factory=lambda: array("q"))
    next_offset: int = 0


@dataclass(slots=True)
class Scanned:
    """What a scan of one segment found."""

    segment: Segment
    #: the segment's first entry
    checkpoint: Checkpoint | None
    parts: dict[tuple[str, int], ScannedPartition]
    #: mirror progress recorded by the segment's entries, in LSN order
    sources: dict[str, SourceCoords]
    #: bytes of a torn tail cut away
    truncated: int = 0
    #: the segment's version (``fentry.SEGMENT_VERSIONS``)
    version: int = fentry.SEGMENT_VERSION
    #: the entries of idempotent producers (the last segment only), in LSN order
    producers: list[Entry] = field(default_factory=list)
    #: LSNs whose entries were lost to damage (checkpoints standing in for them)
    lost: int = 0


class DamagedEntry(CorruptData):
    """A bad entry in the middle of a segment with a valid entry after it: damage.

    ``pos`` is the bad entry's byte, ``lsn`` the LSN it should have had.
    """

    def __init__(
        self,
        reason: str,
        *,
        where: str,
        pos: int,
        lsn: int,
        detail: str,
        next_offsets: dict[tuple[str, int], int],
    ) -> None:
        super().__init__(reason, where=where)
        self.pos = pos
        self.lsn = lsn
        self.detail = detail
        #: where each partition stood before the damage (the scan's state there)
        self.next_offsets = next_offsets


def list_segments(path: Path) -> list[tuple[int, Path]]:
    """The segment files of the journal in ``path`` as (base LSN, path), oldest first.

    A segment created by a roll that crashed before its checkpoint became
    durable holds nothing acknowledged: it is removed (only ever the last one).
    Temporary files of a compressed rewrite (``*.wal.z-tmp``) and of a live
    repair (``*.wal.r-tmp``) are removed.
    """
    for tmp in sorted(path.glob(f"*{SEGMENT_SUFFIX}{TMP_SUFFIX}")):
        # a compressed rewrite that did not finish: its segment is intact
        log.info("journal: deleting %s, left by an unfinished rewrite", tmp.name)
        _fs.ops.unlink(tmp)
    for tmp in sorted(path.glob(f"*{SEGMENT_SUFFIX}{REPAIR_SUFFIX}")):
        # a live repair that did not finish: its segment is as it was (damaged)
        log.info("journal: deleting %s, left by an unfinished repair", tmp.name)
        _fs.ops.unlink(tmp)
    bases: list[tuple[int, Path]] = []
    for f in sorted(path.glob(f"*{SEGMENT_SUFFIX}")):
        try:
            bases.append((int(f.stem), f))
        except ValueError:
            raise CorruptData("unexpected file in journal directory", where=str(f)) from None
    while bases:
        _, f = bases[-1]
        if f.stat().st_size >= fentry.SEGMENT_HEADER_SIZE + fentry.ENTRY_HEADER_SIZE:
            break
        log.warning("journal: removing empty segment %s left by an interrupted roll", f)
        _fs.ops.unlink(f)
        with contextlib.suppress(FileNotFoundError):
            _fs.ops.unlink(f.with_suffix(INDEX_SUFFIX))
        bases.pop()
    return bases


def scan_segment(base: int, path: Path, *, last: bool) -> Scanned:
    """Verify every entry of a segment (CRC, LSN, structure) and index it.

    The loop handles the common entry, DATA with a well-formed batch, with
    one struct unpack and one CRC call and no object per entry: the
    active segment of a journal of single records holds ~300,000 of them.
    Anything else (the checkpoint, mirror entries, any doubt) goes through
    :func:`fentry.decode_entry`, which makes the same checks and says
    precisely what is wrong; a block entry (kind 4, version 3 segments) goes
    through :func:`atrest.decode_block_entry`. A torn tail is cut only in the ``last``
    segment; a zero-filled tail (preallocated space) is cut from any other.
    """
    where = str(path)
    buf = path.read_bytes()
    size = len(buf)
    if size == 0:
        raise CorruptData("empty segment", where=where)
    if fentry.decode_segment_header(buf[: fentry.SEGMENT_HEADER_SIZE], where=where) != base:
        raise CorruptData("segment header LSN does not match its file name", where=where)
    seg = Segment(base, path, size, 0)
    out = Scanned(seg, None, {}, {}, version=fentry.segment_version(buf))
    pos = fentry.SEGMENT_HEADER_SIZE
    lsn = base
    positions = seg.positions
    parts = out.parts
    view = memoryview(buf)
    crc = _crc
    # One unpack per entry: entry header, topic and batch header together,
    # with a struct per topic length (guessed from the previous entry).
    structs: dict[int, struct.Struct] = {}
    by_raw: dict[tuple[bytes, int], ScannedPartition] = {}
    tlen_guess = 0
    unpack = structs.setdefault(0, _scan_struct(0)).unpack_from
    head_size = structs[0].size
    last_time = 0
    while pos < size:
        # ---- the fast path: a DATA entry whose every check passes
        if size - pos >= head_size:
            (
                length,
                stored,
                elsn,
                kind,
                flags,
                tlen,
                partition,
                boff,
                count,
                atime,
                traw,
                bl,
                ver,
                bfl,
                res,
                bbase,
                _,
                bcount,
                mn,
                mx,
            ) = unpack(buf, pos)
            if tlen != tlen_guess:  # another topic length: switch structs and retry
                tlen_guess = tlen
                head = structs.get(tlen) or structs.setdefault(tlen, _scan_struct(tlen))
                unpack, head_size = head.unpack_from, head.size
                continue
            if (
                kind == 1
                and not flags
                and elsn == lsn
                and bl == length - 44 - tlen
                and 40 <= bl <= _MAX_BATCH
                and length <= _MAX_ENTRY
                and pos + length <= size
                and ver == 1
                and not bfl & ~7  # KEYS, HEADERS, NULLS (batch.py)
                and not res
                and bbase == boff
                and bcount == count
                and count >= 1
                and count * ((bfl & 1) + ((bfl & 2) >> 1) + 3) * 4 <= bl - 40
                and mn <= mx
                and lsn != base
                and crc(view[pos + 8 : pos + length]) == stored
                and (
                    (p := by_raw.get((traw, partition)))
                    or (p := _scan_partition(traw, partition, by_raw, parts))
                )
            ):
                positions.append(pos)
                if atime > last_time:  # noqa: PLR1730 (a compare is cheaper than max())
                    last_time = atime
                p.lsns.append(lsn)
                p.offsets.append(boff)
                if boff + count > p.next_offset:  # noqa: PLR1730
                    p.next_offset = boff + count
                pos += length
                lsn += 1
                continue
        # ---- everything else
        if fentry.is_zero_tail(buf, pos):
            # Zeros to the end: the preallocated tail of an active segment.
            seg.size = pos
            if not last:
                cut(path, pos, "zero-filled tail")
            break
        try:
            e = atrest.decode_any_entry(buf, pos, where=f"{where}@{pos}")
            if e.lsn != lsn:
                raise CorruptData(f"LSN {e.lsn} where {lsn} was expected", where=f"{where}@{pos}")
        except CorruptData as exc:
            if last and not valid_entry_follows(buf, pos, lsn):
                log.warning(
                    "journal: truncating torn tail of %s at byte %d (%d bytes): %s",
                    path,
                    pos,
                    size - pos,
                    exc,
                )
                out.truncated += size - pos
                cut(path, pos, "")
                seg.size = pos
                break
            raise DamagedEntry(
                f"corrupt entry in the middle of the journal ({exc.reason}); the entries "
                "after it are intact, so this is damage, not a torn write",
                where=f"{where}@{pos}",
                pos=pos,
                lsn=lsn,
                detail=exc.reason,
                next_offsets=_stood(out),
            ) from None
        if isinstance(e, atrest.BlockEntry) and out.version < atrest.WAL_VERSION_BLOCKS:
            # a whole, valid entry no writer puts there: damage (the version byte), never
            # a torn tail to cut
            raise CorruptData(
                f"a block entry in a version {out.version} segment", where=f"{where}@{pos}"
            )
        if lsn == base:
            if isinstance(e, atrest.BlockEntry) or e.kind != fentry.KIND_CHECKPOINT:
                raise CorruptData("segment does not start with a checkpoint", where=where)
            out.checkpoint = Checkpoint.decode(e.payload, where=f"{where}@{pos}")
        elif not isinstance(e, atrest.BlockEntry) and e.kind == fentry.KIND_CHECKPOINT:
            # A checkpoint inside a segment stands for an entry lost to damage and
            # quarantined (_quarantine.py); its offsets are where the partitions
            # continue after the loss, so none is ever handed out again.
            cp = Checkpoint.decode(e.payload, where=f"{where}@{pos}")
            out.lost += 1
            for key, next_offset in cp.next_offsets.items():
                p = parts.get(key) or parts.setdefault(key, ScannedPartition())
                p.next_offset = max(p.next_offset, next_offset)
        positions.append(pos)
        last_time = max(last_time, e.append_time)
        if isinstance(e, atrest.BlockEntry):
            # a mirrored block: one entry of the partition, its source's progress
            key = (e.topic, e.partition)
            p = parts.get(key) or parts.setdefault(key, ScannedPartition())
            p.lsns.append(lsn)
            p.offsets.append(e.first_offset)
            p.next_offset = max(p.next_offset, e.next_offset)
            out.sources[e.source.region] = e.source
            pos += e.length
            lsn += 1
            continue
        if e.count:
            key = (e.topic, e.partition)
            p = parts.get(key) or parts.setdefault(key, ScannedPartition())
            p.lsns.append(lsn)
            p.offsets.append(e.base_offset)
            p.next_offset = max(p.next_offset, e.next_offset)
        if e.source is not None:
            out.sources[e.source.region] = e.source
        if last and e.producer is not None:
            out.producers.append(e)
        pos += e.length
        lsn += 1
    if not positions:
        raise CorruptData("segment has no valid checkpoint entry", where=where)
    seg.last_append_time = last_time
    return out


def _stood(out: Scanned) -> dict[tuple[str, int], int]:
    """Each partition's next offset after the entries a scan has taken so far."""
    stood = dict(out.checkpoint.next_offsets) if out.checkpoint is not None else {}
    for key, p in out.parts.items():
        stood[key] = max(stood.get(key, 0), p.next_offset)
    return stood


def _scan_partition(
    topic_raw: bytes,
    partition: int,
    by_raw: dict[tuple[bytes, int], ScannedPartition],
    parts: dict[tuple[str, int], ScannedPartition],
) -> ScannedPartition | None:
    """The partition of a scanned entry, or None if its topic is not UTF-8."""
    try:
        topic = topic_raw.decode()
    except UnicodeDecodeError:
        return None
    key = (topic, partition)
    p = by_raw[(topic_raw, partition)] = parts.get(key) or parts.setdefault(key, ScannedPartition())
    return p


def cut(path: Path, pos: int, what: str) -> None:
    """Truncate a segment file at ``pos``, durably."""
    if what:
        log.info("journal: removing the %s of %s at byte %d", what, path, pos)
    fd = _fs.ops.open(path, os.O_RDWR)
    try:
        _fs.ops.ftruncate(fd, pos)
        _fs.ops.fsync(fd)
    finally:
        _fs.ops.close(fd)


def valid_entry_follows(buf: bytes, pos: int, lsn: int) -> bool:
    """Whether any whole, valid entry with an LSN >= ``lsn`` starts after ``pos``.

    If one does, the bad bytes at ``pos`` are corruption in the middle,
    not a torn tail, and must not be truncated away. Runs of zeros (a
    preallocated tail) are skipped at C speed.
    """
    return next_valid_entry(buf, pos, lsn) is not None


def next_valid_entry(buf: bytes, pos: int, lsn: int) -> int | None:
    """The byte of the first whole, valid entry with an LSN >= ``lsn`` after ``pos``
    (None: none): where a scan re-syncs after damage."""
    size = len(buf)
    last_start = size - fentry.ENTRY_HEADER_SIZE
    if pos + 4 <= size:
        n = fentry.peek_length(buf, pos)
        if n >= fentry.ENTRY_HEADER_SIZE and pos + n <= last_start:
            with contextlib.suppress(CorruptData):
                if atrest.decode_any_entry(buf, pos + n).lsn >= lsn:
                    return pos + n
    start = pos + 1
    while start <= last_start:
        if not buf[start]:
            # An entry's length field (>= 44) has a non-zero byte in its first 4.
            m = _NONZERO.search(buf, start)
            if m is None:
                return None
            start = max(start, m.start() - 3)
            if start > last_start:
                return None
        cand_lsn = int.from_bytes(buf[start + 8 : start + 16], "little")
        if lsn <= cand_lsn < lsn + (1 << 32):
            with contextlib.suppress(CorruptData):
                atrest.decode_any_entry(buf, start)
                return start
        start += 1
    return None
