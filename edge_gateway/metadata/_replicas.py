"""Keeping one metadata server replica in step with the others (PostgreSQL store).

Replicas are stateless HTTP servers over one database. What each keeps in
memory — the routing table, verified tokens, the head relay — must follow
changes made through the others:

* **Head reports** (:meth:`ReplicaSync.publish`) are written in batches, one
  transaction per batch whatever the number of reports waiting (group
  commit: while a batch is in the database, the next one gathers). The
  transaction also returns every head moved since this replica's relay
  version, so the relay applies a complete prefix of the versions and its
  version stays a watermark (see :mod:`edge_gateway.metadata._pg`). Long
  polls held on this replica wake from memory as the batch lands.
* **A poll** (:meth:`ReplicaSync.run`) reads the routing version, the
  credentials version and the heads moved since the relay's version, in one
  round trip: the others' head reports wake this replica's long polls; a new
  routing version reloads the table; a new credentials version forgets
  verified tokens and reloads the admin token. It runs as soon as another
  replica notifies an admin change, or a batch this replica cannot apply from
  the notification alone, and every ``interval_s`` whatever happens, so a
  lost notification (the listening connection down while PostgreSQL
  restarts) delays a change by one interval at most.
* **Notifications** (``LISTEN``, one per batch:
  :mod:`edge_gateway.metadata._pg`) carry a batch's moves and its range of
  versions: a replica whose relay has every head below that range applies
  them at once, in trio's thread, with no poll (at fleet rates, a poll per
  other replica's batch was a worker-thread call and a round trip each).
  A gap (a notification lost) is noticed by the range and makes it poll.

Measured (docs/metadata.md, ``bench/metadata_sync.py``): a notification
wakes the other replica within a few ms, the poll alone in ``interval_s / 2``
on average; one NOTIFY per batch costs the head batches nothing measurable
(they serialise on their own lock already).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from edge_gateway.errors import Unavailable

__all__ = ["ReplicaSync", "ReplicaSyncStatistics"]

log = logging.getLogger("edgegw.metadata.replicas")

Heads = list[tuple[str, int, int]]


class SharedStore(Protocol):
    def publish_heads(self, moves: dict[str, int], since: int) -> Heads: ...

    def poll(self, since: int) -> tuple[int, int, int, Heads]: ...

    def advance_versions(self, seen: int) -> int: ...

    def listen(self, stop: threading.Event, woken: Callable[[Note | None], None]) -> None: ...


class Note(Protocol):
    """A head batch as another replica's notification tells it (``_pg.HeadsNote``)."""

    @property
    def after(self) -> int: ...

    @property
    def upto(self) -> int: ...

    @property
    def heads(self) -> Heads: ...


class Relay(Protocol):
    version: int

    def apply(self, heads: Heads) -> None: ...

    def head(self, region: str) -> int | None: ...


@dataclass(frozen=True, slots=True)
class ReplicaSyncStatistics:
    """What a replica's sync did since its start (``/healthz`` ``replica_sync``).

    The bench subtracts two readings: batches per second, reports per batch,
    the wall time a batch and a poll take in the database (their worker
    thread's whole call: the round trips, the commit, the wait for the
    advisory lock that orders the replicas' batches).
    """

    #: Head batches written (one transaction each) and the reports in them.
    batches: int
    reports: int
    #: Regions written (a region reported twice in one batch counts once).
    batch_moves: int
    #: Seconds spent writing batches, start to commit (the sum over batches).
    batch_s: float
    #: Polls run, and the seconds they took.
    polls: int
    poll_s: float
    #: Notifications from the other replicas that reached this one, and those
    #: whose heads were applied from the notification itself (no poll).
    notified: int
    notes_applied: int
    #: Heads from the database applied to the relay (the others' reports and
    #: this replica's own, as each batch returns them).
    heads_applied: int


class _Batch:
    def __init__(self) -> None:
        self.moves: dict[str, int] = {}
        self.done = trio.Event()
        self.error: Unavailable | None = None


class ReplicaSync:
    """Head reports into, and changes from, the database shared by the replicas."""

    def __init__(
        self,
        store: SharedStore,
        relay: Relay,
        *,
        run_db: Callable[..., Awaitable[Any]],
        on_routing_version: Callable[[int], Awaitable[None]],
        on_credentials_version: Callable[[int], Awaitable[None]],
        interval_s: float = 1.0,
        notify: bool = True,
    ) -> None:
        self._store = store
        self._relay = relay
        self._run_db = run_db
        self._on_routing = on_routing_version
        self._on_credentials = on_credentials_version
        self.interval_s = interval_s
        self.notify = notify
        self._wake = trio.Event()
        self._batch = _Batch()
        self._pending = trio.Event()
        self._routing_version: int | None = None
        self._credentials_version: int | None = None
        self._poll_lock = trio.Lock()
        self._failing = False
        #: Figures for tests and the bench: batches written, reports in them, polls.
        self.batches = self.reports = self.polls = 0
        self._batch_moves = self._notified = self._heads_applied = self._notes_applied = 0
        #: Notes from the listening thread, taken in trio's (deque: thread-safe ends).
        self._notes: collections.deque[Note | None] = collections.deque()
        self._notes_scheduled = threading.Event()
        #: A batch of this replica's is in the database; notes held until it returns.
        self._writing = False
        self._held: list[Note] = []
        self._batch_s = self._poll_s = 0.0

    def statistics(self) -> ReplicaSyncStatistics:
        return ReplicaSyncStatistics(
            batches=self.batches,
            reports=self.reports,
            batch_moves=self._batch_moves,
            batch_s=self._batch_s,
            polls=self.polls,
            poll_s=self._poll_s,
            notified=self._notified,
            notes_applied=self._notes_applied,
            heads_applied=self._heads_applied,
        )

    async def publish(self, region: str, seq: int) -> tuple[int, int]:
        """Record ``region``'s head (through the next batch); (head seq, relay version)."""
        batch = self._batch
        if seq > batch.moves.get(region, -1):
            batch.moves[region] = seq
        self.reports += 1
        self._pending.set()
        await batch.done.wait()
        if batch.error is not None:
            raise batch.error
        head = self._relay.head(region)
        return (seq if head is None else max(head, seq)), self._relay.version

    async def catch_up(self) -> None:
        """Poll now (a client's version is ahead of this replica's)."""
        await self._poll()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write batches and poll, until cancelled; ready after the first poll."""
        try:
            await self._poll()
        except Unavailable as exc:
            log.warning("metadata database unavailable at start: %s", exc)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_batches)
            if self.notify:
                nursery.start_soon(self._listen)
            task_status.started()
            while True:
                with trio.move_on_after(self.interval_s):
                    await self._wake.wait()
                self._wake = trio.Event()
                try:
                    await self._poll()
                except Unavailable as exc:
                    if not self._failing:
                        log.warning("metadata database unavailable: %s (retrying)", exc)
                    self._failing = True
                    continue
                if self._failing:
                    log.info("metadata database reachable again")
                    self._failing = False

    def _take_notes(self) -> None:
        """Apply the notes the listener queued, in order (trio's thread, no checkpoint).

        A note is the whole of a batch's versions (``after``, ``upto``]: when
        this relay has every head up to ``after``, the note's heads bring it to
        ``upto`` with no poll. A note above the relay's version while this
        replica's own batch is in the database waits for it (most such gaps
        are that batch, committed just before). Otherwise (a notification
        lost while the listener reconnected, an admin change, a batch too big
        to tell) the poll runs, which fetches everything since the relay's
        version.
        """
        self._notes_scheduled.clear()
        while self._notes:
            note = self._notes.popleft()
            if note is not None and (
                self._held or (self._writing and self._relay.version < note.after)
            ):
                # Most gaps are this replica's own batch, committed just before
                # the other's but not yet returned: held until it is (in order).
                self._held.append(note)
            else:
                self._take_note(note)

    def _take_note(self, note: Note | None) -> None:
        if note is not None and self._relay.version >= note.after:
            self._relay.apply(note.heads)
            # Every version up to upto is known now: the batch's moves are
            # these, and a batch takes no version for a head that does not move.
            self._relay.version = max(self._relay.version, note.upto)
            self._notes_applied += 1
        else:
            self._wake.set()

    def _take_held(self) -> None:
        """This replica's batch returned (or failed): the notes held for it, in order."""
        held, self._held = self._held, []
        for note in held:
            self._take_note(note)

    async def _listen(self) -> None:
        stop = threading.Event()
        token = trio.lowlevel.current_trio_token()

        def woken(note: Note | None) -> None:
            # The listening thread: queue the note, and call into trio once per
            # burst (the flag is cleared there before the queue is read, so a
            # note queued after that calls again: none waits unread).
            self._notified += 1  # one thread writes it; read for figures only
            self._notes.append(note)
            if not stop.is_set() and not self._notes_scheduled.is_set():
                self._notes_scheduled.set()
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(self._take_notes)

        try:
            await trio.to_thread.run_sync(self._store.listen, stop, woken, abandon_on_cancel=True)
        finally:
            stop.set()  # the abandoned thread ends within its 0.5 s wait

    async def _write_batches(self) -> None:
        try:
            await self._write_batches_forever()
        finally:  # stopping: reports still waiting get a 503, not a hang
            self._batch.error = Unavailable("the metadata server is stopping")
            self._batch.done.set()

    async def _write_batches_forever(self) -> None:
        while True:
            await self._pending.wait()
            self._pending = trio.Event()
            batch, self._batch = self._batch, _Batch()
            started = time.perf_counter()
            self._writing = True
            try:
                heads = await self._run_db(
                    self._store.publish_heads, batch.moves, self._relay.version
                )
                self._batch_s += time.perf_counter() - started
                self._relay.apply(heads)
                self.batches += 1
                self._batch_moves += len(batch.moves)
                self._heads_applied += len(heads)
            except Unavailable as exc:
                batch.error = exc
            finally:
                self._writing = False
                self._take_held()
                batch.done.set()

    async def _poll(self) -> None:
        async with self._poll_lock:
            since = self._relay.version
            started = time.perf_counter()
            routing, credentials, issued, heads = await self._run_db(self._store.poll, since)
            self._poll_s += time.perf_counter() - started
            self.polls += 1
            self._heads_applied += len(heads)
            self._relay.apply(heads)
            if issued < self._relay.version:
                # The database went back in time (see _pg): new versions must
                # stay above every one a client holds.
                moved = await self._run_db(self._store.advance_versions, self._relay.version)
                log.warning(
                    "metadata database: head versions went back to %d (below %d seen here): "
                    "moved them on to %d",
                    issued,
                    self._relay.version,
                    moved,
                )
            # The first poll too: a change between the app's start and this poll.
            if credentials != self._credentials_version:
                self._credentials_version = credentials
                await self._on_credentials(credentials)
            if routing != self._routing_version:
                self._routing_version = routing
                await self._on_routing(routing)
