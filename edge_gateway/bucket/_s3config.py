"""How to reach a bucket on an S3-compatible store (:class:`S3Config`), without boto3.

Kept apart from :mod:`edge_gateway.bucket._s3` so that loading and checking a
configuration never imports boto3 and botocore (~100 ms and ~15 MB): only a
gateway whose bucket is on S3 loads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from edge_gateway.bucket._base import validate_prefix
from edge_gateway.bucket._errors import InvalidRequest
from edge_gateway.errors import ConfigError

__all__ = ["MAX_PARTS", "MAX_PART_SIZE", "MAX_PUT_SIZE", "MIB", "MIN_PART_SIZE", "S3Config"]

MIB: Final = 1024 * 1024
#: S3's smallest part (all parts but the last), largest part and part count.
MIN_PART_SIZE: Final = 5 * MIB
MAX_PART_SIZE: Final = 5 * 1024 * MIB
MAX_PARTS: Final = 10_000
#: S3's largest single PUT.
MAX_PUT_SIZE: Final = 5 * 1024 * MIB
#: botocore waits this long for ``100 Continue`` before sending a body anyway,
#: and caps its retry backoff at this many seconds (standard mode).
_EXPECT_CONTINUE_WAIT: Final = 1.0
_BOTOCORE_MAX_BACKOFF: Final = 20.0

_OPTIONAL_STR: Final = (str, type(None))
_NUMBER: Final = (int, float)
_FIELD_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "bucket": (str,),
    "prefix": (str,),
    "endpoint_url": _OPTIONAL_STR,
    "region": _OPTIONAL_STR,
    "path_style": (bool,),
    "access_key": _OPTIONAL_STR,
    "secret_key": _OPTIONAL_STR,
    "session_token": _OPTIONAL_STR,
    "profile": _OPTIONAL_STR,
    "connect_timeout": _NUMBER,
    "read_timeout": _NUMBER,
    "retry_mode": (str,),
    "max_attempts": (int,),
    "max_concurrency": (int,),
    "multipart_threshold": (int,),
    "part_size": (int,),
    "part_concurrency": (int,),
    "checksums": (str,),
    "list_page_size": (int,),
    "lean_get": (bool,),
}


@dataclass(frozen=True, slots=True)
class S3Config:
    """How to reach one bucket (and a prefix in it) on an S3-compatible store.

    Field names are the configuration keys (see ``docs/bucket.md``). Without
    ``access_key``/``secret_key`` the standard AWS credential chain applies
    (environment, ``profile``/shared files, container and instance roles).
    """

    bucket: str
    #: Every key is stored under this prefix ("" for the bucket's root); a
    #: missing trailing "/" is added.
    prefix: str = ""
    #: ``None`` for AWS; ``http(s)://host:port`` for MinIO, R2, Ceph, moto.
    endpoint_url: str | None = None
    region: str | None = None
    #: Path-style addressing (``endpoint/bucket/key``), needed by most
    #: self-hosted stores; otherwise botocore chooses (virtual-hosted on AWS).
    path_style: bool = False
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    #: A named profile of the shared AWS config files.
    profile: str | None = None
    #: Seconds to establish a connection (per attempt).
    connect_timeout: float = 5.0
    #: Seconds of silence while waiting for (more of) a response, per attempt.
    #: A store answers a PUT within a second or so; a silent link (a
    #: blackhole) must surface as ``BucketUnavailable`` soon enough for the
    #: shipper's own retry loop and for a bounded shutdown (worker threads are
    #: never abandoned): see :attr:`max_request_seconds`.
    read_timeout: float = 10.0
    #: botocore's retry mode; ``adaptive`` also rate-limits the client when throttled.
    retry_mode: Literal["standard", "adaptive"] = "standard"
    #: Attempts per request, the first included (1 = no retries). The callers
    #: (shipper, tailers) retry on their own with backoff, so a few are enough.
    max_attempts: int = 3
    #: Requests in flight at once (worker threads and pooled connections).
    max_concurrency: int = 16
    #: Objects larger than this go up as multipart uploads.
    multipart_threshold: int = 16 * MIB
    #: Size of each part but the last; raised automatically beyond 10,000 parts.
    part_size: int = 8 * MIB
    #: Parts of one multipart upload in flight at once. Each holds a copy of
    #: its slice of the object while it is sent, so this bounds an upload's
    #: extra memory (``part_concurrency * part_size``: 32 MiB by default);
    #: ``max_concurrency`` bounds all requests together.
    part_concurrency: int = 4
    #: ``when_supported`` sends a CRC32 with every upload (boto3's default);
    #: ``when_required`` only where the API demands one, for stores that
    #: reject boto3's checksum headers.
    checksums: Literal["when_supported", "when_required"] = "when_supported"
    #: Keys per ListObjectsV2 page (S3's maximum is 1000).
    list_page_size: int = 1000
    #: GETs signed by botocore's SigV4 signer and sent on the client's own
    #: connection pool, without botocore's per-call pipeline (about half the
    #: CPU per GET); any answer but a success (or a 404/416) and any transport
    #: failure is sent again through botocore, whose errors and retries are
    #: unchanged. ``False``: every GET through botocore (docs/bucket.md).
    lean_get: bool = True

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"bucket config {key!r}: {why}")

        # Values may come from a parsed config file: check types first, so
        # that the error names the key instead of failing on a comparison.
        for key, kinds in _FIELD_TYPES.items():
            value = getattr(self, key)
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
                raise bad(key, f"must be {names}, got {value!r}")
        if not 3 <= len(self.bucket) <= 255:
            raise bad("bucket", f"needs a bucket name of 3 to 255 characters, got {self.bucket!r}")
        if "/" in self.bucket:
            raise bad("bucket", f"{self.bucket!r} must be a bucket name, not a path (use 'prefix')")
        if self.prefix:
            try:
                validate_prefix(self.prefix)
            except InvalidRequest as exc:
                raise bad("prefix", str(exc)) from None
            if self.prefix.startswith("/"):
                raise bad("prefix", "must not start with '/'")
        if (self.access_key is None) != (self.secret_key is None):
            raise bad("access_key", "access_key and secret_key go together (or neither)")
        if self.session_token is not None and self.access_key is None:
            raise bad("session_token", "needs access_key and secret_key")
        if self.endpoint_url is not None and not self.endpoint_url.startswith(
            ("http://", "https://")
        ):
            raise bad(
                "endpoint_url", f"must start with http:// or https://, got {self.endpoint_url!r}"
            )
        for key in ("connect_timeout", "read_timeout"):
            if not getattr(self, key) > 0:
                raise bad(key, "must be > 0 seconds")
        if self.retry_mode not in ("standard", "adaptive"):
            raise bad("retry_mode", f"must be 'standard' or 'adaptive', got {self.retry_mode!r}")
        if self.max_attempts < 1:
            raise bad("max_attempts", "must be >= 1 (1 = no retries)")
        if self.max_concurrency < 1:
            raise bad("max_concurrency", "must be >= 1")
        if self.part_concurrency < 1:
            raise bad("part_concurrency", "must be >= 1")
        if not MIN_PART_SIZE <= self.part_size <= MAX_PART_SIZE:
            raise bad(
                "part_size", f"must be between {MIN_PART_SIZE} (5 MiB) and {MAX_PART_SIZE} (5 GiB)"
            )
        if not MIN_PART_SIZE <= self.multipart_threshold <= MAX_PUT_SIZE:
            raise bad(
                "multipart_threshold",
                f"must be between {MIN_PART_SIZE} (5 MiB) and {MAX_PUT_SIZE} (5 GiB)",
            )
        if self.checksums not in ("when_supported", "when_required"):
            raise bad("checksums", "must be 'when_supported' or 'when_required'")
        if not 1 <= self.list_page_size <= 1000:
            raise bad("list_page_size", "must be between 1 and 1000")

    @property
    def max_request_seconds(self) -> float:
        """How long one request can take at most when the store stops answering.

        Every attempt may wait ``connect_timeout``, then up to 1 s for
        ``100 Continue`` (botocore sends ``Expect: 100-continue`` with
        uploads), then ``read_timeout``; between attempts botocore's standard
        backoff sleeps up to 1, 2, 4 … s (capped at 20). A store that keeps
        trickling bytes can hold a request longer: the timeouts bound
        silences, not transfers. With the defaults: 3 x 16 + 3 = 51 s.
        """
        per_attempt = self.connect_timeout + _EXPECT_CONTINUE_WAIT + self.read_timeout
        backoff = sum(min(2.0**i, _BOTOCORE_MAX_BACKOFF) for i in range(self.max_attempts - 1))
        return self.max_attempts * per_attempt + backoff

    @property
    def max_get_seconds(self) -> float:
        """:attr:`max_request_seconds` for a GET: with :attr:`lean_get`, a GET
        whose lean attempt fails on a silent link (``connect_timeout`` or
        ``read_timeout``) goes through botocore's attempts after it."""
        lean_attempt = self.connect_timeout + self.read_timeout if self.lean_get else 0.0
        return self.max_request_seconds + lean_attempt

    @property
    def key_prefix(self) -> str:
        """The prefix as stored: empty, or ending with ``/``."""
        if self.prefix and not self.prefix.endswith("/"):
            return self.prefix + "/"
        return self.prefix

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> S3Config:
        """Build a config from a mapping of config keys (e.g. a parsed TOML table).

        Unknown keys raise :class:`ConfigError` naming them, so typos are not
        silently ignored.
        """
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown bucket config keys {unknown}; known: {sorted(known)}")
        if "bucket" not in values:
            raise ConfigError("bucket config 'bucket' is required")
        try:
            return cls(**values)  # type: ignore[arg-type]
        except TypeError as exc:
            raise ConfigError(f"bucket config: {exc}") from None
