"""``edgegw demo``: two regions on one machine, mirroring each other through a local bucket.

Starts two real gateways (``edgegw serve`` processes, regions ``north`` and
``south``) sharing a local-directory bucket, with a topic homed in each and
mirrored by the other; produces sample telemetry in both; waits until each
mirrors the other's topic; checks the mirrors record for record; measures the
end-to-end latency (acknowledged at the home region → readable in the other);
prints a table and exits 0. No servers to install, under a minute.
"""

from __future__ import annotations

import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import typer
from rich.table import Table

from edge_gateway.format.batch import encode_batch
from edge_gateway.telemetry import TelemetryGenerator, partition_for
from edgegw_cli._common import console, fail

BATCH_TYPE = "application/vnd.edgegw.batch"
REGIONS = {"north": ("sensors", 4), "south": ("weather", 2)}


@dataclass
class Site:
    region: str
    topic: str
    partitions: int
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    log_path: Path = field(default_factory=Path)


def _config(site: Site, bucket: Path, flush_ms: int, poll_ms: int) -> str:
    topics = "".join(
        f'[[topics]]\nname = "{topic}"\nhome = "{region}"\npartitions = {parts}\n'
        f'subscribers = ["*"]\n'
        for region, (topic, parts) in REGIONS.items()
    )
    return (
        f'region = "{site.region}"\ndata_dir = "{site.data_dir}"\n'
        f"[shipper]\nflush_interval_ms = {flush_ms}\n"
        f"[mirror]\npoll_interval_ms = {poll_ms}\nmax_poll_interval_ms = 500\n"
        f'[bucket]\ntype = "local"\npath = "{bucket}"\n'
        f'[api]\nlisten = "127.0.0.1:0"\n{topics}'
    )


def _start(site: Site, config: Path) -> None:
    site.log_path = site.data_dir.parent / f"{site.region}.log"
    with open(site.log_path, "wb") as log:
        site.proc = subprocess.Popen(
            [sys.executable, "-m", "edgegw_cli", "serve", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _wait_ready(site: Site, timeout: float = 60.0) -> None:
    addr = site.data_dir / "api.addr"
    deadline = time.monotonic() + timeout
    assert site.proc is not None
    while not addr.exists():
        if site.proc.poll() is not None or time.monotonic() > deadline:
            raise fail(f"gateway {site.region} did not start; see {site.log_path}")
        time.sleep(0.05)
    site.url = "http://" + addr.read_text().strip()


def _stop(site: Site) -> int:
    if site.proc is None or site.proc.poll() is not None:
        return site.proc.returncode if site.proc else 0
    site.proc.send_signal(signal.SIGTERM)
    try:
        return site.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        site.proc.kill()
        return -9


def _produce(site: Site, records: int) -> tuple[int, int]:
    """Produce telemetry with binary batches; returns (records, value bytes)."""
    gen = TelemetryGenerator(site=site.region, sensors=200, seed=hash(site.region) & 0xFFFF)
    readings = gen.take(records)
    by_partition: dict[int, list[tuple[bytes, bytes, int]]] = defaultdict(list)
    for r in readings:
        by_partition[partition_for(r.key, site.partitions)].append((r.key, r.value, r.timestamp_ms))
    size = 0
    with httpx.Client(base_url=site.url, timeout=30) as client:
        for p, rows in by_partition.items():
            for i in range(0, len(rows), 500):
                chunk = rows[i : i + 500]
                batch = encode_batch(
                    [v for _, v, _ in chunk],
                    keys=[k for k, _, _ in chunk],
                    timestamps=[t for _, _, t in chunk],
                )
                size += sum(len(v) for _, v, _ in chunk)
                r = client.post(
                    f"/v1/topics/{site.topic}/partitions/{p}/batches",
                    content=batch,
                    headers={"content-type": BATCH_TYPE},
                )
                if r.status_code != 200:
                    raise fail(f"produce to {site.region} failed: {r.status_code} {r.text}")
    return len(readings), size


def _high_watermarks(client: httpx.Client, topic: str) -> list[int]:
    r = client.get(f"/v1/topics/{topic}")
    r.raise_for_status()
    return [p["next_offset"] for p in r.json()["partitions"]]


def _all_records(client: httpx.Client, topic: str, partition: int) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    offset = 0
    while True:
        r = client.get(
            f"/v1/topics/{topic}/partitions/{partition}/records",
            params={"offset": offset, "max_records": 5000},
        )
        r.raise_for_status()
        doc = r.json()
        for rec in doc["records"]:
            out.append(
                (
                    rec["offset"],
                    rec.get("key"),
                    rec.get("value"),
                    rec.get("value_b64"),
                    rec["timestamp"],
                )
            )
        if doc["next_offset"] >= doc["high_watermark"] or not doc["records"]:
            return out
        offset = doc["next_offset"]


def _wait_mirrored(home: Site, other: Site, timeout: float) -> float:
    """Seconds until ``other`` mirrors everything ``home`` holds of its topic."""
    start = time.monotonic()
    with (
        httpx.Client(base_url=home.url, timeout=30) as h,
        httpx.Client(base_url=other.url, timeout=30) as o,
    ):
        want = _high_watermarks(h, home.topic)
        while _high_watermarks(o, f"{home.region}.{home.topic}") != want:
            if time.monotonic() - start > timeout:
                raise fail(f"{other.region} did not mirror {home.region}.{home.topic} in time")
            time.sleep(0.05)
    return time.monotonic() - start


def _latency(home: Site, other: Site, count: int, rate: float) -> list[float]:
    """Produce ``count`` single records at ``home``; ms until each is readable at ``other``."""
    mirror = f"{home.region}.{home.topic}"
    acked: dict[int, float] = {}
    seen: dict[int, float] = {}
    with httpx.Client(base_url=other.url, timeout=30) as o:
        start_offset = _high_watermarks(o, mirror)[0]
    done = threading.Event()

    def follow() -> None:
        offset = start_offset
        with httpx.Client(base_url=other.url, timeout=30) as o:
            while not done.is_set() or len(seen) < len(acked):
                r = o.get(
                    f"/v1/topics/{mirror}/partitions/0/records",
                    params={"offset": offset, "wait_ms": 1000},
                )
                now = time.monotonic()
                for rec in r.json()["records"]:
                    seen.setdefault(rec["offset"], now)
                    offset = rec["offset"] + 1
                if done.is_set() and time.monotonic() - stop_at > 30:
                    return

    stop_at = float("inf")
    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    with httpx.Client(base_url=home.url, timeout=30) as h:
        for i in range(count):
            r = h.post(
                f"/v1/topics/{home.topic}/records",
                json={"records": [{"value": f"probe {i}", "partition": 0}]},
            )
            r.raise_for_status()
            acked[r.json()["offsets"][0]["offset"]] = time.monotonic()
            time.sleep(1 / rate)
    stop_at = time.monotonic()
    done.set()
    follower.join(timeout=35)
    return [(seen[o] - t) * 1000 for o, t in acked.items() if o in seen]


def _bucket_figures(bucket: Path, region: str) -> tuple[int, int]:
    log = bucket / "objects" / "regions" / region / "log"
    files = list(log.glob("*.egw")) if log.exists() else []
    return len(files), sum(f.stat().st_size for f in files)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def demo(
    work_dir: Path = typer.Option(
        Path(".edgegw/demo"), "--dir", help="Where the demo keeps its data (wiped at start)."
    ),
    records: int = typer.Option(20_000, min=1, help="Telemetry records produced per region."),
    probes: int = typer.Option(300, min=10, help="Single records timed end to end."),
    flush_ms: int = typer.Option(250, min=1, help="Shipper flush interval."),
    poll_ms: int = typer.Option(100, min=1, help="Mirror poll interval."),
) -> None:
    """Run two regions on this machine, mirroring each other, and print what happened.

    Example: edgegw demo --records 50000
    """
    if work_dir.exists():
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True)
    bucket = (work_dir / "bucket").resolve()
    sites = [
        Site(region, topic, parts, (work_dir / region).resolve())
        for region, (topic, parts) in REGIONS.items()
    ]
    console.print(
        "[bold]edgegw demo[/]: two gateways (north, south) sharing a local bucket at "
        f"{bucket}; each homes a topic the other mirrors"
    )
    t0 = time.monotonic()
    try:
        for site in sites:
            site.data_dir.mkdir(parents=True)
            cfg = work_dir / f"{site.region}.toml"
            cfg.write_text(_config(site, bucket, flush_ms, poll_ms))
            _start(site, cfg)
        for site in sites:
            _wait_ready(site)
        console.print(
            f"gateways up in {time.monotonic() - t0:.1f}s: "
            + ", ".join(f"{s.region} at {s.url}" for s in sites)
        )
        produced: dict[str, tuple[int, int]] = {}
        errors: list[str] = []

        def produce(site: Site) -> None:
            try:
                produced[site.region] = _produce(site, records)
            except (httpx.HTTPError, typer.Exit) as exc:
                errors.append(f"{site.region}: {exc}")

        threads = [threading.Thread(target=produce, args=(s,)) for s in sites]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors or len(produced) != len(sites):
            raise fail(f"producing failed ({'; '.join(errors)}); see the logs in {work_dir}")
        north, south = sites
        converge = {
            south.region: _wait_mirrored(north, south, 45),
            north.region: _wait_mirrored(south, north, 45),
        }
        mismatches = []
        for home, other in ((north, south), (south, north)):
            with (
                httpx.Client(base_url=home.url, timeout=30) as h,
                httpx.Client(base_url=other.url, timeout=30) as o,
            ):
                for p in range(home.partitions):
                    if _all_records(h, home.topic, p) != _all_records(
                        o, f"{home.region}.{home.topic}", p
                    ):
                        mismatches.append(f"{home.region}.{home.topic}/{p}")
        latencies = _latency(north, south, probes, rate=50)
    finally:
        codes = {s.region: _stop(s) for s in sites}
    table = Table(title=f"edgegw demo: 2 regions, {records:,} telemetry records each")
    for col in ("home", "topic", "records", "MB", "objects", "MB stored", "ratio", "mirror", "lag"):
        table.add_column(col, justify="right" if col not in ("region", "topic") else "left")
    for site, other in ((north, south), (south, north)):
        n, size = produced[site.region]
        objects, wire = _bucket_figures(bucket, site.region)
        table.add_row(
            site.region,
            site.topic,
            f"{n:,}",
            f"{size / 1e6:.1f}",
            str(objects),
            f"{wire / 1e6:.2f}",
            f"{size / wire:.1f}x" if wire else "-",
            other.region,
            f"{converge[other.region]:.2f}s",
        )
    console.print(table)
    console.print(
        f"end-to-end latency north → south over {len(latencies)} records "
        f"(flush {flush_ms} ms, poll {poll_ms} ms): p50 {_pct(latencies, 50):.0f} ms, "
        f"p99 {_pct(latencies, 99):.0f} ms"
    )
    if mismatches:
        raise fail(f"mirrors differ from their sources: {', '.join(mismatches)}")
    if len(latencies) < probes:
        raise fail(f"only {len(latencies)} of {probes} probe records reached the mirror")
    if any(code != 0 for code in codes.values()):
        raise fail(f"gateways exited with {codes}; see the logs in {work_dir}")
    console.print(
        f"[green]mirrors equal their sources record for record; both gateways stopped "
        f"cleanly[/] ({time.monotonic() - t0:.1f}s; data and logs in {work_dir})"
    )
