"""Helpers of the bucket suite (a plain module: test files import it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from edge_gateway.bucket import AzureConfig, Bucket, GcsConfig, S3Config
from edge_gateway.testing.emulators import azurite_connection_string
from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY

#: Opens the backend under test (the ``bucket_opener`` fixture).
Opener = Callable[[], Awaitable[Bucket]]

MIB = 1024 * 1024

#: Small enough that the contract suite's 11 MiB object goes up in 3 parts.
TEST_MULTIPART_THRESHOLD = 5 * MIB
TEST_PART_SIZE = 5 * MIB
#: Small pages, so that listing a few dozen keys exercises S3 pagination.
TEST_LIST_PAGE_SIZE = 7


def make_s3_config(endpoint: str, bucket: str, **overrides: object) -> S3Config:
    """An S3Config for the moto server with short timeouts and the test sizes."""
    values: dict[str, object] = {
        "bucket": bucket,
        "endpoint_url": endpoint,
        "region": REGION,
        "path_style": True,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "connect_timeout": 2.0,
        "read_timeout": 10.0,
        "max_attempts": 2,
        "max_concurrency": 8,
        "multipart_threshold": TEST_MULTIPART_THRESHOLD,
        "part_size": TEST_PART_SIZE,
        "list_page_size": TEST_LIST_PAGE_SIZE,
    }
    values.update(overrides)
    return S3Config.from_mapping(values)


def azure_config(endpoint: str, container: str, **overrides: object) -> AzureConfig:
    """An AzureConfig for Azurite with short timeouts and small blocks (so the
    contract suite's 11 MiB object goes up as staged blocks)."""
    values: dict[str, object] = {
        "container": container,
        "prefix": "edgegw/",
        "connection_string": azurite_connection_string(endpoint),
        "connect_timeout": 2.0,
        "read_timeout": 10.0,
        "max_attempts": 2,
        "max_concurrency": 8,
        "max_single_put_size": 4 * 1024 * 1024,
        "block_size": 4 * 1024 * 1024,
        "list_page_size": 7,
    }
    values.update(overrides)
    return AzureConfig.from_mapping(values)


def gcs_config(endpoint: str, bucket: str, **overrides: object) -> GcsConfig:
    """A GcsConfig for the emulator (anonymous) with short timeouts and small pages."""
    values: dict[str, object] = {
        "bucket": bucket,
        "prefix": "edgegw/",
        "endpoint_url": endpoint,
        "anonymous": True,
        "connect_timeout": 2.0,
        "read_timeout": 10.0,
        "max_attempts": 2,
        "max_concurrency": 8,
        "list_page_size": 7,
    }
    values.update(overrides)
    return GcsConfig.from_mapping(values)
