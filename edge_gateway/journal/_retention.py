"""Retention: which segments are deleted, and when (shipped, drop-oldest, a full disk).

What it owns (:class:`Retention`, a part the journal composes): the safe
LSN (the shipper's confirmed watermark) and deleting sealed segments below
it once retention or the budget allows (``set_safe_lsn``,
``delete_segments``, the retention ticker); a drop-oldest journal's
deletion of unshipped segments, recorded first in ``dropped.log``
(``drop_unshipped``, ``shed``; the records and their queries are the
journal's ``DropLog``, ``_dropped.py``); and a disk-full episode
(``while_disk_full``, ``keep_free``, ``roll_making_room``, ``check_disk``
and the disk watch; the filesystem side is ``_space.py``). The segments
themselves are taken off the journal's ``SegmentSet`` (``_segment_set.py``).

It is given the parts it works on (the segment set, the disk, the drop log,
the partitions' indexes, durability) and the journal's append path as
:class:`RetainedLog` (its byte count and budget, the roll, the map); it does
not import the journal.
"""

from __future__ import annotations

import bisect
import logging
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

import trio

from edge_gateway.errors import DiskFull
from edge_gateway.journal._config import JournalConfig
from edge_gateway.journal._dropped import Drop, DropLog, DroppedRange
from edge_gateway.journal._durability import Durability
from edge_gateway.journal._index import IndexCache
from edge_gateway.journal._segment import Segment
from edge_gateway.journal._segment_set import SegmentSet
from edge_gateway.journal._space import DiskSpace, no_room
from edge_gateway.journal._state import _now_ms, _Partition

log = logging.getLogger("edgegw.journal")


#: On a full disk the active segment is sealed early (so it can be deleted once
#: shipped) only if at least this much of it is shipped: no storm of tiny segments.
_EARLY_ROLL_MIN: Final = 64 * 1024
#: Why drop-oldest deleted an unshipped segment (the log line's tail).
_OVER_BUDGET: Final = " (drop-oldest: the lane is over its budget)"
_DISK_FULL: Final = " (drop-oldest: the disk is full)"


class RetainedLog(Protocol):
    """What retention asks of the journal whose segments it deletes (its append path)."""

    path: Path
    #: bytes of the segments and their index files
    _total_bytes: int
    _max_bytes: int
    _segment_bytes: int
    #: appends call ``_reserve`` once the active segment would pass this
    _roll_at: int
    _broken: str | None
    _closed: bool
    drop_oldest: bool
    make_room_elsewhere: Callable[[int], bool] | None

    def _roll(self) -> None:
        """Seal the active segment and start the next one."""

    def _map(self, seg: Segment) -> None:
        """Map the active segment for small appends."""

    def _write_index(self, seg: Segment) -> None:
        """Write a sealed segment's index file."""

    def _settle(self) -> None:
        """Finish the mirror group in flight, if any."""


class Retention:
    """Deletes a journal's segments: shipped ones within the policy, unshipped ones
    in a drop-oldest journal, and what a full disk needs."""

    def __init__(
        self,
        journal: RetainedLog,
        config: JournalConfig,
        segments: SegmentSet,
        space: DiskSpace,
        drop_log: DropLog,
        durability: Durability,
        index_cache: IndexCache,
        partitions: dict[tuple[str, int], _Partition],
        unindexed: list[Segment],
    ) -> None:
        #: the journal's append path (``w`` in the methods)
        self._writer = journal
        self._config = config
        self._set = segments
        self._space = space
        self._drop_log = drop_log
        self._durability = durability
        self._index_cache = index_cache
        self._partitions = partitions
        #: sealed segments whose index file could not be written yet
        self._unindexed = unindexed
        #: entries below it are confirmed elsewhere (shipped): they may be deleted
        self.safe_lsn = 0

    async def ticker(self, period: float = 5.0) -> None:
        """Delete what the watermark and retention allow, every ``period`` seconds."""
        while True:
            await trio.sleep(period)
            self.delete_segments()

    async def disk_watch(self) -> None:
        """Notice space returning to a full disk (5 times a second while full, else each second)."""
        while True:
            await trio.sleep(0.2 if self._space.full_since is not None else 1.0)
            self.check_disk()
            # With fsync = "never" no fsync hands the map's pages back.
            self._set.segments[-1].release_written()

    def set_safe_lsn(self, lsn: int) -> None:
        """Entries below ``lsn`` are confirmed elsewhere (shipped) and may be deleted.

        Deletion still waits for the retention policy. The watermark only moves
        forward.
        """
        if lsn > self.safe_lsn:
            self.safe_lsn = min(lsn, self._durability.durable_lsn + 1)
            self.delete_segments()

    def delete_segments(self, need: int = 0, *, force: bool = False, limit: int = -1) -> int:
        """Delete the oldest sealed segments the watermark and retention allow.

        ``force`` (a full disk) deletes shipped segments within retention
        too. Deletion always goes oldest first, so segments past retention
        go before any within it, and stops at the first segment holding an
        entry at or above the safe LSN: never an unshipped byte.
        """
        w = self._writer
        deleted = 0
        now = _now_ms()
        keep_bytes = self._config.effective_retention_bytes
        while len(self._set.segments) > 1 and deleted != limit:
            seg = self._set.segments[0]
            if seg.end_lsn > self.safe_lsn:
                break
            expired = now - seg.last_append_time >= self._config.retention_ms
            pressure = w._total_bytes > keep_bytes or (
                need and w._total_bytes + need > w._max_bytes
            )
            if not (expired or pressure or force):
                break
            early = not (expired or pressure)
            why = " before its retention ended: the disk is (nearly) full" if early else ""
            if not self._drop_oldest(why):
                break
            deleted += 1
            if early:
                self._space.deleted_early()
        return deleted

    def drop_unshipped(self, why: str = _OVER_BUDGET) -> bool:
        """Delete the oldest sealed segment though it is not (all) shipped, after
        recording exactly what it held in ``dropped.log`` (fsynced). False if there
        is none (only the active segment is left) or it could not be deleted.

        On a disk full to the last byte the record itself needs room: the
        reserve file gives it (the drop then frees a whole segment, and the
        reserve comes back once the disk has room for it)."""
        w = self._writer
        if len(self._set.segments) < 2 or w._broken is not None:
            return False
        seg = self._set.segments[0]
        first = max(seg.base_lsn, self.safe_lsn)
        held_to = min(max(first, self._drop_log.taken_lsn), seg.end_lsn)
        parts = [(first, held_to, True), (held_to, seg.end_lsn, False)]
        drops = [self._describe_drop(seg, a, b, held) for a, b, held in parts if a < b]
        if not self._drop_log.last_is_of(seg.base_lsn):
            # (A second try after a failed unlink records nothing twice.)
            try:
                self._record_drops(drops)
            except OSError as exc:
                log.warning("journal: cannot record a drop in %s: %s", w.path, exc)
                return False
        self.safe_lsn = max(self.safe_lsn, seg.end_lsn)
        for d in drops:
            log.warning(
                "journal: dropping unshipped segment %s of drop-oldest lane %s (LSN %d-%d%s): %s",
                seg.path.name,
                w.path.name,
                d.lsn_first,
                d.lsn_last,
                ", in an object being shipped" if d.held else "",
                "; ".join(
                    f"{r.topic}/{r.partition} offsets {r.first}-{r.last} "
                    f"({r.records} records, {r.bytes} bytes)"
                    for r in d.ranges
                )
                or "no records",
            )
        return self._drop_oldest(why)

    def _record_drops(self, drops: list[Drop]) -> None:
        """Record ``drops`` (``dropped.log``, then memory); on no room, release the
        reserve file and retry."""
        try:
            self._drop_log.append(drops)
        except OSError as exc:
            if not (no_room(exc) and self._space.release_reserve("to record a drop")):
                raise
            self._drop_log.append(drops)

    def make_room_unshipped(self, need: int) -> bool:
        """The disk is full and no shipped segment is left to delete: a drop-oldest
        journal drops its oldest unshipped sealed segment (recorded as any drop);
        a block journal asks the drop-oldest journals beside it
        (:attr:`make_room_elsewhere`) and never drops a byte of its own. True if
        room was made."""
        w = self._writer
        if w.drop_oldest:
            return self.drop_unshipped(_DISK_FULL)
        ask = w.make_room_elsewhere
        return ask is not None and ask(need)

    def _drop_for_space(self) -> bool:
        """A drop-oldest journal on a full disk: drop its oldest unshipped segment; if
        only the active one is left and it holds enough to be worth it, seal it
        early first (the reserve file pays for the new segment). True if room was made."""
        if len(self._set.segments) < 2:
            if self._set.segments[-1].size < _EARLY_ROLL_MIN:
                return False
            try:
                self.roll_making_room()
            except DiskFull:
                return False
        return self.drop_unshipped(_DISK_FULL)

    def shed(self, nbytes: int, *, disk_full: bool = False) -> int:
        """Free at least ``nbytes`` of the budget if this is a drop-oldest journal:
        shipped segments first, then the oldest unshipped ones (recorded as any
        drop). For a block lane of the same gateway that is full, or that found
        the disk full (``disk_full``: what the log says), see ``Lanes``.
        Returns the bytes freed (0 for a block journal)."""
        w = self._writer
        if not w.drop_oldest or w._closed:
            return 0
        why = _DISK_FULL if disk_full else _OVER_BUDGET
        before = w._total_bytes
        while before - w._total_bytes < nbytes:
            if self.delete_segments(force=True, limit=1):
                continue
            if not self.drop_unshipped(why):
                break
        return before - w._total_bytes

    def _describe_drop(self, seg: Segment, lsn_a: int, lsn_b: int, held: bool) -> Drop:
        """What ``seg``'s entries with LSNs ``lsn_a <= lsn < lsn_b`` hold, per partition.

        From the index only: a partition's offsets within a lane are contiguous,
        so an entry ends where the partition's next entry starts (in this
        segment, the next one, or the active segment's index). A compressed
        segment's come from its entry tables, and its sizes are those of the
        entries it holds as journal entries (``wal_bytes`` split by entry).
        """
        runs: dict[tuple[str, int], tuple[array[int], array[int]]] = {}
        if seg.compressed is not None:
            segments = self._set
            positions = array(
                "q", seg.compressed.load_positions(lambda k, at: segments.file_pread(seg, k, at))
            )
            positions.append(seg.compressed.wal_bytes)
            runs = seg.compressed.partition_runs(lambda k, at: segments.file_pread(seg, k, at))
        else:
            assert seg.index is not None
            positions = seg.index.positions().to_array()
            positions.append(seg.size)
        ranges: list[DroppedRange] = []
        for (topic, partition), p in sorted(self._partitions.items()):
            if not p.seg_bases or p.seg_bases[0] != seg.base_lsn:
                continue
            if seg.compressed is not None:
                lsns, offsets = runs.get((topic, partition), (array("q"), array("q")))
            else:
                assert seg.index is not None
                run_lsns, run_offsets = seg.index.run(p.seg_at[0], p.seg_count[0])
                lsns, offsets = run_lsns.to_array(), run_offsets.to_array()
            n = len(lsns)
            ka = bisect.bisect_left(lsns, lsn_a)
            kb = bisect.bisect_left(lsns, lsn_b)
            if ka >= kb:
                continue
            if kb < n:
                end = offsets[kb]
            elif len(p.seg_first) > 1:
                end = p.seg_first[1]
            elif p.offsets:
                end = p.offsets[0]
            else:
                end = p.next_offset
            base = seg.base_lsn
            size = sum(positions[i - base + 1] - positions[i - base] for i in lsns[ka:kb])
            first = offsets[ka]
            ranges.append(DroppedRange(topic, partition, first, end - 1, end - first, size))
        return Drop(seg.base_lsn, seg.end_lsn, lsn_a, lsn_b - 1, _now_ms(), held, tuple(ranges))

    def _drop_oldest(self, why: str = "") -> bool:
        w = self._writer
        deleted = self._set.delete_oldest()
        if deleted is None:
            return False
        seg, freed = deleted
        if seg in self._unindexed:
            self._unindexed.remove(seg)
        w._total_bytes -= freed
        base = seg.base_lsn
        for p in self._partitions.values():
            if p.seg_bases and p.seg_bases[0] == base:
                del p.seg_bases[0], p.seg_first[0], p.seg_at[0], p.seg_count[0]
        if seg.index is not None:
            self._index_cache.forget(seg.index)
        log.info(
            "journal: deleted segment %s (LSN %d-%d)%s",
            seg.path.name,
            seg.base_lsn,
            seg.end_lsn - 1,
            why,
        )
        return True

    def disk_space(self) -> tuple[int, int]:
        """(bytes free for this user, size) of the filesystem under the journal; -1 if unknown."""
        return self._space.free_and_size()

    def disk_full(self, where: Path, exc: OSError, need: int) -> DiskFull:
        """Note that a write found no room (see :meth:`DiskSpace.full`); the error to raise.

        Until the episode ends every append passes :meth:`_reserve`, which
        makes room or notices the space.
        """
        w = self._writer
        if self._space.full_since is None:
            w._roll_at = 0
        return self._space.full(where, exc, need)

    def refused(self) -> None:
        """Count an append refused with DiskFull."""
        self._space.refused()

    def keep_free(self) -> None:
        """Delete shipped segments while the disk has less room than the next two segments need.

        Oldest first, within retention too: a disk about to fill would
        otherwise refuse new data to keep old, already shipped data. Keeping
        this headroom also keeps preallocation (and the fast append path)
        working on a small disk.
        """
        w = self._writer
        free, _ = self.disk_space()
        low = 2 * w._segment_bytes + self._config.reserve_bytes
        while 0 <= free < low and len(self._set.segments) > 1:
            oldest = self._set.segments[0]
            if not self.delete_segments(force=True, limit=1):
                return
            free += oldest.size

    def _end_disk_full(self, free: int) -> None:
        w = self._writer
        self._space.end(free)
        w._roll_at = w._segment_bytes
        active = self._set.segments[-1]
        if active.mm is None and active.fd is not None:
            w._map(active)  # preallocation failed while the disk was full

    def while_disk_full(self, length: int) -> None:
        """Before an append while the disk is full: notice space returning, or make room."""
        w = self._writer
        seg = self._set.segments[-1]
        if seg.size + length <= seg.mm_end:
            return  # it goes into space preallocated before the disk filled
        free, _ = self.disk_space()
        if free >= self._space.resume_at:
            self._end_disk_full(free)
            return
        if self.delete_segments(force=True, limit=1):
            return
        if w.drop_oldest and self._drop_for_space():
            return
        if self._shipped_bytes(seg) >= _EARLY_ROLL_MIN:
            # Everything shipped is in the active segment: seal it early, so
            # that it can be deleted (now, or once its tail is shipped).
            self.roll_making_room()
            self.delete_segments(force=True, limit=1)

    def _shipped_bytes(self, seg: Segment) -> int:
        """Bytes of ``seg``'s entries below the safe LSN."""
        k = self.safe_lsn - seg.base_lsn
        if k <= 1:
            return 0
        positions = seg.entry_positions
        return (positions[k] if k < seg.entries else seg.size) - positions[0]

    def roll_making_room(self) -> None:
        """Roll; if the disk is too full for the new segment, make room and retry.

        Room comes from shipped segments, oldest first, then from drop-oldest
        data (see :meth:`make_room_unshipped`), then from the reserve file,
        which exists for this moment: with it gone, the new segment fits, and
        the sealed one can be deleted once shipped (or dropped, in a
        drop-oldest journal).
        """
        w = self._writer
        while True:
            try:
                w._roll()
                return
            except DiskFull:
                if self.delete_segments(force=True, limit=1):
                    continue
                if self.make_room_unshipped(0):
                    continue
                # A drop-oldest journal's active segment is dropped once sealed,
                # shipped or not.
                active = self._set.segments[-1]
                if (
                    w.drop_oldest or self._shipped_bytes(active) >= _EARLY_ROLL_MIN
                ) and self._space.release_reserve():
                    continue
                raise

    def check_disk(self) -> None:
        """Look at the disk: end a disk-full episode when space returned, catch up on chores.

        :meth:`run` calls it five times a second while the disk is full and
        once a second otherwise. With room again it writes index files that
        could not be written and recreates the reserve file.
        """
        w = self._writer
        if w._closed:
            return
        w._settle()
        if self._space.full_since is not None:
            free, _ = self.disk_space()
            if free < self._space.resume_at:
                return
            self._end_disk_full(free)
        if w._broken is not None:
            return
        self.keep_free()
        for seg in list(self._unindexed):
            try:
                w._write_index(seg)  # (and drop it from memory)
            except OSError:
                break
            self._unindexed.remove(seg)
            log.info("journal: wrote the index of %s", seg.path.name)
        self._space.keep_reserve()
