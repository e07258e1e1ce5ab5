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

With topic priorities the gateway has one journal per *lane* (``Lanes``,
docs/journal.md): each object is filled lane by lane in drain order --
``critical``, then ``normal``, then ``bulk`` -- so a lane's backlog ships
before a lower lane's is touched, and every object starts with whatever
critical entries are pending (live critical data is never stuck behind a
drain). Each lane has its own shipped watermark; the objects then carry a lane
table (log object version 2) with every lane's LSN range. :attr:`Shipper.may_ship`
is the one place where a lane can be held back (a link policy).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from edge_gateway import heap
from edge_gateway.backoff import Backoff
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
from edge_gateway.bucket_log import (
    LogState,
    exists,
    load_log_state,
    mark_bucket,
    read_gc_boundary,
    read_header,
    read_skipped,
    set_aside,
    skip_to_head,
)
from edge_gateway.clock import BucketClock
from edge_gateway.durable import replace_file
from edge_gateway.errors import (
    BucketLost,
    ConfigError,
    CorruptData,
    Denied,
    DiskFull,
    Fenced,
    InvalidInput,
    Unavailable,
    UnsupportedFormat,
)
from edge_gateway.failpoints import fail_point
from edge_gateway.format import entry as fentry
from edge_gateway.format import logobject
from edge_gateway.format.entry import Checkpoint
from edge_gateway.format.logobject import (
    GapRange,
    LaneRange,
    LogObjectBuilder,
    LogObjectHeader,
    WriteKeyLike,
)
from edge_gateway.format.manifest import (
    Manifest,
    ManifestEntry,
    log_key,
    log_prefix,
    manifest_key,
    manifest_prefix,
    parse_log_key,
    parse_manifest_key,
    region_prefix,
)
from edge_gateway.format.pack import encode_pack, pack_key, pack_prefix, parse_pack_key
from edge_gateway.journal import (
    MAIN_LANE,
    Drop,
    Entry,
    Journal,
    Lane,
    Lanes,
    Loss,
    Priority,
    ReadBuffers,
    StoredChunk,
)
from edge_gateway.names import validate_region
from edge_gateway.protocol.log_decisions import Conflict, ManifestSchedule, classify_conflict
from edge_gateway.statefile import seal, unseal

log = logging.getLogger("edgegw.shipper")

MiB = 1024 * 1024
#: Upper bound of ``backlog_object_bytes``: an object is built in memory.
MAX_BACKLOG_OBJECT_BYTES = 1024 * MiB
#: After an outage, how soon the shipper retries once another request to the
#: store is answered (instead of the rest of its backoff).
RETRY_AFTER_ANSWER_S = 0.5
#: A manifest's pack is written only when it copies at least this many entries.
PACK_MIN_ENTRIES = 4
#: Objects of a drain compressed at once, each in a worker thread (zstd
#: releases the GIL). Compression is most of a drain's CPU time, so a second
#: core nearly doubles its speed; more would hold more objects in memory for
#: little gain on the small machines an edge site runs on.
_BUILD_THREADS = max(1, min(2, os.cpu_count() or 1))
#: A drain of at least this many objects back to back ends with a trim of the
#: C heap (``edge_gateway.heap``): the buffers it went through stay with the
#: process otherwise, fragmented, until the next drain.
TRIM_AFTER_OBJECTS = 8
#: Journal entries whose bodies the shipper reads; the others (mirror entries,
#: which belong to other regions' logs) are stepped over by their headers
#: (CRC-checked, not copied): a catch-up mirrors hundreds of MB that this
#: region never ships, and reading them whole cost as much CPU as applying them.
_SHIPPED_KINDS = frozenset({fentry.KIND_DATA})


#: Per lane, an LSN of that lane's journal.
LaneLsns = dict[Lane, int]


@dataclass(frozen=True, slots=True)
class _Prepared:
    """An object built for ``seq`` from each lane's LSNs ``first[lane]..last[lane]``."""

    seq: int
    first: LaneLsns
    last: LaneLsns
    #: None when the ranges hold nothing to ship (mirror entries only).
    obj: bytes | None
    records: int
    journal_bytes: int
    #: Per drop-oldest lane, the first LSNs of the drops whose gaps the object carries.
    drops: dict[Lane, tuple[int, ...]] = field(default_factory=dict)
    gap_records: int = 0


@dataclass(frozen=True, slots=True)
class _Read:
    """The entries of the object for ``seq``: each lane's LSNs ``first[lane]..last[lane]``
    (an empty range ``first = last + 1`` for a lane it takes nothing from)."""

    seq: int
    first: LaneLsns
    last: LaneLsns
    #: The DATA entries of the ranges (empty: mirror entries only, nothing to ship).
    data: list[Entry]
    #: Gap markers: offsets drop-oldest lanes dropped in these ranges (docs/protocol.md).
    gaps: tuple[GapRange, ...] = ()
    #: Per drop-oldest lane, the first LSNs of the drops behind ``gaps``.
    drops: dict[Lane, tuple[int, ...]] = field(default_factory=dict)
    #: A chunk of a compressed segment, the object's last lane range: its blocks
    #: ship as stored (docs/at-rest.md, "The shipper: objects from stored blocks").
    chunk: StoredChunk | None = None

    @property
    def builds_object(self) -> bool:
        """Whether the ranges hold something to ship (else they are stepped over)."""
        return bool(self.data or self.gaps or (self.chunk is not None and self.chunk.blocks))


@dataclass(slots=True)
class _Building:
    """An object of a drain being built ahead of its commit."""

    read: _Read
    prepared: _Prepared | None = None
    done: trio.Event = field(default_factory=trio.Event)


def _gap_ranges(lane: Lane, drops: list[Drop]) -> list[GapRange]:
    """The gap markers of ``drops`` (records a drop-oldest lane dropped unshipped)."""
    return [
        GapRange(lane.id, r.topic, r.partition, r.first, r.last, r.records, r.bytes)
        for d in drops
        for r in d.ranges
    ]


def _lost_gap_ranges(lane: Lane, loss: Loss) -> list[GapRange]:
    """The gap markers of entries lost to damage and quarantined (``Journal.losses``)."""
    return [
        GapRange(lane.id, r.topic, r.partition, r.first, r.last, r.records, 0)
        for r in loss.ranges
        if r.records
    ]


def _merge_gaps(gaps: list[GapRange]) -> tuple[GapRange, ...]:
    """Sorted by (topic, partition, offset), adjacent ranges of a partition merged
    (consecutive dropped segments): the gap table's order (docs/log-object.md)."""
    out: list[GapRange] = []
    for g in sorted(gaps, key=lambda g: (g.topic, g.partition, g.first_offset)):
        prev = out[-1] if out else None
        if (
            prev is not None
            and (prev.topic, prev.partition, prev.lane) == (g.topic, g.partition, g.lane)
            and prev.last_offset + 1 == g.first_offset
        ):
            out[-1] = GapRange(
                g.lane,
                g.topic,
                g.partition,
                prev.first_offset,
                g.last_offset,
                prev.records + g.records,
                prev.bytes + g.bytes,
            )
        else:
            out.append(g)
    return tuple(out)


class Diverged(Fenced):
    """The journal and the region's log disagree: another writer continued the log while
    this journal holds unshipped data, or the journal lost entries the log holds."""


def _describe_failure(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class _Claim:
    """A fence this writer is creating, recorded before its PUT.

    Whose fence is at ``seq`` is known only from its bytes: two writers can
    try the same epoch at the same seq, and a writer's own fence may land
    with its answer lost. Until it is settled (:meth:`Shipper._settle_claim`)
    the claimed epoch is not known to be this writer's.
    """

    seq: int
    #: Digest of the fence's bytes (they carry a timestamp: unique per attempt).
    #: Not their CRC32C: an object ending in its own CRC has a constant one.
    digest: str
    #: The epoch this writer held before, if the fence turns out not to be its own.
    prior_epoch: int


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
    #: Ids of the lanes other than the normal one this writer shipped from
    #: (a lane journal of these found empty must be lined up by a claim first).
    lanes: tuple[int, ...] = ()
    #: A fence being created, not settled yet (``epoch`` is its epoch).
    claim: _Claim | None = None
    #: Per lane id, a journal LSN at or above every LSN handed to a create
    #: (written before the PUT, as the fence's claim is; the journal held it
    #: durably): the bucket holds no LSN of the lane above it. Read only;
    #: :meth:`Shipper._save_writer_state` always writes the shipper's current
    #: marks (``Shipper._sent``).
    sent: tuple[tuple[int, int], ...] = ()


#: The fields of a ``shipper.json`` written before it carried a checksum.
_STATE_KEYS = frozenset({"region", "epoch", "log_seq", "log_lsn", "lanes", "claim", "sent"})


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
    #: Before each manifest, write a *pack* of its small entries (verbatim
    #: copies in one object, ``format/pack.py``) of at most this many bytes,
    #: so a reader far behind fetches them with one GET instead of one per
    #: entry. 0 writes none. Costs one more PUT per manifest and uploads the
    #: packed entries' bytes a second time.
    pack_max_bytes: int = 4 * MiB
    #: Entries larger than this are never packed (a reader fetches them alone
    #: at no extra round trip per byte worth mentioning).
    pack_entry_max_bytes: int = 64 * 1024
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
        if not 0 <= self.pack_max_bytes <= MAX_BACKLOG_OBJECT_BYTES:
            raise ConfigError("shipper.pack_max_bytes must be within 0 (no packs)..1 GiB")
        if self.pack_entry_max_bytes < 1:
            raise ConfigError("shipper.pack_entry_max_bytes must be positive")


@dataclass(frozen=True, slots=True)
class LaneShipStats:
    """One lane's shipping state (``edgegw status``, the ``lane`` label of metrics)."""

    lane: str
    #: Every entry of the lane's journal up to this LSN is in the bucket.
    shipped_lsn: int
    next_lsn: int
    #: Entries and bytes of the lane's journal not shipped yet.
    backlog_entries: int
    backlog_bytes: int
    #: The link policy holds the lane back (:attr:`Shipper.may_ship`).
    held: bool = False


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
    #: is away), ``denied`` (the bucket refuses this gateway: see ``denied``)
    #: or ``failing`` (its runs end with an unexpected error, ``last_error``,
    #: and the supervisor restarts it: nothing ships until a person looks).
    state: str = "starting"
    #: The refusal in force, while ``state`` is ``denied``.
    denied: Denial | None = None
    #: Per lane, in drain order (one entry, ``normal``, without priorities).
    lanes: tuple[LaneShipStats, ...] = ()
    #: Corrupt or foreign objects set aside from where the next entry went.
    set_aside: int = 0
    #: Records named by gap markers committed (drop-oldest lanes, this run).
    gap_records: int = 0
    #: Unfinished multipart uploads of log objects aborted at claims (crash leftovers).
    uploads_aborted: int = 0
    #: Drains after which the C heap was trimmed (``edge_gateway.heap``).
    heap_trims: int = 0
    #: Packs of small entries written (``format/pack.py``), and their bytes.
    packs: int = 0
    pack_bytes: int = 0
    #: Runs in a row that ended with an unexpected error (``failing``).
    failures: int = 0


#: The states of :attr:`ShipperStats.state`.
SHIPPER_STATES = ("starting", "shipping", "retrying", "denied", "failing")

#: Bucket errors the shipper retries with backoff: an outage, or a refusal
#: that a person is expected to fix (credentials, policy, bucket).
_RETRIED = (BucketUnavailable, AccessDenied)
#: Times in a row a corrupt object is set aside from one seq before giving up
#: (something keeps planting it: an operator must look).
_SET_ASIDE_MAX = 3


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
        lanes: Lanes | None = None,
        key: WriteKeyLike | None = None,
    ) -> None:
        self.journal = journal
        #: The region's write key: every object with data is sealed with it (None: plaintext).
        self.key = key
        if lanes is not None and lanes.main is not journal:
            raise InvalidInput("the shipper's journal must be the lanes' normal lane")
        #: (lane, journal) in drain order; the normal lane alone without priorities.
        self._lanes: list[tuple[Lane, Journal]] = (
            lanes.in_drain_order() if lanes is not None else [(MAIN_LANE, journal)]
        )
        #: More than one lane: objects carry a lane table (log object version 2).
        self._multi = len(self._lanes) > 1
        #: Whether a lane of this priority may ship now; the one place a link
        #: policy holds a lane back (by default every lane always ships).
        #: Call :meth:`policy_changed` when its answer may have changed.
        self.may_ship: Callable[[Priority], bool] = lambda priority: True
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
        #: Per lane: the first journal LSN not shipped yet, and the last shipped.
        self._ship_from: LaneLsns = {lane: 1 for lane, _ in self._lanes}
        self._shipped: LaneLsns = {lane: 0 for lane, _ in self._lanes}
        self._gc_boundary = 0
        self._low_watermark = 1
        self._next_offsets: dict[tuple[str, int], int] = {}
        self._pending_manifest: list[ManifestEntry] = []
        #: The bytes of small entries this shipper created (seq order) that
        #: the next manifest's pack copies; at most ``pack_max_bytes`` of them.
        self._pack_bodies: list[tuple[int, bytes]] = []
        self._pack_held = 0
        #: The last seq the newest manifest in the bucket covers, if any (GC
        #: never deletes that entry: the log-still-there check HEADs it).
        self._last_manifest_seq: int | None = None
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
        self._idle_wait: trio.CancelScope | None = None
        #: The backoff between two attempts while the bucket is away or
        #: refuses (:meth:`ship_now` cuts it short).
        self._retry_wait: trio.CancelScope | None = None
        #: Attempts (claims, creates) the bucket failed or refused, ever: a
        #: waiter that must not wait through an outage (``edgegw sync``)
        #: compares it with the count it read before asking.
        self._failed_attempts = 0
        # counters
        self._objects = self._fences = self._manifests = self._records = 0
        self._packs = self._pack_bytes = 0
        self._uploads_aborted = 0
        self._set_aside_count = 0
        self._journal_bytes = self._wire_bytes = self._retries = 0
        #: Records named by the gap markers this shipper committed (drop-oldest lanes).
        self._gap_records = 0
        self._heap_trims = 0
        #: The buffers the journal reads a drain's entries into (one set per
        #: _ship_many: reused from object to object, let go of at its end).
        self._read_buffers: ReadBuffers | None = None
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
        #: Per lane id, an LSN at or above every one handed to a create: written
        #: to shipper.json before the create (:meth:`_write_ahead`), so that a
        #: journal found ending below it at the next start is known to have
        #: lost entries the bucket may hold (:meth:`_check_journal_tail`).
        self._sent: dict[int, int] = {}
        #: The writer state last written to shipper.json (its ``sent`` aside).
        self._saved: _WriterState | None = None
        #: Why produce must wait for this shipper's claim (None: it need not):
        #: the journal ends below what it had sent to the bucket.
        self.intake_hold: str | None = None
        #: Runs that ended with an unexpected exception since the shipper last
        #: caught up (its supervisor restarts it), and the last one's error.
        self._failures = 0
        self._failure: str | None = None
        #: Set by :meth:`reset`: the next claim resumes this process's epoch
        #: without a new fence when the log's head is still ours.
        self._resume = False

    # ------------------------------------------------------------- claim

    def _load_writer_state(self) -> _WriterState | None:
        try:
            data = self._state_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._damaged_state(f"unreadable: {exc}") from None
        try:
            doc = unseal(data, where=str(self._state_path), legacy_keys=_STATE_KEYS)
        except CorruptData as exc:
            raise self._damaged_state(exc.reason) from None
        if doc.get("region") != self.region:
            raise ConfigError(
                f"this journal belongs to region {doc.get('region')!r}, not {self.region!r}"
            )
        epoch = doc.get("epoch")
        if not isinstance(epoch, int):
            raise self._damaged_state("no epoch")
        # Written by older versions without them: nothing known, nothing checked.
        log_seq, log_lsn = doc.get("log_seq", 0), doc.get("log_lsn", 0)
        if not isinstance(log_seq, int) or not isinstance(log_lsn, int):
            raise self._damaged_state("a bad log_seq or log_lsn")
        lanes = doc.get("lanes", [])
        if not isinstance(lanes, list) or not all(isinstance(i, int) for i in lanes):
            raise self._damaged_state("bad lanes")
        claim = doc.get("claim")
        if claim is not None:
            try:
                claim = _Claim(int(claim["seq"]), str(claim["digest"]), int(claim["prior_epoch"]))
            except (TypeError, KeyError, ValueError):
                raise self._damaged_state("a bad claim") from None
        sent = doc.get("sent", {})
        try:
            sent_lsns = tuple((int(k), int(v)) for k, v in sent.items())
        except (AttributeError, TypeError, ValueError):
            raise self._damaged_state("bad sent LSNs") from None
        return _WriterState(epoch, log_seq, log_lsn, tuple(lanes), claim, sent_lsns)

    def _damaged_state(self, reason: str) -> CorruptData:
        """The error for a damaged ``shipper.json``: what is wrong and what to do.

        Refused, never rebuilt: the file is the only record of this writer's
        epoch and of what it sent (the bucket cannot tell this journal's
        epoch from another writer's), so a person decides (docs/operations.md,
        "A damaged disk").
        """
        return CorruptData(
            f"shipper state damaged ({reason}): restore {self._state_path.name} from a "
            "backup, or run `edgegw restore` (it discards records not shipped yet)",
            where=str(self._state_path),
        )

    def _save_writer_state(self, state: _WriterState) -> None:
        """Write shipper.json atomically; :class:`DiskFull` (tmp removed) if there is no room."""
        doc: dict[str, object] = {
            "region": self.region,
            "epoch": state.epoch,
            "log_seq": state.log_seq,
            "log_lsn": state.log_lsn,
        }
        if self._multi:
            doc["lanes"] = sorted(lane.id for lane, _ in self._lanes if not lane.is_main)
        if state.claim is not None:
            c = state.claim
            doc["claim"] = {"seq": c.seq, "digest": c.digest, "prior_epoch": c.prior_epoch}
        if self._sent:
            doc["sent"] = {str(lane_id): lsn for lane_id, lsn in sorted(self._sent.items())}
        data = seal(doc)
        try:
            replace_file(self._state_path, data)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise DiskFull(
                f"no room to write {self._state_path.name}: {exc.strerror or exc}"
            ) from None
        self._saved = dataclasses.replace(state, sent=())

    async def _probe_and_read(self) -> LogState | Exception:
        """The conditional-create probe, and meanwhile the first read of the log.

        Both are round trips in a row (the probe ~4, the read a LIST, a few
        GETs and rounds of HEADs) and the read changes nothing, so they
        overlap: a claim, on every start, waits for the longer of the two
        instead of both. The probe's error is raised as it was before the
        read (``BucketGone`` as :class:`BucketLost`); the read's outcome,
        its state or its error, is returned for :meth:`claim` to handle.
        """
        box: list[LogState | Exception] = []
        probe_error: Exception | None = None

        async def read() -> None:
            try:
                box.append(await load_log_state(self.bucket, self.prefix, self.region))
            except Exception as exc:  # noqa: BLE001 - handled by claim(), in its order
                box.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            try:
                # Under the region's own keys: all a confined region may write.
                await verify_conditional_create(
                    self.bucket, region_prefix(self.prefix, self.region)
                )
            except Exception as exc:  # noqa: BLE001 - raised below, outside the nursery
                probe_error = exc
                nursery.cancel_scope.cancel()
        if probe_error is not None:
            if isinstance(probe_error, BucketGone):
                raise self._lost(str(probe_error)) from None
            raise probe_error
        return box[0]

    async def claim(self) -> None:
        """Verify the bucket, find the log head, reconcile with the journal, claim an epoch.

        Raises :class:`Fenced`/:class:`Diverged` when this gateway must not
        write, :class:`~edge_gateway.errors.BucketLost` when the log is below
        what this journal knows it committed (unless :attr:`reship` and the
        journal can re-create it), ``UnsupportedStore`` for a bucket without
        conditional creates, ``BucketUnavailable`` when the bucket is away
        (retry later).
        """
        first_read: LogState | Exception | None = await self._probe_and_read()
        state: LogState | None = None
        set_aside = 0
        fence: bytes | None = None
        while True:
            written = self._load_writer_state()
            self._merge_sent(written)
            try:
                if first_read is not None:
                    got, first_read = first_read, None
                    if isinstance(got, Exception):
                        raise got
                    state = got
                elif state is None:
                    state = await load_log_state(self.bucket, self.prefix, self.region)
                else:  # lost a race to a live writer: straight to its head, read the rest after
                    state = await skip_to_head(self.bucket, self.prefix, self.region, state)
            except NotFound as exc:
                # A manifest or GC boundary names an entry that is not there.
                raise self._lost(f"an entry it still refers to is gone ({exc})") from None
            except UnsupportedFormat:
                raise
            except CorruptData as exc:
                if set_aside >= _SET_ASIDE_MAX or not await self._corrupt_head(exc):
                    raise
                set_aside += 1
                state = None  # read the log again, without it
                continue
            written = await self._settle_claim(written)
            known = self._reconcile(state, written)
            if self.recreated_from_lsn is not None:
                await self._drop_stale(state, written.epoch if written else 0)
            if self._resumable(state, written):
                # A restart of this process's shipper (``reset``): nobody
                # wrote since our last entry, so the epoch is still ours and
                # the log continues after its head without a fence. A task
                # that fails again and again claims no epoch per restart.
                epoch, seq = self._epoch, state.head
                break
            epoch = max(state.head_epoch, state.max_epoch, written.epoch if written else 0) + 1
            seq = state.head + 1
            fence = logobject.encode_fence(
                self.region, epoch, seq, self._shipped_lsn, self._clock(), self._lane_watermarks()
            )
            # Write-ahead: remember the fence we are about to create, so a
            # crash or a lost answer after it lands still recognises it (by its
            # bytes) as ours -- and a fence of the same epoch by another writer
            # that won the race is not mistaken for ours.
            claim = _Claim(seq, _digest(fence), written.epoch if written else 0)
            await trio.to_thread.run_sync(
                self._save_writer_state,
                _WriterState(epoch, known.log_seq, known.log_lsn, claim=claim),
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
        # Lined up with the log: it holds each lane's entries up to the
        # shipped LSN and none above (any sent before and not there never
        # landed; the journal may hand out those LSNs again).
        self._sent = {lane.id: self._shipped[lane] for lane, _ in self._lanes}
        await trio.to_thread.run_sync(
            self._save_writer_state, _WriterState(epoch, seq, self._shipped_lsn)
        )
        self._epoch = epoch
        self._next_seq = seq + 1
        self._gc_boundary = state.gc_boundary
        self._low_watermark = state.gc_boundary + 1
        self._next_offsets = dict(state.next_offsets)
        self._pending_manifest = [ManifestEntry.from_header(h, size) for h, size in state.tail]
        if fence is not None:
            fence_header = logobject.decode_header(fence, where="fence")
            self._pending_manifest.append(ManifestEntry.from_header(fence_header, len(fence)))
        self._schedule.first_seq = (
            (state.manifest.last_seq + 1) if state.manifest else self._low_watermark
        )
        self._last_manifest_seq = state.manifest.last_seq if state.manifest else None
        self._schedule.committed(len(self._pending_manifest))
        self._fences += fence is not None
        self._resume = False
        for lane, j in self._lanes:
            if lane.drops:
                # Entries dropped while an object holding them was being
                # committed, which never committed (the process died): the
                # log resumes at or before them, so they are gaps after all.
                j.release_held(self._ship_from[lane])
        self._claimed = True
        self._claimed_event.set()
        self._accepted()
        self._last_commit_mono = time.monotonic()
        self.intake_hold = None
        if fence is None:
            log.info(
                "shipper: region %s resumed epoch %d after seq %d (no new fence; journal "
                "shipped through LSN %s)",
                self.region,
                epoch,
                seq,
                self._describe_shipped(),
            )
        else:
            log.info(
                "shipper: region %s claimed epoch %d at seq %d (journal shipped through LSN %s)",
                self.region,
                epoch,
                seq,
                self._describe_shipped(),
            )
            self._notify_commit(seq)
        await self._mark_bucket()
        await self._abort_incomplete_uploads()

    async def _abort_incomplete_uploads(self) -> None:
        """Abort the multipart uploads of log objects that earlier writers left unfinished.

        A crash (or a lost abort) between a large object's parts and its
        completion leaves an upload behind that no read sees but the store
        keeps (and AWS bills). This writer holds the newest epoch now, so an
        unfinished upload under its log is a fenced writer's: aborting it
        removes no object, and a zombie still sending it only has its
        completion fail and then finds itself fenced. Best effort: without
        the permission (``s3:ListBucketMultipartUploads``) or during an outage
        it is left to the bucket's lifecycle rule (docs/bucket.md).
        """
        try:
            aborted = await self.bucket.abort_incomplete_uploads(
                log_prefix(self.prefix, self.region)
            )
        except _RETRIED as exc:
            log.warning(
                "shipper: could not look for unfinished multipart uploads under the log (%s); "
                "a lifecycle rule that aborts incomplete uploads cleans them",
                exc,
            )
            return
        if aborted:
            self._uploads_aborted += aborted
            log.warning(
                "shipper: aborted %d unfinished multipart upload(s) of log objects "
                "(a crash or a fenced writer left them)",
                aborted,
            )

    async def _corrupt_head(self, exc: CorruptData) -> bool:
        """Set aside a corrupt entry found while loading the log, if it is the head.

        The head is where this writer's next entry went: set aside, the log
        ends before it and the claim takes that seq. A corrupt entry below
        the head is in the middle of the log, followed by valid ones: it is
        left for the operator (False: the claim fails with the error).
        """
        try:
            region, seq = parse_log_key(exc.where or "", self.prefix)
        except CorruptData:
            return False
        if region != self.region or await exists(
            self.bucket, log_key(self.prefix, self.region, seq + 1)
        ):
            return False
        await self._set_aside(exc.where or "", exc)
        return True

    async def _set_aside(self, key: str, exc: CorruptData) -> None:
        """Move a corrupt or foreign object out of the seq this writer's next entry goes to.

        Nobody applied it (readers check an entry whole before applying any
        of it) and only this region's writer creates its entries, so the
        entry created there instead is the first valid one at that seq. A
        note with the evidence stays under ``quarantine/`` (docs/protocol.md).
        """
        _, seq = parse_log_key(key, self.prefix)
        note = await set_aside(self.bucket, self.prefix, self.region, seq, exc, self._clock())
        self._set_aside_count += 1
        log.error(
            "shipper: %s where this gateway's next entry goes was not a valid entry of "
            "region %s (%s); set it aside (note: %s) and created the entry there",
            key,
            self.region,
            exc.reason,
            note or "none, it was gone",
        )

    def _merge_sent(self, written: _WriterState | None) -> None:
        """Take the sent LSNs shipper.json remembers (the higher of them and ours)."""
        if written is None:
            return
        for lane_id, lsn in written.sent:
            if lsn > self._sent.get(lane_id, 0):
                self._sent[lane_id] = lsn

    def _resumable(self, state: LogState, written: _WriterState | None) -> bool:
        """Whether a claim after :meth:`reset` may go on with this process's epoch.

        Only this process's own epoch, and only while the log's newest
        entries are all of it: a fence of any other writer would be the head
        or below a head of a higher epoch.
        """
        return (
            self._resume
            and self._epoch > 0
            and written is not None
            and written.epoch == self._epoch
            and state.head_epoch == self._epoch
            and state.max_epoch <= self._epoch
            and self.recreated_from_lsn is None
            and not state.skipped
        )

    def _check_journal_tail(self, written: _WriterState | None) -> str | None:
        """Compare each journal's end with what this writer shipped from it, before any append.

        A journal that ends below an LSN the bucket confirmed (``log_lsn``)
        lost entries the bucket holds -- a segment moved aside or lost, an old
        copy restored: appending would hand out LSNs and offsets the bucket
        holds already, so this raises :class:`Diverged` (``edgegw restore``).
        One that ends below an LSN it sent (written before each create) may
        have: the returned reason says why produce waits for the claim, which
        compares the journal with the log's head. None: nothing is missing.
        """
        if written is None:
            return None
        holds: list[str] = []
        for lane, j in self._lanes:
            last = j.next_lsn - 1
            confirmed = written.log_lsn if lane.is_main else 0
            sent = max(confirmed, self._sent.get(lane.id, 0))
            if last >= sent:
                continue
            name = "journal" if lane.is_main else f"lane {lane}'s journal"
            if j.is_new:
                # An empty (new or wiped) journal: the claim continues it
                # after the log's head (offsets from the log), before intake.
                holds.append(f"the {name} is empty but had sent LSNs up to {sent}")
            elif last < confirmed:
                raise Diverged(
                    f"region {self.region}: the {name} ends at LSN {last}, but the bucket "
                    f"confirmed it through LSN {confirmed} ({self._state_path}): the journal "
                    "lost entries the bucket holds (a segment moved aside, deleted or restored "
                    "from an older copy). Appending would hand out LSNs and offsets the bucket "
                    "holds already, so this gateway does not start. Run `edgegw restore` to "
                    "continue from the bucket (its records stay there; unshipped ones in the "
                    "moved segments are not recovered)."
                )
            else:
                holds.append(
                    f"the {name} ends at LSN {last} but sent LSNs up to {sent} to the bucket"
                )
        if not holds:
            return None
        return "; ".join(holds)

    async def _write_ahead(self, last: LaneLsns) -> None:
        """Record in shipper.json, before a create, the LSNs it may take to the bucket.

        The mark is each lane's durable end, not just the object's last LSN
        (shipped entries are durable, so it is at least that, and never past
        what the journal holds): a backlog drain writes it once, not once per
        object; at a steady pace, it is one small atomic write per flush
        (~6 ms here, off the produce path). Without room to write it the
        create goes ahead (shipping frees the journal's space) and the claim
        at the next start is the check.
        """
        if all(lsn <= self._sent.get(lane.id, 0) for lane, lsn in last.items()):
            return
        for lane, j in self._lanes:
            mark = max(last[lane], j.durable_lsn)
            if mark > self._sent.get(lane.id, 0):
                self._sent[lane.id] = mark
        state = self._saved or _WriterState(self._epoch)
        try:
            await trio.to_thread.run_sync(self._save_writer_state, state)
        except DiskFull as exc:
            log.warning(
                "shipper: %s; shipping without the record of the LSNs sent (the next claim "
                "checks the journal against the log)",
                exc,
            )

    async def _settle_claim(self, written: _WriterState | None) -> _WriterState | None:
        """Resolve a fence left unsettled by a lost race, a lost answer or a crash.

        The fence at the claim's seq is ours if its bytes are the ones we
        wrote; then its epoch is ours. Otherwise (another writer's fence, or
        none: it never landed) the epoch we held before is. A fence missing
        below the head cannot be told apart and counts as not ours: a journal
        with unshipped data then stops with :class:`Diverged` instead of
        taking another writer's head as its own.
        """
        if written is None or written.claim is None:
            return written
        c = written.claim
        try:
            got = await self.bucket.get(log_key(self.prefix, self.region, c.seq))
            ours = _digest(got.data) == c.digest
        except NotFound:
            ours = False
        if ours:
            settled = dataclasses.replace(written, claim=None)
        else:
            settled = dataclasses.replace(written, epoch=c.prior_epoch, claim=None)
            log.info(
                "shipper: the fence this gateway tried at seq %d (epoch %d) is not its own; "
                "it holds epoch %d",
                c.seq,
                written.epoch,
                c.prior_epoch,
            )
        await trio.to_thread.run_sync(self._save_writer_state, settled)
        return settled

    async def _mark_bucket(self) -> None:
        """Make the bucket recognisable as edgegw's (``edgegw restore``/``sync`` check it)."""
        try:
            if await mark_bucket(self.bucket, self.prefix, self.region, self._clock()):
                log.info("shipper: marked %s as an edgegw bucket", self.bucket.name)
        except AccessDenied:
            # A region's policy does not grant the marker (docs/security.md):
            # it is the admin's to write, once per fleet. Only a hint for the
            # CLI, which recognises the bucket by this region's log meanwhile.
            log.warning(
                "shipper: the fleet marker of %s is missing and this region may not write it: "
                "the admin writes it once (edgegw bucket mark); commands recognise the bucket "
                "by its region logs meanwhile",
                self.bucket.name,
            )
        except BucketUnavailable as exc:
            # The next claim writes it.
            log.warning("shipper: could not write the bucket marker (%s)", exc)

    def ship_now(self) -> None:
        """Ship what is pending at once instead of at the flush deadline (``edgegw sync``).

        A shipper waiting to retry (the bucket was away) tries again at once:
        the link may just have come up, which is when ``edgegw sync`` runs.
        """
        self._ship_now = True
        if self._flush_wait is not None:
            self._flush_wait.cancel()
        if self._retry_wait is not None:
            self._retry_wait.cancel()

    def reset(self) -> None:
        """Forget the claim, so that :meth:`run` claims again (the supervisor's restart).

        A run that failed unexpectedly may have stopped between an upload and
        its bookkeeping; claiming again reconciles with the log head exactly
        as a restart of the process does (a lost response is recognised as
        ours). While the log's head is still of this process's epoch, the
        claim resumes it without a fence (:meth:`_resumable`): a task that
        fails again and again costs no epoch per restart.
        """
        self._claimed = False
        self._resume = True

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
        created entries (and maybe a manifest and a pack) at seqs far above the new
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
        for info in await self.bucket.list(pack_prefix(self.prefix, self.region)):
            try:
                _, _, last_seq = parse_pack_key(info.key, self.prefix)
            except CorruptData:
                continue
            if last_seq > state.head:  # copies of entries that go now
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
            self._ship_from[MAIN_LANE] = j.next_lsn
            self._shipped[MAIN_LANE] = j.next_lsn - 1
            self._line_up_lanes(state, head_is_ours)
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
                f"journal ends at {journal_last}: the journal lost entries the bucket holds (a "
                "segment moved aside, deleted or restored from an older copy). Appending would "
                "hand out LSNs and offsets the bucket holds already. Run `edgegw restore` to "
                "continue from the bucket."
            )
        # (A journal that starts after head_lsn + 1 was refused as a lost
        # bucket above: its segments are deleted only once shipped.)
        self._ship_from[MAIN_LANE] = head_lsn + 1
        self._shipped[MAIN_LANE] = head_lsn
        j.set_safe_lsn(head_lsn + 1)
        self._line_up_lanes(state, head_is_ours)

    def _lost_lane_journals(self, written: _WriterState) -> list[Lane]:
        """Lanes this writer shipped from whose journal is empty now (a lost directory):
        their partitions' next offsets must come from the log before any append."""
        return [
            lane
            for lane, j in self._lanes
            if not lane.is_main and lane.id in written.lanes and j.is_new
        ]

    def _line_up_lanes(self, state: LogState, head_is_ours: bool) -> None:
        """The other lanes' watermarks from the head's lane table (docs/protocol.md,
        "Reconciliation"); a head without one (version 1) shipped nothing of them."""
        header = state.head_header
        table = {r.lane: r.last_lsn for r in header.lanes} if header is not None else {}
        for lane, j in self._lanes:
            if lane.is_main:
                continue
            head_lsn = table.get(lane.id, 0) if head_is_ours else 0
            last = j.next_lsn - 1
            if j.is_new and head_lsn > last:
                # A new or wiped journal continues the lane's LSNs, and every
                # partition's offsets from the log (the lane's partitions are
                # among them; for the others another lane holds more, and the
                # partition stays there: Lanes picks the highest).
                j.reset_empty(Checkpoint(dict(state.next_offsets), {}), head_lsn + 1)
                last = head_lsn
            elif head_lsn > last:
                raise Diverged(
                    f"region {self.region}'s log covers lane {lane}'s journal LSNs up to "
                    f"{head_lsn} but that journal ends at {last}: it lost data. Run "
                    "`edgegw restore`."
                )
            elif (
                not j.is_new
                and head_lsn + 1 < j.statistics().first_lsn
                # (a drop-oldest lane deleted them unshipped and recorded it)
                and not j.drops_cover(head_lsn + 1, j.statistics().first_lsn)
            ):
                raise self._lost(
                    f"it covers lane {lane}'s journal LSNs up to {head_lsn}, but that journal "
                    f"deleted LSNs up to {j.statistics().first_lsn - 1} after the bucket had "
                    "confirmed them"
                )
            self._ship_from[lane] = head_lsn + 1
            self._shipped[lane] = head_lsn
            j.set_safe_lsn(head_lsn + 1)

    # ------------------------------------------------------------- ship

    @property
    def _shipped_lsn(self) -> int:
        return self._shipped[MAIN_LANE]

    @property
    def shipped_lsn(self) -> int:
        """Every entry of the normal lane's journal up to this LSN is committed to the
        bucket (or needs no shipping)."""
        return self._shipped_lsn

    def shipped_lsns(self) -> dict[Lane, int]:
        """:attr:`shipped_lsn` of every lane."""
        return dict(self._shipped)

    def _lane_watermarks(self) -> dict[int, int] | None:
        """Lane id -> shipped LSN of the lanes other than the normal one (None: one lane)."""
        if not self._multi:
            return None
        return {lane.id: self._shipped[lane] for lane, _ in self._lanes if not lane.is_main}

    def _describe_shipped(self) -> str:
        if not self._multi:
            return str(self._shipped_lsn)
        return ", ".join(f"{lane} {self._shipped[lane]}" for lane, _ in self._lanes)

    async def wait_shipped(self, lsn: int, lane: Lane = MAIN_LANE) -> None:
        """Wait until entry ``lsn`` of ``lane``'s journal is committed to the bucket."""
        while self._shipped[lane] < lsn:
            await self._shipped_lot.park()

    @property
    def failed_attempts(self) -> int:
        """How many claims and creates the bucket failed (away) or refused so far."""
        return self._failed_attempts

    async def wait_shipped_or_failed(self, lsn: int, failures: int, lane: Lane = MAIN_LANE) -> bool:
        """Wait until entry ``lsn`` of ``lane`` is committed (True), or until an
        attempt fails after :attr:`failed_attempts` was ``failures`` (False).

        For a waiter that must not wait through an outage (``edgegw sync``):
        the shipper itself goes on retrying; :attr:`statistics` ``last_error``
        and :attr:`denied` say why it failed.
        """
        while self._shipped[lane] < lsn:
            if self._failed_attempts > failures:
                return False
            await self._shipped_lot.park()
        return True

    async def wait_failed_attempt(self, failures: int) -> None:
        """Wait until an attempt fails after :attr:`failed_attempts` was ``failures``."""
        while self._failed_attempts <= failures:
            await self._shipped_lot.park()

    def cannot_ship(self) -> Unavailable:
        """Why the last attempt failed, as the error ``edgegw sync`` ends with: the
        bucket refuses this shipper (:class:`Denied`), or is away."""
        denied = self._denial.current
        if denied is not None:
            return Denied(
                f"cannot ship: the bucket refuses this gateway ({denied.code}): {denied.error}",
                code=denied.code,
                action=denied.action,
            )
        return Unavailable(
            f"cannot ship now: the bucket is unreachable "
            f"({self._last_error or 'it did not answer'}); nothing is lost: the records stay "
            "in the journal and ship when the bucket answers again (run sync again then)"
        )

    def _attempt_failed(self) -> None:
        self._failed_attempts += 1
        self._shipped_lot.unpark_all()

    async def wait_claimed(self) -> None:
        """Wait until this shipper owns the region's log (see :meth:`run`)."""
        await self._claimed_event.wait()

    def shipped_offsets(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition), the next offset not yet committed to the bucket."""
        return dict(self._next_offsets)

    def pending(self) -> bool:
        """Whether entries wait to ship in a lane that may ship now."""
        return any(j.next_lsn > self._ship_from[lane] for lane, j in self._lanes if self._may(lane))

    def _may(self, lane: Lane) -> bool:
        return self.may_ship(lane.priority)

    def _may_publish(self, prepared: _Prepared) -> bool:
        """Whether every lane with entries in ``prepared`` may still ship (asked before the PUT)."""
        if prepared.obj is None:
            return True  # nothing goes on the link
        return all(
            self._may(lane)
            for lane, _ in self._lanes
            if prepared.last.get(lane, 0) >= prepared.first.get(lane, 1)
        )

    def policy_changed(self) -> None:
        """:attr:`may_ship` may answer differently now: look at the lanes again."""
        if self._idle_wait is not None:
            self._idle_wait.cancel()

    async def ship_once(self) -> bool:
        """Ship up to ``max_object_bytes`` of durable entries as one object. False if none."""
        if not self._claimed:
            raise InvalidInput("claim() first")
        while True:
            read = await self._read(
                dict(self._ship_from), self._next_seq, self.config.max_object_bytes
            )
            if read is None:
                return False
            prepared = await self._build(read)
            if not self._stale(prepared):
                break
        await self._publish(prepared)
        return True

    async def _ship_many(
        self,
        *,
        until: LaneLsns | None = None,
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
        ones until every lane that may ship has read through its LSN in ``until``,
        while ``next_due`` accepts their entries, each up to
        ``backlog_object_bytes``. Returns the number of objects shipped.

        With lanes, an object whose upload had to be retried (the link went
        down under it) is committed as built -- its outcome was unknown --
        but the objects built ahead of it are dropped and read again once it
        is in: they were read before the outage, and the lanes' backlogs that
        piled up meanwhile must ship in drain order (critical first). So after
        an outage at most that one object precedes the critical backlog.
        """
        if not self._claimed:
            raise InvalidInput("claim() first")
        shipped = 0
        buffers = self._read_buffers = ReadBuffers()
        try:
            while True:
                first = await self._read(
                    dict(self._ship_from), self._next_seq, self.config.max_object_bytes
                )
                if first is None:
                    return shipped
                n, again = await self._ship_round(first, until, next_due, progress)
                shipped += n
                if not again:
                    return shipped
                if until is not None and all(
                    self._shipped[lane] >= until[lane] for lane, _ in self._lanes if self._may(lane)
                ):
                    return shipped
        finally:
            if self._read_buffers is buffers:
                self._read_buffers = None
            if shipped >= TRIM_AFTER_OBJECTS:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(heap.trim)
                self._heap_trims += 1

    async def _ship_round(
        self,
        first: _Read,
        until: LaneLsns | None,
        next_due: Callable[[list[Entry]], bool] | None,
        progress: Callable[[int, int], None] | None,
    ) -> tuple[int, bool]:
        """One run of :meth:`_ship_many` from ``first``: (objects shipped, whether to read
        again because an upload was retried and what was built ahead is stale)."""
        cfg = self.config
        # Memory of a drain: at most _BUILD_THREADS objects are being read or
        # built (their entries in memory), and at most one more is read and
        # not yet committed (built objects waiting to upload hold only their
        # compressed bytes: ``build`` drops the entries).
        building = trio.Semaphore(_BUILD_THREADS)
        in_memory = trio.Semaphore(_BUILD_THREADS + 1)
        building.acquire_nowait()  # for ``first``
        in_memory.acquire_nowait()
        send, receive = trio.open_memory_channel[_Building](math.inf)
        backlog_limit = max(cfg.max_object_bytes, cfg.backlog_object_bytes)

        async def build(slot: _Building) -> None:
            try:
                slot.prepared = await self._build(slot.read)
                # Built: the object holds what it needs (compressed). Let go
                # of the entries now rather than at the commit, or every built
                # object waiting for the link would keep its entries too (in
                # place: the caller's first read refers to the same list).
                # read_ahead took what it needs of ``data`` before yielding.
                slot.read.data.clear()
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
                    if until is not None and all(
                        read.last[lane] >= until[lane] for lane, _ in self._lanes if self._may(lane)
                    ):
                        return
                    seq = read.seq + (1 if read.builds_object else 0)
                    after = {lane: last + 1 for lane, last in read.last.items()}
                    read = None  # (the slot holds it; its entries go once built)
                    await in_memory.acquire()
                    await building.acquire()
                    read = await self._read(after, seq, backlog_limit, due=next_due)
                    if read is None:
                        building.release()
                        in_memory.release()

        shipped = 0
        again = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_ahead, nursery)
                async for slot in receive:
                    await slot.done.wait()
                    assert slot.prepared is not None
                    if not self._may_publish(slot.prepared) or self._stale(slot.prepared):
                        # The link policy closed for a lane in it while it was
                        # built (an allowance ran out meanwhile): drop it and
                        # what was built after it; read again once it opens.
                        nursery.cancel_scope.cancel()
                        break
                    retries = self._retries
                    await self._publish(slot.prepared)
                    slot.prepared = None
                    in_memory.release()
                    shipped += 1
                    if progress is not None:
                        done = sum(self._shipped.values())
                        progress(done, sum(until.values()) if until else done)
                    if self._multi and self._retries != retries:
                        # Retried: what was built ahead predates the outage
                        # (see _ship_many); read it again in drain order.
                        again = True
                        nursery.cancel_scope.cancel()
                        break
        except BaseExceptionGroup as group:
            # Surface the commit's own error (Fenced, ...), not a group of one.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        return shipped, again

    async def _read(
        self,
        first: LaneLsns,
        seq: int,
        limit: int,
        *,
        due: Callable[[list[Entry]], bool] | None = None,
    ) -> _Read | None:
        """The durable entries of the object for ``seq`` from each lane's LSN in ``first``;
        None: nothing (due) to ship.

        The object holds up to ``max_object_bytes`` of entries; when that much
        is there and more is pending, it grows up to ``limit`` (a backlog).
        Lanes fill it in drain order: a lane's entries come in only when every
        lane before it had less than the object's room pending, and a lane
        that :attr:`may_ship` holds back is skipped.

        A lane whose position is the first LSN of a chunk of a compressed
        segment (docs/at-rest.md) takes that whole chunk, as stored blocks,
        and the object ends with it: one object per chunk, built without
        compressing anything. Entry reads stop before a compressed segment
        (so that the next object starts at its first chunk), and a position
        inside a chunk (part of it shipped before the segment was rewritten)
        reads the rest of that chunk only, rebuilt from its frames, once.
        """
        entries: list[Entry] = []
        last = {lane: lsn - 1 for lane, lsn in first.items()}
        room = limit
        gaps: list[GapRange] = []
        drops: dict[Lane, tuple[int, ...]] = {}
        chunk: StoredChunk | None = None
        for lane, j in self._lanes:
            if room <= 0:
                break
            if not self._may(lane):
                continue
            if j.durable_lsn < j.next_lsn - 1:
                await j.wait_durable(j.next_lsn - 1)
            durable = j.durable_lsn
            # A lane with drops pending at its position reads entries as ever:
            # its gap markers are worked out from what it reads.
            span = None if lane.drops and j.drops_from(first[lane]) else j.chunk_span(first[lane])
            # Entries lost to damage (journal/_quarantine.py): an object never holds
            # data from both sides of a loss (a partition's offsets in an object are
            # contiguous); the one that starts at the loss carries it as gap markers.
            losses = j.losses_from(first[lane])
            at_loss = losses[0] if losses and losses[0].lsn_first <= first[lane] else None
            ahead = [x for x in losses if x is not at_loss]
            stop = ahead[0].lsn_first - 1 if ahead else None
            if (
                span is not None
                and span.first_lsn == first[lane]
                and at_loss is None
                and (stop is None or stop >= span.last_lsn)
            ):
                chunk = await j.read_chunk_in_thread(first[lane])
                last[lane] = chunk.last_lsn
                break
            if span is not None:
                through: int | None = span.last_lsn
            else:
                at = j.compressed_from(first[lane])
                through = None if at is None else at - 1
            if stop is not None:
                through = stop if through is None else min(through, stop)
            if at_loss is not None:
                last[lane] = max(last[lane], min(at_loss.lsn_last, durable))
                gaps += _lost_gap_ranges(lane, at_loss)
            got = await self._read_entries(
                j, first[lane], room, drops=lane.drops, through_lsn=through
            )
            if got:
                last[lane] = got[-1].lsn
                room -= sum(e.length for e in got)
                entries += got
            elif durable >= first[lane] and j.only_checkpoints(first[lane], durable):
                # Only checkpoints (reads skip them: a fresh journal's first
                # entry is one): nothing to ship, but the lane is past them.
                last[lane] = durable
            if lane.drops:
                # What the lane dropped from this object's first LSN on: before
                # the entries read (their LSNs are after every dropped one).
                dropped = j.drops_from(first[lane], got[-1].lsn if got else None)
                if dropped:
                    last[lane] = max(last[lane], dropped[-1].lsn_last)
                    gaps += _gap_ranges(lane, dropped)
                    drops[lane] = tuple(d.lsn_first for d in dropped)
        # Entries, gaps, chunks and checkpoint-only ranges each move a lane's
        # ``last`` past ``first``. A chunk is sealed data: always due.
        passed = any(last[lane] >= lsn for lane, lsn in first.items())
        if not passed or (chunk is None and due is not None and not due(entries)):
            return None
        data = [e for e in entries if e.kind == fentry.KIND_DATA]
        return _Read(seq, dict(first), last, data, _merge_gaps(gaps), drops, chunk)

    async def _read_entries(
        self,
        j: Journal,
        first_lsn: int,
        limit: int,
        *,
        drops: bool = False,
        through_lsn: int | None = None,
    ) -> list[Entry]:
        """Up to ``limit`` bytes of durable entries from ``first_lsn``, in LSN order.

        Read and checked in a worker thread (:meth:`Journal.read_entries_in_thread`):
        a backlog object's entries cost milliseconds of CPU (the read and a
        CRC32C of every entry) that must not stall the event loop (local
        produce and consume share it), and in a thread they run on the second
        core beside the previous object's compression. Within a drain the
        runs are read into the same few buffers (:class:`ReadBuffers`): fresh
        memory costs a page fault per 4 KiB. A
        drop-oldest lane (``drops``) may drop entries while they are read:
        then they are read again, so that no object ships records its gap
        markers also report dropped. ``through_lsn``: none after it.
        """
        while True:
            before = j.drops_from(first_lsn) if drops else None
            entries = await j.read_entries_in_thread(
                first_lsn,
                max_bytes=limit,
                payload_kinds=_SHIPPED_KINDS,
                buffers=self._read_buffers,
                through_lsn=through_lsn,
            )
            if before is None or j.drops_from(first_lsn) == before:
                return entries

    async def _build(self, read: _Read) -> _Prepared:
        """Build the object of ``read`` (compression in a worker thread).

        A chunk's blocks go in as stored (``add_stored``): compressed at rest
        with the block encoding the builder uses, and sealed (``[encryption]``)
        by the builder like the blocks it compresses, since a seal binds the
        block to the object's seq and epoch.
        """
        if not read.builds_object:
            return _Prepared(read.seq, read.first, read.last, None, 0, 0)
        builder = LogObjectBuilder()
        # One call per partition, not per entry: a backlog of one-record
        # entries is ~16,000 entries an object, and the per-call checks were
        # a third of a drain's event-loop time (bench/offline.py).
        by_partition: dict[tuple[str, int], list[bytes | memoryview]] = {}
        for e in read.data:
            batches = by_partition.get((e.topic, e.partition))
            if batches is None:
                by_partition[(e.topic, e.partition)] = [e.payload]
            else:
                batches.append(e.payload)
        for (topic, partition), batches in by_partition.items():
            builder.add(topic, partition, batches)
        chunk_records = chunk_bytes = 0
        if read.chunk is not None:
            for topic, partition, block in read.chunk.blocks:
                builder.add_stored(topic, partition, block)
            chunk_records, chunk_bytes = read.chunk.records, read.chunk.data_bytes
        epoch, created, level = self._epoch, self._clock(), self.config.compression_level
        lanes = self._lane_table(read.first, read.last)
        key = self.key
        obj = await trio.to_thread.run_sync(
            lambda: builder.build(
                region=self.region,
                epoch=epoch,
                seq=read.seq,
                first_lsn=read.first[MAIN_LANE],
                last_lsn=read.last[MAIN_LANE],
                created_ms=created,
                level=level,
                lanes=lanes,
                key=key,
                gaps=read.gaps,
            )
        )
        return _Prepared(
            read.seq,
            read.first,
            read.last,
            obj,
            sum(e.count for e in read.data) + chunk_records,
            sum(e.length for e in read.data) + chunk_bytes,
            read.drops,
            sum(g.records for g in read.gaps),
        )

    def _lane_table(self, first: LaneLsns, last: LaneLsns) -> tuple[LaneRange, ...]:
        """The lane table of an object (empty with one lane: a version 1 object)."""
        if not self._multi:
            return ()
        return tuple(
            LaneRange(lane.id, first[lane], last[lane])
            for lane in sorted((lane for lane, _ in self._lanes), key=lambda lane: lane.id)
            if not lane.is_main
        )

    def _stale(self, p: _Prepared) -> bool:
        """Whether a drop-oldest lane dropped entries of ``p``'s ranges after they were
        read: then ``p`` would ship records also reported dropped, or miss a gap;
        it is read and built again."""
        for lane, j in self._lanes:
            if not lane.drops or p.last[lane] < p.first[lane]:
                continue
            now = tuple(d.lsn_first for d in j.drops_from(p.first[lane], p.last[lane]))
            if now != p.drops.get(lane, ()):
                return True
        return False

    async def _publish(self, p: _Prepared) -> None:
        """Commit a prepared object (if it holds data) and move the shipped watermarks past it."""
        assert p.first == self._ship_from, "objects must be published in LSN order"
        if p.obj is not None:
            assert p.seq == self._next_seq, "objects must be published in seq order"
            for lane, j in self._lanes:
                if lane.drops:
                    # From now on a drop of these entries is marked held: they
                    # reach the bucket with this object.
                    j.take(p.last[lane] + 1)
            await self._commit(p.obj, p.seq, p.first, p.last)
            self._records += p.records
            self._journal_bytes += p.journal_bytes
            self._gap_records += p.gap_records
        # The commit is done: advance the watermark BEFORE anything else can
        # wait (the manifest PUT below). A cancellation there (shutdown) must
        # not leave a committed object looking unshipped, or the next drain
        # would ship the same LSNs again under a new seq.
        self._advance(p.last)
        if p.obj is not None:
            await self._maybe_write_manifest()

    def _advance(self, last: LaneLsns) -> None:
        for lane, j in self._lanes:
            self._ship_from[lane] = last[lane] + 1
            self._shipped[lane] = last[lane]
            j.set_safe_lsn(last[lane] + 1)
        self._shipped_lot.unpark_all()

    async def _commit(self, obj: bytes, seq: int, first: LaneLsns, last: LaneLsns) -> None:
        epoch = self._epoch
        first_lsn, last_lsn = first[MAIN_LANE], last[MAIN_LANE]
        lanes = self._lane_table(first, last)
        key = log_key(self.prefix, self.region, seq)
        backoff = Backoff(self.config.retry_base_s, self.config.retry_cap_s)
        landed: LogObjectHeader | None = None
        await self._write_ahead(last)
        while True:
            t0 = time.perf_counter()
            try:
                landed = await self._create(key, obj, epoch, first_lsn, last_lsn, lanes)
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
        # An entry found already ours after a 412 (a lost response, or the
        # same range re-shipped after a restart) is summarised from what the
        # bucket holds: a sealed object rebuilt has other nonces and CRCs.
        header = landed if landed is not None else logobject.decode_header(obj, where=key)
        if landed is None:
            # Only bytes known to be the bucket's: one found after a 412 may
            # differ (a sealed object rebuilt has other nonces).
            self._hold_for_pack(seq, obj)
        self._next_seq = seq + 1
        self._objects += 1
        self._wire_bytes += len(obj)
        self._last_ship_ms = self._clock()
        self._last_error = None
        for g in header.gaps:
            gap_key = (g.topic, g.partition)
            self._next_offsets[gap_key] = max(self._next_offsets.get(gap_key, 0), g.last_offset + 1)
        for b in header.blocks:
            self._next_offsets[(b.topic, b.partition)] = b.last_offset + 1
        self._pending_manifest.append(ManifestEntry.from_header(header, header.total_length))
        self._schedule.committed()
        self._notify_commit(seq)

    async def _create(
        self,
        key: str,
        obj: bytes,
        epoch: int,
        first_lsn: int,
        last_lsn: int,
        lanes: tuple[LaneRange, ...] = (),
    ) -> LogObjectHeader | None:
        """One attempt to create the entry; returns once it is committed (by us).

        Returns the header of the entry in the bucket when it was found there
        already ours (None when this attempt created it).

        A corrupt or foreign object where the entry goes is set aside
        (:meth:`_set_aside`) and the create tried again, at most
        :data:`_SET_ASIDE_MAX` times.
        """
        _, seq = parse_log_key(key, self.prefix)
        for _ in range(_SET_ASIDE_MAX + 1):
            try:
                await self._create_timed(key, obj)
                return None
            except PreconditionFailed:
                pass
            try:
                theirs = (await read_header(self.bucket, key)).header
                if (theirs.region, theirs.seq) != (self.region, seq):
                    raise CorruptData(
                        f"entry claims seq {theirs.seq} of region {theirs.region!r}", where=key
                    )
                break
            except UnsupportedFormat:
                raise  # a newer gateway's entry: never ours to remove
            except CorruptData as exc:
                await self._set_aside(key, exc)
        else:
            raise CorruptData(
                f"a corrupt object came back {_SET_ASIDE_MAX} times after being set aside",
                where=key,
            )
        outcome = classify_conflict(
            our_epoch=epoch,
            our_first_lsn=first_lsn,
            our_last_lsn=last_lsn,
            their_epoch=theirs.epoch,
            their_first_lsn=theirs.first_lsn,
            their_last_lsn=theirs.last_lsn,
        )
        if outcome is Conflict.OURS and theirs.lanes != lanes:
            # Same epoch and lane 0 range, other lanes' ranges differ: two
            # processes believe they hold our epoch (as in classify_conflict).
            raise Fenced(
                f"another writer uses our epoch {epoch} ({key} has lane ranges "
                f"{theirs.lanes}, ours {lanes})"
            )
        if outcome is Conflict.OURS:
            log.info("shipper: %s was already ours (a lost response); committed", key)
            return theirs
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
            self._attempt_failed()
            with trio.move_on_after(delay) as self._retry_wait:
                await trio.sleep_forever()
            self._retry_wait = None
            return
        self._retrying = True
        self._attempt_failed()
        log.warning("shipper: %s (%s); retrying in %.2fs", what, exc, delay)
        with trio.move_on_after(delay) as self._retry_wait:
            # A link back is usually seen first by a mirror (polling every
            # second): retry shortly after, not at the end of a backoff that
            # grew to retry_cap_s while the link was down.
            await self.bucket.wait_reachable()
            await trio.sleep(min(delay, RETRY_AFTER_ANSWER_S))
        self._retry_wait = None

    def _accepted(self) -> None:
        """The bucket took a claim or a commit: any outage or refusal is over."""
        self._retrying = False
        self._last_error = None
        self._denial.cleared()

    @property
    def state(self) -> str:
        """One of :data:`SHIPPER_STATES` (see :attr:`ShipperStats.state`)."""
        if self._failure is not None:
            return "failing"
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

    def _hold_for_pack(self, seq: int, obj: bytes) -> None:
        cfg = self.config
        if len(obj) > cfg.pack_entry_max_bytes or self._pack_held + len(obj) > cfg.pack_max_bytes:
            return
        self._pack_bodies.append((seq, bytes(obj)))
        self._pack_held += len(obj)

    def _release_packed(self, last_seq: int) -> None:
        """Forget the held bytes of entries up to ``last_seq`` (their manifest is written)."""
        keep = [(s, b) for s, b in self._pack_bodies if s > last_seq]
        self._pack_bodies = keep
        self._pack_held = sum(len(b) for _, b in keep)

    async def _write_pack(self, first_seq: int, last_seq: int) -> None:
        """Create the pack of the held small entries among ``first_seq..last_seq``, if worth it.

        Best effort: a pack only spares readers round trips, so a refusal or
        an outage is logged and shipping goes on (the manifest follows).
        """
        bodies = [(s, b) for s, b in self._pack_bodies if first_seq <= s <= last_seq]
        if len(bodies) < PACK_MIN_ENTRIES or not self.may_ship(Priority.BULK):
            # A pack copies data already shipped: it is the first thing a
            # link allowance or a bulk window holds back, never worth a wait.
            return
        key = pack_key(self.prefix, self.region, bodies[0][0], bodies[-1][0])
        data = encode_pack(self.region, bodies)
        if await self._create_summary(key, data, "pack", "readers GET its entries"):
            self._packs += 1
            self._pack_bytes += len(data)

    async def _create_summary(
        self, key: str, data: bytes, what: str, meanwhile: str
    ) -> bool | None:
        """Create a manifest or a pack: objects shipping does not wait for.

        True: created now; False: one exists already (a previous incarnation's:
        entries are immutable, so either copy is right); None: not written
        (logged with what happens ``meanwhile``). A bucket gone stops the shipper.
        """
        try:
            await self._create_timed(key, data)
        except PreconditionFailed:
            log.info("shipper: %s %s already exists", what, key)
            return False
        except BucketGone as exc:
            raise self._lost(f"{key} could not be created: {exc}") from None
        except _RETRIED as exc:
            log.warning("shipper: %s %s not written yet (%s); %s", what, key, exc, meanwhile)
            return None
        return True

    async def _maybe_write_manifest(self, *, force: bool = False) -> None:
        if not self._pending_manifest or not (force or self._schedule.due(self._mono_ms())):
            return
        now = self._clock()
        entries = list(self._pending_manifest)
        if not await self._log_still_there(entries[0].seq):
            return
        if self.config.pack_max_bytes:
            await self._write_pack(entries[0].seq, entries[-1].seq)
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
        # A refused manifest does not hold up shipping (the log is the truth;
        # readers fall back to headers): the next one covers it.
        meanwhile = "the next one covers its entries"
        if await self._create_summary(key, manifest.encode(), "manifest", meanwhile) is None:
            return
        self._manifests += 1
        self._last_manifest_seq = manifest.last_seq
        del self._pending_manifest[: len(entries)]
        self._release_packed(entries[-1].seq)
        self._schedule.written(manifest.last_seq, self._mono_ms())
        self._caught_up()
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
        last entry the newest manifest covers (or, before the first manifest,
        the oldest entry no manifest covers yet): GC never deletes it (it keeps
        the newest manifest and its entries), so if it is gone, the bucket lost
        the log. The entry, not the manifest: a bucket wiped between this check
        and the manifest's create receives that manifest, but the entries it
        covers were created before the check, so they are gone from it.
        False: the bucket is away, try at the next manifest.
        """
        seq = first_pending if self._last_manifest_seq is None else self._last_manifest_seq
        key = log_key(self.prefix, self.region, seq)
        try:
            await self.bucket.head(key)
        except NotFound:
            raise self._lost(f"{key}, which this gateway wrote, is gone") from None
        except _RETRIED as exc:
            # Away or refusing (an expired key, say): the next manifest asks again.
            log.warning("shipper: manifest not written yet (%s)", exc)
            return False
        return True

    # ------------------------------------------------------------- loops

    async def ship_pending(self, progress: Callable[[int, int], None] | None = None) -> int:
        """Ship everything appended so far (``edgegw sync``). Returns objects shipped."""
        target = {lane: j.next_lsn - 1 for lane, j in self._lanes}
        shipped = 0
        if any(self._shipped[lane] < target[lane] for lane, _ in self._lanes if self._may(lane)):
            shipped = await self._ship_many(until=target, progress=progress)
        await self._maybe_write_manifest(force=True)
        return shipped

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim (retrying while the bucket is away or refuses), then ship for ever.

        An unexpected exception is counted and kept (:attr:`state` ``failing``,
        ``edgegw status``) until a later run catches up, and propagates: the
        gateway's supervisor restarts the shipper (:meth:`reset`).
        """
        try:
            await self._run(task_status)
        except Exception as exc:
            if not isinstance(exc, Fenced | BucketLost):  # deliberate ends: not a failure
                self._failures += 1
                self._failure = _describe_failure(exc)
            raise

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        """Claim (retrying while the bucket is away or refuses), then ship for ever.

        A gateway that has claimed its region before (its journal holds a
        writer state) reports ready at once and claims in the background, so
        a site starts and journals while its link is down or its credentials
        are refused. A journal that never met the bucket must learn the
        region's log first — otherwise its offsets could reuse ones already
        in the bucket — so the first start of a gateway waits for the bucket
        (and for access to it) before reporting ready.
        """
        written = self._load_writer_state()
        self._merge_sent(written)
        # Before intake opens: a journal that lost what the bucket holds must
        # not append (Diverged), one that may have waits for the claim.
        hold = self._check_journal_tail(written)
        if hold is not None:
            self.intake_hold = hold
            log.warning(
                "shipper: %s; produce waits until the claim has compared the journal with "
                "region %s's log in the bucket",
                hold,
                self.region,
            )
        met_bucket = written is not None and not self._lost_lane_journals(written) and hold is None
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
                if not isinstance(exc, DiskFull):
                    self._attempt_failed()
                with trio.move_on_after(delay) as self._retry_wait:
                    await trio.sleep_forever()
                self._retry_wait = None
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
                    self._caught_up()
                    await self._wait_appended()
                else:
                    with trio.move_on_after(max(due / 1000, manifest_floor_s)):
                        await self._wait_appended()
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
                await self._wait_appended_bytes(full_at)
            self._flush_wait = None
            self._ship_now = False
            # A backlog (after an outage, or a burst) ships back to back: a
            # full object, then objects of up to backlog_object_bytes, each
            # built while the previous one uploads.
            await self._ship_many(next_due=self._is_full)
            self._appended_bytes_at_ship = self._appended_bytes()
            if not self.pending():
                await self._maybe_write_manifest()

    def _caught_up(self) -> None:
        """A run got through a full cycle (a manifest written, or nothing left to ship):
        the failures before it are over."""
        if self._failure is not None:
            log.info(
                "shipper: shipping again after %d failed run(s) (last: %s)",
                self._failures,
                self._failure,
            )
        self._failures = 0
        self._failure = None

    async def _wait_appended(self) -> None:
        """Wait until a lane that may ship has an entry to ship, or :meth:`policy_changed`."""
        lane, j = self._lanes[0]
        if not self._multi and self._may(lane):
            await j.wait_appended(self._ship_from[lane])
            return
        with trio.CancelScope() as self._idle_wait:
            async with trio.open_nursery() as nursery:

                async def one(lane: Lane, j: Journal) -> None:
                    await j.wait_appended(self._ship_from[lane])
                    nursery.cancel_scope.cancel()

                for lane, j in self._lanes:
                    if self._may(lane):
                        nursery.start_soon(one, lane, j)
                if not nursery.child_tasks:
                    await trio.sleep_forever()  # every lane held: until policy_changed
        self._idle_wait = None

    def _appended_bytes(self) -> int:
        return sum(j.appended_bytes for _, j in self._lanes)

    async def _wait_appended_bytes(self, total: int) -> None:
        """Wait until the lanes together appended ``total`` bytes (since they opened)."""
        if not self._multi:
            await self._lanes[0][1].wait_appended_bytes(total)
            return
        while (missing := total - self._appended_bytes()) > 0:
            # Whenever the lanes together add ``missing`` bytes, one of them
            # adds at least its share: wait for the first lane to do so.
            share = -(-missing // len(self._lanes))
            async with trio.open_nursery() as nursery:

                async def one(j: Journal, share: int) -> None:
                    await j.wait_appended_bytes(j.appended_bytes + share)
                    nursery.cancel_scope.cancel()

                for _, j in self._lanes:
                    nursery.start_soon(one, j, share)

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
        age = 0.0
        for lane, j in self._lanes:
            if not self._may(lane) or j.next_lsn <= self._ship_from[lane]:
                continue
            first = j.read_entries(self._ship_from[lane], max_bytes=1, durable_only=False)
            if first:
                age = max(age, (self._clock() - first[0].append_time) / 1000)
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
            set_aside=self._set_aside_count,
            uploads_aborted=self._uploads_aborted,
            heap_trims=self._heap_trims,
            manifests=self._manifests,
            packs=self._packs,
            pack_bytes=self._pack_bytes,
            records=self._records,
            journal_bytes=self._journal_bytes,
            wire_bytes=self._wire_bytes,
            retries=self._retries,
            last_ship_ms=self._last_ship_ms,
            last_error=self._failure or self._last_error,
            upload_seconds_total=self._upload_s,
            state=self.state,
            denied=self._denial.current,
            lanes=tuple(self._lane_stats()),
            gap_records=self._gap_records,
            failures=self._failures,
        )

    def _lane_stats(self) -> list[LaneShipStats]:
        out = []
        for lane, j in self._lanes:
            shipped = self._shipped[lane]
            out.append(
                LaneShipStats(
                    lane=str(lane),
                    shipped_lsn=shipped,
                    next_lsn=j.next_lsn,
                    backlog_entries=max(0, j.next_lsn - 1 - shipped),
                    backlog_bytes=j.bytes_from(shipped + 1),
                    held=not self._may(lane),
                )
            )
        return out
