"""Fixtures of the metadata tests: one server process per module, with two regions
(``fleet``), or one per test with nothing in it (``server``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _meta_support import Fleet, MetaServer, http


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A running server with regions ``north`` and ``south`` (tokens in ``tokens``)."""
    server = MetaServer(tmp_path_factory.mktemp("meta") / "meta.sqlite")
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
def server(tmp_path: Path) -> Iterator[MetaServer]:
    """A metadata server of its own for one test, empty."""
    s = MetaServer(tmp_path / "meta.sqlite")
    try:
        yield s
    finally:
        s.stop()
