"""Per-region IAM policies confine each region to its own keys (issue 19.1), for real.

moto enforces signatures and IAM (``tests/_moto_auth.py``): each region's
gateway runs as an IAM user holding exactly the policy ``edgegw iam policy
--region R`` prints. Two such gateways must do everything a fleet does --
claim, ship (multipart included), write manifests, mirror each other,
publish cursors, run bucket GC (deletions and the boundary's
compare-and-swap) -- with no refusal; and with one region's key, writing or
deleting another region's keys is refused (403). The pipeline's policy reads
and cannot write. moto checks actions and resources (with ``*`` wildcards)
but ignores the ``s3:prefix`` condition of ListBucket: that part of the
policies is checked by AWS alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import httpx
import pytest
from _moto_auth import AuthMoto, credentials_env
from _serve import Gateway, Producer, TopicSpec, check_acknowledged, wait_mirrored, wait_until

from edge_gateway.bucket_log import bucket_marker_key, encode_bucket_marker
from edge_gateway.errors import EdgeGatewayError
from edge_gateway.format.manifest import parse_log_key
from edge_gateway.iam import pipeline_policy, region_policy
from edge_gateway.testing.moto import REGION
from edge_gateway.testing.ports import free_port

PREFIX = "plant"
TOPICS = [TopicSpec("t-n", "north", partitions=2), TopicSpec("t-s", "south", partitions=2)]


def _client(moto: AuthMoto, key: tuple[str, str]) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=moto.endpoint,
        region_name=REGION,
        aws_access_key_id=key[0],
        aws_secret_access_key=key[1],
        config=botocore.config.Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def _code(call: Any) -> str | None:
    """The S3 error code ``call()`` gets, None if it succeeds."""
    try:
        call()
    except botocore.exceptions.ClientError as exc:
        return str(exc.response.get("Error", {}).get("Code"))
    return None


def _gateway(root: Path, region: str, moto: AuthMoto, bucket: str, key: tuple[str, str]) -> Gateway:
    g = Gateway(
        region,
        root,
        {
            "type": "s3",
            "bucket": bucket,
            "prefix": PREFIX,
            "endpoint_url": moto.endpoint,
            "region": REGION,
            "path_style": True,
            "max_attempts": 1,
            # Large objects go up as multipart uploads (authorized as PutObject).
            "multipart_threshold": 5 << 20,
        },
        TOPICS,
        {
            "shipper": {"manifest_every": 5},
            "gc": {"enabled": True, "interval_ms": 1000, "retention_ms": 0},
        },
    )
    g.env = credentials_env(root / f"aws-{region}", key)
    return g


def _log_seqs(moto: AuthMoto, bucket: str, region: str) -> list[int]:
    """The seqs in ``region``'s log, in order."""
    pages = moto.s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{PREFIX}/regions/{region}/log/"
    )
    keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    return [parse_log_key(key, prefix=PREFIX)[1] for key in keys]


def _denied(g: Gateway) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = g.status()["denied"]
    except (httpx.HTTPError, EdgeGatewayError):
        return {}
    return doc


@pytest.mark.slow
def test_confined_regions_mirror_each_other_and_collect_their_logs(
    moto_auth: AuthMoto, tmp_path: Path
) -> None:
    bucket = moto_auth.bucket()
    # The admin marks the bucket first (regions may not: docs/security.md).
    marked = _edgegw(
        credentials_env(tmp_path / "aws-admin", moto_auth.admin_key),
        "bucket", "mark", "--s3-bucket", bucket, "--s3-prefix", PREFIX,
        "--s3-endpoint", moto_auth.endpoint, "--s3-path-style",
    )  # fmt: skip
    assert marked.returncode == 0, marked.stdout + marked.stderr
    keys = {
        r: moto_auth.user(r, region_policy(bucket, PREFIX, r)).new_key() for r in ("north", "south")
    }
    gws = {r: _gateway(tmp_path, r, moto_auth, bucket, keys[r]) for r in keys}
    for g in gws.values():
        g.start()
    producers: list[Producer] = []
    try:
        producers = [
            Producer(gws[t.home].url, t.name, t.partitions, seed=i, pause=0.005)
            for i, t in enumerate(TOPICS)
        ]
        for p in producers:
            p.start()
        time.sleep(4)
        # Incompressible megabytes: an object above the multipart threshold.
        with gws["north"].client(timeout=120) as c:
            c.produce("t-n", [os.urandom(1 << 20) for _ in range(7)], partition=0, ack="shipped")
        for p in producers:
            p.stop()
        wait_mirrored(gws["north"], "t-n", gws["south"])
        wait_mirrored(gws["south"], "t-s", gws["north"])
        for p, t in zip(producers, TOPICS, strict=True):
            check_acknowledged(p, gws[t.home])
        # Bucket GC deleted mirrored entries: deletions and the boundary's CAS.
        wait_until(
            lambda: _log_seqs(moto_auth, bucket, "north")[0] > 1,
            timeout=60,
            what="north's GC to delete its first log entries",
        )
        for g in gws.values():
            status = g.status()
            assert status["denied"] == {}, status["denied"]
        # The large object went up as a multipart upload, completed.
        requests = moto_auth.server.log_path.read_text(errors="replace").splitlines()
        assert any(
            f"/{bucket}/{PREFIX}/regions/north/log/" in r and "?uploads" in r for r in requests
        )
        assert moto_auth.s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    finally:
        for p in producers:
            p.stopping.set()
        for g in gws.values():
            g.stop()
    for g in gws.values():
        assert "AccessDenied" not in g.log.read_text(), g.tail(60)


def test_a_regions_key_cannot_write_or_delete_another_regions_keys(moto_auth: AuthMoto) -> None:
    bucket = moto_auth.bucket()
    admin = moto_auth.s3
    south_key = f"{PREFIX}/regions/south/log/{1:020d}.egw"
    admin.put_object(Bucket=bucket, Key=south_key, Body=b"south's entry")
    admin.put_object(Bucket=bucket, Key=f"{PREFIX}/regions/south/gc-boundary.json", Body=b"{}")
    north = _client(
        moto_auth, moto_auth.user("north", region_policy(bucket, PREFIX, "north")).new_key()
    )
    pipeline = _client(
        moto_auth, moto_auth.user("pipeline", pipeline_policy(bucket, PREFIX)).new_key()
    )
    try:
        put = north.put_object
        # Another region's log, manifests, GC boundary, probe and readers' cursors: refused.
        for key in (
            f"{PREFIX}/regions/south/log/{2:020d}.egw",
            f"{PREFIX}/regions/south/manifest/{2:020d}.json",
            f"{PREFIX}/regions/south/gc-boundary.json",
            f"{PREFIX}/regions/south/_edgegw-probe/x",
            f"{PREFIX}/regions/south/cursors/west.json",
            f"{PREFIX}/elsewhere/x",
            "outside-the-prefix",
        ):
            assert _code(lambda k=key: put(Bucket=bucket, Key=k, Body=b"x")) == "AccessDenied", key
        for key in (south_key, f"{PREFIX}/regions/south/gc-boundary.json"):
            assert _code(lambda k=key: north.delete_object(Bucket=bucket, Key=k)) == "AccessDenied"
        assert admin.get_object(Bucket=bucket, Key=south_key)["Body"].read() == b"south's entry"
        # Its own keys, its cursor in south's folder, and reading the fleet: allowed.
        for key in (
            f"{PREFIX}/regions/north/log/{1:020d}.egw",
            f"{PREFIX}/regions/north/gc-boundary.json",
            f"{PREFIX}/regions/south/cursors/north.json",
        ):
            assert _code(lambda k=key: put(Bucket=bucket, Key=k, Body=b"x")) is None, key
        assert (
            _code(
                lambda: north.delete_object(
                    Bucket=bucket, Key=f"{PREFIX}/regions/north/log/{1:020d}.egw"
                )
            )
            is None
        )
        assert north.get_object(Bucket=bucket, Key=south_key)["Body"].read() == b"south's entry"
        # The pipeline reads everything and writes nothing.
        assert pipeline.get_object(Bucket=bucket, Key=south_key)["Body"].read() == b"south's entry"
        listed = pipeline.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}/regions/")
        assert {i["Key"] for i in listed["Contents"]} >= {south_key}
        assert (
            _code(lambda: pipeline.put_object(Bucket=bucket, Key=south_key, Body=b"x"))
            == "AccessDenied"
        )
        assert _code(lambda: pipeline.delete_object(Bucket=bucket, Key=south_key)) == "AccessDenied"
    finally:
        north.close()
        pipeline.close()


def _edgegw(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgegw_cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_fleet_marker_is_the_admins_a_regions_key_cannot_write_it(
    moto_auth: AuthMoto, tmp_path: Path
) -> None:
    """Issue 41.3: a stolen device key must not replace the marker every site's sync reads.

    The region's policy grants nothing on the marker: no create (IAM cannot
    tell a create from an overwrite; moto does not evaluate the
    ``s3:if-none-match`` condition that would tell them apart, so the design
    does not rely on it), no overwrite, no delete. The admin writes it with
    ``edgegw bucket mark``.
    """
    bucket = moto_auth.bucket()
    marker = bucket_marker_key(PREFIX)
    north = _client(
        moto_auth, moto_auth.user("north", region_policy(bucket, PREFIX, "north")).new_key()
    )
    try:
        # Before the admin: the region may not create it, conditionally or not.
        put = north.put_object
        assert _code(lambda: put(Bucket=bucket, Key=marker, Body=b"x")) == "AccessDenied"
        assert (
            _code(lambda: put(Bucket=bucket, Key=marker, Body=b"x", IfNoneMatch="*"))
            == "AccessDenied"
        )
        assert moto_auth.s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
        # The admin marks the bucket with the documented command.
        admin_env = credentials_env(tmp_path / "aws-admin", moto_auth.admin_key)
        args = ["--s3-bucket", bucket, "--s3-prefix", PREFIX, "--s3-endpoint", moto_auth.endpoint]
        proc = _edgegw(admin_env, "bucket", "mark", *args, "--s3-path-style")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "as an edgegw bucket" in proc.stdout, proc.stdout
        written = moto_auth.s3.get_object(Bucket=bucket, Key=marker)["Body"].read()
        assert json.loads(written)["created_by"] == "admin"
        # The region reads it, and cannot overwrite or delete it.
        assert north.get_object(Bucket=bucket, Key=marker)["Body"].read() == written
        assert _code(lambda: north.put_object(Bucket=bucket, Key=marker, Body=b"{")) == (
            "AccessDenied"
        )
        assert _code(lambda: north.delete_object(Bucket=bucket, Key=marker)) == "AccessDenied"
        assert moto_auth.s3.get_object(Bucket=bucket, Key=marker)["Body"].read() == written
        # Run again: a valid marker is kept as it is.
        proc = _edgegw(admin_env, "bucket", "mark", *args, "--s3-path-style")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "is an edgegw bucket already" in proc.stdout, proc.stdout
        assert moto_auth.s3.get_object(Bucket=bucket, Key=marker)["Body"].read() == written
    finally:
        north.close()


def test_a_region_starts_a_fleet_without_the_marker_grant(
    moto_auth: AuthMoto, tmp_path: Path
) -> None:
    """`edgegw sync --new-bucket` with a region's key on an unmarked bucket: a note, not a failure.

    The region's log makes the bucket recognisable; the admin marks it when they get to it.
    """
    bucket = moto_auth.bucket()
    key = moto_auth.user("north", region_policy(bucket, PREFIX, "north")).new_key()
    g = _gateway(tmp_path, "north", moto_auth, bucket, key)
    first = _edgegw(g.env, "sync", "--config", str(g.config), "--new-bucket")
    out = first.stdout + first.stderr
    assert first.returncode == 0, out
    assert "edgegw bucket mark" in out, out  # says who writes the marker
    assert _log_seqs(moto_auth, bucket, "north")  # claimed: its log is in the bucket
    keys = [k for k, _ in moto_auth.objects(bucket)]
    assert bucket_marker_key(PREFIX) not in keys, keys
    # Recognised by its log from now on: no --new-bucket needed.
    again = _edgegw(g.env, "sync", "--config", str(g.config))
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_gateway_with_another_regions_key_gets_a_clear_permission_error(
    moto_auth: AuthMoto, tmp_path: Path
) -> None:
    """south's config with north's key (a copied env file): a refusal, not an outage."""
    bucket = moto_auth.bucket()
    moto_auth.s3.put_object(
        Bucket=bucket, Key=bucket_marker_key(PREFIX), Body=encode_bucket_marker("north", 1)
    )
    key = moto_auth.user("north", region_policy(bucket, PREFIX, "north")).new_key()
    g = _gateway(tmp_path, "south", moto_auth, bucket, key)
    sync = subprocess.run(
        [sys.executable, "-m", "edgegw_cli", "sync", "--config", str(g.config)],
        env={**os.environ, **g.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = sync.stdout + sync.stderr
    assert sync.returncode != 0, out
    assert "AccessDenied" in out, out
    assert f"{PREFIX}/regions/south/" in out or "regions/south/" in out, out
    assert "unavailable" not in out.lower(), out
    # A first start waits for the bucket before it writes api.addr: a fixed port.
    port = free_port()
    text = g.config.read_text()
    g.config.write_text(text.replace('listen = "127.0.0.1:0"', f'listen = "127.0.0.1:{port}"'))
    g.spawn()
    g.url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _denied(g), timeout=60, what="a denied shipper")
        denied = g.status()["denied"]["shipper"]
        assert denied["code"] == "AccessDenied", denied
        assert g.running
    finally:
        g.stop()


def test_the_policies_in_deploy_iam_are_what_the_command_prints() -> None:
    root = Path(__file__).resolve().parents[2]
    for name, role, region in (
        ("region.json", "region", "REGION"),
        ("pipeline.json", "pipeline", ""),
        ("admin.json", "admin", ""),
    ):
        args = ["iam", "policy", f"--role={role}", "--bucket=FLEET-BUCKET", "--prefix=PREFIX"]
        if region:
            args.append(f"--region={region}")
        out = subprocess.run(
            [sys.executable, "-m", "edgegw_cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert json.loads((root / "deploy" / "iam" / name).read_text()) == json.loads(out), name
