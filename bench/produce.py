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
              ``edge_gateway.client.Client`` (httpx) are reported next to it,
              since with them the client's own CPU is much of the latency;
* ``batched`` throughput with batches of 1000 100-byte records, through the
              binary batch route (``application/vnd.edgegw.batch``, encoded by
              the client in the timed loop) and through the JSON route;
* ``idle``    the gateway's resident memory (RSS) once started and idle.

Next to it, the same on NATS JetStream when ``nats-server`` is installed
(started by the bench on 127.0.0.1 with ``-js`` and a file-backed stream in
a scratch directory), driven with nats-py: synchronous ``js.publish``
latency and ``publish_async`` throughput in batches of 1000. Without
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
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import (
    Row,
    emit_json,
    fixed_size_values,
    machine_info,
    percentile,
    progress,
    ratio,
    render_table,
    scratch_dir,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edge_gateway.format.batch import encode_batch

BATCH = 1000
RECORD = 100
BATCH_MEDIA_TYPE = "application/vnd.edgegw.batch"


# ------------------------------------------------------------------ gateway


class GatewayProcess:
    """``edgegw serve`` in a child process; stderr drained in a thread."""

    def __init__(self, root: Path, server: str) -> None:
        self.data_dir = root / "gw"
        config = root / "edgegw.toml"
        config.write_text(
            f"""
region = "bench"
data_dir = "{self.data_dir}"
shutdown_grace_s = 10.0
[journal]
fsync = "interval"
[api]
listen = "127.0.0.1:0"
server = "{server}"
[log]
level = "warning"
[[topics]]
name = "t"
home = "bench"
partitions = 1
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
        host, _, port = addr_file.read_text().strip().rpartition(":")
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

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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


def gw_single(gw: GatewayProcess, values: list[bytes], warmup: int, client: str) -> list[float]:
    """Latencies of one request per record with ``client``: raw, http.client or edgegw."""
    bodies = [b'{"records":[{"value":' + json.dumps(v.decode()).encode() + b"}]}" for v in values]
    path = "/v1/topics/t/records"
    if client == "edgegw":
        from edge_gateway.client import Client

        with Client(f"http://{gw.host}:{gw.port}") as c:

            def send(i: int) -> None:
                c.produce("t", values[i])

            return _timed(send, len(values), warmup)
    if client == "raw":
        raw = RawHttp(gw.host, gw.port)

        def send(i: int) -> None:
            raw.post(path, bodies[i], "application/json")

        try:
            return _timed(send, len(values), warmup)
        finally:
            raw.close()
    conn = connect(gw)

    def send(i: int) -> None:
        post(conn, path, bodies[i], "application/json")

    try:
        return _timed(send, len(values), warmup)
    finally:
        conn.close()


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


# --------------------------------------------------------------------- NATS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def nats_server(root: Path) -> Iterator[str | None]:
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
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def nats_bench(
    url: str, values: list[bytes], warmup: int, seconds: float
) -> tuple[list[float], float] | None:
    try:
        import nats
        from nats.js.api import StorageType, StreamConfig
    except ImportError:
        progress("nats-py not installed (pip install -e '.[bench]'): NATS figures left null")
        return None

    async def run() -> tuple[list[float], float]:
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
            n = 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                for i in range(BATCH):
                    await js.publish_async("bench.t", values[i])
                await js.publish_async_completed()
                n += 1
            rate = n * BATCH / (time.perf_counter() - t0)
            return lat, rate
        finally:
            await nc.close()

    return asyncio.run(run())


# --------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs (under ~45 s)")
    ap.add_argument("--dir", type=Path, default=None, help="scratch parent directory")
    ap.add_argument(
        "--server",
        choices=("hypercorn", "builtin"),
        default="hypercorn",
        help="api.server of the gateway under test (default: the config default, hypercorn)",
    )
    args = ap.parse_args()
    single_n, warmup, seconds = (3000, 500, 3.0) if args.quick else (20000, 2000, 10.0)
    values = fixed_size_values(max(single_n + warmup, 20 * BATCH), RECORD)
    figures: dict[str, Any] = {"quick": args.quick, "server": args.server}

    with scratch_dir("produce-", args.dir) as root:
        figures["machine"] = machine_info(root)
        progress(f"starting edgegw serve (api.server = {args.server}) ...")
        gw = GatewayProcess(root, args.server)
        try:
            time.sleep(1.0)
            figures["idle_rss_mb"] = gw.rss_mb()
            progress(f"gateway on {gw.host}:{gw.port}, idle RSS {figures['idle_rss_mb']:.1f} MB")
            for client, suffix in (
                ("raw", ""),
                ("http.client", "_http_client"),
                ("edgegw", "_edgegw_client"),
            ):
                progress(
                    f"single-record produce latency, {client} client ({single_n} requests) ..."
                )
                lat = gw_single(gw, values[: single_n + warmup], warmup, client)
                figures[f"produce_p50_us{suffix}"] = percentile(lat, 50) * 1e6
                figures[f"produce_p99_us{suffix}"] = percentile(lat, 99) * 1e6
            progress("batched produce, binary route ...")
            figures["batched_records_per_s"] = gw_batched(gw, values, seconds, binary=True)
            progress("batched produce, JSON route ...")
            figures["batched_json_records_per_s"] = gw_batched(gw, values, seconds, binary=False)
            figures["loaded_rss_mb"] = gw.rss_mb()
        finally:
            gw.stop()
        figures["gateway_exit_code"] = gw.proc.returncode

        figures.update(nats_p50_us=None, nats_p99_us=None, nats_batched_records_per_s=None)
        with nats_server(root) as url:
            if url is not None:
                progress(f"NATS JetStream on {url}: latency and publish_async throughput ...")
                got = nats_bench(url, values[: single_n + warmup], warmup, seconds)
                if got is not None:
                    nlat, nrate = got
                    figures["nats_p50_us"] = percentile(nlat, 50) * 1e6
                    figures["nats_p99_us"] = percentile(nlat, 99) * 1e6
                    figures["nats_batched_records_per_s"] = nrate

    figures["batched_ratio_vs_nats"] = ratio(
        figures["batched_records_per_s"], figures["nats_batched_records_per_s"]
    )
    figures["batched_json_ratio_vs_nats"] = ratio(
        figures["batched_json_records_per_s"], figures["nats_batched_records_per_s"]
    )
    figures["p50_ratio_vs_nats"] = ratio(figures["produce_p50_us"], figures["nats_p50_us"])

    def ok(value: float | None, good: bool) -> bool | None:
        return None if value is None else good

    br, pr = figures["batched_ratio_vs_nats"], figures["p50_ratio_vs_nats"]
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
            "NATS js.publish p50",
            figures["nats_p50_us"],
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
        "memory",
        Row(
            "idle RSS",
            figures["idle_rss_mb"],
            "MB",
            target="<= 80 MB",
            ok=figures["idle_rss_mb"] <= 80,
        ),
        Row("RSS after the runs", figures["loaded_rss_mb"], "MB"),
    ]
    print(render_table("edgegw local API produce vs NATS JetStream", rows))
    emit_json(figures)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
