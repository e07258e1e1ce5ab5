"""A bucket on Google Cloud Storage, through ``google-cloud-storage`` (``edgegw[gcs]``).

The JSON API, not GCS's S3-compatible XML API: the XML API has no
``If-None-Match`` on uploads, the JSON API has ``ifGenerationMatch=0``
(create only if no live object has the name), and ``ifGenerationMatch=<g>``
for compare-and-swap. An object's *generation* is its identity here: the
ETag this backend hands out is the generation as a decimal string, so
``put(..., if_match=etag)`` is ``ifGenerationMatch=<etag>``. GCS answers 412
to it also for a missing object, so a 412 is told apart by a HEAD.

The SDK blocks: every call runs in a worker thread under one
:class:`trio.CapacityLimiter`. Exceptions are translated in
:func:`translate_error`: 412 → :class:`PreconditionFailed`; 404 →
:class:`NotFound` (a missing *bucket* → :class:`AccessDenied`, code
``NoSuchBucket``); 401/403 and a credential chain that found nothing →
:class:`AccessDenied`; 408/429/5xx and transport failures →
:class:`BucketUnavailable`; other 4xx → :class:`InvalidRequest`.

A ranged read is a metadata GET (size and generation) then a media GET of
the range pinned to that generation, so data, size and ETag always describe
one version; a read costs two requests here.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

import google.api_core.exceptions as gexc
import google.auth.exceptions
import requests
import trio
from google.api_core.retry import Retry
from google.cloud import storage
from google.cloud.storage.retry import ConditionalRetryPolicy, is_generation_specified

from edge_gateway.bucket._base import Bucket, GetResult, ObjectInfo
from edge_gateway.bucket._cloudconfig import GcsConfig
from edge_gateway.bucket._errors import (
    AccessDenied,
    BucketUnavailable,
    InvalidRequest,
    NoSuchBucket,
    NotFound,
    PreconditionFailed,
)
from edge_gateway.bucket._paging import collect_listing
from edge_gateway.errors import ConfigError, EdgeGatewayError

__all__ = ["GcsBucket", "translate_error"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

_DENIED_ACTION: Final = (
    "give the gateway valid GCS credentials ([bucket] credentials_file, or Application "
    "Default Credentials) with a role that creates, reads and deletes objects in the "
    "bucket (roles/storage.objectUser); docs/stores.md"
)
_NO_BUCKET_ACTION: Final = (
    "create the bucket (edgegw never creates one), or correct [bucket] bucket; shipping "
    "resumes by itself once it exists"
)


def _client(config: GcsConfig) -> storage.Client:
    """Build the SDK client (blocking: may read a key file, may ask the metadata server)."""
    options: dict[str, Any] = {"project": config.project or "edgegw"}
    if config.endpoint_url:
        options["client_options"] = {"api_endpoint": config.endpoint_url}
    try:
        if config.anonymous:
            from google.auth.credentials import AnonymousCredentials

            anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
            return storage.Client(credentials=anonymous, **options)
        if config.credentials_file:
            return storage.Client.from_service_account_json(config.credentials_file, **options)
        if config.project is None:
            options.pop("project")
        return storage.Client(**options)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"bucket config for GCS bucket {config.bucket!r}: {exc}") from None


class GcsBucket(Bucket):
    """A :class:`Bucket` on one Google Cloud Storage bucket (keys under a prefix)."""

    def __init__(self, config: GcsConfig, client: storage.Client) -> None:
        super().__init__()
        self._config = config
        self._prefix = config.key_prefix
        self._client = client
        self._bucket = client.bucket(config.bucket)
        self._limiter = trio.CapacityLimiter(config.max_concurrency)
        self._timeout = (config.connect_timeout, config.read_timeout)
        # The client's retries count time, not attempts: about one second of
        # backoff per further attempt allowed. The callers (shipper, tailers)
        # retry on their own, so this only smooths over a blip.
        base = (
            Retry(initial=0.2, maximum=1.0, timeout=float(config.max_attempts - 1))
            if config.max_attempts > 1
            else None
        )
        self._retry = base
        self._conditional_retry = (
            None
            if base is None
            else ConditionalRetryPolicy(base, is_generation_specified, ["query_params"])
        )

    @classmethod
    async def open(cls, config: GcsConfig) -> GcsBucket:
        """Create the client for ``config``; no request is sent yet.

        A credential chain that finds nothing fails here as
        :class:`AccessDenied` (a person must provide credentials).
        """
        try:
            client = await trio.to_thread.run_sync(_client, config)
        except google.auth.exceptions.DefaultCredentialsError as exc:
            raise AccessDenied(
                f"GCS bucket {config.bucket!r}: no credentials: {exc}",
                code="NoCredentialsError",
                action=_DENIED_ACTION,
            ) from None
        return cls(config, client)

    @property
    def config(self) -> GcsConfig:
        return self._config

    @property
    def name(self) -> str:
        """``gs://bucket/prefix``."""
        return f"gs://{self._config.bucket}/{self._prefix}"

    def describe(self) -> str:
        where = self._config.endpoint_url or self._client._connection.API_BASE_URL
        return f"GCS bucket {self._config.bucket!r} (prefix {self._prefix!r}) at {where}"

    async def check_exists(self) -> None:
        """Raise :class:`NoSuchBucket` if the bucket does not exist (one object listing)."""

        def probe(bucket: Any) -> None:
            pages = self._client.list_blobs(
                bucket, prefix=self._prefix or None, max_results=1, timeout=self._timeout
            ).pages
            next(iter(pages), None)

        try:
            await self._run("list", None, probe)
        except AccessDenied as exc:
            if exc.code != "NoSuchBucket":
                raise
            raise NoSuchBucket(
                f"{self.describe()}: no such bucket (edgegw never creates buckets)"
            ) from None

    # -- hooks --------------------------------------------------------------

    async def _put(
        self, key: str, data: bytes, *, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo:
        full = self._full_key(key)
        generation: int | None = None
        if if_none_match:
            generation = 0
        elif if_match is not None:
            try:
                generation = int(if_match)
            except ValueError:
                # Not an ETag of this backend: it matches no object.
                await self._head(key)  # NotFound when there is none
                raise PreconditionFailed(
                    f"put of key {key!r}: {if_match!r} is not a generation of {self.describe()}",
                    key=key,
                ) from None

        def call(bucket: Any) -> Any:
            blob = bucket.blob(full)
            blob.upload_from_string(
                data,
                content_type="application/octet-stream",
                if_generation_match=generation,
                timeout=self._timeout,
                retry=self._conditional_retry if generation is not None else None,
            )
            return blob

        try:
            blob = await self._run("put", key, call)
        except PreconditionFailed:
            if if_match is not None:
                await self._head(key)  # GCS answers 412 for a missing object too
            raise
        return ObjectInfo(key, len(data), str(blob.generation), _when(blob.updated))

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        info = await self._head(key)
        if start >= info.size or (end is not None and start == end):
            return GetResult(
                key, b"", min(start, info.size), info.size, info.etag, info.last_modified
            )
        full = self._full_key(key)
        last = info.size - 1 if end is None else min(end, info.size) - 1

        def call(bucket: Any) -> bytes:
            blob = bucket.blob(full, generation=int(info.etag))
            data: bytes = blob.download_as_bytes(
                start=start,
                end=last,
                raw_download=True,
                timeout=self._timeout,
                retry=self._retry,
            )
            return data

        data = await self._run("get", key, call)
        if len(data) != last + 1 - start:
            raise BucketUnavailable(
                f"get of key {key!r} on {self.describe()}: asked for bytes {start}..{last}, "
                f"got {len(data)} bytes",
                key=key,
            )
        return GetResult(key, data, start, info.size, info.etag, info.last_modified)

    async def _head(self, key: str) -> ObjectInfo:
        full = self._full_key(key)

        def call(bucket: Any) -> Any:
            blob = bucket.get_blob(full, timeout=self._timeout, retry=self._retry)
            if blob is None:
                raise gexc.NotFound(f"no object {full!r}")  # type: ignore[no-untyped-call]
            return blob

        blob = await self._run("head", key, call)
        return ObjectInfo(key, int(blob.size), str(blob.generation), _when(blob.updated))

    async def _list(
        self, prefix: str, *, start_after: str | None, limit: int | None
    ) -> builtins.list[ObjectInfo]:
        full_prefix = self._prefix + prefix
        pages: Iterator[Any] | None = None
        # GCS's startOffset is inclusive; keys up to start_after are also
        # skipped on this side (an emulator may ignore the parameter).
        offset = None if start_after is None else self._prefix + start_after

        def next_page(bucket: Any) -> builtins.list[Any] | None:
            nonlocal pages
            if pages is None:
                pages = iter(
                    self._client.list_blobs(
                        bucket,
                        prefix=full_prefix or None,
                        start_offset=offset,
                        page_size=self._config.list_page_size,
                        timeout=self._timeout,
                        retry=self._retry,
                    ).pages
                )
            page = next(pages, None)
            return None if page is None else builtins.list(page)

        return await collect_listing(
            lambda: self._run("list", None, next_page),
            self._prefix,
            start_after,
            limit,
            lambda blob, key: ObjectInfo(
                key, int(blob.size), str(blob.generation), _when(blob.updated)
            ),
        )

    async def _delete(self, key: str) -> None:
        full = self._full_key(key)
        with contextlib.suppress(NotFound):  # idempotent
            await self._run(
                "delete",
                key,
                lambda b: b.delete_blob(full, timeout=self._timeout, retry=self._retry),
            )

    async def _aclose(self) -> None:
        await trio.to_thread.run_sync(self._client.close)

    # -- thread boundary ----------------------------------------------------------

    def _full_key(self, key: str) -> str:
        full = self._prefix + key
        if len(full.encode("utf-8")) > 1024:
            raise InvalidRequest(
                f"key {key!r} with prefix {self._prefix!r} exceeds 1024 bytes", key=key
            )
        return full

    async def _run(self, operation: str, key: str | None, fn: Callable[[Any], _T]) -> _T:
        try:
            return await trio.to_thread.run_sync(fn, self._bucket, limiter=self._limiter)
        except (
            gexc.GoogleAPIError,
            google.auth.exceptions.GoogleAuthError,
            requests.exceptions.RequestException,
            OSError,
        ) as exc:
            raise translate_error(exc, operation=operation, key=key, where=self.describe()) from exc


def translate_error(
    exc: BaseException, *, operation: str, key: str | None, where: str
) -> EdgeGatewayError:
    """The project's error for an exception of the GCS client (see the module docstring)."""
    what = f"{operation} of key {key!r}" if key is not None else operation
    detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    message = f"{what} on {where}: {type(exc).__name__}: {detail or 'no detail'}"
    if isinstance(exc, gexc.GoogleAPICallError):
        status = int(exc.code or 0)
        if (status == 404 and key is None) or "bucket does not exist" in detail.lower():
            return AccessDenied(
                f"{message}: the bucket does not exist", key=key, code="NoSuchBucket"
            )
        if status == 412:
            return PreconditionFailed(message, key=key)
        if status == 404:
            return NotFound(message, key=key)
        if status in (401, 403):
            return AccessDenied(message, key=key, code="AccessDenied", action=_DENIED_ACTION)
        if status >= 500 or status in (408, 409, 429):
            return BucketUnavailable(message, key=key)
        if 400 <= status < 500:
            return InvalidRequest(message, key=key)
        return BucketUnavailable(message, key=key)
    if isinstance(exc, google.auth.exceptions.DefaultCredentialsError):
        return AccessDenied(message, key=key, code="NoCredentialsError", action=_DENIED_ACTION)
    if isinstance(exc, google.auth.exceptions.RefreshError):
        return AccessDenied(message, key=key, code="ExpiredToken", action=_DENIED_ACTION)
    # Transport failures, retry deadlines, unknown client errors: transient.
    return BucketUnavailable(message, key=key)


def _when(value: datetime | None) -> datetime:
    return value.astimezone(UTC) if value is not None else datetime.now(UTC)
