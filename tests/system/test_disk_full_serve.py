"""`edgegw serve` on a small disk that another process fills and frees, again and again.

Issue 29.3/29.5 (and 14.5): the north gateway's data directory is a 24 MB
tmpfs, with the journal's default settings (a 4 GiB budget, 24 h
retention: the disk fills long before the budget). A filler process takes
every free byte, keeps taking whatever the gateway frees, then lets go, six
times, while producers write as fast as they can. South, on the ordinary
disk, mirrors north's topic.

* north never exits, and answers produce with 200 or ``503 disk_full``,
  nothing else (no 500, no traceback); each fill makes it delete shipped
  segments early or refuse writes (or both);
* every acknowledged record is in south's mirror at the offset it was
  acknowledged with (north deleted shipped segments to make room, so the
  mirror is where all of them still are), and north's partitions hold the
  same records in their last offsets;
* north's status and metrics show the episodes; after the last fill its
  disk is back to "ok" and it accepts writes again without a restart.

Needs root to mount the tmpfs; skipped elsewhere, saying so.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from _serve import Fleet, TopicSpec, read_partition, wait_mirrored
from _tmpfs import mounted_tmpfs

from edge_gateway.api.wire import BATCH_MEDIA_TYPE
from edge_gateway.format.batch import encode_batch

PARTITIONS = 3
FILLS = 6

# Takes every free byte of the filesystem (and whatever is freed meanwhile)
# for HOLD seconds, then gives it all back for a while; FILLS times.
FILLER = """
import errno, os, sys, time
target, fills = sys.argv[1], int(sys.argv[2])
def top_up(fd, size):
    chunk = 1 << 20
    while chunk >= 4096:
        try:
            os.posix_fallocate(fd, size, chunk)
            size += chunk
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            chunk //= 2
    return size
for i in range(fills):
    fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
    size, until = 0, time.monotonic() + 1.0 + 0.3 * (i % 3)
    while time.monotonic() < until:
        size = top_up(fd, size)
        time.sleep(0.05)
    os.close(fd)
    os.unlink(target)
    print("filled", i, size, flush=True)
    time.sleep(0.8)
"""


class Producer(threading.Thread):
    """Binary batches to north as fast as it answers; 503 disk_full is waited out, not an error."""

    def __init__(self, url: str, seed: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.seed = seed
        self.acked: dict[tuple[int, int], bytes] = {}
        self.codes: dict[str, int] = {}
        self.unexpected: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        n = 0
        with httpx.Client(base_url=self.url, timeout=30) as c:
            while not self.stopping.is_set():
                p = (self.seed + n) % PARTITIONS
                values = [f"{self.seed}:{n}:{k}:".encode() + b"v" * 600 for k in range(20)]
                n += 1
                try:
                    r = c.post(
                        f"/v1/topics/t/partitions/{p}/batches",
                        content=encode_batch(values, timestamps=[1_795_000_000_000] * 20),
                        headers={"content-type": BATCH_MEDIA_TYPE},
                    )
                except httpx.HTTPError as exc:
                    self.unexpected.append(f"{type(exc).__name__}: {exc}")
                    return
                code = r.json().get("error", {}).get("code", "") if r.status_code != 200 else ""
                key = f"{r.status_code} {code}".strip()
                self.codes[key] = self.codes.get(key, 0) + 1
                if r.status_code == 200:
                    for v, o in zip(values, r.json()["offsets"], strict=True):
                        self.acked[(p, o["offset"])] = v
                elif r.status_code == 503 and code == "disk_full":
                    assert int(r.headers["retry-after"]) >= 1
                    time.sleep(0.02)  # a client honouring Retry-After would wait longer
                else:
                    self.unexpected.append(f"{r.status_code}: {r.text[:300]}")
                    return


def test_a_small_disk_filled_and_freed_by_another_process(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    root.mkdir()
    with mounted_tmpfs(root / "north", "24m") as disk:
        fleet = Fleet(
            root,
            ["north", "south"],
            [TopicSpec("t", "north", partitions=PARTITIONS, subscribers=("south",))],
        )
        producers: list[Producer] = []
        try:
            fleet.start()
            north, south = fleet["north"], fleet["south"]
            producers = [Producer(north.url, seed) for seed in range(2)]
            for p in producers:
                p.start()
            time.sleep(1.0)
            filler = subprocess.run(
                [sys.executable, "-c", FILLER, str(disk / "filler"), str(FILLS)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert filler.returncode == 0, filler.stderr
            time.sleep(1.0)  # intake after the last fill, without a restart
            for p in producers:
                p.stopping.set()
            for p in producers:
                p.join(timeout=60)
            assert north.running, f"north exited:\n{north.tail()}"
            for p in producers:
                assert p.unexpected == [], (p.unexpected, p.codes)
            codes: dict[str, int] = {}
            for p in producers:
                for k, v in p.codes.items():
                    codes[k] = codes.get(k, 0) + v
            assert set(codes) <= {"200", "503 disk_full"}, codes
            refused = codes.get("503 disk_full", 0)

            status = north.status()
            disk_doc = status["disk"]
            # The fills bit: the journal refused writes, or it kept making room
            # by deleting shipped segments early (when shipping keeps up it can
            # always do that, and never has to refuse: which of the two happens
            # depends on how the filler's grabs and the journal's deletions
            # interleave on this machine).
            assert refused > 0 or disk_doc["segments_deleted_for_space"] > 0, (codes, disk_doc)
            assert disk_doc["state"] == "ok", disk_doc
            if refused:
                assert disk_doc["full_episodes"] >= 1
            assert disk_doc["full_rejections"] == refused
            assert disk_doc["size_bytes"] == 24 * 1024 * 1024
            assert status["errors"] == {}
            r = httpx.post(
                f"{north.url}/v1/topics/t/records", json={"records": [{"value": "after"}]}
            )
            assert r.status_code == 200, r.text

            # Every acknowledged record reached south's mirror, at its offset.
            wait_mirrored(north, "t", south, timeout=60)
            acked: dict[tuple[int, int], bytes] = {}
            for p in producers:
                acked.update(p.acked)
            for part in range(PARTITIONS):
                mirrored = {r.offset: r.value for r in read_partition(south.url, "north.t", part)}
                lost = [o for (pp, o), v in acked.items() if pp == part and mirrored.get(o) != v]
                assert lost == [], f"north.t/{part}: {len(lost)} acknowledged records lost"
                # North still holds its newest records, the same ones.
                first = httpx.get(f"{north.url}/v1/topics/t").json()["partitions"][part][
                    "first_offset"
                ]
                held = read_partition(north.url, "t", part, start=first)
                assert all(mirrored[r.offset] == r.value for r in held)
            log = north.log.read_text(errors="replace")
            assert "Traceback" not in log
            if refused:
                assert "disk full writing" in log
            else:
                assert "before its retention ended: the disk is (nearly) full" in log
        finally:
            for p in producers:
                p.stopping.set()
            codes_at_exit = fleet.close()
    assert codes_at_exit == {"north": 0, "south": 0}, f"logs in {root}"
