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
``pg_notify`` on :data:`CHANNEL`, which wakes the other replicas' polls at
once (:meth:`PostgresStore.listen`): NOTIFY takes a database-wide lock at
commit, so it is paid per batch, and a batch grows with the report rate.
If the database goes back in time (a failover to a standby that had not
received the last transactions, a restore), versions would be issued again
below what replicas have seen, and their long polls would miss those heads:
a replica that finds the sequence below its relay's version moves it past
(:meth:`PostgresStore.advance_versions`).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final, cast
from urllib.parse import urlsplit, urlunsplit

from edge_gateway.errors import ClosedError, ConfigError, InvalidInput, Unavailable
from edge_gateway.metadata._db import Conn, Cursor, SqlStore

__all__ = ["PG_MIGRATIONS", "PostgresStore", "is_postgres_url", "redact_url"]

log = logging.getLogger("edgegw.metadata.pg")

#: Advisory lock keys (any two constants unlikely to clash with another application's).
WRITE_LOCK: Final = 0x6567_7701
HEADS_LOCK: Final = 0x6567_7702
MIGRATE_LOCK: Final = 0x6567_7703
#: The channel replicas NOTIFY after a head batch or an admin change (payload: the sender's id).
CHANNEL: Final = "edgegw_metadata"

#: Migration ``i`` brings ``schema_version`` from ``i`` to ``i + 1``. Append only.
#: 1 is the SQLite schema at its version 4 (tokens with rotation, topic
#: priority and on_full); 2 adds the shared head relay.
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
)

_UPSERT_HEAD: Final = (
    "INSERT INTO heads (region, seq, version) VALUES (%s, %s, nextval('head_versions'))"
    " ON CONFLICT (region) DO UPDATE SET seq = excluded.seq, version = excluded.version"
    " WHERE heads.seq < excluded.seq"
)


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
            check=ConnectionPool.check_connection,
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
                for statement in PG_MIGRATIONS[i].split(";"):
                    if statement.strip():
                        conn.execute(statement)
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
                yield conn
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

    # ---------------------------------------------------------------- heads

    def publish_heads(self, moves: Mapping[str, int], since: int) -> list[tuple[str, int, int]]:
        """Record ``moves`` (region -> seq; a seq not above the stored one changes
        nothing) and return every head of a version above ``since``, these included.

        One transaction under :data:`HEADS_LOCK`, so versions commit in order.
        """
        with self._connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (HEADS_LOCK,))
            with conn.cursor() as cur:
                cur.executemany(_UPSERT_HEAD, list(moves.items()))
            rows = conn.execute(
                "SELECT region, seq, version FROM heads WHERE version > %s", (since,)
            ).fetchall()
            # One notification per batch, not per report: see the module docstring.
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self.replica_id))
        return [(str(r), int(s), int(v)) for r, s, v in rows]

    def listen(self, stop: threading.Event, woken: Callable[[], None]) -> None:
        """Call ``woken()`` when another replica notifies a change, until ``stop`` is set.

        Blocking (a worker thread); its own connection, outside the pool. A
        lost connection is opened again (every 0.5 s while it fails), and
        ``woken()`` is called once it is back: notifications sent meanwhile
        are lost, the poll that follows finds their changes.
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
                        woken()
                    while not stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.payload != self.replica_id:
                                woken()
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
            meta = dict(
                conn.execute(
                    "SELECT key, value FROM meta"
                    " WHERE key IN ('routing_version', 'credentials_version')"
                ).fetchall()
            )
            rows = conn.execute(
                "SELECT region, seq, version FROM heads WHERE version > %s", (since,)
            ).fetchall()
            (issued,) = conn.execute("SELECT last_value FROM head_versions").fetchone()
        heads = [(str(r), int(s), int(v)) for r, s, v in rows]
        routing, credentials = int(meta["routing_version"]), int(meta.get("credentials_version", 0))
        return routing, credentials, int(issued), heads
