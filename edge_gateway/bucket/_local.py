"""A bucket in a local directory: the embedded default.

Layout under the root directory::

    objects/<key>     one regular file per object; "/" in keys are directories
    tmp/              files being written; never visible as objects
    lock              flock()ed around replacing puts and deletes

How each guarantee is kept (see ``docs/bucket.md``):

* **Durable writes.** Data goes to ``tmp/<random>``, is fsynced, and only then
  gets its name under ``objects/``; the directory is fsynced after. A crash
  leaves either no object or the whole object, never a torn one.
* **Atomic create-only.** ``os.link(tmp, target)`` fails with ``EEXIST`` if
  the name exists, atomically, in the kernel; no lock is involved, so it also
  holds between processes sharing the directory.
* **Compare-and-swap.** ``if_match`` puts, plain puts and deletes run under a
  trio lock (one thread per process waits) plus an ``flock`` on ``lock``
  (other processes), compare the current content's ETag and ``os.replace``.
* **Consistent reads.** Files are never modified in place: every put creates
  a new inode. A reader's open file descriptor therefore keeps one version,
  and data, size and etag all come from that descriptor.

ETags are the quoted hex MD5 of the content (S3's ETag for single-part
uploads). Computing one reads the whole file, so etags are cached by inode
identity (device, inode, size, mtime); the compare-and-swap compares against
a freshly computed digest, so a stale cache entry could only make a CAS fail,
never succeed wrongly.

A key cannot name both an object and a "directory" of other keys (``a`` and
``a/b``), as S3 would allow; such a put raises :class:`InvalidRequest`. The
bucket layout of edgegw never does that.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import hashlib
import logging
import os
import stat
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TypeVar, TypeVarTuple

import trio

from edge_gateway.bucket._base import Bucket, GetResult, ObjectInfo
from edge_gateway.bucket._errors import (
    AccessDenied,
    BucketError,
    BucketGone,
    BucketUnavailable,
    InvalidRequest,
    NoSuchBucket,
    NotFound,
    PreconditionFailed,
)
from edge_gateway.durable import sync_directory
from edge_gateway.errors import CorruptData

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

log = logging.getLogger("edgegw.bucket")

_CHUNK: Final = 1024 * 1024
_ETAG_CACHE_SIZE: Final = 4096
#: Temporary files older than this are leftovers of a crash and removed on open.
_STALE_TMP_SECONDS: Final = 3600.0
#: A concurrent delete may remove an empty directory between our mkdir and link.
_LINK_ATTEMPTS: Final = 5


class LocalBucket(Bucket):
    """A :class:`Bucket` stored in a local (or shared-mount) directory.

    Create it with :meth:`open`, which checks (or makes) the directory. File I/O runs
    in worker threads, at most ``max_concurrency`` at a time.
    """

    def __init__(self, root: Path, *, max_concurrency: int = 8) -> None:
        super().__init__()
        self._root = root.absolute()
        self._objects = self._root / "objects"
        self._tmp = self._root / "tmp"
        self._lock_path = self._root / "lock"
        self._limiter = trio.CapacityLimiter(max_concurrency)
        # Serialises replacing writers inside this process so that only one
        # worker thread at a time blocks on the cross-process flock.
        self._write_lock = trio.Lock()
        self._etags: OrderedDict[tuple[int, int, int, int], str] = OrderedDict()
        self._etags_lock = threading.Lock()
        #: The open's writes (lock file, clock probe, stale tmp/ files) failed
        #: as an outage (EROFS, ENOSPC, EIO, EACCES): done before the next write.
        self._housekeeping_due = False

    @classmethod
    async def open(
        cls, root: str | os.PathLike[str], *, create: bool = False, max_concurrency: int = 8
    ) -> LocalBucket:
        """Open the bucket directory ``root``.

        Without ``create`` the bucket must exist: ``root`` is a directory that
        holds ``objects/``; otherwise :class:`NoSuchBucket` is raised and
        nothing is created, so a mistyped path (or a share that is not
        mounted) never turns into a new, empty bucket. ``create=True`` makes a
        new bucket: ``root`` and its parents when missing, the layout inside
        when ``root`` is empty. A non-empty directory without ``objects/`` is
        refused either way: it is something else.

        An existing bucket opens even when it cannot be written to now (a
        read-only remount, a full disk, EIO): the open's own writes (the lock
        file, the clock probe, removing stale files in ``tmp/``) are then
        put off to the first write, which fails as an outage
        (:class:`BucketUnavailable`, :class:`AccessDenied`) until the
        directory takes writes again -- as for a running gateway. Reads work
        meanwhile. A gateway restarting on such a bucket serves at once.
        """
        bucket = cls(Path(root), max_concurrency=max_concurrency)
        deferred = await bucket._in_thread(bucket._prepare, create, key=None)
        if deferred is not None:
            bucket._housekeeping_due = True
            log.warning(
                "%s cannot be written to now (%s): opened for reading; writes retry until it can",
                bucket.describe(),
                deferred,
            )
        return bucket

    @property
    def root(self) -> Path:
        """The bucket's root directory."""
        return self._root

    @property
    def name(self) -> str:
        """``file://`` URL of the root directory."""
        return self._root.as_uri()

    def describe(self) -> str:
        """Names the directory for messages."""
        return f"local bucket directory {str(self._root)!r}"

    # -- hooks --------------------------------------------------------------

    async def _put(
        self, key: str, data: bytes, *, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo:
        await self._housekeep_if_due(key)
        if if_none_match:
            # os.link is atomic by itself: no lock, also across processes.
            return await self._in_thread(self._create_sync, key, data, key=key)
        async with self._write_lock:
            return await self._in_thread(self._replace_sync, key, data, if_match, key=key)

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        return await self._in_thread(self._get_sync, key, start, end, key=key)

    async def _head(self, key: str) -> ObjectInfo:
        result = await self._in_thread(self._get_sync, key, 0, 0, key=key)
        return result.info

    async def _list(
        self, prefix: str, *, start_after: str | None, limit: int | None
    ) -> builtins.list[ObjectInfo]:
        return await self._in_thread(self._list_sync, prefix, start_after, limit, key=None)

    async def _delete(self, key: str) -> None:
        await self._housekeep_if_due(key)
        async with self._write_lock:
            await self._in_thread(self._delete_sync, key, key=key)

    async def _aclose(self) -> None:
        # Nothing is held open between calls.
        with self._etags_lock:
            self._etags.clear()

    async def _housekeep_if_due(self, key: str) -> None:
        """The open's writes, put off by :meth:`open`: before the first write after it.

        Raises what they meet (the outage is still on: the write would fail
        the same way); the next write tries again.
        """
        if self._housekeeping_due:
            await self._in_thread(self._housekeep, key=key)
            self._housekeeping_due = False
            log.info("%s takes writes again", self.describe())

    # -- thread boundary ------------------------------------------------------

    async def _in_thread(self, fn: Callable[[*_Ts], _T], *args: *_Ts, key: str | None) -> _T:
        """Run blocking ``fn`` in a worker thread, translating ``OSError``.

        Not abandoned on cancellation: a write that started finishes (or
        fails) before the caller sees ``Cancelled``, so no temporary file or
        half-made directory is left behind by a cancel.
        """
        try:
            return await trio.to_thread.run_sync(lambda: fn(*args), limiter=self._limiter)
        except BucketError:
            raise
        except OSError as exc:
            raise self._translate(exc, key) from exc

    def _translate(self, exc: OSError, key: str | None, what: str = "") -> BucketError:
        if exc.errno == errno.ENOENT and (lost := self._layout_lost()) is not None:
            # Recreating the layout would start a new, empty bucket under a
            # writer's feet: say so, and let the writer stop.
            return lost
        what = what or (f"key {key!r}" if key is not None else "listing")
        detail = exc.strerror or str(exc)
        name = errno.errorcode.get(exc.errno) if exc.errno is not None else None
        if name:
            detail += f" ({name})"
        if exc.filename:
            detail += f": {exc.filename}"
        message = f"{what} in {self.describe()}: {detail}"
        if exc.errno in (errno.EACCES, errno.EPERM):
            return AccessDenied(message, key=key, code=name or "EACCES")
        if exc.errno == errno.ENAMETOOLONG:
            return InvalidRequest(
                message + " (a key segment is too long for the filesystem)", key=key
            )
        # Everything else (ENOSPC, EDQUOT, EIO, EROFS, ENOENT of the bucket's
        # own directories, a stale NFS handle, ...) is the disk or mount
        # failing: like an unreachable store, the caller keeps its data and
        # retries later; the message says what happened.
        return BucketUnavailable(message, key=key)

    # -- blocking parts (worker threads only) -----------------------------------

    def _prepare(self, create: bool) -> BucketError | None:
        """Check (or make) the layout and keep house; the outage that put it off, if any."""
        if not self._objects.is_dir():
            self._check_new_root(create)
            self._housekeep()  # a new bucket's layout: made now or not at all
            return None
        try:
            self._housekeep()
        except OSError as exc:
            error = self._translate(exc, None, "opening")
            if isinstance(error, BucketUnavailable | AccessDenied) and not isinstance(
                error, BucketGone
            ):
                return error
            raise error from exc
        return None

    def _housekeep(self) -> None:
        """Make the layout's directories and lock file, and remove stale files of ``tmp/``."""
        for directory in (self._root, self._objects, self._tmp):
            self._makedirs(directory)
        fd = os.open(self._lock_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        os.close(fd)
        # "Now" on the directory's own clock: the time a file created there
        # gets (on a shared mount, the file server's), never this machine's
        # clock, so an opener whose clock runs ahead does not take another
        # machine's upload in flight for a crash's leftover.
        probe = self._tmp / f".clock-{uuid.uuid4().hex}"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            now = os.fstat(fd).st_mtime
        finally:
            os.close(fd)
            os.unlink(probe)
        cutoff = now - _STALE_TMP_SECONDS
        with os.scandir(self._tmp) as entries:
            for entry in entries:
                try:
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)
                except FileNotFoundError:
                    pass

    def _check_new_root(self, create: bool) -> None:
        """``root`` has no ``objects/``: refuse, unless asked to create a bucket where none is."""
        where = self.describe()
        if not self._root.exists():
            if create:
                return
            raise NoSuchBucket(f"{where} does not exist")
        if not self._root.is_dir():
            raise NoSuchBucket(f"{where} is not a directory")
        # lost+found: the root of a freshly made filesystem is still empty;
        # tmp/ and lock (and objects/, made since we looked): another process
        # is making the layout -- two gateways started at once on a new bucket.
        others = sorted(set(os.listdir(self._root)) - {"lost+found", "tmp", "lock", "objects"})
        if others:
            raise NoSuchBucket(
                f"{where} is not a bucket directory (it has no objects/, but holds "
                f"{', '.join(others[:3])}{', ...' if len(others) > 3 else ''})"
            )
        if not create:
            raise NoSuchBucket(
                f"{where} is empty, not a bucket directory (it has no objects/; "
                "a share that is not mounted?)"
            )

    def _layout_lost(self) -> BucketGone | None:
        """The error for a bucket whose directory was removed or replaced while open, if so."""
        if self._objects.is_dir() and self._tmp.is_dir():
            return None
        return BucketGone(
            f"{self.describe()} lost its layout while in use (objects/ or tmp/ is gone): "
            "the directory was removed or replaced, or a share is not mounted"
        )

    def _path(self, key: str) -> Path:
        # validate_key() already rejected "..", "." and empty segments, so the
        # joined path stays under objects/.
        return self._objects.joinpath(*key.split("/"))

    def _write_tmp(self, data: bytes) -> tuple[Path, str, os.stat_result]:
        """Write ``data`` to a new fsynced temporary file; return its path, etag, stat."""
        tmp = self._tmp / f"{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        etag = _md5_etag(data)
        self._remember_etag(st, etag)
        return tmp, etag, st

    def _create_sync(self, key: str, data: bytes) -> ObjectInfo:
        target = self._path(key)
        tmp, etag, st = self._write_tmp(data)
        try:
            for attempt in range(_LINK_ATTEMPTS):
                try:
                    self._makedirs(target.parent, key=key)
                    os.link(tmp, target)
                    break
                except FileExistsError:
                    if target.is_dir():
                        raise self._conflict(key) from None
                    raise PreconditionFailed(
                        f"create-only put of key {key!r} in {self.describe()}: "
                        "the key already exists",
                        key=key,
                    ) from None
                except NotADirectoryError:
                    raise self._conflict(key) from None
                except FileNotFoundError:
                    # A delete removed an emptied parent directory between
                    # our mkdir and link: make it again.
                    if attempt == _LINK_ATTEMPTS - 1:
                        raise
            sync_directory(target.parent)
        finally:
            _unlink_quietly(tmp)
        return ObjectInfo(key, len(data), etag, _mtime(st))

    def _replace_sync(self, key: str, data: bytes, if_match: str | None) -> ObjectInfo:
        target = self._path(key)
        tmp, etag, st = self._write_tmp(data)
        try:
            with self._flock():
                if if_match is not None:
                    current = self._fresh_etag(target, key)
                    if _strip_etag(current) != _strip_etag(if_match):
                        raise PreconditionFailed(
                            f"put of key {key!r} if-match {if_match} in {self.describe()}: "
                            f"the current ETag is {current}",
                            key=key,
                        )
                self._makedirs(target.parent, key=key)
                try:
                    os.replace(tmp, target)
                except (IsADirectoryError, NotADirectoryError):
                    raise self._conflict(key) from None
            sync_directory(target.parent)
        finally:
            _unlink_quietly(tmp)
        return ObjectInfo(key, len(data), etag, _mtime(st))

    def _get_sync(self, key: str, start: int, end: int | None) -> GetResult:
        fd = self._open_object(key)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._not_found(key)
            size = st.st_size
            first = min(start, size)
            last = size if end is None else max(first, min(end, size))
            data = _pread_exactly(fd, last - first, first, key)
            etag = self._etag_of(fd, st, key)
        finally:
            os.close(fd)
        return GetResult(key, data, first, size, etag, _mtime(st))

    def _list_sync(
        self, prefix: str, start_after: str | None, limit: int | None
    ) -> list[ObjectInfo]:
        # Walk only the directory the prefix's complete segments name, prune
        # subtrees that cannot hold a match, then sort the full keys: a
        # per-directory sort would put "a/b" before "a-c", S3 puts it after.
        base, _, _ = prefix.rpartition("/")
        keys: list[str] = []
        self._collect(base, prefix, start_after, keys)
        keys.sort()
        if limit is not None:
            del keys[limit:]
        infos: list[ObjectInfo] = []
        for key in keys:
            try:
                infos.append(self._get_sync(key, 0, 0).info)
            except NotFound:
                continue  # deleted since the walk
        return infos

    def _collect(
        self, directory: str, prefix: str, start_after: str | None, out: list[str]
    ) -> None:
        path = self._path(directory) if directory else self._objects
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            self._check_present(None)
            return
        for entry in entries:
            key = f"{directory}/{entry.name}" if directory else entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if is_dir:
                below = key + "/"
                if not (below.startswith(prefix) or prefix.startswith(below)):
                    continue
                # Every key below is > below; if start_after is past them all, skip.
                if (
                    start_after is not None
                    and start_after > below
                    and not start_after.startswith(below)
                ):
                    continue
                self._collect(key, prefix, start_after, out)
            elif key.startswith(prefix) and (start_after is None or key > start_after):
                out.append(key)

    def _delete_sync(self, key: str) -> None:
        target = self._path(key)
        with self._flock():
            try:
                os.unlink(target)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                self._check_present(key)
                return  # no object under this key: deleting is a no-op
            sync_directory(target.parent)
            # Drop directories the delete emptied, so that "a" can later be
            # an object after "a/b" is gone (S3 has no directories at all).
            parent = target.parent
            while parent != self._objects:
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent

    # -- helpers ----------------------------------------------------------------

    def _open_object(self, key: str) -> int:
        try:
            return os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            self._check_present(key)
            raise self._not_found(key) from None

    def _check_present(self, key: str | None) -> None:
        """Raise :class:`BucketGone` (a :class:`BucketUnavailable`) if the directory is gone.

        A missing ``objects/`` is not an empty bucket: the directory was
        removed, or it lives on a share that is not mounted now (the bare
        mount point is left). Answering ``NotFound`` or an empty listing
        then would tell a tailer "nothing new", the shipper "an empty log"
        and GC "deleted"; the store is away instead, like an unreachable S3.
        """
        if not self._objects.is_dir():
            raise BucketGone(
                f"{'key ' + repr(key) if key is not None else 'listing'} in {self.describe()}: "
                f"{self._objects} is missing (the directory was removed, or its share is "
                "not mounted)",
                key=key,
            )

    def _not_found(self, key: str) -> NotFound:
        return NotFound(f"no object with key {key!r} in {self.describe()}", key=key)

    def _conflict(self, key: str) -> InvalidRequest:
        return InvalidRequest(
            f"key {key!r} in {self.describe()} names a directory of other keys or lies "
            "below an object; a local bucket cannot hold both 'a' and 'a/b'",
            key=key,
        )

    def _makedirs(self, directory: Path, *, key: str | None = None) -> None:
        """Create ``directory`` and missing parents, fsyncing each new entry."""
        if directory.is_dir():
            return
        missing: list[Path] = []
        path = directory
        while not path.exists():
            if key is not None and path == self._objects:
                # An object's parent directories are made inside objects/,
                # never objects/ itself: that is the bucket, and it is gone.
                raise self._layout_lost() or self._conflict(key)
            missing.append(path)
            path = path.parent
        if not path.is_dir():
            raise self._conflict(key or str(directory))
        for path in reversed(missing):
            try:
                path.mkdir()
            except FileExistsError:
                if not path.is_dir():
                    raise self._conflict(key or str(path)) from None
            except NotADirectoryError:
                raise self._conflict(key or str(path)) from None
            sync_directory(path.parent)

    @contextmanager
    def _flock(self) -> Iterator[None]:
        try:
            fd = os.open(self._lock_path, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            # Not in a bare mount point (the share is away); otherwise
            # someone removed only the lock file: make it again.
            self._check_present(None)
            fd = os.open(self._lock_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _fresh_etag(self, path: Path, key: str) -> str:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            self._check_present(key)
            raise self._not_found(key) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._not_found(key)
            return _hash_fd(fd, st.st_size, key)
        finally:
            os.close(fd)

    def _etag_of(self, fd: int, st: os.stat_result, key: str) -> str:
        ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._etags_lock:
            cached = self._etags.get(ident)
            if cached is not None:
                self._etags.move_to_end(ident)
                return cached
        etag = _hash_fd(fd, st.st_size, key)
        self._remember_etag(st, etag)
        return etag

    def _remember_etag(self, st: os.stat_result, etag: str) -> None:
        ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._etags_lock:
            self._etags[ident] = etag
            self._etags.move_to_end(ident)
            while len(self._etags) > _ETAG_CACHE_SIZE:
                self._etags.popitem(last=False)


def _md5_etag(data: bytes) -> str:
    # MD5 is an identity here (S3 compatibility), not a security measure.
    return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'


def _hash_fd(fd: int, size: int, key: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    offset = 0
    while offset < size:
        chunk = os.pread(fd, min(_CHUNK, size - offset), offset)
        if not chunk:
            raise CorruptData(f"file shrank to {offset} of {size} bytes while read", where=key)
        digest.update(chunk)
        offset += len(chunk)
    return f'"{digest.hexdigest()}"'


def _pread_exactly(fd: int, length: int, offset: int, key: str) -> bytes:
    if length == 0:
        return b""
    data = os.pread(fd, length, offset)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        chunk = os.pread(fd, length - got, offset + got)
        if not chunk:
            # Objects are never written in place; a short file was changed
            # behind the bucket's back.
            raise CorruptData(
                f"file ended at {offset + got}, expected {offset + length}", where=key
            )
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _strip_etag(etag: str) -> str:
    # S3 accepts If-Match with or without the quotes; so do we.
    return etag.strip().strip('"')


def _mtime(st: os.stat_result) -> datetime:
    return datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=UTC)


def _unlink_quietly(path: Path) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)
