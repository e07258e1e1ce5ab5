"""How to reach a container on Azure Blob Storage or a bucket on Google Cloud Storage.

Kept apart from :mod:`edge_gateway.bucket._azure` and
:mod:`edge_gateway.bucket._gcs` so that loading and checking a configuration
never imports their SDKs (optional extras: ``edgegw[azure]``,
``edgegw[gcs]``): only a gateway whose bucket is on one of them loads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Final, TypeVar

from edge_gateway.bucket._base import validate_prefix
from edge_gateway.bucket._errors import InvalidRequest
from edge_gateway.errors import ConfigError

__all__ = ["AzureConfig", "GcsConfig"]

MIB: Final = 1024 * 1024
#: Azure's container names: 3-63 of lowercase letters, digits and single dashes.
_CONTAINER: Final = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$")
#: GCS's bucket names (the dotted form included): 3-222 characters.
_GCS_BUCKET: Final = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
#: Azure's largest single Put Blob (service version 2019-12-12 and later).
AZURE_MAX_PUT: Final = 5000 * MIB

_C = TypeVar("_C", "AzureConfig", "GcsConfig")


def _bad(key: str, why: str) -> ConfigError:
    return ConfigError(f"bucket config {key!r}: {why}")


def _check_common(config: AzureConfig | GcsConfig) -> None:
    """Types of every field, then the fields both stores share."""
    for f in fields(config):
        value = getattr(config, f.name)
        kinds: tuple[type, ...]
        default = f.default
        if isinstance(default, bool):
            kinds = (bool,)
        elif isinstance(default, float):
            kinds = (int, float)
        elif isinstance(default, int):
            kinds = (int,)
        elif default is None:
            kinds = (str, type(None))
        else:
            kinds = (str,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise _bad(f.name, f"must be {names}, got {value!r}")
    if config.prefix:
        try:
            validate_prefix(config.prefix)
        except InvalidRequest as exc:
            raise _bad("prefix", str(exc)) from None
    for key in ("connect_timeout", "read_timeout"):
        if not getattr(config, key) > 0:
            raise _bad(key, "must be > 0 seconds")
    if config.max_attempts < 1:
        raise _bad("max_attempts", "must be >= 1 (1 = no retries)")
    if config.max_concurrency < 1:
        raise _bad("max_concurrency", "must be >= 1")
    if not 1 <= config.list_page_size <= 5000:
        raise _bad("list_page_size", "must be between 1 and 5000")
    if config.endpoint_url is not None and not config.endpoint_url.startswith(
        ("http://", "https://")
    ):
        raise _bad(
            "endpoint_url", f"must start with http:// or https://, got {config.endpoint_url!r}"
        )


def _key_prefix(prefix: str) -> str:
    return prefix + "/" if prefix and not prefix.endswith("/") else prefix


def _from_mapping(cls: type[_C], values: Mapping[str, object], name_key: str) -> _C:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown bucket config keys {unknown}; known: {sorted(known)}")
    if name_key not in values:
        raise ConfigError(f"bucket config {name_key!r} is required")
    try:
        return cls(**values)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(f"bucket config: {exc}") from None


@dataclass(frozen=True, slots=True)
class AzureConfig:
    """How to reach one container (and a prefix in it) on Azure Blob Storage.

    Credentials, the first that is set: ``connection_string``; the file
    ``connection_string_file`` (one line); ``account_key`` (with
    ``endpoint_url``, the account's blob endpoint); the environment variable
    ``AZURE_STORAGE_CONNECTION_STRING``; else ``endpoint_url`` with
    azure-identity's ``DefaultAzureCredential`` (managed identity, workload
    identity, environment, Azure CLI) when the ``azure-identity`` package is
    installed. Field names are the configuration keys (``docs/stores.md``).
    """

    container: str
    #: Every key is stored under this prefix ("" for the container's root).
    prefix: str = ""
    #: The account's blob endpoint: ``https://<account>.blob.core.windows.net``,
    #: or Azurite's ``http://127.0.0.1:10000/devstoreaccount1``. Taken from
    #: the connection string when one is given.
    endpoint_url: str | None = None
    connection_string: str | None = field(default=None, repr=False)
    connection_string_file: str | None = None
    account_key: str | None = field(default=None, repr=False)
    #: Seconds to establish a connection, and of silence while reading.
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    #: Attempts per request, the first included (the SDK's retry policy).
    max_attempts: int = 3
    #: Requests in flight at once (worker threads and pooled connections).
    max_concurrency: int = 16
    #: Objects up to this size go up as one Put Blob; larger ones as staged
    #: blocks committed by one Put Block List (create-only: ``If-None-Match: *``).
    max_single_put_size: int = 64 * MIB
    #: Size of each staged block of a larger object.
    block_size: int = 8 * MIB
    #: Blobs per List Blobs page (Azure's maximum is 5000).
    list_page_size: int = 1000

    def __post_init__(self) -> None:
        _check_common(self)
        if not _CONTAINER.match(self.container):
            raise _bad(
                "container",
                f"{self.container!r} is not an Azure container name (3 to 63 lowercase "
                "letters, digits and single dashes)",
            )
        given = [k for k in ("connection_string", "connection_string_file") if getattr(self, k)]
        if len(given) > 1:
            raise _bad("connection_string", "give connection_string or connection_string_file")
        if self.account_key is not None and given:
            raise _bad("account_key", "give account_key or a connection string, not both")
        if self.account_key is not None and self.endpoint_url is None:
            raise _bad("account_key", "needs endpoint_url (the account's blob endpoint)")
        if not 1 <= self.max_single_put_size <= AZURE_MAX_PUT:
            raise _bad("max_single_put_size", f"must be between 1 and {AZURE_MAX_PUT} (5000 MiB)")
        if not 1 <= self.block_size <= 4000 * MIB:
            raise _bad("block_size", "must be between 1 and 4000 MiB")

    @property
    def key_prefix(self) -> str:
        """The prefix as stored: empty, or ending with ``/``."""
        return _key_prefix(self.prefix)

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> AzureConfig:
        """Build a config from config keys; unknown keys raise :class:`ConfigError`."""
        return _from_mapping(cls, values, "container")


@dataclass(frozen=True, slots=True)
class GcsConfig:
    """How to reach one bucket (and a prefix in it) on Google Cloud Storage (JSON API).

    Credentials: ``credentials_file`` (a service account's JSON key), else
    Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``, the
    metadata server on GCE/GKE, ``gcloud auth application-default login``);
    ``anonymous`` for an emulator. ``endpoint_url`` (or the environment's
    ``STORAGE_EMULATOR_HOST``) points the client elsewhere than Google.
    """

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    project: str | None = None
    credentials_file: str | None = None
    anonymous: bool = False
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    #: Attempts per request, the first included (the client's retry policy;
    #: conditional writes are retried by it, unconditional ones are not).
    max_attempts: int = 3
    max_concurrency: int = 16
    list_page_size: int = 1000

    def __post_init__(self) -> None:
        _check_common(self)
        if not _GCS_BUCKET.match(self.bucket):
            raise _bad("bucket", f"{self.bucket!r} is not a GCS bucket name")
        if self.anonymous and self.credentials_file:
            raise _bad("anonymous", "give anonymous or credentials_file, not both")

    @property
    def key_prefix(self) -> str:
        """The prefix as stored: empty, or ending with ``/``."""
        return _key_prefix(self.prefix)

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> GcsConfig:
        """Build a config from config keys; unknown keys raise :class:`ConfigError`."""
        return _from_mapping(cls, values, "bucket")
