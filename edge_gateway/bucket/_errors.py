"""Bucket errors: the project's error tree, refined for object storage.

Every backend raises only these (plus :class:`~edge_gateway.errors.ClosedError`
after ``aclose()``, and :class:`~edge_gateway.errors.ConfigError` for a
configuration no store can accept, such as a malformed endpoint); foreign
exceptions are translated at each backend's one boundary: the S3 client
stack's (botocore's, and urllib3's, ``http.client``'s, ``ssl``'s and socket
errors that escape botocore while an answer's body is read) in
``_s3.translate_error``, ``OSError`` in ``LocalBucket._translate``. Which
is transient (:class:`BucketUnavailable`), which needs a person
(:class:`AccessDenied`) and which is a bug or a bad argument: the tables in
``docs/bucket.md``::

    EdgeGatewayError
    ├── BucketError                  base of the classes below; carries ``key``
    │   ├── PreconditionFailed       a conditional put lost (the key exists, or
    │   │                            its ETag is not the one given)
    │   ├── NotFound                 no object under the key
    │   ├── BucketUnavailable        (also an Unavailable) the store is away,
    │   │   │                        slow or throttling; retry with backoff
    │   │   └── BucketGone           a local bucket directory lost its layout
    │   │                            while open; readers wait, writers stop
    │   ├── AccessDenied             (also a Denied, so an Unavailable) the
    │   │                            store refuses this gateway: credentials,
    │   │                            policy, no such bucket, wrong region;
    │   │                            a person must act, callers retry
    │   ├── InvalidRequest           (also an InvalidInput) a key breaks the
    │   │                            key rules, or the store refused the
    │   │                            request as malformed (other 4xx)
    │   └── NoSuchBucket             (also a ConfigError) at open: no such S3
    │                                bucket, no such local directory, or a
    │                                directory that is not a bucket
    └── ConfigError
        └── UnsupportedStore         the store cannot do conditional creates
                                     (fencing is impossible) or refuses
                                     compare-and-swap (GC cannot advance)

``PreconditionFailed`` and ``NotFound`` are *answers*, not failures: the
shipper resolves a lost create by reading the entry back, a tailer reads a
missing next entry as "nothing new".

``AccessDenied`` is retried like an outage (credentials get rotated, a
policy gets fixed, a bucket gets created: the next attempt works, without a
restart), but it carries the store's error ``code`` and an ``action`` --
what a person has to do -- that status, metrics and the log show.
"""

from __future__ import annotations

from typing import Final

from edge_gateway.errors import (
    ConfigError,
    Denied,
    EdgeGatewayError,
    InvalidInput,
    Unavailable,
)

#: Refusals that new credentials can cure (the S3 adapter builds its client
#: anew before the next request, re-reading the credential chain).
CREDENTIAL_CODES: Final = frozenset(
    {
        "AccessDenied",
        "AccountProblem",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "TokenRefreshRequired",
        # the client side of the credential chain (botocore's names)
        "ConfigParseError",
        "CredentialsExpired",
        "InvalidConfigError",
        "NoAuthTokenError",
        "NoCredentialsError",
        "PartialCredentialsError",
        "ProfileNotFound",
        "UnauthorizedSSOTokenError",
    }
)
#: Refusals about where the bucket is: the configuration must change.
PLACE_CODES: Final = frozenset(
    {
        "AuthorizationHeaderMalformed",
        "IllegalLocationConstraintException",
        "NoSuchBucket",
        "PermanentRedirect",
    }
)

_CREDENTIALS_ACTION: Final = (
    "give the gateway valid credentials: the standard chain (environment, shared credentials "
    "file, credential_process, web identity) is read again whenever the bucket refuses, so new "
    "ones there need no restart; keys written in the config file do "
    "(docs/operations.md, 'Credentials')"
)
_ACTIONS: Final = {
    "AccessDenied": (
        "give the gateway's identity its region's policy (`edgegw iam policy --region "
        "<region> --bucket <bucket> --prefix <prefix>`, deploy/iam/region.json): it "
        "reads the fleet and writes only its own region's keys -- a refusal naming "
        "another region's key means the config's region and the key's do not match"
    ),
    "AccountProblem": "the store's account is suspended or has a problem: contact its owner",
    "AllAccessDisabled": "all access to the bucket is disabled: contact its owner",
    "RequestTimeTooSkewed": (
        "set this machine's clock (NTP): the store refuses requests signed more than "
        "15 minutes off its own time"
    ),
    "CredentialsExpired": (
        "the credential source hands out credentials that are already expired by this "
        "machine's clock: set the clock (NTP), or fix the credential source"
    ),
    "NoSuchBucket": (
        "create the bucket, or correct [bucket] bucket / endpoint_url; shipping resumes by "
        "itself once the bucket exists"
    ),
    "PermanentRedirect": "set [bucket] region (or endpoint_url) to where the bucket is",
    "AuthorizationHeaderMalformed": "set [bucket] region to the bucket's region",
    "IllegalLocationConstraintException": "set [bucket] region to the bucket's region",
    "EACCES": "let the gateway's user read and write the bucket directory",
    "EPERM": "let the gateway's user read and write the bucket directory",
}


def denied_action(code: str) -> str:
    """What a person does about a refusal with the store's error ``code``."""
    return _ACTIONS.get(code, _CREDENTIALS_ACTION)


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


class AccessDenied(BucketError, Denied):
    """The store refuses this gateway (see :class:`~edge_gateway.errors.Denied`).

    Bad, revoked or expired credentials or none at all, a policy that
    forbids the request (HTTP 403), a bucket that does not exist, the wrong
    region or endpoint, a clock too far off. ``code`` is the store's error
    code (``InvalidAccessKeyId``, ``NoSuchBucket``...; botocore's exception
    name for a failure of the credential chain, the errno name for a local
    directory) and ``action`` what to do (by default from the code).
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        code: str = "AccessDenied",
        action: str | None = None,
    ) -> None:
        self.key = key
        self.code = code
        self.action = action or denied_action(code)
        EdgeGatewayError.__init__(self, message)

    @property
    def credentials_may_help(self) -> bool:
        """True when other credentials can cure it (not a missing bucket or the wrong place)."""
        return self.code in CREDENTIAL_CODES or self.code not in _ACTIONS


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
    """The configured store does not do a conditional write edgegw needs.

    Raised by :func:`~edge_gateway.bucket.verify_conditional_create`: without
    create-only puts two writers of one region cannot be fenced, so edgegw
    refuses to run against such a store. Raised by bucket GC
    (``edge_gateway.mirror.log_gc``) when the store answers 412 to a
    compare-and-swap whose ETag is the object's current one: the GC boundary
    cannot advance there, and retrying cannot help.
    """
