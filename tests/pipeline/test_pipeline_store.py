"""The pipeline's S3 reader over a link that breaks in the middle of a body (moto, TCP proxy).

botocore retries a request that fails; a body that breaks off after the
answer came is the reader's to retry. No Spark here.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

import pytest

from edge_gateway.errors import Unavailable
from edge_gateway.pipeline._store import BucketSpec
from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY
from edge_gateway.testing.tcpproxy import ProxyMode, TcpProxy

if TYPE_CHECKING:  # typing stubs: the dev extra, not needed to run the tests
    from mypy_boto3_s3.client import S3Client


def _spec(bucket: str, proxy: TcpProxy) -> BucketSpec:
    return BucketSpec(
        f"s3://{bucket}",
        endpoint_url=proxy.url,
        region=REGION,
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
    )


def _wait_stalled(proxy: TcpProxy, status: int) -> None:
    deadline = time.monotonic() + 30
    while proxy.statistics().stalled.get(status, 0) < 1:
        assert time.monotonic() < deadline, "the answer never stalled"
        time.sleep(0.02)


def test_a_body_that_breaks_off_is_read_again(
    moto_endpoint: str, s3_admin: S3Client, s3_bucket_name: str
) -> None:
    data = os.urandom(1 << 20)
    s3_admin.put_object(Bucket=s3_bucket_name, Key="obj", Body=data)
    with TcpProxy("127.0.0.1", int(moto_endpoint.rsplit(":", 1)[1])) as proxy:
        reader = _spec(s3_bucket_name, proxy).open()
        got: list[tuple[bytes, int]] = []
        errors: list[BaseException] = []

        def read() -> None:
            try:
                got.append(reader.get("obj", 0, len(data)))
            except BaseException as exc:
                errors.append(exc)

        proxy.set_mode(ProxyMode.STALL_BODY)
        t = threading.Thread(target=read, daemon=True)
        t.start()
        _wait_stalled(proxy, 206)
        proxy.set_mode(ProxyMode.RESET)  # the link dies mid-body
        proxy.set_mode(ProxyMode.PASS)
        t.join(timeout=60)
        assert not t.is_alive()
        assert errors == []
        assert got == [(data, len(data))]


def test_a_body_that_always_breaks_off_is_unavailable_not_a_crash(
    moto_endpoint: str, s3_admin: S3Client, s3_bucket_name: str
) -> None:
    s3_admin.put_object(Bucket=s3_bucket_name, Key="obj", Body=os.urandom(1 << 20))
    with TcpProxy("127.0.0.1", int(moto_endpoint.rsplit(":", 1)[1])) as proxy:
        reader = _spec(s3_bucket_name, proxy).open()
        errors: list[BaseException] = []
        stop = threading.Event()

        def read() -> None:
            try:
                reader.get("obj")
            except BaseException as exc:
                errors.append(exc)
            finally:
                stop.set()

        def break_bodies() -> None:
            # Every answer stalls half way, then its connection is reset.
            while not stop.is_set():
                proxy.set_mode(ProxyMode.STALL_BODY)
                before = proxy.statistics().stalled.get(206, 0)
                deadline = time.monotonic() + 30
                while proxy.statistics().stalled.get(206, 0) == before and not stop.is_set():
                    if time.monotonic() > deadline:
                        return
                    time.sleep(0.02)
                proxy.set_mode(ProxyMode.RESET)

        breaker = threading.Thread(target=break_bodies, daemon=True)
        t = threading.Thread(target=read, daemon=True)
        breaker.start()
        time.sleep(0.05)
        t.start()
        t.join(timeout=120)
        stop.set()
        breaker.join(timeout=30)
        assert not t.is_alive()
        assert len(errors) == 1
        with pytest.raises(Unavailable, match="obj"):
            raise errors[0]
