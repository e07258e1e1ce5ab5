"""Topic priorities in metadata-server mode: the schema migration, the API field, the CLI,
and a gateway that takes a topic's lane from the routing table.

The store and the routing documents are checked alone (a version 2 database
from before priorities is migrated; a document without the field means
``normal``); the API and the CLI against a real ``edgegw metadata serve``;
the gateway as real ``edgegw serve`` processes on a local-directory bucket:
a topic the table makes critical is journaled in the critical lane, and a
priority changed while the gateway runs moves the topic's appends to the new
lane once the old one has shipped them, with its offsets gap-free along the
log and mirrored exactly once by another region.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
import trio
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

from edge_gateway.bucket import LocalBucket
from edge_gateway.bucket_log import find_head
from edge_gateway.errors import InvalidInput
from edge_gateway.format import logobject
from edge_gateway.format.manifest import log_key
from edge_gateway.journal import Priority
from edge_gateway.metadata._db import MIGRATIONS, MetadataStore
from edge_gateway.metadata.routing import PRIORITIES, RoutingTable, TopicRoute, topology

# ------------------------------------------------------------------ store


def test_priorities_are_the_journals() -> None:
    assert tuple(p.value for p in Priority) == PRIORITIES


def test_a_version_2_database_is_migrated_and_its_topics_are_normal(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    for i in range(2):
        db.executescript(MIGRATIONS[i])
    db.execute("INSERT INTO regions (id, created_ms) VALUES ('north', 1), ('south', 1)")
    db.execute(
        "INSERT INTO topics (name, home, partitions, retention_ms, subscribers, created_ms,"
        " updated_ms) VALUES ('t', 'north', 3, NULL, '[\"south\"]', 1, 1)"
    )
    db.execute("PRAGMA user_version = 2")
    db.close()

    s = MetadataStore(path)
    try:
        assert s.schema_version == len(MIGRATIONS) >= 3
        before = s.routing()
        (t,) = before.topics
        assert t == TopicRoute("t", "north", 3, None, ("south",), "normal")
        # Absent in the document while normal: older gateways read it as before.
        assert "priority" not in t.to_json()
        changed = s.alter_topic("t", {"priority": "critical"}, 2)
        assert changed.priority == "critical"
        after = s.routing()
        assert after.version == before.version + 1
        assert after.topics[0].to_json()["priority"] == "critical"
        # the same value again changes nothing (no new version)
        s.alter_topic("t", {"priority": "critical"}, 3)
        assert s.routing().version == after.version
        with pytest.raises(InvalidInput, match="priority must be one of 'critical', 'normal'"):
            s.alter_topic("t", {"priority": "urgent"}, 4)
        s.create_topic(TopicRoute("b", "north", 1, None, (), "bulk"), 5)
        assert s.topic("b").priority == "bulk"
    finally:
        s.close()
    # The column refuses anything else, whoever writes it.
    db = sqlite3.connect(path, isolation_level=None)
    try:
        with pytest.raises(sqlite3.IntegrityError):
            db.execute("UPDATE topics SET priority = 'urgent' WHERE name = 't'")
    finally:
        db.close()


def test_routing_documents_with_and_without_the_field() -> None:
    old = {
        "version": 3,
        "regions": ["north"],
        "topics": [{"name": "t", "home": "north", "partitions": 1, "retention_ms": None}],
    }
    table = RoutingTable.from_json(old)
    assert table.topics[0].priority == "normal"
    assert topology(table)[0].priority is Priority.NORMAL
    new = json.loads(json.dumps(old))
    new["topics"][0]["priority"] = "bulk"
    table = RoutingTable.from_json(new)
    assert topology(table)[0].priority is Priority.BULK
    assert RoutingTable.from_json(table.to_json()) == table
    for bad in ("urgent", "", None, 1, "Critical"):
        new["topics"][0]["priority"] = bad
        with pytest.raises(InvalidInput, match="priority must be one of"):
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
        r = c.post("/v1/topics", json={"name": "prio-a", "home": "north", "priority": "critical"})
        assert r.status_code == 201, r.text
        assert r.json()["priority"] == "critical"
        r = c.post("/v1/topics", json={"name": "prio-b", "home": "north", "priority": "high"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_request"
        assert err["message"] == "priority must be one of 'critical', 'normal', 'bulk', not 'high'"
        r = c.patch("/v1/topics/prio-a", json={"priority": 3})
        assert r.status_code == 400, r.text
        assert "priority must be one of" in r.json()["error"]["message"]
        r = c.patch("/v1/topics/prio-a", json={"priority": "normal"})
        assert r.status_code == 200, r.text
        assert "priority" not in r.json()
        routing = c.get("/v1/routing").json()
        assert "priority" not in next(t for t in routing["topics"] if t["name"] == "prio-a")

    r = cli(fleet.url, "topics", "create", "prio-c", "--home", "north", "--priority", "bulk")
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if "prio-c" in line and "north" in line)
    assert "bulk" in row
    r = cli(fleet.url, "topics", "alter", "prio-c", "--priority", "critical")
    assert r.returncode == 0, r.stderr
    r = cli(fleet.url, "topics", "list")
    assert r.returncode == 0, r.stderr
    rows = {
        name: line
        for line in r.stdout.splitlines()
        for name in ("prio-a", "prio-c")
        if name in line and "north" in line
    }
    assert "critical" in rows["prio-c"], rows
    assert "normal" in rows["prio-a"], rows
    r = cli(fleet.url, "topics", "alter", "prio-c", "--priority", "urgent")
    assert r.returncode != 0
    (line,) = r.stderr.strip().splitlines()
    assert "--priority: priority must be one of 'critical', 'normal', 'bulk'" in line, line


# ---------------------------------------------------------------- gateways


def _log_offsets(bucket_dir: Path, region: str) -> dict[tuple[str, int], list[int]]:
    async def read() -> dict[tuple[str, int], list[int]]:
        bucket = await LocalBucket.open(bucket_dir)
        out: dict[tuple[str, int], list[int]] = {}
        try:
            for seq in range(1, await find_head(bucket, "", region) + 1):
                key = log_key("", region, seq)
                data = (await bucket.get(key)).data
                header = logobject.decode_header(data, where=key, object_size=len(data))
                for b in header.blocks:
                    raw = logobject.decode_block(b, data[b.offset : b.end], where=key)
                    for batch in logobject.iter_block_batches(b, raw, where=key):
                        out.setdefault((b.topic, b.partition), []).extend(
                            r.offset for r in batch.records()
                        )
        finally:
            await bucket.aclose()
        return out

    return trio.run(read)


@pytest.mark.slow
def test_a_gateway_takes_its_lanes_from_the_routing_table(
    tmp_path: Path, server: MetaServer
) -> None:
    tokens = {}
    with http(server.url) as c:
        for region in ("north", "south"):
            r = c.post("/v1/regions", json={"id": region})
            assert r.status_code == 201, r.text
            tokens[region] = r.json()["token"]
    for name, priority in (("alarms", "critical"), ("telemetry", "normal"), ("logs", "bulk")):
        admin(
            server.url,
            "POST",
            "/v1/topics",
            {
                "name": name,
                "home": "north",
                "partitions": 2,
                "subscribers": ["south"],
                "priority": priority,
            },
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
    try:
        fleet.start()
        # The lanes of the table's priorities, each topic in its own.
        assert list(lanes(north)) == ["critical", "normal", "bulk"]
        for topic, lane in (("alarms", "critical"), ("telemetry", "normal"), ("logs", "bulk")):
            before = {k: v["next_lsn"] for k, v in lanes(north).items()}
            produce_two_partitions(north, topic, 20)  # one entry per partition
            after = {k: v["next_lsn"] for k, v in lanes(north).items()}
            assert after == {**before, lane: before[lane] + 2}, (topic, before, after)

        # telemetry becomes critical while the gateway runs (the CLI sets it):
        # once the normal lane has shipped it, its appends go to the critical lane.
        r = cli(server.url, "topics", "alter", "telemetry", "--priority", "critical")
        assert r.returncode == 0, r.stderr
        version = admin(server.url, "GET", "/v1/routing")["version"]
        wait_until(
            lambda: north.status()["metadata"]["version"] == version, 30, "north to apply it"
        )
        wait_until(
            lambda: all(v["backlog_entries"] == 0 for v in lanes(north).values()),
            30,
            "north to ship",
        )
        before = lanes(north)
        produce_two_partitions(north, "telemetry", 20)
        after = lanes(north)
        assert after["critical"]["next_lsn"] == before["critical"]["next_lsn"] + 2, after
        assert after["normal"]["next_lsn"] == before["normal"]["next_lsn"], after
        assert "telemetry: priority normal -> critical" in north.log.read_text()

        # Offsets run on across the move, once each along the log and in the mirror.
        wait_until(
            lambda: all(v["backlog_entries"] == 0 for v in lanes(north).values()),
            30,
            "north to ship",
        )
        offsets = _log_offsets(fleet.bucket_dir, "north")
        for p in range(2):
            assert offsets[("telemetry", p)] == list(range(40))
            assert [r.offset for r in read_partition(north.url, "telemetry", p)] == list(range(40))
        wait_until(lambda: south.next_offsets("north.telemetry") == [40, 40], 60, "south to mirror")
        assert mirror_mismatches(north, "telemetry", 2, south) == []
        for topic in ("alarms", "logs"):
            wait_until(
                lambda topic=topic: south.next_offsets(f"north.{topic}") == [20, 20],
                60,
                f"south to mirror {topic}",
            )
            assert mirror_mismatches(north, topic, 2, south) == []
    finally:
        codes = fleet.close()
    assert set(codes.values()) == {0}, f"exit codes {codes}; logs in {tmp_path}"


def test_bulk_windows_are_accepted_with_a_metadata_server(tmp_path: Path) -> None:
    """The routing table says which topics are bulk: the config cannot know it."""
    from edge_gateway.config import load_config
    from edge_gateway.errors import ConfigError

    text = 'region = "north"\n[link]\nbulk_windows = ["22:00-06:00"]\n'
    path = tmp_path / "edgegw.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="no \\[\\[topics\\]\\] has priority"):
        load_config(path)
    path.write_text(text + '[metadata]\nurl = "http://127.0.0.1:1"\ntoken = "x"\n')
    assert load_config(path).link.bulk_windows == ("22:00-06:00",)
