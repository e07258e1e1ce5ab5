"""Opening a journal: its state rebuilt from the files in its directory.

What it does (:func:`recover_into`, called once by ``Journal.open_sync``):
fit the segment size to a small disk, complete a drop recorded in
``dropped.log`` whose segment the last run left behind, load what
``lost.log`` recorded, and ``_recover``: load each segment, sealed ones
from their index files (a version 1 file is converted) or, compressed, from
their directories, the last one — or one whose index file is unusable — by
a scan, and apply the last segment's checkpoint. The scan itself is
``_recovery.py``; damage in the middle of a segment is rebuilt from the
bucket (``_repair.py``) or else quarantined (``_quarantine.py``).

Opening is a procedure, not a part with state of its own: these functions
fill in a new journal given as :class:`OpenedLog` (its segments, partitions,
source progress, counters and the parts it composes). They do not import
the journal.
"""

from __future__ import annotations

import contextlib
import logging
import os
from array import array
from pathlib import Path
from typing import Any, Protocol

from edge_gateway.errors import CorruptData
from edge_gateway.format import entry as fentry
from edge_gateway.format.entry import Checkpoint, Entry, SourceCoords
from edge_gateway.journal import _fs
from edge_gateway.journal._compressed import CompressedFile, is_compressed
from edge_gateway.journal._compressed_open import repair_at_open
from edge_gateway.journal._compressed_quarantine import quarantine_compressed
from edge_gateway.journal._config import JournalConfig
from edge_gateway.journal._dropped import DropLog
from edge_gateway.journal._durability import Durability
from edge_gateway.journal._index import (
    IndexCache,
    IndexFile,
    PartitionRun,
    SegmentIndex,
    file_version,
)
from edge_gateway.journal._quarantine import Loss, load_losses, quarantine_damage
from edge_gateway.journal._recovery import DamagedEntry, Scanned, list_segments, scan_segment
from edge_gateway.journal._repair import Repaired, RepairSource, load_repairs, repair_damage
from edge_gateway.journal._retention import Retention
from edge_gateway.journal._rewriter import expand_in_place
from edge_gateway.journal._segment import INDEX_SUFFIX, Segment, segment_name
from edge_gateway.journal._space import DiskSpace
from edge_gateway.journal._state import _Partition

log = logging.getLogger("edgegw.journal")


class OpenedLog(Protocol):
    """The journal being opened, as the open fills it in (``Journal`` answers)."""

    path: Path
    config: JournalConfig
    _next_lsn: int
    _total_bytes: int
    _segment_bytes: int
    _roll_at: int
    _active_version: int
    _write_version: int
    _truncated_on_open: int
    _sources: dict[str, SourceCoords]
    _losses: list[Loss]
    _repairs: list[Repaired]
    _repair_source: RepairSource | None
    _space: DiskSpace
    _drop_log: DropLog
    _retention: Retention
    _durability: Durability
    _index_cache: IndexCache
    recovered_producers: dict[str, Any] | None
    recovered_producer_entries: list[Entry]

    @property
    def _segments(self) -> list[Segment]:
        """The segments, oldest first, the active one last."""
        ...

    def _start_segment(self, base_lsn: int, checkpoint: Checkpoint) -> None: ...

    def _apply_checkpoint(self, cp: Checkpoint) -> None: ...

    def _add_segment(self, seg: Segment) -> None: ...

    def _partition(self, topic: str, partition: int) -> _Partition: ...

    def _seal(
        self, seg: Segment, parts: dict[tuple[str, int], tuple[array[int], array[int]]]
    ) -> None: ...

    def _add_runs(self, seg: Segment, runs: list[PartitionRun]) -> None: ...

    def _map(self, seg: Segment) -> None: ...


def recover_into(self: OpenedLog, start: Checkpoint, repair: RepairSource | None = None) -> None:
    """Rebuild a new journal's state from its directory (``start``: the offsets of a
    journal that holds nothing yet; ``repair``: where damaged, shipped ranges are
    rebuilt from, for this open only: it blocks on the bucket)."""
    _fit_disk(self)
    _finish_drops(self)
    self._losses = load_losses(self.path)
    self._repairs = load_repairs(self.path)
    self._repair_source = repair
    try:
        _recover(self, start)
    finally:
        self._repair_source = None


def _finish_drops(self: OpenedLog) -> None:
    """Load ``dropped.log``; complete a drop whose record is durable but whose
    segment is still there (the process died between the two)."""
    drops = self._drop_log.load()
    if not drops:
        return
    last = drops[-1]
    seg = self.path / segment_name(last.segment)
    if seg.exists():
        _fs.ops.unlink(seg)
        with contextlib.suppress(FileNotFoundError):
            _fs.ops.unlink(seg.with_suffix(".idx"))
        log.warning(
            "journal: completed the drop of segment %s (LSN %d-%d) recorded in %s "
            "before the last run ended",
            seg.name,
            last.segment,
            last.end - 1,
            self.path / "dropped.log",
        )
    self._retention.safe_lsn = max(self._retention.safe_lsn, last.end)


def _fit_disk(self: OpenedLog) -> None:
    """Roll smaller segments on a small disk (see :meth:`DiskSpace.fit`)."""
    self._segment_bytes = self._roll_at = self._space.fit(
        self._segment_bytes, self.config.max_bytes
    )


def _recover(self: OpenedLog, start: Checkpoint) -> None:
    bases = list_segments(self.path)
    if not bases:
        self._start_segment(self._next_lsn, start)
        self._apply_checkpoint(start)
        return
    expected = bases[0][0]
    for i, (base, f) in enumerate(bases):
        if base != expected:
            raise CorruptData(
                f"segments are not contiguous: expected LSN {expected}, file starts at {base}",
                where=str(f),
            )
        last = i == len(bases) - 1
        seg = _load_segment(self, base, f, last=last)
        expected = seg.end_lsn
    active = self._segments[-1]
    self._next_lsn = active.end_lsn
    self._durability.durable_lsn = self._next_lsn - 1
    active.fd = _fs.ops.open(active.path, os.O_RDWR)
    self._map(active)
    self._total_bytes = sum(s.size for s in self._segments)
    self._total_bytes += sum(
        s.index_path.stat().st_size for s in self._segments[:-1] if s.index_path.exists()
    )


def _load_segment(self: OpenedLog, base: int, path: Path, *, last: bool) -> Segment:
    if is_compressed(path):
        if not last:
            try:
                return _load_compressed(self, base, path)
            except CorruptData as exc:  # rebuilt from the bucket, else quarantined
                if not repair_at_open(path, base, self._repair_source, self._repairs, exc):
                    quarantine_compressed(path, base, exc, known=self._losses)
                # an entry log now, scanned below
        else:
            # Only sealed segments are rewritten, so the segment after it was moved
            # aside (or lost): the journal appends to an entry log, and this one
            # becomes one again, byte for byte, then opens as any last segment.
            expand_in_place(path)
    if not last:
        seg = _load_indexed(self, base, path)
        if seg is not None:
            return seg
    return _add_scanned(self, _scan_quarantining(self, base, path, last=last), last=last)


#: Damaged ranges quarantined in one segment at most before the open gives up.
_MAX_LOSSES_PER_SEGMENT = 1000


def _scan_quarantining(self: OpenedLog, base: int, path: Path, *, last: bool) -> Scanned:
    """Scan a segment; damage in its middle is rebuilt from the bucket (``_repair.py``)
    or else quarantined (``_quarantine.py``), and the scan starts again over the
    rewritten segment, until it is sound."""
    for _ in range(_MAX_LOSSES_PER_SEGMENT):
        try:
            return scan_segment(base, path, last=last)
        except DamagedEntry as exc:
            src, known = self._repair_source, self._repairs
            if repair_damage(path, base, exc, last=last, source=src, known=known) is None:
                quarantine_damage(path, base, exc, last=last, known=self._losses)
    raise CorruptData(
        f"more than {_MAX_LOSSES_PER_SEGMENT} damaged ranges: restore the segment", where=str(path)
    )


def _load_compressed(self: OpenedLog, base: int, path: Path) -> Segment:
    """A sealed compressed segment from its directory (header, trailer, directory; no scan).

    An index file beside it is from the entry log it replaced (a rewrite
    stopped between the rename and the unlink): never trusted, deleted.
    """
    stale = path.with_suffix(INDEX_SUFFIX)
    with contextlib.suppress(FileNotFoundError):
        _fs.ops.unlink(stale)
        log.info("journal: deleted %s, stale beside a compressed segment", stale.name)
    cf = CompressedFile.open(path, base)
    seg = Segment(base, path, cf.size, cf.directory.last_append_time, compressed=cf)
    self._add_segment(seg)
    for topic, partition, first_offset in cf.partitions():
        p = self._partition(topic, partition)
        p.seg_bases.append(base)
        p.seg_first.append(first_offset)
        p.seg_at.append(0)  # read through the directory's frames, not an index file
        p.seg_count.append(0)
    return seg


def _load_indexed(self: OpenedLog, base: int, path: Path) -> Segment | None:
    """A sealed segment from its index file (a version 1 file is converted); None to scan."""
    seg = Segment(base, path, path.stat().st_size, 0)
    idx_path = seg.index_path
    try:
        if file_version(idx_path) == 1:
            old = SegmentIndex.decode_v1(idx_path.read_bytes(), where=str(idx_path))
            if old.base_lsn != base or old.size != seg.size:
                raise CorruptData("index does not match its segment", where=str(idx_path))
            log.info("journal: converting the index of %s to version 2", path.name)
            seg.last_append_time = old.last_append_time
            seg.positions = old.positions
            self._add_segment(seg)
            self._seal(seg, old.partitions)
            return seg
        f, seg.last_append_time, runs = IndexFile.open(
            idx_path, self._index_cache, base_lsn=base, segment_size=seg.size
        )
    except (OSError, CorruptData) as exc:
        log.info("journal: rebuilding index of %s (%s)", path, exc)
        return None
    seg.index = f
    self._add_segment(seg)
    self._add_runs(seg, runs)
    return seg


def _add_scanned(self: OpenedLog, scanned: Scanned, *, last: bool) -> Segment:
    """Add a scanned segment; a sealed one's index goes to its file (:meth:`_seal`)."""
    if last:
        self._active_version = scanned.version
        if scanned.version >= fentry.SEGMENT_VERSION_BLOCKS:
            self._write_version = scanned.version  # block entries: rolls stay version 3
        self.recovered_producer_entries = scanned.producers
        if scanned.checkpoint is not None:
            self.recovered_producers = scanned.checkpoint.producers
    if last and scanned.checkpoint is not None:
        self._apply_checkpoint(scanned.checkpoint)
    for (topic, partition), sp in scanned.parts.items():
        p = self._partition(topic, partition)
        p.next_offset = max(p.next_offset, sp.next_offset)
        if last:
            p.lsns.extend(sp.lsns)
            p.offsets.extend(sp.offsets)
    self._sources.update(scanned.sources)
    self._truncated_on_open += scanned.truncated
    seg = scanned.segment
    self._add_segment(seg)
    if not last:
        self._seal(seg, {key: (sp.lsns, sp.offsets) for key, sp in scanned.parts.items()})
    return seg
