"""Repair from the bucket: a damaged range that was shipped is rebuilt (issue 45, item 3).

When an open's scan meets damage in the middle of a segment
(:class:`~edge_gateway.journal._recovery.DamagedEntry`) and the bucket has the
lost LSNs (the main lane's ``shipper.json`` confirmed them), the journal asks
a :class:`RepairSource` -- the gateway's, which reads the region's log
objects (``edge_gateway/bucket_repair.py``); the journal imports no bucket --
for the objects whose LSN range meets the damaged one. :func:`rebuild` (pure:
no I/O) makes the entries again, and :func:`repair_damage`:

1. copies the damaged segment, as it is, to ``<data_dir>/quarantine/``
   (``<lane>-<segment>-lsn<first LSN>.damaged``), fsynced;
2. appends one record of the repair to ``repaired.log`` in the journal
   directory (the line format of ``lost.log``, ``v: 1``), fsynced, and writes
   ``quarantine/<time>-<lane>-lsn<first>-report.json`` (``"repaired": true``);
3. rewrites the segment (temporary file, fsync, rename, directory fsync) with
   the rebuilt entries where the damaged bytes were; every entry before and
   after them is kept byte for byte.

A kill at any step is safe: before the rename the segment is still damaged
and the next open repairs it again (``repaired.log`` gets no second record of
the same range); after it the segment is sound. Fail points
``repair.copied`` and ``repair.recorded`` stop between the steps.

**What is rebuilt** (docs/journal.md, "Repair from the bucket"). A log object
holds each partition's record batches exactly as the journal stored them,
one batch per DATA entry, and each lane's LSN range; not the entries'
headers. So a rebuilt entry has the batch byte for byte (offsets, timestamps,
keys, values, headers, nulls: what a reader gets is identical), its topic,
partition, base offset and count, and an LSN in the damaged range inside the
LSN range of the object that shipped it. Not kept, because the bucket does
not have them:

* which of the object's LSNs each batch had when an object ships several
  partitions' entries in the damaged range: they take the object's LSNs in
  (topic, partition, offset) order;
* the append time: the first intact entry's after the damage (or, if the
  object was built earlier, the object's creation time): never earlier than
  the true one, so retention keeps a rebuilt entry at least as long;
* an idempotent producer's stamp on the entry (``FLAG_PRODUCER``): rebuilt
  entries carry none (a retry of that very produce after the restart is not
  recognised as a duplicate by that stamp).

A rebuild is refused -- and the range quarantined as before (``_quarantine.py``)
-- when the objects do not give exactly the lost offsets: a batch that
straddles the damaged range's edge, offsets missing or not continuous with
the intact neighbours, more batches than LSNs or an LSN without a batch (an
earlier loss's checkpoint: its offsets are gap markers in the bucket, not
batches; or a mirror entry: its records are the source region's). Every LSN
of the range is a rebuilt DATA entry; home entries between mirror entries are
rebuilt. Lost mirror entries are re-fetched from their source region's log
instead (``_mirror_repair.py``, tried first by :func:`repair_damage` when the
source reads other regions' logs).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from edge_gateway._crc import crc32c
from edge_gateway.durable import replace_file
from edge_gateway.errors import CorruptData, EdgeGatewayError
from edge_gateway.failpoints import fail_point
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.batch import read_header
from edge_gateway.format.entry import Checkpoint
from edge_gateway.journal import _fs, _mirror_repair
from edge_gateway.journal._dropped import append_records, load_records
from edge_gateway.journal._lane_repair import bucket_may_hold, lane_partitions
from edge_gateway.journal._quarantine import QUARANTINE_DIR
from edge_gateway.journal._recovery import DamagedEntry, next_valid_entry
from edge_gateway.journal._segment import first_entry_after

__all__ = [
    "REPAIRED_NAME",
    "NotRebuilt",
    "RepairSource",
    "Repaired",
    "RepairedRange",
    "ShippedObject",
    "load_repairs",
    "rebuild",
    "repair_damage",
]

log = logging.getLogger("edgegw.journal")

REPAIRED_NAME: Final = "repaired.log"
VERSION: Final = 1

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ShippedObject:
    """What one log object ships of a lane: its LSN range and each partition's batches."""

    #: the object's bucket key (for the log and the report)
    key: str
    #: the lane's LSNs ``first_lsn..last_lsn`` the object ships
    first_lsn: int
    last_lsn: int
    #: the writer's clock when the object was built (ms)
    created_ms: int
    #: per partition, its batches in offset order: ``(base offset, batch bytes)``
    batches: dict[Key, list[tuple[int, bytes]]]
    #: the object ships other lanes' LSNs too (some partitions are not this lane's)
    other_lanes: bool = False
    #: the lane whose LSNs ``first_lsn..last_lsn`` are (its id in the lane tables; 0:
    #: the main lane). Of another lane's object only the partitions with an intact
    #: entry in the segment are taken (``_lane_repair.py``)
    lane: int = 0


class RepairSource(Protocol):
    """Where a lane's shipped entries are read back from (the gateway gives one)."""

    def shipped(self, first_lsn: int, last_lsn: int) -> Sequence[ShippedObject]:
        """The objects whose LSN range of the lane meets ``first_lsn..last_lsn``, in LSN
        order. Blocking (the journal opens in a worker thread). Raises
        :class:`~edge_gateway.errors.Unavailable` when the bucket is out of reach,
        :class:`~edge_gateway.errors.CorruptData` when an object is damaged."""
        ...


class NotRebuilt(Exception):
    """The objects do not give exactly the lost entries; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RepairedRange:
    """One partition's offsets ``first..last`` (inclusive) put back."""

    topic: str
    partition: int
    first: int
    last: int

    @property
    def records(self) -> int:
        return self.last - self.first + 1

    def to_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "first_offset": self.first,
            "last_offset": self.last,
            "records": self.records,
        }


@dataclass(frozen=True, slots=True)
class Repaired:
    """A damaged range of one segment rebuilt from the bucket (one line of ``repaired.log``)."""

    segment: int
    lsn_first: int
    lsn_last: int
    #: the damaged bytes ``[byte_first, byte_end)`` of the segment as it was
    byte_first: int
    byte_end: int
    time_ms: int
    reason: str
    #: the damaged segment's copy, relative to the data directory
    copy: str
    #: DATA entries rebuilt (every LSN of the range)
    entries: int
    #: the log objects read
    objects: tuple[str, ...]
    ranges: tuple[RepairedRange, ...]

    @property
    def records(self) -> int:
        return sum(r.records for r in self.ranges)

    def to_json(self) -> dict[str, object]:
        return {
            "v": VERSION,
            "segment": self.segment,
            "lsn_first": self.lsn_first,
            "lsn_last": self.lsn_last,
            "byte_first": self.byte_first,
            "byte_end": self.byte_end,
            "time_ms": self.time_ms,
            "reason": self.reason,
            "copy": self.copy,
            "entries": self.entries,
            "objects": list(self.objects),
            "ranges": [r.to_json() for r in self.ranges],
        }


def _decode(body: bytes, where: str) -> Repaired:
    try:
        doc = json.loads(body)
        if doc.get("v") != VERSION:
            raise CorruptData(
                f"unsupported repaired.log record version {doc.get('v')!r}", where=where
            )
        return Repaired(
            int(doc["segment"]),
            int(doc["lsn_first"]),
            int(doc["lsn_last"]),
            int(doc["byte_first"]),
            int(doc["byte_end"]),
            int(doc["time_ms"]),
            str(doc["reason"]),
            str(doc["copy"]),
            int(doc["entries"]),
            tuple(str(k) for k in doc["objects"]),
            tuple(
                RepairedRange(
                    str(r["topic"]),
                    int(r["partition"]),
                    int(r["first_offset"]),
                    int(r["last_offset"]),
                )
                for r in doc["ranges"]
            ),
        )
    except CorruptData:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptData(f"bad repaired.log record: {exc}", where=where) from None


def load_repairs(directory: Path) -> list[Repaired]:
    """The records of ``directory/repaired.log``, oldest first (a torn last line is cut)."""
    return load_records(directory / REPAIRED_NAME, _decode)


# --------------------------------------------------------------------------
# the rebuild: no I/O


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """:func:`rebuild`'s result: the entries' bytes for LSNs ``lsn_first..lsn_end - 1``."""

    lsn_first: int
    lsn_end: int
    #: where the damaged bytes end (the first intact entry after them)
    resync: int
    data: bytes
    entries: int
    objects: tuple[str, ...]
    ranges: tuple[RepairedRange, ...]


def _walk(buf: bytes, pos: int, end: int) -> list[atrest.AnyEntry]:
    """The entries that decode from ``pos`` on, up to ``end`` or the first that does not."""
    out = []
    while pos < end and not fentry.is_zero_tail(buf, pos):
        try:
            e = atrest.decode_any_entry(buf, pos)
        except CorruptData:
            break
        out.append(e)
        pos += e.length
    return out


def _is_mirror(e: atrest.AnyEntry) -> bool:
    return isinstance(e, atrest.BlockEntry) or e.kind == fentry.KIND_MIRROR


def rebuild(
    buf: bytes,
    damage: DamagedEntry,
    objects: Sequence[ShippedObject],
    *,
    last: bool,
    limit: Mapping[Key, int] | None = None,
    end: tuple[int, int] | None = None,
) -> Rebuilt:
    """The entries of the damaged LSNs of segment bytes ``buf``, made again from ``objects``.

    ``damage`` is the scan's finding; ``last``: the segment is the journal's
    last (no later segment holds entries of its partitions). ``limit``, for a
    sealed segment: where each partition stood at the next segment's start (its
    checkpoint), so the end of a partition with no entry after the damage is
    known. ``end``, for a sealed segment whose LSN range is known (the live
    repair's): ``(its end LSN, its last append time)``, so that damage that
    runs to the segment's end is rebuilt too (with ``limit``). Raises
    :class:`NotRebuilt` unless the objects give exactly the lost offsets.
    """
    resync = next_valid_entry(buf, damage.pos, damage.lsn)
    if resync is None and end is not None and limit is not None and not last:
        resync = len(buf)  # the damage runs to the end: the next segment bounds it
    if resync is None:
        raise NotRebuilt("no intact entry follows the damage")
    if damage.lsn == fentry.decode_segment_header(buf, where="segment"):
        # The segment's first entry is its checkpoint (offsets, producers), never shipped.
        raise NotRebuilt("the damage takes the segment's checkpoint")
    header_end = fentry.SEGMENT_HEADER_SIZE
    before_entries = _walk(buf, header_end, damage.pos)
    after_entries = _walk(buf, resync, len(buf))
    # A mirror entry in the damaged range has no batch in this region's objects (its
    # records are the source's: _mirror_repair.py): its LSN is left without one, and
    # the range is refused below. Mirror partitions are never taken from this
    # region's objects.
    mirrored = {(e.topic, e.partition) for e in (*before_entries, *after_entries) if _is_mirror(e)}
    own = lane_partitions((*before_entries, *after_entries))
    if after_entries:
        lsn_first, lsn_end = damage.lsn, after_entries[0].lsn
        seg_end = after_entries[-1].lsn + 1
        append_time = after_entries[0].append_time
    elif end is not None:
        lsn_first, lsn_end = damage.lsn, end[0]
        seg_end = end[0]
        append_time = end[1]  # the segment's last: never earlier than a lost entry's
    else:
        raise NotRebuilt("no intact entry follows the damage")
    before: dict[Key, int] = dict(damage.next_offsets)
    # Where each partition goes on after the damage: its first entry after it, else
    # (a sealed segment) where it stood at the next segment's start.
    first_after: dict[Key, int] = {} if last else dict(limit or {})
    seen_after: set[Key] = set()
    for e in after_entries:
        if isinstance(e, fentry.Entry) and e.count:
            key = (e.topic, e.partition)
            if key not in seen_after:
                seen_after.add(key)
                first_after[key] = e.base_offset
    # The lost batches: those whose offsets lie between where each partition stood
    # before the damage and where it goes on after it.
    chosen: list[tuple[ShippedObject, list[tuple[Key, int, bytes]]]] = []
    for obj in sorted(objects, key=lambda o: o.first_lsn):
        lo, hi = max(obj.first_lsn, lsn_first), min(obj.last_lsn, lsn_end - 1)
        if lo > hi:
            continue
        picked: list[tuple[Key, int, bytes]] = []
        for key in sorted(obj.batches):
            if obj.other_lanes and key not in before and key not in first_after:
                continue  # another lane's partition, as far as this segment tells
            if obj.lane and key not in own and first_after.get(key, -1) <= before.get(key, 0):
                # Neither an intact entry nor the next checkpoint says the partition
                # moved on in this segment: a lane's checkpoint names other lanes'
                # partitions too (their offsets stand still here).
                continue
            if key in mirrored:
                raise NotRebuilt(f"{obj.key} ships {key[0]}/{key[1]}, a mirror partition here")
            start, stop = before.get(key, 0), first_after.get(key)
            for base, batch in obj.batches[key]:
                count = read_header(batch, where=obj.key).count
                if base + count <= start or (stop is not None and base >= stop):
                    continue  # an intact entry's, before or after the damage
                if base < start or (stop is not None and base + count > stop):
                    raise NotRebuilt(
                        f"{obj.key}: the batch at {key[0]}/{key[1]} offset {base} straddles the "
                        "damaged range's edge"
                    )
                if stop is None and not last and obj.last_lsn >= seg_end:
                    raise NotRebuilt(
                        f"{obj.key} ships LSNs past the segment, and {key[0]}/{key[1]} has no "
                        "entry after the damage to bound its lost offsets"
                    )
                picked.append((key, base, batch))
        chosen.append((obj, picked))
    out: list[bytes] = []
    lsn = lsn_first
    got: dict[Key, list[tuple[int, int]]] = {}

    def fill(until: int) -> None:
        # A home segment's entries in the middle are DATA entries (one batch each);
        # a checkpoint there stands for an earlier loss (its offsets are not in the
        # bucket's objects, only its gap markers): such a range is not rebuilt.
        if lsn < until:
            raise NotRebuilt(
                f"LSNs {lsn}..{until - 1} have no batch in the objects (an earlier loss's "
                "checkpoints, or entries the bucket does not hold)"
            )

    used: list[str] = []
    for obj, picked in chosen:
        if not picked:
            continue
        used.append(obj.key)
        fill(max(lsn, obj.first_lsn))
        hi = min(obj.last_lsn, lsn_end - 1)
        when = min(append_time, obj.created_ms) if obj.created_ms > 0 else append_time
        for key, base, batch in picked:
            if lsn > hi:
                raise NotRebuilt(
                    f"{obj.key} holds more lost batches than LSNs {max(lsn_first, obj.first_lsn)}"
                    f"..{hi}"
                )
            count = read_header(batch, where=obj.key).count
            out.append(
                fentry.encode_entry(
                    lsn=lsn,
                    kind=fentry.KIND_DATA,
                    topic=key[0].encode(),
                    partition=key[1],
                    base_offset=base,
                    count=count,
                    append_time=when,
                    payload=batch,
                )
            )
            got.setdefault(key, []).append((base, base + count))
            lsn += 1
    fill(lsn_end)
    ranges = _check_offsets(got, before, first_after)
    data = b"".join(out)
    _check_entries(data, lsn_first, lsn_end)
    return Rebuilt(
        lsn_first, lsn_end, resync, data, sum(len(v) for v in got.values()), tuple(used), ranges
    )


def _check_offsets(
    got: dict[Key, list[tuple[int, int]]], before: dict[Key, int], first_after: dict[Key, int]
) -> tuple[RepairedRange, ...]:
    """Each partition's rebuilt offsets continue the entry before and reach the one after."""
    ranges = []
    for key in sorted(got.keys() | first_after.keys()):
        start = before.get(key, 0)
        spans = sorted(got.get(key, []))
        at = start
        for first, end in spans:
            if first != at:
                raise NotRebuilt(
                    f"{key[0]}/{key[1]}: offsets {at}..{first - 1} are in no object"
                    if first > at
                    else f"{key[0]}/{key[1]}: offset {first} twice"
                )
            at = end
        if key in first_after and at != first_after[key]:
            raise NotRebuilt(
                f"{key[0]}/{key[1]}: the objects end at offset {at}, the entry after the "
                f"damage starts at {first_after[key]}"
            )
        if spans:
            ranges.append(RepairedRange(key[0], key[1], start, at - 1))
    return tuple(ranges)


def _check_entries(data: bytes, lsn_first: int, lsn_end: int) -> None:
    """Decode the rebuilt entries back: CRCs and the LSN sequence."""
    pos, lsn = 0, lsn_first
    while pos < len(data):
        e = atrest.decode_any_entry(data, pos, where="rebuilt entries")
        if e.lsn != lsn:
            raise NotRebuilt(f"rebuilt entry LSN {e.lsn} where {lsn} comes next")
        pos += e.length
        lsn += 1
    if lsn != lsn_end:
        raise NotRebuilt(f"rebuilt LSNs end at {lsn - 1}, the damaged range at {lsn_end - 1}")


# --------------------------------------------------------------------------
# the repair


def next_checkpoint(path: Path, base: int) -> Checkpoint | None:
    """The checkpoint of the segment after ``path`` (where its partitions and sources
    stood); None if there is none or it does not read."""
    try:
        found = first_entry_after(path, base)
        if found is None:
            return None
        nxt, first = found
        if not isinstance(first, fentry.Entry) or first.kind != fentry.KIND_CHECKPOINT:
            return None
        return Checkpoint.decode(first.payload, where=str(nxt))
    except (OSError, CorruptData):
        return None


def _replace(path: Path, data: bytes) -> None:
    replace_file(path, data, ops=_fs.ops)


def repair_damage(
    path: Path,
    base: int,
    damage: DamagedEntry,
    *,
    last: bool,
    source: RepairSource | None,
    known: list[Repaired],
    now_ms: int | None = None,
    work: Path | None = None,
    end: tuple[int, int] | None = None,
) -> Repaired | None:
    """Rebuild the damaged range at ``damage.pos`` of segment ``path`` from ``source``.

    ``work``: the file that holds the segment's entry log and is rewritten
    (a live repair's copy beside the segment, ``_live_repair.py``); the
    segment's own file by default. Either way ``path`` names the segment (its
    lane, the segment after it, the copy's name and the report). ``end``: see
    :func:`rebuild` (a sealed segment whose damage may run to its end).

    None (nothing written) when there is no source, the bucket does not have
    the range (``shipper.json``), it is out of reach, or :func:`rebuild`
    refuses: the caller quarantines the range then. ``known`` is
    ``repaired.log``'s records (a repair recorded by a run that died before
    its rewrite is not recorded twice).
    """
    if source is None:
        return None
    target = path if work is None else work
    buf = target.read_bytes()
    resync = next_valid_entry(buf, damage.pos, damage.lsn)
    if resync is None and end is not None and not last:
        resync, lsn_end = len(buf), end[0]
    elif resync is None:
        return None
    else:
        lsn_end = atrest.decode_any_entry(buf, resync).lsn
    shipped = bucket_may_hold(path.parent)
    try:
        nxt = None if last else next_checkpoint(path, base)
        limit = None if nxt is None else dict(nxt.next_offsets)
        # Mirror entries: re-fetched from the source region's log (_mirror_repair.py).
        rebuilt = _mirror_repair.repair_mirrored(
            buf, damage, resync, source, last=last, next_checkpoint=nxt, end=end
        )
        if rebuilt is None:
            if shipped is None or shipped < lsn_end - 1:
                return None  # not (known to be) in the bucket: quarantined, reported lost
            objects = source.shipped(damage.lsn, lsn_end - 1)
            rebuilt = rebuild(buf, damage, objects, last=last, limit=limit, end=end)
    except (NotRebuilt, EdgeGatewayError) as exc:
        log.warning(
            "journal: damaged entries LSN %d-%d in %s are in the bucket but were not "
            "rebuilt (%s): quarantined instead",
            damage.lsn,
            lsn_end - 1,
            path,
            exc.reason if isinstance(exc, NotRebuilt | CorruptData) else exc,
        )
        return None
    when = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    qdir = path.parent.parent / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    lane_dir = path.parent.name
    copy_name = f"{lane_dir}-{path.stem}-lsn{damage.lsn}.damaged"
    done = Repaired(
        base,
        damage.lsn,
        lsn_end - 1,
        damage.pos,
        resync,
        when,
        damage.detail,
        f"{QUARANTINE_DIR}/{copy_name}",
        rebuilt.entries,
        rebuilt.objects,
        rebuilt.ranges,
    )
    # 1. the damaged bytes, as they are
    _replace(qdir / copy_name, buf)
    fail_point("repair.copied")
    # 2. the record (once) and the operator's report
    if not any(k.segment == base and k.lsn_first == damage.lsn for k in known):
        body = json.dumps(done.to_json(), separators=(",", ":")).encode()
        append_records(path.parent, REPAIRED_NAME, [b"%08x " % crc32c(body) + body + b"\n"])
        known.append(done)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when / 1000))
    report = {
        **done.to_json(),
        "repaired": True,
        "journal": str(path.parent),
        "file": str(path),
        "damaged_bytes": resync - damage.pos,
        "records_repaired": done.records,
    }
    _replace(
        qdir / f"{stamp}-{lane_dir}-lsn{damage.lsn}-report.json",
        json.dumps(report, indent=2).encode() + b"\n",
    )
    fail_point("repair.recorded")
    # 3. the segment with the rebuilt entries in place of the damaged bytes
    _replace(target, buf[: damage.pos] + rebuilt.data + buf[resync:])
    log.warning(
        "journal: damaged entries in %s (bytes %d-%d: %s): LSN %d-%d repaired from the "
        "bucket (%d entries, %s; objects %s); the damaged copy is %s",
        path,
        damage.pos,
        resync - 1,
        damage.detail,
        damage.lsn,
        lsn_end - 1,
        rebuilt.entries,
        ", ".join(f"{r.topic}/{r.partition} {r.first}-{r.last}" for r in rebuilt.ranges)
        or "no records",
        ", ".join(rebuilt.objects) or "none",
        done.copy,
    )
    return done
