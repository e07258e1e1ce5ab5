"""The GCS backend beyond the shared contract, against gcp-storage-emulator.

The emulator ignores ``ifGenerationMatch`` (checked here with the plain SDK,
so the contract suite's skip of its conditional tests stays honest: this
test fails the day the emulator enforces it). edgegw therefore refuses it,
as it refuses s3rver. What the emulator can show -- generations as ETags,
ranges, listing, errors -- is tested.
"""

from __future__ import annotations

import pytest
from _bucket_support import gcs_config

from edge_gateway.bucket import (
    BucketUnavailable,
    GcsConfig,
    NoSuchBucket,
    NotFound,
    PreconditionFailed,
    UnsupportedStore,
    verify_conditional_create,
)
from edge_gateway.bucket._gcs import GcsBucket, translate_error
from edge_gateway.errors import ConfigError
from edge_gateway.testing.ports import free_port


def test_the_emulator_still_ignores_if_generation_match(
    gcs_emulator_endpoint: str, gcs_bucket_name: str
) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(
        project="edgegw",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": gcs_emulator_endpoint},
    )
    try:
        blob = client.bucket(gcs_bucket_name).blob("k")
        blob.upload_from_string(b"first", if_generation_match=0)
        # Real GCS answers 412 here; the emulator overwrites.
        client.bucket(gcs_bucket_name).blob("k").upload_from_string(
            b"second", if_generation_match=0
        )
        assert client.bucket(gcs_bucket_name).blob("k").download_as_bytes() == b"second"
    finally:
        client.close()


async def test_edgegw_refuses_the_emulator(
    gcs_emulator_endpoint: str, gcs_bucket_name: str
) -> None:
    async with await GcsBucket.open(gcs_config(gcs_emulator_endpoint, gcs_bucket_name)) as bucket:
        with pytest.raises(UnsupportedStore, match="accepted a second create-only put"):
            await verify_conditional_create(bucket, "regions/r1")
        assert await bucket.list() == []


async def test_generations_are_the_etags(gcs_emulator_endpoint: str, gcs_bucket_name: str) -> None:
    async with await GcsBucket.open(gcs_config(gcs_emulator_endpoint, gcs_bucket_name)) as bucket:
        v1 = await bucket.put("state", b"v1")
        assert v1.etag.isdigit()
        v2 = await bucket.put("state", b"v2", if_match=v1.etag)
        assert v2.etag != v1.etag
        got = await bucket.get("state", start=1)
        assert (got.data, got.size, got.etag) == (b"2", 2, v2.etag)
        assert (await bucket.head("state")).etag == v2.etag
        # An ETag of another backend matches nothing; a missing object is NotFound.
        with pytest.raises(PreconditionFailed, match="not a generation"):
            await bucket.put("state", b"v3", if_match='"0x8D"')
        with pytest.raises(NotFound):
            await bucket.put("absent", b"v3", if_match='"0x8D"')


async def test_a_missing_bucket_and_a_store_that_is_not_there(gcs_emulator_endpoint: str) -> None:
    async with await GcsBucket.open(gcs_config(gcs_emulator_endpoint, "no-such-bucket")) as bucket:
        with pytest.raises(NoSuchBucket, match="no such bucket"):
            await bucket.check_exists()
    gone = gcs_config(f"http://127.0.0.1:{free_port()}", "edgegw", connect_timeout=0.5)
    async with await GcsBucket.open(gone) as bucket:
        with pytest.raises(BucketUnavailable):
            await bucket.put("k", b"x", if_none_match=True)
        with pytest.raises(BucketUnavailable):
            await bucket.list()


def test_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="not a GCS bucket name"):
        GcsConfig(bucket="Bad Name")
    with pytest.raises(ConfigError, match="anonymous or credentials_file"):
        GcsConfig(bucket="edgegw", anonymous=True, credentials_file="/k.json")
    with pytest.raises(ConfigError, match="endpoint_url"):
        GcsConfig(bucket="edgegw", endpoint_url="localhost:9023")


def test_sdk_errors_are_translated() -> None:
    import google.api_core.exceptions as gexc
    import requests

    cases = [
        (gexc.PreconditionFailed("412"), PreconditionFailed),
        (gexc.NotFound("No such object"), NotFound),
        (gexc.TooManyRequests("slow down"), BucketUnavailable),
        (gexc.ServiceUnavailable("503"), BucketUnavailable),
        (requests.exceptions.ConnectionError("refused"), BucketUnavailable),
    ]
    for exc, expected in cases:
        error = translate_error(exc, operation="put", key="k", where="GCS bucket 'b'")
        assert type(error) is expected, (exc, error)
    denied = translate_error(gexc.Forbidden("no"), operation="get", key="k", where="w")
    assert getattr(denied, "code", None) == "AccessDenied"
    assert "roles/storage.objectUser" in getattr(denied, "action", "")


async def test_a_large_object_goes_up_resumable_and_reads_back_in_ranges(
    gcs_emulator_endpoint: str, gcs_bucket_name: str
) -> None:
    # Above 8 MiB the client uploads in a resumable session: the condition
    # (ifGenerationMatch) travels with it, the data must arrive whole.
    data = bytes(range(256)) * (9 * 4096 + 3)
    async with await GcsBucket.open(gcs_config(gcs_emulator_endpoint, gcs_bucket_name)) as bucket:
        info = await bucket.put("regions/r1/log/big", data, if_none_match=True)
        got = await bucket.get("regions/r1/log/big")
        assert (got.data == data, got.size, got.etag) == (True, len(data), info.etag)
        middle = await bucket.get("regions/r1/log/big", start=8 << 20, end=(8 << 20) + 9)
        assert middle.data == data[8 << 20 : (8 << 20) + 9]
