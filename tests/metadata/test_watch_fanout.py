"""Head reports write their lines to watches in step themselves (no task woken per watch).

In-process, with the app's ASGI ``send`` and the server's ``send_nowait``
(the SEND_NOWAIT scope extension) held by the test: a report's line reaches
every watch in step before any checkpoint, only watches of its region get
it, and a line the socket did not take whole hands the watch back to its
task, which finishes it and coalesces what moved meanwhile. On a real
socket pair: what the socket does not take is held and goes first, whole
and in order, with the exchange's next send. Against a real server
process: reports of a fleet's watches go the direct way, the lines arrive
in order, and ``/healthz`` shows the report → line latency.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import trio
import trio.testing
from _meta_support import ADMIN_TOKEN, MetaServer, http

from edge_gateway import pygc
from edge_gateway.metadata import WatchDecoder
from edge_gateway.metadata._db import MetadataStore
from edge_gateway.metadata._fanout import LatencyHistogram
from edge_gateway.metadata.server import MetadataApp, MetadataServerConfig
from edge_gateway.net.asgi import SEND_NOWAIT
from edge_gateway.net.http11 import _RawFraming, _Reply


class _Sink:
    """The app's ``send`` and the server's ``send_nowait`` of one watch, recorded in order."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, bytes]] = []
        #: send_nowait answers False (the socket did not take it all) while set.
        self.full = False

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.chunks.append(("task", message.get("body", b"")))

    def send_nowait(self, body: bytes) -> bool:
        self.chunks.append(("direct", body))
        return not self.full

    def decoded(self) -> list[tuple[int, dict[str, int]]]:
        return WatchDecoder("test").feed(b"".join(body for _, body in self.chunks))


def _scope(query: bytes, sink: _Sink) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": "/v1/heads",
        "query_string": query,
        "headers": [],
        "extensions": {SEND_NOWAIT: sink.send_nowait},
    }


async def _never() -> dict[str, Any]:
    await trio.sleep_forever()
    raise AssertionError


async def test_a_report_writes_its_line_to_every_watch_in_step_at_once(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path / "m.sqlite")
    try:
        app = MetadataApp(store, MetadataServerConfig(db=tmp_path / "m.sqlite"))
        north, both, other = _Sink(), _Sink(), _Sink()
        async with trio.open_nursery() as nursery:
            for sink, regions in ((north, b"north"), (both, b"north,south"), (other, b"east")):
                query = b"watch=1&since=0&wait_ms=60000&regions=" + regions
                nursery.start_soon(app, _scope(query, sink), _never, sink.send)
            await trio.testing.wait_all_tasks_blocked()
            assert [len(s.chunks) for s in (north, both, other)] == [1, 1, 1]  # the first line
            for seq in range(1, 6):
                app.heads.report("north", seq)
            app.heads.report("south", 1)
            # No checkpoint since the reports: no watch's task ran, yet the lines are out.
            assert [kind for kind, _ in north.chunks] == ["task"] + ["direct"] * 5
            assert [kind for kind, _ in both.chunks] == ["task"] + ["direct"] * 6
            assert len(other.chunks) == 1
            assert app.heads.direct_lines == 11
            assert app.heads.line_latency.count == 11
            await trio.testing.wait_all_tasks_blocked()
            assert len(north.chunks) == 6  # the tasks, run since, wrote nothing more
            nursery.cancel_scope.cancel()
        assert [heads for _, heads in north.decoded()] == [{}] + [{"north": s} for s in range(1, 6)]
        assert both.decoded()[-1][1] == {"south": 1}
        versions = [v for v, _ in both.decoded()]
        assert versions == sorted(set(versions))
        assert versions[-1] == app.heads.version
    finally:
        store.close()


async def test_a_line_the_socket_did_not_take_whole_goes_back_to_the_task(
    tmp_path: Path,
) -> None:
    store = MetadataStore(tmp_path / "m.sqlite")
    try:
        app = MetadataApp(store, MetadataServerConfig(db=tmp_path / "m.sqlite"))
        sink = _Sink()
        async with trio.open_nursery() as nursery:
            query = b"watch=1&since=0&wait_ms=60000&regions=north,south"
            nursery.start_soon(app, _scope(query, sink), _never, sink.send)
            await trio.testing.wait_all_tasks_blocked()
            sink.full = True
            app.heads.report("north", 1)  # written in part: the task must finish it
            app.heads.report("north", 2)  # not in step any more: for the task
            app.heads.report("south", 7)
            assert [kind for kind, _ in sink.chunks] == ["task", "direct"]
            sink.full = False
            await trio.testing.wait_all_tasks_blocked()
            # The task sent once: what moved after the part-written line, coalesced.
            assert [kind for kind, _ in sink.chunks] == ["task", "direct", "task"]
            app.heads.report("north", 3)  # in step again: direct
            assert [kind for kind, _ in sink.chunks][-1] == "direct"
            nursery.cancel_scope.cancel()
        assert [heads for _, heads in sink.decoded()] == [
            {},
            {"north": 1},
            {"north": 2, "south": 7},
            {"north": 3},
        ]
        assert app.heads.direct_lines == 1  # the one taken whole
    finally:
        store.close()


async def test_keep_alive_lines_count_from_the_last_direct_line(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = MetadataStore(tmp_path / "m.sqlite")
    try:
        app = MetadataApp(store, MetadataServerConfig(db=tmp_path / "m.sqlite"))
        sink = _Sink()
        async with trio.open_nursery() as nursery:
            await nursery.start(app.run_background)  # the keep-alive sweep
            query = b"watch=1&since=0&wait_ms=10000&regions=north"
            nursery.start_soon(app, _scope(query, sink), _never, sink.send)
            await trio.sleep(6)
            app.heads.report("north", 1)  # direct, at 6 s
            await trio.sleep(9)  # 15 s: 9 s after the last line, no keep-alive yet
            assert [heads for _, heads in sink.decoded()] == [{}, {"north": 1}]
            await trio.sleep(2)  # 17 s: the keep-alive, 10 s after the direct line
            assert [heads for _, heads in sink.decoded()] == [{}, {"north": 1}, {}]
            # In step: the sweep wrote it (no task woken, no timer per watch).
            assert [kind for kind, _ in sink.chunks] == ["task", "direct", "direct"]
            assert app.heads.direct_keepalives == 1
            # A socket that does not take a keep-alive whole hands it to the task.
            sink.full = True
            await trio.sleep(11)
            sink.full = False
            await trio.testing.wait_all_tasks_blocked()
            assert [kind for kind, _ in sink.chunks][-2:] == ["direct", "task"]
            assert sink.decoded()[-1][1] == {}
            nursery.cancel_scope.cancel()
    finally:
        store.close()


async def test_send_nowait_holds_what_the_socket_does_not_take_and_sends_it_first() -> None:
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(a))
    reader = trio.socket.from_stdlib_socket(b)
    reply = _Reply(stream, _RawFraming(lambda: False), head_only=False)
    await reply({"type": "http.response.start", "status": 200, "headers": []})
    await reply({"type": "http.response.body", "body": b"first\n", "more_body": True})
    lines = [b"line %06d %s\n" % (i, b"x" * 100) for i in range(5000)]
    taken = [reply.send_nowait(line) for line in lines]
    # The socket filled up: from the first line it did not take, every later one is held.
    first_held = taken.index(False)
    assert not any(taken[first_held:])
    received = bytearray()

    async def read_all() -> None:
        while not received.endswith(b"0\r\n\r\n"):
            received.extend(await reader.recv(65536))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        await reply({"type": "http.response.body", "body": b"last\n", "more_body": False})
    stream.socket.close()
    reader.close()
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    data = bytearray()
    while True:  # undo the chunked framing
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        data += body[:size]
        body = body[size + 2 :]
    assert bytes(data) == b"first\n" + b"".join(lines) + b"last\n"


def test_a_server_writes_report_lines_directly_and_shows_their_latency(tmp_path: Path) -> None:
    server = MetaServer(tmp_path / "meta.sqlite")
    try:
        with http(server.url) as c:
            for region in ("north", "south"):
                assert c.post("/v1/regions", json={"id": region}).status_code == 201
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(
                b"GET /v1/heads?watch=1&regions=north,south&wait_ms=60000 HTTP/1.1\r\n"
                b"Host: meta\r\nAuthorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n\r\n"
            )
            data = b""
            while b"\r\n\r\n" not in data:
                data += s.recv(65536)
            assert data.startswith(b"HTTP/1.1 200"), data
            with http(server.url) as c:
                for seq in range(1, 21):
                    region = "north" if seq % 2 else "south"
                    r = c.post(f"/v1/regions/{region}/head", json={"seq": seq})
                    assert r.status_code == 200, r.text
                health = c.get("/healthz").json()
            body = data.split(b"\r\n\r\n", 1)[1]
            seen: list[tuple[int, dict[str, int]]] = []
            deadline = time.monotonic() + 30
            while not seen or seen[-1][1] != {"south": 20}:
                assert time.monotonic() < deadline, seen
                # chunk framing stripped crudely: the lines are the JSON parts
                text = (
                    b"\n".join(part for part in body.split(b"\r\n") if part.startswith(b"{"))
                    + b"\n"
                )
                seen = WatchDecoder("test").feed(text)
                if seen and seen[-1][1] == {"south": 20}:
                    break
                body += s.recv(65536)
        heads = [h for _, h in seen if h]
        assert heads == [{"north" if q % 2 else "south": q} for q in range(1, 21)]
        assert health["watch_lines_direct"] == 20
        assert health["watch_lines"] == 21  # the first line, by the watch's task
        counts = health["line_latency_counts"]
        assert len(counts) == len(LatencyHistogram.BOUNDS_US) + 1
        assert sum(counts) == 20
        assert health["line_latency_p99_ms"] is not None
        assert 0 < health["line_latency_p99_ms"] < 1000
        # the collector is settled when the server listens; its pauses counted from then
        gc = health["python_gc"]
        assert gc["settled"] is True, gc
        assert len(gc["collections"]) == len(gc["max_pause_ms"]) == 3, gc
        assert gc["frozen_objects"] > 0, gc
        assert gc["thresholds"][0] == pygc.GEN0_THRESHOLD, gc
    finally:
        server.stop()


def test_connections_queued_at_once_are_all_served(tmp_path: Path) -> None:
    """A burst of connections (a fleet reconnecting) is taken from the listen
    queue in batches: every one of them is served, and answers on its own socket."""
    server = MetaServer(tmp_path / "meta.sqlite")
    try:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        socks = [socket.create_connection((host, int(port)), timeout=30) for _ in range(300)]
        try:
            for i, s in enumerate(socks):  # all queued before the server reads any
                s.sendall(b"GET /healthz?n=%d HTTP/1.1\r\nHost: meta\r\n\r\n" % i)
            for s in socks:
                data = b""
                while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                    chunk = s.recv(65536)
                    assert chunk, data
                    data += chunk
                assert data.startswith(b"HTTP/1.1 200"), data
        finally:
            for s in socks:
                s.close()
    finally:
        server.stop()
    assert "accept failed" not in server.log.read_text()
