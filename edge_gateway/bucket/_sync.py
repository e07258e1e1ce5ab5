"""A blocking facade over a :class:`~edge_gateway.bucket.Bucket`, for code that is not trio.

The PySpark pipeline runs in plain threads and processes (the driver, and
Python workers on every executor); the bucket backends are trio-async. A
:class:`SyncBucket` opens one backend inside a trio loop of its own, on a
daemon thread, and forwards each call there with ``trio.from_thread``: the
same backend code, key rules, error translation and statistics as the
gateway, only blocking. Calls from several threads at once run concurrently
in that loop (bounded by the backend's own limiter).

A :class:`SyncBucket` holds a thread and connections, so it never travels
between processes: pickle its *config* (:class:`LocalConfig`,
:class:`~edge_gateway.bucket.S3Config`, :class:`~edge_gateway.bucket.AzureConfig`,
:class:`~edge_gateway.bucket.GcsConfig`, all frozen dataclasses) and open it
where it is used. Opening imports only that store's SDK (boto3 only for S3).
"""

from __future__ import annotations

import builtins
import contextlib
import queue
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self, TypeVar

import trio

from edge_gateway.bucket._base import Bucket, BucketStatistics, GetResult, ObjectInfo
from edge_gateway.bucket._cloudconfig import AzureConfig, GcsConfig
from edge_gateway.bucket._errors import BucketUnavailable, NotFound
from edge_gateway.bucket._local import LocalBucket
from edge_gateway.bucket._open import open_cloud_bucket
from edge_gateway.bucket._s3config import S3Config
from edge_gateway.errors import ClosedError, InvalidInput

__all__ = ["LocalConfig", "StoreConfig", "SyncBucket"]

_T = TypeVar("_T")

#: Seconds ``close`` waits for the loop thread to release the backend.
_CLOSE_TIMEOUT: Final = 60.0


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """A local-directory bucket (:class:`~edge_gateway.bucket.LocalBucket`) at ``root``.

    On a Spark cluster the directory must be a mount every node shares. The
    bucket must exist (``create=False``), so a mount that is missing on one
    node fails that node's reads instead of reading an empty new bucket.
    """

    root: Path
    create: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.root, Path):
            raise InvalidInput(f"LocalConfig.root must be a Path, got {self.root!r}")


#: Every store a :class:`SyncBucket` (and the gateway) can open.
StoreConfig = LocalConfig | S3Config | AzureConfig | GcsConfig


async def open_bucket(config: StoreConfig) -> Bucket:
    """Open the async bucket ``config`` describes, importing only its store's SDK."""
    if isinstance(config, LocalConfig):
        return await LocalBucket.open(config.root, create=config.create)
    return await open_cloud_bucket(config)


class SyncBucket:
    """Blocking ``put``/``get``/``head``/``list``/``delete`` on a bucket opened from a config.

    Open with :meth:`open`; use as a context manager or call :meth:`close`.
    Errors are the bucket's own (:class:`~edge_gateway.bucket.NotFound`,
    :class:`~edge_gateway.bucket.BucketUnavailable`, ...); after :meth:`close`
    every call raises :class:`~edge_gateway.errors.ClosedError`.

    ``read_attempts`` > 1 repeats a ``get``/``head``/``list`` that ended in
    :class:`~edge_gateway.bucket.BucketUnavailable` (reads are idempotent).
    The S3 client retries a request that fails, but not an answer whose body
    breaks off half way (a link lost mid-download): a batch reader that
    would otherwise fail a whole Spark task asks for a few attempts.
    """

    def __init__(
        self,
        bucket: Bucket,
        token: trio.lowlevel.TrioToken,
        stop: trio.Event,
        thread: threading.Thread,
        *,
        read_attempts: int,
    ) -> None:
        # Built by open() only: the bucket lives in the loop behind ``token``.
        self._bucket = bucket
        self._token = token
        self._stop = stop
        self._thread = thread
        self._read_attempts = read_attempts
        self._closed = False

    @classmethod
    def open(cls, config: StoreConfig, *, read_attempts: int = 1) -> SyncBucket:
        """Start a loop thread, open the bucket in it and return the facade.

        Raises what opening the backend raises (``NoSuchBucket``,
        ``ConfigError`` for a missing optional SDK ...), with no thread left.
        """
        if not isinstance(config, StoreConfig):
            raise InvalidInput(f"not a bucket config: {config!r}")
        if read_attempts < 1:
            raise InvalidInput(f"read_attempts must be >= 1, got {read_attempts}")
        opened: queue.SimpleQueue[
            tuple[Bucket, trio.lowlevel.TrioToken, trio.Event] | BaseException
        ] = queue.SimpleQueue()

        async def serve() -> None:
            try:
                bucket = await open_bucket(config)
            except BaseException as exc:  # noqa: BLE001 - handed to the opening thread
                opened.put(exc)
                return
            stop = trio.Event()
            try:
                opened.put((bucket, trio.lowlevel.current_trio_token(), stop))
                await stop.wait()
            finally:
                await bucket.aclose()

        thread = threading.Thread(
            target=trio.run,
            args=(serve,),
            name=f"edgegw-bucket-{type(config).__name__}",
            daemon=True,
        )
        thread.start()
        result = opened.get()
        if isinstance(result, BaseException):
            thread.join()
            raise result
        bucket, token, stop = result
        return cls(bucket, token, stop, thread, read_attempts=read_attempts)

    # -- identity and state -------------------------------------------------

    @property
    def name(self) -> str:
        """The backend's URL-like name (``s3://b/p``, ``file:///d``)."""
        return self._bucket.name

    def describe(self) -> str:
        """The backend's sentence-fragment for messages."""
        return self._bucket.describe()

    def __repr__(self) -> str:
        return f"<SyncBucket {self._bucket.name}{' closed' if self._closed else ''}>"

    def __reduce__(self) -> str | tuple[Any, ...]:
        raise TypeError(
            "a SyncBucket holds a thread and connections and cannot be pickled: "
            "send its config (LocalConfig, S3Config ...) and open it where it is used"
        )

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def statistics(self) -> BucketStatistics:
        """The backend's counters (see :meth:`Bucket.statistics`)."""
        return self._run(self._bucket_statistics)

    async def _bucket_statistics(self) -> BucketStatistics:
        return self._bucket.statistics()

    # -- the interface ------------------------------------------------------

    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> ObjectInfo:
        """:meth:`Bucket.put`, blocking (never repeated: a put's outcome may be unknown)."""
        return self._run(
            lambda: self._bucket.put(key, data, if_none_match=if_none_match, if_match=if_match)
        )

    def get(self, key: str, *, start: int | None = None, end: int | None = None) -> GetResult:
        """:meth:`Bucket.get`, blocking: the object, or its byte range ``[start, end)``."""
        return self._read(lambda: self._bucket.get(key, start=start, end=end))

    def head(self, key: str) -> ObjectInfo:
        """:meth:`Bucket.head`, blocking."""
        return self._read(lambda: self._bucket.head(key))

    def exists(self, key: str) -> bool:
        """Whether an object has the key (one HEAD)."""
        try:
            self.head(key)
        except NotFound:
            return False
        return True

    def list(
        self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None
    ) -> builtins.list[ObjectInfo]:
        """:meth:`Bucket.list`, blocking: the objects under ``prefix``, sorted by key."""
        return self._read(lambda: self._bucket.list(prefix, start_after=start_after, limit=limit))

    def delete(self, key: str) -> None:
        """:meth:`Bucket.delete`, blocking."""
        self._run(lambda: self._bucket.delete(key))

    def close(self) -> None:
        """Close the backend and end the loop thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(trio.RunFinishedError):  # the loop is gone already
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(_CLOSE_TIMEOUT)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------

    def _run(self, call: Callable[[], Awaitable[_T]]) -> _T:
        if self._closed:
            raise ClosedError(f"{self._bucket.describe()} is closed")
        if threading.current_thread() is self._thread:
            raise RuntimeError("SyncBucket called from its own loop: use the async Bucket there")

        async def in_loop() -> _T:
            return await call()

        try:
            return trio.from_thread.run(in_loop, trio_token=self._token)
        except trio.RunFinishedError:
            raise ClosedError(f"{self._bucket.describe()}: its loop has ended") from None

    def _read(self, call: Callable[[], Awaitable[_T]]) -> _T:
        attempt = 1
        while True:
            try:
                return self._run(call)
            except BucketUnavailable as exc:
                if attempt >= self._read_attempts:
                    if attempt > 1:
                        exc.add_note(f"(failed {attempt} times in a row)")
                    raise
            attempt += 1
