"""Fixtures of the metadata tests: one server process per module, with two regions
(``fleet``), or one per test with nothing in it (``server``).

Both run on SQLite; a module that sets ``STORES = ("sqlite", "postgres")`` runs
its tests that use them on each store (the API contract is the same). The
PostgreSQL cluster (``postgres``) is one per session, started from Debian's
``postgresql`` binaries; each server gets a database of its own.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _meta_support import Fleet, MetaServer, http, new_database

from edge_gateway.testing.postgres import BIN_DIR, Postgres


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    stores = getattr(metafunc.module, "STORES", None)
    if stores and "store_kind" in metafunc.fixturenames:
        metafunc.parametrize("store_kind", stores, indirect=True, scope="module")


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL cluster on a free loopback port, for the whole session."""
    if BIN_DIR is None:
        pytest.skip(
            "PostgreSQL is not installed and could not be (make postgresql, "
            "or apt-get install postgresql)"
        )
    # Not under pytest's temporary directory: as root that is private to root,
    # and the cluster runs as user postgres.
    root = Path(tempfile.mkdtemp(prefix="edgegw-pg-"))
    try:
        pg = Postgres(root)
        try:
            yield pg
        finally:
            pg.stop("immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def store_kind(request: pytest.FixtureRequest) -> str:
    """``sqlite`` (default) or ``postgres`` (modules with ``STORES``)."""
    return str(getattr(request, "param", "sqlite"))


def _db(request: pytest.FixtureRequest, kind: str, directory: Path) -> Path | str:
    if kind == "postgres":
        return new_database(request.getfixturevalue("postgres"))
    return directory / "meta.sqlite"


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, store_kind: str
) -> Iterator[Fleet]:
    """A running server with regions ``north`` and ``south`` (tokens in ``tokens``)."""
    directory = tmp_path_factory.mktemp("meta")
    server = MetaServer(_db(request, store_kind, directory), files=directory / "meta")
    try:
        tokens = {}
        with http(server.url) as c:
            for region in ("north", "south"):
                r = c.post("/v1/regions", json={"id": region})
                assert r.status_code == 201, r.text
                tokens[region] = r.json()["token"]
        yield Fleet(server, server.url, tokens)
    finally:
        server.stop()


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest, store_kind: str) -> Iterator[MetaServer]:
    """A metadata server of its own for one test, empty."""
    s = MetaServer(_db(request, store_kind, tmp_path), files=tmp_path / "meta")
    try:
        yield s
    finally:
        s.stop()
