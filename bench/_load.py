"""A closed-loop HTTP/1.1 load generator: N keep-alive connections, one request in flight each.

Used by ``bench/produce.py`` for the capacity figure (many small producers).
It runs in its own process (``python bench/_load.py HOST PORT ...``) so that its
CPU is not the gateway's, drives every connection from one thread with
``selectors`` (epoll) and pre-built request bytes, and parses only the status
line and ``Content-Length`` of each response: at ~15-25 us of CPU per request
it leaves the cores to the server, as ``wrk`` would. Each connection sends its
next request as soon as the previous response is complete (as fast as acks
return). Prints one JSON object: requests, seconds, errors, latency
percentiles.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import ssl
import sys
import time
from typing import Any


def _content_length(head: bytes) -> int:
    i = head.lower().find(b"content-length:")
    if i < 0:
        return 0
    j = head.find(b"\r\n", i)
    return int(head[i + 15 : j if j > 0 else len(head)])


def run(
    host: str,
    port: int,
    path: str,
    body: bytes,
    connections: int,
    seconds: float,
    warmup: float,
    tls: ssl.SSLContext | None = None,
) -> dict[str, object]:
    request = (
        b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (path.encode(), host.encode(), port, len(body))
    ) + body
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(connections):
        s = socket.create_connection((host, port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:  # the handshake happens here, before any measuring
            s = tls.wrap_socket(s, server_hostname=host)
        s.setblocking(False)
        socks.append(s)
    # Per connection: [unparsed bytes, when its request in flight was sent]
    state: dict[int, list[Any]] = {s.fileno(): [b"", 0.0] for s in socks}
    lat: list[float] = []
    errors = 0
    statuses: dict[int, int] = {}
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + seconds
    for s in socks:
        state[s.fileno()][1] = time.perf_counter()
        s.sendall(request)
        sel.register(s, selectors.EVENT_READ)
    done = 0
    announced = False
    while True:
        now = time.perf_counter()
        if now >= stop_at:
            break
        if not announced and now >= measure_from:
            # The caller samples the server's CPU between this line and the result.
            print("measuring", flush=True)
            announced = True
        for key, _ in sel.select(timeout=1.0):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            st = state[key.fd]
            try:
                data = s.recv(65536)
                # TLS: a record may hold more than one read returned.
                while isinstance(s, ssl.SSLSocket) and s.pending():
                    data += s.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError):
                continue
            if not data:
                raise SystemExit("the server closed a connection")
            buf = st[0] + data
            while True:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                head = buf[:end]
                length = _content_length(head)
                if len(buf) < end + 4 + length:
                    break
                status = int(head[9:12])
                buf = buf[end + 4 + length :]
                t = time.perf_counter()
                if st[1] >= measure_from and t < stop_at:
                    lat.append(t - st[1])
                    done += 1
                    statuses[status] = statuses.get(status, 0) + 1
                    if status != 200:
                        errors += 1
                st[1] = t
                s.sendall(request)
            st[0] = buf
    print("done", flush=True)
    for s in socks:
        s.close()
    lat.sort()

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(len(lat) * q / 100))] if lat else float("nan")

    return {
        "requests": done,
        "seconds": seconds,
        "errors": errors,
        "statuses": statuses,
        "p50_s": pct(50),
        "p99_s": pct(99),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--path", default="/v1/topics/t/records")
    ap.add_argument("--body", default='{"records":[{"value":"x"}]}')
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--ca-file", default=None, help="speak TLS, verifying with this CA")
    a = ap.parse_args()
    tls = ssl.create_default_context(cafile=a.ca_file) if a.ca_file else None
    out = run(a.host, a.port, a.path, a.body.encode(), a.connections, a.seconds, a.warmup, tls)
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
