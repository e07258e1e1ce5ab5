"""A bucket on Azure Blob Storage, through ``azure-storage-blob`` (``edgegw[azure]``).

The SDK blocks, so every call to it runs in a worker thread
(``trio.to_thread.run_sync``) under one :class:`trio.CapacityLimiter`, sized
like the client's connection pool; threads are never abandoned (the SDK's
timeouts bound them). Every exception of the SDK is translated here, in
:func:`translate_error`, and only here:

====================================================  ==========================
Azure answer / exception                              raised
====================================================  ==========================
412 ``ConditionNotMet``, 409 ``BlobAlreadyExists``    :class:`PreconditionFailed`
404 ``BlobNotFound``                                  :class:`NotFound`
404 ``ContainerNotFound``                             :class:`AccessDenied` (code
                                                      ``NoSuchBucket``)
401/403, ``ClientAuthenticationError`` (a key that    :class:`AccessDenied`
does not sign, a credential chain that found nothing)
5xx, 429, 408, other 409s, connection and read        :class:`BucketUnavailable`
failures (``ServiceRequestError``,
``ServiceResponseError``), other ``AzureError``
other 4xx                                             :class:`InvalidRequest`
====================================================  ==========================

How the interface maps onto Blob Storage: a create-only put is Put Blob
with ``If-None-Match: *`` (the SDK's ``overwrite=False``); an object larger
than ``max_single_put_size`` goes up as staged blocks and one Put Block List
that carries the same condition, so the whole upload is one atomic create.
A compare-and-swap is Put Blob with ``If-Match: <etag>``; Azure answers 412
to it also when the blob does not exist, so a 412 is told apart by a HEAD
(:class:`NotFound` when there is no blob). Ranged reads are Get Blob with a
``Range``; a LIST is List Blobs by prefix. List Blobs has no ``start-after``
(its marker is opaque), so ``list(start_after=...)`` pages from the prefix
and skips keys up to it on this side: edgegw lists only for GC, restores and
checks, never to discover new log entries.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

import trio
from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobBlock, BlobServiceClient, ContainerClient, ExponentialRetry

from edge_gateway.bucket._base import Bucket, GetResult, ObjectInfo
from edge_gateway.bucket._cloudconfig import AZURE_MAX_PUT, AzureConfig
from edge_gateway.bucket._errors import (
    AccessDenied,
    BucketUnavailable,
    InvalidRequest,
    NoSuchBucket,
    NotFound,
    PreconditionFailed,
)
from edge_gateway.bucket._paging import collect_listing
from edge_gateway.bucket._probe import probe_key
from edge_gateway.errors import ConfigError, EdgeGatewayError

__all__ = ["AzureBucket", "translate_error"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: The environment variable the Azure tools read a connection string from.
CONNECTION_STRING_ENV: Final = "AZURE_STORAGE_CONNECTION_STRING"
_PRECONDITION_CODES: Final = frozenset({"ConditionNotMet", "BlobAlreadyExists"})
_CONTAINER_CODES: Final = frozenset({"ContainerNotFound", "ContainerBeingDeleted"})
_DENIED_ACTION: Final = (
    "give the gateway valid Azure credentials ([bucket] connection_string, "
    "connection_string_file or account_key, read at start; AZURE_STORAGE_CONNECTION_STRING; "
    "or the identity DefaultAzureCredential finds) with a role that reads, writes and "
    "deletes blobs in the container (Storage Blob Data Contributor); docs/stores.md"
)
_NO_CONTAINER_ACTION: Final = (
    "create the container (edgegw never creates one), or correct [bucket] container or "
    "the account; shipping resumes by itself once it exists"
)

# The SDK logs every request and answer at INFO: keep it to warnings unless
# the operator configured that logger.
_http_log = logging.getLogger("azure.core.pipeline.policies.http_logging_policy")
if _http_log.level == logging.NOTSET:
    _http_log.setLevel(logging.WARNING)


def _service_client(
    config: AzureConfig, *, single_put_up_to: int | None = None
) -> BlobServiceClient:
    """Build the SDK client for ``config`` (blocking: may read a file).

    ``single_put_up_to`` replaces ``max_single_put_size`` (the client that
    sends every create-only put as one Put Blob on a store that ignores the
    condition on Put Block List).
    """
    import requests
    import requests.adapters

    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(
        pool_connections=config.max_concurrency, pool_maxsize=config.max_concurrency
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    options: dict[str, Any] = {
        "transport": RequestsTransport(
            session=session,
            session_owner=True,
            connection_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
        ),
        # The SDK's default waits 15 s, then 18 s, between attempts: far longer
        # than a bounded shutdown allows. The callers retry with their own
        # backoff, so a few short waits here are enough (1 s, 3 s, 5 s ...).
        "retry_policy": ExponentialRetry(
            initial_backoff=1,
            increment_base=2,
            retry_total=config.max_attempts - 1,
            random_jitter_range=1,
        ),
        "max_single_put_size": single_put_up_to or config.max_single_put_size,
        "max_block_size": config.block_size,
        "connection_timeout": config.connect_timeout,
        "read_timeout": config.read_timeout,
        "user_agent": "edgegw",
    }
    connection_string = config.connection_string
    if config.connection_string_file:
        try:
            connection_string = Path(config.connection_string_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"bucket config 'connection_string_file': cannot read "
                f"{config.connection_string_file!r}: {exc.strerror or exc}"
            ) from None
    if connection_string is None and config.account_key is None:
        connection_string = os.environ.get(CONNECTION_STRING_ENV) or None
    try:
        if connection_string is not None:
            return BlobServiceClient.from_connection_string(connection_string, **options)
        if config.endpoint_url is None:
            raise ConfigError(
                "bucket config: no Azure credentials: set connection_string, "
                "connection_string_file, account_key (with endpoint_url) or "
                f"{CONNECTION_STRING_ENV}, or endpoint_url with azure-identity installed "
                "(DefaultAzureCredential)"
            )
        if config.account_key is not None:
            return BlobServiceClient(config.endpoint_url, credential=config.account_key, **options)
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError:
            raise ConfigError(
                "bucket config: no Azure credentials in the config or "
                f"{CONNECTION_STRING_ENV}, and azure-identity (for DefaultAzureCredential: "
                "managed identity, workload identity, Azure CLI) is not installed"
            ) from None
        return BlobServiceClient(
            config.endpoint_url, credential=DefaultAzureCredential(), **options
        )
    except ValueError as exc:
        # A malformed connection string or URL: only the config can fix it.
        raise ConfigError(f"bucket config for container {config.container!r}: {exc}") from None


class AzureBucket(Bucket):
    """A :class:`Bucket` on one Azure Blob Storage container (keys under a prefix).

    Open with :meth:`open` (builds the client in a worker thread; no request
    yet) and close with :meth:`aclose`.
    """

    def __init__(self, config: AzureConfig, service: BlobServiceClient) -> None:
        super().__init__()
        self._config = config
        self._prefix = config.key_prefix
        self._service = service
        self._container: ContainerClient = service.get_container_client(config.container)
        self._limiter = trio.CapacityLimiter(config.max_concurrency)
        #: Whether Put Block List honours If-None-Match here (None: not probed yet).
        self._blocks_conditional: bool | None = None
        self._blocks_probe_lock = trio.Lock()
        #: Sends any object as one Put Blob (built when a store needs it).
        self._single_put: BlobServiceClient | None = None

    #: For ``edgegw bucket check``: how this store commits a large object.
    multipart_commit = "Put Block List"
    multipart_workaround = (
        "the store ignores If-None-Match on Put Block List; edgegw sends every create-only "
        "put as one Put Blob on it (up to 5000 MiB), so it stays create-only"
    )

    @classmethod
    async def open(cls, config: AzureConfig) -> AzureBucket:
        """Create the client for ``config``; :class:`ConfigError` for one no store accepts."""
        service = await trio.to_thread.run_sync(_service_client, config)
        return cls(config, service)

    @property
    def config(self) -> AzureConfig:
        """The configuration this bucket was opened with."""
        return self._config

    @property
    def name(self) -> str:
        """``azure://<account>/<container>/<prefix>``."""
        return f"azure://{self._service.account_name}/{self._config.container}/{self._prefix}"

    def describe(self) -> str:
        """Names account, container, prefix and endpoint for messages."""
        return (
            f"Azure container {self._config.container!r} (prefix {self._prefix!r}) "
            f"at {self._service.url}"
        )

    async def check_exists(self) -> None:
        """Raise :class:`NoSuchBucket` if the container does not exist (one List Blobs)."""

        def probe(container: ContainerClient) -> None:
            pages = container.list_blobs(
                name_starts_with=self._prefix or None, results_per_page=1
            ).by_page()
            next(pages, None)

        try:
            await self._run("list", None, probe)
        except AccessDenied as exc:
            if exc.code != "NoSuchBucket":
                raise
            raise NoSuchBucket(
                f"{self.describe()}: no such container (edgegw never creates containers)"
            ) from None

    # -- hooks --------------------------------------------------------------

    async def _put(
        self, key: str, data: bytes, *, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo:
        full = self._full_key(key)
        kwargs: dict[str, Any] = {"overwrite": not if_none_match, "max_concurrency": 4}
        if if_match is not None:
            kwargs.update(etag=if_match, match_condition=MatchConditions.IfNotModified)
        container = self._container
        if (
            if_none_match
            and len(data) > self._config.max_single_put_size
            and not await self.multipart_create_is_conditional(near=key)
        ):
            if len(data) > AZURE_MAX_PUT:
                raise InvalidRequest(
                    f"put of {len(data)} bytes create-only on {self.describe()}, which ignores "
                    "If-None-Match on Put Block List, exceeds Azure's single Put Blob limit",
                    key=key,
                )
            container = await self._single_put_container()

        def call(_: ContainerClient) -> dict[str, Any]:
            result: dict[str, Any] = container.get_blob_client(full).upload_blob(data, **kwargs)
            return result

        try:
            answer = await self._run("put", key, call)
        except PreconditionFailed:
            if if_match is not None:
                # Azure answers 412 to If-Match on a missing blob too.
                await self._head(key)  # NotFound when there is none
            raise
        return ObjectInfo(key, len(data), _etag(answer.get("etag"), key), _when(answer))

    async def multipart_create_is_conditional(self, near: str = "") -> bool:
        """Whether Put Block List with ``If-None-Match: *`` onto an existing blob is refused.

        Azure and Azurite refuse it (409/412); a store that replaced the
        blob would let a large create-only put overwrite a log entry, so
        there every create-only put goes up as one Put Blob. Probed once per
        bucket object (three small requests under ``_edgegw-probe/``, in the
        region folder of ``near`` when it is in one), then remembered.
        """
        if self._blocks_conditional is not None:
            return self._blocks_conditional
        async with self._blocks_probe_lock:
            if self._blocks_conditional is None:
                honoured = await self._probe_block_condition(near)
                if not honoured:
                    _log.warning(
                        "%s ignores If-None-Match on Put Block List: create-only puts go up "
                        "as single Put Blobs there, whatever their size",
                        self.describe(),
                    )
                self._blocks_conditional = honoured
        return self._blocks_conditional

    async def _probe_block_condition(self, near: str) -> bool:
        folder = near.split("/", 2)
        key = probe_key("/".join(folder[:2]) if len(folder) == 3 and folder[0] == "regions" else "")
        full = self._full_key(key)
        block_id = "ZWRnZWd3LXByb2Jl"  # base64 of "edgegw-probe"

        def commit_over(container: ContainerClient) -> None:
            blob = container.get_blob_client(full)
            blob.stage_block(block_id, b"edgegw block probe: second\n")
            blob.commit_block_list([BlobBlock(block_id)], if_none_match="*")

        await self._put(key, b"edgegw block probe: first\n", if_none_match=False, if_match=None)
        try:
            try:
                await self._run("put", key, commit_over)
            except PreconditionFailed:
                return True
            return False
        finally:
            with trio.move_on_after(10, shield=True):
                try:
                    await self._delete(key)
                except EdgeGatewayError as exc:
                    _log.warning("could not delete probe object %r in %s: %s", key, self.name, exc)

    async def _single_put_container(self) -> ContainerClient:
        if self._single_put is None:
            self._single_put = await trio.to_thread.run_sync(
                partial(_service_client, self._config, single_put_up_to=AZURE_MAX_PUT)
            )
        return self._single_put.get_container_client(self._config.container)

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        full = self._full_key(key)
        if end is not None and start == end:
            return await self._empty_read(key, start)
        length = None if end is None else end - start

        def call(container: ContainerClient) -> tuple[bytes, Any] | None:
            blob = container.get_blob_client(full)
            try:
                downloader = blob.download_blob(offset=start, length=length, max_concurrency=1)
            except HttpResponseError as exc:
                if exc.status_code == 416:
                    return None  # the range starts at or past the end
                raise
            return downloader.readall(), downloader.properties

        answer = await self._run("get", key, call)
        if answer is None:
            return await self._empty_read(key, start)
        data, props = answer
        size = _total_size(props, start, len(data), key)
        return GetResult(
            key,
            data,
            min(start, size),
            size,
            _etag(props.etag, key),
            _need(props.last_modified, "Last-Modified", key),
        )

    async def _empty_read(self, key: str, start: int) -> GetResult:
        info = await self._head(key)
        return GetResult(key, b"", min(start, info.size), info.size, info.etag, info.last_modified)

    async def _head(self, key: str) -> ObjectInfo:
        full = self._full_key(key)
        props = await self._run(
            "head", key, lambda c: c.get_blob_client(full).get_blob_properties()
        )
        return ObjectInfo(
            key,
            int(props.size),
            _etag(props.etag, key),
            _need(props.last_modified, "Last-Modified", key),
        )

    async def _list(
        self, prefix: str, *, start_after: str | None, limit: int | None
    ) -> builtins.list[ObjectInfo]:
        full_prefix = self._prefix + prefix
        pages: Iterator[Iterator[Any]] | None = None

        def next_page(container: ContainerClient) -> builtins.list[Any] | None:
            nonlocal pages
            if pages is None:
                pages = container.list_blobs(
                    name_starts_with=full_prefix or None,
                    results_per_page=self._config.list_page_size,
                ).by_page()
            page = next(pages, None)
            return None if page is None else builtins.list(page)

        return await collect_listing(
            lambda: self._run("list", None, next_page),
            self._prefix,
            start_after,
            limit,
            lambda props, key: ObjectInfo(
                key,
                int(props.size),
                _etag(props.etag, key),
                _need(props.last_modified, "Last-Modified", key),
            ),
        )

    async def _delete(self, key: str) -> None:
        full = self._full_key(key)
        with contextlib.suppress(NotFound):  # idempotent
            await self._run("delete", key, lambda c: c.get_blob_client(full).delete_blob())

    async def _aclose(self) -> None:
        await trio.to_thread.run_sync(self._service.close)
        if self._single_put is not None:
            await trio.to_thread.run_sync(self._single_put.close)

    # -- thread boundary ----------------------------------------------------------

    def _full_key(self, key: str) -> str:
        full = self._prefix + key
        if len(full.encode("utf-8")) > 1024:
            raise InvalidRequest(
                f"key {key!r} with prefix {self._prefix!r} exceeds 1024 bytes", key=key
            )
        return full

    async def _run(
        self, operation: str, key: str | None, fn: Callable[[ContainerClient], _T]
    ) -> _T:
        """Call blocking SDK code ``fn(container)`` in a worker thread; translate its errors."""
        try:
            return await trio.to_thread.run_sync(fn, self._container, limiter=self._limiter)
        except (AzureError, OSError) as exc:
            raise translate_error(exc, operation=operation, key=key, where=self.describe()) from exc


def translate_error(
    exc: BaseException, *, operation: str, key: str | None, where: str
) -> EdgeGatewayError:
    """The project's error for an exception of the Azure SDK (see the module docstring)."""
    what = f"{operation} of key {key!r}" if key is not None else operation
    if isinstance(exc, HttpResponseError):
        status = int(exc.status_code or 0)
        code = str(getattr(exc, "error_code", None) or "")
        reason = _one_line(exc.reason or "") or "no reason"
        message = f"{what} on {where}: HTTP {status} {code or reason}"
        if code in _CONTAINER_CODES:
            return AccessDenied(
                f"{message}: the container does not exist",
                key=key,
                code="NoSuchBucket",
                action=_NO_CONTAINER_ACTION,
            )
        if (
            isinstance(exc, (ResourceModifiedError, ResourceExistsError))
            and (status == 412 or code in _PRECONDITION_CODES)
        ) or status == 412:
            return PreconditionFailed(message, key=key)
        if isinstance(exc, ResourceNotFoundError) or status == 404:
            return NotFound(message, key=key)
        if status in (401, 403) or isinstance(exc, ClientAuthenticationError):
            # No status: the credential chain found nothing (DefaultAzureCredential).
            fallback = "AccessDenied" if status else "NoCredentialsError"
            return AccessDenied(message, key=key, code=code or fallback, action=_DENIED_ACTION)
        if status >= 500 or status in (408, 409, 429) or status == 0:
            return BucketUnavailable(message, key=key)
        if 400 <= status < 500:
            return InvalidRequest(message, key=key)
        return BucketUnavailable(message, key=key)
    detail = _one_line(str(exc)) or "no detail"
    message = f"{what} on {where}: {type(exc).__name__}: {detail}"
    if isinstance(exc, ClientAuthenticationError):
        # A credential chain that found nothing usable: a person must act.
        return AccessDenied(message, key=key, code="NoCredentialsError", action=_DENIED_ACTION)
    # ServiceRequestError (connect), ServiceResponseError (read), a timeout,
    # a broken stream, an unknown AzureError: transient, the caller retries.
    return BucketUnavailable(message, key=key)


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _need(value: _T | None, name: str, key: str) -> _T:
    """A field every answer carries; a store that left it out answered wrongly."""
    if value is None:
        raise BucketUnavailable(f"the store's answer for key {key!r} has no {name}", key=key)
    return value


def _etag(value: str | None, key: str) -> str:
    """The ETag, always quoted: Azure quotes it in headers but not in List Blobs."""
    etag = _need(value, "ETag", key)
    return etag if etag.startswith('"') else f'"{etag}"'


def _when(answer: dict[str, Any]) -> datetime:
    value = answer.get("last_modified") or answer.get("date")
    return value.astimezone(UTC) if isinstance(value, datetime) else datetime.now(UTC)


def _total_size(props: Any, start: int, got: int, key: str) -> int:
    """The whole blob's size: from ``Content-Range`` (``bytes 5-9/10``) when ranged."""
    content_range = getattr(props, "content_range", None)
    if content_range:
        try:
            return int(str(content_range).rpartition("/")[2])
        except ValueError:
            raise BucketUnavailable(
                f"unparsable Content-Range {content_range!r}", key=key
            ) from None
    size = getattr(props, "size", None)
    return int(size) if size is not None else start + got
