"""A single-node Ceph cluster with RGW on loopback, for the RGW test tier (``-m rgw``).

Debian 12's ``ceph-mon``, ``ceph-osd`` and ``radosgw`` (16.2 Pacific) run a
whole cluster as three processes in one scratch directory: one monitor, one
OSD on ``memstore`` (objects in RAM, capped at 1 GiB), no authentication,
pools of size 1, and RGW's beast frontend on a free 127.0.0.1 port. The
processes run in the foreground as children of the test session (no
daemonizing, no systemd), so :meth:`RgwCluster.stop` ends exactly them.
Starting takes ~10-15 s here; see docs/operations.md ("Stores tested").

``make test-stores`` installs the packages when missing and runs the tier.
"""

from __future__ import annotations

import http.client
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from edge_gateway.testing.ports import free_port

#: The packages that provide the binaries below (Debian 12: 16.2).
PACKAGES: Final = ("radosgw", "ceph-mon", "ceph-osd")
BINARIES: Final = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "monmaptool", "ceph")
ACCESS_KEY: Final = "EDGEGWRGWTEST"
SECRET_KEY: Final = "edgegw-rgw-test-secret"


def missing_binaries() -> list[str]:
    """The Ceph programs this machine lacks (empty: the tier can run)."""
    return [b for b in BINARIES if shutil.which(b) is None]


@dataclass
class RgwCluster:
    """A running mon + OSD + RGW; :meth:`stop` ends them."""

    root: Path
    endpoint: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        """Terminate RGW, then the OSD, then the monitor (kill after 10 s each)."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _conf(root: Path, fsid: str, mon_port: int, rgw_port: int) -> str:
    return f"""[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{mon_port}
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
# With auth none, the messenger's "secure" mode (RGW's default towards the
# monitor) has no keys to use: crc only.
ms mon client mode = crc
ms client mode = crc
ms bind ipv6 = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon warn on pool no redundancy = false
osd objectstore = memstore
memstore device bytes = 1073741824
osd data = {root}/osd
mon data = {root}/mon
run dir = {root}/run
admin socket = {root}/run/$name.asok
log file = {root}/$name.log
keyring = {root}/keyring
osd max object name len = 256
osd max object namespace len = 64
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:{rgw_port}
rgw data = {root}/rgw
"""


def _run(root: Path, *argv: str, timeout: float = 60) -> str:
    done = subprocess.run(
        [*argv, "-c", str(root / "ceph.conf")],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _answers(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def start_rgw(root: Path, *, timeout: float = 120.0) -> RgwCluster:
    """Make and start a cluster under ``root`` (empty or missing); return once RGW answers
    and the test user (:data:`ACCESS_KEY`, :data:`SECRET_KEY`) exists."""
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)}: apt-get install -y {' '.join(PACKAGES)}")
    for sub in ("mon", "osd", "run", "rgw"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    mon_port, rgw_port = free_port(), free_port()
    fsid = str(uuid.uuid4())
    (root / "ceph.conf").write_text(_conf(root, fsid, mon_port, rgw_port))
    cluster = RgwCluster(root, f"http://127.0.0.1:{rgw_port}")
    conf = str(root / "ceph.conf")

    def spawn(*argv: str) -> None:
        with (root / f"{argv[0]}.out").open("ab") as out:
            cluster.processes.append(
                subprocess.Popen(
                    [*argv, "-f", "-c", conf],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )

    try:
        monmap = str(root / "monmap")
        address = f"[v2:127.0.0.1:{mon_port}]"
        subprocess.run(
            ["monmaptool", "--create", "--addv", "a", address, "--fsid", fsid, monmap],
            capture_output=True,
            check=True,
            timeout=30,
        )
        _run(root, "ceph-mon", "--mkfs", "-i", "a", "--monmap", monmap)
        spawn("ceph-mon", "-i", "a")
        osd_id = _run(root, "ceph", "osd", "create").strip()
        _run(root, "ceph-osd", "-i", osd_id, "--mkfs")
        spawn("ceph-osd", "-i", osd_id)
        spawn("radosgw", "-n", "client.rgw")
        deadline = time.monotonic() + timeout
        while not _answers(rgw_port):
            dead = [p.args[0] for p in cluster.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{dead} exited" if dead else f"RGW did not answer within {timeout} s"
                raise RuntimeError(f"Ceph cluster in {root}: {why}; see the logs there")
            time.sleep(0.2)
        _run(
            root,
            "radosgw-admin",
            "user",
            "create",
            "--uid",
            "edgegw",
            "--display-name",
            "edgegw tests",
            "--access-key",
            ACCESS_KEY,
            "--secret-key",
            SECRET_KEY,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster
