"""Repair of mirror entries: a damaged range of a mirror topic is re-fetched from the source
region's log (issue 45, item 3, its last part).

A mirror entry's records are the source region's, so this region's log
objects do not hold them (``_repair.py`` refuses such a range). But every
mirror entry records where it came from (:class:`~edge_gateway.format.entry.SourceCoords`:
the source region, the seq of its log object, the epoch, whether it was the
object's last entry), and a mirror partition keeps the source's offsets. So
no new field is needed: the intact entries around the damage (or the
segment's checkpoint before it and the next segment's after it) bound the
source seqs the lost entries came from, and each mirror partition's offsets
before and after the damage name exactly the records lost. The gateway's
:class:`MirrorSource` reads those objects of ``regions/<source>/log/``
(``edge_gateway/mirror_repair.py``: opened with the keys the tailers use);
:func:`rebuild_mirrored` (pure: no I/O) appends them again as the tailer
did (``mirror/_tailer.py``, ``_plan.py``):

* objects in seq order; a fence, or an entry of an epoch below the one
  accepted, appends nothing;
* each object's blocks in the object's order, those of a mirrored topic
  (``<source>.<topic>`` held here) whose offsets lie between where the
  partition stood before the damage and where it goes on after it;
* a block kept as one block entry (``mirror.keep_blocks``), or its batches
  one entry each (without it, or for an object a block of which straddles
  the damage's edge: the tailer resumed inside it, by batches);
* each entry's source coordinates as the tailer recorded them: the object's
  seq, the highest epoch accepted, END_OF_SOURCE_OBJECT on the object's last
  entry; the append time that of the first intact entry after the damage
  (never earlier than the true one, as ``_repair.py`` does).

The result must be exactly the lost entries: one per lost LSN (a progress
marker -- an entry with nothing to append -- or a home entry between mirror
entries in the range: refused, the records could not be placed), offsets
continuous from the entry before to the entry after, CRCs decoded back.
Anything else raises :class:`~edge_gateway.journal._repair.NotRebuilt` and the
range is quarantined (reported lost, ``repairable: true``) as before; a source
object the source's GC collected is :class:`~edge_gateway.errors.CorruptData`
from the source, the same outcome. The live repair's bounded attempts apply
unchanged (``_live_repair.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from edge_gateway.format import atrest, logobject
from edge_gateway.format import entry as fentry
from edge_gateway.format.entry import Checkpoint, SourceCoords
from edge_gateway.format.logobject import BlockIndex
from edge_gateway.journal import _repair
from edge_gateway.journal._recovery import DamagedEntry
from edge_gateway.names import mirror_topic

__all__ = [
    "MirrorSource",
    "MirroredObject",
    "SeqRange",
    "mirror_range",
    "rebuild_mirrored",
    "repair_mirrored",
]

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class MirroredObject:
    """One log object of a source region, as a mirror fetched it."""

    #: the object's key (for the log and the report)
    key: str
    seq: int
    epoch: int
    fence: bool
    #: the object has the NULLS flag (what a block entry records)
    nulls: bool
    #: its blocks in the object's order: the index entry and the stored bytes,
    #: opened if the object was encrypted (checked: CRC, tag, frame)
    blocks: tuple[tuple[BlockIndex, bytes], ...]


@runtime_checkable
class MirrorSource(Protocol):
    """Where mirror entries are re-fetched from: the source regions' logs (the gateway's)."""

    #: the tailers keep fetched blocks as block entries (``mirror.keep_blocks``)
    keep_blocks: bool

    def mirrored(self, region: str, first_seq: int, last_seq: int) -> Sequence[MirroredObject]:
        """The objects ``first_seq..last_seq`` of ``region``'s log, in seq order. Blocking.
        Raises :class:`~edge_gateway.errors.Unavailable` when the bucket is out of reach,
        :class:`~edge_gateway.errors.CorruptData` when one is damaged or was collected
        by the source's GC."""
        ...


@dataclass(frozen=True, slots=True)
class SeqRange:
    """The source entries the lost mirror entries came from (:func:`mirror_range`)."""

    region: str
    first_seq: int
    last_seq: int
    #: where the reader stood before the damage (the epoch accepted, a resumed entry)
    before: SourceCoords


def _first_after(
    after: Sequence[atrest.AnyEntry], *, last: bool, limit: Mapping[Key, int] | None
) -> dict[Key, int]:
    """Where each partition goes on after the damage: its first entry after it, else (a
    sealed segment) where it stood at the next segment's start."""
    out: dict[Key, int] = {} if last else dict(limit or {})
    seen: set[Key] = set()
    for e in after:
        key = (e.topic, e.partition)
        if isinstance(e, atrest.BlockEntry):
            first = e.first_offset
        elif e.kind in (fentry.KIND_DATA, fentry.KIND_MIRROR) and e.count:
            first = e.base_offset
        else:
            continue
        if key not in seen:
            seen.add(key)
            out[key] = first
    return out


def _coords(e: atrest.AnyEntry) -> SourceCoords | None:
    return e.source if (isinstance(e, atrest.BlockEntry) or e.kind == fentry.KIND_MIRROR) else None


def mirror_range(
    buf: bytes,
    damage: DamagedEntry,
    resync: int,
    *,
    last: bool,
    next_checkpoint: Checkpoint | None,
) -> SeqRange | None:
    """The source region and seqs of the mirror entries lost at ``damage`` (the damaged
    bytes end at ``resync``), from the intact entries around them; None when no mirror
    partition lost offsets there (the damage holds home entries). Raises
    :class:`~edge_gateway.journal._repair.NotRebuilt` when the range cannot be bounded."""
    entries = _repair._walk(buf, fentry.SEGMENT_HEADER_SIZE, damage.pos)
    after = _repair._walk(buf, resync, len(buf))
    before: dict[str, SourceCoords] = {}
    if entries and isinstance(entries[0], fentry.Entry):
        first = entries[0]
        if first.kind == fentry.KIND_CHECKPOINT:
            before.update(Checkpoint.decode(first.payload, where="checkpoint").sources)
    for e in entries:
        c = _coords(e)
        if c is not None:
            before[c.region] = c
    later: dict[str, SourceCoords] = {}
    for e in after:
        c = _coords(e)
        if c is not None and c.region not in later:
            later[c.region] = c
    if next_checkpoint is not None:
        for region, c in next_checkpoint.sources.items():
            later.setdefault(region, c)
    # Entries of a source after the damage do not mean some were lost in it: only a
    # mirror partition whose offsets move across it (or one with no bound after it) does.
    # A source with no coordinates on one side cannot be bounded: if entries of it were
    # lost, the home rebuild refuses the range (an LSN without a batch).
    limit = None if next_checkpoint is None else next_checkpoint.next_offsets
    bound = _first_after(after, last=last, limit=limit)

    def lost_some(region: str) -> bool:
        mine = [
            k for k in damage.next_offsets.keys() | bound.keys() if k[0].startswith(region + ".")
        ]
        return not all(k in bound and bound[k] == damage.next_offsets.get(k, 0) for k in mine)

    # (Coordinates equal on both sides: the damage is inside one source object's entries.)
    moved = sorted(r for r in before.keys() & later.keys() if lost_some(r))
    if not moved:
        return None  # none lost: the damage holds home entries (or progress markers)
    if len(moved) > 1:
        raise _repair.NotRebuilt(
            f"the damaged range holds entries of {len(moved)} source regions ({', '.join(moved)}):"
            " their order is not known"
        )
    region = moved[0]
    b, a = before[region], later[region]
    first_seq = b.seq + 1 if b.end_of_object else b.seq
    return SeqRange(region, first_seq, a.seq, b)


def repair_mirrored(
    buf: bytes,
    damage: DamagedEntry,
    resync: int,
    source: object,
    *,
    last: bool,
    next_checkpoint: Checkpoint | None,
    end: tuple[int, int] | None = None,
) -> _repair.Rebuilt | None:
    """The lost mirror entries at ``damage``, re-fetched from ``source`` (if it is a
    :class:`MirrorSource`); None when no mirror entry was lost there (or ``source``
    does not read other regions' logs): the caller goes on as for a home range."""
    if not isinstance(source, MirrorSource):
        return None
    span = mirror_range(buf, damage, resync, last=last, next_checkpoint=next_checkpoint)
    if span is None:
        return None
    objects = source.mirrored(span.region, span.first_seq, span.last_seq)
    limit = None if next_checkpoint is None else dict(next_checkpoint.next_offsets)
    return rebuild_mirrored(
        buf,
        damage,
        resync,
        span,
        objects,
        keep_blocks=source.keep_blocks,
        last=last,
        limit=limit,
        end=end,
    )


def rebuild_mirrored(
    buf: bytes,
    damage: DamagedEntry,
    resync: int,
    span: SeqRange,
    objects: Sequence[MirroredObject],
    *,
    keep_blocks: bool,
    last: bool,
    limit: Mapping[Key, int] | None = None,
    end: tuple[int, int] | None = None,
) -> _repair.Rebuilt | None:
    """The entries of the damaged LSNs, appended again from the source objects ``objects``
    of ``span`` (module docstring); None when none of them is a mirror entry (home
    entries only: the caller rebuilds them from this region's log). ``last``, ``limit``
    and ``end`` as for :func:`~edge_gateway.journal._repair.rebuild`. Raises
    :class:`~edge_gateway.journal._repair.NotRebuilt` unless they give exactly the lost
    entries."""
    after = _repair._walk(buf, resync, len(buf))
    if after:
        lsn_first, lsn_end = damage.lsn, after[0].lsn
        append_time = after[0].append_time
    elif end is not None:
        lsn_first, lsn_end = damage.lsn, end[0]
        append_time = end[1]
    else:
        raise _repair.NotRebuilt("no intact entry follows the damage")
    before: dict[Key, int] = dict(damage.next_offsets)
    first_after = _first_after(after, last=last, limit=limit)
    # The mirrored topics: a topic of the source is subscribed if its mirror topic is
    # held here (a partition first seen inside the damage is refused by the LSN count).
    held = {t for t, _ in before.keys() | first_after.keys()}
    by_seq = {o.seq: o for o in objects}
    missing = [s for s in range(span.first_seq, span.last_seq + 1) if s not in by_seq]
    if missing:
        raise _repair.NotRebuilt(
            f"{span.region}'s log entries {missing[0]}..{missing[-1]} were not read"
        )
    epoch = span.before.epoch
    out: list[bytes] = []
    got: dict[Key, list[tuple[int, int]]] = {}
    used: list[str] = []
    lsn = lsn_first
    for seq in range(span.first_seq, span.last_seq + 1):
        obj = by_seq[seq]
        if obj.epoch < epoch:
            continue  # a zombie writer's entry: skipped (a marker, if any, is refused below)
        epoch = max(epoch, obj.epoch)  # a fence raises the epoch accepted too
        if obj.fence:
            continue
        # this object's lost appends, as the tailer made them: (local key, block, stored bytes)
        planned: list[tuple[Key, BlockIndex, bytes]] = []
        straddles = False
        for index, stored in obj.blocks:
            local = mirror_topic(span.region, index.topic)
            if local not in held:
                continue
            key = (local, index.partition)
            start, stop = before.get(key, 0), first_after.get(key)
            if index.last_offset < start or (stop is not None and index.first_offset >= stop):
                continue  # an intact entry's, before or after the damage
            if index.first_offset < start or (stop is not None and index.last_offset >= stop):
                straddles = True
            planned.append((key, index, stored))
        if not planned:
            continue
        pieces = _appends(obj, planned, before, first_after, keep_blocks and not straddles)
        used.append(obj.key)
        ends = _ends_object(obj, span.region, held, planned, first_after)
        for k, piece in enumerate(pieces):
            if lsn >= lsn_end:
                raise _repair.NotRebuilt(
                    f"{obj.key}: more lost entries than LSNs {lsn_first}..{lsn_end - 1}"
                )
            coords = SourceCoords(span.region, seq, epoch, ends and k == len(pieces) - 1)
            out.append(piece.encode(lsn, append_time, coords, obj.nulls))
            got.setdefault(piece.key, []).append((piece.first, piece.first + piece.count))
            lsn += 1
    if not got:
        return None  # no mirror entry among the lost ones: a home range
    if lsn != lsn_end:
        raise _repair.NotRebuilt(
            f"LSNs {lsn}..{lsn_end - 1} have no entry in {span.region}'s log entries "
            f"{span.first_seq}..{span.last_seq} (progress markers or home entries among them)"
        )
    ranges = _repair._check_offsets(got, before, first_after)
    data = b"".join(out)
    _repair._check_entries(data, lsn_first, lsn_end)
    return _repair.Rebuilt(
        lsn_first,
        lsn_end,
        resync,
        data,
        sum(len(v) for v in got.values()),
        tuple(used),
        ranges,
    )


@dataclass(frozen=True, slots=True)
class _Piece:
    """One lost entry of an object: a block kept whole (``index``), or one batch."""

    key: Key
    first: int
    count: int
    #: the block's index entry (a block entry), None for a batch
    index: BlockIndex | None
    #: the block's stored bytes, or the batch
    payload: bytes

    def encode(self, lsn: int, append_time: int, source: SourceCoords, nulls: bool) -> bytes:
        if self.index is not None:
            return atrest.encode_block_entry(
                lsn=lsn,
                topic=self.key[0],
                partition=self.key[1],
                append_time=append_time,
                source=source,
                index=self.index,
                stored=self.payload,
                nulls=nulls,
            )
        return fentry.encode_entry(
            lsn=lsn,
            kind=fentry.KIND_MIRROR,
            topic=self.key[0].encode(),
            partition=self.key[1],
            base_offset=self.first,
            count=self.count,
            append_time=append_time,
            payload=self.payload,
            source=source,
        )


def _ends_object(
    obj: MirroredObject,
    region: str,
    held: set[str],
    planned: Sequence[tuple[Key, BlockIndex, bytes]],
    first_after: Mapping[Key, int],
) -> bool:
    """Whether the object's last append (END_OF_SOURCE_OBJECT) is among the lost entries:
    its last block of a mirrored topic is the last planned one, and ends inside the
    damaged range (not in an intact entry after it)."""
    last_held = [i for i, _ in obj.blocks if mirror_topic(region, i.topic) in held][-1]
    key, index, _ = planned[-1]
    stop = first_after.get(key)
    return index is last_held and (stop is None or index.last_offset < stop)


def _appends(
    obj: MirroredObject,
    planned: Sequence[tuple[Key, BlockIndex, bytes]],
    before: Mapping[Key, int],
    first_after: Mapping[Key, int],
    as_blocks: bool,
) -> list[_Piece]:
    """The lost entries of one object, in the order the tailer appended them."""
    out: list[_Piece] = []
    for key, index, stored in planned:
        if as_blocks:
            out.append(_Piece(key, index.first_offset, index.record_count, index, stored))
            continue
        opened = atrest.check_stored_block(index, stored, where=obj.key)
        raw = logobject.decode_block(opened, stored, where=obj.key)
        start, stop = before.get(key, 0), first_after.get(key)
        for batch in logobject.iter_block_batches(index, raw, where=obj.key):
            if batch.next_offset <= start or (stop is not None and batch.base_offset >= stop):
                continue
            if batch.base_offset < start or (stop is not None and batch.next_offset > stop):
                raise _repair.NotRebuilt(
                    f"{obj.key}: the batch at {key[0]}/{key[1]} offset {batch.base_offset} "
                    "straddles the damaged range's edge"
                )
            out.append(_Piece(key, batch.base_offset, batch.count, None, bytes(batch.raw)))
    return out
