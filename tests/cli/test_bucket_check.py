"""``edgegw bucket check`` as a user runs it: a real process against real servers.

moto passes; moto behind Ceph RGW 16.2's quirks passes with edgegw working
around them; a store that ignores conditional writes (like s3rver) and one
that refuses compare-and-swap fail with a line that names what is missing.
Azure Blob passes on Azurite (50 racers: exactly one wins); the GCS
emulator, which ignores ifGenerationMatch, is refused like s3rver.
Every run leaves the bucket as it found it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from _cli_support import assert_one_line_failure, invoke, run_edgegw
from _quirky_s3 import new_bucket_on
from _rgw import ACCESS_KEY as RGW_ACCESS_KEY
from _rgw import SECRET_KEY as RGW_SECRET_KEY

from edge_gateway.bucket import LocalBucket
from edge_gateway.testing.emulators import azurite_connection_string
from edge_gateway.testing.moto import s3_client

FAST = ("--samples", "5", "--throughput-mib", "4", "--racers", "20")


def _s3_args(endpoint: str, bucket: str) -> list[str]:
    return ["--s3-bucket", bucket, "--s3-endpoint", endpoint, "--s3-path-style"]


def _keys(endpoint: str, bucket: str) -> list[str]:
    client = s3_client(endpoint)
    try:
        return [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    finally:
        client.close()


def _rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["checks"]}


def test_moto_passes_and_is_left_clean(moto_endpoint: str, s3_bucket_name: str) -> None:
    proc = run_edgegw("bucket", "check", *_s3_args(moto_endpoint, s3_bucket_name), *FAST, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    rows = _rows(doc)
    for name in (
        "conditional create: new key",
        "conditional create: existing key",
        "conditional create: 20 racers",
        "conditional overwrite (If-Match)",
        "conditional multipart complete",
        "ranged GET",
        "GET/HEAD of a missing key",
        "LIST by prefix",
        "delete",
        "read-after-write",
    ):
        assert rows[name]["result"] == "pass", rows[name]
    assert doc["figures"]["put_p99_ms"] >= doc["figures"]["put_p50_ms"] > 0
    assert doc["figures"]["read_mb_s"] > 0
    assert _keys(moto_endpoint, s3_bucket_name) == []


def test_the_table_says_plainly_that_edgegw_can_run(
    moto_endpoint: str, s3_bucket_name: str
) -> None:
    proc = run_edgegw("bucket", "check", *_s3_args(moto_endpoint, s3_bucket_name), *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "conditional create: 20 racers" in proc.stdout
    assert "p50" in proc.stdout
    assert proc.stdout.rstrip().endswith("edgegw can run on this store.")


def test_a_store_ignoring_conditional_writes_is_refused(quirky_s3: Callable[..., str]) -> None:
    endpoint = quirky_s3("ignore-conditions")  # as s3rver
    bucket = new_bucket_on(endpoint)
    proc = run_edgegw("bucket", "check", *_s3_args(endpoint, bucket), *FAST)
    assert proc.returncode == 1, proc.stdout
    verdict = proc.stdout.rstrip().splitlines()[-1]
    assert verdict.startswith("edgegw cannot run on this store: conditional create: existing key")
    assert "ignores If-None-Match: *" in verdict
    assert _keys(endpoint, bucket) == []


def test_a_store_refusing_compare_and_swap_is_refused(quirky_s3: Callable[..., str]) -> None:
    endpoint = quirky_s3("refuse-if-match")
    bucket = new_bucket_on(endpoint)
    proc = run_edgegw("bucket", "check", *_s3_args(endpoint, bucket), *FAST, "--json")
    assert proc.returncode == 1
    rows = _rows(json.loads(proc.stdout))
    assert rows["conditional overwrite (If-Match)"]["result"] == "fail"
    assert "does not support compare-and-swap" in rows["conditional overwrite (If-Match)"]["detail"]
    assert rows["conditional create: existing key"]["result"] == "pass"
    assert _keys(endpoint, bucket) == []


def test_rgw_quirks_pass_with_the_workarounds(quirky_s3: Callable[..., str]) -> None:
    endpoint = quirky_s3("bare-if-match", "ignore-multipart-condition")  # as Ceph RGW 16.2
    bucket = new_bucket_on(endpoint)
    proc = run_edgegw("bucket", "check", *_s3_args(endpoint, bucket), *FAST, "--json")
    assert proc.returncode == 0, proc.stdout
    rows = _rows(json.loads(proc.stdout))
    assert rows["conditional multipart complete"]["result"] == "workaround"
    assert "one PutObject" in rows["conditional multipart complete"]["detail"]
    assert "bare ETag" in rows["conditional overwrite (If-Match)"]["detail"]
    assert _keys(endpoint, bucket) == []


def test_check_with_a_config_file(tmp_path: Path) -> None:
    async def make() -> None:
        await (await LocalBucket.open(tmp_path / "bucket", create=True)).aclose()

    trio.run(make)
    config = tmp_path / "edgegw.toml"
    config.write_text(
        f'region = "north"\ndata_dir = "{tmp_path / "data"}"\n\n'
        f'[bucket]\npath = "{tmp_path / "bucket"}"\nprefix = "fleet"\n'
    )
    res = invoke("bucket", "check", "--config", config, *FAST)
    assert res.exit_code == 0, res.stderr
    assert "edgegw can run on this store." in res.stdout
    assert not list((tmp_path / "bucket" / "objects").rglob("*.*"))


def test_bad_options_and_an_unreachable_store(tmp_path: Path) -> None:
    res = invoke("bucket", "check")
    assert res.exit_code == 2
    res = invoke("bucket", "check", "--samples", "3")
    assert_one_line_failure(
        res.exit_code,
        res.stderr,
        "give --config, --bucket-dir, --s3-bucket, --azure-container or --gcs-bucket",
    )
    assert res.exit_code == 2
    res = invoke("bucket", "check", "--bucket-dir", tmp_path / "nowhere")
    assert_one_line_failure(res.exit_code, res.stderr, "could not check the store")
    assert res.exit_code == 1


@pytest.mark.rgw
def test_ceph_rgw_passes_with_the_workarounds(rgw_endpoint: str, rgw_bucket_name: str) -> None:
    # The real Ceph RGW 16.2 (-m rgw): what the quirky moto above stands for.
    proc = run_edgegw(
        "bucket",
        "check",
        *_s3_args(rgw_endpoint, rgw_bucket_name),
        *FAST,
        "--json",
        env={"AWS_ACCESS_KEY_ID": RGW_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": RGW_SECRET_KEY},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _rows(json.loads(proc.stdout))
    assert rows["conditional multipart complete"]["result"] == "workaround"
    assert (
        "missing key 412; the store wants the bare ETag"
        in (rows["conditional overwrite (If-Match)"]["detail"])
    )
    assert all(r["result"] in ("pass", "workaround", "info") for r in rows.values())


def _azure_config(tmp_path: Path, endpoint: str, container: str) -> Path:
    config = tmp_path / "edgegw.toml"
    config.write_text(
        f'region = "north"\ndata_dir = "{tmp_path / "data"}"\n\n'
        f'[bucket]\ntype = "azure"\ncontainer = "{container}"\nprefix = "fleet"\n'
        f'connection_string_file = "{tmp_path / "azure.conn"}"\n'
    )
    (tmp_path / "azure.conn").write_text(azurite_connection_string(endpoint) + "\n")
    return config


def _azure_blobs(endpoint: str, container: str) -> list[str]:
    from azure.storage.blob import BlobServiceClient

    with BlobServiceClient.from_connection_string(azurite_connection_string(endpoint)) as svc:
        return [b.name for b in svc.get_container_client(container).list_blobs()]


def test_azurite_passes_with_50_racers_and_is_left_clean(
    tmp_path: Path, azurite_endpoint: str, azure_container_name: str
) -> None:
    config = _azure_config(tmp_path, azurite_endpoint, azure_container_name)
    proc = run_edgegw(
        "bucket", "check", "--config", config, "--samples", "5", "--throughput-mib", "4", "--json"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    rows = _rows(doc)
    assert rows["conditional create: 50 racers"]["result"] == "pass"
    assert rows["conditional create: 50 racers"]["detail"] == "exactly one winner, 49 got 412"
    assert rows["conditional overwrite: 10 racers"]["result"] == "pass"
    assert rows["conditional overwrite (If-Match)"]["result"] == "pass"
    multipart = rows["conditional multipart complete"]
    assert (multipart["result"], multipart["detail"]) == (
        "pass",
        "412 on Put Block List onto an existing key",
    )
    assert all(r["result"] in ("pass", "info") for r in rows.values()), rows
    assert doc["store"].startswith(f"Azure container {azure_container_name!r}")
    assert _azure_blobs(azurite_endpoint, azure_container_name) == []


def test_a_missing_azure_container_is_named(tmp_path: Path, azurite_endpoint: str) -> None:
    config = _azure_config(tmp_path, azurite_endpoint, "no-such-container")
    res = run_edgegw("bucket", "check", "--config", config, *FAST)
    line = assert_one_line_failure(res.returncode, res.stderr, "no such container")
    assert "no-such-container" in line


def test_the_gcs_emulator_is_refused_naming_the_conditional_create(
    tmp_path: Path, gcs_emulator_endpoint: str, gcs_bucket_name: str
) -> None:
    # gcp-storage-emulator ignores ifGenerationMatch, as s3rver ignores If-None-Match.
    config = tmp_path / "edgegw.toml"
    config.write_text(
        f'region = "north"\ndata_dir = "{tmp_path / "data"}"\n\n'
        f'[bucket]\ntype = "gcs"\nbucket = "{gcs_bucket_name}"\n'
        f'endpoint_url = "{gcs_emulator_endpoint}"\nanonymous = true\n'
    )
    proc = run_edgegw("bucket", "check", "--config", config, *FAST)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = proc.stdout.rstrip().splitlines()[-1]
    assert verdict.startswith("edgegw cannot run on this store: conditional create: existing key")
    assert "20 of 20 concurrent creators succeeded" in verdict


def test_azure_and_gcs_by_options(
    azurite_endpoint: str,
    azure_container_name: str,
    gcs_emulator_endpoint: str,
    gcs_bucket_name: str,
) -> None:
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(azurite_endpoint)}
    proc = run_edgegw(
        "bucket",
        "check",
        "--azure-container",
        azure_container_name,
        "--prefix",
        "p",
        *FAST,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("edgegw can run on this store.")
    assert _azure_blobs(azurite_endpoint, azure_container_name) == []
    proc = run_edgegw(
        "bucket",
        "check",
        "--gcs-bucket",
        gcs_bucket_name,
        "--gcs-endpoint",
        gcs_emulator_endpoint,
        *FAST,
        env={"GOOGLE_APPLICATION_CREDENTIALS": "", "STORAGE_EMULATOR_HOST": gcs_emulator_endpoint},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "edgegw cannot run on this store: conditional create: existing key" in proc.stdout
    res = invoke("bucket", "check", "--azure-container", "c1x", "--gcs-bucket", "b1x")
    assert_one_line_failure(res.exit_code, res.stderr, "not both")
    assert res.exit_code == 2
    res = invoke("bucket", "check", "--azure-container", "Bad_Name")
    assert_one_line_failure(res.exit_code, res.stderr, "not an Azure container name")
