"""Real `edgegw serve` processes for tests.

* :class:`Server` starts one gateway from a config file and waits for its
  ``api.addr`` (tests/service, tests/cli).
* :class:`Fleet` runs several regions on one bucket — a local directory, or
  moto's S3 server with a :class:`~edge_gateway.testing.tcpproxy.TcpProxy`
  in front of it per gateway, so one region can lose the bucket alone — with
  start, SIGTERM, kill -9 and a :class:`~edge_gateway.client.Client` per
  region (tests/system).
* :class:`Producer` writes a varied workload (keys, text and binary values
  and headers, explicit timestamps, JSON and binary batches) in a thread and
  remembers every acknowledged record; :func:`read_partition` reads a
  partition back through the API, failing on a duplicate or a gap;
  :func:`mirror_mismatches` compares a mirror with its source record for record.
"""

from __future__ import annotations

import base64
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from edgegw_cli._fleet import stop_process

from edge_gateway.api.wire import BATCH_MEDIA_TYPE, NEXT_OFFSET_HEADER
from edge_gateway.client import Client, read_addr_file
from edge_gateway.config import load_config
from edge_gateway.format.batch import Record, encode_batch, iter_batches
from edge_gateway.testing.tcpproxy import TcpProxy

EDGEGW = Path(sys.executable).parent / "edgegw"


def write_config(tmp_path: Path, **journal: object) -> Path:
    extra = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in journal.items())
    path = tmp_path / "edgegw.toml"
    path.write_text(
        f"""
region = "north"
data_dir = "{tmp_path / "data"}"
shutdown_grace_s = 20.0
[journal]
{extra}
[shipper]
flush_interval_ms = 50
[api]
listen = "127.0.0.1:0"
[[topics]]
name = "t"
home = "north"
partitions = 3
"""
    )
    return path


class Server:
    def __init__(self, config: Path) -> None:
        self.addr_file = load_config(config, env={}).data_dir / "api.addr"
        self.addr_file.unlink(missing_ok=True)
        # A file, not a pipe: a chatty server must never block on a full pipe.
        self.log = config.parent / "serve.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(EDGEGW), "serve", "--config", str(config)],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while not self.addr_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"serve did not start: {self.log.read_text()}")
            time.sleep(0.05)
        self.url = read_addr_file(self.addr_file.parent)  # https://... when it serves TLS

    def stop(self, sig: int) -> tuple[int, str]:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        return code, self.log.read_text()


# ------------------------------------------------------------------ waiting


def wait_until(
    predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# ------------------------------------------------------------------ config


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str | Path):
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML for {v!r}")


@dataclass(frozen=True)
class TopicSpec:
    name: str
    home: str
    partitions: int = 3
    subscribers: tuple[str, ...] = ("*",)
    #: ``[[topics]] priority`` (written only when not the default).
    priority: str = "normal"
    #: ``[[topics]] on_full`` (written only when not the default).
    on_full: str = "block"


#: Settings that keep a fleet quick on a small machine (every section may be overridden).
FAST: dict[str, dict[str, object]] = {
    "shipper": {
        "flush_interval_ms": 100,
        "manifest_interval_ms": 1000,
        "retry_base_s": 0.05,
        "retry_cap_s": 1.0,
    },
    "mirror": {"poll_interval_ms": 50, "max_poll_interval_ms": 300, "retry_cap_ms": 500},
    "gc": {"enabled": False},
    "log": {"level": "info"},
    "api": {"listen": "127.0.0.1:0"},
}


class Gateway:
    """One region's `edgegw serve` process in a :class:`Fleet` (its files under ``root``)."""

    def __init__(
        self,
        region: str,
        root: Path,
        bucket: Mapping[str, object],
        topics: Sequence[TopicSpec],
        sections: Mapping[str, Mapping[str, object]],
    ) -> None:
        self.region = region
        self.data_dir = root / region
        self.config = root / f"{region}.toml"
        self.log = root / f"{region}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.starts = 0
        #: Extra environment of the next starts (fail points, ``LD_PRELOAD`` of libfaketime).
        self.env: dict[str, str] = {}
        merged = {name: dict(values) for name, values in FAST.items()}
        for name, values in sections.items():
            merged.setdefault(name, {}).update(values)
        merged["bucket"] = dict(bucket)
        lines = [f"region = {_toml_value(region)}", f"data_dir = {_toml_value(self.data_dir)}"]
        lines.append("shutdown_grace_s = 10.0")
        for name, values in merged.items():
            lines.append(f"[{name}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
        for t in topics:
            lines += [
                "[[topics]]",
                f"name = {_toml_value(t.name)}",
                f"home = {_toml_value(t.home)}",
                f"partitions = {t.partitions}",
                f"subscribers = {_toml_value(t.subscribers)}",
            ]
            if t.priority != "normal":
                lines.append(f"priority = {_toml_value(t.priority)}")
            if t.on_full != "block":
                lines.append(f"on_full = {_toml_value(t.on_full)}")
        self.config.write_text("\n".join(lines) + "\n")

    # -------------------------------------------------------- process

    def spawn(self) -> None:
        """Start the process (returns at once; :meth:`wait_ready` waits for the API)."""
        assert not self.running, f"{self.region} is already running"
        (self.data_dir / "api.addr").unlink(missing_ok=True)
        self.url = ""
        self.starts += 1
        with open(self.log, "ab") as log:
            log.write(f"---- start #{self.starts} ----\n".encode())
            log.flush()
            # A file, not a pipe: a chatty server must never block on a full pipe.
            self.proc = subprocess.Popen(
                [str(EDGEGW), "serve", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env} if self.env else None,
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait for ``api.addr`` and a 200 from ``/healthz`` (produce is accepted)."""
        addr = self.data_dir / "api.addr"
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.region} exited ({self.proc.returncode}):\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.region} not ready in {timeout}s:\n{self.tail()}")
            if addr.exists() and not self.url:
                text = addr.read_text().strip()
                self.url = f"http://{text}" if text else ""
            if self.url:
                try:
                    if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a graceful shutdown) and wait; the exit code (-9 if it had to be killed)."""
        if self.proc is None:
            return 0
        return stop_process(self.proc, timeout)

    def kill(self) -> None:
        """kill -9: no flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    # -------------------------------------------------------- API

    def client(self, timeout: float = 30.0) -> Client:
        assert self.url, f"{self.region} is not running"
        return Client(self.url, timeout=timeout)

    def status(self) -> dict[str, Any]:
        with self.client() as c:
            return c.status()

    def mirror(self, source: str) -> dict[str, Any]:
        """This gateway's mirror of ``source`` as ``status`` reports it."""
        doc: dict[str, Any] = self.status()["mirrors"][source]
        return doc

    def next_offsets(self, topic: str) -> list[int]:
        with self.client() as c:
            return [p["next_offset"] for p in c.topic(topic)["partitions"]]


class Fleet:
    """Several regions on one bucket, each an `edgegw serve` process.

    ``s3=(moto_port, bucket_name)`` puts them on moto's server, each behind
    its own :class:`TcpProxy` (``fleet.proxies[region]``); otherwise they
    share a local-directory bucket under ``root``, or the ``[bucket]``
    section ``bucket`` (an Azure container on Azurite, say), or the section
    ``bucket(region)`` returns. ``sections``
    override config sections for every region, ``per_region`` for one.
    """

    def __init__(
        self,
        root: Path,
        regions: Sequence[str],
        topics: Sequence[TopicSpec],
        *,
        s3: tuple[int, str] | None = None,
        bucket: Mapping[str, object] | Callable[[str], Mapping[str, object]] | None = None,
        sections: Mapping[str, Mapping[str, object]] | None = None,
        per_region: Mapping[str, Mapping[str, Mapping[str, object]]] | None = None,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.topics = list(topics)
        self.proxies: dict[str, TcpProxy] = {}
        self.bucket_dir = root / "bucket"
        # A configured bucket.path must exist: this fleet starts a new bucket.
        self.bucket_dir.mkdir(exist_ok=True)
        self.gateways: dict[str, Gateway] = {}
        for region in regions:
            section: dict[str, object]
            if callable(bucket):
                section = dict(bucket(region))
            elif bucket is not None:
                section = dict(bucket)
            elif s3 is None:
                section = {"type": "local", "path": str(self.bucket_dir)}
            else:
                port, name = s3
                proxy = TcpProxy("127.0.0.1", port).start()
                self.proxies[region] = proxy
                section = {
                    "type": "s3",
                    "bucket": name,
                    "endpoint_url": proxy.url,
                    "region": "us-east-1",
                    "path_style": True,
                    "access_key": "testing",
                    "secret_key": "testing",
                    "connect_timeout": 1.0,
                    "read_timeout": 2.0,
                    "max_attempts": 1,
                }
            merged: dict[str, dict[str, object]] = {}
            for src in (sections or {}, (per_region or {}).get(region, {})):
                for name, values in src.items():
                    merged.setdefault(name, {}).update(values)
            self.gateways[region] = Gateway(region, root, section, topics, merged)

    def __getitem__(self, region: str) -> Gateway:
        return self.gateways[region]

    def start(self, regions: Iterable[str] | None = None) -> None:
        """Start the given regions (default all) side by side; return when all are ready."""
        gws = [self.gateways[r] for r in (regions or self.gateways)]
        for g in gws:
            g.spawn()
        for g in gws:
            g.wait_ready()

    def close(self) -> dict[str, int]:
        """SIGTERM every gateway (proxies first healed, so shutdown can ship); exit codes."""
        for proxy in self.proxies.values():
            proxy.set_mode("pass")
        codes = {r: g.stop() for r, g in self.gateways.items()}
        for proxy in self.proxies.values():
            proxy.stop()
        return codes

    def mirrored_pairs(self) -> list[tuple[TopicSpec, Gateway, Gateway]]:
        """(topic, home gateway, mirroring gateway) for every mirror in the fleet."""
        out = []
        for t in self.topics:
            for region, g in self.gateways.items():
                if region != t.home and ("*" in t.subscribers or region in t.subscribers):
                    out.append((t, self.gateways[t.home], g))
        return out

    def wait_converged(self, timeout: float = 60.0) -> None:
        """Wait until every mirror has every record its source holds now."""
        for t, home, other in self.mirrored_pairs():
            wait_mirrored(home, t.name, other, timeout)

    def mismatches(self) -> list[str]:
        out = []
        for t, home, other in self.mirrored_pairs():
            out += mirror_mismatches(home, t.name, t.partitions, other)
        return out


# ------------------------------------------------------------------ reading


def wait_mirrored(home: Gateway, topic: str, other: Gateway, timeout: float = 60.0) -> None:
    """Wait until ``other``'s mirror of ``topic`` has every record ``home`` holds now."""
    want = home.next_offsets(topic)
    mirror = f"{home.region}.{topic}"
    wait_until(
        lambda: other.next_offsets(mirror) == want,
        timeout,
        f"{other.region} to mirror {mirror} up to {want}",
    )


def read_partition(
    url: str, topic: str, partition: int, start: int = 0, limit: int | None = None
) -> list[Record]:
    """Every record of a partition from ``start`` (at most ``limit``), through binary fetch.

    Offsets must run ``start, start + 1, ...`` without a repeat or a hole:
    a duplicate or a gap in the gateway's journal fails here, whatever the
    fetch path would hide.
    """
    out: list[Record] = []
    offset = start
    with httpx.Client(base_url=url, timeout=30) as c:
        while limit is None or len(out) < limit:
            r = c.get(
                f"/v1/topics/{topic}/partitions/{partition}/records",
                params={"offset": offset, "max_records": 5000, "max_bytes": 8 << 20},
                headers={"accept": BATCH_MEDIA_TYPE},
            )
            r.raise_for_status()
            next_offset = int(r.headers[NEXT_OFFSET_HEADER])
            got = 0
            for batch in iter_batches(r.content, where=f"{topic}/{partition}@{offset}"):
                for rec in batch.records():
                    if rec.offset >= next_offset:
                        continue  # past this page (max_records)
                    if rec.offset < offset:
                        # the page may start before the requested offset, nowhere else
                        assert not got, f"{topic}/{partition}: duplicate offset {rec.offset}"
                        continue
                    expected = start + len(out)
                    assert rec.offset == expected, (
                        f"{topic}/{partition}: offset {rec.offset} where {expected} was due "
                        f"({'duplicate' if rec.offset < expected else 'gap'})"
                    )
                    out.append(rec)
                    got += 1
                    if limit is not None and len(out) >= limit:
                        return out
            if not got:
                break
            offset = next_offset
    return out


def mirror_mismatches(home: Gateway, topic: str, partitions: int, other: Gateway) -> list[str]:
    """Partitions where ``other``'s mirror differs from ``home``'s topic, record for record."""
    bad = []
    for p in range(partitions):
        want = read_partition(home.url, topic, p)
        got = read_partition(other.url, f"{home.region}.{topic}", p)
        if got != want:
            first = next(
                (i for i, (x, y) in enumerate(zip(want, got, strict=False)) if x != y),
                min(len(want), len(got)),
            )
            bad.append(
                f"{other.region}:{home.region}.{topic}/{p}: {len(got)} records vs {len(want)} "
                f"at home, first difference at index {first}"
            )
    return bad


def prefix_mismatches(home: Gateway, topic: str, partitions: int, other: Gateway) -> list[str]:
    """Partitions where ``other``'s mirror is not a prefix of the source (a mirror in progress)."""
    bad = []
    for p in range(partitions):
        got = read_partition(other.url, f"{home.region}.{topic}", p)
        want = read_partition(home.url, topic, p)[: len(got)]
        if got != want:
            bad.append(f"{other.region}:{home.region}.{topic}/{p} is not a prefix of the source")
    return bad


# ------------------------------------------------------------------ writing


class Producer(threading.Thread):
    """Produces a varied workload to ``topic`` at ``url`` until stopped.

    Alternates JSON produce calls (text and binary keys, values and headers,
    explicit timestamps) with binary batches (binary headers, null keys), of
    up to ``max_batch`` records each;
    ``acked[(partition, offset)]`` holds every acknowledged record. A failed
    request ends the thread with ``error`` set (a test asserts it is None).
    """

    def __init__(
        self,
        url: str,
        topic: str,
        partitions: int,
        *,
        seed: int = 1,
        pause: float = 0.01,
        limit: int | None = None,
        max_batch: int = 50,
    ) -> None:
        super().__init__(daemon=True, name=f"producer-{topic}")
        self.url = url
        self.topic = topic
        self.partitions = partitions
        self.rnd = random.Random(seed)
        self.pause = pause
        self.limit = limit
        self.max_batch = max_batch
        self.acked: dict[tuple[int, int], Record] = {}
        self.error: str | None = None
        self.stopping = threading.Event()
        self.n = 0

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)
        assert not self.is_alive(), "the producer did not stop"

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=30) as c:
                while not self.stopping.is_set():
                    if self.limit is not None and self.n >= self.limit:
                        return
                    if self.rnd.random() < 0.5:
                        self._json(c)
                    else:
                        self._batch(c)
                    if self.pause:
                        time.sleep(self.pause)
        except Exception as exc:  # reported to the test
            self.error = f"{type(exc).__name__}: {exc}"

    def _record(self, i: int) -> Record:
        rnd = self.rnd
        key: bytes | None = None
        roll = rnd.random()
        if roll < 0.4:
            key = f"sensor-{rnd.randrange(50)}".encode()
        elif roll < 0.6:
            key = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 9)))
        if rnd.random() < 0.2:
            value = bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 64)))
        else:
            value = f'{{"n": {self.n + i}, "t": {rnd.uniform(-5, 40):.2f}}}'.encode()
        headers: list[tuple[str, bytes]] = []
        for h in range(rnd.randrange(0, 3)):
            if rnd.random() < 0.5:
                headers.append((f"h{h}", f"text-{rnd.randrange(1000)}".encode()))
            else:
                headers.append((f"bin{h}", bytes([0xFF, 0x00, rnd.randrange(256)])))
        ts = 1_795_380_000_000 + rnd.randrange(10**9)
        return Record(0, ts, key, value, tuple(headers))

    def _json(self, c: httpx.Client) -> None:
        recs = [self._record(i) for i in range(self.rnd.randrange(1, min(20, self.max_batch) + 1))]
        docs = []
        for r in recs:
            doc: dict[str, Any] = {"timestamp": r.timestamp}
            for name, data in (("key", r.key), ("value", r.value)):
                if data is None:
                    continue
                try:
                    doc[name] = data.decode("utf-8")
                except UnicodeDecodeError:
                    doc[f"{name}_b64"] = base64.b64encode(data).decode()
            text = {k: v.decode() for k, v in r.headers if k.startswith("h")}
            binary = {k: base64.b64encode(v).decode() for k, v in r.headers if k.startswith("bin")}
            if text:
                doc["headers"] = text
            if binary:
                doc["headers_b64"] = binary
            docs.append(doc)
        resp = c.post(f"/v1/topics/{self.topic}/records", json={"records": docs})
        assert resp.status_code == 200, resp.text
        for r, o in zip(recs, resp.json()["offsets"], strict=True):
            # The API returns text headers before binary ones (two JSON objects).
            headers = tuple(h for h in r.headers if h[0].startswith("h")) + tuple(
                h for h in r.headers if h[0].startswith("bin")
            )
            self.acked[(o["partition"], o["offset"])] = Record(
                o["offset"], r.timestamp, r.key, r.value, headers
            )
        self.n += len(recs)

    def _batch(self, c: httpx.Client) -> None:
        recs = [self._record(i) for i in range(self.rnd.randrange(1, self.max_batch + 1))]
        p = self.rnd.randrange(self.partitions)
        with_keys = any(r.key is not None for r in recs)
        body = encode_batch(
            [r.value for r in recs],
            keys=[r.key for r in recs] if with_keys else None,
            timestamps=[r.timestamp for r in recs],
            headers=[r.headers for r in recs] if any(r.headers for r in recs) else None,
        )
        resp = c.post(
            f"/v1/topics/{self.topic}/partitions/{p}/batches",
            content=body,
            headers={"content-type": BATCH_MEDIA_TYPE},
        )
        assert resp.status_code == 200, resp.text
        for r, o in zip(recs, resp.json()["offsets"], strict=True):
            self.acked[(p, o["offset"])] = Record(
                o["offset"], r.timestamp, r.key, r.value, r.headers
            )
        self.n += len(recs)


def check_acknowledged(producer: Producer, home: Gateway) -> None:
    """Every record the producer had acknowledged is at home, as it was produced."""
    assert producer.error is None, producer.error
    assert producer.acked, "nothing was produced"
    for p in range(producer.partitions):
        stored = {r.offset: r for r in read_partition(home.url, producer.topic, p)}
        for (pp, offset), rec in producer.acked.items():
            if pp == p:
                assert stored.get(offset) == rec, (
                    f"{producer.topic}/{p}@{offset} differs or is lost"
                )
