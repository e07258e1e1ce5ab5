"""A bucket that lost the region's log stops `edgegw serve` (exit 4) with a message that
says so and how to recover, instead of retrying for ever or blaming the journal; and
`edgegw reship` re-creates the log from the journal when it still can.

Real processes throughout: `edgegw serve` on a local bucket directory (the
embedded default, ``<data_dir>/bucket``) or on moto's S3 server, the bucket
wiped under it while it runs or while it is stopped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
from _cli_support import assert_one_line_failure, cli_env, run_edgegw
from _serve import EDGEGW, Fleet, Gateway, TopicSpec

from edge_gateway.bucket import Bucket, LocalBucket, S3Bucket, S3Config
from edge_gateway.bucket_log import find_head
from edge_gateway.errors import Unavailable
from edge_gateway.format import logobject
from edge_gateway.format.manifest import log_key
from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

SITE = "north"
TOPIC = TopicSpec("t", SITE, partitions=2)
#: serve's exit code when the bucket lost the region's log (docs/operations.md).
EXIT_BUCKET_LOST = 4

Stored = dict[int, dict[int, bytes]]


@pytest.fixture
def gateways() -> Iterator[list[Gateway]]:
    """Gateways a test starts; whatever still runs at the end is killed."""
    started: list[Gateway] = []
    yield started
    for g in started:
        g.kill()


def make_gateway(
    root: Path, gateways: list[Gateway], bucket: dict[str, object] | None = None, **journal: Any
) -> Gateway:
    sections: dict[str, dict[str, object]] = {"shipper": {"manifest_interval_ms": 300}}
    if journal:
        sections["journal"] = journal
    g = Gateway(SITE, root, bucket or {"type": "local"}, [TOPIC], sections)
    gateways.append(g)
    return g


def produce(g: Gateway, first: int, count: int, *, ack: str = "shipped", pad: int = 0) -> Stored:
    values = [f"r{first + i:06d}".encode() + b"x" * pad for i in range(count)]
    out: Stored = {}
    with g.client() as c:
        for i in range(0, count, 50):
            res = c.produce("t", values[i : i + 50], ack=ack)  # type: ignore[arg-type]
            for v, p, o in zip(values[i : i + 50], res.partitions, res.offsets, strict=True):
                out.setdefault(p, {})[o] = v
    return out


def merge(*parts: Stored) -> Stored:
    out: Stored = {}
    for part in parts:
        for p, records in part.items():
            out.setdefault(p, {}).update(records)
    return out


def exit_code(g: Gateway, timeout: float = 90.0) -> int:
    """Wait for the gateway to stop by itself (a bounded wait, not a timing assertion)."""
    assert g.proc is not None
    try:
        return g.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"the gateway did not stop within {timeout:.0f}s:\n{g.tail(10)}"
        ) from None


def lost_line(g: Gateway) -> str:
    """The one-line `bucket lost:` message of the last start, without a traceback."""
    last_start = g.log.read_text(errors="replace").rsplit("---- start #", 1)[-1]
    assert "Traceback" not in last_start, last_start
    lines = [line for line in last_start.splitlines() if line.startswith("error: bucket lost: ")]
    assert len(lines) == 1, last_start
    assert f"region {SITE}'s log in " in lines[0], lines[0]
    return lines[0]


def log_records(open_bucket: Any) -> Stored:
    """Every record of the region's log in the bucket, by partition and offset."""

    async def read() -> Stored:
        bucket: Bucket = await open_bucket()
        out: Stored = {}
        try:
            head = await find_head(bucket, "", SITE)
            for seq in range(1, head + 1):
                key = log_key("", SITE, seq)
                data = (await bucket.get(key)).data
                need = logobject.header_length_hint(data[:12], where=key)
                header = logobject.decode_header(data[:need], where=key)
                for b in header.blocks:
                    raw = logobject.decode_block(b, data[b.offset : b.end], where=key)
                    for batch in logobject.iter_block_batches(b, raw, where=key):
                        for r in batch.records():
                            assert r.offset not in out.get(b.partition, {}), f"dup {r.offset}"
                            out.setdefault(b.partition, {})[r.offset] = r.value
        finally:
            await bucket.aclose()
        return out

    return trio.run(read)


def assert_complete(stored: Stored, acked: Stored) -> None:
    """The log holds every acknowledged record at its offset; partitions from 0, no gap."""
    for p, records in acked.items():
        for offset, value in records.items():
            assert stored.get(p, {}).get(offset) == value, f"{p}/{offset} is not in the log"
    for p, records in stored.items():
        assert sorted(records) == list(range(len(records))), f"partition {p} has a gap"


def wipe(directory: Path, how: str) -> None:
    # The running gateway may create a file (a manifest, a temp file) in a
    # directory while rmtree empties it ("Directory not empty"): wipe again,
    # as an operator would, until the directory is gone.
    for _ in range(50):
        shutil.rmtree(directory, ignore_errors=True)
        if not directory.exists():
            break
    assert not directory.exists(), f"could not remove {directory}"
    directory.mkdir()
    if how == "new-bucket":  # an empty bucket where the old one was (a fresh copy)
        for sub in ("objects", "tmp"):
            (directory / sub).mkdir()


@pytest.mark.parametrize("how", ["empty-directory", "new-bucket"])
def test_bucket_wiped_while_running_stops_the_gateway_and_reship_recovers(
    tmp_path: Path, gateways: list[Gateway], how: str
) -> None:
    g = make_gateway(tmp_path, gateways)
    bucket_dir = g.data_dir / "bucket"
    g.start()
    before = produce(g, 0, 120)
    wipe(bucket_dir, how)
    # Accepted into the journal; its upload is where the loss shows.
    try:
        after = produce(g, 120, 30, ack="local")
    except Unavailable:
        # The gateway's own next write (a manifest, a pack) met the loss
        # first and it stopped: nothing more was acknowledged (a loaded
        # machine widens the window between the wipe and this request).
        after = {}
    assert exit_code(g) == EXIT_BUCKET_LOST
    line = lost_line(g)
    assert "edgegw reship" in line, line

    # At restart the claim finds the head below what this gateway committed.
    g.spawn()
    assert exit_code(g) == EXIT_BUCKET_LOST
    line = lost_line(g)
    assert "this gateway saw seq" in line, line
    assert "re-creates the log from this journal" in line, line

    if how == "empty-directory":
        # The bucket holds no edgegw data any more: reship wants to be told.
        proc = run_edgegw("reship", "--config", g.config)
        assert_one_line_failure(proc.returncode, proc.stderr, "--new-bucket")
        proc = run_edgegw("reship", "--config", g.config, "--new-bucket")
    elif not any(p.is_file() for p in (bucket_dir / "objects").rglob("*")):
        # The gateway's first write into the new bucket met the loss and it
        # stopped before writing anything there (a loaded machine widens that
        # window): the bucket is as empty as a wiped directory.
        proc = run_edgegw("reship", "--config", g.config)
        assert_one_line_failure(proc.returncode, proc.stderr, "--new-bucket")
        proc = run_edgegw("reship", "--config", g.config, "--new-bucket")
    else:
        # The entries written into the new bucket before the loss was noticed
        # make it an edgegw bucket; reship deletes them (they sit at seqs the
        # re-created log needs) and ships the journal again.
        proc = run_edgegw("reship", "--config", g.config)
    assert proc.returncode == 0, proc.stderr
    assert "re-created the log of north" in proc.stdout, proc.stdout

    def open_local() -> Any:
        return LocalBucket.open(bucket_dir)

    acked = merge(before, after)
    assert_complete(log_records(open_local), acked)
    # The gateway runs again and offsets continue (a reused one is a duplicate in the log).
    g.start()
    more = produce(g, 150, 20)
    assert g.stop() == 0
    assert_complete(log_records(open_local), merge(acked, more))


def test_restart_after_the_bucket_lost_what_the_journal_deleted(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    # Small segments deleted as soon as they are shipped: the journal keeps
    # only the newest, so it cannot re-create the log.
    g = make_gateway(tmp_path, gateways, segment_bytes=64 * 1024, retention_ms=0)
    g.start()
    produce(g, 0, 400, pad=1000)
    assert g.stop() == 0
    journal = g.data_dir / "journal"
    segments = sorted(journal.glob("*.wal"))
    assert segments[0].name != f"{1:020d}.wal", "no shipped segment was deleted"
    shutil.rmtree(g.data_dir / "bucket")

    g.spawn()
    assert exit_code(g) == EXIT_BUCKET_LOST
    line = lost_line(g)
    assert "this gateway saw seq" in line, line
    assert "cannot be re-created" in line, line
    assert "edgegw restore" in line, line

    # A journal whose shipper.json predates log_seq (an older version): the
    # deleted segments alone tell that the bucket lost what it had confirmed
    # (this used to stop with "CorruptData: ... unshipped segments are missing").
    state = json.loads((journal / "shipper.json").read_text())
    (journal / "shipper.json").write_text(
        json.dumps({"region": state["region"], "epoch": state["epoch"]})
    )
    g.spawn()
    assert exit_code(g) == EXIT_BUCKET_LOST
    line = lost_line(g)
    assert "the journal deleted LSNs up to" in line, line
    assert "cannot be re-created" in line, line

    proc = run_edgegw("reship", "--config", g.config, "--new-bucket")
    assert_one_line_failure(proc.returncode, proc.stderr, "cannot be re-created")


def test_s3_bucket_emptied_while_stopped(
    tmp_path: Path,
    gateways: list[Gateway],
    moto_endpoint: str,
    s3_bucket_name: str,
    s3_admin: S3Client,
) -> None:
    s3 = {
        "type": "s3",
        "bucket": s3_bucket_name,
        "endpoint_url": moto_endpoint,
        "region": REGION,
        "path_style": True,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
    }
    g = make_gateway(tmp_path, gateways, s3)
    g.start()
    acked = produce(g, 0, 60)
    assert g.stop() == 0
    listed = s3_admin.list_objects_v2(Bucket=s3_bucket_name)
    for item in listed.get("Contents", []):
        s3_admin.delete_object(Bucket=s3_bucket_name, Key=item["Key"])

    g.spawn()
    assert exit_code(g) == EXIT_BUCKET_LOST
    assert "edgegw reship" in lost_line(g)

    proc = run_edgegw("reship", "--config", g.config, "--new-bucket")
    assert proc.returncode == 0, proc.stderr

    def open_s3() -> Any:
        return S3Bucket.open(
            S3Config(
                bucket=s3_bucket_name,
                endpoint_url=moto_endpoint,
                path_style=True,
                region=REGION,
                access_key=ACCESS_KEY,
                secret_key=SECRET_KEY,
            )
        )

    assert_complete(log_records(open_s3), acked)


def test_serve_refuses_an_s3_bucket_that_does_not_exist(
    tmp_path: Path, gateways: list[Gateway], moto_endpoint: str
) -> None:
    s3 = {
        "type": "s3",
        "bucket": "edgegw-no-such-bucket",
        "endpoint_url": moto_endpoint,
        "region": REGION,
        "path_style": True,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
    }
    g = make_gateway(tmp_path, gateways, s3)
    proc = subprocess.run(
        [str(EDGEGW), "serve", "--config", str(g.config)],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    assert "'edgegw-no-such-bucket'" in lines[0], lines[0]
    assert "no such bucket" in lines[0], lines[0]


def test_serve_refuses_a_configured_bucket_path_that_does_not_exist(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    typo = tmp_path / "shared-bucekt"
    g = make_gateway(tmp_path, gateways, {"type": "local", "path": str(typo)})
    proc = subprocess.run(
        [str(EDGEGW), "serve", "--config", str(g.config)],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    assert "bucket.path" in lines[0], lines[0]
    assert "does not exist" in lines[0], lines[0]
    assert "mkdir -p" in lines[0], lines[0]
    assert not typo.exists()
    # Made by the operator (an empty directory): a new bucket starts there.
    typo.mkdir()
    g.start()
    produce(g, 0, 5)
    assert g.stop() == 0
    assert (typo / "objects" / "edgegw-bucket.json").is_file()


def test_a_gateway_that_met_its_s3_bucket_still_starts_while_it_is_unreachable(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    # The existence check at start must not turn an outage into a refusal:
    # a site that has claimed its region before starts and journals offline.
    fleet = Fleet(
        tmp_path, [SITE], [TOPIC], s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name)
    )
    try:
        g = fleet[SITE]
        g.start()
        produce(g, 0, 10)
        assert g.stop() == 0
        fleet.proxies[SITE].set_mode("refuse")
        g.start()
        offline = produce(g, 10, 10, ack="local")
        fleet.proxies[SITE].set_mode("pass")
        with g.client() as c:  # shipped once the bucket answers again
            c.produce("t", [b"last"], ack="shipped")
        assert all(r for r in offline.values())
    finally:
        fleet.close()
