"""Token hashes across a server upgrade: scrypt hashes an earlier server wrote keep
working, and each is replaced by a salted SHA-256 hash on its first successful check.

Real server processes on SQLite and PostgreSQL, over a database prepared as an
earlier server left it (its hashes scrypt).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _meta_support import ADMIN_TOKEN, MetaServer, http, new_database, scrypt_hash

from edge_gateway.metadata._db import split_region_token, verify_token
from edge_gateway.metadata.server import open_database

STORES = ("sqlite", "postgres")


@pytest.fixture
def legacy_db(tmp_path: Path, request: pytest.FixtureRequest, store_kind: str) -> Path | str:
    """A database with region ``north`` and the admin token, both hashed with scrypt."""
    db: Path | str = tmp_path / "meta.sqlite"
    if store_kind == "postgres":
        db = new_database(request.getfixturevalue("postgres"))
    return db


def _prepare(db: Path | str) -> str:
    """Region ``north``'s token; every hash in ``db`` made scrypt."""
    store = open_database(db)
    try:
        token = store.add_region("north", 1)
        with store._write() as conn:
            conn.execute(
                "UPDATE regions SET token_hash = ? WHERE id = 'north'", (scrypt_hash(token),)
            )
        store.set_admin_token_hash(scrypt_hash(ADMIN_TOKEN))
    finally:
        store.close()
    return token


def _hashes(db: Path | str, token: str) -> tuple[str, str]:
    """(north's stored token hash, the admin token's stored hash)."""
    store = open_database(db)
    try:
        token_id = split_region_token(token)
        assert token_id is not None
        found = store.region_token(token_id, 2)
        admin = store.admin_token_hash()
    finally:
        store.close()
    assert found is not None
    assert admin is not None
    return found[1], admin


def test_scrypt_hashes_verify_and_are_upgraded(legacy_db: Path | str, tmp_path: Path) -> None:
    token = _prepare(legacy_db)
    assert all(h.startswith("scrypt$") for h in _hashes(legacy_db, token))
    # No --admin-token: the server takes the stored (scrypt) admin hash as it is.
    server = MetaServer(legacy_db, admin_token=None, files=tmp_path / "meta")
    try:
        wrong = token[:-4] + ("aaaa" if not token.endswith("aaaa") else "bbbb")
        with http(server.url, wrong) as c:
            assert c.get("/v1/routing").status_code == 401
        assert _hashes(legacy_db, token)[0].startswith("scrypt$")  # a refusal changes nothing
        with http(server.url, token) as c:
            assert c.get("/v1/routing").status_code == 200
            r = c.post("/v1/regions/north/heartbeat", json={"gateway_version": "t"})
            assert r.status_code == 200, r.text
        with http(server.url, "not-the-admin-token-0123456789") as c:
            assert c.get("/v1/regions").status_code == 401
        with http(server.url) as c:
            assert c.get("/v1/regions").status_code == 200
        region_hash, admin_hash = _hashes(legacy_db, token)
        assert region_hash.startswith("sha256$")
        assert admin_hash.startswith("sha256$")
        assert verify_token(token, region_hash)
        assert verify_token(ADMIN_TOKEN, admin_hash)
        assert not verify_token(wrong, region_hash)
    finally:
        server.stop()
    # A new server process (no token cache) checks the upgraded hashes.
    server = MetaServer(legacy_db, admin_token=None, files=tmp_path / "meta2")
    try:
        with http(server.url, token) as c:
            assert c.get("/v1/routing").status_code == 200
        with http(server.url, wrong) as c:
            assert c.get("/v1/routing").status_code == 401
        with http(server.url) as c:
            assert c.get("/v1/regions").status_code == 200
    finally:
        server.stop()


def test_a_given_admin_token_replaces_a_scrypt_hash(legacy_db: Path | str, tmp_path: Path) -> None:
    token = _prepare(legacy_db)
    server = MetaServer(legacy_db, files=tmp_path / "meta")  # --admin-token ADMIN_TOKEN
    try:
        assert _hashes(legacy_db, token)[1].startswith("sha256$")
        with http(server.url) as c:
            assert c.get("/v1/regions").status_code == 200
    finally:
        server.stop()


def test_new_tokens_are_stored_as_sha256(server: MetaServer) -> None:
    with http(server.url) as c:
        r = c.post("/v1/regions", json={"id": "east"})
        assert r.status_code == 201, r.text
        token = r.json()["token"]
        rotated = c.post("/v1/regions/east/token", json={"keep_previous_s": 60}).json()["token"]
    region_hash, admin_hash = _hashes(server.db, rotated)
    assert region_hash.startswith("sha256$")
    assert admin_hash.startswith("sha256$")
    with http(server.url, token) as c:  # the previous token, in its grace period
        assert c.get("/v1/routing").status_code == 200
