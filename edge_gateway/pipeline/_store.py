"""Synchronous, picklable read access to a bucket, for the Spark driver and workers.

The gateway's :mod:`edge_gateway.bucket` backends are async (trio) and hold
connections: they cannot travel to a Spark executor. A :class:`BucketSpec` is
a plain, picklable description of where the bucket is and how to reach it
(endpoint and credentials included, so executors never depend on the driver's
environment); :meth:`BucketSpec.open` builds a :class:`BucketReader` in the
process that uses it:

* ``LocalReader`` reads a local-directory bucket (``edge_gateway.bucket.LocalBucket``
  stores each object at ``<root>/objects/<key>``); on a cluster the directory
  must be a mount shared by every node.
* ``S3Reader`` reads with boto3 (any S3-compatible endpoint).

Only reads are needed: ranged GET (with the object's total size), HEAD and LIST.
Missing objects raise :class:`NotFoundError`; an unreachable store
:class:`~edge_gateway.errors.Unavailable`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edge_gateway.errors import EdgeGatewayError, InvalidInput, Unavailable

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client


class NotFoundError(EdgeGatewayError):
    """The object does not exist."""


class BucketReader(Protocol):
    def get(self, key: str, start: int = 0, end: int | None = None) -> tuple[bytes, int]:
        """Bytes ``[start, end)`` of the object (to its end if ``end`` is None), and its size."""
        ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix``, sorted."""
        ...


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

    def open(self) -> BucketReader:
        if self.is_s3:
            return S3Reader(self)
        return LocalReader(self.local_root)

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


class LocalReader:
    """A local-directory bucket (the layout of ``LocalBucket``)."""

    def __init__(self, root: Path) -> None:
        self._objects = root / "objects"
        if not self._objects.is_dir():
            raise InvalidInput(f"bucket: {root} is not a local-directory bucket (no objects/)")

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise InvalidInput(f"bad key {key!r}")
        return self._objects.joinpath(*parts)

    def get(self, key: str, start: int = 0, end: int | None = None) -> tuple[bytes, int]:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            raise NotFoundError(key) from None
        try:
            size = os.fstat(fd).st_size
            stop = size if end is None else min(end, size)
            chunks: list[bytes] = []
            pos = start
            while pos < stop:
                chunk = os.pread(fd, stop - pos, pos)
                if not chunk:
                    break
                chunks.append(chunk)
                pos += len(chunk)
            return b"".join(chunks), size
        finally:
            os.close(fd)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        folder = prefix.rpartition("/")[0]
        base = self._path(folder) if folder else self._objects
        if not base.is_dir():
            return []
        keys = (p.relative_to(self._objects).as_posix() for p in base.rglob("*") if p.is_file())
        return sorted(k for k in keys if k.startswith(prefix))


#: Reads of one object's body before a broken body is an error.
_BODY_ATTEMPTS = 3


class S3Reader:
    """An S3-compatible bucket through boto3 (blocking; one client per reader)."""

    def __init__(self, spec: BucketSpec) -> None:
        import boto3
        import botocore.config

        rest = spec.url[5:]
        self._bucket, _, prefix = rest.partition("/")
        self._prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        path_style = spec.path_style if spec.path_style is not None else bool(spec.endpoint_url)
        session = boto3.session.Session(
            aws_access_key_id=spec.access_key,
            aws_secret_access_key=spec.secret_key,
            aws_session_token=spec.session_token,
            region_name=spec.region or "us-east-1",
        )
        self._client: S3Client = session.client(
            "s3",
            endpoint_url=spec.endpoint_url,
            config=botocore.config.Config(
                connect_timeout=5,
                read_timeout=30,
                retries={"mode": "standard", "total_max_attempts": 5},
                max_pool_connections=16,
                s3={"addressing_style": "path" if path_style else "auto"},
                user_agent_extra="edgegw-pipeline",
            ),
        )

    def _call(self, key: str, fn: Any, **kwargs: Any) -> Any:
        import botocore.exceptions

        try:
            return fn(Bucket=self._bucket, **kwargs)
        except botocore.exceptions.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound") or status == 404:
                raise NotFoundError(key) from None
            if status == 416:
                raise NotFoundError(f"{key}: range not satisfiable") from None
            raise Unavailable(f"S3 {code or status} on {key}: {exc}") from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise Unavailable(f"S3 unreachable reading {key}: {exc}") from exc

    def get(self, key: str, start: int = 0, end: int | None = None) -> tuple[bytes, int]:
        if end is not None and end <= start:
            return b"", self._size(key)
        import botocore.exceptions

        rng = f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"
        for attempt in range(1, _BODY_ATTEMPTS + 1):
            resp = self._call(key, self._client.get_object, Key=self._prefix + key, Range=rng)
            try:
                # The answer came; its body can still die on the way (a link
                # lost mid-download, a short read): botocore's retries cover
                # the request, not the body, so read it again here.
                data = resp["Body"].read()
                break
            except (botocore.exceptions.BotoCoreError, OSError) as exc:
                if attempt == _BODY_ATTEMPTS:
                    raise Unavailable(f"S3 body of {key} broke off {attempt} times: {exc}") from exc
        content_range = resp.get("ContentRange")
        size = int(content_range.rsplit("/", 1)[1]) if content_range else len(data)
        return data, size

    def _size(self, key: str) -> int:
        resp = self._call(key, self._client.head_object, Key=self._prefix + key)
        return int(resp["ContentLength"])

    def exists(self, key: str) -> bool:
        try:
            self._size(key)
        except NotFoundError:
            return False
        return True

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": self._prefix + prefix}
            if token:
                kwargs["ContinuationToken"] = token
            resp = self._call(prefix, self._client.list_objects_v2, **kwargs)
            keys += [o["Key"][len(self._prefix) :] for o in resp.get("Contents", [])]
            if not resp.get("IsTruncated"):
                return sorted(keys)
            token = resp.get("NextContinuationToken")
