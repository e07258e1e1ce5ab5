"""The metadata server's store: SQLite in WAL mode, versioned schema migrations.

Every call is synchronous and short; the server runs them in one worker
thread at a time (the store is not shared between threads concurrently).
Each change runs in one ``BEGIN IMMEDIATE`` transaction, so two concurrent
creations of the same topic cannot both succeed: the second one sees the row
and gets :class:`Refused` (409 ``topic_exists``).

The routing version (``meta.routing_version``) is bumped in the same
transaction as every change to topics, regions or bucket locations, so a
version always names exactly one routing table. Heartbeats do not bump it.

Tokens are never stored: region tokens are ``egw_<id>_<secret>``, the id
finds the row and the token is checked against a salted SHA-256 hash
(:func:`hash_token`; hashes written by earlier servers are scrypt, still
verified and replaced on their first successful check:
:meth:`SqlStore.upgrade_token_hash`); the admin token's hash lives in
``meta.admin_token``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, ClassVar, Final, Protocol, cast

from edge_gateway.errors import ClosedError, ConfigError, InvalidInput
from edge_gateway.metadata.routing import (
    ALL,
    BucketLocation,
    RoutingTable,
    TopicRoute,
    parse_on_full,
    parse_partitions,
    parse_priority,
    parse_retention,
    parse_subscribers,
)
from edge_gateway.names import validate_region, validate_topic

__all__ = [
    "MIGRATIONS",
    "MetadataStore",
    "Refused",
    "SqlStore",
    "hash_token",
    "is_legacy_hash",
    "verify_token",
]


class Cursor(Protocol):
    """What the stores use of a DB-API cursor (sqlite3 and psycopg alike)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """A connection that runs one statement with ``?`` placeholders."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Cursor: ...


#: Schema migrations; migration ``i`` brings ``PRAGMA user_version`` from ``i`` to ``i + 1``.
#: Append only: never edit a migration that has shipped.
MIGRATIONS: Final[tuple[str, ...]] = (
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
    CREATE TABLE regions (
        id TEXT PRIMARY KEY,
        token_id TEXT UNIQUE,
        token_hash TEXT,
        created_ms INTEGER NOT NULL,
        revoked_ms INTEGER,
        last_heartbeat_ms INTEGER,
        gateway_version TEXT,
        lag_json TEXT
    );
    CREATE TABLE topics (
        name TEXT PRIMARY KEY,
        home TEXT NOT NULL REFERENCES regions(id),
        partitions INTEGER NOT NULL CHECK (partitions >= 1),
        retention_ms INTEGER,
        subscribers TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL
    );
    CREATE TABLE buckets (name TEXT PRIMARY KEY, settings TEXT NOT NULL);
    INSERT INTO meta (key, value) VALUES ('routing_version', '1');
    """,
    # 2: token rotation. During a rotation a region has two valid tokens: the
    # new one (token_id/token_hash) and the previous one until prev_expires_ms.
    """
    ALTER TABLE regions ADD COLUMN prev_token_id TEXT;
    ALTER TABLE regions ADD COLUMN prev_token_hash TEXT;
    ALTER TABLE regions ADD COLUMN prev_expires_ms INTEGER;
    CREATE UNIQUE INDEX regions_prev_token_id ON regions (prev_token_id);
    """,
    # 3: topic priorities (the journal lane at the home region). Every topic
    # stored before is 'normal', as the gateways treated it.
    """
    ALTER TABLE topics ADD COLUMN priority TEXT NOT NULL DEFAULT 'normal'
        CHECK (priority IN ('critical', 'normal', 'bulk'));
    """,
    # 4: a topic's on_full policy (its lane at the home region drops its oldest
    # unshipped records when full, or refuses appends). Every topic stored
    # before is 'block', as the gateways treated it.
    """
    ALTER TABLE topics ADD COLUMN on_full TEXT NOT NULL DEFAULT 'block'
        CHECK (on_full IN ('block', 'drop-oldest'));
    """,
)

#: The tables ``edgegw metadata migrate`` copies, with their columns, in an
#: order that satisfies the foreign keys.
COPIED_TABLES: Final[dict[str, tuple[str, ...]]] = {
    "meta": ("key", "value"),
    "regions": (
        "id",
        "token_id",
        "token_hash",
        "created_ms",
        "revoked_ms",
        "last_heartbeat_ms",
        "gateway_version",
        "lag_json",
        "prev_token_id",
        "prev_token_hash",
        "prev_expires_ms",
    ),
    "topics": (
        "name",
        "home",
        "partitions",
        "retention_ms",
        "subscribers",
        "created_ms",
        "updated_ms",
        "priority",
        "on_full",
    ),
    "buckets": ("name", "settings"),
}

# Token hashes. Every token this server issues is high-entropy: a region
# token carries 256 random bits (token_urlsafe(32)), and the admin token is
# the operator's, at least 16 characters (the docs say `openssl rand -hex 24`).
# A deliberately slow KDF (scrypt, bcrypt, Argon2) exists to make guessing a
# low-entropy *password* from its hash expensive; against 2**256 candidates
# one SHA-256 is as out of reach as one scrypt, and costs ~1 µs instead of
# ~40 ms and 16 MiB (docs/security.md, "How tokens are stored"). Salted all the
# same, so equal tokens never share a hash.
_SHA256: Final = "sha256"
_SALT_BYTES: Final = 16
# The scheme of earlier servers: verified, never written; replaced on a check.
_SCRYPT: Final = "scrypt"
REGION_TOKEN_PREFIX: Final = "egw_"  # noqa: S105 - a prefix, not a secret


class Refused(InvalidInput):
    """A request the store refuses; ``status`` and ``code`` are the HTTP answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def hash_token(token: str) -> str:
    """A salted SHA-256 hash of ``token``: ``sha256$<salt hex>$<sha256(salt + token) hex>``."""
    salt = secrets.token_bytes(_SALT_BYTES)
    return f"{_SHA256}${salt.hex()}${_sha256(salt, token).hex()}"


def is_legacy_hash(stored: str) -> bool:
    """Whether ``stored`` is a hash of an earlier scheme (scrypt), to be replaced once verified."""
    return stored.startswith(_SCRYPT + "$")


def verify_token(token: str, stored: str) -> bool:
    """Whether ``token`` matches ``stored`` (a :func:`hash_token` hash, or an
    earlier server's ``scrypt$n$r$p$<salt>$<hash>``), compared in constant time.

    A scrypt check takes ~40 ms and 16 MiB: call it off the event loop
    (:func:`is_legacy_hash` says which).
    """
    try:
        scheme, _, rest = stored.partition("$")
        if scheme == _SHA256:
            salt, digest = rest.split("$")
            expected = bytes.fromhex(digest)
            got = _sha256(bytes.fromhex(salt), token)
        elif scheme == _SCRYPT:
            n, r, p, salt, digest = rest.split("$")
            expected = bytes.fromhex(digest)
            got = hashlib.scrypt(
                token.encode("utf-8", "surrogateescape"),
                salt=bytes.fromhex(salt),
                n=int(n),
                r=int(r),
                p=int(p),
                dklen=len(expected),
            )
        else:
            return False
    except ValueError:
        return False
    return hmac.compare_digest(got, expected)


def _sha256(salt: bytes, token: str) -> bytes:
    return hashlib.sha256(salt + token.encode("utf-8", "surrogateescape")).digest()


def split_region_token(token: str) -> str | None:
    """The token id of a region token (``egw_<id>_<secret>``), or None."""
    if not token.startswith(REGION_TOKEN_PREFIX):
        return None
    token_id, sep, secret = token[len(REGION_TOKEN_PREFIX) :].partition("_")
    if not sep or not secret or len(token_id) != 16:
        return None
    return token_id


def _new_region_token() -> tuple[str, str, str]:
    """(token id, token, its hash) of a fresh region token ``egw_<id>_<secret>``."""
    token_id = secrets.token_hex(8)
    token = f"{REGION_TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
    return token_id, token, hash_token(token)


class SqlStore:
    """Regions, topics and bucket locations in a SQL database: the logic every store shares.

    A subclass gives the connections: :meth:`_read` (no transaction needed)
    and :meth:`_write` (one transaction; ``serialize=True`` also serialises
    it with every other such write, as SQLite's ``BEGIN IMMEDIATE`` does).
    The SQL here runs on SQLite and PostgreSQL alike, written with ``?``
    placeholders.
    """

    #: Several replicas share the database (PostgreSQL): each one learns the
    #: others' changes by polling it (``_replicas``), and head reports go through it.
    shared: ClassVar[bool] = False
    #: How many calls may run at once (worker threads).
    concurrency: int = 1

    def _read(self) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def _write(self, *, serialize: bool = True) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    @property
    def schema_version(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        """Where the data is, for logs (no password)."""
        raise NotImplementedError

    # ------------------------------------------------------------ plumbing

    @staticmethod
    def _bump(db: Conn) -> None:
        db.execute(
            "UPDATE meta SET value = CAST(CAST(value AS BIGINT) + 1 AS TEXT)"
            " WHERE key = 'routing_version'"
        )

    @staticmethod
    def _bump_credentials(db: Conn) -> None:
        """Count a change of who may do what (other replicas then forget verified tokens)."""
        db.execute(
            "INSERT INTO meta (key, value) VALUES ('credentials_version', '1')"
            " ON CONFLICT (key) DO UPDATE"
            " SET value = CAST(CAST(meta.value AS BIGINT) + 1 AS TEXT)"
        )

    def routing_version(self) -> int:
        with self._read() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'routing_version'").fetchone()
        return int(row[0])

    # ---------------------------------------------------------- admin token

    def admin_token_hash(self) -> str | None:
        with self._read() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'admin_token'").fetchone()
        return str(row[0]) if row else None

    def set_admin_token_hash(self, hashed: str) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO meta (key, value) VALUES ('admin_token', ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (hashed,),
            )
            self._bump_credentials(db)

    def upgrade_token_hash(self, old: str, new: str) -> bool:
        """Replace the stored hash ``old`` (a verified legacy one) by ``new``, of the same token.

        Wherever ``old`` is: a region's current or previous token, or the
        admin token. Compare-and-set on ``old``: a rotation or revocation in
        between wins, and nothing changes. The token stays the same, so no
        credentials version is bumped (other replicas' verified tokens stay
        valid). True when a hash was replaced.
        """
        with self._write(serialize=False) as db:
            n = db.execute(
                "UPDATE regions SET token_hash = ? WHERE token_hash = ?", (new, old)
            ).rowcount
            n += db.execute(
                "UPDATE regions SET prev_token_hash = ? WHERE prev_token_hash = ?", (new, old)
            ).rowcount
            n += db.execute(
                "UPDATE meta SET value = ? WHERE key = 'admin_token' AND value = ?", (new, old)
            ).rowcount
        return n > 0

    # -------------------------------------------------------------- regions

    def region_token(self, token_id: str, now_ms: int) -> tuple[str, str, int | None] | None:
        """(region, token hash, valid until ms or None) of a valid region token id, or None.

        The current token is valid until the region is revoked or the token
        rotated; the previous one, after a rotation, until ``prev_expires_ms``.
        """
        with self._read() as db:
            row = db.execute(
                "SELECT id, token_hash FROM regions WHERE token_id = ? AND revoked_ms IS NULL",
                (token_id,),
            ).fetchone()
            if row is not None:
                return (str(row[0]), str(row[1]), None)
            row = db.execute(
                "SELECT id, prev_token_hash, prev_expires_ms FROM regions"
                " WHERE prev_token_id = ? AND revoked_ms IS NULL AND prev_expires_ms > ?",
                (token_id, now_ms),
            ).fetchone()
        return (str(row[0]), str(row[1]), int(row[2])) if row else None

    def add_region(self, region: str, now_ms: int) -> str:
        """Register ``region`` (or re-activate a revoked one); returns its new token."""
        validate_region(region)
        token_id, token, hashed = _new_region_token()
        with self._write() as db:
            row = db.execute("SELECT revoked_ms FROM regions WHERE id = ?", (region,)).fetchone()
            if row is not None and row[0] is None:
                raise Refused(409, "region_exists", f"region {region!r} already exists")
            if row is None:
                db.execute(
                    "INSERT INTO regions (id, token_id, token_hash, created_ms)"
                    " VALUES (?, ?, ?, ?)",
                    (region, token_id, hashed, now_ms),
                )
            else:
                db.execute(
                    "UPDATE regions SET token_id = ?, token_hash = ?, revoked_ms = NULL,"
                    " prev_token_id = NULL, prev_token_hash = NULL, prev_expires_ms = NULL"
                    " WHERE id = ?",
                    (token_id, hashed, region),
                )
            self._bump(db)
            self._bump_credentials(db)
        return token

    def rotate_region_token(self, region: str, now_ms: int, keep_previous_ms: int) -> str:
        """Issue ``region`` a new token; the current one stays valid ``keep_previous_ms``.

        Two tokens at most: a token still in its grace period from an earlier
        rotation ends now. ``keep_previous_ms = 0`` invalidates the current
        token at once (a leaked one).
        """
        if keep_previous_ms < 0:
            raise InvalidInput(f"keep_previous_ms must be >= 0, got {keep_previous_ms}")
        token_id, token, hashed = _new_region_token()
        with self._write() as db:
            row = db.execute(
                "SELECT revoked_ms, token_id, token_hash FROM regions WHERE id = ?", (region,)
            ).fetchone()
            if row is None or row[0] is not None:
                raise _unknown_region(region)
            keep = keep_previous_ms > 0
            db.execute(
                "UPDATE regions SET token_id = ?, token_hash = ?, prev_token_id = ?,"
                " prev_token_hash = ?, prev_expires_ms = ? WHERE id = ?",
                (
                    token_id,
                    hashed,
                    row[1] if keep else None,
                    row[2] if keep else None,
                    now_ms + keep_previous_ms if keep else None,
                    region,
                ),
            )
            self._bump_credentials(db)
        return token

    def revoke_region(self, region: str, now_ms: int) -> None:
        """Invalidate ``region``'s token; its topics stay (the region can be re-added)."""
        with self._write() as db:
            row = db.execute("SELECT revoked_ms FROM regions WHERE id = ?", (region,)).fetchone()
            if row is None:
                raise _unknown_region(region)
            if row[0] is None:
                db.execute(
                    "UPDATE regions SET revoked_ms = ?, token_id = NULL, token_hash = NULL,"
                    " prev_token_id = NULL, prev_token_hash = NULL, prev_expires_ms = NULL"
                    " WHERE id = ?",
                    (now_ms, region),
                )
                self._bump(db)
                self._bump_credentials(db)

    def heartbeat(
        self, region: str, gateway_version: str, lag: Mapping[str, float], now_ms: int
    ) -> None:
        # No write lock: a heartbeat touches its own row only.
        with self._write(serialize=False) as db:
            cur = db.execute(
                "UPDATE regions SET last_heartbeat_ms = ?, gateway_version = ?, lag_json = ?"
                " WHERE id = ? AND revoked_ms IS NULL",
                (now_ms, gateway_version, json.dumps(dict(lag), sort_keys=True), region),
            )
            if cur.rowcount == 0:
                raise _unknown_region(region)

    def heartbeats(self, beats: Sequence[tuple[str, str, Mapping[str, float], int]]) -> None:
        """Several regions' :meth:`heartbeat` (region, gateway version, lag, now_ms each);
        a region unknown or revoked since is skipped (its heartbeat no longer matters)."""
        for region, gateway_version, lag, now_ms in beats:
            with contextlib.suppress(Refused):
                self.heartbeat(region, gateway_version, lag, now_ms)

    def regions(self) -> list[dict[str, Any]]:
        with self._read() as db:
            rows = db.execute(
                "SELECT id, created_ms, revoked_ms, last_heartbeat_ms, gateway_version, lag_json"
                " FROM regions ORDER BY id"
            ).fetchall()
        return [_region_json(r) for r in rows]

    def region(self, region: str) -> dict[str, Any]:
        with self._read() as db:
            row = db.execute(
                "SELECT id, created_ms, revoked_ms, last_heartbeat_ms, gateway_version, lag_json"
                " FROM regions WHERE id = ?",
                (region,),
            ).fetchone()
        if row is None:
            raise _unknown_region(region)
        return _region_json(row)

    # --------------------------------------------------------------- topics

    def create_topic(self, topic: TopicRoute, now_ms: int) -> None:
        with self._write() as db:
            self._check_regions(db, topic.home, topic.subscribers)
            if db.execute("SELECT 1 FROM topics WHERE name = ?", (topic.name,)).fetchone():
                raise Refused(409, "topic_exists", f"topic {topic.name!r} already exists")
            db.execute(
                "INSERT INTO topics (name, home, partitions, retention_ms, subscribers,"
                " priority, on_full, created_ms, updated_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    topic.name,
                    topic.home,
                    topic.partitions,
                    topic.retention_ms,
                    _subs_text(topic.subscribers),
                    topic.priority,
                    topic.on_full,
                    now_ms,
                    now_ms,
                ),
            )
            self._bump(db)

    def alter_topic(self, name: str, changes: Mapping[str, Any], now_ms: int) -> TopicRoute:
        """Apply ``changes`` (partitions, retention_ms, subscribers, priority, on_full);
        returns the new topic."""
        allowed = {"partitions", "retention_ms", "subscribers", "priority", "on_full"}
        extra = sorted(set(changes) - allowed)
        if extra:
            hint = " (a topic's home region cannot change)" if "home" in extra else ""
            raise InvalidInput(f"cannot alter {', '.join(map(repr, extra))}{hint}")
        with self._write() as db:
            current = self._topic(db, name)
            partitions = current.partitions
            if "partitions" in changes:
                partitions = parse_partitions(changes["partitions"])
                if partitions < current.partitions:
                    raise Refused(
                        400,
                        "partitions_shrink",
                        f"topic {name!r} has {current.partitions} partitions; "
                        f"partitions can only grow (asked for {partitions})",
                    )
            retention = current.retention_ms
            if "retention_ms" in changes:
                retention = parse_retention(changes["retention_ms"])
            subscribers = current.subscribers
            if "subscribers" in changes:
                subscribers = parse_subscribers(changes["subscribers"], current.home)
                self._check_regions(db, current.home, subscribers)
            priority = current.priority
            if "priority" in changes:
                priority = parse_priority(changes["priority"])
            on_full = current.on_full
            if "on_full" in changes:
                on_full = parse_on_full(changes["on_full"])
            new = TopicRoute(
                name, current.home, partitions, retention, subscribers, priority, on_full
            )
            if new != current:
                db.execute(
                    "UPDATE topics SET partitions = ?, retention_ms = ?, subscribers = ?,"
                    " priority = ?, on_full = ?, updated_ms = ? WHERE name = ?",
                    (
                        partitions,
                        retention,
                        _subs_text(subscribers),
                        priority,
                        on_full,
                        now_ms,
                        name,
                    ),
                )
                self._bump(db)
            return new

    def delete_topic(self, name: str) -> None:
        with self._write() as db:
            if db.execute("DELETE FROM topics WHERE name = ?", (name,)).rowcount == 0:
                raise _unknown_topic(name)
            self._bump(db)

    def topic(self, name: str) -> TopicRoute:
        with self._read() as db:
            return self._topic(db, name)

    def _topic(self, db: Conn, name: str) -> TopicRoute:
        validate_topic(name)
        row = db.execute(
            "SELECT name, home, partitions, retention_ms, subscribers, priority, on_full"
            " FROM topics WHERE name = ?",
            (name,),
        ).fetchone()
        if row is None:
            raise _unknown_topic(name)
        return _topic_of(row)

    def _check_regions(self, db: Conn, home: str, subscribers: tuple[str, ...] | str) -> None:
        wanted = [home] + ([] if subscribers == ALL else list(subscribers))
        for region in wanted:
            if db.execute("SELECT 1 FROM regions WHERE id = ?", (region,)).fetchone() is None:
                raise _unknown_region(region)

    # -------------------------------------------------------------- buckets

    def put_bucket(self, name: str, settings: Mapping[str, Any]) -> bool:
        """Create or replace a bucket location; True when it was created."""
        text = json.dumps(dict(settings), sort_keys=True)
        with self._write() as db:
            row = db.execute("SELECT settings FROM buckets WHERE name = ?", (name,)).fetchone()
            if row is not None and row[0] == text:
                return False
            db.execute(
                "INSERT INTO buckets (name, settings) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET settings = excluded.settings",
                (name, text),
            )
            self._bump(db)
            return row is None

    def delete_bucket(self, name: str) -> None:
        with self._write() as db:
            if db.execute("DELETE FROM buckets WHERE name = ?", (name,)).rowcount == 0:
                raise Refused(404, "unknown_bucket", f"no bucket location named {name!r}")
            self._bump(db)

    def bucket(self, name: str) -> BucketLocation:
        with self._read() as db:
            row = db.execute(
                "SELECT name, settings FROM buckets WHERE name = ?", (name,)
            ).fetchone()
        if row is None:
            raise Refused(404, "unknown_bucket", f"no bucket location named {name!r}")
        return BucketLocation(row[0], json.loads(row[1]))

    # -------------------------------------------------------------- routing

    def routing(self) -> RoutingTable:
        """The current routing table (one consistent read)."""
        with self._write(serialize=False) as db:  # a transaction: one snapshot of every table
            version = int(
                db.execute("SELECT value FROM meta WHERE key = 'routing_version'").fetchone()[0]
            )
            regions = tuple(
                r[0]
                for r in db.execute("SELECT id FROM regions WHERE revoked_ms IS NULL ORDER BY id")
            )
            topics = tuple(
                _topic_of(r)
                for r in db.execute(
                    "SELECT name, home, partitions, retention_ms, subscribers, priority,"
                    " on_full FROM topics ORDER BY name"
                )
            )
            buckets = tuple(
                BucketLocation(r[0], json.loads(r[1]))
                for r in db.execute("SELECT name, settings FROM buckets ORDER BY name")
            )
        return RoutingTable(version, regions, topics, buckets)

    # ---------------------------------------------------------- copy (migrate)

    def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table, by table (one consistent read): see :meth:`load`."""
        with self._write(serialize=False) as db:
            return {
                table: [tuple(r) for r in db.execute(f"SELECT {', '.join(cols)} FROM {table}")]  # noqa: S608 - fixed names
                for table, cols in COPIED_TABLES.items()
            }

    def load(self, rows: Mapping[str, Sequence[tuple[Any, ...]]]) -> None:
        """Write :meth:`dump`'s rows into this store, which must hold no region,
        topic or bucket yet; ``meta`` (routing version, admin token hash) is replaced.

        One transaction: a failure leaves the store as it was.
        """
        with self._write() as db:
            for table in ("regions", "topics", "buckets"):
                if db.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is not None:  # noqa: S608
                    raise ConfigError(
                        f"{self.describe()}: the target already holds {table}; "
                        "migrate into a new, empty database"
                    )
            db.execute("DELETE FROM meta")
            for table, cols in COPIED_TABLES.items():
                marks = ", ".join("?" * len(cols))
                for row in rows.get(table, ()):
                    db.execute(
                        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})",  # noqa: S608
                        row,
                    )
            self._bump_credentials(db)


class _Tx:
    """``with store._write() as db``: BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> Conn:
        self.db.execute("BEGIN IMMEDIATE")
        return cast(Conn, self.db)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")


class MetadataStore(SqlStore):
    """The embedded store: one SQLite file in WAL mode."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise ConfigError(f"{path}: cannot open the metadata database: {exc}") from None
        self._db: sqlite3.Connection | None = db
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("PRAGMA busy_timeout=5000")
            self._migrate(db)
        except sqlite3.DatabaseError as exc:
            db.close()
            raise ConfigError(f"{path}: not a usable metadata database: {exc}") from None
        except BaseException:  # a schema too new, a cancellation: no connection left behind
            db.close()
            raise

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version > len(MIGRATIONS):
            raise ConfigError(
                f"the metadata database has schema version {version}; this edgegw knows "
                f"up to {len(MIGRATIONS)} (written by a newer edgegw?)"
            )
        for i in range(version, len(MIGRATIONS)):
            # One transaction per migration: a crash leaves the previous version whole.
            with _Tx(db):
                for statement in _statements(MIGRATIONS[i]):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {i + 1}")

    @property
    def schema_version(self) -> int:
        return int(self._conn().execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def describe(self) -> str:
        return str(self.path)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise ClosedError("the metadata store is closed")
        return self._db

    @contextmanager
    def _read(self) -> Iterator[Conn]:
        yield cast(Conn, self._conn())

    def _write(self, *, serialize: bool = True) -> _Tx:
        return _Tx(self._conn())  # SQLite serialises every write transaction


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _subs_text(subscribers: tuple[str, ...] | str) -> str:
    return ALL if subscribers == ALL else json.dumps(list(subscribers))


def _topic_of(row: tuple[Any, ...]) -> TopicRoute:
    name, home, partitions, retention, subs, priority, on_full = row
    subscribers: tuple[str, ...] | str = ALL if subs == ALL else tuple(json.loads(subs))
    return TopicRoute(name, home, partitions, retention, subscribers, priority, on_full)  # type: ignore[arg-type]


def _region_json(row: tuple[Any, ...]) -> dict[str, Any]:
    rid, created, revoked, beat, version, lag = row
    return {
        "id": rid,
        "status": "revoked" if revoked is not None else "active",
        "created_ms": created,
        "revoked_ms": revoked,
        "last_heartbeat_ms": beat,
        "gateway_version": version,
        "lag": json.loads(lag) if lag else None,
    }


def _unknown_region(region: str) -> Refused:
    return Refused(404, "unknown_region", f"unknown region {region!r} (add it first)")


def _unknown_topic(name: str) -> Refused:
    return Refused(404, "unknown_topic", f"unknown topic {name!r}")
