"""Fixtures of the bucket suite: one ``bucket`` per backend.

The contract tests take ``bucket`` and run once per backend: the local
directory, S3 over HTTP against moto's server, and the fault-injecting
wrapper with no fault set (which must be transparent).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from _bucket_support import Opener, make_s3_config

from edge_gateway.bucket import Bucket, FaultyBucket, LocalBucket, S3Bucket, S3Config


@pytest.fixture
def s3_config(moto_endpoint: str, s3_bucket_name: str) -> S3Config:
    """Config of a fresh bucket on the session's moto server."""
    return make_s3_config(moto_endpoint, s3_bucket_name, prefix="edgegw/")


@pytest.fixture(params=["local", "s3", "faulty-local"])
def bucket_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """How to open the backend under test (moto starts only for the S3 run)."""
    if request.param == "s3":
        config: S3Config = request.getfixturevalue("s3_config")
        return lambda: S3Bucket.open(config)
    if request.param == "local":
        return lambda: LocalBucket.open(tmp_path / "bucket", create=True)

    async def faulty() -> Bucket:
        return FaultyBucket(await LocalBucket.open(tmp_path / "bucket", create=True))

    return faulty


@pytest.fixture
async def bucket(bucket_opener: Opener) -> AsyncIterator[Bucket]:
    """An open, empty bucket of each backend; closed after the test."""
    opened = await bucket_opener()
    try:
        yield opened
    finally:
        await opened.aclose()
