"""A bucket on any S3-compatible store, through boto3.

boto3 blocks, so every call to it runs in a worker thread
(``trio.to_thread.run_sync``) under one :class:`trio.CapacityLimiter` per
bucket, sized like the client's connection pool. Worker threads are never
abandoned on cancellation: a request that started completes (bounded by the
client's timeouts and retries) before the cancelled task unwinds.

Every exception of the client stack is translated here, and only here: every
boto3 call, and every read of an answer's body, runs inside
:meth:`S3Bucket._run`, which passes what it catches to :func:`translate_error`
(as httpx's ``map_exceptions`` does at its transport boundary). That is
botocore's exceptions and also those of the layers below it, which botocore
lets escape while an answer's body streams: it reads the body of an *error*
answer to a streaming operation (a GET's 404) outside its own exception
handling, and a streamed body (``StreamingBody.read``) outside the client
call; urllib3's, ``http.client``'s, ``ssl``'s and socket errors then reach
the caller as they are (the gateway exited on one before this was done).

=====================================================  ==========================
store answer / exception                               raised
=====================================================  ==========================
412, ``PreconditionFailed``                            :class:`PreconditionFailed`
404, ``NoSuchKey``                                     :class:`NotFound`
403, ``AccessDenied``, bad or expired credentials,     :class:`AccessDenied`
no credentials, a broken profile or credentials file,
``NoSuchBucket``, the wrong region (301
``PermanentRedirect``, ``AuthorizationHeaderMalformed``),
credentials the chain refreshed that are still expired
5xx, 409 (conflicting conditional write), 429,         :class:`BucketUnavailable`
throttling codes, ``RequestTimeout``, ``NoSuchUpload``
connection refused/reset, timeouts, truncated bodies   :class:`BucketUnavailable`
(botocore's ``HTTPClientError``, ``ConnectionError``,
``IncompleteReadError``, ``ResponseStreamingError``...)
urllib3's ``HTTPError`` (``ReadTimeoutError``,         :class:`BucketUnavailable`
``ProtocolError``, ``SSLError``, ``DecodeError``...),
``http.client.HTTPException`` (``IncompleteRead``,
``RemoteDisconnected``...), ``OSError`` (socket and
``ssl`` errors, ``TimeoutError``, ``ConnectionResetError``)
an answer without a field it must have (``ETag``...)   :class:`BucketUnavailable`
a malformed endpoint URL (urllib3's                    :class:`ConfigError`
``LocationValueError``), botocore's config errors
(``NoRegionError``, ``InvalidRetryConfigurationError``...)
other 4xx, parameter validation                        :class:`InvalidRequest`
=====================================================  ==========================

Unknown botocore exceptions count as transient (the caller keeps its data and
retries; the message names the exception). Anything else (a ``TypeError``)
is a bug here and is not translated. :class:`AccessDenied` is a
:class:`~edge_gateway.errors.Denied`, which callers retry like an outage: a
site keeps taking data while a person fixes its access.

Credentials: without keys in the config, botocore's standard chain finds
them (environment, shared credentials and config files with ``profile``,
``credential_process``, web identity, container and instance roles), and
refreshes temporary ones before they expire. Static credentials from the
chain (a shared credentials file) are read once per client, so after a
refusal that new credentials could cure, the bucket builds its client anew
at once -- a key rotated in the file, or a ``credential_process`` that now
answers differently, takes effect without a restart -- and if the new
client signs with another key, the refused request is sent again with it
(a refused request did not happen), so a planned rotation is never seen by
the callers. Requests in flight finish on the old client, which is closed
after the last of them. A client that cannot be built
because of its credentials (a missing profile, a credential_process that
fails) does not stop :meth:`S3Bucket.open`: every request tries again and
raises until it can be built.

GETs take the lean path of :mod:`edge_gateway.bucket._s3lean` when the
config's ``lean_get`` is on: signed and sent without botocore's per-call
pipeline, on the client's own connection pool, in the same worker-thread
call. It hands every answer but a success back to ``client.get_object``
(404 and 416 excepted: botocore's own parser makes the same ``ClientError``
of them), so what reaches :func:`translate_error` is what it always was.

Objects larger than ``multipart_threshold`` go up as a multipart upload whose
parts are sent in parallel; the create-only condition is applied to
CompleteMultipartUpload (``If-None-Match: *``), which is what makes the whole
upload one atomic create. boto3's transfer manager is not used because it
cannot pass ``IfNoneMatch`` to CompleteMultipartUpload and runs its own
thread pool outside our limiter.
"""

from __future__ import annotations

import builtins
import http.client
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import botocore.config
import botocore.exceptions
import botocore.session
import trio
import urllib3.exceptions

from edge_gateway.bucket._base import Bucket, GetResult, ObjectInfo
from edge_gateway.bucket._errors import (
    PLACE_CODES,
    AccessDenied,
    BucketUnavailable,
    InvalidRequest,
    NoSuchBucket,
    NotFound,
    PreconditionFailed,
)
from edge_gateway.bucket._probe import probe_key
from edge_gateway.bucket._s3config import (
    MAX_PARTS,
    MAX_PUT_SIZE,
    S3Config,
)
from edge_gateway.bucket._s3lean import LeanGet
from edge_gateway.errors import ConfigError, EdgeGatewayError

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

#: ``regions/<region>/`` at the start of a key: the folder a region may write.
_REGION_FOLDER: Final = re.compile(r"regions/[^/]+/")
_log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: An abort after a failed multipart upload runs shielded, for at most this long.
_ABORT_TIMEOUT: Final = 10.0

_UNAVAILABLE_CODES: Final = frozenset(
    {
        "BandwidthLimitExceeded",
        "ConditionalRequestConflict",
        "EC2ThrottledException",
        "InternalError",
        "NoSuchUpload",
        "OperationAborted",
        "PriorRequestNotComplete",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestTimeout",
        "RequestTimeoutException",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
    }
)
_ACCESS_CODES: Final = frozenset(
    {
        "AccessDenied",
        "AccountProblem",
        "AllAccessDisabled",
        "ExpiredToken",
        "InvalidAccessKeyId",
        "InvalidToken",
        "RequestTimeTooSkewed",
        "SignatureDoesNotMatch",
        "TokenRefreshRequired",
    }
    | PLACE_CODES  # NoSuchBucket, the wrong region
)
# botocore exceptions that mean "the network or the store is away".
_UNAVAILABLE_BOTOCORE: Final = (
    botocore.exceptions.HTTPClientError,  # connection closed, read timeout, streaming error
    botocore.exceptions.ConnectionError,  # refused, connect timeout, DNS, TLS, proxy
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ChecksumError,  # a response corrupted in transit
    botocore.exceptions.CapacityNotAvailableError,  # adaptive mode's client-side throttle
    botocore.exceptions.CredentialRetrievalError,  # IMDS / STS / SSO unreachable
    botocore.exceptions.MetadataRetrievalError,
    botocore.exceptions.TokenRetrievalError,
)
# The credential chain found nothing usable: a person must provide
# credentials (or fix the profile, or the file that a rotation left broken).
_CREDENTIAL_BOTOCORE: Final = (
    botocore.exceptions.NoCredentialsError,
    botocore.exceptions.PartialCredentialsError,
    botocore.exceptions.NoAuthTokenError,
    botocore.exceptions.UnauthorizedSSOTokenError,
    botocore.exceptions.ProfileNotFound,
    botocore.exceptions.InvalidConfigError,
    botocore.exceptions.ConfigParseError,
)
# Values of edgegw's own config that no store accepts.
_CONFIG_BOTOCORE: Final = (
    botocore.exceptions.NoRegionError,
    botocore.exceptions.UnknownEndpointError,
    botocore.exceptions.InvalidRetryConfigurationError,
    botocore.exceptions.InvalidS3AddressingStyleError,
)
#: botocore raises a bare ``RuntimeError`` with this text when the chain
#: refreshed temporary credentials and got ones that are expired already
#: (a credential source, or this machine's clock, that is off).
_STILL_EXPIRED: Final = "refreshed credentials are still expired"
#: Everything the client stack raises about a request (see the module
#: docstring): botocore's exceptions, and those of the layers below it that
#: escape botocore while an answer's body is read.
STORE_EXCEPTIONS: Final = (
    botocore.exceptions.ClientError,
    botocore.exceptions.BotoCoreError,
    urllib3.exceptions.HTTPError,  # ReadTimeoutError, ProtocolError, SSLError, DecodeError...
    http.client.HTTPException,  # IncompleteRead, RemoteDisconnected, BadStatusLine...
    OSError,  # socket errors, ssl.SSLError, TimeoutError, ConnectionResetError, EPIPE...
)
#: Below botocore, the one kind that is not the link or the store: a
#: malformed endpoint URL (or proxy URL) that no retry can fix.
_CONFIG_TRANSPORT: Final = (urllib3.exceptions.LocationValueError,)


def _build_client(config: S3Config, loader: object | None) -> tuple[S3Client, object, str | None]:
    """Build a client and its session (blocking: reads the shared files, may run a
    ``credential_process``); returns it with the session's model loader and the
    access key id it signs with (``None``: the chain found no credentials).

    A fresh botocore session resolves the credential chain anew; passing the
    loader of an earlier one skips parsing the service models again (a
    rebuild then costs ~10 ms instead of ~100).
    """
    session = botocore.session.Session(profile=config.profile)
    if loader is not None:
        session.register_component("data_loader", loader)
    client_config = botocore.config.Config(
        connect_timeout=config.connect_timeout,
        read_timeout=config.read_timeout,
        retries={"mode": config.retry_mode, "total_max_attempts": config.max_attempts},
        max_pool_connections=config.max_concurrency,
        s3={"addressing_style": "path" if config.path_style else "auto"},
        request_checksum_calculation=config.checksums,
        response_checksum_validation=config.checksums,
        user_agent_extra="edgegw",
    )
    client = session.create_client(
        "s3",
        region_name=config.region,
        endpoint_url=config.endpoint_url,
        aws_access_key_id=config.access_key,
        aws_secret_access_key=config.secret_key,
        aws_session_token=config.session_token,
        config=client_config,
    )
    key_id = config.access_key
    if key_id is None:
        # The chain's credentials, as create_client resolved (and cached) them.
        credentials = session.get_credentials()
        key_id = None if credentials is None else credentials.access_key
    return cast("S3Client", client), session.get_component("data_loader"), key_id


@dataclass(eq=False, slots=True)
class _Client:
    """A client and the requests running on it; a retired one closes after the last."""

    client: S3Client
    #: The access key id it signs with (``None``: no credentials found).
    key_id: str | None = None
    users: int = 0
    retired: bool = False
    #: GETs without botocore's request pipeline (``None``: off, or not possible).
    lean: LeanGet | None = None


class S3Bucket(Bucket):
    """A :class:`Bucket` on an S3-compatible store.

    Open with :meth:`open` (builds the boto3 client in a worker thread) and
    close with :meth:`aclose` (closes its connection pool).
    """

    def __init__(self, config: S3Config, client: S3Client | None) -> None:
        """Wrap an existing client (``None``: build one before the first request).

        The bucket owns the client and closes it on ``aclose``.
        """
        super().__init__()
        self._config = config
        self._prefix = config.key_prefix
        self._limiter = trio.CapacityLimiter(config.max_concurrency)
        self._current: _Client | None = None if client is None else self._held(client, None)
        #: The lean GET path of each live client, by ``id(client)``: worker
        #: threads look theirs up here (one dict read, atomic under the GIL).
        self._leans: dict[int, LeanGet] = {}
        if self._current is not None and self._current.lean is not None:
            self._leans[id(client)] = self._current.lean
        self._retired: set[_Client] = set()
        self._loader: object | None = None
        #: Build a new client before the next request (none yet, or the
        #: last build after a refusal failed).
        self._stale = client is None
        self._build_lock = trio.Lock()
        self._rebuilds = 0
        #: The ETag form If-Match needs here (see _put_if_match); None: not learned yet.
        self._if_match_form: str | None = None
        #: Whether CompleteMultipartUpload honours If-None-Match here (None: not probed yet).
        self._multipart_conditional: bool | None = None
        self._multipart_probe_lock = trio.Lock()

    @classmethod
    async def open(cls, config: S3Config) -> S3Bucket:
        """Create the client for ``config``; no request is sent yet.

        Raises :class:`ConfigError` for a configuration no store accepts. A
        client that cannot be built for want of credentials (a missing
        profile, a failing ``credential_process``) does not fail the open:
        each request tries again, and raises :class:`AccessDenied` (or
        :class:`BucketUnavailable`) until it works.
        """
        try:
            client, loader, key_id = await trio.to_thread.run_sync(
                _build_client, config, None, abandon_on_cancel=True
            )
        except (botocore.exceptions.BotoCoreError, ValueError, RuntimeError) as exc:
            error = _build_error(exc, config)
            if isinstance(error, ConfigError):
                raise error from exc
            _log.warning("S3 client not built yet, retried at the first request: %s", error)
            return cls(config, None)
        bucket = cls(config, client)
        bucket._loader = loader
        assert bucket._current is not None
        bucket._current.key_id = key_id
        return bucket

    def _held(self, client: S3Client, key_id: str | None) -> _Client:
        """A new client's record, with its lean GET path when the config asks for one."""
        lean = LeanGet.attach(client) if self._config.lean_get else None
        return _Client(client, key_id, lean=lean)

    def _close(self, held: _Client) -> None:
        self._leans.pop(id(held.client), None)
        held.client.close()

    @property
    def lean_get(self) -> LeanGet | None:
        """The current client's lean GET path (``None``: off), for tests and benches."""
        return None if self._current is None else self._current.lean

    @property
    def _client(self) -> S3Client:
        """The client new requests use (tests reach into it to inject faults)."""
        assert self._current is not None, "no client built yet"
        return self._current.client

    @property
    def client_builds(self) -> int:
        """Clients built anew since open (after refused credentials)."""
        return self._rebuilds

    @property
    def config(self) -> S3Config:
        """The configuration this bucket was opened with."""
        return self._config

    @property
    def name(self) -> str:
        """``s3://bucket/prefix``."""
        return f"s3://{self._config.bucket}/{self._prefix}"

    def describe(self) -> str:
        """Names bucket, prefix and endpoint for messages."""
        where = self._config.endpoint_url or f"AWS ({self._config.region or 'default region'})"
        return f"S3 bucket {self._config.bucket!r} (prefix {self._prefix!r}) at {where}"

    async def check_exists(self) -> None:
        """Raise :class:`NoSuchBucket` if the bucket does not exist (one LIST of one key).

        A LIST under the prefix rather than HeadBucket: the least-privilege
        policies (``edgegw iam policy``, ``deploy/iam/``) grant ``s3:ListBucket`` only for
        the prefix, and a HEAD's error has no body to tell a missing bucket
        from a refused one.
        """

        try:
            await self._run(
                "list",
                None,
                lambda client: client.list_objects_v2(
                    Bucket=self._config.bucket, Prefix=self._prefix, MaxKeys=1
                ),
            )
        except AccessDenied as exc:
            if exc.code != "NoSuchBucket":
                raise
            raise NoSuchBucket(
                f"{self.describe()}: no such bucket (edgegw never creates S3 buckets)"
            ) from None

    # -- hooks --------------------------------------------------------------

    async def _put(
        self, key: str, data: bytes, *, if_none_match: bool, if_match: str | None
    ) -> ObjectInfo:
        full_key = self._full_key(key)
        # If-Match goes on a single PUT even for large objects: CAS is meant
        # for small state objects, and not every store (moto among them)
        # checks If-Match on CompleteMultipartUpload.
        if (
            if_match is None
            and len(data) > self._config.multipart_threshold
            and (not if_none_match or await self.multipart_create_is_conditional(near=key))
        ):
            return await self._put_multipart(key, full_key, data, if_none_match=if_none_match)
        # Here a large object is a CAS, or a create-only put on a store that
        # ignores the condition on CompleteMultipartUpload: one PUT either way.
        if len(data) > MAX_PUT_SIZE:
            why = (
                "with if_match"
                if if_match is not None
                else f"create-only on {self.describe()}, which ignores If-None-Match on "
                "CompleteMultipartUpload,"
            )
            raise InvalidRequest(
                f"put of {len(data)} bytes {why} exceeds S3's single-PUT limit", key=key
            )
        if if_match is not None:
            return await self._put_if_match(key, full_key, data, if_match)
        return await self._put_object(key, full_key, data, if_none_match=if_none_match)

    async def _put_object(
        self, key: str, full_key: str, data: bytes, *, if_none_match: bool = False
    ) -> ObjectInfo:
        """One PutObject, create-only with ``if_none_match``."""
        kwargs: dict[str, Any] = {"Bucket": self._config.bucket, "Key": full_key, "Body": data}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        response = await self._run("put", key, lambda c: c.put_object(**kwargs))
        return ObjectInfo(
            key, len(data), _field(response, "ETag", "put", key), _response_date(response)
        )

    # -- compare-and-swap -------------------------------------------------------

    @property
    def if_match_form(self) -> str | None:
        """How this store wants the ETag in ``If-Match``: ``"quoted"`` (AWS, moto,
        MinIO), ``"bare"`` (Ceph RGW 16.2), or ``None`` (not learned yet)."""
        return self._if_match_form

    async def _put_if_match(self, key: str, full_key: str, data: bytes, etag: str) -> ObjectInfo:
        """A PutObject with ``If-Match``, in the ETag form the store accepts.

        AWS documents ``If-Match`` with the ETag as it returns it, quoted;
        Ceph RGW 16.2 compares the bare value and answers 412 to the quoted
        one even when it matches (issue 27). Until the form is learned, a
        412 is checked by reading the object back: an ETag equal to the one
        sent means the store refused its own current ETag, so the same
        conditional put goes once more with the ETag in the other form --
        still conditional, so nothing can be overwritten that changed in
        between. The form that succeeds is kept for the life of this object.
        A 412 to both forms while the ETag read back stays equal is
        :class:`PreconditionFailed` saying so (a store that refuses
        compare-and-swap); the caller tells it from contention the same way.
        """
        first = self._if_match_form or "quoted"
        try:
            info = await self._put_with_etag(key, full_key, data, _etag_form(etag, first))
        except PreconditionFailed:
            if self._if_match_form is not None:
                raise  # the form is known: a 412 is a changed object
            current = await self._current_etag(key)
            if current != _etag_form(etag, "bare"):
                raise  # it did change (or NotFound, raised by the read-back)
            second = "bare" if first == "quoted" else "quoted"
            try:
                info = await self._put_with_etag(key, full_key, data, _etag_form(etag, second))
            except PreconditionFailed as exc:
                if await self._current_etag(key) != _etag_form(etag, "bare"):
                    raise  # another writer won in between: contention
                raise PreconditionFailed(
                    f"{self.describe()} answered 412 to If-Match with the object's current "
                    f"ETag {etag} in both forms (quoted and bare): it does not support "
                    "compare-and-swap on PutObject",
                    key=key,
                ) from exc
            self._learn_if_match_form(second)
            return info
        self._learn_if_match_form(first)
        return info

    def _learn_if_match_form(self, form: str) -> None:
        if self._if_match_form is None:
            self._if_match_form = form
            if form != "quoted":
                _log.info(
                    "%s compares If-Match with the %s ETag (as Ceph RGW 16.2 does); "
                    "compare-and-swap sends it that way from now on",
                    self.describe(),
                    form,
                )

    async def _put_with_etag(self, key: str, full_key: str, data: bytes, etag: str) -> ObjectInfo:
        kwargs: dict[str, Any] = {
            "Bucket": self._config.bucket,
            "Key": full_key,
            "Body": data,
            "IfMatch": etag,
        }
        response = await self._run("put", key, lambda c: c.put_object(**kwargs))
        return ObjectInfo(
            key, len(data), _field(response, "ETag", "put", key), _response_date(response)
        )

    async def _current_etag(self, key: str) -> str:
        """The object's ETag, bare (:class:`NotFound` if there is none)."""
        return _etag_form((await self._head(key)).etag, "bare")

    async def _get(self, key: str, start: int, end: int | None) -> GetResult:
        full_key = self._full_key(key)
        if end is not None and start == end:
            # HTTP cannot ask for zero bytes ("bytes=5-4" means the whole object).
            return await self._empty_read(key, start)
        kwargs: dict[str, Any] = {"Bucket": self._config.bucket, "Key": full_key}
        if start > 0 or end is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"

        range_header: str | None = kwargs.get("Range")

        def call(client: S3Client) -> tuple[Mapping[str, Any], bytes] | None:
            lean = self._leans.get(id(client))
            try:
                if lean is not None:
                    answer = lean.get(full_key, range_header)
                    if answer is not None:
                        return answer.as_response(), answer.body
                response = client.get_object(**kwargs)
            except botocore.exceptions.ClientError as exc:
                if _status(exc) == 416:
                    return None  # the range starts at or past the end
                raise
            if lean is not None and not lean.ready:
                lean.learn(full_key)
            body = response["Body"]
            try:
                return response, body.read()
            except STORE_EXCEPTIONS as exc:
                # The answer (200/206) had come: say so, a timeout here is a
                # link that stalled half way, not a store that never answered.
                exc.add_note(f"after the {_status_of(response)} answer's headers, in its body")
                raise
            finally:
                body.close()

        answer = await self._run("get", key, call)
        if answer is None:
            return await self._empty_read(key, start)
        response, data = answer
        content_range = response.get("ContentRange")
        if content_range:
            first, size = _parse_content_range(content_range, key)
        else:
            # No Range sent, or a store that ignored it and sent everything:
            # cut the range out here.
            size = len(data)
            first = min(start, size)
            data = data[first : size if end is None else min(end, size)]
        return GetResult(
            key,
            data,
            first,
            size,
            _field(response, "ETag", "get", key),
            _field(response, "LastModified", "get", key),
        )

    async def _empty_read(self, key: str, start: int) -> GetResult:
        """A read of no bytes: the object's size and etag come from a HEAD."""
        info = await self._head(key)
        return GetResult(key, b"", min(start, info.size), info.size, info.etag, info.last_modified)

    async def _head(self, key: str) -> ObjectInfo:
        full_key = self._full_key(key)
        response = await self._run(
            "head",
            key,
            lambda c: c.head_object(Bucket=self._config.bucket, Key=full_key),
        )
        return ObjectInfo(
            key,
            _field(response, "ContentLength", "head", key),
            _field(response, "ETag", "head", key),
            _field(response, "LastModified", "head", key),
        )

    async def _list(
        self, prefix: str, *, start_after: str | None, limit: int | None
    ) -> builtins.list[ObjectInfo]:
        out: builtins.list[ObjectInfo] = []
        token: str | None = None
        # One worker-thread call per page, so a long listing neither holds a
        # limiter slot throughout nor ignores cancellation between pages.
        while True:
            kwargs: dict[str, Any] = {
                "Bucket": self._config.bucket,
                "Prefix": self._prefix + prefix,
                "MaxKeys": self._config.list_page_size
                if limit is None
                else min(self._config.list_page_size, limit - len(out)),
            }
            if token is not None:
                kwargs["ContinuationToken"] = token
            elif start_after is not None:
                kwargs["StartAfter"] = self._prefix + start_after
            page = await self._run("list", None, partial(_list_page, kwargs=kwargs))
            cut = len(self._prefix)
            for item in page.get("Contents", []):
                out.append(
                    ObjectInfo(
                        _field(item, "Key", "list", None)[cut:],
                        _field(item, "Size", "list", None),
                        _field(item, "ETag", "list", None),
                        _field(item, "LastModified", "list", None),
                    )
                )
            if not page.get("IsTruncated") or (limit is not None and len(out) >= limit):
                return out if limit is None else out[:limit]
            token = _field(page, "NextContinuationToken", "list", None)

    async def _delete(self, key: str) -> None:
        full_key = self._full_key(key)
        await self._run(
            "delete",
            key,
            lambda c: c.delete_object(Bucket=self._config.bucket, Key=full_key),
        )

    async def _aclose(self) -> None:
        # Closing only releases pooled sockets: no I/O worth a thread, and it
        # must happen even if the caller is being cancelled.
        for held in (self._current, *self._retired):
            if held is not None:
                self._close(held)
        self._retired.clear()

    # -- multipart --------------------------------------------------------------

    async def multipart_create_is_conditional(self, near: str = "") -> bool:
        """Whether the store refuses a CompleteMultipartUpload with ``If-None-Match: *``
        onto an existing key (probed once per bucket object, then remembered).

        AWS, MinIO and moto refuse it with 412; Ceph RGW 16.2 ignores the
        header there and replaces the object (while it honours it on
        PutObject). On such a store a create-only put of any size goes up as
        one PutObject (up to S3's 5 GiB), so that a large log object is as
        create-only as a small one. The probe is four small requests under
        ``_edgegw-probe/`` (one single-byte part), its object deleted after;
        in the region folder of ``near`` (the key being put) when it is in
        one, the only keys a region confined by its IAM policy may write.
        """
        if self._multipart_conditional is not None:
            return self._multipart_conditional
        async with self._multipart_probe_lock:
            if self._multipart_conditional is None:
                honoured = await self._probe_multipart_condition(near)
                if not honoured:
                    _log.warning(
                        "%s ignores If-None-Match on CompleteMultipartUpload (Ceph RGW 16.2 "
                        "does): create-only puts go up as single PUTs there, whatever their size",
                        self.describe(),
                    )
                self._multipart_conditional = honoured
        return self._multipart_conditional

    async def _probe_multipart_condition(self, near: str) -> bool:
        region_folder = _REGION_FOLDER.match(near)
        key = probe_key(region_folder.group(0) if region_folder else "")
        full_key = self._full_key(key)
        await self._put_object(key, full_key, b"edgegw multipart probe: first\n")
        try:
            try:
                await self._put_multipart(
                    key, full_key, b"edgegw multipart probe: second\n", if_none_match=True
                )
            except PreconditionFailed:
                return True
            return False
        finally:
            with trio.move_on_after(_ABORT_TIMEOUT, shield=True):
                try:
                    await self._delete(key)
                except EdgeGatewayError as exc:
                    _log.warning("could not delete probe object %r in %s: %s", key, self.name, exc)

    async def _put_multipart(
        self, key: str, full_key: str, data: bytes, *, if_none_match: bool
    ) -> ObjectInfo:
        bucket = self._config.bucket
        with_checksums = self._config.checksums == "when_supported"
        # Like s3transfer: when checksums are on, declare CRC32 for the
        # upload and hand each part's checksum back on completion (AWS
        # requires that once the upload declared an algorithm).
        create_kwargs: dict[str, Any] = {"Bucket": bucket, "Key": full_key}
        if with_checksums:
            create_kwargs["ChecksumAlgorithm"] = "CRC32"
        created = await self._run("put", key, lambda c: c.create_multipart_upload(**create_kwargs))
        upload_id = _field(created, "UploadId", "put", key)
        try:
            part_size = max(self._config.part_size, math.ceil(len(data) / MAX_PARTS))
            count = math.ceil(len(data) / part_size)
            parts: builtins.list[CompletedPartTypeDef] = [{} for _ in range(count)]
            failures: builtins.list[EdgeGatewayError] = []

            async def upload_part(index: int, nursery: trio.Nursery) -> None:
                def call(client: S3Client) -> CompletedPartTypeDef:
                    # Slice inside the thread: the copy stays off the event loop.
                    body = data[index * part_size : (index + 1) * part_size]
                    kwargs: dict[str, Any] = {
                        "Bucket": bucket,
                        "Key": full_key,
                        "UploadId": upload_id,
                        "PartNumber": index + 1,
                        "Body": body,
                    }
                    if with_checksums:
                        kwargs["ChecksumAlgorithm"] = "CRC32"
                    response = client.upload_part(**kwargs)
                    part: CompletedPartTypeDef = {
                        "PartNumber": index + 1,
                        "ETag": _field(response, "ETag", "put", key),
                    }
                    if with_checksums and "ChecksumCRC32" in response:
                        part["ChecksumCRC32"] = response["ChecksumCRC32"]
                    return part

                try:
                    parts[index] = await self._run("put", key, call)
                except EdgeGatewayError as exc:
                    # One failed part fails the upload: stop the others and
                    # report this error itself rather than an ExceptionGroup.
                    failures.append(exc)
                    nursery.cancel_scope.cancel()

            # The parts wait for a slot here, not in the worker-thread
            # limiter: each part's slice is copied only when it is sent.
            in_flight = trio.Semaphore(self._config.part_concurrency)

            async def upload_part_bounded(index: int, nursery: trio.Nursery) -> None:
                async with in_flight:
                    await upload_part(index, nursery)

            async with trio.open_nursery() as nursery:
                for index in range(count):
                    nursery.start_soon(upload_part_bounded, index, nursery)
            if failures:
                raise failures[0]

            complete_kwargs: dict[str, Any] = {
                "Bucket": bucket,
                "Key": full_key,
                "UploadId": upload_id,
                "MultipartUpload": {"Parts": parts},
            }
            if if_none_match:
                complete_kwargs["IfNoneMatch"] = "*"
            response = await self._run(
                "put", key, lambda c: c.complete_multipart_upload(**complete_kwargs)
            )
        except BaseException:
            # Parts of an upload that never completes are billed until
            # aborted; abort even when cancelled, but briefly.
            with trio.move_on_after(_ABORT_TIMEOUT, shield=True):
                await self._abort(key, full_key, upload_id)
            raise
        return ObjectInfo(
            key, len(data), _field(response, "ETag", "put", key), _response_date(response)
        )

    async def _abort_incomplete_uploads(self, prefix: str) -> int:
        bucket, full_prefix = self._config.bucket, self._prefix + prefix
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": full_prefix}
        aborted = 0
        while True:
            page = await self._run(
                "list", prefix or None, partial(_list_uploads_page, kwargs=dict(kwargs))
            )
            for upload in page.get("Uploads", []):
                full_key = _field(upload, "Key", "list", prefix or None)
                upload_id = _field(upload, "UploadId", "list", prefix or None)
                key = full_key[len(self._prefix) :]
                _log.info(
                    "%s: aborting an unfinished multipart upload of %r (started %s)",
                    self.describe(),
                    key,
                    upload.get("Initiated"),
                )
                await self._abort(key, full_key, upload_id)
                aborted += 1
            if not page.get("IsTruncated"):
                return aborted
            kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")

    async def _abort(self, key: str, full_key: str, upload_id: str) -> None:
        try:
            await self._run(
                "put",
                key,
                lambda c: c.abort_multipart_upload(
                    Bucket=self._config.bucket, Key=full_key, UploadId=upload_id
                ),
            )
        except EdgeGatewayError as exc:
            # Never hide the error that made us abort. NoSuchUpload here means
            # the upload already completed (a lost response) or was aborted;
            # for anything else a lifecycle rule on the bucket is the backstop.
            _log.warning("abort of multipart upload of %r in %s failed: %s", key, self.name, exc)

    # -- thread boundary ----------------------------------------------------------

    def _full_key(self, key: str) -> str:
        full = self._prefix + key
        if len(full.encode("utf-8")) > 1024:
            raise InvalidRequest(
                f"key {key!r} with prefix {self._prefix!r} exceeds S3's 1024 bytes", key=key
            )
        return full

    async def _run(self, operation: str, key: str | None, fn: Callable[[S3Client], _T]) -> _T:
        """Call blocking boto3 code ``fn(client)`` in a worker thread; translate its exceptions.

        Every request goes through here, and ``fn`` also reads the answer's
        body (a ``StreamingBody``): the exceptions of that read are the ones
        botocore does not translate itself. After a refusal that new
        credentials could cure, a new client reads the credential chain
        again; if it found other credentials (a key rotated in the shared
        file), the request is sent once more with them at once -- a refused
        request did not happen, so repeating it is safe -- and a planned
        rotation goes unnoticed. Otherwise the refusal is raised.
        """
        held = await self._client_for_request(operation, key)
        try:
            return await self._call(held, operation, key, fn)
        except AccessDenied as refused:
            if not refused.credentials_may_help or self._config.access_key is not None:
                raise  # keys in the config cannot change under us; the chain's can
            fresh = await self._fresh_client(held, operation, key)
            if fresh.key_id == held.key_id:
                raise
            _log.info(
                "%s: the credential chain has other credentials now (key %s, was %s); "
                "sending the refused %s again with them",
                self.describe(),
                fresh.key_id,
                held.key_id,
                operation,
            )
            return await self._call(fresh, operation, key, fn)

    async def _call(
        self, held: _Client, operation: str, key: str | None, fn: Callable[[S3Client], _T]
    ) -> _T:
        held.users += 1
        try:
            return await trio.to_thread.run_sync(fn, held.client, limiter=self._limiter)
        except (*STORE_EXCEPTIONS, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and _STILL_EXPIRED not in str(exc):
                raise  # not the credential chain's: a bug, not translated
            raise self._translate(exc, operation, key) from exc
        finally:
            held.users -= 1
            if held.retired and not held.users:
                self._retired.discard(held)
                self._close(held)

    def _translate(self, exc: BaseException, operation: str, key: str | None) -> EdgeGatewayError:
        return translate_error(
            exc,
            operation=operation,
            key=key,
            where=self.describe(),
            bucket=self._config.bucket,
            endpoint=self._config.endpoint_url,
        )

    async def _client_for_request(self, operation: str, key: str | None) -> _Client:
        """The current client; built first when there is none (or the last build failed)."""
        if self._current is None or self._stale:
            async with self._build_lock:
                if self._current is None or self._stale:
                    await self._build(operation, key)
        assert self._current is not None
        return self._current

    async def _fresh_client(self, refused: _Client, operation: str, key: str | None) -> _Client:
        """A client built after ``refused`` was refused (by this call, or a concurrent one)."""
        async with self._build_lock:
            if self._current is refused or self._current is None or self._stale:
                self._stale = True  # until a build succeeds
                await self._build(operation, key)
        assert self._current is not None
        return self._current

    async def _build(self, operation: str, key: str | None) -> None:
        # A fresh session reads the credential chain again. Abandoned on
        # cancellation: a credential_process that hangs must not hold up a
        # shutdown, and the thread touches nothing of ours until it returns.
        try:
            client, loader, key_id = await trio.to_thread.run_sync(
                _build_client, self._config, self._loader, abandon_on_cancel=True
            )
        except (botocore.exceptions.BotoCoreError, ValueError, RuntimeError) as exc:
            error = _build_error(exc, self._config, operation=operation, key=key)
            if isinstance(error, ConfigError) and self._current is not None:
                # The same config built a client before: what changed is the
                # shared files under it. Refused, never fatal to a running site.
                error = AccessDenied(str(error), key=key, code=type(exc).__name__)
            raise error from exc
        old, self._current = self._current, self._held(client, key_id)
        if self._current.lean is not None:
            self._leans[id(client)] = self._current.lean
        self._loader = loader
        self._stale = False
        if old is not None:
            self._rebuilds += 1
            # Debug: the caller's DenialTracker already says what is refused.
            _log.debug(
                "%s: built a new S3 client, reading the credential chain again after a refusal",
                self.describe(),
            )
            old.retired = True
            if old.users:
                self._retired.add(old)  # closed by the last request running on it
            else:
                self._close(old)


def _build_error(
    exc: BaseException, config: S3Config, *, operation: str = "open", key: str | None = None
) -> EdgeGatewayError:
    """The error for a client that could not be built: config, credentials, or unreachable."""
    if isinstance(exc, (ValueError, *_CONFIG_BOTOCORE)):
        # A bad endpoint URL or client setting: nothing but the config fixes it.
        return ConfigError(f"bucket config for {config.bucket!r}: {_one_line(str(exc))}")
    if isinstance(exc, RuntimeError) and _STILL_EXPIRED not in str(exc):
        raise exc
    where = config.endpoint_url or "AWS"
    return translate_error(
        exc,
        operation=f"{operation} (building the S3 client)",
        key=key,
        where=f"S3 bucket {config.bucket!r} at {where}",
        bucket=config.bucket,
        endpoint=config.endpoint_url,
    )


def translate_error(
    exc: BaseException,
    *,
    operation: str,
    key: str | None,
    where: str,
    bucket: str,
    endpoint: str | None,
) -> EdgeGatewayError:
    """The project's error for an exception of the S3 client stack (see the module docstring).

    ``operation`` and ``key`` name the request, ``where`` the store (for the
    message); ``bucket`` and ``endpoint`` are the configured ones. Transient
    failures become :class:`BucketUnavailable` (the callers retry with
    backoff; a write's outcome is unknown), the others the error that says
    what to fix.
    """
    what = f"{operation} of key {key!r}" if key is not None else operation
    notes = getattr(exc, "__notes__", ())
    if notes:
        where = f"{where} ({'; '.join(notes)})"
    if isinstance(exc, RuntimeError) and _STILL_EXPIRED in str(exc):
        return AccessDenied(
            f"{what} on {where}: the credential chain refreshed temporary credentials that "
            "are already expired by this machine's clock",
            key=key,
            code="CredentialsExpired",
        )
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = _status(exc)
        detail = f"{code or status}: {_one_line(str(error.get('Message', ''))) or 'no message'}"
        message = f"{what} on {where}: HTTP {status} {detail}"
        if code == "NoSuchBucket":
            return AccessDenied(
                f"{what}: bucket {bucket!r} does not exist at {endpoint or 'AWS'} "
                f"(HTTP {status} {detail})",
                key=key,
                code=code,
            )
        if code == "NoSuchUpload":
            return BucketUnavailable(
                f"{message} (the multipart upload is gone: aborted by a lifecycle rule "
                "or by a newer writer's claim, or completed by an earlier attempt whose "
                "response was lost; "
                "the outcome is unknown)",
                key=key,
            )
        if status == 412 or code == "PreconditionFailed":
            return PreconditionFailed(message, key=key)
        if status == 404 or code in ("NoSuchKey", "NotFound"):
            return NotFound(message, key=key)
        if status == 403 or code in _ACCESS_CODES:
            # An answer without a body (to a HEAD) has only its status as a code.
            return AccessDenied(
                message, key=key, code=code if code and not code.isdigit() else "AccessDenied"
            )
        if status == 301:
            return AccessDenied(message, key=key, code="PermanentRedirect")
        if status >= 500 or status in (409, 429) or code in _UNAVAILABLE_CODES:
            return BucketUnavailable(message, key=key)
        if 400 <= status < 500:
            return InvalidRequest(message, key=key)
        return BucketUnavailable(message, key=key)
    if isinstance(exc, botocore.exceptions.BotoCoreError):
        message = f"{what} on {where}: {type(exc).__name__}: {_one_line(str(exc))}"
        if isinstance(exc, _UNAVAILABLE_BOTOCORE):
            return BucketUnavailable(message, key=key)
        if isinstance(exc, _CREDENTIAL_BOTOCORE):
            return AccessDenied(message, key=key, code=type(exc).__name__)
        if isinstance(exc, _CONFIG_BOTOCORE):
            return ConfigError(message)
        if isinstance(
            exc, botocore.exceptions.ValidationError | botocore.exceptions.ParamValidationError
        ):
            return InvalidRequest(message, key=key)
        # Unknown botocore failures are treated as transient: the caller
        # keeps its data and retries with backoff, and the message (logged
        # by the retry loop) names the exception.
        return BucketUnavailable(message, key=key)
    # Below botocore: named with their module, since several share a name
    # with botocore's (urllib3's ReadTimeoutError, ssl's SSLError).
    kind = type(exc)
    detail = _one_line(str(exc)) or "no detail"
    message = f"{what} on {where}: {kind.__module__}.{kind.__qualname__}: {detail}"
    if isinstance(exc, _CONFIG_TRANSPORT):
        return ConfigError(f"bucket config 'endpoint_url': {endpoint!r}: {message}")
    # The link or the store failed, stalled or broke off during the request
    # (most often while an answer's body was read): transient.
    return BucketUnavailable(message, key=key)


def _etag_form(etag: str, form: str) -> str:
    """``etag`` quoted (``"abc"``) or bare (``abc``), whichever form it came in."""
    bare = etag[1:-1] if len(etag) >= 2 and etag[0] == etag[-1] == '"' else etag
    return f'"{bare}"' if form == "quoted" else bare


def _list_uploads_page(client: S3Client, *, kwargs: dict[str, Any]) -> Any:
    return client.list_multipart_uploads(**kwargs)


def _list_page(client: S3Client, *, kwargs: dict[str, Any]) -> Any:
    return client.list_objects_v2(**kwargs)


def _status_of(response: Mapping[str, Any]) -> int:
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _one_line(text: str) -> str:
    """Messages are one line (botocore's parameter report has one line per problem)."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _field(response: Mapping[str, Any], name: str, operation: str, key: str | None) -> Any:
    """A field every answer of ``operation`` carries; a store that left it out answered wrongly."""
    try:
        return response[name]
    except KeyError:
        what = f"{operation} of key {key!r}" if key is not None else operation
        raise BucketUnavailable(f"{what}: the store's answer has no {name}", key=key) from None


def _status(exc: botocore.exceptions.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _parse_content_range(value: str, key: str) -> tuple[int, int]:
    """``bytes 5-9/10`` → (first byte, total size)."""
    try:
        unit, _, rest = value.partition(" ")
        span, _, total = rest.partition("/")
        first = int(span.partition("-")[0])
        size = int(total)
    except ValueError:
        raise BucketUnavailable(f"unparsable Content-Range {value!r}", key=key) from None
    if unit != "bytes":
        raise BucketUnavailable(f"unexpected Content-Range unit in {value!r}", key=key)
    return first, size


def _response_date(response: Mapping[str, Any]) -> datetime:
    """The server's ``Date`` header: PUT responses carry no Last-Modified."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if date:
        try:
            return parsedate_to_datetime(date).astimezone(UTC)
        except (TypeError, ValueError):
            pass
    return datetime.now(UTC)
