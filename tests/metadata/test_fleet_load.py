"""A server carrying a fleet: overload answers, head fan-out, heartbeats written behind.

Real ``edgegw metadata serve`` processes, driven over their limits
(``--max-inflight``, ``--max-verifying``, ``--max-long-polls``): past one,
a request gets ``503 overloaded`` with ``Retry-After`` at once, ``/healthz``
still answers, and the connection stays usable. The head relay: reports
coalesced while a follower is busy still leave every follower with the
latest head, and a report sent right after a poll started is never lost
between the poll's check and its wait. Heartbeats answered from memory
show at once and reach the database (also at a stop).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from _meta_support import ADMIN_TOKEN, MetaServer, http

from edge_gateway.metadata import MetadataClient
from edge_gateway.metadata._db import MetadataStore


def _regions(url: str, names: list[str]) -> dict[str, str]:
    with http(url) as c:
        out = {}
        for name in names:
            r = c.post("/v1/regions", json={"id": name})
            assert r.status_code == 201, r.text
            out[name] = r.json()["token"]
        return out


def _first_contact(url: str, tokens: list[str]) -> list[httpx.Response]:
    """One request per token, all at once (each token's first: a scrypt check each)."""
    barrier = threading.Barrier(len(tokens))

    def one(token: str) -> httpx.Response:
        with http(url, token) as c:
            barrier.wait()
            return c.get("/v1/routing")

    with ThreadPoolExecutor(len(tokens)) as pool:
        return list(pool.map(one, tokens))


def _assert_overloaded(r: httpx.Response) -> None:
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "overloaded"
    assert r.headers["retry-after"].isdigit()
    assert 1 <= int(r.headers["retry-after"]) <= 30


def test_new_tokens_past_max_verifying_get_503_with_retry_after(tmp_path: Path) -> None:
    server = MetaServer(tmp_path / "meta.sqlite", extra=("--max-verifying", "1"))
    try:
        tokens = _regions(server.url, [f"r{i}" for i in range(12)])
        answers = _first_contact(server.url, list(tokens.values()))
        shed = [r for r in answers if r.status_code != 200]
        assert shed, "12 first contacts at once never went past one check in progress"
        for r in shed:
            _assert_overloaded(r)
        assert any(r.status_code == 200 for r in answers)
        # The server answers throughout, and every token works once checked.
        with http(server.url, None) as c:
            health = c.get("/healthz").json()
            assert health["shed"] >= len(shed)
        for token in tokens.values():
            with http(server.url, token) as c:
                for _ in range(20):
                    r = c.get("/v1/routing")
                    if r.status_code == 200:
                        break
                    _assert_overloaded(r)
                assert r.status_code == 200
    finally:
        server.stop()


def test_requests_past_max_inflight_get_503_and_the_connection_stays_usable(
    tmp_path: Path,
) -> None:
    server = MetaServer(tmp_path / "meta.sqlite", extra=("--max-inflight", "2"))
    try:
        tokens = _regions(server.url, [f"r{i}" for i in range(10)])
        barrier = threading.Barrier(len(tokens))

        def heartbeats(region: str) -> tuple[httpx.Response, list[int]]:
            # Each first contact stays in progress for its scrypt check (~40 ms).
            body = {"gateway_version": "t", "lag": {}}
            with http(server.url, tokens[region]) as c:
                barrier.wait()
                first = c.post(f"/v1/regions/{region}/heartbeat", json=body)
                later = []  # again on the same client (its pooled connection)
                while not later or later[-1] == 503:
                    later.append(c.post(f"/v1/regions/{region}/heartbeat", json=body).status_code)
                return first, later

        with ThreadPoolExecutor(len(tokens)) as pool:
            answers = list(pool.map(heartbeats, tokens))
        shed = [first for first, _ in answers if first.status_code != 200]
        assert shed, "10 first contacts at once never went past two in progress"
        for r in shed:
            _assert_overloaded(r)
            # Refused before its body was read, the body was drained instead:
            # the connection is not closed, the client sends again on it.
            assert r.headers.get("connection") != "close"
        assert all(later[-1] == 200 for _, later in answers)
    finally:
        server.stop()


def test_long_polls_past_max_long_polls_get_503(tmp_path: Path) -> None:
    server = MetaServer(tmp_path / "meta.sqlite", extra=("--max-long-polls", "2"))
    try:
        _regions(server.url, ["north"])
        held = threading.Event()
        results: list[int] = []

        def poll() -> None:
            with http(server.url) as c:
                r = c.get("/v1/heads", params={"since": 0, "regions": "north", "wait_ms": 8000})
                results.append(r.status_code)

        threads = [threading.Thread(target=poll) for _ in range(2)]
        for t in threads:
            t.start()
        with http(server.url, None) as c:
            for _ in range(300):
                if c.get("/healthz").json()["long_polls"] == 2:
                    held.set()
                    break
                threading.Event().wait(0.02)
        assert held.is_set(), "the two polls were never held"
        with http(server.url) as c:
            third = c.get("/v1/heads", params={"since": 0, "regions": "north", "wait_ms": 8000})
            _assert_overloaded(third)
            # A poll that need not wait is no held poll: answered at once.
            assert c.post("/v1/regions/north/head", json={"seq": 4}).status_code == 200
        for t in threads:
            t.join(30)
        assert results == [200, 200]  # woken by the report, not refused
    finally:
        server.stop()


def test_coalesced_reports_wake_every_follower_with_the_latest_head(tmp_path: Path) -> None:
    server = MetaServer(tmp_path / "meta.sqlite")
    try:
        _regions(server.url, ["north", "south"])
        with http(server.url) as c:
            since0 = c.get("/v1/heads", params={"since": 0}).json()["version"]
        last = 60
        finals: list[int] = []
        errors: list[str] = []
        start = threading.Barrier(6 + 4)

        def follower() -> None:
            seen, since = -1, since0
            with http(server.url) as c:
                start.wait()
                while seen < last:
                    r = c.get(
                        "/v1/heads",
                        params={"since": since, "regions": "north,south", "wait_ms": 20_000},
                    )
                    doc = r.json()
                    if "north" not in doc["heads"]:
                        errors.append(f"an answer without north's head: {doc}")
                        return
                    assert doc["heads"]["north"] >= seen  # never backwards
                    seen, since = doc["heads"]["north"], doc["version"]
            finals.append(seen)

        def reporter(k: int) -> None:
            with http(server.url) as c:
                start.wait()
                # Four reporters race; seqs arrive out of order and many at once.
                for seq in range(k, last + 1, 4):
                    assert c.post("/v1/regions/north/head", json={"seq": seq}).status_code == 200

        threads = [threading.Thread(target=follower) for _ in range(6)]
        threads += [threading.Thread(target=reporter, args=(k,)) for k in range(1, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert finals == [last] * 6
        with http(server.url) as c:
            assert c.get("/v1/heads", params={"since": 0}).json()["heads"]["north"] == last
    finally:
        server.stop()


def test_a_report_right_after_a_poll_started_is_never_lost(tmp_path: Path) -> None:
    server = MetaServer(tmp_path / "meta.sqlite")
    try:
        _regions(server.url, ["north"])
        with http(server.url) as poller, http(server.url) as reporter:
            since = poller.get("/v1/heads", params={"since": 0}).json()["version"]
            for seq in range(1, 41):
                box: list[httpx.Response] = []

                def poll(since: int = since, box: list[httpx.Response] = box) -> None:
                    params = {"since": since, "regions": "north", "wait_ms": 15_000}
                    box.append(poller.get("/v1/heads", params=params))

                t = threading.Thread(target=poll)
                t.start()
                # No pause: the report races the poll's check-then-wait.
                assert reporter.post("/v1/regions/north/head", json={"seq": seq}).status_code == 200
                t.join(30)
                doc = box[0].json()
                # A lost wake-up would answer {} after 15 s instead.
                assert doc["heads"] == {"north": seq}, (seq, doc)
                since = doc["version"]
    finally:
        server.stop()


def test_heartbeats_show_at_once_and_reach_the_database(tmp_path: Path) -> None:
    db = tmp_path / "meta.sqlite"
    server = MetaServer(db)
    try:
        token = _regions(server.url, ["north"])["north"]
        with http(server.url, token) as c:
            body = {"gateway_version": "9.9", "lag": {"x": 1.5}, "head_seq": 3}
            assert c.post("/v1/regions/north/heartbeat", json=body).status_code == 200
        with http(server.url) as c:
            row = c.get("/v1/regions/north").json()
        assert row["gateway_version"] == "9.9"
        assert row["lag"] == {"x": 1.5}
        assert row["head_seq"] == 3
        beat_ms = row["last_heartbeat_ms"]
        assert beat_ms is not None
    finally:
        assert server.stop() == 0
    # Written behind, and at the latest when the server stops.
    store = MetadataStore(db)
    try:
        stored = store.region("north")
    finally:
        store.close()
    assert stored["last_heartbeat_ms"] == beat_ms
    assert stored["gateway_version"] == "9.9"


async def test_a_large_routing_table_is_sent_gzipped(tmp_path: Path) -> None:
    server = MetaServer(tmp_path / "meta.sqlite")
    try:
        _regions(server.url, ["north", "south"])
        with http(server.url) as c:
            for i in range(80):
                body = {"name": f"telemetry-{i:03d}", "home": "north", "subscribers": ["south"]}
                assert c.post("/v1/topics", json=body).status_code == 201
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(base_url=server.url, headers=auth) as c2:
            raw = await c2.get("/v1/routing", headers={"Accept-Encoding": "gzip"})
            plain = await c2.get("/v1/routing", headers={"Accept-Encoding": "identity"})
        assert raw.headers["content-encoding"] == "gzip"
        assert int(raw.headers["content-length"]) < len(raw.content) / 4  # decoded by httpx
        assert "content-encoding" not in plain.headers
        assert plain.json() == raw.json()
        async with MetadataClient(server.url, token=ADMIN_TOKEN) as client:
            fetch = await client.fetch_routing()
        assert len(fetch.table.topics) == 80
        assert fetch.etag == raw.headers["etag"]
    finally:
        server.stop()
