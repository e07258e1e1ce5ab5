"""``edgegw sync`` as a real process: a journal in a data directory is shipped
to a local-directory bucket and to S3 (moto's server), every record arrives,
a second run ships only what is new, and an unreachable store fails with a
one-line reason.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import trio
from _cli_support import EDGEGW, assert_one_line_failure, cli_env, run_edgegw
from _serve import Fleet, TopicSpec

from edge_gateway.bucket import Bucket, LocalBucket, S3Bucket, S3Config
from edge_gateway.bucket_log import find_head, latest_manifest, read_header
from edge_gateway.format import logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.manifest import (
    Manifest,
    log_key,
    manifest_prefix,
    parse_manifest_key,
)
from edge_gateway.journal import Journal, JournalConfig
from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY
from edge_gateway.testing.ports import free_port
from edge_gateway.testing.tcpproxy import LinkShape, TcpProxy

SITE = "north"
TOPICS = {"telemetry": 3, "orders": 2}

Records = dict[tuple[str, int], list[tuple[int, bytes | None, bytes]]]


def value(topic: str, p: int, o: int) -> bytes:
    return json.dumps({"t": topic, "p": p, "o": o, "pad": "x" * (o % 200)}).encode()


def journal_records(data_dir: Path, batches: int, per_batch: int = 7) -> Records:
    """Append ``batches`` batches to every partition of TOPICS in the data dir's
    journal (the layout ``edgegw sync`` reads: ``<data-dir>/journal``); returns
    every record the journal holds by then."""
    j = Journal.open_sync(data_dir / "journal", JournalConfig())
    try:
        for _ in range(batches):
            for topic, partitions in TOPICS.items():
                for p in range(partitions):
                    first = j.next_offset(topic, p)
                    offsets = range(first, first + per_batch)
                    j.append_nowait(
                        topic,
                        p,
                        encode_batch(
                            [value(topic, p, o) for o in offsets],
                            keys=[b"k%d" % o for o in offsets],
                            timestamps=[1_700_000_000_000 + o for o in offsets],
                        ),
                    )
        total = {(t, p): j.next_offset(t, p) for t, n in TOPICS.items() for p in range(n)}
    finally:
        j.close_sync()
    return {
        (t, p): [(o, b"k%d" % o, value(t, p, o)) for o in range(n)] for (t, p), n in total.items()
    }


async def bucket_records(bucket: Bucket) -> tuple[Records, list[Manifest]]:
    """Every record in the region's log, read the way a reader does (ranged
    header read, then the blocks), and its manifests, oldest first."""
    head = await find_head(bucket, "", SITE)
    out: Records = {}
    for seq in range(1, head + 1):
        key = log_key("", SITE, seq)
        read = await read_header(bucket, key)
        h = read.header
        assert (h.region, h.seq) == (SITE, seq)
        data = (await bucket.get(key)).data
        for b in h.blocks:
            raw = logobject.decode_block(b, data[b.offset : b.end], where=key)
            for batch in logobject.iter_block_batches(b, raw, where=key):
                out.setdefault((b.topic, b.partition), []).extend(
                    (r.offset, r.key, r.value) for r in batch.records()
                )
    manifests = []
    for info in await bucket.list(manifest_prefix("", SITE)):
        region, last_seq = parse_manifest_key(info.key)
        data = (await bucket.get(info.key)).data
        manifests.append(Manifest.decode(data, where=info.key, region=region, last_seq=last_seq))
    assert manifests, "sync writes a manifest at the end"
    # Consecutive manifests cover consecutive seqs, the last one up to the head.
    assert manifests[0].first_seq == 1
    for before, after in itertools.pairwise(manifests):
        assert after.first_seq == before.last_seq + 1
    assert manifests[-1].last_seq == head
    assert await latest_manifest(bucket, "", SITE) == manifests[-1]
    return out, manifests


def check_bucket(
    open_bucket: Callable[[], Coroutine[Any, Any, Bucket]], expected: Records
) -> list[Manifest]:
    """The bucket holds exactly the ``expected`` records, and manifests that agree."""

    async def main() -> tuple[Records, list[Manifest]]:
        bucket = await open_bucket()
        try:
            return await bucket_records(bucket)
        finally:
            await bucket.aclose()

    got, manifests = trio.run(main)
    assert got.keys() == expected.keys()
    for key, records in expected.items():
        assert got[key] == records, key
    assert manifests[-1].next_offsets == {k: len(v) for k, v in expected.items()}
    return manifests


def summary(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.startswith("shipped ")]
    assert len(lines) == 1, stdout
    return lines[0]


def test_sync_to_a_bucket_directory(tmp_path: Path) -> None:
    data, bucket_dir = tmp_path / "data", tmp_path / "bucket"
    expected = journal_records(data, batches=40)
    args = ["sync", "--data-dir", data, "--region", SITE, "--bucket-dir", bucket_dir]
    # Small objects (the smallest allowed): the backlog ships as several objects, in order.
    # The first sync starts the bucket (--new-bucket); later ones find an edgegw bucket.
    proc = run_edgegw(*args, "--flush-bytes", 64 * 1024, "--new-bucket")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    n = sum(len(v) for v in expected.values())
    assert summary(proc.stdout).startswith(f"shipped {n:,} records in ")

    def open_local() -> Coroutine[Any, Any, Bucket]:
        return LocalBucket.open(bucket_dir, create=True)

    first = check_bucket(open_local, expected)
    data_entries = [e for m in first for e in m.entries if not e.fence]
    assert len(data_entries) > 2, "64 KiB objects: the backlog needs several"

    # Nothing new: a second run ships nothing and keeps the log as it is.
    proc = run_edgegw(*args)
    assert proc.returncode == 0, proc.stderr
    assert summary(proc.stdout).startswith("shipped 0 records")
    check_bucket(open_local, expected)

    # More records: the next run ships exactly those, after the old ones.
    expected = journal_records(data, batches=3)
    proc = run_edgegw(*args)
    assert proc.returncode == 0, proc.stderr
    assert summary(proc.stdout).startswith(f"shipped {3 * 7 * 5} records")
    last = check_bucket(open_local, expected)
    assert last[-1].last_seq > first[-1].last_seq


def test_sync_to_s3(tmp_path: Path, moto_endpoint: str, s3_bucket_name: str) -> None:
    data = tmp_path / "data"
    expected = journal_records(data, batches=10)
    proc = run_edgegw(
        "sync",
        "--data-dir",
        data,
        "--region",
        SITE,
        "--s3-bucket",
        s3_bucket_name,
        "--s3-endpoint",
        moto_endpoint,
        "--s3-path-style",
        "--new-bucket",
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert summary(proc.stdout).startswith(f"shipped {10 * 7 * 5} records")

    def open_s3() -> Coroutine[Any, Any, Bucket]:
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

    check_bucket(open_s3, expected)


def test_sync_fails_cleanly_when_s3_is_unreachable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    journal_records(data, batches=2)
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc = run_edgegw(
        "sync",
        "--data-dir",
        data,
        "--region",
        SITE,
        "--s3-bucket",
        "edgegw-unreachable",
        "--s3-endpoint",
        endpoint,
        "--s3-path-style",
        timeout=180,
    )
    line = assert_one_line_failure(proc.returncode, proc.stderr, "BucketUnavailable")
    assert endpoint in line
    assert "shipped " not in proc.stdout
    # The journal is untouched: a later sync to a reachable bucket ships it all.
    proc = run_edgegw(
        "sync", "--data-dir", data, "--region", SITE, "--bucket-dir", tmp_path / "b", "--new-bucket"
    )
    assert proc.returncode == 0, proc.stderr
    assert summary(proc.stdout).startswith(f"shipped {2 * 7 * 5} records")


def test_sync_refuses_bad_arguments(tmp_path: Path) -> None:
    data = tmp_path / "data"
    journal_records(data, batches=1)
    proc = run_edgegw(
        "sync", "--data-dir", data, "--region", "no/such", "--bucket-dir", tmp_path / "b"
    )
    assert_one_line_failure(proc.returncode, proc.stderr, "region")


def test_sync_beside_a_gateway_whose_bucket_is_away_fails_with_a_reason(
    tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    # Issue 41, item 6: `edgegw sync` asked the running gateway and then waited
    # without a word for as long as the bucket was away (136 s in one run).
    # Like the one-shot sync on an unreachable store, it must end non-zero
    # with a one-line reason, and ship everything once the bucket is back.
    fleet = Fleet(
        tmp_path / "fleet",
        [SITE],
        [TopicSpec("t", SITE, partitions=2)],
        s3=(int(moto_endpoint.rsplit(":", 1)[1]), s3_bucket_name),
        # Ships only when asked: what is pending at the sync is still pending.
        per_region={SITE: {"shipper": {"flush_interval_ms": 600_000}}},
    )
    try:
        g = fleet[SITE]
        g.start()
        with g.client() as c:
            for i in range(5):
                c.produce("t", [b"v%d" % i], ack="local")
        fleet.proxies[SITE].set_mode("refuse")
        t0 = time.monotonic()
        proc = run_edgegw("sync", "--config", g.config, timeout=120)
        took = time.monotonic() - t0
        line = assert_one_line_failure(proc.returncode, proc.stderr, "bucket")
        assert took < 30, (took, proc.stderr)
        assert "unreachable" in line or "away" in line, line
        assert "nothing is lost" in line, line
        assert "run sync again" in line, line
        assert "shipped " not in proc.stdout
        assert g.running
        # The link is back: the same command returns once all five are in the
        # bucket (the gateway's own retry may have shipped them first).
        fleet.proxies[SITE].set_mode("pass")
        proc = run_edgegw("sync", "--config", g.config, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert summary(proc.stdout)
        status = g.status()
        assert status["shipper"]["pending_lsns"] == 0, status["shipper"]
        (topic,) = [t for t in status["topics"] if t["name"] == "t"]
        assert sum(p["unshipped"] for p in topic["partitions"]) == 0
    finally:
        codes = fleet.close()
    assert codes[SITE] == 0, fleet[SITE].tail()


def _bar_and_summary_objects(stdout: str) -> tuple[list[int], int]:
    """The objects counts on the progress bar's lines, and the summary's."""
    bars = [int(m[1]) for m in re.finditer(r"entries (\d+) objects,", stdout)]
    m = re.match(r"shipped [\d,]+ records in (\d+) objects", summary(stdout))
    assert m is not None, stdout
    return bars, int(m[1])


def test_the_progress_bar_and_the_summary_count_the_same_objects(tmp_path: Path) -> None:
    # Issue 41, item 9: the bar said "3 objects" beside "shipped 2 records in 2
    # objects" (the bar counted every object the gateway shipped since it
    # started, the summary those of this sync).
    data, bucket_dir = tmp_path / "data", tmp_path / "bucket"
    journal_records(data, batches=2)
    args = ["sync", "--data-dir", data, "--region", SITE, "--bucket-dir", bucket_dir]
    for extra in (["--new-bucket"], []):  # the second run finds the fence of the first
        journal_records(data, batches=1)
        proc = run_edgegw(*args, *extra)
        assert proc.returncode == 0, proc.stderr
        bars, shipped = _bar_and_summary_objects(proc.stdout)
        assert bars, proc.stdout
        assert bars[-1] == shipped, proc.stdout

    # Through a running gateway, which had shipped before this sync.
    fleet = Fleet(
        tmp_path / "fleet",
        [SITE],
        [TopicSpec("t", SITE, partitions=2)],
        per_region={SITE: {"shipper": {"flush_interval_ms": 600_000}}},
    )
    try:
        g = fleet[SITE]
        g.start()
        for round_ in range(2):
            with g.client() as c:
                c.produce("t", [b"a%d" % round_, b"b%d" % round_], ack="local")
            proc = run_edgegw("sync", "--config", g.config, timeout=120)
            assert proc.returncode == 0, proc.stderr
            bars, shipped = _bar_and_summary_objects(proc.stdout)
            assert shipped == 1, proc.stdout
            assert bars, proc.stdout
            assert bars[-1] == shipped, proc.stdout
    finally:
        codes = fleet.close()
    assert codes[SITE] == 0, fleet[SITE].tail()


def test_sync_ends_with_a_reason_when_the_bucket_goes_away_mid_way(
    tmp_path: Path, moto_endpoint: str, s3_admin: Any, s3_bucket_name: str
) -> None:
    # Issue 41, item 6, the one-shot side: an unreachable store at the start
    # ended the sync with a reason, but one lost in the middle of the backlog
    # was retried for as long as it lasted. Both now end at the first failed
    # attempt (as a sync through a running gateway does); nothing is lost.
    data = tmp_path / "data"
    j = Journal.open_sync(data / "journal", JournalConfig())
    try:
        for _ in range(40):  # ~1 MB that zstd cannot shrink
            values = [os.urandom(1000) for _ in range(25)]
            j.append_nowait("t", 0, encode_batch(values, timestamps=[1_700_000_000_000] * 25))
    finally:
        j.close_sync()
    proxy = TcpProxy("127.0.0.1", int(moto_endpoint.rsplit(":", 1)[1])).start()
    try:
        proxy.set_shape(LinkShape(up_bytes_per_s=150_000))  # ~7 s for the backlog
        proc = subprocess.Popen(
            [
                str(EDGEGW),
                "sync",
                "--data-dir",
                str(data),
                "--region",
                SITE,
                "--s3-bucket",
                s3_bucket_name,
                "--s3-endpoint",
                proxy.url,
                "--s3-path-style",
                "--new-bucket",
                "--flush-bytes",
                str(64 * 1024),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )

        def shipped() -> int:
            listed = s3_admin.list_objects_v2(Bucket=s3_bucket_name, Prefix=f"regions/{SITE}/log/")
            return len(listed.get("Contents", []))

        deadline = time.monotonic() + 60
        while shipped() < 3:  # the claim's fence and two objects: in the middle
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "nothing shipped"
            time.sleep(0.05)
        proxy.set_mode("refuse")
        t0 = time.monotonic()
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        took = time.monotonic() - t0
    finally:
        proxy.stop()
    line = assert_one_line_failure(proc.returncode, err, "cannot ship now")
    assert took < 30, (took, err)
    assert "the bucket is unreachable" in line
    assert "nothing is lost" in line
    assert "run sync again" in line
    assert "shipped " not in out
