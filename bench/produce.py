"""Produce benchmark: the gateway's local HTTP API next to NATS JetStream.

Usage::

    .venv/bin/python bench/produce.py [--quick] [--dir PATH]

Starts a real ``edgegw serve`` process (``fsync = "interval"``, the default
local bucket, so the shipper runs as in production) and measures, over the
local API on 127.0.0.1:

* ``single``  single-record produce latency: one HTTP request per record
              (``POST /v1/topics/t/records``, a 100-byte value) on one
              keep-alive connection, p50/p99. The headline figures use a
              minimal raw-socket HTTP/1.1 client (it measures the gateway);
              the same with the stdlib ``http.client`` and with
              ``edge_gateway.client.Client``, one request of each in turn
              (so both see the same load), are reported next to it, since
              with them the client's own CPU is much of the latency;
* ``batched`` throughput with batches of 1000 100-byte records, through the
              binary batch route (``application/vnd.edgegw.batch``, encoded by
              the client in the timed loop) and through the JSON route;
* ``concurrent`` capacity with many small producers: 64 keep-alive
              connections, each posting one single-record JSON request as
              soon as the previous one is acked (closed loop), for 20 s
              (quick: 5 s) after 1 s of warm-up: requests/s, p50/p99 and
              the gateway's CPU per request (user + system time of its
              process from ``/proc``). The load comes from ``bench/_load.py``
              in its own process (one thread, epoll, pre-built requests,
              ~20 us of CPU per request), so the two share the machine's cores;
* ``idle``    the gateway's resident memory (RSS) once started and idle;
* ``tls``     the cost of TLS on the local API (``[api] tls_cert``; skipped
              with ``--no-tls`` or without ``cryptography``): a second gateway
              serving HTTPS with a certificate made for the run, started next
              to the first; single-record p50/p99 with the raw client over
              TLS and over plain HTTP, one request of each in turn (the same
              load for both), and the capacity run again over TLS (the load
              generator does the handshakes before it measures), beside the
              plain figures of this run, as ratios.

Next to it, the same on NATS JetStream when ``nats-server`` is installed
(started by the bench on 127.0.0.1 with ``-js`` and a file-backed stream in
a scratch directory), driven with nats-py: synchronous ``js.publish``
latency; ``publish_async`` throughput with a window of up to 4000
outstanding acks (nats-py's ``publish_async_max_pending``: the strongest
nats-py figure here; awaiting each group of 1000 halves it); and capacity with
64 concurrent synchronous publishers (one connection and one ``js.publish``
in flight each, nats-server's CPU per message from ``/proc``; the Python
publishers' own CPU bounds that figure). Without
``nats-server`` the NATS figures are null. NATS 2.9 has no per-message fsync
either, so both sides ack after the write to the OS.

The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import (
    Row,
    add_baseline_args,
    code_root,
    emit_json,
    fixed_size_values,
    machine_info,
    percentile,
    progress,
    ratio,
    render_table,
    run_baseline_ab,
    scratch_dir,
    without_baseline_args,
)

sys.path.insert(0, str(code_root()))

from edge_gateway.format.batch import encode_batch
from edge_gateway.testing.ports import free_port

BATCH = 1000
RECORD = 100
BATCH_MEDIA_TYPE = "application/vnd.edgegw.batch"


# ------------------------------------------------------------------ gateway


class GatewayProcess:
    """``edgegw serve`` in a child process; stderr drained in a thread."""

    def __init__(
        self,
        root: Path,
        server: str,
        *,
        name: str = "gw",
        tls: tuple[Path, Path] | None = None,
        journal: str = "",
        partitions: int = 1,
    ) -> None:
        self.data_dir = root / name
        config = root / f"{name}.toml"
        tls_toml = f'tls_cert = "{tls[0]}"\ntls_key = "{tls[1]}"\n' if tls else ""
        config.write_text(
            f"""
region = "bench"
data_dir = "{self.data_dir}"
shutdown_grace_s = 10.0
[journal]
fsync = "interval"
{journal}
[api]
listen = "127.0.0.1:0"
server = "{server}"
{tls_toml}[log]
level = "warning"
[[topics]]
name = "t"
home = "bench"
partitions = {partitions}
"""
        )
        exe = Path(sys.executable).parent / "edgegw"
        cmd = (
            [str(exe)]
            if exe.exists()
            else [sys.executable, "-m", "edgegw_cli"]  # the CLI package, if installed
        )
        self.proc = subprocess.Popen(
            [*cmd, "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        addr_file = self.data_dir / "api.addr"
        deadline = time.monotonic() + 60
        while not addr_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("edgegw serve did not start:\n" + "".join(self.stderr[-30:]))
            time.sleep(0.05)
        addr = addr_file.read_text().strip().removeprefix("https://")
        host, _, port = addr.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class RawHttp:
    """The thinnest keep-alive HTTP/1.1 client: one ``sendall`` per request, parse
    the status line and Content-Length, read the body. It measures the gateway,
    not the client library (``http.client`` parses headers with ``email``, which
    costs more CPU here than the gateway's whole request path)."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection((host, port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock if tls is None else tls.wrap_socket(sock, server_hostname=host)
        self.host = f"{host}:{port}".encode()
        self.buf = b""

    def post(self, path: str, body: bytes, ctype: str) -> bytes:
        self.sock.sendall(
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
            % (path.encode(), self.host, ctype.encode(), len(body))
            + body
        )
        buf = self.buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            buf += self._recv()
        head, rest = buf[:end], buf[end + 4 :]
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += self._recv()
        self.buf = rest[length:]
        if status != 200:
            raise SystemExit(f"POST {path}: {status} {rest[:300]!r}")
        return rest[:length]

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise SystemExit("the gateway closed the connection")
        return data

    def close(self) -> None:
        self.sock.close()


def connect(gw: GatewayProcess) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection(gw.host, gw.port, timeout=30)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def post(conn: http.client.HTTPConnection, path: str, body: bytes, ctype: str) -> bytes:
    conn.request("POST", path, body, {"content-type": ctype})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise SystemExit(f"POST {path}: {resp.status} {data[:300]!r}")
    return data


def gw_single(gw: GatewayProcess, values: list[bytes], warmup: int) -> list[float]:
    """Latencies of one request per record with the raw client (:class:`RawHttp`)."""
    bodies = [b'{"records":[{"value":' + json.dumps(v.decode()).encode() + b"}]}" for v in values]
    path = "/v1/topics/t/records"
    raw = RawHttp(gw.host, gw.port)

    def send(i: int) -> None:
        raw.post(path, bodies[i], "application/json")

    try:
        return _timed(send, len(values), warmup)
    finally:
        raw.close()


def gw_single_pair(
    plain: GatewayProcess,
    tls: GatewayProcess,
    ctx: ssl.SSLContext | None,
    values: list[bytes],
    warmup: int,
) -> tuple[list[float], list[float]]:
    """Latencies of the raw client over plain HTTP and over TLS, one request of
    each in turn (two gateways side by side), so that both see the same load."""
    bodies = [b'{"records":[{"value":' + json.dumps(v.decode()).encode() + b"}]}" for v in values]
    path = "/v1/topics/t/records"
    a, b = RawHttp(plain.host, plain.port), RawHttp(tls.host, tls.port, ctx)
    lat_plain: list[float] = []
    lat_tls: list[float] = []
    try:
        for i, body in enumerate(bodies):
            t0 = time.perf_counter()
            a.post(path, body, "application/json")
            t1 = time.perf_counter()
            b.post(path, body, "application/json")
            t2 = time.perf_counter()
            if i >= warmup:
                lat_plain.append(t1 - t0)
                lat_tls.append(t2 - t1)
    finally:
        a.close()
        b.close()
    return lat_plain, lat_tls


def gw_clients_interleaved(
    gw: GatewayProcess, values: list[bytes], warmup: int
) -> tuple[list[float], list[float]]:
    """Latencies of ``http.client`` and of ``edge_gateway.client.Client``, one request
    of each in turn on their own keep-alive connections, so that both see the same
    load of the machine (run one after the other, a busy machine's swings made
    their ratio anything from 1.1 to 2)."""
    from edge_gateway.client import Client

    bodies = [b'{"records":[{"value":' + json.dumps(v.decode()).encode() + b"}]}" for v in values]
    path = "/v1/topics/t/records"
    conn = connect(gw)
    lat_http: list[float] = []
    lat_edgegw: list[float] = []
    try:
        with Client(f"http://{gw.host}:{gw.port}") as c:
            for i, (body, value) in enumerate(zip(bodies, values, strict=True)):
                t0 = time.perf_counter()
                post(conn, path, body, "application/json")
                t1 = time.perf_counter()
                c.produce("t", value)
                t2 = time.perf_counter()
                if i >= warmup:
                    lat_http.append(t1 - t0)
                    lat_edgegw.append(t2 - t1)
    finally:
        conn.close()
    return lat_http, lat_edgegw


def _timed(send: Any, n: int, warmup: int) -> list[float]:
    for i in range(warmup):
        send(i)
    lat = []
    for i in range(warmup, n):
        t0 = time.perf_counter()
        send(i)
        lat.append(time.perf_counter() - t0)
    return lat


def gw_batched(gw: GatewayProcess, values: list[bytes], seconds: float, binary: bool) -> float:
    """Records/s for batches of BATCH values, encoding included, one connection."""
    conn = connect(gw)
    batches = [values[i : i + BATCH] for i in range(0, len(values) - BATCH + 1, BATCH)]
    texts = [[v.decode() for v in b] for b in batches]

    def send(i: int) -> None:
        if binary:
            body = encode_batch(batches[i % len(batches)], timestamps=time.time_ns() // 1_000_000)
            post(conn, "/v1/topics/t/partitions/0/batches", body, BATCH_MEDIA_TYPE)
        else:
            body = json.dumps(
                {"records": [{"value": v} for v in texts[i % len(texts)]]}, separators=(",", ":")
            ).encode()
            post(conn, "/v1/topics/t/records", body, "application/json")

    for i in range(3):  # warm up
        send(i)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        send(n)
        n += 1
    elapsed = time.perf_counter() - t0
    conn.close()
    return n * BATCH / elapsed


CONNECTIONS = 64
LOAD_SCRIPT = Path(__file__).resolve().parent / "_load.py"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gw_capacity(
    gw: GatewayProcess, seconds: float, ca_file: Path | None = None
) -> dict[str, float]:
    """Closed-loop load from CONNECTIONS keep-alive connections (``bench/_load.py``)."""
    body = '{"records":[{"value":' + json.dumps("x" * (RECORD - 2)) + "}]}"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(LOAD_SCRIPT),
            gw.host,
            str(gw.port),
            "--connections",
            str(CONNECTIONS),
            "--seconds",
            str(seconds),
            "--body",
            body,
            *(("--ca-file", str(ca_file)) if ca_file is not None else ()),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    cpu0 = cpu1 = 0.0
    result: dict[str, Any] = {}
    for line in proc.stdout:
        if line.strip() == "measuring":
            cpu0 = cpu_seconds(gw.proc.pid)
        elif line.strip() == "done":
            cpu1 = cpu_seconds(gw.proc.pid)
        elif line.startswith("{"):
            result = json.loads(line)
    if proc.wait() != 0 or not result:
        raise SystemExit("the load generator failed")
    n = result["requests"]
    if result["errors"]:
        raise SystemExit(f"{result['errors']} of {n} requests failed: {result['statuses']}")
    return {
        "requests_per_s": n / result["seconds"],
        "p50_ms": result["p50_s"] * 1e3,
        "p99_ms": result["p99_s"] * 1e3,
        "cpu_us_per_request": (cpu1 - cpu0) / n * 1e6 if n else float("nan"),
    }


# --------------------------------------------------------------------- NATS


@contextlib.contextmanager
def nats_server(root: Path) -> Iterator[tuple[str, int] | None]:
    exe = shutil.which("nats-server")
    if exe is None:
        progress("nats-server not found: NATS figures left null (apt-get install -y nats-server)")
        yield None
        return
    port, monitor = free_port(), free_port()
    store = root / "nats"
    store.mkdir()
    proc = subprocess.Popen(
        [exe, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("nats-server did not start") from None
                time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def nats_bench(
    url: str, pid: int, values: list[bytes], warmup: int, seconds: float, capacity_s: float
) -> tuple[list[float], float, dict[str, float]] | None:
    try:
        import nats
        from nats.js.api import StorageType, StreamConfig
    except ImportError:
        progress("nats-py not installed (pip install -e '.[bench]'): NATS figures left null")
        return None

    async def capacity() -> dict[str, float]:
        conns = [await nats.connect(url) for _ in range(CONNECTIONS)]
        lat: list[float] = []
        start = time.perf_counter()
        measure_from = start + 1.0
        stop_at = measure_from + capacity_s
        cpu: list[float] = []

        async def publisher(nc: Any) -> None:
            js = nc.jetstream()
            value = values[0]
            while (t0 := time.perf_counter()) < stop_at:
                await js.publish("bench.t", value)
                t1 = time.perf_counter()
                if t0 >= measure_from and t1 < stop_at:
                    lat.append(t1 - t0)

        async def sample_cpu() -> None:
            await asyncio.sleep(measure_from - time.perf_counter())
            cpu.append(cpu_seconds(pid))
            await asyncio.sleep(stop_at - time.perf_counter())
            cpu.append(cpu_seconds(pid))

        try:
            await asyncio.gather(sample_cpu(), *(publisher(nc) for nc in conns))
        finally:
            for nc in conns:
                await nc.close()
        return {
            "requests_per_s": len(lat) / capacity_s,
            "p50_ms": percentile(lat, 50) * 1e3,
            "p99_ms": percentile(lat, 99) * 1e3,
            "cpu_us_per_request": (cpu[1] - cpu[0]) / len(lat) * 1e6 if lat else float("nan"),
        }

    async def run() -> tuple[list[float], float, dict[str, float]]:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            await js.add_stream(
                StreamConfig(name="BENCH", subjects=["bench.>"], storage=StorageType.FILE)
            )
            for v in values[:warmup]:
                await js.publish("bench.t", v)
            lat = []
            for v in values[warmup:]:
                t0 = time.perf_counter()
                await js.publish("bench.t", v)
                lat.append(time.perf_counter() - t0)
            # A window of outstanding acks (publish_async_max_pending, 4000):
            # publish_async waits only when the window is full.
            n = 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                for i in range(BATCH):
                    await js.publish_async("bench.t", values[i])
                n += 1
            await js.publish_async_completed()
            rate = n * BATCH / (time.perf_counter() - t0)
        finally:
            await nc.close()
        return lat, rate, await capacity()

    return asyncio.run(run())


# ---------------------------------------------------------------------- TLS

TLS_KEYS = (
    "tls_produce_p50_us",
    "tls_produce_p99_us",
    "tls_plain_p50_us",
    "tls_plain_p99_us",
    "tls_concurrent_requests_per_s",
    "tls_concurrent_p50_ms",
    "tls_concurrent_p99_ms",
    "tls_concurrent_cpu_us_per_request",
    "tls_p50_ratio_vs_plain",
    "tls_capacity_ratio_vs_plain",
    "tls_cpu_ratio_vs_plain",
)


def tls_figures(
    root: Path,
    plain: GatewayProcess,
    args: argparse.Namespace,
    values: list[bytes],
    warmup: int,
    plain_cap: dict[str, float],
    capacity_s: float,
) -> dict[str, Any]:
    """The TLS figures (null when skipped): see the module docstring, ``tls``."""
    out: dict[str, Any] = dict.fromkeys(TLS_KEYS)
    if args.no_tls:
        return out
    try:
        from edge_gateway.testing.tls import make_tls_files
    except ImportError:  # pragma: no cover - the bench extra has it
        progress("cryptography not installed (pip install -e '.[bench]'): TLS figures left null")
        return out
    try:
        files = make_tls_files(root / "certs", names=("127.0.0.1",), client=False)
    except ImportError:
        progress("cryptography not installed (pip install -e '.[bench]'): TLS figures left null")
        return out
    progress("starting a second gateway serving TLS ...")
    tls = GatewayProcess(root, args.server, name="gw-tls", tls=(files.cert, files.key))
    try:
        ctx = ssl.create_default_context(cafile=str(files.ca))
        progress(f"single-record latency, plain and TLS in turn ({len(values) - warmup} each) ...")
        lat_plain, lat_tls = gw_single_pair(plain, tls, ctx, values, warmup)
        out["tls_plain_p50_us"] = percentile(lat_plain, 50) * 1e6
        out["tls_plain_p99_us"] = percentile(lat_plain, 99) * 1e6
        out["tls_produce_p50_us"] = percentile(lat_tls, 50) * 1e6
        out["tls_produce_p99_us"] = percentile(lat_tls, 99) * 1e6
        progress(f"capacity over TLS: {CONNECTIONS} connections ...")
        cap = gw_capacity(tls, capacity_s, files.ca)
        for key in ("requests_per_s", "p50_ms", "p99_ms", "cpu_us_per_request"):
            out[f"tls_concurrent_{key}"] = cap[key]
    finally:
        tls.stop()
    out["tls_p50_ratio_vs_plain"] = ratio(out["tls_produce_p50_us"], out["tls_plain_p50_us"])
    out["tls_capacity_ratio_vs_plain"] = ratio(
        out["tls_concurrent_requests_per_s"], plain_cap["requests_per_s"]
    )
    out["tls_cpu_ratio_vs_plain"] = ratio(
        out["tls_concurrent_cpu_us_per_request"], plain_cap["cpu_us_per_request"]
    )
    return out


AT_REST_KEYS = (
    "at_rest_p50_us",
    "at_rest_p99_us",
    "at_rest_off_p50_us",
    "at_rest_off_p99_us",
    "at_rest_concurrent_requests_per_s",
    "at_rest_off_concurrent_requests_per_s",
    "at_rest_concurrent_p99_ms",
    "at_rest_off_concurrent_p99_ms",
    "at_rest_pending_segments_before",
    "at_rest_pending_segments_after",
    "at_rest_rewritten_segments",
    "at_rest_child_max_rss_bytes",
    "at_rest_gateway_rss_mb",
    "at_rest_off_gateway_rss_mb",
)
#: Rounds of the at-rest pair: the latency run is cut into this many parts and the
#: capacity runs this many times on each (alternating which goes first); a ratio is
#: the median of the rounds' ratios, reported with its spread.
AT_REST_ROUNDS = 5
#: Partitions of the at-rest pair's topic: a JSON request of one record per partition
#: writes that many single-record entries (the slowest entries to rewrite).
AT_REST_PARTITIONS = 64


def _at_rest_status(gw: GatewayProcess) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        urllib.request.urlopen(f"http://{gw.host}:{gw.port}/v1/status", timeout=30).read()
    )
    at_rest: dict[str, Any] = doc["journal"]["at_rest"]
    return at_rest


def _fill_single_entries(gw: GatewayProcess, values: list[bytes], seconds: float) -> int:
    """JSON requests of one record per partition (single-record entries) for ``seconds``."""
    conn = connect(gw)
    texts = [v.decode() for v in values]
    n = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            body = json.dumps(
                {
                    "records": [
                        {"value": texts[(n + p) % len(texts)], "partition": p}
                        for p in range(AT_REST_PARTITIONS)
                    ]
                }
            )
            conn.request("POST", "/v1/topics/t/records", body, {"content-type": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise SystemExit(f"produce: {r.status}")
            n += AT_REST_PARTITIONS
    finally:
        conn.close()
    return n


def at_rest_figures(
    root: Path, args: argparse.Namespace, values: list[bytes], warmup: int, fill_s: float,
    capacity_s: float,
) -> dict[str, Any]:  # fmt: skip
    """Produce with ``journal.at_rest`` on and off, two gateways side by side (same run).

    Both get 4 MiB segments and a backlog of single-record entries first, so
    the compressed one's rewriter has sealed segments to rewrite while the
    latency (one request of each in turn, the order swapped every request)
    and the capacity (``AT_REST_ROUNDS`` runs of each, alternating which goes
    first) are measured; its pending segments before and after say so. Each
    ratio to off (``at_rest_{p50,p99,capacity}_ratio_vs_off``) is the median
    of the rounds' ratios (the latency run cut into ``AT_REST_ROUNDS``
    parts), with its spread (``_min``, ``_max``, ``_runs``): on a shared
    machine one run's p99 ratio moved between 0.48 and 0.99.
    """
    out: dict[str, Any] = dict.fromkeys(AT_REST_KEYS)
    progress("starting two gateways, journal.at_rest compressed and off (4 MiB segments) ...")
    on = GatewayProcess(
        root,
        args.server,
        name="gw-at-rest",
        journal='segment_bytes = "4MiB"\nat_rest = "compressed"',
        partitions=AT_REST_PARTITIONS,
    )
    try:
        off = GatewayProcess(
            root,
            args.server,
            name="gw-at-rest-off",
            journal='segment_bytes = "4MiB"\nat_rest = "off"',
            partitions=AT_REST_PARTITIONS,
        )
        try:
            progress(f"a backlog of single-record entries in each ({fill_s:g} s each) ...")
            _fill_single_entries(off, values, fill_s)
            _fill_single_entries(on, values, fill_s)
            out["at_rest_pending_segments_before"] = _at_rest_status(on)["pending_segments"]
            progress(
                f"single-record latency, at_rest on and off in turn ({len(values) - warmup}), "
                f"{AT_REST_ROUNDS} rounds ..."
            )
            lat_on, lat_off = _pair_alternating(on, off, values, warmup)
            out["at_rest_p50_us"] = percentile(lat_on, 50) * 1e6
            out["at_rest_p99_us"] = percentile(lat_on, 99) * 1e6
            out["at_rest_off_p50_us"] = percentile(lat_off, 50) * 1e6
            out["at_rest_off_p99_us"] = percentile(lat_off, 99) * 1e6
            # each round: its share of the requests, p50 and p99 of each gateway, their ratio
            n = len(lat_on) // AT_REST_ROUNDS
            for q in (50, 99):
                out[f"at_rest_p{q}_ratio_runs"] = [
                    percentile(lat_on[k * n : (k + 1) * n], q)
                    / percentile(lat_off[k * n : (k + 1) * n], q)
                    for k in range(AT_REST_ROUNDS)
                ]
            progress(
                f"capacity, at_rest on and off alternating: {AT_REST_ROUNDS} rounds of "
                f"{capacity_s:g} s each, {CONNECTIONS} connections ..."
            )
            caps: list[tuple[dict[str, float], dict[str, float]]] = []
            for k in range(AT_REST_ROUNDS):
                # A B, B A, A B, ...: neither always runs first
                if k % 2 == 0:
                    c_on = gw_capacity(on, capacity_s)
                    c_off = gw_capacity(off, capacity_s)
                else:
                    c_off = gw_capacity(off, capacity_s)
                    c_on = gw_capacity(on, capacity_s)
                caps.append((c_on, c_off))
            status = _at_rest_status(on)
            out["at_rest_pending_segments_after"] = status["pending_segments"]
            out["at_rest_rewritten_segments"] = status["rewritten_segments"]
            # the rewrite's child process (absent from a gateway that rewrites on a thread)
            out["at_rest_child_max_rss_bytes"] = status.get("child_max_rss_bytes")
            out["at_rest_gateway_rss_mb"] = on.rss_mb()
            out["at_rest_off_gateway_rss_mb"] = off.rss_mb()
            out["at_rest_capacity_ratio_runs"] = [
                a["requests_per_s"] / b["requests_per_s"] for a, b in caps
            ]
            out["at_rest_concurrent_requests_per_s"] = statistics.median(
                a["requests_per_s"] for a, _ in caps
            )
            out["at_rest_off_concurrent_requests_per_s"] = statistics.median(
                b["requests_per_s"] for _, b in caps
            )
            out["at_rest_concurrent_p99_ms"] = statistics.median(a["p99_ms"] for a, _ in caps)
            out["at_rest_off_concurrent_p99_ms"] = statistics.median(b["p99_ms"] for _, b in caps)
        finally:
            off.stop()
    finally:
        on.stop()
    # the medians of the rounds' ratios, with their spread
    for name in ("p50", "p99", "capacity"):
        runs = out[f"at_rest_{name}_ratio_runs"]
        out[f"at_rest_{name}_ratio_vs_off"] = statistics.median(runs)
        out[f"at_rest_{name}_ratio_min"] = min(runs)
        out[f"at_rest_{name}_ratio_max"] = max(runs)
    return out


def _pair_alternating(
    a: GatewayProcess, b: GatewayProcess, values: list[bytes], warmup: int
) -> tuple[list[float], list[float]]:
    """Latencies of one single-record request to each gateway in turn, the order swapped
    on every request (neither always goes first, so neither always follows the other's
    work), with the raw client."""
    bodies = [b'{"records":[{"value":' + json.dumps(v.decode()).encode() + b"}]}" for v in values]
    path = "/v1/topics/t/records"
    ra, rb = RawHttp(a.host, a.port), RawHttp(b.host, b.port)
    lat_a: list[float] = []
    lat_b: list[float] = []
    try:
        for i, body in enumerate(bodies):
            first, second = (ra, rb) if i % 2 == 0 else (rb, ra)
            t0 = time.perf_counter()
            first.post(path, body, "application/json")
            t1 = time.perf_counter()
            second.post(path, body, "application/json")
            t2 = time.perf_counter()
            if i >= warmup:
                la, lb = (t1 - t0, t2 - t1) if i % 2 == 0 else (t2 - t1, t1 - t0)
                lat_a.append(la)
                lat_b.append(lb)
    finally:
        ra.close()
        rb.close()
    return lat_a, lat_b


# --------------------------------------------------------------------- main


def _at_rest_rows(figures: dict[str, Any]) -> list[Row | str]:
    pr, cr = figures["at_rest_p50_ratio_vs_off"], figures["at_rest_capacity_ratio_vs_off"]
    return [
        "journal.at_rest: compressed (the rewriter running) vs off, two gateways, same run "
        f"(rewriter: {figures['at_rest_pending_segments_before']} segments pending before, "
        f"{figures['at_rest_pending_segments_after']} after the capacity run)",
        Row(
            "single-record p50, compressed",
            figures["at_rest_p50_us"],
            "us",
            "at_rest off, in turn",
            figures["at_rest_off_p50_us"],
            "within 10%",
            None if pr is None else abs(pr - 1) <= 0.1,
        ),
        Row(
            "single-record p99, compressed",
            figures["at_rest_p99_us"],
            "us",
            "at_rest off",
            figures["at_rest_off_p99_us"],
        ),
        Row(
            "capacity, compressed",
            figures["at_rest_concurrent_requests_per_s"],
            "req/s",
            "at_rest off",
            figures["at_rest_off_concurrent_requests_per_s"],
            "within 10%",
            None if cr is None else abs(cr - 1) <= 0.1,
        ),
        "ratios to at_rest off over "
        + f"{AT_REST_ROUNDS} rounds (median, spread): "
        + ", ".join(
            f"{name} {figures[f'at_rest_{name}_ratio_vs_off']:.2f}x "
            f"({figures[f'at_rest_{name}_ratio_min']:.2f}-"
            f"{figures[f'at_rest_{name}_ratio_max']:.2f})"
            for name in ("p50", "p99", "capacity")
        ),
        _memory_line(figures),
    ]


def _memory_line(figures: dict[str, Any]) -> str:
    child = figures.get("at_rest_child_max_rss_bytes")
    on, off = figures.get("at_rest_gateway_rss_mb"), figures.get("at_rest_off_gateway_rss_mb")
    parts = [
        f"gateway RSS {on:.0f} MB (at_rest off: {off:.0f} MB)"
        if on is not None and off is not None
        else "gateway RSS -"
    ]
    parts.append(
        f"the rewrite's child process peak {child / 2**20:.0f} MiB (only while it runs)"
        if child
        else "no rewrite child (a gateway that rewrites on a thread, or none ran)"
    )
    return "memory: " + "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs (under ~45 s)")
    ap.add_argument("--dir", type=Path, default=None, help="scratch parent directory")
    ap.add_argument(
        "--server",
        choices=("hypercorn", "builtin"),
        default="builtin",
        help="api.server of the gateway under test",
    )
    ap.add_argument("--no-tls", action="store_true", help="skip the TLS figures")
    ap.add_argument(
        "--at-rest-only",
        action="store_true",
        help="only the journal.at_rest on/off comparison (no NATS, no TLS)",
    )
    ap.add_argument(
        "--no-at-rest",
        action="store_true",
        help="skip the journal.at_rest on/off comparison (code before it has no such key: "
        "--baseline-commit runs of older code need this flag)",
    )
    add_baseline_args(ap)
    args = ap.parse_args()
    if args.baseline_commit:
        passed = without_baseline_args(sys.argv[1:])
        run_baseline_ab(Path(__file__).resolve(), passed, args.baseline_commit, args.rounds)
        return
    single_n, warmup, seconds = (3000, 500, 3.0) if args.quick else (20000, 2000, 10.0)
    capacity_s = 5.0 if args.quick else 20.0
    values = fixed_size_values(max(single_n + warmup, 20 * BATCH), RECORD)
    figures: dict[str, Any] = {"quick": args.quick, "server": args.server}

    with scratch_dir("produce-", args.dir) as root:
        figures["machine"] = machine_info(root)
        if not args.no_at_rest:
            figures.update(
                at_rest_figures(
                    root, args, values[: single_n + warmup], warmup, seconds, capacity_s
                )
            )
        if args.at_rest_only:
            print(
                render_table(
                    "edgegw produce, journal.at_rest compressed vs off", _at_rest_rows(figures)
                )
            )
            emit_json(figures)
            return
        progress(f"starting edgegw serve (api.server = {args.server}) ...")
        gw = GatewayProcess(root, args.server)
        try:
            time.sleep(1.0)
            figures["idle_rss_mb"] = gw.rss_mb()
            progress(f"gateway on {gw.host}:{gw.port}, idle RSS {figures['idle_rss_mb']:.1f} MB")
            progress(f"single-record produce latency, raw client ({single_n} requests) ...")
            lat = gw_single(gw, values[: single_n + warmup], warmup)
            figures["produce_p50_us"] = percentile(lat, 50) * 1e6
            figures["produce_p99_us"] = percentile(lat, 99) * 1e6
            progress(
                f"single-record produce latency, http.client and edgegw Client "
                f"interleaved ({single_n} requests each) ..."
            )
            pair = gw_clients_interleaved(gw, values[: single_n + warmup], warmup)
            for suffix, lat in zip(("_http_client", "_edgegw_client"), pair, strict=True):
                figures[f"produce_p50_us{suffix}"] = percentile(lat, 50) * 1e6
                figures[f"produce_p99_us{suffix}"] = percentile(lat, 99) * 1e6
            progress("batched produce, binary route ...")
            figures["batched_records_per_s"] = gw_batched(gw, values, seconds, binary=True)
            progress("batched produce, JSON route ...")
            figures["batched_json_records_per_s"] = gw_batched(gw, values, seconds, binary=False)
            progress(
                f"capacity: {CONNECTIONS} connections, single-record requests, {capacity_s:g} s ..."
            )
            cap = gw_capacity(gw, capacity_s)
            for key, value in cap.items():
                figures[f"concurrent_{key}"] = value
            figures["loaded_rss_mb"] = gw.rss_mb()
            figures.update(
                tls_figures(root, gw, args, values[: single_n + warmup], warmup, cap, capacity_s)
            )
        finally:
            gw.stop()
        figures["gateway_exit_code"] = gw.proc.returncode

        figures.update(nats_p50_us=None, nats_p99_us=None, nats_batched_records_per_s=None)
        for key in cap:
            figures[f"nats_concurrent_{key}"] = None
        with nats_server(root) as server:
            if server is not None:
                url, pid = server
                progress(f"NATS JetStream on {url}: latency, throughput, capacity ...")
                got = nats_bench(url, pid, values[: single_n + warmup], warmup, seconds, capacity_s)
                if got is not None:
                    nlat, nrate, ncap = got
                    figures["nats_p50_us"] = percentile(nlat, 50) * 1e6
                    figures["nats_p99_us"] = percentile(nlat, 99) * 1e6
                    figures["nats_batched_records_per_s"] = nrate
                    for key, value in ncap.items():
                        figures[f"nats_concurrent_{key}"] = value

    figures["batched_ratio_vs_nats"] = ratio(
        figures["batched_records_per_s"], figures["nats_batched_records_per_s"]
    )
    figures["batched_json_ratio_vs_nats"] = ratio(
        figures["batched_json_records_per_s"], figures["nats_batched_records_per_s"]
    )
    figures["p50_ratio_vs_nats"] = ratio(figures["produce_p50_us"], figures["nats_p50_us"])
    figures["client_p50_ratio_vs_raw"] = ratio(
        figures["produce_p50_us_edgegw_client"], figures["produce_p50_us_http_client"]
    )
    figures["concurrent_ratio_vs_nats"] = ratio(
        figures["concurrent_requests_per_s"], figures["nats_concurrent_requests_per_s"]
    )

    def ok(value: float | None, good: bool) -> bool | None:
        return None if value is None else good

    tls_rows: list[Row | str] = [
        "TLS on the local API (a second gateway with api.tls_cert, same run)",
        Row(
            "p50, raw client over TLS",
            figures["tls_produce_p50_us"],
            "us",
            "plain HTTP, in turn",
            figures["tls_plain_p50_us"],
        ),
        Row(
            "p99, raw client over TLS",
            figures["tls_produce_p99_us"],
            "us",
            "plain HTTP, in turn",
            figures["tls_plain_p99_us"],
        ),
        Row(
            "capacity over TLS",
            figures["tls_concurrent_requests_per_s"],
            "req/s",
            "plain HTTP capacity",
            figures["concurrent_requests_per_s"],
        ),
        Row(
            "server CPU per request, TLS",
            figures["tls_concurrent_cpu_us_per_request"],
            "us",
            "plain HTTP",
            figures["concurrent_cpu_us_per_request"],
        ),
    ]

    br, pr = figures["batched_ratio_vs_nats"], figures["p50_ratio_vs_nats"]
    cr = figures["client_p50_ratio_vs_raw"]
    rows: list[Row | str] = [
        "single-record produce, one request per record, keep-alive (raw HTTP/1.1 client)",
        Row(
            "p50 latency",
            figures["produce_p50_us"],
            "us",
            "NATS js.publish p50",
            figures["nats_p50_us"],
            "<= 2x NATS",
            ok(pr, pr is not None and pr <= 2.0),
        ),
        Row("p99 latency", figures["produce_p99_us"], "us", "NATS p99", figures["nats_p99_us"]),
        Row(
            "p50, http.client",
            figures["produce_p50_us_http_client"],
            "us",
            "NATS js.publish p50",
            figures["nats_p50_us"],
        ),
        Row(
            "p50, edgegw Client",
            figures["produce_p50_us_edgegw_client"],
            "us",
            "http.client p50",
            figures["produce_p50_us_http_client"],
            "<= 1.2x http.client",
            ok(cr, cr is not None and cr <= 1.2),
        ),
        f"batched produce, {BATCH} x {RECORD}-byte records per request, one connection",
        Row(
            "binary batch route",
            figures["batched_records_per_s"],
            "rec/s",
            "NATS publish_async",
            figures["nats_batched_records_per_s"],
            ">= 3x NATS",
            ok(br, br is not None and br >= 3.0),
        ),
        Row(
            "JSON route",
            figures["batched_json_records_per_s"],
            "rec/s",
            "NATS publish_async",
            figures["nats_batched_records_per_s"],
        ),
        f"capacity: {CONNECTIONS} keep-alive connections, one single-record request in "
        "flight each, as fast as acks return",
        Row(
            "requests/s",
            figures["concurrent_requests_per_s"],
            "req/s",
            "NATS, 64 sync publishers",
            figures["nats_concurrent_requests_per_s"],
            ">= 5000",
            figures["concurrent_requests_per_s"] >= 5000,
        ),
        Row(
            "p50 latency",
            figures["concurrent_p50_ms"],
            "ms",
            "NATS p50",
            figures["nats_concurrent_p50_ms"],
        ),
        Row(
            "p99 latency",
            figures["concurrent_p99_ms"],
            "ms",
            "NATS p99",
            figures["nats_concurrent_p99_ms"],
            "<= 20 ms",
            figures["concurrent_p99_ms"] <= 20,
        ),
        Row(
            "server CPU per request",
            figures["concurrent_cpu_us_per_request"],
            "us",
            "nats-server CPU/msg",
            figures["nats_concurrent_cpu_us_per_request"],
        ),
        "memory",
        Row(
            "idle RSS",
            figures["idle_rss_mb"],
            "MB",
            target="<= 80 MB",
            ok=figures["idle_rss_mb"] <= 80,
        ),
        Row("RSS after the runs", figures["loaded_rss_mb"], "MB"),
        *tls_rows,
        *([] if args.no_at_rest else _at_rest_rows(figures)),
    ]
    print(render_table("edgegw local API produce vs NATS JetStream", rows))
    emit_json(figures)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
