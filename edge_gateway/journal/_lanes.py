"""The journals of one gateway, one per lane, behind one face (``docs/journal.md``, "Lanes").

Appends go to the lane of the topic's priority; reads find an offset in the
lane that holds it. Offsets stay per partition and gap-free across lanes.

**A partition's lane is pinned.** When the configuration moves a topic to
another priority, its appends stay in the old lane until that lane has
shipped every entry of the partition (its safe LSN is past the partition's
last entry there); then the new lane's journal starts the partition at the
old lane's next offset and takes its appends. So a partition's entries reach
the bucket in offset order whichever lane ships first, and the old lane's
offsets stay readable there until retention deletes them.

**Disk budget.** ``journal.max_bytes`` is the total over all lanes;
``journal.reserve`` guarantees a lane bytes the others cannot take. Before
each append a lane's budget is set to its reserve plus what of the shared
pool (``max_bytes`` minus every reserve) the other lanes do not use beyond
their own reserves. A lane over its budget deletes its shipped segments or
refuses the append (``JournalFull``), as a single journal does.

**Drop-oldest data gives way.** A block lane over its budget first makes the
drop-oldest lanes shed what they hold beyond their reserve; a block lane
that finds the *filesystem* full (``ENOSPC``) with no shipped segment left
makes the drop-oldest lanes on the same filesystem shed
(``Journal.make_room_elsewhere``) before it answers ``DiskFull``.

Mirror partitions never come here: tailers append to the main (``normal``)
lane's journal directly.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import trio

from edge_gateway.errors import InvalidInput, JournalFull
from edge_gateway.format.entry import Entry, ProducerFields
from edge_gateway.journal._config import JournalConfig
from edge_gateway.journal._journal import Journal, OffsetOutOfRange, open_journal
from edge_gateway.journal._lane import (
    ALL_LANES,
    MAIN_LANE,
    Lane,
    Priority,
    lane_path,
    lanes_on_disk,
)
from edge_gateway.journal._repair import RepairSource

log = logging.getLogger("edgegw.journal")

__all__ = ["LaneAppended", "Lanes", "open_lanes"]


#: Builds a NamedTuple without its Python-level ``__new__`` (as the journal's append does).
_new = tuple.__new__


class LaneAppended(NamedTuple):
    """Where an append went: the lane, its LSN in that lane's journal, its offsets."""

    lane: Lane
    lsn: int
    base_offset: int
    # shadows tuple.count, as Appended's does
    count: int  # type: ignore[assignment]

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count


class Lanes:
    """Routes a gateway's local appends and reads over its lanes' journals."""

    def __init__(
        self,
        journals: Mapping[Lane, Journal],
        priority_of: Callable[[str], Priority | Lane],
        config: JournalConfig | None = None,
    ) -> None:
        if MAIN_LANE not in journals:
            raise InvalidInput("the normal lane's journal is required")
        #: More than one lane: log objects carry a lane table (version 2).
        self.multi = len(journals) > 1
        #: In drain order (critical, normal, bulk).
        self.journals: dict[Lane, Journal] = dict(
            sorted(journals.items(), key=lambda item: item[0].rank)
        )
        self.main = journals[MAIN_LANE]
        self._priority_of = priority_of
        self._config = config or self.main.config
        self._owner: dict[tuple[str, int], Lane] = {}
        #: LSN of the last entry a partition got in its owner lane (this run).
        self._last_lsn: dict[tuple[str, int], int] = {}
        self._pending_moves: set[tuple[str, int]] = set()
        self._moves = 0
        # The append path's shortcuts (it runs per record batch): per lane, its
        # journal and reserve, and the other lanes' (for its budget); per
        # partition whose lane is settled (its owner is the lane it wants),
        # the lane's index in them.
        cfg = self._config
        # A priority's reserve is its block lane's (a drop-oldest lane makes its own room).
        self._plan = [
            (j, 0 if lane.drops else cfg.reserved(lane.priority))
            for lane, j in self.journals.items()
        ]
        self._pool = cfg.max_bytes - sum(r for _, r in self._plan)
        self._others = [
            [other for k, other in enumerate(self._plan) if k != i] for i in range(len(self._plan))
        ]
        self._index = {lane: i for i, lane in enumerate(self.journals)}
        self._lane_at = list(self.journals)
        self._settled: dict[tuple[str, int], int] = {}
        self._fit_budgets()
        # A full disk under a block lane makes the drop-oldest lanes on the same
        # filesystem give way, as a full budget does (docs/journal.md, "Disk full").
        self._devices = [_device(j.path) for j, _ in self._plan]
        if any(j.drop_oldest for j, _ in self._plan):
            for i, (j, _) in enumerate(self._plan):
                if not j.drop_oldest:
                    j.make_room_elsewhere = functools.partial(self._shed_for_disk, i)

    def lane_for(self, topic: str) -> Lane:
        """The lane the configuration puts ``topic`` in (one that is open here)."""
        want = self._priority_of(topic)
        lane = want if isinstance(want, Lane) else Lane(want)
        return lane if lane in self.journals else MAIN_LANE

    # ---------------------------------------------------------------- owners

    def owner(self, topic: str, partition: int) -> Lane:
        """The lane that takes the partition's appends now."""
        key = (topic, partition)
        lane = self._owner.get(key)
        if lane is None:
            lane = self._owner[key] = self._find_owner(topic, partition)
        return lane

    def _find_owner(self, topic: str, partition: int) -> Lane:
        want = self.lane_for(topic)
        nexts = {lane: j.next_offset(topic, partition) for lane, j in self.journals.items()}
        top = max(nexts.values())
        if top == 0:
            return want
        tied = [lane for lane, n in nexts.items() if n == top]
        # A tie: the new lane was started at the old one's next offset and has
        # no entry yet; both agree where the partition goes on.
        return want if want in tied else tied[0]

    def _route(self, topic: str, partition: int) -> Lane:
        key = (topic, partition)
        lane = self.owner(topic, partition)
        want = self.lane_for(topic)
        if lane == want:
            return lane
        old = self.journals[lane]
        nxt = old.next_offset(topic, partition)
        if old.first_offset(topic, partition) < nxt:
            # Entries are still there: are they all shipped? (Unknown this
            # run: the lane's last LSN bounds them.)
            last = self._last_lsn.get(key, old.next_lsn - 1)
            if old.safe_lsn <= last:
                if key not in self._pending_moves:
                    self._pending_moves.add(key)
                    log.info(
                        "lanes: %s/%d moves from lane %s to %s once lane %s has shipped it "
                        "(through LSN %d; shipped below %d)",
                        topic,
                        partition,
                        lane,
                        want,
                        lane,
                        last,
                        old.safe_lsn,
                    )
                return lane
        self.journals[want].start_partition(topic, partition, nxt)
        self._owner[key] = want
        self._last_lsn.pop(key, None)
        self._pending_moves.discard(key)
        self._moves += 1
        log.info(
            "lanes: %s/%d moved from lane %s to %s at offset %d", topic, partition, lane, want, nxt
        )
        return want

    @property
    def pending_moves(self) -> int:
        """Partitions whose priority changed, waiting for their old lane to ship them."""
        return len(self._pending_moves)

    @property
    def moves(self) -> int:
        return self._moves

    # ---------------------------------------------------------------- budget

    def _fit(self, i: int) -> None:
        """Give lane ``i`` its reserve plus the shared bytes the others leave (see above).

        Done before each of the lane's appends, so it always sees the others'
        use as it is now: a lane's budget only matters to its own appends.
        """
        j, reserve = self._plan[i]
        taken = 0
        for other, r in self._others[i]:
            used = other.disk_bytes
            if used > r:
                taken += used - r
        j.set_budget(reserve + self._pool - taken)

    def _shed_for(self, i: int, length: int, *, disk_full: bool = False) -> bool:
        """Make drop-oldest lanes other than ``i`` give up shared room for an append of
        ``length`` bytes to lane ``i`` (of its filesystem if ``disk_full``). True if
        any was freed."""
        need = length + self._config.segment_bytes
        freed = 0
        for k, (j, reserve) in enumerate(self._plan):
            if k == i or not j.drop_oldest or j.disk_bytes <= reserve:
                continue
            if disk_full and self._devices[k] != self._devices[i]:
                continue
            freed += j.shed(min(need - freed, j.disk_bytes - reserve), disk_full=disk_full)
            if freed >= need:
                break
        return freed > 0

    def _shed_for_disk(self, i: int, length: int) -> bool:
        """Lane ``i`` (a block lane) found its disk full with no shipped segment left to
        delete: drop-oldest lanes on the same filesystem give way, as for the budget."""
        return self._shed_for(i, length, disk_full=True)

    def _fit_budgets(self) -> None:
        if self.multi:
            for i in range(len(self._plan)):
                self._fit(i)

    def priorities_changed(self) -> None:
        """The topics' priorities may have changed: route each partition afresh."""
        self._settled.clear()

    def budgets(self) -> dict[Lane, int]:
        """Each lane's disk budget now (bytes)."""
        self._fit_budgets()
        return {lane: j.budget_bytes for lane, j in self.journals.items()}

    # ---------------------------------------------------------------- append

    def append_nowait(
        self,
        topic: str,
        partition: int,
        batch: bytes | bytearray | memoryview,
        producer: ProducerFields | None = None,
    ) -> LaneAppended:
        """Append to the partition's lane (see :meth:`Journal.append_nowait`)."""
        if not self.multi:
            lsn, base, count = self.main.append_nowait(topic, partition, batch, producer)
            return _new(LaneAppended, (MAIN_LANE, lsn, base, count))
        key = (topic, partition)
        i = self._settled.get(key)
        if i is None:
            lane = self._route(topic, partition)
            i = self._index[lane]
            if lane == self.lane_for(topic):
                self._settled[key] = i
        self._fit(i)
        lane = self._lane_at[i]
        try:
            lsn, base, count = self._plan[i][0].append_nowait(topic, partition, batch, producer)
        except JournalFull:
            # Drop-oldest data is what gives way: a full lane takes the shared
            # room a drop-oldest lane holds beyond its reserve, then tries again.
            if not self._shed_for(i, len(batch)):
                raise
            self._fit(i)
            lsn, base, count = self._plan[i][0].append_nowait(topic, partition, batch, producer)
        if key in self._pending_moves:
            # Only a partition waiting to move needs its last LSN in the old lane.
            self._last_lsn[key] = lsn
        return _new(LaneAppended, (lane, lsn, base, count))

    async def append(
        self, topic: str, partition: int, batch: bytes | bytearray | memoryview
    ) -> LaneAppended:
        """Append and wait as the lane's fsync policy asks (see :meth:`Journal.append`).

        The lane is chosen and the entry written with no checkpoint in
        between, so a move cannot slip between them.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        res = self.append_nowait(topic, partition, batch)
        await self.journals[res.lane].after_append(res.lsn)
        return res

    # ---------------------------------------------------------------- reads

    def next_offset(self, topic: str, partition: int) -> int:
        return max(j.next_offset(topic, partition) for j in self.journals.values())

    def first_offset(self, topic: str, partition: int) -> int:
        """The first offset still held in any lane (the next offset when none is)."""
        held = [
            j.first_offset(topic, partition)
            for j in self.journals.values()
            if j.first_offset(topic, partition) < j.next_offset(topic, partition)
        ]
        return min(held) if held else self.next_offset(topic, partition)

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 10_000,
        max_bytes: int = 1024 * 1024,
    ) -> list[Entry]:
        """Entries of one partition from ``offset`` (see :meth:`Journal.read`).

        One lane's entries per call: a read that reaches the end of the old
        lane of a moved partition stops there, and the next read continues in
        the new lane.
        """
        if not self.multi:
            return self.main.read(
                topic, partition, offset, max_records=max_records, max_bytes=max_bytes
            )
        if offset >= self.next_offset(topic, partition):
            return []
        for j in self.journals.values():
            if not j.first_offset(topic, partition) <= offset < j.next_offset(topic, partition):
                continue
            entries = j.read(topic, partition, offset, max_records=max_records, max_bytes=max_bytes)
            if not entries or entries[0].base_offset > offset:
                continue  # the offset is in a gap here: another lane holds it
            # Stop where this lane's entries skip offsets that another lane holds.
            for k in range(1, len(entries)):
                if entries[k].base_offset != entries[k - 1].next_offset:
                    return entries[:k]
            return entries
        raise OffsetOutOfRange(topic, partition, offset, self.first_offset(topic, partition))

    async def wait_for(self, topic: str, partition: int, offset: int) -> None:
        """Wait until the partition holds ``offset`` in any lane."""
        if not self.multi:
            await self.main.wait_for(topic, partition, offset)
            return
        while self.next_offset(topic, partition) <= offset:
            async with trio.open_nursery() as nursery:

                async def one(j: Journal) -> None:
                    await j.wait_for(topic, partition, offset)
                    nursery.cancel_scope.cancel()

                for j in self.journals.values():
                    nursery.start_soon(one, j)

    def partitions(self) -> list[tuple[str, int]]:
        return sorted({k for j in self.journals.values() for k in j.partitions()})

    async def flush(self) -> None:
        for j in self.journals.values():
            await j.flush()

    def in_drain_order(self) -> list[tuple[Lane, Journal]]:
        return [(lane, self.journals[lane]) for lane in ALL_LANES if lane in self]

    def __contains__(self, lane: object) -> bool:
        return lane in self.journals


def _device(path: Path) -> int:
    """The filesystem ``path`` is on (-1 if unknown)."""
    try:
        return os.stat(path).st_dev
    except OSError:
        return -1


@contextlib.asynccontextmanager
async def open_lanes(
    main: Path,
    config: JournalConfig,
    priorities: Iterable[Priority | Lane],
    priority_of: Callable[[str], Priority | Lane],
    repair: Callable[[Lane], RepairSource | None] | None = None,
) -> AsyncIterator[Lanes]:
    """Open the normal lane's journal at ``main`` and one per other lane (or priority)
    in ``priorities`` -- or on disk: a lane that still holds data is always opened,
    whatever the configuration says now. ``repair`` gives each lane's source of
    damaged, shipped ranges (``_repair.py``)."""
    wanted = lanes_on_disk(main) | {p if isinstance(p, Lane) else Lane(p) for p in priorities}
    async with contextlib.AsyncExitStack() as stack:
        journals = {
            lane: await stack.enter_async_context(
                open_journal(
                    lane_path(main, lane),
                    config,
                    drop_oldest=lane.drops,
                    repair=None if repair is None else repair(lane),
                )
            )
            for lane in sorted(wanted, key=lambda lane: lane.rank)
        }
        if len(journals) > 1:
            log.info(
                "journal: lanes %s (%s)",
                ", ".join(str(lane) for lane in journals),
                ", ".join(str(lane_path(main, lane)) for lane in journals),
            )
        yield Lanes(journals, priority_of, config)
