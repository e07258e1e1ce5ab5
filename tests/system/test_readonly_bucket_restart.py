"""A restart with a read-only local bucket serves at once, then ships (issue 41.4).

docs/operations.md: a gateway that has claimed its region "starts and accepts
writes at once, whether the bucket is reachable, unreachable or refusing it".
A running gateway already treats EROFS as an outage; at a restart the local
bucket's open made its lock file, met EROFS and the process exited 1 (under
systemd: a crash loop with no intake).

For real: the bucket directory is a tmpfs of its own (root needed; skipped
elsewhere, saying so). The gateway claims and ships, stops; the tmpfs is
remounted read-only (``mount -o remount,ro``: every write gets EROFS); the
gateway restarts, must be ready and acknowledge writes at once, and report
the outage; once the filesystem is writable again everything it acknowledged
ships, with no restart.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest
from _serve import Gateway, TopicSpec, wait_until
from _tmpfs import mounted_tmpfs

TOPIC = TopicSpec("t", "north", partitions=2)


def _remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True, capture_output=True)


def _unshipped(g: Gateway) -> int:
    with g.client() as c:
        return sum(p["unshipped"] for p in c.topic(TOPIC.name)["partitions"])


def _log_entries(bucket: Path) -> list[str]:
    log = bucket / "objects" / "regions" / "north" / "log"
    return sorted(p.name for p in log.iterdir()) if log.is_dir() else []


def test_restart_with_a_read_only_bucket_serves_then_ships(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "bucketfs", "32m") as fs:
        bucket = fs / "bucket"
        bucket.mkdir()
        g = Gateway(
            "north",
            tmp_path,
            {"type": "local", "path": str(bucket)},
            [TOPIC],
            {"shipper": {"retry_cap_s": 0.5}},
        )
        try:
            g.start()
            with g.client() as c:
                c.produce(TOPIC.name, [b"before-%d" % i for i in range(10)], ack="shipped")
            assert g.stop() == 0, g.tail()
            shipped_before = _log_entries(bucket)
            assert shipped_before

            _remount(fs, "ro")
            with pytest.raises(OSError, match="Read-only file system") as exc_info:
                (bucket / "probe").write_bytes(b"x")
            assert exc_info.value.errno == errno.EROFS

            g.spawn()
            g.wait_ready(timeout=30)  # exited 1 here: BucketUnavailable ... EROFS ... /lock
            with g.client() as c:
                acked = c.produce(TOPIC.name, [b"while-ro-%d" % i for i in range(20)])
            assert len(acked.offsets) == 20
            wait_until(
                lambda: "EROFS" in (g.status()["shipper"]["last_error"] or ""),
                timeout=30,
                what="the shipper to report the read-only bucket",
            )
            assert _unshipped(g) >= 20
            assert g.running
            assert _log_entries(bucket) == shipped_before

            _remount(fs, "rw")
            wait_until(lambda: _unshipped(g) == 0, timeout=60, what="shipping after remount rw")
            assert len(_log_entries(bucket)) > len(shipped_before)
            status = g.status()["shipper"]
            assert status["claimed"], status
            assert g.stop() == 0, g.tail()
        finally:
            g.stop()
            if os.path.ismount(fs):
                _remount(fs, "rw")
    log = g.log.read_text(errors="replace")
    assert "fatal" not in log, g.tail(80)
