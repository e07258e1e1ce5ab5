"""The heads watch (``GET /v1/heads?watch=1``, protocol 2): one held response per gateway.

Real server processes: the watch delivers every change in order and sends
keep-alive lines; a connection killed (and refused for a while) is resumed
from the last version read without losing a change; a client of the long
poll (protocol 1) still works against this server, and this client against
the previous server's code, taken from git history. In-process, with the
app's ASGI ``send`` held by the test: changes made while a line waits for a
slow reader become one line, and a reader that takes nothing is dropped.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from _meta_support import ADMIN_TOKEN, Fleet, MetaServer, http
from _old_code import old_sources

from edge_gateway.errors import Unavailable
from edge_gateway.metadata import HeadReporter, MetadataClient, WatchDecoder, encode_heads
from edge_gateway.metadata._db import MetadataStore
from edge_gateway.metadata.server import MetadataApp, MetadataServerConfig
from edge_gateway.testing.tcpproxy import TcpProxy

#: The last commit whose server had no watch (protocol 1 only).
OLD_SERVER_COMMIT = "c6950b9b4eb1597288d6d3c6818b8f789e102f3c"


async def _next_with_heads(updates: Any) -> Any:
    """The next update that names a head (keep-alive lines skipped)."""
    with trio.fail_after(20):
        while True:
            update = await anext(updates)
            if update.heads:
                return update


async def test_the_watch_delivers_every_change_in_order(fleet: Fleet) -> None:
    async with (
        MetadataClient(fleet.url, token=ADMIN_TOKEN) as watcher,
        MetadataClient(fleet.url, token=fleet.tokens["north"], region="north") as north,
    ):
        updates = watcher.watch_heads(0, ["north"], wait_ms=30_000)
        async with aclosing(updates):
            with trio.fail_after(20):
                first = await anext(updates)  # at once, before any change
            base = first.heads.get("north", 0)
            since = first.version
            for i in range(1, 21):
                await north.report_head(base + i)
                update = await _next_with_heads(updates)
                # One report at a time: each is one line, in order, and only north's.
                assert update.heads == {"north": base + i}
                assert update.version > since
                since = update.version


async def test_keep_alive_lines_come_every_wait_ms(fleet: Fleet) -> None:
    async with MetadataClient(fleet.url, token=ADMIN_TOKEN) as watcher:
        updates = watcher.watch_heads(0, ["south"], wait_ms=200)
        async with aclosing(updates):
            with trio.fail_after(20):
                first = await anext(updates)
                quiet = [await anext(updates) for _ in range(3)]
    # Nothing moved: lines with no heads, at the version of the first line.
    assert all(u.heads == {} and u.version == first.version for u in quiet)


async def test_a_killed_connection_is_resumed_without_losing_a_change(fleet: Fleet) -> None:
    host, port = fleet.url.removeprefix("http://").rsplit(":", 1)
    with TcpProxy(host, int(port)) as proxy:
        seen: list[int] = []
        opened: list[int] = []
        moved = trio.Event()

        async def follow() -> None:
            # What the agent does: watch, and after a failure resume from the last version.
            since = 0
            async with MetadataClient(proxy.url, token=ADMIN_TOKEN, timeout_s=5) as c:
                while True:
                    opened.append(since)
                    try:
                        async with aclosing(c.watch_heads(since, ["south"], wait_ms=1000)) as ups:
                            async for update in ups:
                                since = update.version
                                if "south" in update.heads:
                                    seen.append(update.heads["south"])
                                    moved.set()
                    except Unavailable:
                        await trio.sleep(0.1)

        async def wait_seen(seq: int) -> None:
            nonlocal moved
            with trio.fail_after(30):
                while not seen or seen[-1] < seq:
                    await moved.wait()
                    moved = trio.Event()

        async with (
            MetadataClient(fleet.url, token=fleet.tokens["south"], region="south") as south,
            trio.open_nursery() as nursery,
        ):
            base = await south.report_head(0)  # the head the server holds (0 if none)
            nursery.start_soon(follow)
            await wait_seen(base)
            for i in range(1, 6):
                await south.report_head(base + i)
            await wait_seen(base + 5)
            # Cut the watch (refuse resets every open connection) and keep new
            # ones out while the head moves on.
            proxy.set_mode("refuse")
            for i in range(6, 11):
                await south.report_head(base + i)
            await trio.sleep(0.5)
            proxy.set_mode("pass")
            await wait_seen(base + 10)
            nursery.cancel_scope.cancel()
    assert len(opened) >= 2, "the watch was never cut"
    assert opened[-1] > 0, "resumed from the last version read, not from the start"
    assert seen == sorted(seen)
    assert seen[-1] == base + 10


def test_a_long_poll_client_still_works(fleet: Fleet) -> None:
    """Protocol 1 (gateways before the watch): ``GET /v1/heads`` without ``watch``."""
    with http(fleet.url) as c:
        version = c.get("/v1/heads", params={"since": 0}).json()["version"]
        with http(fleet.url, fleet.tokens["north"]) as north:
            head = north.post("/v1/regions/north/head", json={"seq": 0}).json()["seq"]
            north.post("/v1/regions/north/head", json={"seq": head + 1})
        r = c.get("/v1/heads", params={"since": version, "regions": "north", "wait_ms": 5000})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc["heads"] == {"north": head + 1}
    assert doc["version"] > version


async def test_a_report_a_heartbeat_carried_is_not_sent(fleet: Fleet) -> None:
    async with MetadataClient(fleet.url, token=fleet.tokens["north"], region="north") as c:
        base = await c.report_head(0)  # the head the server holds
        reporter = HeadReporter(c)
        reporter.report_nowait(base + 5)
        reporter.sent_elsewhere(base + 5)  # a heartbeat carried it meanwhile
        async with trio.open_nursery() as nursery:
            await nursery.start(reporter.run)
            await trio.testing.wait_all_tasks_blocked()
            assert reporter.statistics().reports == 0  # superseded: not sent
            reporter.report_nowait(base + 7)
            for _ in range(400):  # sent at once; a slow machine gets 20 s
                if reporter.statistics().reports:
                    break
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert reporter.statistics().reports == 1
        assert reporter.statistics().sent == base + 7
        assert await c.report_head(0) == base + 7


@pytest.mark.parametrize("stack", ["builtin", "hypercorn"])
def test_a_watch_whose_client_hung_up_ends_at_once(tmp_path: Path, stack: str) -> None:
    server = MetaServer(tmp_path / "meta.sqlite", extra=("--server", stack))
    try:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)

        def counts() -> tuple[int, int]:
            with http(server.url, None) as c:
                doc = c.get("/healthz").json()
            return int(doc["watches"]), int(doc["long_polls"])

        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(
                b"GET /v1/heads?watch=1&wait_ms=60000 HTTP/1.1\r\nHost: meta\r\n"
                b"Authorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n\r\n"
            )
            head = s.recv(65536)
            assert head.startswith(b"HTTP/1.1 200"), head
            assert b"application/x-ndjson" in head.lower()
            assert counts() == (1, 1)
        deadline = time.monotonic() + 30
        while counts() != (0, 0):  # not at wait_ms (60 s): at the hang-up
            assert time.monotonic() < deadline, "the watch outlived its client"
            time.sleep(0.05)
    finally:
        server.stop()


# ------------------------------------------------------------- old server


@pytest.fixture
def old_server(tmp_path: Path) -> Any:
    """The server's code before the watch, in open mode (loopback, no admin token)."""
    old = old_sources(OLD_SERVER_COMMIT, tmp_path / "old")
    addr = tmp_path / "old.addr"
    script = (
        "import sys, trio\n"
        "from pathlib import Path\n"
        "from edge_gateway.metadata.server import MetadataServerConfig, serve_metadata\n"
        "config = MetadataServerConfig(db=Path(sys.argv[1]), listen='127.0.0.1:0',"
        " addr_file=Path(sys.argv[2]))\n"
        "trio.run(serve_metadata, config)\n"
    )
    with open(tmp_path / "old.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "old.sqlite"), str(addr)],
            env={**os.environ, "PYTHONPATH": str(old)},
            cwd=old,
            stdout=log,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 60
        while not addr.exists():
            assert proc.poll() is None, (tmp_path / "old.log").read_text()
            assert time.monotonic() < deadline, "the old server did not start"
            time.sleep(0.05)
        url = addr.read_text().strip()
        with httpx.Client(base_url=url, timeout=30) as c:
            assert c.post("/v1/regions", json={"id": "north"}).status_code == 201
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_the_watch_falls_back_to_long_polls_on_an_older_server(old_server: str) -> None:
    async with (
        MetadataClient(old_server) as watcher,
        MetadataClient(old_server, region="north") as north,
    ):
        await north.report_head(5)
        # The older server answers the watch's request as one long poll: one update, then the end.
        async with aclosing(watcher.watch_heads(0, ["north"], wait_ms=5000)) as updates:
            got = [u async for u in updates]
        assert len(got) == 1
        assert got[0].heads == {"north": 5}
        # Asked again with its version, it waits for the next move, as a long poll does.
        async with trio.open_nursery() as nursery:
            later: list[Any] = []

            async def ask() -> None:
                async with aclosing(watcher.watch_heads(got[0].version, ["north"], 20_000)) as ups:
                    later.extend([u async for u in ups])

            nursery.start_soon(ask)
            await trio.sleep(0.5)
            await north.report_head(6)
        assert [u.heads for u in later] == [{"north": 6}]


# ------------------------------------------------------------- in-process


class _HeldSend:
    """An ASGI ``send`` whose reader stops taking lines after the ``hold_after``-th."""

    def __init__(self, hold_after: int) -> None:
        self.lines: list[bytes] = []
        self.hold_after = hold_after
        self.release = trio.Event()
        #: Set when the sender gave up on the line held (it was cancelled).
        self.dropped = trio.Event()

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            self.lines.append(message["body"])
            if len(self.lines) == self.hold_after:
                try:
                    await self.release.wait()
                except trio.Cancelled:
                    self.dropped.set()
                    raise


def _scope(query: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": "/v1/heads",
        "query_string": query,
        "headers": [],
    }


async def _never() -> dict[str, Any]:
    await trio.sleep_forever()
    raise AssertionError


async def test_changes_made_while_a_line_waits_become_one_line(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path / "m.sqlite")
    try:
        app = MetadataApp(store, MetadataServerConfig(db=tmp_path / "m.sqlite"))
        send = _HeldSend(hold_after=2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                app, _scope(b"watch=1&since=0&regions=north&wait_ms=60000"), _never, send
            )
            await trio.testing.wait_all_tasks_blocked()
            assert len(send.lines) == 1  # at once: nothing moved yet
            app.heads.report("north", 1)
            await trio.testing.wait_all_tasks_blocked()
            assert len(send.lines) == 2  # the reader takes this line slowly...
            for seq in range(2, 11):  # ... while north moves nine times
                app.heads.report("north", seq)
                app.heads.report("south", seq)  # not watched
            send.release.set()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        decoded = WatchDecoder("test").feed(b"".join(send.lines))
        assert [heads for _, heads in decoded] == [{}, {"north": 1}, {"north": 10}]
        assert decoded[2][0] == app.heads.version
    finally:
        store.close()


async def test_a_reader_that_takes_nothing_is_dropped(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = MetadataStore(tmp_path / "m.sqlite")
    try:
        app = MetadataApp(store, MetadataServerConfig(db=tmp_path / "m.sqlite"))
        send = _HeldSend(hold_after=2)  # the second line is never taken
        async with trio.open_nursery() as nursery:
            nursery.start_soon(app, _scope(b"watch=1&regions=north&wait_ms=60000"), _never, send)
            await trio.testing.wait_all_tasks_blocked()
            assert app.watches == 1
            app.heads.report("north", 1)
            with trio.fail_after(60):  # the send timeout (10 s) on the mock clock
                await send.dropped.wait()
            await trio.testing.wait_all_tasks_blocked()
        assert app.watches == 0
        assert app.watch_dropped == 1
        assert app.admission.long_polls == 0
        assert app.admission.inflight == 0
    finally:
        store.close()


def test_the_line_format_round_trips_fed_whole_and_byte_by_byte() -> None:
    lines = [encode_heads(7, {}), encode_heads(9, {"north": 3, "é": 2**62})]
    data = b"".join(lines)
    whole = WatchDecoder("test").feed(data)
    bytewise = WatchDecoder("test")
    pieces = [u for i in range(len(data)) for u in bytewise.feed(data[i : i + 1])]
    assert whole == pieces == [(7, {}), (9, {"north": 3, "é": 2**62})]
    # An older server's single answer (no newline) is the last line.
    old = WatchDecoder("test")
    assert old.feed(json.dumps({"version": 3, "heads": {"a": 1}}).encode()) == []
    assert old.end() == (3, {"a": 1})
