"""``edgegw scenario run FILE``: a multi-region scenario with faults, checked at the end.

A scenario (TOML, see ``scenarios/``) names regions, topics, a steady workload
per topic and a timeline of faults against the gateway processes:

* ``kill`` — kill -9 the gateway (no flush, no goodbye);
* ``stop`` — SIGTERM (graceful: flush and ship within the grace period);
* ``start`` — start it again (after ``kill`` or ``stop``);
* ``pause`` / ``resume`` — SIGSTOP / SIGCONT: a frozen machine that neither
  ships nor mirrors, then thaws (``for_s`` on ``pause`` resumes by itself).

Producers write at their rate throughout, retrying while their gateway is
down (as a device would), and remember every acknowledged record. At the end
every gateway is started, everything must converge, and the runner checks:
every acknowledged record is present at its home region, offsets are
gap-free, and every mirror equals its source record for record.
"""

from __future__ import annotations

import random
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.table import Table
from rich.text import Text

from edgegw_cli._common import console, fail
from edgegw_cli._fleet import (
    FleetTopic,
    Site,
    all_records,
    bucket_figures,
    claim_work_dir,
    mirror_mismatches,
    wait_mirrored,
)

app = typer.Typer(help="Multi-region scenarios with faults.", no_args_is_help=True)

ACTIONS = ("kill", "stop", "start", "pause", "resume")


@dataclass(frozen=True)
class Fault:
    at_s: float
    action: str
    region: str
    for_s: float = 0.0


@dataclass(frozen=True)
class Workload:
    region: str
    topic: str
    rate: float
    batch: int


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration_s: float
    flush_ms: int
    poll_ms: int
    regions: tuple[str, ...]
    topics: tuple[FleetTopic, ...]
    workloads: tuple[Workload, ...]
    faults: tuple[Fault, ...]
    converge_timeout_s: float


def load_scenario(path: Path) -> Scenario:
    try:
        doc: dict[str, Any] = tomllib.loads(path.read_text())
    except OSError as exc:
        raise fail(f"{path}: {exc.strerror or exc}", code=2) from None
    except tomllib.TOMLDecodeError as exc:
        raise fail(f"{path}: not valid TOML: {exc}", code=2) from None
    try:
        regions = tuple(r["name"] for r in doc["regions"])
        topics = tuple(
            FleetTopic(
                t["name"],
                t["home"],
                int(t.get("partitions", 1)),
                tuple(t.get("subscribers", ["*"])),
            )
            for t in doc["topics"]
        )
        workloads = tuple(
            Workload(w["region"], w["topic"], float(w["rate"]), int(w.get("batch", 50)))
            for w in doc.get("workload", [])
        )
        faults = tuple(
            sorted(
                (
                    Fault(float(f["at_s"]), f["action"], f["region"], float(f.get("for_s", 0)))
                    for f in doc.get("faults", [])
                ),
                key=lambda f: f.at_s,
            )
        )
        sc = Scenario(
            name=doc.get("name", path.stem),
            description=doc.get("description", ""),
            duration_s=float(doc.get("duration_s", 10)),
            flush_ms=int(doc.get("flush_ms", 250)),
            poll_ms=int(doc.get("poll_ms", 100)),
            regions=regions,
            topics=topics,
            workloads=workloads,
            faults=faults,
            converge_timeout_s=float(doc.get("converge_timeout_s", 60)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise fail(f"{path}: malformed scenario ({type(exc).__name__}: {exc})", code=2) from None
    for f in sc.faults:
        if f.action not in ACTIONS or f.region not in regions:
            raise fail(f"{path}: fault {f} needs an action in {ACTIONS} and a known region", 2)
    for w in sc.workloads:
        home = next((t.home for t in topics if t.name == w.topic), None)
        if home != w.region:
            raise fail(f"{path}: workload {w.topic} must run in its home region ({home})", 2)
    return sc


class Producer(threading.Thread):
    """A device: produces at a steady rate, retries while its gateway is away."""

    def __init__(self, site: Site, w: Workload, stop: threading.Event, seed: int) -> None:
        super().__init__(daemon=True)
        self.site, self.w, self.stopping = site, w, stop
        self.rnd = random.Random(seed)
        self.acked: dict[tuple[int, int], str] = {}
        self.retries = 0
        self.sent = 0

    def run(self) -> None:
        interval = self.w.batch / self.w.rate
        next_at = time.monotonic()
        client: httpx.Client | None = None
        url = ""
        pending: list[str] = []
        while not self.stopping.is_set():
            if not pending:
                pending = [
                    f'{{"n": {self.sent + i}, "v": {self.rnd.random():.6f}}}'
                    for i in range(self.w.batch)
                ]
            if self.site.url != url or client is None:
                if client is not None:
                    client.close()
                url = self.site.url
                client = httpx.Client(base_url=url, timeout=5) if url else None
            ok = False
            if client is not None:
                try:
                    r = client.post(
                        f"/v1/topics/{self.w.topic}/records",
                        json={"records": [{"value": v} for v in pending]},
                    )
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    for v, o in zip(pending, r.json()["offsets"], strict=True):
                        self.acked[(o["partition"], o["offset"])] = v
                    self.sent += len(pending)
                    pending = []
            if not ok:
                self.retries += 1
                time.sleep(0.1)
                continue
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        if client is not None:
            client.close()


def _apply(fault: Fault, sites: dict[str, Site], timers: list[threading.Timer]) -> str:
    site = sites[fault.region]
    if fault.action == "kill":
        site.kill()
    elif fault.action == "stop":
        site.stop()
    elif fault.action == "start":
        if not site.running:
            site.start()
            site.wait_ready()
    elif fault.action == "pause":
        site.pause()
        if fault.for_s:
            t = threading.Timer(fault.for_s, site.resume)
            t.start()
            timers.append(t)
    elif fault.action == "resume":
        site.resume()
    return f"t={fault.at_s:>5.1f}s {fault.action:<6} {fault.region}" + (
        f" for {fault.for_s:.1f}s" if fault.for_s else ""
    )


@app.command("run")
def run(
    file: Path = typer.Argument(..., help="Scenario file (see scenarios/)."),
    work_dir: Path = typer.Option(
        Path(".edgegw/scenario"), "--dir", help="Where the gateways keep data (wiped at start)."
    ),
) -> None:
    """Run a scenario: gateways as processes, steady producers, faults on a timeline, checks.

    Example: edgegw scenario run scenarios/lte-blips.toml
    """
    sc = load_scenario(file)
    _work_lock = claim_work_dir(work_dir, "scenario")  # held while this run lasts
    bucket = (work_dir / "bucket").resolve()
    sites = {r: Site(r, (work_dir / r).resolve()) for r in sc.regions}
    console.print(Text.assemble((f"scenario {sc.name}", "bold"), f": {sc.description}"))
    stop = threading.Event()
    producers: list[Producer] = []
    timers: list[threading.Timer] = []
    codes: dict[str, int] = {}
    failures: list[str] = []
    lag: dict[str, float] = {}
    try:
        for site in sites.values():
            site.write_config(bucket, sc.topics, sc.flush_ms, sc.poll_ms)
            site.start()
        for site in sites.values():
            site.wait_ready()
        producers = [Producer(sites[w.region], w, stop, seed=i) for i, w in enumerate(sc.workloads)]
        for p in producers:
            p.start()
        t0 = time.monotonic()
        for fault in sc.faults:
            time.sleep(max(0.0, t0 + fault.at_s - time.monotonic()))
            console.print("  " + _apply(fault, sites, timers), highlight=False)
        time.sleep(max(0.0, t0 + sc.duration_s - time.monotonic()))
        stop.set()
        for p in producers:
            p.join(timeout=30)
        for t in timers:
            t.cancel()
        for site in sites.values():  # the end state: everything up again
            site.resume()
            if not site.running:
                site.start()
                site.wait_ready()
        console.print("converging ...")
        for t in sc.topics:
            home = sites[t.home]
            for r, other in sites.items():
                if r != t.home and ("*" in t.subscribers or r in t.subscribers):
                    lag[f"{r}:{t.home}.{t.name}"] = wait_mirrored(
                        home, t.name, other, sc.converge_timeout_s
                    )
                    failures += mirror_mismatches(home, t.name, t.partitions, other)
        for p in producers:
            failures += _check_acked(p, sc)
    finally:
        stop.set()
        for t in timers:
            t.cancel()
        for r, site in sites.items():
            codes[r] = site.stop()
    _report(sc, sites, producers, bucket, lag if not failures else {})
    if failures:
        raise fail(f"scenario {sc.name} FAILED: {'; '.join(failures[:10])}")
    if any(c != 0 for c in codes.values()):
        raise fail(f"gateways exited with {codes}; logs in {work_dir}")
    console.print(
        Text.assemble(
            (f"scenario {sc.name} passed", "green"),
            ": every acknowledged record present once, in order; every mirror equals its source",
        )
    )


def _check_acked(p: Producer, sc: Scenario) -> list[str]:
    t = next(t for t in sc.topics if t.name == p.w.topic)
    bad: list[str] = []
    with httpx.Client(base_url=p.site.url, timeout=30) as client:
        for part in range(t.partitions):
            stored = all_records(client, t.name, part)
            offsets = [r[0] for r in stored]
            if offsets != list(range(len(offsets))):
                bad.append(f"{t.home}:{t.name}/{part} has gaps or duplicates")
            values = {r[0]: r[3] for r in stored}
            lost = [o for (pp, o), v in p.acked.items() if pp == part and values.get(o) != v]
            if lost:
                bad.append(f"{t.home}:{t.name}/{part} lost {len(lost)} acknowledged records")
    return bad


def _report(
    sc: Scenario,
    sites: dict[str, Site],
    producers: list[Producer],
    bucket: Path,
    lag: dict[str, float],
) -> None:
    table = Table(title=f"scenario {sc.name}")
    for col in ("region", "records acked", "producer retries", "log objects", "MiB in bucket"):
        table.add_column(col, justify="left" if col == "region" else "right")
    for r in sites:
        acked = sum(len(p.acked) for p in producers if p.w.region == r)
        retries = sum(p.retries for p in producers if p.w.region == r)
        objects, size = bucket_figures(bucket, r)
        table.add_row(r, f"{acked:,}", str(retries), str(objects), f"{size / 2**20:.2f}")
    console.print(table)
    for k, v in sorted(lag.items()):
        console.print(f"  {k} converged {v:.2f}s after the end", highlight=False)
