"""Fleet benchmark: one metadata server under the requests of N simulated gateways.

Usage::

    .venv/bin/python bench/fleet.py [--quick] [--gateways N] [--procs P] [--away-s S] ...

What runs: a real ``edgegw metadata serve`` process (SQLite; with
``--replicas R`` > 1, R of them sharing a PostgreSQL database — a throwaway
cluster from Debian's ``postgresql``, seeded by ``edgegw metadata migrate`` —
with gateway i talking to replica i mod R), and P load
processes (``--procs``, one per core by default) that each simulate a share
of N gateways on one epoll loop with a heap of timers: no task per gateway,
requests prepared once as bytes and sent on non-blocking sockets (not N real
gateways, nor httpx: the load generator must leave the cores to the server;
the bench reports the load processes' CPU so a reader sees whether a run
was load-bound). Each simulated gateway does what the agent
(``edge_gateway.metadata.agent``) does, with the agent's backoff and its
watch decoder (``edge_gateway.metadata.WatchDecoder``):

* a **heartbeat** every ``--heartbeat-s`` (10 s), starting at a random phase;
* a **routing refresh** with ``If-None-Match``: every ``--routing-s`` (5 s)
  until a heartbeat answer names the table's routing version, then only
  every ``--routing-safety-s`` (300 s) while heartbeats go on confirming it,
  and at once when one names another version (``--routing-safety-s 0``:
  every ``--routing-s`` whatever the heartbeats say, as gateways before);
* **one held long poll** ``GET /v1/heads`` for the ``--follow`` sources it
  mirrors (each drawn at random from the fleet), re-sent at once with the
  answer's version, ``wait_ms`` = ``--wait-ms``;
* for a ``--ship-share`` of the sites (10 %), a commit every
  ``--ship-ms`` (250 ms) and a **head report** of it, sent as the
  gateway's ``HeadReporter`` sends them: one at a time, the latest seq
  (so a slow answer coalesces commits); the first as a request, and once
  its answer names protocol 3 (``edgegw-protocol``) as lines of one **head
  stream** per gateway (``POST .../head-stream``: the client's request head,
  built by h11 with the client's headers, and its chunked lines; acks read
  with the client's ``AckDecoder``); a stream that cannot be opened leaves
  the report to a request, as the client does (``--reports request``: one
  request per report, as gateways before protocol 3);
* on a failure, the agent's backoff (``edge_gateway.backoff.Backoff`` with full
  jitter, never sooner than a ``503``'s ``Retry-After``).

The long polls hold one connection per gateway; the other requests of a
load process share a pool of ``--pool`` keep-alive connections (a real
gateway also keeps one idle keep-alive connection of its own: see the idle
connection baseline for what that adds to the server's RSS).

Phases: ramp-up (gateways start over one heartbeat interval), a measured
window of ``--duration-s``, then the **reconnect herd**: the server is
stopped (SIGTERM) for ``--away-s`` — the gateways keep retrying with their
backoff, as they would through a 10-minute outage, whose only effect on
them is that every retry loop is at its cap with random phases, which a
shorter away reaches too once it is longer than the backoff cap (20 s) —
then started again on the same port and database. ``reconnect_all_s`` is
the time from the restarted server listening until every gateway has had a
heartbeat and a routing answer from it (or a heartbeat answer naming its
table's version, which confirms the table as a 304 does: with
``--routing-safety-s``, the default, a gateway whose heartbeats went on
across the outage sends no routing poll) and the server holds every
gateway's long poll again (its ``/healthz`` count); ``/healthz`` is probed
every 0.25 s throughout, so "answering throughout" is a measured figure.

Auth: ``--auth admin`` (the default) sends the admin token as every
gateway (allowed: admin may act as any region), which costs the server the
same per request as a region token once verified; ``--auth region`` gives
each gateway its own token, so a restart costs one token check per
gateway (a store lookup and a SHA-256; scrypt, ~40 ms each, 2 at once,
before) — the bench reports that cost (``token_check_ms``) in either mode.

Figures, each next to a same-run baseline: per operation the rate and
p50/p99 latency (baseline: a trivial ASGI endpoint on the same HTTP server,
``--server builtin`` or ``hypercorn``, closed loop with ``bench/_load.py``, 32 connections); wake-up
latency (a head report sent → the last follower's answer received) and
where it goes: the report's wait for a free connection in the load process,
the server's own part (report received → its line written to a watch's
socket: the server's histogram, ``/healthz`` ``line_latency_counts``, over
the window) and the load processes' loop lag (how late they ran a 10 ms
timer: a line on the socket waits about that long to be read); the
ceiling (the asked load at the CPU per report measured, against the one
core a server process has, and the load processes' share);
server RSS (per held poll, against bare hypercorn holding idle
connections) and CPU (per 1,000 requests, against the trivial endpoint).
The machine is shared: figures are noisy; the ratios are the point. The
last line is one JSON object.

``--profile-server PATH`` runs the server under cProfile, timed by its main
thread's CPU clock: ``PATH.1`` covers the first run (ramp-up and the measured
window), ``PATH.2`` the run after the herd; read them with ``pstats``. With
``--replicas``, each replica's: ``PATH.r0.1``, ``PATH.r1.1``, ... Replica runs
also print each replica's CPU (its event loop apart from its worker threads)
and RSS, PostgreSQL's CPU, PSS, commits and costliest statements
(``pg_stat_statements``), and the group commit's figures (``/healthz``
``replica_sync``).
``--profile-load PATH`` does the same for each load process (``PATH.0``,
``PATH.1``, ...); a profiler slows them several times, so read shares only.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import errno
import heapq
import json
import math
import os
import random
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import BENCH_DIR, OUT_DIR, Row, emit_json, percentile, render_table, scratch_dir
from _common import progress as _progress

sys.path.insert(0, str(BENCH_DIR.parent))
import h11

from edge_gateway.backoff import Backoff
from edge_gateway.errors import CorruptData
from edge_gateway.metadata import WatchDecoder
from edge_gateway.metadata._headstream import (
    HEAD_STREAM_PROTOCOL,
    PROTOCOL_HEADER,
    AckDecoder,
    encode_report,
    protocol_of,
    stream_request_headers,
)

ADMIN_TOKEN = "fleet-bench-admin-token-0123456789"
EDGEGW = Path(sys.executable).parent / "edgegw"
OPS = ("heartbeat", "head_report", "routing", "heads_poll")
#: A gateway is back when it has had each of these since the restart.
BACK_OPS = ("heartbeat", "routing", "heads_poll")


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Plan:
    """Everything a load process needs (written as JSON for it)."""

    host: str
    port: int
    #: Every replica's port: gateway i talks to ports[i % len(ports)] (one server: [port]).
    ports: list[int]
    gateways: int
    lo: int
    hi: int
    tokens: list[str]
    heartbeat_s: float
    routing_s: float
    #: While heartbeats confirm the routing version, the routing poll runs this
    #: seldom (the agent's ROUTING_SAFETY_REFRESH_S); 0: every routing_s, as
    #: gateways before it did.
    routing_safety_s: float
    ship_ms: float
    shippers: list[int]
    follows: list[list[int]]
    wait_ms: int
    #: "watch" (one held GET /v1/heads?watch=1, as the agent) or "poll" (long polls, as before).
    protocol: str
    #: "stream" (one head stream per shipping gateway once the server names
    #: protocol 3, as the agent's HeadReporter) or "request" (one request each, as before).
    reports: str
    pool: int
    start_at: float
    ramp_s: float
    measure_from: float
    measure_to: float
    away_at: float
    stop_file: str
    #: Holds the time the restarted server listens (written by the parent).
    back_file: str
    out_file: str
    seed: int


_T0 = time.monotonic()


def progress(message: str) -> None:
    _progress(f"[{time.monotonic() - _T0:5.1f} s] {message}")


def region_name(i: int) -> str:
    return f"site-{i:05d}"


# ----------------------------------------------------------- load process


class Dechunk:
    """HTTP/1.1 chunked framing undone, incrementally (the watch's body never ends)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.left = 0  # bytes of the current chunk still to come
        self.crlf = False  # the CRLF after a chunk's data is next
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        self.buf += data
        out = bytearray()
        while self.buf and not self.ended:
            if self.crlf:
                if len(self.buf) < 2:
                    break
                del self.buf[:2]
                self.crlf = False
            elif self.left:
                take = min(self.left, len(self.buf))
                out += self.buf[:take]
                del self.buf[:take]
                self.left -= take
                self.crlf = self.left == 0
            else:
                end = self.buf.find(b"\r\n")
                if end < 0:
                    break
                size = int(bytes(self.buf[:end]).split(b";")[0], 16)
                del self.buf[: end + 2]
                if size == 0:
                    self.ended = True
                self.left = size
        return bytes(out)


class HttpError(Exception):
    pass


def retry_after(head: bytes) -> float | None:
    i = head.lower().find(b"retry-after:")
    if i < 0:
        return None
    j = head.find(b"\r\n", i)
    try:
        return float(head[i + 12 : j if j > 0 else len(head)].strip())
    except ValueError:
        return None


@dataclass
class Recorder:
    """What one load process saw."""

    measure_from: float
    measure_to: float
    away_at: float
    lat: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPS})
    count: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPS, 0))
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPS, 0))
    shed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPS, 0))
    #: region -> [[seq, sent at], ...] (reports sent in the window)
    reports: dict[str, list[list[float]]] = field(default_factory=dict)
    #: "gw|source" -> [[seq, received at], ...]
    wakes: dict[str, list[list[float]]] = field(default_factory=dict)
    #: When the restarted server listened (None before).
    back_at: float | None = None
    #: gateway -> op -> first success sent after the server came back
    back: dict[int, dict[str, float]] = field(default_factory=dict)
    #: Watches opened (each one request).
    opens: int = 0
    #: How late the load process's loop ran a 10 ms timer, in the window (s):
    #: a line that reached the socket waits about this long to be read.
    loop_lag: list[float] = field(default_factory=list)
    #: A report's wait for a free control connection, in the window (s).
    report_queue: list[float] = field(default_factory=list)
    #: Failures by kind ("heads_poll: ConnectionRefusedError", ...), in the window.
    failures: dict[str, int] = field(default_factory=dict)

    def mark_back(self, gw: int, op: str, t0: float, t1: float) -> None:
        if self.back_at is not None and t0 >= self.back_at:
            self.back.setdefault(gw, {}).setdefault(op, t1)

    def needs_mark(self, gw: int, op: str) -> bool:
        return self.back_at is not None and op not in self.back.get(gw, {})

    def done(self, op: str, t0: float, t1: float, status: int, gw: int) -> None:
        if self.measure_from <= t0 < self.measure_to:
            self.count[op] += 1
            self.lat[op].append(t1 - t0)
            if status >= 400:
                self.errors[op] += 1
            if status == 503:
                self.shed[op] += 1
        if status < 400:
            self.mark_back(gw, op, t0, t1)

    def failed(self, op: str, t0: float, error: object = None) -> None:
        if self.measure_from <= t0 < self.measure_to:
            self.errors[op] += 1
            kind = f"{op}: {type(error).__name__} {error}"[:80]
            self.failures[kind] = self.failures.get(kind, 0) + 1


# The load engine: one thread, one epoll selector, one heap of timers; no task
# per gateway and no async framework. Each simulated gateway is a few fields
# and callbacks (its heartbeat, routing, reporter and heads loops as the agent
# runs them); its requests are bytes prepared once, sent on non-blocking
# sockets. A trio load process spent most of its CPU in trio itself (cancel
# scopes, scheduling: --profile-load), which on a 2-core machine is CPU the
# server under test did not get.

Callback = Any  # (status, head, body) | (None, error, b"")


class Loop:
    """Timers (a heap: time, order, generation check) and socket readiness (epoll)."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.timers: list[tuple[float, int, Any, Any]] = []
        self._order = 0

    def at(self, when: float, fn: Any, arg: Any = None) -> None:
        self._order += 1
        heapq.heappush(self.timers, (when, self._order, fn, arg))

    def after(self, delay: float, fn: Any, arg: Any = None) -> None:
        self.at(time.time() + delay, fn, arg)

    def run(self, stopped: Any) -> None:
        timers, select = self.timers, self.sel.select
        while not stopped():
            now = time.time()
            while timers and timers[0][0] <= now:
                _, _, fn, arg = heapq.heappop(timers)
                fn(arg)
            wait = min(0.05, timers[0][0] - time.time()) if timers else 0.05
            for key, mask in select(max(0.0, wait)):
                key.data(mask)


class Conn:
    """One HTTP/1.1 keep-alive connection, non-blocking: one request at a time,
    or (``stream``) a response whose chunked body is handed on as it comes."""

    __slots__ = (
        "cb",
        "chunked",
        "deadline_gen",
        "end",
        "head",
        "inbuf",
        "length",
        "loop",
        "on_data",
        "out",
        "port",
        "sock",
        "writing",
    )

    def __init__(self, loop: Loop, port: int) -> None:
        self.loop, self.port = loop, port
        self.sock: socket.socket | None = None
        self.out = b""
        self.inbuf = bytearray()
        self.cb: Callback = None
        #: For a streamed response: called with each piece of its (chunked) body.
        self.on_data: Any = None
        self.head = b""
        self.end = -1
        self.length = 0
        self.chunked = False
        self.writing = False
        self.deadline_gen = 0

    def request(self, data: bytes, timeout: float, cb: Callback, on_data: Any = None) -> None:
        self.cb, self.on_data = cb, on_data
        self.head, self.end, self.chunked = b"", -1, False
        self.deadline_gen += 1
        self.loop.after(timeout, self._timed_out, self.deadline_gen)
        self.out = data
        if self.sock is None:
            s = socket.socket()
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = s
            err = s.connect_ex(("127.0.0.1", self.port))
            if err not in (0, errno.EINPROGRESS):
                self.fail(OSError(err, os.strerror(err)))
                return
            self.writing = True
            self.loop.sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, self._ready)
            return
        self._flush()

    def extend(self, timeout: float) -> None:
        """A streamed response: the next piece is due within ``timeout``."""
        self.deadline_gen += 1
        self.loop.after(timeout, self._timed_out, self.deadline_gen)

    def clear_deadline(self) -> None:
        """A streamed exchange with nothing due (a head stream between reports)."""
        self.deadline_gen += 1

    def write(self, data: bytes) -> None:
        """More of a request body still being sent (a head stream's next line)."""
        if self.sock is None:
            return
        self.out += data
        self._flush()

    def _timed_out(self, gen: int) -> None:
        if gen == self.deadline_gen and self.cb is not None:
            self.fail(HttpError("timed out"))

    def _flush(self) -> None:
        assert self.sock is not None
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self.fail(exc)
            return
        self.out = self.out[sent:]
        want = bool(self.out)
        if want != self.writing:
            self.writing = want
            mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
            self.loop.sel.modify(self.sock, mask, self._ready)

    def _ready(self, mask: int) -> None:
        if self.sock is None:
            return
        if mask & selectors.EVENT_WRITE:
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self.fail(OSError(err, os.strerror(err)))
                return
            self._flush()
        if mask & selectors.EVENT_READ and self.sock is not None:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            except OSError as exc:
                self.fail(exc)
                return
            if not data:
                self.fail(HttpError("closed"))
                return
            self._received(data)

    def _received(self, data: bytes) -> None:
        if self.cb is None:  # nothing asked: the server closes an idle connection
            self.close()
            return
        if self.chunked:
            self.on_data(data)
            return
        buf = self.inbuf
        buf += data
        if self.end < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self.end = end
            self.head = h = bytes(buf[:end])
            low = h.lower()
            i = low.find(b"content-length:")
            if i >= 0:
                j = h.find(b"\r\n", i)
                self.length = int(h[i + 15 : j if j > 0 else len(h)])
            elif self.on_data is not None and b"transfer-encoding: chunked" in low:
                self.chunked = True
                rest = bytes(buf[end + 4 :])
                buf.clear()
                cb, self.cb = self.cb, None
                cb(int(h[9:12]), h, b"")  # the head: the body follows through on_data
                if self.sock is not None:
                    self.cb = cb
                    if rest:
                        self.on_data(rest)
                return
            else:
                self.length = 0
        need = self.end + 4 + self.length
        if len(buf) < need:
            return
        h = self.head
        answer = bytes(buf[self.end + 4 : need])
        del buf[:need]
        cb, self.cb = self.cb, None
        self.deadline_gen += 1
        if b"connection: close" in h.lower():
            self.close()
        cb(int(h[9:12]), h, answer)

    def fail(self, exc: BaseException) -> None:
        cb, self.cb = self.cb, None
        self.close()
        if cb is not None:
            cb(None, exc, b"")

    def close(self) -> None:
        self.deadline_gen += 1
        if self.sock is not None:
            s, self.sock = self.sock, None
            with contextlib.suppress(KeyError, ValueError):
                self.loop.sel.unregister(s)
            s.close()
        self.inbuf = bytearray()
        self.out = b""
        self.writing = False
        self.chunked = False


class Pool:
    """The control connections to one server: a request waits for a free one."""

    def __init__(self, loop: Loop, port: int, size: int) -> None:
        self.idle = [Conn(loop, port) for _ in range(size)]
        self.waiting: collections.deque[tuple[bytes, Callback]] = collections.deque()

    def request(self, data: bytes, cb: Callback) -> None:
        if self.idle:
            self._start(self.idle.pop(), data, cb)
        else:
            self.waiting.append((data, cb))

    def _start(self, conn: Conn, data: bytes, cb: Callback) -> None:
        t0 = time.time()

        def done(status: int | None, h: Any, answer: bytes) -> None:
            if self.waiting:
                self._start(conn, *self.waiting.popleft())
            else:
                self.idle.append(conn)
            cb(t0, status, h, answer)

        conn.request(data, REQUEST_TIMEOUT_S, done)


REQUEST_TIMEOUT_S = 10.0


class Gateway:
    """One simulated gateway: the agent's loops as callbacks on the :class:`Loop`."""

    def __init__(self, load: LoadProcess, gw: int) -> None:
        self.load, self.gw = load, gw
        plan = load.plan
        self.region = region_name(gw)
        self.port = plan.ports[gw % len(plan.ports)]
        self.pool = load.pools[self.port]
        auth = f"Authorization: Bearer {plan.tokens[gw]}\r\n".encode()
        host = f"Host: {plan.host}:{self.port}\r\n".encode()
        post = b"Content-Type: application/json\r\nContent-Length: "
        self.beat_head = (
            f"POST /v1/regions/{self.region}/heartbeat HTTP/1.1\r\n".encode() + host + auth + post
        )
        self.report_head = (
            f"POST /v1/regions/{self.region}/head HTTP/1.1\r\n".encode() + host + auth + post
        )
        self.routing_req = b"GET /v1/routing HTTP/1.1\r\nAccept-Encoding: gzip\r\n" + host + auth
        sources = ",".join(region_name(s) for s in plan.follows[gw])
        watch = "&watch=1" if plan.protocol == "watch" else ""
        self.heads_query = f"&regions={sources}&wait_ms={plan.wait_ms}{watch} HTTP/1.1\r\n".encode()
        self.heads_tail = host + auth + b"\r\n"
        self.seq = -1
        self.beat_version: int | None = None
        self.table_version: int | None = None
        self.etag = b""
        # heartbeat
        self.beat_backoff = Backoff(0.5, max(plan.heartbeat_s, 20.0))
        self.beat_failures = 0  # in a row
        # routing: the agent's poll, which heartbeats naming the version stand in for
        self.routing_backoff = Backoff(0.5, max(plan.routing_s, 20.0))
        self.poll_now = False
        self.routing_phase = ""  # "long" | "short" | "backoff" while waiting, "" otherwise
        self.routing_gen = 0
        # reporter: one report in flight, the newest seq
        self.report_backoff = Backoff(0.1, 5.0)
        self.reporting = False
        self.sent = -1
        # head stream: learnt from a report's answer (PROTOCOL_HEADER), as the client does
        self.streams = False
        self.stream_conn = Conn(load.loop, self.port)
        self.stream_open = False
        #: The report on the stream awaiting its ack: (seq, sent at), or None.
        self.stream_pending: tuple[int, float] | None = None
        self.stream_sent = 0
        self.stream_h11 = h11.Connection(h11.CLIENT)
        self.stream_head = b""
        self.stream_target = f"/v1/regions/{self.region}/head-stream".encode()
        self.stream_headers = stream_request_headers(
            f"{plan.host}:{self.port}".encode(), plan.tokens[gw]
        )
        # heads
        self.heads_backoff = Backoff(0.2, 5.0)
        self.heads_conn = Conn(load.loop, self.port)
        self.since = 0

    def start(self) -> None:
        loop, rand, plan = self.load.loop, self.load.rand, self.load.plan
        # As the agent: its routing fetch and its first heartbeat start together
        # (apart, a gateway polled routing every --routing-s until its first
        # heartbeat confirmed the table: up to 12 polls each over a 60 s ramp).
        start = rand.random() * plan.ramp_s
        loop.after(start, self.heartbeat)
        loop.after(start, self.routing)
        loop.after(rand.random() * plan.ramp_s, self.heads)
        if self.gw in self.load.shippers:
            loop.after(rand.random() * plan.ship_ms / 1000, self.commit)

    # -------------------------------------------------------------- heartbeat

    def heartbeat(self, _: Any = None) -> None:
        if self.seq >= 0:
            body = b'{"gateway_version":"bench","lag":%b,"head_seq":%d}' % (_LAG, self.seq)
        else:
            body = b'{"gateway_version":"bench","lag":%b}' % _LAG
        self.pool.request(b"%b%d\r\n\r\n%b" % (self.beat_head, len(body), body), self._beat_done)

    def _beat_done(self, t0: float, status: int | None, h: Any, answer: bytes) -> None:
        load, plan = self.load, self.load.plan
        t1 = time.time()
        late = False
        if status is None:
            load.rec.failed("heartbeat", t0, h)
            late = "timed out" in str(h)
            status, h = 0, b""
        else:
            load.rec.done("heartbeat", t0, t1, status, self.gw)
            late = status == 503
        if status == 200:
            self.beat_failures = 0
            self.beat_backoff.reset()
            # As the agent: a version other than the table's fetches it at once.
            version = json.loads(answer)["routing_version"]
            self.beat_version = version
            if version != self.table_version:
                self.poll_routing_now()
            elif plan.routing_safety_s:
                # The server confirmed the table: what a 304 would say.
                load.rec.mark_back(self.gw, "routing", t0, t1)
            load.loop.after(plan.heartbeat_s, self.heartbeat)
        else:
            self.beat_failures += 1
            # As the agent (late_beat_keeps_table): a heartbeat merely late (timed
            # out, or shed with a 503) once keeps the table confirmed.
            if self.beat_version is not None and not (late and self.beat_failures == 1):
                self.beat_version = None
                self.poll_routing_now()  # the routing poll takes over
            delay = self.beat_backoff.delay_after(retry_after(h), load.rand.random())
            load.loop.after(delay, self.heartbeat)

    # ---------------------------------------------------------------- routing

    def routing(self, _: Any = None) -> None:
        self.routing_phase = ""
        data = self.routing_req
        if self.etag:
            data += b"If-None-Match: " + self.etag + b"\r\n"
        self.pool.request(data + b"\r\n", self._routing_done)

    def _routing_done(self, t0: float, status: int | None, h: Any, answer: bytes) -> None:
        load = self.load
        if status is None:
            load.rec.failed("routing", t0, h)
            status, h = 0, b""
        else:
            load.rec.done("routing", t0, time.time(), status, self.gw)
        if status in (200, 304):
            if status == 200:
                i = h.lower().find(b"etag:")
                self.etag = h[i + 5 : h.find(b"\r\n", i)].strip() if i >= 0 else b""
                self.table_version = int(self.etag.strip(b'"') or 0)
            self.routing_backoff.reset()
            self._routing_settle()
        else:
            delay = self.routing_backoff.delay_after(retry_after(h), load.rand.random())
            self._routing_wait(delay, "backoff")

    def _confirmed(self) -> bool:
        return bool(self.load.plan.routing_safety_s) and self.beat_version == self.table_version

    def _routing_settle(self) -> None:
        """The agent's wait after a table: long while heartbeats confirm it, else the poll's."""
        plan = self.load.plan
        if self._confirmed():
            self._routing_wait(max(plan.routing_s, plan.routing_safety_s), "long")
        else:
            self._routing_wait(plan.routing_s, "short")

    def _routing_wait(self, delay: float, phase: str) -> None:
        self.routing_phase = phase
        self.routing_gen += 1
        if self.poll_now:  # called while busy: the wait ends at once
            delay = 0.0
        self.load.loop.after(delay, self._routing_woke, self.routing_gen)

    def poll_routing_now(self) -> None:
        if self.routing_phase:
            self.routing_gen += 1
            self.poll_now = True
            self._routing_woke(self.routing_gen)
        else:
            self.poll_now = True

    def _routing_woke(self, gen: int) -> None:
        if gen != self.routing_gen:
            return
        called, self.poll_now = self.poll_now, False
        if self.routing_phase == "short" and not called and self._confirmed():
            self._routing_settle()
        else:
            self.routing()

    # --------------------------------------------------------------- shipping

    def commit(self, _: Any = None) -> None:
        self.seq += 1
        if not self.reporting:
            self.report()
        self.load.loop.after(self.load.plan.ship_ms / 1000, self.commit)

    def report(self, _: Any = None) -> None:
        seq = self.seq
        if seq <= self.sent:
            self.reporting = False
            return
        self.reporting = True
        t_sent = time.time()
        if self.streams and self.load.plan.reports == "stream":
            if self.stream_open:
                self._stream_line(seq, t_sent)
            else:
                self._open_stream(seq, t_sent)
            return
        self._report_request(seq, t_sent)

    def _report_request(self, seq: int, t_sent: float) -> None:
        body = b'{"seq":%d}' % seq

        def done(t0: float, status: int | None, h: Any, answer: bytes) -> None:
            self._report_done(seq, t_sent, t0, status, h)

        self.pool.request(b"%b%d\r\n\r\n%b" % (self.report_head, len(body), body), done)

    def _report_done(self, seq: int, t_sent: float, t0: float, status: int | None, h: Any) -> None:
        load = self.load
        if status is None:
            load.rec.failed("head_report", t0, h)
            status, h = 0, b""
        else:
            load.rec.done("head_report", t0, time.time(), status, self.gw)
        if status == 200:
            # As the client: a head report's answer says whether the server streams.
            i = h.lower().find(PROTOCOL_HEADER.encode() + b":")
            j = h.find(b"\r\n", i) if i >= 0 else -1
            value = h[i + len(PROTOCOL_HEADER) + 1 : j if j > 0 else len(h)] if i >= 0 else None
            self.streams = protocol_of(value) >= HEAD_STREAM_PROTOCOL
            self._reported(seq, t_sent, t0)
        else:
            self._report_failed(retry_after(h))

    def _reported(self, seq: int, t_sent: float, t0: float) -> None:
        load, plan = self.load, self.load.plan
        self.report_backoff.reset()
        self.sent = seq
        if plan.measure_from <= t_sent < plan.measure_to:
            load.rec.reports.setdefault(self.region, []).append([seq, t_sent])
            load.rec.report_queue.append(t0 - t_sent)
        self.report()  # the commits made meanwhile: one report of the newest

    def _report_failed(self, after: float | None) -> None:
        load = self.load
        delay = self.report_backoff.delay_after(after, load.rand.random())
        load.loop.after(delay, self.report)

    def _open_stream(self, seq: int, t_sent: float) -> None:
        """The client's ``open_head_stream``: the request head (h11's bytes, the
        client's headers), the answer's head at once, then a line per report."""
        load, conn = self.load, self.stream_conn
        self.stream_h11 = h11.Connection(h11.CLIENT)
        head = self.stream_h11.send(
            h11.Request(method=b"POST", target=self.stream_target, headers=self.stream_headers)
        )
        dechunk, decoder = Dechunk(), AckDecoder("bench")
        t0 = time.time()

        def broken(error: object) -> None:
            self.stream_open = False
            conn.cb = None
            conn.close()
            pending, self.stream_pending = self.stream_pending, None
            if pending is not None:
                load.rec.failed("head_report", pending[1], error)
                self._report_failed(None)

        def on_head(status: int | None, h: Any, answer: bytes) -> None:
            if self.stream_open:  # the open stream broke (reset, timeout, closed)
                broken(h)
                return
            if status is None:
                # As the client: a stream that cannot be opened (the server away)
                # leaves the report to a request, which fails over or fails.
                conn.close()
                self._report_request(seq, t_sent)
                return
            if status != 200:
                conn.cb = None
                conn.close()
                load.rec.done("head_report", t0, time.time(), status, self.gw)
                if status in (404, 405):
                    self.streams = False
                    self._report_request(seq, t_sent)
                else:
                    self._report_failed(retry_after(h))
                return
            self.stream_open = True
            self.stream_sent = 0
            self._stream_line(seq, t_sent)

        def on_data(piece: bytes) -> None:
            try:
                acks = decoder.feed(dechunk.feed(piece))
            except (ValueError, CorruptData) as exc:
                broken(exc)
                return
            for ack in acks:
                if ack.error is not None:
                    broken(HttpError(ack.error[0]))
                    return
                pending = self.stream_pending
                if pending is not None and ack.acked >= self.stream_sent:
                    self.stream_pending = None
                    conn.clear_deadline()
                    t1 = time.time()
                    load.rec.done("head_report", pending[1], t1, 200, self.gw)
                    self._reported(pending[0], pending[1], pending[1])
            if dechunk.ended:
                broken(HttpError("the server ended the head stream"))

        conn.request(head, REQUEST_TIMEOUT_S, on_head, on_data)

    def _stream_line(self, seq: int, t_sent: float) -> None:
        data = self.stream_h11.send(h11.Data(data=encode_report(seq)))
        self.stream_pending = (seq, t_sent)
        self.stream_sent += 1
        self.stream_conn.write(data)
        self.stream_conn.extend(REQUEST_TIMEOUT_S)

    # ------------------------------------------------------------------ heads

    def heads(self, _: Any = None) -> None:
        data = b"GET /v1/heads?since=%d%b%b" % (self.since, self.heads_query, self.heads_tail)
        t0 = time.time()
        rec, plan = self.load.rec, self.load.plan
        if plan.protocol == "watch":
            self._watch(data, t0)
            return
        timeout = REQUEST_TIMEOUT_S + plan.wait_ms / 1000
        if rec.needs_mark(self.gw, "heads_poll"):
            # After the restart: "held" once it has waited 1 s unanswered (or answered).
            self.load.loop.after(1.0, self._mark_held, (self.heads_conn.deadline_gen + 1, t0))
        self.heads_conn.request(data, timeout, lambda *r: self._poll_done(t0, *r))

    def _mark_held(self, arg: tuple[int, float]) -> None:
        gen, t0 = arg
        if self.heads_conn.deadline_gen == gen:  # still the same poll, unanswered
            self.load.rec.mark_back(self.gw, "heads_poll", t0, t0 + 1.0)

    def _poll_done(self, t0: float, status: int | None, h: Any, answer: bytes) -> None:
        load, plan = self.load, self.load.plan
        if status is None:
            load.rec.failed("heads_poll", t0, h)
            load.loop.after(self.heads_backoff.delay_after(None, load.rand.random()), self.heads)
            return
        t1 = time.time()
        load.rec.done("heads_poll", t0, t1, status, self.gw)
        if status != 200:
            delay = self.heads_backoff.delay_after(retry_after(h), load.rand.random())
            load.loop.after(delay, self.heads)
            return
        self.heads_backoff.reset()
        doc = json.loads(answer)
        self.since = doc["version"]
        if plan.measure_from <= t1 < plan.away_at:
            for src, seq in doc["heads"].items():
                load.rec.wakes.setdefault(f"{self.gw}|{src}", []).append([seq, t1])
        self.heads()

    def _watch(self, data: bytes, t0: float) -> None:
        """The agent's heads watch: one held response, a line per change, resumed
        from the last line's version after a failure (with the agent's backoff)."""
        load, plan, conn = self.load, self.load.plan, self.heads_conn
        state: dict[str, Any] = {"t0": t0, "status": 0, "h": b""}
        dechunk, decoder = Dechunk(), WatchDecoder("bench")
        between_s = REQUEST_TIMEOUT_S + plan.wait_ms / 1000

        def ended(error: BaseException | None) -> None:
            if state["status"] == 0:
                load.rec.failed("heads_poll", state["t0"], error)
            conn.close()
            delay = self.heads_backoff.delay_after(retry_after(state["h"]), load.rand.random())
            load.loop.after(delay, self.heads)

        def on_data(piece: bytes) -> None:
            try:
                updates = decoder.feed(dechunk.feed(piece))
            except (ValueError, CorruptData) as exc:
                conn.cb = None
                ended(exc)
                return
            for version, heads in updates:
                t1 = time.time()
                load.rec.done("heads_poll", state["t0"], t1, 200, self.gw)
                self.heads_backoff.reset()
                self.since = version
                if plan.measure_from <= t1 < plan.away_at:
                    for src, seq in heads.items():
                        load.rec.wakes.setdefault(f"{self.gw}|{src}", []).append([seq, t1])
                state["t0"] = t1
            if dechunk.ended:
                conn.cb = None
                ended(None)
            else:
                conn.extend(between_s)

        def on_head(status: int | None, h: Any, answer: bytes) -> None:
            if status is None:  # connect, send or read failed; or the stream broke
                ended(h)
                return
            state["status"], state["h"] = status, h
            if status != 200:
                load.rec.done("heads_poll", state["t0"], time.time(), status, self.gw)
                ended(None)
                return
            if not conn.chunked:
                ended(HttpError("not a watch: the server answered a long poll"))
                return
            load.rec.opens += 1
            conn.extend(between_s)

        conn.request(data, REQUEST_TIMEOUT_S, on_head, on_data)


_LAG = b'{"shipper_pending_entries":0.0,"shipper_retries":0.0}'


class LoadProcess:
    """A share of the fleet (gateways ``plan.lo``..``plan.hi``) on one :class:`Loop`."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.loop = Loop()
        self.rec = Recorder(plan.measure_from, plan.measure_to, plan.away_at)
        self.rand = random.Random(plan.seed)
        self.pools = {port: Pool(self.loop, port, plan.pool) for port in plan.ports}
        self.shippers = set(plan.shippers)
        self.stop = False

    def run(self) -> None:
        plan = self.plan
        time.sleep(max(0.0, plan.start_at - time.time()))
        for gw in range(plan.lo, plan.hi):
            Gateway(self, gw).start()
        self.loop.after(0.01, self._lag_probe, time.time() + 0.01)
        self.loop.after(0.25, self._check)
        self.loop.run(lambda: self.stop)

    def _lag_probe(self, due: float) -> None:
        now = time.time()
        if self.plan.measure_from <= now < self.plan.measure_to:
            self.rec.loop_lag.append(now - due)
        self.loop.at(now + 0.01, self._lag_probe, now + 0.01)

    def _check(self, _: Any = None) -> None:
        """The parent's files: the stop, the restarted server's time; our progress."""
        plan, rec = self.plan, self.rec
        if os.path.exists(plan.stop_file):
            self.stop = True
            return
        if rec.back_at is None and os.path.exists(plan.back_file):
            rec.back_at = float(Path(plan.back_file).read_text())
        if rec.back_at is not None:
            full = sum(1 for b in rec.back.values() if all(op in b for op in BACK_OPS))
            Path(plan.out_file + ".progress").write_text(str(full))
        self.loop.after(0.25, self._check)

    def results(self) -> dict[str, Any]:
        rec = self.rec
        return {
            "count": rec.count,
            "errors": rec.errors,
            "shed": rec.shed,
            "lat": {op: sorted(v) for op, v in rec.lat.items()},
            "reports": rec.reports,
            "wakes": rec.wakes,
            "back": {str(k): v for k, v in rec.back.items()},
            "opens": rec.opens,
            "loop_lag": sorted(rec.loop_lag),
            "report_queue": sorted(rec.report_queue),
            "failures": rec.failures,
        }


def load_main(plan_file: str) -> None:
    plan = Plan(**json.loads(Path(plan_file).read_text()))
    load = LoadProcess(plan)
    load.run()
    Path(plan.out_file).write_text(json.dumps(load.results()))


# --------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Runs ``argv[2:]`` (a script and its arguments) under cProfile and writes the
#: stats to ``argv[1]``. Timed by the thread's CPU clock, not the wall clock: on a
#: shared machine a wall clock charges the time the process waited for a core to
#: whatever call it was in (a socket write, mostly).
_PROFILE_SERVER = """
import cProfile, os, runpy, sys, time
out = sys.argv[1]
sys.argv = sys.argv[2:]
# As when the script runs itself: its folder first on the path, not the working
# directory that -c put there (else a checkout there shadows PYTHONPATH's code).
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
prof = cProfile.Profile(time.thread_time)
try:
    prof.runcall(runpy.run_path, sys.argv[0], run_name="__main__")
except SystemExit:
    pass
finally:
    prof.dump_stats(out)
"""


class Server:
    """``edgegw metadata serve`` on a fixed port (so it can come back on the same one)."""

    def __init__(
        self,
        db: Path | str,
        port: int,
        extra: list[str],
        profile: str | None = None,
        *,
        files: Path,
    ) -> None:
        self.db, self.port, self.extra = db, port, extra
        self.proc: subprocess.Popen[bytes] | None = None
        #: Write a cProfile of each run of the server to ``<profile>.<n>`` (n = 1, 2, ...).
        self.profile = profile
        self.runs = 0
        self.addr = files.with_suffix(".addr")
        self.log = files.with_suffix(".log")

    def start(self) -> float:
        """Start; returns when it listens (time.time())."""
        self.addr.unlink(missing_ok=True)
        self.runs += 1
        argv = [str(EDGEGW), "metadata", "serve", "--db", str(self.db)]
        if self.profile:
            argv = [sys.executable, "-c", _PROFILE_SERVER, f"{self.profile}.{self.runs}", *argv]
        argv += ["--listen", f"127.0.0.1:{self.port}", "--addr-file", str(self.addr)]
        argv += ["--admin-token", ADMIN_TOKEN, *self.extra]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not self.addr.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"metadata serve did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)
        return time.time()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


class Replicas:
    """The servers of a run: one on SQLite, or replicas sharing one PostgreSQL database."""

    def __init__(self, servers: list[Server]) -> None:
        self.servers = servers
        self.ports = [s.port for s in servers]
        self.log = servers[0].log

    def start(self) -> float:
        """Start every one; returns when the last listens (time.time())."""
        return max(s.start() for s in self.servers)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def cpu_s(self) -> float:
        return sum(self.cpu_each())

    def cpu_each(self) -> list[float]:
        return [proc_cpu_s(s.pid) for s in self.servers]

    def main_thread_cpu_each(self) -> list[float]:
        """The trio thread's share (the rest: worker threads, the database calls)."""
        return [proc_cpu_s(s.pid, s.pid) for s in self.servers]

    def rss_mb(self, key: str = "VmRSS") -> float:
        return sum(self.rss_each(key))

    def rss_each(self, key: str = "VmRSS") -> list[float]:
        return [proc_rss_mb(s.pid, key) for s in self.servers]


class PgWatch:
    """The throwaway PostgreSQL of a replica run: its CPU, memory and statements.

    CPU: the postmaster and its children (the replicas' pooled connections are
    long-lived backends, so a window's difference is theirs). Memory: PSS, not
    RSS (every backend maps the shared buffers). Statements:
    ``pg_stat_statements`` (preloaded: the cluster restarts once at setup).
    """

    def __init__(self, pg: Any, dbname: str) -> None:
        self.pg, self.dbname = pg, dbname
        pg.psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        pg.restart()
        pg.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements", dbname)

    def pids(self) -> list[int]:
        main = int((self.pg.data / "postmaster.pid").read_text().split()[0])
        pids = [main]
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
                    if int(stat[1]) == main:
                        pids.append(int(d.name))
        return pids

    def cpu_s(self) -> float:
        total = 0.0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                total += proc_cpu_s(pid)
        return total

    def pss_mb(self) -> float:
        total = 0.0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) / 1024
        return total

    def commits(self) -> int:
        return int(
            self.pg.psql(
                f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{self.dbname}'"
            ).strip()
        )

    def reset(self) -> None:
        self.pg.psql("SELECT pg_stat_statements_reset()", self.dbname)

    def top(self, window_s: float, k: int = 8) -> list[dict[str, Any]]:
        """The statements that took the most time since :meth:`reset`."""
        out = self.pg.psql(
            "SELECT calls, total_exec_time, rows, regexp_replace(query, '\\s+', ' ', 'g')"
            " FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT " + str(k),
            self.dbname,
        )
        top = []
        for line in out.splitlines():
            calls, total_ms, rows, query = line.split("|", 3)
            top.append(
                {
                    "query": query[:100],
                    "calls_per_s": int(calls) / window_s,
                    "mean_ms": float(total_ms) / max(1, int(calls)),
                    "ms_per_s": float(total_ms) / window_s,
                    "rows_per_call": int(rows) / max(1, int(calls)),
                }
            )
        return top


def proc_cpu_s(pid: int, thread: int | None = None) -> float:
    """A process's CPU seconds (or one thread's of it)."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mb(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return math.nan


def healthz(port: int, timeout: float = 5.0) -> tuple[dict[str, Any] | None, float]:
    """/healthz's answer (None on failure) and how long it took."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        doc = json.loads(data.split(b"\r\n\r\n", 1)[1])
        return doc, time.perf_counter() - t0
    except (OSError, ValueError, IndexError):
        return None, time.perf_counter() - t0


def seed_db(db: Path, gateways: int, follows: list[list[int]], auth: str) -> list[str]:
    """Create the database with ``gateways`` regions (and a topic per followed source).

    The schema comes from the store (created and migrated by it). In
    ``region`` mode each region gets a real token from the store (its
    hash as the server writes it); in ``admin`` mode the regions
    are inserted without tokens of their own in one transaction (the
    gateways then send the admin token).
    """
    sys.path.insert(0, str(BENCH_DIR.parent))
    import sqlite3

    from edge_gateway.metadata._db import MetadataStore

    store = MetadataStore(db)
    tokens: list[str] = []
    now = int(time.time() * 1000)
    if auth == "region":
        for i in range(gateways):
            tokens.append(store.add_region(region_name(i), now))
    store.close()
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        if auth != "region":
            conn.executemany(
                "INSERT INTO regions (id, created_ms) VALUES (?, ?)",
                [(region_name(i), now) for i in range(gateways)],
            )
            tokens = [ADMIN_TOKEN] * gateways
        followers: dict[int, list[str]] = {}
        for gw, srcs in enumerate(follows):
            for s in srcs:
                followers.setdefault(s, []).append(region_name(gw))
        # One topic per site that others follow (a realistic routing table's size).
        conn.executemany(
            "INSERT INTO topics (name, home, partitions, retention_ms, subscribers,"
            " created_ms, updated_ms) VALUES (?, ?, 1, NULL, ?, ?, ?)",
            [
                (f"t-{region_name(s)}", region_name(s), json.dumps(sorted(subs)), now, now)
                for s, subs in sorted(followers.items())
            ],
        )
        conn.execute(
            "UPDATE meta SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)"
            " WHERE key = 'routing_version'"
        )
        conn.execute("COMMIT")
    finally:
        conn.close()
    return tokens


# ----------------------------------------------------------------- baselines

_TRIVIAL_APP = r"""
import sys, trio
from hypercorn.config import Config
from hypercorn.trio import serve
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"}); return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"11")]})
    await send({"type": "http.response.body", "body": b'{"ok":true}'})
async def builtin():
    import logging
    from edge_gateway.net.http11 import Http11Server
    listeners = await trio.open_tcp_listeners(int(sys.argv[1]), host="127.0.0.1")
    await Http11Server(app, log=logging.getLogger("x"), keep_alive_timeout=75.0).serve(listeners)
if sys.argv[2] == "hypercorn":
    cfg = Config(); cfg.bind = ["127.0.0.1:" + sys.argv[1]]; cfg.accesslog = None
    cfg.errorlog = None; cfg.keep_alive_timeout = 75.0
    trio.run(serve, app, cfg)
else:
    trio.run(builtin)
"""


def baseline(seconds: float, idle_connections: int, server: str) -> dict[str, float]:
    """A trivial ASGI endpoint on the same HTTP server as the metadata server's: closed-loop
    capacity, latency, CPU per 1,000 requests; and the RSS each idle connection adds."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _TRIVIAL_APP, str(port), server])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the baseline server did not start") from None
                time.sleep(0.05)
        time.sleep(0.3)
        rss0 = proc_rss_mb(proc.pid)
        load = subprocess.Popen(
            [
                *(sys.executable, str(BENCH_DIR / "_load.py"), "127.0.0.1", str(port)),
                *("--path", "/x", "--body", "{}", "--connections", "32"),
                *("--seconds", str(seconds), "--warmup", "0.5"),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert load.stdout is not None
        cpu0 = t0 = 0.0
        lines = []
        for line in load.stdout:
            lines.append(line)
            if line.strip() == "measuring":
                cpu0, t0 = proc_cpu_s(proc.pid), time.monotonic()
            elif line.strip() == "done":
                cpu1, t1 = proc_cpu_s(proc.pid), time.monotonic()
        load.wait()
        res = json.loads(lines[-1])
        rps = res["requests"] / res["seconds"]
        cpu_per_k = (cpu1 - cpu0) / max(1, res["requests"]) * 1000
        cpu_pct = (cpu1 - cpu0) / (t1 - t0) * 100
        # idle keep-alive connections, each having served one request
        socks = []
        req = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
        for _ in range(idle_connections):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(req)
            socks.append(s)
        for s in socks:
            s.recv(65536)
        time.sleep(0.5)
        rss1 = proc_rss_mb(proc.pid)
        for s in socks:
            s.close()
        return {
            "rps": rps,
            "p50_ms": res["p50_s"] * 1000,
            "p99_ms": res["p99_s"] * 1000,
            "cpu_s_per_1k": cpu_per_k,
            "cpu_pct": cpu_pct,
            "rss_idle_mb": rss0,
            "rss_per_conn_kb": (rss1 - rss0) * 1024 / max(1, idle_connections),
        }
    finally:
        proc.terminate()
        proc.wait()


def healthz_all(ports: list[int]) -> tuple[dict[str, Any] | None, float]:
    """Every replica's /healthz, summed (None if one failed), and the longest it took.

    ``long_polls``: the polls and watches held (a server counts its head streams
    among its held requests too: they are ``head_streams``, apart).
    """
    total: dict[str, Any] = {
        "long_polls": 0,
        "head_streams": 0,
        "shed": 0,
        "line_latency_counts": None,
        "replica_sync": None,
        # The servers' collector (absent: a server before it): collections and
        # pause seconds per generation, summed; the longest pause of any.
        "gc_collections": None,
        "gc_pause_s": None,
        "gc_max_pause_ms": None,
    }
    took_max = 0.0
    failed = False
    for port in ports:
        doc, took = healthz(port)
        took_max = max(took_max, took)
        if doc is None:
            failed = True
        else:
            streams = doc.get("head_streams", 0)  # absent: a server before protocol 3
            total["long_polls"] += doc["long_polls"] - streams
            total["head_streams"] += streams
            total["shed"] += doc["shed"]
            counts = doc.get("line_latency_counts")  # absent: a server before it
            if counts is not None:
                prev = total["line_latency_counts"] or [0] * len(counts)
                total["line_latency_counts"] = [a + b for a, b in zip(prev, counts, strict=True)]
            pygc = doc.get("python_gc") or {}
            if "collections" in pygc:
                for k, v in (("gc_collections", "collections"), ("gc_pause_s", "pause_seconds")):
                    prev = total[k] or [0] * len(pygc[v])
                    total[k] = [x + y for x, y in zip(prev, pygc[v], strict=True)]
                worst = max(pygc["max_pause_ms"])
                total["gc_max_pause_ms"] = max(total["gc_max_pause_ms"] or 0.0, worst)
            sync = doc.get("replica_sync")  # PostgreSQL replicas only
            if sync is not None:
                summed = total["replica_sync"] or dict.fromkeys(sync, 0)
                total["replica_sync"] = {k: summed[k] + v for k, v in sync.items()}
    return (None if failed else total), took_max


def gc_window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The servers' collections and pauses over the window, from two :func:`healthz_all` sums."""
    c0, c1 = before.get("gc_collections"), after.get("gc_collections")
    p0, p1 = before.get("gc_pause_s"), after.get("gc_pause_s")
    if c0 is None or c1 is None or p0 is None or p1 is None:
        return {}
    return {
        "server_gc_collections": [b - a for a, b in zip(c0, c1, strict=True)],
        "server_gc_pause_ms": [(b - a) * 1000 for a, b in zip(p0, p1, strict=True)],
        # Since the server listened (the ramp too): a pause this long stops every request.
        "server_gc_max_pause_ms": after.get("gc_max_pause_ms"),
    }


def gc_rows(figures: dict[str, Any]) -> list[Row | str]:
    """The servers' collector over the window, if they report it."""
    if "server_gc_collections" not in figures:
        return []
    young, middle, full = figures["server_gc_collections"]
    pause = figures["server_gc_pause_ms"]
    return [
        "the servers' garbage collector (the window)",
        Row("full collections", full, "", "young and middle", young + middle),
        Row("  paused in full ones", pause[2], "ms", "in young and middle", pause[0] + pause[1]),
        Row("  longest pause since listening", figures["server_gc_max_pause_ms"], "ms"),
    ]


def token_check_ms(port: int) -> float:
    """Server time of one first-contact region token check, via a fresh region."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=url, timeout=30) as c:
        c.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        r = c.post("/v1/regions", json={"id": "bench-token-probe"})
        token = r.json()["token"]
        probe = {"Authorization": f"Bearer {token}"}
        t0 = time.perf_counter()
        c.get("/v1/routing", headers=probe)  # first contact: the check
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        c.get("/v1/routing", headers=probe)  # cached
        cached = time.perf_counter() - t0
    return (first - cached) * 1000


# -------------------------------------------------------------- the analysis


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "count": dict.fromkeys(OPS, 0),
        "errors": dict.fromkeys(OPS, 0),
        "shed": dict.fromkeys(OPS, 0),
        "lat": {op: [] for op in OPS},
        "reports": {},
        "wakes": {},
        "back": {},
        "opens": 0,
        "loop_lag": [],
        "report_queue": [],
        "failures": {},
    }
    for r in results:
        for kind, k in r["failures"].items():
            out["failures"][kind] = out["failures"].get(kind, 0) + k
        out["opens"] += r["opens"]
        out["loop_lag"].extend(r["loop_lag"])
        out["report_queue"].extend(r["report_queue"])
        for key in ("count", "errors", "shed"):
            for op in OPS:
                out[key][op] += r[key][op]
        for op in OPS:
            out["lat"][op].extend(r["lat"][op])
        out["reports"].update(r["reports"])
        out["wakes"].update(r["wakes"])
        out["back"].update(r["back"])
    return out


def wake_latencies(
    reports: dict[str, list[list[float]]],
    wakes: dict[str, list[list[float]]],
    follows: list[list[int]],
) -> tuple[list[float], int]:
    """Per report with followers: sent → its last follower's first answer with that seq or
    a later one. Also the number of (report, follower) pairs never woken."""
    followers: dict[str, list[int]] = {}
    for gw, srcs in enumerate(follows):
        for s in srcs:
            followers.setdefault(region_name(s), []).append(gw)
    out: list[float] = []
    missed = 0
    for region, sent in reports.items():
        subs = followers.get(region, [])
        if not subs:
            continue
        views = []
        for gw in subs:
            seen = sorted(wakes.get(f"{gw}|{region}", []), key=lambda x: x[1])
            # the running max seq by time: the first answer at or above a seq
            seqs, times, best = [], [], -1
            for seq, t in seen:
                if seq > best:
                    best = seq
                    seqs.append(seq)
                    times.append(t)
            views.append((seqs, times))
        for seq, t_sent in sent:
            worst = 0.0
            for seqs, times in views:
                k = bisect.bisect_left(seqs, seq)
                if k == len(seqs):
                    missed += 1
                    worst = math.inf
                    break
                worst = max(worst, times[k] - t_sent)
            if worst != math.inf:
                out.append(worst)
    return out, missed


# ------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few hundred gateways, < 1 minute")
    ap.add_argument("--gateways", type=int, default=None)
    ap.add_argument("--procs", type=int, default=None, help="load processes (default: 1-2)")
    ap.add_argument("--heartbeat-s", type=float, default=10.0)
    ap.add_argument("--routing-s", type=float, default=5.0)
    ap.add_argument(
        "--routing-safety-s",
        type=float,
        default=300.0,
        help="routing poll while heartbeats confirm the version (0: every --routing-s, "
        "as gateways before the agent used heartbeats for it)",
    )
    ap.add_argument("--ship-share", type=float, default=0.10)
    ap.add_argument("--ship-ms", type=float, default=250.0)
    ap.add_argument("--follow", type=int, default=2, help="sources each gateway mirrors")
    ap.add_argument("--wait-ms", type=int, default=30_000)
    ap.add_argument(
        "--protocol",
        choices=("watch", "poll"),
        default="watch",
        help="heads: one held watch per gateway (as the agent), or a long poll re-sent "
        "after every answer (as gateways before protocol 2)",
    )
    ap.add_argument(
        "--reports",
        choices=("stream", "request"),
        default="stream",
        help="head reports: lines of one head stream per gateway once the server names "
        "protocol 3 (as the agent), or one request each (as gateways before protocol 3)",
    )
    ap.add_argument(
        "--pool",
        type=int,
        default=None,
        help="control connections per process (default: one per 10 gateways, at least 48)",
    )
    ap.add_argument("--duration-s", type=float, default=None)
    ap.add_argument(
        "--ramp-s",
        type=float,
        default=None,
        help="gateways start over this long before the window (default: 10 s, 4 s --quick)",
    )
    ap.add_argument("--away-s", type=float, default=None, help="server stopped this long")
    ap.add_argument("--herd-timeout-s", type=float, default=None)
    ap.add_argument("--auth", choices=("admin", "region"), default="admin")
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="server processes; more than one run as replicas on PostgreSQL (a throwaway "
        "cluster from Debian's postgresql), the gateways spread over them",
    )
    ap.add_argument("--server", choices=("builtin", "hypercorn"), default="builtin")
    ap.add_argument("--server-arg", action="append", default=[], help="extra serve option")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--profile-server",
        metavar="PATH",
        help="run the server under cProfile: PATH.1 (the measured run), PATH.2 (after the herd)",
    )
    ap.add_argument(
        "--profile-load",
        metavar="PATH",
        help="run each load process under cProfile: PATH.0, PATH.1, ...",
    )
    ap.add_argument("--load-plan", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.load_plan:
        load_main(a.load_plan)
        return
    n = a.gateways or (300 if a.quick else 10_000)
    procs = a.procs or (1 if n <= 1000 else 2)
    pool = a.pool or max(48, n // procs // 10)
    duration = a.duration_s or (8.0 if a.quick else 60.0)
    away = a.away_s if a.away_s is not None else (3.0 if a.quick else 120.0)
    herd_timeout = a.herd_timeout_s or (90.0 if a.quick else 300.0)
    # Gateways start over the ramp: at 10,000, ten seconds is itself a herd
    # (every gateway opens its watch and fetches the ~100 KB gzipped routing table),
    # so a steady-state window needs a longer one (--ramp-s).
    ramp = a.ramp_s if a.ramp_s is not None else min(a.heartbeat_s, 4.0 if a.quick else 10.0)
    rng = random.Random(a.seed)
    n_ship = max(1, round(n * a.ship_share))
    shippers = sorted(rng.sample(range(n), n_ship))
    follows = []
    for gw in range(n):
        srcs: set[int] = set()
        while len(srcs) < min(a.follow, n - 1):
            s = rng.randrange(n)
            if s != gw:
                srcs.add(s)
        follows.append(sorted(srcs))

    with scratch_dir("fleet-") as tmp:
        progress(f"baseline: a trivial ASGI endpoint on the {a.server} server")
        base = baseline(2.0 if a.quick else 8.0, min(n, 2000), a.server)
        db = tmp / "meta.sqlite"
        progress(f"seeding {n} regions ({a.auth} auth)")
        tokens = seed_db(db, n, follows, a.auth)
        extra = ["--server", a.server, *a.server_arg]
        pg: Any = None
        pg_watch: PgWatch | None = None
        if a.replicas > 1:
            from edge_gateway.testing.postgres import Postgres

            progress(f"PostgreSQL for {a.replicas} replicas; copying the regions into it")
            # Not under the scratch directory: the cluster runs as user postgres.
            pg = Postgres(Path(tempfile.mkdtemp(prefix="edgegw-pg-")))
            try:
                url = pg.create_database("fleet")
                pg_watch = PgWatch(pg, "fleet")
                subprocess.run(
                    [str(EDGEGW), "metadata", "migrate", "--from", str(db), "--to", url],
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
            except BaseException:  # the cluster outlives this process otherwise
                pg.stop("immediate")
                shutil.rmtree(pg.root, ignore_errors=True)
                raise
            # Each replica its own profile: PATH.r<i>.1, PATH.r<i>.2.
            servers = [
                Server(
                    url,
                    free_port(),
                    extra,
                    f"{a.profile_server}.r{i}" if a.profile_server else None,
                    files=tmp / f"replica-{i}",
                )
                for i in range(a.replicas)
            ]
        else:
            servers = [Server(db, free_port(), extra, a.profile_server, files=db)]
        server = Replicas(servers)
        port = server.ports[0]
        server.start()
        try:
            check_ms = token_check_ms(port)
            rss_start = server.rss_mb()
            t0 = time.time() + 2.0
            measure_from = t0 + ramp + 2.0
            measure_to = measure_from + duration
            away_at = measure_to + 5.0  # wakes of the last reports are still collected
            stop_file = tmp / "stop"
            plans = []
            for p in range(procs):
                lo, hi = n * p // procs, n * (p + 1) // procs
                plan = Plan(
                    "127.0.0.1",
                    port,
                    server.ports,
                    n,
                    lo,
                    hi,
                    tokens,
                    a.heartbeat_s,
                    a.routing_s,
                    a.routing_safety_s,
                    a.ship_ms,
                    shippers,
                    follows,
                    a.wait_ms,
                    a.protocol,
                    a.reports,
                    pool,
                    t0,
                    ramp,
                    measure_from,
                    measure_to,
                    away_at,
                    str(stop_file),
                    str(tmp / "back"),
                    str(tmp / f"load-{p}.json"),
                    a.seed + p,
                )
                path = tmp / f"plan-{p}.json"
                path.write_text(json.dumps(plan.__dict__))
                plans.append(plan)
            loads = []
            for p in range(procs):
                argv = [__file__, "--load-plan", str(tmp / f"plan-{p}.json")]
                if a.profile_load:
                    argv = ["-c", _PROFILE_SERVER, f"{a.profile_load}.{p}", *argv]
                argv.insert(0, sys.executable)
                loads.append(subprocess.Popen(argv))
            progress(
                f"{n} gateways ({n_ship} shipping every {a.ship_ms:g} ms, following {a.follow} "
                f"each) from {procs} process(es); ramp {ramp:g} s, window {duration:g} s"
            )
            time.sleep(max(0.0, measure_from - time.time()))
            doc, _ = healthz_all(server.ports)
            lines0 = (doc or {}).get("line_latency_counts")
            sync0 = (doc or {}).get("replica_sync")
            gc0 = doc or {}
            if pg_watch is not None:
                pg_watch.reset()
                pg_cpu0, pg_commits0 = pg_watch.cpu_s(), pg_watch.commits()
            each0, main0 = server.cpu_each(), server.main_thread_cpu_each()
            cpu0, w0 = sum(each0), time.time()
            load_cpu0 = [proc_cpu_s(p.pid) for p in loads]
            held_seen: list[int] = []
            health_lat: list[float] = []
            health_fail = 0
            while time.time() < measure_to:
                doc, took = healthz_all(server.ports)
                health_lat.append(took)
                if doc is None:
                    health_fail += 1
                else:
                    held_seen.append(doc["long_polls"])
                    if lines0 is None:  # the first probe failed: count from this one
                        lines0 = doc.get("line_latency_counts")
                time.sleep(0.5)
            each1, main1 = server.cpu_each(), server.main_thread_cpu_each()
            cpu1, w1 = sum(each1), time.time()
            pg_figures: dict[str, Any] = {}
            if pg_watch is not None:
                pg_figures = {
                    "pg_cpu_pct": (pg_watch.cpu_s() - pg_cpu0) / (w1 - w0) * 100,
                    "pg_commits_per_s": (pg_watch.commits() - pg_commits0) / (w1 - w0),
                    "pg_pss_mb": pg_watch.pss_mb(),
                    "pg_top_statements": pg_watch.top(w1 - w0),
                }
            load_cpu1 = [proc_cpu_s(p.pid) for p in loads]
            doc, _ = healthz_all(server.ports)
            if doc is None:  # a probe failed: the last that answered in the window
                doc, _ = healthz_all(server.ports)
            lines1 = (doc or {}).get("line_latency_counts")
            sync1 = (doc or {}).get("replica_sync")
            gc1 = doc or {}
            streams_end = (doc or {}).get("head_streams")
            if doc is not None:
                held_seen.append(doc["long_polls"])
            held_end = held_seen[-1] if held_seen else 0
            held_min = min(held_seen) if held_seen else None
            held_max = max(held_seen) if held_seen else 0
            rss_each = server.rss_each()
            rss = sum(rss_each)
            rss_peak = server.rss_mb("VmHWM")
            cpu_pct = (cpu1 - cpu0) / (w1 - w0) * 100
            # ---- the reconnect herd
            time.sleep(max(0.0, away_at - time.time()))
            progress(f"stopping the server for {away:g} s (the gateways back off meanwhile)")
            server.stop()
            time.sleep(away)
            spawned_at = time.time()
            (tmp / "back").write_text(repr(spawned_at))  # anything answered after is the new run
            back_at = server.start()
            progress("server back; waiting for every gateway")
            herd_health: list[float] = []
            herd_fail = 0
            deadline = back_at + herd_timeout
            while time.time() < deadline:
                doc, took = healthz_all(server.ports)
                herd_health.append(took)
                if doc is None:
                    herd_fail += 1
                full = 0
                for p in plans:
                    with contextlib.suppress(OSError, ValueError):  # not written yet, or half
                        full += int(Path(p.out_file + ".progress").read_text() or 0)
                if full >= n:
                    break
                time.sleep(0.25)
            doc, _ = healthz_all(server.ports)
            herd_held = doc["long_polls"] if doc else None
            stop_file.touch()
            for p in loads:
                p.wait(timeout=120)
            herd_cpu_s = server.cpu_s()
            herd_shed = (doc or {}).get("shed")
        finally:
            server.stop()
            if pg is not None:
                pg.stop("immediate")
                shutil.rmtree(pg.root, ignore_errors=True)
            # The server's log outlives the scratch directory (bench/out is git-ignored).
            with contextlib.suppress(OSError):
                shutil.copyfile(server.log, OUT_DIR / "fleet-server-last.log")
        results = [json.loads(Path(p.out_file).read_text()) for p in plans]
        progress("loads done")

    m = merge(results)
    window = w1 - w0
    figures: dict[str, Any] = {
        "gateways": n,
        "procs": procs,
        "auth": a.auth,
        "server": a.server,
        "replicas": a.replicas,
        "store": "postgres" if a.replicas > 1 else "sqlite",
    }

    def rate(op: str) -> float:
        return m["count"][op] / window

    def pct(op: str, q: float) -> float:
        return percentile(m["lat"][op], q) * 1000

    wake, missed = wake_latencies(m["reports"], m["wakes"], follows)
    wake_ms = [w * 1000 for w in wake]
    # Where a wake's time goes: in the server (report received → its line written
    # to a watch's socket, the server's histogram over the window) and in the load
    # processes (how late their loop ran a timer: a line on the socket waits that).
    server_line_ms: dict[str, float | None] = {"p50": None, "p99": None}
    if lines0 is not None and lines1 is not None:
        sys.path.insert(0, str(BENCH_DIR.parent))
        from edge_gateway.metadata._fanout import LatencyHistogram

        window_counts = [b - a for a, b in zip(lines0, lines1, strict=True)]
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            v = LatencyHistogram.quantile_of(window_counts, q)
            server_line_ms[name] = None if v is None else v * 1000
    lag_ms = [x * 1000 for x in sorted(m["loop_lag"])]
    queue_ms = [x * 1000 for x in sorted(m["report_queue"])]
    # The ceiling: what the asked load would cost at the CPU per report measured
    # (the server serves one core at most: one trio thread), and the load side's.
    asked_reports = n_ship * 1000 / a.ship_ms
    served_reports = m["count"]["head_report"] / (w1 - w0)
    # Requests asked per second: heartbeats, reports, routing safety polls (the
    # watch's lines ride on them: their cost is in the CPU per request measured).
    asked = n / a.heartbeat_s + asked_reports + n / max(a.routing_s, a.routing_safety_s)
    served = sum(m["count"][op] for op in OPS if not (a.protocol == "watch" and op == "heads_poll"))
    scale = asked / (served / (w1 - w0)) if served else math.nan
    load_cpu_pct = [(b - c) / (w1 - w0) * 100 for c, b in zip(load_cpu0, load_cpu1, strict=True)]
    # herd: every gateway had a heartbeat and a routing answer, and holds a long poll
    lasts = []
    for gw in range(n):
        b = m["back"].get(str(gw), {})
        if all(op in b for op in BACK_OPS):
            lasts.append(max(b[op] for op in BACK_OPS))
    complete = len(lasts)
    reconnect = max(lasts) - back_at if complete == n else None
    # Requests: with the watch, its lines are not requests (each open is one).
    watching = a.protocol == "watch"
    total_rps = sum(rate(op) for op in OPS if not (watching and op == "heads_poll"))
    cpu_s = cpu1 - cpu0
    # The growth over the idle server, per poll held (at most: the peak count seen).
    rss_per_poll_kb = (rss - rss_start) * 1024 / max(1, held_max)
    figures.update(
        heartbeat_per_s=rate("heartbeat"),
        heartbeat_p50_ms=pct("heartbeat", 50),
        heartbeat_p99_ms=pct("heartbeat", 99),
        head_report_per_s=rate("head_report"),
        head_report_p50_ms=pct("head_report", 50),
        head_report_p99_ms=pct("head_report", 99),
        routing_per_s=rate("routing"),
        routing_p50_ms=pct("routing", 50),
        routing_p99_ms=pct("routing", 99),
        protocol=a.protocol,
        heads_answers_per_s=rate("heads_poll"),
        watch_opens=m["opens"],
        requests_per_s=total_rps,
        requests_per_gateway_s=total_rps / n,
        routing_safety_s=a.routing_safety_s,
        errors={op: m["errors"][op] for op in OPS},
        load_failures=dict(sorted(m["failures"].items(), key=lambda kv: -kv[1])[:8]),
        shed_503={op: m["shed"][op] for op in OPS},
        long_polls_held=held_end,
        head_streams_held=streams_end,
        long_polls_held_min=held_min,
        wake_p50_ms=percentile(wake_ms, 50),
        wake_p99_ms=percentile(wake_ms, 99),
        wake_reports=len(wake_ms),
        wake_server_line_p50_ms=server_line_ms["p50"],
        wake_server_line_p99_ms=server_line_ms["p99"],
        load_loop_lag_p50_ms=percentile(lag_ms, 50) if lag_ms else None,
        load_loop_lag_p99_ms=percentile(lag_ms, 99) if lag_ms else None,
        load_cpu_pct=load_cpu_pct,
        load_cpu_pct_total=sum(load_cpu_pct),
        report_queue_p50_ms=percentile(queue_ms, 50) if queue_ms else None,
        report_queue_p99_ms=percentile(queue_ms, 99) if queue_ms else None,
        head_reports_asked_per_s=asked_reports,
        requests_asked_per_s=asked,
        server_cores_for_asked=cpu_pct / 100 * scale,
        load_cores_for_asked=sum(load_cpu_pct) / 100 * scale,
        machine_cores=os.cpu_count(),
        load_average=os.getloadavg()[0],
        wake_missed=missed,
        server_rss_mb=rss,
        server_rss_peak_mb=rss_peak,
        server_rss_start_mb=rss_start,
        rss_per_poll_kb=rss_per_poll_kb,
        server_cpu_pct=cpu_pct,
        cpu_s_per_1k_requests=cpu_s / max(1.0, total_rps * window) * 1000,
        # The server's CPU per gateway, whatever the protocol: what sizing needs.
        cpu_ms_per_gateway_s=cpu_s / window / n * 1000,
        healthz_p99_ms=percentile(health_lat, 99) * 1000,
        healthz_failures=health_fail,
        long_polls_held_max=held_max,
        reconnect_all_s=reconnect,
        reconnect_complete=complete,
        away_s=away,
        herd_healthz_max_ms=max(herd_health) * 1000 if herd_health else None,
        herd_healthz_failures=herd_fail,
        herd_shed_503=herd_shed,
        herd_long_polls_held=herd_held,
        herd_server_cpu_s=herd_cpu_s,
        token_check_ms=check_ms,
        restart_token_checks_s=n * check_ms / 1000 / 2 if a.auth == "region" else None,
        baseline=base,
        **gc_window(gc0, gc1),
    )
    replica_rows: list[Row | str] = []
    if a.replicas > 1:
        # Per replica, PostgreSQL's share, and the group commit and sync over the window.
        sync: dict[str, float] = {}
        if sync0 is not None and sync1 is not None:
            sync = {k: sync1[k] - sync0[k] for k in sync1}
        batches, polls = sync.get("batches", 0), sync.get("polls", 0)
        figures.update(
            replica_cpu_pct=[(b - c) / window * 100 for c, b in zip(each0, each1, strict=True)],
            replica_main_thread_pct=[
                (b - c) / window * 100 for c, b in zip(main0, main1, strict=True)
            ],
            replica_rss_mb=rss_each,
            **pg_figures,
            sync_batches_per_s=batches / window,
            sync_reports_per_batch=sync["reports"] / batches if batches else None,
            sync_regions_per_batch=sync["batch_moves"] / batches if batches else None,
            sync_batch_ms=sync["batch_s"] / batches * 1000 if batches else None,
            sync_polls_per_s=polls / window,
            sync_poll_ms=sync["poll_s"] / polls * 1000 if polls else None,
            sync_notified_per_s=sync.get("notified", 0) / window,
            sync_heads_applied_per_s=sync.get("heads_applied", 0) / window,
        )
        replica_rows = ["replicas and PostgreSQL (the window)"]
        for i, (c, r) in enumerate(
            zip(figures["replica_cpu_pct"], figures["replica_rss_mb"], strict=True)
        ):
            replica_rows.append(Row(f"replica {i} CPU", c, "% of a core", "RSS MB", r))
            replica_rows.append(
                Row(
                    "  of it the trio thread",
                    figures["replica_main_thread_pct"][i],
                    "% of a core",
                    "threads (db)",
                    c - figures["replica_main_thread_pct"][i],
                )
            )
        if pg_figures:
            replica_rows += [
                Row("PostgreSQL CPU", pg_figures["pg_cpu_pct"], "% of a core", "replicas", cpu_pct),
                Row("  PostgreSQL PSS", pg_figures["pg_pss_mb"], "MB", "replicas' RSS", rss),
                Row(
                    "  commits", pg_figures["pg_commits_per_s"], "/s", "batches/s", batches / window
                ),
            ]
        replica_rows += [
            Row("group commit: batches", batches / window, "/s", "reports/s", served_reports),
            Row(
                "  reports per batch",
                figures["sync_reports_per_batch"],
                "",
                "regions",
                figures["sync_regions_per_batch"],
            ),
            Row(
                "  batch, start to commit",
                figures["sync_batch_ms"],
                "ms",
                "poll",
                figures["sync_poll_ms"],
            ),
            Row("polls", polls / window, "/s", "notifications/s", figures["sync_notified_per_s"]),
        ]
        for st in pg_figures.get("pg_top_statements", [])[:5]:
            replica_rows.append(
                f"  pg: {st['ms_per_s']:7.1f} ms/s {st['calls_per_s']:7.1f} calls/s "
                f"{st['mean_ms']:.3f} ms {st['query'][:70]}"
            )
    polling = (
        f"heartbeats stand in, safety {a.routing_safety_s:g} s" if a.routing_safety_s else "always"
    )
    rows: list[Row | str] = [
        f"{n} gateways, {n_ship} shipping every {a.ship_ms:g} ms, each following {a.follow}; "
        f"heartbeat {a.heartbeat_s:g} s, routing {a.routing_s:g} s "
        f"({polling}); "
        f"window {window:.0f} s; heads by {a.protocol}; "
        + (f"{a.replicas} replicas on PostgreSQL " if a.replicas > 1 else "one server on SQLite ")
        + "(shared machine: noisy)",
        Row("requests served", total_rps, "req/s", "trivial endpoint c=32", base["rps"]),
        Row("  per gateway", total_rps / n, "req/s", "heartbeats per gateway", 1 / a.heartbeat_s),
    ]
    for op, label in (
        ("heartbeat", "heartbeats"),
        ("head_report", "head reports"),
        ("routing", "routing refreshes"),
    ):
        rows.append(Row(label, rate(op), "/s", "trivial endpoint c=32", base["rps"]))
        rows.append(Row(f"  {label} p50", pct(op, 50), "ms", "trivial p50", base["p50_ms"]))
        rows.append(Row(f"  {label} p99", pct(op, 99), "ms", "trivial p99", base["p99_ms"]))
    rows += [
        Row(
            "heads lines (watch)" if watching else "heads answers (polls)",
            rate("heads_poll"),
            "/s",
            "head reports",
            rate("head_report"),
        ),
        Row("long polls held", held_end, "", "gateways", n, ok=held_end >= n * 0.99),
        Row(
            "wake p50 (report → all followers)",
            percentile(wake_ms, 50),
            "ms",
            "trivial p50",
            base["p50_ms"],
        ),
        Row(
            "wake p99",
            percentile(wake_ms, 99),
            "ms",
            "trivial p99",
            base["p99_ms"],
            target="<= 250",
            ok=bool(wake_ms) and percentile(wake_ms, 99) <= 250,
        ),
        Row(
            "  server: report → line written (p99)",
            server_line_ms["p99"],
            "ms",
            "p50",
            server_line_ms["p50"],
        ),
        Row(
            "  load: loop lag, line waits (p99)",
            figures["load_loop_lag_p99_ms"],
            "ms",
            "p50",
            figures["load_loop_lag_p50_ms"],
        ),
        Row(
            "  load: report waits for a connection (p99)",
            figures["report_queue_p99_ms"],
            "ms",
            "p50",
            figures["report_queue_p50_ms"],
        ),
        Row(
            "load processes' CPU",
            sum(load_cpu_pct),
            "% of a core",
            "server CPU",
            cpu_pct,
        ),
        "the ceiling: the requests asked at the CPU per request measured",
        Row("requests asked", asked, "/s", "served", served / (w1 - w0)),
        Row("  of them head reports", asked_reports, "/s", "served", served_reports),
        Row(
            "  server cores it needs",
            figures["server_cores_for_asked"],
            "cores",
            "one server has",
            1.0,
            target="<= 1",
            ok=figures["server_cores_for_asked"] <= 1,
        ),
        Row(
            "  load processes' cores",
            figures["load_cores_for_asked"],
            "cores",
            "machine cores",
            float(os.cpu_count() or 1),
        ),
        Row("  machine load average (1 min)", figures["load_average"], "", "cores", os.cpu_count()),
        Row(
            "server RSS",
            rss,
            "MB",
            "bare server idle",
            base["rss_idle_mb"],
            target="<= 512",
            ok=rss <= 512,
        ),
        Row(
            "  RSS per held poll", rss_per_poll_kb, "KB", "idle conn, bare", base["rss_per_conn_kb"]
        ),
        Row("server CPU", cpu_pct, "% of a core", "trivial at c=32", base["cpu_pct"]),
        Row(
            "  CPU per gateway",
            figures["cpu_ms_per_gateway_s"],
            "ms/s",
            "trivial, per request",
            base["cpu_s_per_1k"],
        ),
        Row(
            "  CPU per 1,000 requests",
            figures["cpu_s_per_1k_requests"],
            "s",
            "trivial",
            base["cpu_s_per_1k"],
        ),
        *gc_rows(figures),
        *replica_rows,
        "reconnect herd",
        Row(
            "reconnect_all_s",
            reconnect,
            "s",
            f"away {away:g} s",
            away,
            target="<= 60",
            ok=reconnect is not None and reconnect <= 60,
        ),
        Row(
            "  /healthz max during herd",
            figures["herd_healthz_max_ms"],
            "ms",
            "failures",
            herd_fail,
        ),
        Row("token check (first contact)", check_ms, "ms", "trivial p50", base["p50_ms"]),
    ]
    print(render_table("fleet: the metadata server, many gateways", rows))
    emit_json(figures)


if __name__ == "__main__":
    main()
