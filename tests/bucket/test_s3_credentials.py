"""Credentials from the standard chain, read again after a refusal (issue 26, item 2).

Against moto with authentication enforced (``tests/_moto_auth.py``): the
bucket has no keys in its config, so botocore's chain finds them in the
shared credentials and config files the test points to. A key revoked and
replaced in the file works at the next request, without reopening the
bucket; a profile that is missing at open does not fail the open; a
``credential_process`` that hands out credentials already expired is a
refusal (``AccessDenied``), not botocore's bare ``RuntimeError``.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _bucket_support import make_s3_config
from _moto_auth import AuthMoto, credentials_env, write_credentials

from edge_gateway.bucket import AccessDenied, S3Bucket
from edge_gateway.errors import Unavailable


def _chain_config(moto: AuthMoto, bucket: str, **overrides: object) -> object:
    # No keys: the standard chain (here: the files of credentials_env).
    return make_s3_config(
        moto.endpoint, bucket, access_key=None, secret_key=None, max_attempts=1, **overrides
    )


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point this process's credential chain at the test's files (empty for now)."""
    for name, value in credentials_env(tmp_path / "aws").items():
        monkeypatch.setenv(name, value)
    return tmp_path / "aws"


async def test_a_key_rotated_in_the_credentials_file_works_at_the_next_request(
    moto_auth: AuthMoto, files: Path
) -> None:
    user = moto_auth.user()
    first = user.new_key()
    write_credentials(files / "credentials", first)
    config = _chain_config(moto_auth, moto_auth.bucket())
    async with await S3Bucket.open(config) as bucket:  # type: ignore[arg-type]
        await bucket.put("a", b"1", if_none_match=True)

        user.revoke(first[0])
        with pytest.raises(AccessDenied) as refused:
            await bucket.put("b", b"2", if_none_match=True)
        # Still refused (the file still holds the revoked key), read again each time.
        with pytest.raises(AccessDenied):
            await bucket.get("a")

        write_credentials(files / "credentials", user.new_key())
        await bucket.put("b", b"2", if_none_match=True)  # the same bucket object
        assert (await bucket.get("a")).data == b"1"
        assert bucket.client_builds == 3  # after each refusal, one new client
        assert refused.value.code == "InvalidAccessKeyId"
        assert isinstance(refused.value, Unavailable)  # retried by the callers


async def test_a_planned_rotation_is_seamless(moto_auth: AuthMoto, files: Path) -> None:
    # The procedure of docs/operations.md: new key into the file, then the old
    # one revoked. The first request refused with the old key is sent again
    # at once with the new one: the caller never sees a refusal.
    user = moto_auth.user()
    old = user.new_key()
    write_credentials(files / "credentials", old)
    config = _chain_config(moto_auth, moto_auth.bucket())
    async with await S3Bucket.open(config) as bucket:  # type: ignore[arg-type]
        await bucket.put("a", b"1", if_none_match=True)
        write_credentials(files / "credentials", user.new_key())
        user.revoke(old[0])
        await bucket.put("b", b"2", if_none_match=True)
        assert (await bucket.get("b")).data == b"2"
        assert bucket.client_builds == 1
        assert bucket.statistics().errors == 0


async def test_keys_in_the_config_are_not_read_again(moto_auth: AuthMoto, files: Path) -> None:
    # Keys written in the config cannot change under a running gateway:
    # refused, it says what to do and does not rebuild for nothing.
    user = moto_auth.user()
    key = user.new_key()
    config = make_s3_config(
        moto_auth.endpoint, moto_auth.bucket(), access_key=key[0], secret_key=key[1]
    )
    async with await S3Bucket.open(config) as bucket:
        await bucket.put("a", b"1")
        user.revoke(key[0])
        write_credentials(files / "credentials", user.new_key())  # not looked at
        for _ in range(2):
            with pytest.raises(AccessDenied, match="InvalidAccessKeyId"):
                await bucket.put("a", b"1")
        assert bucket.client_builds == 0


async def test_a_missing_profile_does_not_fail_the_open(moto_auth: AuthMoto, files: Path) -> None:
    # Before: ConfigError at open, so a gateway whose credentials file was
    # being replaced exited 2 and crash-looped. Now each request tries again.
    user = moto_auth.user()
    config = _chain_config(moto_auth, moto_auth.bucket(), profile="site")
    async with await S3Bucket.open(config) as bucket:  # type: ignore[arg-type]
        with pytest.raises(AccessDenied) as excinfo:
            await bucket.put("a", b"1")
        assert excinfo.value.code == "ProfileNotFound"
        key = user.new_key()
        (files / "credentials").write_text(
            f"[site]\naws_access_key_id = {key[0]}\naws_secret_access_key = {key[1]}\n"
        )
        await bucket.put("a", b"1")
        assert (await bucket.get("a")).data == b"1"


async def test_credentials_that_come_expired_are_a_refusal(
    moto_auth: AuthMoto, files: Path, tmp_path: Path
) -> None:
    # A credential source (or this machine's clock) that is off: botocore
    # raises a bare RuntimeError, which escaped the adapter before.
    user = moto_auth.user()
    key = user.new_key()
    doc = {
        "Version": 1,
        "AccessKeyId": key[0],
        "SecretAccessKey": key[1],
        "SessionToken": "",
        "Expiration": (datetime.now(UTC) - timedelta(hours=1)).isoformat(),
    }
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps(doc))
    (files / "config").write_text(
        f"[default]\ncredential_process = {sys.executable} -c "
        f"\"import sys; sys.stdout.write(open('{answer}').read())\"\n"
    )
    config = _chain_config(moto_auth, moto_auth.bucket())
    async with await S3Bucket.open(config) as bucket:  # type: ignore[arg-type]
        with pytest.raises(AccessDenied) as excinfo:
            await bucket.put("a", b"1")
        assert excinfo.value.code == "CredentialsExpired"
        assert "clock" in excinfo.value.action
        # The source is fixed: credentials valid for an hour.
        doc["Expiration"] = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        answer.write_text(json.dumps(doc))
        await bucket.put("a", b"1")
