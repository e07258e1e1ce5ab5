"""Gateways take their topology from a real metadata server process, and apply changes live.

Real processes throughout: ``edgegw metadata serve`` and ``edgegw serve`` per
region on one local-directory bucket. Covered: live changes (a new topic
becomes writable, partitions grow, a subscription added starts a tailer, a
removed one stops it and a re-added one resumes exactly once), produce to a
topic homed elsewhere (``409 wrong_region`` naming the home), unknown topics
(refused unless ``auto_create``), and a gateway that starts while the server
is down (from its cache), then picks up a change once the server is back.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
from _meta_support import EDGEGW, MetaServer, admin, http
from _serve import Fleet, Gateway, mirror_mismatches, wait_until

DEADLINE = 60.0


def _regions(url: str, *names: str) -> dict[str, str]:
    with http(url) as c:
        tokens = {}
        for name in names:
            r = c.post("/v1/regions", json={"id": name})
            assert r.status_code == 201, r.text
            tokens[name] = r.json()["token"]
        return tokens


def _fleet(
    root: Path,
    url: str,
    tokens: dict[str, str],
    *,
    per_region: dict[str, dict[str, dict[str, object]]] | None = None,
) -> Fleet:
    regions = {
        r: {"metadata": {"token": tok}, **(per_region or {}).get(r, {})}
        for r, tok in tokens.items()
    }
    meta = {"url": url, "poll_interval_ms": 200, "heartbeat_interval_ms": 500}
    return Fleet(root, list(tokens), [], sections={"metadata": meta}, per_region=regions)


def _produce(g: Gateway, topic: str, n: int, partition: int | None = None) -> httpx.Response:
    where = {} if partition is None else {"partition": partition}
    records = [{"value": f"{g.region}-{topic}-{i}", **where} for i in range(n)]
    return httpx.post(f"{g.url}/v1/topics/{topic}/records", json={"records": records}, timeout=30)


def _error(r: httpx.Response) -> dict[str, Any]:
    err: dict[str, Any] = r.json()["error"]
    return err


def _partitions(g: Gateway, topic: str) -> int | None:
    r = httpx.get(f"{g.url}/v1/topics/{topic}", timeout=30)
    return len(r.json()["partitions"]) if r.status_code == 200 else None


def _status_text(g: Gateway) -> str:
    """What `edgegw status` prints for ``g`` (one line per row)."""
    out = subprocess.run(
        [str(EDGEGW), "status", "--url", g.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    return out.stdout


def _metrics(g: Gateway) -> str:
    return httpx.get(f"{g.url}/metrics", timeout=30).text


def _metadata(g: Gateway) -> dict[str, Any]:
    doc: dict[str, Any] = g.status()["metadata"]
    return doc


def test_live_routing_changes(tmp_path: Path, server: MetaServer) -> None:
    tokens = _regions(server.url, "north", "south")
    admin(server.url, "POST", "/v1/topics", {"name": "a", "home": "north", "partitions": 2})
    fleet = _fleet(tmp_path, server.url, tokens)
    north, south = fleet["north"], fleet["south"]
    try:
        fleet.start()
        for g in (north, south):
            m = _metadata(g)
            assert m["mode"] == "live", m
            assert m["describe"] == f"metadata: live (version {m['version']})"
        assert _produce(north, "a", 10).status_code == 200
        # Homed elsewhere: refused with the documented error, naming the home region.
        r = _produce(south, "a", 1)
        assert r.status_code == 409
        err = _error(r)
        assert err["code"] == "wrong_region"
        assert err["home_region"] == "north"
        assert "'north'" in err["message"]
        # Unknown (auto_create is off): refused.
        r = _produce(north, "nope", 1)
        assert (r.status_code, _error(r)["code"]) == (404, "unknown_topic")
        assert "edgegw topics create" in _error(r)["message"]
        assert south.status()["mirrors"] == {}

        # A subscription added at runtime: south starts mirroring, no restart.
        admin(server.url, "PATCH", "/v1/topics/a", {"subscribers": ["south"]})
        wait_until(lambda: "north" in south.status()["mirrors"], DEADLINE, "south's tailer")
        wait_until(
            lambda: (
                _partitions(south, "north.a") == 2
                and south.next_offsets("north.a") == north.next_offsets("a")
            ),
            DEADLINE,
            "south to mirror north.a",
        )
        # Partitions added: writable at home, mirrored with the new partition.
        admin(server.url, "PATCH", "/v1/topics/a", {"partitions": 4})
        wait_until(lambda: _partitions(north, "a") == 4, DEADLINE, "north to see 4 partitions")
        assert _produce(north, "a", 5, partition=3).status_code == 200
        wait_until(
            lambda: (
                _partitions(south, "north.a") == 4
                and south.next_offsets("north.a") == north.next_offsets("a")
            ),
            DEADLINE,
            "south to mirror partition 3",
        )
        # A new topic homed at south becomes writable there, and north mirrors it.
        admin(server.url, "POST", "/v1/topics", {"name": "b", "home": "south", "subscribers": "*"})
        wait_until(lambda: _produce(south, "b", 3).status_code == 200, DEADLINE, "b writable")
        wait_until(
            lambda: _error(_produce(north, "b", 1))["code"] == "wrong_region",
            DEADLINE,
            "north to refuse b (homed at south)",
        )
        wait_until(
            lambda: (
                _partitions(north, "south.b") == 1
                and north.next_offsets("south.b") == south.next_offsets("b")
            ),
            DEADLINE,
            "north to mirror south.b",
        )

        # The subscription removed: south's tailer of north stops, the mirror topic goes.
        admin(server.url, "PATCH", "/v1/topics/a", {"subscribers": []})
        wait_until(lambda: "north" not in south.status()["mirrors"], DEADLINE, "tailer stopped")
        assert _partitions(south, "north.a") is None
        # Produced meanwhile, then the subscription is back: the new tailer resumes
        # where the old one stopped (the progress is in the journal) — no gap, no duplicate.
        for p in range(4):
            assert _produce(north, "a", 7, partition=p).status_code == 200
        admin(server.url, "PATCH", "/v1/topics/a", {"subscribers": "*"})
        wait_until(
            lambda: (
                _partitions(south, "north.a") == 4
                and south.next_offsets("north.a") == north.next_offsets("a")
            ),
            DEADLINE,
            "south to mirror north.a again",
        )
        assert mirror_mismatches(north, "a", 4, south) == []
        assert mirror_mismatches(south, "b", 1, north) == []
        status = south.status()
        assert status["errors"] == {}
        assert status["mirrors"]["north"]["gaps"] == []

        # The server heard from both: heartbeats with lag figures and heads.
        def regions() -> dict[str, Any]:
            return {r["id"]: r for r in admin(server.url, "GET", "/v1/regions")["regions"]}

        wait_until(
            lambda: "mirror.north.seconds_behind" in (regions()["south"]["lag"] or {}),
            DEADLINE,
            "a heartbeat of south with its mirror lag",
        )
        assert regions()["south"]["gateway_version"]
        assert regions()["north"]["head_seq"] is not None
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


def test_auto_create_is_per_region(tmp_path: Path, server: MetaServer) -> None:
    tokens = _regions(server.url, "north", "south")
    fleet = _fleet(tmp_path, server.url, tokens)
    # north allows auto_create, south does not.
    north_cfg = fleet["north"].config
    north_cfg.write_text("auto_create = true\n" + north_cfg.read_text())
    north, south = fleet["north"], fleet["south"]
    try:
        fleet.start()
        assert _produce(north, "fresh", 2).status_code == 200
        assert _partitions(north, "fresh") == 1
        r = _produce(south, "fresh2", 1)
        assert (r.status_code, _error(r)["code"]) == (404, "unknown_topic")
        # Once the routing table homes the name elsewhere, the routing table wins.
        before = _metadata(north)["version"]
        admin(server.url, "POST", "/v1/topics", {"name": "taken", "home": "south"})
        wait_until(lambda: _metadata(north)["version"] > before, DEADLINE, "north to see the topic")
        r = _produce(north, "taken", 1)
        assert (r.status_code, _error(r)["code"]) == (409, "wrong_region")
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


def test_start_from_cache_while_the_server_is_down(tmp_path: Path) -> None:
    db = tmp_path / "meta.sqlite"
    server = MetaServer(db)
    port = int(server.url.rsplit(":", 1)[1])
    tokens = _regions(server.url, "north", "south")
    admin(server.url, "POST", "/v1/topics", {"name": "t", "home": "north", "subscribers": "*"})
    fleet = _fleet(tmp_path, server.url, tokens)
    north, south = fleet["north"], fleet["south"]
    try:
        fleet.start()
        assert _produce(north, "t", 5).status_code == 200
        wait_until(
            lambda: (
                _partitions(south, "north.t") == 1
                and south.next_offsets("north.t") == north.next_offsets("t")
            ),
            DEADLINE,
            "south to mirror north.t",
        )
        assert fleet.close() == {"north": 0, "south": 0}
        assert (north.data_dir / "routing.json").exists()
        server.stop(signal.SIGKILL)

        # The server is down: both start from their cache, serve and mirror.
        fleet.start()
        for g in (north, south):
            m = _metadata(g)
            assert m["mode"] == "cached", m
            assert m["describe"].startswith("metadata: cached since "), m
            assert m["last_error"]
        assert _produce(north, "t", 5).status_code == 200
        assert _error(_produce(south, "t", 1))["code"] == "wrong_region"
        wait_until(
            lambda: south.next_offsets("north.t") == north.next_offsets("t"),
            DEADLINE,
            "south to mirror from the cached routing",
        )
        relay = _metadata(south)["relay"]
        assert relay["enabled"]
        assert not relay["active"]
        assert "edgegw_metadata_live 0.0" in _metrics(south)
        assert "edgegw_metadata_routing_age_seconds" in _metrics(south)
        out = _status_text(south)
        assert "cached since" in out
        assert "mirrors poll the bucket" in out

        # The server comes back on the same address; a change is picked up.
        server = MetaServer(db, listen=f"127.0.0.1:{port}")
        wait_until(lambda: _metadata(south)["mode"] == "live", DEADLINE, "south live again")
        admin(server.url, "POST", "/v1/topics", {"name": "u", "home": "south"})
        wait_until(lambda: _produce(south, "u", 1).status_code == 200, DEADLINE, "u writable")
        m = _metadata(south)
        assert m["describe"] == f"metadata: live (version {m['version']})"
        assert f"live (version {m['version']})" in _status_text(south)
        assert "edgegw_metadata_live 1.0" in _metrics(south)
        assert mirror_mismatches(north, "t", 1, south) == []
    finally:
        codes = fleet.close()
        server.stop()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


def test_a_damaged_routing_cache_is_rebuilt_from_the_server(
    tmp_path: Path, server: MetaServer
) -> None:
    """One bit flipped in a digit of routing.json (still valid JSON): the checksum finds
    it; the file goes to quarantine/, status, the metric and the log say so, and the
    table comes from the server again (issue 45, item 4)."""
    tokens = _regions(server.url, "north")
    admin(server.url, "POST", "/v1/topics", {"name": "t", "home": "north", "partitions": 2})
    fleet = _fleet(tmp_path, server.url, tokens)
    north = fleet["north"]
    try:
        fleet.start()
        assert _produce(north, "t", 5, partition=1).status_code == 200
        assert fleet.close() == {"north": 0}
        cache = north.data_dir / "routing.json"
        data = bytearray(cache.read_bytes())
        digits = [i for i, b in enumerate(data) if chr(b).isdigit()]
        i = min(digits, key=lambda i: abs(i - len(data) // 2))
        data[i] ^= 0x01  # a digit stays a digit: valid JSON, the same shape
        cache.write_bytes(bytes(data))

        fleet.start()
        damaged = north.status()["state_files"]["damaged"]
        assert [d["file"] for d in damaged] == ["routing.json"], damaged
        assert "checksum mismatch" in damaged[0]["reason"]
        assert Path(damaged[0]["quarantined"]).read_bytes() == bytes(data)
        assert 'edgegw_state_files_damaged_total{file="routing.json"} 1.0' in _metrics(north)
        out = _status_text(north)
        assert "1 damaged" in out
        assert "routing.json: routing cache: checksum mismatch" in out
        assert _partitions(north, "t") == 2
        with north.client() as c:
            assert [r.value for r in c.fetch("t", 1, 0).records] == [
                f"north-t-{i}".encode() for i in range(5)
            ]
        wait_until(cache.exists, DEADLINE, "the routing cache saved again")
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
    fleet.start()  # the cache written again is sound
    try:
        assert north.status()["state_files"]["damaged"] == []
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
