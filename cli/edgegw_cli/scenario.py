"""``edgegw scenario run FILE``: a multi-region scenario with faults, checked at the end.

A scenario (TOML, see ``scenarios/README.md``; parsed and checked by
:mod:`edgegw_cli._scenario_spec`) names regions, topics, a steady workload per
topic and a timeline of faults. Process faults hit the gateway processes:

* ``kill`` — kill -9 the gateway (no flush, no goodbye);
* ``stop`` — SIGTERM (graceful: flush and ship within the grace period);
* ``start`` — start it again (after ``kill`` or ``stop``);
* ``pause`` / ``resume`` — SIGSTOP / SIGCONT: a frozen machine that neither
  ships nor mirrors, then thaws (``for_s`` on ``pause`` resumes by itself).

With ``bucket = "s3"`` the runner starts moto's S3 server on loopback and
gives each region its own link to it: a :class:`TcpProxy` shaped as the
region's ``[regions.link]`` says. Link faults change a link for ``for_s``
seconds, then it returns to its configured shape and mode pass:

* ``link_down`` — connections refused, open ones reset;
* ``blackhole`` — nothing gets through either way (held, delivered on heal);
* ``drop_responses`` — requests reach S3, answers never come back;
* ``slow`` / ``lossy`` / ``cap`` — the link's latency / random resets / caps
  overridden for a while.

Producers write at their rate throughout, retrying while their gateway is
down (as a device would), and remember every acknowledged record. At the end
every gateway is started and every link healed, everything must converge, and
the runner counts: acknowledged records lost (at home or in a mirror),
duplicated, reordered; mirror partitions that differ from their source; and
reports bytes on each link, catch-up time after each link fault and each
gateway's peak RSS.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import shutil
import subprocess
import sys
import threading
import time
import tomllib
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import typer
from rich.table import Table
from rich.text import Text

from edge_gateway.format.batch import decode_batch
from edge_gateway.journal import Journal
from edge_gateway.testing.moto import MotoServer, start_moto_server
from edge_gateway.testing.tcpproxy import LinkShape, ProxyMode, TcpProxy
from edgegw_cli._common import console, fail
from edgegw_cli._fleet import (
    MetadataProcess,
    Site,
    all_records,
    bucket_figures,
    claim_work_dir,
    first_offsets,
    high_watermarks,
    mirror_mismatches,
    wait_mirrored,
)
from edgegw_cli._plant import Planted, plant, still_there
from edgegw_cli._scenario_spec import (
    SEGMENT_MB,
    Fault,
    Scenario,
    ScenarioError,
    Workload,
    parse_scenario,
)
from edgegw_cli._serve_run import EXIT_FENCED

app = typer.Typer(help="Multi-region scenarios with faults.", no_args_is_help=True)

S3_BUCKET = "edgegw-scenario"
#: How long a process fault on a region waits for that region's split brain
#: (restore, start, the first gateway fenced) before it is a failure.
SPLIT_BRAIN_SETTLE_S = 180.0
_LINK_MODES = {
    "link_down": ProxyMode.REFUSE,
    "blackhole": ProxyMode.BLACKHOLE,
    "drop_responses": ProxyMode.DROP_RESPONSES,
    "metadata_down": ProxyMode.REFUSE,
    "metadata_blackhole": ProxyMode.BLACKHOLE,
}


def load_scenario(path: Path) -> Scenario:
    try:
        doc: dict[str, Any] = tomllib.loads(path.read_text())
    except OSError as exc:
        raise fail(f"{path}: {exc.strerror or exc}", code=2) from None
    except tomllib.TOMLDecodeError as exc:
        raise fail(f"{path}: not valid TOML: {exc}", code=2) from None
    try:
        return parse_scenario(doc, path.stem)
    except ScenarioError as exc:
        raise fail(f"{path}: malformed scenario: {exc}", code=2) from None


class Producer(threading.Thread):
    """A device: produces at a steady rate, retries while its gateway is away.

    Each value carries a sequence number ``n``. A batch whose answer was lost
    (a timeout, a reset, a 5xx) is retried as is, so its records may be
    stored twice: that is the device's at-least-once, not the gateway's doing,
    and :attr:`ambiguous` remembers those ``n`` so the checks can tell.
    """

    def __init__(self, site: Site, w: Workload, stop: threading.Event, seed: int) -> None:
        super().__init__(daemon=True)
        self.site, self.w, self.stopping = site, w, stop
        self.rnd = random.Random(seed)
        #: What the region's writer acknowledged, by (partition, offset).
        self.acked: dict[tuple[int, int], str] = {}
        #: What a writer of the region acknowledged before a second writer
        #: fenced it (split brain; see :meth:`follow`).
        self.acked_by_old_writer: dict[tuple[int, int], str] = {}
        self.lock = threading.Lock()
        #: (monotonic time, records) of every acknowledged batch.
        self.acked_at: list[tuple[float, int]] = []
        self.ambiguous: set[int] = set()
        self.retries = 0
        self.sent = 0
        #: Answers other than 200 by status (503: a full journal or disk, a stopping gateway).
        self.refused: Counter[int] = Counter()

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
            site = self.site
            if site.url != url or client is None:
                if client is not None:
                    client.close()
                url = site.url
                client = httpx.Client(base_url=url, timeout=5) if url else None
            ok = False
            if client is not None:
                try:
                    r = client.post(
                        f"/v1/topics/{self.w.topic}/records",
                        json={"records": [{"value": v} for v in pending]},
                    )
                    ok = r.status_code == 200
                    if not ok:
                        self.refused[r.status_code] += 1
                    if r.status_code >= 500:
                        self._ambiguous(pending)
                except httpx.ConnectError:
                    ok = False  # never reached the gateway
                except httpx.HTTPError:
                    self._ambiguous(pending)
                if ok:
                    with self.lock:
                        into = self.acked if site is self.site else self.acked_by_old_writer
                        for v, o in zip(pending, r.json()["offsets"], strict=True):
                            into[(o["partition"], o["offset"])] = v
                    self.acked_at.append((time.monotonic(), len(pending)))
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

    def follow(self, site: Site) -> None:
        """Write to ``site`` from now on: the region's new writer (the old one was fenced).

        What the old writer acknowledged is set apart: offsets it gave but never
        shipped are given again by the new writer (a restore continues from the
        region's log, not from the old journal).
        """
        with self.lock:
            self.acked_by_old_writer.update(self.acked)
            self.acked = {}
            self.site = site

    def _ambiguous(self, pending: list[str]) -> None:
        self.ambiguous.update(n for v in pending if (n := _seq(v)) is not None)


def _seq(value: object) -> int | None:
    """The producer's sequence number in a stored value (None if it has none)."""
    try:
        n = json.loads(value)["n"] if isinstance(value, str) else None
    except (ValueError, TypeError, KeyError):
        return None
    return n if isinstance(n, int) else None


class Links:
    """One proxy per region between its gateway and a server, and the faults on them.

    The bucket's links (to moto) are shaped as the scenario says; the metadata
    server's (``shaped=False``) are plain loopback that only faults change.
    """

    def __init__(self, sc: Scenario, upstream_port: int, seed: int, *, shaped: bool = True) -> None:
        self.sc = sc
        self.shaped = shaped
        self.seeds = {r: seed * 1009 + i for i, r in enumerate(sc.regions)}
        self.proxies: dict[str, TcpProxy] = {}
        #: Link faults on now, per region, by their place on the timeline.
        self._active: dict[str, dict[int, Fault]] = {r: {} for r in sc.regions}
        self._lock = threading.Lock()
        for r in sc.regions:
            self.proxies[r] = TcpProxy("127.0.0.1", upstream_port, shape=self.configured(r)).start()

    def configured(self, region: str) -> LinkShape:
        return self.sc.link(region).shape(self.seeds[region]) if self.shaped else LinkShape()

    def apply(self, fault: Fault, fault_id: int) -> Callable[[], None]:
        """Put ``fault`` in effect; returns what ends it.

        Faults on one link compose: the mode is that of the latest link fault
        still on (pass if none), the shape the configured one with the
        parameters of every shape fault still on (later ones win).
        """
        targets = list(self.sc.regions) if fault.region == "*" else [fault.region]
        with self._lock:
            for r in targets:
                self._active[r][fault_id] = fault
                self._settle(r)

        def heal() -> None:
            with self._lock:
                for r in targets:
                    self._active[r].pop(fault_id, None)
                    if fault.action == "drop_responses":
                        # The answers held meanwhile are lost, not late: the
                        # connections that waited for them are reset.
                        self.proxies[r].reset_connections()
                    self._settle(r)

        return heal

    def _settle(self, region: str) -> None:
        active = [self._active[region][i] for i in sorted(self._active[region])]
        modes = [_LINK_MODES[f.action] for f in active if f.action in _LINK_MODES]
        params: dict[str, float] = {}
        for f in active:
            params.update(f.params)
        proxy = self.proxies[region]
        proxy.set_mode(modes[-1] if modes else ProxyMode.PASS)
        shape = (
            replace(self.sc.link(region), **params).shape(self.seeds[region] + 7)
            if params
            else self.configured(region)
        )
        if shape != proxy.shape:
            proxy.set_shape(shape)

    def heal_all(self) -> None:
        with self._lock:
            for r in self.proxies:
                self._active[r].clear()
                self._settle(r)

    def figures(self) -> dict[str, dict[str, int]]:
        out = {}
        for r, proxy in self.proxies.items():
            s = proxy.statistics()
            out[r] = {
                "bytes_up": s.bytes_to_upstream,
                "bytes_down": s.bytes_to_client,
                "connections": s.accepted,
                "resets": s.resets,
                "random_resets": s.random_resets,
            }
        return out

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()


@dataclass
class SplitBrain:
    """A second gateway for a region, from ``edgegw restore``, while the first still runs.

    The second claims the region's log (a fence entry at a higher epoch); the
    first must stop at its next upload with exit 3 (fenced). When it has,
    the region's producers follow the second (as devices would once the old
    machine is gone).
    """

    region: str
    old: Site
    new: Site
    began: float
    old_exit: int | None = None
    fenced_after_s: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def watch(self, on_exit: Callable[[], None]) -> None:
        def wait() -> None:
            assert self.old.proc is not None
            self.old_exit = self.old.proc.wait()
            self.fenced_after_s = round(time.monotonic() - self.began, 3)
            on_exit()
            self.done.set()

        threading.Thread(target=wait, daemon=True).start()


@dataclass
class CatchUp:
    """Seconds from a link fault's end until every mirror holds what its home held then.

    At the heal, the runner reads each home partition's high watermark (which
    covers every record acknowledged so far); the fault's catch-up time is
    when every subscriber's mirror has reached all of them.
    """

    sc: Scenario
    sites: dict[str, Site]
    results: list[dict[str, Any]] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def watch(self, label: str, ended_at_s: float) -> None:
        args = (label, ended_at_s, time.monotonic())
        t = threading.Thread(target=self._run, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def pairs(self) -> list[tuple[str, str, str]]:
        return [
            (t.name, t.home, r)
            for t in self.sc.topics
            for r in self.sc.regions
            if r != t.home and ("*" in t.subscribers or r in t.subscribers)
        ]

    def hwm(self, region: str, topic: str) -> list[int] | None:
        url = self.sites[region].url
        if not url:
            return None
        try:
            with httpx.Client(base_url=url, timeout=5) as c:
                return high_watermarks(c, topic)
        except httpx.HTTPError:
            return None

    def _run(self, label: str, ended_at_s: float, began: float) -> None:
        result: dict[str, Any] = {"fault": label, "ended_at_s": ended_at_s, "seconds": None}
        want: dict[str, list[int]] = {}
        for t in self.sc.topics:
            while t.name not in want:
                if self.stopping.wait(0 if not want else 0.05):
                    self.results.append(result)
                    return
                hwm = self.hwm(t.home, t.name)
                if hwm is not None:
                    want[t.name] = hwm
        waiting = self.pairs()
        while waiting:
            topic, home, r = waiting[0]
            have = self.hwm(r, f"{home}.{topic}")
            if have is not None and all(h >= w for h, w in zip(have, want[topic], strict=True)):
                waiting.pop(0)
                continue
            if self.stopping.wait(0.05):
                self.results.append(result)
                return
        result["seconds"] = round(time.monotonic() - began, 3)
        self.results.append(result)

    def finish(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=10)


class LagSampler(threading.Thread):
    """Replication lag of every mirror while the timeline runs, every 250 ms.

    Each round reads every home topic's high watermarks (kept with the time)
    and every mirror's: a mirror's lag is how long ago its home held no more
    than the mirror holds now (0 if it holds all the home held this round).
    Rounds where the home does not answer (down, frozen) are skipped.

    The lag is the *region's*: measured from the most the region's mirror has
    held, by any of its gateways. A gateway restored from the bucket (a split
    brain's second) starts with empty mirrors and replays the homes' history;
    the age of that history is not replication lag, while the time until the
    replay gets past what the region held before is (the lag keeps growing
    meanwhile). The replay's own figure, the age of what the restored mirror
    held at its worst, is kept apart as ``replay_max_s``, and the split brain's
    catch-up time (until every mirror holds what the homes held when the
    second gateway took over) is in the report's catch-up list.
    """

    def __init__(self, catch_up: CatchUp) -> None:
        super().__init__(daemon=True)
        self.catch_up = catch_up
        self.stopping = threading.Event()
        self.history: dict[str, list[tuple[float, list[int]]]] = {}
        self.samples: dict[str, list[float]] = {}
        #: Per mirror: the most the region's mirror has held, per partition.
        self.best: dict[str, list[int]] = {}
        #: Per mirror: lags of a restored mirror behind what the region held.
        self.replays: dict[str, list[float]] = {}

    def run(self) -> None:
        while not self.stopping.wait(0.25):
            self.sample()

    def sample(self) -> None:
        cu = self.catch_up
        now = time.monotonic()
        fresh: set[str] = set()
        for t in cu.sc.topics:
            hwm = cu.hwm(t.home, t.name)
            if hwm is not None:
                self.history.setdefault(t.name, []).append((now, hwm))
                fresh.add(t.name)
        for topic, home, r in cu.pairs():
            if topic not in fresh:
                continue
            have = cu.hwm(r, f"{home}.{topic}")
            if have is None:
                continue
            pair = f"{r}:{home}.{topic}"
            best = self.best.get(pair)
            if best is not None and len(best) == len(have):
                if any(h < b for h, b in zip(have, best, strict=True)):
                    since = held_since(self.history[topic], have)
                    self.replays.setdefault(pair, []).append(now - since)
                have = [max(h, b) for h, b in zip(have, best, strict=True)]
            self.best[pair] = have
            since = held_since(self.history[topic], have)
            self.samples.setdefault(pair, []).append(now - since)

    def figures(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for pair, values in sorted(self.samples.items()):
            ordered = sorted(values)
            p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
            out[pair] = {"p99_s": round(p99, 3), "max_s": round(ordered[-1], 3)}
            if pair in self.replays:
                out[pair]["replay_max_s"] = round(max(self.replays[pair]), 3)
        return out


def held_since(history: list[tuple[float, list[int]]], have: list[int]) -> float:
    """When the home last held no more than ``have`` (per partition), by ``history``.

    ``history`` is (time, high watermarks) oldest first; a mirror behind even
    the oldest entry counts from that entry (a lower bound on its lag).
    """
    held = [
        at
        for at, want in history
        if len(have) == len(want) and all(h >= w for h, w in zip(have, want, strict=True))
    ]
    return max(held) if held else history[0][0]


class RssSampler(threading.Thread):
    """Each gateway's peak resident set (VmHWM), sampled every 250 ms across restarts."""

    def __init__(self, sites: dict[str, Site]) -> None:
        super().__init__(daemon=True)
        self.sites = sites
        self.peak: dict[str, int] = dict.fromkeys(sites, 0)
        #: Every 5 s, per region: (seconds since start, pid, VmRSS bytes, RssAnon
        #: bytes): growth over time, and how much of it is heap rather than
        #: file pages mapped from the journal (which the kernel can take back).
        self.series: dict[str, list[tuple[float, int, int, int]]] = {r: [] for r in sites}
        self.stopping = threading.Event()
        self._began = time.monotonic()

    def run(self) -> None:
        rounds = 0
        while not self.stopping.wait(0.25):
            self.sample(keep=rounds % 20 == 0)
            rounds += 1

    def sample(self, keep: bool = False) -> None:
        for r, site in self.sites.items():
            proc = site.proc
            if proc is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                fields: dict[str, int] = {}
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    name, _, value = line.partition(":")
                    if name in ("VmHWM", "VmRSS", "RssAnon"):
                        fields[name] = int(value.split()[0]) * 1024
                self.peak[r] = max(self.peak[r], fields.get("VmHWM", 0))
                if keep and "VmRSS" in fields:
                    at = round(time.monotonic() - self._began, 1)
                    self.series[r].append(
                        (at, proc.pid, fields["VmRSS"], fields.get("RssAnon", fields["VmRSS"]))
                    )


@app.command("run")
def run(
    file: Path = typer.Argument(..., help="Scenario file (see scenarios/)."),
    work_dir: Path = typer.Option(
        Path(".edgegw/scenario"), "--dir", help="Where the gateways keep data (wiped at start)."
    ),
    quick: bool = typer.Option(
        False, "--quick", help="The short form: every time on the timeline times quick_scale."
    ),
    seed: int = typer.Option(0, "--seed", help="Seeds the producers and the links' draws."),
    report_path: Path | None = typer.Option(
        None, "--report", help="Also write the report as JSON to this file."
    ),
) -> None:
    """Run a scenario: gateways as processes, steady producers, faults on a timeline, checks.

    Example: edgegw scenario run scenarios/lte-blips.toml
    """
    sc = load_scenario(file)
    if quick:
        sc = sc.quick()
    _work_lock = claim_work_dir(work_dir, "scenario")  # held while this run lasts
    bucket = (work_dir / "bucket").resolve()
    sites = {r: _site(sc, r, work_dir / r) for r in sc.regions}
    console.print(Text.assemble((f"scenario {sc.name}", "bold"), f": {sc.description}"))
    stop = threading.Event()
    producers: list[Producer] = []
    timers: list[threading.Timer] = []
    codes: dict[str, int] = {}
    failures: list[str] = []
    lag: dict[str, float] = {}
    counts: dict[str, int] = {}
    moto: MotoServer | None = None
    links: Links | None = None
    meta: MetadataProcess | None = None
    meta_links: Links | None = None
    catch_up = CatchUp(sc, sites)
    rss = RssSampler(sites)
    lag_sampler = LagSampler(catch_up)
    heals: dict[int, Callable[[], None]] = {}
    planted: list[Planted] = []
    splits: list[SplitBrain] = []
    restoring: list[threading.Thread] = []
    #: Per region with a split brain under way: set once it settled (the first
    #: gateway fenced and the producers on the second, or the attempt failed).
    settled: dict[str, threading.Event] = {}
    #: Topics and mirrors served from an offset above 0, by reader: their first offsets.
    trimmed: dict[str, list[int]] = {}
    tokens: dict[str, str] = {}
    #: When each timed fault began and ended (monotonic), by its place on the timeline.
    windows: dict[int, list[float]] = {}
    heal_lock = threading.Lock()
    t0 = time.monotonic()  # the timeline's start, set again once producers run

    def heal(i: int, label: str) -> None:
        with heal_lock:
            fn = heals.pop(i, None)
        if fn is not None:
            fn()
            windows[i].append(time.monotonic())
            ended = time.monotonic() - t0
            console.print(f"  t={ended:.1f}s healed: {label}", highlight=False)
            catch_up.watch(label, round(ended, 1))

    def split_brain(region: str) -> None:
        """Start a second gateway for ``region`` from `edgegw restore`, beside the first.

        The first hangs meanwhile (SIGSTOP: the machine a technician took for
        dead) and thaws once the second serves: it still holds what it
        acknowledged and never shipped, and meets the second's fence at its
        next upload. (Frozen, because a claim racing a first gateway that
        ships every flush interval may take long on a slow link.)
        """
        try:
            _split_brain(region)
        finally:
            sb = next((sb for sb in splits if sb.region == region and not sb.done.is_set()), None)
            if sb is None:  # failed before the watch: nothing to wait for
                settled[region].set()

    def _split_brain(region: str) -> None:
        sites[region].pause()
        name = f"{region}.restored"
        new = _site(sc, region, work_dir / name, name=name)
        s3 = (links.proxies[region].url, S3_BUCKET) if links else None
        md = (meta_links.proxies[region].url, tokens[region]) if meta_links else None
        new.write_config(bucket, sc.topics, sc.flush_ms, sc.poll_ms, s3=s3, metadata=md)
        argv = [sys.executable, "-m", "edgegw_cli", "restore", "--config", str(new.config)]
        out = subprocess.run(
            [*argv, "--yes"], capture_output=True, text=True, timeout=120, check=False
        )
        new.log_path.write_text(out.stdout + out.stderr)
        if out.returncode != 0:
            sites[region].resume()
            failures.append(
                f"edgegw restore of a second {region} gateway exited {out.returncode}: "
                + out.stderr.strip()[-300:]
            )
            return
        sb = SplitBrain(region, sites[region], new, time.monotonic())
        splits.append(sb)  # from now on stopped at the end, whatever happens
        new.start()
        try:
            new.wait_ready(timeout=120)
        except typer.Exit:
            failures.append(f"split brain: the second {region} gateway did not start")
            return
        finally:
            sb.old.resume()

        def fenced() -> None:
            sites[region] = new
            for p in producers:
                if p.w.region == region:
                    p.follow(new)
            settled[region].set()
            catch_up.watch(
                f"split brain of {region} (the restored gateway's mirrors replaying)",
                round(time.monotonic() - t0, 1),
            )

        sb.watch(fenced)

    try:
        if sc.bucket == "s3":
            moto = start_moto_server(work_dir / "moto.log")
            httpx.put(f"{moto.endpoint}/{S3_BUCKET}", timeout=30).raise_for_status()
            links = Links(sc, moto.port, seed)
            for r in sc.regions:
                console.print(f"  link {r}: {sc.link(r).describe()}", highlight=False)
        if sc.metadata:
            meta = MetadataProcess(work_dir.resolve())
            meta.start()
            tokens = {r: meta.add_region(r) for r in sc.regions}
            for topic in sc.topics:
                meta.create_topic(topic)
            meta_links = Links(sc, urlsplit(meta.url).port or 80, seed, shaped=False)
            console.print("  metadata server: one plain link per region", highlight=False)
        for site in sites.values():
            s3 = (links.proxies[site.region].url, S3_BUCKET) if links else None
            md = (meta_links.proxies[site.region].url, tokens[site.region]) if meta_links else None
            site.write_config(bucket, sc.topics, sc.flush_ms, sc.poll_ms, s3=s3, metadata=md)
            site.start()
        for site in sites.values():
            site.wait_ready()
        rss.start()
        lag_sampler.start()
        producers = [
            Producer(sites[w.region], w, stop, seed=seed * 100 + i)
            for i, w in enumerate(sc.workloads)
        ]
        for p in producers:
            p.start()
        t0 = time.monotonic()
        for i, fault in enumerate(sc.faults):
            time.sleep(max(0.0, t0 + fault.at_s - time.monotonic()))
            if fault.is_link or fault.is_metadata:
                on = links if fault.is_link else meta_links
                assert on is not None
                heals[i] = on.apply(fault, i)
                windows[i] = [time.monotonic()]
                t = threading.Timer(fault.for_s, heal, args=(i, fault.label()))
                t.start()
                timers.append(t)
            elif fault.is_bucket:
                kind = fault.action.removeprefix("plant_")
                others = [r for r in sc.regions if r != fault.region]
                s3 = (moto.endpoint, S3_BUCKET) if moto is not None else None
                got = plant(kind, fault.region, others, seed=seed + i, bucket_dir=bucket, s3=s3)
                if got is None:
                    failures.append(f"{fault.label()}: the gateway took every seq tried")
                else:
                    planted.append(got)
            elif fault.action == "split_brain":
                # A restore and a claim take a while: the timeline goes on meanwhile.
                settled[fault.region] = threading.Event()
                t = threading.Thread(target=split_brain, args=(fault.region,), daemon=True)
                t.start()
                restoring.append(t)
            else:
                # A process fault on a region whose split brain is under way is
                # meant for the survivor: wait until the first gateway is fenced
                # (a loaded machine can take longer than the timeline allows).
                pending = settled.get(fault.region)
                if pending is not None and not pending.is_set():
                    console.print(
                        f"  {fault.label()}: waiting for the split brain of {fault.region} "
                        "to settle",
                        highlight=False,
                    )
                    if pending.wait(timeout=SPLIT_BRAIN_SETTLE_S):
                        late = time.monotonic() - t0 - fault.at_s
                        console.print(f"  settled, {late:.1f}s late", highlight=False)
                    else:
                        failures.append(
                            f"split brain of {fault.region}: not settled {SPLIT_BRAIN_SETTLE_S} s "
                            f"after the fault at t={fault.at_s} was due"
                        )
                _apply(fault, sites, timers)
            console.print("  " + fault.label(), highlight=False)
        time.sleep(max(0.0, t0 + sc.duration_s - time.monotonic()))
        stop.set()
        lag_sampler.stopping.set()
        lag_sampler.join(timeout=30)
        for p in producers:
            p.join(timeout=30)
        for t in timers:
            t.cancel()
        for i, fault in enumerate(sc.faults):  # link faults still on end now
            heal(i, fault.label())
        for ls in (links, meta_links):
            if ls is not None:
                ls.heal_all()
        for t in restoring:
            t.join(timeout=180)
        for sb in splits:
            sb.old.resume()
            if not sb.done.wait(timeout=60):
                failures.append(f"split brain: the first {sb.region} gateway was not fenced")
                sb.old.stop()
                sb.done.wait(timeout=10)
            elif sb.old_exit != EXIT_FENCED:
                failures.append(
                    f"split brain: the first {sb.region} gateway exited {sb.old_exit}, "
                    f"not {EXIT_FENCED} (fenced)"
                )
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
                    try:
                        lag[f"{r}:{t.home}.{t.name}"] = wait_mirrored(
                            home, t.name, other, sc.converge_timeout_s
                        )
                    except typer.Exit:  # said why; the report still comes
                        failures.append(f"{r} did not converge on {t.home}.{t.name}")
                    bad = mirror_mismatches(home, t.name, t.partitions, other)
                    counts["mirror_divergence"] = counts.get("mirror_divergence", 0) + len(bad)
                    failures += [f"mirror {b} differs from its source" for b in bad]
        catch_up.finish(timeout=sc.converge_timeout_s)
        s3_direct = (moto.endpoint, S3_BUCKET) if moto is not None else None
        for bad in planted:
            # Set aside by the region's gateway, its entry created there instead.
            if still_there(bad, bucket_dir=bucket, s3=s3_direct):
                failures.append(f"{bad.kind} object planted at {bad.key} is still there")
        failures += _check_kept_working(sc, producers, windows)
        old_journals = {sb.region: sb.old.data_dir / "journal" for sb in splits}
        for p in producers:
            failures += _check_acked(p, sc, sites, counts, old_journals.get(p.w.region), trimmed)
        rss.sample()
    finally:
        stop.set()
        rss.stopping.set()
        lag_sampler.stopping.set()
        catch_up.stopping.set()
        for t in timers:
            t.cancel()
        for ls in (links, meta_links):
            if ls is not None:  # healed, so that a graceful stop can ship
                with contextlib.suppress(RuntimeError):
                    ls.heal_all()
        for r, site in sites.items():
            codes[r] = site.stop()
        for sb in splits:  # the loser is gone (fenced); a failed run may have left either up
            sb.old.stop()
            if sites[sb.region] is not sb.new:
                sb.new.stop()
        if meta is not None:
            codes["metadata"] = meta.stop()
        link_figures = links.figures() if links is not None else {}
        meta_figures = meta_links.figures() if meta_links is not None else {}
        for ls in (links, meta_links):
            if ls is not None:
                ls.close()
        objects = {
            r: _s3_figures(moto, r) if moto is not None else bucket_figures(bucket, r)
            for r in sc.regions
        }
        statuses: Counter[int] = Counter()
        if moto is not None:
            moto.stop()
            statuses.update(req.status for req in moto.requests())
    doc = _report_doc(
        sc,
        quick,
        seed,
        producers,
        objects,
        link_figures,
        rss.peak,
        counts,
        lag,
        catch_up.results,
        lag_sampler.figures(),
        failures,
        codes,
    )
    doc["timed_faults"] = _timed_faults(sc, producers, windows, t0)
    doc["rss_samples"] = {r: [list(x) for x in v] for r, v in rss.series.items()}
    doc["acked_by_fenced_writer"] = counts.get("acked_by_fenced_writer", 0)
    doc["planted"] = [{"region": b.region, "kind": b.kind, "key": b.key} for b in planted]
    # Checked from these offsets on (a restored home; a journal that deleted
    # mirror segments early for room): what is below is in the bucket only.
    doc["served_from"] = trimmed
    doc["split_brain"] = [
        {
            "region": sb.region,
            "second_gateway_at_s": round(sb.began - t0, 1),
            "first_gateway_exit_code": sb.old_exit,
            "first_gateway_fenced_after_s": sb.fenced_after_s,
            "first_gateway_journal": str(sb.old.data_dir / "journal"),
            "acked_by_first_gateway": sum(
                len(p.acked_by_old_writer) for p in producers if p.w.region == sb.region
            ),
            "acked_by_fenced_writer": counts.get(f"acked_by_fenced_writer:{sb.region}", 0),
        }
        for sb in splits
    ]
    for r, figures in meta_figures.items():
        doc["regions"][r]["metadata_link"] = figures
    if meta is not None:
        doc["metadata_exit_code"] = codes["metadata"]
    if moto is not None:
        doc["s3_requests"] = {
            "total": sum(statuses.values()),
            "by_status": {str(k): v for k, v in sorted(statuses.items())},
        }
    _print_report(doc)
    if report_path is not None:
        report_path.write_text(json.dumps(doc, indent=2) + "\n")
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


def _site(sc: Scenario, region: str, data_dir: Path, name: str = "") -> Site:
    """A region's gateway as the scenario sets it up: its journal budget, its clock."""
    site = Site(region, data_dir.resolve(), name=name)
    budget = dict(sc.journal_max_mb).get(region)
    if budget is not None:
        # Small segments, so that shipped ones are deleted in small steps.
        site.extra_toml = (
            f"[journal]\nsegment_bytes = {int(SEGMENT_MB * 2**20)}\n"
            f"max_bytes = {int(budget * 2**20)}\n"
        )
    skew = dict(sc.clock_skew_h).get(region)
    if skew:
        # Preloaded into the gateway itself (no wrapper: signals reach it);
        # its monotonic clock is shifted by the same constant.
        site.env = {"LD_PRELOAD": libfaketime(), "FAKETIME": f"{round(skew * 3600):+d}"}
    return site


def libfaketime() -> str:
    """Path of Debian's libfaketime.so.1 (package faketime); refuses the run without it."""
    listed = ""
    if shutil.which("dpkg") is not None:
        listed = subprocess.run(
            ["dpkg", "-L", "faketime", "libfaketime"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    for line in listed.splitlines():
        if line.endswith("/libfaketime.so.1"):
            return line
    raise fail("clock_skew_h needs libfaketime: apt-get install faketime", code=2)


def _apply(fault: Fault, sites: dict[str, Site], timers: list[threading.Timer]) -> None:
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


def acked_between(p: Producer, began: float, ended: float) -> int:
    """Records ``p`` had acknowledged between two instants (monotonic)."""
    return sum(n for at, n in p.acked_at if began <= at <= ended)


def _timed_faults(
    sc: Scenario, producers: list[Producer], windows: dict[int, list[float]], t0: float
) -> list[dict[str, Any]]:
    """Each link or metadata fault: when it was on, and what each region acknowledged meanwhile."""
    out = []
    for i, (began, *rest) in sorted(windows.items()):
        ended = rest[0] if rest else time.monotonic()
        out.append(
            {
                "fault": sc.faults[i].label(),
                "began_at_s": round(began - t0, 1),
                "ended_at_s": round(ended - t0, 1),
                "acked_during": {
                    r: sum(acked_between(p, began, ended) for p in producers if p.w.region == r)
                    for r in sc.regions
                },
            }
        )
    return out


def _check_kept_working(
    sc: Scenario, producers: list[Producer], windows: dict[int, list[float]]
) -> list[str]:
    """A region whose metadata link was down must keep acknowledging from its cached routing."""
    bad = []
    for i, (began, *rest) in sorted(windows.items()):
        fault = sc.faults[i]
        if not fault.is_metadata or not rest:
            continue
        for r in sc.regions if fault.region == "*" else [fault.region]:
            mine = [p for p in producers if p.w.region == r]
            if mine and not sum(acked_between(p, began, rest[0]) for p in mine):
                bad.append(f"{r} acknowledged nothing during {fault.label()}")
    return bad


def journal_values(journal_dir: Path, topic: str) -> dict[tuple[int, int], str]:
    """Every record of ``topic`` in a stopped gateway's journal, by (partition, offset)."""
    out: dict[tuple[int, int], str] = {}
    j = Journal.open_sync(journal_dir)
    try:
        for t, part in j.partitions():
            if t != topic:
                continue
            offset = j.first_offset(t, part)
            while entries := j.read(t, part, offset):
                for e in entries:
                    for rec in decode_batch(e.payload, where=str(journal_dir)).records(offset):
                        out[(part, rec.offset)] = (rec.value or b"").decode("utf-8", "replace")
                    offset = max(offset, e.next_offset)
    finally:
        j.close_sync()
    return out


def split_old_writer(
    old: dict[tuple[int, int], str],
    in_log: list[dict[int, object]],
    old_journal: dict[tuple[int, int], str],
) -> tuple[dict[tuple[int, int], str], dict[tuple[int, int], str], int]:
    """What a fenced writer acknowledged: (in the region's log, only in its journal, lost).

    ``in_log`` is the region's history per partition as a mirror holds it (the
    log in the bucket). A record the old writer acknowledged is *kept* when
    the log holds it at its offset (it was shipped before the fence); else it
    was acknowledged by the fenced writer and never shipped: it is counted
    apart, and must still be in the old gateway's journal (the data directory
    a fenced gateway leaves behind); one in neither place is lost.
    """
    kept: dict[tuple[int, int], str] = {}
    fenced: dict[tuple[int, int], str] = {}
    lost = 0
    for (part, o), v in old.items():
        if part < len(in_log) and in_log[part].get(o) == v:
            kept[(part, o)] = v
        else:
            fenced[(part, o)] = v
            lost += old_journal.get((part, o)) != v
    return kept, fenced, lost


def _check_acked(
    p: Producer,
    sc: Scenario,
    sites: dict[str, Site],
    counts: dict[str, int],
    old_journal: Path | None = None,
    trimmed: dict[str, list[int]] | None = None,
) -> list[str]:
    """Count, at the home and in every mirror: acknowledged records lost, duplicated, reordered.

    Offsets must be gap-free; every acknowledged (partition, offset) must hold
    the value acknowledged there; a sequence number stored twice is a
    duplicate unless the producer retried its batch after a lost answer; a
    sequence number lower than the one before it in a partition (first
    copies only) is a reordering.
    """
    t = next(t for t in sc.topics if t.name == p.w.topic)
    readers = [(t.home, t.name)] + [
        (r, f"{t.home}.{t.name}")
        for r in sc.regions
        if r != t.home and ("*" in t.subscribers or r in t.subscribers)
    ]
    bad: list[str] = []
    acked = p.acked
    if trimmed is None:
        trimmed = {}
    for i, (region, name) in enumerate(readers):
        with httpx.Client(base_url=sites[region].url, timeout=30) as client:
            starts = first_offsets(client, name)
            partitions = [
                all_records(client, name, part, starts[part]) for part in range(t.partitions)
            ]
        # Trimmed further while read? Checked from where each partition starts.
        starts = [
            int(stored[0][0]) if stored else start  # type: ignore[call-overload]
            for stored, start in zip(partitions, starts, strict=True)
        ]
        if any(starts):
            key = f"{region}:{name}"
            trimmed[key] = starts
        for part, stored in enumerate(partitions):
            if [r[0] for r in stored] != list(range(starts[part], starts[part] + len(stored))):
                bad.append(f"{region}:{name}/{part} has gaps in its offsets")
        values = [{r[0]: r[3] for r in stored} for stored in partitions]
        if i == 1 and p.acked_by_old_writer and old_journal is not None:
            # The first mirror holds the region's log: what the fenced writer shipped.
            kept, fenced, lost = split_old_writer(
                p.acked_by_old_writer, values, journal_values(old_journal, t.name)
            )
            acked = {**kept, **p.acked}
            counts["acked_by_fenced_writer"] = counts.get("acked_by_fenced_writer", 0) + len(fenced)
            key = f"acked_by_fenced_writer:{t.home}"
            counts[key] = counts.get(key, 0) + len(fenced)
            counts["lost"] = counts.get("lost", 0) + lost
            if lost:
                bad.append(f"{t.home}:{t.name} lost {lost} records the fenced writer acknowledged")
        elif i == 0 and p.acked_by_old_writer and len(readers) == 1:
            bad.append(f"{t.home}:{t.name} split brain needs a mirror of the topic to check it")
        # A restored home serves only what it took since: check from where it starts.
        mine = {k: v for k, v in acked.items() if k[0] >= len(starts) or k[1] >= starts[k[0]]}
        found = count_problems(values, mine, p.ambiguous)
        for key, value in found.items():
            counts[key] = counts.get(key, 0) + value
            if value:
                bad.append(f"{region}:{name} {key} {value} acknowledged records")
    return bad


def count_problems(
    partitions: list[dict[int, object]],
    acked: dict[tuple[int, int], str],
    ambiguous: set[int],
) -> dict[str, int]:
    """Lost, duplicated and reordered records in one topic (or mirror) as stored.

    ``partitions[p]`` maps offset to value; ``acked`` what the producer was
    acknowledged, by (partition, offset); ``ambiguous`` the sequence numbers
    the producer sent again after a lost answer (their second copy is the
    device's doing, not a duplicate).
    """
    seen: Counter[int] = Counter()
    lost = reordered = 0
    for part, values in enumerate(partitions):
        lost += sum(1 for (pp, o), v in acked.items() if pp == part and values.get(o) != v)
        seqs = [n for _, v in sorted(values.items()) if (n := _seq(v)) is not None]
        # Order is judged on first copies: a retried batch stored twice is a
        # duplicate (or a device's retry), not also a reordering.
        firsts = [n for n in dict.fromkeys(seqs) if n not in seen]
        reordered += sum(1 for a, b in itertools.pairwise(firsts) if b < a)
        seen.update(seqs)
    lost += sum(1 for (pp, _), _v in acked.items() if pp >= len(partitions))
    duplicated = sum(c - 1 for n, c in seen.items() if c > 1 and n not in ambiguous)
    return {"lost": lost, "duplicated": duplicated, "reordered": reordered}


def _s3_figures(moto: MotoServer, region: str) -> tuple[int, int]:
    """(log objects, bytes) of a region's log on moto (listed directly, not over a link)."""
    ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
    count = size = 0
    params = {"list-type": "2", "prefix": f"regions/{region}/log/"}
    try:
        with httpx.Client(base_url=moto.endpoint, timeout=30) as c:
            while True:
                r = c.get(f"/{S3_BUCKET}", params=params)
                r.raise_for_status()
                root = ET.fromstring(r.content)  # noqa: S314 (our own moto's answer)
                for item in root.iter(f"{ns}Contents"):
                    count += 1
                    size += int(item.findtext(f"{ns}Size") or 0)
                token = root.findtext(f"{ns}NextContinuationToken")
                if not token:
                    return count, size
                params["continuation-token"] = token
    except (httpx.HTTPError, ET.ParseError):
        return -1, -1


def _report_doc(
    sc: Scenario,
    quick: bool,
    seed: int,
    producers: list[Producer],
    objects: dict[str, tuple[int, int]],
    link_figures: dict[str, dict[str, int]],
    peak_rss: dict[str, int],
    counts: dict[str, int],
    lag: dict[str, float],
    catch_up: list[dict[str, Any]],
    replication_lag: dict[str, dict[str, float]],
    failures: list[str],
    codes: dict[str, int],
) -> dict[str, Any]:
    regions: dict[str, Any] = {}
    for r in sc.regions:
        regions[r] = {
            "acknowledged": sum(
                len(p.acked) + len(p.acked_by_old_writer) for p in producers if p.w.region == r
            ),
            "producer_retries": sum(p.retries for p in producers if p.w.region == r),
            "refused_by_status": {
                str(k): v
                for k, v in sorted(
                    sum((p.refused for p in producers if p.w.region == r), Counter[int]()).items()
                )
            },
            "log_objects": objects[r][0],
            "log_bytes": objects[r][1],
            "peak_rss_bytes": peak_rss.get(r, 0),
            "exit_code": codes.get(r),
        }
        if r in link_figures:
            regions[r]["link"] = {"shape": sc.link(r).describe(), **link_figures[r]}
    return {
        "scenario": sc.name,
        "quick": quick,
        "seed": seed,
        "bucket": sc.bucket,
        "duration_s": sc.duration_s,
        "passed": not failures and all(c == 0 for c in codes.values()),
        "failures": failures,
        "acknowledged": sum(len(p.acked) + len(p.acked_by_old_writer) for p in producers),
        "lost": counts.get("lost", 0),
        "duplicated": counts.get("duplicated", 0),
        "reordered": counts.get("reordered", 0),
        "mirror_divergence": counts.get("mirror_divergence", 0),
        "regions": regions,
        "catch_up": sorted(catch_up, key=lambda c: float(c["ended_at_s"])),
        "replication_lag": replication_lag,
        "converged_after_end_s": {k: round(v, 3) for k, v in sorted(lag.items())},
    }


def _print_report(doc: dict[str, Any]) -> None:
    table = Table(title=f"scenario {doc['scenario']}" + (" (quick)" if doc["quick"] else ""))
    cols = ["region", "records acked", "producer retries", "log objects", "MiB in bucket"]
    cols += ["peak RSS MiB"]
    has_links = any("link" in v for v in doc["regions"].values())
    if has_links:
        cols += ["link MB up", "link MB down", "link resets"]
    for col in cols:
        table.add_column(col, justify="left" if col == "region" else "right")
    for r, v in doc["regions"].items():
        row = [
            r,
            f"{v['acknowledged']:,}",
            str(v["producer_retries"]),
            str(v["log_objects"]),
            f"{v['log_bytes'] / 2**20:.2f}",
            f"{v['peak_rss_bytes'] / 2**20:.0f}",
        ]
        if has_links:
            link = v.get("link", {})
            row += [
                f"{link.get('bytes_up', 0) / 1e6:.2f}",
                f"{link.get('bytes_down', 0) / 1e6:.2f}",
                str(link.get("resets", 0)),
            ]
        table.add_row(*row)
    console.print(table)
    console.print(
        f"  acknowledged {doc['acknowledged']:,}; lost {doc['lost']}, duplicated "
        f"{doc['duplicated']}, reordered {doc['reordered']}; mirror partitions diverging "
        f"{doc['mirror_divergence']}",
        highlight=False,
    )
    for r, v in doc["regions"].items():
        if v.get("refused_by_status"):
            by = ", ".join(f"{k}: {n}" for k, n in v["refused_by_status"].items())
            console.print(f"  {r}: produce answered other than 200 ({by})", highlight=False)
    for reader, firsts in doc.get("served_from", {}).items():
        console.print(
            f"  {reader} checked from offsets {firsts} (below: in the bucket only)",
            highlight=False,
        )
    for sb in doc.get("split_brain", []):
        console.print(
            f"  split brain in {sb['region']}: a second gateway from edgegw restore at "
            f"t={sb['second_gateway_at_s']:g}s; the first exited {sb['first_gateway_exit_code']} "
            f"{sb['first_gateway_fenced_after_s']}s later; of the "
            f"{sb['acked_by_first_gateway']:,} records the first acknowledged, "
            f"{sb['acked_by_fenced_writer']:,} were never shipped (acked_by_fenced_writer: kept "
            f"in {sb['first_gateway_journal']}, not in the region's log)",
            highlight=False,
        )
    if "s3_requests" in doc:
        s3 = doc["s3_requests"]
        by = ", ".join(f"{k}: {v}" for k, v in s3["by_status"].items())
        console.print(f"  S3 requests {s3['total']:,} ({by})", highlight=False)
    for c in doc["catch_up"]:
        took = "not caught up" if c["seconds"] is None else f"{c['seconds']:.2f}s"
        console.print(
            f"  catch-up after {c['fault']} (ended t={c['ended_at_s']:g}s): {took}",
            highlight=False,
        )
    for k, v in doc["replication_lag"].items():
        replay = ""
        if "replay_max_s" in v:
            replay = f" (a restored gateway's replay: up to {v['replay_max_s']:.2f}s behind)"
        console.print(
            f"  {k} replication lag during the run: p99 {v['p99_s']:.2f}s, "
            f"max {v['max_s']:.2f}s{replay}",
            highlight=False,
        )
    for k, v in doc["converged_after_end_s"].items():
        console.print(f"  {k} converged {v:.2f}s after the end", highlight=False)
