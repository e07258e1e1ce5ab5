"""The bucket interface every backend implements.

The public methods live here and are concrete: they check arguments (the
same key rules for every backend, so a key that works on one works on all),
refuse calls after ``aclose()`` and keep the statistics. A backend implements
the underscored hooks (``_put``, ``_get``, ...), which receive arguments that
are already valid.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Final, Self

import trio

from edge_gateway.bucket._errors import (
    BucketUnavailable,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
)
from edge_gateway.errors import ClosedError

#: S3's limit on key length, in UTF-8 bytes; every backend enforces it.
MAX_KEY_BYTES: Final = 1024

#: The operation names used by statistics and by ``FaultyBucket(operations=...)``.
OPERATIONS: Final = frozenset({"put", "get", "head", "list", "delete"})


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a store knows about one object.

    ``etag`` is opaque: pass it back unchanged as ``put(..., if_match=etag)``.
    Each backend computes it its own way (S3: the store's ETag, quoted; local:
    the quoted hex MD5 of the content), so etags are comparable only within
    one backend. ``last_modified`` is timezone-aware (UTC).
    """

    key: str
    size: int
    etag: str
    last_modified: datetime


@dataclass(frozen=True, slots=True)
class GetResult:
    """The bytes of a (possibly ranged) read, with the object's identity.

    ``data`` is ``content[start:start + len(data)]`` of the object whose total
    length is ``size`` and whose ETag is ``etag``; data, size and etag always
    describe the same version of the object.
    """

    key: str
    data: bytes = field(repr=False)
    start: int
    size: int
    etag: str
    last_modified: datetime

    @property
    def end(self) -> int:
        """Offset one past the last byte returned (exclusive)."""
        return self.start + len(self.data)

    @property
    def is_whole(self) -> bool:
        """Whether ``data`` is the complete object."""
        return self.start == 0 and len(self.data) == self.size

    @property
    def info(self) -> ObjectInfo:
        """The object's metadata without the data."""
        return ObjectInfo(self.key, self.size, self.etag, self.last_modified)


@dataclass(frozen=True, slots=True)
class BucketStatistics:
    """Counters of one bucket object since it was opened.

    Requests count calls of the interface (a multipart upload is one put).
    ``precondition_failed`` and ``not_found`` are answers rather than
    failures, so ``errors`` does not include them; ``unavailable`` is the part
    of ``errors`` that was :class:`BucketUnavailable`.
    """

    puts: int = 0
    gets: int = 0
    heads: int = 0
    lists: int = 0
    deletes: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    precondition_failed: int = 0
    not_found: int = 0
    unavailable: int = 0
    errors: int = 0

    @property
    def requests(self) -> int:
        """All calls, of every kind."""
        return self.puts + self.gets + self.heads + self.lists + self.deletes


class _Counters:
    """The mutable side of :class:`BucketStatistics` (trio code only, no locking)."""

    def __init__(self) -> None:
        self.requests = dict.fromkeys(OPERATIONS, 0)
        self.bytes_written = 0
        self.bytes_read = 0
        self.precondition_failed = 0
        self.not_found = 0
        self.unavailable = 0
        self.errors = 0
        #: The last request that ended found the store unreachable, and the
        #: event set when one is answered again (:meth:`Bucket.wait_reachable`).
        self.unreachable = False
        self.reachable_again: trio.Event | None = None

    @contextmanager
    def track(self, operation: str) -> Iterator[None]:
        self.requests[operation] += 1
        try:
            yield
        except PreconditionFailed:
            self.precondition_failed += 1
            self._answered()
            raise
        except NotFound:
            self.not_found += 1
            self._answered()
            raise
        except BucketUnavailable:
            self.unavailable += 1
            self.errors += 1
            self.unreachable = True
            raise
        except Exception:
            self.errors += 1
            raise
        self._answered()

    def _answered(self) -> None:
        if self.unreachable:
            self.unreachable = False
            event, self.reachable_again = self.reachable_again, None
            if event is not None:
                event.set()

    def snapshot(self) -> BucketStatistics:
        r = self.requests
        return BucketStatistics(
            puts=r["put"],
            gets=r["get"],
            heads=r["head"],
            lists=r["list"],
            deletes=r["delete"],
            bytes_written=self.bytes_written,
            bytes_read=self.bytes_read,
            precondition_failed=self.precondition_failed,
            not_found=self.not_found,
            unavailable=self.unavailable,
            errors=self.errors,
        )


def validate_key(key: object) -> str:
    """Return ``key`` if it is a valid object key, else raise :class:`InvalidRequest`.

    The rules are the intersection of what S3 and a POSIX directory accept, so
    every backend stores the same keys: 1 to 1024 UTF-8 bytes; ``/``-separated
    segments that are not empty (no leading, trailing or doubled ``/``) and not
    ``.`` or ``..``; no control characters and no backslash.
    """
    if not isinstance(key, str):
        raise InvalidRequest(f"object key must be a string, got {type(key).__name__}")
    if not key:
        raise InvalidRequest("object key must not be empty")
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"object key {key!r} is not valid Unicode", key=key) from None
    if len(encoded) > MAX_KEY_BYTES:
        raise InvalidRequest(
            f"object key is {len(encoded)} bytes long; the limit is {MAX_KEY_BYTES}", key=key
        )
    if any(c < " " or c in "\x7f\\" for c in key):
        raise InvalidRequest(
            f"object key {key!r} contains a control character or a backslash", key=key
        )
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidRequest(
                f"object key {key!r} has an empty, '.' or '..' segment "
                "(no leading, trailing or doubled '/')",
                key=key,
            )
    return key


def validate_prefix(prefix: object) -> str:
    """Return ``prefix`` if some valid key could start with it, else raise.

    The empty prefix lists everything. A prefix is a plain string prefix (it
    need not end at a ``/``), but the complete segments in it follow the key
    rules, which also keeps a directory walk inside its root.
    """
    if not isinstance(prefix, str):
        raise InvalidRequest(f"list prefix must be a string, got {type(prefix).__name__}")
    if prefix:
        try:
            # Any valid key continues a valid prefix with at least one more
            # character; checking prefix + "x" applies the segment rules to the
            # complete segments only.
            validate_key(prefix + "x")
        except InvalidRequest as exc:
            raise InvalidRequest(f"list prefix {prefix!r} cannot match any key: {exc}") from None
    return prefix


class Bucket(abc.ABC):
    """An object store holding immutable-by-convention objects under string keys.

    All methods are trio-async and safe to call from concurrent tasks. The
    guarantees every backend gives (checked by the shared contract suite in
    ``tests/bucket/``):

    * ``put(..., if_none_match=True)`` is an atomic create-only: of any number
      of concurrent creators of one key exactly one succeeds, the others get
      :class:`PreconditionFailed`;
    * ``put(..., if_match=etag)`` is an atomic compare-and-swap on the ETag
      (:class:`PreconditionFailed` if it changed, :class:`NotFound` if the
      object is gone);
    * a successful put is durable and visible to every later call;
    * ``get`` returns data, size and etag of one version of the object.

    Use as ``async with`` or call :meth:`aclose`; afterwards every call raises
    :class:`~edge_gateway.errors.ClosedError`.
    """

    def __init__(self) -> None:
        self._closed = False
        self._counters = _Counters()

    async def wait_reachable(self) -> None:
        """Return once a request to the store is answered after one found it unreachable.

        At once if the last request that ended was answered (or none failed).
        Lets a component backing off after an outage (the shipper, whose
        backoff grows to ``retry_cap_s``) retry as soon as another one (a
        mirror polling every second) finds the link back. Wrappers forward
        it to the store they wrap, which sees every component's requests.
        """
        c = self._counters
        if not c.unreachable:
            return
        if c.reachable_again is None:
            c.reachable_again = trio.Event()
        await c.reachable_again.wait()

    # -- identity -----------------------------------------------------------

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """A short URL-like name for logs and metrics (``s3://b/p``, ``file:///d``)."""

    def describe(self) -> str:
        """A sentence-fragment naming the store for error messages."""
        return self.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    async def check_exists(self) -> None:  # noqa: B027 - a no-op unless a backend needs a request
        """Raise :class:`NoSuchBucket` if the store has no such bucket.

        Opening an S3 bucket makes no request, so a mistyped name surfaces
        only here (or at the first request); a local bucket is checked when
        it is opened, and this is a no-op. Other failures (unavailable,
        access denied) propagate as usual.
        """

    # -- the interface ------------------------------------------------------

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> ObjectInfo:
        """Store ``data`` under ``key`` and return the new object's info.

        ``if_none_match=True`` creates only if no object has the key, else
        raises :class:`PreconditionFailed`. ``if_match=etag`` replaces only
        the version with that ETag (:class:`PreconditionFailed` if it differs,
        :class:`NotFound` if there is none). The two are exclusive.

        On :class:`BucketUnavailable` the outcome is unknown: the object may
        have been stored.
        """
        validate_key(key)
        if not isinstance(data, bytes):
            raise InvalidRequest(f"put data must be bytes, got {type(data).__name__}", key=key)
        if if_none_match and if_match is not None:
            raise InvalidRequest("if_none_match and if_match are exclusive", key=key)
        if if_match is not None and (not isinstance(if_match, str) or not if_match):
            raise InvalidRequest("if_match must be a non-empty ETag string", key=key)
        self._check_open()
        with self._counters.track("put"):
            info = await self._put(key, data, if_none_match=if_none_match, if_match=if_match)
        self._counters.bytes_written += len(data)
        return info

    async def get(self, key: str, *, start: int | None = None, end: int | None = None) -> GetResult:
        """Read the object, or the byte range ``[start, end)`` of it.

        The range has Python slice semantics on the content: ``start``
        defaults to 0 and ``end`` (exclusive) to the object's size; a range
        reaching past the end is clipped, one starting at or past the end
        returns no data. Both must be non-negative with ``start <= end``.
        ``GetResult.size`` is always the whole object's size.
        """
        validate_key(key)
        for label, value in (("start", start), ("end", end)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise InvalidRequest(f"{label} must be a non-negative int, got {value!r}", key=key)
        if start is not None and end is not None and end < start:
            raise InvalidRequest(f"range end {end} is before start {start}", key=key)
        self._check_open()
        with self._counters.track("get"):
            result = await self._get(key, start or 0, end)
        self._counters.bytes_read += len(result.data)
        return result

    async def head(self, key: str) -> ObjectInfo:
        """Return the object's size, etag and modification time, or raise :class:`NotFound`."""
        validate_key(key)
        self._check_open()
        with self._counters.track("head"):
            return await self._head(key)

    async def list(
        self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None
    ) -> builtins.list[ObjectInfo]:
        """Return the objects whose keys start with ``prefix``, sorted by key.

        Sorting is by Unicode code point, which equals S3's UTF-8 byte order.
        ``start_after`` skips keys up to and including it; ``limit`` caps the
        number returned (``None``: all; the S3 backend pages internally).
        """
        validate_prefix(prefix)
        if start_after is not None and not isinstance(start_after, str):
            raise InvalidRequest(f"start_after must be a string, got {start_after!r}")
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise InvalidRequest(f"limit must be a non-negative int or None, got {limit!r}")
        self._check_open()
        if limit == 0:
            return []
        with self._counters.track("list"):
            return await self._list(prefix, start_after=start_after, limit=limit)

    async def delete(self, key: str) -> None:
        """Delete the object; deleting a missing key succeeds (idempotent)."""
        validate_key(key)
        self._check_open()
        with self._counters.track("delete"):
            await self._delete(key)

    async def abort_incomplete_uploads(self, prefix: str) -> int:
        """Abort the unfinished multipart uploads to keys under ``prefix``; return how many.

        What a crash between a multipart upload's parts and its completion
        leaves behind: invisible to reads and lists, but stored (and on AWS
        billed) until aborted. Only S3 keeps such state that it does not
        clean itself (Azure drops uncommitted blocks after a week; local and
        GCS uploads are single-shot), so elsewhere this returns 0 without a
        request. Aborting an upload that another writer is still sending makes
        its completion fail (:class:`BucketUnavailable`: it sends it again);
        it never removes an object. One list request per page of uploads,
        counted as a ``list``; the aborts are not counted as requests.
        """
        validate_prefix(prefix)
        self._check_open()
        with self._counters.track("list"):
            return await self._abort_incomplete_uploads(prefix)

    def statistics(self) -> BucketStatistics:
        """A snapshot of this bucket object's counters."""
        return self._counters.snapshot()

    async def aclose(self) -> None:
        """Release connections and threads' resources; idempotent.

        Callers must not have calls in flight (in trio they cannot, once
        the tasks that made them are done).
        """
        if self._closed:
            return
        self._closed = True
        await self._aclose()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self.describe()} is closed")

    # -- backend hooks ------------------------------------------------------

    @abc.abstractmethod
    async def _put(
        self, key: str, data: bytes, *, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo: ...

    @abc.abstractmethod
    async def _get(self, key: str, start: int, end: int | None) -> GetResult: ...

    @abc.abstractmethod
    async def _head(self, key: str) -> ObjectInfo: ...

    @abc.abstractmethod
    async def _list(
        self, prefix: str, *, start_after: str | None, limit: int | None
    ) -> builtins.list[ObjectInfo]: ...

    @abc.abstractmethod
    async def _delete(self, key: str) -> None: ...

    @abc.abstractmethod
    async def _aclose(self) -> None: ...

    async def _abort_incomplete_uploads(self, prefix: str) -> int:
        """Backends without leftover upload state have nothing to abort."""
        return 0
