"""The metadata server as a real process: state, conflicts, ETags, auth, bad input, heads."""

from __future__ import annotations

import signal
import ssl
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import trio
from _meta_support import ADMIN_TOKEN, EDGEGW, Fleet, MetaServer, http

from edge_gateway.testing.tls import make_tls_files

#: The API contract is the same on every store (conftest.py runs these on each).
STORES = ("sqlite", "postgres")


def _name(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _error(r: httpx.Response, status: int, code: str | None = None) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"]
    if code is not None:
        assert err["code"] == code, err
    return str(err["message"])


# ----------------------------------------------------------------- state


def test_restart_keeps_state(tmp_path: Path) -> None:
    db = tmp_path / "meta.sqlite"
    server = MetaServer(db)
    with http(server.url) as c:
        token = c.post("/v1/regions", json={"id": "north"}).json()["token"]
        c.post("/v1/regions", json={"id": "south"})
        body = {"name": "telemetry", "home": "north", "partitions": 2, "subscribers": ["south"]}
        assert c.post("/v1/topics", json=body).status_code == 201
        assert c.patch("/v1/topics/telemetry", json={"partitions": 4}).status_code == 200
        bucket = {"type": "s3", "bucket": "fleet", "endpoint_url": "http://s3.example"}
        assert c.put("/v1/buckets/default", json=bucket).status_code == 201
        before = c.get("/v1/routing")
    assert server.stop(signal.SIGTERM) == 0
    assert not server.addr_file.exists()

    # Restarted without --admin-token: the stored (hashed) one still works.
    server = MetaServer(db, admin_token=None)
    try:
        with http(server.url) as c:
            after = c.get("/v1/routing")
            assert after.json() == before.json()
            assert after.headers["etag"] == before.headers["etag"]
            etag = before.headers["etag"]
            assert c.get("/v1/routing", headers={"If-None-Match": etag}).status_code == 304
            t = after.json()["topics"][0]
            assert (t["name"], t["partitions"], t["subscribers"]) == ("telemetry", 4, ["south"])
            assert after.json()["buckets"] == [{"name": "default", **bucket}]
        with http(server.url, token) as c:
            assert c.post("/v1/regions/north/head", json={"seq": 1}).status_code == 200
        with http(server.url, None) as c:  # not open mode: an admin token is stored
            _error(c.get("/v1/routing"), 401, "unauthorized")
    finally:
        server.stop()
    assert db.exists()
    assert "admin-token-for-tests" not in db.read_bytes().decode("latin-1")
    assert "egw_" not in db.read_bytes().decode("latin-1")  # only hashes are stored


async def test_concurrent_creation_one_winner(fleet: Fleet) -> None:
    name = _name()
    statuses: list[int] = []
    codes: list[str] = []
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=fleet.url, headers=headers, timeout=30) as c:

        async def create(partitions: int) -> None:
            body = {"name": name, "home": "north", "partitions": partitions}
            r = await c.post("/v1/topics", json=body)
            statuses.append(r.status_code)
            if r.status_code != 201:
                codes.append(r.json()["error"]["code"])

        async with trio.open_nursery() as nursery:
            for i in range(12):
                nursery.start_soon(create, i + 1)
        described = (await c.get(f"/v1/topics/{name}")).json()
    assert sorted(statuses) == [201] + [409] * 11
    assert codes == ["topic_exists"] * 11
    assert 1 <= described["partitions"] <= 12


# ------------------------------------------------------------------ ETag


def test_etag_and_304(fleet: Fleet) -> None:
    with http(fleet.url) as c:
        first = c.get("/v1/routing")
        etag = first.headers["etag"]
        assert etag == f'"{first.json()["version"]}"'
        again = c.get("/v1/routing", headers={"If-None-Match": etag})
        assert again.status_code == 304
        assert again.content == b""
        assert c.get("/v1/routing", headers={"If-None-Match": f'"0", W/{etag}'}).status_code == 304
        assert c.get("/v1/routing", headers={"If-None-Match": '"0"'}).status_code == 200
        # A heartbeat does not change the routing ...
        beat = {"gateway_version": "0.1.0", "lag": {"south": 1.5}}
        assert c.post("/v1/regions/north/heartbeat", json=beat).status_code == 200
        assert c.get("/v1/routing", headers={"If-None-Match": etag}).status_code == 304
        # ... a topic does.
        name = _name()
        assert c.post("/v1/topics", json={"name": name, "home": "north"}).status_code == 201
        changed = c.get("/v1/routing", headers={"If-None-Match": etag})
        assert changed.status_code == 200
        assert changed.json()["version"] == first.json()["version"] + 1
        assert changed.headers["etag"] != etag
        # An alter that changes nothing keeps the version.
        v = changed.json()["version"]
        assert c.patch(f"/v1/topics/{name}", json={"partitions": 1}).status_code == 200
        assert c.get("/v1/routing").json()["version"] == v


# ------------------------------------------------------------------ auth


def test_auth_rules(fleet: Fleet) -> None:
    topic = _name()
    with http(fleet.url) as admin:
        assert admin.post("/v1/topics", json={"name": topic, "home": "north"}).status_code == 201
        revoked_token = admin.post("/v1/regions", json={"id": "gone"}).json()["token"]
        assert admin.delete("/v1/regions/gone").status_code == 204
    north, south = fleet.tokens["north"], fleet.tokens["south"]
    new_topic = {"name": _name(), "home": "north"}
    routes: list[tuple[str, str, object]] = [
        ("GET", "/v1/routing", None),
        ("GET", "/v1/topics", None),
        ("GET", f"/v1/topics/{topic}", None),
        ("GET", "/v1/regions", None),
        ("GET", "/v1/regions/north", None),
        ("GET", "/v1/heads", None),
        ("GET", "/v1/buckets", None),
        ("POST", "/v1/topics", new_topic),
        ("PATCH", f"/v1/topics/{topic}", {"partitions": 3}),
        ("DELETE", f"/v1/topics/{topic}", None),
        ("POST", "/v1/regions", {"id": "east"}),
        ("DELETE", "/v1/regions/south", None),
        ("PUT", "/v1/buckets/b1", {"type": "local", "path": "/srv/bucket"}),
        ("DELETE", "/v1/buckets/b1", None),
        ("POST", "/v1/regions/north/heartbeat", {"gateway_version": "x"}),
        ("POST", "/v1/regions/north/head", {"seq": 3}),
        ("POST", "/v1/regions/north/token", {"keep_previous_s": 3600}),
    ]
    admin_only = {("POST", "/v1/topics"), ("PATCH", f"/v1/topics/{topic}")}
    admin_only |= {("DELETE", f"/v1/topics/{topic}"), ("POST", "/v1/regions")}
    admin_only |= {("DELETE", "/v1/regions/south"), ("PUT", "/v1/buckets/b1")}
    admin_only |= {("DELETE", "/v1/buckets/b1"), ("POST", "/v1/regions/north/token")}
    as_north = {("POST", "/v1/regions/north/heartbeat"), ("POST", "/v1/regions/north/head")}

    for method, path, body in routes:
        for token in (None, "wrong-token-0123456789", revoked_token, "egw_0000000000000000_x"):
            with http(fleet.url, token) as c:
                _error(c.request(method, path, json=body), 401, "unauthorized")
        # south acts on north's behalf, or changes the fleet: 403.
        with http(fleet.url, south) as c:
            r = c.request(method, path, json=body)
            if (method, path) in admin_only or (method, path) in as_north:
                msg = _error(r, 403, "forbidden")
                assert "south" in msg
            else:
                assert r.status_code == 200, (method, path, r.text)
        # north: its own heartbeat and head, and every read.
        with http(fleet.url, north) as c:
            r = c.request(method, path, json=body)
            if (method, path) in admin_only:
                _error(r, 403, "forbidden")
            else:
                assert r.status_code == 200, (method, path, r.text)
    # The admin may do everything (in an order where each call makes sense).
    with http(fleet.url) as c:
        for method, path, body in routes:
            r = c.request(method, path, json=body)
            assert r.status_code in (200, 201, 204), (method, path, r.text)
    # south was revoked by the admin run above: its token stops working at once.
    with http(fleet.url, south) as c:
        _error(c.get("/v1/routing"), 401, "unauthorized")
    with http(fleet.url) as c:  # re-add south for the other tests: a new token
        fleet.tokens["south"] = c.post("/v1/regions", json={"id": "south"}).json()["token"]
    with http(fleet.url, fleet.tokens["south"]) as c:
        assert c.get("/v1/routing").status_code == 200
    with http(fleet.url, None) as c:  # public routes
        assert c.get("/healthz").status_code == 200
        assert c.get("/openapi.json").json()["openapi"].startswith("3.1")


def test_token_rotation(fleet: Fleet) -> None:
    region = _name()
    with http(fleet.url) as admin:
        first = admin.post("/v1/regions", json={"id": region}).json()["token"]
        with http(fleet.url, first) as c:  # verified and cached by the server
            assert c.get("/v1/routing").status_code == 200
        r = admin.post(f"/v1/regions/{region}/token", json={"keep_previous_s": 1})
        assert r.status_code == 200, r.text
        doc = r.json()
        second = doc["token"]
        assert doc["id"] == region
        assert isinstance(doc["previous_valid_until_ms"], int)
        for token in (first, second):  # two valid tokens during the rotation
            with http(fleet.url, token) as c:
                assert c.get("/v1/routing").status_code == 200
        # The grace period ends even for a token the server has cached.
        time.sleep(max(0.0, doc["previous_valid_until_ms"] / 1000 - time.time()) + 0.2)
        with http(fleet.url, first) as c:
            _error(c.get("/v1/routing"), 401, "unauthorized")
        with http(fleet.url, second) as c:
            assert c.get("/v1/routing").status_code == 200
        # keep_previous_s 0: the current token ends at once; the default keeps a day.
        third = admin.post(f"/v1/regions/{region}/token", json={"keep_previous_s": 0}).json()
        assert third["previous_valid_until_ms"] is None
        with http(fleet.url, second) as c:
            _error(c.get("/v1/routing"), 401, "unauthorized")
        fourth = admin.post(f"/v1/regions/{region}/token", json={}).json()
        assert fourth["previous_valid_until_ms"] > (time.time() + 86_000) * 1000
        for token in (third["token"], fourth["token"]):
            with http(fleet.url, token) as c:
                assert c.get("/v1/routing").status_code == 200
        for bad in (
            {"keep_previous_s": -1},
            {"keep_previous_s": "1"},
            {"keep_previous_s": 1.5},
            {"keep_previous_s": True},
            {"keep_previous_s": 31 * 86_400},
            {"nope": 1},
        ):
            _error(admin.post(f"/v1/regions/{region}/token", json=bad), 400)
        _error(admin.post("/v1/regions/mars/token", json={}), 404)
        # Revoking the region ends both of its tokens.
        assert admin.delete(f"/v1/regions/{region}").status_code == 204
        for token in (third["token"], fourth["token"]):
            with http(fleet.url, token) as c:
                _error(c.get("/v1/routing"), 401, "unauthorized")


def test_non_loopback_needs_an_admin_token(tmp_path: Path) -> None:
    argv = [str(EDGEGW), "metadata", "serve", "--db", str(tmp_path / "m.sqlite")]
    argv += ["--listen", "0.0.0.0:0"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2
    assert "admin token is required" in r.stderr
    r = subprocess.run(
        [*argv, "--admin-token", "short"], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 2
    assert "at least 16 characters" in r.stderr


def test_open_mode_on_loopback(tmp_path: Path) -> None:
    server = MetaServer(tmp_path / "open.sqlite", admin_token=None)
    try:
        with http(server.url, None) as c:
            assert c.post("/v1/regions", json={"id": "north"}).status_code == 201
            assert c.get("/v1/routing").json()["regions"] == ["north"]
            _error(c.get("/v1/routing", headers={"Authorization": "Bearer nope"}), 401)
    finally:
        server.stop()


def test_tls(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path / "certs", names=("127.0.0.1",), client=False)
    server = MetaServer(
        tmp_path / "tls.sqlite", extra=("--tls-cert", str(files.cert), "--tls-key", str(files.key))
    )
    try:
        assert server.url.startswith("https://")
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ctx = ssl.create_default_context(cafile=str(files.ca))
        with httpx.Client(base_url=server.url, verify=ctx, headers=headers) as c:
            assert c.get("/v1/routing").status_code == 200
    finally:
        server.stop()


# ------------------------------------------------------------- bad input


def test_bad_input_is_4xx_with_a_message(fleet: Fleet) -> None:
    with http(fleet.url) as c:
        post = {"headers": {"Content-Type": "application/json"}}
        _error(c.post("/v1/topics", content=b'{"name": "x", ', **post), 400, "invalid_json")
        _error(c.post("/v1/topics", content=b"\xff\xfe", **post), 400, "invalid_json")
        _error(c.post("/v1/topics", content=b"", **post), 400, "invalid_json")
        _error(c.post("/v1/topics", content=b"[1, 2]", **post), 400, "invalid_json")
        _error(c.post("/v1/topics", content=b"[" * 50_000, **post), 400, "invalid_json")
        msg = _error(c.post("/v1/topics", content=b"x" * 100_000, **post), 413, "body_too_large")
        assert "limit" in msg

        def chunks() -> object:
            for _ in range(100):
                yield b" " * 1024

        _error(c.post("/v1/topics", content=chunks(), **post), 413, "body_too_large")  # type: ignore[arg-type]
        _error(
            c.post("/v1/topics", content=b"{}", headers={"Content-Type": "text/plain"}),
            415,
            "unsupported_media_type",
        )
        _error(c.post("/v1/topics", json={"name": "a/b", "home": "north"}), 400, "invalid_name")
        # Text PostgreSQL cannot store (a NUL) is refused on every store, before it.
        beat = {"gateway_version": "1\x00", "lag": {}}
        _error(c.post("/v1/regions/north/heartbeat", json=beat), 400, "invalid_request")
        _error(c.post("/v1/topics", json={"name": "ok", "home": "no.pe"}), 400, "invalid_name")
        _error(c.post("/v1/topics", json={"name": "ok", "home": "north", "x": 1}), 400)
        _error(c.post("/v1/topics", json={"name": "ok", "home": "north", "partitions": 0}), 400)
        _error(c.post("/v1/topics", json={"name": "ok", "home": "north", "partitions": True}), 400)
        msg = _error(c.post("/v1/topics", json={"name": "ok", "home": "mars"}), 404)
        assert "mars" in msg
        body = {"name": "ok", "home": "north", "subscribers": ["pluto"]}
        _error(c.post("/v1/topics", json=body), 404, "unknown_region")
        body = {"name": "ok", "home": "north", "subscribers": ["north"]}
        _error(c.post("/v1/topics", json=body), 400)

        name = _name()
        body = {"name": name, "home": "north", "partitions": 4}
        assert c.post("/v1/topics", json=body).status_code == 201
        _error(c.post("/v1/topics", json=body), 409, "topic_exists")
        msg = _error(c.patch(f"/v1/topics/{name}", json={"partitions": 2}), 400)
        assert "only grow" in msg
        assert "home" in _error(c.patch(f"/v1/topics/{name}", json={"home": "south"}), 400)
        _error(c.patch("/v1/topics/nope", json={"partitions": 9}), 404, "unknown_topic")
        _error(c.delete("/v1/topics/nope"), 404, "unknown_topic")
        _error(c.get("/v1/regions/mars"), 404, "unknown_region")
        _error(c.delete("/v1/regions/mars"), 404, "unknown_region")
        _error(c.post("/v1/regions", json={"id": "north"}), 409, "region_exists")
        _error(c.post("/v1/regions/mars/head", json={"seq": 1}), 404, "unknown_region")
        _error(c.post("/v1/regions/north/head", json={"seq": -1}), 400)
        _error(c.post("/v1/regions/north/head", json={"seq": 1, "x": 2}), 400)
        _error(c.post("/v1/regions/north/heartbeat", json={"lag": {"a": "b"}}), 400)
        _error(c.get("/v1/heads", params={"wait_ms": "10000000"}), 400)
        _error(c.get("/v1/heads", params={"since": "-1"}), 400)
        _error(c.get("/v1/heads", params={"regions": "a/b"}), 400, "invalid_name")
        _error(c.put("/v1/buckets/b", json={"type": "ftp"}), 400)
        _error(c.put("/v1/buckets/b", json={"type": "s3", "secret_key": "k"}), 400)
        _error(c.get("/v1/buckets/nope"), 404, "unknown_bucket")
        _error(c.get("/v1/nope"), 404, "not_found")
        r = c.put("/v1/topics", json={})
        _error(r, 405, "method_not_allowed")
        assert "POST" in r.headers["allow"]


# ------------------------------------------------------------------ heads


async def test_head_long_poll(fleet: Fleet) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    north = {"Authorization": f"Bearer {fleet.tokens['north']}"}
    south = {"Authorization": f"Bearer {fleet.tokens['south']}"}
    async with httpx.AsyncClient(base_url=fleet.url, timeout=60) as c:
        start = (await c.get("/v1/heads", headers=admin)).json()
        since = start["version"]
        seq = start["heads"].get("north", 0) + 10

        # Nothing moves: the poll times out with no heads and the same version.
        empty = (
            await c.get("/v1/heads", params={"since": since, "wait_ms": 200}, headers=admin)
        ).json()
        assert empty == {"version": since, "heads": {}}

        # A report wakes a long poll at once (a 30 s wait that returns with the head).
        got: list[dict[str, object]] = []

        async def poll() -> None:
            params = {"since": since, "regions": "north", "wait_ms": 30_000}
            r = await c.get("/v1/heads", params=params, headers=south)
            got.append(r.json())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            await trio.sleep(0.2)
            # south's head moving does not answer a poll for north only.
            s = await c.post("/v1/regions/south/head", json={"seq": seq}, headers=south)
            assert s.status_code == 200
            await trio.sleep(0.2)
            assert got == []
            r = await c.post("/v1/regions/north/head", json={"seq": seq}, headers=north)
            assert r.json()["seq"] == seq
        assert got[0]["heads"] == {"north": seq}
        assert isinstance(got[0]["version"], int)
        assert got[0]["version"] > since

        # Coalesced: an older seq changes nothing.
        r = await c.post("/v1/regions/north/head", json={"seq": seq - 5}, headers=north)
        assert r.json()["seq"] == seq
        assert r.json()["version"] == got[0]["version"]
        after = await c.get("/v1/heads", params={"since": r.json()["version"]}, headers=admin)
        assert after.json()["heads"] == {}
        # since=0 gives every known head.
        every = (await c.get("/v1/heads", params={"since": 0}, headers=admin)).json()
        assert every["heads"]["north"] == seq
        assert every["heads"]["south"] == seq
        # A heartbeat can carry the head too; regions list shows it.
        beat = {"gateway_version": "0.1.0", "lag": {"south": 0.5}, "head_seq": seq + 1}
        assert (
            await c.post("/v1/regions/north/heartbeat", json=beat, headers=north)
        ).status_code == 200
        region = (await c.get("/v1/regions/north", headers=admin)).json()
        assert region["head_seq"] == seq + 1
        assert region["gateway_version"] == "0.1.0"
        assert region["lag"] == {"south": 0.5}
        assert region["last_heartbeat_ms"] > 0


async def test_stop_ends_long_polls(tmp_path: Path) -> None:
    server = MetaServer(tmp_path / "m.sqlite")
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as c:
        answers: list[int] = []

        async def poll() -> None:
            r = await c.get("/v1/heads", params={"since": 0, "wait_ms": 60_000})
            answers.append(r.status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            await trio.sleep(0.3)
            code = await trio.to_thread.run_sync(server.stop)
    assert code == 0
    assert answers == [200]
