"""The shipper: journal -> one multi-partition log object per flush -> the region's log.

Protocol and failure cases: ``docs/protocol.md``. In short, per flush:

1. take the durable journal entries after the shipped watermark (up to
   ``max_object_bytes``; up to ``backlog_object_bytes`` for a backlog), keep
   the DATA ones (mirror entries belong to other regions' logs), and build
   ONE object: a header with the index, then a zstd block per (topic,
   partition) made of the journal's batches as they are;
2. create it as ``log/<next seq>`` with a create-only PUT: that PUT is the commit;
3. move the journal's safe LSN past it, so segments can be deleted, and wake
   ``ack=shipped`` waiters;
4. every ``manifest_interval`` (or ``manifest_every`` entries) also create a
   manifest covering the entries since the previous one -- after one HEAD
   that checks the bucket still holds the previous manifest: a wiped bucket
   accepts the next create as if nothing happened, so the shipper stops with
   :class:`~edge_gateway.errors.BucketLost` instead of writing a second log.

A flush happens when the oldest unshipped entry has waited ``flush_interval``
or ``max_object_bytes`` are pending; an idle gateway makes no requests (but the
manifest of what it shipped, once its interval is up). While
the bucket is away, the shipper retries the same object with exponential
backoff and jitter and the journal keeps accepting; afterwards the backlog
ships as large objects, in LSN order.

While the bucket *refuses* the gateway (:class:`~edge_gateway.bucket.AccessDenied`:
revoked or expired credentials, a policy, no such bucket, the wrong region)
the shipper does the same -- claim and commits are retried with backoff,
the same bytes at the same seq, so nothing ships twice or is skipped when
access works again -- but its state is ``denied``: :meth:`Shipper.statistics`
carries the store's code and what to do, and the log says so at ERROR when
it starts and every few minutes while it lasts (:class:`~edge_gateway.bucket.DenialTracker`).

Objects shipped back to back (a backlog, ``ship_pending``) are pipelined: the
next object is read and compressed (in a worker thread) while the previous
one uploads. Creates stay strictly sequential -- object ``n + 1`` is created
only once ``n`` is committed, so the log never has a hole -- and an object
built ahead of a failed commit (``Fenced``) is dropped.

Objects of a backlog are larger: the first object of a flush holds at most
``max_object_bytes`` (so live traffic ships exactly as before), and the ones
shipped back to back behind it -- only when at least ``max_object_bytes``
more are pending -- grow to ``backlog_object_bytes``. Every PUT has a fixed
cost (a round trip, the store's per-request work, a manifest entry), so a
drain of many small objects is bound by request overhead rather than bytes;
fewer, larger objects ship the same journal in fewer requests.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from edge_gateway.bucket import (
    AccessDenied,
    Bucket,
    BucketGone,
    BucketUnavailable,
    Denial,
    DenialTracker,
    NotFound,
    PreconditionFailed,
    verify_conditional_create,
)
from edge_gateway.clock import BucketClock
from edge_gateway.errors import BucketLost, ConfigError, CorruptData, DiskFull, Fenced, InvalidInput
from edge_gateway.failpoints import fail_point
from edge_gateway.format import entry as fentry
from edge_gateway.format import logobject
from edge_gateway.format.entry import Checkpoint
from edge_gateway.format.logobject import LogObjectBuilder
from edge_gateway.format.manifest import (
    Manifest,
    ManifestEntry,
    log_key,
    log_prefix,
    manifest_key,
    manifest_prefix,
    parse_log_key,
    parse_manifest_key,
)
from edge_gateway.journal import Entry, Journal
from edge_gateway.names import validate_region
from edge_gateway.protocol.log import Backoff, Conflict, ManifestSchedule, classify_conflict
from edge_gateway.regionlog import (
    LogState,
    load_log_state,
    mark_bucket,
    read_gc_boundary,
    read_header,
    read_skipped,
    skip_to_head,
)

log = logging.getLogger("edgegw.shipper")

MiB = 1024 * 1024
#: Upper bound of ``backlog_object_bytes``: an object is built in memory.
MAX_BACKLOG_OBJECT_BYTES = 1024 * MiB
#: Objects of a drain compressed at once, each in a worker thread (zstd
#: releases the GIL). Compression is most of a drain's CPU time, so a second
#: core nearly doubles its speed; more would hold more objects in memory for
#: little gain on the small machines an edge site runs on.
_BUILD_THREADS = max(1, min(2, os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class _Prepared:
    """An object built for ``seq`` from journal LSNs ``first_lsn..last_lsn``, not yet created."""

    seq: int
    first_lsn: int
    last_lsn: int
    #: None when the range holds nothing to ship (mirror entries only).
    obj: bytes | None
    records: int
    journal_bytes: int


@dataclass(frozen=True, slots=True)
class _Read:
    """The entries of the object for ``seq``: journal LSNs ``first_lsn..last_lsn``."""

    seq: int
    first_lsn: int
    last_lsn: int
    #: The DATA entries of the range (empty: mirror entries only, nothing to ship).
    data: list[Entry]


@dataclass(slots=True)
class _Building:
    """An object of a drain being built ahead of its commit."""

    read: _Read
    prepared: _Prepared | None = None
    done: trio.Event = field(default_factory=trio.Event)


class Diverged(Fenced):
    """Another writer continued this region's log while this journal holds unshipped data."""


@dataclass(frozen=True, slots=True)
class _WriterState:
    """What ``<journal>/shipper.json`` remembers between runs.

    ``epoch`` is the last epoch claimed (written before the fence: write-ahead).
    ``log_seq`` is a seq the region's log is known to have reached -- a head
    seen at a claim, our fence, the last entry of a manifest we wrote -- and
    ``log_lsn`` the journal LSN shipped through at that seq. A log's head never
    moves back (creates only; GC keeps the newest entries), so finding it below
    ``log_seq`` means the bucket lost the log (:class:`BucketLost`).
    """

    epoch: int
    log_seq: int = 0
    log_lsn: int = 0


@dataclass(frozen=True, slots=True)
class ShipperConfig:
    flush_interval_ms: int = 250
    #: Journal bytes per object of a flush; a flush goes early once this
    #: much is pending.
    max_object_bytes: int = 8 * MiB
    #: Journal bytes per object when draining a backlog: objects shipped back
    #: to back behind a full one grow up to this (fewer creates, each a round
    #: trip). A drain holds the entries of up to two objects being built at
    #: once, plus compressed objects waiting: bench/ship.py measured a peak of
    #: 35-110 MiB above the resident memory at 16 MiB (110-180 at 32 MiB,
    #: 250-270 at 64 MiB; 10-35 with 8 MiB objects). A value at or below
    #: ``max_object_bytes`` keeps every object at ``max_object_bytes``.
    backlog_object_bytes: int = 16 * MiB
    manifest_interval_ms: int = 10_000
    manifest_every: int = 100
    #: zstd level of the blocks. 1 is both faster and smaller than 3 on
    #: telemetry JSON (bench/ship.py: 14.2x vs 12.3x at ~700 vs ~510 MB/s per
    #: core; FACTS.md: 7.0x vs 6.8x), so shipping stays cheap on small CPUs.
    compression_level: int = 1
    retry_base_s: float = 0.1
    retry_cap_s: float = 30.0
    #: After a pause longer than this between two commits, re-read the GC
    #: boundary after the next create (see docs/protocol.md, "GC boundary").
    gc_check_after_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.flush_interval_ms <= 0:
            raise ConfigError("shipper.flush_interval_ms must be > 0")
        if self.max_object_bytes < 64 * 1024:
            raise ConfigError("shipper.max_object_bytes must be at least 64 KiB")
        if not 0 < self.backlog_object_bytes <= MAX_BACKLOG_OBJECT_BYTES:
            raise ConfigError("shipper.backlog_object_bytes must be within 1 B..1 GiB")
        if not 1 <= self.compression_level <= 22:
            raise ConfigError("shipper.compression_level must be 1..22")
        if self.manifest_every < 1 or self.manifest_interval_ms <= 0:
            raise ConfigError("shipper.manifest_every and manifest_interval_ms must be positive")


@dataclass(frozen=True, slots=True)
class ShipperStats:
    claimed: bool
    epoch: int
    next_seq: int
    shipped_lsn: int
    objects: int
    fences: int
    manifests: int
    records: int
    journal_bytes: int
    wire_bytes: int
    retries: int
    last_ship_ms: int
    last_error: str | None
    upload_seconds_total: float
    #: ``starting`` (not claimed yet), ``shipping``, ``retrying`` (the bucket
    #: is away) or ``denied`` (the bucket refuses this gateway: see ``denied``).
    state: str = "starting"
    #: The refusal in force, while ``state`` is ``denied``.
    denied: Denial | None = None


#: The states of :attr:`ShipperStats.state`.
SHIPPER_STATES = ("starting", "shipping", "retrying", "denied")

#: Bucket errors the shipper retries with backoff: an outage, or a refusal
#: that a person is expected to fix (credentials, policy, bucket).
_RETRIED = (BucketUnavailable, AccessDenied)


class Shipper:
    """Ships one region's journal to its log in the bucket. Single writer, fenced by epoch."""

    def __init__(
        self,
        journal: Journal,
        bucket: Bucket,
        region: str,
        *,
        config: ShipperConfig | None = None,
        prefix: str = "",
        state_path: str | os.PathLike[str] | None = None,
        clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        on_commit: Callable[[int], None] | None = None,
        bucket_clock: BucketClock | None = None,
        reship: bool = False,
    ) -> None:
        self.journal = journal
        self.bucket = bucket
        self.region = validate_region(region)
        self.config = config or ShipperConfig()
        self.prefix = prefix
        self._state_path = Path(state_path) if state_path else journal.path / "shipper.json"
        self._clock = clock
        self._rand = random.Random()
        self._claimed = False
        self._claimed_event = trio.Event()
        self._epoch = 0
        self._next_seq = 1
        self._ship_from = 1  # first journal LSN not shipped yet
        self._shipped_lsn = 0
        self._gc_boundary = 0
        self._low_watermark = 1
        self._next_offsets: dict[tuple[str, int], int] = {}
        self._pending_manifest: list[ManifestEntry] = []
        #: The newest manifest in the bucket (GC never deletes it), if any.
        self._last_manifest_key: str | None = None
        self._schedule = ManifestSchedule(
            interval_ms=self.config.manifest_interval_ms, max_entries=self.config.manifest_every
        )
        self._last_commit_mono = time.monotonic()
        #: Compared with the bucket's on every object this shipper writes.
        self.bucket_clock = bucket_clock or BucketClock()
        # Intervals run on the monotonic clock (``_mono_ms``), never on the
        # wall clock, which an edge device may set by days while running.
        self._mono_origin = time.monotonic()
        self._schedule.last_written_ms = self._mono_ms() - self.config.manifest_interval_ms
        #: Monotonic time (``time.monotonic``) no later than the append of
        #: every pending entry (-inf: unknown, e.g. entries from before a restart).
        self._pending_since = -math.inf
        self._shipped_lot = trio.lowlevel.ParkingLot()
        self._appended_bytes_at_ship = 0
        self._ship_now = False
        self._flush_wait: trio.CancelScope | None = None
        # counters
        self._objects = self._fences = self._manifests = self._records = 0
        self._journal_bytes = self._wire_bytes = self._retries = 0
        self._last_ship_ms = 0
        self._last_error: str | None = None
        self._upload_s = 0.0
        #: The last bucket operation failed as unavailable (until one succeeds).
        self._retrying = False
        self._denial = DenialTracker(log, f"shipper of region {self.region}")
        #: Called with each seq right after it is committed (the fence of a
        #: claim included), e.g. ``HeadReporter.report_nowait``: it must not
        #: block; an exception is logged and ignored, never fails shipping.
        self.on_commit = on_commit
        #: ``edgegw reship``: when the bucket lost the region's log, claim
        #: anyway and ship the journal again from the bucket's head -- if the
        #: journal still holds every entry after it (else :class:`BucketLost`).
        self.reship = reship
        #: Set by a claim that accepted a lost log (``reship``): the first LSN shipped again.
        self.recreated_from_lsn: int | None = None

    # ------------------------------------------------------------- claim

    def _load_writer_state(self) -> _WriterState | None:
        try:
            doc = json.loads(self._state_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise CorruptData(
                f"unreadable shipper state: {exc}", where=str(self._state_path)
            ) from None
        if doc.get("region") != self.region:
            raise ConfigError(
                f"this journal belongs to region {doc.get('region')!r}, not {self.region!r}"
            )
        epoch = doc.get("epoch")
        if not isinstance(epoch, int):
            raise CorruptData("shipper state has no epoch", where=str(self._state_path))
        # Written by older versions without them: nothing known, nothing checked.
        log_seq, log_lsn = doc.get("log_seq", 0), doc.get("log_lsn", 0)
        if not isinstance(log_seq, int) or not isinstance(log_lsn, int):
            raise CorruptData("shipper state has a bad log_seq", where=str(self._state_path))
        return _WriterState(epoch, log_seq, log_lsn)

    def _save_writer_state(self, state: _WriterState) -> None:
        """Write shipper.json atomically; :class:`DiskFull` (tmp removed) if there is no room."""
        tmp = self._state_path.with_suffix(".tmp")
        data = json.dumps(
            {
                "region": self.region,
                "epoch": state.epoch,
                "log_seq": state.log_seq,
                "log_lsn": state.log_lsn,
            }
        ).encode()
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise DiskFull(
                f"no room to write {self._state_path.name}: {exc.strerror or exc}"
            ) from None
        os.replace(tmp, self._state_path)
        dfd = os.open(self._state_path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    async def claim(self) -> None:
        """Verify the bucket, find the log head, reconcile with the journal, claim an epoch.

        Raises :class:`Fenced`/:class:`Diverged` when this gateway must not
        write, :class:`~edge_gateway.errors.BucketLost` when the log is below
        what this journal knows it committed (unless :attr:`reship` and the
        journal can re-create it), ``UnsupportedStore`` for a bucket without
        conditional creates, ``BucketUnavailable`` when the bucket is away
        (retry later).
        """
        try:
            await verify_conditional_create(self.bucket, self.prefix)
        except BucketGone as exc:
            raise self._lost(str(exc)) from None
        state: LogState | None = None
        while True:
            written = self._load_writer_state()
            try:
                if state is None:
                    state = await load_log_state(self.bucket, self.prefix, self.region)
                else:  # lost a race to a live writer: straight to its head, read the rest after
                    state = await skip_to_head(self.bucket, self.prefix, self.region, state)
            except NotFound as exc:
                # A manifest or GC boundary names an entry that is not there.
                raise self._lost(f"an entry it still refers to is gone ({exc})") from None
            known = self._reconcile(state, written)
            if self.recreated_from_lsn is not None:
                await self._drop_stale(state, written.epoch if written else 0)
            epoch = max(state.head_epoch, state.max_epoch, written.epoch if written else 0) + 1
            # Write-ahead: remember the epoch we are about to claim, so a crash
            # right after the fence lands still recognises the head as ours.
            await trio.to_thread.run_sync(
                self._save_writer_state, _WriterState(epoch, known.log_seq, known.log_lsn)
            )
            seq = state.head + 1
            fence = logobject.encode_fence(
                self.region, epoch, seq, self._shipped_lsn, self._clock()
            )
            try:
                await self._create_timed(log_key(self.prefix, self.region, seq), fence)
            except PreconditionFailed:
                log.info("shipper: seq %d was taken while claiming; looking again", seq)
                continue
            except BucketGone as exc:
                raise self._lost(str(exc)) from None
            break
        if state.skipped:
            # The live writer is fenced now: read what it committed before our
            # fence, and line the journal up with it (offsets continue after it).
            state = await read_skipped(self.bucket, self.prefix, self.region, state)
            self._reconcile(state, self._load_writer_state())
        await trio.to_thread.run_sync(
            self._save_writer_state, _WriterState(epoch, seq, self._shipped_lsn)
        )
        self._epoch = epoch
        self._next_seq = seq + 1
        self._gc_boundary = state.gc_boundary
        self._low_watermark = state.gc_boundary + 1
        self._next_offsets = dict(state.next_offsets)
        self._pending_manifest = [ManifestEntry.from_header(h, size) for h, size in state.tail]
        fence_header = logobject.decode_header(fence, where="fence")
        self._pending_manifest.append(ManifestEntry.from_header(fence_header, len(fence)))
        self._schedule.first_seq = (
            (state.manifest.last_seq + 1) if state.manifest else self._low_watermark
        )
        self._last_manifest_key = (
            manifest_key(self.prefix, self.region, state.manifest.last_seq)
            if state.manifest
            else None
        )
        self._schedule.committed(len(self._pending_manifest))
        self._fences += 1
        self._claimed = True
        self._claimed_event.set()
        self._accepted()
        self._last_commit_mono = time.monotonic()
        log.info(
            "shipper: region %s claimed epoch %d at seq %d (journal shipped through LSN %d)",
            self.region,
            epoch,
            seq,
            self._shipped_lsn,
        )
        self._notify_commit(seq)
        await self._mark_bucket()

    async def _mark_bucket(self) -> None:
        """Make the bucket recognisable as edgegw's (``edgegw restore``/``sync`` check it)."""
        try:
            if await mark_bucket(self.bucket, self.prefix, self.region, self._clock()):
                log.info("shipper: marked %s as an edgegw bucket", self.bucket.name)
        except BucketUnavailable as exc:
            # Only a hint for the CLI: the next claim writes it.
            log.warning("shipper: could not write the bucket marker (%s)", exc)

    def ship_now(self) -> None:
        """Ship what is pending at once instead of at the flush deadline (``edgegw sync``)."""
        self._ship_now = True
        if self._flush_wait is not None:
            self._flush_wait.cancel()

    def reset(self) -> None:
        """Forget the claim, so that :meth:`run` claims again (the supervisor's restart).

        A run that failed unexpectedly may have stopped between an upload and
        its bookkeeping; claiming again reconciles with the log head exactly
        as a restart of the process does (a lost response is recognised as
        ours), at the cost of one fence entry.
        """
        self._claimed = False

    def _notify_commit(self, seq: int) -> None:
        hook = self.on_commit
        if hook is None:
            return
        try:
            hook(seq)
        except Exception:  # a hint for others: it never stops shipping
            log.exception("shipper: on_commit hook failed for seq %d", seq)

    def _reconcile(self, state: LogState, written: _WriterState | None) -> _WriterState:
        """Line the journal up with the log head: no gap, no duplicate, no reused offset.

        Returns what the log is now known to hold (``epoch`` unused), for
        ``shipper.json``.
        """
        j = self.journal
        journal_last = j.next_lsn - 1
        head_lsn = state.head_last_lsn
        ours = written.epoch if written is not None else None
        head_is_ours = state.head == 0 or (ours is not None and state.head_epoch <= ours)
        first_lsn = j.statistics().first_lsn
        # Every LSN below the journal's first was shipped: segments are deleted
        # only once the bucket confirmed them.
        if written is not None and state.head < written.log_seq:
            lost = (
                f"its head is seq {state.head} (journal LSN {head_lsn}) but this gateway saw "
                f"seq {written.log_seq} committed there (LSN {written.log_lsn})"
            )
        elif head_is_ours and not j.is_new and head_lsn + 1 < first_lsn:
            lost = (
                f"it covers journal LSNs up to {head_lsn}, but the journal deleted LSNs up to "
                f"{first_lsn - 1} after the bucket had confirmed them"
            )
        else:
            lost = ""
        if lost:
            # A head we wrote, and the journal holds everything after it: the
            # log can be re-created by shipping again from there.
            can_reship = head_is_ours and first_lsn <= head_lsn + 1 <= journal_last + 1
            if not (self.reship and can_reship):
                raise self._lost(lost, resume_lsn=head_lsn + 1, can_reship=can_reship)
            log.warning(
                "shipper: region %s's log in %s was lost (%s); re-creating it from the "
                "journal: shipping LSNs %d-%d again",
                self.region,
                self.bucket.describe(),
                lost,
                head_lsn + 1,
                journal_last,
            )
            known = _WriterState(0, state.head, head_lsn)
            self.recreated_from_lsn = head_lsn + 1
        elif written is not None and written.log_seq >= state.head:
            known = written
        else:
            known = _WriterState(0, state.head, head_lsn if head_is_ours else 0)
        self._line_up(state, head_is_ours, ours)
        return known

    async def _drop_stale(self, state: LogState, ours: int) -> None:
        """Reship: delete what this region's old epochs left above the surviving head.

        A gateway that wrote on after its bucket was replaced by an empty one
        created entries (and maybe a manifest) at seqs far above the new
        head, until a check noticed. The log is re-created from the journal
        from the head on, so these hold nothing the journal does not; left
        there, they would collide with the re-created entries at their seqs.
        An entry of a higher epoch than ours is another writer's: stop.
        """
        entries = await self.bucket.list(
            log_prefix(self.prefix, self.region),
            start_after=log_key(self.prefix, self.region, state.head),
        )
        stale: list[str] = []
        for info in entries:
            try:
                parse_log_key(info.key, self.prefix)
            except CorruptData:
                continue  # not a log entry
            theirs = (await read_header(self.bucket, info.key)).header
            if theirs.epoch > ours:
                raise Diverged(
                    f"region {self.region}: {info.key} above the head of the lost log was "
                    f"written with epoch {theirs.epoch}, ours is {ours}: another gateway writes "
                    "this region; stop it first"
                )
            stale.append(info.key)
        for info in await self.bucket.list(manifest_prefix(self.prefix, self.region)):
            try:
                _, last_seq = parse_manifest_key(info.key, self.prefix)
            except CorruptData:
                continue
            if last_seq > state.head:
                stale.append(info.key)
        for key in stale:
            await self.bucket.delete(key)
        if stale:
            log.warning(
                "shipper: deleted %d objects of the lost log above seq %d (%s .. %s)",
                len(stale),
                state.head,
                stale[0],
                stale[-1],
            )

    def _lost(
        self, what: str, *, resume_lsn: int | None = None, can_reship: bool | None = None
    ) -> BucketLost:
        """The error for a bucket that lost this region's log, with the way out."""
        j = self.journal
        first, last = j.statistics().first_lsn, j.next_lsn - 1
        if can_reship is None:  # the bucket's head is not known (found while running)
            held = f"it still holds LSNs {first}-{last}" if first <= last else "it holds no entries"
            how = (
                "`edgegw reship --config FILE` re-creates the log from the journal if the "
                f"journal holds every entry after the bucket's head ({held})"
            )
        elif can_reship:
            how = (
                "`edgegw reship --config FILE` re-creates the log from this journal, which "
                f"still holds every entry after the bucket's head (LSNs {resume_lsn}-{last})"
            )
        else:
            how = (
                f"this journal no longer holds every entry after the bucket's head (LSN "
                f"{resume_lsn} on; it starts at {first}), so the log cannot be re-created from "
                "it: `edgegw restore` starts a new journal from what the bucket holds"
            )
        return BucketLost(
            f"region {self.region}'s log in {self.bucket.describe()} was lost: {what}. "
            "The bucket was wiped or replaced, or the config names another bucket or prefix "
            f"(then fix the config). To recover: {how}; see docs/operations.md, "
            "'The bucket lost a region's log'"
        )

    def _line_up(self, state: LogState, head_is_ours: bool, ours: int | None) -> None:
        j = self.journal
        journal_last = j.next_lsn - 1
        head_lsn = state.head_last_lsn
        if j.is_new and (not head_is_ours or head_lsn > journal_last or state.head):
            if state.head:
                # A new or wiped gateway continues the region's log: LSNs and
                # offsets resume where the bucket's log ends.
                j.reset_empty(Checkpoint(dict(state.next_offsets), {}), head_lsn + 1)
                log.info(
                    "shipper: empty journal continues the log of %s at LSN %d (%d partitions)",
                    self.region,
                    head_lsn + 1,
                    len(state.next_offsets),
                )
            self._ship_from = j.next_lsn
            self._shipped_lsn = j.next_lsn - 1
            return
        if not head_is_ours:
            raise Diverged(
                f"region {self.region}'s log was continued by another writer (epoch "
                f"{state.head_epoch}, ours {ours}) while this journal holds data up to LSN "
                f"{journal_last}; its unshipped records cannot be merged. Stop the other writer, "
                "or run `edgegw restore` to start this gateway from the bucket (discarding "
                "local unshipped data)."
            )
        if head_lsn > journal_last:
            raise Diverged(
                f"region {self.region}'s log covers journal LSNs up to {head_lsn} but the local "
                f"journal ends at {journal_last}: the journal lost data. Run `edgegw restore`."
            )
        # (A journal that starts after head_lsn + 1 was refused as a lost
        # bucket above: its segments are deleted only once shipped.)
        self._ship_from = head_lsn + 1
        self._shipped_lsn = head_lsn
        j.set_safe_lsn(head_lsn + 1)

    # ------------------------------------------------------------- ship

    @property
    def shipped_lsn(self) -> int:
        """Every journal entry up to this LSN is committed to the bucket (or needs no shipping)."""
        return self._shipped_lsn

    async def wait_shipped(self, lsn: int) -> None:
        """Wait until the journal entry ``lsn`` is committed to the bucket."""
        while self._shipped_lsn < lsn:
            await self._shipped_lot.park()

    async def wait_claimed(self) -> None:
        """Wait until this shipper owns the region's log (see :meth:`run`)."""
        await self._claimed_event.wait()

    def shipped_offsets(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition), the next offset not yet committed to the bucket."""
        return dict(self._next_offsets)

    def pending(self) -> bool:
        return self.journal.next_lsn > self._ship_from

    async def ship_once(self) -> bool:
        """Ship up to ``max_object_bytes`` of durable entries as one object. False if none."""
        if not self._claimed:
            raise InvalidInput("claim() first")
        read = await self._read(self._ship_from, self._next_seq, self.config.max_object_bytes)
        if read is None:
            return False
        await self._publish(await self._build(read))
        return True

    async def _ship_many(
        self,
        *,
        until_lsn: int | None = None,
        next_due: Callable[[list[Entry]], bool] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Ship objects back to back, building the next ones while the previous uploads.

        Commits stay strictly in order: object ``n + 1`` is created only after
        object ``n`` is committed; if that fails (``Fenced``, ...), every
        object built ahead is dropped. Entries are read in LSN order on this
        thread; up to :data:`_BUILD_THREADS` objects are compressed at once in
        worker threads, and at most one more than that is held in memory. The
        first object is always shipped (up to ``max_object_bytes``); the next
        ones while their first LSN is at most ``until_lsn`` and ``next_due``
        accepts their entries, each up to ``backlog_object_bytes``. Returns the
        number of objects shipped.
        """
        if not self._claimed:
            raise InvalidInput("claim() first")
        cfg = self.config
        first = await self._read(self._ship_from, self._next_seq, cfg.max_object_bytes)
        if first is None:
            return 0
        # Memory of a drain: at most _BUILD_THREADS objects are being read or
        # built (their entries in memory), and at most one more is read and
        # not yet committed (built objects waiting to upload hold only their
        # compressed bytes).
        building = trio.Semaphore(_BUILD_THREADS)
        in_memory = trio.Semaphore(_BUILD_THREADS + 1)
        building.acquire_nowait()  # for ``first``
        in_memory.acquire_nowait()
        send, receive = trio.open_memory_channel[_Building](math.inf)
        backlog_limit = max(cfg.max_object_bytes, cfg.backlog_object_bytes)

        async def build(slot: _Building) -> None:
            try:
                slot.prepared = await self._build(slot.read)
            finally:
                building.release()
            slot.done.set()

        async def read_ahead(nursery: trio.Nursery) -> None:
            async with send:
                read: _Read | None = first
                while read is not None:
                    slot = _Building(read)
                    nursery.start_soon(build, slot)
                    send.send_nowait(slot)
                    if until_lsn is not None and read.last_lsn >= until_lsn:
                        return
                    await in_memory.acquire()
                    await building.acquire()
                    seq = read.seq + (1 if read.data else 0)
                    read = await self._read(read.last_lsn + 1, seq, backlog_limit, due=next_due)
                    if read is None:
                        building.release()
                        in_memory.release()

        shipped = 0
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_ahead, nursery)
                async for slot in receive:
                    await slot.done.wait()
                    assert slot.prepared is not None
                    await self._publish(slot.prepared)
                    slot.prepared = None
                    in_memory.release()
                    shipped += 1
                    if progress is not None:
                        progress(self._shipped_lsn, until_lsn or self._shipped_lsn)
        except BaseExceptionGroup as group:
            # Surface the commit's own error (Fenced, ...), not a group of one.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        return shipped

    async def _read(
        self,
        first_lsn: int,
        seq: int,
        limit: int,
        *,
        due: Callable[[list[Entry]], bool] | None = None,
    ) -> _Read | None:
        """The durable entries of the object for ``seq`` from ``first_lsn``; None: nothing
        (due) to ship.

        The object holds up to ``max_object_bytes`` of entries; when that much
        is there and more is pending, it grows up to ``limit`` (a backlog).
        """
        j = self.journal
        if j.durable_lsn < j.next_lsn - 1:
            await j.wait_durable(j.next_lsn - 1)
        entries = await self._read_entries(first_lsn, limit)
        if not entries or (due is not None and not due(entries)):
            return None
        data = [e for e in entries if e.kind == fentry.KIND_DATA]
        return _Read(seq, first_lsn, entries[-1].lsn, data)

    async def _read_entries(self, first_lsn: int, limit: int) -> list[Entry]:
        """Up to ``limit`` bytes of durable entries from ``first_lsn``, in LSN order.

        Beyond ``max_object_bytes`` the entries are read one ``max_object_bytes``
        step at a time, letting other tasks run in between: reading and
        checking a large object's entries takes tens of milliseconds that
        must not stall the event loop (local produce and consume share it).
        """
        step = self.config.max_object_bytes
        entries = self.journal.read_entries(first_lsn, max_bytes=min(step, limit))
        size = sum(e.length for e in entries)
        # A short read means nothing more is durable yet: no backlog.
        while entries and step <= size < limit:
            await trio.lowlevel.checkpoint()
            more = self.journal.read_entries(entries[-1].lsn + 1, max_bytes=min(step, limit - size))
            if not more:
                break
            entries.extend(more)
            size += sum(e.length for e in more)
        return entries

    async def _build(self, read: _Read) -> _Prepared:
        """Build the object of ``read`` (compression in a worker thread)."""
        if not read.data:
            return _Prepared(read.seq, read.first_lsn, read.last_lsn, None, 0, 0)
        builder = LogObjectBuilder()
        for e in read.data:
            builder.add_batch(e.topic, e.partition, e.payload)
        epoch, created, level = self._epoch, self._clock(), self.config.compression_level
        obj = await trio.to_thread.run_sync(
            lambda: builder.build(
                region=self.region,
                epoch=epoch,
                seq=read.seq,
                first_lsn=read.first_lsn,
                last_lsn=read.last_lsn,
                created_ms=created,
                level=level,
            )
        )
        return _Prepared(
            read.seq,
            read.first_lsn,
            read.last_lsn,
            obj,
            sum(e.count for e in read.data),
            sum(e.length for e in read.data),
        )

    async def _publish(self, p: _Prepared) -> None:
        """Commit a prepared object (if it holds data) and move the shipped watermark past it."""
        assert p.first_lsn == self._ship_from, "objects must be published in LSN order"
        if p.obj is not None:
            assert p.seq == self._next_seq, "objects must be published in seq order"
            await self._commit(p.obj, p.seq, p.first_lsn, p.last_lsn)
            self._records += p.records
            self._journal_bytes += p.journal_bytes
        # The commit is done: advance the watermark BEFORE anything else can
        # wait (the manifest PUT below). A cancellation there (shutdown) must
        # not leave a committed object looking unshipped, or the next drain
        # would ship the same LSNs again under a new seq.
        self._advance(p.last_lsn)
        if p.obj is not None:
            await self._maybe_write_manifest()

    def _advance(self, last_lsn: int) -> None:
        self._ship_from = last_lsn + 1
        self._shipped_lsn = last_lsn
        self.journal.set_safe_lsn(last_lsn + 1)
        self._shipped_lot.unpark_all()

    async def _commit(self, obj: bytes, seq: int, first_lsn: int, last_lsn: int) -> None:
        epoch = self._epoch
        key = log_key(self.prefix, self.region, seq)
        backoff = Backoff(self.config.retry_base_s, self.config.retry_cap_s)
        while True:
            t0 = time.perf_counter()
            try:
                await self._create(key, obj, epoch, first_lsn, last_lsn)
                self._upload_s += time.perf_counter() - t0
                break
            except BucketGone as exc:
                # The bucket went away under us (a local directory removed or
                # replaced): retrying would write into whatever replaces it.
                raise self._lost(f"{key} could not be created: {exc}") from None
            except _RETRIED as exc:
                # From the PUT or from reading the entry back after a 412:
                # either way the outcome is unknown (or, refused, known not to
                # have happened), and the same bytes at the same seq are
                # retried (a 412 then tells whether they landed).
                self._upload_s += time.perf_counter() - t0
                await self._retry_later(backoff, f"{key} not committed", exc)
        self._accepted()
        await self._after_create(seq)
        header = logobject.decode_header(obj, where=key)
        self._next_seq = seq + 1
        self._objects += 1
        self._wire_bytes += len(obj)
        self._last_ship_ms = self._clock()
        self._last_error = None
        for b in header.blocks:
            self._next_offsets[(b.topic, b.partition)] = b.last_offset + 1
        self._pending_manifest.append(ManifestEntry.from_header(header, len(obj)))
        self._schedule.committed()
        self._notify_commit(seq)

    async def _create(
        self, key: str, obj: bytes, epoch: int, first_lsn: int, last_lsn: int
    ) -> None:
        """One attempt to create the entry; returns once it is committed (by us)."""
        try:
            await self._create_timed(key, obj)
            return
        except PreconditionFailed:
            pass
        theirs = (await read_header(self.bucket, key)).header
        outcome = classify_conflict(
            our_epoch=epoch,
            our_first_lsn=first_lsn,
            our_last_lsn=last_lsn,
            their_epoch=theirs.epoch,
            their_first_lsn=theirs.first_lsn,
            their_last_lsn=theirs.last_lsn,
        )
        if outcome is Conflict.OURS:
            log.info("shipper: %s was already ours (a lost response); committed", key)
            return
        if outcome is Conflict.FENCED:
            raise Fenced(
                f"region {self.region}: {key} was written with epoch {theirs.epoch}; "
                f"this gateway (epoch {epoch}) has been replaced and stops writing"
            )
        raise CorruptData(
            f"a lower-epoch writer ({theirs.epoch}) created {key} after our claim", where=key
        )

    async def _retry_later(
        self, backoff: Backoff, what: str, exc: BucketUnavailable | AccessDenied
    ) -> None:
        self._retries += 1
        self._last_error = str(exc)
        delay = backoff.next_delay(self._rand.random())
        if isinstance(exc, AccessDenied):
            # Logged at ERROR when it starts and as a periodic reminder, not
            # as a warning per attempt.
            self._denial.refused(exc)
        else:
            self._retrying = True
            log.warning("shipper: %s (%s); retrying in %.2fs", what, exc, delay)
        await trio.sleep(delay)

    def _accepted(self) -> None:
        """The bucket took a claim or a commit: any outage or refusal is over."""
        self._retrying = False
        self._last_error = None
        self._denial.cleared()

    @property
    def state(self) -> str:
        """One of :data:`SHIPPER_STATES` (see :attr:`ShipperStats.state`)."""
        if self._denial.current is not None:
            return "denied"
        if self._retrying:
            return "retrying"
        return "shipping" if self._claimed else "starting"

    @property
    def denied(self) -> Denial | None:
        """The bucket's refusal in force (``None`` while it accepts this gateway)."""
        return self._denial.current

    async def _after_create(self, seq: int) -> None:
        """After a stall, make sure the create did not re-create a seq that GC deleted."""
        now = time.monotonic()
        stalled = (now - self._last_commit_mono) * 1000 > self.config.gc_check_after_ms
        self._last_commit_mono = now
        if not stalled:
            return
        # The entry is committed; until the boundary is known this writer may
        # not go on (it may be a zombie that GC has overtaken), so an outage
        # here is waited out like one of the create.
        backoff = Backoff(self.config.retry_base_s, self.config.retry_cap_s)
        while True:
            try:
                boundary = await read_gc_boundary(self.bucket, self.prefix, self.region)
                break
            except _RETRIED as exc:
                await self._retry_later(backoff, f"GC boundary check after seq {seq}", exc)
        self._gc_boundary = max(self._gc_boundary, boundary)
        if boundary >= seq:
            raise Fenced(
                f"region {self.region}: seq {seq} was created after GC had already deleted up "
                f"to seq {boundary}; this writer stalled past GC and must stop"
            )

    async def _maybe_write_manifest(self, *, force: bool = False) -> None:
        if not self._pending_manifest or not (force or self._schedule.due(self._mono_ms())):
            return
        now = self._clock()
        entries = list(self._pending_manifest)
        if not await self._log_still_there(entries[0].seq):
            return
        manifest = Manifest(
            region=self.region,
            epoch=self._epoch,
            first_seq=entries[0].seq,
            last_seq=entries[-1].seq,
            low_watermark=self._low_watermark,
            created_ms=now,
            entries=tuple(entries),
            next_offsets=dict(self._next_offsets),
        )
        key = manifest_key(self.prefix, self.region, manifest.last_seq)
        try:
            await self._create_timed(key, manifest.encode())
        except PreconditionFailed:
            log.info("shipper: manifest %s already exists", key)
        except BucketGone as exc:
            raise self._lost(f"{key} could not be created: {exc}") from None
        except _RETRIED as exc:
            # A refused manifest does not hold up shipping (the log is the
            # truth; readers fall back to headers): the next one covers it.
            log.warning("shipper: manifest %s not written yet (%s)", key, exc)
            return
        self._manifests += 1
        self._last_manifest_key = key
        del self._pending_manifest[: len(entries)]
        self._schedule.written(manifest.last_seq, self._mono_ms())
        last = entries[-1]
        try:
            await trio.to_thread.run_sync(
                self._save_writer_state, _WriterState(self._epoch, last.seq, last.last_lsn)
            )
        except DiskFull as exc:
            # What shipper.json keeps here only lets a restart notice a bucket
            # that lost entries; the older state stays valid (it claims less).
            # The next manifest writes it again.
            log.info("shipper: %s; kept the previous state (the next manifest retries)", exc)

    async def _log_still_there(self, first_pending: int) -> bool:
        """Check, once per manifest, that the bucket still holds what we wrote.

        A creates-only log cannot tell a wiped bucket from a new one: the next
        create just succeeds. So before each manifest one HEAD looks for the
        newest manifest (or, before the first, the oldest entry no manifest
        covers yet): GC never deletes either, so if it is gone, the bucket lost
        the log. False: the bucket is away, try at the next manifest.
        """
        key = self._last_manifest_key or log_key(self.prefix, self.region, first_pending)
        try:
            await self.bucket.head(key)
        except NotFound:
            raise self._lost(f"{key}, which this gateway wrote, is gone") from None
        except BucketUnavailable as exc:
            log.warning("shipper: manifest not written yet (%s)", exc)
            return False
        return True

    # ------------------------------------------------------------- loops

    async def ship_pending(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Ship everything appended so far (``edgegw sync``). Returns objects shipped."""
        target = self.journal.next_lsn - 1
        shipped = 0
        if self._shipped_lsn < target:
            shipped = await self._ship_many(until_lsn=target, progress=progress)
        await self._maybe_write_manifest(force=True)
        return shipped

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim (retrying while the bucket is away or refuses), then ship for ever.

        A gateway that has claimed its region before (its journal holds a
        writer state) reports ready at once and claims in the background, so
        a site starts and journals while its link is down or its credentials
        are refused. A journal that never met the bucket must learn the
        region's log first — otherwise its offsets could reuse ones already
        in the bucket — so the first start of a gateway waits for the bucket
        (and for access to it) before reporting ready.
        """
        met_bucket = self._load_writer_state() is not None
        if met_bucket:
            task_status.started()
        backoff = Backoff(self.config.retry_base_s, self.config.retry_cap_s)
        while not self._claimed:
            try:
                await self.claim()
            except (*_RETRIED, DiskFull) as exc:
                # The probe, the log's head and the fence all go through
                # here: refused or away, the claim waits and tries again.
                # So does the write-ahead of the epoch on a full disk (the
                # journal deletes shipped segments to make room meanwhile).
                self._last_error = f"claim: {exc}"
                delay = backoff.next_delay(self._rand.random())
                if isinstance(exc, DiskFull):
                    log.warning("shipper: cannot claim yet (%s); retrying in %.1fs", exc, delay)
                elif isinstance(exc, AccessDenied):
                    self._denial.refused(exc)
                else:
                    self._retrying = True
                    log.warning(
                        "shipper: bucket unavailable at start (%s); retrying in %.1fs", exc, delay
                    )
                await trio.sleep(delay)
        if not met_bucket:
            task_status.started()
        flush_s = self.config.flush_interval_ms / 1000
        manifest_floor_s = 0.0
        while True:
            fail_point("shipper.loop")
            if not self.pending():
                # Idle. Entries shipped since the last manifest get theirs when
                # it is due (one request, then nothing): without new data the
                # summary must not wait for ever.
                due = self._schedule.due_in_ms(self._mono_ms()) if self._pending_manifest else None
                if due is None:
                    await self.journal.wait_appended(self._ship_from)
                else:
                    with trio.move_on_after(max(due / 1000, manifest_floor_s)):
                        await self.journal.wait_appended(self._ship_from)
                    if not self.pending():
                        await self._maybe_write_manifest()
                        # Not written (the bucket is away): try again after an
                        # interval, not in a loop.
                        manifest_floor_s = (
                            self.config.manifest_interval_ms / 1000
                            if self._pending_manifest
                            else 0.0
                        )
                        continue
                self._pending_since = time.monotonic()
            # The oldest pending entry sets the deadline; a full object goes now.
            deadline = trio.current_time() + max(0.0, flush_s - self.oldest_pending_age_s())
            full_at = self._appended_bytes_at_ship + self.config.max_object_bytes
            with trio.move_on_at(deadline) as self._flush_wait:
                if self._ship_now:
                    self._flush_wait.cancel()
                await self.journal.wait_appended_bytes(full_at)
            self._flush_wait = None
            self._ship_now = False
            # A backlog (after an outage, or a burst) ships back to back: a
            # full object, then objects of up to backlog_object_bytes, each
            # built while the previous one uploads.
            await self._ship_many(next_due=self._is_full)
            self._appended_bytes_at_ship = self.journal.appended_bytes
            if not self.pending():
                await self._maybe_write_manifest()

    # ------------------------------------------------------------- clocks

    async def _create_timed(self, key: str, data: bytes) -> None:
        """A create-only PUT; its answer also measures the skew against the bucket's clock."""
        ticket = self.bucket_clock.begin()
        info = await self.bucket.put(key, data, if_none_match=True)
        self.bucket_clock.observe(ticket, info.last_modified, key)

    def _mono_ms(self) -> int:
        """Milliseconds on the monotonic clock (for intervals; unaffected by setting the time)."""
        return int((time.monotonic() - self._mono_origin) * 1000)

    def oldest_pending_age_s(self) -> float:
        """How long the oldest entry not shipped yet has waited (0 when none).

        From its append time (the wall clock, kept in the journal: it
        survives a restart), but never more than the monotonic time since
        the shipper last saw the journal fully shipped — every pending entry
        was appended after that — and never below 0. Setting the wall clock
        forward therefore cannot make a flush come before
        ``flush_interval_ms``; setting it back can delay one only for entries
        that arrived during an upload, by at most that upload's time.
        """
        if not self.pending():
            return 0.0
        first = self.journal.read_entries(self._ship_from, max_bytes=1, durable_only=False)
        if not first:
            return 0.0
        age = max(0.0, (self._clock() - first[0].append_time) / 1000)
        return min(age, max(0.0, time.monotonic() - self._pending_since))

    def _is_full(self, entries: list[Entry]) -> bool:
        return sum(e.length for e in entries) >= self.config.max_object_bytes

    def statistics(self) -> ShipperStats:
        return ShipperStats(
            claimed=self._claimed,
            epoch=self._epoch,
            next_seq=self._next_seq,
            shipped_lsn=self._shipped_lsn,
            objects=self._objects,
            fences=self._fences,
            manifests=self._manifests,
            records=self._records,
            journal_bytes=self._journal_bytes,
            wire_bytes=self._wire_bytes,
            retries=self._retries,
            last_ship_ms=self._last_ship_ms,
            last_error=self._last_error,
            upload_seconds_total=self._upload_s,
            state=self.state,
            denied=self._denial.current,
        )
