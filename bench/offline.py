"""Days offline on a small device: memory, reopen and drain of a large backlog (issue 16).

Usage::

    .venv/bin/python bench/offline.py [--quick] [--cap-mb 4] [--backlog-gib N]

One `edgegw serve` process (a real gateway) on a moto S3 bucket reached
through the project's TCP proxy (``edge_gateway.testing.tcpproxy``):

1. the gateway starts and claims its region while the link is up; then the
   link goes down (the proxy refuses connections);
2. producers write to three topics (``alarms``, ``telemetry``, ``bulk``) until
   the journal holds at least 8 GiB (``--quick``: 1 GiB): JSON requests whose
   records each go to a different partition, so every journal entry holds
   ONE record (most of the backlog), and one request in ten is a small binary
   batch (20 records) to one partition;
3. the gateway restarts with the backlog, still offline: the time until it
   answers ``/healthz`` again is the reopen;
4. the link returns, with ``link.max_bytes_per_s`` = 4 MB/s (``--cap-mb``),
   and the backlog drains. The bench samples the gateway's ``/v1/status``
   every 0.5 s and its VmRSS (``/proc/<pid>/status``) every 0.25 s throughout.

Figures, each beside its target (issue 16) and a baseline from the same run:

* ``entries``, ``backlog_gib``: the journal's entries (LSNs) and bytes;
* ``peak_rss_mb`` (target <= 150 MB for 8 GiB of single-record entries),
  baseline: the same gateway's RSS when it was ready with an empty journal;
* ``rss_mb_per_million_entries`` (target <= 5): RSS growth over the fill per
  million entries; baseline: what the in-RAM index of old cost (three 8-byte
  slots per entry: 22.9 MB per million). VmRSS counts the mapped active
  segment's page cache (file-backed, up to ``journal.segment_bytes``, given
  back when the segment rolls); ``anon_rss_mb_per_million_entries`` is the
  growth of the process's own memory (RssAnon) alone;
* ``link_cap_mb_per_s``, ``achieved_mb_per_s``, ``cap_ratio`` (0.9-1.05): bytes
  the gateway put on the link (its meter) over the drain's steady part;
  ``link_waited_s`` / ``cap_bound``: whether transfers waited for the cap at
  all (if not, the shipper set the rate and the ratio says nothing of the cap);
* ``reopen_s_per_gib`` (target <= 2): the start with the backlog less the
  first start with an empty journal (the process's own start-up, same run),
  per GiB; ``reopen_s`` is the whole start;
* ``critical_drained_s`` and ``bulk_before_critical_objects`` (target 0): only
  when this build's topics take a ``priority``; otherwise null, with a note.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    MB,
    GiB,
    Row,
    emit_json,
    fixed_size_values,
    progress,
    render_table,
    scratch_dir,
)

from edge_gateway.api.wire import BATCH_MEDIA_TYPE
from edge_gateway.config import TopicConfig
from edge_gateway.format import logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.testing.moto import ACCESS_KEY, REGION, SECRET_KEY, s3_client, start_moto_server
from edge_gateway.testing.tcpproxy import ProxyMode, TcpProxy

EDGEGW = Path(sys.executable).parent / "edgegw"
PARTITIONS = 64
#: (topic, priority, share of the single-record requests)
TOPICS = (("alarms", "critical", 1), ("telemetry", "normal", 6), ("bulk", "bulk", 3))
VALUE_BYTES = 200
#: The old in-RAM journal index: three array('q') slots (position, LSN, offset) per entry.
OLD_INDEX_MB_PER_MILLION = 3 * 8 * 1_000_000 / MB


def priorities_supported() -> bool:
    """Whether this build's topics take a ``priority`` (the lanes work of issue 16)."""
    return "priority" in {f.name for f in dataclasses.fields(TopicConfig)}


class RssSampler(threading.Thread):
    """Samples the VmRSS of whichever gateway process is current."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.pid: int | None = None
        self.peak_kb = 0
        self.last_kb = 0
        #: Anonymous memory (RssAnon) at the last sample: RSS without the
        #: file-backed pages of the mapped active segment (up to
        #: journal.segment_bytes of page cache, docs/journal.md "Memory").
        self.anon_kb = 0
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(0.25):
            kb = self.sample()
            if kb:
                self.peak_kb = max(self.peak_kb, kb)

    def sample(self) -> int:
        pid = self.pid
        if pid is None:
            return 0
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            self.anon_kb = int(fields["RssAnon"].split()[0])
            self.last_kb = int(fields["VmRSS"].split()[0])
            return self.last_kb
        except (OSError, ValueError, KeyError):
            return 0

    def stop(self) -> None:
        self._stop.set()


class Gateway:
    def __init__(self, root: Path, config: Path) -> None:
        self.root, self.config = root, config
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 600.0) -> float:
        """Start; seconds until ``/healthz`` answers 200."""
        addr = self.root / "data" / "api.addr"
        addr.unlink(missing_ok=True)
        log = open(self.root / "gateway.log", "ab")  # noqa: SIM115 - the process holds it
        began = time.monotonic()
        self.proc = subprocess.Popen(
            [str(EDGEGW), "serve", "--config", str(self.config)],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = began + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the gateway exited ({self.proc.returncode}): see gateway.log")
            if addr.exists() and addr.read_text().strip():
                self.url = f"http://{addr.read_text().strip()}"
                try:
                    if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                        return time.monotonic() - began
                except httpx.HTTPError:
                    pass
            time.sleep(0.02)
        raise SystemExit(f"the gateway was not ready in {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = httpx.get(f"{self.url}/v1/status", timeout=30).json()
        return doc


def write_config(root: Path, proxy_url: str, cap: int, backlog: int, prio: bool) -> Path:
    topics = ""
    for name, priority, _ in TOPICS:
        topics += f'[[topics]]\nname = "{name}"\nhome = "north"\npartitions = {PARTITIONS}\n'
        if prio:
            topics += f'priority = "{priority}"\n'
    config = root / "edgegw.toml"
    config.write_text(
        f"""region = "north"
data_dir = "{root / "data"}"
shutdown_grace_s = 1.0
[journal]
max_bytes = {int(backlog * 1.5) + GiB}
[link]
max_bytes_per_s = {cap}
[bucket]
type = "s3"
bucket = "fleet"
endpoint_url = "{proxy_url}"
region = "{REGION}"
path_style = true
access_key = "{ACCESS_KEY}"
secret_key = "{SECRET_KEY}"
connect_timeout = 1.0
read_timeout = 10.0
max_attempts = 1
[gc]
enabled = false
[api]
listen = "127.0.0.1:0"
server = "builtin"
{topics}"""
    )
    return config


def produce(url: str, backlog: int, producers: int, value_bytes: int) -> None:
    """``producers`` threads until the journal holds ``backlog`` bytes (checked every ~2 s)."""
    values = [v.decode() for v in fixed_size_values(PARTITIONS * 4, value_bytes)]
    weighted = [name for name, _, share in TOPICS for _ in range(share)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def producer(k: int) -> None:
        try:
            with httpx.Client(base_url=url, timeout=60) as c:
                n = k
                while not stop.is_set():
                    topic = weighted[n % len(weighted)]
                    if n % 10 == 9:
                        batch = [values[(n + i) % len(values)].encode() for i in range(20)]
                        r = c.post(
                            f"/v1/topics/{topic}/partitions/{n % PARTITIONS}/batches",
                            content=encode_batch(batch, timestamps=[1_795_000_000_000] * 20),
                            headers={"content-type": BATCH_MEDIA_TYPE},
                        )
                    else:
                        # One record per partition: PARTITIONS single-record entries.
                        body = {
                            "records": [
                                {"value": values[(n + p) % len(values)], "partition": p}
                                for p in range(PARTITIONS)
                            ]
                        }
                        r = c.post(
                            f"/v1/topics/{topic}/records",
                            content=json.dumps(body, separators=(",", ":")),
                            headers={"content-type": "application/json"},
                        )
                    if r.status_code != 200:
                        raise RuntimeError(f"produce: {r.status_code} {r.text[:200]}")
                    n += producers
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(producers)]
    for t in threads:
        t.start()
    try:
        while not stop.is_set():
            time.sleep(2.0)
            j = httpx.get(f"{url}/v1/status", timeout=30).json()["journal"]
            progress(f"  journal {j['bytes'] / GiB:.2f} GiB, {j['next_lsn'] - 1:,} entries")
            if j["bytes"] >= backlog:
                break
    finally:
        stop.set()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 GiB backlog instead of 8 GiB")
    ap.add_argument("--cap-mb", type=float, default=4.0, help="link cap in MB/s (default 4)")
    ap.add_argument("--backlog-gib", type=float, default=None, help="override the backlog size")
    ap.add_argument("--producers", type=int, default=8, help="concurrent producers (default 8)")
    ap.add_argument(
        "--value-bytes", type=int, default=VALUE_BYTES, help="bytes per record value (200)"
    )
    args = ap.parse_args()
    cap = int(args.cap_mb * MB)
    backlog = int((args.backlog_gib or (1.0 if args.quick else 8.0)) * GiB)
    prio = priorities_supported()

    rss = RssSampler()
    rss.start()
    with scratch_dir("offline") as root:
        free = os.statvfs(root)
        if free.f_bavail * free.f_frsize < backlog * 1.3:
            raise SystemExit(f"{root}: not enough free disk for a {backlog / GiB:.1f} GiB backlog")
        moto = start_moto_server(root / "moto.log")
        proxy = TcpProxy("127.0.0.1", int(moto.endpoint.rsplit(":", 1)[1])).start()
        gw = Gateway(root, write_config(root, proxy.url, cap, backlog, prio))
        samples: list[tuple[float, int, int]] = []
        try:
            s3_client(moto.endpoint).create_bucket(Bucket="fleet")
            first_start_s = gw.start()
            assert gw.proc is not None
            rss.pid = gw.proc.pid
            wait_claimed(gw)
            time.sleep(1.0)
            idle_kb = rss.sample()
            idle_anon_kb = rss.anon_kb
            proxy.set_mode(ProxyMode.REFUSE)
            progress(f"link down; producing a {backlog / GiB:.1f} GiB backlog ...")
            began = time.monotonic()
            produce(gw.url, backlog, args.producers, args.value_bytes)
            produce_s = time.monotonic() - began
            st = gw.status()
            lanes = st.get("lanes", {}).get("lanes") or []
            if lanes:  # one journal per priority: count them all
                entries = sum(lane["next_lsn"] - 1 for lane in lanes)
                backlog_bytes = sum(lane["journal_bytes"] for lane in lanes)
            else:
                entries = st["journal"]["next_lsn"] - 1
                backlog_bytes = st["journal"]["bytes"]
            filled_kb = rss.sample()
            filled_anon_kb = rss.anon_kb
            fill_peak_kb = rss.peak_kb
            progress(f"restarting with the backlog ({entries:,} entries), still offline ...")
            gw.stop()
            rss.pid = None
            reopen_s = gw.start()
            assert gw.proc is not None
            rss.pid = gw.proc.pid
            progress(f"  ready in {reopen_s:.2f} s; link up, capped at {cap / MB:.1f} MB/s ...")
            proxy.set_mode(ProxyMode.PASS)
            drain_began = time.monotonic()
            head_seq = st["shipper"]["next_seq"]
            critical_drained_s: float | None = None
            while True:
                doc = gw.status()
                samples.append(
                    (time.monotonic(), doc["link"]["up_bytes"], doc["shipper"]["pending_lsns"])
                )
                if critical_drained_s is None and unshipped(doc, "alarms") == 0:
                    critical_drained_s = time.monotonic() - drain_began
                if doc["shipper"]["pending_lsns"] == 0:
                    break
                if len(samples) % 20 == 0:
                    progress(
                        f"  {doc['shipper']['pending_lsns']:,} entries pending, "
                        f"{doc['link']['up_bytes'] / MB:.0f} MB up"
                    )
                time.sleep(0.5)
            drain_s = time.monotonic() - drain_began
            end = gw.status()
            wire_bytes = end["shipper"]["wire_bytes"]
            # Seconds transfers waited for the cap: ~0 means the cap never bound
            # (the shipper could not fill the link), so cap_ratio is not about the cap.
            waited_s = end["link"]["waited_s"]
            bulk_before = bulk_before_critical(moto.endpoint, head_seq)
        finally:
            gw.stop()
            rss.stop()
            proxy.stop()
            moto.stop()

    moving = [i for i in range(1, len(samples)) if samples[i][1] > samples[i - 1][1]]
    if moving:
        first, last = moving[0] - 1, moving[-1]
        (t0, b0, _), (t1, b1, _) = samples[first], samples[last]
        achieved = (b1 - b0) / (t1 - t0) / MB if t1 > t0 else None
    else:
        achieved = None
    cap_ratio = None if achieved is None else achieved / (cap / MB)
    gib = backlog_bytes / GiB
    peak_mb = max(rss.peak_kb, fill_peak_kb) / 1024
    per_million = (filled_kb - idle_kb) / 1024 / (entries / 1e6) if entries else None
    anon_per_million = (filled_anon_kb - idle_anon_kb) / 1024 / (entries / 1e6) if entries else None
    # The start of an empty journal (same run) is the process's own start-up:
    # what a backlog adds to it is the journal's reopen.
    reopen_per_gib = max(0.0, reopen_s - first_start_s) / gib if gib else None
    note = None if prio else "priorities not yet in this build"
    rows: list[Row | str] = [
        f"backlog: {entries:,} entries, {gib:.2f} GiB in {produce_s:.0f} s "
        f"({entries / produce_s:,.0f} entries/s)",
        Row(
            "peak RSS of the gateway",
            peak_mb,
            "MB",
            "same gateway, ready, empty journal",
            idle_kb / 1024,
            "<= 150 MB (8 GiB)",
            peak_mb <= 150,
        ),
        Row(
            "RSS growth per million entries",
            per_million,
            "MB",
            "old in-RAM index (3 x 8 B/entry)",
            OLD_INDEX_MB_PER_MILLION,
            "<= 5",
            per_million is not None and per_million <= 5,
        ),
        Row(
            "RssAnon growth per million entries",
            anon_per_million,
            "MB",
            "old in-RAM index (3 x 8 B/entry)",
            OLD_INDEX_MB_PER_MILLION,
        ),
        Row(
            "reopen with the backlog, per GiB",
            reopen_per_gib,
            "s",
            "first start, empty journal (s)",
            first_start_s,
            "<= 2",
            reopen_per_gib is not None and reopen_per_gib <= 2,
        ),
        Row(
            "drain over the capped link",
            achieved,
            "MB/s",
            "link.max_bytes_per_s",
            cap / MB,
            "0.9-1.05x",
            cap_ratio is not None and 0.9 <= cap_ratio <= 1.05,
        ),
    ]
    if waited_s <= 0.1 * drain_s:
        rows.append(
            f"the cap hardly bound (transfers waited {waited_s:.1f} s of a {drain_s:.0f} s "
            "drain): the shipper, not the link, set the drain rate"
        )
    if note:
        rows.append(
            f"critical_drained_s, bulk_before_critical_objects: null ({note}); in LSN order "
            f"(the baseline priorities improve on): alarms drained after "
            f"{critical_drained_s or 0:.0f} s, {bulk_before} objects with bulk data before"
        )
    else:
        rows.append(
            f"critical drained after {critical_drained_s or 0:.1f} s; "
            f"{bulk_before} objects with bulk data before the last critical one (target 0)"
        )
    print(render_table(f"offline {gib:.1f} GiB, link cap {cap / MB:.1f} MB/s", rows))
    emit_json(
        {
            "bench": "offline",
            "quick": args.quick,
            "entries": entries,
            "backlog_gib": round(gib, 3),
            "produce_s": round(produce_s, 1),
            "peak_rss_mb": round(peak_mb, 1),
            "idle_rss_mb": round(idle_kb / 1024, 1),
            "filled_rss_mb": round(filled_kb / 1024, 1),
            "rss_mb_per_million_entries": None if per_million is None else round(per_million, 2),
            "anon_rss_mb_per_million_entries": (
                None if anon_per_million is None else round(anon_per_million, 2)
            ),
            "link_cap_mb_per_s": cap / MB,
            "achieved_mb_per_s": None if achieved is None else round(achieved, 3),
            "cap_ratio": None if cap_ratio is None else round(cap_ratio, 4),
            "drain_s": round(drain_s, 1),
            "link_waited_s": round(waited_s, 1),
            "cap_bound": waited_s > 0.1 * drain_s,
            "wire_mb": round(wire_bytes / MB, 1),
            "reopen_s": round(reopen_s, 3),
            "first_start_s": round(first_start_s, 3),
            "reopen_s_per_gib": None if reopen_per_gib is None else round(reopen_per_gib, 3),
            "critical_drained_s": round(critical_drained_s, 1)
            if prio and critical_drained_s is not None
            else None,
            "bulk_before_critical_objects": bulk_before if prio else None,
            "lsn_order_critical_drained_s": None
            if prio or critical_drained_s is None
            else round(critical_drained_s, 1),
            "lsn_order_bulk_before_critical_objects": None if prio else bulk_before,
            "priorities": prio,
            "note": note,
            "targets": {
                "peak_rss_mb": 150,
                "rss_mb_per_million_entries": 5,
                "cap_ratio": [0.9, 1.05],
                "reopen_s_per_gib": 2,
                "bulk_before_critical_objects": 0,
            },
        }
    )


def unshipped(doc: dict[str, Any], topic: str) -> int:
    """Records of ``topic`` not yet in the bucket, by the gateway's status."""
    for t in doc["topics"]:
        if t["name"] == topic:
            return sum(p.get("unshipped", 0) for p in t["partitions"])
    raise SystemExit(f"no topic {topic!r} in the gateway's status")


def bulk_before_critical(endpoint: str, first_seq: int) -> int:
    """Objects from ``first_seq`` on that hold bulk data and precede the last alarms one."""
    s3 = s3_client(endpoint)
    try:
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket="fleet", Prefix="regions/north/log/"
        ):
            keys += [o["Key"] for o in page.get("Contents", [])]
        topics_by_seq: list[set[str]] = []
        for key in sorted(keys):
            seq = int(key.rsplit("/", 1)[1].split(".")[0])
            if seq < first_seq:
                continue
            head = s3.get_object(Bucket="fleet", Key=key, Range="bytes=0-1048575")["Body"].read()
            header = logobject.decode_header(head, where=key)
            topics_by_seq.append({b.topic for b in header.blocks})
    finally:
        s3.close()
    last_critical = max((i for i, t in enumerate(topics_by_seq) if "alarms" in t), default=-1)
    return sum(1 for t in topics_by_seq[:last_critical] if "bulk" in t)


def wait_claimed(gw: Gateway, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not gw.status()["shipper"]["claimed"]:
        if time.monotonic() > deadline:
            raise SystemExit("the gateway did not claim its region")
        time.sleep(0.1)


if __name__ == "__main__":
    main()
