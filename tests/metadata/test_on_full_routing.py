"""``on_full`` in metadata-server mode: the schema migration, the API field, the CLI,
and a gateway that puts a drop-oldest topic from the routing table in its drop lane.

The store and the routing documents are checked alone (a version 3 database
from before ``on_full`` is migrated and its topics are ``block``; a document
without the field means ``block``); the API and the CLI against a real
``edgegw metadata serve``; the gateway as real ``edgegw serve`` processes on a
local-directory bucket: a topic the table makes ``drop-oldest`` is journaled
in the ``journal-<priority>-drop`` lane, ships from there and is mirrored.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from _meta_support import (
    ADMIN_TOKEN,
    EDGEGW,
    MetaServer,
    admin,
    http,
    lanes,
    produce_two_partitions,
)
from _meta_support import Fleet as MetaFleet
from _serve import Fleet, mirror_mismatches, read_partition, wait_until

from edge_gateway.errors import InvalidInput
from edge_gateway.journal import Lane, OnFull, Priority
from edge_gateway.metadata._db import MIGRATIONS, MetadataStore
from edge_gateway.metadata.routing import ON_FULL, RoutingTable, TopicRoute, topology

# ------------------------------------------------------------------ store


def test_on_full_values_are_the_journals() -> None:
    assert tuple(o.value for o in OnFull) == ON_FULL


def test_a_version_3_database_is_migrated_and_its_topics_block(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    for i in range(3):
        db.executescript(MIGRATIONS[i])
    db.execute("INSERT INTO regions (id, created_ms) VALUES ('north', 1), ('south', 1)")
    db.execute(
        "INSERT INTO topics (name, home, partitions, retention_ms, subscribers, priority,"
        " created_ms, updated_ms) VALUES ('t', 'north', 3, NULL, '[\"south\"]', 'bulk', 1, 1)"
    )
    db.execute("PRAGMA user_version = 3")
    db.close()

    s = MetadataStore(path)
    try:
        assert s.schema_version == len(MIGRATIONS) == 4
        before = s.routing()
        (t,) = before.topics
        assert t == TopicRoute("t", "north", 3, None, ("south",), "bulk", "block")
        # Absent in the document while block: older gateways read it as before.
        assert "on_full" not in t.to_json()
        changed = s.alter_topic("t", {"on_full": "drop-oldest"}, 2)
        assert (changed.priority, changed.on_full) == ("bulk", "drop-oldest")
        after = s.routing()
        assert after.version == before.version + 1
        assert after.topics[0].to_json()["on_full"] == "drop-oldest"
        # the same value again changes nothing (no new version)
        s.alter_topic("t", {"on_full": "drop-oldest"}, 3)
        assert s.routing().version == after.version
        with pytest.raises(InvalidInput, match="on_full must be one of 'block', 'drop-oldest'"):
            s.alter_topic("t", {"on_full": "drop-newest"}, 4)
        s.create_topic(TopicRoute("d", "north", 1, None, (), "critical", "drop-oldest"), 5)
        assert s.topic("d").on_full == "drop-oldest"
        assert s.topic("d").priority == "critical"
    finally:
        s.close()
    # The column refuses anything else, whoever writes it.
    db = sqlite3.connect(path, isolation_level=None)
    try:
        with pytest.raises(sqlite3.IntegrityError):
            db.execute("UPDATE topics SET on_full = 'drop' WHERE name = 't'")
    finally:
        db.close()


def test_routing_documents_with_and_without_the_field() -> None:
    old = {
        "version": 3,
        "regions": ["north"],
        "topics": [{"name": "t", "home": "north", "partitions": 1, "retention_ms": None}],
    }
    table = RoutingTable.from_json(old)
    assert table.topics[0].on_full == "block"
    assert topology(table)[0].on_full is OnFull.BLOCK
    new = json.loads(json.dumps(old))
    new["topics"][0]["on_full"] = "drop-oldest"
    new["topics"][0]["priority"] = "bulk"
    table = RoutingTable.from_json(new)
    (t,) = topology(table)
    assert (t.priority, t.on_full) == (Priority.BULK, OnFull.DROP_OLDEST)
    assert RoutingTable.from_json(table.to_json()) == table
    for bad in ("drop", "", None, 1, "Block", "drop_oldest"):
        new["topics"][0]["on_full"] = bad
        with pytest.raises(InvalidInput, match="on_full must be one of"):
            RoutingTable.from_json(new)


# ------------------------------------------------------------- API and CLI


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEGW_")}
    env.update(COLUMNS="250", EDGEGW_METADATA_URL=url, EDGEGW_METADATA_TOKEN=ADMIN_TOKEN)
    return subprocess.run(
        [str(EDGEGW), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def test_api_and_cli(fleet: MetaFleet) -> None:
    with http(fleet.url) as c:
        r = c.post("/v1/topics", json={"name": "full-a", "home": "north", "on_full": "drop-oldest"})
        assert r.status_code == 201, r.text
        assert r.json()["on_full"] == "drop-oldest"
        r = c.post("/v1/topics", json={"name": "full-b", "home": "north", "on_full": "drop"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_request"
        assert err["message"] == "on_full must be one of 'block', 'drop-oldest', not 'drop'"
        r = c.patch("/v1/topics/full-a", json={"on_full": True})
        assert r.status_code == 400, r.text
        assert "on_full must be one of" in r.json()["error"]["message"]
        routing = c.get("/v1/routing").json()
        topic = next(t for t in routing["topics"] if t["name"] == "full-a")
        assert topic["on_full"] == "drop-oldest"
        r = c.patch("/v1/topics/full-a", json={"on_full": "block"})
        assert r.status_code == 200, r.text
        assert "on_full" not in r.json()
        routing = c.get("/v1/routing").json()
        assert "on_full" not in next(t for t in routing["topics"] if t["name"] == "full-a")

    r = cli(fleet.url, "topics", "create", "full-c", "--home", "north", "--on-full", "drop-oldest")
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "full-c" in line and "north" in line)
    assert "drop-oldest" in row
    r = cli(fleet.url, "topics", "alter", "full-a", "--on-full", "drop-oldest")
    assert r.returncode == 0, r.stderr
    r = cli(fleet.url, "topics", "alter", "full-c", "--on-full", "block")
    assert r.returncode == 0, r.stderr
    r = cli(fleet.url, "topics", "list")
    assert r.returncode == 0, r.stderr
    rows = {
        name: line
        for line in r.stdout.splitlines()
        for name in ("full-a", "full-c")
        if name in line and "north" in line
    }
    assert "drop-oldest" in rows["full-a"], rows
    assert "block" in rows["full-c"], rows
    assert "drop-oldest" not in rows["full-c"], rows
    r = cli(fleet.url, "topics", "alter", "full-c", "--on-full", "drop-newest")
    assert r.returncode != 0
    (line,) = r.stderr.strip().splitlines()
    assert "--on-full: on_full must be one of 'block', 'drop-oldest'" in line, line


# ---------------------------------------------------------------- gateways


@pytest.mark.slow
def test_a_drop_oldest_topic_from_the_table_lands_in_its_drop_lane(
    tmp_path: Path, server: MetaServer
) -> None:
    tokens = {}
    with http(server.url) as c:
        for region in ("north", "south"):
            r = c.post("/v1/regions", json={"id": region})
            assert r.status_code == 201, r.text
            tokens[region] = r.json()["token"]
    for name, on_full in (("events", "drop-oldest"), ("telemetry", "block")):
        admin(
            server.url,
            "POST",
            "/v1/topics",
            {"name": name, "home": "north", "partitions": 2, "subscribers": ["south"]}
            | ({"on_full": on_full} if on_full != "block" else {}),
        )
    meta = {"url": server.url, "poll_interval_ms": 200, "heartbeat_interval_ms": 500}
    fleet = Fleet(
        tmp_path,
        ["north", "south"],
        [],
        sections={"metadata": meta},
        per_region={r: {"metadata": {"token": t}} for r, t in tokens.items()},
    )
    north, south = fleet["north"], fleet["south"]
    drop_lane = Lane(Priority.NORMAL, OnFull.DROP_OLDEST)
    try:
        fleet.start()
        assert str(drop_lane) in lanes(north), lanes(north)
        assert (north.data_dir / drop_lane.dirname).is_dir()
        assert drop_lane.dirname == "journal-normal-drop"
        for topic, lane in (("events", str(drop_lane)), ("telemetry", "normal")):
            before = {k: v["next_lsn"] for k, v in lanes(north).items()}
            produce_two_partitions(north, topic, 20)  # one entry per partition
            after = {k: v["next_lsn"] for k, v in lanes(north).items()}
            assert after == {**before, lane: before[lane] + 2}, (topic, before, after)
        # The drop lane's journal holds the topic's records on disk.
        segments = [p for p in (north.data_dir / drop_lane.dirname).rglob("*") if p.is_file()]
        assert any(p.stat().st_size > 0 for p in segments), segments
        for p in range(2):
            assert [r.offset for r in read_partition(north.url, "events", p)] == list(range(20))
        wait_until(
            lambda: all(v["backlog_entries"] == 0 for v in lanes(north).values()),
            30,
            "north to ship",
        )
        wait_until(lambda: south.next_offsets("north.events") == [20, 20], 60, "south to mirror")
        assert mirror_mismatches(north, "events", 2, south) == []

        # telemetry becomes drop-oldest while the gateway runs (the CLI sets it):
        # the normal-drop lane is open, so once the normal lane has shipped it
        # its appends go there, offsets running on.
        r = cli(server.url, "topics", "alter", "telemetry", "--on-full", "drop-oldest")
        assert r.returncode == 0, r.stderr
        version = admin(server.url, "GET", "/v1/routing")["version"]
        wait_until(
            lambda: north.status()["metadata"]["version"] == version, 30, "north to apply it"
        )
        before = lanes(north)
        produce_two_partitions(north, "telemetry", 20)
        after = lanes(north)
        assert after[str(drop_lane)]["next_lsn"] == before[str(drop_lane)]["next_lsn"] + 2, after
        assert after["normal"]["next_lsn"] == before["normal"]["next_lsn"], after
        assert "telemetry: on_full block -> drop-oldest" in north.log.read_text()
        for p in range(2):
            assert [r.offset for r in read_partition(north.url, "telemetry", p)] == list(range(40))
        wait_until(lambda: south.next_offsets("north.telemetry") == [40, 40], 60, "south to mirror")
        assert mirror_mismatches(north, "telemetry", 2, south) == []

        # A lane not open in this run (bulk-drop): logged, taken at the next start;
        # the topic stays writable, its offsets running on.
        r = cli(server.url, "topics", "alter", "events", "--priority", "bulk")
        assert r.returncode == 0, r.stderr
        version = admin(server.url, "GET", "/v1/routing")["version"]
        wait_until(
            lambda: north.status()["metadata"]["version"] == version, 30, "north to apply it"
        )
        assert "bulk-drop" not in lanes(north)
        log = north.log.read_text()
        assert "events: priority normal -> bulk" in log
        assert "events: lane bulk-drop (priority bulk, on_full drop-oldest) has no journal" in log
        produce_two_partitions(north, "events", 20)
        for p in range(2):
            assert [r.offset for r in read_partition(north.url, "events", p)] == list(range(40))
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"
