"""The metadata server's PostgreSQL store: several replicas over one database.

``edgegw metadata serve --db postgresql://...`` opens a :class:`PostgresStore`.
The logic (tokens, topics, regions, bucket locations, routing versions) is
:class:`~edge_gateway.metadata._db.SqlStore`'s, the same SQL as SQLite's;
this module gives it connections and keeps its own versioned migrations
(table ``schema_version``).

Connections come from a psycopg-pool :class:`~psycopg_pool.ConnectionPool`
of synchronous psycopg 3 connections, used from worker threads (the server
runs under trio; psycopg's async API is asyncio's). A connection is checked
when taken from the pool, so after PostgreSQL restarts the first calls find
the dead ones, drop them and connect again: the replicas reconnect by
themselves. Meanwhile a call fails with :class:`~edge_gateway.errors.Unavailable`
(the server answers 503).

Writes that the SQLite store serialises with ``BEGIN IMMEDIATE`` take one
transaction-scoped advisory lock here (:data:`WRITE_LOCK`): two replicas
creating one topic at once still give one 201 and one 409.

**Heads.** Unlike SQLite's single server, replicas share the head relay
through table ``heads`` (region, seq, version). Versions come from sequence
``head_versions``, taken under advisory lock :data:`HEADS_LOCK`, so versions
commit in order: a replica that has seen version V has seen every head of a
version <= V. Each replica writes the reports it receives in batches (group
commit: :meth:`PostgresStore.publish_heads`) and reads the others' moves with
:meth:`PostgresStore.poll` (see :mod:`edge_gateway.metadata._replicas`).
Each batch (not each report) and each admin change ends with one
``pg_notify`` on :data:`CHANNEL` (:meth:`PostgresStore.listen`): NOTIFY takes
a database-wide lock at commit, so it is paid per batch, and a batch grows
with the report rate. A batch's notification carries its moves and its
range of versions (:func:`parse_note`), so another replica in step applies
them without a poll; an admin change's, or a batch too big for a payload,
makes the others poll at once.
If the database goes back in time (a failover to a standby that had not
received the last transactions, a restore), versions would be issued again
below what replicas have seen, and their long polls would miss those heads:
a replica that finds the sequence below its relay's version moves it past
(:meth:`PostgresStore.advance_versions`).
"""

from __future__ import annotations

import json
import logging
import select
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, cast
from urllib.parse import urlsplit, urlunsplit

from edge_gateway.errors import ClosedError, ConfigError, InvalidInput, Unavailable
from edge_gateway.metadata._db import Conn, Cursor, SqlStore

__all__ = [
    "PG_MIGRATIONS",
    "HeadsNote",
    "PostgresStore",
    "is_postgres_url",
    "parse_note",
    "redact_url",
]

log = logging.getLogger("edgegw.metadata.pg")

#: Advisory lock keys (any two constants unlikely to clash with another application's).
WRITE_LOCK: Final = 0x6567_7701
HEADS_LOCK: Final = 0x6567_7702
MIGRATE_LOCK: Final = 0x6567_7703
#: The channel replicas NOTIFY after a head batch or an admin change (payload: the
#: sender's id, then for a batch its heads: :func:`parse_note`).
CHANNEL: Final = "edgegw_metadata"
#: A batch's moves longer than this (as JSON) are not put in its notification.
NOTE_MAX_HEADS_BYTES: Final = 7_000

#: Migration ``i`` brings ``schema_version`` from ``i`` to ``i + 1``. Append only.
#: 1 is the SQLite schema at its version 4 (tokens with rotation, topic
#: priority and on_full); 2 adds the shared head relay; 3 writes a head batch in
#: one round trip (a function). Each runs whole (PostgreSQL's simple query
#: protocol takes several statements), not split at semicolons: a function's
#: body has its own.
PG_MIGRATIONS: Final[tuple[str, ...]] = (
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE regions (
        id TEXT PRIMARY KEY,
        token_id TEXT UNIQUE,
        token_hash TEXT,
        created_ms BIGINT NOT NULL,
        revoked_ms BIGINT,
        last_heartbeat_ms BIGINT,
        gateway_version TEXT,
        lag_json TEXT,
        prev_token_id TEXT UNIQUE,
        prev_token_hash TEXT,
        prev_expires_ms BIGINT
    );
    CREATE TABLE topics (
        name TEXT PRIMARY KEY,
        home TEXT NOT NULL REFERENCES regions(id),
        partitions INTEGER NOT NULL CHECK (partitions >= 1),
        retention_ms BIGINT,
        subscribers TEXT NOT NULL,
        created_ms BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL,
        priority TEXT NOT NULL DEFAULT 'normal'
            CHECK (priority IN ('critical', 'normal', 'bulk')),
        on_full TEXT NOT NULL DEFAULT 'block' CHECK (on_full IN ('block', 'drop-oldest'))
    );
    CREATE TABLE buckets (name TEXT PRIMARY KEY, settings TEXT NOT NULL);
    INSERT INTO meta (key, value) VALUES ('routing_version', '1');
    """,
    # Versions start at the creation time in microseconds: above any version a
    # gateway got from a SQLite server before the fleet moved here (those start
    # at that server's start time), so its first poll here gets every head.
    """
    CREATE TABLE heads (region TEXT PRIMARY KEY, seq BIGINT NOT NULL, version BIGINT NOT NULL);
    CREATE SEQUENCE head_versions AS BIGINT;
    SELECT setval('head_versions', (extract(epoch FROM clock_timestamp()) * 1000000)::BIGINT);
    """,
    # A head batch in one round trip (PostgresStore.publish_heads): the lock, the
    # upserts, the notification and the heads since the caller's version, in one
    # statement's transaction. The lock is held for the server-side work only,
    # not across the replica's round trips, so the replicas' batches queue less
    # behind each other. Versions are taken under the lock, as before. The
    # notification carries the batch's moves (see parse_note), unless they would
    # not fit in a payload (8,000 bytes): then the others poll.
    f"""
    CREATE FUNCTION edgegw_publish_heads(regions TEXT[], seqs BIGINT[], since BIGINT, sender TEXT)
    RETURNS TABLE (region TEXT, seq BIGINT, version BIGINT) LANGUAGE plpgsql AS $body$
    DECLARE
        v_after BIGINT;
        v_upto BIGINT;
        moved TEXT;
    BEGIN
        PERFORM pg_advisory_xact_lock({HEADS_LOCK});
        SELECT s.last_value INTO v_after FROM head_versions AS s;
        -- A version only for a head that moves (none taken and left unused), so
        -- the sequence stays at the last committed head's version and the next
        -- batch's range starts there: replicas in step apply notes, no poll.
        WITH u AS (
            SELECT r AS region, s AS seq FROM unnest(regions, seqs) AS x (r, s)
        ), up AS (
            UPDATE heads AS h SET seq = u.seq, version = nextval('head_versions')
            FROM u WHERE h.region = u.region AND h.seq < u.seq
            RETURNING h.region, h.seq, h.version
        ), ins AS (
            INSERT INTO heads (region, seq, version)
            SELECT u.region, u.seq, nextval('head_versions') FROM u
            WHERE NOT EXISTS (SELECT 1 FROM heads AS h WHERE h.region = u.region)
            RETURNING heads.region, heads.seq, heads.version
        ), m AS (
            SELECT * FROM up UNION ALL SELECT * FROM ins
        )
        SELECT COALESCE(json_agg(json_build_array(m.region, m.seq, m.version)), '[]')::TEXT
            INTO moved FROM m;
        SELECT s.last_value INTO v_upto FROM head_versions AS s;
        IF length(moved) <= {NOTE_MAX_HEADS_BYTES} THEN
            PERFORM pg_notify('{CHANNEL}', concat_ws(' ', sender, v_after, v_upto, moved));
        ELSE
            PERFORM pg_notify('{CHANNEL}', sender);
        END IF;
        RETURN QUERY SELECT h.region, h.seq, h.version FROM heads AS h WHERE h.version > since;
    END
    $body$;
    """,  # noqa: S608 - constants of this module, no input
)


@dataclass(frozen=True, slots=True)
class HeadsNote:
    """A head batch as its notification tells it: every head that moved with a
    version in (``after``, ``upto``], the batch's whole range of versions."""

    after: int
    upto: int
    heads: list[tuple[str, int, int]]


def parse_note(payload: str) -> tuple[str, HeadsNote | None]:
    """(sender, the batch's heads) of a notification on :data:`CHANNEL`.

    ``None``: a change to fetch with a poll (an admin change, a batch too big
    for a payload, a payload this edgegw does not read).
    """
    sender, _, rest = payload.partition(" ")
    if not rest:
        return sender, None
    try:
        after, upto, moved = rest.split(" ", 2)
        heads = [(str(r), int(s), int(v)) for r, s, v in json.loads(moved)]
        return sender, HeadsNote(int(after), int(upto), heads)
    except (ValueError, TypeError):
        return sender, None


#: A replica's poll in one round trip (one statement: a snapshot of all four).
_POLL: Final = (
    "SELECT (SELECT value FROM meta WHERE key = 'routing_version'),"
    " (SELECT value FROM meta WHERE key = 'credentials_version'),"
    " (SELECT last_value FROM head_versions),"
    " (SELECT json_agg(json_build_array(region, seq, version)) FROM heads WHERE version > %s)"
)


#: A pooled connection used less than this long ago is taken without a check.
CHECK_IDLE_S: Final = 1.0


def _checker(check: Callable[[Any], None]) -> Callable[[Any], None]:
    """The pool's check of a connection it hands out, when there is reason to.

    The check is a round trip (an empty query): on every call it doubled a
    head batch's round trips. A connection used within :data:`CHECK_IDLE_S`
    whose socket has nothing to read is taken as it is: an idle connection
    has nothing to read unless the server ended it (a restart, a stop: it
    sends its error and closes), which a zero-timeout ``select`` sees without
    a round trip. Otherwise the check runs, and finds a dead one as before.
    """

    def check_if_needed(conn: Any) -> None:
        used_at = getattr(conn, "_edgegw_used_at", None)
        if used_at is not None and time.monotonic() - used_at < CHECK_IDLE_S:
            try:
                readable, _, _ = select.select([conn.fileno()], [], [], 0)
            except (OSError, ValueError):  # closed, or no socket: let the check say
                readable = [True]
            if not readable:
                return
        check(conn)

    return check_if_needed


def is_postgres_url(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))


def redact_url(url: str) -> str:
    """``url`` without its password (for logs and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


class _PgConn:
    """A psycopg connection taking ``?`` placeholders (the SQL shared with SQLite)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor:
        return cast(Cursor, self.conn.execute(sql.replace("?", "%s"), tuple(params)))


class PostgresStore(SqlStore):
    """Regions, topics, bucket locations and heads in PostgreSQL, shared by replicas."""

    shared = True

    def __init__(self, url: str, *, pool_size: int = 8, connect_timeout_s: float = 10.0) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool, PoolTimeout
        except ImportError:
            raise ConfigError(
                "a postgresql:// database needs psycopg and psycopg-pool: "
                "pip install 'edgegw[postgres]'"
            ) from None
        self.url = url
        self.concurrency = pool_size
        #: Names this process's notifications, so that it ignores its own.
        self.replica_id = uuid.uuid4().hex
        self._refused: type[BaseException] = psycopg.DataError
        self._errors: tuple[type[BaseException], ...] = (
            psycopg.OperationalError,
            psycopg.InterfaceError,
            PoolTimeout,
        )
        self._pool: Any = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "connect_timeout": 5},
            check=_checker(ConnectionPool.check_connection),
            # Calls never wait for a connection the pool has (the server runs at
            # most pool_size at once): a wait is PostgreSQL being away, so fail
            # soon (503) rather than hold the request.
            timeout=2.0,
            # Keep trying to reconnect while PostgreSQL is away (default: 5 min, then give up).
            reconnect_timeout=365 * 86400.0,
            name="edgegw-metadata",
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
            self._migrate()
        except self._errors as exc:
            self._pool.close()
            raise ConfigError(f"{self.describe()}: cannot use the database: {exc}") from None
        except psycopg.Error as exc:
            self._pool.close()
            raise ConfigError(f"{self.describe()}: not a usable metadata database: {exc}") from None
        except BaseException:
            self._pool.close()
            raise
        self._closed = False

    def describe(self) -> str:
        return redact_url(self.url)

    def _migrate(self) -> None:
        with self._pool.connection() as conn, conn.transaction():
            # Replicas starting together: one migrates, the others wait and find it done.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = conn.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                conn.execute("INSERT INTO schema_version (version) VALUES (0)")
            version = 0 if row is None else int(row[0])
            if version > len(PG_MIGRATIONS):
                raise ConfigError(
                    f"the metadata database has schema version {version}; this edgegw knows "
                    f"up to {len(PG_MIGRATIONS)} (written by a newer edgegw?)"
                )
            # PostgreSQL's DDL is transactional: all of it, or none.
            for i in range(version, len(PG_MIGRATIONS)):
                conn.execute(PG_MIGRATIONS[i])
                conn.execute("UPDATE schema_version SET version = %s", (i + 1,))
                log.info("metadata database %s: schema version %d", self.describe(), i + 1)

    @property
    def schema_version(self) -> int:
        with self._read() as db:
            return int(db.execute("SELECT version FROM schema_version").fetchone()[0])

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.close()

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        if self._closed:
            raise ClosedError("the metadata store is closed")
        try:
            with self._pool.connection() as conn:
                try:
                    yield conn
                finally:
                    conn._edgegw_used_at = time.monotonic()  # see _checker
        except self._errors as exc:
            raise Unavailable(f"metadata database {self.describe()}: {exc}") from None
        except self._refused as exc:  # a value the schema cannot hold: the request's fault
            raise InvalidInput(f"the metadata database refused a value: {exc}") from None

    @contextmanager
    def _read(self) -> Iterator[Conn]:
        with self._connection() as conn:
            yield _PgConn(conn)

    @contextmanager
    def _write(self, *, serialize: bool = True) -> Iterator[Conn]:
        with self._connection() as conn, conn.transaction():
            if serialize:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            yield _PgConn(conn)
            if serialize:  # an admin change (rare): the other replicas poll at once
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self.replica_id))

    def heartbeats(self, beats: Sequence[tuple[str, str, Mapping[str, float], int]]) -> None:
        """Several regions' heartbeats in one transaction, in a pipeline.

        A fleet's write-behind heartbeats (~500 a second per replica at 10,000
        gateways) one transaction each cost a pool check, BEGIN, UPDATE and
        COMMIT: four round trips apiece. Here a batch is one. No write lock: each
        heartbeat touches its own row; an unknown or revoked region updates
        nothing, as :meth:`SqlStore.heartbeats` skips it.
        """
        if not beats:
            return
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                "UPDATE regions SET last_heartbeat_ms = %s, gateway_version = %s, lag_json = %s"
                " WHERE id = %s AND revoked_ms IS NULL",
                [
                    (now_ms, version, json.dumps(dict(lag), sort_keys=True), region)
                    for region, version, lag, now_ms in beats
                ],
            )

    # ---------------------------------------------------------------- heads

    def publish_heads(self, moves: Mapping[str, int], since: int) -> list[tuple[str, int, int]]:
        """Record ``moves`` (region -> seq; a seq not above the stored one changes
        nothing) and return every head of a version above ``since``, these included.

        One transaction under :data:`HEADS_LOCK`, so versions commit in order.
        """
        # One round trip (migration 3's function), one notification per batch,
        # not per report: see the module docstring.
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT region, seq, version FROM edgegw_publish_heads(%s, %s, %s, %s)",
                (list(moves), list(moves.values()), since, self.replica_id),
            ).fetchall()
        return [(str(r), int(s), int(v)) for r, s, v in rows]

    def listen(self, stop: threading.Event, woken: Callable[[HeadsNote | None], None]) -> None:
        """Call ``woken(note)`` when another replica notifies a change, until ``stop`` is set.

        ``note``: the heads of a batch (:func:`parse_note`), or None for a
        change to poll for. Blocking (a worker thread); its own connection,
        outside the pool; notifications come in commit order. A lost
        connection is opened again (every 0.5 s while it fails), and
        ``woken(None)`` is called once it is back: notifications sent
        meanwhile are lost, the poll that follows finds their changes.
        """
        import psycopg

        broken = False
        while not stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if broken:
                        log.info("metadata database: listening for changes again")
                        broken = False
                        woken(None)
                    while not stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            sender, heads = parse_note(note.payload)
                            if sender != self.replica_id:
                                woken(heads)
            except psycopg.Error as exc:
                if not broken:
                    log.warning("metadata database: not listening for changes: %s", exc)
                broken = True
                stop.wait(0.5)

    def advance_versions(self, seen: int) -> int:
        """Move the head version sequence to at least ``seen``; its value."""
        with self._connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (HEADS_LOCK,))
            row = conn.execute(
                "SELECT setval('head_versions', GREATEST(last_value, %s)) FROM head_versions",
                (seen,),
            ).fetchone()
        return int(row[0])

    def poll(self, since: int) -> tuple[int, int, int, list[tuple[str, int, int]]]:
        """(routing version, credentials version, the last head version issued,
        heads of a version above ``since``)."""
        with self._connection() as conn:
            routing, credentials, issued, rows = conn.execute(_POLL, (since,)).fetchone()
        heads = [(str(r), int(s), int(v)) for r, s, v in rows or ()]
        return int(routing), int(credentials or 0), int(issued), heads
