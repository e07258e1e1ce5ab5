"""Fixtures shared by the mirror tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edge_gateway.bucket import FaultyBucket, LocalBucket


@pytest.fixture
async def bucket(tmp_path: Path) -> AsyncIterator[FaultyBucket]:
    """A local bucket behind the fault-injecting wrapper (no faults until a test sets some)."""
    b = FaultyBucket(await LocalBucket.open(tmp_path / "bucket", create=True))
    try:
        yield b
    finally:
        await b.aclose()
