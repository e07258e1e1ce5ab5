"""S3Bucket specifics, against moto's server over HTTP."""

from __future__ import annotations

import os
import threading
import uuid
from typing import TYPE_CHECKING, Any

import botocore.exceptions
import pytest
import trio
from _bucket_support import MIB, make_s3_config

from edge_gateway.bucket import (
    AccessDenied,
    BucketUnavailable,
    NoSuchBucket,
    NotFound,
    PreconditionFailed,
    S3Bucket,
    S3Config,
    verify_conditional_create,
)
from edge_gateway.errors import ConfigError
from edge_gateway.testing.ports import free_port

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client


async def test_connection_refused_is_unavailable_and_quick() -> None:
    # Nothing listens on the port: connect fails at once, and with one
    # attempt and short timeouts the bucket reports it within a second or two.
    config = make_s3_config(
        f"http://127.0.0.1:{free_port()}",
        "edgegw-nowhere",
        connect_timeout=0.5,
        read_timeout=0.5,
        max_attempts=1,
    )
    async with await S3Bucket.open(config) as bucket:
        with trio.fail_after(5):
            start = trio.current_time()
            with pytest.raises(BucketUnavailable) as excinfo:
                await bucket.put("log/1", b"x", if_none_match=True)
            with pytest.raises(BucketUnavailable):
                await bucket.get("log/1")
        assert trio.current_time() - start < 3
        assert "edgegw-nowhere" in str(excinfo.value)
        assert bucket.statistics().unavailable == 2


async def test_missing_bucket_is_refused_until_it_exists(
    moto_endpoint: str, s3_admin: S3Client
) -> None:
    # Issue 26: not a ConfigError (fatal to a gateway) but a refusal that is
    # retried: once someone creates the bucket, the same bucket object works.
    name = f"edgegw-later-{uuid.uuid4().hex[:12]}"
    config = make_s3_config(moto_endpoint, name)
    async with await S3Bucket.open(config) as bucket:
        with pytest.raises(AccessDenied, match="does not exist") as excinfo:
            await bucket.put("k", b"v")
        assert excinfo.value.code == "NoSuchBucket"
        assert "create the bucket" in excinfo.value.action
        with pytest.raises(AccessDenied):
            await verify_conditional_create(bucket)
        s3_admin.create_bucket(Bucket=name)
        await verify_conditional_create(bucket)
        await bucket.put("k", b"v")
        assert bucket.client_builds == 0  # new credentials cannot help a missing bucket


async def test_prefix_isolates_and_is_stripped(
    moto_endpoint: str, s3_bucket_name: str, s3_admin: S3Client
) -> None:
    a_config = make_s3_config(moto_endpoint, s3_bucket_name, prefix="site-a")
    b_config = make_s3_config(moto_endpoint, s3_bucket_name, prefix="site-b/")
    async with await S3Bucket.open(a_config) as a, await S3Bucket.open(b_config) as b:
        await a.put("regions/r1/log/1", b"a")
        await b.put("regions/r1/log/1", b"b")
        assert [i.key for i in await a.list("regions/")] == ["regions/r1/log/1"]
        assert (await b.get("regions/r1/log/1")).data == b"b"
        assert a.name == f"s3://{s3_bucket_name}/site-a/"
        assert "site-a/" in a.describe()
        assert moto_endpoint in a.describe()
    stored = s3_admin.list_objects_v2(Bucket=s3_bucket_name)["Contents"]
    assert sorted(o["Key"] for o in stored) == [
        "site-a/regions/r1/log/1",
        "site-b/regions/r1/log/1",
    ]


async def test_multipart_upload_is_used_and_cleaned_up(
    s3_config: S3Config, s3_admin: S3Client
) -> None:
    data = os.urandom(11 * MIB)
    async with await S3Bucket.open(s3_config) as bucket:
        info = await bucket.put("log/big", data, if_none_match=True)
        # S3's ETag of a multipart object ends in "-<parts>".
        assert info.etag.endswith('-3"')
        with pytest.raises(PreconditionFailed):
            await bucket.put("log/big", data, if_none_match=True)
        assert bucket.statistics().puts == 2
    # The refused upload was aborted, not left behind to be billed.
    uploads = s3_admin.list_multipart_uploads(Bucket=s3_config.bucket)
    assert uploads.get("Uploads", []) == []


async def test_failed_part_aborts_upload_and_raises_one_error(
    s3_config: S3Config, s3_admin: S3Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await S3Bucket.open(s3_config) as bucket:
        # Break one part on our side of the wire; every other request still
        # goes to the server.
        real_upload_part = bucket._client.upload_part

        def upload_part(**kwargs: Any) -> Any:
            if kwargs["PartNumber"] == 2:
                raise botocore.exceptions.EndpointConnectionError(endpoint_url="http://x")
            return real_upload_part(**kwargs)

        monkeypatch.setattr(bucket._client, "upload_part", upload_part)
        with pytest.raises(BucketUnavailable, match="EndpointConnectionError"):
            await bucket.put("log/big", os.urandom(11 * MIB), if_none_match=True)
        with pytest.raises(NotFound):
            await bucket.head("log/big")
    assert s3_admin.list_multipart_uploads(Bucket=s3_config.bucket).get("Uploads", []) == []


async def test_cancelled_upload_is_aborted(s3_config: S3Config, s3_admin: S3Client) -> None:
    data = os.urandom(11 * MIB)
    async with await S3Bucket.open(s3_config) as bucket:
        with trio.move_on_after(0.05):
            await bucket.put("log/big", data, if_none_match=True)
        try:
            got = await bucket.get("log/big")
        except NotFound:
            pass
        else:  # the machine was fast enough to finish: then all of it
            assert got.data == data
    assert s3_admin.list_multipart_uploads(Bucket=s3_config.bucket).get("Uploads", []) == []


async def test_abort_incomplete_uploads_under_a_prefix(
    s3_config: S3Config, s3_admin: S3Client
) -> None:
    # What a process killed between its parts and the completion leaves: an
    # upload with parts and no object. Only those under the prefix go.
    keys = ["regions/r1/log/7.egw", "regions/r1/log/8.egw", "regions/r2/log/7.egw"]
    for key in keys:
        full_key = s3_config.key_prefix + key
        upload = s3_admin.create_multipart_upload(Bucket=s3_config.bucket, Key=full_key)
        s3_admin.upload_part(
            Bucket=s3_config.bucket,
            Key=full_key,
            UploadId=upload["UploadId"],
            PartNumber=1,
            Body=b"a part",
        )
    async with await S3Bucket.open(s3_config) as bucket:
        await bucket.put("regions/r1/log/1.egw", b"committed")
        assert await bucket.abort_incomplete_uploads("regions/r1/log/") == 2
        assert await bucket.abort_incomplete_uploads("regions/r1/log/") == 0
        assert (await bucket.get("regions/r1/log/1.egw")).data == b"committed"
        assert bucket.statistics().lists == 2
        for key in keys[:2]:
            with pytest.raises(NotFound):
                await bucket.head(key)
    uploads = s3_admin.list_multipart_uploads(Bucket=s3_config.bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads] == [s3_config.key_prefix + keys[2]]


async def test_part_concurrency_bounds_the_parts_in_flight(
    moto_endpoint: str, s3_bucket_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_s3_config(moto_endpoint, s3_bucket_name, part_concurrency=2)
    data = os.urandom(16 * MIB)  # 4 parts of 5 MiB (the last 1 MiB)
    in_flight: list[int] = []
    lock = threading.Lock()
    # The first two parts wait for each other: both in flight at once.
    meet = threading.Barrier(2, timeout=30)
    async with await S3Bucket.open(config) as bucket:
        real_upload_part = bucket._client.upload_part

        def upload_part(**kwargs: Any) -> Any:
            with lock:
                in_flight.append(in_flight[-1] + 1 if in_flight else 1)
            try:
                # (Not the store probe's one-part upload, which comes first.)
                if kwargs["Key"].endswith("log/big") and kwargs["PartNumber"] <= 2:
                    meet.wait()
                return real_upload_part(**kwargs)
            finally:
                with lock:
                    in_flight.append(in_flight[-1] - 1)

        monkeypatch.setattr(bucket._client, "upload_part", upload_part)
        await bucket.put("log/big", data, if_none_match=True)
        assert (await bucket.get("log/big")).data == data
    assert max(in_flight) == 2
    assert in_flight[-1] == 0


async def test_if_match_on_large_object_uses_single_put(s3_config: S3Config) -> None:
    data = os.urandom(6 * MIB)
    async with await S3Bucket.open(s3_config) as bucket:
        first = await bucket.put("state", data)
        assert first.etag.endswith('-2"')
        second = await bucket.put("state", data[::-1], if_match=first.etag)
        assert "-" not in second.etag  # a single PUT
        with pytest.raises(PreconditionFailed):
            await bucket.put("state", data, if_match=first.etag)
        with pytest.raises(NotFound):
            await bucket.put("absent", data, if_match=first.etag)


async def test_checksums_when_required_mode(moto_endpoint: str, s3_bucket_name: str) -> None:
    config = make_s3_config(moto_endpoint, s3_bucket_name, checksums="when_required")
    data = os.urandom(5 * MIB + 1)
    async with await S3Bucket.open(config) as bucket:
        await bucket.put("big", data, if_none_match=True)
        await bucket.put("small", b"x", if_none_match=True)
        assert (await bucket.get("big")).data == data
        await verify_conditional_create(bucket)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"bucket": "ab"}, "bucket"),
        ({"bucket": "a/b"}, "bucket"),
        ({"prefix": "/abs"}, "prefix"),
        ({"prefix": "a//b"}, "prefix"),
        ({"part_size": 4 * MIB}, "part_size"),
        ({"multipart_threshold": MIB}, "multipart_threshold"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"retry_mode": "legacy"}, "retry_mode"),
        ({"checksums": "always"}, "checksums"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"endpoint_url": "127.0.0.1:9000"}, "endpoint_url"),
        ({"secret_key": None}, "access_key"),
        ({"list_page_size": 1001}, "list_page_size"),
        ({"max_attempts": "5"}, "max_attempts"),
        ({"path_style": "yes"}, "path_style"),
        ({"max_concurrency": True}, "max_concurrency"),
        ({"region": 1}, "region"),
    ],
)
def test_config_errors_name_the_key(overrides: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        make_s3_config("http://127.0.0.1:1", **{"bucket": "edgegw-config", **overrides})


def test_config_from_mapping() -> None:
    config = S3Config.from_mapping({"bucket": "edgegw", "prefix": "prod", "path_style": True})
    assert config.key_prefix == "prod/"
    assert config.multipart_threshold == 16 * MIB
    with pytest.raises(ConfigError, match="unknown bucket config keys"):
        S3Config.from_mapping({"bucket": "edgegw", "endpoint": "http://x"})
    with pytest.raises(ConfigError, match="required"):
        S3Config.from_mapping({"prefix": "p"})
    assert "secret" not in repr(S3Config(bucket="edgegw", access_key="AK", secret_key="secret"))


def test_config_covers_every_field() -> None:
    # Each config key has a type check (the table must follow new fields).
    from edge_gateway.bucket._s3config import _FIELD_TYPES

    assert set(_FIELD_TYPES) == set(S3Config.__dataclass_fields__)


async def test_check_exists_names_a_bucket_that_does_not_exist(
    moto_endpoint: str, s3_bucket_name: str
) -> None:
    async with await S3Bucket.open(make_s3_config(moto_endpoint, s3_bucket_name)) as bucket:
        await bucket.check_exists()  # there, and empty: fine
    missing = make_s3_config(moto_endpoint, "edgegw-no-such-bucket", prefix="p/")
    async with await S3Bucket.open(missing) as bucket:
        with pytest.raises(NoSuchBucket, match=r"'edgegw-no-such-bucket'.*no such bucket"):
            await bucket.check_exists()
