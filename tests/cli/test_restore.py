"""``edgegw restore`` and ``sync`` as real processes: they act only on an edgegw bucket.

A mistyped bucket directory, an empty or foreign bucket, an S3 bucket that does
not exist, or a region with no log would otherwise look like a region that
never shipped: restore would restart its offsets at 0 (the reuse it exists to
prevent) and sync would start a second log somewhere nobody reads. Each is
refused with one line, before anything is created or moved, unless
``--new-bucket`` says a new bucket (or region) is meant. ``restore --config``
takes region, data dir and bucket from the gateway's config.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from _cli_support import assert_one_line_failure, run_edgegw
from _serve import Gateway, TopicSpec

from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import Journal, JournalConfig

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

SITE = "north"


def write_journal(data_dir: Path, records: int = 30) -> None:
    """A data dir whose journal holds ``records`` records of telemetry/0, not shipped."""
    j = Journal.open_sync(data_dir / "journal", JournalConfig())
    try:
        first = j.next_offset("telemetry", 0)
        values = [b"v%d" % o for o in range(first, first + records)]
        j.append_nowait("telemetry", 0, encode_batch(values, timestamps=1_700_000_000_000))
    finally:
        j.close_sync()


def shipped_bucket(tmp_path: Path, records: int = 30) -> Path:
    """A local bucket holding north's log of ``records`` records (shipped by ``edgegw sync``)."""
    bucket = tmp_path / "bucket"
    write_journal(tmp_path / "site", records)
    proc = run_edgegw(
        "sync", "--data-dir", tmp_path / "site", "--region", SITE, "--bucket-dir", bucket,
        "--new-bucket",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return bucket


def restore(data_dir: Path, region: str, *bucket: str | Path) -> tuple[int, str, str]:
    proc = run_edgegw(
        "restore", "--data-dir", data_dir, "--region", region, *bucket, "--yes"
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def journal_files(data_dir: Path) -> list[str]:
    return sorted(p.name for p in (data_dir / "journal").iterdir())


def test_restore_refuses_a_bucket_directory_that_does_not_exist(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_journal(data)  # unshipped records that a wrong restore would move aside
    before = journal_files(data)
    typo = tmp_path / "typo-bucket"
    code, _, err = restore(data, SITE, "--bucket-dir", typo)
    line = assert_one_line_failure(code, err, "does not exist")
    assert "--new-bucket" in line
    assert not typo.exists()
    assert journal_files(data) == before
    assert not list(tmp_path.glob("data/journal.aside-*"))


def test_restore_refuses_an_empty_directory_and_an_empty_s3_bucket(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = restore(tmp_path / "d1", SITE, "--bucket-dir", empty)
    assert_one_line_failure(code, err, "not a bucket directory")
    assert list(empty.iterdir()) == []

    s3 = ("--s3-bucket", s3_bucket_name, "--s3-endpoint", moto_endpoint, "--s3-path-style")
    code, _, err = restore(tmp_path / "d2", SITE, *s3)
    line = assert_one_line_failure(code, err, "is not an edgegw bucket")
    assert s3_bucket_name in line
    assert "--new-bucket" in line
    assert not (tmp_path / "d2" / "journal").exists()


def test_restore_refuses_an_s3_bucket_that_does_not_exist_and_keeps_the_journal(
    tmp_path: Path, moto_endpoint: str
) -> None:
    data = tmp_path / "data"
    write_journal(data)
    before = journal_files(data)
    code, _, err = restore(
        data, SITE, "--s3-bucket", "edgegw-no-such-bucket", "--s3-endpoint", moto_endpoint,
        "--s3-path-style",
    )  # fmt: skip
    # Refused before anything was touched: the journal was not moved aside
    # (it used to be, before the bucket was even opened).
    assert journal_files(data) == before
    assert not list(tmp_path.glob("data/journal.aside-*"))
    line = assert_one_line_failure(code, err, "no such bucket")
    assert "'edgegw-no-such-bucket'" in line


def test_restore_refuses_a_region_without_a_log_unless_new_bucket(tmp_path: Path) -> None:
    bucket = shipped_bucket(tmp_path)
    code, _, err = restore(tmp_path / "data", "nroth", "--bucket-dir", bucket)
    line = assert_one_line_failure(code, err, "region 'nroth' has no log")
    assert "--new-bucket" in line
    assert not (tmp_path / "data" / "journal").exists()

    code, out, err = restore(tmp_path / "data", "nroth", "--bucket-dir", bucket, "--new-bucket")
    assert code == 0, err
    assert "restored nroth: log head seq 0" in out


def test_restore_continues_the_offsets_of_a_bucket_without_marker(tmp_path: Path) -> None:
    # Buckets written before the marker existed hold region logs and no marker.
    bucket = shipped_bucket(tmp_path, records=30)
    (bucket / "objects" / "edgegw-bucket.json").unlink()
    code, out, err = restore(tmp_path / "data", SITE, "--bucket-dir", bucket)
    assert code == 0, err
    assert "restored north" in out
    assert "offsets continue from the bucket" in out
    j = Journal.open_sync(tmp_path / "data" / "journal", JournalConfig())
    try:
        assert j.next_offset("telemetry", 0) == 30
    finally:
        j.close_sync()


def test_new_bucket_makes_the_directory_and_marks_it(tmp_path: Path) -> None:
    bucket = tmp_path / "new" / "bucket"
    code, out, err = restore(tmp_path / "data", SITE, "--bucket-dir", bucket, "--new-bucket")
    assert code == 0, err
    assert "restored north: log head seq 0" in out
    marker = json.loads((bucket / "objects" / "edgegw-bucket.json").read_text())
    assert marker["format"] == "edgegw-bucket"
    # Now it is an edgegw bucket: the region still has no log, so that is refused.
    code, _, err = restore(tmp_path / "data", SITE, "--bucket-dir", bucket)
    assert_one_line_failure(code, err, "has no log")


def test_restore_with_config_after_the_data_dir_is_lost(tmp_path: Path) -> None:
    shared = tmp_path / "shared-bucket"
    shared.mkdir()
    g = Gateway(
        SITE,
        tmp_path,
        {"type": "local", "path": str(shared)},
        [TopicSpec("t", SITE, partitions=1)],
        {},
    )
    try:
        g.start()
        with httpx.Client(base_url=g.url, timeout=30) as c:
            r = c.post("/v1/topics/t/records?ack=shipped", json={"records": [{"value": "a"}] * 7})
            assert r.status_code == 200, r.text
        assert g.stop() == 0
        # The disk is lost: a new, empty data dir.
        shutil.rmtree(g.data_dir)
        proc = run_edgegw("restore", "--config", g.config)
        assert proc.returncode == 0, proc.stderr
        assert "restored north" in proc.stdout
        g.start()
        with httpx.Client(base_url=g.url, timeout=30) as c:
            r = c.post("/v1/topics/t/records", json={"records": [{"value": "b"}]})
            assert r.status_code == 200, r.text
            assert r.json()["offsets"] == [{"partition": 0, "offset": 7}]
        assert g.stop() == 0
    finally:
        g.kill()

    proc = run_edgegw("restore", "--config", g.config, "--region", SITE)
    assert_one_line_failure(proc.returncode, proc.stderr, "come from the config file")


def test_sync_refuses_a_bucket_that_is_not_edgegws(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str, s3_admin: S3Client
) -> None:
    data = tmp_path / "data"
    write_journal(data)
    typo = tmp_path / "typo-bucket"
    base = ("sync", "--data-dir", data, "--region", SITE)
    proc = run_edgegw(*base, "--bucket-dir", typo)
    assert_one_line_failure(proc.returncode, proc.stderr, "does not exist")
    assert not typo.exists()

    s3 = ("--s3-bucket", s3_bucket_name, "--s3-endpoint", moto_endpoint, "--s3-path-style")
    proc = run_edgegw(*base, *s3)
    assert_one_line_failure(proc.returncode, proc.stderr, "is not an edgegw bucket")
    assert "Contents" not in s3_admin.list_objects_v2(Bucket=s3_bucket_name)

    # Told so, sync starts the bucket and ships everything the journal held.
    proc = run_edgegw(*base, *s3, "--new-bucket")
    assert proc.returncode == 0, proc.stderr
    assert "shipped 30 records" in proc.stdout
    keys = [o["Key"] for o in s3_admin.list_objects_v2(Bucket=s3_bucket_name)["Contents"]]
    assert "edgegw-bucket.json" in keys


def test_restore_moves_every_lane_aside(tmp_path: Path) -> None:
    # (Offline sync and reship ship every lane: tests/system/test_offline_lanes.py.)
    bucket = shipped_bucket(tmp_path)
    data = tmp_path / "data"
    write_journal(data)
    crit = Journal.open_sync(data / "journal-critical", JournalConfig())  # a lane's journal
    crit.close_sync()
    code, out, err = restore(data, SITE, "--bucket-dir", bucket)
    assert code == 0, err
    assert "journal-critical" in out
    assert len(list(data.glob("journal.aside-*"))) == 1
    assert len(list(data.glob("journal-critical.aside-*"))) == 1
    assert not (data / "journal-critical").exists()


def test_a_malformed_marker_warns_and_sync_and_restore_go_on(tmp_path: Path) -> None:
    """Issue 41.3: a marker overwritten with garbage stopped sync/restore/reship at every site."""
    bucket = shipped_bucket(tmp_path, records=30)
    marker = bucket / "objects" / "edgegw-bucket.json"
    marker.write_bytes(b"\x00 overwritten by a stolen key")
    proc = run_edgegw(
        "sync", "--data-dir", tmp_path / "site", "--region", SITE, "--bucket-dir", bucket
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    code, out, err = restore(tmp_path / "data", SITE, "--bucket-dir", bucket)
    assert code == 0, err
    assert "offsets continue from the bucket" in out
    for stderr in (proc.stderr, err):
        line = next(ln for ln in stderr.splitlines() if "edgegw-bucket.json" in ln)
        assert "WARNING" in line, stderr
        assert str(bucket) in line, line
        assert "malformed" in line, line
        assert "edgegw bucket mark" in line, line  # what to do
    # The admin's command puts a valid marker back; then nothing warns.
    mark = run_edgegw("bucket", "mark", "--bucket-dir", bucket)
    assert mark.returncode == 0, mark.stderr
    assert "replaced a malformed edgegw-bucket.json" in mark.stdout, mark.stdout
    assert json.loads(marker.read_text())["format"] == "edgegw-bucket"
    code, _, err = restore(tmp_path / "data2", SITE, "--bucket-dir", bucket)
    assert code == 0, err
    assert "edgegw-bucket.json" not in err, err
