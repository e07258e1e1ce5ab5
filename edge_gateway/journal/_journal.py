"""The local write-ahead journal: one log for every topic and partition of a site.

Invariants (the tests check each one):

* Entries have consecutive LSNs; a segment holds a contiguous LSN range and is
  named after its first LSN.
* Per partition, offsets are assigned at append and are gap-free (a mirror
  partition may skip forward only when the caller says so, for a source gap).
* An entry is visible to readers once written to the OS; ``durable_lsn`` says
  how far an fsync has covered. Appends with ``fsync=always`` return only when
  covered.
* A torn or corrupt tail of the active segment is truncated on open (and
  logged with its byte position); corruption anywhere else stops the open
  with an error naming the segment and position. A corrupt entry is never
  served.
* A segment is deleted only when every entry in it is below the caller's
  safe LSN (the shipper's confirmed watermark) *and* the retention policy
  allows; a full disk budget makes appends fail with ``JournalFull`` and never
  touches acknowledged data. A full disk (``ENOSPC``, ``EDQUOT``) deletes
  shipped segments within retention, oldest first, before an append fails
  with ``DiskFull``; it never deletes an unshipped byte, except in a
  ``drop-oldest`` journal, which then drops its oldest unshipped segments
  (recorded first in ``dropped.log``) as it does over its budget, and which a
  block journal beside it may ask to (``make_room_elsewhere``).
* A write that fails leaves the journal as it was before it: a partly written
  entry is truncated away, a roll that fails half way is undone (the old
  segment stays active) and retried by the next append, an index file that
  cannot be written is written later (or rebuilt from its segment at open).
* After a failed fsync, or a write that fails for another reason than a full
  disk (``EIO``: a failing card), the journal stops intake for good
  (``Unavailable``) and never counts anything after its last good fsync as
  durable: the kernel may have dropped the dirty pages (PostgreSQL's
  "fsyncgate"). Reads and shipping of the durable entries go on.

* Only the active segment's read index is in memory. A sealed segment's is in
  its index file (written atomically at the seal, rebuilt from the segment if
  missing or damaged), read through one bounded cache, so the index's memory
  is bounded by the configuration, not by the backlog (docs/journal.md,
  "Memory"); until a full disk lets the file be written, its bytes are read
  from memory.

The parts, as in Kafka's log: ``_segment.py`` (a segment file),
``_index.py`` (its index file and the cache), ``_recovery.py`` (the open's
scan), ``_space.py`` (the filesystem: disk full, the reserve file),
``_state.py`` (the in-memory records: ``Appended``, per partition, per topic,
the runs of mirror LSNs). The Journal holds the append path and composes
parts that own their state, given what they need (none imports the
Journal): ``SegmentSet`` (``_segment_set.py``: the segments at rest and the
descriptors reads go through), ``Reads`` (``_reads.py``: the read path),
``Durability`` (``_durability.py``: ``durable_lsn``, group commit, the
interval flusher), ``DropLog`` (``_dropped.py``: ``dropped.log`` and the
drops queries), ``Retention`` (``_retention.py``: the safe LSN, deleting
segments, drop-oldest, a full disk) and ``MirrorAppends``
(``_mirror_append.py``: the mirror append path and its group in flight).
Its methods that belong to a part delegate to it, so the Journal's public
methods are as before. The open (``_open.py``, a procedure) fills in a new
journal's state from its directory. docs/journal.md, "How the journal is
laid out", draws the whole.
Every system call that writes goes through ``_fs.ops`` (``_fs.py``), the seam
the fault-injection tests swap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import sys
import time
from array import array
from collections.abc import AsyncIterator, Callable, Container, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

import trio
import trio.lowlevel

from edge_gateway._crc import crc32c
from edge_gateway.datadir import DirectoryLock, lock_directory
from edge_gateway.errors import (
    ClosedError,
    CorruptData,
    DiskFull,
    InvalidInput,
    JournalFull,
    Unavailable,
)
from edge_gateway.format import batch as fbatch
from edge_gateway.format import entry as fentry
from edge_gateway.format.atrest import FrameCache
from edge_gateway.format.entry import Checkpoint, Entry, ProducerFields, SourceCoords
from edge_gateway.journal import _chunks, _fs, _open
from edge_gateway.journal._chunks import ChunkSpan, StoredChunk
from edge_gateway.journal._config import FsyncPolicy, JournalConfig
from edge_gateway.journal._dropped import Drop, DropLog
from edge_gateway.journal._durability import Durability
from edge_gateway.journal._index import (
    IndexCache,
    IndexFile,
    PartitionRun,
    SegmentIndex,
)
from edge_gateway.journal._live_repair import LiveRepair
from edge_gateway.journal._lost_repaired import still_lost
from edge_gateway.journal._mirror_append import MirrorAppends, MirrorBatch, MirrorBlock
from edge_gateway.journal._quarantine import Loss
from edge_gateway.journal._reads import OffsetOutOfRange, ReadBuffers, Reads
from edge_gateway.journal._repair import Repaired, RepairSource
from edge_gateway.journal._retention import Retention
from edge_gateway.journal._rewriter import Rewriter
from edge_gateway.journal._segment import Segment, segment_name, write_atomically
from edge_gateway.journal._segment_set import SegmentSet
from edge_gateway.journal._space import RESERVE_NAME, DiskSpace, no_room
from edge_gateway.journal._state import Appended, MirrorRuns, _now_ms, _Partition, _Topic
from edge_gateway.names import validate_topic

__all__ = [
    "RESERVE_NAME",
    "Appended",
    "Journal",
    "JournalStats",
    "MirrorBatch",
    "MirrorBlock",
    "OffsetOutOfRange",
]

log = logging.getLogger("edgegw.journal")

_MAX_PARTITION: Final = 2**31 - 1
# Entries up to this size are assembled into one bytes object and copied into
# the active segment's map; larger ones go out with pwritev, batch uncopied.
_SMALL_WRITE: Final = 16 * 1024
_BATCH_PEEK = fbatch.HEADER_PEEK
_LEN_CRC = fentry.ENTRY_LEN_CRC
_NO_WATCH: Final = 2**63
_MAX_BATCH: Final = fbatch.MAX_BATCH_BYTES
#: RAM of one segment's summary beyond its arrays: the Segment, its paths, its
#: IndexFile, its slots in the journal's lists (~1.1 KiB measured with
#: tracemalloc, rounded up; see docs/journal.md "Memory")
_SEGMENT_MEMORY: Final = 1280
_crc = crc32c
_time_ns = time.time_ns
_new_appended = tuple.__new__
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_cancel_shielded_checkpoint = trio.lowlevel.cancel_shielded_checkpoint


@dataclass(frozen=True, slots=True)
class JournalStats:
    """A snapshot of the journal's counters (see :meth:`Journal.statistics`)."""

    segments: int
    bytes: int
    max_bytes: int
    first_lsn: int
    next_lsn: int
    durable_lsn: int
    safe_lsn: int
    partitions: int
    appends: int
    appended_bytes: int
    fsyncs: int
    fsync_seconds_total: float
    fsync_seconds_max: float
    full_rejections: int
    truncated_bytes_on_open: int
    open_seconds: float
    #: bytes of entries in the active segment (what the next open scans)
    active_segment_bytes: int
    #: free bytes (for this user) and size of the filesystem under the journal (-1: unknown)
    disk_free_bytes: int = -1
    disk_size_bytes: int = -1
    #: the disk is full (ENOSPC/EDQUOT): appends that do not fit fail with DiskFull
    disk_full: bool = False
    #: appends refused with DiskFull, and the episodes of a full disk, since open
    disk_full_rejections: int = 0
    disk_full_episodes: int = 0
    #: shipped segments deleted before their retention ended, to make room on a full disk
    segments_deleted_for_space: int = 0
    #: why intake stopped for good (a failed fsync, EIO), or None
    failed: str | None = None
    #: RAM held by the read index: the active segment's, the sealed segments'
    #: summaries, index files not written yet, and the index cache (see
    #: docs/journal.md, "Memory")
    index_memory_bytes: int = 0
    #: of which pages of index files in the cache, and its capacity
    index_cache_bytes: int = 0
    index_cache_capacity_bytes: int = 0
    #: index page lookups served from the cache, and read from the file
    index_cache_hits: int = 0
    index_cache_misses: int = 0
    #: A ``drop-oldest`` journal (docs/journal.md, "Drop-oldest lanes").
    drop_oldest: bool = False
    #: Unshipped segments it deleted to make room, and the records and bytes in them
    #: (over the life of the journal: counted from ``dropped.log`` at open; records
    #: the shipper was committing when they were dropped are not counted).
    dropped_segments: int = 0
    dropped_records: int = 0
    dropped_bytes: int = 0
    #: sealed segments at rest compressed (``EGWC``, docs/at-rest.md), their bytes
    #: on disk, and the bytes of the entry logs they replaced
    compressed_segments: int = 0
    compressed_bytes: int = 0
    compressed_wal_bytes: int = 0
    #: decompressed frames held (``journal.block_cache_bytes``), and lookups
    #: served from them or decompressed
    block_cache_bytes: int = 0
    block_cache_hits: int = 0
    block_cache_misses: int = 0
    #: the background rewrite (``journal.at_rest``, docs/at-rest.md): running,
    #: segments rewritten and their bytes before (entry logs) and after
    #: (compressed), failed rewrites, sealed entry logs still to rewrite
    rewriter_running: bool = False
    rewritten_segments: int = 0
    rewritten_bytes_before: int = 0
    rewritten_bytes_after: int = 0
    rewrite_failures: int = 0
    rewrite_pending: int = 0
    #: the largest peak resident memory a rewrite's child process reported
    rewrite_child_max_rss_bytes: int = 0
    #: entries lost to damage in the middle of a segment and quarantined (over the
    #: life of the journal, from ``lost.log``): LSNs, and the records known lost
    #: (``exact: false`` ranges count at their bound; docs/operations.md)
    lost_lsns: int = 0
    lost_records: int = 0
    #: of them, those a later repair rebuilt (``repaired.log`` supersedes the loss,
    #: ``_lost_repaired.py``): still lost are ``lost_lsns - lost_repaired_lsns``
    lost_repaired_lsns: int = 0
    lost_repaired_records: int = 0


class Journal:
    """One write-ahead log for all topics and partitions of a site.

    Open it with :func:`open_journal`. Appends and reads are synchronous calls
    on the event-loop thread (a write to the OS page cache takes microseconds);
    only fsync runs in a worker thread. Waiting is explicit:
    :meth:`wait_durable`, :meth:`wait_for`, :meth:`wait_appended`.
    """

    def __init__(self, path: Path, config: JournalConfig) -> None:
        self.path = path
        self.config = config
        #: the segments at rest, and the descriptors reads go through
        self._segment_set = SegmentSet(FrameCache(config.block_cache_bytes))
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._sources: dict[str, SourceCoords] = {}
        self._topics: dict[str, _Topic] = {}
        self._next_lsn = 1
        self._total_bytes = 0
        self._append_waiters = 0
        self._bytes_watch = _NO_WATCH
        self._bytes_targets: list[int] = []
        self._notify_at = _NO_WATCH
        self._bytes_lot = trio.lowlevel.ParkingLot()
        #: wall-clock ms of the latest append (the active segment's last append time)
        self._now = 0
        self._last_yield_ms = 0
        self._always = config.fsync is FsyncPolicy.ALWAYS
        self._yield_ms = config.fsync_interval_ms
        self._segment_bytes = config.segment_bytes
        #: appends call _reserve once the active segment would pass this: the
        #: segment size, or 0 while the disk is full (every append checks then)
        self._roll_at = config.segment_bytes
        self._max_bytes = config.max_bytes
        self._fsync_bytes = config.fsync_bytes
        self._closed = False
        #: why intake stopped for good (a failed fsync, EIO); reads go on
        self._broken: str | None = None
        #: the filesystem: free space, disk-full episodes, the reserve file
        self._space = DiskSpace(path, config.reserve_bytes)
        #: sealed segments whose index file could not be written yet
        self._unindexed: list[Segment] = []
        #: pages of sealed segments' index files (journal.index_cache_bytes)
        self._index_cache = IndexCache(config.index_cache_bytes)
        self._append_lot = trio.lowlevel.ParkingLot()
        # counters
        self._rolls = 0
        self._lsn_at_open = 1
        self._appended_bytes = 0
        self._full_rejections = 0
        self._truncated_on_open = 0
        self._open_seconds = 0.0
        self._lock: DirectoryLock | None = None
        #: A drop-oldest journal: over budget, or on a full disk, delete the oldest
        #: unshipped segment.
        self.drop_oldest = False
        #: A block journal on a full disk, with no shipped segment left to delete:
        #: asks the drop-oldest journals beside it to free about ``n`` bytes of the
        #: filesystem before refusing (set by ``Lanes``); True if any was freed.
        self.make_room_elsewhere: Callable[[int], bool] | None = None
        #: What drop-oldest deleted unshipped (dropped.log), and what the
        #: shipper is committing (drops below it are ``held``).
        self._drop_log = DropLog(path)
        #: entries lost to damage and quarantined (``lost.log``, _quarantine.py), oldest first
        self._losses: list[Loss] = []
        #: damaged ranges rebuilt from the bucket (``repaired.log``, _repair.py), oldest first
        self._repairs: list[Repaired] = []
        #: where an open reads damaged, shipped ranges back from (None: quarantined)
        self._repair_source: RepairSource | None = None
        #: The active segment's version: producer entries go only into a version 2 one,
        #: block entries only into a version 3 one.
        self._active_version = fentry.SEGMENT_VERSION
        #: The version new segments get: 3 once the journal holds a block entry
        #: (then every roll keeps it), else 2, so a journal with no block entries
        #: stays readable by the code before them.
        self._write_version = fentry.SEGMENT_VERSION
        #: The idempotent producers' state for the checkpoint of each new
        #: segment (set by the gateway; ``ProducerTable.snapshot``).
        self.producer_snapshot: Callable[[], dict[str, Any]] | None = None
        #: What open found for the producers: the last segment's checkpoint
        #: state and the producer entries after it (``Gateway`` rebuilds its table).
        self.recovered_producers: dict[str, Any] | None = None
        self.recovered_producer_entries: list[Entry] = []
        #: LSN runs of mirror entries appended since the open, for
        #: :meth:`read_entries` to step over without reading them (a hint)
        self._mirror_runs = MirrorRuns()
        #: the read path: given the segments, the partitions' indexes, the
        #: mirror runs, and this journal for its ends (``next_lsn``,
        #: ``durable_lsn``, ``closed``)
        self._reads = Reads(self._segment_set, self._partitions, self._mirror_runs, self)
        #: group commit and the fsync policy: owns durable_lsn; given the
        #: segments (it fsyncs the active one) and this journal as the log it
        #: makes durable
        self._durability = Durability(config, self._segment_set, self)
        #: what is deleted and when: owns the safe LSN; given the parts it
        #: deletes from and this journal's append path (its bytes, the roll)
        self._retention = Retention(
            self,
            config,
            self._segment_set,
            self._space,
            self._drop_log,
            self._durability,
            self._index_cache,
            self._partitions,
            self._unindexed,
        )
        #: the mirror append path and its group in flight (``inflight``, which
        #: every other writer settles first); given this journal's append path
        #: and retention (a full disk)
        self._mirrors = MirrorAppends(self, self._retention, self._mirror_runs)
        #: the background rewrite of sealed segments, compressed (``journal.at_rest``;
        #: the gateway runs :meth:`Rewriter.run` when it is on)
        self.rewriter = Rewriter(
            path,
            self._segment_set,
            self._index_cache,
            self._unindexed,
            self,
            level=config.at_rest_level,
        )
        #: damaged sealed segments rebuilt from the bucket while the journal runs
        #: (``_live_repair.py``; the gateway attaches the source and runs it)
        self.live_repair = LiveRepair(
            path,
            self._segment_set,
            self._partitions,
            self._index_cache,
            self._unindexed,
            self,
        )

    @property
    def _segments(self) -> list[Segment]:
        """The segments, oldest first, the active one last (the segment set's list)."""
        return self._segment_set.segments

    @property
    def closed(self) -> bool:
        """The journal is closed (reads and waits raise ``ClosedError``)."""
        return self._closed

    # ------------------------------------------------------------------ open

    @classmethod
    def open_sync(
        cls,
        path: str | os.PathLike[str],
        config: JournalConfig | None = None,
        *,
        start: Checkpoint | None = None,
        start_lsn: int = 1,
        drop_oldest: bool = False,
        repair: RepairSource | None = None,
    ) -> Journal:
        """Open (or create) the journal in ``path`` and recover its state.

        Blocking; :func:`open_journal` runs it in a worker thread and starts
        the background flusher. ``start`` and ``start_lsn`` apply only when the
        directory holds no journal yet: a restore continues the LSNs and
        offsets that the bucket already has, so nothing is ever reused.
        ``repair``: where damage found by the open is rebuilt from (``_repair.py``);
        without it (or when it cannot), the damage is quarantined.
        """
        t0 = time.perf_counter()
        if start_lsn < 1:
            raise InvalidInput("start_lsn must be >= 1")
        j = cls(Path(path), config or JournalConfig())
        j.drop_oldest = j._space.drop_oldest = drop_oldest
        # One process per journal: a second one would truncate the segment the
        # first writes through its map (see edge_gateway.datadir).
        try:
            j._lock = lock_directory(j.path, "journal")
        except OSError as exc:
            kind = DiskFull if no_room(exc) else Unavailable
            raise kind(f"cannot open the journal in {j.path}: {exc}") from exc
        j._next_lsn = start_lsn
        try:
            _open.recover_into(j, start or Checkpoint({}, {}), repair)
        except BaseException as exc:
            j._release_files()
            j._lock.release()
            if isinstance(exc, OSError):
                kind = DiskFull if no_room(exc) else Unavailable
                raise kind(f"cannot open the journal in {j.path}: {exc}") from exc
            raise
        j._space.keep_reserve()
        j._lsn_at_open = j._next_lsn
        j._open_seconds = time.perf_counter() - t0
        return j

    def _release_files(self) -> None:
        """Close every file and map (an open that failed half way)."""
        self._closed = True
        for seg in self._segments:
            if seg.mm is not None:
                seg.mm.close()
                seg.mm = None
            if seg.fd is not None:
                with contextlib.suppress(OSError):
                    _fs.ops.close(seg.fd)
                seg.fd = None
        self._segment_set.close_reads()
        self._index_cache.close()

    @property
    def is_new(self) -> bool:
        """True while the journal holds nothing but its first checkpoint."""
        return len(self._segments) == 1 and self._segments[0].entries == 1

    def reset_empty(self, start: Checkpoint, start_lsn: int) -> None:
        """Restart a journal that holds nothing yet at ``start_lsn`` with ``start`` offsets.

        Used when a new (or wiped) gateway continues a region log that already
        has data: LSNs and offsets continue where the bucket's log ends.
        """
        self._check_open()
        if self._mirrors.inflight is not None:
            self._mirrors.settle()
        if not self.is_new:
            raise InvalidInput("only a journal that holds no entries can be reset")
        if self._durability.flushing:
            raise InvalidInput("cannot reset a journal while an fsync is in flight")
        old = self._segment_set.pop_active()
        if old.mm is not None:
            old.mm.close()
        if old.fd is not None:
            _fs.ops.close(old.fd)
        _fs.ops.unlink(old.path)
        self._total_bytes -= old.size
        self._partitions.clear()
        self._topics.clear()
        self._sources.clear()
        self._mirror_runs.clear()
        try:
            self._start_segment(start_lsn, start)
        except DiskFull as exc:
            # The old segment is gone: there is nothing to append to.
            self._broken = f"reset to LSN {start_lsn} failed: {exc}"
            raise
        self._apply_checkpoint(start)
        self._lsn_at_open = self._next_lsn

    def _apply_checkpoint(self, cp: Checkpoint) -> None:
        for (topic, partition), next_offset in cp.next_offsets.items():
            p = self._partition(topic, partition)
            p.next_offset = max(p.next_offset, next_offset)
        for region, coords in cp.sources.items():
            self._sources.setdefault(region, coords)

    def _add_segment(self, seg: Segment) -> None:
        self._active = seg
        self._segment_set.add(seg)

    def _partition(self, topic: str, partition: int) -> _Partition:
        key = (topic, partition)
        p = self._partitions.get(key)
        if p is None:
            p = self._partitions[key] = _Partition(topic, partition)
            t = self._topics.get(topic)
            if t is not None:
                t.partitions[partition] = p
        return p

    def _seal(
        self, seg: Segment, parts: dict[tuple[str, int], tuple[array[int], array[int]]]
    ) -> None:
        """Move a sealed segment's index out of memory, into its index file.

        ``parts`` are the segment's data entries per partition. From here
        on only the summary stays in memory (the segment and 32 bytes per
        partition in it); lookups read the file through the index cache.
        """
        idx = SegmentIndex(seg.base_lsn, seg.size, seg.last_append_time, seg.positions, parts)
        data, runs = idx.encode()
        seg.index = IndexFile.from_bytes(seg.index_path, self._index_cache, data)
        seg.positions = array("q")
        self._add_runs(seg, runs)
        self._index_sealed(seg)

    def _add_runs(self, seg: Segment, runs: list[PartitionRun]) -> None:
        for r in runs:
            p = self._partition(r.topic, r.partition)
            p.seg_bases.append(seg.base_lsn)
            p.seg_first.append(r.first_offset)
            p.seg_at.append(r.at)
            p.seg_count.append(r.count)

    def _write_index(self, seg: Segment) -> None:
        """Write the index file that is still held in memory."""
        assert seg.index is not None
        data = seg.index.data
        if data is None:
            return
        try:
            replaced = seg.index_path.stat().st_size  # a version 1 file being converted
        except OSError:
            replaced = 0
        write_atomically(seg.index_path, data)
        seg.index.data = None
        self._total_bytes += len(data) - replaced

    def _index_sealed(self, seg: Segment) -> None:
        """Write a sealed segment's index file, or keep it in memory and write it later.

        A full disk (or any error) never fails an append for it: the
        journal reads the index from memory meanwhile and retries once there
        is room again (see :meth:`check_disk`); an open rebuilds a missing
        index from its segment.
        """
        try:
            self._write_index(seg)
        except OSError as exc:
            if seg not in self._unindexed:
                self._unindexed.append(seg)
            log.info(
                "journal: index of %s not written (%s); written when there is room, "
                "or rebuilt from the segment at the next open",
                seg.path.name,
                exc,
            )

    def _fail(self, what: str, exc: OSError) -> Unavailable:
        """Stop intake for good after a write or fsync failure; the error to raise.

        After a failed fsync the kernel may have dropped the dirty pages and
        a later fsync can succeed without them (PostgreSQL's "fsyncgate"), so
        nothing written after the last good fsync may ever be counted as
        durable: ``durable_lsn`` stops where it is, ``fsync=always`` appends
        waiting on it fail, the shipper (which reads only durable entries)
        ships nothing after it. A write that fails with ``EIO`` says the
        same of the device. Reads and shipping of the durable entries go on.
        """
        if self._broken is None:
            self._broken = f"{what}: {exc}"
            log.error(
                "journal: %s; intake stopped (nothing after LSN %d counts as durable). "
                "Check the disk (dmesg, SMART) and restart the gateway: the next open "
                "verifies the active segment entry by entry.",
                self._broken,
                self._durability.durable_lsn,
            )
        return self._failed_error()

    def _failed_error(self) -> Unavailable:
        return Unavailable(
            f"journal stopped after a write failure: {self._broken}; intake stays stopped "
            "until the gateway is restarted"
        )

    # --------------------------------------------------------------- segments

    def _start_segment(self, base_lsn: int, checkpoint: Checkpoint) -> None:
        """Create a segment whose first entry is ``checkpoint``, durably.

        On failure nothing is left behind (the file is removed) and the
        journal is unchanged: ``DiskFull`` when there is no room, otherwise
        intake stops (see :meth:`_fail`).
        """
        path = self.path / segment_name(base_lsn)
        payload = checkpoint.encode()
        now = _now_ms()
        entry = fentry.encode_checkpoint_entry(lsn=base_lsn, append_time=now, payload=payload)
        data = fentry.encode_segment_header(base_lsn, self._write_version) + entry
        fd = -1
        try:
            # No segment holds base_lsn yet, so a file of that name is what an
            # undone roll could not remove: it holds nothing acknowledged.
            with contextlib.suppress(FileNotFoundError):
                _fs.ops.unlink(path)
            fd = _fs.ops.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            _fs.write_all(_fs.ops, fd, data)
            _fs.ops.fsync(fd)
            _fs.fsync_dir(self.path)
        except OSError as exc:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    _fs.ops.close(fd)
            with contextlib.suppress(OSError):
                _fs.ops.unlink(path)
            if no_room(exc):
                raise self._retention.disk_full(path, exc, len(data)) from exc
            raise self._fail(f"creating {path}", exc) from exc
        seg = Segment(
            base_lsn, path, len(data), now, array("q", [fentry.SEGMENT_HEADER_SIZE]), fd=fd
        )
        # Preallocate only once the checkpoint is durable: a segment file
        # longer than its header always starts with a valid checkpoint.
        self._map(seg)
        self._add_segment(seg)
        self._next_lsn = base_lsn + 1
        self._durability.durable_lsn = base_lsn
        self._total_bytes += len(data)
        self._active_version = self._write_version

    def _roll(self) -> None:
        """Seal the active segment (fsync + index file) and start the next one.

        All or nothing: if the new segment cannot be created, the old one
        stays the active one (the next append retries the roll); only the
        index file may come later (:meth:`_index_sealed`); until then the
        index stays in memory.
        """
        if self._mirrors.inflight is not None:
            self._mirrors.settle()
        old = self._segments[-1]
        assert old.fd is not None
        try:
            self._unmap(old)  # a sealed segment ends at its last entry: no preallocated tail
        except OSError as exc:
            if no_room(exc):
                raise self._retention.disk_full(old.path, exc, 0) from exc
            raise self._fail(f"cutting the preallocated tail of {old.path}", exc) from exc
        try:
            _fs.ops.fsync(old.fd)
        except OSError as exc:
            raise self._fail(f"fsync of {old.path}", exc) from exc
        self._durability.synced(self._next_lsn - 1, self._appended_bytes)
        old.last_append_time = max(old.last_append_time, self._now)
        self._retention.keep_free()
        cp = Checkpoint(
            {key: p.next_offset for key, p in self._partitions.items()},
            dict(self._sources),
            # Every entry so far is durable (the fsync above): the state
            # covers exactly the LSNs before the new segment.
            self.producer_snapshot() if self.producer_snapshot is not None else None,
        )
        self._start_segment(self._next_lsn, cp)
        # The new segment exists: the roll is done.
        self._durability.close_after_fsync(old.fd)  # a worker thread may be fsyncing it
        old.fd = None
        self._rolls += 1
        # Every entry the partitions hold in memory is in the old segment.
        parts = {}
        for key, p in self._partitions.items():
            if p.lsns:
                parts[key] = (p.lsns, p.offsets)
                p.lsns, p.offsets = array("q"), array("q")
        self._seal(old, parts)
        self.rewriter.sealed()
        self.live_repair.sealed()

    def _map(self, seg: Segment) -> None:
        """Preallocate and map the active segment, if configured (see :meth:`Segment.map`)."""
        if self.config.preallocate:
            seg.map(self._segment_bytes)

    def _unmap(self, seg: Segment) -> None:
        seg.unmap()

    # ----------------------------------------------------------------- append

    def _topic(self, topic: str) -> _Topic:
        t = self._topics.get(topic)
        if t is None:
            validate_topic(topic)
            raw = topic.encode()
            head = fentry.data_head_struct(len(raw))
            t = self._topics[topic] = _Topic(topic, raw, head, fentry.ENTRY_HEADER_SIZE + len(raw))
            for (name, partition), p in self._partitions.items():
                if name == topic:
                    t.partitions[partition] = p
        return t

    @staticmethod
    def _producer_head(t: _Topic) -> struct.Struct:
        t.producer_head = fentry.data_head_struct(len(t.raw), producer=True)
        return t.producer_head

    def _check_open(self) -> None:
        """For writes: the journal is open and intake has not stopped."""
        if self._closed:
            raise ClosedError("journal is closed")
        if self._broken is not None:
            raise self._failed_error()

    def _check_readable(self) -> None:
        """For reads and waits: they go on after intake stopped (see :meth:`_fail`)."""
        if self._closed:
            raise ClosedError("journal is closed")

    def _new_partition(self, t: _Topic, partition: int) -> _Partition:
        if not isinstance(partition, int) or not 0 <= partition <= _MAX_PARTITION:
            raise InvalidInput(f"partition {partition!r} out of range")
        return self._partition(t.name, partition)

    def _bad_batch(
        self, topic: str, partition: int, batch: bytes | bytearray | memoryview
    ) -> NoReturn:
        """Raise the precise error for a batch that failed the quick checks of an append."""
        where = f"append to {topic}/{partition}"
        h = fbatch.read_header(batch, 0, where=where)  # raises CorruptData if malformed
        raise InvalidInput(f"{where}: batch length field {h.length} but {len(batch)} bytes given")

    def append_nowait(
        self,
        topic: str,
        partition: int,
        batch: bytes | bytearray | memoryview,
        producer: ProducerFields | None = None,
    ) -> Appended:
        """Append an encoded batch; offsets are assigned here, gap-free.

        Returns once the entry is written to the OS: it is readable at once and
        survives a crash of this process. With ``fsync=always`` use
        :meth:`append`, which also waits for the fsync. ``producer``: the
        idempotent producer's id, epoch and sequence, written into the entry
        (the caller checked them, see ``edge_gateway.idempotence``).
        """
        # The hot path of the whole gateway: kept flat on purpose (one dict
        # lookup per topic and partition, one struct pack, one CRC, one copy
        # into the mapped segment or one pwritev, then the bookkeeping; the
        # rare cases call out). docs/journal.md "The append path" has figures.
        if self._mirrors.inflight is not None:
            self._mirrors.settle()
        if self._closed or self._broken is not None:
            self._check_open()
        t = self._topics.get(topic) or self._topic(topic)
        p = t.partitions.get(partition) or self._new_partition(t, partition)
        n = len(batch)
        try:
            length, version, flags, reserved, count, min_ts, max_ts = _BATCH_PEEK.unpack_from(batch)
        except struct.error:
            length = -1
        # The checks fbatch.read_header makes, so that every entry the journal
        # writes decodes on read and never stops a reopen (the batch CRC is
        # the reader's to check: it is verified on every decode).
        if (
            length != n
            or version != 1
            or flags & ~7
            or reserved
            or count < 1
            or min_ts > max_ts
            or count * ((flags & 1) + ((flags & 2) >> 1) + 3) * 4 > n - 40
            or n > _MAX_BATCH
        ):
            self._bad_batch(topic, partition, batch)
        length = t.overhead + n
        if producer is not None:
            length += fentry.PRODUCER_TAIL_SIZE
            if self._active_version < 2:
                self._roll_for_producers()
        elif flags & 4 and self._active_version < 2:
            # A batch with nulls (batch.FLAG_NULLS) only in a version 2
            # segment, which a gateway from before nulls refuses as a whole.
            self._roll_for_producers()
        seg = self._active
        if seg.size + length > self._roll_at or self._total_bytes + length > self._max_bytes:
            self._reserve(length)
            seg = self._active
        lsn = self._next_lsn
        base = p.next_offset
        now = _time_ns() // 1_000_000
        if producer is None:
            head = t.head.pack(
                lsn, 1, 0, len(t.raw), partition, base, count, now, t.raw, n, 1, flags, 0, base
            )
        else:
            phead = t.producer_head or self._producer_head(t)
            try:
                head = phead.pack(
                    lsn,
                    1,
                    fentry.FLAG_PRODUCER,
                    len(t.raw),
                    partition,
                    base,
                    count,
                    now,
                    t.raw,
                    producer.producer_id,
                    producer.epoch,
                    0,
                    producer.sequence,
                    n,
                    1,
                    flags,
                    0,
                    base,
                )
            except struct.error:
                raise InvalidInput(f"producer fields out of range: {producer}") from None
        pos = seg.size
        end = pos + length
        if n <= _SMALL_WRITE:
            body = head + batch[16:]
            data = _LEN_CRC.pack(length, _crc(body)) + body
            if end <= seg.mm_end and not self._durability.syncing:
                seg.mm[pos:end] = data  # type: ignore[index]
            else:
                self._put(seg, [data], length)
        else:
            view = memoryview(batch)[16:]
            self._put(seg, [_LEN_CRC.pack(length, _crc(view, _crc(head))) + head, view], length)
        seg.positions.append(pos)
        seg.size = end
        self._now = now
        self._total_bytes += length
        self._next_lsn = lsn + 1
        self._appended_bytes += length
        if self._appended_bytes >= self._notify_at:
            self._notify()
        p.lsns.append(lsn)
        p.offsets.append(base)
        p.next_offset = base + count
        if p.waiters:
            p.lot.unpark_all()
        return _new_appended(Appended, (lsn, base, count))

    def _roll_for_producers(self) -> None:
        """Start a version 2 segment: the active one is an older gateway's version 1.

        (Or version 3 when :meth:`_roll_for_blocks` set it: version 3 holds
        producer entries and nulls too.)
        """
        if self._write_version == fentry.SEGMENT_VERSION:
            log.info(
                "journal %s: starting a version 2 segment (producer entries, null values)",
                self.path,
            )
        try:
            if self._space.full_since is not None:
                self._retention.while_disk_full(0)
            self._retention.roll_making_room()
        except DiskFull:
            self._retention.refused()
            raise

    def _roll_for_blocks(self) -> None:
        """Start a version 3 segment (and write version 3 from now on): a block entry comes."""
        log.info("journal %s: starting a version 3 segment (mirrored block entries)", self.path)
        self._write_version = fentry.SEGMENT_VERSION_BLOCKS
        self._roll_for_producers()

    async def append(
        self, topic: str, partition: int, batch: bytes | bytearray | memoryview
    ) -> Appended:
        """Append an encoded batch and wait until it is as durable as the policy asks.

        A cancelled call raises before it writes anything, except with
        ``fsync=always``, where the wait for the fsync can be cancelled after
        the entry is written (it is then in the journal, just not yet known
        to be durable).
        """
        await _checkpoint_if_cancelled()
        res = self.append_nowait(topic, partition, batch)
        if self._always:
            await self._durability.wait_durable(res[0])
        elif not 0 <= self._now - self._last_yield_ms < self._yield_ms:
            # A producer that never blocks would starve the interval flusher
            # (and the delivery of a finished fsync): yield once per interval.
            # (A wall clock set back also counts as due: otherwise no yield
            # would come until the clock caught up again.)
            self._last_yield_ms = self._now
            await _cancel_shielded_checkpoint()
        return res

    async def after_append(self, lsn: int) -> None:
        """What :meth:`append` does after :meth:`append_nowait`: wait for the fsync
        (``always``) or yield once per interval. For callers that must pick the
        journal and append without a checkpoint in between (``Lanes``)."""
        await self._after_append(lsn)

    async def _after_append(self, lsn: int) -> None:
        if self._always:
            await self._durability.wait_durable(lsn)
        elif not 0 <= self._now - self._last_yield_ms < self._yield_ms:
            self._last_yield_ms = self._now
            await _cancel_shielded_checkpoint()

    # the mirror appends (_mirror_append.py, MirrorAppends)

    async def append_mirror(
        self,
        topic: str,
        partition: int,
        batch: bytes | bytearray | memoryview | None,
        source: SourceCoords,
        *,
        allow_gap: bool = False,
    ) -> Appended:
        """Append a batch mirrored from another region (see :meth:`MirrorAppends.append`)."""
        return await self._mirrors.append(topic, partition, batch, source, allow_gap=allow_gap)

    async def append_mirror_batches(
        self, batches: Sequence[MirrorBatch], source: SourceCoords, last: SourceCoords
    ) -> list[Appended]:
        """Append the mirrored batches of one source entry with one write
        (see :meth:`MirrorAppends.append_batches`)."""
        return await self._mirrors.append_batches(batches, source, last)

    async def append_mirror_blocks(
        self, blocks: Sequence[MirrorBlock], source: SourceCoords, last: SourceCoords
    ) -> list[Appended]:
        """Append fetched log-object blocks of one source entry, each as one block entry
        (see :meth:`MirrorAppends.append_blocks`)."""
        return await self._mirrors.append_blocks(blocks, source, last)

    def _index(self, p: _Partition, lsn: int, base: int, next_offset: int) -> None:
        p.lsns.append(lsn)
        p.offsets.append(base)
        p.next_offset = next_offset
        if p.waiters:
            p.lot.unpark_all()

    def _reserve(self, length: int) -> None:
        """Make room for an entry of ``length`` bytes: roll the segment, check the budget."""
        if self._mirrors.inflight is not None:
            self._mirrors.settle()
        if length > fentry.MAX_ENTRY_BYTES:
            raise InvalidInput(f"journal entry of {length} bytes exceeds {fentry.MAX_ENTRY_BYTES}")
        try:
            if self._space.full_since is not None:
                self._retention.while_disk_full(length)
            seg = self._segments[-1]
            if seg.size + length > self._segment_bytes and len(seg.positions) > 1:
                self._retention.roll_making_room()
        except DiskFull:
            self._retention.refused()
            raise
        if self._total_bytes + length > self._max_bytes:
            self._retention.delete_segments(need=length)
            if (
                self._max_bytes
                < self._total_bytes + length
                <= self._max_bytes + self._segment_bytes
                and self.rewriter.hurry()
            ):
                # The budget counts compressed bytes and sealed segments wait for
                # their rewrite, which will make room: the append goes into a
                # slack of one segment meanwhile (docs/journal.md, "The rewrite").
                return
            if self.drop_oldest:
                while (
                    self._total_bytes + length > self._max_bytes
                    and self._retention.drop_unshipped()
                ):
                    pass
            if self._total_bytes + length > self._max_bytes:
                self._full_rejections += 1
                raise JournalFull(
                    f"journal disk budget full: {self._total_bytes} of {self._max_bytes} "
                    f"bytes used, {length} more needed; data is deleted only after it is "
                    f"shipped (safe LSN {self._retention.safe_lsn}, oldest segment ends at LSN "
                    f"{self._segments[0].end_lsn - 1})"
                )

    def _put(self, seg: Segment, parts: list[bytes | memoryview], length: int) -> None:
        """Write one encoded entry (in pieces) at the end of the active segment.

        On a full disk the partial write is undone and shipped segments are
        deleted, oldest first, until it fits, then drop-oldest data (see
        :meth:`Retention.make_room_unshipped`); ``DiskFull`` if none is left.
        """
        pos = seg.size
        if pos + length <= seg.mm_end and length <= _SMALL_WRITE and not self._durability.syncing:
            seg.mm[pos : pos + length] = b"".join(parts)  # type: ignore[index]
            return
        while True:
            try:
                written = _fs.ops.pwritev(seg.fd, parts, pos)  # type: ignore[arg-type]
                if written != length:  # short write: finish it byte-exactly
                    self._finish_short_write(seg, parts, written)
                return
            except OSError as exc:
                self._write_failed(seg, exc)  # raises unless the disk is full
                error = self._retention.disk_full(seg.path, exc, length)
                if not (
                    self._retention.delete_segments(force=True, limit=1)
                    or self._retention.make_room_unshipped(length)
                ):
                    self._retention.refused()
                    raise error from exc

    def _emit(self, parts: list[bytes | memoryview], length: int, now: int) -> None:
        """Write one encoded entry at the end of the active segment and account for it."""
        seg = self._active
        self._put(seg, parts, length)
        seg.positions.append(seg.size)
        seg.size += length
        self._now = now
        self._total_bytes += length
        self._next_lsn += 1
        self._appended_bytes += length
        if self._appended_bytes >= self._notify_at:
            self._notify()

    def _notify(self) -> None:
        """Wake whoever waits on appends (the slow path of every append, see :meth:`_arm`)."""
        appended = self._appended_bytes
        d = self._durability
        if d.flusher_idle:
            d.flusher_idle = False
            d.dirty_lot.unpark_all()
        elif d.urgent_waiting and appended - d.synced_mark >= self._fsync_bytes:
            d.urgent_waiting = False
            d.urgent_lot.unpark_all()
        if self._append_waiters:
            self._append_lot.unpark_all()
        if appended >= self._bytes_watch:
            self._bytes_lot.unpark_all()
        self._arm()

    def _arm(self) -> None:
        """Set the appended-bytes mark at which an append must call :meth:`_notify`.

        Appends compare one counter with one mark instead of checking every
        kind of waiter; whatever changes a waiter's state calls this again.
        """
        d = self._durability
        if d.flusher_idle or self._append_waiters:
            self._notify_at = 0
        else:
            urgent = d.synced_mark + self._fsync_bytes if d.urgent_waiting else _NO_WATCH
            self._notify_at = min(urgent, self._bytes_watch)

    def _write(
        self,
        kind: int,
        topic_raw: bytes,
        partition: int,
        base_offset: int,
        count: int,
        payload: tuple[bytes | memoryview, ...],
        payload_len: int,
        source: SourceCoords | None,
    ) -> int:
        """Write one entry of any kind (the general path; data appends inline it)."""
        if self._mirrors.inflight is not None:
            self._mirrors.settle()
        now = _time_ns() // 1_000_000
        probe = fentry.encode_entry_rest(
            lsn=0,
            kind=kind,
            topic=topic_raw,
            partition=partition,
            base_offset=base_offset,
            count=count,
            append_time=now,
            source=source,
        )
        length = 8 + len(probe) + payload_len
        self._reserve(length)
        lsn = self._next_lsn
        rest = fentry.encode_entry_rest(
            lsn=lsn,
            kind=kind,
            topic=topic_raw,
            partition=partition,
            base_offset=base_offset,
            count=count,
            append_time=now,
            source=source,
        )
        head = fentry.ENTRY_LEN_CRC.pack(length, fentry.entry_crc(rest, *payload))
        self._emit([head, rest, *payload], length, now)
        return lsn

    def _finish_short_write(self, seg: Segment, parts: list[bytes | memoryview], done: int) -> None:
        assert seg.fd is not None
        data = b"".join(parts)[done:]
        pos = seg.size + done
        while data:
            k = _fs.ops.pwrite(seg.fd, data, pos)
            data = data[k:]
            pos += k

    def _write_failed(self, seg: Segment, exc: OSError) -> None:
        """Roll back a partly written entry, so the next one does not land after garbage.

        Returns if the disk is full (the caller makes room or raises
        ``DiskFull``); any other error stops intake (see :meth:`_fail`).
        """
        assert seg.fd is not None
        try:
            # From here on the segment is written with pwrite only (the
            # truncate takes away the preallocated space the map relies on).
            if seg.mm is not None:
                seg.mm.close()
                seg.mm = None
                seg.mm_end = 0
            _fs.ops.ftruncate(seg.fd, seg.size)
        except OSError as exc2:
            raise self._fail(f"{seg.path}: write failed ({exc}) and rollback failed", exc2) from exc
        if not no_room(exc):
            raise self._fail(f"writing {seg.path}", exc) from exc

    # ------------------------------------------------------------ durability

    @property
    def next_lsn(self) -> int:
        """The LSN the next entry will get."""
        return self._next_lsn

    @property
    def durable_lsn(self) -> int:
        """Every entry with an LSN up to this one is on stable storage."""
        return self._durability.durable_lsn

    # Durability is its own part (_durability.py); these delegate to it.

    async def wait_durable(self, lsn: int) -> None:
        """Wait until entry ``lsn`` is fsynced; concurrent waiters share one fsync."""
        await self._durability.wait_durable(lsn)

    async def flush(self) -> None:
        """Fsync everything appended so far."""
        await self._durability.flush()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The journal's background work: the interval flusher, retention, the disk watch."""
        async with trio.open_nursery() as nursery:
            if self.config.fsync is FsyncPolicy.INTERVAL:
                nursery.start_soon(self._durability.interval_flusher)
            nursery.start_soon(self._retention.ticker)
            nursery.start_soon(self._retention.disk_watch)
            task_status.started()

    # ------------------------------------------------------------ making room

    # retention, drop-oldest and a full disk (_retention.py, Retention)

    def set_safe_lsn(self, lsn: int) -> None:
        """Entries below ``lsn`` are confirmed elsewhere (shipped) and may be deleted.

        Deletion still waits for the retention policy. The watermark only moves
        forward.
        """
        self._retention.set_safe_lsn(lsn)

    def shed(self, nbytes: int, *, disk_full: bool = False) -> int:
        """Free at least ``nbytes`` if this is a drop-oldest journal (see
        :meth:`Retention.shed`); the bytes freed (0 for a block journal)."""
        return self._retention.shed(nbytes, disk_full=disk_full)

    def check_disk(self) -> None:
        """Look at the disk: end a disk-full episode when space returned, catch up on
        chores (see :meth:`Retention.check_disk`)."""
        self._retention.check_disk()

    def _settle(self) -> None:
        """Finish the mirror group in flight, if any (every other writer calls it first)."""
        if self._mirrors.inflight is not None:
            self._mirrors.settle()

    @property
    def safe_lsn(self) -> int:
        return self._retention.safe_lsn

    # ------------------------------------------------------------- drops

    # The record of drops is its own part (DropLog, _dropped.py); these delegate to it.

    @property
    def drop_generation(self) -> int:
        """Bumped at each drop (the shipper notices drops under an object it built)."""
        return self._drop_log.generation

    def take(self, lsn: int) -> None:
        """The shipper is committing an object holding the entries below ``lsn``.

        A drop of those entries from now on records them as ``held``: they
        reach the bucket with that object (docs/journal.md, "Drop-oldest lanes").
        """
        self._drop_log.take(lsn)

    def drops_from(self, lsn: int, through: int | None = None) -> list[Drop]:
        """The recorded drops of LSNs from ``lsn`` on (through ``through``), oldest first:
        the gaps the shipper ships in its object whose range starts at ``lsn``.

        A ``held`` record (entries that were in an object being committed) is
        among them only if that object never committed: the next object then
        starts at or before its ``lsn_first``.
        """
        return self._drop_log.from_lsn(lsn, through)

    def drops_cover(self, first: int, end: int) -> bool:
        """Whether recorded drops account for every LSN ``first <= lsn < end`` (a
        drop-oldest journal that starts after the bucket's head is not a lost log)."""
        return self._drop_log.cover(first, end)

    def release_held(self, lsn: int) -> None:
        """The shipper's log resumes at ``lsn``: ``held`` drops from there on were in an
        object that never committed, so they are gaps (counted as such from now on;
        ``dropped.log`` keeps the flag, and the next claim decides again)."""
        self._drop_log.release_held(lsn)

    def dropped(self, *, held: bool = True) -> list[Drop]:
        """Every drop recorded in ``dropped.log``, oldest first; without the ``held``
        ones if ``held`` is False (entries dropped while the shipper committed
        them: gaps only if the process died before that commit)."""
        return self._drop_log.all(held=held)

    def losses(self) -> list[Loss]:
        """Every range lost to damage and quarantined (``lost.log``), oldest first."""
        return list(self._losses)

    def repairs(self) -> list[Repaired]:
        """Every damaged range rebuilt from the bucket (``repaired.log``), oldest first."""
        return list(self._repairs)

    # The live repair's calls back (``_live_repair.Host``).

    def repaired(self, done: list[Repaired]) -> None:
        """Ranges the live repair rebuilt (already in ``repaired.log``)."""
        self._repairs.extend(done)

    def index_sealed(self, seg: Segment) -> None:
        """Write a sealed segment's index file (or keep it in memory until it can be)."""
        self._index_sealed(seg)

    def compress_again(self) -> None:
        """A sealed segment became an entry log again: the rewriter has work."""
        self.rewriter.sealed()

    def losses_from(self, lsn: int) -> list[Loss]:
        """The losses that cost LSNs from ``lsn`` on, oldest first (the shipper ships
        each as gap markers, in an object that starts at its first LSN)."""
        return sorted(
            (x for x in self._losses if x.lsn_last >= max(lsn, x.lsn_first)),
            key=lambda x: x.lsn_first,
        )

    # ------------------------------------------------------------------ read

    # The read path is its own part (_reads.py); these delegate to it.

    def read_entry(self, lsn: int) -> Entry:
        """Read and verify the entry with this LSN (:meth:`Reads.read_entry`)."""
        try:
            return self._reads.read_entry(lsn)
        except CorruptData as exc:
            self.live_repair.check_read(exc)  # RepairPending if it is being repaired
            raise

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 10_000,
        max_bytes: int = 1024 * 1024,
    ) -> list[Entry]:
        """Entries of one partition from ``offset`` on, oldest first (:meth:`Reads.read`).

        An empty list means nothing at or after ``offset`` yet (see :meth:`wait_for`).
        """
        try:
            return self._reads.read(
                topic, partition, offset, max_records=max_records, max_bytes=max_bytes
            )
        except CorruptData as exc:
            self.live_repair.check_read(exc)  # RepairPending if it is being repaired
            raise

    def only_checkpoints(self, first_lsn: int, last_lsn: int) -> bool:
        """Whether every entry from ``first_lsn`` to ``last_lsn`` is a checkpoint.

        A checkpoint is only ever the first entry of a segment, so this is a
        count of segment bases in the range (no read). The shipper steps over
        such a range (its reads skip checkpoints), e.g. a fresh journal's first
        entry.
        """
        return self._segment_set.only_checkpoints(first_lsn, last_lsn)

    def read_entries(
        self,
        from_lsn: int,
        *,
        max_bytes: int = 8 * 1024 * 1024,
        durable_only: bool = True,
        payload_kinds: Container[int] | None = None,
    ) -> list[Entry]:
        """Entries in LSN order from ``from_lsn``, up to ``max_bytes`` (for the shipper).

        See :meth:`Reads.read_entries`.
        """
        return self._reads.read_entries(
            from_lsn, max_bytes=max_bytes, durable_only=durable_only, payload_kinds=payload_kinds
        )

    async def read_entries_in_thread(
        self,
        from_lsn: int,
        *,
        max_bytes: int = 8 * 1024 * 1024,
        payload_kinds: Container[int] | None = None,
        buffers: ReadBuffers | None = None,
        through_lsn: int | None = None,
    ) -> list[Entry]:
        """:meth:`read_entries` of durable entries, read and checked in a worker thread
        (:meth:`Reads.read_entries_in_thread`); none after ``through_lsn`` when given."""
        return await self._reads.read_entries_in_thread(
            from_lsn,
            max_bytes=max_bytes,
            payload_kinds=payload_kinds,
            buffers=buffers,
            through_lsn=through_lsn,
        )

    # A compressed segment's chunks, for the shipper (_chunks.py, docs/at-rest.md).

    def chunk_span(self, lsn: int) -> ChunkSpan | None:
        """The LSN range of the chunk holding ``lsn`` when a compressed segment
        holds it (None otherwise); no I/O."""
        self._check_readable()
        return _chunks.chunk_span(self._segment_set, lsn)

    def compressed_from(self, lsn: int) -> int | None:
        """The first LSN at or after ``lsn`` that a compressed segment holds (None: none)."""
        self._check_readable()
        return _chunks.compressed_from(self._segment_set, lsn)

    async def read_chunk_in_thread(self, first_lsn: int) -> StoredChunk:
        """The chunk of a compressed segment that starts at ``first_lsn``: its local data
        frames as stored blocks (CRC-checked, not decompressed), read in a worker thread."""
        self._check_readable()
        return await _chunks.read_chunk_in_thread(self._segment_set, first_lsn)

    # ----------------------------------------------------------------- waits

    async def wait_for(self, topic: str, partition: int, offset: int) -> None:
        """Wait until the partition holds a record at ``offset`` (no polling)."""
        p = self._partitions.get((topic, partition)) or self._partition(topic, partition)
        while p.next_offset <= offset:
            self._check_readable()
            p.waiters += 1
            try:
                await p.lot.park()
            finally:
                p.waiters -= 1

    @property
    def appended_bytes(self) -> int:
        """Bytes of entries appended since open (a running total)."""
        return self._appended_bytes

    async def wait_appended_bytes(self, total: int) -> None:
        """Wait until :attr:`appended_bytes` reaches ``total`` (one wake-up, not one per append)."""
        while self._appended_bytes < total:
            self._check_readable()
            self._bytes_targets.append(total)
            self._bytes_watch = min(self._bytes_targets)
            self._arm()
            try:
                await self._bytes_lot.park()
            finally:
                self._bytes_targets.remove(total)
                self._bytes_watch = min(self._bytes_targets, default=_NO_WATCH)
                self._arm()

    async def wait_appended(self, lsn: int) -> None:
        """Wait until an entry with LSN ``lsn`` has been written."""
        while self._next_lsn <= lsn:
            self._check_readable()
            self._append_waiters += 1
            self._arm()
            try:
                await self._append_lot.park()
            finally:
                self._append_waiters -= 1
                self._arm()

    # ------------------------------------------------------------- queries

    def next_offset(self, topic: str, partition: int) -> int:
        p = self._partitions.get((topic, partition))
        return p.next_offset if p else 0

    def start_partition(self, topic: str, partition: int, next_offset: int) -> None:
        """Let the partition's next append here start at ``next_offset``.

        For a topic whose lane changed (``docs/journal.md``, "Lanes"): the new
        lane's journal continues the partition where the old lane's ended, so
        offsets stay gap-free across lanes. If this journal still holds older
        entries of the partition (it moved away and back), the offsets between
        are in the other lane: a gap here, read like a mirror gap. Not durable
        by itself: the first append records the offset in its entry (and each
        segment's checkpoint after it), and until then the old lane knows it.
        """
        self._check_open()
        t = self._topic(topic)
        p = t.partitions.get(partition) or self._new_partition(t, partition)
        if p.next_offset > next_offset:
            raise InvalidInput(
                f"{topic}/{partition} already holds offsets up to {p.next_offset} in "
                f"{self.path}; it cannot start at {next_offset}"
            )
        p.next_offset = next_offset

    def bytes_from(self, lsn: int) -> int:
        """Bytes of the entries from ``lsn`` on (a lane's backlog: ``bytes_from(safe_lsn)``)."""
        return self._segment_set.bytes_from(lsn)

    @property
    def disk_bytes(self) -> int:
        """Bytes of segments (and index files) counted against the budget."""
        return self._total_bytes

    def account_bytes(self, delta: int) -> None:
        """Count ``delta`` more bytes against the budget (the rewriter's files)."""
        self._total_bytes += delta

    @property
    def budget_bytes(self) -> int:
        """The disk budget in force (``max_bytes``, unless :meth:`set_budget` changed it)."""
        return self._max_bytes

    def set_budget(self, max_bytes: int) -> None:
        """Set the disk budget of appends (a lane's share of a gateway's ``max_bytes``)."""
        self._max_bytes = max_bytes

    def first_offset(self, topic: str, partition: int) -> int:
        p = self._partitions.get((topic, partition))
        return p.first_offset if p else 0

    def partitions(self) -> list[tuple[str, int]]:
        """Every (topic, partition) that has ever held data."""
        return sorted(k for k, p in self._partitions.items() if p.next_offset > 0)

    def source_progress(self) -> dict[str, SourceCoords]:
        """Per source region, the coordinates of the last mirrored entry applied."""
        return dict(self._sources)

    def statistics(self) -> JournalStats:
        free, size = self._retention.disk_space()
        dropped_segments, dropped_records, dropped_bytes = self._drop_log.counts()
        compressed = [s.compressed for s in self._segments if s.compressed is not None]
        frames = self._segment_set.frame_cache
        rw = self.rewriter.statistics()
        still = {id(x) for x in still_lost(self._losses, self._repairs)}
        repaired_later = [x for x in self._losses if id(x) not in still]
        return JournalStats(
            segments=len(self._segments),
            bytes=self._total_bytes,
            max_bytes=self.config.max_bytes,
            first_lsn=self._segments[0].base_lsn if self._segments else 0,
            next_lsn=self._next_lsn,
            durable_lsn=self._durability.durable_lsn,
            safe_lsn=self._retention.safe_lsn,
            partitions=len(self._partitions),
            appends=self._next_lsn - self._lsn_at_open - self._rolls,
            appended_bytes=self._appended_bytes,
            fsyncs=self._durability.fsyncs,
            fsync_seconds_total=self._durability.fsync_total,
            fsync_seconds_max=self._durability.fsync_max,
            full_rejections=self._full_rejections,
            truncated_bytes_on_open=self._truncated_on_open,
            open_seconds=self._open_seconds,
            active_segment_bytes=self._segments[-1].size if self._segments else 0,
            disk_free_bytes=free,
            disk_size_bytes=size,
            disk_full=self._space.full_since is not None,
            disk_full_rejections=self._space.rejections,
            disk_full_episodes=self._space.episodes,
            segments_deleted_for_space=self._space.deleted_for_space,
            failed=self._broken,
            index_memory_bytes=self.index_memory(),
            index_cache_bytes=self._index_cache.bytes,
            index_cache_capacity_bytes=self._index_cache.capacity,
            index_cache_hits=self._index_cache.hits,
            index_cache_misses=self._index_cache.misses,
            drop_oldest=self.drop_oldest,
            dropped_segments=dropped_segments,
            dropped_records=dropped_records,
            dropped_bytes=dropped_bytes,
            lost_lsns=sum(x.lsn_last - x.lsn_first + 1 for x in self._losses),
            lost_records=sum(x.records for x in self._losses),
            lost_repaired_lsns=sum(x.lsn_last - x.lsn_first + 1 for x in repaired_later),
            lost_repaired_records=sum(x.records for x in repaired_later),
            compressed_segments=len(compressed),
            compressed_bytes=sum(c.size for c in compressed),
            compressed_wal_bytes=sum(c.wal_bytes for c in compressed),
            block_cache_bytes=frames.bytes,
            block_cache_hits=frames.hits,
            block_cache_misses=frames.misses,
            rewriter_running=rw.running,
            rewritten_segments=rw.segments,
            rewritten_bytes_before=rw.bytes_before,
            rewritten_bytes_after=rw.bytes_after,
            rewrite_failures=rw.failures,
            rewrite_pending=rw.pending,
            rewrite_child_max_rss_bytes=rw.child_max_rss_bytes,
        )

    def index_memory(self) -> int:
        """Bytes of RAM the read index holds (docs/journal.md, "Memory").

        Counted: the arrays (allocated sizes), the segment objects, index
        files held in memory until they can be written, the cache, and the
        entry positions of compressed segments read by LSN (at most
        ``POSITIONS_KEPT`` of them). Not counted: the frame cache
        (``block_cache_bytes`` in :meth:`statistics`).
        """
        total = self._index_cache.bytes + sum(p.memory() for p in self._partitions.values())
        for seg in self._segments:
            total += _SEGMENT_MEMORY + sys.getsizeof(seg.positions)
            if seg.index is not None and seg.index.data is not None:
                total += len(seg.index.data)
            if seg.compressed is not None and seg.compressed.positions is not None:
                # a compressed segment's entry positions, kept while it is read by LSN
                total += sys.getsizeof(seg.compressed.positions)
        return total

    # ----------------------------------------------------------------- close

    def close_sync(self) -> None:
        """Fsync and close every file. Idempotent."""
        if self._closed:
            return
        if self._mirrors.inflight is not None:
            self._mirrors.settle()
        self._closed = True
        try:
            active = self._segments[-1] if self._segments else None
            if active is not None and active.fd is not None:
                try:
                    if self._broken is None:
                        self._close_active(active)
                finally:
                    if active.mm is not None:
                        active.mm.close()
                        active.mm = None
                    with contextlib.suppress(OSError):
                        _fs.ops.close(active.fd)
                    active.fd = None
        finally:
            self._segment_set.close_reads()
            self._index_cache.close()
            if self._lock is not None:
                self._lock.release()
            self._durability.wake_all()
            self._append_lot.unpark_all()
            self._bytes_lot.unpark_all()
            for p in self._partitions.values():
                p.lot.unpark_all()

    def _close_active(self, active: Segment) -> None:
        """Cut the preallocated tail and fsync; failures are logged, never raised.

        Closing must release everything. A tail that cannot be cut is kept
        (the next open recognises the zeros as free space); a failed fsync
        is a failed fsync (see :meth:`_fail`).
        """
        assert active.fd is not None
        try:
            self._unmap(active)  # a clean close leaves no preallocated tail
        except OSError as exc:
            log.warning("journal: could not cut the preallocated tail of %s: %s", active.path, exc)
        try:
            _fs.ops.fsync(active.fd)
        except OSError as exc:
            self._fail(f"fsync of {active.path} at close", exc)
        else:
            self._durability.durable_lsn = self._next_lsn - 1

    async def aclose(self) -> None:
        """Wait for an fsync in flight, then fsync and close. Always releases."""
        with trio.CancelScope(shield=True):
            await self._durability.wait_idle()
        self.close_sync()


@asynccontextmanager
async def open_journal(
    path: str | os.PathLike[str],
    config: JournalConfig | None = None,
    *,
    drop_oldest: bool = False,
    repair: RepairSource | None = None,
) -> AsyncIterator[Journal]:
    """Open the journal (recovery runs in a worker thread) with its background tasks.

    For embedding and tests; the gateway instead starts :meth:`Journal.run`
    in its own nursery.
    """
    journal = await trio.to_thread.run_sync(
        lambda: Journal.open_sync(path, config, drop_oldest=drop_oldest, repair=repair)
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            try:
                yield journal
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # Surface the body's own exception, not a group of one.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        await journal.aclose()
