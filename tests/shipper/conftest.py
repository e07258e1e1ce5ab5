"""The shipper tests run against both kinds of bucket: a local directory and S3 (moto)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edge_gateway.bucket import Bucket, LocalBucket, S3Bucket, S3Config


@pytest.fixture(params=["local", "s3"])
async def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Bucket]:
    if request.param == "s3":
        b: Bucket = await S3Bucket.open(
            S3Config(
                bucket=request.getfixturevalue("s3_bucket_name"),
                endpoint_url=request.getfixturevalue("moto_endpoint"),
                path_style=True,
                region="us-east-1",
                access_key="testing",
                secret_key="testing",
            )
        )
    else:
        b = await LocalBucket.open(tmp_path / "bucket", create=True)
    try:
        yield b
    finally:
        await b.aclose()
