"""The background scrub: re-read the journal's sealed segments at a bounded rate (issue 45, item 2).

A sealed segment nobody reads (shipped long ago, kept for retention) can rot
on an SD card unnoticed until a reader or a restart needs it. The
:class:`Scrubber` re-reads every lane's sealed segments (never a lane's
last, *active* one) in LSN order, one full pass every
``journal.scrub_interval``, and applies the same pure checks as ``edgegw
journal verify`` (:func:`check_segment`, :func:`check_index`) to the bytes.

Why it stays out of the way of acks: the bytes are read in chunks of
:data:`CHUNK_BYTES` in a worker thread (one at a time, its own limiter),
with a sleep after each chunk that holds the rate to :func:`scrub_rate`
(the journal's sealed bytes spread over the interval, within a floor and a
ceiling); the checks of a segment's bytes run in the worker thread too.

A segment deleted after the listing (retention, a drop-oldest lane) is
skipped, not damage. Each segment is read through one descriptor, so a
segment replaced by its compressed form mid-read is read whole as it was.
Findings are kept per file: damage found once is logged once (a WARNING
naming the file, the byte and the reason), stays in :meth:`Scrubber.statistics`
while the file stays damaged, and is forgotten when the file is gone or reads
clean. Each finding goes to :attr:`Scrubber.on_damage` (the gateway's: the
lane journal's live repair, ``_live_repair.py``, which rebuilds a damaged
segment the bucket holds); the scrub itself only reads and reports.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import trio

from edge_gateway.journal._lane import lane_path, lanes_on_disk
from edge_gateway.journal._segment import INDEX_SUFFIX
from edge_gateway.journal._verify import (
    Damage,
    Key,
    SegmentFacts,
    check_index,
    check_segment,
    segment_files,
)

__all__ = [
    "CHUNK_BYTES",
    "SCRUB_CEILING_BYTES_PER_S",
    "SCRUB_FLOOR_BYTES_PER_S",
    "ScrubFinding",
    "ScrubStats",
    "Scrubber",
    "scrub_rate",
]

log = logging.getLogger("edgegw.journal")

#: Bytes read per worker-thread call; the pacing sleeps after each.
CHUNK_BYTES: Final = 256 * 1024
#: The scrub reads at least this fast: a small journal's pass ends well before
#: the interval, so a new sealed segment waits at most about one interval.
SCRUB_FLOOR_BYTES_PER_S: Final = 16 * 1024
#: ... and at most this fast, whatever the journal's size and the interval: a
#: pass that cannot finish in the interval takes longer rather than taking the disk.
SCRUB_CEILING_BYTES_PER_S: Final = 8 * 1024 * 1024


def scrub_rate(
    journal_bytes: int,
    interval_s: float,
    *,
    floor: float = SCRUB_FLOOR_BYTES_PER_S,
    ceiling: float = SCRUB_CEILING_BYTES_PER_S,
) -> float:
    """Bytes/s that read ``journal_bytes`` in ``interval_s``, within ``[floor, ceiling]``."""
    if interval_s <= 0:
        raise ValueError(f"scrub interval must be > 0, not {interval_s}")
    return min(max(journal_bytes / interval_s, floor), ceiling)


@dataclass(frozen=True, slots=True)
class ScrubFinding:
    """A damaged file the scrub found: the first bad byte and why."""

    lane: str
    path: Path
    offset: int
    reason: str
    #: wall-clock time (ms) of the pass that first found it
    found_ms: int

    def to_json(self) -> dict[str, object]:
        return {
            "lane": self.lane,
            "file": str(self.path),
            "offset": self.offset,
            "reason": self.reason,
            "found_ms": self.found_ms,
        }


@dataclass(frozen=True, slots=True)
class ScrubStats:
    """:meth:`Scrubber.statistics`: the scrub's passes since the gateway started."""

    interval_s: float
    #: full passes over every lane's sealed segments
    passes: int
    bytes_scrubbed: int
    segments_checked: int
    #: segments deleted (retention, a drop) between the listing and their read
    segments_skipped: int
    #: the rate of the pass under way (or the last), bytes per second
    rate_bytes_per_s: float
    #: wall-clock time (ms) the last full pass ended, None before the first
    last_pass_ms: int | None
    #: how long the last full pass took, in seconds
    last_pass_s: float | None
    #: bytes the last full pass read (segments and index files)
    last_pass_bytes: int
    #: segments the last full pass checked
    last_pass_segments: int
    #: the damaged files known now (found and neither gone nor clean since)
    damaged: tuple[ScrubFinding, ...]


class Scrubber:
    """Re-reads the sealed segments of the journal at ``main`` (every lane) at a bounded rate."""

    def __init__(
        self,
        main: Path,
        interval_s: float,
        *,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"scrub interval must be > 0, not {interval_s}")
        self._main = main
        self._interval_s = interval_s
        self._wall_ms = wall_ms
        #: one worker thread at most: the scrub never takes more
        self._limiter = trio.CapacityLimiter(1)
        self._passes = 0
        self._bytes = 0
        self._checked = 0
        self._skipped = 0
        self._rate = 0.0
        self._last_pass_ms: int | None = None
        self._last_pass_s: float | None = None
        self._last_pass_bytes = 0
        self._last_pass_segments = 0
        self._damaged: dict[Path, ScrubFinding] = {}
        #: told of each damaged file found; True: it is being repaired (the gateway
        #: sets it: the live repair of the file's journal)
        self.on_damage: Callable[[Path], bool] | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Scrub pass after pass, one starting every ``interval_s`` (or when the last ends)."""
        task_status.started()
        while True:
            start = trio.current_time()
            await self.scrub_pass()
            await trio.sleep_until(start + self._interval_s)

    async def scrub_pass(self) -> None:
        """One full pass over every lane's sealed segments, paced by :func:`scrub_rate`."""
        started = trio.current_time()
        bytes_before, checked_before = self._bytes, self._checked
        plan = await trio.to_thread.run_sync(self._list, limiter=self._limiter)
        total = sum(size for _, segs in plan for _, _, size in segs)
        self._rate = scrub_rate(total, self._interval_s)
        seen: set[Path] = set()
        for lane, segs in plan:
            next_offsets: dict[Key, int] = {}
            for base, path, _ in segs:
                seen.add(path)
                seen.add(path.with_suffix(INDEX_SUFFIX))
                facts = await self._scrub_segment(lane, base, path, next_offsets)
                # The next segment's offsets are checked against this one's, if it was sound.
                sound = facts is not None and facts.damage is None
                next_offsets = facts.next_offsets if facts is not None and sound else {}
        for gone in self._damaged.keys() - seen:
            del self._damaged[gone]
        self._passes += 1
        self._last_pass_ms = self._wall_ms()
        self._last_pass_s = trio.current_time() - started
        self._last_pass_bytes = self._bytes - bytes_before
        self._last_pass_segments = self._checked - checked_before

    def statistics(self) -> ScrubStats:
        """The passes, bytes and damaged files so far (the status's ``journal.scrub``)."""
        return ScrubStats(
            self._interval_s,
            self._passes,
            self._bytes,
            self._checked,
            self._skipped,
            self._rate,
            self._last_pass_ms,
            self._last_pass_s,
            self._last_pass_bytes,
            self._last_pass_segments,
            tuple(sorted(self._damaged.values(), key=lambda f: str(f.path))),
        )

    def _list(self) -> list[tuple[str, list[tuple[int, Path, int]]]]:
        """Per lane in drain order, its sealed segments ``(base LSN, path, size)``."""
        out = []
        for lane in sorted(lanes_on_disk(self._main), key=lambda lane: lane.rank):
            segs = segment_files(lane_path(self._main, lane))[:-1]  # the last is active
            sealed = []
            for base, path in segs:
                if base is None:
                    continue  # not a segment's name: verify reports it, the journal ignores it
                try:
                    sealed.append((base, path, path.stat().st_size))
                except FileNotFoundError:
                    continue
            out.append((str(lane), sealed))
        return out

    async def _scrub_segment(
        self, lane: str, base: int, path: Path, next_offsets: dict[Key, int]
    ) -> SegmentFacts | None:
        """Read and check one sealed segment and its index (None: gone, or unreadable)."""
        data = await self._read_paced(path)
        if data is None:
            self._skipped += 1
            self._forget(path)
            self._forget(path.with_suffix(INDEX_SUFFIX))
            return None
        if isinstance(data, Damage):
            self._checked += 1
            self._record(lane, path, data)
            return None
        view = data if isinstance(data, bytes) else memoryview(data)
        # The checks are pure: a shutdown need not wait for a large segment's.
        facts = await trio.to_thread.run_sync(
            lambda: check_segment(view, base_lsn=base, next_offsets=next_offsets),
            limiter=self._limiter,
            abandon_on_cancel=True,
        )
        self._checked += 1
        self._record(lane, path, facts.damage)
        idx = path.with_suffix(INDEX_SUFFIX)
        if facts.damage is not None or facts.compressed:
            # A damaged segment's index is not checked (verify skips it too); a
            # compressed segment's old index is stale and deleted at the next open.
            self._forget(idx)
            return facts
        index = await self._read_paced(idx)
        if index is None:
            self._forget(idx)  # not written yet, or gone with its segment
            return facts
        if isinstance(index, Damage):
            self._record(lane, idx, index)
            return facts
        index_bytes = index if isinstance(index, bytes) else bytes(index)  # small: copy it
        _, damage = await trio.to_thread.run_sync(
            lambda: check_index(index_bytes, facts, segment_size=len(data)),
            limiter=self._limiter,
            abandon_on_cancel=True,
        )
        self._record(lane, idx, damage)
        return facts

    async def _read_paced(self, path: Path) -> bytes | mmap.mmap | Damage | None:
        """The file's bytes, read a chunk at a time at the pass's rate.

        The paced read finds read errors and brings the pages in; the check
        then runs over a read-only map of the same file (the descriptor opened
        here: a segment swapped for its compressed form meanwhile is still read
        whole), so a pass holds no copy of a segment on the heap, however long
        the pacing takes (a 64 MiB segment at the floor rate takes over an
        hour): its pages are the kernel's, reclaimable. Sealed segments are
        never truncated; one cut by hand during its check would raise SIGBUS,
        which is why the map covers only the bytes the paced read found.

        None: it is gone. A read error (``EIO`` from a failing card) is
        damage at the byte the read started from, not a failure of the scrub.
        """
        offset = 0
        try:
            fd = await trio.to_thread.run_sync(os.open, path, os.O_RDONLY, limiter=self._limiter)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return Damage(0, f"cannot open: {exc.strerror or exc}")
        try:
            while chunk := await trio.to_thread.run_sync(
                os.pread, fd, CHUNK_BYTES, offset, limiter=self._limiter
            ):
                n = len(chunk)
                del chunk  # only the count is kept: the check reads the map
                offset += n
                self._bytes += n
                await trio.sleep(n / self._rate)
            if offset == 0:
                return b""
            return mmap.mmap(fd, offset, access=mmap.ACCESS_READ)
        except OSError as exc:
            return Damage(offset, f"read error: {exc.strerror or exc}")
        finally:
            os.close(fd)

    def _record(self, lane: str, path: Path, damage: Damage | None) -> None:
        if damage is None:
            self._forget(path)
            return
        repairing = self.on_damage is not None and self.on_damage(path)
        known = self._damaged.get(path)
        if known is not None and (known.offset, known.reason) == (damage.offset, damage.reason):
            return  # said once already
        found = ScrubFinding(lane, path, damage.offset, damage.reason, self._wall_ms())
        self._damaged[path] = found
        log.warning(
            'journal scrub: %s is damaged at byte %d: %s (%s; docs/operations.md, "A damaged '
            'disk")',
            path,
            damage.offset,
            damage.reason,
            "being repaired from the bucket"
            if repairing
            else "it stays as it is: not repairable from the bucket now",
        )

    def _forget(self, path: Path) -> None:
        if self._damaged.pop(path, None) is not None:
            log.info("journal scrub: %s is no longer damaged (gone or rewritten)", path)
