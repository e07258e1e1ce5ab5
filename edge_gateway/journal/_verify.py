"""Verify a journal's files, read-only: every segment and index file, and each against the other.

Two layers, as elsewhere in the journal:

* **The checks** are pure functions of bytes: :func:`check_segment` walks a
  segment (an entry log ``EGWJ`` of version 1-3, or a compressed segment
  ``EGWC``) and returns :class:`SegmentFacts` -- its LSN range, the position
  of every entry, each partition's (LSN, base offset) pairs -- or the first
  bad byte and why; :func:`check_index` compares an index file's bytes with
  those facts. A background scrub (issue 45, item 2) calls the same two on
  the bytes it reads, a segment at a time.
* **The shell** (:func:`verify_journal`) lists the lanes of a data directory
  and their segment files, reads each file once and applies the checks, with
  the rules that make it safe beside a running gateway (docs/operations.md,
  "A damaged disk"): it takes no lock and writes nothing; the last segment of
  a lane is the *active* one, whose tail may be being written (a torn or
  zero tail there is the end of what was read, not damage, and damage in its
  middle is reported only when a second read shows the same bytes: a read
  that overtook a write in progress sees that write complete the second
  time); a segment deleted by retention or a drop after the listing is
  *skipped*, not damaged.

What a segment must satisfy is docs/format.md's recovery rules, made strict
(nothing is cut, everything is reported): the header's magic, version and
base LSN (equal to the file name); entries whole, each with a valid CRC, a
known kind and flags its segment version allows, consecutive LSNs from the
base, a checkpoint first and nowhere else, every batch's header agreeing with
its entry and its own CRC matching; per partition, offsets that never go
back (an entry starts at or after where the entries and checkpoints before it
in the lane reached); segments of a lane contiguous in LSNs.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from edge_gateway._crc import crc32c
from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.format import atrest
from edge_gateway.format import batch as fbatch
from edge_gateway.format import entry as fentry
from edge_gateway.format.entry import Checkpoint
from edge_gateway.journal._index import SegmentIndex
from edge_gateway.journal._lane import Lane, lane_path, lanes_on_disk
from edge_gateway.journal._recovery import valid_entry_follows
from edge_gateway.journal._segment import INDEX_SUFFIX, SEGMENT_SUFFIX

__all__ = [
    "Damage",
    "FileCheck",
    "SegmentFacts",
    "VerifyReport",
    "check_index",
    "check_segment",
    "verify_journal",
]

Status = Literal["ok", "damaged", "skipped"]
Role = Literal["sealed", "active", "index"]
Key = tuple[str, int]

# The index file's layout (docs/format.md, "Index file"; _index.py reads it the same way).
_IDX_MAGIC: Final = b"EGWI"
_IDX_HEAD = struct.Struct("<4sB3xQQQqII")
_IDX_HEAD_V1 = struct.Struct("<4sB3xQQQq")
_IDX_DIR = struct.Struct("<HIQQq")
#: reads of an active segment that looks damaged before the damage is reported
_READS: Final = 5


@dataclass(frozen=True, slots=True)
class Damage:
    """The first bad byte of a file, and what is wrong there."""

    offset: int
    reason: str


@dataclass(slots=True)
class SegmentFacts:
    """What a check of one segment's bytes found (valid up to ``end``)."""

    #: ``journal v2``, ``compressed EGWC v1 (of journal v3)``, ...
    kind: str
    base_lsn: int
    #: LSN of the last valid entry (``base_lsn - 1``: none)
    last_lsn: int
    #: the byte where the valid entries end (the file's size when all is well)
    end: int
    #: the byte position of every valid entry (entry logs only)
    positions: array[int] = field(default_factory=lambda: array("q"))
    #: per partition, the (LSNs, base offsets) of its entries with records
    partitions: dict[Key, tuple[array[int], array[int]]] = field(default_factory=dict)
    #: per partition, where the lane's offsets stand after this segment
    next_offsets: dict[Key, int] = field(default_factory=dict)
    damage: Damage | None = None
    notes: list[str] = field(default_factory=list)
    compressed: bool = False

    @property
    def entries(self) -> int:
        return self.last_lsn - self.base_lsn + 1


class _Bad(Exception):
    """A check failed at ``offset`` (internal: becomes :class:`Damage`)."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason


class _Walk:
    """The checks every entry gets, whichever kind of segment holds it."""

    def __init__(self, facts: SegmentFacts, version: int, next_offsets: dict[Key, int]) -> None:
        self.facts = facts
        self.version = version
        self.next = dict(next_offsets)
        self.lsn = facts.base_lsn

    def entry(self, e: atrest.AnyEntry, at: int) -> None:
        """Check entry ``e`` (found at byte ``at``) and take it into the facts."""
        if e.lsn != self.lsn:
            raise _Bad(at, f"LSN {e.lsn} where {self.lsn} comes next")
        first = self.lsn == self.facts.base_lsn
        if isinstance(e, atrest.BlockEntry):
            if self.version != atrest.WAL_VERSION_BLOCKS:
                raise _Bad(at, f"a block entry in a version {self.version} segment")
            if first:
                raise _Bad(at, "the segment does not start with a checkpoint")
            _check_block_batches(e, at)
            self._offsets(e.topic, e.partition, e.first_offset, e.record_count, e.lsn, at)
        elif e.kind == fentry.KIND_CHECKPOINT:
            if not first:
                # A checkpoint inside a segment holds the LSN of an entry lost to
                # damage and quarantined (lost.log; _quarantine.py): no damage now.
                self.facts.notes.append(f"LSN {e.lsn}: lost to damage, quarantined")
            self._checkpoint(e.payload, at)
        else:
            if first:
                raise _Bad(at, "the segment does not start with a checkpoint")
            if e.producer is not None and self.version < 2:
                raise _Bad(
                    at, f"an idempotent producer's entry in a version {self.version} segment"
                )
            if e.kind == fentry.KIND_DATA and not e.count:
                raise _Bad(at, f"a data entry without records at LSN {e.lsn}")
            if e.count:
                # The decoders checked the batch header against the entry and that the
                # payload is exactly one batch; its own CRC, which the journal checks
                # only when a reader decodes the batch, is checked here.
                payload = e.payload
                stored = int.from_bytes(payload[16:20], "little")
                actual = fbatch.batch_crc(payload, 0, len(payload))
                if actual != stored:
                    raise _Bad(
                        at,
                        f"batch CRC mismatch at LSN {e.lsn} "
                        f"(stored {stored:08x}, computed {actual:08x})",
                    )
                self._offsets(e.topic, e.partition, e.base_offset, e.count, e.lsn, at)
        self.lsn += 1
        self.facts.last_lsn = e.lsn

    def _checkpoint(self, payload: bytes | memoryview, at: int) -> None:
        try:
            cp = Checkpoint.decode(payload, where="checkpoint")
        except CorruptData as exc:
            raise _Bad(at, exc.reason) from None
        if cp.producers is not None and self.version < 2:
            raise _Bad(at, f"a version 2 checkpoint in a version {self.version} segment")
        for key, nxt in cp.next_offsets.items():
            reached = self.next.get(key, 0)
            if nxt < reached:
                raise _Bad(
                    at,
                    f"checkpoint: {key[0]}/{key[1]} continues at offset {nxt}, but the "
                    f"lane's entries before it reached {reached}",
                )
            self.next[key] = nxt

    def _offsets(
        self, topic: str, partition: int, base: int, count: int, lsn: int, at: int
    ) -> None:
        key = (topic, partition)
        reached = self.next.get(key, 0)
        if base < reached:
            raise _Bad(
                at,
                f"{topic}/{partition}: LSN {lsn} holds offsets {base}..{base + count - 1}, "
                f"but the lane's entries before it reached offset {reached}",
            )
        self.next[key] = base + count
        runs = self.facts.partitions.get(key)
        if runs is None:
            runs = self.facts.partitions[key] = (array("q"), array("q"))
        runs[0].append(lsn)
        runs[1].append(base)


def _check_block_batches(e: atrest.BlockEntry, at: int) -> None:
    """A block entry's records, which the journal checks only when a reader reads them:
    the block decompressed (into its declared size), its batches filling it with
    offsets continuing, each batch decoded (CRC, columns) within the block's timestamps."""
    frame = e.frame_index()
    where = f"block entry at LSN {e.lsn}"
    try:
        batches = atrest.FrameBatches(
            frame, atrest.decode_frame(frame, e.stored, where=where), where=where
        )
        offset = e.first_offset
        while offset <= e.last_offset:
            offset = batches.batch(offset).next_offset
    except CorruptData as exc:
        raise _Bad(at, f"{where}: {exc.reason}") from None


def check_segment(
    data: bytes | memoryview,
    *,
    base_lsn: int,
    active: bool = False,
    next_offsets: dict[Key, int] | None = None,
) -> SegmentFacts:
    """Check one segment file's bytes (``base_lsn``: from its name).

    ``active``: the lane's last segment, which may be being written: a torn
    or zero-filled tail ends the check there (a note, not damage).
    ``next_offsets``: where the lane's partitions stood before this segment
    (the previous segment's :attr:`SegmentFacts.next_offsets`); not changed.
    Never raises for bad bytes: the facts hold the first :class:`Damage`.
    """
    magic = bytes(data[:4])
    if magic == atrest.MAGIC:
        return _check_compressed(data, base_lsn, dict(next_offsets or {}))
    return _check_wal(data, base_lsn, active, dict(next_offsets or {}))


def _check_wal(
    data: bytes | memoryview, base_lsn: int, active: bool, next_offsets: dict[Key, int]
) -> SegmentFacts:
    buf = data if isinstance(data, bytes) else memoryview(data)
    size = len(buf)
    version = buf[4] if size > 4 else 0
    facts = SegmentFacts(f"journal v{version}", base_lsn, base_lsn - 1, fentry.SEGMENT_HEADER_SIZE)
    if size < fentry.SEGMENT_HEADER_SIZE:
        facts.damage = Damage(0, f"segment header truncated ({size} bytes)")
        facts.end = 0
        return facts
    magic, _, header_lsn = struct.unpack_from("<4sB3xQ", buf)
    if magic != fentry.SEGMENT_MAGIC:
        facts.kind = "unknown"
        facts.damage = Damage(0, f"not a journal segment (magic {magic!r})")
        return facts
    if version not in atrest.WAL_VERSIONS:
        facts.damage = Damage(4, f"unsupported segment version {version}")
        return facts
    if header_lsn != base_lsn:
        facts.damage = Damage(8, f"the header's base LSN {header_lsn} is not the file name's")
        return facts
    walk = _Walk(facts, version, next_offsets)
    pos = fentry.SEGMENT_HEADER_SIZE
    fast = fentry.decode_data_entry
    try:
        while pos < size:
            if buf[pos] == 0 and fentry.is_zero_tail(buf, pos):
                if not active:
                    facts.notes.append(
                        f"a zero-filled tail of {size - pos} bytes from byte {pos} "
                        "(an interrupted seal; the next open cuts it)"
                    )
                break
            try:
                e: atrest.AnyEntry | None = fast(buf, pos) if walk.lsn != base_lsn else None
                if e is None:
                    e = atrest.decode_any_entry(buf, pos, where="entry")
            except CorruptData as exc:
                if active and not valid_entry_follows(bytes(buf), pos, walk.lsn):
                    facts.notes.append(
                        f"stopped at byte {pos}: {size - pos} bytes of an entry not yet "
                        "complete (being written, or a torn write the next open cuts)"
                    )
                    break
                raise _Bad(pos, exc.reason) from None
            walk.entry(e, pos)
            facts.positions.append(pos)
            pos += e.length
    except _Bad as bad:
        facts.damage = Damage(bad.offset, bad.reason)
    facts.end = pos
    if facts.damage is None and facts.entries == 0:
        facts.damage = Damage(pos, "the segment holds no entry (not even its checkpoint)")
    facts.next_offsets = walk.next
    return facts


def _check_compressed(
    data: bytes | memoryview, base_lsn: int, next_offsets: dict[Key, int]
) -> SegmentFacts:
    buf = memoryview(data)
    size = len(buf)
    facts = SegmentFacts("compressed", base_lsn, base_lsn - 1, 0, compressed=True)
    try:
        try:
            wal_version, header_lsn = atrest.decode_header(buf, where="header")
        except CorruptData as exc:
            raise _Bad(0, exc.reason) from None
        facts.kind = f"compressed EGWC v{atrest.VERSION} (of journal v{wal_version})"
        if header_lsn != base_lsn:
            raise _Bad(8, f"the header's base LSN {header_lsn} is not the file name's")
        if size < atrest.HEADER_SIZE + atrest.TRAILER_SIZE:
            raise _Bad(0, f"{size} bytes cannot be a compressed segment")
        tail = size - atrest.TRAILER_SIZE
        try:
            dir_offset, dir_length = atrest.decode_trailer(buf[tail:], file_size=size, where="")
        except CorruptData as exc:
            raise _Bad(tail, f"trailer: {exc.reason}") from None
        try:
            d = atrest.decode_directory(
                buf[dir_offset : dir_offset + dir_length],
                base_lsn=base_lsn,
                wal_version=wal_version,
                dir_offset=dir_offset,
                where="",
            )
        except CorruptData as exc:
            raise _Bad(dir_offset, f"directory: {exc.reason}") from None
        raws: dict[int, bytes] = {}
        for n, f in enumerate(d.frames):
            try:
                raw = atrest.decode_frame(f, buf[f.offset : f.end], where="")
                batches = atrest.FrameBatches(f, raw, where="")
                offset = f.first_offset
                while offset <= f.last_offset:  # FrameBatches checked they fill the frame
                    pos, length = batches.locate(offset)
                    h = fbatch.read_header(raw, pos, where="batch")
                    if fbatch.batch_crc(raw, pos, length) != h.crc:
                        raise CorruptData(f"batch at raw byte {pos}: CRC mismatch")
                    offset = h.base_offset + h.count
            except CorruptData as exc:
                raise _Bad(f.offset, f"frame {n}: {exc.reason}") from None
            raws[n] = raw

        def stored_of(n: int) -> bytes:
            return bytes(buf[d.frames[n].offset : d.frames[n].end])

        walk = _Walk(facts, wal_version, next_offsets)
        for c_no, c in enumerate(d.chunks):
            stored = buf[c.meta_offset : c.meta_offset + c.meta_stored]
            try:
                ents = atrest.decode_entries(d, c_no, stored, where="")
            except CorruptData as exc:
                raise _Bad(c.meta_offset, f"chunk {c_no} entry table: {exc.reason}") from None
            for i in range(c.n_entries):
                try:
                    wal = atrest.wal_entry(d, ents, i, raws.__getitem__, stored_of, where="")
                    e = atrest.decode_any_entry(wal, where="")
                except CorruptData as exc:
                    raise _Bad(c.meta_offset, f"LSN {c.first_lsn + i}: {exc.reason}") from None
                walk.entry(e, c.meta_offset)
        facts.next_offsets = walk.next
        facts.end = size
    except _Bad as bad:
        facts.damage = Damage(bad.offset, bad.reason)
    return facts


def check_index(
    data: bytes, facts: SegmentFacts, *, segment_size: int
) -> tuple[str, Damage | None]:
    """Check an index file's bytes against its segment's facts: ``(kind, first damage)``.

    Version 2: its CRC, header and directory, then every element: entry
    ``i``'s position, each partition's LSNs and base offsets and its first
    offset must be what the segment holds. Version 1 is read whole and
    compared the same way. The damage's offset is the first bad byte of the
    index file.
    """
    version = data[4] if len(data) > 4 and data[:4] == _IDX_MAGIC else 0
    kind = f"index v{version}" if version else "index"
    try:
        if version == 1:
            _check_index_v1(data, facts, segment_size)
        else:
            _check_index_v2(data, facts, segment_size)
    except _Bad as bad:
        return kind, Damage(bad.offset, bad.reason)
    return kind, None


def _check_index_v2(data: bytes, facts: SegmentFacts, segment_size: int) -> None:
    size = len(data)
    if size < _IDX_HEAD.size + 4:
        raise _Bad(0, f"index file truncated ({size} bytes)")
    (stored,) = struct.unpack_from("<I", data, size - 4)
    if crc32c(memoryview(data)[: size - 4]) != stored:
        raise _Bad(size - 4, "index file CRC mismatch")
    magic, version, base, n, seg_size, _last, nparts, dir_len = _IDX_HEAD.unpack_from(data)
    if magic != _IDX_MAGIC or version != 2:
        raise _Bad(0, f"not an index file (magic {magic!r}, version {version})")
    _check_index_head(base, n, seg_size, facts, segment_size)
    runs: list[tuple[Key, int, int, int, int]] = []
    cur = _IDX_HEAD.size
    end_dir = _IDX_HEAD.size + dir_len
    try:
        for _ in range(nparts):
            tlen, partition, k, at, first = _IDX_DIR.unpack_from(data, cur)
            topic = data[cur + _IDX_DIR.size : cur + _IDX_DIR.size + tlen].decode()
            runs.append(((topic, partition), k, at, first, cur))
            cur += _IDX_DIR.size + tlen
    except (struct.error, UnicodeDecodeError) as exc:
        raise _Bad(cur, f"malformed index directory: {exc}") from None
    positions_at = end_dir + -end_dir % 8
    if cur != end_dir or positions_at + 8 * n + sum(16 * r[1] for r in runs) != size - 4:
        raise _Bad(40, "the index's arrays do not end where its directory says")
    _compare(data, positions_at, facts.positions, "entry", facts.base_lsn)
    seen = {r[0] for r in runs}
    for key in facts.partitions.keys() - seen:
        raise _Bad(48, f"the index has no entries of {key[0]}/{key[1]}, which the segment holds")
    for key, k, at, first, dir_at in runs:
        pair = facts.partitions.get(key)
        if pair is None:
            raise _Bad(
                dir_at, f"the index lists {key[0]}/{key[1]}, which the segment does not hold"
            )
        lsns, offsets = pair
        if k != len(lsns):
            raise _Bad(
                dir_at, f"{key[0]}/{key[1]}: {k} entries in the index, {len(lsns)} in the segment"
            )
        if first != offsets[0]:
            raise _Bad(
                dir_at, f"{key[0]}/{key[1]}: first offset {first}, the segment's is {offsets[0]}"
            )
        _compare(data, at, lsns, f"{key[0]}/{key[1]} LSN", None)
        _compare(data, at + 8 * k, offsets, f"{key[0]}/{key[1]} base offset", None)


def _check_index_head(base: int, n: int, seg_size: int, facts: SegmentFacts, size: int) -> None:
    if base != facts.base_lsn:
        raise _Bad(8, f"the index is of base LSN {base}, its segment's is {facts.base_lsn}")
    if n != facts.entries:
        raise _Bad(16, f"the index counts {n} entries, the segment holds {facts.entries}")
    if seg_size != size:
        raise _Bad(24, f"the index is of a segment of {seg_size} bytes, the segment has {size}")


def _compare(data: bytes, at: int, expected: array[int], what: str, lsn0: int | None) -> None:
    """Compare ``len(expected)`` i64 of ``data`` from byte ``at`` with ``expected``."""
    got = array("q")
    got.frombytes(data[at : at + 8 * len(expected)])
    if got == expected:
        return
    for i, (g, x) in enumerate(zip(got, expected, strict=False)):
        if g != x:
            name = f"LSN {lsn0 + i}" if lsn0 is not None else f"element {i}"
            if lsn0 is not None:
                raise _Bad(
                    at + 8 * i,
                    f"the index says {name} is at byte {g} of the segment; it is at byte {x}",
                )
            raise _Bad(at + 8 * i, f"{what} {i}: the index says {g}, the segment holds {x}")
    raise _Bad(at + 8 * len(got), f"the index ends inside its {what} array")


def _check_index_v1(data: bytes, facts: SegmentFacts, segment_size: int) -> None:
    try:
        idx = SegmentIndex.decode_v1(data, where="index")
    except CorruptData as exc:
        raise _Bad(len(data) - 4 if "CRC" in exc.reason else 0, exc.reason) from None
    n = len(idx.positions)
    _check_index_head(idx.base_lsn, n, idx.size, facts, segment_size)
    _compare(data, _IDX_HEAD_V1.size, facts.positions, "entry", facts.base_lsn)
    after = _IDX_HEAD_V1.size + 8 * n
    if idx.partitions.keys() != facts.partitions.keys():
        raise _Bad(after, "the index's partitions are not the segment's")
    for key, (lsns, offsets) in idx.partitions.items():
        if lsns != facts.partitions[key][0] or offsets != facts.partitions[key][1]:
            raise _Bad(after, f"{key[0]}/{key[1]}: the index's entries are not the segment's")


# --------------------------------------------------------------------------
# the shell: files on disk


@dataclass(frozen=True, slots=True)
class FileCheck:
    """The verdict on one file (a line of ``edgegw journal verify``)."""

    lane: str
    path: Path
    #: ``sealed`` or ``active`` segment, or ``index`` file
    role: Role
    kind: str
    status: Status
    first_lsn: int | None = None
    last_lsn: int | None = None
    entries: int = 0
    bytes: int = 0
    damage: Damage | None = None
    #: why it was skipped, or what was seen that is not damage
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "lane": self.lane,
            "file": str(self.path),
            "role": self.role,
            "kind": self.kind,
            "status": self.status,
            "first_lsn": self.first_lsn,
            "last_lsn": self.last_lsn,
            "entries": self.entries,
            "bytes": self.bytes,
            "offset": None if self.damage is None else self.damage.offset,
            "reason": None if self.damage is None else self.damage.reason,
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Everything :func:`verify_journal` checked, file by file, lanes in drain order."""

    journal: Path
    lanes: tuple[str, ...]
    files: tuple[FileCheck, ...]

    @property
    def damaged(self) -> list[FileCheck]:
        return [f for f in self.files if f.status == "damaged"]

    @property
    def ok(self) -> bool:
        return not self.damaged

    def to_json(self) -> dict[str, Any]:
        return {
            "journal": str(self.journal),
            "ok": self.ok,
            "lanes": list(self.lanes),
            "files": [f.to_json() for f in self.files],
            "summary": {
                "files": len(self.files),
                "damaged": len(self.damaged),
                "skipped": sum(f.status == "skipped" for f in self.files),
                "entries": sum(f.entries for f in self.files if f.role != "index"),
                "bytes": sum(f.bytes for f in self.files),
            },
        }


#: ``progress(done_bytes, total_bytes, file)``, called after each file.
Progress = Callable[[int, int, Path], None]


def read_whole(path: Path) -> bytes | None:
    """The file's bytes, or None if it is gone (deleted since it was listed)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        parts = []
        while chunk := os.read(fd, 1 << 24):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def segment_files(directory: Path) -> list[tuple[int | None, Path]]:
    """A lane directory's segment files in LSN order, with their base LSNs (None: not a number)."""
    out: list[tuple[int | None, Path]] = []
    for f in sorted(directory.glob(f"*{SEGMENT_SUFFIX}")):
        try:
            out.append((int(f.stem), f))
        except ValueError:
            out.append((None, f))
    return out


def verify_journal(
    main: Path, *, progress: Progress | None = None, settle_s: float = 0.05
) -> VerifyReport:
    """Verify every lane of the journal whose normal lane is at ``main`` (read-only, no lock).

    ``settle_s``: the pause before the second read of an active segment that
    looked damaged (a read can overtake a write in progress; damage stays).
    Raises :class:`InvalidInput` when ``main`` is not a journal directory.
    """
    if not main.is_dir():
        raise InvalidInput(f"no journal directory at {main}")
    lanes = sorted(lanes_on_disk(main), key=lambda lane: lane.rank)
    plan = [(lane, segment_files(lane_path(main, lane))) for lane in lanes]
    total = 0
    for _, segs in plan:
        for _, p in segs:
            with contextlib.suppress(OSError):
                total += p.stat().st_size
                total += p.with_suffix(INDEX_SUFFIX).stat().st_size
    done = 0
    files: list[FileCheck] = []
    for lane, segs in plan:
        for check in _verify_lane(lane, segs, settle_s):
            files.append(check)
            done += check.bytes
            if progress is not None:
                progress(min(done, total), total, check.path)
    return VerifyReport(main, tuple(str(lane) for lane in lanes), tuple(files))


def _verify_lane(
    lane: Lane, segs: list[tuple[int | None, Path]], settle_s: float
) -> Iterable[FileCheck]:
    name = str(lane)
    next_offsets: dict[Key, int] = {}
    prev_last: int | None = None
    for i, (base, path) in enumerate(segs):
        active = i == len(segs) - 1
        role: Role = "active" if active else "sealed"
        if base is None:
            yield FileCheck(
                name, path, role, "unknown", "damaged", damage=Damage(0, "not a segment name")
            )
            prev_last = None
            continue
        checked = _read_and_check(path, base, active, next_offsets, settle_s)
        if checked is None:
            note = "deleted while verifying (retention or a drop): not checked"
            yield FileCheck(name, path, role, "journal", "skipped", notes=(note,))
            prev_last = None
            continue
        data, facts = checked
        damage = facts.damage
        if prev_last is not None and base != prev_last + 1:
            missing = (
                f"LSNs {prev_last + 1}..{base - 1} are missing"
                if base > prev_last + 1
                else f"it overlaps the segment before it, which ends at LSN {prev_last}"
            )
            if damage is None or damage.offset > 8:
                damage = Damage(8, f"LSN gap before this segment: {missing}")
        size = len(data)
        index = None if active else _verify_index(name, path, facts, size)
        yield FileCheck(
            name,
            path,
            role,
            facts.kind,
            "ok" if damage is None else "damaged",
            base if facts.entries else None,
            facts.last_lsn if facts.entries else None,
            facts.entries,
            size,
            damage,
            tuple(facts.notes),
        )
        if index is not None:
            yield index
        next_offsets = facts.next_offsets
        prev_last = facts.last_lsn if facts.damage is None else None


def _read_and_check(
    path: Path, base: int, active: bool, next_offsets: dict[Key, int], settle_s: float
) -> tuple[bytes, SegmentFacts] | None:
    """Read a segment and check it (None: it is gone).

    An active segment that looks damaged is read again after ``settle_s``:
    a read can overtake a write in progress (bytes not yet written, then
    later ones that were), which looks like damage in the middle; the
    second read sees that write complete. Damage is reported only when two
    reads in a row find it at the same byte, for the same reason.
    """
    previous: Damage | None = None
    checked: tuple[bytes, SegmentFacts] | None = None
    for _ in range(_READS):
        data = read_whole(path)
        if data is None:
            return None
        facts = check_segment(data, base_lsn=base, active=active, next_offsets=next_offsets)
        checked = data, facts
        if not active or facts.damage is None or facts.damage == previous or facts.compressed:
            break
        previous = facts.damage
        time.sleep(settle_s)
    return checked  # damage at a new place at every read: the last is reported


def _verify_index(lane: str, segment: Path, facts: SegmentFacts, size: int) -> FileCheck | None:
    """The verdict on a sealed segment's index file (None: it has none; a note says so)."""
    idx = segment.with_suffix(INDEX_SUFFIX)
    data = read_whole(idx)
    if data is None:
        if not facts.compressed:
            facts.notes.append("no index file (the journal rebuilds it at its next open)")
        return None
    if facts.compressed:
        note = "stale: beside a compressed segment (the next open deletes it)"
        return FileCheck(lane, idx, "index", "index", "ok", bytes=len(data), notes=(note,))
    if facts.damage is not None:
        note = "not checked: its segment is damaged"
        return FileCheck(lane, idx, "index", "index", "skipped", bytes=len(data), notes=(note,))
    kind, damage = check_index(data, facts, segment_size=size)
    notes = ("the journal ignores a damaged index file and rebuilds it at its next open",)
    return FileCheck(
        lane,
        idx,
        "index",
        kind,
        "ok" if damage is None else "damaged",
        facts.base_lsn,
        facts.last_lsn,
        facts.entries,
        len(data),
        damage,
        notes if damage else (),
    )
