"""Fixtures of the bucket suite: one ``bucket`` per backend.

The contract tests take ``bucket`` and run once per backend: the local
directory, S3 over HTTP against moto's server, and the fault-injecting
wrapper with no fault set (which must be transparent); with ``-m rgw``, also
S3 against a real Ceph RGW 16.2 (tests/_rgw.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from _bucket_support import Opener, make_s3_config
from _rgw import ACCESS_KEY as RGW_ACCESS_KEY
from _rgw import SECRET_KEY as RGW_SECRET_KEY

from edge_gateway.bucket import Bucket, FaultyBucket, LocalBucket, S3Bucket, S3Config


@pytest.fixture
def s3_config(moto_endpoint: str, s3_bucket_name: str) -> S3Config:
    """Config of a fresh bucket on the session's moto server."""
    return make_s3_config(moto_endpoint, s3_bucket_name, prefix="edgegw/")


@pytest.fixture(params=["local", "s3", "faulty-local", pytest.param("rgw", marks=pytest.mark.rgw)])
def bucket_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """How to open the backend under test (moto starts only for the S3 run, Ceph
    only for the RGW run: ``-m rgw``)."""
    if request.param == "s3":
        config: S3Config = request.getfixturevalue("s3_config")
        return lambda: S3Bucket.open(config)
    if request.param == "rgw":
        rgw = make_s3_config(
            request.getfixturevalue("rgw_endpoint"),
            request.getfixturevalue("rgw_bucket_name"),
            prefix="edgegw/",
            access_key=RGW_ACCESS_KEY,
            secret_key=RGW_SECRET_KEY,
        )
        return lambda: S3Bucket.open(rgw)
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
