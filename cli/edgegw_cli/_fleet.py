"""Several real gateways on one machine: what `edgegw demo` and `edgegw scenario` drive.

Each site is an `edgegw serve` process with its own data dir and config,
sharing one local-directory bucket; the API binds a free port and the site's
address is read from ``<data_dir>/api.addr``. :class:`MetadataProcess` runs
`edgegw metadata serve` beside them (the demo's topology comes from it).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from edge_gateway.datadir import DirectoryLock, holder_of, lock_directory
from edge_gateway.errors import InUse
from edgegw_cli._common import fail, fresh_dir
from edgegw_cli._errors import reason

BATCH_TYPE = "application/vnd.edgegw.batch"


def claim_work_dir(work_dir: Path, role: str) -> DirectoryLock:
    """Wipe ``work_dir`` and lock it for this run — unless something still runs in it.

    A second run on the same directory, or a gateway left running by a run
    that was killed, would lose its files under it: refuse instead.
    """
    try:
        dirs = (
            [work_dir, *(p for p in work_dir.iterdir() if p.is_dir())] if work_dir.is_dir() else []
        )
        for d in dirs:
            holder = holder_of(d)
            if holder is not None:
                busy = InUse(d, holder if holder.pid is not None else None)
                raise fail(f"{busy}; stop it, or give this run another --dir")
    except OSError as exc:
        raise fail(f"cannot use {work_dir} as the work directory: {reason(exc)}", 2) from None
    fresh_dir(work_dir)
    try:
        return lock_directory(work_dir, role)
    except InUse as exc:  # another run started in between
        raise fail(f"{exc}; give this run another --dir") from None
    except OSError as exc:
        raise fail(f"cannot use {work_dir} as the work directory: {reason(exc)}", 2) from None


@dataclass(frozen=True)
class FleetTopic:
    name: str
    home: str
    partitions: int
    subscribers: tuple[str, ...] = ("*",)

    def toml(self) -> str:
        subs = ", ".join(f'"{s}"' for s in self.subscribers)
        return (
            f'[[topics]]\nname = "{self.name}"\nhome = "{self.home}"\n'
            f"partitions = {self.partitions}\nsubscribers = [{subs}]\n"
        )


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM (a graceful shutdown) and wait; the exit code (-9 if it had to be killed)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return -9
    return proc.returncode


@dataclass
class Site:
    region: str
    data_dir: Path
    config: Path = field(default_factory=Path)
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    log_path: Path = field(default_factory=Path)
    paused: bool = False
    #: Names the config and log files (``<name>.toml``, ``<name>.log``); the
    #: region by default (a second gateway of the region needs another).
    name: str = ""
    #: Extra environment of the gateway process (e.g. libfaketime's).
    env: dict[str, str] = field(default_factory=dict)
    #: Extra TOML tables for the config (e.g. ``[journal]``).
    extra_toml: str = ""

    def write_config(
        self,
        bucket: Path,
        topics: Sequence[FleetTopic],
        flush_ms: int,
        poll_ms: int,
        *,
        metadata: tuple[str, str] | None = None,
        s3: tuple[str, str] | None = None,
    ) -> None:
        """Write the site's config: static ``topics``, or ``metadata=(url, token)``.

        ``s3=(endpoint_url, bucket_name)`` puts the bucket on an S3 server
        (moto's, through this site's link) instead of the directory ``bucket``.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if s3 is None:
            # A configured bucket.path must exist (a typo is refused): this fleet
            # starts a new bucket there, which the first gateway lays out.
            bucket.mkdir(parents=True, exist_ok=True)
            bucket_toml = f'[bucket]\ntype = "local"\npath = "{bucket}"\n'
        else:
            endpoint, name = s3
            # moto takes any credentials; path-style addressing on loopback.
            bucket_toml = (
                f'[bucket]\ntype = "s3"\nbucket = "{name}"\nendpoint_url = "{endpoint}"\n'
                'region = "us-east-1"\npath_style = true\n'
                'access_key = "testing"\nsecret_key = "testing"\n'
            )
        name = self.name or self.region
        self.config = self.data_dir.parent / f"{name}.toml"
        self.log_path = self.data_dir.parent / f"{name}.log"
        if metadata is not None:
            url, token = metadata
            topology = (
                f'[metadata]\nurl = "{url}"\ntoken = "{token}"\n'
                "poll_interval_ms = 1000\nheartbeat_interval_ms = 2000\n"
            )
        else:
            topology = "".join(t.toml() for t in topics)
        self.config.write_text(
            f'region = "{self.region}"\ndata_dir = "{self.data_dir}"\n'
            f"[shipper]\nflush_interval_ms = {flush_ms}\n"
            f"[mirror]\npoll_interval_ms = {poll_ms}\nmax_poll_interval_ms = 500\n"
            + bucket_toml
            + '[api]\nlisten = "127.0.0.1:0"\n'
            + self.extra_toml
            + topology
        )

    def start(self) -> None:
        (self.data_dir / "api.addr").unlink(missing_ok=True)
        self.url = ""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edgegw_cli", "serve", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env} if self.env else None,
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        addr = self.data_dir / "api.addr"
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        while not addr.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise fail(f"gateway {self.region} did not start; see {self.log_path}")
            time.sleep(0.05)
        text = addr.read_text().strip()
        self.url = text if "://" in text else f"http://{text}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: the graceful shutdown. Returns the exit code."""
        if self.proc is None:
            return 0
        if self.paused:
            self.resume()
        return stop_process(self.proc, timeout)

    def kill(self) -> None:
        """kill -9: no flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: the gateway hangs (a frozen VM, a stuck disk) without dying."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.proc is not None and self.paused:
            self.proc.send_signal(signal.SIGCONT)
            self.paused = False


class MetadataProcess:
    """`edgegw metadata serve` on a free loopback port, with a fresh admin token."""

    def __init__(self, work_dir: Path) -> None:
        self.db = work_dir / "meta.sqlite"
        self.addr_file = work_dir / "meta.addr"
        self.log_path = work_dir / "metadata.log"
        self.admin_token = secrets.token_urlsafe(24)
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 60.0) -> None:
        self.addr_file.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "edgegw_cli", "metadata", "serve", "--db", str(self.db)]
        argv += ["--listen", "127.0.0.1:0", "--addr-file", str(self.addr_file)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                # The token goes by the environment: not visible in `ps`.
                env={**os.environ, "EDGEGW_METADATA_ADMIN_TOKEN": self.admin_token},
            )
        deadline = time.monotonic() + timeout
        while not self.addr_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise fail(f"the metadata server did not start; see {self.log_path}")
            time.sleep(0.05)
        self.url = self.addr_file.read_text().strip()

    def admin(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def call(self, method: str, path: str, body: object = None) -> dict[str, object]:
        with self.admin() as c:
            r = c.request(method, path, json=body)
        if r.status_code >= 300:
            raise fail(f"metadata server: {method} {path} -> {r.status_code} {r.text[:200]}")
        doc: dict[str, object] = r.json() if r.content else {}
        return doc

    def add_region(self, region: str) -> str:
        """Register ``region``; returns its token."""
        return str(self.call("POST", "/v1/regions", {"id": region})["token"])

    def create_topic(self, topic: FleetTopic) -> None:
        subs: object = "*" if topic.subscribers == ("*",) else list(topic.subscribers)
        body = {"name": topic.name, "home": topic.home, "partitions": topic.partitions}
        self.call("POST", "/v1/topics", {**body, "subscribers": subs})

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        return stop_process(self.proc, timeout)


def high_watermarks(client: httpx.Client, topic: str) -> list[int]:
    r = client.get(f"/v1/topics/{topic}")
    r.raise_for_status()
    return [p["next_offset"] for p in r.json()["partitions"]]


def first_offsets(client: httpx.Client, topic: str) -> list[int]:
    """Each partition's first offset the gateway still serves (0 unless restored or trimmed)."""
    r = client.get(f"/v1/topics/{topic}")
    r.raise_for_status()
    return [p["first_offset"] for p in r.json()["partitions"]]


def all_records(
    client: httpx.Client, topic: str, partition: int, start: int = 0
) -> list[tuple[object, ...]]:
    """Every record of a partition from ``start`` on, as comparable tuples (offset, key, ...)."""
    out: list[tuple[object, ...]] = []
    offset = start
    while True:
        r = client.get(
            f"/v1/topics/{topic}/partitions/{partition}/records",
            params={"offset": offset, "max_records": 5000},
        )
        if r.status_code == 400 and not out and start > 0:
            # Trimmed meanwhile (a journal short of budget deletes old
            # segments): start again from what it serves now.
            first = first_offsets(client, topic)[partition]
            if first > offset:
                offset = first
                continue
        r.raise_for_status()
        doc = r.json()
        for rec in doc["records"]:
            out.append(
                (
                    rec["offset"],
                    rec.get("key"),
                    rec.get("key_b64"),
                    rec.get("value"),
                    rec.get("value_b64"),
                    rec["timestamp"],
                    tuple(sorted((rec.get("headers") or {}).items())),
                )
            )
        if doc["next_offset"] >= doc["high_watermark"] or not doc["records"]:
            return out
        offset = doc["next_offset"]


def wait_mirrored(home: Site, topic: str, other: Site, timeout: float) -> float:
    """Seconds until ``other`` mirrors everything ``home`` holds of ``topic``."""
    start = time.monotonic()
    with (
        httpx.Client(base_url=home.url, timeout=30) as h,
        httpx.Client(base_url=other.url, timeout=30) as o,
    ):
        want = high_watermarks(h, topic)
        while high_watermarks(o, f"{home.region}.{topic}") != want:
            if time.monotonic() - start > timeout:
                raise fail(f"{other.region} did not mirror {home.region}.{topic} in {timeout}s")
            time.sleep(0.05)
    return time.monotonic() - start


def mirror_mismatches(home: Site, topic: str, partitions: int, other: Site) -> list[str]:
    """Partitions where ``other``'s mirror differs from ``home``'s topic, record for record.

    Compared from the later of the offsets each serves first: a restored home
    serves only what it took after the restore, and a journal short of disk
    budget deletes mirror segments early (the bucket still holds them).
    """
    bad = []
    with (
        httpx.Client(base_url=home.url, timeout=30) as h,
        httpx.Client(base_url=other.url, timeout=30) as o,
    ):
        mirrored = first_offsets(o, f"{home.region}.{topic}")
        starts = [max(a, b) for a, b in zip(first_offsets(h, topic), mirrored, strict=True)]
        for p in range(partitions):
            mine = all_records(h, topic, p, starts[p])
            theirs = all_records(o, f"{home.region}.{topic}", p, starts[p])
            # Either may have been trimmed further while read: the overlap.
            cut = max([r[0] for r in mine[:1] + theirs[:1]], default=0)
            assert isinstance(cut, int)
            if [r for r in mine if r[0] >= cut] != [r for r in theirs if r[0] >= cut]:
                bad.append(f"{other.region}:{home.region}.{topic}/{p}")
    return bad


def bucket_figures(bucket: Path, region: str) -> tuple[int, int]:
    """(log objects, bytes) of a region's log in a local-directory bucket."""
    log = bucket / "objects" / "regions" / region / "log"
    files = list(log.glob("*.egw")) if log.exists() else []
    return len(files), sum(f.stat().st_size for f in files)
