"""Fixtures shared by the mirror tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from _mirror_support import JCFG, open_bucket

from edge_gateway.bucket import Bucket, FaultyBucket, LocalBucket
from edge_gateway.journal import Journal


@pytest.fixture
async def bucket(tmp_path: Path) -> AsyncIterator[FaultyBucket]:
    """A local bucket behind the fault-injecting wrapper (no faults until a test sets some)."""
    b = FaultyBucket(await LocalBucket.open(tmp_path / "bucket", create=True))
    try:
        yield b
    finally:
        await b.aclose()


@pytest.fixture(params=["local", "s3", pytest.param("rgw", marks=pytest.mark.rgw)])
async def any_bucket(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Bucket]:
    """Each kind of bucket in turn: a local directory, moto's S3 server, a real RGW (-m rgw)."""
    endpoint = name = None
    if request.param == "s3":
        endpoint = request.getfixturevalue("moto_endpoint")
        name = request.getfixturevalue("s3_bucket_name")
    if request.param == "rgw":
        endpoint = request.getfixturevalue("rgw_endpoint")
        name = request.getfixturevalue("rgw_bucket_name")
    b = await open_bucket(request.param, tmp_path, endpoint, name)
    try:
        yield b
    finally:
        await b.aclose()


def _open(path: Path) -> Iterator[Journal]:
    j = Journal.open_sync(path, JCFG)
    try:
        yield j
    finally:
        j.close_sync()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    """The mirroring region's journal."""
    yield from _open(tmp_path / "mirror-journal")


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Journal]:
    """The source region ``a``'s journal."""
    yield from _open(tmp_path / "a")
