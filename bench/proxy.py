"""TCP fault proxy benchmark: does a LinkShape cap hold, per direction, under a saturating load?

Usage::

    .venv/bin/python bench/proxy.py [--quick] [--up-mb 8] [--down-mb 20] [--conns 4]

An upstream on loopback sinks what it is sent and sends without pause; the
proxy (``edge_gateway.testing.tcpproxy``) sits in between, in a process of
its own driven through its stdin (``shape ...`` commands), as a scenario
would run it, so that the load's threads do not compete with it for the GIL. ``--conns``
connections upload and as many download at the same time, all through one
proxy, so both caps are saturated together (a link is one pipe: the
connections of one direction share its cap). The receivers count bytes; the
bench reports, over a window of ``--seconds`` (10; 4 with --quick) after a
1 s warm-up:

* per direction, the achieved rate against the configured cap
  (``up_ratio``, ``down_ratio``; target 0.95-1.05);
* per direction, the slowest connection's share against the fastest's
  (``up_fairness``, ``down_fairness``; 1.0 is an even split);
* the baseline, same run and same load: the proxy with no shape
  (``uncapped_up_mb_per_s``, ``uncapped_down_mb_per_s``), so the cap is shown to
  be the limit and not the machine;
* latency with jitter: the median round trip of small messages with
  ``latency=20 ms, jitter=5 ms`` against the 40 ms the shape implies, next to
  the unshaped round trip.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MB, Row, emit_json, median, progress, render_table

from edge_gateway.testing.tcpproxy import LinkShape

BLOCK = bytes(256 * 1024)


class Upstream:
    """The far end. A connection's first byte says what it is for.

    ``u``: sink what follows; ``d``: send without pause; ``e``: echo.
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sunk: dict[int, int] = {}  # bytes received per upload connection
        self.stopping = False
        self._next = itertools.count()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        key = next(self._next)
        with sock:
            try:
                kind = sock.recv(1)
                if kind == b"u":
                    self.sunk[key] = 0
                    buf = bytearray(1 << 20)
                    while n := sock.recv_into(buf):
                        self.sunk[key] += n
                elif kind == b"d":
                    while not self.stopping:
                        sock.sendall(BLOCK)
                elif kind == b"e":
                    while data := sock.recv(65536):
                        sock.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self.stopping = True
        self.listener.close()


class Proxy:
    """``python -m edge_gateway.testing.tcpproxy`` in a child process."""

    def __init__(self, upstream_port: int) -> None:
        self.child = subprocess.Popen(
            [sys.executable, "-m", "edge_gateway.testing.tcpproxy", f"127.0.0.1:{upstream_port}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.child.stdout is not None
        self.address = ("127.0.0.1", int(self.child.stdout.readline()))

    def command(self, line: str) -> None:
        assert self.child.stdin is not None
        assert self.child.stdout is not None
        self.child.stdin.write(line + "\n")
        self.child.stdin.flush()
        answer = self.child.stdout.readline().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"tcpproxy: {line!r}: {answer}")

    def close(self) -> None:
        assert self.child.stdin is not None
        with contextlib.suppress(OSError):
            self.child.stdin.write("quit\n")
            self.child.stdin.close()
        try:
            self.child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()
        if self.child.stdout is not None:
            self.child.stdout.close()


def saturate(
    proxy: Proxy, upstream: Upstream, conns: int, warmup: float, seconds: float
) -> tuple[list[float], list[float]]:
    """Bytes/s per upload and per download connection over the window."""
    stop = threading.Event()
    got: dict[int, int] = {}
    socks: list[socket.socket] = []

    def upload(sock: socket.socket) -> None:
        try:
            sock.sendall(b"u")
            while not stop.is_set():
                sock.sendall(BLOCK)
        except OSError:
            pass

    def download(i: int, sock: socket.socket) -> None:
        buf = bytearray(1 << 20)
        try:
            sock.sendall(b"d")
            while not stop.is_set() and (n := sock.recv_into(buf)):
                got[i] += n
        except OSError:
            pass

    before = set(upstream.sunk)
    threads = []
    for i in range(conns):
        up = socket.create_connection(proxy.address)
        down = socket.create_connection(proxy.address)
        socks += [up, down]
        got[i] = 0
        threads.append(threading.Thread(target=upload, args=(up,), daemon=True))
        threads.append(threading.Thread(target=download, args=(i, down), daemon=True))
    for t in threads:
        t.start()
    time.sleep(warmup)
    ups = [k for k in upstream.sunk if k not in before]
    t0 = time.monotonic()
    up0 = {k: upstream.sunk[k] for k in ups}
    down0 = dict(got)
    time.sleep(seconds)
    t1 = time.monotonic()
    up1 = {k: upstream.sunk[k] for k in ups}
    down1 = dict(got)
    stop.set()
    for s in socks:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in send or recv
        s.close()
    for t in threads:
        t.join(timeout=5)
    span = t1 - t0
    return (
        [(up1[k] - up0[k]) / span for k in ups],
        [(down1[i] - down0[i]) / span for i in got],
    )


def round_trips(proxy: Proxy, n: int) -> list[float]:
    out = []
    with socket.create_connection(proxy.address) as sock:
        sock.sendall(b"e")
        for _ in range(n):
            began = time.perf_counter()
            sock.sendall(b"ping")
            got = b""
            while len(got) < 4:
                got += sock.recv(4 - len(got))
            out.append(time.perf_counter() - began)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 s windows")
    ap.add_argument("--up-mb", type=float, default=8.0, help="up cap in MB/s (default 8)")
    ap.add_argument("--down-mb", type=float, default=20.0, help="down cap in MB/s (default 20)")
    ap.add_argument("--conns", type=int, default=4, help="connections per direction (default 4)")
    ap.add_argument("--seconds", type=float, default=None, help="window (default 10; 4 quick)")
    args = ap.parse_args()
    seconds = args.seconds or (4.0 if args.quick else 10.0)
    up_cap, down_cap = args.up_mb * MB, args.down_mb * MB

    upstream = Upstream()
    proxy = Proxy(upstream.port)
    try:
        progress(f"baseline: no shape, {args.conns} connections each way ...")
        base_up, base_down = saturate(proxy, upstream, args.conns, 1.0, min(seconds, 4.0))
        base_rtt = round_trips(proxy, 50)
        progress(f"capped: up {args.up_mb} MB/s, down {args.down_mb} MB/s, {seconds:.0f} s ...")
        shape = LinkShape(up_bytes_per_s=up_cap, down_bytes_per_s=down_cap)
        proxy.command(f"shape {shape.describe()}")
        cap_up, cap_down = saturate(proxy, upstream, args.conns, 1.0, seconds)
        progress("latency 20 ms +- 5 ms ...")
        proxy.command("shape latency=0.02 jitter=0.005 seed=1")
        rtt = round_trips(proxy, 50)
    finally:
        proxy.close()
        upstream.close()

    up, down = sum(cap_up), sum(cap_down)
    up_ratio, down_ratio = up / up_cap, down / down_cap
    up_fair = min(cap_up) / max(cap_up) if cap_up and max(cap_up) else 0.0
    down_fair = min(cap_down) / max(cap_down) if cap_down and max(cap_down) else 0.0
    rtt_ms, base_rtt_ms = median(rtt) * 1000, median(base_rtt) * 1000
    print(
        render_table(
            f"tcpproxy LinkShape, {args.conns} connections each way, {seconds:.0f} s window",
            [
                "caps (both directions saturated at once)",
                Row(
                    "up through the cap",
                    up / MB,
                    "MB/s",
                    "configured up cap",
                    up_cap / MB,
                    "0.95-1.05x",
                    0.95 <= up_ratio <= 1.05,
                ),
                Row(
                    "down through the cap",
                    down / MB,
                    "MB/s",
                    "configured down cap",
                    down_cap / MB,
                    "0.95-1.05x",
                    0.95 <= down_ratio <= 1.05,
                ),
                Row("up: slowest / fastest connection", up_fair, "ratio"),
                Row("down: slowest / fastest connection", down_fair, "ratio"),
                Row("up, no shape", sum(base_up) / MB, "MB/s", "up cap", up_cap / MB),
                Row("down, no shape", sum(base_down) / MB, "MB/s", "down cap", down_cap / MB),
                "latency 20 ms, jitter 5 ms",
                Row("median round trip", rtt_ms, "ms", "2 x latency", 40.0),
                Row("median round trip, no shape", base_rtt_ms, "ms"),
            ],
        )
    )
    emit_json(
        {
            "bench": "proxy",
            "seconds": seconds,
            "conns": args.conns,
            "up_cap_mb_per_s": up_cap / MB,
            "down_cap_mb_per_s": down_cap / MB,
            "up_mb_per_s": up / MB,
            "down_mb_per_s": down / MB,
            "up_ratio": up_ratio,
            "down_ratio": down_ratio,
            "up_fairness": up_fair,
            "down_fairness": down_fair,
            "uncapped_up_mb_per_s": sum(base_up) / MB,
            "uncapped_down_mb_per_s": sum(base_down) / MB,
            "rtt_ms": rtt_ms,
            "rtt_ratio": rtt_ms / 40.0,
            "uncapped_rtt_ms": base_rtt_ms,
            "ok": 0.95 <= up_ratio <= 1.05 and 0.95 <= down_ratio <= 1.05,
        }
    )


if __name__ == "__main__":
    main()
