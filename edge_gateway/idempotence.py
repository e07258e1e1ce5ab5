"""Idempotent produce: producer ids, epochs and per-partition sequences (sans-IO).

Kafka's idempotent producer is the model (its ``ProducerStateManager``):

- a producer gets an id (and epoch 0) from :meth:`ProducerTable.new_producer`;
  a new instance of the same producer may bump the epoch
  (:meth:`ProducerTable.bump`), which fences the older instance
  (:class:`~edge_gateway.errors.ProducerFenced`);
- every append of that producer to a partition carries a :class:`ProducerSeq`:
  the sequence number of its first record, per (topic, partition), starting at
  0 and counting records (a batch of 3 at sequence 7 is followed by 10);
- per producer and partition the last :data:`REMEMBERED_BATCHES` batches are
  remembered (:class:`BatchMeta`: sequence, count, offsets, journal LSN): an
  append that repeats one of them exactly is a *duplicate* and answered with the
  original offsets; one that leaves a gap is refused
  (:class:`~edge_gateway.errors.OutOfOrderSequence`);
- at most ``max_producers`` producers are remembered, each for
  ``expiry_ms`` after its last append or init; beyond that the oldest idle
  are forgotten and their next request gets
  :class:`~edge_gateway.errors.UnknownProducer`.

:class:`ProducerTable` holds no I/O: the gateway checks an append with
:meth:`~ProducerTable.check`, writes it to the journal (the producer id, epoch
and sequence go into the journal entry), then calls
:meth:`~ProducerTable.record`. The journal's checkpoint at the start of every
segment carries :meth:`~ProducerTable.snapshot` (the state of producers whose
entries a deleted segment took away), and recovery rebuilds the table from the
last checkpoint plus the entries after it (:meth:`~ProducerTable.restore`,
:meth:`~ProducerTable.replay`).

:class:`ProducerRegistry` is the table's thin I/O shell in the gateway: it
rebuilds the table from the journals at start and keeps ``producers.json`` in
the data dir (the ids issued, never issued again, and the epochs bumped), which
it writes before an id or an epoch is handed out.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import trio

from edge_gateway.durable import replace_file
from edge_gateway.errors import (
    CorruptData,
    InvalidInput,
    OutOfOrderSequence,
    ProducerFenced,
    UnknownProducer,
)
from edge_gateway.statefile import StateFiles, seal, unseal

if TYPE_CHECKING:
    from edge_gateway.journal import Journal

__all__ = [
    "MAX_EPOCH",
    "MAX_PRODUCER_ID",
    "PRODUCERS_FILE",
    "REMEMBERED_BATCHES",
    "SEQUENCE_MODULUS",
    "BatchMeta",
    "ProducerRegistry",
    "ProducerSeq",
    "ProducerStats",
    "ProducerTable",
]

log = logging.getLogger("edgegw.gateway")

#: Batches remembered per producer and partition (Kafka: 5, its
#: ``max.in.flight.requests.per.connection`` limit for idempotence).
REMEMBERED_BATCHES: Final = 5
#: Sequences are 31-bit and wrap to 0 after 2**31 - 1, as Kafka's.
SEQUENCE_MODULUS: Final = 2**31
#: Epochs are 15-bit (Kafka's int16 >= 0); an exhausted epoch gets a new id.
MAX_EPOCH: Final = 2**15 - 1
MAX_PRODUCER_ID: Final = 2**63 - 1
#: Version of :meth:`ProducerTable.snapshot`'s document.
SNAPSHOT_VERSION: Final = 1
#: The idempotent producers' registry in the data dir: issued ids, bumped epochs.
PRODUCERS_FILE: Final = "producers.json"
#: Producer ids reserved per write of the registry.
_ID_BLOCK: Final = 1024
#: A damaged registry is rebuilt with its next id this far past the highest id
#: the journal knows: ids handed out after the last checkpoint and never
#: written with are not in the journal, and must never be issued again (it
#: would take 2**32 ``init_producer`` calls to have issued that many).
_REBUILD_ID_GAP: Final = 2**32


@dataclass(frozen=True, slots=True)
class ProducerSeq:
    """What an idempotent append carries: who wrote it and its place in the producer's sequence."""

    #: from :meth:`ProducerTable.new_producer` (``Gateway.init_producer``)
    producer_id: int
    epoch: int
    #: sequence number of the first record of this append, for this (topic, partition)
    sequence: int

    def check(self) -> None:
        """Raise :class:`InvalidInput` unless every field is in range."""
        if not 0 <= self.producer_id <= MAX_PRODUCER_ID:
            raise InvalidInput(f"producer id {self.producer_id} out of range")
        if not 0 <= self.epoch <= MAX_EPOCH:
            raise InvalidInput(f"producer epoch {self.epoch} out of range 0..{MAX_EPOCH}")
        if not 0 <= self.sequence < SEQUENCE_MODULUS:
            raise InvalidInput(
                f"producer sequence {self.sequence} out of range 0..{SEQUENCE_MODULUS - 1}"
            )


class BatchMeta(NamedTuple):
    """One remembered append of a producer to a partition (a tuple: made on every append)."""

    epoch: int
    sequence: int
    count: int  # type: ignore[assignment]  # shadows tuple.count, as LaneAppended does
    base_offset: int
    #: journal LSN of the entry (in lane ``lane``), to wait for its durability
    lsn: int
    #: the journal lane's id (``Lane.id``; 0 the normal lane)
    lane: int

    @property
    def last_sequence(self) -> int:
        return (self.sequence + self.count - 1) % SEQUENCE_MODULUS


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """:meth:`ProducerTable.statistics`."""

    producers: int
    partitions: int
    duplicates: int
    issued: int
    expired: int
    evicted: int
    next_id: int


class _Producer:
    __slots__ = ("epoch", "last_seen", "parts")

    def __init__(self, epoch: int, last_seen: int) -> None:
        self.epoch = epoch
        self.last_seen = last_seen
        self.parts: dict[tuple[str, int], deque[BatchMeta]] = {}


class ProducerTable:
    """The de-duplication state of every idempotent producer (see the module docstring).

    ``now`` arguments are wall-clock milliseconds (a journal entry's
    ``append_time`` on replay), so expiry survives a restart.
    """

    def __init__(self, *, max_producers: int = 10_000, expiry_ms: int = 24 * 3600 * 1000) -> None:
        if max_producers < 1:
            raise InvalidInput("max_producers must be at least 1")
        if expiry_ms < 1:
            raise InvalidInput("the producer expiry must be positive")
        self.max_producers = max_producers
        self.expiry_ms = expiry_ms
        #: the next producer id to issue; ids are never reused (the caller
        #: persists it, see ``Gateway``)
        self.next_id = 1
        self._producers: dict[int, _Producer] = {}
        self.duplicates = 0
        self.issued = 0
        self.expired = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._producers)

    def __contains__(self, producer_id: object) -> bool:
        return producer_id in self._producers

    # ------------------------------------------------------------ producers

    def new_producer(self, now: int) -> tuple[int, int]:
        """Issue a new producer id at epoch 0 (forgetting the oldest idle if full)."""
        self.expire(now)
        pid = self.next_id
        if pid > MAX_PRODUCER_ID:
            raise InvalidInput("producer ids exhausted")
        self.next_id = pid + 1
        self._make_room()
        self._producers[pid] = _Producer(0, now)
        self.issued += 1
        return pid, 0

    def bump(self, producer_id: int, epoch: int | None, now: int) -> tuple[int, int]:
        """A new instance of ``producer_id``: its epoch + 1, fencing the older one.

        ``epoch`` is the caller's current epoch (None: whatever it is); an
        older one raises :class:`ProducerFenced` (a newer instance already
        bumped it). An exhausted epoch gets a new id at epoch 0.
        """
        self.expire(now)
        p = self._producers.get(producer_id)
        if p is None:
            raise UnknownProducer(
                f"producer id {producer_id} is not known here (expired, evicted or never "
                "issued): get a new one"
            )
        if epoch is not None:
            if epoch < p.epoch:
                raise ProducerFenced(
                    f"producer {producer_id} epoch {epoch} is fenced by epoch {p.epoch}"
                )
            if epoch > p.epoch:
                raise InvalidInput(
                    f"producer {producer_id} epoch {epoch} is newer than its current {p.epoch}"
                )
        if p.epoch >= MAX_EPOCH:
            del self._producers[producer_id]
            return self.new_producer(now)
        p.epoch += 1
        p.last_seen = now
        return producer_id, p.epoch

    def _make_room(self) -> None:
        over = len(self._producers) - self.max_producers + 1
        if over <= 0:
            return
        oldest = sorted(self._producers.items(), key=lambda kv: kv[1].last_seen)[:over]
        for pid, _ in oldest:
            del self._producers[pid]
        self.evicted += len(oldest)

    def expire(self, now: int) -> int:
        """Forget producers idle for longer than the expiry; returns how many."""
        limit = now - self.expiry_ms
        gone = [pid for pid, p in self._producers.items() if p.last_seen < limit]
        for pid in gone:
            del self._producers[pid]
        self.expired += len(gone)
        return len(gone)

    # ------------------------------------------------------------ appends

    def check(
        self, topic: str, partition: int, seq: ProducerSeq, count: int, now: int
    ) -> BatchMeta | None:
        """Check an append of ``count`` records before it is written.

        Returns the remembered batch when the append is a duplicate (write
        nothing, answer with its offsets), None when it is the next in
        sequence (write it, then :meth:`record`). Raises
        :class:`UnknownProducer`, :class:`ProducerFenced` or
        :class:`OutOfOrderSequence`; changes nothing but the producer's
        last-seen time and the duplicate count.
        """
        seq.check()
        if count < 1:
            raise InvalidInput("an idempotent append needs at least one record")
        p = self._producers.get(seq.producer_id)
        if p is not None and p.last_seen < now - self.expiry_ms:
            del self._producers[seq.producer_id]
            self.expired += 1
            p = None
        if p is None:
            raise UnknownProducer(
                f"producer id {seq.producer_id} is not known here (expired, evicted or never "
                "issued): get a new one"
            )
        if seq.epoch < p.epoch:
            raise ProducerFenced(
                f"producer {seq.producer_id} epoch {seq.epoch} is fenced by epoch {p.epoch}"
            )
        if seq.epoch > p.epoch:
            raise ProducerFenced(
                f"producer {seq.producer_id} epoch {seq.epoch} is newer than the gateway's "
                f"{p.epoch}: get the epoch from init_producer"
            )
        p.last_seen = max(p.last_seen, now)
        batches = p.parts.get((topic, partition))
        if batches:
            last = batches[-1]
            if last.epoch == seq.epoch:
                expected = (last.sequence + last.count) % SEQUENCE_MODULUS
                if seq.sequence == expected:
                    # The next in sequence (the common case): not a repeat of a
                    # remembered batch, whose sequences all lie before it.
                    return None
                for b in batches:
                    if b.epoch == seq.epoch and b.sequence == seq.sequence:
                        if b.count != count:
                            raise OutOfOrderSequence(
                                f"producer {seq.producer_id} sequence {seq.sequence} on "
                                f"{topic}/{partition} was written with {b.count} records, "
                                f"not {count}",
                                expected=(last.last_sequence + 1) % SEQUENCE_MODULUS,
                            )
                        self.duplicates += 1
                        return b
                raise OutOfOrderSequence(
                    f"producer {seq.producer_id} sequence {seq.sequence} on "
                    f"{topic}/{partition}: expected {expected} ("
                    + (
                        "a gap: an earlier append was not written"
                        if _ahead(seq.sequence, expected)
                        else "older than the batches remembered"
                    )
                    + ")",
                    expected=expected,
                )
        if seq.sequence != 0:
            raise OutOfOrderSequence(
                f"producer {seq.producer_id} epoch {seq.epoch} has written nothing to "
                f"{topic}/{partition}: its first sequence there must be 0, not {seq.sequence}",
                expected=0,
            )
        return None

    def record(
        self,
        topic: str,
        partition: int,
        seq: ProducerSeq,
        count: int,
        base_offset: int,
        *,
        lsn: int,
        lane: int = 0,
        now: int,
    ) -> None:
        """Remember an append :meth:`check` passed and the journal wrote."""
        p = self._producers.get(seq.producer_id)
        if p is None:  # forgotten between check and record: cannot happen without an await
            self._make_room()
            p = self._producers[seq.producer_id] = _Producer(seq.epoch, now)
        self._remember(p, topic, partition, seq, count, base_offset, lsn, lane, now)

    @staticmethod
    def _remember(
        p: _Producer,
        topic: str,
        partition: int,
        seq: ProducerSeq,
        count: int,
        base_offset: int,
        lsn: int,
        lane: int,
        now: int,
    ) -> None:
        key = (topic, partition)
        batches = p.parts.get(key)
        if batches is None:
            batches = p.parts[key] = deque(maxlen=REMEMBERED_BATCHES)
        elif batches and batches[-1].epoch != seq.epoch:
            batches.clear()  # a new epoch starts a new sequence
        batches.append(BatchMeta(seq.epoch, seq.sequence, count, base_offset, lsn, lane))
        p.epoch = max(p.epoch, seq.epoch)
        p.last_seen = max(p.last_seen, now)

    # ------------------------------------------------------------ recovery

    def replay(
        self,
        topic: str,
        partition: int,
        seq: ProducerSeq,
        count: int,
        base_offset: int,
        *,
        lsn: int,
        lane: int = 0,
        append_time: int,
    ) -> None:
        """Apply a journal entry found at open (after the checkpoint it follows).

        No checks: the entry was checked when it was written. The producer
        comes back if it was not in the checkpoint (its first append), and
        ids at or above it are never issued again.
        """
        p = self._producers.get(seq.producer_id)
        if p is None:
            p = self._producers[seq.producer_id] = _Producer(seq.epoch, append_time)
        elif seq.epoch < p.epoch:
            return  # an old epoch's entry after a bump: nothing to remember
        self.next_id = max(self.next_id, seq.producer_id + 1)
        self._remember(p, topic, partition, seq, count, base_offset, lsn, lane, append_time)

    def note_epoch(self, producer_id: int, epoch: int, now: int) -> None:
        """Raise a remembered producer's epoch (a bump persisted outside the journal)."""
        p = self._producers.get(producer_id)
        if p is None:
            p = self._producers[producer_id] = _Producer(epoch, now)
        elif epoch > p.epoch:
            p.epoch = epoch
            p.last_seen = max(p.last_seen, now)
        self.next_id = max(self.next_id, producer_id + 1)

    def snapshot(self, lane: int | None = None) -> dict[str, Any]:
        """The table as a JSON-able document; with ``lane``, only batches written to that lane.

        A lane's journal checkpoint holds only its own batches: another
        lane's may not be durable yet, and a snapshot that remembered a
        batch lost in a crash would answer its retry as a duplicate.
        """
        producers = []
        for pid, p in sorted(self._producers.items()):
            parts = []
            for (topic, partition), batches in sorted(p.parts.items()):
                rows = [
                    [b.epoch, b.sequence, b.count, b.base_offset, b.lsn]
                    for b in batches
                    if lane is None or b.lane == lane
                ]
                if rows:
                    parts.append([topic, partition, rows])
            producers.append([pid, p.epoch, p.last_seen, parts])
        return {"v": SNAPSHOT_VERSION, "next_id": self.next_id, "producers": producers}

    def restore(self, doc: dict[str, Any], *, lane: int = 0, where: str = "snapshot") -> None:
        """Merge a :meth:`snapshot` document (one lane's checkpoint) into the table.

        Merging is a union: epochs and last-seen times take the larger, and a
        partition's batches are merged by offset (keeping the last
        :data:`REMEMBERED_BATCHES`), so lanes' checkpoints restore in any order.
        """
        try:
            if doc.get("v") != SNAPSHOT_VERSION:
                raise CorruptData(
                    f"unsupported producer snapshot version {doc.get('v')!r}", where=where
                )
            self.next_id = max(self.next_id, int(doc["next_id"]))
            for pid, epoch, last_seen, parts in doc["producers"]:
                pid, epoch, last_seen = int(pid), int(epoch), int(last_seen)
                p = self._producers.get(pid)
                if p is None:
                    p = self._producers[pid] = _Producer(epoch, last_seen)
                p.epoch = max(p.epoch, epoch)
                p.last_seen = max(p.last_seen, last_seen)
                self.next_id = max(self.next_id, pid + 1)
                for topic, partition, rows in parts:
                    key = (str(topic), int(partition))
                    merged = {b.base_offset: b for b in p.parts.get(key, ())}
                    for e, s, c, off, lsn in rows:
                        merged[int(off)] = BatchMeta(
                            int(e), int(s), int(c), int(off), int(lsn), lane
                        )
                    ordered = [merged[k] for k in sorted(merged)]
                    p.parts[key] = deque(ordered[-REMEMBERED_BATCHES:], maxlen=REMEMBERED_BATCHES)
        except CorruptData:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CorruptData(f"malformed producer snapshot: {exc}", where=where) from None

    # ------------------------------------------------------------ status

    def statistics(self) -> ProducerStats:
        return ProducerStats(
            producers=len(self._producers),
            partitions=sum(len(p.parts) for p in self._producers.values()),
            duplicates=self.duplicates,
            issued=self.issued,
            expired=self.expired,
            evicted=self.evicted,
            next_id=self.next_id,
        )


def _ahead(seq: int, expected: int) -> bool:
    """Whether ``seq`` is after ``expected`` in the wrapping sequence space."""
    return 0 < (seq - expected) % SEQUENCE_MODULUS < SEQUENCE_MODULUS // 2


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ProducerRegistry:
    """The gateway's :class:`ProducerTable` and ``producers.json`` (docs/api.md,
    "Idempotent produce").

    :meth:`restore` rebuilds the table when the gateway starts: each lane's
    last checkpoint, then its entries after it, then the registry file.
    :meth:`init_producer` issues ids and bumps epochs, durably.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        max_producers: int,
        expiry_ms: int,
        clock: Callable[[], int] = _now_ms,
        state_files: StateFiles | None = None,
    ) -> None:
        self.path = data_dir / PRODUCERS_FILE
        #: Where a damaged registry is reported (None: it is refused, CorruptData).
        self._state_files = state_files
        self._max_producers = max_producers
        self._expiry_ms = expiry_ms
        #: Wall-clock milliseconds.
        self._clock = clock
        #: Rebuilt from the journal when the gateway starts.
        self.table = self._new_table()
        #: Producer ids below this may have been issued (producers.json).
        self._id_limit = 1
        #: Epochs bumped by init_producer: id -> (epoch, ms), kept in producers.json.
        self._bumped: dict[int, tuple[int, int]] = {}
        self._lock = trio.Lock()

    def _new_table(self) -> ProducerTable:
        return ProducerTable(max_producers=self._max_producers, expiry_ms=self._expiry_ms)

    def restore(self, journals: Iterable[tuple[int, Journal]]) -> None:
        """Rebuild the table: each lane's last checkpoint, then its entries after it.

        ``journals``: (lane id, the lane's journal). Then ``producers.json``:
        the ids issued (never issued again) and the epochs bumped since. Each
        lane's journal gets the snapshot hook its next checkpoint writes.
        """
        table = self._new_table()
        for lane_id, j in journals:
            if j.recovered_producers is not None:
                table.restore(j.recovered_producers, lane=lane_id, where=f"{j.path} checkpoint")
            for e in j.recovered_producer_entries:
                assert e.producer is not None
                seq = ProducerSeq(e.producer.producer_id, e.producer.epoch, e.producer.sequence)
                table.replay(
                    e.topic,
                    e.partition,
                    seq,
                    e.count,
                    e.base_offset,
                    lsn=e.lsn,
                    lane=lane_id,
                    append_time=e.append_time,
                )
            j.recovered_producer_entries = []
            j.producer_snapshot = functools.partial(self.snapshot, lane_id)
        path = self.path
        try:
            limit, bumped = _read_registry(path)
        except CorruptData as exc:
            if self._state_files is None:
                raise
            # Rebuilt from the journal (the table above): the ids issued are
            # never issued again (a jump past all of them). The epochs bumped
            # since an entry of that epoch are forgotten: that producer's next
            # append is refused (ProducerFenced, newer than ours) and its
            # client asks init_producer again.
            limit, bumped = min(table.next_id + _REBUILD_ID_GAP, MAX_PRODUCER_ID), {}
            self._state_files.damaged(
                path,
                exc.reason,
                f"rebuilt from the journal: the next producer id is {limit}",
                remove=False,  # a missing registry would mean "no id issued yet"
            )
            _write_durably(path, seal({"v": 1, "id_limit": limit, "epochs": []}))
        table.next_id = max(table.next_id, limit)
        for pid, (ep, at) in bumped.items():
            table.note_epoch(pid, ep, at)
        table.expire(self._clock())
        self._bumped = {pid: v for pid, v in bumped.items() if pid in table}
        self._id_limit = table.next_id
        self.table = table
        if len(table):
            log.info("idempotence: %d producers remembered, next id %d", len(table), table.next_id)

    def snapshot(self, lane_id: int) -> dict[str, Any]:
        """What a lane's next segment checkpoint keeps of the producers (at the roll)."""
        self.table.expire(self._clock())
        return self.table.snapshot(lane_id)

    async def init_producer(
        self, producer_id: int | None = None, epoch: int | None = None
    ) -> tuple[int, int]:
        """A new id at epoch 0, or ``producer_id`` at its next epoch; durable when returned.

        See ``Gateway.init_producer``.
        """
        await trio.lowlevel.checkpoint()
        now = self._clock()
        if producer_id is None:
            pid, new_epoch = self.table.new_producer(now)
        else:
            pid, new_epoch = self.table.bump(producer_id, epoch, now)
        await self._save(pid, new_epoch)
        return pid, new_epoch

    async def _save(self, producer_id: int, epoch: int) -> None:
        """Make an issued id (and a bumped epoch) durable before it is handed out.

        Ids are reserved in blocks of :data:`_ID_BLOCK`: the file is written
        once per block, and a restart issues from the block's end.
        """
        table = self.table
        if epoch > 0:
            self._bumped[producer_id] = (epoch, self._clock())
        elif table.next_id <= self._id_limit:
            return
        async with self._lock:
            limit = max(self._id_limit, table.next_id + _ID_BLOCK)
            self._bumped = {pid: v for pid, v in self._bumped.items() if pid in table}
            doc = {
                "v": 1,
                "id_limit": limit,
                "epochs": [[pid, e, at] for pid, (e, at) in sorted(self._bumped.items())],
            }
            await trio.to_thread.run_sync(_write_durably, self.path, seal(doc))
            self._id_limit = limit


#: The fields of ``producers.json`` as written before it had a checksum.
_REGISTRY_KEYS: Final = frozenset({"v", "id_limit", "epochs"})


def _read_registry(path: Path) -> tuple[int, dict[int, tuple[int, int]]]:
    """``producers.json``: (id limit, {id: (epoch, ms)}); (1, {}) when there is none.

    :class:`CorruptData` when it is unreadable, not JSON, of another version
    or has a field of the wrong type.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 1, {}
    except OSError as exc:
        raise CorruptData(f"unreadable producer registry: {exc}", where=str(path)) from None
    doc = unseal(data, where=str(path), legacy_keys=_REGISTRY_KEYS)
    if doc.get("v") != 1:
        raise CorruptData(f"unsupported version {doc.get('v')!r}", where=str(path))
    limit, epochs = doc.get("id_limit"), doc.get("epochs")
    if type(limit) is not int or not 1 <= limit <= MAX_PRODUCER_ID or not isinstance(epochs, list):
        raise CorruptData("malformed producer registry: bad id_limit or epochs", where=str(path))
    bumped: dict[int, tuple[int, int]] = {}
    for row in epochs:
        if not (isinstance(row, list) and len(row) == 3 and all(type(v) is int for v in row)):
            raise CorruptData(f"malformed producer registry: epoch row {row!r}", where=str(path))
        pid, ep, at = row
        bumped[pid] = (ep, at)
    return limit, bumped


def _write_durably(path: Path, data: bytes) -> None:
    """Write ``path`` by a temporary file, fsync, rename and fsync of the directory."""
    replace_file(path, data)
