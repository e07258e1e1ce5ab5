"""Every exception of the S3 client stack, at every call site of the S3 bucket.

The requests go to moto's server over HTTP. A fault is injected *while the
body of the server's answer is read*: urllib3's ``HTTPResponse.read`` is
wrapped so that, for the answer to one chosen botocore operation, it reads a
byte of the real body and then raises the exception under test. That is the
spot where botocore lets foreign exceptions through (it reads the body of an
error answer to a GET, such as the 404 for a log entry not written yet,
outside its exception handling; and a GET's ``StreamingBody`` after the
client call), and where a stalled or broken link shows up in production.
Everything else — the request, botocore's parsing, retries (one attempt
here), the adapter's own code — is the real thing.
"""

from __future__ import annotations

import errno
import http.client
import logging
import os
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import botocore.exceptions
import pytest
import urllib3.exceptions
import urllib3.response
from _bucket_support import MIB, make_s3_config

from edge_gateway.bucket import (
    AccessDenied,
    Bucket,
    BucketUnavailable,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
    S3Bucket,
)
from edge_gateway.bucket._s3 import STORE_EXCEPTIONS, translate_error
from edge_gateway.errors import ConfigError, EdgeGatewayError, Unavailable

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

#: Every foreign kind the stack can raise while an answer streams (all transient).
KINDS: dict[str, Callable[[], Exception]] = {
    "urllib3 ReadTimeoutError": lambda: urllib3.exceptions.ReadTimeoutError(
        None, "/bucket/key", "Read timed out."
    ),
    "urllib3 ProtocolError": lambda: urllib3.exceptions.ProtocolError(
        "Connection broken: IncompleteRead(3 bytes read, 7 more expected)",
        http.client.IncompleteRead(b"abc", 7),
    ),
    "urllib3 IncompleteRead": lambda: urllib3.exceptions.IncompleteRead(3, 7),
    "urllib3 SSLError": lambda: urllib3.exceptions.SSLError("decryption failed or bad record mac"),
    "urllib3 DecodeError": lambda: urllib3.exceptions.DecodeError(
        "Received response with content-encoding: gzip, but failed to decode it."
    ),
    "http.client IncompleteRead": lambda: http.client.IncompleteRead(b"abc", 7),
    "http.client RemoteDisconnected": lambda: http.client.RemoteDisconnected(
        "Remote end closed connection without response"
    ),
    "ssl SSLError": lambda: ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC]"),
    "ConnectionResetError": lambda: ConnectionResetError(
        errno.ECONNRESET, "Connection reset by peer"
    ),
    "BrokenPipeError": lambda: BrokenPipeError(errno.EPIPE, "Broken pipe"),
    "TimeoutError": lambda: TimeoutError("timed out"),
    "OSError ENETUNREACH": lambda: OSError(errno.ENETUNREACH, "Network is unreachable"),
    "botocore ReadTimeoutError": lambda: botocore.exceptions.ReadTimeoutError(
        endpoint_url="http://127.0.0.1:1"
    ),
    "botocore ResponseStreamingError": lambda: botocore.exceptions.ResponseStreamingError(
        error="connection broken"
    ),
    "botocore IncompleteReadError": lambda: botocore.exceptions.IncompleteReadError(
        actual_bytes=3, expected_bytes=7
    ),
    "botocore ConnectionClosedError": lambda: botocore.exceptions.ConnectionClosedError(
        endpoint_url="http://127.0.0.1:1"
    ),
    "botocore EndpointConnectionError": lambda: botocore.exceptions.EndpointConnectionError(
        endpoint_url="http://127.0.0.1:1"
    ),
    "botocore ConnectTimeoutError": lambda: botocore.exceptions.ConnectTimeoutError(
        endpoint_url="http://127.0.0.1:1"
    ),
}


class BodyFaults:
    """Raises a chosen exception while the body of one operation's next answer is read.

    :meth:`arm` names a botocore operation (``GetObject``...); the next
    request of that operation, seen by botocore's ``before-send`` event, gets
    the fault on its first body read. Calls run one at a time in these tests,
    except multipart parts, of which the first to read its answer fails.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, Exception] = {}
        self._pending: Exception | None = None
        #: (operation, exception) of every fault raised.
        self.raised: list[tuple[str, Exception]] = []
        self._operation = ""

    def arm(self, operation: str, exc: Exception) -> None:
        with self._lock:
            self._armed[operation] = exc

    def attach(self, bucket: S3Bucket) -> None:
        bucket._client.meta.events.register("before-send.s3", self._before_send)

    def _before_send(self, event_name: str, **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[1]
        with self._lock:
            exc = self._armed.pop(operation, None)
            if exc is not None:
                self._pending, self._operation = exc, operation

    def wrap_read(self, real: Callable[..., bytes]) -> Callable[..., bytes]:
        def read(response: urllib3.response.HTTPResponse, *args: Any, **kwargs: Any) -> bytes:
            with self._lock:
                exc, self._pending = self._pending, None
            if exc is None:
                return real(response, *args, **kwargs)
            real(response, 1)  # a byte of the real answer first: the fault is mid-body
            self.raised.append((self._operation, exc))
            # As urllib3 does when a read fails inside it: the connection is
            # closed, not left to the garbage collector, whose "unclosed
            # socket" ResourceWarning fails whichever test it lands in (seen
            # on 3.13). The fault raised here bypasses urllib3's own cleanup.
            response.close()
            raise exc

        return read


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> BodyFaults:
    body_faults = BodyFaults()
    monkeypatch.setattr(
        urllib3.response.HTTPResponse,
        "read",
        body_faults.wrap_read(urllib3.response.HTTPResponse.read),
    )
    return body_faults


@pytest.fixture
async def bucket(moto_endpoint: str, s3_bucket_name: str, faults: BodyFaults) -> Any:
    # One attempt: botocore retries some of these on its own (those it
    # translates itself); one attempt makes each injected fault the outcome.
    # Every GET through botocore: its boundary is what is tested here (the
    # lean GET path hands every such fault back to botocore's call:
    # tests/bucket/test_s3_lean_get.py).
    config = make_s3_config(
        moto_endpoint, s3_bucket_name, prefix="p/", max_attempts=1, lean_get=False
    )
    async with await S3Bucket.open(config) as opened:
        faults.attach(opened)
        await opened.put("existing", b"0123456789" * 100)
        yield opened


@dataclass(frozen=True)
class Site:
    """One call of the bucket interface and the botocore operation whose answer is faulted."""

    operation: str
    call: Callable[[Bucket, str], Awaitable[object]]


BIG = 5 * MIB + 10  # above the tests' multipart threshold: two parts


def _big() -> bytes:
    return os.urandom(BIG)


SITES: dict[str, Site] = {
    "put": Site("PutObject", lambda b, k: b.put(k, b"data")),
    "put create-only": Site("PutObject", lambda b, k: b.put(k, b"data", if_none_match=True)),
    "put create-only, 412 answer": Site(
        "PutObject", lambda b, k: b.put("existing", b"data", if_none_match=True)
    ),
    "put if-match, 412 answer": Site(
        "PutObject", lambda b, k: b.put("existing", b"data", if_match='"0"')
    ),
    "get": Site("GetObject", lambda b, k: b.get("existing")),
    "get, 404 answer": Site("GetObject", lambda b, k: b.get(k)),
    "ranged get": Site("GetObject", lambda b, k: b.get("existing", start=10, end=20)),
    "ranged get, 416 answer": Site("GetObject", lambda b, k: b.get("existing", start=5000)),
    "ranged get, 416 then head": Site("HeadObject", lambda b, k: b.get("existing", start=5000)),
    "head": Site("HeadObject", lambda b, k: b.head("existing")),
    "head, 404 answer": Site("HeadObject", lambda b, k: b.head(k)),
    "delete": Site("DeleteObject", lambda b, k: b.delete("existing")),
    "list": Site("ListObjectsV2", lambda b, k: b.list("")),
    "multipart create": Site(
        "CreateMultipartUpload", lambda b, k: b.put(k, _big(), if_none_match=True)
    ),
    "multipart upload part": Site("UploadPart", lambda b, k: b.put(k, _big(), if_none_match=True)),
    "multipart complete": Site(
        "CompleteMultipartUpload", lambda b, k: b.put(k, _big(), if_none_match=True)
    ),
}


@pytest.mark.parametrize("site", list(SITES))
async def test_every_foreign_exception_is_translated_at_every_call_site(
    bucket: S3Bucket, faults: BodyFaults, site: str
) -> None:
    s = SITES[site]
    wrong: list[str] = []
    for i, (kind, make) in enumerate(KINDS.items()):
        exc = make()
        before = bucket.statistics()
        faults.arm(s.operation, exc)
        try:
            await s.call(bucket, f"key-{i}")
        except BucketUnavailable as got:
            if bucket.describe() not in str(got):
                wrong.append(f"{kind}: the message does not name the store: {got}")
        except Exception as got:  # collected: one report for every kind
            wrong.append(f"{kind}: raised {type(got).__module__}.{type(got).__name__}: {got}")
        else:
            wrong.append(f"{kind}: no error (the fault was not injected?)")
        assert faults.raised[-1] == (s.operation, exc), f"{kind} was not injected at {site}"
        assert bucket.statistics().unavailable == before.unavailable + 1, kind
    assert wrong == [], f"at {site}:\n" + "\n".join(wrong)
    # Nothing broke for good: the same call works without a fault.
    await bucket.put("existing", b"0123456789" * 100)
    assert (await bucket.get("existing", start=0, end=4)).data == b"0123"


async def test_abort_after_a_failed_part_is_translated_too(
    bucket: S3Bucket,
    faults: BodyFaults,
    s3_admin: S3Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A part fails, and so does the abort that follows: the caller gets the
    # part's error, the abort's is logged (translated), nothing escapes.
    caplog.set_level(logging.WARNING, logger="edge_gateway.bucket._s3")
    # Probed before the faults are armed (the probe uploads a part too).
    assert await bucket.multipart_create_is_conditional()
    for i, (kind, make) in enumerate(KINDS.items()):
        part_error, abort_error = make(), make()
        faults.arm("UploadPart", part_error)
        faults.arm("AbortMultipartUpload", abort_error)
        with pytest.raises(BucketUnavailable, match=f"put of key 'big-{i}'"):
            await bucket.put(f"big-{i}", _big(), if_none_match=True)
        assert faults.raised[-2:] == [
            ("UploadPart", part_error),
            ("AbortMultipartUpload", abort_error),
        ], kind
        logged = caplog.records[-1].getMessage()
        assert f"abort of multipart upload of 'big-{i}'" in logged, kind
        assert bucket.describe() in logged, kind
    # The faults hit the answers: the store had applied each abort.
    assert s3_admin.list_multipart_uploads(Bucket=bucket.config.bucket).get("Uploads", []) == []


async def test_a_404_whose_body_stalls_is_unavailable_not_not_found(
    bucket: S3Bucket, faults: BodyFaults
) -> None:
    # The incident: the answer to a tailer's poll for the next entry is a
    # 404 whose body never finishes. It is not "nothing new" (the status
    # line alone does not say that much), and not a crash: retry later.
    faults.arm("GetObject", urllib3.exceptions.ReadTimeoutError(None, "/x", "Read timed out."))
    with pytest.raises(BucketUnavailable, match=r"urllib3\.exceptions\.ReadTimeoutError"):
        await bucket.get("log/00000000000000000007")
    with pytest.raises(NotFound):
        await bucket.get("log/00000000000000000007")


# ------------------------------------------------------------------ the table


def _client_error(status: int, code: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {
            "Error": {"Code": code, "Message": "m"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "GetObject",
    )


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_client_error(412, "PreconditionFailed"), PreconditionFailed),
        (_client_error(404, "NoSuchKey"), NotFound),
        (_client_error(404, "NoSuchBucket"), AccessDenied),
        (_client_error(403, "AccessDenied"), AccessDenied),
        (_client_error(403, "InvalidAccessKeyId"), AccessDenied),
        (_client_error(400, "ExpiredToken"), AccessDenied),
        (_client_error(301, "PermanentRedirect"), AccessDenied),
        (_client_error(400, "AuthorizationHeaderMalformed"), AccessDenied),
        (_client_error(503, "SlowDown"), BucketUnavailable),
        (_client_error(409, "ConditionalRequestConflict"), BucketUnavailable),
        (_client_error(404, "NoSuchUpload"), BucketUnavailable),
        (_client_error(400, "InvalidArgument"), InvalidRequest),
        (botocore.exceptions.NoCredentialsError(), AccessDenied),
        (botocore.exceptions.ProfileNotFound(profile="p"), AccessDenied),
        (botocore.exceptions.ConfigParseError(path="/x/credentials"), AccessDenied),
        (botocore.exceptions.ParamValidationError(report="bad"), InvalidRequest),
        (botocore.exceptions.NoRegionError(), ConfigError),
        (
            botocore.exceptions.ChecksumError(
                checksum_type="crc32", expected_checksum="a", actual_checksum="b"
            ),
            BucketUnavailable,
        ),
        (urllib3.exceptions.LocationParseError("http://[::1"), ConfigError),
        *((make(), BucketUnavailable) for make in KINDS.values()),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else v.__name__,
)
def test_translation_table(exc: BaseException, expected: type[EdgeGatewayError]) -> None:
    assert isinstance(exc, STORE_EXCEPTIONS)
    got = translate_error(
        exc,
        operation="get",
        key="k",
        where="S3 bucket 'b' at http://store",
        bucket="b",
        endpoint="http://store",
    )
    assert type(got) is expected
    assert str(got)  # one line that says what and where
    assert "\n" not in str(got)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (_client_error(404, "NoSuchBucket"), "NoSuchBucket"),
        (_client_error(403, "InvalidAccessKeyId"), "InvalidAccessKeyId"),
        (_client_error(403, "403"), "AccessDenied"),  # a HEAD's answer has no body
        (_client_error(301, "301"), "PermanentRedirect"),
        (botocore.exceptions.NoCredentialsError(), "NoCredentialsError"),
        # botocore's words when a refresh brought credentials expired already
        (
            RuntimeError(
                "Credentials were refreshed, but the refreshed credentials are still expired."
            ),
            "CredentialsExpired",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_refusals_carry_the_store_code_and_what_to_do(exc: BaseException, code: str) -> None:
    # Issue 26: a refusal is retried like an outage (never a fatal ConfigError),
    # and status shows its code and what a person does about it.
    got = translate_error(
        exc,
        operation="put",
        key="k",
        where="S3 bucket 'b' at http://store",
        bucket="b",
        endpoint="http://store",
    )
    assert isinstance(got, AccessDenied)
    assert isinstance(got, Unavailable)
    assert not isinstance(got, ConfigError)
    assert got.code == code
    assert got.action
    assert "\n" not in str(got)


@pytest.mark.parametrize(
    ("operation", "field", "call"),
    [
        ("PutObject", "ETag", lambda b: b.put("k", b"v")),
        ("GetObject", "ETag", lambda b: b.get("existing")),
        ("HeadObject", "ContentLength", lambda b: b.head("existing")),
        ("CreateMultipartUpload", "UploadId", lambda b: b.put("big", _big())),
    ],
)
async def test_an_answer_without_a_required_field_is_unavailable(
    bucket: S3Bucket, operation: str, field: str, call: Callable[[Bucket], Awaitable[object]]
) -> None:
    # A store (or a middlebox) that answers 200 without the field: not a
    # KeyError from deep inside the adapter.
    def drop(parsed: dict[str, Any], **_: Any) -> None:
        parsed.pop(field, None)

    bucket._client.meta.events.register(f"after-call.s3.{operation}", drop)
    with pytest.raises(BucketUnavailable, match=f"the store's answer has no {field}"):
        await call(bucket)
