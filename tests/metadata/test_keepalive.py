"""Keep-alive between gateways and the metadata server: no false "unreachable".

The server used to close idle connections after hypercorn's 5 s, the
gateways' poll interval: a gateway reused a pooled connection just as the
server closed it, got ``Connection reset by peer``, counted a fetch failure
and flipped ``edgegw_metadata_live`` to 0 although the server was fine.

* The server's keep-alive (75 s) outlasts the gateways' intervals and their
  pools' idle expiry (30 s): checked as figures, and on a real server
  process (a connection idle for longer than the old 5 s is still open).
* A request that fails on a reused connection before any answer is sent
  again and not counted; a failure on a new connection is reported at once:
  unit tests against a scripted server on real sockets that resets exactly
  the connections it is told to.
* A stalled request body gets ``408 request_timeout`` and the connection closes.
* A real gateway process polls a real metadata server whose idle close is
  made to cross the gateway's next request on the wire (a short server
  keep-alive, the poll interval just under it, and latency from the TCP
  fault proxy): over many polls, no fetch or heartbeat failure is counted.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _meta_support import ADMIN_TOKEN
from _serve import Gateway, wait_until

from edge_gateway.config import MetadataSettings
from edge_gateway.errors import ClosedError, Unavailable
from edge_gateway.metadata.agent import AgentHooks, MetadataAgent
from edge_gateway.metadata.client import MetadataClient
from edge_gateway.metadata.server import MetadataServerConfig, _hypercorn_config, serve_metadata
from edge_gateway.net.http import CLIENT_KEEPALIVE_EXPIRY_S, KEEP_ALIVE_TIMEOUT_S
from edge_gateway.testing.tcpproxy import ProxyMode, TcpProxy

ROUTING = b'{"version":1,"regions":["north"],"topics":[],"buckets":[]}'


class ScriptedServer:
    """Answers every request with :data:`ROUTING`, except those ``reset`` picks.

    ``reset(connection, request)`` (both counted from 0) says whether to read
    that request and then reset the connection (RST, no answer) instead:
    what a client sees when its request crosses the server's close.
    """

    def __init__(self, reset: Callable[[int, int], bool]) -> None:
        self.reset = reset
        #: (connection, request) of every request received, in order.
        self.requests: list[tuple[int, int]] = []
        self._connections = 0
        self.url = ""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        task_status.started()
        await trio.serve_listeners(self._serve, listeners)

    async def _serve(self, stream: trio.SocketStream) -> None:
        conn = self._connections
        self._connections += 1
        buf = b""
        n = 0
        async with stream:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += await stream.receive_some(65536)
                buf = buf[length:]
                self.requests.append((conn, n))
                if self.reset(conn, n):
                    stream.socket.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    return  # closing with linger 0 sends a RST
                await stream.send_all(
                    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nETag: "1"\r\n'
                    b"Content-Length: %d\r\n\r\n%s" % (len(ROUTING), ROUTING)
                )
                n += 1


def agent_for(url: str, tmp_path: Path) -> MetadataAgent:
    """A gateway's metadata agent (its counters are what the status and metrics show)."""

    async def apply_routing(table: object) -> None:
        raise AssertionError("no table is applied here")

    def shipper_statistics() -> Any:
        raise ClosedError("no shipper")

    hooks = AgentHooks(
        region="north",
        data_dir=tmp_path,
        apply_routing=apply_routing,
        shipper_statistics=shipper_statistics,
        tailers=dict,
    )
    return MetadataAgent(hooks, MetadataSettings(url=url, head_relay=False))


async def test_a_reset_of_a_reused_connection_is_retried_and_not_counted(tmp_path: Path) -> None:
    # The second request on the first connection is reset, as when the server's
    # idle close crosses it; every other request is answered.
    server = ScriptedServer(lambda conn, n: (conn, n) == (0, 1))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        agent = agent_for(server.url, tmp_path)
        try:
            for _ in range(3):
                await agent._fetch()
        finally:
            await agent.aclose()
        nursery.cancel_scope.cancel()
    # Sent again on a new connection, once, and kept on it.
    assert server.requests == [(0, 0), (0, 1), (1, 0), (1, 1)]
    status = agent.status()
    assert status["fetch_failures"] == 0
    assert status["fetches"] == 3
    assert status["mode"] == "live"
    assert status["stale_retries"] == 1


async def test_a_failure_on_a_new_connection_is_reported_at_once(tmp_path: Path) -> None:
    # Every connection is reset at its first request: a server that is really broken.
    server = ScriptedServer(lambda conn, n: True)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        async with MetadataClient(server.url, region="north") as client:
            with pytest.raises(Unavailable, match="unreachable"):
                await client.fetch_routing()
            assert server.requests == [(0, 0)]  # not sent again
            assert client.stale_retries == 0
        # A reused connection that fails, then a new one that fails too: one
        # retry, and the new connection's failure is reported (and counted).
        server = ScriptedServer(lambda conn, n: (conn, n) != (0, 0))
        await nursery.start(server.run)
        agent = agent_for(server.url, tmp_path)
        try:
            await agent._fetch()
            await agent._fetch()
        finally:
            await agent.aclose()
        assert server.requests == [(0, 0), (0, 1), (1, 0)]
        status = agent.status()
        assert (status["fetches"], status["fetch_failures"]) == (1, 1)
        assert status["mode"] == "cached"
        assert status["stale_retries"] == 1
        nursery.cancel_scope.cancel()


def test_keep_alive_times_are_aligned() -> None:
    """The server keeps an idle connection longer than any client waits to reuse it."""
    settings = MetadataSettings()
    intervals_s = (settings.poll_interval_ms / 1000, settings.heartbeat_interval_ms / 1000)
    assert max(intervals_s) < CLIENT_KEEPALIVE_EXPIRY_S < KEEP_ALIVE_TIMEOUT_S
    server = MetadataServerConfig(db=Path("meta.sqlite"))
    assert server.keep_alive_timeout_s == KEEP_ALIVE_TIMEOUT_S
    assert _hypercorn_config(server).keep_alive_timeout == KEEP_ALIVE_TIMEOUT_S
    client = MetadataClient("http://127.0.0.1:1")
    pool: Any = client._http._transport
    assert pool._pool._keepalive_expiry == CLIENT_KEEPALIVE_EXPIRY_S


async def test_the_server_keeps_idle_connections_past_the_poll_interval(fleet: Any) -> None:
    host, _, port = fleet.url.removeprefix("http://").rpartition(":")
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: meta\r\n\r\n")
        answer = b""
        with trio.fail_after(30):  # hypercorn writes the head and the body apart
            while not answer.endswith(b"}"):
                data = await stream.receive_some(65536)
                assert data, answer
                answer += data
        assert answer.startswith(b"HTTP/1.1 200")
        # Longer than the gateways' poll interval (5 s), the server's old keep-alive.
        with trio.move_on_after(7):
            data = await stream.receive_some(65536)
            raise AssertionError(f"the server closed an idle connection within 7 s: {data!r}")


async def test_a_gateway_polling_across_the_servers_idle_close_counts_no_failures(
    tmp_path: Path,
) -> None:
    keep_alive_s, latency_s, interval_s = 1.5, 0.5, 0.75
    # The gateway sends its next poll ~latency + interval after the server
    # answered; the server closes keep_alive after answering, and the poll
    # reaches it latency after it left: interval in (keep_alive - 2 latency,
    # keep_alive - latency) puts the close between the two, on every poll
    # that reuses a connection (the proxy delays data, not the FIN).
    assert keep_alive_s - 2 * latency_s < interval_s < keep_alive_s - latency_s
    config = MetadataServerConfig(
        db=tmp_path / "meta.sqlite",
        listen="127.0.0.1:0",
        admin_token=ADMIN_TOKEN,
        keep_alive_timeout_s=keep_alive_s,
    )
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_metadata, config)
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as admin:
            r = await admin.post("/v1/regions", json={"id": "north"})
            assert r.status_code == 201, r.text
            token = r.json()["token"]
        host, _, port = url.removeprefix("http://").rpartition(":")
        with TcpProxy(host, int(port), mode=ProxyMode.LATENCY, latency=latency_s) as proxy:
            meta = {
                "url": proxy.url,
                "token": token,
                "poll_interval_ms": int(interval_s * 1000),
                "heartbeat_interval_ms": int(interval_s * 1000),
            }
            (tmp_path / "bucket").mkdir()  # a configured bucket.path must exist
            bucket = {"type": "local", "path": str(tmp_path / "bucket")}
            gw = Gateway("north", tmp_path, bucket, [], {"metadata": meta})
            try:
                await trio.to_thread.run_sync(gw.start)

                def polled() -> dict[str, Any] | None:
                    # Heartbeats, which confirm the routing version, stand in for
                    # most routing polls (agent.py): count both.
                    doc: dict[str, Any] = gw.status()["metadata"]
                    sent = doc["fetches"] + doc["fetch_failures"]
                    sent += doc["heartbeats"] + doc["heartbeat_failures"]
                    return doc if sent >= 20 else None

                status = await trio.to_thread.run_sync(
                    lambda: wait_until(polled, 120, "twenty polls and heartbeats", interval=0.5)
                )
                metrics = await trio.to_thread.run_sync(
                    lambda: httpx.get(f"{gw.url}/metrics", timeout=30).text
                )
            finally:
                await trio.to_thread.run_sync(gw.stop)
        nursery.cancel_scope.cancel()
    assert status["fetch_failures"] == 0, status
    assert status["heartbeat_failures"] == 0, status
    assert status["mode"] == "live", status
    # The close did cross requests (else this test proves nothing): they were sent again.
    assert status["stale_retries"] > 0, status
    assert "edgegw_metadata_live 1" in metrics
    assert "edgegw_metadata_fetch_failures_total 0" in metrics


async def test_a_stalled_body_gets_408_and_the_connection_closes(tmp_path: Path) -> None:
    config = MetadataServerConfig(
        db=tmp_path / "meta.sqlite", listen="127.0.0.1:0", read_timeout_s=1.0
    )
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_metadata, config)
        host, _, port = url.removeprefix("http://").rpartition(":")
        body = b'{"id": "north"}'
        async with await trio.open_tcp_stream(host, int(port)) as stream:
            await stream.send_all(
                b"POST /v1/regions HTTP/1.1\r\nHost: meta\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:5])
            )
            answer = b""
            with trio.fail_after(30):
                while data := await stream.receive_some(65536):
                    answer += data
        nursery.cancel_scope.cancel()
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in head.lower()
    assert b'"request_timeout"' in rest
