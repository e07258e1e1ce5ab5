"""A compressed segment's checkpoint, derived when the entry table holding it is damaged.

Issue 45. A segment's checkpoint (its first entry: where each partition and
mirror source stands, the idempotent producers' table, at the segment's
start) is in no bucket, and in a compressed segment it is kept in the first
chunk's entry table. When that table does not check, :func:`derive_checkpoint`
makes it again from the neighbours -- only when what it makes is proven to
be what was lost, else it raises :class:`CorruptData` with the reason:

* **the partitions' offsets**: the previous segment's checkpoint with that
  segment's entries applied (each entry's next offset, a checkpoint entry in
  its middle -- an earlier loss -- moving partitions on), checked against a
  second, independent source: this segment's directory (a partition's first
  frame starts where it stood; one with no frame here stood where the next
  segment's checkpoint has it). Both must agree for every partition; a
  partition only this segment holds must start at offset 0 (born here), and
  the next segment's checkpoint must name no partition neither knows.
* **the mirror sources and the producers' table**: their fields only move
  forward (a source's sequence, producer ids, epochs and sequence numbers),
  so when the previous and the next segment's checkpoints hold the same,
  this one held the same too (no table at all -- a journal's first
  checkpoint -- is the same as an empty one; the next segment's form is
  taken). Otherwise they cannot be had: refused.

The directory must check (its CRC): it is the second source. The derived
checkpoint entry's append time is the previous segment's last entry's (no
later than the true one); it is not compared with anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_gateway.errors import CorruptData
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.entry import Checkpoint
from edge_gateway.journal._segment import segment_name

__all__ = ["derive_checkpoint"]

Key = tuple[str, int]


def _entries(path: Path) -> list[atrest.AnyEntry]:
    """Every entry of segment ``path`` (an entry log or compressed), each checked."""
    data = path.read_bytes()
    if data[: len(atrest.MAGIC)] == atrest.MAGIC:
        return list(atrest.CompressedSegment(data, where=str(path)).entries())
    out = []
    pos = fentry.SEGMENT_HEADER_SIZE
    while pos < len(data) and not fentry.is_zero_tail(data, pos):
        e = atrest.decode_any_entry(data, pos, where=str(path))
        out.append(e)
        pos += e.length
    return out


def _neighbour(path: Path, base: int, *, before: bool) -> Path:
    bases = sorted(int(f.stem) for f in path.parent.glob(f"*{path.suffix}") if f.stem.isdigit())
    others = [b for b in bases if (b < base if before else b > base)]
    if not others:
        side = "previous" if before else "next"
        raise CorruptData(f"no {side} segment to derive it from", where=str(path))
    return path.with_name(segment_name(others[-1] if before else others[0]))


def _checkpoint(e: atrest.AnyEntry, lsn: int, where: str) -> Checkpoint:
    if not isinstance(e, fentry.Entry) or e.kind != fentry.KIND_CHECKPOINT or e.lsn != lsn:
        raise CorruptData(f"no checkpoint at LSN {lsn}", where=where)
    return Checkpoint.decode(e.payload, where=where)


def _no_producers(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """A producers' table as a state: none (a version 1 checkpoint) is the same as a
    fresh table's snapshot (no producers, next id 1)."""
    if doc is None or (doc.get("producers") == [] and doc.get("next_id") == 1):
        return None
    return doc


def derive_checkpoint(path: Path, base: int, d: atrest.SegmentDirectory) -> bytes:
    """The checkpoint entry of compressed segment ``path`` (base LSN ``base``, its
    directory ``d``, which checked), proven equal to the lost one (module docstring);
    raises :class:`CorruptData` naming why not. Blocking."""
    where = str(path)
    try:
        prev = _neighbour(path, base, before=True)
        nxt = _neighbour(path, base, before=False)
        prev_entries = _entries(prev)
        if not prev_entries or prev_entries[-1].lsn != base - 1:
            raise CorruptData(
                "the previous segment does not end where this one starts", where=where
            )
        first = prev_entries[0]
        start = _checkpoint(first, int(prev.stem), str(prev))
        nxt_data = nxt.read_bytes()
        if nxt_data[: len(atrest.MAGIC)] == atrest.MAGIC:
            head = next(atrest.CompressedSegment(nxt_data, where=str(nxt)).entries())
        else:
            head = atrest.decode_any_entry(nxt_data, fentry.SEGMENT_HEADER_SIZE, where=str(nxt))
        end = _checkpoint(head, int(nxt.stem), str(nxt))
    except (OSError, StopIteration) as exc:
        raise CorruptData(f"the neighbours do not read ({exc})", where=where) from None
    if start.sources != end.sources or _no_producers(start.producers) != _no_producers(
        end.producers
    ):
        raise CorruptData(
            "the mirror sources or the producers' table changed between the previous and "
            "the next segment's checkpoints: this one's cannot be derived",
            where=where,
        )
    # the first source: the previous segment's checkpoint and entries
    offsets: dict[Key, int] = dict(start.next_offsets)
    for e in prev_entries[1:]:
        if isinstance(e, atrest.BlockEntry) or e.count:
            key = (e.topic, e.partition)
            offsets[key] = max(offsets.get(key, 0), e.next_offset)
        elif isinstance(e, fentry.Entry) and e.kind == fentry.KIND_CHECKPOINT:
            for key, o in Checkpoint.decode(e.payload, where=str(prev)).next_offsets.items():
                offsets[key] = max(offsets.get(key, 0), o)
    # the second: this segment's directory, then the next segment's checkpoint
    here = {key: d.frames_of(*key)[0].first_offset for key in d.parts if d.frames_of(*key)}
    for key, o in offsets.items():
        other = here.get(key, end.next_offsets.get(key))
        if other != o:
            raise CorruptData(
                f"{key[0]}/{key[1]}: the previous segment says it stood at {o}, this "
                f"segment and the next say {other}: the checkpoint cannot be derived",
                where=where,
            )
    for key, o in here.items():
        if key not in offsets and o != 0:
            raise CorruptData(
                f"{key[0]}/{key[1]} starts at {o} here and is unknown before",
                where=where,
            )
    unknown = set(end.next_offsets) - set(offsets) - set(here)
    if unknown:
        raise CorruptData(
            f"the next segment's checkpoint names partitions unknown here: {sorted(unknown)}",
            where=where,
        )
    # the next segment's form of the same table: written by a roll, as this one was (the
    # previous may be the journal's first checkpoint, which has none)
    cp = Checkpoint(offsets, dict(start.sources), end.producers)
    return fentry.encode_checkpoint_entry(
        lsn=base, append_time=prev_entries[-1].append_time, payload=cp.encode()
    )
