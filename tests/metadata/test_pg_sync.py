"""The replicas' path through PostgreSQL at fleet rates: fewer round trips, same answers.

On the session's real cluster: a head batch is one statement (schema 3's
function) and keeps the versions' rules (ordered, a lower seq changes
nothing, every head since the caller's version comes back, one notification
per batch); a database left at schema 2 by the previous edgegw is migrated
with its heads; heartbeats written in one transaction skip unknown and
revoked regions as the per-region path does; the poll is one statement. In
process: the pool's check skips connections used just now, and heads a
replica applies from the database are written to the watches in step by the
relay itself, in version order.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import trio
import trio.testing
from _meta_support import new_database

from edge_gateway.metadata import WatchDecoder
from edge_gateway.metadata._db import MetadataStore
from edge_gateway.metadata._fanout import HeadRelay
from edge_gateway.metadata._pg import (
    CHANNEL,
    CHECK_IDLE_S,
    NOTE_MAX_HEADS_BYTES,
    PG_MIGRATIONS,
    HeadsNote,
    PostgresStore,
    _checker,
    parse_note,
)
from edge_gateway.metadata._replicas import ReplicaSync
from edge_gateway.metadata.server import MetadataApp, MetadataServerConfig
from edge_gateway.net.asgi import SEND_NOWAIT
from edge_gateway.testing.postgres import Postgres


def _statements(conn: Any) -> int:
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return int(row[0])


def test_a_head_batch_is_one_transaction_with_the_versions_rules(postgres: Postgres) -> None:
    url = new_database(postgres)
    store = PostgresStore(url)
    try:
        with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url) as probe:
            listener.execute(f"LISTEN {CHANNEL}")
            first = store.publish_heads({"north": 5, "south": 3}, 0)
            assert {(r, s) for r, s, _ in first} == {("north", 5), ("south", 3)}
            since = max(v for _, _, v in first)
            # A lower seq changes nothing; a higher one moves above every version so far.
            assert store.publish_heads({"north": 4}, since) == []
            (moved,) = store.publish_heads({"north": 6, "south": 3}, since)
            assert moved[:2] == ("north", 6)
            assert moved[2] > since
            # Every head since the caller's version comes back, others' moves included.
            assert {r for r, _, _ in store.publish_heads({"east": 1}, 0)} == {
                "north",
                "south",
                "east",
            }
            # One notification per batch, naming the sender, with the batch's moves
            # and its whole range of versions: the ranges follow each other.
            notes = [parse_note(n.payload) for n in listener.notifies(timeout=1.0, stop_after=4)]
            assert [sender for sender, _ in notes] == [store.replica_id] * 4
            told = [note for _, note in notes]
            assert all(t is not None for t in told)
            assert [sorted(t.heads) for t in told if t] == [
                sorted(first),
                [],
                [moved],
                [h for h in store.poll(0)[3] if h[0] == "east"],
            ]
            for before, after in itertools.pairwise(told):
                assert before
                assert after
                assert before.upto == after.after
                assert all(before.upto < v <= after.upto for _, _, v in after.heads)
            # One transaction per batch (the function's statement): the stats
            # collector flushes lazily, so count a few batches against it.
            before = _statements(probe)
            probe.commit()
            for seq in range(10, 20):
                store.publish_heads({"west": seq}, 0)
            time.sleep(1.2)  # pg_stat_database is updated at most every second
            probe.execute("SELECT pg_stat_clear_snapshot()")
            after = _statements(probe)
            # 10 batches; the pool's check is skipped for connections used just now.
            assert after - before <= 10 + 2, after - before
    finally:
        store.close()


def test_a_schema_2_database_is_migrated_with_its_heads(postgres: Postgres) -> None:
    url = new_database(postgres)
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for migration in PG_MIGRATIONS[:2]:
            conn.execute(migration)
        conn.execute("INSERT INTO schema_version (version) VALUES (2)")
        conn.execute(
            "INSERT INTO heads (region, seq, version) VALUES ('north', 7, nextval('head_versions'))"
        )
    store = PostgresStore(url)
    try:
        assert store.schema_version == len(PG_MIGRATIONS) == 3
        (head,) = store.publish_heads({"north": 6}, 0)  # kept, and not moved back
        assert head[:2] == ("north", 7)
        routing, credentials, issued, heads = store.poll(0)
        assert heads == [head]
        assert issued >= head[2]
        assert routing >= 1
        assert credentials == 0
    finally:
        store.close()


def test_heartbeats_in_one_transaction_skip_unknown_and_revoked_regions(
    postgres: Postgres, tmp_path: Path
) -> None:
    pg = PostgresStore(new_database(postgres))
    lite = MetadataStore(tmp_path / "m.sqlite")
    try:
        for store in (pg, lite):
            store.add_region("north", 1)
            store.add_region("gone", 1)
            store.revoke_region("gone", 2)
            store.heartbeats(
                [
                    ("north", "1.2.3", {"t": 0.5}, 100),
                    ("gone", "1.2.3", {}, 100),
                    ("nowhere", "1.2.3", {}, 100),
                ]
            )
            store.heartbeats([])
        assert pg.regions() == lite.regions()
        north = pg.region("north")
        assert north["last_heartbeat_ms"] == 100
        assert north["gateway_version"] == "1.2.3"
        assert pg.region("gone")["last_heartbeat_ms"] is None
    finally:
        pg.close()
        lite.close()


def test_the_poll_is_one_snapshot_of_versions_and_heads(postgres: Postgres) -> None:
    store = PostgresStore(new_database(postgres))
    try:
        routing, credentials, issued, heads = store.poll(0)
        assert heads == []
        store.publish_heads({"north": 1, "south": 2}, 0)
        store.add_region("east", 1)  # bumps the credentials (and routing) versions
        routing2, credentials2, issued2, heads2 = store.poll(0)
        assert routing2 > routing  # a new region is in the routing table
        assert credentials2 > credentials
        assert issued2 >= max(v for _, _, v in heads2) > issued
        assert store.poll(issued2)[3] == []
    finally:
        store.close()


def test_the_pools_check_skips_connections_used_just_now_with_nothing_to_read() -> None:
    checked: list[object] = []
    check = _checker(checked.append)

    class Conn:
        def __init__(self, sock: socket.socket, used_at: float | None) -> None:
            self.sock = sock
            if used_at is not None:
                self._edgegw_used_at = used_at

        def fileno(self) -> int:
            return self.sock.fileno()

    now = time.monotonic()
    quiet, ended = socket.socketpair()
    with quiet, ended:
        fresh, recent = Conn(quiet, None), Conn(quiet, now)
        idle = Conn(quiet, now - CHECK_IDLE_S - 0.1)
        for conn in (fresh, recent, idle):
            check(conn)
        assert checked == [fresh, idle]
        # The server ended it (sent its error, closed): readable, so checked.
        checked.clear()
        ended.sendall(b"E")
        ended.close()
        check(recent)
        assert checked == [recent]


def test_the_pools_check_still_finds_a_restarted_database(postgres: Postgres) -> None:
    """Connections used just before PostgreSQL restarts: the next calls work at once."""
    store = PostgresStore(new_database(postgres), pool_size=2)
    try:
        store.publish_heads({"north": 1}, 0)
        postgres.restart()
        postgres.wait_ready()
        for _ in range(4):  # every pooled connection, each used within CHECK_IDLE_S
            assert store.poll(0)[3][0][:2] == ("north", 1)
    finally:
        store.close()


class _Sink:
    def __init__(self) -> None:
        self.chunks: list[tuple[str, bytes]] = []

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.chunks.append(("task", message.get("body", b"")))

    def send_nowait(self, body: bytes) -> bool:
        self.chunks.append(("direct", body))
        return True


async def _never() -> dict[str, Any]:
    await trio.sleep_forever()
    raise AssertionError


async def test_heads_from_the_database_go_to_watches_in_step_in_version_order(
    tmp_path: Path,
) -> None:
    store = MetadataStore(tmp_path / "m.sqlite")
    try:
        app = MetadataApp(store, MetadataServerConfig(db=tmp_path / "m.sqlite"))
        north, both = _Sink(), _Sink()
        async with trio.open_nursery() as nursery:
            for sink, regions in ((north, b"north"), (both, b"north,south")):
                scope = {
                    "type": "http",
                    "method": "GET",
                    "path": "/v1/heads",
                    "query_string": b"watch=1&since=0&wait_ms=60000&regions=" + regions,
                    "headers": [],
                    "extensions": {SEND_NOWAIT: sink.send_nowait},
                }
                nursery.start_soon(app, scope, _never, sink.send)
            await trio.testing.wait_all_tasks_blocked()
            v = app.heads.version
            # A batch's heads, as the database returns them: in no particular order.
            app.heads.apply([("south", 4, v + 3), ("north", 2, v + 2), ("north", 1, v + 1)])
            app.heads.apply([("north", 1, v + 1)])  # seen: changes nothing
            # No checkpoint since: the relay wrote the lines, no task ran.
            assert [kind for kind, _ in north.chunks] == ["task", "direct", "direct"]
            assert [kind for kind, _ in both.chunks] == ["task"] + ["direct"] * 3
            assert app.heads.version == v + 3
            await trio.testing.wait_all_tasks_blocked()
            assert len(both.chunks) == 4  # the tasks, run since, wrote nothing more
            nursery.cancel_scope.cancel()
        lines = WatchDecoder("test").feed(b"".join(body for _, body in both.chunks))
        assert lines[1:] == [(v + 1, {"north": 1}), (v + 2, {"north": 2}), (v + 3, {"south": 4})]
        lines = WatchDecoder("test").feed(b"".join(body for _, body in north.chunks))
        assert lines[1:] == [(v + 1, {"north": 1}), (v + 2, {"north": 2})]
    finally:
        store.close()


async def _run_db(fn: Any, *args: Any) -> Any:
    return await trio.to_thread.run_sync(fn, *args)


async def _nothing(version: int) -> None:
    pass


def _hourly_sync(store: Any, relay: HeadRelay, **kw: Any) -> ReplicaSync:
    """A replica's sync whose timed poll is an hour away: what it learns, it learns
    from notifications (or the polls they trigger)."""
    return ReplicaSync(
        store,
        relay,
        run_db=_run_db,
        on_routing_version=_nothing,
        on_credentials_version=_nothing,
        interval_s=3600,
        **kw,
    )


async def test_a_burst_of_batches_reaches_the_other_replica_through_its_notifications(
    postgres: Postgres,
) -> None:
    """50 batches from replica a: b's relay has the last head without its timed poll
    (an hour away), from the notifications' heads, with no poll."""
    url = new_database(postgres)
    a, b = PostgresStore(url), PostgresStore(url)
    relay = HeadRelay(version=0)

    sync = _hourly_sync(b, relay)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sync.run)
            await trio.sleep(1.0)  # LISTEN in place (its thread connects)
            # b's first poll found no head (its relay at version 0): the first
            # note is below its range, so b polls, and is in step after.
            await trio.to_thread.run_sync(a.publish_heads, {"north": 1}, 0)
            with trio.fail_after(10):
                while relay.head("north") != 1:  # noqa: ASYNC110 - the relay has no wait
                    await trio.sleep(0.01)
            before = sync.statistics()
            for seq in range(2, 52):
                await trio.to_thread.run_sync(a.publish_heads, {"north": seq}, 0)
            with trio.fail_after(10):
                while relay.head("north") != 51:  # noqa: ASYNC110 - the relay has no wait
                    await trio.sleep(0.01)
            # In step: every batch from its note, no poll.
            after = sync.statistics()
            assert after.notes_applied - before.notes_applied == 50
            assert after.polls == before.polls
            nursery.cancel_scope.cancel()
    finally:
        a.close()
        b.close()


def test_a_batch_too_big_for_a_payload_and_an_admin_change_notify_without_heads(
    postgres: Postgres,
) -> None:
    url = new_database(postgres)
    store = PostgresStore(url)
    try:
        with psycopg.connect(url, autocommit=True) as listener:
            listener.execute(f"LISTEN {CHANNEL}")
            many = {f"region-{i:05d}": 1 for i in range(NOTE_MAX_HEADS_BYTES // 20)}
            assert len(store.publish_heads(many, 0)) == len(many)
            store.add_region("north", 1)
            notes = [parse_note(n.payload) for n in listener.notifies(timeout=1.0, stop_after=2)]
            assert notes == [(store.replica_id, None), (store.replica_id, None)]
    finally:
        store.close()


def test_notes_that_do_not_follow_the_relay_make_it_poll() -> None:
    """Unreadable payloads and gaps: never applied, a poll instead."""
    assert parse_note("abc") == ("abc", None)
    assert parse_note("abc 1 2 [[") == ("abc", None)
    assert parse_note("abc x 2 []") == ("abc", None)
    sender, note = parse_note('abc 10 12 [["north", 5, 12]]')
    assert sender == "abc"
    assert note is not None
    assert (note.after, note.upto, note.heads) == (10, 12, [("north", 5, 12)])


async def test_a_lost_notification_is_noticed_by_the_next_ones_range(
    postgres: Postgres,
) -> None:
    """b's listener misses a's batch (its relay is behind the next note's range):
    b polls at once and has every head, without its timed poll (an hour away)."""
    url = new_database(postgres)
    a, b = PostgresStore(url), PostgresStore(url)
    relay = HeadRelay(version=0)

    sync = _hourly_sync(b, relay)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sync.run)
            await trio.sleep(1.0)  # LISTEN in place
            # A batch b's listener does not hear: written by a's store under b's id
            # (a replica ignores its own notifications).
            a.replica_id = b.replica_id
            await trio.to_thread.run_sync(a.publish_heads, {"south": 3}, 0)
            a.replica_id = "a"
            polls = sync.statistics().polls
            await trio.to_thread.run_sync(a.publish_heads, {"north": 1}, 0)
            with trio.fail_after(10):
                while relay.head("south") != 3 or relay.head("north") != 1:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert sync.statistics().polls > polls
            assert sync.statistics().notes_applied == 0
            # In step again: the next batch comes from its note, no poll.
            polls = sync.statistics().polls
            await trio.to_thread.run_sync(a.publish_heads, {"north": 2}, 0)
            with trio.fail_after(10):
                while relay.head("north") != 2:  # noqa: ASYNC110 - the relay has no wait
                    await trio.sleep(0.01)
            assert sync.statistics().notes_applied == 1
            assert sync.statistics().polls == polls
            nursery.cancel_scope.cancel()
    finally:
        a.close()
        b.close()


class _SlowStore:
    """A shared store whose head batch waits for the test (a worker thread)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batch_heads: list[tuple[str, int, int]] = []
        self.polls = 0

    def publish_heads(self, moves: dict[str, int], since: int) -> list[tuple[str, int, int]]:
        self.release.wait(10)
        return self.batch_heads

    def poll(self, since: int) -> tuple[int, int, int, list[tuple[str, int, int]]]:
        self.polls += 1
        return 1, 0, 10, [("x", 1, 10)] if since < 10 else []

    def advance_versions(self, seen: int) -> int:
        return seen

    def listen(self, stop: Any, woken: Any) -> None:
        stop.wait()


async def test_a_note_behind_this_replicas_own_batch_waits_for_it_not_for_a_poll() -> None:
    """Replica b's batch (versions 11 to 15) commits just before a's (16 to 20), whose note
    reaches b before b's batch returns: b holds the note until then, and polls only
    if the gap is still there."""
    store = _SlowStore()
    relay = HeadRelay(version=0)

    sync = _hourly_sync(store, relay, notify=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(sync.run)
        assert relay.version == 10
        store.batch_heads = [("b-region", 1, 15)]
        nursery.start_soon(sync.publish, "b-region", 1)
        await trio.testing.wait_all_tasks_blocked()  # b's batch is in the database
        sync._notes.append(HeadsNote(15, 20, [("a-region", 7, 20)]))
        sync._take_notes()
        await trio.testing.wait_all_tasks_blocked()
        assert relay.head("a-region") is None  # held, and no poll
        assert store.polls == 1
        store.release.set()
        with trio.fail_after(10):
            while relay.head("a-region") != 7:  # noqa: ASYNC110 - the relay has no wait
                await trio.sleep(0.01)
        assert relay.version == 20
        assert store.polls == 1
        assert sync.statistics().notes_applied == 1
        # A gap that is not this replica's batch: a poll at once.
        sync._notes.append(HeadsNote(30, 31, [("a-region", 8, 31)]))
        sync._take_notes()
        with trio.fail_after(10):
            while store.polls < 2:  # noqa: ASYNC110 - the store has no wait
                await trio.sleep(0.01)
        assert relay.head("a-region") == 7
        nursery.cancel_scope.cancel()
