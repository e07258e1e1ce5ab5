"""``edgegw demo``: two regions on one machine, mirroring each other through a local bucket.

Starts the reference metadata server (``edgegw metadata serve``, a process),
registers regions ``north`` and ``south`` and creates a topic homed in each
and mirrored by the other through its API; then starts two real gateways
(``edgegw serve`` processes) that take their routing from it and share a
local-directory bucket. Produces sample telemetry in both; waits until each
mirrors the other's topic; checks the mirrors record for record; measures the
end-to-end latency (acknowledged at the home region → readable in the other,
the mirror woken by the metadata server's head relay); prints a table and
exits 0. No servers to install, under a minute.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.table import Table
from rich.text import Text

from edge_gateway.format.batch import encode_batch
from edge_gateway.sample_data import TelemetryGenerator, partition_for
from edgegw_cli._common import console, fail
from edgegw_cli._fleet import (
    BATCH_TYPE,
    FleetTopic,
    MetadataProcess,
    Site,
    bucket_figures,
    claim_work_dir,
    high_watermarks,
    mirror_mismatches,
    wait_mirrored,
)

REGIONS = {"north": ("sensors", 4), "south": ("weather", 2)}
TOPICS = [FleetTopic(topic, region, parts) for region, (topic, parts) in REGIONS.items()]


def _topic(site: Site) -> FleetTopic:
    return next(t for t in TOPICS if t.home == site.region)


def _produce(site: Site, records: int) -> tuple[int, int]:
    """Produce telemetry with binary batches; returns (records, value bytes)."""
    gen = TelemetryGenerator(site=site.region, sensors=200, seed=hash(site.region) & 0xFFFF)
    readings = gen.take(records)
    by_partition: dict[int, list[tuple[bytes, bytes, int]]] = defaultdict(list)
    for r in readings:
        by_partition[partition_for(r.key, _topic(site).partitions)].append(
            (r.key, r.value, r.timestamp_ms)
        )
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
                    f"/v1/topics/{_topic(site).name}/partitions/{p}/batches",
                    content=batch,
                    headers={"content-type": BATCH_TYPE},
                )
                if r.status_code != 200:
                    raise fail(f"produce to {site.region} failed: {r.status_code} {r.text}")
    return len(readings), size


def _latency(home: Site, other: Site, count: int, rate: float) -> list[float]:
    """Produce ``count`` single records at ``home``; ms until each is readable at ``other``."""
    topic = _topic(home).name
    mirror = f"{home.region}.{topic}"
    acked: dict[int, float] = {}
    seen: dict[int, float] = {}
    with httpx.Client(base_url=other.url, timeout=30) as o:
        start_offset = high_watermarks(o, mirror)[0]
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
                f"/v1/topics/{topic}/records",
                json={"records": [{"value": f"probe {i}", "partition": 0}]},
            )
            r.raise_for_status()
            acked[r.json()["offsets"][0]["offset"]] = time.monotonic()
            time.sleep(1 / rate)
    stop_at = time.monotonic()
    done.set()
    follower.join(timeout=35)
    return [(seen[o] - t) * 1000 for o, t in acked.items() if o in seen]


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
    _work_lock = claim_work_dir(work_dir, "demo")  # held while this run lasts
    bucket = (work_dir / "bucket").resolve()
    sites = [Site(region, (work_dir / region).resolve()) for region in REGIONS]
    console.print(
        Text.assemble(
            ("edgegw demo", "bold"),
            ": a metadata server and two gateways (north, south) sharing a "
            f"local bucket at {bucket}; each homes a topic the other mirrors",
        )
    )
    t0 = time.monotonic()
    north, south = sites
    meta = MetadataProcess(work_dir.resolve())
    codes: dict[str, int] = {}
    try:
        meta.start()
        tokens = {site.region: meta.add_region(site.region) for site in sites}
        for topic in TOPICS:
            meta.create_topic(topic)
        console.print(
            f"metadata server at {meta.url}: regions {', '.join(tokens)}; topics "
            + ", ".join(f"{t.name} (home {t.home}, {t.partitions} partitions)" for t in TOPICS)
        )
        for site in sites:
            # Kafka clients can join in (docs/kafka.md): each gateway's listener
            # address is printed below and kept in <dir>/<region>/kafka.addr.
            site.extra_toml = '[kafka]\nlisten = "127.0.0.1:0"\n'
            site.write_config(
                bucket, TOPICS, flush_ms, poll_ms, metadata=(meta.url, tokens[site.region])
            )
            site.start()
        for site in sites:
            site.wait_ready()
        console.print(
            f"gateways up in {time.monotonic() - t0:.1f}s: "
            + ", ".join(f"{s.region} at {s.url} (Kafka {_kafka_addr(s)})" for s in sites)
        )
        _wait_routed(sites)
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
        converge = {
            south.region: wait_mirrored(north, _topic(north).name, south, 45),
            north.region: wait_mirrored(south, _topic(south).name, north, 45),
        }
        mismatches = [
            *mirror_mismatches(north, _topic(north).name, _topic(north).partitions, south),
            *mirror_mismatches(south, _topic(south).name, _topic(south).partitions, north),
        ]
        latencies = _latency(north, south, probes, rate=50)
        routing = {site.region: _metadata_line(site) for site in sites}
    finally:
        codes = {s.region: s.stop() for s in sites}
        codes["metadata"] = meta.stop()
    table = Table(title=f"edgegw demo: 2 regions, {records:,} telemetry records each")
    columns = ("home", "topic", "records", "MiB", "objects", "MiB stored", "ratio", "mirror", "lag")
    for col in columns:
        table.add_column(col, justify="right" if col not in ("home", "topic") else "left")
    for site, other in ((north, south), (south, north)):
        n, size = produced[site.region]
        objects, wire = bucket_figures(bucket, site.region)
        table.add_row(
            site.region,
            _topic(site).name,
            f"{n:,}",
            f"{size / 2**20:.1f}",
            str(objects),
            f"{wire / 2**20:.2f}",
            f"{size / wire:.1f}x" if wire else "-",
            other.region,
            f"{converge[other.region]:.2f}s",
        )
    console.print(table)
    for region, line in routing.items():
        console.print(f"{region}: {line}", highlight=False)
    console.print(
        f"end-to-end latency north → south over {len(latencies)} records "
        f"(flush {flush_ms} ms, mirrors woken by relayed heads): p50 "
        f"{_pct(latencies, 50):.0f} ms, p99 {_pct(latencies, 99):.0f} ms"
    )
    if mismatches:
        raise fail(f"mirrors differ from their sources: {', '.join(mismatches)}")
    if len(latencies) < probes:
        raise fail(f"only {len(latencies)} of {probes} probe records reached the mirror")
    if any(code != 0 for code in codes.values()):
        raise fail(f"processes exited with {codes}; see the logs in {work_dir}")
    console.print(
        Text.assemble(
            (
                "mirrors equal their sources record for record; both gateways and the "
                "metadata server stopped cleanly",
                "green",
            ),
            f" ({time.monotonic() - t0:.1f}s; data and logs in {work_dir})",
        )
    )


def _kafka_addr(site: Site) -> str:
    """The Kafka bootstrap address of a started site (written with api.addr)."""
    path = site.data_dir / "kafka.addr"  # written just after api.addr
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return path.read_text().strip() if path.exists() else "?"


def _status(site: Site) -> dict[str, Any]:
    r = httpx.get(f"{site.url}/v1/status", timeout=30)
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


def _wait_routed(sites: list[Site], timeout: float = 30.0) -> None:
    """Wait until every gateway has the routing table and mirrors the other region."""
    deadline = time.monotonic() + timeout
    for site in sites:
        while True:
            doc = _status(site)
            if doc["metadata"]["mode"] == "live" and doc["mirrors"]:
                break
            if time.monotonic() > deadline:
                raise fail(f"{site.region} did not get its routing: {doc['metadata']['describe']}")
            time.sleep(0.05)


def _metadata_line(site: Site) -> str:
    meta = _status(site)["metadata"]
    relay = meta["relay"]
    state = "active" if relay.get("active") else "unavailable"
    return (
        f"{meta['describe']}; head relay {state} ({relay.get('reports', 0)} heads reported, "
        f"{sum(m['relay_wakeups'] for m in _status(site)['mirrors'].values())} mirror wake-ups)"
    )
