"""The tailer's decisions, sans-IO: what an entry of a source log means for the mirror.

:class:`SourceState` follows one source region's log for one reader. The I/O
side (:class:`~edge_gateway.mirror.Tailer`) feeds it what it learned about
the next entry (an :class:`EntryInfo`, from the object's header or from a
manifest) and the mirror's per-partition next offsets; it answers with an
:class:`EntryPlan` — skip the entry, record progress only, or append these
blocks — and, once the blocks are fetched and decoded, with the exact list of
:class:`MirrorAppend` to write. Every check that needs no bytes lives here,
so it is tested without a bucket or a journal.

Invariants (``docs/mirroring.md`` has the protocol):

* entries are applied strictly in seq order, each exactly once;
* an entry whose epoch is lower than one already accepted is skipped (a
  zombie writer's), but still advances the position;
* a writer's first entry in a new epoch is its fence, so a data entry that
  raises the epoch right after an entry this reader accepted is impossible
  and refused;
* per mirror partition, offsets continue the local partition exactly; the
  only offsets below it that are tolerated are those of the entry being
  resumed after a crash (duplicates, dropped whole batches at a time);
* offsets jumping forward are *gaps*: data the source no longer has. Where a
  partition (or the whole mirror) starts is not a gap of the mirror, and is
  only recorded.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from edge_gateway.errors import CorruptData, EdgeGatewayError, InvalidInput
from edge_gateway.format.batch import RecordBatch
from edge_gateway.format.entry import SourceCoords
from edge_gateway.format.logobject import BlockIndex, GapRange, LogObjectHeader
from edge_gateway.format.manifest import ManifestEntry
from edge_gateway.names import mirror_topic


class GapPolicy(enum.StrEnum):
    """What a tailer does when the source no longer has data the mirror needs.

    * ``fail`` (default): stop mirroring this source with :class:`SourceGap`;
      an operator decides (the mirror stays exact up to the gap).
    * ``skip``: continue at the earliest data available, with the gap's exact
      range logged and kept in the tailer's statistics.
    """

    FAIL = "fail"
    SKIP = "skip"


class GapKind(enum.StrEnum):
    """Why offsets or entries are missing from a mirror."""

    #: Log entries were deleted (GC) before this reader applied them.
    LOG = "log"
    #: A partition's offsets jump forward in the source log.
    PARTITION = "partition"
    #: Where the mirror of a source, or of a newly seen partition, starts: the
    #: earlier data was gone (or not subscribed) before this mirror began.
    #: Not a loss of this mirror, so no policy applies; it is still recorded.
    START = "start"
    #: The source dropped these offsets before shipping them (a drop-oldest
    #: topic over its disk budget) and says so in its log (a gap marker): the
    #: exact range, declared by the source, so no policy applies; recorded and
    #: reported (WARNING, metrics, status).
    DROPPED = "dropped"


@dataclass(frozen=True, slots=True)
class Gap:
    """A range of the source that the mirror does not hold.

    For ``LOG`` gaps ``first_seq..last_seq`` are the deleted entries
    (inclusive). For ``PARTITION`` and ``START`` gaps of a partition, both
    seqs name the entry where the jump showed and
    ``[first_offset, end_offset)`` are the missing offsets of ``topic`` (the
    source topic) and ``partition``.
    """

    kind: GapKind
    source: str
    first_seq: int
    last_seq: int
    topic: str | None = None
    partition: int | None = None
    first_offset: int | None = None
    end_offset: int | None = None

    def describe(self) -> str:
        """One line for logs and error messages."""
        if self.topic is None:
            return (
                f"{self.kind} gap in region {self.source}'s log: entries "
                f"{self.first_seq}..{self.last_seq} are gone"
            )
        if self.kind is GapKind.DROPPED:
            return (
                f"dropped gap in {self.source}:{self.topic}/{self.partition}: offsets "
                f"{self.first_offset}..{(self.end_offset or 0) - 1} "
                f"({(self.end_offset or 0) - (self.first_offset or 0)} records) were dropped "
                f"by the source before they were shipped (on_full = drop-oldest; gap marker "
                f"in entry {self.first_seq})"
            )
        return (
            f"{self.kind} gap in {self.source}:{self.topic}/{self.partition}: offsets "
            f"{self.first_offset}..{(self.end_offset or 0) - 1} are missing "
            f"(seen at entry {self.first_seq})"
        )


class SourceGap(EdgeGatewayError):
    """The source no longer has data this mirror needs, and the gap policy is ``fail``.

    The tailer of this source stops (its ``run`` raises this); other sources
    go on. Nothing of the entry that showed the gap was applied. Retrying
    cannot help: the data is gone. An operator either accepts the loss
    (``gap_policy = "skip"``, and restarts) or rebuilds the mirror.
    """

    def __init__(self, gap: Gap) -> None:
        self.gap = gap
        super().__init__(
            f"mirror of region {gap.source} stopped: {gap.describe()}; the gap policy is "
            "'fail' (set gap_policy='skip' to continue from the earliest data available)"
        )


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """What a reader knows of a log entry before fetching its blocks."""

    key: str
    seq: int
    epoch: int
    region: str
    fence: bool
    #: Size of the whole object (the end of its last block).
    size: int
    header_length: int
    blocks: tuple[BlockIndex, ...]
    #: True when the info came from a manifest (no header was read).
    planned: bool = False
    #: An encrypted entry: the id of its key, and the LSN range its blocks are bound to.
    key_id: str | None = None
    first_lsn: int = 0
    last_lsn: int = 0
    #: Gap markers: offsets the source dropped unshipped (version 3 entries).
    gaps: tuple[GapRange, ...] = ()
    #: The object has the NULLS flag (a batch in it holds a null value).
    nulls: bool = False

    @property
    def total_length(self) -> int:
        """Same as :attr:`size`; lets :func:`~edge_gateway.format.logobject.plan_ranges` take it."""
        return self.size

    @classmethod
    def from_header(cls, key: str, header: LogObjectHeader) -> EntryInfo:
        return cls(
            key,
            header.seq,
            header.epoch,
            header.region,
            header.is_fence,
            header.total_length,
            header.header_length,
            header.blocks,
            key_id=header.key_id,
            first_lsn=header.first_lsn,
            last_lsn=header.last_lsn,
            gaps=header.gaps,
            nulls=header.has_nulls,
        )

    @classmethod
    def from_manifest(cls, key: str, region: str, entry: ManifestEntry) -> EntryInfo:
        return cls(
            key,
            entry.seq,
            entry.epoch,
            region,
            entry.fence,
            entry.size,
            entry.header_length,
            entry.blocks,
            planned=True,
            key_id=entry.key_id,
            first_lsn=entry.first_lsn,
            last_lsn=entry.last_lsn,
            gaps=entry.gaps,
            nulls=entry.nulls,
        )


class Action(enum.Enum):
    """What applying an entry amounts to."""

    #: Append the planned blocks' batches.
    APPLY = "apply"
    #: Nothing to append (a fence, nothing subscribed, everything already
    #: mirrored): only the position advances.
    PROGRESS = "progress"
    #: The entry's epoch is below one already accepted (a zombie's): skipped.
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class BlockPlan:
    """A subscribed block of an entry and how to append it."""

    index: BlockIndex
    #: The local mirror topic (``<source>.<topic>``).
    topic: str
    #: Batches that end below this offset are already in the mirror (an
    #: entry resumed after a crash) and are dropped.
    skip_below: int
    #: The block's first new batch skips forward over a recorded gap.
    allow_gap: bool


@dataclass(frozen=True, slots=True)
class EntryPlan:
    """The decision for one entry (see :meth:`SourceState.plan`)."""

    info: EntryInfo
    action: Action
    blocks: tuple[BlockPlan, ...] = ()
    #: Gaps this entry shows (START or PARTITION), in block order.
    gaps: tuple[Gap, ...] = ()
    #: The entry is the one a crash interrupted: some of it is applied already.
    resumed: bool = False
    #: Gap markers whose jump no block of this entry makes: ((topic, partition),
    #: offset after the gap) for :meth:`SourceState.applied` to remember.
    declared: tuple[tuple[tuple[str, int], int], ...] = ()

    @property
    def whole_blocks(self) -> bool:
        """Every planned block is new as a whole, so it may be kept as one block entry.

        False when a crash interrupted this entry inside a block (a block
        whose first batches are in the mirror already): its new batches are
        then picked out per batch (:meth:`SourceState.assemble`), as before.
        """
        return all(bp.skip_below <= bp.index.first_offset for bp in self.blocks)

    def block_appends(self, blocks: Mapping[BlockIndex, bytes]) -> list[BlockAppend]:
        """The block entries of a :attr:`whole_blocks` plan, from its blocks' stored bytes
        (opened, checked: ``blocks`` maps each planned block to them)."""
        if not self.whole_blocks:
            raise InvalidInput(f"entry {self.info.seq} resumes inside a block")
        out: list[BlockAppend] = []
        for bp in self.blocks:
            stored = blocks.get(bp.index)
            if stored is None:
                raise InvalidInput(
                    f"no stored bytes given for block {bp.index.topic}/{bp.index.partition}"
                )
            out.append(BlockAppend(bp.topic, bp.index, stored, bp.allow_gap))
        return out

    @property
    def partition_gaps(self) -> tuple[Gap, ...]:
        """The gaps the gap policy decides on (START gaps are not losses)."""
        return tuple(g for g in self.gaps if g.kind is GapKind.PARTITION)


@dataclass(frozen=True, slots=True)
class BlockAppend:
    """One fetched block to append to a mirror partition as one block entry, as shipped."""

    #: The local mirror topic (``<source>.<topic>``).
    topic: str
    #: The block's index entry in the source object (its partition, offsets, counts).
    index: BlockIndex
    #: Its stored bytes, opened if the object was encrypted.
    stored: bytes
    #: The block skips forward over a recorded gap.
    allow_gap: bool


@dataclass(frozen=True, slots=True)
class MirrorAppend:
    """One batch to append to a mirror partition, with its source offsets."""

    topic: str
    partition: int
    batch: bytes
    base_offset: int
    count: int
    allow_gap: bool


class SourceState:
    """Where a reader stands in one source region's log, and the rules for moving on.

    Built from the journal's last recorded coordinates for the source
    (``Journal.source_progress()``): ``None`` for a source never mirrored
    (then :meth:`start_at` says where its log begins). ``subscribed(topic)``
    says whether a source topic is mirrored.
    """

    def __init__(
        self,
        source: str,
        subscribed: Callable[[str], bool],
        progress: SourceCoords | None = None,
    ) -> None:
        self.source = source
        self._subscribed = subscribed
        #: source topic -> its mirror topic's name (checked and built once)
        self._local_topics: dict[str, str] = {}
        #: (source topic, partition) -> the offset after a gap marker already
        #: applied whose jump the mirror partition has not made yet (its next
        #: append skips to here). In memory: see docs/mirroring.md, "Dropped gaps".
        self._declared: dict[tuple[str, int], int] = {}
        #: Nothing from this source was ever applied (no progress recorded).
        self.fresh = progress is None
        if progress is None:
            self.next_seq = 0  # unknown until start_at()
            self.accepted_epoch = 0
            self.resume_inside = False
            self.anchored = False
        else:
            if progress.region != source:
                raise InvalidInput(f"progress of region {progress.region!r} given for {source!r}")
            if progress.seq < 0 or progress.epoch < 0:
                raise InvalidInput(f"impossible progress {progress!r}")
            self.next_seq = progress.seq + 1 if progress.end_of_object else progress.seq
            #: Highest epoch accepted so far (the journal records it with progress).
            self.accepted_epoch = progress.epoch
            #: The entry at ``next_seq`` is partly applied (a crash between its batches).
            self.resume_inside = not progress.end_of_object
            #: The entry before ``next_seq`` was processed by this reader, so
            #: an epoch change at ``next_seq`` must come with a fence.
            #: (Epoch 0 is recorded after a gap: nothing is known then.)
            self.anchored = progress.seq > 0 and progress.epoch > 0

    @property
    def started(self) -> bool:
        return self.next_seq > 0

    def _local_topic(self, topic: str) -> str:
        local = self._local_topics.get(topic)
        if local is None:
            local = self._local_topics[topic] = mirror_topic(self.source, topic)
        return local

    def subscribed(self, topic: str) -> bool:
        return self._subscribed(topic)

    def start_at(self, seq: int) -> Gap | None:
        """Position a fresh reader at ``seq``, the oldest entry the log still has.

        Returns the START gap when earlier entries are gone (recorded, not a
        loss of this mirror).
        """
        if self.started:
            raise InvalidInput(f"reader of {self.source} already started at {self.next_seq}")
        if seq < 1:
            raise InvalidInput(f"log seqs start at 1, not {seq}")
        self.next_seq = seq
        self.anchored = False
        if seq > 1:
            return Gap(GapKind.START, self.source, 1, seq - 1)
        return None

    def log_gap(self, oldest: int) -> Gap:
        """The gap if the reader must skip to ``oldest`` because entries below it are deleted.

        Does not move the reader; call :meth:`skip_to` to accept the gap.
        """
        if oldest <= self.next_seq:
            raise InvalidInput(f"no gap: next seq {self.next_seq}, oldest available {oldest}")
        kind = GapKind.START if self.fresh else GapKind.LOG
        return Gap(kind, self.source, self.next_seq, oldest - 1)

    def skip_to(self, oldest: int) -> SourceCoords:
        """Move past deleted entries to ``oldest`` (a gap the policy accepted).

        Returns the coordinates to record in the journal so a restart starts
        at ``oldest`` too. The accepted epoch is forgotten (recorded as 0):
        the fence of the epoch that follows the gap may be among the deleted
        entries, so the next entry's epoch cannot be checked against the
        entries before the gap.
        """
        if oldest <= self.next_seq:
            raise InvalidInput(f"cannot skip back from {self.next_seq} to {oldest}")
        self.next_seq = oldest
        self.accepted_epoch = 0
        self.resume_inside = False
        self.anchored = False
        return SourceCoords(self.source, oldest - 1, 0, True)

    def plan(self, info: EntryInfo, local_next: Callable[[str, int], int]) -> EntryPlan:
        """Decide what to do with the entry at :attr:`next_seq`.

        ``local_next(mirror_topic, partition)`` is the mirror partition's next
        offset (0 if it never held data). Raises :class:`CorruptData` for an
        entry that cannot belong at this place of the log; the state is
        unchanged then.
        """
        where = info.key
        if not self.started:
            raise InvalidInput("start_at() first: the reader does not know where the log begins")
        if info.seq != self.next_seq:
            raise CorruptData(f"entry claims seq {info.seq}, expected {self.next_seq}", where=where)
        if info.region != self.source:
            raise CorruptData(
                f"entry of region {info.region!r} in the log of {self.source!r}", where=where
            )
        if info.epoch == 0:
            raise CorruptData("impossible epoch 0 (writers claim epochs from 1)", where=where)
        if self.resume_inside and info.epoch != self.accepted_epoch:
            raise CorruptData(
                f"entry was partly applied with epoch {self.accepted_epoch} and now has "
                f"epoch {info.epoch}: log entries are immutable",
                where=where,
            )
        if info.epoch < self.accepted_epoch:
            return EntryPlan(info, Action.STALE)
        if (
            info.epoch > self.accepted_epoch
            and not info.fence
            and self.anchored
            and self.accepted_epoch > 0
        ):
            raise CorruptData(
                f"impossible epoch: raised from {self.accepted_epoch} to {info.epoch} by a data "
                "entry (a writer's first entry in an epoch is its fence)",
                where=where,
            )
        if info.fence:
            return EntryPlan(info, Action.PROGRESS, resumed=self.resume_inside)
        blocks: list[BlockPlan] = []
        gaps: list[Gap] = []
        expected: dict[tuple[str, int], int] = {}
        #: partitions whose next block may jump to a declared gap's end
        declared: dict[tuple[str, int], int] = {}
        for g in info.gaps:
            if not self._subscribed(g.topic):
                continue
            key = (g.topic, g.partition)
            exp = expected.get(key)
            if exp is None:
                exp = max(
                    local_next(self._local_topic(g.topic), g.partition),
                    self._declared.get(key, 0),
                )
            if g.last_offset < exp:
                continue  # applied before (a resumed entry)
            if g.first_offset > exp > 0:
                gaps.append(
                    Gap(
                        GapKind.PARTITION,
                        self.source,
                        info.seq,
                        info.seq,
                        g.topic,
                        g.partition,
                        exp,
                        g.first_offset,
                    )
                )
            gaps.append(
                Gap(
                    GapKind.DROPPED,
                    self.source,
                    info.seq,
                    info.seq,
                    g.topic,
                    g.partition,
                    max(exp, g.first_offset),
                    g.last_offset + 1,
                )
            )
            expected[key] = declared[key] = g.last_offset + 1
        for b in info.blocks:
            if not self._subscribed(b.topic):
                continue
            local = self._local_topic(b.topic)
            key = (b.topic, b.partition)
            exp = expected.get(key)
            first_here = exp is None
            if exp is None:
                exp = local_next(local, b.partition)
                # A gap marker of an earlier entry: the mirror jumps to its end.
                end = self._declared.get(key)
                if end is not None and exp < end:
                    exp = end
                    declared[key] = end
            what = f"{b.topic}/{b.partition} offsets {b.first_offset}..{b.last_offset}"
            allow_gap = False
            if key in declared and b.first_offset == declared.pop(key):
                # The jump a gap marker declared (recorded as a DROPPED gap).
                allow_gap = local_next(local, b.partition) < b.first_offset
            elif b.first_offset > exp:
                # A partition the mirror never held starts wherever the log
                # first shows it; any other jump is data the source lost.
                start = first_here and exp == 0
                gaps.append(
                    Gap(
                        GapKind.START if start else GapKind.PARTITION,
                        self.source,
                        info.seq,
                        info.seq,
                        b.topic,
                        b.partition,
                        exp,
                        b.first_offset,
                    )
                )
                allow_gap = True
            elif b.last_offset < exp:
                if not self.resume_inside:
                    raise CorruptData(
                        f"{what} go backwards: the mirror already holds up to {exp - 1}",
                        where=where,
                    )
                expected[key] = exp  # applied before the crash: nothing to fetch
                continue
            elif b.first_offset < exp and not self.resume_inside:
                raise CorruptData(
                    f"{what} overlap the mirror, which holds up to {exp - 1}", where=where
                )
            blocks.append(BlockPlan(b, local, exp, allow_gap))
            expected[key] = b.last_offset + 1
        action = Action.APPLY if blocks else Action.PROGRESS
        return EntryPlan(
            info,
            action,
            tuple(blocks),
            tuple(gaps),
            resumed=self.resume_inside,
            declared=tuple(declared.items()),
        )

    def assemble(
        self, plan: EntryPlan, batches: Mapping[BlockIndex, Sequence[RecordBatch]]
    ) -> tuple[list[MirrorAppend], int]:
        """The appends for ``plan`` from its blocks' decoded batches, and the duplicates dropped.

        ``batches`` maps each planned block to its batches (checked by
        ``iter_block_batches`` against the index). A batch that straddles the
        point where a crash interrupted the entry cannot come from the same
        entry and raises :class:`CorruptData`.
        """
        out: list[MirrorAppend] = []
        dropped = 0
        for bp in plan.blocks:
            got = batches.get(bp.index)
            if got is None:
                raise InvalidInput(
                    f"no batches given for block {bp.index.topic}/{bp.index.partition}"
                )
            first = True
            for batch in got:
                if batch.next_offset <= bp.skip_below:
                    dropped += 1
                    continue
                if batch.base_offset < bp.skip_below:
                    raise CorruptData(
                        f"batch {batch.base_offset}..{batch.next_offset - 1} of "
                        f"{bp.index.topic}/{bp.index.partition} straddles offset "
                        f"{bp.skip_below}, where this entry's application was interrupted",
                        where=plan.info.key,
                    )
                out.append(
                    MirrorAppend(
                        bp.topic,
                        bp.index.partition,
                        batch.raw,
                        batch.base_offset,
                        batch.count,
                        bp.allow_gap and first,
                    )
                )
                first = False
        return out, dropped

    def coords(self, plan: EntryPlan, *, end_of_object: bool) -> SourceCoords:
        """The source coordinates to record with an append (or marker) of ``plan``.

        The epoch recorded is the highest accepted, so a restart keeps
        refusing what this reader refused (a stale entry records the
        accepted epoch, not its own).
        """
        epoch = max(self.accepted_epoch, plan.info.epoch)
        return SourceCoords(self.source, plan.info.seq, epoch, end_of_object)

    def entered(self, plan: EntryPlan) -> None:
        """Some of ``plan``'s appends are in the journal: a retry resumes inside it."""
        self.accepted_epoch = max(self.accepted_epoch, plan.info.epoch)
        self.resume_inside = True
        self.fresh = False

    def applied(self, plan: EntryPlan) -> None:
        """All of ``plan`` is in the journal: move to the next entry."""
        if plan.info.seq != self.next_seq:
            raise InvalidInput(f"applied seq {plan.info.seq}, expected {self.next_seq}")
        if plan.action is not Action.STALE:
            self.accepted_epoch = max(self.accepted_epoch, plan.info.epoch)
            for key, end in plan.declared:
                self._declared[key] = max(self._declared.get(key, 0), end)
            for bp in plan.blocks:
                self._declared.pop((bp.index.topic, bp.index.partition), None)
        self.next_seq = plan.info.seq + 1
        self.resume_inside = False
        self.anchored = True
        self.fresh = False

    def position(self) -> SourceCoords | None:
        """Coordinates of the last entry fully processed (``None`` before any)."""
        if self.fresh or not self.started:
            return None
        if self.resume_inside:
            return SourceCoords(self.source, self.next_seq, self.accepted_epoch, False)
        return SourceCoords(self.source, self.next_seq - 1, self.accepted_epoch, True)


class PollSchedule:
    """Idle polling: ``base_s`` while data flows, then back off by ``factor`` up to ``max_s``.

    The first ``hold`` polls after new data stay at ``base_s``: a source that
    ships an object every few hundred milliseconds leaves empty polls between
    its objects, and backing off on those would add up to one doubled
    interval to the latency of every object. Only a source that stays quiet
    longer than that is idle, and polled less and less often.
    """

    def __init__(self, base_s: float, max_s: float, factor: float = 2.0, hold: int = 0) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self.factor = factor
        self.hold = hold
        self.current_s = base_s
        self._since_data = 0

    def idle(self) -> float:
        """The wait before the next poll after one that found nothing; backs off."""
        self._since_data += 1
        if self._since_data <= self.hold:
            return self.base_s
        delay = self.current_s
        self.current_s = min(self.max_s, self.current_s * self.factor)
        return delay

    def reset(self) -> None:
        """New data arrived: poll at the base interval again."""
        self.current_s = self.base_s
        self._since_data = 0
