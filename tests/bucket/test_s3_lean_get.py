"""The S3 backend's lean GET path (``lean_get``, issue 42) against the real moto server.

The lean path must be invisible to callers: the same bytes and metadata as
botocore's call, the same errors (a missing key, refused credentials), the
same statistics; any answer it does not take as a success, and any failure
of its transport (a reset mid-body, a body cut short, a checksum that does
not match), goes through botocore's call. And it must really be used: these
tests fail if a botocore upgrade takes away what it needs (then every GET
would silently go the slow way).
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import botocore.credentials
import botocore.session
import pytest
import urllib3.exceptions
import urllib3.response
from _bucket_support import make_s3_config
from _moto_auth import AuthMoto

from edge_gateway.bucket import AccessDenied, NotFound, S3Bucket, S3Config
from edge_gateway.bucket._s3lean import LeanGet
from edge_gateway.testing.ports import free_port
from edge_gateway.testing.tls import make_tls_files

BODY = os.urandom(110_000)


@pytest.fixture
async def lean(moto_endpoint: str, s3_bucket_name: str) -> AsyncIterator[S3Bucket]:
    config = make_s3_config(moto_endpoint, s3_bucket_name, prefix="p/", max_attempts=1)
    async with await S3Bucket.open(config) as bucket:
        await bucket.put("obj", BODY)
        await bucket.get("obj")  # the first GET goes through botocore: the shape is learned
        yield bucket


@pytest.fixture
async def plain(moto_endpoint: str, s3_bucket_name: str) -> AsyncIterator[S3Bucket]:
    """The same bucket with every GET through botocore (the path before)."""
    config = make_s3_config(
        moto_endpoint, s3_bucket_name, prefix="p/", max_attempts=1, lean_get=False
    )
    async with await S3Bucket.open(config) as bucket:
        yield bucket


def _lean(bucket: S3Bucket) -> LeanGet:
    assert bucket.lean_get is not None, "no lean GET path (did botocore change?)"
    return bucket.lean_get


async def test_the_lean_path_is_used_and_returns_what_botocore_returns(
    lean: S3Bucket, plain: S3Bucket
) -> None:
    path = _lean(lean)
    assert path.ready
    assert plain.lean_get is None
    await lean.put("empty", b"")
    await lean.put("odd key/ü +%~!.txt", b"x" * 10)
    reads: list[tuple[str, int | None, int | None]] = [
        ("obj", None, None),
        ("obj", 10, 20),
        ("obj", 109_990, None),
        ("obj", 5, 200_000),  # past the end: what there is
        ("obj", 200_000, None),  # 416: an empty read, a HEAD for the size
        ("empty", None, None),
        ("odd key/ü +%~!.txt", None, None),
        ("odd key/ü +%~!.txt", 3, 4),
    ]
    before = path.lean
    for key, start, end in reads:
        got = await lean.get(key, start=start, end=end)
        want = await plain.get(key, start=start, end=end)
        assert got == want, (key, start, end)
        assert got.data == want.data
    assert (await lean.get("obj")).data == BODY
    # Every read but the 416 (botocore's ClientError, then a HEAD) answered
    # lean, and so did the last whole GET.
    assert path.lean - before == len(reads)
    assert path.fallbacks == 0


async def test_a_missing_key_raises_the_same_error_without_a_second_request(
    lean: S3Bucket, plain: S3Bucket, moto_server: Any
) -> None:
    mark = moto_server.log_position()
    with pytest.raises(NotFound) as lean_error:
        await lean.get("missing")
    requests = [r for r in moto_server.requests(since=mark) if r.key.endswith("missing")]
    with pytest.raises(NotFound) as plain_error:
        await plain.get("missing")
    assert str(lean_error.value) == str(plain_error.value)
    # Each client has its own modeled exception classes: the same name.
    assert type(lean_error.value.__cause__).__name__ == "NoSuchKey"
    assert type(plain_error.value.__cause__).__name__ == "NoSuchKey"
    assert len(requests) == 1  # a poll for an object not there yet costs one GET, as before
    assert _lean(lean).fallbacks == 0


async def test_statistics_count_lean_gets(lean: S3Bucket) -> None:
    before = lean.statistics()
    for _ in range(3):
        await lean.get("obj", start=0, end=1000)
    after = lean.statistics()
    assert after.gets == before.gets + 3
    assert after.bytes_read == before.bytes_read + 3000
    assert after.errors == before.errors


class _BodyFault:
    """Spoils the next body read of any answer (both paths read through urllib3)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed: Callable[[urllib3.response.HTTPResponse, bytes], bytes] | None = None
        real = urllib3.response.HTTPResponse.read

        def read(response: urllib3.response.HTTPResponse, *args: Any, **kwargs: Any) -> bytes:
            data: bytes = real(response, *args, **kwargs)
            spoil, self.armed = self.armed, None
            return data if spoil is None or not data else spoil(response, data)

        monkeypatch.setattr(urllib3.response.HTTPResponse, "read", read)


def _reset(response: urllib3.response.HTTPResponse, data: bytes) -> bytes:
    response.close()
    raise urllib3.exceptions.ProtocolError(
        "Connection broken", ConnectionResetError(104, "Connection reset by peer")
    )


@pytest.mark.parametrize(
    ("fault", "spoil"),
    [
        ("connection reset mid-body", _reset),
        ("body cut short", lambda response, data: data[:-1]),
        (
            "a flipped byte (the store's CRC32 no longer matches)",
            lambda response, data: bytes([data[0] ^ 1]) + data[1:],
        ),
    ],
)
async def test_a_spoiled_answer_falls_back_to_botocore(
    lean: S3Bucket, monkeypatch: pytest.MonkeyPatch, fault: str, spoil: Any
) -> None:
    faults = _BodyFault(monkeypatch)
    path = _lean(lean)
    before = lean.statistics()
    faults.armed = spoil
    got = await lean.get("obj")
    assert got.data == BODY, fault
    assert faults.armed is None, "the fault was not injected"
    assert path.fallbacks == 1, fault
    after = lean.statistics()
    assert (after.gets, after.errors) == (before.gets + 1, before.errors)


async def test_checksums_are_checked_as_botocore_checks_them(lean: S3Bucket) -> None:
    # boto3 sent a CRC32 with the PUT (checksums = "when_supported") and asks
    # for it back on GET (x-amz-checksum-mode): the lean path does the same.
    path = _lean(lean)
    shape = path._shape
    assert shape is not None
    assert ("x-amz-checksum-mode", "ENABLED") in shape.headers
    assert "crc32" in shape.checksums


async def test_without_checksums_none_are_asked_for(
    moto_endpoint: str, s3_bucket_name: str
) -> None:
    config = make_s3_config(moto_endpoint, s3_bucket_name, checksums="when_required")
    async with await S3Bucket.open(config) as bucket:
        await bucket.put("k", b"data")
        await bucket.get("k")
        assert (await bucket.get("k")).data == b"data"
        shape = _lean(bucket)._shape
        assert shape is not None
        assert shape.checksums == ()
        assert all(name.lower() != "x-amz-checksum-mode" for name, _ in shape.headers)
        assert _lean(bucket).lean == 1


async def test_refused_credentials_go_through_botocore(moto_auth: AuthMoto) -> None:
    user = moto_auth.user()
    key = user.new_key()
    config = make_s3_config(
        moto_auth.endpoint, moto_auth.bucket(), access_key=key[0], secret_key=key[1]
    )
    async with await S3Bucket.open(config) as bucket:
        await bucket.put("a", b"1")
        await bucket.get("a")
        assert (await bucket.get("a")).data == b"1"
        path = _lean(bucket)
        assert path.lean == 1  # moto checked the lean path's signature
        user.revoke(key[0])
        with pytest.raises(AccessDenied) as refused:
            await bucket.get("a")
        assert refused.value.code == "InvalidAccessKeyId"
        assert path.fallbacks == 1  # the 403 was botocore's to raise


async def test_refreshed_credentials_are_used_at_the_next_get(moto_auth: AuthMoto) -> None:
    # Temporary credentials that the chain refreshes: the lean path reads the
    # client's credentials at every request, so it signs with the new ones.
    user = moto_auth.user()
    current = {"key": user.new_key()}

    def refresh() -> dict[str, str]:
        access, secret = current["key"]
        expiry = datetime.now(UTC) + timedelta(minutes=10)  # inside the refresh window
        return {
            "access_key": access,
            "secret_key": secret,
            "token": "",
            "expiry_time": expiry.isoformat(),
        }

    session = botocore.session.Session()
    session._credentials = botocore.credentials.RefreshableCredentials.create_from_metadata(  # type: ignore[attr-defined]
        refresh(), refresh, "test"
    )
    config = make_s3_config(
        moto_auth.endpoint, moto_auth.bucket(), access_key=None, secret_key=None, max_attempts=1
    )
    client = session.create_client(
        "s3",
        endpoint_url=config.endpoint_url,
        region_name=config.region,
        config=botocore.config.Config(s3={"addressing_style": "path"}),
    )
    async with S3Bucket(config, client) as bucket:  # type: ignore[arg-type]
        await bucket.put("a", b"1")
        await bucket.get("a")
        old = current["key"]
        current["key"] = user.new_key()
        user.revoke(old[0])
        assert (await bucket.get("a")).data == b"1"
        path = _lean(bucket)
        assert (path.lean, path.fallbacks) == (1, 0)


async def test_lean_get_off_is_botocore_only(plain: S3Bucket) -> None:
    await plain.put("k", b"v")
    assert (await plain.get("k")).data == b"v"
    assert plain.lean_get is None
    assert S3Config.from_mapping({"bucket": "bkt", "lean_get": False}).lean_get is False


def test_a_get_may_take_one_lean_attempt_more() -> None:
    # The lean attempt on a silent store, then botocore's attempts.
    assert S3Config(bucket="edgegw").max_get_seconds == 51 + 5 + 10
    assert S3Config(bucket="edgegw", lean_get=False).max_get_seconds == 51


# -- TLS ------------------------------------------------------------------------


def _wait_tls(port: int, ca: Path, process: subprocess.Popen[bytes]) -> None:
    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto with TLS exited: {process.returncode}")
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=1) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1"),
            ):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("moto with TLS did not answer")


@pytest.fixture(scope="module")
def tls_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``(https endpoint, the CA that verifies it)`` of a moto server with TLS."""
    root = tmp_path_factory.mktemp("tls-moto")
    files = make_tls_files(root, names=("127.0.0.1", "localhost"))
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    argv += ["-s", "-c", str(files.cert), "-k", str(files.key)]
    with (root / "moto.log").open("ab") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        _wait_tls(port, files.ca, process)
        yield f"https://127.0.0.1:{port}", files.ca
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_tls_the_lean_path_verifies_with_the_clients_ca_bundle(
    tls_moto: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # TLS settings come from the environment (AWS_CA_BUNDLE here), as
    # botocore reads them; the lean path sends on the client's own session,
    # so it verifies the same way.
    endpoint, ca = tls_moto
    monkeypatch.setenv("AWS_CA_BUNDLE", str(ca))
    config = make_s3_config(endpoint, "edgegw-tls-lean", max_attempts=1)
    async with await S3Bucket.open(config) as bucket:
        bucket._client.create_bucket(Bucket="edgegw-tls-lean")
        await bucket.put("k", BODY)
        await bucket.get("k")
        assert (await bucket.get("k")).data == BODY
        path = _lean(bucket)
        assert path._shape is not None
        assert path._shape.base.startswith("https://")
        assert (path.lean, path.fallbacks) == (1, 0)
