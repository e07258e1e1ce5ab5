"""Where the pipeline's bucket is, as a plain picklable value (:class:`BucketSpec`).

The pipeline reads the bucket through :mod:`edge_gateway.bucket`, the same
backends as the gateway, with the blocking facade
:class:`~edge_gateway.bucket.SyncBucket` (the driver and Spark's Python
workers are not trio). A :class:`SyncBucket` holds a thread and connections
and never travels; a :class:`BucketSpec` does: it goes to executors inside
tasks and data source options (endpoint and credentials included, so
executors never depend on the driver's environment), and each process that
reads opens the bucket there: :meth:`BucketSpec.shared` opens it once per
process and keeps it (Spark reuses a Python worker for many tasks, and an S3
client costs tens of milliseconds to build), :meth:`BucketSpec.open` opens one
that the caller closes.

A spec names a local-directory bucket by its path (``file://`` optional; on a
cluster, a mount shared by every node) or an S3-compatible one as
``s3://bucket[/prefix]``; :meth:`BucketSpec.config` turns it into the
bucket package's config (:class:`~edge_gateway.bucket.LocalConfig`,
:class:`~edge_gateway.bucket.S3Config`).
"""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from edge_gateway.bucket import LocalConfig, S3Config, SyncBucket
from edge_gateway.errors import InvalidInput

__all__ = ["BucketSpec"]

#: Reads of one object before a broken answer fails the task: the S3 client
#: retries failed requests, not a body that breaks off after the answer came.
READ_ATTEMPTS: Final = 3
#: The S3 client's timeouts and attempts for batch reads: a Spark task waits
#: longer than a gateway, which retries on its own and must shut down quickly.
_S3_READ_TIMEOUT: Final = 30.0
_S3_MAX_ATTEMPTS: Final = 5


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """Where a bucket is: a local directory or ``s3://bucket[/prefix]``, with its access."""

    url: str
    endpoint_url: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    #: Path-style addressing; None: on when an endpoint is given (MinIO, moto, Ceph).
    path_style: bool | None = None

    def __post_init__(self) -> None:
        if not self.url:
            raise InvalidInput("bucket: an empty location")
        if self.is_s3:
            name = self.url[5:].split("/", 1)[0]
            if not 3 <= len(name) <= 255:
                raise InvalidInput(f"bucket: {self.url!r} names no valid bucket")
        if (self.access_key is None) != (self.secret_key is None):
            raise InvalidInput("bucket: access_key and secret_key go together (or neither)")

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")

    def describe(self) -> str:
        if self.is_s3:
            return f"{self.url} at {self.endpoint_url or 'AWS'}"
        return f"local directory {self.local_root}"

    @property
    def local_root(self) -> Path:
        return Path(self.url.removeprefix("file://")).expanduser()

    def config(self) -> LocalConfig | S3Config:
        """The bucket package's config for this bucket (raises ``ConfigError`` if invalid)."""
        if not self.is_s3:
            return LocalConfig(self.local_root)
        name, _, prefix = self.url[5:].partition("/")
        return S3Config(
            bucket=name,
            prefix=prefix,
            endpoint_url=self.endpoint_url,
            region=self.region or "us-east-1",
            path_style=self.path_style if self.path_style is not None else bool(self.endpoint_url),
            access_key=self.access_key,
            secret_key=self.secret_key,
            session_token=self.session_token,
            read_timeout=_S3_READ_TIMEOUT,
            max_attempts=_S3_MAX_ATTEMPTS,
        )

    def open(self) -> SyncBucket:
        """Open the bucket in this process (close it, or use it as a context manager)."""
        return SyncBucket.open(self.config(), read_attempts=READ_ATTEMPTS)

    def shared(self) -> SyncBucket:
        """This process's open bucket for this spec: opened on first use, closed at exit.

        Callers do not close it. Safe from any thread; a forked child opens its
        own (the parent's loop thread does not exist there).
        """
        with _shared.lock:
            bucket = _shared.buckets.get(self)
            if bucket is None or bucket.closed:
                bucket = _shared.buckets[self] = self.open()
            return bucket

    def to_options(self) -> dict[str, str]:
        """The data source options that describe this bucket (see ``source.py``)."""
        out = {"bucket": self.url}
        for name in ("endpoint_url", "region", "access_key", "secret_key", "session_token"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.path_style is not None:
            out["path_style"] = "true" if self.path_style else "false"
        return out

    @classmethod
    def from_options(cls, options: Any) -> BucketSpec:
        """From data source options (a case-insensitive mapping of strings)."""
        url = options.get("bucket")
        if not url:
            raise InvalidInput("the edgegw data source needs option 'bucket'")
        path_style = options.get("path_style")
        return cls(
            url=str(url),
            endpoint_url=options.get("endpoint_url"),
            region=options.get("region"),
            access_key=options.get("access_key"),
            secret_key=options.get("secret_key"),
            session_token=options.get("session_token"),
            path_style=None if path_style is None else str(path_style).lower() == "true",
        )


class _Shared:
    """The buckets :meth:`BucketSpec.shared` opened in this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buckets: dict[BucketSpec, SyncBucket] = {}

    def close_all(self) -> None:
        with self.lock:
            buckets, self.buckets = list(self.buckets.values()), {}
        for bucket in buckets:
            bucket.close()

    def forget(self) -> None:
        # In a forked child: the loop threads stayed in the parent.
        self.lock = threading.Lock()
        self.buckets = {}


_shared = _Shared()
atexit.register(_shared.close_all)
os.register_at_fork(after_in_child=_shared.forget)
