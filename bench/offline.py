"""Days offline on a small device: memory, reopen and drain of a large backlog (issue 16).

Usage::

    .venv/bin/python bench/offline.py [--quick] [--cap-mb 4] [--backlog-gib N] [--at-rest-only]
    .venv/bin/python bench/offline.py --fill direct [--backlog-gib 8] [--max-fill-s S]

One `edgegw serve` process (a real gateway) on a moto S3 bucket reached
through the project's TCP proxy (``edge_gateway.testing.tcpproxy``):

1. the gateway starts and claims its region while the link is up; then the
   link goes down (the proxy refuses connections);
2. producers write to three topics (``alarms``, ``telemetry``, ``bulk``) until
   the journals hold at least 8 GiB (``--quick``: 1 GiB): JSON requests whose
   records each go to a different partition, so every journal entry holds
   ONE record (most of the backlog), and one request in ten is a small binary
   batch (20 records) to one partition;
3. the gateway restarts with the backlog, still offline: the time until it
   answers ``/healthz`` again is the reopen;
4. the link returns, with ``link.max_bytes_per_s`` = 4 MB/s (``--cap-mb``),
   and the backlog drains. The bench samples the gateway's ``/v1/status``
   every 0.5 s and its VmRSS and RssAnon (``/proc/<pid>/status``) every
   0.25 s throughout;
5. the cap phase: the link goes down again, producers write ``--cap-seconds``
   (100) seconds of the cap as binary batches of incompressible records
   (~256 KiB each), and the link returns: a backlog the shipper reads and
   compresses far faster than the cap, so the cap sets the rate.

Figures, each beside its target (issue 16) and a baseline from the same run:

* ``entries``, ``backlog_gib``: the journals' entries (LSNs) and bytes, over
  every lane;
* ``peak_rss_mb`` (target <= 150 MB for 8 GiB of single-record entries),
  baseline: the same gateway's RSS when it was ready with an empty journal;
  also per phase (``fill_peak_rss_mb``, ``drain_peak_rss_mb``, ...);
* ``rss_mb_per_million_entries`` (target <= 5): the least-squares slope of
  VmRSS against entries over the fill after its first million (warm-up), so
  what configuration bounds (each lane's active segment and its in-memory
  index, refilled at every roll) is not counted as growth;
  ``anon_rss_mb_per_million_entries`` the same for RssAnon;
  ``rss_mb_per_million_from_idle`` the old figure (end of fill less the idle,
  empty gateway), baseline: what the in-RAM index of old cost (three 8-byte
  slots per entry: 22.9 MB per million);
* ``link_cap_mb_per_s``, ``achieved_mb_per_s``, ``cap_ratio`` (0.9-1.05): the
  cap phase's bytes on the link by the gateway's meter over its moving part;
  ``cap_minute_ratio_min``/``_max``: the lowest and highest rate over every
  60 s window, over the cap; ``cap_proxy_mb_per_s``: the proxy's own count
  of bytes to the store (HTTP and manifests included); ``cap_waited_s``:
  seconds transfers waited for the cap;
* ``single_drain_mb_per_s`` / ``single_drain_entries_per_s``: the drain of
  the one-record backlog, which the shipper's CPU sets (``link_waited_s``,
  ``cap_bound`` say whether the cap bound at all);
* ``reopen_s_per_gib`` (target <= 2): the start with the backlog less the
  first start with an empty journal (the process's own start-up, same run),
  per GiB; ``reopen_s`` is the whole start;
* ``critical_drained_s`` and ``bulk_before_critical_objects`` (target 0): only
  when this build's topics take a ``priority``; otherwise null, with a note.
* ``bytes_per_record_at_rest`` (issue 42; target <= 33.1: three days at 1,000
  reference records/s in 8 GiB) and ``offline_hours_per_gib`` at 1,000
  records/s: two more gateways (4 MiB segments, a local bucket), one with
  ``journal.at_rest = "compressed"`` (the default: its rewriter runs while
  they produce), one with ``"off"``, take the same reference telemetry
  records (``sample_data``) as single-record entries (``--at-rest-records``,
  default 1,000,000; ``--quick`` 100,000). The compressed segments' bytes
  over their records, beside the same segments' bytes uncompressed
  (``bytes_per_record_uncompressed``) and the off journal's
  (``bytes_per_record_off``, index files included);
  ``journal_bytes_per_record_compressed`` counts the whole journal (its
  uncompressed active segment too). ``--at-rest-only`` runs only these
  (``--quick --at-rest-only``: about a minute).
* ``load_avg``: the machine's load average at the end (other work shares it).

``--fill direct`` (issue 42: the backlog of a three-day outage is ~259 M
one-record entries, far beyond what HTTP producers write in a session)
runs a different sequence instead: the gateway starts once with an empty
journal (its idle RSS: the baseline) and stops; the bench writes that
journal in-process, in rounds of ``--round-segments`` (16) segments of 64
MiB, with the journal's own ``Journal.open_sync`` and ``append_nowait``:
the reference telemetry records (``sample_data``'s readings, 200 sensors,
one every millisecond, keyed to 16 partitions), each its own entry, made
by a second process; after each round every sealed segment is rewritten
by ``compress_sealed_segment`` (the rewriter's ``write_compressed``,
offline and unpaced) and the real gateway reopens the journal offline:
reopen time, VmRSS and RssAnon after one second (the points of
``rss_mb_per_million_entries``, and of ``..._past_settled`` after the 40th
segment, once the 32 directories a process keeps decoded are all in use).
The fill stops when the compressed segments hold ``--backlog-gib`` (8: three
days) or at the first round boundary after ``--max-fill-s``; then the link
comes up, capped, and the whole backlog drains to moto
(``drain_peak_rss_mb``, ``drain_mb_per_s`` beside the cap). Printed beside
the same run's idle gateway and the 150 MB target, with the RSS
extrapolated to three days (259.2 M entries) from the last reopen and the
drain's peak plus the slope, labelled as an extrapolation.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import queue as queue_module
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
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
from edge_gateway.format import atrest, logobject
from edge_gateway.format.batch import encode_batch
from edge_gateway.journal import FsyncPolicy, Journal, JournalConfig, compress_sealed_segment
from edge_gateway.sample_data import TelemetryGenerator, partition_for
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


def write_config(
    root: Path, proxy_url: str, cap: int, backlog: int, prio: bool, partitions: int = PARTITIONS
) -> Path:
    topics = ""
    for name, priority, _ in TOPICS:
        topics += f'[[topics]]\nname = "{name}"\nhome = "north"\npartitions = {partitions}\n'
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


def journal_totals(doc: dict[str, Any]) -> tuple[int, int]:
    """(entries, bytes) of the gateway's journals: every lane's, or the one journal's."""
    lanes = doc.get("lanes", {}).get("lanes") or []
    if lanes:
        return sum(lane["next_lsn"] - 1 for lane in lanes), sum(
            lane["journal_bytes"] for lane in lanes
        )
    return doc["journal"]["next_lsn"] - 1, doc["journal"]["bytes"]


def produce(
    url: str,
    backlog: int,
    producers: int,
    value_bytes: int,
    rss: RssSampler | None = None,
    samples: list[tuple[int, int, int]] | None = None,
) -> None:
    """``producers`` threads until the journals hold ``backlog`` bytes (checked every ~2 s).

    The journals' bytes are summed over the lanes (one journal per priority):
    the normal lane alone held about two thirds of the backlog. With ``rss``,
    each check appends (entries, VmRSS kB, RssAnon kB) to ``samples``.
    """
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
            entries, size = journal_totals(httpx.get(f"{url}/v1/status", timeout=30).json())
            note = ""
            if rss is not None and samples is not None:
                samples.append((entries, rss.sample(), rss.anon_kb))
                note = f"; RSS {rss.last_kb / 1024:.0f} MB, anon {rss.anon_kb / 1024:.0f} MB"
            progress(f"  journals {size / GiB:.2f} GiB, {entries:,} entries{note}")
            if size >= backlog:
                break
    finally:
        stop.set()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


def produce_batches(url: str, total: int, producers: int) -> int:
    """Binary batches of incompressible records (~256 KiB each) until ``total`` bytes went in.

    For the cap phase: a backlog the shipper can read and compress far faster
    than the cap (a few large entries instead of millions of one-record
    ones), so the cap, not the shipper, sets the drain rate. 61 distinct
    batches (a prime, against the 64 partitions) so no block repeats a batch.
    """
    pool = [
        encode_batch([os.urandom(1024) for _ in range(256)], timestamps=[1_795_000_000_000] * 256)
        for _ in range(61)
    ]
    sent = [0] * producers
    errors: list[BaseException] = []

    def producer(k: int) -> None:
        try:
            with httpx.Client(base_url=url, timeout=60) as c:
                n = k
                while sum(sent) < total and not errors:
                    batch = pool[n % len(pool)]
                    r = c.post(
                        f"/v1/topics/telemetry/partitions/{n % PARTITIONS}/batches",
                        content=batch,
                        headers={"content-type": BATCH_MEDIA_TYPE},
                    )
                    if r.status_code != 200:
                        raise RuntimeError(f"produce: {r.status_code} {r.text[:200]}")
                    sent[k] += len(batch)
                    n += producers
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(sent)


#: (monotonic s, the meter's up bytes, the proxy's bytes to the store, pending LSNs)
DrainSample = tuple[float, int, int, int]


def drain(
    gw: Gateway,
    proxy: TcpProxy,
    on_sample: Callable[[dict[str, Any], float], None] | None = None,
) -> tuple[list[DrainSample], float]:
    """Link up; sample every 0.5 s until nothing is pending. (samples, seconds)."""
    proxy.set_mode(ProxyMode.PASS)
    began = time.monotonic()
    samples: list[DrainSample] = []
    while True:
        doc = gw.status()
        now = time.monotonic()
        samples.append(
            (
                now,
                doc["link"]["up_bytes"],
                proxy.statistics().bytes_to_upstream,
                doc["shipper"]["pending_lsns"],
            )
        )
        if on_sample is not None:
            on_sample(doc, now - began)
        if doc["shipper"]["pending_lsns"] == 0:
            return samples, time.monotonic() - began
        if len(samples) % 20 == 0:
            progress(
                f"  {doc['shipper']['pending_lsns']:,} entries pending, "
                f"{doc['link']['up_bytes'] / MB:.0f} MB up"
            )
        time.sleep(0.5)


def moving_span(samples: list[DrainSample]) -> tuple[int, int] | None:
    """Indexes of the samples around the part of a drain where bytes moved."""
    moving = [i for i in range(1, len(samples)) if samples[i][1] > samples[i - 1][1]]
    if not moving or samples[moving[-1]][0] <= samples[moving[0] - 1][0]:
        return None
    return moving[0] - 1, moving[-1]


def rate(samples: list[DrainSample], column: int) -> float | None:
    """MB/s of ``column`` over the moving part of a drain."""
    span = moving_span(samples)
    if span is None:
        return None
    a, b = samples[span[0]], samples[span[1]]
    return (b[column] - a[column]) / (b[0] - a[0]) / MB


def minute_ratios(samples: list[DrainSample], cap: int) -> tuple[float, float] | None:
    """(lowest, highest) of the meter's rate over every 60 s window of the moving part, / cap."""
    span = moving_span(samples)
    if span is None:
        return None
    moving = samples[span[0] : span[1] + 1]
    ratios = []
    j = 0
    for i, (t0, b0, _, _) in enumerate(moving):
        j = max(j, i)
        while j < len(moving) and moving[j][0] - t0 < 60.0:
            j += 1
        if j == len(moving):
            break
        t1, b1 = moving[j][0], moving[j][1]
        ratios.append((b1 - b0) / (t1 - t0) / cap)
    return (min(ratios), max(ratios)) if ratios else None


def slope(points: list[tuple[int, int]]) -> float | None:
    """Least-squares slope of kB against entries, in MB per million entries.

    Over many samples the sawtooth of what is bounded by configuration (each
    lane's active segment and its in-memory index, refilled at every roll)
    averages out, and what is left is what grows with the backlog.
    """
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return sxy / sxx / 1024 * 1e6


AT_REST_PARTITIONS = 16
#: The target of issue 42: three days at 1,000 reference records/s in 8 GiB.
AT_REST_TARGET_BYTES = 8 * GiB / (3 * 86400 * 1000)


def at_rest_phase(root: Path, records: int, producers: int) -> dict[str, Any]:
    """Bytes per reference record at rest, ``journal.at_rest`` compressed and off (same run).

    Two gateways, one after the other, each take the same ``records``
    reference telemetry records (``sample_data.TelemetryGenerator``) as
    single-record entries (JSON requests of one record per partition, each
    record in its sensor's partition by key hash; 4 MiB segments) while their
    shippers run; the compressed
    one's rewriter rewrites sealed segments as they seal, and the bench
    waits for it to catch up. Then both stop and their files are counted:
    for each compressed segment its size and its records (its directory's
    frames), and the bytes of the entry log it replaced (the same segments
    uncompressed: today's figure); the off journal's segments and index files
    over all its records (today's journal as a whole).
    """
    gen = TelemetryGenerator(sensors=200, seed=42)
    # keyed by sensor, as a producer partitions them (a sensor's readings stay
    # together); a request takes the next record of each partition, so each
    # record is an entry of its own
    queues: list[list[dict[str, Any]]] = [[] for _ in range(AT_REST_PARTITIONS)]
    for r in gen.take(records):
        p = partition_for(r.key, AT_REST_PARTITIONS)
        queues[p].append({"key": r.key.decode(), "value": r.value.decode(), "partition": p})
    bodies = []
    for i in range(max(len(q) for q in queues)):
        batch = [q[i] for q in queues if i < len(q)]
        bodies.append(json.dumps({"records": batch}, separators=(",", ":")))
    out: dict[str, Any] = {"at_rest_records": records}
    for mode in ("compressed", "off"):
        d = root / f"at-rest-{mode}"
        (d / "bucket").mkdir(parents=True)
        config = d / "edgegw.toml"
        config.write_text(
            f"""region = "north"
data_dir = "{d / "data"}"
shutdown_grace_s = 5.0
[journal]
segment_bytes = "4MiB"
at_rest = "{mode}"
[bucket]
type = "local"
path = "{d / "bucket"}"
[gc]
enabled = false
[log]
level = "warning"
[api]
listen = "127.0.0.1:0"
server = "builtin"
[[topics]]
name = "telemetry"
home = "north"
partitions = {AT_REST_PARTITIONS}
"""
        )
        gw = Gateway(d, config)
        gw.start()
        try:
            progress(f"at rest ({mode}): {records:,} reference records, one per entry ...")
            began = time.monotonic()
            _post_all(gw.url, bodies, producers)
            out[f"at_rest_{mode}_produce_records_per_s"] = records / (time.monotonic() - began)
            if mode == "compressed":
                began = time.monotonic()
                while (a := gw.status()["journal"]["at_rest"])["pending_segments"]:
                    if time.monotonic() - began > 1800:
                        raise SystemExit("the rewriter did not catch up in 30 min")
                    time.sleep(0.5)
                out["at_rest_catch_up_s"] = time.monotonic() - began
                out["at_rest_rewrite_failures"] = a["rewrite_failures"]
            out[f"at_rest_{mode}_journal_bytes"] = gw.status()["journal"]["bytes"]
        finally:
            gw.stop()
    journal = root / "at-rest-compressed" / "data" / "journal"
    size = wal = recs = segs = 0
    for f in sorted(journal.glob("*.wal")):
        data = f.read_bytes()
        if data[:4] != atrest.MAGIC:
            continue
        directory = atrest.CompressedSegment(data, where=str(f)).directory
        size += len(data)
        wal += directory.wal_bytes
        recs += sum(fr.record_count for fr in directory.frames)
        segs += 1
    off = root / "at-rest-off" / "data" / "journal"
    off_bytes = sum(f.stat().st_size for f in off.iterdir() if f.suffix in (".wal", ".idx"))
    bpr = size / recs if recs else None
    out.update(
        at_rest_compressed_segments=segs,
        bytes_per_record_at_rest=bpr,
        bytes_per_record_uncompressed=wal / recs if recs else None,
        bytes_per_record_off=off_bytes / records,
        journal_bytes_per_record_compressed=out["at_rest_compressed_journal_bytes"] / records,
        offline_hours_per_gib=None if bpr is None else GiB / (bpr * 1000) / 3600,
        offline_hours_per_gib_uncompressed=GiB / (off_bytes / records * 1000) / 3600,
    )
    return out


def _post_all(url: str, bodies: list[str], producers: int) -> None:
    errors: list[BaseException] = []

    def post(k: int) -> None:
        try:
            with httpx.Client(base_url=url, timeout=60) as c:
                for body in bodies[k::producers]:
                    r = c.post(
                        "/v1/topics/telemetry/records",
                        content=body,
                        headers={"content-type": "application/json"},
                    )
                    if r.status_code != 200:
                        raise RuntimeError(f"produce: {r.status_code} {r.text[:200]}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=post, args=(k,)) for k in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def at_rest_rows(f: dict[str, Any]) -> list[Row | str]:
    bpr, hours = f["bytes_per_record_at_rest"], f["offline_hours_per_gib"]
    return [
        f"at rest: {f['at_rest_records']:,} reference telemetry records, one per entry, "
        f"the rewriter running ({f['at_rest_compressed_segments']} segments rewritten; it "
        f"caught up {f['at_rest_catch_up_s']:.0f} s after the last produce)",
        Row(
            "bytes per record at rest",
            bpr,
            "B",
            "the same segments uncompressed",
            f["bytes_per_record_uncompressed"],
            f"<= {AT_REST_TARGET_BYTES:.1f}",
            None if bpr is None else bpr <= AT_REST_TARGET_BYTES,
        ),
        Row(
            "whole journal (active segment too)",
            f["journal_bytes_per_record_compressed"],
            "B",
            "journal.at_rest = off",
            f["bytes_per_record_off"],
        ),
        Row(
            "offline hours per GiB at 1,000 rec/s",
            hours,
            "h",
            "journal.at_rest = off",
            f["offline_hours_per_gib_uncompressed"],
            f">= {72 / 8:.0f} (3 days in 8 GiB)",
            None if hours is None else hours >= 9,
        ),
        Row(
            "produce, at rest compressed",
            f["at_rest_compressed_produce_records_per_s"],
            "rec/s",
            "journal.at_rest = off",
            f["at_rest_off_produce_records_per_s"],
        ),
    ]


# ------------------------------------------------------------ --fill direct

#: The gateway's default ``journal.segment_bytes``: the direct fill writes its journal with it.
DIRECT_SEGMENT_BYTES = 64 * MB
#: Reference records per message from the generating process.
DIRECT_CHUNK = 20_000
#: Messages the generating process may run ahead (~420 MB of the bench's memory, not the gateway's).
DIRECT_QUEUED = 64
#: ``TelemetryGenerator``'s default start (2026-11-18).
REFERENCE_START_MS = 1_795_000_000_000
#: Compressed segments after which the directories a process keeps decoded
#: (32, docs/journal.md "Memory") are all in use: the RSS slope past it is growth.
DIRECTORIES_SETTLED = 40
#: Three days at the reference rate (shared/WORKLOADS.md): 1,000 records/s.
THREE_DAYS_RECORDS = 3 * 86400 * 1000


def reference_readings(sensors: int, seed: int, step_ms: int) -> Iterator[tuple[bytes, bytes, int]]:
    """``sample_data.TelemetryGenerator``'s readings, byte for byte, ~3x faster.

    The same random stream in the same order, the same rounding and the same
    JSON (``json.dumps`` writes a float as its ``repr``, as ``%r`` does); the
    timestamp's text is formatted once per second. Checked against the
    generator itself (:func:`_check_reference_readings`) before a fill uses it.
    """
    rnd = random.Random(seed)
    gauss = rnd.gauss
    ids = [f"s-{i:05d}" for i in range(sensors)]
    keys = [i.encode() for i in ids]
    temp = [rnd.uniform(15.0, 25.0) for _ in range(sensors)]
    hum = [rnd.uniform(30.0, 60.0) for _ in range(sensors)]
    template = (
        '{"sensor_id": "%s", "site": "north", "ts": "%s%03dZ", "temperature": %r, '
        '"humidity": %r, "vibration": %r, "pressure_hpa": %r, "battery_v": %r, '
        '"status": "ok", "seq": %d}'
    )
    now = REFERENCE_START_MS
    second, stamp = -1, ""
    seq = 0
    while True:
        i = seq % sensors
        temp[i] += gauss(0, 0.02)
        hum[i] = min(100.0, max(0.0, hum[i] + gauss(0, 0.05)))
        t = temp[i]
        if now // 1000 != second:
            second = now // 1000
            stamp = datetime.fromtimestamp(now / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        value = template % (
            ids[i],
            stamp,
            now % 1000,
            round(t + gauss(0, 0.05), 2),
            round(hum[i], 1),
            round(abs(gauss(0.01, 0.004)), 3),
            round(1013.25 + (t - 20.0) * 0.8 + gauss(0, 0.1), 2),
            round(3.7 - seq * 1e-7, 3),
            seq,
        )
        yield keys[i], value.encode(), now
        seq += 1
        now += step_ms


def _check_reference_readings(n: int = 50_000) -> None:
    """Refuse to fill unless :func:`reference_readings` equals ``TelemetryGenerator``."""
    fast = reference_readings(200, 42, 1)
    slow = TelemetryGenerator(sensors=200, seed=42, step_ms=1, start_ms=REFERENCE_START_MS)
    for k in range(n):
        r = next(slow)
        if next(fast) != (r.key, r.value, r.timestamp_ms):
            raise SystemExit(f"reference_readings differs from TelemetryGenerator at record {k}")


def _generate_batches(queue: Any, partitions: int) -> None:
    """The generating process of ``--fill direct``: encoded one-record batches, forever.

    The reference telemetry records of shared/WORKLOADS.md (``sample_data``:
    200 sensors, drifting values, one record every millisecond: 1,000/s),
    keyed by sensor and partitioned by key hash, each encoded as its own
    batch, as the API encodes a JSON request's record: one journal entry each.
    The readings come from :func:`reference_readings` (the same bytes,
    checked at start). In a process of its own so that generating runs
    beside the appends and the compression (the queue holds up to
    ``DIRECT_QUEUED`` messages, ~1.3 M records, so it keeps going while a
    round's segments are compressed).
    """
    _check_reference_readings()
    readings = reference_readings(200, 42, 1)
    part_of: dict[bytes, int] = {}
    while True:
        out = []
        for _ in range(DIRECT_CHUNK):
            key, value, ts = next(readings)
            p = part_of.get(key)
            if p is None:
                p = part_of[key] = partition_for(key, partitions)
            out.append((p, encode_batch([value], keys=[key], timestamps=ts)))
        queue.put(out)


def _next_chunk(queue: Any, gen: Any) -> list[tuple[int, bytes]]:
    """The generating process's next message; exit if it died (it would never send one)."""
    while True:
        try:
            chunk: list[tuple[int, bytes]] = queue.get(timeout=10)
        except queue_module.Empty:
            if not gen.is_alive():
                raise SystemExit(f"the generating process exited ({gen.exitcode})") from None
        else:
            return chunk


@dataclasses.dataclass
class FillPoint:
    """The gateway reopened offline after a round of the direct fill."""

    entries: int
    compressed_bytes: int
    wal_bytes: int
    segments: int
    reopen_s: float
    rss_kb: int
    anon_kb: int
    fill_s: float


def direct_fill(
    journal_dir: Path,
    target_bytes: int,
    round_segments: int,
    on_round: Callable[[int, int, int, int], FillPoint],
    stop_gateway: Callable[[], None],
    max_s: float | None = None,
) -> tuple[list[FillPoint], float, float]:
    """Fill the gateway's (closed) journal until its compressed segments hold ``target_bytes``.

    Rounds of ``round_segments`` segments: open the journal with its own
    ``Journal.open_sync``, ``append_nowait`` one-record batches from the
    generating process, close it, and rewrite every sealed segment with
    ``compress_sealed_segment`` (the rewriter's ``write_compressed``: the
    same code and frames as the gateway's background rewrite, offline and
    unpaced). After each round ``on_round(entries, compressed bytes, their
    bytes uncompressed, compressed segments)`` reopens the real gateway
    offline and samples it; ``stop_gateway`` stops it before the next
    round (one process per journal). The gateway is left running after the
    last round. With ``max_s``, no round starts after ``max_s`` seconds: the
    figures are then at the scale reached (the JSON says so). Returns the
    points, seconds appending and seconds compressing.
    """
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue(maxsize=DIRECT_QUEUED)
    gen = ctx.Process(target=_generate_batches, args=(queue, AT_REST_PARTITIONS), daemon=True)
    gen.start()
    config = JournalConfig(
        fsync=FsyncPolicy.NEVER,
        segment_bytes=DIRECT_SEGMENT_BYTES,
        max_bytes=target_bytes * 2 + (round_segments + 2) * DIRECT_SEGMENT_BYTES,
    )
    points: list[FillPoint] = []
    append_s = compress_s = 0.0
    compressed = wal = segments = 0
    began = time.monotonic()
    try:
        while compressed < target_bytes:
            if points and max_s is not None and time.monotonic() - began > max_s:
                progress(f"  fill stopped at {max_s:.0f} s (--max-fill-s), below the target")
                break
            if points:
                stop_gateway()
            t0 = time.monotonic()
            j = Journal.open_sync(journal_dir, config)
            try:
                goal = j.appended_bytes + round_segments * DIRECT_SEGMENT_BYTES
                while j.appended_bytes < goal:
                    for partition, batch in _next_chunk(queue, gen):
                        j.append_nowait("telemetry", partition, batch)
                entries = j.next_lsn - 1
            finally:
                j.close_sync()
            t1 = time.monotonic()
            append_s += t1 - t0
            files = sorted(journal_dir.glob("*.wal"))
            for f in files[:-1]:  # the last one is the segment the journal appends to
                with f.open("rb") as fh:
                    if fh.read(4) == atrest.MAGIC:
                        continue
                done = compress_sealed_segment(journal_dir, int(f.name.split(".")[0]))
                compressed += done.compressed_bytes
                wal += done.wal_bytes
                segments += 1
            compress_s += time.monotonic() - t1
            progress(
                f"  fill: {entries:,} entries, {segments} segments compressed to "
                f"{compressed / GiB:.3f} GiB ({compressed / max(1, wal):.3f} of their "
                f"{wal / GiB:.2f} GiB), {time.monotonic() - began:.0f} s"
            )
            points.append(on_round(entries, compressed, wal, segments))
    finally:
        gen.kill()
        gen.join()
    return points, append_s, compress_s


def direct_main(args: argparse.Namespace, cap: int, target: int) -> None:
    """``--fill direct``: the backlog written in-process, compressed, then reopened and drained.

    The gateway (``edgegw serve``) starts once with an empty journal (its
    idle RSS, the baseline) and stops; :func:`direct_fill` writes its journal
    in rounds, and after each round the gateway reopens it offline (reopen
    time, RSS: the points of the slope per million entries). Then the link
    comes up, capped, and the whole compressed backlog drains to moto.
    """
    rss = RssSampler()
    rss.start()
    with scratch_dir("offline") as root:
        free = os.statvfs(root)
        room = target + (args.round_segments + 2) * DIRECT_SEGMENT_BYTES
        if free.f_bavail * free.f_frsize < room * 1.3:
            raise SystemExit(f"{root}: not enough free disk for {target / GiB:.1f} GiB compressed")
        moto = start_moto_server(root / "moto.log")
        proxy = TcpProxy("127.0.0.1", int(moto.endpoint.rsplit(":", 1)[1])).start()
        gw = Gateway(
            root,
            write_config(root, proxy.url, cap, target, prio=False, partitions=AT_REST_PARTITIONS),
        )
        try:
            s3_client(moto.endpoint).create_bucket(Bucket="fleet")
            first_start_s = gw.start()
            assert gw.proc is not None
            rss.pid = gw.proc.pid
            wait_claimed(gw)
            time.sleep(1.0)
            idle_kb, idle_anon_kb = rss.sample(), rss.anon_kb
            proxy.set_mode(ProxyMode.REFUSE)
            gw.stop()
            rss.pid = None
            fill_began = time.monotonic()

            def reopen(entries: int, compressed: int, wal: int, segments: int) -> FillPoint:
                fill_s = time.monotonic() - fill_began
                reopen_s = gw.start()
                assert gw.proc is not None
                rss.pid = gw.proc.pid
                time.sleep(1.0)
                point = FillPoint(
                    entries, compressed, wal, segments, reopen_s, rss.sample(), rss.anon_kb, fill_s
                )
                progress(
                    f"  reopened offline in {reopen_s:.2f} s: RSS {point.rss_kb / 1024:.1f} MB, "
                    f"anon {point.anon_kb / 1024:.1f} MB"
                )
                return point

            def stop_between() -> None:
                gw.stop()
                rss.pid = None

            progress(f"link down; direct fill to {target / GiB:.2f} GiB compressed ...")
            points, append_s, compress_s = direct_fill(
                root / "data" / "journal",
                target,
                args.round_segments,
                reopen,
                stop_between,
                args.max_fill_s,
            )
            last = points[-1]
            # The gateway is running, offline, on the whole backlog (the last point).
            rss.peak_kb = 0
            st = gw.status()
            entries, journal_bytes = journal_totals(st)
            progress(f"  link up, capped at {cap / MB:.1f} MB/s; draining {entries:,} entries ...")
            waited0 = st["link"]["waited_s"]
            anon_peak = [0]

            def watch(doc: dict[str, Any], elapsed: float) -> None:
                anon_peak[0] = max(anon_peak[0], rss.anon_kb)

            samples, drain_s = drain(gw, proxy, watch)
            end = gw.status()
            drain_peak_kb = rss.peak_kb
            drained_kb, drained_anon_kb = rss.sample(), rss.anon_kb
            waited_s = end["link"]["waited_s"] - waited0
            wire_bytes = end["shipper"]["wire_bytes"]
        finally:
            gw.stop()
            rss.stop()
            proxy.stop()
            moto.stop()

    bpr = last.compressed_bytes / last.entries
    wal_bpr = last.wal_bytes / last.entries
    rss_slope = slope([(p.entries, p.rss_kb) for p in points])
    anon_slope = slope([(p.entries, p.anon_kb) for p in points])
    # Past the directories a process keeps decoded (32, docs/journal.md "Memory"),
    # what is left grows with the backlog.
    late = [p for p in points if p.segments > DIRECTORIES_SETTLED]
    late_slope = slope([(p.entries, p.rss_kb) for p in late])
    # Extrapolated (printed as such): the last reopen's RSS plus the slope up to three days.
    growth = late_slope if late_slope is not None else rss_slope
    extra = (
        None
        if growth is None
        else last.rss_kb / 1024 + max(0.0, growth) * (THREE_DAYS_RECORDS - last.entries) / 1e6
    )
    extra_drain = (
        None
        if growth is None
        else drain_peak_kb / 1024 + max(0.0, growth) * (THREE_DAYS_RECORDS - last.entries) / 1e6
    )
    reopen_per_gib = max(0.0, last.reopen_s - first_start_s) / (last.compressed_bytes / GiB)
    drain_mb_s = rate(samples, 1)
    span = moving_span(samples)
    drain_entries_s = (
        (samples[span[0]][3] - samples[span[1]][3]) / (samples[span[1]][0] - samples[span[0]][0])
        if span
        else None
    )
    peak_mb = max(drain_peak_kb, last.rss_kb) / 1024
    hours = GiB / (bpr * 1000) / 3600
    rows: list[Row | str] = [
        f"direct fill: {last.entries:,} reference records, one per entry, in {last.segments} "
        f"segments of {DIRECT_SEGMENT_BYTES // MB} MiB compressed to "
        f"{last.compressed_bytes / GiB:.3f} GiB ({append_s:.0f} s appending, {compress_s:.0f} s "
        f"compressing, {len(points)} rounds)",
        Row(
            "bytes per record at rest",
            bpr,
            "B",
            "the same segments uncompressed",
            wal_bpr,
            f"<= {AT_REST_TARGET_BYTES:.1f}",
            bpr <= AT_REST_TARGET_BYTES,
        ),
        Row(
            "offline hours per GiB at 1,000 rec/s",
            hours,
            "h",
            "the same segments uncompressed",
            GiB / (wal_bpr * 1000) / 3600,
            ">= 9 (3 days in 8 GiB)",
            hours >= 9,
        ),
        Row(
            "RSS reopened offline on the backlog",
            last.rss_kb / 1024,
            "MB",
            "same gateway, ready, empty journal",
            idle_kb / 1024,
        ),
        Row(
            "peak RSS, drain of the backlog",
            drain_peak_kb / 1024,
            "MB",
            "same gateway, ready, empty journal",
            idle_kb / 1024,
            f"<= 150 MB ({last.compressed_bytes / GiB:.2f} GiB)",
            peak_mb <= 150,
        ),
        Row(
            "RSS growth per million entries (reopens)",
            rss_slope,
            "MB",
            "old in-RAM index (3 x 8 B/entry)",
            OLD_INDEX_MB_PER_MILLION,
            "<= 5",
            rss_slope is not None and rss_slope <= 5,
        ),
        Row(
            f"  the same past {DIRECTORIES_SETTLED} segments",
            late_slope,
            "MB",
            "old in-RAM index (3 x 8 B/entry)",
            OLD_INDEX_MB_PER_MILLION,
            "<= 5",
            None if late_slope is None else late_slope <= 5,
        ),
        Row(
            "EXTRAPOLATED peak RSS at 3 days (259.2 M)",
            extra_drain,
            "MB",
            "same gateway, ready, empty journal",
            idle_kb / 1024,
            "<= 150 MB (8 GiB)",
            extra_drain is not None and extra_drain <= 150,
        ),
        Row(
            "reopen with the backlog, per GiB",
            reopen_per_gib,
            "s",
            "first start, empty journal (s)",
            first_start_s,
            "<= 2",
            reopen_per_gib <= 2,
        ),
        Row(
            "drain of the compressed backlog", drain_mb_s, "MB/s", "link.max_bytes_per_s", cap / MB
        ),
        f"drain: {drain_entries_s or 0:,.0f} entries/s over {drain_s:.0f} s; transfers waited "
        f"{waited_s:.0f} s for the cap "
        f"({'the cap bound' if waited_s > 0.1 * drain_s else 'the cap hardly bound'})",
        "reopens (entries, RSS MB, anon MB, s): "
        + "; ".join(
            f"{p.entries / 1e6:.1f} M {p.rss_kb / 1024:.1f} {p.anon_kb / 1024:.1f} {p.reopen_s:.2f}"
            for p in points
        ),
    ]
    title = (
        f"offline, direct fill, {last.compressed_bytes / GiB:.2f} GiB compressed, "
        f"cap {cap / MB:.1f} MB/s"
    )
    print(render_table(title, rows))
    emit_json(
        {
            "bench": "offline",
            "fill": "direct",
            "entries": last.entries,
            "journal_entries_status": entries,
            "journal_bytes_status": journal_bytes,
            "target_gib": round(target / GiB, 3),
            "reached_target": last.compressed_bytes >= target,
            "compressed_gib": round(last.compressed_bytes / GiB, 4),
            "uncompressed_gib": round(last.wal_bytes / GiB, 3),
            "compressed_segments": last.segments,
            "bytes_per_record_at_rest": round(bpr, 2),
            "bytes_per_record_uncompressed": round(wal_bpr, 2),
            "offline_hours_per_gib": round(hours, 2),
            "fill_append_s": round(append_s, 1),
            "fill_compress_s": round(compress_s, 1),
            "idle_rss_mb": round(idle_kb / 1024, 1),
            "idle_anon_mb": round(idle_anon_kb / 1024, 1),
            "reopened_rss_mb": round(last.rss_kb / 1024, 1),
            "reopened_anon_mb": round(last.anon_kb / 1024, 1),
            "drain_peak_rss_mb": round(drain_peak_kb / 1024, 1),
            "drain_peak_anon_mb": round(anon_peak[0] / 1024, 1),
            "drained_rss_mb": round(drained_kb / 1024, 1),
            "drained_anon_mb": round(drained_anon_kb / 1024, 1),
            "peak_rss_mb": round(peak_mb, 1),
            "rss_mb_per_million_entries": None if rss_slope is None else round(rss_slope, 3),
            "anon_rss_mb_per_million_entries": None if anon_slope is None else round(anon_slope, 3),
            "rss_mb_per_million_entries_past_settled": (
                None if late_slope is None else round(late_slope, 3)
            ),
            "extrapolated_with": "past_settled" if late_slope is not None else "all_points",
            "extrapolated_reopened_rss_mb_3_days": None if extra is None else round(extra, 1),
            "extrapolated_peak_rss_mb_3_days": None
            if extra_drain is None
            else round(extra_drain, 1),
            "reopen_s": round(last.reopen_s, 3),
            "first_start_s": round(first_start_s, 3),
            "reopen_s_per_gib": round(reopen_per_gib, 3),
            "link_cap_mb_per_s": cap / MB,
            "drain_mb_per_s": None if drain_mb_s is None else round(drain_mb_s, 3),
            "drain_entries_per_s": None if drain_entries_s is None else round(drain_entries_s),
            "drain_s": round(drain_s, 1),
            "link_waited_s": round(waited_s, 1),
            "wire_mb": round(wire_bytes / MB, 1),
            "points": [dataclasses.asdict(p) for p in points],
            "load_avg": list(os.getloadavg()),
            "targets": {
                "peak_rss_mb": 150,
                "rss_mb_per_million_entries": 5,
                "reopen_s_per_gib": 2,
                "bytes_per_record_at_rest": round(AT_REST_TARGET_BYTES, 1),
            },
        }
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 GiB backlog instead of 8 GiB")
    ap.add_argument("--cap-mb", type=float, default=4.0, help="link cap in MB/s (default 4)")
    ap.add_argument("--backlog-gib", type=float, default=None, help="override the backlog size")
    ap.add_argument("--producers", type=int, default=8, help="concurrent producers (default 8)")
    ap.add_argument(
        "--value-bytes", type=int, default=VALUE_BYTES, help="bytes per record value (200)"
    )
    ap.add_argument(
        "--cap-seconds",
        type=float,
        default=100.0,
        help="seconds of the cap the batched backlog of the cap phase holds (default 100)",
    )
    ap.add_argument(
        "--at-rest-only",
        action="store_true",
        help="only the at-rest figures (bytes per record, offline hours per GiB)",
    )
    ap.add_argument(
        "--at-rest-records",
        type=int,
        default=None,
        help="reference records of the at-rest figures (default 1,000,000; --quick 100,000)",
    )
    ap.add_argument(
        "--fill",
        choices=("http", "direct"),
        default="http",
        help="http: producers through the API (the issue 16 run); direct: the journal written "
        "in-process with its append API and compressed, then reopened and drained (issue 42)",
    )
    ap.add_argument(
        "--round-segments",
        type=int,
        default=16,
        help="--fill direct: segments appended between two reopens of the gateway (default 16)",
    )
    ap.add_argument(
        "--max-fill-s",
        type=float,
        default=None,
        help="--fill direct: start no round after this many seconds (the figures at the scale "
        "reached)",
    )
    args = ap.parse_args()
    if args.fill == "direct":
        gib = args.backlog_gib or (1.0 if args.quick else 8.0)
        direct_main(args, int(args.cap_mb * MB), int(gib * GiB))
        return
    at_rest_records = args.at_rest_records or (100_000 if args.quick else 1_000_000)
    if args.at_rest_only:
        with scratch_dir("offline") as root:
            f = at_rest_phase(root, at_rest_records, args.producers)
        print(render_table("journal at rest, compressed vs off", at_rest_rows(f)))
        emit_json({"bench": "offline", "quick": args.quick, **f, "load_avg": list(os.getloadavg())})
        return
    cap = int(args.cap_mb * MB)
    backlog = int((args.backlog_gib or (1.0 if args.quick else 8.0)) * GiB)
    cap_backlog = int(cap * args.cap_seconds)
    prio = priorities_supported()

    rss = RssSampler()
    rss.start()
    with scratch_dir("offline") as root:
        free = os.statvfs(root)
        if free.f_bavail * free.f_frsize < (backlog + cap_backlog) * 1.3:
            raise SystemExit(f"{root}: not enough free disk for a {backlog / GiB:.1f} GiB backlog")
        at_rest = at_rest_phase(root, at_rest_records, args.producers)
        moto = start_moto_server(root / "moto.log")
        proxy = TcpProxy("127.0.0.1", int(moto.endpoint.rsplit(":", 1)[1])).start()
        gw = Gateway(root, write_config(root, proxy.url, cap, backlog + cap_backlog, prio))
        fill: list[tuple[int, int, int]] = []
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
            produce(gw.url, backlog, args.producers, args.value_bytes, rss, fill)
            produce_s = time.monotonic() - began
            st = gw.status()
            entries, backlog_bytes = journal_totals(st)
            filled_kb = rss.sample()
            filled_anon_kb = rss.anon_kb
            fill_peak_kb = rss.peak_kb
            progress(f"restarting with the backlog ({entries:,} entries), still offline ...")
            gw.stop()
            rss.pid = None
            reopen_s = gw.start()
            assert gw.proc is not None
            rss.pid = gw.proc.pid
            time.sleep(1.0)
            reopened_kb, reopened_anon_kb = rss.sample(), rss.anon_kb
            rss.peak_kb = 0
            progress(f"  ready in {reopen_s:.2f} s; link up, capped at {cap / MB:.1f} MB/s ...")
            head_seq = st["shipper"]["next_seq"]
            critical: list[float] = []
            peak_anon = [0]

            def watch(doc: dict[str, Any], elapsed: float) -> None:
                peak_anon[0] = max(peak_anon[0], rss.anon_kb)
                if not critical and unshipped(doc, "alarms") == 0:
                    critical.append(elapsed)

            waited0 = gw.status()["link"]["waited_s"]
            single, drain_s = drain(gw, proxy, watch)
            end = gw.status()
            drain_peak_kb = rss.peak_kb
            drained_kb, drained_anon_kb = rss.sample(), rss.anon_kb
            wire_bytes = end["shipper"]["wire_bytes"]
            # Seconds transfers waited for the cap: ~0 means the cap never bound
            # (the shipper could not fill the link), so the rate is not about the cap.
            waited_s = end["link"]["waited_s"] - waited0
            bulk_before = bulk_before_critical(moto.endpoint, head_seq)

            # The cap phase: a backlog the shipper drains faster than the cap.
            proxy.set_mode(ProxyMode.REFUSE)
            progress(
                f"cap phase: link down; {cap_backlog / MB:.0f} MB of incompressible batches ..."
            )
            produce_batches(gw.url, cap_backlog, args.producers)
            waited0 = gw.status()["link"]["waited_s"]
            progress(f"  link up, capped at {cap / MB:.1f} MB/s ...")
            capped, cap_drain_s = drain(gw, proxy)
            cap_waited_s = gw.status()["link"]["waited_s"] - waited0
        finally:
            gw.stop()
            rss.stop()
            proxy.stop()
            moto.stop()

    single_mb_s = rate(single, 1)
    achieved = rate(capped, 1)
    proxy_mb_s = rate(capped, 2)
    cap_ratio = None if achieved is None else achieved / (cap / MB)
    minute = minute_ratios(capped, cap)
    gib = backlog_bytes / GiB
    peak_mb = max(drain_peak_kb, fill_peak_kb) / 1024
    # Growth with the backlog: the slope over the fill after its first million
    # entries (warm-up: imports, pools, the first rolls of every lane).
    warm = [(e, kb) for e, kb, _ in fill if e >= 1_000_000]
    per_million = slope(warm)
    anon_per_million = slope([(e, a) for e, _, a in fill if e >= 1_000_000])
    from_idle = (filled_kb - idle_kb) / 1024 / (entries / 1e6) if entries else None
    # The start of an empty journal (same run) is the process's own start-up:
    # what a backlog adds to it is the journal's reopen.
    reopen_per_gib = max(0.0, reopen_s - first_start_s) / gib if gib else None
    critical_drained_s = critical[0] if critical else None
    note = None if prio else "priorities not yet in this build"
    span = moving_span(single)
    single_entries_s = (
        (single[span[0]][3] - single[span[1]][3]) / (single[span[1]][0] - single[span[0]][0])
        if span
        else None
    )
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
            "RSS end of fill - idle, per million",
            from_idle,
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
            "drain of 1-record entries (wire)",
            single_mb_s,
            "MB/s",
            "link.max_bytes_per_s",
            cap / MB,
        ),
        Row(
            "capped drain of batches (meter)",
            achieved,
            "MB/s",
            "link.max_bytes_per_s",
            cap / MB,
            "0.9-1.05x",
            cap_ratio is not None and 0.9 <= cap_ratio <= 1.05,
        ),
        f"cap phase: every 60 s window at {minute[0]:.3f}-{minute[1]:.3f}x the cap; "
        f"transfers waited {cap_waited_s:.0f} s of {cap_drain_s:.0f} s; through the proxy "
        f"{proxy_mb_s or 0:.2f} MB/s (HTTP and manifests included)"
        if minute
        else f"cap phase shorter than a minute ({cap_drain_s:.0f} s)",
    ]
    if waited_s <= 0.1 * drain_s:
        rows.append(
            f"1-record drain: the cap hardly bound (waited {waited_s:.1f} s of {drain_s:.0f} s); "
            f"the shipper set the rate: {single_entries_s or 0:,.0f} entries/s"
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
    rows += at_rest_rows(at_rest)
    print(render_table(f"offline {gib:.1f} GiB, link cap {cap / MB:.1f} MB/s", rows))
    emit_json(
        {
            "bench": "offline",
            "quick": args.quick,
            "entries": entries,
            "backlog_gib": round(gib, 3),
            "produce_s": round(produce_s, 1),
            "peak_rss_mb": round(peak_mb, 1),
            "fill_peak_rss_mb": round(fill_peak_kb / 1024, 1),
            "drain_peak_rss_mb": round(drain_peak_kb / 1024, 1),
            "drain_peak_anon_mb": round(peak_anon[0] / 1024, 1),
            "idle_rss_mb": round(idle_kb / 1024, 1),
            "idle_anon_mb": round(idle_anon_kb / 1024, 1),
            "filled_rss_mb": round(filled_kb / 1024, 1),
            "filled_anon_mb": round(filled_anon_kb / 1024, 1),
            "reopened_rss_mb": round(reopened_kb / 1024, 1),
            "reopened_anon_mb": round(reopened_anon_kb / 1024, 1),
            "drained_rss_mb": round(drained_kb / 1024, 1),
            "drained_anon_mb": round(drained_anon_kb / 1024, 1),
            "rss_mb_per_million_entries": None if per_million is None else round(per_million, 2),
            "anon_rss_mb_per_million_entries": (
                None if anon_per_million is None else round(anon_per_million, 2)
            ),
            "rss_mb_per_million_from_idle": None if from_idle is None else round(from_idle, 2),
            "link_cap_mb_per_s": cap / MB,
            "achieved_mb_per_s": None if achieved is None else round(achieved, 3),
            "cap_ratio": None if cap_ratio is None else round(cap_ratio, 4),
            "cap_minute_ratio_min": None if minute is None else round(minute[0], 4),
            "cap_minute_ratio_max": None if minute is None else round(minute[1], 4),
            "cap_drain_s": round(cap_drain_s, 1),
            "cap_waited_s": round(cap_waited_s, 1),
            "cap_proxy_mb_per_s": None if proxy_mb_s is None else round(proxy_mb_s, 3),
            "single_drain_mb_per_s": None if single_mb_s is None else round(single_mb_s, 3),
            "single_drain_entries_per_s": None
            if single_entries_s is None
            else round(single_entries_s),
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
            **at_rest,
            "load_avg": list(os.getloadavg()),
            "targets": {
                "peak_rss_mb": 150,
                "rss_mb_per_million_entries": 5,
                "cap_ratio": [0.9, 1.05],
                "reopen_s_per_gib": 2,
                "bulk_before_critical_objects": 0,
                "bytes_per_record_at_rest": round(AT_REST_TARGET_BYTES, 1),
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
