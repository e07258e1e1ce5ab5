"""The Azure Blob backend beyond the shared contract: against Azurite, how it
answers a missing container, a wrong key and a store that is not there; how
its configuration is checked; and how every kind of SDK error is translated."""

from __future__ import annotations

from pathlib import Path

import pytest
from _bucket_support import azure_config
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)

from edge_gateway.bucket import (
    AccessDenied,
    AzureConfig,
    BucketUnavailable,
    InvalidRequest,
    NoSuchBucket,
    NotFound,
    PreconditionFailed,
    verify_conditional_create,
)
from edge_gateway.bucket._azure import AzureBucket, translate_error
from edge_gateway.config import load_config
from edge_gateway.errors import ConfigError
from edge_gateway.testing.emulators import azurite_connection_string
from edge_gateway.testing.ports import free_port

WRONG_KEY = "d3Jvbmcga2V5IGZvciB0aGUgZGV2IGFjY291bnQ="


async def test_a_missing_container_is_named(azurite_endpoint: str) -> None:
    bucket = await AzureBucket.open(azure_config(azurite_endpoint, "no-such-container"))
    async with bucket:
        with pytest.raises(NoSuchBucket, match="no such container"):
            await bucket.check_exists()
        with pytest.raises(AccessDenied) as excinfo:
            await bucket.put("k", b"x", if_none_match=True)
    assert excinfo.value.code == "NoSuchBucket"
    assert "create the container" in excinfo.value.action


async def test_a_wrong_key_is_access_denied(
    azurite_endpoint: str, azure_container_name: str
) -> None:
    config = azure_config(
        azurite_endpoint,
        azure_container_name,
        connection_string=None,
        endpoint_url=azurite_endpoint,
        account_key=WRONG_KEY,
    )
    async with await AzureBucket.open(config) as bucket:
        with pytest.raises(AccessDenied) as excinfo:
            await bucket.put("k", b"x")
    assert "HTTP 403" in str(excinfo.value)
    assert "Storage Blob Data Contributor" in excinfo.value.action


async def test_a_store_that_is_not_there_is_unavailable(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}/devstoreaccount1"
    config = azure_config(endpoint, "edgegw", connect_timeout=0.5, max_attempts=1)
    async with await AzureBucket.open(config) as bucket:
        with pytest.raises(BucketUnavailable, match="ServiceRequestError"):
            await bucket.get("k")
        with pytest.raises(BucketUnavailable):
            await verify_conditional_create(bucket)
        assert bucket.statistics().unavailable == 2


async def test_the_prefix_keeps_keys_apart(
    azurite_endpoint: str, azure_container_name: str
) -> None:
    one = await AzureBucket.open(azure_config(azurite_endpoint, azure_container_name, prefix="a"))
    two = await AzureBucket.open(azure_config(azurite_endpoint, azure_container_name, prefix="a/b"))
    async with one, two:
        await two.put("k", b"two", if_none_match=True)
        await one.put("k", b"one", if_none_match=True)
        assert [i.key for i in await one.list()] == ["b/k", "k"]
        assert (await two.get("k")).data == b"two"
        assert one.name.endswith(f"/{azure_container_name}/a/")


def test_config_is_checked_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="container"):
        AzureConfig(container="Bad_Name")
    with pytest.raises(ConfigError, match="needs endpoint_url"):
        AzureConfig(container="edgegw", account_key="k")
    with pytest.raises(ConfigError, match="connection_string or connection_string_file"):
        AzureConfig(container="edgegw", connection_string="x", connection_string_file="f")
    with pytest.raises(ConfigError, match="unknown bucket config keys"):
        AzureConfig.from_mapping({"container": "edgegw", "bucket": "x"})
    with pytest.raises(ConfigError, match="max_attempts"):
        AzureConfig(container="edgegw", max_attempts=0)
    config = tmp_path / "edgegw.toml"
    config.write_text('region = "r"\n[bucket]\ntype = "azure"\n')
    with pytest.raises(ConfigError, match=r"bucket\.container: required"):
        load_config(config)
    config.write_text('region = "r"\n[bucket]\ntype = "azure"\ncontainer = "A"\n')
    with pytest.raises(ConfigError, match="not an Azure container name"):
        load_config(config)
    config.write_text(
        'region = "r"\n[bucket]\ntype = "azure"\ncontainer = "fleet"\n'
        'connection_string_file = "/etc/edgegw/azure"\nmultipart_threshold = 33554432\n'
    )
    azure = load_config(config).bucket.azure_config()
    assert (azure.container, azure.max_single_put_size) == ("fleet", 32 << 20)
    assert "connection_string=" not in repr(azure)  # secrets stay out of logs


async def test_an_unreadable_connection_string_file_is_a_config_error(tmp_path: Path) -> None:
    config = AzureConfig(container="edgegw", connection_string_file=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="connection_string_file"):
        await AzureBucket.open(config)
    with pytest.raises(ConfigError, match="edgegw"):
        await AzureBucket.open(AzureConfig(container="edgegw", connection_string="nonsense"))


def _http_error(cls: type[HttpResponseError], status: int, code: str) -> HttpResponseError:
    exc = cls(message=f"{code} happened")
    exc.status_code = status
    exc.error_code = code  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_http_error(ResourceModifiedError, 412, "ConditionNotMet"), PreconditionFailed),
        (_http_error(ResourceExistsError, 409, "BlobAlreadyExists"), PreconditionFailed),
        (_http_error(ResourceExistsError, 409, "LeaseIdMissing"), BucketUnavailable),
        (_http_error(ResourceNotFoundError, 404, "BlobNotFound"), NotFound),
        (_http_error(ResourceNotFoundError, 404, "ContainerNotFound"), AccessDenied),
        (_http_error(ClientAuthenticationError, 403, "AuthorizationFailure"), AccessDenied),
        (_http_error(HttpResponseError, 403, "AuthorizationPermissionMismatch"), AccessDenied),
        (_http_error(HttpResponseError, 429, "TooManyRequests"), BucketUnavailable),
        (_http_error(HttpResponseError, 503, "ServerBusy"), BucketUnavailable),
        (_http_error(HttpResponseError, 500, "InternalError"), BucketUnavailable),
        (_http_error(HttpResponseError, 400, "InvalidHeaderValue"), InvalidRequest),
        (ServiceRequestError("connection refused"), BucketUnavailable),
        (ServiceResponseError("read timed out"), BucketUnavailable),
        (ClientAuthenticationError("DefaultAzureCredential failed"), AccessDenied),
        (ConnectionResetError("reset"), BucketUnavailable),
    ],
)
def test_sdk_errors_are_translated(exc: BaseException, expected: type[Exception]) -> None:
    error = translate_error(exc, operation="put", key="k", where="Azure container 'c'")
    assert type(error) is expected
    assert "put of key 'k' on Azure container 'c'" in str(error)


async def test_put_block_list_is_create_only_on_azurite(
    azurite_endpoint: str, azure_container_name: str
) -> None:
    config = azure_config(azurite_endpoint, azure_container_name)
    async with await AzureBucket.open(config) as bucket:
        assert await bucket.multipart_create_is_conditional(near="regions/r1/log/1")
        assert await bucket.list() == []  # the probe cleaned up


async def test_large_creates_go_as_one_put_blob_where_block_lists_ignore_the_condition(
    azurite_endpoint: str, azure_container_name: str
) -> None:
    # A store whose Put Block List ignored If-None-Match (none known; Azurite
    # and Azure honour it) gets every create-only put as one Put Blob.
    config = azure_config(azurite_endpoint, azure_container_name)
    data = bytes(range(256)) * (5 * 4096)  # 5 MiB: above the fixture's 4 MiB blocks
    async with await AzureBucket.open(config) as bucket:
        bucket._blocks_conditional = False
        info = await bucket.put("regions/r1/log/big", data, if_none_match=True)
        with pytest.raises(PreconditionFailed):
            await bucket.put("regions/r1/log/big", data[:100], if_none_match=True)
        got = await bucket.get("regions/r1/log/big")
        assert (got.data == data, got.etag) == (True, info.etag)
        assert bucket._single_put is not None  # the one-Put-Blob client was used
    from azure.storage.blob import ContainerClient

    with ContainerClient.from_connection_string(
        azurite_connection_string(azurite_endpoint), azure_container_name
    ) as container:
        blocks = container.get_blob_client("edgegw/regions/r1/log/big").get_block_list()
    # One Put Blob leaves no committed block list; staged blocks would show.
    assert blocks == ([], [])
