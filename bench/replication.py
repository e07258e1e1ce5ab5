"""Replication between two gateway processes through moto's S3 server on loopback.

Regions ``a`` and ``b`` run as real ``edgegw serve`` processes; topic ``t`` is
homed at ``a`` and mirrored by ``b`` (flush 250 ms, poll 100 ms). Each gateway
reaches the bucket through its own TCP proxy (a thread of this process), so
``b`` can be cut off alone -- except during the catch-ups (b), (b'), (b'') and
(f)'s, where ``b`` reaches moto directly, like the raw GETs they are compared
with; (b*) runs the same catch-up through the proxy and prints what it costs.

(a) end-to-end latency: single records produced at ``a`` at a steady rate, a
    long-polling consumer at ``b`` on the mirror; latency = visible at b -
    acknowledged at a (one process, one clock); and b's GETs of log entries
    per entry a wrote, with the 404s among them (the cost of polling and of
    asking ahead);
(b) catch-up: a backlog produced at ``a`` while ``b`` is stopped, sized in
    log-object bytes (256 MB, ``--backlog-mb``; ~2.9 GB of reference records,
    ``TelemetryBacklog``, the same records for every catch-up phase of a run);
    ``b`` starts and mirrors it; MB/s of log objects until caught up, next to raw boto3
    GETs of the same objects (8 threads, like the tailer's prefetch); CPU
    seconds of ``b``'s process per MB of log objects, next to the CPU of the
    raw GETs (this process) per MB; and what the CPU alone allows on this
    machine: ``b``'s CPU and moto's over the catch-up, spread over the cores
    (``catchup_cpu_floor_s``), and the raw GETs' seconds over that floor
    (``catchup_ratio_cpu_ceiling``: the most ``catchup_ratio`` could be with
    this CPU per byte, every core busy all the time); and the same objects
    fetched with the catch-up's pattern and nothing else (``windowed_gets``:
    the same LIST and manifest GET first, then GETs in seq order, at most 8
    not yet taken in order, direct like b): ``catchup_ratio_window_ceiling``
    = raw GETs' seconds over those, the most ``catchup_ratio`` can be with
    that window and order on this store; ``catchup_vs_windowed`` = the
    catch-up's speed over theirs;
(b') the same catch-up with ``b`` appending batch by batch (``[mirror]
    keep_blocks = false``, the path before block entries): MB/s beside raw
    GETs of its objects, CPU per MB and journal bytes per bucket byte beside
    (b)'s (``mirror_bytes_per_bucket_byte``: ``b``'s journal growth over the
    log objects' bytes, target <= 1.2);
(b'') the same catch-up with every GET through botocore (``[bucket] lean_get =
    false``, the S3 backend's path before the lean GET path): MB/s beside raw
    GETs of its objects, and CPU per MB beside (b)'s (``lean_vs_botocore_cpu``);
(b*) the same catch-up with ``b`` behind its TCP proxy (how every catch-up
    ran before): MB/s beside raw GETs direct and through an identical proxy
    (``proxied_catchup_ratio`` against direct, the old ``catchup_ratio``;
    ``proxied_catchup_ratio_vs_proxied_raw`` proxy against proxy;
    ``proxy_cost_raw_gets`` = raw GETs' speed through the proxy over direct),
    in-order GETs through b's proxy (``proxied_window_ceiling``), and this
    process's CPU per MB during the catch-up (the proxies' thread:
    ``proxied_bench_cpu_ms_per_mb``). With ``--profile-b FILE``, py-spy
    records ``b`` during (b)'s catch-up (raw collapsed stacks, 250 Hz);
(c) idle: requests per second ``b`` makes when nothing happens (S3 polling
    mode, no metadata server), from moto's request log (``a`` has no sources,
    so an idle ``a`` makes none);
(d) resume: ``b``'s proxy refuses connections for 10 s while ``a`` produces;
    then it passes again; seconds until ``b``'s mirror advances;
(e) head relay: both gateways restart with a metadata server (``edgegw
    metadata serve``) holding the same topology; end-to-end latency again,
    now with ``b``'s mirror woken by relayed heads instead of polling, and
    the requests both gateways make to the bucket over 30 s of idleness
    (10 s with --quick; the target is none at all);
(f) encryption: both restart in S3 polling mode with ``[encryption]`` on
    (``a`` seals its log objects with AES-256-GCM, ``b`` holds ``a``'s key);
    (a) and (b) again -- latency, catch-up MB/s of records and CPU per MB --
    each printed beside the plaintext figure of the same run, with the ratio
    (``sealed_catchup_ratio`` = sealed / plaintext records MB/s). Runs before
    (e), so both use the same polling mode.
(g) small-entry catch-up (last, on its own bucket and gateways): a fresh
    ``a`` flushing every 5 ms takes single ~180 B telemetry records until its
    log holds N entries (1,500; 400 with --quick) of ~400 B each, all under
    manifests; a fresh ``b`` with ``[mirror] packs = false`` mirrors it (one
    GET per entry), then a fresh ``c`` with packs on (a's shipper wrote a pack
    before each manifest). For each: seconds and entries/s from its API
    answering to its mirror holding every record, its GETs of log entries
    and of packs and all its requests (moto's log), its CPU seconds; the
    baseline is raw boto3 GETs of the same entry keys (8 threads).
    ``small_catchup_ratio_vs_raw`` = packs on / raw GETs entries/s,
    ``small_catchup_speedup_packs`` = packs on / packs off.
    ``--small-entries N`` sets N; ``--small-link`` puts the readers (and
    the raw GETs) behind the soak's link: 30 +- 10 ms each way, 8 Mbit/s up,
    16 Mbit/s down (a restored site replaying the others' history).

Usage: python bench/replication.py [--quick] [--backlog-mb MB] [--profile-b FILE]
[--small-only] [--small-entries N] [--small-link]. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    MB,
    Row,
    emit_json,
    machine_info,
    percentile,
    progress,
    ratio,
    render_table,
    scratch_dir,
)
from edgegw_cli._fleet import BATCH_TYPE, MetadataProcess, Site, high_watermarks

from edge_gateway.encryption import write_key_file
from edge_gateway.format.batch import encode_batch
from edge_gateway.format.crypt import generate_key
from edge_gateway.sample_data import TelemetryGenerator
from edge_gateway.testing.moto import s3_client, start_moto_server
from edge_gateway.testing.tcpproxy import LinkShape, TcpProxy

BUCKET = "edgegw-bench"
PARTITIONS = 4


def write_config(
    site: Site,
    proxy: TcpProxy | str,
    metadata: tuple[str, str] | None = None,
    key_file: Path | None = None,
    *,
    bucket: str = BUCKET,
    flush_interval_ms: int = 250,
    subscribers: tuple[str, ...] = ("b",),
    mirror_packs: bool | None = None,
    mirror_keep_blocks: bool | None = None,
    lean_get: bool | None = None,
) -> None:
    encryption = ""
    if key_file is not None:  # a seals with it, b opens a's objects with it
        encryption = (
            f'[encryption]\nkey_file = "{key_file}"\n'
            if site.region == "a"
            else f'[encryption.sources.a]\nkey_files = ["{key_file}"]\n'
        )
    topology = f"""
[[topics]]
name = "t"
home = "a"
partitions = {PARTITIONS}
subscribers = [{", ".join(f'"{r}"' for r in subscribers)}]
"""
    if metadata is not None:
        topology = f"""
[metadata]
url = "{metadata[0]}"
token = "{metadata[1]}"
poll_interval_ms = 1000
"""
    # Written only when asked: the other sections run with the default.
    packs = "" if mirror_packs is None else f"packs = {'true' if mirror_packs else 'false'}\n"
    if mirror_keep_blocks is not None:
        packs += f"keep_blocks = {'true' if mirror_keep_blocks else 'false'}\n"
    lean = "" if lean_get is None else f"lean_get = {'true' if lean_get else 'false'}\n"
    # b's journal keeps every byte it mirrors in a run (the per-batch phase
    # alone writes ~3 GB of records): its growth is the mirror's bytes at rest,
    # which deleting shipped segments past the default retention would hide.
    journal = '[journal]\nmax_bytes = "16GiB"\n' if site.region == "b" else ""
    site.data_dir.mkdir(parents=True, exist_ok=True)
    site.config = site.data_dir.parent / f"{site.region}.toml"
    site.log_path = site.data_dir.parent / f"{site.region}.log"
    site.config.write_text(
        f"""
region = "{site.region}"
data_dir = "{site.data_dir}"
[shipper]
flush_interval_ms = {flush_interval_ms}
[mirror]
poll_interval_ms = 100
{packs}[bucket]
type = "s3"
bucket = "{bucket}"
endpoint_url = "{proxy if isinstance(proxy, str) else proxy.url}"
region = "us-east-1"
path_style = true
access_key = "testing"
secret_key = "testing"
connect_timeout = 1.0
read_timeout = 5.0
max_attempts = 2
{lean}[gc]
enabled = false
[api]
listen = "127.0.0.1:0"
[log]
level = "warning"
{journal}{encryption}{topology}"""
    )


def latency(a: Site, b: Site, count: int, rate: float) -> list[float]:
    acked: dict[int, float] = {}
    seen: dict[int, float] = {}
    with httpx.Client(base_url=b.url, timeout=30) as c:
        start = high_watermarks(c, "a.t")[0]
    stop = threading.Event()

    def follow() -> None:
        offset = start
        with httpx.Client(base_url=b.url, timeout=30) as c:
            deadline = None
            while deadline is None or time.monotonic() < deadline:
                if stop.is_set() and deadline is None:
                    deadline = time.monotonic() + 15
                if stop.is_set() and len(seen) >= len(acked):
                    return
                r = c.get(
                    "/v1/topics/a.t/partitions/0/records",
                    params={"offset": offset, "wait_ms": 500},
                )
                now = time.monotonic()
                for rec in r.json()["records"]:
                    seen.setdefault(rec["offset"], now)
                    offset = rec["offset"] + 1

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    interval = 1 / rate
    next_at = time.monotonic()
    with httpx.Client(base_url=a.url, timeout=30) as c:
        for i in range(count):
            r = c.post(
                "/v1/topics/t/records",
                json={"records": [{"value": f"probe {i}", "partition": 0}]},
            )
            r.raise_for_status()
            acked[r.json()["offsets"][0]["offset"]] = time.monotonic()
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
    stop.set()
    t.join(timeout=30)
    return [(seen[o] - at) * 1000 for o, at in acked.items() if o in seen]


def wait_relayed(b: Site, timeout: float = 60) -> None:
    """Wait until b's mirror of a follows relayed heads."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=b.url, timeout=30) as c:
        while True:
            doc = c.get("/v1/status").json()
            mirror = doc["mirrors"].get("a")
            if doc["metadata"]["relay"].get("active") and mirror and mirror["relay"]:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"b never followed relayed heads: {doc['metadata']}")
            time.sleep(0.05)


class TelemetryBacklog:
    """The reference telemetry records of shared/WORKLOADS.md, as encoded batches of 2,000.

    ``TelemetryGenerator``'s model (one reading per sensor in turn, 500
    sensors; temperature and humidity drifting as random walks, noise on
    every reading, the battery draining), drawn with numpy a round of sensors
    at a time: ~45 MB/s of records against ~9 for the generator's per-record
    loop, which a backlog of ~2.8 GB of records could not wait for. The same
    distributions, so zstd compresses them alike (14.05x and 14.05x in 1 MiB
    blocks, level 3, checked when this was written); deterministic from
    ``seed``.

    The batches are spooled to ``path`` as they are first drawn: every
    catch-up phase of a run replays the same records from the start (and
    draws more only when it needs more), so phases compare like for like and
    the records are drawn once per run.
    """

    ROUNDS = 4  # rounds of 500 sensors: 2,000 records a batch

    def __init__(self, path: Path, *, sensors: int = 500, seed: int = 11) -> None:
        import numpy as np

        self._np = np
        self._rng = np.random.default_rng(seed)
        self._ids = [f"s-{i:05d}" for i in range(sensors)]
        self._temp = self._rng.uniform(15.0, 25.0, sensors)
        self._hum = self._rng.uniform(30.0, 60.0, sensors)
        self._now = 1_795_000_000_000
        self._seq = 0
        self._path = path
        #: (offset in the spool, batch length, record bytes) per batch drawn so far
        self._index: list[tuple[int, int, int]] = []
        self._spool = open(path, "w+b")  # noqa: SIM115 - closed by close()

    def close(self) -> None:
        self._spool.close()

    def _draw(self) -> tuple[bytes, int]:
        """The next batch: its encoding and its records' bytes."""
        np, rng = self._np, self._rng
        shape = (self.ROUNDS, len(self._ids))
        temp = self._temp + np.cumsum(rng.normal(0, 0.02, shape), axis=0)
        hum = np.clip(self._hum + np.cumsum(rng.normal(0, 0.05, shape), axis=0), 0.0, 100.0)
        self._temp, self._hum = temp[-1].copy(), hum[-1].copy()
        t_out = np.round(temp + rng.normal(0, 0.05, shape), 2).ravel().tolist()
        h_out = np.round(hum, 1).ravel().tolist()
        vib = np.round(np.abs(rng.normal(0.01, 0.004, shape)), 3).ravel().tolist()
        pres = np.round(1013.25 + (temp - 20.0) * 0.8 + rng.normal(0, 0.1, shape), 2)
        p_out = pres.ravel().tolist()
        n = shape[0] * shape[1]
        bat = np.round(3.7 - (self._seq + np.arange(n)) * 1e-7, 3).tolist()
        keys, values, stamps = [], [], []
        second, head = -1, ""
        for k in range(n):
            seq, now = self._seq + k, self._now + k * 10
            if now // 1000 != second:
                second = now // 1000
                head = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
            sid = self._ids[k % len(self._ids)]
            # json.dumps's layout and float repr (TelemetryGenerator's), written out
            values.append(
                f'{{"sensor_id": "{sid}", "site": "a", "ts": "{head}{now % 1000:03d}Z", '
                f'"temperature": {t_out[k]!r}, "humidity": {h_out[k]!r}, '
                f'"vibration": {vib[k]!r}, "pressure_hpa": {p_out[k]!r}, '
                f'"battery_v": {bat[k]!r}, "status": "ok", "seq": {seq}}}'.encode()
            )
            keys.append(sid.encode())
            stamps.append(now)
        self._seq += n
        self._now += n * 10
        return encode_batch(values, keys=keys, timestamps=stamps), sum(map(len, values))

    def batches(self) -> Iterator[tuple[bytes, int]]:
        """The batches from the first, for ever: replayed from the spool, then drawn anew."""
        i = 0
        while True:
            if i == len(self._index):
                batch, nbytes = self._draw()
                self._spool.seek(0, os.SEEK_END)
                self._index.append((self._spool.tell(), len(batch), nbytes))
                self._spool.write(batch)
                yield batch, nbytes
            else:
                at, size, nbytes = self._index[i]
                self._spool.seek(at)
                yield self._spool.read(size), nbytes
            i += 1


def post_batches(a: Site, batches: Iterator[tuple[bytes, int]], nbytes: int) -> int:
    """POST batches at ``a``, partitions in turn, until ``nbytes`` of records; returns the bytes.

    A ``503 journal_full`` (a's journal full of what it has not shipped yet)
    is retried after its Retry-After, as a producer would.
    """
    produced = 0
    with httpx.Client(base_url=a.url, timeout=60) as c:
        p = 0
        while produced < nbytes:
            batch, size = next(batches)
            while True:
                r = c.post(
                    f"/v1/topics/t/partitions/{p}/batches",
                    content=batch,
                    headers={"content-type": BATCH_TYPE},
                )
                if r.status_code != 503:
                    break
                time.sleep(float(r.headers.get("retry-after", "1")))
            r.raise_for_status()
            produced += size
            p = (p + 1) % PARTITIONS
    return produced


#: Record bytes per byte of log object assumed before a backlog's first
#: objects are measured (the reference records compress ~11.4x in log objects).
_FIRST_GUESS_RATIO = 11.0


def produce_backlog(
    a: Site, s3: Any, after_seq: int, wire_bytes: int, records: TelemetryBacklog
) -> int:
    """Produce at ``a`` until its log holds ``wire_bytes`` of new log objects (after
    ``after_seq``), within a few percent; returns the record bytes produced.

    Sized in log-object bytes, what a catch-up fetches: in rounds, each
    asking for the bytes still missing at the compression measured so far
    (a first round of 95% of the target at a guess of 11x), each waiting for
    a to ship.
    """
    batches = records.batches()
    produced = wire = 0
    per_wire = _FIRST_GUESS_RATIO * 0.95
    while wire < wire_bytes * 0.97:
        produced += post_batches(a, batches, int((wire_bytes - wire) * per_wire))
        wait_shipped(a)
        wire = sum(size for _, size in log_objects(s3, after_seq))
        per_wire = produced / max(1, wire)
    return produced


def wait_shipped(site: Site, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=site.url, timeout=30) as c:
        while True:
            doc = c.get("/v1/topics/t").json()
            if all(p["unshipped"] == 0 for p in doc["partitions"]):
                return
            if time.monotonic() > deadline:
                raise SystemExit("a did not ship its backlog in time")
            time.sleep(0.1)


def wait_caught_up(a: Site, b: Site, timeout: float = 300) -> None:
    """Return once ``b``'s mirror holds every record ``a`` holds (polling b's API).

    Every 20 ms, or 0.5% of the time waited so far when that is longer: the
    end is seen within 0.5% (20 ms at most before 4 s) while b answers fewer
    polls in a long catch-up (each costs b CPU that a catch-up at a real site
    does not spend: 10-20% of the busy samples of b's event loop at 50 polls/s in
    the profiles of docs/mirroring.md).
    """
    with (
        httpx.Client(base_url=a.url, timeout=30) as ca,
        httpx.Client(base_url=b.url, timeout=30) as cb,
    ):
        want = high_watermarks(ca, "t")
        started = time.monotonic()
        deadline = started + timeout
        while high_watermarks(cb, "a.t") != want:
            now = time.monotonic()
            if now > deadline:
                raise SystemExit("b did not catch up in time")
            time.sleep(max(0.02, (now - started) * 0.005))


def journal_bytes(site: Site) -> int:
    """The bytes ``site``'s journal holds (its status: entries and index files)."""
    with httpx.Client(base_url=site.url, timeout=30) as c:
        return int(c.get("/v1/status").json()["journal"]["bytes"])


def catch_up(
    a: Site,
    b: Site,
    s3: Any,
    backlog: int,
    records: TelemetryBacklog,
    server_pid: int,
    profile: Path | None = None,
) -> tuple[int, list[tuple[str, int]], int, float, float, float, int, float]:
    """A backlog of ``backlog`` bytes of log objects produced at ``a`` while ``b``
    is stopped (``records`` from the first), then ``b`` catches up.

    Returns (record bytes produced, the log objects, their bytes, seconds to
    catch up, CPU seconds of ``b``'s process meanwhile, CPU seconds of the
    server ``server_pid`` -- moto -- meanwhile, the bytes ``b``'s journal grew
    by: the mirror's bytes at rest for the objects' bytes, CPU seconds of this
    process meanwhile: the TCP proxies' thread when ``b`` goes through one).
    With ``profile``, py-spy records ``b`` during the catch-up into that file
    (raw: collapsed stacks, one line per stack with its count).
    """
    wait_shipped(a)
    before = head_seq(s3)
    held = journal_bytes(b)
    assert b.stop() == 0
    produced = produce_backlog(a, s3, before, backlog, records)
    objects = log_objects(s3, before)
    wire = sum(size for _, size in objects)
    b.start()
    assert b.proc is not None
    spy = None
    if profile is not None:
        # Attached while b imports, before it is ready: b starts mirroring as
        # soon as it is, and the catch-up must not pass before py-spy is on.
        time.sleep(0.2)
        profile.parent.mkdir(parents=True, exist_ok=True)
        cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(b.proc.pid)]
        cmd += ["-r", "250", "-f", "raw", "-o", str(profile), "--nonblocking"]
        spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    b.wait_ready()
    c0 = cpu_seconds(b.proc.pid)
    s0 = cpu_seconds(server_pid)
    p0 = time.process_time()
    t0 = time.perf_counter()
    wait_caught_up(a, b)
    elapsed = time.perf_counter() - t0
    cpu = cpu_seconds(b.proc.pid) - c0
    own = time.process_time() - p0
    server = cpu_seconds(server_pid) - s0
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    grown = journal_bytes(b) - held
    return produced, objects, wire, elapsed, cpu, server, grown, own


def log_objects(s3: Any, after_seq: int, bucket: str = BUCKET) -> list[tuple[str, int]]:
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix="regions/a/log/"
    ):
        for obj in page.get("Contents", []):
            seq = int(obj["Key"].rsplit("/", 1)[1].split(".")[0])
            if seq > after_seq:
                out.append((obj["Key"], obj["Size"]))
    return out


def head_seq(s3: Any, bucket: str = BUCKET) -> int:
    objs = log_objects(s3, 0, bucket)
    return max((int(k.rsplit("/", 1)[1].split(".")[0]) for k, _ in objs), default=0)


def raw_gets(s3: Any, keys: list[str], bucket: str = BUCKET) -> tuple[float, float]:
    """Seconds to GET ``keys`` with 8 threads, and the CPU seconds this process spent."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.get_object(Bucket=bucket, Key=k)["Body"].read(), keys))
    return time.perf_counter() - t0, time.process_time() - c0


def windowed_gets(s3: Any, keys: list[str], window: int = 8, bucket: str = BUCKET) -> float:
    """Seconds for the catch-up's fetch pattern alone, with no journal and no gateway.

    The same start as the tailer's catch-up (a LIST of a's manifests, then a
    GET of the newest, which the tailer plans from), then the objects' GETs in
    seq order with at most ``window`` (``prefetch_objects``) not yet taken in
    order: a slot frees only when its object's turn comes, as the tailer's
    slot frees when its entry is applied. What no tailer can beat with that
    window, in order, through the same client path: the same-run ceiling of
    ``catchup_ratio`` (against the raw GETs, unordered, 8 threads).
    """
    t0 = time.perf_counter()
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="regions/a/manifest/").get("Contents", [])
    if listed:
        s3.get_object(Bucket=bucket, Key=listed[-1]["Key"])["Body"].read()
    pending: collections.deque[concurrent.futures.Future[bytes]] = collections.deque()
    with concurrent.futures.ThreadPoolExecutor(window) as pool:
        for key in keys:
            if len(pending) == window:
                pending.popleft().result()  # the oldest one's turn: its slot frees
            pending.append(
                pool.submit(lambda k: s3.get_object(Bucket=bucket, Key=k)["Body"].read(), key)
            )
        for f in pending:
            f.result()
    return time.perf_counter() - t0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log_gets(reqs: list[Any]) -> tuple[int, int]:
    """GETs of region a's log entries among ``reqs``, and how many of them were 404s."""
    gets = [r for r in reqs if r.method == "GET" and "/regions/a/log/" in r.path]
    return len(gets), sum(1 for r in gets if r.status == 404)


SMALL_BUCKET = "edgegw-bench-small"


def produce_small(a: Site, s3: Any, entries: int) -> int:
    """Single telemetry records (~200 B) at ``a``, one per flush, until its log holds ``entries``.

    Returns the records produced.
    """
    gen = TelemetryGenerator(site="a", sensors=50, seed=5)
    produced = 0
    with httpx.Client(base_url=a.url, timeout=30) as c:
        while head_seq(s3, SMALL_BUCKET) < entries:
            for _ in range(100):
                value = gen.take(1)[0].value.decode()
                c.post(
                    "/v1/topics/t/records",
                    json={"records": [{"value": value, "partition": produced % PARTITIONS}]},
                ).raise_for_status()
                produced += 1
                time.sleep(0.008)  # past a's 5 ms flush: about one entry per record
    return produced


def manifested_seq(s3: Any) -> int:
    """The highest log seq a manifest of region ``a`` covers (manifests are named by it)."""
    last = 0
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=SMALL_BUCKET, Prefix="regions/a/manifest/"
    ):
        for obj in page.get("Contents", []):
            last = max(last, int(obj["Key"].rsplit("/", 1)[1].split(".")[0]))
    return last


#: ``--small-link``: the soak's link (bench/soak.py), both ways.
SOAK_LINK = LinkShape(
    up_bytes_per_s=1_000_000, down_bytes_per_s=2_000_000, latency_s=0.03, jitter_s=0.01
)


def small_reader(
    root: Path, region: str, moto: Any, s3: Any, a: Site, packs: bool, shape: LinkShape | None
) -> dict[str, Any]:
    """A fresh gateway ``region`` mirrors a's whole log of small entries; what it cost.

    Seconds and CPU run from its API answering to its mirror holding every
    record; the requests are moto's log of the same span (the bucket is this
    section's own, so only this reader's requests are in it).
    """
    proxy = TcpProxy("127.0.0.1", moto.port, shape=shape).start()
    site = Site(region, (root / region).resolve())
    write_config(
        site,
        proxy,
        bucket=SMALL_BUCKET,
        subscribers=("b", "c"),
        mirror_packs=packs,
    )
    try:
        mark = moto.log_position()
        spawned = time.perf_counter()
        site.start()
        site.wait_ready()
        assert site.proc is not None
        c0 = cpu_seconds(site.proc.pid)
        t0 = time.perf_counter()
        with httpx.Client(base_url=site.url, timeout=30) as c:
            # The tailer may start before the API answers: what it had already
            # mirrored then is outside the timed span (should be ~0).
            at_ready = sum(high_watermarks(c, "a.t"))
        wait_caught_up(a, site)
        seconds = time.perf_counter() - t0
        from_spawn = time.perf_counter() - spawned
        cpu = cpu_seconds(site.proc.pid) - c0
        with httpx.Client(base_url=site.url, timeout=30) as c:
            m = c.get("/v1/status").json()["mirrors"]["a"]
        time.sleep(0.2)  # moto logs a request after answering it
        reqs = [r for r in moto.requests(since=mark) if r.bucket == SMALL_BUCKET]
    finally:
        site.stop()
        proxy.stop()
    log_gets = [r for r in reqs if r.method == "GET" and r.key.startswith("regions/a/log/")]
    return {
        "s": seconds,
        "s_from_spawn": from_spawn,
        "records_at_ready": at_ready,
        "cpu_s": cpu,
        "log_gets": len(log_gets),
        "log_404s": sum(1 for r in log_gets if r.status == 404),
        "pack_gets": sum(
            1 for r in reqs if r.method == "GET" and r.key.startswith("regions/a/pack/")
        ),
        "requests": len(reqs),
        "pack_reads": m.get("pack_reads"),
        "pack_entries": m.get("pack_entries"),
        "pack_fallbacks": m.get("pack_fallbacks"),
    }


def small_catch_up(
    root: Path, moto: Any, s3: Any, entries: int, shape: LinkShape | None = None
) -> dict[str, Any]:
    """(g): a log of ``entries`` small entries, mirrored by a fresh reader without and with packs.

    Its own bucket and gateways: ``a`` flushes every 5 ms (so nearly every
    record is an entry of its own, as at a quiet site), ``b`` reads it with
    ``[mirror] packs = false``, then ``c`` (a fresh data dir, the same bucket
    contents) with packs on. Baseline: raw boto3 GETs of the same entry keys,
    8 threads.
    """
    s3.create_bucket(Bucket=SMALL_BUCKET)
    proxy = TcpProxy("127.0.0.1", moto.port).start()
    a = Site("a", (root / "a").resolve())
    write_config(a, proxy, bucket=SMALL_BUCKET, flush_interval_ms=5, subscribers=("b", "c"))
    f: dict[str, Any] = {}
    try:
        a.start()
        a.wait_ready()
        t0 = time.perf_counter()
        f["small_records"] = produce_small(a, s3, entries)
        wait_shipped(a)
        head = head_seq(s3, SMALL_BUCKET)
        # Wait for the manifest of the last entries (manifest_interval_ms, 10 s):
        # the reader that was away finds every entry under a manifest (and its pack).
        deadline = time.monotonic() + 30
        while manifested_seq(s3) < head and time.monotonic() < deadline:
            time.sleep(0.2)
        f["small_produce_s"] = time.perf_counter() - t0
        f["small_manifested_seq"] = manifested_seq(s3)
        objects = log_objects(s3, 0, SMALL_BUCKET)
        f["small_entries"] = len(objects)
        f["small_entry_bytes_mean"] = sum(size for _, size in objects) / max(1, len(objects))
        with httpx.Client(base_url=a.url, timeout=30) as c:
            shipper = c.get("/v1/status").json()["shipper"]
        f["small_packs_written"] = shipper.get("packs")
        f["small_pack_bytes"] = shipper.get("pack_bytes")
        for region, packs, tag in (("b", False, "off"), ("c", True, "on")):
            progress(f"(g) {region} catches up on {len(objects)} entries, packs {tag} ...")
            r = small_reader(root, region, moto, s3, a, packs, shape)
            for k, v in r.items():
                f[f"small_{tag}_{k}"] = v
            f[f"small_{tag}_entries_per_s"] = len(objects) / r["s"]
        keys = [k for k, _ in objects]
        if shape is None:
            raw_s, _ = raw_gets(s3, keys, SMALL_BUCKET)
        else:
            with TcpProxy("127.0.0.1", moto.port, shape=shape) as link:
                raw_s, _ = raw_gets(s3_client(link.url), keys, SMALL_BUCKET)
        f["small_raw_s"] = raw_s
        f["small_raw_entries_per_s"] = len(objects) / raw_s
    finally:
        a.stop()
        proxy.stop()
    f["small_catchup_ratio_vs_raw"] = ratio(
        f["small_on_entries_per_s"], f["small_raw_entries_per_s"]
    )
    f["small_catchup_speedup_packs"] = ratio(
        f["small_on_entries_per_s"], f["small_off_entries_per_s"]
    )
    return f


def small_rows(f: dict[str, Any]) -> list[Row | str]:
    """The table rows of (g)."""
    return [
        f"(g) small-entry catch-up: {f['small_entries']} entries of "
        f"{f['small_entry_bytes_mean']:.0f} B (a flushes every 5 ms), "
        f"{f['small_packs_written']} packs"
        + (" -- quick: 400 entries instead of 1,500" if f["quick"] else "")
        + (
            "; readers and raw GETs behind the soak's link (60 ms RTT, 8/16 Mbit/s)"
            if f.get("small_link") == "soak"
            else ""
        ),
        Row(
            "catch-up, packs on",
            f["small_on_entries_per_s"],
            "entries/s",
            "raw boto3 GETs, 8 threads",
            f["small_raw_entries_per_s"],
        ),
        Row(
            "catch-up, packs off",
            f["small_off_entries_per_s"],
            "entries/s",
            "packs on",
            f["small_on_entries_per_s"],
        ),
        Row("seconds, packs on", f["small_on_s"], "s", "packs off", f["small_off_s"]),
        Row(
            "GETs of log entries, packs on",
            f["small_on_log_gets"],
            "GET",
            "packs off",
            f["small_off_log_gets"],
        ),
        Row(
            "seconds from process start, packs on",
            f["small_on_s_from_spawn"],
            "s",
            "packs off",
            f["small_off_s_from_spawn"],
        ),
        Row("GETs of packs, packs on", f["small_on_pack_gets"], "GET"),
        Row(
            "bucket requests, packs on",
            f["small_on_requests"],
            "req",
            "packs off",
            f["small_off_requests"],
        ),
        Row(
            "CPU of the reader, packs on",
            f["small_on_cpu_s"],
            "s",
            "packs off",
            f["small_off_cpu_s"],
        ),
    ]


def ceiling_note(f: dict[str, Any]) -> str:
    """(b)'s same-run ceilings of ``catchup_ratio``, and which one stops it short of 0.8."""
    cpu, window, got = (
        f.get("catchup_ratio_cpu_ceiling"),
        f.get("catchup_ratio_window_ceiling"),
        f.get("catchup_ratio"),
    )
    if cpu is None or window is None or got is None:
        return "ceilings of catchup_ratio: not measured"
    note = (
        f"ceilings of catchup_ratio in this run: CPU {cpu:.2f} (b's and moto's CPU over "
        f"{f['machine'].get('cpus', '?')} cores), window {window:.2f} (in-order GETs, window 8); "
        f"the catch-up made {got:.2f}"
    )
    if got >= 0.8:
        return note
    low, name = min((cpu, "the CPU"), (window, "the window"))
    if low < 0.8:
        return f"{note}: {name} stops it short of 0.8 ({low:.2f})"
    return f"{note}: neither ceiling is under 0.8; the catch-up made {got / low:.2f} of the lower"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs (about 90 s, (g) included)")
    ap.add_argument("--dir", type=Path, default=None, help="scratch parent directory")
    ap.add_argument("--small-only", action="store_true", help="run only (g)")
    ap.add_argument("--small-entries", type=int, default=None, help="(g)'s log length")
    ap.add_argument(
        "--small-link", action="store_true", help="(g)'s readers behind the soak's link"
    )
    ap.add_argument(
        "--profile-b",
        type=Path,
        default=None,
        metavar="FILE",
        help="py-spy (250 Hz, raw collapsed stacks) on b during (b)'s catch-up into FILE",
    )
    ap.add_argument(
        "--backlog-mb",
        type=float,
        default=None,
        help="each catch-up's backlog in MB of log objects (default 256; 16 with --quick)",
    )
    args = ap.parse_args()
    small_n = args.small_entries or (400 if args.quick else 1500)
    probes, rate = (500, 100.0) if args.quick else (2000, 100.0)
    # Sized in log-object bytes, what a catch-up fetches: ~256 MB of objects
    # is ~2.9 GB of the reference records, a catch-up of several seconds.
    backlog = int((args.backlog_mb or (16 if args.quick else 256)) * MB)
    idle_s = 5.0 if args.quick else 10.0
    relay_idle_s = 10.0 if args.quick else 30.0
    figures: dict[str, Any] = {"quick": args.quick, "probes": probes, "backlog_wire_bytes": backlog}
    figures["small_target_entries"] = small_n
    figures["small_link"] = "soak" if args.small_link else "loopback"
    with scratch_dir("replication-", args.dir) as root:
        figures["machine"] = machine_info(root)
        moto = start_moto_server(root / "moto.log")
        s3 = s3_client(moto.endpoint)
        s3.create_bucket(Bucket=BUCKET)
        proxy_a = TcpProxy("127.0.0.1", moto.port).start()
        proxy_b = TcpProxy("127.0.0.1", moto.port).start()
        a = Site("a", (root / "a").resolve())
        b = Site("b", (root / "b").resolve())
        meta = MetadataProcess(root.resolve())
        records = TelemetryBacklog(root / "backlog.spool")
        write_config(a, proxy_a)
        write_config(b, proxy_b)
        try:
            if not args.small_only:
                progress("starting gateways a and b ...")
                a.start()
                a.wait_ready()
                b.start()
                b.wait_ready()
                progress(f"(a) end-to-end latency: {probes} records at {rate:.0f}/s ...")
                head0, mark = head_seq(s3), moto.log_position()
                lat = latency(a, b, probes, rate)
                gets, misses = log_gets(moto.requests(since=mark))
                written = max(1, head_seq(s3) - head0)
                figures["e2e_gets_per_entry"] = gets / written
                figures["e2e_404s_per_entry"] = misses / written
                figures["e2e_samples"] = len(lat)
                for q in (50, 90, 99):
                    figures[f"e2e_p{q}_ms"] = percentile(lat, q)

                progress(f"(b) catch-up: {backlog / MB:.0f} MB of log objects at a, b stopped ...")
                # (b), (b') and (b'') reach moto directly, like the raw GETs
                # they are compared with; b's proxy is only there so (d) can
                # cut b off. (b*) below runs the catch-up through the proxy.
                write_config(b, moto.endpoint)
                mark = moto.log_position()
                produced, objects, wire, catchup_s, catchup_cpu, server_cpu, grown, _ = catch_up(
                    a, b, s3, backlog, records, moto.process.pid, args.profile_b
                )
                # b's GETs of log objects per object (moto's log, before the raw
                # GETs): 1.0 when every entry came whole in one request.
                time.sleep(0.2)  # moto logs a request after answering it
                gets, misses = log_gets(moto.requests(since=mark))
                figures["catchup_log_gets_per_object"] = (gets - misses) / max(1, len(objects))
                figures["catchup_mirror_journal_mb"] = grown / MB
                figures["mirror_bytes_per_bucket_byte"] = grown / wire
                figures.update(
                    catchup_objects=len(objects),
                    catchup_wire_mb=wire / MB,
                    catchup_journal_mb=produced / MB,
                    catchup_s=catchup_s,
                    catchup_mb_per_s=wire / MB / catchup_s,
                    catchup_journal_mb_per_s=produced / MB / catchup_s,
                )
                raw_server0 = cpu_seconds(moto.process.pid)
                raw_s, raw_cpu = raw_gets(s3, [k for k, _ in objects])
                raw_server_cpu = cpu_seconds(moto.process.pid) - raw_server0
                figures["raw_get_mb_per_s"] = wire / MB / raw_s
                # The same objects fetched in order on b's path (direct), window
                # 8, after the same LIST and manifest GET: the ceiling of the ratio.
                win_s = windowed_gets(s3, [k for k, _ in objects])
                figures["windowed_get_seconds"] = win_s
                figures["windowed_get_mb_per_s"] = wire / MB / win_s
                figures["catchup_ratio_window_ceiling"] = raw_s / win_s
                figures["catchup_vs_windowed"] = win_s / catchup_s
                figures["raw_get_seconds"] = raw_s
                figures["raw_get_server_cpu_s"] = raw_server_cpu
                figures["catchup_server_cpu_s"] = server_cpu
                # What the CPU alone allows: the catching-up gateway's CPU and
                # moto's over the cores (the floor of the catch-up's time on
                # this machine), and the ratio to the raw GETs that floor
                # would give.
                cores = os.cpu_count() or 1
                figures["catchup_cpu_floor_s"] = (catchup_cpu + server_cpu) / cores
                figures["catchup_ratio_cpu_ceiling"] = (
                    raw_s / figures["catchup_cpu_floor_s"]
                    if figures["catchup_cpu_floor_s"] > 0
                    else None
                )
                figures["catchup_cpu_s"] = catchup_cpu
                figures["catchup_cpu_ms_per_mb"] = catchup_cpu * 1000 / (wire / MB)
                figures["catchup_cpu_ms_per_journal_mb"] = catchup_cpu * 1000 / (produced / MB)
                figures["raw_get_cpu_ms_per_mb"] = raw_cpu * 1000 / (wire / MB)
                with httpx.Client(base_url=b.url, timeout=30) as cb:
                    m = cb.get("/v1/status").json()["mirrors"]["a"]
                figures["catchup_fetches_in_flight_peak"] = m.get("fetches_in_flight_peak")
                figures["catchup_prefetch_peak_mb"] = m.get("prefetch_peak_bytes", 0) / MB
                figures["catchup_ratio"] = ratio(
                    figures["catchup_mb_per_s"], figures["raw_get_mb_per_s"]
                )

                progress(
                    "(b') catch-up again, b appending batch by batch (keep_blocks = false) ..."
                )
                write_config(b, moto.endpoint, mirror_keep_blocks=False)
                _, objects2, wire2, s2, cpu2, _, grown2, _ = catch_up(
                    a, b, s3, backlog, records, moto.process.pid
                )
                write_config(b, moto.endpoint)  # the default again at b's next start
                raw2_s, _ = raw_gets(s3, [k for k, _ in objects2])
                figures.update(
                    perbatch_catchup_mb_per_s=wire2 / MB / s2,
                    perbatch_raw_get_mb_per_s=wire2 / MB / raw2_s,
                    perbatch_catchup_ratio=ratio(wire2 / MB / s2, wire2 / MB / raw2_s),
                    perbatch_catchup_cpu_ms_per_mb=cpu2 * 1000 / (wire2 / MB),
                    perbatch_mirror_bytes_per_bucket_byte=grown2 / wire2,
                    blocks_vs_perbatch_cpu=ratio(
                        figures["catchup_cpu_ms_per_mb"], cpu2 * 1000 / (wire2 / MB)
                    ),
                )

                progress("(b'') catch-up again, every GET through botocore (lean_get = false) ...")
                write_config(b, moto.endpoint, lean_get=False)
                _, objects3, wire3, s3_s, cpu3, _, _, _ = catch_up(
                    a, b, s3, backlog, records, moto.process.pid
                )
                raw3_s, _ = raw_gets(s3, [k for k, _ in objects3])
                figures.update(
                    botocore_catchup_mb_per_s=wire3 / MB / s3_s,
                    botocore_raw_get_mb_per_s=wire3 / MB / raw3_s,
                    botocore_catchup_ratio=ratio(wire3 / MB / s3_s, wire3 / MB / raw3_s),
                    botocore_catchup_cpu_ms_per_mb=cpu3 * 1000 / (wire3 / MB),
                    lean_vs_botocore_cpu=ratio(
                        figures["catchup_cpu_ms_per_mb"], cpu3 * 1000 / (wire3 / MB)
                    ),
                )

                progress(
                    "(b*) catch-up again, b through its TCP proxy (as before this run's change) ..."
                )
                # What the bench's proxy costs: the same catch-up with b behind
                # proxy_b, this process's CPU meanwhile (the proxies' thread),
                # and the raw and in-order GETs through an identical proxy.
                write_config(b, proxy_b)  # b stays behind its proxy for (c) onwards
                _, objects4, wire4, s4, cpu4, _, _, own4 = catch_up(
                    a, b, s3, backlog, records, moto.process.pid
                )
                keys4 = [k for k, _ in objects4]
                raw4_s, _ = raw_gets(s3, keys4)
                with TcpProxy("127.0.0.1", moto.port) as link:
                    p0 = time.process_time()
                    rawp_s, _ = raw_gets(s3_client(link.url), keys4)
                    rawp_cpu = time.process_time() - p0
                winp_s = windowed_gets(s3_client(proxy_b.url), keys4)
                win4_s = windowed_gets(s3, keys4)
                figures.update(
                    proxied_catchup_mb_per_s=wire4 / MB / s4,
                    proxied_catchup_cpu_ms_per_mb=cpu4 * 1000 / (wire4 / MB),
                    proxied_bench_cpu_ms_per_mb=own4 * 1000 / (wire4 / MB),
                    proxied_raw_get_mb_per_s=wire4 / MB / rawp_s,
                    proxied_raw_get_client_and_proxy_cpu_ms_per_mb=rawp_cpu * 1000 / (wire4 / MB),
                    proxied_direct_raw_get_mb_per_s=wire4 / MB / raw4_s,
                    proxied_windowed_get_mb_per_s=wire4 / MB / winp_s,
                    proxied_direct_windowed_get_mb_per_s=wire4 / MB / win4_s,
                    # against the raw GETs straight to moto (the old catchup_ratio)
                    proxied_catchup_ratio=ratio(wire4 / MB / s4, wire4 / MB / raw4_s),
                    # like for like: both through an identical proxy
                    proxied_catchup_ratio_vs_proxied_raw=ratio(
                        wire4 / MB / s4, wire4 / MB / rawp_s
                    ),
                    proxied_window_ceiling=raw4_s / winp_s,
                    proxy_cost_raw_gets=ratio(wire4 / MB / rawp_s, wire4 / MB / raw4_s),
                )

                progress(f"(c) idle requests at b over {idle_s:.0f}s ...")
                time.sleep(3.0)  # let the last polls settle into the idle backoff
                mark = moto.log_position()
                time.sleep(idle_s)
                reqs = moto.requests(since=mark)
                gets = sum(
                    1 for r in reqs if r.method in ("GET", "HEAD") and "list-type" not in r.path
                )
                lists = sum(
                    1 for r in reqs if "list-type" in r.path or r.path.rstrip("/").endswith(BUCKET)
                )
                figures["idle_gets_per_s_per_source"] = gets / idle_s
                figures["idle_lists_per_s"] = lists / idle_s
                figures["idle_requests_total"] = len(reqs)

                progress("(d) resume: b cut off from the bucket for 10 s while a produces ...")
                stop = threading.Event()

                def steady() -> None:
                    with httpx.Client(base_url=a.url, timeout=30) as c:
                        i = 0
                        while not stop.is_set():
                            c.post("/v1/topics/t/records", json={"records": [{"value": f"r{i}"}]})
                            i += 1
                            time.sleep(0.02)

                producer = threading.Thread(target=steady, daemon=True)
                producer.start()
                proxy_b.set_mode("refuse")
                proxy_b.reset_connections()
                time.sleep(10)
                with httpx.Client(base_url=b.url, timeout=30) as cb:
                    at_restore = sum(high_watermarks(cb, "a.t"))
                    proxy_b.set_mode("pass")
                    t0 = time.perf_counter()
                    deadline = t0 + 120
                    while sum(high_watermarks(cb, "a.t")) <= at_restore:
                        if time.perf_counter() > deadline:
                            break
                        time.sleep(0.01)
                    figures["resume_s"] = time.perf_counter() - t0
                stop.set()
                producer.join(timeout=10)

                progress("(f) encryption: a and b restart with [encryption]; (a) and (b) again ...")
                key_file = root.resolve() / "a-bench.key"
                write_key_file(key_file, generate_key())
                for site in (b, a):
                    assert site.stop() == 0
                for site, proxy in ((a, proxy_a), (b, proxy_b)):
                    write_config(site, proxy, key_file=key_file)
                    site.start()
                    site.wait_ready()
                lat = latency(a, b, probes, rate)
                for q in (50, 90, 99):
                    figures[f"sealed_e2e_p{q}_ms"] = percentile(lat, q)
                # b straight to moto, as in (b), whose figure this one is beside
                write_config(b, moto.endpoint, key_file=key_file)
                produced, objects, wire, catchup_s, catchup_cpu, _, grown, _ = catch_up(
                    a, b, s3, backlog, records, moto.process.pid
                )
                figures["sealed_mirror_bytes_per_bucket_byte"] = grown / wire
                figures.update(
                    sealed_catchup_objects=len(objects),
                    sealed_catchup_wire_mb=wire / MB,
                    sealed_catchup_journal_mb=produced / MB,
                    sealed_catchup_s=catchup_s,
                    sealed_catchup_mb_per_s=wire / MB / catchup_s,
                    sealed_catchup_journal_mb_per_s=produced / MB / catchup_s,
                    sealed_catchup_cpu_ms_per_journal_mb=catchup_cpu * 1000 / (produced / MB),
                )
                figures["sealed_catchup_ratio"] = ratio(
                    figures["sealed_catchup_journal_mb_per_s"], figures["catchup_journal_mb_per_s"]
                )
                with httpx.Client(base_url=b.url, timeout=30) as cb:
                    m = cb.get("/v1/status").json()["mirrors"]["a"]
                figures["sealed_mirror_state"] = m["state"]

                progress("(e) head relay: restarting a and b with a metadata server ...")
                for site in (b, a):
                    assert site.stop() == 0
                meta.start()
                tokens = {s.region: meta.add_region(s.region) for s in (a, b)}
                meta.call(
                    "POST",
                    "/v1/topics",
                    {"name": "t", "home": "a", "partitions": PARTITIONS, "subscribers": ["b"]},
                )
                for site, proxy in ((a, proxy_a), (b, proxy_b)):
                    write_config(site, proxy, (meta.url, tokens[site.region]))
                    site.start()
                    site.wait_ready()
                wait_relayed(b)
                lat = latency(a, b, probes, rate)
                figures["relay_e2e_samples"] = len(lat)
                for q in (50, 90, 99):
                    figures[f"relay_e2e_p{q}_ms"] = percentile(lat, q)
                progress(
                    f"(e) idle requests of a and b over {relay_idle_s:.0f}s with the relay ..."
                )
                wait_caught_up(a, b)
                time.sleep(3.0)
                mark = moto.log_position()
                time.sleep(relay_idle_s)
                figures["relay_idle_s"] = relay_idle_s
                figures["relay_idle_requests"] = len(moto.requests(since=mark))
                for site in (b, a):
                    assert site.stop() == 0
                meta.stop()
            progress(f"(g) small-entry catch-up: {small_n} entries ...")
            figures.update(
                small_catch_up(
                    root / "g", moto, s3, small_n, SOAK_LINK if args.small_link else None
                )
            )
        finally:
            for site in (a, b):
                site.stop()
            meta.stop()
            proxy_a.stop()
            proxy_b.stop()
            moto.stop()
            records.close()

    def ok(v: float | None, good: bool) -> bool | None:
        return None if v is None else good

    f = figures
    rows: list[Row | str] = (
        []
        if args.small_only
        else [
            f"(a) end-to-end, a -> b, {f['e2e_samples']} records (flush 250 ms, poll 100 ms)"
            + (" -- quick: fewer records than the 2,000 of a full run" if f["quick"] else ""),
            Row(
                "p50",
                f["e2e_p50_ms"],
                "ms",
                target="<= 300 ms",
                ok=ok(f["e2e_p50_ms"], f["e2e_p50_ms"] <= 300),
            ),
            Row("p90", f["e2e_p90_ms"], "ms"),
            Row("GETs of log entries per entry written", f["e2e_gets_per_entry"], "GET"),
            Row("... of which 404s", f["e2e_404s_per_entry"], "GET"),
            Row(
                "p99",
                f["e2e_p99_ms"],
                "ms",
                target="<= 600 ms",
                ok=ok(f["e2e_p99_ms"], f["e2e_p99_ms"] <= 600),
            ),
            f"(b) catch-up: {f['catchup_objects']} objects, {f['catchup_wire_mb']:.0f} MB of "
            f"log objects ({f['catchup_journal_mb']:.0f} MB of records), b straight to moto "
            "like the raw GETs"
            + (" -- quick: a smaller backlog than the 256 MB of a full run" if f["quick"] else ""),
            Row(
                "catch-up (log objects)",
                f["catchup_mb_per_s"],
                "MB/s",
                "raw boto3 GETs, 8 threads",
                f["raw_get_mb_per_s"],
                ">= 0.8x",
                ok(f["catchup_ratio"], (f["catchup_ratio"] or 0) >= 0.8),
            ),
            Row(
                "in-order GETs, window 8, same start, direct (b's path)",
                f["windowed_get_mb_per_s"],
                "MB/s",
                "raw boto3 GETs, 8 threads",
                f["raw_get_mb_per_s"],
                "the ceiling of the ratio",
            ),
            Row(
                "catch-up vs those in-order GETs",
                f["catchup_mb_per_s"],
                "MB/s",
                "in-order GETs",
                f["windowed_get_mb_per_s"],
            ),
            Row("catch-up (records)", f["catchup_journal_mb_per_s"], "MB/s"),
            Row(
                "mirror journal bytes per bucket byte",
                f["mirror_bytes_per_bucket_byte"],
                "x",
                "log objects fetched",
                1.0,
                "<= 1.2",
                ok(f["mirror_bytes_per_bucket_byte"], f["mirror_bytes_per_bucket_byte"] <= 1.2),
            ),
            Row(
                "CPU per MB of log objects",
                f["catchup_cpu_ms_per_mb"],
                "ms",
                "raw boto3 GETs (client CPU)",
                f["raw_get_cpu_ms_per_mb"],
            ),
            Row("CPU per MB of records", f["catchup_cpu_ms_per_journal_mb"], "ms"),
            Row(
                "b's CPU and moto's over the cores",
                f.get("catchup_cpu_floor_s"),
                "s",
                "raw boto3 GETs",
                f.get("raw_get_seconds"),
            ),
            Row("fetches in flight at most", f["catchup_fetches_in_flight_peak"], ""),
            Row("GETs of log objects per object", f["catchup_log_gets_per_object"], "GET"),
            ceiling_note(f),
            "(b') the same catch-up, b appending batch by batch ([mirror] keep_blocks = false)",
            Row(
                "catch-up (log objects), per batch",
                f["perbatch_catchup_mb_per_s"],
                "MB/s",
                "raw boto3 GETs, 8 threads",
                f["perbatch_raw_get_mb_per_s"],
            ),
            Row(
                "CPU per MB of log objects, blocks",
                f["catchup_cpu_ms_per_mb"],
                "ms",
                "per batch",
                f["perbatch_catchup_cpu_ms_per_mb"],
            ),
            Row(
                "mirror journal bytes per bucket byte, per batch",
                f["perbatch_mirror_bytes_per_bucket_byte"],
                "x",
            ),
            "(b'') the same catch-up, every GET through botocore ([bucket] lean_get = false)",
            Row(
                "catch-up (log objects), botocore GETs",
                f["botocore_catchup_mb_per_s"],
                "MB/s",
                "raw boto3 GETs, 8 threads",
                f["botocore_raw_get_mb_per_s"],
            ),
            Row(
                "CPU per MB of log objects, lean GETs",
                f["catchup_cpu_ms_per_mb"],
                "ms",
                "botocore GETs",
                f["botocore_catchup_cpu_ms_per_mb"],
            ),
            "(b*) the same catch-up, b through its TCP proxy (the bench's, in this process)",
            Row(
                "catch-up (log objects), proxied",
                f["proxied_catchup_mb_per_s"],
                "MB/s",
                "raw boto3 GETs, direct",
                f["proxied_direct_raw_get_mb_per_s"],
            ),
            Row(
                "raw boto3 GETs through an identical proxy",
                f["proxied_raw_get_mb_per_s"],
                "MB/s",
                "direct",
                f["proxied_direct_raw_get_mb_per_s"],
            ),
            Row(
                "in-order GETs, window 8, b's proxy",
                f["proxied_windowed_get_mb_per_s"],
                "MB/s",
                "direct",
                f["proxied_direct_windowed_get_mb_per_s"],
            ),
            Row(
                "CPU per MB of log objects, proxied b",
                f["proxied_catchup_cpu_ms_per_mb"],
                "ms",
                "direct b (b)",
                f["catchup_cpu_ms_per_mb"],
            ),
            Row("the proxy's CPU per MB (this process)", f["proxied_bench_cpu_ms_per_mb"], "ms"),
            "(c) idle b, S3 polling, no metadata server",
            Row(
                "GETs/HEADs per second",
                f["idle_gets_per_s_per_source"],
                "req/s",
                target="<= 10",
                ok=f["idle_gets_per_s_per_source"] <= 10,
            ),
            Row(
                "LISTs per second",
                f["idle_lists_per_s"],
                "req/s",
                target="0",
                ok=f["idle_lists_per_s"] == 0,
            ),
            "(d) resume after 10 s cut off",
            Row("time to advance", f["resume_s"], "s", target="<= 1.0 s", ok=f["resume_s"] <= 1.0),
            "(f) encryption on (a seals, b opens), same polling mode as (a) and (b)",
            Row("p50, sealed", f["sealed_e2e_p50_ms"], "ms", "plaintext (a)", f["e2e_p50_ms"]),
            Row("p99, sealed", f["sealed_e2e_p99_ms"], "ms", "plaintext (a)", f["e2e_p99_ms"]),
            Row(
                "catch-up (records), sealed",
                f["sealed_catchup_journal_mb_per_s"],
                "MB/s",
                "plaintext (b)",
                f["catchup_journal_mb_per_s"],
            ),
            Row(
                "CPU per MB of records, sealed",
                f["sealed_catchup_cpu_ms_per_journal_mb"],
                "ms",
                "plaintext (b)",
                f["catchup_cpu_ms_per_journal_mb"],
            ),
            f"(e) with the metadata server's head relay ({f['relay_e2e_samples']} records)",
            Row(
                "p50",
                f["relay_e2e_p50_ms"],
                "ms",
                "S3 polling (a)",
                f["e2e_p50_ms"],
                target="<= 300 ms",
                ok=ok(f["relay_e2e_p50_ms"], f["relay_e2e_p50_ms"] <= 300),
            ),
            Row(
                "p99",
                f["relay_e2e_p99_ms"],
                "ms",
                "S3 polling (a)",
                f["e2e_p99_ms"],
                target="<= 600 ms",
                ok=ok(f["relay_e2e_p99_ms"], f["relay_e2e_p99_ms"] <= 600),
            ),
            Row(
                f"bucket requests, a and b idle {f['relay_idle_s']:.0f} s",
                f["relay_idle_requests"],
                "req",
                target="0",
                ok=f["relay_idle_requests"] == 0,
            ),
        ]
    )
    rows += small_rows(f)
    print(render_table("edgegw replication between two gateway processes", rows))
    emit_json(figures)


if __name__ == "__main__":
    main()
