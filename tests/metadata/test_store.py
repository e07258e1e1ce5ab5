"""The stores alone: migrations, token hashes, topic rules, routing versions.

The tests of the ``store`` fixture run on SQLite and on PostgreSQL (the
session's cluster); the SQL is the same, the plumbing and migrations are not.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fds import no_gc, open_paths
from _meta_support import new_database, scrypt_hash

from edge_gateway.errors import ConfigError, InvalidInput
from edge_gateway.metadata._db import (
    MIGRATIONS,
    MetadataStore,
    Refused,
    SqlStore,
    hash_token,
    is_legacy_hash,
    split_region_token,
    verify_token,
)
from edge_gateway.metadata._pg import PG_MIGRATIONS, PostgresStore, redact_url
from edge_gateway.metadata.routing import TopicRoute
from edge_gateway.testing.ports import closed_port
from edge_gateway.testing.postgres import Postgres


@pytest.fixture(params=["sqlite", "postgres"])
def store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SqlStore]:
    s: SqlStore
    if request.param == "postgres":
        s = PostgresStore(new_database(request.getfixturevalue("postgres")))
    else:
        s = MetadataStore(tmp_path / "m.sqlite")
    try:
        s.add_region("north", 1)
        s.add_region("south", 2)
        yield s
    finally:
        s.close()


def _token_id(token: str) -> str:
    token_id = split_region_token(token)
    assert token_id is not None
    return token_id


def test_rotation_keeps_two_tokens_valid_for_the_grace_period(store: SqlStore) -> None:
    old = store.add_region("east", 10)
    new = store.rotate_region_token("east", 1_000, keep_previous_ms=500)
    assert new != old
    # Both valid until the grace period ends; the old one says until when.
    assert store.region_token(_token_id(new), 1_499)[:1] == ("east",)
    found = store.region_token(_token_id(old), 1_499)
    assert found is not None
    assert found[0] == "east"
    assert found[2] == 1_500
    assert verify_token(old, found[1])
    assert store.region_token(_token_id(old), 1_500) is None
    assert store.region_token(_token_id(new), 10**12) is not None
    # A second rotation ends the first one's grace period: two tokens at most.
    newer = store.rotate_region_token("east", 1_200, keep_previous_ms=500)
    assert store.region_token(_token_id(old), 1_201) is None
    assert store.region_token(_token_id(new), 1_201) is not None
    assert store.region_token(_token_id(newer), 1_201) is not None
    # keep 0: the current token dies at once (a leaked token).
    last = store.rotate_region_token("east", 1_300, keep_previous_ms=0)
    assert store.region_token(_token_id(newer), 1_301) is None
    assert store.region_token(_token_id(new), 1_301) is None
    # Revoking ends every token of the region; re-adding starts clean.
    store.rotate_region_token("east", 1_400, keep_previous_ms=10_000)
    store.revoke_region("east", 1_500)
    assert store.region_token(_token_id(last), 1_501) is None
    with pytest.raises(Refused) as exc:
        store.rotate_region_token("east", 1_600, keep_previous_ms=0)
    assert exc.value.status == 404
    with pytest.raises(Refused):
        store.rotate_region_token("nowhere", 1_600, keep_previous_ms=0)
    with pytest.raises(InvalidInput):
        store.rotate_region_token("north", 1_600, keep_previous_ms=-1)


def test_a_version_1_database_is_migrated_and_its_tokens_still_work(tmp_path: Path) -> None:
    """A server upgraded in place keeps every region's token (schema 1 -> 2)."""
    path = tmp_path / "m.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(MIGRATIONS[0])
    token_id, token = "0123456789abcdef", "egw_0123456789abcdef_old-secret"
    db.execute(
        "INSERT INTO regions (id, token_id, token_hash, created_ms) VALUES (?, ?, ?, ?)",
        ("north", token_id, hash_token(token), 1),
    )
    db.execute("PRAGMA user_version = 1")
    db.close()
    s = MetadataStore(path)
    try:
        assert s.schema_version == len(MIGRATIONS)
        found = s.region_token(token_id, 2)
        assert found is not None
        assert verify_token(token, found[1])
        s.rotate_region_token("north", 3, keep_previous_ms=100)
        assert s.region_token(token_id, 50) is not None
        assert s.region_token(token_id, 103) is None
    finally:
        s.close()


def test_wal_and_schema_version(tmp_path: Path) -> None:
    s = MetadataStore(tmp_path / "m.sqlite")
    assert s.schema_version == len(MIGRATIONS)
    s.close()
    db = sqlite3.connect(tmp_path / "m.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.close()
    with no_gc():
        with pytest.raises(ConfigError, match="newer edgegw") as refused:
            MetadataStore(tmp_path / "m.sqlite")
        # the refusal closed its connection (the traceback would keep a leaked one open)
        assert refused.traceback
        assert open_paths(tmp_path / "m.sqlite") == []


def test_not_a_database(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"not sqlite at all" * 100)
    with no_gc():
        with pytest.raises(ConfigError, match="not a usable metadata database"):
            MetadataStore(tmp_path / "junk")
        assert open_paths(tmp_path / "junk") == []


def test_close_releases_the_database(tmp_path: Path) -> None:
    with no_gc():
        s = MetadataStore(tmp_path / "m.sqlite")
        s.add_region("north", 1)
        assert open_paths(tmp_path / "m.sqlite")
        s.close()
        assert open_paths(tmp_path / "m.sqlite") == []
        s.close()  # idempotent


def test_token_hashes() -> None:
    stored = hash_token("s3cret-token-value")
    assert "s3cret" not in stored
    # Salted SHA-256: sha256$<16-byte salt>$<32-byte digest>, not a slow KDF.
    scheme, salt, digest = stored.split("$")
    assert (scheme, len(bytes.fromhex(salt)), len(bytes.fromhex(digest))) == ("sha256", 16, 32)
    assert not is_legacy_hash(stored)
    assert verify_token("s3cret-token-value", stored)
    assert not verify_token("s3cret-token-valuf", stored)
    assert not verify_token("x", "garbage")
    assert not verify_token("x", "scrypt$a$b$c$d$e")
    assert not verify_token("x", "sha256$zz$00")
    assert not verify_token("x", "sha256$00")
    assert not verify_token("s3cret-token-value", stored.replace("sha256", "md5", 1))
    assert hash_token("same") != hash_token("same")  # salted
    assert split_region_token("egw_0123456789abcdef_secret") == "0123456789abcdef"
    assert split_region_token("egw_short_secret") is None
    assert split_region_token("admin") is None


def test_scrypt_hashes_of_earlier_servers_still_verify() -> None:
    legacy = scrypt_hash("old-token-value-0123")
    assert is_legacy_hash(legacy)
    assert verify_token("old-token-value-0123", legacy)
    assert not verify_token("old-token-value-0124", legacy)


def test_legacy_hashes_are_upgraded_in_place(store: SqlStore) -> None:
    """A verified scrypt hash is replaced by a SHA-256 one of the same token, wherever
    it is (current token, previous token, admin token); compare-and-set on the old hash."""
    current = store.add_region("east", 10)
    previous = store.add_region("west", 10)
    admin = "admin-token-value-0123456789"
    legacy = {t: scrypt_hash(t) for t in (current, previous, admin)}
    with store._write() as db:
        db.execute("UPDATE regions SET token_hash = ? WHERE id = 'east'", (legacy[current],))
        db.execute("UPDATE regions SET token_hash = ? WHERE id = 'west'", (legacy[previous],))
    store.set_admin_token_hash(legacy[admin])
    store.rotate_region_token("west", 20, keep_previous_ms=1_000)  # `previous` is west's prev now

    for token in (current, previous):
        found = store.region_token(_token_id(token), 30)
        assert found is not None
        assert found[1] == legacy[token]
        assert store.upgrade_token_hash(found[1], hash_token(token))
        after = store.region_token(_token_id(token), 30)
        assert after is not None
        assert after[:1] == found[:1]
        assert after[2] == found[2]
        assert after[1].startswith("sha256$")
        assert verify_token(token, after[1])
        assert not verify_token(token + "x", after[1])
    assert store.upgrade_token_hash(legacy[admin], hash_token(admin))
    stored_admin = store.admin_token_hash()
    assert stored_admin is not None
    assert stored_admin.startswith("sha256$")
    assert verify_token(admin, stored_admin)

    # A hash no longer stored (rotated or revoked in between) is not resurrected.
    token = store.add_region("gone", 40)
    found = store.region_token(_token_id(token), 40)
    assert found is not None
    store.revoke_region("gone", 41)
    assert not store.upgrade_token_hash(found[1], hash_token(token))
    assert store.region_token(_token_id(token), 42) is None


def test_region_tokens(store: SqlStore) -> None:
    with pytest.raises(Refused) as exc:
        store.add_region("north", 3)
    assert (exc.value.status, exc.value.code) == (409, "region_exists")
    token = store.add_region("east", 3)
    token_id = split_region_token(token)
    assert token_id is not None
    found = store.region_token(token_id, 3)
    assert found is not None
    assert found[0] == "east"
    assert found[2] is None  # valid until revoked or rotated
    assert verify_token(token, found[1])
    store.revoke_region("east", 4)
    assert store.region_token(token_id, 4) is None
    assert store.region("east")["status"] == "revoked"
    assert "east" not in store.routing().regions
    again = store.add_region("east", 5)  # re-activated with a new token
    assert again != token
    assert store.region("east")["status"] == "active"


def test_topic_rules_and_versions(store: SqlStore) -> None:
    v0 = store.routing_version()
    store.create_topic(TopicRoute("t", "north", 2, None, ("south",)), 10)
    assert store.routing_version() == v0 + 1
    with pytest.raises(Refused, match="already exists"):
        store.create_topic(TopicRoute("t", "south", 1, None, ()), 11)
    with pytest.raises(Refused) as exc:
        store.create_topic(TopicRoute("u", "mars", 1, None, ()), 11)
    assert exc.value.code == "unknown_region"
    with pytest.raises(Refused) as exc:
        store.alter_topic("t", {"partitions": 1}, 12)
    assert exc.value.code == "partitions_shrink"
    with pytest.raises(InvalidInput, match="home region cannot change"):
        store.alter_topic("t", {"home": "south"}, 12)
    assert store.routing_version() == v0 + 1  # refusals change nothing
    new = store.alter_topic("t", {"partitions": 5, "subscribers": "*", "retention_ms": 1000}, 13)
    assert (new.partitions, new.subscribers, new.retention_ms) == (5, "*", 1000)
    assert store.topic("t") == new
    assert store.routing_version() == v0 + 2
    store.alter_topic("t", {"partitions": 5}, 14)  # no change, no new version
    assert store.routing_version() == v0 + 2
    store.heartbeat("north", "0.1.0", {"lag_s": 1.0}, 15)
    assert store.routing_version() == v0 + 2
    table = store.routing()
    assert table.version == v0 + 2
    assert table.topic("t") == new
    store.delete_topic("t")
    with pytest.raises(Refused, match="unknown topic"):
        store.topic("t")
    with pytest.raises(Refused, match="unknown topic"):
        store.delete_topic("t")


def test_buckets(store: SqlStore) -> None:
    v = store.routing_version()
    assert store.put_bucket("default", {"type": "local", "path": "/srv"})
    assert not store.put_bucket("default", {"type": "local", "path": "/srv"})
    assert store.routing_version() == v + 1
    assert not store.put_bucket("default", {"type": "local", "path": "/other"})
    assert store.bucket("default").settings == {"type": "local", "path": "/other"}
    store.delete_bucket("default")
    with pytest.raises(Refused):
        store.delete_bucket("default")


def test_postgres_schema_is_versioned(postgres: Postgres) -> None:
    url = new_database(postgres)
    s = PostgresStore(url)
    try:
        assert s.schema_version == len(PG_MIGRATIONS)
        s.add_region("north", 1)
    finally:
        s.close()
    again = PostgresStore(url)  # migrated already: opens as it is
    try:
        assert again.schema_version == len(PG_MIGRATIONS)
        assert again.routing().regions == ("north",)
    finally:
        again.close()
    dbname = url.rsplit("/", 1)[1]
    postgres.psql("UPDATE schema_version SET version = 99", dbname)
    with pytest.raises(ConfigError, match="schema version 99; this edgegw knows up to"):
        PostgresStore(url)


def test_postgres_unreachable_is_a_config_error_without_the_password() -> None:
    with closed_port() as port:
        url = f"postgresql://edgegw:s3cret@127.0.0.1:{port}/edgegw"
        with pytest.raises(ConfigError, match="cannot use the database") as exc:
            PostgresStore(url, connect_timeout_s=1)
    assert "s3cret" not in str(exc.value)
    assert redact_url(url) == f"postgresql://edgegw:***@127.0.0.1:{port}/edgegw"


def test_postgres_refuses_a_value_as_invalid_input(postgres: Postgres) -> None:
    """A value PostgreSQL cannot hold (a NUL in text) is the request's fault: InvalidInput
    (400), never a 500 (the server refuses the known case before it gets here)."""
    s = PostgresStore(new_database(postgres))
    try:
        s.add_region("north", 1)
        with pytest.raises(InvalidInput, match="refused a value"):
            s.heartbeat("north", "1\x00", {}, 2)
        s.heartbeat("north", "1.0", {}, 3)  # the connection is still good
        assert s.region("north")["gateway_version"] == "1.0"
    finally:
        s.close()
