"""The record of what a ``drop-oldest`` lane deleted unshipped (``docs/journal.md``,
"Drop-oldest lanes").

A drop-oldest journal over its budget deletes its oldest sealed segment even
when the bucket does not have it yet. Before the unlink it appends one line
per dropped LSN range to ``dropped.log`` in the journal directory and fsyncs
it, so that what was dropped is known exactly, whatever happens next:

- the process dies after the record and before the unlink: the next open
  finds the segment named by the last record still there and deletes it then
  (the drop is completed, never undone, so the record never names data that
  is still served or shipped);
- the process dies while writing the record: the line is torn (its CRC does
  not match), the unlink never happened, and the open cuts the line away.

A line is ``<crc32c of the JSON, 8 hex digits> <JSON>\\n``; the JSON::

    {"v": 1, "segment": <base LSN of the segment>, "end": <its end LSN>,
     "lsn_first": a, "lsn_last": b, "time_ms": ..., "held": false,
     "ranges": [[topic, partition, first_offset, last_offset, records, bytes], ...]}

``lsn_first..lsn_last`` (inclusive) is the part of the segment the record
covers; the shipper ships a record as a gap marker in the object whose lane
range starts at or before ``lsn_first``, so a record of LSNs the bucket
already has (``lsn_last`` below the shipped watermark) is never shipped.
``held``: the shipper had these entries in an object being committed when
they were dropped (they reach the bucket with it unless the process dies
first; then the record reports them, see ``Journal.drops_from``).

:class:`DropLog` is a journal's part that owns them: the records in memory
(loaded at open, appended at each drop) and the LSN below which the shipper
is committing an object (drops there are ``held``). Pure file handling, no
trio.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData
from edge_gateway.journal import _fs

T = TypeVar("T")

DROPPED_NAME: Final = "dropped.log"
VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class DroppedRange:
    """One partition's records dropped unshipped: offsets ``first..last`` (inclusive)."""

    topic: str
    partition: int
    first: int
    last: int
    records: int
    #: bytes of the journal entries that held them
    bytes: int


@dataclass(frozen=True, slots=True)
class Drop:
    """The records of one LSN range of a dropped segment (one line of ``dropped.log``)."""

    segment: int
    end: int
    lsn_first: int
    lsn_last: int
    time_ms: int
    held: bool
    ranges: tuple[DroppedRange, ...]

    def encode(self) -> bytes:
        doc = {
            "v": VERSION,
            "segment": self.segment,
            "end": self.end,
            "lsn_first": self.lsn_first,
            "lsn_last": self.lsn_last,
            "time_ms": self.time_ms,
            "held": self.held,
            "ranges": [
                [r.topic, r.partition, r.first, r.last, r.records, r.bytes] for r in self.ranges
            ],
        }
        body = json.dumps(doc, separators=(",", ":")).encode()
        return b"%08x " % crc32c(body) + body + b"\n"


def _decode(body: bytes, where: str) -> Drop:
    try:
        doc = json.loads(body)
        if doc.get("v") != VERSION:
            raise CorruptData(
                f"unsupported dropped.log record version {doc.get('v')!r}", where=where
            )
        ranges = tuple(
            DroppedRange(str(t), int(p), int(a), int(b), int(n), int(s))
            for t, p, a, b, n, s in doc["ranges"]
        )
        return Drop(
            int(doc["segment"]),
            int(doc["end"]),
            int(doc["lsn_first"]),
            int(doc["lsn_last"]),
            int(doc["time_ms"]),
            bool(doc["held"]),
            ranges,
        )
    except CorruptData:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptData(f"bad dropped.log record: {exc}", where=where) from None


def load_drops(directory: Path) -> list[Drop]:
    """The records of ``directory/dropped.log``, oldest first; a torn last line is cut away.

    A bad line before the last one is damage, not a torn write: :class:`CorruptData`.
    """
    return load_records(directory / DROPPED_NAME, _decode)


def load_records(path: Path, decode: Callable[[bytes, str], T]) -> list[T]:
    """The ``<crc32c hex> <json>`` lines of ``path`` decoded, oldest first (none if
    it does not exist); a torn last line is cut away, a bad one before it is
    :class:`CorruptData`. ``dropped.log`` and ``lost.log`` (``_quarantine.py``)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out: list[T] = []
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        line = data[pos:nl] if nl >= 0 else data[pos:]
        where = f"{path}@{pos}"
        ok = nl >= 0 and len(line) > 9 and line[8:9] == b" "
        if ok:
            try:
                ok = int(line[:8], 16) == crc32c(line[9:])
            except ValueError:
                ok = False
        if not ok:
            if nl >= 0 and nl + 1 < len(data):
                raise CorruptData(f"corrupt record in the middle of {path.name}", where=where)
            # A torn last line: written by a step that never went on to the next.
            fd = _fs.ops.open(path, os.O_RDWR)
            try:
                _fs.ops.ftruncate(fd, pos)
                _fs.ops.fsync(fd)
            finally:
                _fs.ops.close(fd)
            break
        out.append(decode(line[9:], where))
        pos = nl + 1
    return out


def append_drops(directory: Path, drops: list[Drop]) -> None:
    """Append ``drops`` to ``directory/dropped.log`` and fsync it (and the directory
    when the file is new): durable before the segment is unlinked."""
    append_records(directory, DROPPED_NAME, [d.encode() for d in drops])


def append_records(directory: Path, name: str, lines: list[bytes]) -> None:
    """Append ``lines`` to ``directory/name`` and fsync it (and the directory when
    the file is new)."""
    path = directory / name
    new = not path.exists()
    fd = _fs.ops.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _fs.write_all(_fs.ops, fd, b"".join(lines))
        _fs.ops.fsync(fd)
    finally:
        _fs.ops.close(fd)
    if new:
        dfd = _fs.ops.open(directory, os.O_RDONLY)
        try:
            _fs.ops.fsync(dfd)
        finally:
            _fs.ops.close(dfd)


class DropLog:
    """A journal's drops: ``dropped.log`` and its records in memory, oldest first.

    Also what the shipper is committing (:meth:`take`): a drop of entries
    below that LSN is recorded as ``held``. Every journal has one; only a
    ``drop-oldest`` one ever records a drop.
    """

    __slots__ = ("directory", "drops", "generation", "taken_lsn")

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        #: what drop-oldest deleted unshipped (``dropped.log``), oldest first
        self.drops: list[Drop] = []
        #: bumped at each drop (the shipper notices drops under an object it built)
        self.generation = 0
        #: entries below this LSN are in an object the shipper is committing
        self.taken_lsn = 0

    def load(self) -> list[Drop]:
        """Read ``dropped.log`` (the open); its records, oldest first."""
        self.drops = load_drops(self.directory)
        return self.drops

    def append(self, drops: list[Drop]) -> None:
        """Record ``drops``: durably in ``dropped.log`` first, then in memory.

        Raises ``OSError`` (nothing recorded) if the file cannot be written.
        """
        append_drops(self.directory, drops)
        self.drops += drops
        self.generation += 1

    def last_is_of(self, segment: int) -> bool:
        """Whether the last record is of the segment with this base LSN (a second
        try of a drop whose unlink failed records nothing twice)."""
        return bool(self.drops) and self.drops[-1].segment == segment

    def take(self, lsn: int) -> None:
        """The shipper is committing an object holding the entries below ``lsn``."""
        self.taken_lsn = max(self.taken_lsn, lsn)

    def from_lsn(self, lsn: int, through: int | None = None) -> list[Drop]:
        """The drops of LSNs from ``lsn`` on (through ``through``), oldest first."""
        out = []
        for d in reversed(self.drops):
            if d.lsn_first < lsn:
                break
            if through is None or d.lsn_first <= through:
                out.append(d)
        out.reverse()
        return out

    def cover(self, first: int, end: int) -> bool:
        """Whether the drops account for every LSN ``first <= lsn < end``."""
        cur = first
        for d in self.drops:
            if d.lsn_first <= cur <= d.lsn_last:
                cur = d.lsn_last + 1
        return cur >= end

    def release_held(self, lsn: int) -> None:
        """``held`` drops from ``lsn`` on are gaps from now on (their object never committed)."""
        self.drops = [
            dataclasses.replace(d, held=False) if d.held and d.lsn_first >= lsn else d
            for d in self.drops
        ]

    def all(self, *, held: bool = True) -> list[Drop]:
        """Every drop, oldest first; without the ``held`` ones if ``held`` is False."""
        return [d for d in self.drops if held or not d.held]

    def counts(self) -> tuple[int, int, int]:
        """(segments, records, bytes) dropped over the journal's life (``held`` ones
        count as segments only: their records reached the bucket)."""
        drops = self.drops
        return (
            len({d.segment for d in drops}),
            sum(r.records for d in drops if not d.held for r in d.ranges),
            sum(r.bytes for d in drops if not d.held for r in d.ranges),
        )
