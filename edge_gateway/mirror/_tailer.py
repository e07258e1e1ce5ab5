"""The tailer: follows one source region's log and mirrors its topics into the local journal.

Protocol and every failure case: ``docs/mirroring.md``. In short:

* The tailer asks for ``log/<next seq>``: a 404 means nothing new (no LIST
  while following). Polling starts at ``poll_interval_s`` and backs off while
  idle up to ``max_poll_interval_s``; :meth:`Tailer.wake` (a relayed head)
  polls at once. While a head relay is active (:meth:`Tailer.set_relay`), an
  idle tailer makes no requests at all: it waits for
  :meth:`Tailer.relayed_head` to announce an entry it has not applied (and
  polls every ``relay_safety_poll_s`` as a safety net). The relay is a hint,
  never trusted: the tailer still reads the log itself and stops at the
  first 404; a relayed head that does not exist (yet) is polled for with the
  normal backoff.
* Per entry: one ranged GET of the first 64 KiB (header and index, and all
  of a small object), then only the byte ranges of subscribed partitions;
  every block is CRC-checked and decoded *before* anything is appended. Each
  batch is appended with its source offsets and the entry's coordinates; the
  last append of an entry carries ``end_of_object``. Progress is therefore
  recovered from the journal itself: a crash between two batches of an entry
  resumes inside it, dropping the batches already present by offset.
* Far behind, the tailer plans from the source's manifests (no header reads)
  and prefetches several objects at once, bounded in count and bytes, while
  applying strictly in order.
* Deleted entries (GC) are gaps: policy ``fail`` stops this source with
  :class:`SourceGap`, ``skip`` continues after it and records the range. A
  fresh mirror starts at the oldest entry left; the deleted ones before it
  are a *start*, except those the source's GC names as lost for this reader
  (deleted by the age cap although it was subscribed when they were
  written): those are a gap like any other.
  Corrupt or hostile entries are quarantined and retried with backoff;
  nothing of them is applied.
* A bucket that refuses this gateway (:class:`~edge_gateway.bucket.AccessDenied`:
  credentials, policy, no such bucket) is retried like an outage, but the
  tailer's state is ``denied``, with the store's code and what to do, and
  the log says so at ERROR when it starts and every few minutes after.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import trio

from edge_gateway._trio import wait_set
from edge_gateway.backoff import Backoff
from edge_gateway.bucket import (
    AccessDenied,
    Bucket,
    BucketUnavailable,
    Denial,
    DenialTracker,
    NotFound,
)
from edge_gateway.bucket_log import HEADER_READ_BYTES, find_head, read_header
from edge_gateway.errors import CorruptData, InvalidInput, MissingKey, Unavailable
from edge_gateway.failpoints import fail_point
from edge_gateway.format import atrest, logobject
from edge_gateway.format.batch import RecordBatch
from edge_gateway.format.crypt import Keyring
from edge_gateway.format.entry import SourceCoords
from edge_gateway.format.logobject import BlockIndex
from edge_gateway.format.manifest import (
    Manifest,
    log_key,
    manifest_key,
    manifest_prefix,
    parse_manifest_key,
)
from edge_gateway.journal import Journal, Lane, MirrorBatch, MirrorBlock, Priority
from edge_gateway.mirror._config import TailerConfig
from edge_gateway.mirror._packs import ListedPack, PackReader, PackStats, list_packs
from edge_gateway.mirror._plan import (
    Action,
    EntryInfo,
    EntryPlan,
    Gap,
    GapKind,
    GapPolicy,
    PollSchedule,
    SourceGap,
    SourceState,
)
from edge_gateway.mirror._priority import PriorityGate
from edge_gateway.mirror.cursor import Cursor, publish_cursor
from edge_gateway.mirror.log_gc import GcState, read_gc_state
from edge_gateway.names import validate_region, validate_topic

log = logging.getLogger("edgegw.mirror")

#: Gaps kept in statistics (the log has them all).
_MAX_GAPS_KEPT = 1000
#: Window of the apply-rate estimate behind the ETA.
_RATE_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class QuarantinedEntry:
    """An entry (or other object) the tailer refused as corrupt; it is retried with backoff."""

    key: str
    seq: int
    reason: str
    attempts: int
    first_seen_ms: int
    last_seen_ms: int


#: Entries a partition jump is traced back through to the gap marker that declared it.
_DECLARED_LOOKBACK = 256


@dataclass(frozen=True, slots=True)
class TailerStats:
    """A snapshot of a tailer (see :meth:`Tailer.statistics`)."""

    source: str
    reader: str
    #: starting, following, idle, catching-up, retrying, denied, missing-key,
    #: quarantined, stopped
    state: str
    next_seq: int
    accepted_epoch: int
    #: Highest seq known to exist (manifests, HEADs, relayed heads, reads).
    known_head: int
    entries_behind: int
    #: Estimated from the sizes of the entries seen so far.
    bytes_behind: int
    #: Seconds since this mirror was last caught up with the source's known
    #: head (0 when caught up): how stale its newest data may be.
    seconds_behind: float
    #: Seconds to catch up at the recent apply rate (``None``: unknown or idle).
    eta_s: float | None
    entries: int
    entries_with_data: int
    fences: int
    stale_skipped: int
    #: Entries resumed after an interruption between their batches.
    entries_resumed: int
    records: int
    batches: int
    duplicates_dropped: int
    bytes_fetched: int
    header_reads: int
    planned_entries: int
    polls: int
    empty_polls: int
    poll_interval_s: float
    catch_ups: int
    #: Most bytes held by prefetched objects at once (bounded by prefetch_bytes,
    #: or by one object larger than that).
    prefetch_peak_bytes: int
    #: Most objects fetched ahead at once (bounded by prefetch_objects).
    prefetch_peak_objects: int
    retries: int
    last_error: str | None
    gaps: tuple[Gap, ...]
    quarantined: tuple[QuarantinedEntry, ...]
    quarantine_events: int
    cursor_through_seq: int
    stopped_by: str | None
    #: Per source topic, records the source declared dropped (gap markers, this run).
    dropped_gap_records: tuple[tuple[str, int], ...] = ()
    #: Idle waits are for relayed heads (no polling), see :meth:`Tailer.set_relay`.
    relay: bool = False
    #: Highest head the relay announced (0: none).
    relay_head: int = 0
    #: Polls started by a relayed head.
    relay_wakeups: int = 0
    #: The bucket's refusal in force (state ``denied``).
    denied: Denial | None = None
    #: ``<region>/<key id>`` of the key an encrypted entry needs and this
    #: reader lacks (state ``missing-key``); None otherwise.
    missing_key: str | None = None
    #: Entries being fetched now (header reads, GETs, decoding) and the most at once.
    fetches_in_flight: int = 0
    fetches_in_flight_peak: int = 0
    #: 404s of entries asked for ahead of the first missing one while following
    #: (the cost of probing past the known head, see ``docs/mirroring.md``).
    probe_misses: int = 0
    #: The highest priority of the backlog this tailer catches up now (None:
    #: not catching up); see :class:`~edge_gateway.mirror.PriorityGate`.
    catching_up_priority: str | None = None
    #: Whether it waits now for another source's higher-priority catch-up,
    #: how many fetches waited so, and for how long in all.
    priority_held: bool = False
    priority_holds: int = 0
    priority_held_s: float = 0.0
    #: Packs of small entries read while catching up, entries taken from
    #: them, and packs or bodies not used (the entries were GET alone).
    pack_reads: int = 0
    pack_entries: int = 0
    pack_fallbacks: int = 0
    #: Blocks kept as block entries, as fetched (``keep_blocks``); ``batches``
    #: counts the batches appended one by one (the per-batch path).
    blocks: int = 0


@dataclass(frozen=True, slots=True)
class CatchUpResult:
    """What :meth:`Tailer.catch_up` did."""

    entries: int
    records: int
    #: The next seq to apply (everything below is mirrored).
    next_seq: int


@dataclass(slots=True)
class _Fetched:
    info: EntryInfo
    #: the wanted blocks' decoded batches (the per-batch path) ...
    batches: dict[BlockIndex, list[RecordBatch]]
    #: ... or their stored bytes, opened and checked, not decompressed
    #: (``TailerConfig.keep_blocks``: kept as block entries)
    blocks: dict[BlockIndex, bytes] | None = None


@dataclass(slots=True)
class _FetchPlan:
    info: EntryInfo
    #: bytes from offset 0 already read (the first GET), or empty
    have: bytes
    ranges: list[tuple[int, int]]
    wanted: tuple[BlockIndex, ...]
    cost: int
    #: The pack that may hold the entry's bytes (planned from a manifest).
    pack: ListedPack | None = None


@dataclass(slots=True)
class _Slot:
    seq: int
    cost: int = 0
    #: The entry was planned from a manifest (no header read).
    planned: bool = False
    fetched: _Fetched | None = None
    error: Exception | None = None
    done: trio.Event = field(default_factory=trio.Event)
    #: Set once this slot holds its bytes of the budget (or never will): the
    #: next slot acquires only then, so the budget is taken in seq order.
    budgeted: trio.Event = field(default_factory=trio.Event)


class _Unconfirmed(Exception):
    """A manifest-planned entry would be skipped or show a gap: confirm from its header first."""


class _ByteBudget:
    """Bytes held by prefetched objects (one larger than the budget still passes, alone)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self._lot = trio.lowlevel.ParkingLot()

    async def acquire(self, n: int) -> None:
        while self.used and self.used + n > self.capacity:
            await self._lot.park()
        self.used += n
        self.peak = max(self.peak, self.used)

    def fits(self, n: int) -> bool:
        """Whether :meth:`acquire` of ``n`` bytes would return at once."""
        return not self.used or self.used + n <= self.capacity

    def take(self, n: int) -> None:
        """:meth:`acquire` for ``n`` bytes that :meth:`fits`, without a checkpoint."""
        assert self.fits(n)
        self.used += n
        self.peak = max(self.peak, self.used)

    def release(self, n: int) -> None:
        self.used -= n
        self._lot.unpark_all()


class _ManifestsAhead:
    """A catch-up's manifests, each GET a few ahead of the one planned from.

    One at a time, every manifest cost the launcher a round trip before its
    entries could be planned (a restored gateway replaying a day of a quiet
    source: a round trip per ~40 entries, on top of the entries' own).
    """

    DEPTH = 4

    def __init__(
        self,
        load: Callable[[int, str], Awaitable[Manifest | None]],
        manifests: Sequence[tuple[int, str]],
        nursery: trio.Nursery,
    ) -> None:
        self._load = load
        self._manifests = manifests
        self._nursery = nursery
        self._slots: dict[int, tuple[trio.Event, list[Manifest | Exception | None]]] = {}

    async def get(self, i: int) -> Manifest | None:
        """Manifest ``i`` (None: unusable); a bucket error of its GET is raised here."""
        for j in range(i, min(i + self.DEPTH, len(self._manifests))):
            if j not in self._slots:
                slot: tuple[trio.Event, list[Manifest | Exception | None]] = (trio.Event(), [])
                self._slots[j] = slot
                self._nursery.start_soon(self._fetch, j, *slot)
        for j in [j for j in self._slots if j < i]:
            del self._slots[j]
        done, box = self._slots[i]
        await wait_set(done)
        if not box:  # its fetch was cancelled: so is this task, at the wait above
            raise RuntimeError(f"manifest {self._manifests[i][1]} was not fetched")
        result = box[0]
        if isinstance(result, Exception):
            raise result
        return result

    async def _fetch(
        self, i: int, done: trio.Event, box: list[Manifest | Exception | None]
    ) -> None:
        try:
            box.append(await self._load(*self._manifests[i]))
        except Exception as exc:  # noqa: BLE001 - raised to the launcher in turn
            box.append(exc)
        finally:
            done.set()


#: A catch-up's first GET of an entry no manifest planned asks for at least this
#: much: a busy source's whole object (2-400 KB: a flush interval of records,
#: compressed) in one round trip.
_CATCH_UP_FIRST_GET: Final = 256 * 1024
#: ... and for this many times the mean size of the source's entries planned or
#: read so far, when that is more (a source busier still: its objects are
#: larger); asking past an object's end costs nothing, the store sends what
#: there is.
_CATCH_UP_FIRST_GET_MEANS: Final = 2


class _HeadLater:
    """A catch-up's head search, run while the entries the manifests list are fetched.

    The newest manifest names a seq known to exist: a catch-up far enough
    behind it starts fetching at once, and the galloping HEADs that find the
    entries written after that manifest (several round trips, a 404 each
    at the end) overlap the fetches instead of coming before the first.
    """

    def __init__(self, search: Callable[[], Awaitable[int]], known: int) -> None:
        self._search = search
        #: the highest seq known to exist until the search ends, then the head
        self.head = known
        self.found = trio.Event()
        self.error: Exception | None = None

    async def run(self) -> None:
        try:
            self.head = max(self.head, await self._search())
        except Exception as exc:  # noqa: BLE001 - delivered in seq order by the launcher
            self.error = exc
        finally:
            self.found.set()


class Tailer:
    """Mirrors the topics of one source region into the local journal, exactly once, in order.

    ``topics`` lists the source topics to mirror (``None``: all of them);
    ``local_region`` names this gateway (the reader, for cursors). Start
    :meth:`run` in the gateway's nursery, or call :meth:`catch_up` to pull
    up to the current head and return (``edgegw sync``). One tailer per
    source and journal: two would race on the same mirror partitions.
    """

    def __init__(
        self,
        journal: Journal,
        bucket: Bucket,
        source_region: str,
        topics: Iterable[str] | None,
        local_region: str,
        config: TailerConfig | None = None,
        *,
        prefix: str = "",
        clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        keyring: Keyring | None = None,
        priorities: Mapping[str, Priority] | None = None,
        gate: PriorityGate | None = None,
    ) -> None:
        self.journal = journal
        self.bucket = bucket
        #: Keys to open the source's encrypted objects with (None: holds none).
        self.keyring = keyring
        #: The key an encrypted entry needs and this tailer lacks (state ``missing-key``).
        self._missing_key: MissingKey | None = None
        self.source = validate_region(source_region)
        self.local_region = validate_region(local_region)
        if self.source == self.local_region:
            raise InvalidInput(f"region {self.source} cannot mirror its own log")
        self.topics = None if topics is None else frozenset(validate_topic(t) for t in topics)
        self.config = config or TailerConfig()
        self.prefix = prefix
        self._clock = clock
        self._rand = random.Random()
        #: The source's topics' priorities (absent: normal), for the catch-up
        #: order across sources that ``gate`` keeps (None: no such order).
        self._priorities = dict(priorities or {})
        self._gate = gate
        self._backlog_manifest: Manifest | None = None
        self._backlog_priority: Priority | None = None
        self._held_now = 0
        self._holds = 0
        self._held_s = 0.0
        self._state = SourceState(
            self.source, self._subscribed, journal.source_progress().get(self.source)
        )
        self._started = False
        self._poll = PollSchedule(
            self.config.poll_interval_s, self.config.max_poll_interval_s, hold=self.config.poll_hold
        )
        self._wake = trio.Event()
        self._known_head = 0
        self._relay = False
        self._relay_head = 0
        self._relay_wakeups = 0
        self._last_gap_check: float | None = None
        self._last_catch_up_check: float | None = None
        self._pending_marker_plan: EntryPlan | None = None
        self._markers_pending = 0
        self._next_cursor_at = 0.0
        self._published_through = 0
        self._status = "starting"
        self._stopped_by: str | None = None
        self._quarantine: dict[str, QuarantinedEntry] = {}
        # Full jitter above a floor of the base: a quarantined entry is never
        # re-read a moment after it was refused (docs/protocol.md, "Retry waits").
        self._quarantine_backoff = Backoff(
            self.config.quarantine_retry_base_s,
            self.config.quarantine_retry_cap_s,
            floor_s=self.config.quarantine_retry_base_s,
            rng=self._rand.random,
        )
        self._gaps: deque[Gap] = deque(maxlen=_MAX_GAPS_KEPT)
        #: Per source topic: records the source declared dropped (gap markers), this run.
        self._dropped_records: dict[str, int] = {}
        self._avg_entry_bytes = 0.0
        #: Sizes of the entries planned from manifests or read (their running
        #: mean over the last ~100): what a catch-up's first GET asks for.
        self._sizes_seen = 0
        self._size_mean = 0.0
        self._rate: deque[tuple[float, int]] = deque()
        # counters
        self._entries = self._with_data = self._fences = self._stale = self._resumed = 0
        self._records = self._batches = self._dropped = self._blocks = 0
        self._bytes_fetched = self._header_reads = self._planned = 0
        self._polls = self._empty_polls = self._catch_ups = self._retries = 0
        self._quarantine_events = 0
        self._prefetch_peak_bytes = self._prefetch_peak_objects = 0
        # Fetches in flight (header reads, GETs, decoding) and their peak.
        self._in_flight = self._in_flight_peak = 0
        # Following: entries found by the previous pull and this one so far
        # (they size the probing past the known head), 404s of this pull, and
        # 404s of entries asked for ahead of the first missing one.
        self._found_prev = self._found_now = self._not_found_now = 0
        self._probe_misses = 0
        self._pack_stats = PackStats()
        self._packs: PackReader | None = None
        self._frontier_moved = trio.Event()
        self._last_error: str | None = None
        self._denial = DenialTracker(log, f"mirror {self.source}")
        self._caught_up_at = time.monotonic()
        # Pull rounds of run(), numbered as they start: wait_pulled() waits for
        # one that started after its call to end (done, failed or stopped).
        self._pulls_started = 0
        self._pulls_done = 0
        self._pull_failed: tuple[int, str] | None = None
        self._pull_lot = trio.lowlevel.ParkingLot()

    # ------------------------------------------------------------ public API

    def wake(self, head_seq: int | None = None) -> None:
        """Poll now (the metadata server relayed that the source's head is ``head_seq``)."""
        if head_seq is not None and head_seq > self._known_head:
            self._known_head = head_seq
            self._frontier_moved.set()  # a pull under way asks for it at once
        self._wake.set()

    def set_relay(self, active: bool) -> None:
        """Follow relayed heads (``True``: idle means waiting, no requests) or poll the bucket.

        Switching polls once at once: heads announced while the relay was
        away, or entries committed while it came back, are not missed.
        """
        if active != self._relay:
            self._relay = active
            self._wake.set()

    def relayed_head(self, seq: int) -> None:
        """The relay says the source's head is ``seq``: poll if that entry is not applied yet."""
        self._relay_head = max(self._relay_head, seq)
        if seq >= self._state.next_seq:
            self._relay_wakeups += 1
            self.wake(seq)

    def _idle_delay(self) -> float:
        """How long to wait (for a wake) before polling again after a poll found nothing."""
        delay = self._poll.idle()
        if self._relay and self._relay_head < self._state.next_seq:
            # Every relayed entry is applied: wait for the next announcement.
            safety = self.config.relay_safety_poll_s
            return safety if safety > 0 else math.inf
        # Polling, or a relayed head that is not readable yet: back off as usual.
        return delay

    async def catch_up(self) -> CatchUpResult:
        """Apply everything up to the source's current head, then return.

        Raises what stops it: ``BucketUnavailable``, :class:`CorruptData`
        (the entry is recorded in the quarantine list), :class:`SourceGap`.
        """
        records_before = self._records
        entries = await self._pull()
        await self._publish_cursor(force=True)
        return CatchUpResult(entries, self._records - records_before, self._state.next_seq)

    async def wait_pulled(self) -> CatchUpResult:
        """Poll now (in :meth:`run`) and wait until a poll that started after this call has
        applied everything up to the source's head (``edgegw sync`` on a running gateway).

        Raises :class:`Unavailable` when that poll fails (the bucket is away, the
        entry is quarantined) or the tailer is stopped, as :meth:`catch_up` would.
        """
        want = self._pulls_started + 1
        entries, records = self._entries, self._records
        self.wake()
        while self._pulls_done < want:
            if self._stopped_by is not None:
                raise Unavailable(f"mirror {self.source} is stopped: {self._stopped_by}")
            failed = self._pull_failed
            if failed is not None and failed[0] >= want:
                raise Unavailable(f"mirror {self.source}: {failed[1]}")
            await self._pull_lot.park()
        return CatchUpResult(self._entries - entries, self._records - records, self._state.next_seq)

    @property
    def first_pull_ended(self) -> bool:
        """Whether :meth:`run`'s first pull has ended: applied everything up to the head it
        found (a start-up catch-up), failed (retried from then on), or stopped."""
        return bool(self._pulls_done or self._pull_failed or self._stopped_by is not None)

    async def wait_first_pull(self) -> None:
        """Wait until :attr:`first_pull_ended` (never, for a tailer that is not run)."""
        while not self.first_pull_ended:
            await self._pull_lot.park()

    def _pull_ended(self, generation: int, error: str | None) -> None:
        if error is None:
            self._pulls_done = generation
        else:
            self._pull_failed = (generation, error)
        self._pull_lot.unpark_all()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the source for ever; ready at once (it works offline, retrying).

        Returns only by raising: :class:`SourceGap` (policy ``fail``), or an
        error of the local journal (closed, or a mirror partition that was
        written by someone else). Bucket outages and corrupt entries are
        retried with backoff, never raised.
        """
        task_status.started()
        cfg = self.config
        unavailable = Backoff(cfg.retry_base_s, cfg.retry_cap_s, rng=self._rand.random)
        while True:
            self._pulls_started += 1
            generation = self._pulls_started
            try:
                fail_point("mirror.pull")
                n = await self._pull()
            except SourceGap as exc:
                self._status = "stopped"
                self._stopped_by = str(exc)
                log.error("mirror: %s", exc)
                self._pull_ended(generation, str(exc))
                raise
            except Unavailable as exc:
                self._pull_ended(generation, str(exc))
                self._retries += 1
                self._last_error = str(exc)
                delay = unavailable.next_delay()
                if isinstance(exc, MissingKey):
                    # Waits for a person to add the key: an ERROR when it
                    # starts (or names another key), backoff up to the cap.
                    self._status = "missing-key"
                    if self._missing_key is None or self._missing_key.key_id != exc.key_id:
                        log.error(
                            "mirror %s: %s -- what to do: %s. The other sources go on; "
                            "retrying every %.0fs at most.",
                            self.source,
                            exc,
                            exc.action,
                            cfg.retry_cap_s,
                        )
                    self._missing_key = exc
                elif isinstance(exc, AccessDenied):
                    # Refused: retried the same way (new credentials or a
                    # fixed policy work at the next attempt), logged at ERROR
                    # when it starts and as a reminder, not per attempt.
                    self._status = "denied"
                    self._denial.refused(exc)
                else:
                    self._status = "retrying"
                    log.warning("mirror %s: %s; retrying in %.2fs", self.source, exc, delay)
                await trio.sleep(delay)
                continue
            except CorruptData as exc:
                self._pull_ended(generation, f"entry {self._state.next_seq} is quarantined: {exc}")
                self._status = "quarantined"
                self._last_error = str(exc)
                delay = self._quarantine_backoff.next_delay()
                log.warning(
                    "mirror %s: entry %d stays quarantined; next attempt in %.1fs",
                    self.source,
                    self._state.next_seq,
                    delay,
                )
                await trio.sleep(delay)
                continue
            unavailable.reset()
            self._last_error = None
            self._missing_key = None
            self._denial.cleared()
            await self._publish_cursor()
            self._pull_ended(generation, None)
            if n:
                self._poll.reset()
            self._status = "idle"
            delay = self._idle_delay()
            with trio.move_on_after(delay):
                await self._wake.wait()
            if self._wake.is_set():
                self._wake = trio.Event()
                self._poll.reset()

    def _entries_behind(self) -> int:
        behind = max(0, self._known_head - max(self._state.next_seq, 1) + 1)
        if behind == 0:
            self._caught_up_at = time.monotonic()
        return behind

    def statistics(self) -> TailerStats:
        """A snapshot of progress, lag and trouble."""
        behind = self._entries_behind()
        bytes_behind = int(behind * self._avg_entry_bytes)
        eta: float | None = None
        if behind and len(self._rate) >= 2:
            (t0, n0), (t1, n1) = self._rate[0], self._rate[-1]
            if t1 > t0 and n1 > n0:
                eta = behind / ((n1 - n0) / (t1 - t0))
        return TailerStats(
            source=self.source,
            reader=self.local_region,
            # Until a pull gets past the entry, each retry starts as following or
            # catching-up: the state stays what a person has to act on.
            state="missing-key" if self._missing_key is not None else self._status,
            next_seq=self._state.next_seq,
            accepted_epoch=self._state.accepted_epoch,
            known_head=self._known_head,
            entries_behind=behind,
            bytes_behind=bytes_behind,
            seconds_behind=time.monotonic() - self._caught_up_at if behind else 0.0,
            eta_s=eta,
            entries=self._entries,
            entries_with_data=self._with_data,
            fences=self._fences,
            stale_skipped=self._stale,
            entries_resumed=self._resumed,
            records=self._records,
            batches=self._batches,
            blocks=self._blocks,
            duplicates_dropped=self._dropped,
            bytes_fetched=self._bytes_fetched + self._pack_stats.bytes_fetched,
            header_reads=self._header_reads,
            planned_entries=self._planned,
            polls=self._polls,
            empty_polls=self._empty_polls,
            poll_interval_s=self._poll.current_s,
            catch_ups=self._catch_ups,
            prefetch_peak_bytes=self._prefetch_peak_bytes,
            prefetch_peak_objects=self._prefetch_peak_objects,
            retries=self._retries,
            last_error=self._last_error,
            gaps=tuple(self._gaps),
            dropped_gap_records=tuple(sorted(self._dropped_records.items())),
            quarantined=tuple(self._quarantine.values()),
            quarantine_events=self._quarantine_events,
            cursor_through_seq=self._published_through,
            stopped_by=self._stopped_by,
            relay=self._relay,
            relay_head=self._relay_head,
            relay_wakeups=self._relay_wakeups,
            denied=self._denial.current,
            missing_key=(
                None
                if self._missing_key is None
                else f"{self._missing_key.region}/{self._missing_key.key_id}"
            ),
            fetches_in_flight=self._in_flight,
            fetches_in_flight_peak=self._in_flight_peak,
            probe_misses=self._probe_misses,
            catching_up_priority=None
            if self._backlog_priority is None
            else str(self._backlog_priority),
            priority_held=self._held_now > 0,
            priority_holds=self._holds,
            priority_held_s=self._held_s,
            pack_reads=self._pack_stats.reads,
            pack_entries=self._pack_stats.entries,
            pack_fallbacks=self._pack_stats.fallbacks,
        )

    # ------------------------------------------------------------ following

    def _subscribed(self, topic: str) -> bool:
        return self.topics is None or topic in self.topics

    async def _start(self) -> None:
        """Find where a fresh mirror begins: the oldest entry the source still has."""
        if self._started:
            return
        if not self._state.started:
            gc = await read_gc_state(self.bucket, self.prefix, self.source)
            self._last_gap_check = trio.current_time()
            oldest = gc.highest_deleted_seq + 1
            gaps = self._start_gaps(1, oldest - 1, gc)
            self._check_lost(gaps)  # before moving: a stopped mirror stays at its start
            self._state.start_at(oldest)
            for gap in gaps:
                self._record_gap(gap)
        self._started = True

    def _start_gaps(self, first: int, last: int, gc: GcState) -> list[Gap]:
        """The gaps of a fresh mirror whose first entries ``first..last`` are gone.

        A start, except the entries the source's GC records as lost for this
        reader (``GcState.lost``: deleted before it mirrored them although
        it was subscribed when they were written): those are a LOG gap, and
        the gap policy applies to them.
        """
        if last < first:
            return []
        lost = gc.lost.get(self.local_region)
        if lost is None or lost[1] < first or lost[0] > last:
            return [Gap(GapKind.START, self.source, first, last)]
        a, b = max(lost[0], first), min(lost[1], last)
        log.warning(
            "mirror %s: entries %d..%d were deleted by %s's GC (age cap) before this region "
            "mirrored them, although it was subscribed when they were written: a gap, not "
            "a start (gap_policy %s)",
            self.source,
            a,
            b,
            self.source,
            self.config.gap_policy,
        )
        gaps = [Gap(GapKind.LOG, self.source, a, b)]
        if a > first:
            gaps.insert(0, Gap(GapKind.START, self.source, first, a - 1))
        if b < last:
            gaps.append(Gap(GapKind.START, self.source, b + 1, last))
        return gaps

    def _check_lost(self, gaps: Sequence[Gap]) -> None:
        """Under policy ``fail``, stop at a LOG gap among ``gaps`` (recorded)."""
        for gap in gaps:
            if gap.kind is GapKind.LOG and self.config.gap_policy is GapPolicy.FAIL:
                self._record_gap(gap)
                raise SourceGap(gap)

    async def _pull(self) -> int:
        """Apply entries until the next one does not exist yet; returns how many.

        Every :class:`CorruptData` that stops it is recorded in the
        quarantine list (keyed by the entry, or the object that was bad).
        """
        try:
            return await self._pull_entries()
        except CorruptData as exc:
            self._quarantined(self._state.next_seq, exc)
            raise

    async def _pull_entries(self) -> int:
        await self._start()
        processed = 0
        if self._catch_up_wanted(0):
            processed += await self._catch_up_planned()
            # The store answers again: a refusal episode ends with the first
            # answer, not with the end of a long catch-up.
            self._denial.cleared()
        try:
            while True:
                applied, missing = await self._pipeline(self._state.next_seq, None, ())
                processed += applied
                if not missing:
                    processed += await self._catch_up_planned()
                    continue
                self._denial.cleared()
                self._empty_polls += 1
                if await self._check_gap():
                    continue
                break
        finally:
            await self._flush_marker()
        if self._quarantine:  # whatever was bad (an entry, the boundary) read fine now
            log.info("mirror %s: quarantine cleared", self.source)
            self._quarantine.clear()
            self._quarantine_backoff.reset()
            self._status = "following"
        self._known_head = max(self._known_head, self._state.next_seq - 1)
        return processed

    async def _check_gap(self) -> bool:
        """On a 404 at the next seq: were entries deleted? Skips them if the policy allows.

        Reads the GC boundary only when the entry should exist (a known head
        beyond it), on the first poll, and every ``gap_check_interval_s``
        while idle: an idle tailer costs one GET per poll, not two.
        """
        seq = self._state.next_seq
        now = trio.current_time()
        due = (
            self._known_head >= seq
            or self._last_gap_check is None
            or now - self._last_gap_check >= self.config.gap_check_interval_s
        )
        if not due:
            return False
        self._last_gap_check = now
        gc = await read_gc_state(self.bucket, self.prefix, self.source)
        boundary = gc.highest_deleted_seq
        if boundary < seq:
            if self._known_head >= seq:
                log.warning(
                    "mirror %s: head %d was reported but entry %d does not exist and was not "
                    "deleted; waiting for it",
                    self.source,
                    self._known_head,
                    seq,
                )
                self._known_head = seq - 1
            return False
        gap = self._state.log_gap(boundary + 1)
        gaps = [gap]
        if gap.kind is GapKind.START:
            gaps = self._start_gaps(gap.first_seq, gap.last_seq, gc)
        self._check_lost(gaps)
        await self._flush_marker()
        fresh = self._state.fresh
        coords = self._state.skip_to(boundary + 1)
        for g in gaps:
            self._record_gap(g)
        if not fresh:
            # Persist the jump, so a restart does not meet (and count) it again.
            await self.journal.append_mirror("", 0, None, coords)
        return True

    async def _declared_before(self, gap: Gap) -> Gap | None:
        """The DROPPED gap for a partition jump ``gap`` if an earlier entry's gap marker
        declared exactly it; None otherwise.

        Looks back through the headers of at most :data:`_DECLARED_LOOKBACK`
        entries before the one that shows the jump, and stops at the first
        block or marker of the partition.
        """
        assert gap.topic is not None
        assert gap.partition is not None
        assert gap.first_offset is not None
        assert gap.end_offset is not None
        for seq in range(gap.first_seq - 1, max(0, gap.first_seq - _DECLARED_LOOKBACK), -1):
            try:
                header = (
                    await read_header(self.bucket, log_key(self.prefix, self.source, seq))
                ).header
            except (NotFound, CorruptData):
                return None
            self._header_reads += 1
            key = (gap.topic, gap.partition)
            for g in header.gaps:
                if (g.topic, g.partition) == key and g.last_offset + 1 == gap.end_offset:
                    if g.first_offset <= gap.first_offset:
                        return Gap(
                            GapKind.DROPPED,
                            self.source,
                            seq,
                            seq,
                            gap.topic,
                            gap.partition,
                            gap.first_offset,
                            gap.end_offset,
                        )
                    return None
            if any((b.topic, b.partition) == key for b in header.blocks) or any(
                (g.topic, g.partition) == key for g in header.gaps
            ):
                return None
        return None

    # ------------------------------------------------------------ fetching

    async def _prepare_unplanned(self, seq: int, *, catching_up: bool = False) -> _FetchPlan:
        """Read the entry's header (one ranged GET) and plan the ranges of subscribed blocks.

        ``catching_up``: the entry is known to exist (a catch-up's, past its
        newest manifest): the first GET asks for up to
        :data:`_CATCH_UP_FIRST_GET` bytes, or twice the mean size of the
        entries planned or read so far if more (never more than an object's
        share of ``prefetch_bytes``), so that an object no larger (a busy
        source's, typically) comes whole in one round trip instead of its
        header and then its blocks, two round trips one after the other.
        """
        key = log_key(self.prefix, self.source, seq)
        first = HEADER_READ_BYTES
        if catching_up:
            share = self.config.prefetch_bytes // self.config.prefetch_objects
            want = max(_CATCH_UP_FIRST_GET, int(_CATCH_UP_FIRST_GET_MEANS * self._size_mean))
            first = max(first, min(want, share))
        read = await read_header(self.bucket, key, first)
        self._saw_size(read.size)
        self._header_reads += 1
        self._bytes_fetched += len(read.prefix)
        if read.size != read.header.total_length:
            raise CorruptData(
                f"object is {read.size} bytes, its index describes {read.header.total_length} "
                "(truncated or padded)",
                where=key,
            )
        self._known_head = max(self._known_head, seq)
        return self._plan_fetch(EntryInfo.from_header(key, read.header), read.prefix)

    def _saw_size(self, size: int) -> None:
        """An entry's size, planned from a manifest or read from the store."""
        self._sizes_seen += 1
        self._size_mean += (size - self._size_mean) / min(self._sizes_seen, 100)

    def _plan_fetch(self, info: EntryInfo, have: bytes) -> _FetchPlan:
        wanted: tuple[BlockIndex, ...] = ()
        ranges: list[tuple[int, int]] = []
        # A fence has no blocks; a stale entry is skipped whatever it holds.
        if not info.fence and info.epoch >= self._state.accepted_epoch:
            wanted = tuple(b for b in info.blocks if self._subscribed(b.topic))
        if wanted:
            ranges = logobject.plan_ranges(
                info,
                lambda topic, _p: self._subscribed(topic),
                coalesce_gap=self.config.coalesce_gap,
                whole_object_fraction=self.config.whole_object_fraction,
                have=len(have),
            )
        # Fetched bytes, plus about twice the raw bytes: decoded batches keep
        # their bytes and their records' values; kept as blocks, a copy of the
        # stored bytes.
        if self.config.keep_blocks:
            held = sum(b.stored_length for b in wanted)
        else:
            held = 2 * sum(b.raw_length for b in wanted)
        cost = len(have) + sum(e - s for s, e in ranges) + held
        return _FetchPlan(info, have, ranges, wanted, cost)

    def _opener(self, info: EntryInfo) -> logobject.BlockOpener | None:
        """The opener of an encrypted entry's blocks (:class:`MissingKey` without the key)."""
        if info.key_id is None:
            return None
        if self.keyring is None:
            raise MissingKey(info.region, info.key_id, where=info.key)
        return self.keyring.opener(
            info.region,
            info.key_id,
            info.epoch,
            info.seq,
            info.first_lsn,
            info.last_lsn,
            len(info.blocks),
            where=info.key,
        )

    async def _fetch(self, plan: _FetchPlan, nursery: trio.Nursery | None = None) -> _Fetched:
        """GET the planned ranges and decode every wanted block (CRCs, batch structure)."""
        packs, pack = self._packs, plan.pack
        if packs is not None and pack is not None and nursery is not None and plan.ranges:
            body = await packs.body(pack, plan.info.seq, nursery)
            if body is not None:
                try:
                    return await self._fetch_packed(plan, body)
                except CorruptData as exc:
                    packs.rejected(pack, plan.info.seq, str(exc))
        return await self._fetch_own(plan)

    async def _fetch_packed(self, plan: _FetchPlan, body: bytes) -> _Fetched:
        """Decode the planned ranges of an entry's bytes found in a pack."""
        return await self._decode(plan, self._packed_pieces(plan, body))

    def _decode_now(self, plan: _FetchPlan, body: bytes) -> _Fetched:
        """:meth:`_fetch_packed` on the loop (its blocks are small)."""
        return self._decode_here(plan, self._packed_pieces(plan, body))

    @staticmethod
    def _packed_pieces(plan: _FetchPlan, body: bytes) -> list[tuple[int, bytes]]:
        info = plan.info
        if len(body) != info.size:
            raise CorruptData(
                f"{len(body)} bytes in the pack, its manifest entry says {info.size}",
                where=info.key,
            )
        return [(s, body[s:e]) for s, e in plan.ranges]

    async def _fetch_own(self, plan: _FetchPlan) -> _Fetched:
        """GET the planned ranges of the entry's own object."""
        info = plan.info
        pieces: list[tuple[int, bytes]] = [(0, plan.have)] if plan.have else []
        for start, end in plan.ranges:
            res = await self.bucket.get(info.key, start=start, end=end)
            self._bytes_fetched += len(res.data)
            if res.size != info.size:
                raise CorruptData(
                    f"object is {res.size} bytes, its "
                    f"{'manifest entry' if info.planned else 'index'} says {info.size}",
                    where=info.key,
                )
            pieces.append((start, res.data))
        return await self._decode(plan, pieces)

    async def _decode(self, plan: _FetchPlan, pieces: list[tuple[int, bytes]]) -> _Fetched:
        if not self._decodes_in_thread(plan):
            return self._decode_here(plan, pieces)
        info = plan.info
        if self.config.keep_blocks:
            blocks = await trio.to_thread.run_sync(
                _open_blocks, info.key, plan.wanted, pieces, self._opener(info)
            )
            return _Fetched(info, {}, blocks)
        batches = await trio.to_thread.run_sync(
            _decode_blocks, info.key, plan.wanted, pieces, self._opener(info)
        )
        return _Fetched(info, batches)

    def _decodes_in_thread(self, plan: _FetchPlan) -> bool:
        """Whether the wanted blocks are large enough to decode in a worker thread
        (kept as blocks: to check and open, by their stored bytes)."""
        if self.config.keep_blocks:
            size = sum(b.stored_length for b in plan.wanted)
        else:
            size = sum(b.raw_length for b in plan.wanted)
        return size > self.config.decode_in_thread_bytes

    def _decode_here(self, plan: _FetchPlan, pieces: list[tuple[int, bytes]]) -> _Fetched:
        """Decode the wanted blocks on the loop."""
        info = plan.info
        if not plan.wanted:
            return _Fetched(info, {}, {} if self.config.keep_blocks else None)
        if self.config.keep_blocks:
            return _Fetched(
                info, {}, _open_blocks(info.key, plan.wanted, pieces, self._opener(info))
            )
        return _Fetched(info, _decode_blocks(info.key, plan.wanted, pieces, self._opener(info)))

    # ------------------------------------------------------------ applying

    async def _apply(self, fetched: _Fetched) -> None:
        """Apply one fetched entry: all of its new batches, or (on an error) none of it."""
        state = self._state
        plan = state.plan(fetched.info, self.journal.next_offset)
        info = plan.info
        if info.planned and (plan.action is Action.STALE or plan.partition_gaps):
            # Data would be skipped on a manifest's word alone: ask the object.
            raise _Unconfirmed(f"entry {info.seq}: {plan.action.value}, {len(plan.gaps)} gaps")
        if plan.action is Action.STALE:
            log.info(
                "mirror %s: skipping entry %d of epoch %d (epoch %d accepted)",
                self.source,
                info.seq,
                info.epoch,
                state.accepted_epoch,
            )
            self._stale += 1
            await self._progress_only(plan)
            return
        explained: dict[Gap, Gap] = {}
        for gap in plan.partition_gaps:
            # A jump a gap marker of an entry applied before a restart declared
            # (the pending jump was in memory only): a DROPPED gap, no policy.
            declared = await self._declared_before(gap)
            if declared is not None:
                explained[gap] = declared
            elif self.config.gap_policy is GapPolicy.FAIL:
                self._record_gap(gap)
                raise SourceGap(gap)
        if fetched.blocks is not None and plan.whole_blocks:
            await self._apply_blocks(plan, fetched.blocks, explained)
            return
        batches = fetched.batches
        if fetched.blocks is not None:
            # Resumed inside a block (a crash between its batches, by the
            # per-batch path of an older gateway): its new batches are picked
            # out one by one, as before.
            batches = _batches_of(info.key, fetched.blocks)
        appends, dropped = state.assemble(plan, batches)
        if plan.resumed:
            self._resumed += 1
            log.info(
                "mirror %s: resuming entry %d after an interruption (%d batches already applied)",
                self.source,
                info.seq,
                dropped,
            )
        self._dropped += dropped
        coords = await self._enter(plan, explained, has_data=bool(appends))
        if coords is None:
            return
        mid, last = coords
        # One reservation and one write (in a worker thread) for the entry's
        # batches: the loop goes on with the next entries meanwhile.
        await self.journal.append_mirror_batches(
            [MirrorBatch(a.topic, a.partition, a.batch, a.allow_gap) for a in appends], mid, last
        )
        self._batches += len(appends)
        self._records += sum(a.count for a in appends)
        state.applied(plan)
        self._with_data += 1
        self._entry_done(info)

    async def _apply_blocks(
        self, plan: EntryPlan, blocks: dict[BlockIndex, bytes], explained: dict[Gap, Gap]
    ) -> None:
        """Apply an entry whose blocks are all new: one block entry per block, as shipped."""
        state = self._state
        info = plan.info
        appends = plan.block_appends(blocks)
        if plan.resumed:
            self._resumed += 1
            log.info(
                "mirror %s: resuming entry %d after an interruption (%d blocks not yet applied)",
                self.source,
                info.seq,
                len(appends),
            )
        coords = await self._enter(plan, explained, has_data=bool(appends))
        if coords is None:
            return
        mid, last = coords
        # A plaintext block's stored bytes are those the source's index gives
        # the CRC of, checked when fetched: the journal need not take it again
        # on the loop. An opened (sealed) block's CRC is of other bytes.
        sealed = info.key_id is not None
        await self.journal.append_mirror_blocks(
            [
                MirrorBlock(
                    a.topic,
                    a.index.partition,
                    a.index,
                    a.stored,
                    info.nulls,
                    a.allow_gap,
                    None if sealed else a.index.crc,
                )
                for a in appends
            ],
            mid,
            last,
        )
        self._blocks += len(appends)
        self._records += sum(a.index.record_count for a in appends)
        state.applied(plan)
        self._with_data += 1
        self._entry_done(info)

    async def _enter(
        self, plan: EntryPlan, explained: dict[Gap, Gap], *, has_data: bool
    ) -> tuple[SourceCoords, SourceCoords] | None:
        """What every applied entry does before its appends: record its gaps and
        fence; without data, its progress only (None). Else the coordinates of its
        appends (``mid``, ``last``), the entry marked entered."""
        for gap in plan.gaps:
            self._record_gap(explained.get(gap, gap))
        if plan.info.fence:
            self._fences += 1
        if not has_data:
            await self._progress_only(plan)
            return None
        # Data supersedes a pending progress marker: its coordinates are later.
        self._pending_marker_plan = None
        self._markers_pending = 0
        state = self._state
        mid = state.coords(plan, end_of_object=False)
        last = state.coords(plan, end_of_object=True)
        # Before the first append: an append may land and then be cancelled
        # (or fail) while waiting for its fsync; a retry must resume inside.
        state.entered(plan)
        return mid, last

    async def _progress_only(self, plan: EntryPlan) -> None:
        """An entry with nothing to append: its progress marker is written lazily."""
        self._state.applied(plan)
        self._pending_marker_plan = plan
        self._markers_pending += 1
        self._entry_done(plan.info)
        if self._markers_pending >= self.config.progress_every:
            await self._flush_marker()

    async def _flush_marker(self) -> None:
        plan = self._pending_marker_plan
        if plan is None:
            return
        coords = self._state.coords(plan, end_of_object=True)
        await self.journal.append_mirror("", 0, None, coords)
        self._pending_marker_plan = None
        self._markers_pending = 0

    def _entry_done(self, info: EntryInfo) -> None:
        if self._quarantine:
            for key, q in list(self._quarantine.items()):
                if q.seq <= info.seq:
                    log.info(
                        "mirror %s: %s applied after %d attempts", self.source, key, q.attempts
                    )
                    del self._quarantine[key]
            if not self._quarantine:
                self._quarantine_backoff.reset()
        self._entries += 1
        self._entries_behind()  # notes the moment the mirror catches up
        if info.planned:
            self._planned += 1
        n = self._entries
        self._avg_entry_bytes += (info.size - self._avg_entry_bytes) / min(n, 100)
        now = trio.current_time()
        self._rate.append((now, n))
        while self._rate and now - self._rate[0][0] > _RATE_WINDOW_S:
            self._rate.popleft()

    # ------------------------------------------------------------ catch-up

    def _catch_up_wanted(self, streak: int) -> bool:
        """Whether to look at the manifests (one LIST): never while merely following.

        Yes on the first pull, when a relayed or observed head is far ahead,
        and when ``streak`` entries in a row existed (at most every
        ``catch_up_check_interval_s``).
        """
        cfg = self.config
        last = self._last_catch_up_check
        if last is None:
            return True
        if self._known_head - self._state.next_seq + 1 >= cfg.catch_up_threshold:
            return True
        return (
            streak >= cfg.catch_up_threshold
            and trio.current_time() - last >= cfg.catch_up_check_interval_s
        )

    async def _catch_up_planned(self) -> int:
        """Far behind: plan from manifests (no header reads), prefetch, apply in order.

        One LIST of the manifest folder (newer manifests only), a few HEADs
        to find the head past the newest manifest, then a pipeline. Returns
        the entries applied; the sequential loop does the rest.
        """
        self._last_catch_up_check = trio.current_time()
        first = self._state.next_seq
        folder = manifest_prefix(self.prefix, self.source)
        after = manifest_key(self.prefix, self.source, first - 1)
        manifests: list[tuple[int, str]] = []
        for obj in await self.bucket.list(folder, start_after=after):
            try:
                _, last_seq = parse_manifest_key(obj.key, self.prefix)
            except CorruptData:
                continue  # not a manifest (a stray object in the folder)
            manifests.append((last_seq, obj.key))
        known = max((last for last, _ in manifests), default=0)

        async def search() -> int:
            head = await find_head(self.bucket, self.prefix, self.source, max(known, first - 1))
            # Measured now: replaces a relayed head that may have been wrong.
            self._known_head = head
            return head

        later: _HeadLater | None = None
        if known - first + 1 >= self.config.catch_up_threshold:
            # Far behind by the manifests alone: fetch while the head is searched.
            later = _HeadLater(search, known)
            head = known
        else:
            head = await search()
            if head - first + 1 < self.config.catch_up_threshold:
                return 0
        self._catch_ups += 1
        log.info(
            "mirror %s: %s%d entries behind (%d..%d), catching up from %d manifests",
            self.source,
            "at least " if later is not None else "",
            head - first + 1,
            first,
            head,
            len(manifests),
        )
        if self._gate is not None and manifests:
            self._backlog_manifest = await self._load_manifest(*manifests[-1])
            self._announce_backlog()
        if self.config.packs and manifests:
            packs = await list_packs(
                self.bucket, self.prefix, self.source, first, self.config.pack_max_bytes
            )
            self._packs = (
                PackReader(
                    self.bucket, self.source, packs, self.config.prefetch_bytes, self._pack_stats
                )
                if packs
                else None
            )
        try:
            applied, _ = await self._pipeline(first, head, manifests, later)
        finally:
            self._backlog_manifest = None
            self._announce_backlog()
            self._packs = None  # its bytes go with it
        return applied

    def _announce_backlog(self) -> None:
        """Tell the gate the highest priority of what this catch-up still has to apply.

        Read from the newest manifest of the backlog: a subscribed partition
        whose mirror is below the manifest's next offset has records to come
        (entries after that manifest are few: at most ``manifest_every``).
        """
        if self._gate is None:
            return
        best: Priority | None = None
        m = self._backlog_manifest
        if m is not None:
            for (topic, p), nxt in m.next_offsets.items():
                prio = self._priorities.get(topic, Priority.NORMAL)
                if best is not None and Lane(prio).rank >= Lane(best).rank:
                    continue
                if self._subscribed(topic) and (
                    self.journal.next_offset(f"{self.source}.{topic}", p) < nxt
                ):
                    best = prio
        self._backlog_priority = best
        self._gate.announce(self.source, best)

    async def _pipeline(
        self,
        first: int,
        last: int | None,
        manifests: Sequence[tuple[int, str]],
        later: _HeadLater | None = None,
    ) -> tuple[int, bool]:
        """Fetch entries ahead, in parallel, and apply them strictly in seq order.

        ``last`` bounds a catch-up (raised to the head ``later`` finds, when
        given: its search runs beside the fetches); ``None`` follows the log: entries up to
        the known head are fetched ahead, and a few beyond it while entries
        keep appearing (see :meth:`_frontier`). Ends at the first entry that
        does not exist (returns ``(applied, True)``), after ``last``, or when
        a follow finds the mirror far behind (``(applied, False)``); later
        fetches still in flight are cancelled. Errors surface in seq order.
        """
        cfg = self.config
        send, recv = trio.open_memory_channel[_Slot](math.inf)
        count = trio.Semaphore(cfg.prefetch_objects)
        budget = _ByteBudget(cfg.prefetch_bytes)
        applied = 0
        streak = 0
        missing = False
        error: Exception | None = None
        self._found_now = 0
        async with trio.open_nursery() as nursery:
            if later is not None:
                nursery.start_soon(later.run)
            nursery.start_soon(
                self._launch, first, last, manifests, send, count, budget, nursery, later
            )
            try:
                async for slot in recv:
                    if last is not None:
                        self._status = "catching-up"
                    elif not self._quarantine:
                        # a retry of a quarantined entry stays "quarantined"
                        # until the entry applies
                        self._status = "following"
                    await wait_set(slot.done)
                    # Its turn has come: the next fetch starts while it is applied
                    # (its bytes stay in the budget until then). Held until the
                    # journal's write returned, the slot kept a GET of the window
                    # idle for every append, in seq order, one after the other.
                    count.release()
                    try:
                        if isinstance(slot.error, NotFound):
                            # Nothing at this seq (yet), or it was deleted:
                            # the caller decides (the GC boundary says which).
                            missing = True
                            break
                        self._denial.cleared()
                        await self._apply_slot(slot)
                        if self._packs is not None:
                            self._packs.applied(slot.seq)
                        applied += 1
                        streak += 1
                        if self._backlog_manifest is not None:
                            self._announce_backlog()
                    finally:
                        budget.release(slot.cost)
                    if last is None and self._catch_up_wanted(streak):
                        # Entry after entry exists: far behind, plan from manifests.
                        break
            except Exception as exc:  # noqa: BLE001 - re-raised below, outside the nursery
                error = exc
            # Cancel fetches ahead before the channel closes under the launcher.
            nursery.cancel_scope.cancel()
        recv.close()
        if last is None:
            self._found_prev = self._found_now
        self._probe_misses += max(0, self._not_found_now - (1 if missing else 0))
        self._not_found_now = 0
        if error is not None:
            raise error
        return applied, missing

    def _frontier(self, first: int) -> int:
        """Following: the highest seq worth asking for now.

        Every entry up to the known head (relayed, or seen), and past it as
        many as are still expected from the previous pull's count, or as
        this pull found so far (slow start: each entry found lets one more
        probe out), at least one (the next seq). An idle source costs one
        GET per poll, one that writes an entry between polls the same two
        GETs per pull as one at a time; a source that writes several
        entries per round trip (a slow link) gets them asked for together
        instead of one round trip each. Bounded by ``prefetch_objects``;
        every probe past the end is a 404 (counted in ``probe_misses``).
        """
        found = self._found_now
        ahead = max(1, self._found_prev - found, found)
        return max(self._known_head, first - 1) + min(self.config.prefetch_objects, ahead)

    async def _apply_slot(self, slot: _Slot) -> None:
        """Apply a prefetched entry; one planned from a bad manifest is read again by header.

        A manifest is a hint: if the object disagrees with it (size, CRC,
        epoch, offsets), the entry is fetched again from its own header, and
        only a failure then quarantines it.
        """
        try:
            if slot.error is not None:
                raise slot.error
            assert slot.fetched is not None
            await self._apply(slot.fetched)
        except (CorruptData, _Unconfirmed) as exc:
            if not slot.planned:
                raise
            log.warning(
                "mirror %s: entry %d disagrees with its manifest (%s); reading its header",
                self.source,
                slot.seq,
                exc,
            )
            await self._apply(await self._fetch(await self._prepare_unplanned(slot.seq)))

    async def _launch(
        self,
        first: int,
        last: int | None,
        manifests: Sequence[tuple[int, str]],
        send: trio.MemorySendChannel[_Slot],
        count: trio.Semaphore,
        budget: _ByteBudget,
        nursery: trio.Nursery,
        later: _HeadLater | None = None,
    ) -> None:
        """Start fetches in seq order, as far ahead as the count (and the frontier) allow.

        Each fetch runs in its own task: header reads, GETs and block
        decoding (in worker threads) of several entries overlap. The byte
        budget is taken in seq order (each slot after the one before), so
        later entries can never hold the bytes an earlier one waits for.
        """
        limit = self.config.prefetch_objects
        previous = trio.Event()
        previous.set()
        ahead = _ManifestsAhead(self._load_manifest, manifests, nursery)
        async with send:
            mi = 0
            seq = first
            while True:
                if last is not None and seq > last and later is not None:
                    # At the newest manifest's seq: the rest is up to the head.
                    await wait_set(later.found)
                    if later.error is not None:
                        await count.acquire()  # the consumer releases it, as for any slot
                        slot = _Slot(seq)
                        slot.error = later.error
                        slot.done.set()
                        send.send_nowait(slot)  # in seq order, after the entries before
                        return
                    last, later = max(last, later.head), None
                if last is not None and seq > last:
                    break
                if last is None:
                    while seq > self._frontier(first):
                        self._frontier_moved = trio.Event()
                        await self._frontier_moved.wait()
                await count.acquire()
                slot = _Slot(seq)
                plan: _FetchPlan | None = None
                try:
                    while mi < len(manifests) and manifests[mi][0] < seq:
                        mi += 1
                    if mi < len(manifests):
                        m = await ahead.get(mi)
                        if m is not None and m.first_seq <= seq <= m.last_seq:
                            entry = m.entries[seq - m.first_seq]
                            key = log_key(self.prefix, self.source, seq)
                            slot.planned = True
                            info = EntryInfo.from_manifest(key, m.region, entry)
                            self._saw_size(info.size)
                            plan = self._plan_fetch(info, b"")
                            if self._packs is not None:
                                plan.pack = self._packs.covering(seq)
                except Exception as exc:  # noqa: BLE001 - delivered in order by the consumer
                    slot.error = exc
                    slot.done.set()
                    send.send_nowait(slot)  # the channel is unbounded
                    return
                self._prefetch_peak_objects = max(self._prefetch_peak_objects, limit - count.value)
                if last is None:
                    self._polls += 1
                send.send_nowait(slot)  # the channel is unbounded
                if plan is None or not self._fetch_now(slot, plan, previous, budget, nursery):
                    nursery.start_soon(
                        self._fetch_into, slot, plan, previous, budget, nursery, last is not None
                    )
                previous = slot.budgeted
                seq += 1

    async def _fetch_into(
        self,
        slot: _Slot,
        plan: _FetchPlan | None,
        previous: trio.Event,
        budget: _ByteBudget,
        nursery: trio.Nursery,
        catching_up: bool = False,
    ) -> None:
        """Read the header (unless planned), take the budget in turn, fetch and decode."""
        self._in_flight += 1
        self._in_flight_peak = max(self._in_flight_peak, self._in_flight)
        try:
            if plan is None:
                plan = await self._prepare_unplanned(slot.seq, catching_up=catching_up)
                self._found_now += 1
                self._frontier_moved.set()
            await wait_set(previous)
            await budget.acquire(plan.cost)
            slot.cost = plan.cost
            slot.budgeted.set()
            self._prefetch_peak_bytes = max(self._prefetch_peak_bytes, budget.peak)
            if self._gate is not None and self._gate.held(self.source):
                await self._wait_turn()
            slot.fetched = await self._fetch(plan, nursery)
        except Exception as exc:  # noqa: BLE001 - delivered in order by the consumer
            slot.error = exc
            if isinstance(exc, NotFound):
                self._not_found_now += 1
            # Hand the budget on in order all the same.
            await wait_set(previous)
        finally:
            self._in_flight -= 1
            slot.budgeted.set()
            slot.done.set()

    def _fetch_now(
        self,
        slot: _Slot,
        plan: _FetchPlan,
        previous: trio.Event,
        budget: _ByteBudget,
        nursery: trio.Nursery,
    ) -> bool:
        """Do :meth:`_fetch_into`'s work here if none of it would wait; False: it must.

        A catch-up's small entries are mostly in packs already fetched: their
        bytes are at hand and decoded faster than a task per entry is
        started and scheduled (a restored gateway replays thousands of them).
        Only then: the budget's turn has come and it has room, the priority
        gate does not hold the source, the blocks decode on the loop, and
        the pack holds the entry. A body that disagrees with its manifest
        goes the usual way (the entry's own GET) in a task.
        """
        packs, pack = self._packs, plan.pack
        if (
            packs is None
            or pack is None
            or not plan.ranges
            or not previous.is_set()
            or not budget.fits(plan.cost)
            or (self._gate is not None and self._gate.held(self.source))
            or self._decodes_in_thread(plan)
        ):
            return False
        body = packs.body_now(pack, plan.info.seq, nursery)
        if body is None:
            return False
        budget.take(plan.cost)
        slot.cost = plan.cost
        slot.budgeted.set()
        self._prefetch_peak_bytes = max(self._prefetch_peak_bytes, budget.peak)
        try:
            slot.fetched = self._decode_now(plan, body)
        except CorruptData as exc:
            packs.rejected(pack, plan.info.seq, str(exc))
            nursery.start_soon(self._fetch_own_into, slot, plan)
            return True
        except Exception as exc:  # noqa: BLE001 - delivered in order by the consumer
            slot.error = exc
        slot.done.set()
        return True

    async def _fetch_own_into(self, slot: _Slot, plan: _FetchPlan) -> None:
        """:meth:`_fetch_own` for a slot whose budget is already taken."""
        self._in_flight += 1
        self._in_flight_peak = max(self._in_flight_peak, self._in_flight)
        try:
            slot.fetched = await self._fetch_own(plan)
        except Exception as exc:  # noqa: BLE001 - delivered in order by the consumer
            slot.error = exc
        finally:
            self._in_flight -= 1
            slot.done.set()

    async def _wait_turn(self) -> None:
        """Hold this fetch while another source catches up a higher priority."""
        assert self._gate is not None
        self._held_now += 1
        self._holds += 1
        t0 = time.monotonic()
        try:
            await self._gate.wait_turn(self.source)
        finally:
            self._held_now -= 1
            self._held_s += time.monotonic() - t0

    async def _load_manifest(self, last_seq: int, key: str) -> Manifest | None:
        """A manifest of the source, or ``None`` (with a warning) when it cannot be used."""
        res = await self.bucket.get(key)
        self._bytes_fetched += len(res.data)
        try:
            return Manifest.decode(res.data, where=key, region=self.source, last_seq=last_seq)
        except CorruptData as exc:
            log.warning(
                "mirror %s: ignoring manifest (%s); reading headers instead", self.source, exc
            )
            return None

    # ------------------------------------------------------------ records

    def _record_gap(self, gap: Gap) -> None:
        self._gaps.append(gap)
        if gap.kind is GapKind.START:
            log.info("mirror %s: %s", self.source, gap.describe())
        elif gap.kind is GapKind.DROPPED:
            assert gap.topic is not None
            records = (gap.end_offset or 0) - (gap.first_offset or 0)
            self._dropped_records[gap.topic] = self._dropped_records.get(gap.topic, 0) + records
            log.warning("mirror %s: %s", self.source, gap.describe())
        elif self.config.gap_policy is GapPolicy.SKIP:
            log.warning("mirror %s: SKIPPED %s", self.source, gap.describe())
        else:
            log.error("mirror %s: %s", self.source, gap.describe())

    def _quarantined(self, seq: int, exc: CorruptData) -> None:
        # Keyed by the bad object: the entry, or e.g. the GC boundary document.
        key = exc.where or log_key(self.prefix, self.source, seq)
        now = self._clock()
        self._quarantine_events += 1
        old = self._quarantine.get(key)
        if old is None:
            log.error(
                "mirror %s: QUARANTINED entry %d (%s): %s; nothing of it was applied, "
                "retrying with backoff",
                self.source,
                seq,
                key,
                exc,
            )
            self._quarantine[key] = QuarantinedEntry(key, seq, str(exc), 1, now, now)
        else:
            self._quarantine[key] = QuarantinedEntry(
                key, seq, str(exc), old.attempts + 1, old.first_seen_ms, now
            )

    async def _publish_cursor(self, *, force: bool = False) -> None:
        """Publish how far the mirror is durable, every ``cursor_interval_s`` (if it moved)."""
        interval = self.config.cursor_interval_s
        if not interval:
            return
        now = trio.current_time()
        if not force and now < self._next_cursor_at:
            return
        self._next_cursor_at = now + interval
        progress = self.journal.source_progress().get(self.source)
        if progress is None:
            return
        through = progress.seq if progress.end_of_object else progress.seq - 1
        if through <= self._published_through:
            return
        # GC may delete what a cursor covers: it must be on disk first.
        await self.journal.flush()
        cursor = Cursor(self.source, self.local_region, through, progress.epoch, self._clock())
        try:
            await publish_cursor(self.bucket, self.prefix, cursor)
        except BucketUnavailable as exc:
            self._next_cursor_at = now  # try again after the next poll
            log.info("mirror %s: cursor not published (%s)", self.source, exc)
            return
        except AccessDenied as exc:
            # The pull that just worked shows the bucket reads fine: a policy
            # that forbids writing cursors/ only holds up the source's GC.
            # Tried again at the next interval.
            log.warning(
                "mirror %s: cursor not published, refused (%s): %s -- what to do: %s",
                self.source,
                exc.code,
                exc,
                exc.action,
            )
            return
        self._published_through = through


def _open_blocks(
    key: str,
    wanted: Sequence[BlockIndex],
    pieces: Sequence[tuple[int, bytes]],
    opener: logobject.BlockOpener | None = None,
) -> dict[BlockIndex, bytes]:
    """Check and open every wanted block, without decompressing it (pure; may run in a
    worker thread): its length and CRC as shipped, its tag when sealed, then the
    opened bytes' index rules and zstd frame header (``atrest.check_stored_block``)."""
    out: dict[BlockIndex, bytes] = {}
    for b in wanted:
        stored = logobject.slice_block(b, pieces, where=key)
        opened = bytes(logobject.open_block(b, stored, where=key, opener=opener))
        atrest.check_stored_block(b, opened, where=key)
        out[b] = opened
    return out


def _batches_of(key: str, blocks: dict[BlockIndex, bytes]) -> dict[BlockIndex, list[RecordBatch]]:
    """The batches of opened blocks (:func:`_open_blocks`), decompressed and checked."""
    out: dict[BlockIndex, list[RecordBatch]] = {}
    for b, stored in blocks.items():
        opened = atrest.check_stored_block(b, stored, where=key)
        raw = logobject.decode_block(opened, stored, where=key)
        out[b] = list(logobject.iter_block_batches(b, raw, where=key))
    return out


def _decode_blocks(
    key: str,
    wanted: Sequence[BlockIndex],
    pieces: Sequence[tuple[int, bytes]],
    opener: logobject.BlockOpener | None = None,
) -> dict[BlockIndex, list[RecordBatch]]:
    """Check, open and decode every wanted block (pure; may run in a worker thread)."""
    out: dict[BlockIndex, list[RecordBatch]] = {}
    for b in wanted:
        stored = logobject.slice_block(b, pieces, where=key)
        raw = logobject.decode_block(b, stored, where=key, opener=opener)
        out[b] = list(logobject.iter_block_batches(b, raw, where=key))
    return out
