"""moto's S3 server with authentication enforced, and IAM users to revoke (issue 26).

moto checks signatures and IAM policies once ``INITIAL_NO_AUTH_ACTION_COUNT``
requests have gone by: the first ones (unauthenticated) create an admin
user, its policy and its access key through moto's IAM API, and every later
request needs a key that IAM knows. A test then gives a gateway its own
user (:meth:`AuthMoto.user`), rotates or deletes its keys, and sees the
real answers a revoked key gets (403 ``InvalidAccessKeyId``).

Credentials reach a gateway through the standard chain, as on a device:
:func:`credentials_env` points ``AWS_SHARED_CREDENTIALS_FILE`` and
``AWS_CONFIG_FILE`` at files of the test, and :func:`write_credentials`
replaces the shared credentials file atomically (as a rotation would).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import botocore.config
import botocore.exceptions

from edge_gateway.testing.moto import REGION, MotoServer, start_moto_server

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

#: The health check of start_moto_server, then the admin's user, policy and key.
NO_AUTH_REQUESTS = 4

_ALLOW_ALL = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
)


@dataclass
class IamUser:
    """An IAM user of the server, allowed everything, and its access keys."""

    name: str
    iam: Any
    keys: list[tuple[str, str]] = field(default_factory=list)

    def new_key(self) -> tuple[str, str]:
        """A new access key (id, secret) of this user."""
        k = self.iam.create_access_key(UserName=self.name)["AccessKey"]
        key = (k["AccessKeyId"], k["SecretAccessKey"])
        self.keys.append(key)
        return key

    def revoke(self, key_id: str) -> None:
        """Delete an access key: requests signed with it get 403 InvalidAccessKeyId."""
        self.iam.delete_access_key(UserName=self.name, AccessKeyId=key_id)
        self.keys = [k for k in self.keys if k[0] != key_id]


class AuthMoto:
    """A moto server that enforces authentication, with an admin's clients."""

    def __init__(self, server: MotoServer, admin_key: tuple[str, str]) -> None:
        self.server = server
        self.endpoint = server.endpoint
        self.admin_key = admin_key
        self.s3 = self._client("s3")
        self.iam: Any = self._client("iam")

    @classmethod
    def start(cls, log_path: Path) -> AuthMoto:
        server = start_moto_server(
            log_path, env={"INITIAL_NO_AUTH_ACTION_COUNT": str(NO_AUTH_REQUESTS)}
        )
        try:
            iam = boto3.client(
                "iam",
                endpoint_url=server.endpoint,
                region_name=REGION,
                aws_access_key_id="unauthenticated",
                aws_secret_access_key="unauthenticated",
            )
            iam.create_user(UserName="admin")
            iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=_ALLOW_ALL)
            k = iam.create_access_key(UserName="admin")["AccessKey"]
            moto = cls(server, (k["AccessKeyId"], k["SecretAccessKey"]))
            moto.check_enforced()
        except BaseException:
            server.stop()
            raise
        return moto

    def _client(self, service: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.admin_key[0],
            aws_secret_access_key=self.admin_key[1],
            config=botocore.config.Config(s3={"addressing_style": "path"}),
        )

    def check_enforced(self) -> None:
        """Fail unless a request with an unknown key is refused (the free requests are used up)."""
        bogus = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="AKIANOSUCHKEY",
            aws_secret_access_key="nope",
        )
        try:
            bogus.list_buckets()
        except botocore.exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
        else:
            code = None
        finally:
            bogus.close()
        if code != "InvalidAccessKeyId":
            raise AssertionError(f"moto does not enforce authentication (answer: {code})")

    def user(self, prefix: str = "gw", policy: dict[str, Any] | None = None) -> IamUser:
        """A new IAM user (a gateway's identity) allowed ``policy`` (default: everything)."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.iam.create_user(UserName=name)
        doc = _ALLOW_ALL if policy is None else json.dumps(policy)
        self.iam.put_user_policy(UserName=name, PolicyName="edgegw", PolicyDocument=doc)
        return IamUser(name, self.iam)

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"edgegw-auth-{uuid.uuid4().hex[:16]}"
        self.s3.create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        """(key, content) of every object under ``prefix``, in key order."""
        s3: S3Client = self.s3
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                yield item["Key"], body

    def stop(self) -> None:
        self.s3.close()
        self.iam.close()
        self.server.stop()


def write_credentials(path: Path, key: tuple[str, str] | None) -> None:
    """Replace the shared credentials file (atomically, as a rotation tool would)."""
    text = (
        ""
        if key is None
        else (f"[default]\naws_access_key_id = {key[0]}\naws_secret_access_key = {key[1]}\n")
    )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def credentials_env(root: Path, key: tuple[str, str] | None = None) -> dict[str, str]:
    """Environment that gives a process only the test's credential files.

    ``AWS_SHARED_CREDENTIALS_FILE`` is ``root/credentials`` (holding ``key``),
    ``AWS_CONFIG_FILE`` is ``root/config`` (empty unless a test writes a
    profile into it).
    """
    root.mkdir(parents=True, exist_ok=True)
    creds, config = root / "credentials", root / "config"
    write_credentials(creds, key)
    if not config.exists():
        config.write_text("")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        # They would come before the files in the chain.
        assert name not in os.environ, f"{name} is set: the test cannot control credentials"
    return {
        "AWS_SHARED_CREDENTIALS_FILE": str(creds),
        "AWS_CONFIG_FILE": str(config),
        # No instance metadata service here: do not wait for one.
        "AWS_EC2_METADATA_DISABLED": "true",
    }
