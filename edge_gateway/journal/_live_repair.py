"""Live repair: a damaged sealed segment is rebuilt from the bucket while the journal runs.

Issue 45, item 3, the half the open does not do (``_repair.py`` is the
open's). When the scrub (``_scrub.py``) or a read meets damage in a sealed
segment -- an entry log (``EGWJ``) or a compressed segment (``EGWC``) --
whose entries the bucket holds (the main lane's ``shipper.json`` confirmed
the whole segment, or it holds mirror entries: their source region's log has
them, ``_mirror_repair.py``), :meth:`LiveRepair.report` marks the segment *pending*
and wakes :meth:`LiveRepair.run`. Until the repair is done, a read that
meets the damage raises :class:`~edge_gateway.errors.RepairPending` (503
``repair_pending`` with ``Retry-After``) instead of ``CorruptData``.

The steps, and where each runs:

1. in a worker thread (:func:`prepare_repair`): the segment's entry log is
   copied to ``<lsn>.wal.r-tmp`` beside it (a compressed segment is expanded
   entry by entry, and an entry whose frame or bytes do not check is left as
   bytes that do not decode, of its own length, so the scan finds it as
   damage); then, as at open, scan -- rebuild each damaged range from the
   bucket (``repair_damage`` on the copy: the quarantine copy,
   ``repaired.log``, the report) -- scan again, until the copy scans sound.
   The sound copy's index is built from that last scan (the verification).
2. on the event loop (:meth:`LiveRepair._install`), in one step with no
   checkpoint between, as the rewriter swaps (``_rewriter.py``): the old
   index file is deleted, the copy renamed over the segment, the segment
   swapped in memory (:meth:`SegmentSet.swap_entry_log`: a plain entry log
   again, with its index) and each partition's run in it pointed at the new
   index; then the new index file is written (the journal's
   ``index_sealed``). A segment that retention or a drop took away meanwhile
   is not brought back (the copy is deleted).
3. the directory is fsynced (worker thread), and the rewriter woken: with
   ``journal.at_rest = "compressed"`` it compresses the segment again.

**A range quarantined at open** (``lost.log``, ``repairable: true``: the
bucket was out of reach) takes the same path once its segment is sealed and
the shipper confirmed it whole (:meth:`LiveRepair.sealed`, after each roll;
looked at again every :data:`LOOK_S` while it waits): the checkpoints that
hold its LSNs are left as damage in the copy, and rebuilt like any damage.

A kill at any step loses nothing: before the rename the segment is as it was
(damaged; the next open repairs it, ``repaired.log`` gets no second record of
a range, and a stale ``.r-tmp`` is deleted); after it the segment is sound,
and a missing index file is rebuilt by the open's scan.

**Bounded attempts** (issue 45: "never fetched in a loop"). Each segment's
failures are kept in ``repair-attempts.json`` in the journal directory
(``v: 1``, written atomically), with the time of the next try, drawn by the
shared :class:`~edge_gateway.backoff.Backoff` (:data:`BACKOFF_BASE_S` doubling
up to :data:`BACKOFF_CAP_S`). A failure because the bucket was out of reach
is retried without end at that pace (the bucket comes back); one where the
bucket answered but the range could not be rebuilt counts, and after
:data:`MAX_ATTEMPTS` the segment is given up: logged as an ERROR, reported in
:meth:`LiveRepair.statistics`, its reads answer ``corrupt_data`` again, and
nothing is fetched for it any more (an open that rescans it -- its index file
deleted by the operator -- quarantines the damage, ``_quarantine.py``). The
record of a segment goes when it is repaired or deleted.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

import trio

from edge_gateway.backoff import Backoff
from edge_gateway.durable import replace_file
from edge_gateway.errors import CorruptData, EdgeGatewayError, RepairPending, Unavailable
from edge_gateway.failpoints import fail_point
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.journal import _fs
from edge_gateway.journal._compressed import CompressedFile, is_compressed
from edge_gateway.journal._compressed_repair import expand_salvaged
from edge_gateway.journal._fs import fsync_dir
from edge_gateway.journal._index import IndexCache, IndexFile, PartitionRun, SegmentIndex
from edge_gateway.journal._lane_repair import confirmed_lsn
from edge_gateway.journal._mirror_repair import MirroredObject, MirrorSource
from edge_gateway.journal._quarantine import QUARANTINE_DIR, Loss
from edge_gateway.journal._recovery import DamagedEntry, scan_segment
from edge_gateway.journal._repair import Repaired, RepairSource, ShippedObject, repair_damage
from edge_gateway.journal._segment import REPAIR_SUFFIX, Segment
from edge_gateway.journal._segment_set import SegmentSet
from edge_gateway.journal._state import _Partition
from edge_gateway.statefile import seal, unseal

__all__ = [
    "ATTEMPTS_NAME",
    "MAX_ATTEMPTS",
    "REPAIR_SUFFIX",
    "LiveRepair",
    "LiveRepairStats",
    "NotRepaired",
    "PreparedRepair",
    "expand_damaged",
    "prepare_repair",
]

log = logging.getLogger("edgegw.journal")

ATTEMPTS_NAME: Final = "repair-attempts.json"
VERSION: Final = 1
#: Attempts at a segment the bucket answered for but that could not be rebuilt.
MAX_ATTEMPTS: Final = 5
BACKOFF_BASE_S: Final = 2.0
BACKOFF_CAP_S: Final = 600.0
#: How often a quarantined range whose sealed segment the bucket has not yet
#: confirmed whole is looked at again (seconds).
LOOK_S: Final = 5.0
#: What a read of a pending range tells the client to wait (seconds).
RETRY_AFTER_S: Final = 1
#: Filler for an entry of a compressed segment that does not read back: a length
#: field of 0xFFFFFFFF is no entry's, so the scan meets damage there.
_FILLER: Final = b"\xff"


class NotRepaired(Exception):
    """A live repair of a segment did not happen; ``unavailable``: the bucket was away."""

    def __init__(self, reason: str, *, unavailable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unavailable = unavailable


# ---------------------------------------------------------------- the worker thread


def expand_damaged(path: Path, base: int) -> tuple[bytes, int]:
    """The entry log a compressed segment replaced, its unreadable entries left as damage.

    Returns the bytes and how many entries did not read back. A damaged frame
    holds one partition's batches of many entries, between which other
    partitions' entries are intact: the bytes from the first entry that does
    not read back to the end of the last one are left as one damaged range
    (every entry in it is rebuilt from the bucket, which has them all: the
    segment was shipped), so that the rebuild sees where each partition goes
    on after it. The entries' lengths come from the entry tables
    (``load_positions``): a damaged entry table or directory raises
    ``CorruptData`` here, and :func:`prepare_repair` turns to
    ``_compressed_repair.expand_salvaged``.
    """
    where = str(path)
    data = path.read_bytes()
    cf = CompressedFile.open(path, base)
    seg = atrest.CompressedSegment(data, where=where, cache=atrest.FrameCache(0))
    d = seg.directory
    positions = cf.load_positions(lambda n, at: data[at : at + n])
    ends = [*positions[1:], d.wal_bytes]
    out = bytearray(fentry.encode_segment_header(d.base_lsn, d.wal_version))
    bad = 0
    first_bad = last_end = -1
    i = 0
    for ci in range(len(d.chunks)):
        ents = seg.chunk_entries(ci)
        raws: dict[int, bytes | None] = {}

        def raw_of(n: int, raws: dict[int, bytes | None] = raws) -> bytes:
            if n not in raws:
                try:
                    raws[n] = atrest.decode_frame(d.frames[n], seg.stored(n), where=where)
                except CorruptData:
                    raws[n] = None
            raw = raws[n]
            if raw is None:
                raise CorruptData(f"frame {n} does not read back", where=where)
            return raw

        for k in range(ents.chunk.n_entries):
            n = ends[i] - positions[i]
            try:
                e = atrest.wal_entry(d, ents, k, raw_of, seg.stored, where=where)
                if len(e) != n:
                    raise CorruptData("entry of another length", where=where)
            except CorruptData:
                e = _FILLER * n
                bad += 1
                first_bad = positions[i] if first_bad < 0 else first_bad
                last_end = ends[i]
            out += e
            i += 1
    if bad:
        out[first_bad:last_end] = _FILLER * (last_end - first_bad)
    return bytes(out), bad


@dataclass(frozen=True, slots=True)
class PreparedRepair:
    """A sound, verified copy of a damaged segment, ready to be renamed over it."""

    tmp: Path
    size: int
    last_append_time: int
    #: the index of the copy (not yet written) and its partitions' runs
    index_data: bytes
    runs: list[PartitionRun]
    #: the ranges rebuilt, and those of them new to ``repaired.log`` (a run killed
    #: after recording a range recorded it already)
    repairs: list[Repaired]
    recorded: list[Repaired]
    #: bytes of the file replaced (the compressed one's, if it was)
    old_size: int


class _Watched:
    """A repair source that remembers whether the bucket was out of reach."""

    def __init__(self, source: RepairSource) -> None:
        self.source = source
        self.unavailable: str | None = None

    def shipped(self, first_lsn: int, last_lsn: int) -> Sequence[ShippedObject]:
        try:
            return self.source.shipped(first_lsn, last_lsn)
        except Unavailable as exc:
            self.unavailable = str(exc)
            raise


class _WatchedMirror(_Watched):
    """:class:`_Watched` of a source that also reads other regions' logs (mirror entries)."""

    def __init__(self, source: RepairSource, mirror: MirrorSource) -> None:
        super().__init__(source)
        self.mirror = mirror
        self.keep_blocks = mirror.keep_blocks

    def mirrored(self, region: str, first_seq: int, last_seq: int) -> Sequence[MirroredObject]:
        try:
            return self.mirror.mirrored(region, first_seq, last_seq)
        except Unavailable as exc:
            self.unavailable = str(exc)
            raise


def _watch(source: RepairSource) -> _Watched:
    if isinstance(source, MirrorSource):
        return _WatchedMirror(source, source)
    return _Watched(source)


#: Damaged ranges one segment may have before the live repair gives up on it.
_MAX_RANGES = 100


def prepare_repair(
    path: Path,
    base: int,
    source: RepairSource,
    known: list[Repaired],
    *,
    end: tuple[int, int] | None = None,
    lost: Sequence[tuple[int, int]] = (),
) -> PreparedRepair | None:
    """Steps 1 (module docstring) for sealed segment ``path``; blocking.

    ``end``: the segment's end LSN and last append time (damage that runs to
    its end is rebuilt too, bounded by the next segment's checkpoint).
    ``lost``: LSN ranges an open quarantined (``lost.log``, ``repairable``):
    the checkpoints that hold them are left as damage in the copy, so that
    they are rebuilt like any damage.

    None: the segment scans sound (nothing to repair). Raises
    :class:`NotRepaired` when a damaged range is not rebuilt; the copy is
    deleted then. ``known``: ``repaired.log``'s records (new ones are added).
    """
    tmp = path.with_name(path.name + REPAIR_SUFFIX)
    old_size = path.stat().st_size
    if is_compressed(path):
        try:
            data, _ = expand_damaged(path, base)
        except CorruptData:  # an entry table or the directory does not check
            data = expand_salvaged(path, base)
        # the damaged file as it was (the range's copy is of the expanded entry log)
        qdir = path.parent.parent / QUARANTINE_DIR
        qdir.mkdir(exist_ok=True)
        replace_file(
            qdir / f"{path.parent.name}-{path.stem}-compressed.damaged",
            path.read_bytes(),
            ops=_fs.ops,
        )
    else:
        data = path.read_bytes()
    watched = _watch(source)
    done: list[Repaired] = []
    new: list[Repaired] = []
    try:
        replace_file(tmp, data, sync_dir=False, ops=_fs.ops)
        if lost:
            data = _unfill(tmp, base, data, lost)
            replace_file(tmp, data, sync_dir=False, ops=_fs.ops)
        del data
        for _ in range(_MAX_RANGES):
            try:
                scanned = scan_segment(base, tmp, last=False)
                break
            except DamagedEntry as exc:
                r = repair_damage(
                    path, base, exc, last=False, source=watched, known=known, work=tmp, end=end
                )
                if r is None:
                    raise NotRepaired(
                        watched.unavailable
                        or f"LSN {exc.lsn} on: not rebuilt from the bucket ({exc.detail})",
                        unavailable=watched.unavailable is not None,
                    ) from None
                done.append(r)
                if (
                    known and known[-1] is r
                ):  # recorded now (not by a run killed after recording it)
                    new.append(r)
        else:
            raise NotRepaired(f"more than {_MAX_RANGES} damaged ranges")
        if not done:
            _fs.ops.unlink(tmp)
            return None
        seg = scanned.segment
        parts = {key: (sp.lsns, sp.offsets) for key, sp in scanned.parts.items()}
        idx = SegmentIndex(base, seg.size, seg.last_append_time, seg.positions, parts)
        index_data, runs = idx.encode()
        fail_point("live_repair.prepared")
        return PreparedRepair(
            tmp, seg.size, seg.last_append_time, index_data, runs, done, new, old_size
        )
    except BaseException:
        with contextlib.suppress(OSError):
            _fs.ops.unlink(tmp)
        raise


def _unfill(tmp: Path, base: int, data: bytes, lost: Sequence[tuple[int, int]]) -> bytes:
    """``data`` with the entries of the ``lost`` LSN ranges (the quarantine's
    checkpoints) left as damage; as it is if the copy does not scan (damage the
    loop repairs first: the quarantined ranges wait for the next attempt)."""
    try:
        scanned = scan_segment(base, tmp, last=False)
    except CorruptData:
        return data
    positions = scanned.segment.positions
    size = scanned.segment.size
    out = bytearray(data)
    for first, last in lost:
        i, j = first - base, last + 1 - base
        if i <= 0 or j > len(positions):
            continue  # not this segment's (or its own checkpoint): left as it is
        start = positions[i]
        stop = positions[j] if j < len(positions) else size
        out[start:stop] = _FILLER * (stop - start)
    return bytes(out)


# ---------------------------------------------------------------- attempts


@dataclass(slots=True)
class _Attempts:
    """One segment's failed repairs (a value of ``repair-attempts.json``)."""

    failures: int = 0
    unavailable: int = 0
    next_ms: int = 0
    last_error: str | None = None

    @property
    def exhausted(self) -> bool:
        return self.failures >= MAX_ATTEMPTS

    def to_json(self) -> dict[str, object]:
        return {
            "failures": self.failures,
            "unavailable": self.unavailable,
            "next_ms": self.next_ms,
            "last_error": self.last_error,
        }


def load_attempts(directory: Path) -> dict[int, _Attempts]:
    """``repair-attempts.json`` (empty if missing; a file that does not read is named and
    ignored: the worst it costs is a few more attempts)."""
    path = directory / ATTEMPTS_NAME
    try:
        doc = unseal(path.read_bytes(), where=str(path), legacy_keys=frozenset())
        if doc.get("v") != VERSION:
            raise ValueError(f"unsupported version {doc.get('v')!r}")
        return {
            int(k): _Attempts(
                int(v["failures"]),
                int(v.get("unavailable", 0)),
                int(v["next_ms"]),
                None if v.get("last_error") is None else str(v["last_error"]),
            )
            for k, v in doc["segments"].items()
        }
    except FileNotFoundError:
        return {}
    except (OSError, CorruptData, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("journal: %s does not read (%s); repair attempts start again", path, exc)
        return {}


def _save_attempts(directory: Path, attempts: dict[int, _Attempts]) -> None:
    doc = {"v": VERSION, "segments": {str(k): a.to_json() for k, a in sorted(attempts.items())}}
    replace_file(directory / ATTEMPTS_NAME, seal(doc), ops=_fs.ops)


# ---------------------------------------------------------------- the part


class Host(Protocol):
    """What the live repair needs of its journal."""

    @property
    def closed(self) -> bool: ...

    @property
    def safe_lsn(self) -> int:
        """Entries below it are confirmed by the bucket (the lane's shipper watermark)."""
        ...

    def account_bytes(self, delta: int) -> None:
        """Add ``delta`` to the bytes counted against the budget."""

    def index_sealed(self, seg: Segment) -> None:
        """Write a sealed segment's index file (held in memory until it can be)."""

    def repairs(self) -> list[Repaired]:
        """``repaired.log``'s records so far (a copy)."""

    def losses(self) -> list[Loss]:
        """``lost.log``'s records so far (a copy)."""

    def repaired(self, done: list[Repaired]) -> None:
        """New records of ``repaired.log`` (the journal's list, the metrics)."""

    def compress_again(self) -> None:
        """Wake the rewriter (a repaired segment is an entry log again)."""


@dataclass(frozen=True, slots=True)
class LiveRepairStats:
    """:meth:`LiveRepair.statistics`."""

    #: a source is attached (the gateway's, main lane only)
    enabled: bool
    #: base LSNs of segments waiting for their repair
    pending: tuple[int, ...]
    #: segments repaired while running, and the ranges rebuilt in them
    segments_repaired: int
    ranges_repaired: int
    #: failed attempts (the bucket away or the range not rebuilt) and the last reason
    failures: int
    last_error: str | None
    #: base LSNs of segments given up (MAX_ATTEMPTS): quarantined at the next open
    given_up: tuple[int, ...] = field(default=())

    def to_json(self) -> dict[str, object]:
        return {
            "enabled": self.enabled,
            "pending": list(self.pending),
            "segments_repaired": self.segments_repaired,
            "ranges_repaired": self.ranges_repaired,
            "failures": self.failures,
            "last_error": self.last_error,
            "given_up": list(self.given_up),
        }


class LiveRepair:
    """Repairs a running journal's damaged sealed segments from the bucket (module docstring)."""

    def __init__(
        self,
        root: Path,
        segments: SegmentSet,
        partitions: dict[tuple[str, int], _Partition],
        index_cache: IndexCache,
        unindexed: list[Segment],
        host: Host,
        *,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._root = root
        self._segments = segments
        self._partitions = partitions
        self._index_cache = index_cache
        self._unindexed = unindexed
        self._host = host
        self._wall_ms = wall_ms
        #: gives, for each attempt, where damaged ranges are read back from (None:
        #: off; :meth:`attach`)
        self.source: Callable[[], RepairSource] | None = None
        self._pending: set[int] = set()
        #: per pending segment, the LSN ranges an open quarantined that the bucket has
        self._lost: dict[int, list[tuple[int, int]]] = {}
        #: look for such ranges in sealed segments (at attach, after a roll)
        self._look = False
        #: a quarantined range waits for the shipper to confirm its segment
        self._waiting = False
        self._attempts: dict[int, _Attempts] | None = None
        self._wake = trio.Event()
        self._limiter = trio.CapacityLimiter(1)
        self._segments_done = 0
        self._ranges_done = 0
        self._failures = 0
        self._last_error: str | None = None

    def attach(self, source: Callable[[], RepairSource]) -> None:
        """Repair from the bucket from now on: ``source()`` gives a new source for each
        attempt (the open's gives up at once after one failure); a stale copy that a
        killed repair left is deleted."""
        self.source = source
        self.sealed()
        for stale in self._root.glob(f"*{REPAIR_SUFFIX}"):
            with contextlib.suppress(OSError):
                _fs.ops.unlink(stale)

    # ------------------------------------------------------------ reports

    def sealed(self) -> None:
        """A segment was sealed (or the source attached): a range quarantined at open
        in it may be repaired now (issue 45 step 2)."""
        self._look = True
        self._wake.set()

    def _mark_losses(self) -> bool:
        """Make pending the sealed segments holding quarantined, repairable ranges; True
        if one waits for the shipper to confirm its segment whole (look again soon)."""
        waiting = False
        done = {(r.segment, r.lsn_first) for r in self._host.repairs()}
        sealed = {seg.base_lsn: seg for seg in self._segments.segments[:-1]}
        for loss in self._host.losses():
            seg = sealed.get(loss.segment)
            if seg is None or not loss.repairable or (loss.segment, loss.lsn_first) in done:
                continue
            ranges = self._lost.setdefault(seg.base_lsn, [])
            if (loss.lsn_first, loss.lsn_last) not in ranges:
                ranges.append((loss.lsn_first, loss.lsn_last))
            a = self.attempts.get(seg.base_lsn)
            if not self._mark(seg) and self.source is not None and not (a and a.exhausted):
                waiting = True  # the entries appended after the open are not shipped yet
        return waiting

    @property
    def attempts(self) -> dict[int, _Attempts]:
        if self._attempts is None:
            self._attempts = load_attempts(self._root)
        return self._attempts

    def _repairable(self, seg: Segment) -> bool:
        if self.source is None or seg is self._segments.active:
            return False
        a = self.attempts.get(seg.base_lsn)
        if a is not None and a.exhausted:
            return False
        shipped = confirmed_lsn(self._root, self._host.safe_lsn)
        if shipped is not None and shipped >= seg.end_lsn - 1:
            return True
        # Mirror entries are in their source region's log whatever this region shipped
        # (_mirror_repair.py); a range of home entries not shipped yet fails the attempt
        # (bounded, as any range not rebuilt).
        return self._holds_mirror_entries(seg)

    def _holds_mirror_entries(self, seg: Segment) -> bool:
        """Whether ``seg`` holds entries of a mirror topic (``<region>.<topic>``: a topic
        homed here has no ``.``, ``names.validate_home_topic``)."""
        return any(
            "." in p.topic and _index_of(p.seg_bases, seg.base_lsn) >= 0
            for p in self._partitions.values()
        )

    def report(self, path: Path) -> bool:
        """Damage was found in the file at ``path`` (the scrub): repair it if it can be.

        True if its segment is pending now. Never blocks.
        """
        for seg in self._segments.segments[:-1]:
            if seg.path == path:
                return self._mark(seg)
        return False

    def _mark(self, seg: Segment) -> bool:
        if seg.base_lsn in self._pending:
            return True
        if not self._repairable(seg):
            return False
        self._pending.add(seg.base_lsn)
        log.warning(
            "journal: %s is damaged and its entries are in the bucket: repairing it "
            "in the background (reads of the damage answer repair_pending until then)",
            seg.path,
        )
        self._wake.set()
        return True

    def check_read(self, exc: CorruptData) -> None:
        """A read met ``exc``: raise :class:`RepairPending` if its segment is (now) pending."""
        where = exc.where or ""
        for seg in self._segments.segments[:-1]:
            p = str(seg.path)
            if where == p or where.startswith((p + "@", p + " ")):
                if self._mark(seg):
                    raise RepairPending(
                        f"{seg.path}: damaged ({exc.reason}); being repaired from the bucket, "
                        f"retry in {RETRY_AFTER_S} s"
                    ) from exc
                return

    def statistics(self) -> LiveRepairStats:
        return LiveRepairStats(
            self.source is not None,
            tuple(sorted(self._pending)),
            self._segments_done,
            self._ranges_done,
            self._failures,
            self._last_error,
            tuple(sorted(k for k, a in (self._attempts or {}).items() if a.exhausted)),
        )

    # ------------------------------------------------------------ background

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Repair pending segments as they are reported, each when its backoff allows."""
        task_status.started()
        while not self._host.closed:
            if self._look:
                self._look = False
                self._waiting = self._mark_losses()
            now = self._wall_ms()
            due = [b for b in sorted(self._pending) if self._due(b) <= now]
            if not due:
                wait = min((self._due(b) for b in self._pending), default=now + 60_000) - now
                if self._waiting:
                    wait = min(wait, int(LOOK_S * 1000))
                    self._look = True
                with trio.move_on_after(max(wait, 0) / 1000):
                    await self._wake.wait()
                self._wake = trio.Event()
                continue
            for base in due:
                await self.repair(base)

    def _due(self, base: int) -> int:
        a = self.attempts.get(base)
        return 0 if a is None else a.next_ms

    async def repair(self, base: int) -> bool:
        """Repair the pending segment ``base`` now; True if it is sound (or gone)."""
        seg = self._held(base)
        source = self.source
        if seg is None or source is None:
            self._pending.discard(base)
            self._forget_attempts(base)
            return True
        known = self._host.repairs()
        try:
            end = (seg.end_lsn, seg.last_append_time)
            lost = tuple(self._lost.get(base, ()))
            prepared = await trio.to_thread.run_sync(
                functools.partial(
                    prepare_repair, seg.path, base, source(), known, end=end, lost=lost
                ),
                limiter=self._limiter,
            )
        except NotRepaired as exc:
            await self._failed(seg, exc.reason, unavailable=exc.unavailable)
            return False
        except (OSError, EdgeGatewayError) as exc:
            await self._failed(seg, str(exc), unavailable=False)
            return False
        if prepared is None:
            log.info("journal: %s reads sound now: nothing to repair", seg.path)
            installed = False
        else:
            try:
                installed = self._install(seg, prepared)
            except NotRepaired as exc:
                with contextlib.suppress(OSError):
                    _fs.ops.unlink(prepared.tmp)
                await self._failed(seg, exc.reason, unavailable=False)
                return False
            if not installed:
                return True
        if installed:
            assert prepared is not None
            await trio.to_thread.run_sync(fsync_dir, self._root, limiter=self._limiter)
            self._host.repaired(prepared.recorded)
            self._segments_done += 1
            self._ranges_done += len(prepared.repairs)
            self._host.compress_again()
        self._pending.discard(base)
        self._lost.pop(base, None)
        self._forget_attempts(base)
        return True

    def _held(self, base: int) -> Segment | None:
        for seg in self._segments.segments[:-1]:
            if seg.base_lsn == base:
                return seg
        return None

    def _install(self, seg: Segment, prepared: PreparedRepair) -> bool:
        """Step 2 on the event loop; False if the segment went meanwhile (copy deleted)."""
        if not self._segments.holds(seg) or seg is self._segments.active:
            with contextlib.suppress(OSError):
                _fs.ops.unlink(prepared.tmp)
            log.info("journal: %s went during its repair; repair dropped", seg.path.name)
            self._pending.discard(seg.base_lsn)
            self._forget_attempts(seg.base_lsn)
            return False
        slots = self._runs_of(seg, prepared.runs)  # before any change (NotRepaired)
        old_index = seg.index
        with contextlib.suppress(FileNotFoundError):
            # first: a crash after the rename must not find the old index beside the
            # new segment (the open then rebuilds the index by a scan)
            _fs.ops.unlink(seg.index_path)
        _fs.ops.replace(prepared.tmp, seg.path)
        fail_point("live_repair.renamed")
        if old_index is not None:
            self._index_cache.forget(old_index)
            self._host.account_bytes(-old_index.size if old_index.data is None else 0)
        if seg in self._unindexed:
            self._unindexed.remove(seg)
        self._segments.swap_entry_log(seg, prepared.size)
        seg.last_append_time = prepared.last_append_time
        seg.index = IndexFile.from_bytes(seg.index_path, self._index_cache, prepared.index_data)
        for p, k, run in slots:
            self._put_run(p, k, seg.base_lsn, run)
        self._host.account_bytes(prepared.size - prepared.old_size)
        self._host.index_sealed(seg)
        return True

    def _runs_of(
        self, seg: Segment, runs: list[PartitionRun]
    ) -> list[tuple[_Partition, int | None, PartitionRun]]:
        """Each new run with its partition and the place of its run in ``seg`` (None: it
        had none there, every entry of it was quarantined). Raises :class:`NotRepaired`
        when they do not fit the journal's (a partition it does not know, or one whose
        run in ``seg`` the repair lost): nothing is changed then."""
        out: list[tuple[_Partition, int | None, PartitionRun]] = []
        for r in runs:
            p = self._partitions.get((r.topic, r.partition))
            if p is None:
                raise NotRepaired(f"the repair holds {r.topic}/{r.partition}, unknown here")
            k = _index_of(p.seg_bases, seg.base_lsn)
            out.append((p, None if k < 0 else k, r))
        kept = {id(p) for p, _, _ in out}
        for p in self._partitions.values():
            if id(p) not in kept and _index_of(p.seg_bases, seg.base_lsn) >= 0:
                raise NotRepaired(f"the repair lost {p.topic}/{p.partition}'s entries")
        return out

    @staticmethod
    def _put_run(p: _Partition, k: int | None, base: int, r: PartitionRun) -> None:
        if k is None:
            k = bisect.bisect_left(p.seg_bases, base)
            p.seg_bases.insert(k, base)
            p.seg_first.insert(k, r.first_offset)
            p.seg_at.insert(k, r.at)
            p.seg_count.insert(k, r.count)
            return
        p.seg_first[k] = r.first_offset  # lower, if its first entries were quarantined
        p.seg_at[k] = r.at
        p.seg_count[k] = r.count

    async def _failed(self, seg: Segment, reason: str, *, unavailable: bool) -> None:
        base = seg.base_lsn
        a = self.attempts.setdefault(base, _Attempts())
        if unavailable:
            a.unavailable += 1
        else:
            a.failures += 1
        # the shared backoff, at this segment's count of failures, above half its ceiling
        backoff = Backoff(BACKOFF_BASE_S, BACKOFF_CAP_S, a.failures + a.unavailable - 1)
        a.next_ms = self._wall_ms() + int(backoff.next_delay(0.5 + random.random() / 2) * 1000)
        a.last_error = reason
        self._failures += 1
        self._last_error = f"{seg.path.name}: {reason}"
        if a.exhausted:
            self._pending.discard(base)
            log.error(
                "journal: %s is damaged and was not repaired from the bucket after %d "
                "attempts (%s): given up; its reads answer corrupt_data (to quarantine the "
                "damage: stop the gateway, delete the segment's .idx file and start it; "
                'docs/operations.md, "A damaged disk")',
                seg.path,
                a.failures,
                reason,
            )
        else:
            log.warning(
                "journal: repairing %s from the bucket failed (%s); tried again in %.0f s",
                seg.path,
                reason,
                (a.next_ms - self._wall_ms()) / 1000,
            )
        await trio.to_thread.run_sync(_save_attempts, self._root, dict(self.attempts))

    def _forget_attempts(self, base: int) -> None:
        if self._attempts is not None and self._attempts.pop(base, None) is not None:
            with contextlib.suppress(OSError):
                _save_attempts(self._root, self._attempts)


def _index_of(bases: Sequence[int], base: int) -> int:
    for k, b in enumerate(bases):
        if b == base:
            return k
    return -1
