"""Fixtures of the bucket suite: one ``bucket`` per backend.

The contract tests take ``bucket`` and run once per backend: the local
directory, S3 over HTTP against moto's server, and the fault-injecting
wrapper with no fault set (which must be transparent), Azure Blob against
Azurite and GCS against gcp-storage-emulator; with ``-m rgw``, also S3
against a real Ceph RGW 16.2 (tests/_rgw.py).

gcp-storage-emulator ignores ``ifGenerationMatch`` (checked: a second create
and a stale compare-and-swap both succeed), so on it the tests marked
``conditional`` are skipped there, saying why, and the rest of the contract
runs; tests/bucket/test_gcs_bucket.py checks that the emulator still ignores
the condition (it fails once the emulator enforces it: then drop the skip).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from _bucket_support import Opener, azure_config, gcs_config, make_s3_config
from _rgw import ACCESS_KEY as RGW_ACCESS_KEY
from _rgw import SECRET_KEY as RGW_SECRET_KEY

from edge_gateway.bucket import Bucket, FaultyBucket, LocalBucket, S3Bucket, S3Config

#: Why the GCS emulator cannot pass the conditional tests (docs/stores.md).
GCS_EMULATOR_IGNORES = (
    "gcp-storage-emulator ignores ifGenerationMatch: it cannot prove conditional writes "
    "(docs/stores.md)"
)


@pytest.fixture
def s3_config(moto_endpoint: str, s3_bucket_name: str) -> S3Config:
    """Config of a fresh bucket on the session's moto server."""
    return make_s3_config(moto_endpoint, s3_bucket_name, prefix="edgegw/")


@pytest.fixture(
    params=[
        "local",
        "s3",
        "faulty-local",
        "azure",
        "gcs-emulator",
        pytest.param("rgw", marks=pytest.mark.rgw),
    ]
)
def bucket_opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """How to open the backend under test (moto starts only for the S3 run, Ceph
    only for the RGW run: ``-m rgw``, Azurite and the GCS emulator for theirs)."""
    if request.param == "azure":
        from edge_gateway.bucket._azure import AzureBucket

        azure = azure_config(
            request.getfixturevalue("azurite_endpoint"),
            request.getfixturevalue("azure_container_name"),
        )
        return lambda: AzureBucket.open(azure)
    if request.param == "gcs-emulator":
        from edge_gateway.bucket._gcs import GcsBucket

        if request.node.get_closest_marker("conditional") is not None:
            # tests/bucket/test_gcs_bucket.py proves the emulator still ignores it.
            pytest.skip(GCS_EMULATOR_IGNORES)
        gcs = gcs_config(
            request.getfixturevalue("gcs_emulator_endpoint"),
            request.getfixturevalue("gcs_bucket_name"),
        )
        return lambda: GcsBucket.open(gcs)
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
