"""The pipeline's way to the bucket: ``BucketSpec`` -> the bucket package's ``SyncBucket``.

The pipeline has no bucket code of its own: it reads through
:class:`~edge_gateway.bucket.SyncBucket`, a blocking facade over the same
backends as the gateway, opened from a picklable config in each process
(the driver, every Spark worker). The facade runs here against each store the
pipeline supports (a local directory, S3 on moto's server, GCS on its
emulator, Azure Blob on Azurite), in this process and in a fresh one that gets
only the pickled config, as an executor does.

botocore retries a request that fails; a body that breaks off after the
answer came is the reader's to retry (over a TCP proxy that breaks it). No
Spark here.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from edge_gateway.bucket import (
    AzureConfig,
    GcsConfig,
    LocalConfig,
    NoSuchBucket,
    NotFound,
    StoreConfig,
    SyncBucket,
)
from edge_gateway.errors import ClosedError, Unavailable
from edge_gateway.pipeline.bucketspec import READ_ATTEMPTS, BucketSpec
from edge_gateway.testing import emulators
from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY
from edge_gateway.testing.tcpproxy import ProxyMode, TcpProxy

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client


@pytest.fixture(params=["local", "s3", "gcs-emulator", "azure"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreConfig:
    """A fresh, empty bucket of each store, by its config (what travels to executors)."""
    if request.param == "local":
        return LocalConfig(tmp_path / "bucket", create=True)
    if request.param == "s3":
        spec = BucketSpec(
            f"s3://{request.getfixturevalue('s3_bucket_name')}/some/prefix",
            endpoint_url=request.getfixturevalue("moto_endpoint"),
            region=REGION,
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
        )
        return spec.config()
    if request.param == "gcs-emulator":
        return GcsConfig(
            bucket=request.getfixturevalue("gcs_bucket_name"),
            prefix="edgegw/",
            endpoint_url=request.getfixturevalue("gcs_emulator_endpoint"),
            anonymous=True,
        )
    endpoint = request.getfixturevalue("azurite_endpoint")
    return AzureConfig(
        container=request.getfixturevalue("azure_container_name"),
        prefix="edgegw/",
        connection_string=emulators.azurite_connection_string(endpoint),
    )


def _read_all(config: StoreConfig) -> dict[str, bytes]:
    """What an executor does: open the bucket from its config and read (a child process)."""
    with SyncBucket.open(config) as bucket:
        return {o.key: bucket.get(o.key).data for o in bucket.list("regions/")}


def test_the_facade_reads_and_writes_every_store(store: StoreConfig) -> None:
    data = os.urandom(3000)
    with SyncBucket.open(store) as bucket:
        bucket.put("regions/north/log/1", data, if_none_match=True)
        bucket.put("regions/south/log/1", b"south")
        got = bucket.get("regions/north/log/1", start=100, end=200)
        assert (got.data, got.start, got.size) == (data[100:200], 100, 3000)
        assert bucket.get("regions/north/log/1", start=2990).data == data[2990:]
        assert [o.key for o in bucket.list("regions/")] == [
            "regions/north/log/1",
            "regions/south/log/1",
        ]
        assert bucket.head("regions/south/log/1").size == 5
        assert bucket.exists("regions/north/log/1")
        assert not bucket.exists("regions/north/log/2")
        with pytest.raises(NotFound):
            bucket.get("regions/north/log/2")
        stats = bucket.statistics()
        assert (stats.puts, stats.gets, stats.not_found) == (2, 3, 2)
    assert bucket.closed
    with pytest.raises(ClosedError):
        bucket.get("regions/north/log/1")
    # An executor gets the pickled config, never the open bucket.
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(bucket)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        seen = pool.apply(_read_all, (pickle.loads(pickle.dumps(store)),))
    assert seen == {"regions/north/log/1": data, "regions/south/log/1": b"south"}


def test_calls_from_many_threads_share_one_open_bucket(tmp_path: Path) -> None:
    with SyncBucket.open(LocalConfig(tmp_path, create=True)) as bucket:
        for i in range(8):
            bucket.put(f"k/{i}", bytes([i]) * 1000)
        results: dict[int, bytes] = {}

        def read(i: int) -> None:
            for _ in range(20):
                results[i] = bucket.get(f"k/{i}", start=10, end=20).data

        threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert results == {i: bytes([i]) * 10 for i in range(8)}
        assert bucket.statistics().gets == 160


def test_a_missing_local_bucket_fails_the_open_and_leaves_no_thread(tmp_path: Path) -> None:
    before = threading.active_count()
    with pytest.raises(NoSuchBucket):
        BucketSpec(str(tmp_path / "no-such-bucket")).open()
    assert threading.active_count() == before
    assert not (tmp_path / "no-such-bucket").exists()


def test_a_spec_is_the_bucket_config_and_survives_options_and_pickling() -> None:
    spec = BucketSpec(
        "s3://data-lake/edge/",
        endpoint_url="http://127.0.0.1:9000",
        access_key="a",
        secret_key="s",
    )
    config = spec.config()
    assert (config.bucket, config.key_prefix, config.path_style) == ("data-lake", "edge/", True)
    assert (config.access_key, config.secret_key, config.region) == ("a", "s", "us-east-1")
    assert BucketSpec.from_options(spec.to_options()) == spec
    assert pickle.loads(pickle.dumps(spec)).config() == config
    assert not BucketSpec("s3://data-lake").config().path_style  # AWS: botocore chooses
    assert BucketSpec("file:///mnt/bucket").config() == LocalConfig(Path("/mnt/bucket"))


def _spec(bucket: str, proxy: TcpProxy) -> BucketSpec:
    # What the CLI builds from its flags; open() gives the pipeline's SyncBucket.
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
                result = reader.get("obj", start=0, end=len(data))
                got.append((result.data, result.size))
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
        stats = reader.statistics()
        reader.close()
        assert errors == []
        assert got == [(data, len(data))]
        # the facade read it again: one GET broke off, the next one came whole
        assert (stats.gets, stats.unavailable) == (2, 1)


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
                reader.get("obj", start=1)  # ranged: the answer is a 206
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
        stats = reader.statistics()
        reader.close()
        assert len(errors) == 1
        with pytest.raises(Unavailable, match="obj"):
            raise errors[0]
        assert (stats.gets, stats.unavailable) == (READ_ATTEMPTS, READ_ATTEMPTS)


def test_a_spec_shares_one_open_bucket_per_process(tmp_path: Path) -> None:
    with SyncBucket.open(LocalConfig(tmp_path, create=True)) as setup:
        setup.put("k", b"v")
    spec = BucketSpec(str(tmp_path))
    shared = spec.shared()
    # An equal spec (as a task unpickled on a reused worker carries) finds it too.
    assert pickle.loads(pickle.dumps(spec)).shared() is shared
    assert shared.get("k").data == b"v"
    shared.close()  # closed by mistake: the next user gets a new one
    again = spec.shared()
    assert again is not shared
    assert again.get("k").data == b"v"
