"""Quarantine: damage in the middle of a segment is moved aside and named (issue 45, item 4).

When an open's scan meets a bad entry with a valid entry after it (damage,
not a torn tail: :class:`~edge_gateway.journal._recovery.DamagedEntry`), the
journal does not refuse to start. :func:`quarantine_damage`:

1. copies the damaged segment, as it is, to ``<data_dir>/quarantine/``
   (``<segment>-lsn<first lost LSN>.damaged``), fsynced;
2. appends one record of the loss to ``lost.log`` in the journal directory
   (the line format of ``dropped.log``: ``<crc32c hex> <json>``, ``v: 1``),
   fsynced, and writes ``<data_dir>/quarantine/<time>-report.json`` beside
   the copy for an operator to hand on;
3. rewrites the segment (temporary file, fsync, rename, directory fsync):
   every intact entry before and after the damage is kept byte for byte, and
   each LSN whose entry was lost is held by a *checkpoint* entry carrying
   where each partition continues after the loss. LSNs stay contiguous and
   are never reused; the partitions' offsets skip the lost records, so no
   offset is ever handed out twice (readers and the shipper skip
   checkpoints: a reader of the partition sees its offsets jump).

Where the lost records' offsets are known (a partition has an entry after
the damage in the same segment), the record says them exactly. For a
partition without one, the record gives the offset where it stood before
the damage and, for the last (active) segment, moves the partition on by
the most records the lost bytes could have held (12 bytes a record at
least: ``docs/format.md``), marked ``"exact": false``: never a silent guess.

A kill at any step is safe: before the rename the segment is still damaged
and the next open does it again (``lost.log`` gets no second record of the
same loss); after it, the segment is sound and the record is durable.

Re-sync after the damage uses the recovery's :func:`next_valid_entry`
(entry headers carry a CRC).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from edge_gateway._crc import crc32c
from edge_gateway.durable import replace_file
from edge_gateway.errors import CorruptData
from edge_gateway.failpoints import fail_point
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.format.entry import Checkpoint
from edge_gateway.journal import _fs
from edge_gateway.journal._dropped import append_records, load_records
from edge_gateway.journal._lane_repair import bucket_may_hold, shipped_lsn
from edge_gateway.journal._recovery import DamagedEntry, next_valid_entry

__all__ = [
    "LOST_NAME",
    "QUARANTINE_DIR",
    "LostRange",
    "Loss",
    "load_losses",
    "quarantine_damage",
    "shipped_lsn",
]

log = logging.getLogger("edgegw.journal")

LOST_NAME: Final = "lost.log"
QUARANTINE_DIR: Final = "quarantine"
VERSION: Final = 1
#: The fewest bytes a record takes in a batch (three 4-byte columns): the lost
#: bytes held at most ``bytes // 12`` records.
MIN_RECORD_BYTES: Final = 12

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class LostRange:
    """One partition's lost offsets ``first..last`` (inclusive).

    ``exact``: an entry after the damage says where the partition continues;
    otherwise ``last`` is the most the lost bytes could have held (or ``first - 1``
    if nothing is known to be lost: the partition stood there before the damage).
    """

    topic: str
    partition: int
    first: int
    last: int
    exact: bool

    @property
    def records(self) -> int:
        return max(0, self.last - self.first + 1)

    def to_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "first_offset": self.first,
            "last_offset": self.last,
            "records": self.records,
            "exact": self.exact,
        }


@dataclass(frozen=True, slots=True)
class Loss:
    """Entries of one segment lost to damage (one line of ``lost.log``)."""

    segment: int
    lsn_first: int
    lsn_last: int
    #: the damaged bytes ``[byte_first, byte_end)`` of the segment as it was
    byte_first: int
    byte_end: int
    time_ms: int
    reason: str
    #: the bucket has the lost records: the shipper had confirmed these LSNs, or they
    #: are a mirror topic's (its source's log has them), but they were not rebuilt
    #: (``_repair.py``: the bucket out of reach, or the objects refused); for a lane
    #: other than the main one, its shipper had handed them to a create (its ``sent``
    #: mark): the bucket may hold them, the live repair asks it. None when
    #: shipper.json could not tell
    repairable: bool | None
    #: the damaged segment's copy, relative to the data directory
    copy: str
    ranges: tuple[LostRange, ...]

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
            "repairable": self.repairable,
            "copy": self.copy,
            "ranges": [r.to_json() for r in self.ranges],
        }


def _decode(body: bytes, where: str) -> Loss:
    try:
        doc = json.loads(body)
        if doc.get("v") != VERSION:
            raise CorruptData(f"unsupported lost.log record version {doc.get('v')!r}", where=where)
        rep = doc["repairable"]
        return Loss(
            int(doc["segment"]),
            int(doc["lsn_first"]),
            int(doc["lsn_last"]),
            int(doc["byte_first"]),
            int(doc["byte_end"]),
            int(doc["time_ms"]),
            str(doc["reason"]),
            None if rep is None else bool(rep),
            str(doc["copy"]),
            tuple(
                LostRange(
                    str(r["topic"]),
                    int(r["partition"]),
                    int(r["first_offset"]),
                    int(r["last_offset"]),
                    bool(r["exact"]),
                )
                for r in doc["ranges"]
            ),
        )
    except CorruptData:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptData(f"bad lost.log record: {exc}", where=where) from None


def load_losses(directory: Path) -> list[Loss]:
    """The records of ``directory/lost.log``, oldest first (a torn last line is cut)."""
    return load_records(directory / LOST_NAME, _decode)


def _next_offsets(e: atrest.AnyEntry) -> tuple[Key, int, int] | None:
    """(partition, first offset, next offset) of an entry that holds records."""
    if isinstance(e, atrest.BlockEntry):
        return (e.topic, e.partition), e.first_offset, e.next_offset
    if e.count:
        return (e.topic, e.partition), e.base_offset, e.next_offset
    return None


def _walk(buf: bytes, pos: int, end: int) -> list[tuple[int, atrest.AnyEntry]]:
    """The entries that decode from ``pos`` on, up to ``end`` or the first that does not."""
    out = []
    while pos < end and not fentry.is_zero_tail(buf, pos):
        try:
            e = atrest.decode_any_entry(buf, pos)
        except CorruptData:
            break
        out.append((pos, e))
        pos += e.length
    return out


def record_loss(path: Path, loss: Loss, known: list[Loss], damaged: bytes, lost_bytes: int) -> None:
    """Steps 1 and 2 of quarantining ``loss`` in segment ``path``: the ``damaged`` bytes
    copied to ``loss.copy``, the loss recorded in ``lost.log`` (once: ``known`` holds
    those recorded) and the operator's report written beside the copy."""
    qdir = path.parent.parent / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    # 1. the damaged bytes, as they are
    _replace(path.parent.parent / loss.copy, damaged)
    fail_point("quarantine.copied")
    # 2. the record (once) and the operator's report
    if not any(k.segment == loss.segment and k.lsn_first == loss.lsn_first for k in known):
        body = json.dumps(loss.to_json(), separators=(",", ":")).encode()
        append_records(path.parent, LOST_NAME, [b"%08x " % crc32c(body) + body + b"\n"])
        known.append(loss)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(loss.time_ms / 1000))
    report = {
        **loss.to_json(),
        "journal": str(path.parent),
        "file": str(path),
        "lost_bytes": lost_bytes,
        "records_lost": loss.records,
    }
    _replace(
        qdir / f"{stamp}-{path.parent.name}-lsn{loss.lsn_first}-report.json",
        json.dumps(report, indent=2).encode() + b"\n",
    )
    fail_point("quarantine.recorded")


def lost_checkpoints(
    lsn_first: int, lsn_end: int, skip_to: dict[Key, int], append_time: int
) -> list[bytes]:
    """The entries that hold the lost LSNs ``[lsn_first, lsn_end)``: one checkpoint each,
    the first moving the partitions past the lost offsets (``skip_to``)."""
    return [
        fentry.encode_checkpoint_entry(
            lsn=lsn,
            append_time=append_time,
            payload=Checkpoint(skip_to if lsn == lsn_first else {}, {}).encode(),
        )
        for lsn in range(lsn_first, lsn_end)
    ]


def _replace(path: Path, data: bytes) -> None:
    """``data`` to ``path`` whole, through the journal's fault-injection seam."""
    replace_file(path, data, ops=_fs.ops)


def quarantine_damage(
    path: Path,
    base: int,
    damage: DamagedEntry,
    *,
    last: bool,
    known: list[Loss],
    now_ms: int | None = None,
) -> Loss:
    """Move the damage at ``damage.pos`` of segment ``path`` aside; keep every intact entry.

    The copy and the report go to ``quarantine/`` in the data directory
    (the journal directory's parent); whether the bucket has the lost LSNs,
    to the main lane's ``shipper.json`` (another lane: its ``sent`` mark there,
    ``_lane_repair.bucket_may_hold``). ``known`` is
    ``lost.log``'s records: a loss
    recorded by a run that died before its rewrite is not recorded twice.
    Returns the loss; raises ``damage`` itself when no valid entry follows.
    """
    buf = path.read_bytes()
    resync = next_valid_entry(buf, damage.pos, damage.lsn)
    if resync is None:
        raise damage
    after = atrest.decode_any_entry(buf, resync)
    lsn_first, lsn_end = damage.lsn, after.lsn
    # Where each partition stood before the damage: the scan's state there (the
    # segment's checkpoint, then its entries and earlier losses' checkpoints).
    before: dict[Key, int] = dict(damage.next_offsets)
    # Where those after it continue: each partition's first entry after the damage.
    first_after: dict[Key, int] = {}
    mirrored: set[Key] = set()
    for _, e in _walk(buf, resync, len(buf)):
        got = _next_offsets(e)
        if got is not None:
            first_after.setdefault(got[0], got[1])
            if isinstance(e, atrest.BlockEntry) or e.kind == fentry.KIND_MIRROR:
                mirrored.add(got[0])
    lost_bytes = resync - damage.pos
    bound = lost_bytes // MIN_RECORD_BYTES
    ranges: list[LostRange] = []
    skip_to: dict[Key, int] = {}
    for key in sorted(before.keys() | first_after.keys()):
        start = before.get(key, 0)
        if key in first_after:
            if first_after[key] > start:
                ranges.append(LostRange(key[0], key[1], start, first_after[key] - 1, True))
            skip_to[key] = max(start, first_after[key])
        elif lsn_end > lsn_first:
            # Nothing after the damage says where it continues: at most ``bound``
            # records were lost. The last segment moves the partition past them
            # (a sealed one's successor's checkpoint already says where it went on).
            ranges.append(LostRange(key[0], key[1], start, start + bound - 1, False))
            if last:
                skip_to[key] = start + bound
    # the main lane: what the bucket confirmed; another lane: what its shipper handed
    # to a create (the bucket holds nothing of it above; at or below, the live
    # repair asks the bucket, which rebuilds only what its objects give whole)
    shipped = bucket_may_hold(path.parent)
    repairable = None if shipped is None else lsn_end - 1 <= shipped
    lost_keys = {(r.topic, r.partition) for r in ranges if r.records}
    if lost_keys and lost_keys <= mirrored:
        repairable = True  # mirror entries: the source region's log in the bucket has them
    when = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    qdir = path.parent.parent / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    lane_dir = path.parent.name
    copy_name = f"{lane_dir}-{path.stem}-lsn{lsn_first}.damaged"
    loss = Loss(
        base,
        lsn_first,
        lsn_end - 1,
        damage.pos,
        resync,
        when,
        damage.detail,
        repairable,
        f"{QUARANTINE_DIR}/{copy_name}",
        tuple(ranges),
    )
    record_loss(path, loss, known, buf, lost_bytes)
    # 3. the segment without the damage: one checkpoint per lost LSN
    fillers = lost_checkpoints(lsn_first, lsn_end, skip_to, when)
    _replace(path, buf[: damage.pos] + b"".join(fillers) + buf[resync:])
    _log_loss(path, loss, lost_bytes)
    return loss


def _log_loss(path: Path, loss: Loss, lost_bytes: int) -> None:
    named = ", ".join(
        f"{r.topic}/{r.partition} {r.first}-{r.last}{'' if r.exact else ' (at most)'}"
        for r in loss.ranges
        if r.records
    )
    log.error(
        "journal: damaged entries in %s (bytes %d-%d, %d bytes: %s): LSN %d-%d lost and "
        'quarantined to %s; offsets lost: %s; %s (docs/operations.md, "A damaged disk")',
        path,
        loss.byte_first,
        loss.byte_end - 1,
        lost_bytes,
        loss.reason,
        loss.lsn_first,
        loss.lsn_last,
        loss.copy,
        named or "none known",
        "the bucket has them (repairable, not rebuilt at this open)"
        if loss.repairable
        else "not shipped: lost for good"
        if loss.repairable is False
        else "whether shipped is unknown",
    )
