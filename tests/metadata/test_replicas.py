"""Several metadata server replicas over one PostgreSQL database, with real processes.

Two ``edgegw metadata serve --db postgresql://...`` processes on the session's
PostgreSQL cluster: a head report to one wakes a long poll held on the other;
routing and token changes made through one are served by the other; a
replica killed with SIGKILL makes real gateways fail over to the other and
keep routing; PostgreSQL stopped makes the replicas answer 503, and started
again (or pg_ctl restart) makes them work by themselves; ``edgegw metadata migrate`` moves a
SQLite fleet (with the exact commands of docs/metadata.md).
"""

from __future__ import annotations

import re
import shlex
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _meta_support import ADMIN_TOKEN, EDGEGW, MetaServer, admin, http, new_database
from _serve import Fleet, wait_until

from edge_gateway.errors import Unavailable, UnknownTopic
from edge_gateway.metadata.client import MetadataClient
from edge_gateway.testing.ports import closed_port
from edge_gateway.testing.postgres import Postgres

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metadata.md"


#: How the replicas learn each other's changes: notifications (and a poll every
#: second), or a poll every 100 ms alone.
SYNC = {"notify": (), "poll": ("--no-sync-notify", "--sync-interval-ms", "100")}


@pytest.fixture
def replicas(
    postgres: Postgres, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[MetaServer, MetaServer]]:
    """Replicas ``a`` and ``b`` on one new database (``SYNC[param]``, default notify)."""
    url = new_database(postgres)
    extra = SYNC[getattr(request, "param", "notify")]
    a = MetaServer(url, files=tmp_path / "a", extra=extra)
    b = None
    try:
        b = MetaServer(url, files=tmp_path / "b", extra=extra)
        yield a, b
    finally:
        a.stop()
        if b is not None:
            b.stop()


def _add_regions(url: str, *names: str) -> dict[str, str]:
    return {n: admin(url, "POST", "/v1/regions", {"id": n})["token"] for n in names}


def _version(url: str) -> int:
    with http(url) as c:
        r = c.get("/v1/heads", params={"since": 0, "wait_ms": 0})
        assert r.status_code == 200, r.text
        return int(r.json()["version"])


@pytest.mark.parametrize("replicas", ["notify", "poll"], indirect=True)
def test_a_report_to_one_replica_wakes_a_long_poll_on_the_other(
    replicas: tuple[MetaServer, MetaServer], request: pytest.FixtureRequest
) -> None:
    a, b = replicas
    tokens = _add_regions(a.url, "north", "south")
    wait_until(lambda: _heartbeat(b.url, tokens["north"]) == 200, 10, "b to know north")
    latencies = []
    for i in range(1, 13):
        reporter, waiter = (a, b) if i % 2 else (b, a)
        since = _version(waiter.url)
        answer: dict[str, Any] = {}

        def poll(
            url: str = waiter.url, since: int = since, answer: dict[str, Any] = answer
        ) -> None:
            with http(url, tokens["south"]) as c:
                params = {"since": since, "regions": "north", "wait_ms": 20_000}
                r = c.get("/v1/heads", params=params)
                answer["at"] = time.monotonic()
                answer["r"] = r

        t = threading.Thread(target=poll)
        t.start()
        time.sleep(0.15)  # the long poll is waiting on the other replica
        assert "r" not in answer
        with http(reporter.url, tokens["north"]) as c:
            r = c.post("/v1/regions/north/head", json={"seq": i})
            reported = time.monotonic()
            assert r.status_code == 200, r.text
            assert r.json()["seq"] == i
        t.join(timeout=30)
        assert answer["r"].status_code == 200, answer["r"].text
        doc = answer["r"].json()
        assert doc["heads"] == {"north": i}, doc
        assert doc["version"] > since
        latencies.append(answer["at"] - reported)
    # Notified at once (a poll every second alone would take ~500 ms at the
    # median), or polled every 100 ms: woken well within a second each time.
    assert max(latencies) < 1.0, latencies
    mode = request.node.callspec.params["replicas"]
    if mode == "notify":
        assert statistics.median(latencies) < 0.25, latencies
    print(
        f"cross-replica wake ({mode}): p50 {statistics.median(latencies) * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms"
    )
    # A version from the replica that is ahead, sent to the other: no full
    # re-send of every head (the replica catches up first), and no head missed.
    with http(a.url, tokens["north"]) as c:
        assert c.post("/v1/regions/north/head", json={"seq": 100}).status_code == 200
    version = _version(a.url)
    with http(b.url, tokens["south"]) as c:
        r = c.get("/v1/heads", params={"since": version, "wait_ms": 300})
        assert r.json()["heads"] == {}, r.text


def _heartbeat(url: str, token: str) -> int:
    with http(url, token) as c:
        r = c.post("/v1/regions/north/heartbeat", json={"gateway_version": "t", "lag": {}})
        return r.status_code


def test_changes_through_one_replica_reach_the_other(
    replicas: tuple[MetaServer, MetaServer],
) -> None:
    a, b = replicas
    tokens = _add_regions(a.url, "north", "south")
    # b verifies (and remembers) north's token, then a revokes it: refused on b too.
    wait_until(lambda: _heartbeat(b.url, tokens["north"]) == 200, 10, "b to accept north")
    admin(a.url, "DELETE", "/v1/regions/north")
    wait_until(lambda: _heartbeat(b.url, tokens["north"]) == 401, 5, "b to refuse north")
    # A topic created through a is in b's routing table (a new ETag).
    with http(b.url) as c:
        etag = c.get("/v1/routing").headers["etag"]
    admin(a.url, "POST", "/v1/topics", {"name": "t", "home": "south"})

    def b_has_topic() -> bool:
        with http(b.url) as c:
            r = c.get("/v1/routing", headers={"If-None-Match": etag})
            return r.status_code == 200 and [t["name"] for t in r.json()["topics"]] == ["t"]

    wait_until(b_has_topic, 5, "b to serve the new topic")
    # Two replicas creating one topic at once: one 201, one 409 (the database decides).
    body = {"name": "race", "home": "south"}
    codes: list[int] = []

    def create(url: str) -> None:
        with http(url) as c:
            codes.append(c.post("/v1/topics", json=body).status_code)

    threads = [threading.Thread(target=create, args=(u,)) for u in (a.url, b.url) * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [201, 409, 409, 409, 409, 409]


async def test_client_fails_over_between_urls(
    replicas: tuple[MetaServer, MetaServer],
) -> None:
    a, b = replicas
    with closed_port() as port:
        away = f"http://127.0.0.1:{port}"
        async with MetadataClient([away, a.url, b.url], token=ADMIN_TOKEN, timeout_s=5) as c:
            await c.fetch_routing()
            assert (c.url, c.failovers) == (a.url, 1)
            await c.fetch_routing()  # it stays on the server that answered
            assert (c.url, c.failovers) == (a.url, 1)
        async with MetadataClient(f"{away},{away}/", token=ADMIN_TOKEN, timeout_s=5) as c:
            with pytest.raises(Unavailable):
                await c.fetch_routing()
            assert c.url == away


def test_kill_9_of_a_replica_gateways_fail_over(
    replicas: tuple[MetaServer, MetaServer], tmp_path: Path
) -> None:
    a, b = replicas
    tokens = _add_regions(a.url, "north", "south")
    admin(a.url, "POST", "/v1/topics", {"name": "x", "home": "north", "subscribers": ["south"]})
    regions = {r: {"metadata": {"token": tok}} for r, tok in tokens.items()}
    meta = {"url": f"{a.url},{b.url}", "poll_interval_ms": 200, "heartbeat_interval_ms": 500}
    fleet = Fleet(
        tmp_path / "fleet", list(tokens), [], sections={"metadata": meta}, per_region=regions
    )
    north, south = fleet["north"], fleet["south"]
    try:
        fleet.start()
        for g in (north, south):
            wait_until(lambda g=g: g.status()["metadata"]["mode"] == "live", 30, "live")
            # a, the first URL; or b already, if a call to a failed while the
            # machine was loaded (a timeout, or a 503 when a's PostgreSQL pool
            # could not hand out a connection within 2 s): that gateway failed
            # over before the kill, and the checks below hold for it as well.
            assert g.status()["metadata"]["url"] in (a.url, b.url)
        _produce(north, "x", 5)
        wait_until(lambda: _mirrored(north, south, "x"), 60, "x")

        a.kill()
        # Through b: a new topic. Both gateways take it up (routing), north
        # produces to it and south mirrors it, woken by the relay on b.
        admin(b.url, "POST", "/v1/topics", {"name": "y", "home": "north", "subscribers": "*"})
        # South mirrors y once its routing has it: a newly subscribed topic is
        # mirrored from the tailer's position, not back-filled (docs/mirroring.md),
        # so records north shipped before south's table changed (south's routing
        # can lag north's under load) would be before its start.
        wait_until(lambda: _topic_known(south, "north.y"), 30, "south to take up y")
        wait_until(lambda: _produce(north, "y", 3).status_code == 200, 30, "y writable")
        wait_until(lambda: _mirrored(north, south, "y"), 60, "y")
        for g in (north, south):
            # Waited for, not read once: a call that found both replicas
            # failing (b slow under load) starts its next try at the first URL
            # again, and the next call fails over once more.
            m = wait_until(lambda g=g: _on(g, b.url), 30, "failed over to b")
            assert m["failovers"] >= 1, m
        wait_until(lambda: south.status()["metadata"]["relay"]["active"], 30, "relay on b")
        # b also knows the heads reported to it since a died.
        assert _heads(b.url)["north"] >= 1
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


def _on(g: Any, url: str) -> dict[str, Any] | None:
    """``g``'s metadata status when it is live on ``url``, else None."""
    m: dict[str, Any] = g.status()["metadata"]
    return m if (m["mode"], m["url"]) == ("live", url) else None


def _topic_known(g: Any, topic: str) -> bool:
    return httpx.get(f"{g.url}/v1/topics/{topic}", timeout=30).status_code == 200


def _mirrored(home: Any, other: Any, topic: str) -> bool:
    """Whether ``other`` mirrors all of ``home``'s ``topic`` (False before the mirror exists)."""
    try:
        return bool(other.next_offsets(f"{home.region}.{topic}") == home.next_offsets(topic))
    except UnknownTopic:
        return False


def _produce(g: Any, topic: str, n: int) -> httpx.Response:
    records = [{"value": f"{topic}-{i}"} for i in range(n)]
    return httpx.post(f"{g.url}/v1/topics/{topic}/records", json={"records": records}, timeout=30)


def _heads(url: str) -> dict[str, int]:
    with http(url) as c:
        heads: dict[str, int] = c.get("/v1/heads", params={"since": 0}).json()["heads"]
        return heads


def test_postgres_restart_replicas_reconnect(
    replicas: tuple[MetaServer, MetaServer], postgres: Postgres
) -> None:
    a, b = replicas
    tokens = _add_regions(a.url, "north", "south")
    with http(a.url, tokens["north"]) as c:
        assert c.post("/v1/regions/north/head", json={"seq": 1}).status_code == 200
    postgres.stop()
    try:
        with http(a.url) as c:
            r = c.post("/v1/topics", json={"name": "t", "home": "north"})
        # Unavailable, not a bug: 503 with a Retry-After, never 500.
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "unavailable"
        assert r.headers["retry-after"] == "1"
        with http(b.url) as c:
            assert c.get("/v1/routing").status_code == 200  # held in memory
            assert c.get("/v1/regions").status_code == 503
        # A heartbeat is written behind: its write fails, the replica stays up.
        assert _heartbeat(a.url, tokens["north"]) == 200
        time.sleep(1.5)
        assert a.proc.poll() is None, a.log.read_text()
        with http(a.url) as c:
            assert c.get("/healthz").status_code == 200
    finally:
        postgres.start()
    # No restart of the replicas: they reconnect by themselves.

    def created() -> bool:
        with http(b.url) as c:
            return c.post("/v1/topics", json={"name": "t", "home": "north"}).status_code == 201

    wait_until(created, 30, "b to write again")
    wait_until(lambda: _regions_ok(a.url), 30, "a to read again")
    since = _version(a.url)
    with http(b.url, tokens["north"]) as c:
        assert c.post("/v1/regions/north/head", json={"seq": 2}).status_code == 200
    with http(a.url, tokens["south"]) as c:
        r = c.get("/v1/heads", params={"since": since, "regions": "north", "wait_ms": 10_000})
        assert r.json()["heads"] == {"north": 2}, r.text
    assert "reachable again" in a.log.read_text()
    wait_until(lambda: "listening for changes again" in a.log.read_text(), 10, "a to listen")
    # pg_ctl restart under running replicas: the same, with no 503 window to wait out.
    postgres.restart()

    def topic_created(name: str) -> bool:
        with http(a.url) as c:
            return c.post("/v1/topics", json={"name": name, "home": "north"}).status_code == 201

    wait_until(lambda: topic_created("u"), 30, "a to write after pg_ctl restart")
    since = _version(b.url)
    with http(a.url, tokens["north"]) as c:
        assert c.post("/v1/regions/north/head", json={"seq": 3}).status_code == 200
    with http(b.url, tokens["south"]) as c:
        r = c.get("/v1/heads", params={"since": since, "regions": "north", "wait_ms": 10_000})
        assert r.json()["heads"] == {"north": 3}, r.text


def test_head_versions_that_go_back_are_moved_on(
    replicas: tuple[MetaServer, MetaServer], postgres: Postgres
) -> None:
    """A database back in time (a standby behind, a restore) issues versions again:
    the replicas move them past what their clients hold, and wakes keep working."""
    a, b = replicas
    tokens = _add_regions(a.url, "north", "south")
    with http(a.url, tokens["north"]) as c:
        assert c.post("/v1/regions/north/head", json={"seq": 1}).status_code == 200
    wait_until(lambda: _heads(b.url).get("north") == 1, 10, "b to know the head")
    assert isinstance(a.db, str)
    postgres.psql("SELECT setval('head_versions', 1000)", a.db.rsplit("/", 1)[1])
    wait_until(
        lambda: "head versions went back" in a.log.read_text() + b.log.read_text(),
        10,
        "a replica to notice",
    )
    since = _version(b.url)
    assert since > 1000
    with http(a.url, tokens["north"]) as c:
        assert c.post("/v1/regions/north/head", json={"seq": 2}).status_code == 200
    with http(b.url, tokens["south"]) as c:
        r = c.get("/v1/heads", params={"since": since, "regions": "north", "wait_ms": 5_000})
        assert r.json()["heads"] == {"north": 2}, r.text


def _regions_ok(url: str) -> bool:
    with http(url) as c:
        return c.get("/v1/regions").status_code == 200


# ---------------------------------------------------------------- migrate


def _doc_commands(section: str) -> list[str]:
    """The ``edgegw`` lines of the first fenced block after ``section`` in docs/metadata.md."""
    text = DOCS.read_text()
    start = text.index(section)
    block = re.search(r"^```[^\n]*\n(.*?)^```", text[start:], re.MULTILINE | re.DOTALL)
    assert block is not None
    lines = block.group(1).replace("\\\n", " ").splitlines()
    return [ln.strip() for ln in lines if ln.strip().startswith("edgegw ")]


DOC_URL = "postgresql://edgegw@db.example/edgegw"


def test_migrate_sqlite_to_postgres(postgres: Postgres, tmp_path: Path) -> None:
    sqlite = tmp_path / "meta.sqlite"
    old = MetaServer(sqlite)
    try:
        tokens = _add_regions(old.url, "north", "south", "east")
        rotated = admin(old.url, "POST", "/v1/regions/north/token", {"keep_previous_s": 3600})
        admin(old.url, "DELETE", "/v1/regions/east")
        admin(
            old.url,
            "POST",
            "/v1/topics",
            {"name": "t", "home": "north", "partitions": 3, "subscribers": "*", "priority": "bulk"},
        )
        admin(old.url, "PUT", "/v1/buckets/default", {"type": "local", "path": "/srv/bucket"})
        with http(old.url) as c:
            before = c.get("/v1/routing")
    finally:
        assert old.stop() == 0
    url = new_database(postgres)
    commands = _doc_commands("## Moving from SQLite to PostgreSQL")
    assert [c.split()[:3] for c in commands] == [
        ["edgegw", "metadata", "migrate"],
        ["edgegw", "metadata", "serve"],
    ]
    migrate = shlex.split(commands[0].replace(DOC_URL, url).replace("meta.sqlite", str(sqlite)))
    out = subprocess.run(
        [str(EDGEGW), *migrate[1:]], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "copied 3 regions, 1 topics and 1 bucket locations" in out.stdout
    # The second doc command serves the copy, here on a free loopback port
    # (and with --addr-file), and with no admin token: its hash was copied.
    serve = shlex.split(commands[1].replace(DOC_URL, url))
    assert serve[:5] == ["edgegw", "metadata", "serve", "--db", url]
    assert serve[5] == "--listen"
    assert len(serve) == 7
    new = MetaServer(url, files=tmp_path / "pg", admin_token=None)
    try:
        with http(new.url) as c:
            after = c.get("/v1/routing")
            assert after.json() == before.json()
            assert after.headers["etag"] == before.headers["etag"]
            # A gateway's cached table is still current: a 304.
            r = c.get("/v1/routing", headers={"If-None-Match": before.headers["etag"]})
            assert r.status_code == 304
        # Both of north's tokens (during its rotation) and south's work; east stays revoked.
        for token in (tokens["north"], rotated["token"]):
            assert _heartbeat(new.url, token) == 200
        with http(new.url, tokens["east"]) as c:
            assert c.get("/v1/routing").status_code == 401
        with http(new.url, None) as c:
            assert (
                c.get("/v1/routing").status_code == 401
            )  # not open mode: the admin hash came along
    finally:
        new.stop()
    # Never into a database that holds a fleet already.
    again = subprocess.run(
        [str(EDGEGW), *migrate[1:]], capture_output=True, text=True, timeout=120, check=False
    )
    assert again.returncode == 2
    assert "already holds regions" in again.stderr


async def test_replica_sync_unit_apply_is_a_watermark() -> None:
    """The relay's version only moves forward and never hides an unapplied head."""
    from edge_gateway.metadata.server import HeadRelay

    relay = HeadRelay(version=0)
    relay.apply([("a", 5, 10), ("b", 3, 12)])
    assert relay.version == 12
    relay.apply([("a", 4, 13)])  # an older seq: no move, but the version is seen
    assert relay.version == 13
    assert relay.heads_since(10, None).heads == {"b": 3}
    with trio.move_on_after(5):
        async with trio.open_nursery() as n:
            got: list[dict[str, int]] = []

            async def wait() -> None:
                got.append((await relay.wait_heads(13, None, 5)).heads)

            n.start_soon(wait)
            await trio.sleep(0.05)
            relay.apply([("a", 6, 14)])
    assert got == [{"a": 6}]
