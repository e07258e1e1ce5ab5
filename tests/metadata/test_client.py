"""MetadataClient, HeadReporter and RoutingCache against a real server process."""

from __future__ import annotations

import gzip
import json
import signal
import socket
import uuid
from pathlib import Path

import httpx
import pytest
import trio
from _meta_support import Fleet, MetaServer, http

from edge_gateway.config import GatewayConfig, TopicConfig
from edge_gateway.errors import CorruptData, InvalidInput, Unavailable
from edge_gateway.metadata import (
    HeadReporter,
    MetadataClient,
    MetadataRefused,
    RoutingCache,
    RoutingTable,
    TopicRoute,
    topology,
)
from edge_gateway.metadata.client import refresh_routing
from edge_gateway.testing.ports import free_port

_BOMB = gzip.compress(b"\0" * (64 << 20))
_TRAVERSAL = json.dumps(
    {
        "version": 3,
        "regions": ["north"],
        "topics": [{"name": "../../etc/cron.d/x", "home": "north", "partitions": 1}],
        "buckets": [],
    }
).encode()


def _name() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


async def test_fetch_routing_with_etag(fleet: Fleet) -> None:
    async with MetadataClient(fleet.url, token=fleet.tokens["north"], region="north") as c:
        first = await c.fetch_routing()
        assert first.changed
        assert first.etag == f'"{first.table.version}"'
        assert {"north", "south"} <= set(first.table.regions)
        again = await c.fetch_routing()
        assert not again.changed
        assert again.table is first.table
        name = _name()
        with http(fleet.url) as admin:
            body = {"name": name, "home": "south", "partitions": 3, "subscribers": "*"}
            assert admin.post("/v1/topics", json=body).status_code == 201
        # The heartbeat tells that the routing moved on.
        version = await c.heartbeat(gateway_version="0.1.0", lag={"south": 0.25})
        assert version > first.table.version
        changed = await c.fetch_routing()
        assert changed.changed
        assert changed.table.version == version
        assert changed.table.topic(name) == TopicRoute(name, "south", 3, None, "*")
        assert changed.table.topic(name).subscribed_by("north")  # type: ignore[union-attr]


async def test_heads_through_the_client(fleet: Fleet) -> None:
    async with (
        MetadataClient(fleet.url, token=fleet.tokens["north"], region="north") as north,
        MetadataClient(fleet.url, token=fleet.tokens["south"], region="south") as south,
    ):
        start = await south.wait_heads(0, ["north"])
        base = start.heads.get("north", 0)
        timed_out = await south.wait_heads(start.version, ["north"], wait_ms=100)
        assert timed_out.heads == {}
        assert timed_out.version == start.version

        reporter = HeadReporter(north)
        got: list[dict[str, int]] = []

        async def poll() -> None:
            update = await south.wait_heads(start.version, ["north"], wait_ms=30_000)
            got.append(update.heads)

        async with trio.open_nursery() as nursery:
            await nursery.start(reporter.run)
            nursery.start_soon(poll)
            await trio.sleep(0.1)
            for seq in range(base + 1, base + 201):  # a burst of commits: never blocks
                reporter.report_nowait(seq)
            reporter.report_nowait(base + 5)  # an older seq is ignored
            with trio.fail_after(30):
                while reporter.statistics().sent != base + 200:  # noqa: ASYNC110 - polls stats
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
        stats = reporter.statistics()
        assert stats.latest == base + 200
        assert stats.reports < 200  # coalesced
        assert stats.failures == 0
        assert got
        assert base < got[0]["north"] <= base + 200
        final = await south.wait_heads(0, ["north"])
        assert final.heads == {"north": base + 200}


async def test_a_rotated_token_is_taken_up_from_the_token_file(
    fleet: Fleet, tmp_path: Path
) -> None:
    region = _name()
    with http(fleet.url) as admin:
        first = admin.post("/v1/regions", json={"id": region}).json()["token"]
        token_file = tmp_path / "token"
        token_file.write_text(first + "\n")
        async with MetadataClient(fleet.url, token_file=token_file, region=region) as c:
            await c.heartbeat(gateway_version="v", lag={})
            # Rotated with no grace: the old token is refused; the file still holds it.
            r = admin.post(f"/v1/regions/{region}/token", json={"keep_previous_s": 0})
            second = r.json()["token"]
            with pytest.raises(MetadataRefused) as exc:
                await c.heartbeat(gateway_version="v", lag={})
            assert exc.value.status == 401
            assert c.token_reloads == 0
            # The new token lands in the file: the next call takes it up by itself.
            token_file.write_text(second)
            await c.heartbeat(gateway_version="v", lag={})
            assert c.token_reloads == 1
            await c.fetch_routing()
            assert c.token_reloads == 1
    for bad in ("", "two words", "x" * 5000):
        token_file.write_text(bad)
        with pytest.raises(InvalidInput, match="token_file"):
            MetadataClient(fleet.url, token_file=token_file)
    with pytest.raises(InvalidInput, match="token_file"):
        MetadataClient(fleet.url, token_file=tmp_path / "missing")


async def test_client_errors(fleet: Fleet, tmp_path: Path) -> None:
    async with MetadataClient(fleet.url, token="wrong-token-0123456789") as c:
        with pytest.raises(MetadataRefused) as exc:
            await c.fetch_routing()
        assert (exc.value.status, exc.value.code) == (401, "unauthorized")
    async with MetadataClient(fleet.url, token=fleet.tokens["north"], region="south") as c:
        with pytest.raises(MetadataRefused) as exc:
            await c.report_head(1)
        assert exc.value.status == 403
    async with MetadataClient(fleet.url, token=fleet.tokens["north"]) as c:
        with pytest.raises(InvalidInput, match="region="):
            await c.heartbeat(gateway_version="x")
    async with MetadataClient(f"http://127.0.0.1:{free_port()}", timeout_s=2) as c:
        with pytest.raises(Unavailable, match="unreachable"):
            await c.fetch_routing()

    def bad(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/routing":
            return httpx.Response(200, json={"version": "seven"})
        return httpx.Response(502, text="bad gateway")

    async with MetadataClient("http://meta", transport=httpx.MockTransport(bad)) as c:
        with pytest.raises(CorruptData, match="version"):
            await c.fetch_routing()
        with pytest.raises(Unavailable, match="502"):
            await c.wait_heads(0)


# httpx leaves its body-stream generators to the garbage collector after a
# DecodingError (trio warns about them); that is httpx's, not the client's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_an_answer_garbled_in_transit_is_unavailable() -> None:
    # A link that corrupts a compressed body: httpx raises DecodingError,
    # which is not one of its transport errors; it escaped the client (and
    # the agent's loops) before.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-encoding: gzip\r\ncontent-length: 10\r\n\r\n0123456789"
            )

    with listener:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, answer)
            async with MetadataClient(f"http://127.0.0.1:{port}", region="north") as c:
                with pytest.raises(Unavailable, match="DecodingError"):
                    await c.fetch_routing()


def _serve_once(listener: socket.socket, head: bytes, body: bytes, endless: bool) -> None:
    """Answer one request with ``head`` + ``body`` (chunks of ``body`` for ever if ``endless``)."""
    conn, _ = listener.accept()
    with conn:
        conn.recv(65536)
        try:
            conn.sendall(head + body)
            while endless:
                conn.sendall(b"100000\r\n" + b"x" * 0x100000 + b"\r\n")
        except OSError:  # the client hung up: what it should do
            pass


@pytest.mark.parametrize(
    ("head", "body", "endless", "error", "match"),
    [
        # An answer without end: refused at the bound, not read into memory for ever.
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n",
            b"",
            True,
            CorruptData,
            "larger than 16 MiB",
        ),
        # A compression bomb: 64 MiB of zeros in ~64 KB of gzip.
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(_BOMB),
            _BOMB,
            False,
            CorruptData,
            "larger than 16 MiB",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\n",
            b"{nope",
            False,
            CorruptData,
            "not JSON",
        ),
        # A name that would be a path: refused by the name rules, naming it.
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % len(_TRAVERSAL),
            _TRAVERSAL,
            False,
            CorruptData,
            "topic name",
        ),
    ],
    ids=["endless", "gzip-bomb", "not-json", "path-in-a-topic-name"],
)
# httpx's inner stream generators (below Response.aiter_bytes) are collected
# unexhausted when a read stops early; the response itself is closed.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_hostile_server_gets_a_clear_error_not_a_crash(
    head: bytes, body: bytes, endless: bool, error: type[Exception], match: str
) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    with listener:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, _serve_once, listener, head, body, endless)
            async with MetadataClient(f"http://127.0.0.1:{port}", region="north") as c:
                with pytest.raises(error, match=match):
                    await c.fetch_routing()
                assert c.table is None


async def test_cache_fallback_when_the_server_is_down(tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "meta.sqlite"
    server = MetaServer(db, listen=f"127.0.0.1:{port}")
    cache = RoutingCache(tmp_path / "gw" / "routing.json")
    try:
        with http(server.url) as admin:
            token = admin.post("/v1/regions", json={"id": "north"}).json()["token"]
            admin.post("/v1/regions", json={"id": "south"})
            body = {"name": "telemetry", "home": "south", "partitions": 2, "subscribers": "*"}
            admin.post("/v1/topics", json=body)
        async with MetadataClient(server.url, token=token, region="north", timeout_s=2) as c:
            snap = await refresh_routing(c, cache)
            assert snap.cached_ms is None
            assert snap.changed
            assert snap.describe() == f"metadata: version {snap.table.version}"
            assert cache.load() is not None
            live = snap.table
            assert server.stop(signal.SIGKILL) != 0
            down = await refresh_routing(c, cache)
            assert down.table == live
            assert not down.changed
            assert down.cached_ms is not None
            assert down.error is not None
            assert "unreachable" in down.error
            assert down.describe().startswith("metadata: cached since ")
        # A gateway starting while the server is down runs from the cache.
        async with MetadataClient(server.url, token=token, region="north", timeout_s=2) as c:
            start = await refresh_routing(c, cache)
            assert start.table == live
            assert start.cached_ms is not None
            cfg = GatewayConfig(region="north", topics=topology(start.table))
            assert cfg.mirrored_topics().keys() == {"south.telemetry"}
        # Without a cache, there is nothing to run from.
        async with MetadataClient(server.url, token=token, timeout_s=2) as c:
            with pytest.raises(Unavailable):
                await refresh_routing(c, RoutingCache(tmp_path / "none.json"))

        # The server comes back (same port): primed from the cache, an unchanged
        # table costs a 304; a change is picked up by the next refresh.
        server = MetaServer(db, listen=f"127.0.0.1:{port}")
        async with MetadataClient(server.url, token=token, region="north") as c:
            back = await refresh_routing(c, cache)
            assert back.cached_ms is None
            assert not back.changed
            assert back.table == live
            with http(server.url) as admin:
                r = admin.patch("/v1/topics/telemetry", json={"partitions": 6})
                assert r.status_code == 200
            moved = await refresh_routing(c, cache)
            assert moved.changed
            assert moved.table.topic("telemetry").partitions == 6  # type: ignore[union-attr]
        loaded = cache.load()
        assert loaded is not None
        assert loaded.table == moved.table
        assert loaded.etag == f'"{moved.table.version}"'
    finally:
        server.stop()


def test_routing_cache_files(tmp_path: Path) -> None:
    cache = RoutingCache(tmp_path / "routing.json")
    assert cache.load() is None
    table = RoutingTable(3, ("a", "b"), (TopicRoute("t", "a", 2, 5000, ("b",)),))
    cache.save(table, '"3"', now_ms=1234)
    loaded = cache.load()
    assert loaded is not None
    assert (loaded.table, loaded.etag, loaded.cached_ms) == (table, '"3"', 1234)
    assert [p.name for p in tmp_path.iterdir()] == ["routing.json"]  # no temporary left
    for junk in (b"", b"{", b"[]", b'{"format": 99}', json.dumps({"format": 1}).encode()):
        (tmp_path / "routing.json").write_bytes(junk)
        with pytest.raises(CorruptData):
            cache.load()
    doc = {"format": 1, "cached_ms": 1, "etag": None, "table": {"version": 1, "topics": [{}]}}
    (tmp_path / "routing.json").write_text(json.dumps(doc))
    with pytest.raises(CorruptData, match=r"routing\.json"):
        cache.load()


def test_topology_matches_the_config_shape() -> None:
    table = RoutingTable.from_json(
        {
            "version": 9,
            "regions": ["north", "south", "east"],
            "topics": [
                {
                    "name": "a",
                    "home": "north",
                    "partitions": 4,
                    "retention_ms": None,
                    "subscribers": ["south"],
                },
                {
                    "name": "b",
                    "home": "south",
                    "partitions": 1,
                    "retention_ms": 10,
                    "subscribers": "*",
                },
                {
                    "name": "c",
                    "home": "east",
                    "partitions": 2,
                    "retention_ms": None,
                    "subscribers": [],
                },
            ],
            "buckets": [{"name": "default", "type": "local", "path": "/srv"}],
        }
    )
    topics = topology(table)
    assert topics == (
        TopicConfig("a", "north", 4, ("south",)),
        TopicConfig("b", "south", 1, ("*",)),
        TopicConfig("c", "east", 2, ()),
    )
    for region in table.regions:
        for route, config in zip(table.topics, topics, strict=True):
            assert route.subscribed_by(region) == config.subscribed_by(region)
    south = GatewayConfig(region="south", topics=topics)
    assert south.local_topics().keys() == {"b"}
    assert south.mirrored_topics().keys() == {"north.a"}
    assert south.sources() == {"north": ["a"]}
    assert RoutingTable.from_json(table.to_json()) == table
    with pytest.raises(InvalidInput):
        RoutingTable.from_json({"version": 1, "topics": [{"name": "x", "home": "a.b"}]})
