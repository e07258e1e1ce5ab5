"""GetObject without botocore's request pipeline: signed by its SigV4 signer, sent on its pool.

A GET of a ~110 KB log object through ``client.get_object(...)`` costs about
twice the CPU of the same request signed by botocore's ``S3SigV4Auth`` and
sent with urllib3 (``bench/s3_get_cpu.py``): the difference is botocore's
per-call machinery (parameter validation, event hooks, endpoint rules,
retry bookkeeping, response parsing), not the signature or the bytes. A
catching-up mirror spends that CPU once per object, so its catch-up speed
follows it (docs/mirroring.md).

:class:`LeanGet` sends a GET that way, and only the successful answer: any
other answer, and any failure of the transport, returns ``None`` and the
caller makes the ordinary ``client.get_object`` call, whose errors, retries,
refused-credential handling and throttling stay what they were. The one
exception is a 404 (or a 416, a range past the end): it is parsed by
botocore's own parser into the same ``ClientError`` botocore raises, so
that a mirror polling for an object that does not exist yet does not pay
two requests per poll.

What the request looks like is not worked out here but *learned from
botocore*: the first GetObject of each client goes through botocore, and an
event handler (``before-send``) records the URL and headers it sent. From
them come the URL of any other key (the endpoint, addressing style and key
encoding botocore chose), the signing region and service (from the
``Authorization`` header's credential scope), and the headers to send again
(``x-amz-checksum-mode``, SSE-C headers if any were ever set, the user
agent). The request goes out on the client's own HTTP session
(``botocore.httpsession.URLLib3Session``, a urllib3 ``PoolManager``): the
same connection pool, timeouts, TLS verification and CA bundle, client
certificate and proxies as every other request of the client, by
construction rather than by copying settings. Credentials are the client's
own, read with ``get_frozen_credentials()`` per request, so refreshed
temporary credentials keep working.

The answer's body is read whole and checked against ``Content-Length``; if
botocore would have validated a response checksum (``x-amz-checksum-mode``
was sent, ``checksums = "when_supported"``), it is validated the same way:
the first algorithm of botocore's priority list that the answer carries,
composite (``-N``) values skipped. A mismatch, or an algorithm this module
cannot compute, falls back to botocore's call.

Needs two private attributes of a botocore client (``_request_signer`` for
the credentials, ``_endpoint.http_session`` for the pool); when a botocore
version lacks them, :meth:`LeanGet.attach` returns ``None`` and every GET
goes through botocore (tests/bucket/test_s3_lean_get.py fails then, so an
upgrade does not silently lose the path).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import threading
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Final, cast

import botocore.exceptions
import botocore.httpchecksum
import botocore.parsers
import crc32c
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.utils import parse_timestamp, percent_encode

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

__all__ = ["LeanAnswer", "LeanGet"]

_log = logging.getLogger(__name__)

#: ``Credential=<key id>/<date>/<region>/<service>/aws4_request`` of a SigV4 Authorization header.
_SIGV4_SCOPE: Final = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=[^/]+/\d{8}/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request,"
)
#: Headers of botocore's request that belong to one request (its signature,
#: date, range, attempt count), not to every GET of the client.
_PER_REQUEST: Final = frozenset(
    {
        "authorization",
        "x-amz-date",
        "x-amz-security-token",
        "x-amz-content-sha256",
        "range",
        "amz-sdk-invocation-id",
        "amz-sdk-request",
        "content-length",
        "expect",
        "host",
    }
)
#: Response checksums this module computes, by botocore's algorithm name.
_DIGESTS: Final[dict[str, Callable[[bytes], bytes]]] = {
    "crc32": lambda data: zlib.crc32(data).to_bytes(4, "big"),
    "crc32c": lambda data: crc32c.crc32c(data).to_bytes(4, "big"),
    "sha1": lambda data: hashlib.sha1(data, usedforsecurity=False).digest(),
    "sha256": lambda data: hashlib.sha256(data).digest(),
    "sha512": lambda data: hashlib.sha512(data).digest(),
}


@dataclass(frozen=True, slots=True)
class LeanAnswer:
    """A successful GET's status, headers and whole body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def as_response(self) -> dict[str, Any]:
        """The fields of botocore's GetObject response that the S3 backend's GET reads."""
        headers = self.headers
        response: dict[str, Any] = {"ResponseMetadata": {"HTTPStatusCode": self.status}}
        if "etag" in headers:
            response["ETag"] = headers["etag"]
        if "last-modified" in headers:
            response["LastModified"] = _http_date(headers["last-modified"])
        if "content-range" in headers:
            response["ContentRange"] = headers["content-range"]
        return response


def _http_date(value: str) -> datetime:
    """An HTTP date as an aware UTC datetime, as botocore parses it (equal to its value).

    The standard library's RFC 7231 parser first: botocore's ``parse_timestamp``
    (dateutil) costs ~50 us, ~4% of a lean GET; it takes any other form.
    """
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return parse_timestamp(value)
    if parsed.tzinfo is None:  # "-0000": no zone given, UTC by RFC 5322
        return parsed.replace(tzinfo=UTC)
    return parsed


@dataclass(frozen=True, slots=True)
class _Shape:
    """What botocore's GetObject requests of one client look like."""

    #: The URL of a key is ``base + percent_encode(key) + suffix``.
    base: str
    suffix: str
    region: str
    service: str
    #: Headers sent with every GET (all but the per-request ones).
    headers: tuple[tuple[str, str], ...]
    #: The checksum algorithms botocore would validate, in its order; empty
    #: when it sends no ``x-amz-checksum-mode``.
    checksums: tuple[str, ...]


class LeanGet:
    """GetObject for one botocore client, signed and sent without its request pipeline.

    Thread-safe: :meth:`get` and :meth:`learn` run in the backend's worker
    threads. Counters are for tests and benches (``lean``: answered here;
    ``fallbacks``: handed back to botocore).
    """

    def __init__(self, client: S3Client, credentials: Any, http_session: Any) -> None:
        self._client = client
        self._credentials = credentials
        self._http = http_session
        self._shape: _Shape | None = None
        self._unusable = False
        #: Per worker thread: what botocore last sent for GetObject.
        self._seen = threading.local()
        self._parser = botocore.parsers.create_parser("rest-xml")
        self._operation = client.meta.service_model.operation_model("GetObject")
        self.lean = 0
        self.fallbacks = 0

    @classmethod
    def attach(cls, client: S3Client) -> LeanGet | None:
        """A lean GET path for ``client``, or ``None`` if this botocore lacks what it needs."""
        signer = getattr(client, "_request_signer", None)
        credentials = getattr(signer, "_credentials", None)
        http_session = getattr(getattr(client, "_endpoint", None), "http_session", None)
        if credentials is None or not callable(getattr(http_session, "send", None)):
            _log.debug("S3 GETs go through botocore: no credentials, or no HTTP session to share")
            return None
        lean = cls(client, credentials, http_session)
        client.meta.events.register("before-send.s3.GetObject", lean._record)
        return lean

    @property
    def ready(self) -> bool:
        """Whether the request's shape is learned (until then every GET goes through botocore)."""
        return self._shape is not None

    def _record(self, request: Any, **_: Any) -> None:
        # Runs in the worker thread that called get_object, before each attempt.
        self._seen.last = (
            request.url,
            {
                name: value.decode("latin-1") if isinstance(value, bytes) else str(value)
                for name, value in request.headers.items()
            },
        )

    def learn(self, full_key: str) -> None:
        """Learn the request's shape from the GetObject of ``full_key`` botocore just sent."""
        seen = getattr(self._seen, "last", None)
        self._seen.last = None
        if self._shape is not None or self._unusable or seen is None:
            return
        url, headers = seen
        shape = _shape_of(url, headers, full_key, self._operation)
        if shape is None:
            self._unusable = True
            _log.info(
                "S3 GETs go through botocore: its request (%s) is not one this path can repeat",
                url.partition("?")[0],
            )
            return
        self._shape = shape

    def get(self, full_key: str, range_header: str | None) -> LeanAnswer | None:
        """GET ``full_key`` (blocking); ``None``: make botocore's call instead.

        Raises botocore's ``ClientError`` for a 404 or 416, as botocore's
        call would (the same error class, code, message and status).
        """
        shape = self._shape
        if shape is None:
            return None
        url = shape.base + percent_encode(full_key, safe="/~") + shape.suffix
        headers = dict(shape.headers)
        if range_header is not None:
            headers["Range"] = range_header
        request = AWSRequest(method="GET", url=url, headers=headers)
        try:
            S3SigV4Auth(
                self._credentials.get_frozen_credentials(), shape.service, shape.region
            ).add_auth(request)
            answer = self._http.send(request.prepare())
            status = answer.status_code
            body = answer.content
        except (botocore.exceptions.BotoCoreError, OSError, ValueError) as exc:
            # The transport failed (reset mid-body, timeout, TLS): botocore's
            # call retries and raises as it always did.
            _log.debug("lean GET of %r failed (%s), sent through botocore", full_key, exc)
            self.fallbacks += 1
            return None
        if status in (404, 416):
            self._raise_client_error(status, answer.headers, body)
        if status != 200 and not (status == 206 and range_header is not None):
            self.fallbacks += 1
            return None
        length = answer.headers.get("content-length")
        if length is None or not length.isdigit() or int(length) != len(body):
            self.fallbacks += 1  # a body cut short (or none declared): botocore checks it
            return None
        if not _checksum_matches(shape.checksums, answer.headers, body):
            self.fallbacks += 1
            return None
        self.lean += 1
        return LeanAnswer(status, answer.headers, body)

    def _raise_client_error(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        # What botocore's _make_api_call does with an error answer: parse it
        # with the service's parser, raise the modeled exception class.
        output_shape = self._operation.output_shape
        assert output_shape is not None  # GetObject has an output
        parsed = self._parser.parse(
            {"status_code": status, "headers": headers, "body": body}, output_shape
        )
        code = parsed.get("Error", {}).get("Code")
        error_class = cast(
            "type[botocore.exceptions.ClientError]", self._client.exceptions.from_code(code)
        )
        raise error_class(parsed, "GetObject")


def _shape_of(url: str, headers: Mapping[str, str], full_key: str, operation: Any) -> _Shape | None:
    """The shape of a GetObject request botocore sent for ``full_key``, or ``None``."""
    path, sep, query = url.partition("?")
    encoded = percent_encode(full_key, safe="/~")
    if not path.endswith("/" + encoded):
        return None
    auth = headers.get("Authorization") or headers.get("authorization") or ""
    scope = _SIGV4_SCOPE.match(auth)
    if scope is None:
        return None  # not SigV4 (anonymous, SigV2, SigV4a): leave it to botocore
    kept = tuple(
        (name, value) for name, value in headers.items() if name.lower() not in _PER_REQUEST
    )
    checksums: tuple[str, ...] = ()
    if any(name.lower() == "x-amz-checksum-mode" for name, _ in kept):
        context: dict[str, Any] = {"context": {}}
        botocore.httpchecksum.resolve_response_checksum_algorithms(
            context, operation, {"ChecksumMode": "ENABLED"}
        )
        checksums = tuple(context["context"].get("checksum", {}).get("response_algorithms", ()))
    return _Shape(
        base=path[: len(path) - len(encoded)],
        suffix=sep + query,
        region=scope["region"],
        service=scope["service"],
        headers=kept,
        checksums=checksums,
    )


def _checksum_matches(algorithms: tuple[str, ...], headers: Mapping[str, str], body: bytes) -> bool:
    """Whether the answer passes the check botocore would make (``False``: let botocore make it)."""
    for algorithm in algorithms:
        expected = headers.get(f"x-amz-checksum-{algorithm}")
        if expected is None or "-" in expected:
            continue  # absent, or a composite of the parts' checksums: botocore skips both
        digest = _DIGESTS.get(algorithm)
        if digest is None:
            return False  # botocore can check it (with its CRT), this module cannot
        try:
            return digest(body) == base64.b64decode(expected, validate=True)
        except ValueError:
            return False
    return True
