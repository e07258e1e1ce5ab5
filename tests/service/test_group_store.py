"""The consumer-group offset store's SQLite connection: closed on close() and on a refused file."""

from __future__ import annotations

from pathlib import Path

import pytest
from _fds import no_gc, open_paths

from edge_gateway.errors import ClosedError, CorruptData
from edge_gateway.groups import GroupStore


def test_close_releases_the_database(tmp_path: Path) -> None:
    path = tmp_path / "groups.sqlite"
    with no_gc():
        store = GroupStore(path)
        store.commit_sync("g", [("t", 0, 5, "")], now_ms=1)
        assert open_paths(path)
        store.close()
        assert open_paths(path) == []
        store.close()  # idempotent
    with pytest.raises(ClosedError):
        store.fetch_sync("g")
    reopened = GroupStore(path)
    try:
        assert [(o.topic, o.offset) for o in reopened.fetch_sync("g")] == [("t", 5)]
    finally:
        reopened.close()


def test_a_file_that_is_not_a_database_leaves_nothing_open(tmp_path: Path) -> None:
    path = tmp_path / "groups.sqlite"
    path.write_bytes(b"not sqlite at all" * 100)
    with no_gc():
        with pytest.raises(CorruptData, match=r"damaged .*/quarantine/ to start") as refused:
            GroupStore(path)
        assert refused.traceback  # the refusal's frames are alive; the connection is closed
        assert open_paths(path) == []
