"""At open: a sealed compressed segment that neither opens nor is rebuilt, quarantined.

Issue 45 ("if the bucket is unreachable, the gateway starts serving new
produce and the undamaged ranges, and repairs when the bucket returns"). A
sealed compressed segment (``EGWC``) opens from its trailer and directory
alone (``_open._load_compressed``). When one of them does not check and the
open cannot rebuild the segment from the bucket (``_compressed_open.py``:
the bucket out of reach, not shipped whole, the trailer damaged),
:func:`quarantine_compressed` no longer stops the start. What it cannot read
is quarantined as ``_quarantine.py`` does for an entry log:

* the segment's LSN range is known without its directory: it starts at its
  name, and the next segment's checkpoint (its first entry) ends it and says
  where every partition went on; the segment's own checkpoint is taken from
  the first chunk's entry table (the directory found through the trailer,
  or -- a damaged trailer -- by looking for a directory whose own CRC checks
  and that ends where the trailer starts) and must check on its own (its
  entry CRC, its LSN);
* the file, as it was, is copied to ``quarantine/``, the loss recorded once
  in ``lost.log`` (every LSN after the checkpoint; per partition the exact
  offsets, from the checkpoint to the next segment's; ``repairable`` when the
  bucket holds them), and a report written beside the copy;
* the segment becomes an entry log: its checkpoint, then one checkpoint
  entry per lost LSN (the first carrying where the partitions continue), by
  temporary file, fsync, rename. The open then scans it as any segment, and
  the live repair rebuilds the range once the bucket answers
  (``_live_repair.py``: a quarantined ``repairable`` range).

Never a silent truncation: the journal keeps every LSN, the partitions'
offsets skip the lost records, and the loss is named. Not quarantined (the
open stops as before, naming the file): a damaged header, no checkpoint that
checks (its entry table damaged, or no directory found), no next segment or
one whose first entry does not read.

A kill at any step is safe: before the rename the file is the damaged
compressed segment again and the next open does the same (``lost.log``
gets no second record).
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from pathlib import Path
from typing import Final

from edge_gateway._crc import crc32c
from edge_gateway.durable import replace_file
from edge_gateway.errors import CorruptData
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.entry import Checkpoint
from edge_gateway.journal import _fs
from edge_gateway.journal._lane_repair import bucket_may_hold
from edge_gateway.journal._quarantine import (
    QUARANTINE_DIR,
    Loss,
    LostRange,
    lost_checkpoints,
    record_loss,
)
from edge_gateway.journal._segment import first_entry_after

__all__ = ["find_checkpoint", "quarantine_compressed"]

log = logging.getLogger("edgegw.journal")

_U64: Final = struct.Struct("<Q")
#: Candidate directory positions tried when the trailer does not read.
_MAX_TRIES: Final = 10_000


def _directory(
    view: memoryview, base: int, wal_version: int, where: str
) -> atrest.SegmentDirectory:
    """The directory, through the trailer; or, the trailer damaged, the last position
    holding a directory that checks (its CRC) and ends where the trailer starts."""
    size = len(view)
    try:
        off, length = atrest.decode_trailer(
            view[size - atrest.TRAILER_SIZE :], file_size=size, where=where
        )
    except CorruptData:
        return _search_directory(view, base, wal_version, where)
    raw = view[off : off + length]
    try:
        return atrest.decode_directory(
            raw, base_lsn=base, wal_version=wal_version, dir_offset=off, where=where
        )
    except CorruptData as exc:
        if "CRC mismatch" not in exc.reason:
            raise
    # the CRC fails: its fields are decoded all the same, and only the first chunk's
    # entry table is taken from it, which must then check on its own
    body = bytes(raw[:-4])
    return atrest.decode_directory(
        body + crc32c(body).to_bytes(4, "little"),
        base_lsn=base,
        wal_version=wal_version,
        dir_offset=off,
        where=where,
    )


def _search_directory(
    view: memoryview, base: int, wal_version: int, where: str
) -> atrest.SegmentDirectory:
    """The trailer damaged: the directory is the bytes from a position holding the base
    LSN (its first field) to the trailer, when they check as one (its CRC first)."""
    data = view.obj if isinstance(view.obj, bytes) else bytes(view)
    end = len(view) - atrest.TRAILER_SIZE
    needle = _U64.pack(base)
    at = data.rfind(needle, fentry.SEGMENT_HEADER_SIZE, end)
    for _ in range(_MAX_TRIES):
        if at < 0:
            break
        with contextlib.suppress(CorruptData, struct.error, ValueError, IndexError):
            return atrest.decode_directory(
                view[at:end], base_lsn=base, wal_version=wal_version, dir_offset=at, where=where
            )
        at = data.rfind(needle, fentry.SEGMENT_HEADER_SIZE, at)
    raise CorruptData("the trailer is damaged and no directory that checks was found", where=where)


def find_checkpoint(data: bytes, base: int, *, where: str) -> tuple[int, bytes]:
    """(the journal segment version, the checkpoint entry's bytes) of compressed segment
    ``data``, each checked on its own; raises :class:`CorruptData` when not had."""
    view = memoryview(data)
    wal_version, hbase = atrest.decode_header(view, where=where)
    if hbase != base:
        raise CorruptData(f"the header says base LSN {hbase}", where=where)
    d = _directory(view, base, wal_version, where)
    c = d.chunks[0]
    try:
        first = atrest.decode_entries(
            d, 0, view[c.meta_offset : c.meta_offset + c.meta_stored], where=where
        )
    except CorruptData as exc:
        raise CorruptData(
            f"the entry table holding the segment's checkpoint is damaged ({exc.reason})",
            where=where,
        ) from None
    if first.kinds[0] != fentry.KIND_CHECKPOINT:
        raise CorruptData("the segment's first entry is not a checkpoint", where=where)
    checkpoint = first.extra_bytes(0)
    e = atrest.decode_any_entry(checkpoint, 0, where=f"{where} checkpoint")  # its own CRC
    if e.lsn != base or e.length != len(checkpoint):
        raise CorruptData(f"the checkpoint is LSN {e.lsn}, not {base}", where=where)
    return wal_version, checkpoint


def _next_checkpoint(path: Path, base: int) -> fentry.Entry:
    """The next segment's first entry, its checkpoint (raises :class:`CorruptData`)."""
    try:
        found = first_entry_after(path, base)
    except (OSError, CorruptData) as exc:
        raise CorruptData(
            f"the next segment's checkpoint does not read ({exc})", where=str(path)
        ) from None
    if found is None:
        raise CorruptData("no segment after it says where its LSNs end", where=str(path))
    nxt, first = found
    if (
        not isinstance(first, fentry.Entry)
        or first.kind != fentry.KIND_CHECKPOINT
        or first.lsn != int(nxt.stem)
    ):
        raise CorruptData("the next segment does not start with its checkpoint", where=str(nxt))
    return first


def quarantine_compressed(
    path: Path, base: int, exc: CorruptData, *, known: list[Loss], now_ms: int | None = None
) -> Loss:
    """Quarantine every LSN after the checkpoint of sealed compressed segment ``path``
    (which did not open: ``exc``), and make it an entry log (module docstring).
    Raises :class:`CorruptData` (``exc``'s reason and why) when it cannot. Blocking."""
    where = str(path)
    data = path.read_bytes()
    try:
        wal_version, checkpoint = find_checkpoint(data, base, where=where)
        cp = atrest.decode_any_entry(checkpoint, 0, where=f"{where} checkpoint")
        assert isinstance(cp, fentry.Entry)
        before = Checkpoint.decode(cp.payload, where=f"{where} checkpoint").next_offsets
        nxt = _next_checkpoint(path, base)
        after = Checkpoint.decode(nxt.payload, where=f"{where} next checkpoint")
    except CorruptData as why:
        raise CorruptData(
            f"{exc.reason}; not quarantined either: {why.reason}", where=why.where
        ) from None
    lsn_first, lsn_end = base + 1, nxt.lsn
    ranges = tuple(
        LostRange(t, p, before.get((t, p), 0), o - 1, True)
        for (t, p), o in sorted(after.next_offsets.items())
        if o > before.get((t, p), 0)
    )
    may = bucket_may_hold(path.parent)
    repairable = None if may is None else lsn_end - 1 <= may
    when = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    qdir = path.parent.parent / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    lane_dir = path.parent.name
    copy_name = f"{lane_dir}-{path.stem}-lsn{lsn_first}.damaged"
    loss = Loss(
        base,
        lsn_first,
        lsn_end - 1,
        fentry.SEGMENT_HEADER_SIZE,
        len(data),
        when,
        f"compressed segment does not open ({exc.reason}): every entry after its checkpoint",
        repairable,
        f"{QUARANTINE_DIR}/{copy_name}",
        ranges,
    )
    record_loss(path, loss, known, data, len(data) - fentry.SEGMENT_HEADER_SIZE)
    # 3. an entry log: the checkpoint, then one checkpoint per lost LSN; their append
    # time the next segment's checkpoint's (never earlier than a lost entry's)
    skip_to = dict(after.next_offsets)
    out = [fentry.encode_segment_header(base, wal_version), checkpoint]
    out += lost_checkpoints(lsn_first, lsn_end, skip_to, nxt.append_time)
    with contextlib.suppress(FileNotFoundError):
        _fs.ops.unlink(path.with_suffix(".idx"))  # an entry log's it replaced: stale
    replace_file(path, b"".join(out), ops=_fs.ops)
    named = ", ".join(f"{r.topic}/{r.partition} {r.first}-{r.last}" for r in ranges)
    log.error(
        "journal: %s does not open (%s) and was not rebuilt: LSN %d-%d (every entry after "
        'its checkpoint) quarantined to %s; offsets lost: %s; %s (docs/operations.md, "A '
        'damaged disk")',
        path,
        exc.reason,
        lsn_first,
        lsn_end - 1,
        loss.copy,
        named or "none known",
        "the bucket has them: repaired once it answers"
        if repairable
        else "not shipped: lost for good"
        if repairable is False
        else "whether shipped is unknown",
    )
    return loss
