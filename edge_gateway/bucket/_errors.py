"""Bucket errors: the project's error tree, refined for object storage.

Every backend raises only these (plus :class:`~edge_gateway.errors.ClosedError`
after ``aclose()``, and :class:`~edge_gateway.errors.ConfigError` for a bucket
that does not exist); foreign exceptions are translated at each backend's one
boundary: the S3 client stack's (botocore's, and urllib3's, ``http.client``'s,
``ssl``'s and socket errors that escape botocore while an answer's body is
read) in ``_s3.translate_error``, ``OSError`` in ``LocalBucket._translate``.
Which is transient (:class:`BucketUnavailable`) and which is not: the tables
in ``docs/bucket.md``::

    EdgeGatewayError
    ├── BucketError                  base of the classes below; carries ``key``
    │   ├── PreconditionFailed       a conditional put lost (the key exists, or
    │   │                            its ETag is not the one given)
    │   ├── NotFound                 no object under the key
    │   ├── BucketUnavailable        (also an Unavailable) the store is away,
    │   │   │                        slow or throttling; retry with backoff
    │   │   └── BucketGone           a local bucket directory lost its layout
    │   │                            while open; readers wait, writers stop
    │   ├── AccessDenied             (also an InvalidInput) credentials or
    │   │                            policy refuse the request
    │   ├── InvalidRequest           (also an InvalidInput) a key breaks the
    │   │                            key rules, or the store refused the
    │   │                            request as malformed (other 4xx)
    │   └── NoSuchBucket             (also a ConfigError) the bucket is not
    │                                there: no such S3 bucket, no such local
    │                                directory, or a directory that is not a
    │                                bucket
    └── ConfigError
        └── UnsupportedStore         the store cannot do conditional creates,
                                     so fencing is impossible

``PreconditionFailed`` and ``NotFound`` are *answers*, not failures: the
shipper resolves a lost create by reading the entry back, a tailer reads a
missing next entry as "nothing new".
"""

from __future__ import annotations

from edge_gateway.errors import ConfigError, EdgeGatewayError, InvalidInput, Unavailable


class BucketError(EdgeGatewayError):
    """Base of the errors a bucket raises about one request.

    ``key`` is the object key the request was about (``None`` for a listing
    or a bucket-wide failure).
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        self.key = key
        super().__init__(message)


class PreconditionFailed(BucketError):
    """A conditional put did not apply (HTTP 412).

    With ``if_none_match=True`` the key already exists; with ``if_match`` the
    object's current ETag differs. A create-only put that is retried after a
    lost response also ends here although the first attempt may have been
    ours: read the object back to decide.
    """


class NotFound(BucketError):
    """There is no object under the key (HTTP 404)."""


class BucketUnavailable(BucketError, Unavailable):
    """The store is unreachable, timing out, failing (5xx) or throttling.

    The outcome of a write that raised this is *unknown*: it may have landed.
    """


class BucketGone(BucketUnavailable):
    """A local bucket directory lost its layout while open: removed, replaced, unmounted.

    A reader waits as for any outage (a share may be mounted again). A writer
    must not: the next write would start a new, empty bucket under it, so the
    shipper stops with :class:`~edge_gateway.errors.BucketLost`.
    """


class AccessDenied(BucketError, InvalidInput):
    """The store refused the credentials or the policy forbids the request (HTTP 403)."""


class InvalidRequest(BucketError, InvalidInput):
    """A key or argument is not acceptable, or the store refused the request (other 4xx)."""


class NoSuchBucket(BucketError, ConfigError):
    """The configured bucket does not exist (or is not a bucket).

    For S3, the store answered ``NoSuchBucket``; edgegw never creates S3
    buckets. For a local directory: it does not exist, or it is a non-empty
    directory without the bucket layout (``objects/``); see
    :class:`BucketGone` for one that vanishes while open. Opening creates a
    local bucket only when asked to (``LocalBucket.open(root, create=True)``),
    so a mistyped path is refused instead of becoming a new, empty bucket.
    """


class UnsupportedStore(ConfigError):
    """The configured store does not enforce conditional creates.

    Raised by :func:`~edge_gateway.bucket.verify_conditional_create`: without
    create-only puts two writers of one region cannot be fenced, so edgegw
    refuses to run against such a store.
    """
