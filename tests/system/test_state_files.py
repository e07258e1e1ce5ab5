"""Damaged state files: rebuilt and reported, or refused with one line; never silently trusted.

Issue 45, item 4. With real processes: ``edgegw serve`` on a local bucket
produces 20 records to ``t``, auto-creates ``auto1`` with one record, issues
an idempotent producer id, commits a group offset and counts link usage; then
it stops, and each case starts a copy of that data dir with one state file
damaged the ways an SD card damages it: cut in half, one bit flipped inside a
number (the JSON stays valid: only the checksum sees it), a 4 KiB page of
zeros, or valid JSON of the wrong shape.

* ``producers.json``, ``topics.json``, ``link-usage.json``: the gateway
  starts; the damaged bytes are in ``quarantine/``; ``edgegw status``, the
  metric ``edgegw_state_files_damaged_total{file}`` and a WARNING name the
  file; every acknowledged record is readable (``auto1``'s too), the group's
  offset is unchanged, a new producer id is none issued before; the rebuilt
  file is sound (the next start reports nothing).
* ``groups.sqlite`` and ``journal/shipper.json``: the gateway refuses to
  start, with one line naming the file and what to do, and leaves the file
  where it is.
* The form written before the checksum opens as it is (an upgrade).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from _serve import Gateway, TopicSpec

from edge_gateway import failpoints

TOPIC = "t"
VALUES = [f"v{i:03d}" for i in range(20)]


def _gateway(root: Path) -> Gateway:
    bucket = root / "bucket"
    bucket.mkdir(parents=True, exist_ok=True)
    g = Gateway(
        "north",
        root,
        {"type": "local", "path": str(bucket)},
        [TopicSpec(TOPIC, "north", partitions=1)],
        {},
    )
    text = g.config.read_text()
    g.config.write_text(text.replace("shutdown_grace_s", "auto_create = true\nshutdown_grace_s"))
    return g


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stopped gateway's files: records in t and auto1, a producer id, a group offset."""
    root = tmp_path_factory.mktemp("seed")
    g = _gateway(root)
    g.start()
    try:
        r = httpx.post(
            f"{g.url}/v1/topics/{TOPIC}/records",
            json={"records": [{"value": v} for v in VALUES]},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        r = httpx.post(
            f"{g.url}/v1/topics/auto1/records", json={"records": [{"value": "x"}]}, timeout=30
        )
        assert r.status_code == 200, r.text
        with g.client() as c:
            assert c.init_producer() == (1, 0)
            c.commit_offsets("g1", {(TOPIC, 0): 7})
    finally:
        assert g.stop() == 0, g.tail()
    for name in ("producers.json", "topics.json", "link-usage.json", "groups.sqlite"):
        assert (root / "north" / name).exists(), name
    return root


def _copy(seed: Path, tmp_path: Path) -> Gateway:
    root = tmp_path / "site"
    shutil.copytree(seed, root)
    g = _gateway(root)
    # The config names the data dir: point it at the copy.
    assert str(g.data_dir).startswith(str(root))
    return g


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _flipped(data: bytes) -> bytes:
    """One bit flipped in the digit nearest the middle: still valid JSON of the same shape."""
    i = min(
        (i for i, b in enumerate(data) if chr(b).isdigit()), key=lambda i: abs(i - len(data) // 2)
    )
    out = bytearray(data)
    out[i] ^= 0x01  # '0' <-> '1', '2' <-> '3'...: a digit stays a digit
    return bytes(out)


def _zeroed(data: bytes) -> bytes:
    return bytes(4096) + data[4096:]


def _wrong_types(data: bytes) -> bytes:
    """Valid JSON, the fields of the form without a checksum, every number a string."""

    def strings(x: object) -> object:
        if isinstance(x, dict):
            return {k: strings(v) for k, v in x.items() if k != "crc32c"}
        if isinstance(x, list):
            return [strings(v) for v in x]
        if isinstance(x, int) and not isinstance(x, bool):
            return str(x)
        return x

    return json.dumps(strings(json.loads(data))).encode()


DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "truncated": _truncated,
    "flipped": _flipped,
    "zeroed": _zeroed,
    "wrong-types": _wrong_types,
}


def _metric(g: Gateway, name: str) -> float:
    text = httpx.get(f"{g.url}/metrics", timeout=10).text
    line = f'edgegw_state_files_damaged_total{{file="{name}"}} '
    values = [float(x.removeprefix(line)) for x in text.splitlines() if x.startswith(line)]
    assert len(values) == 1, text
    return values[0]


def _assert_everything_readable(g: Gateway) -> None:
    with g.client() as c:
        got = [r.value.decode() for r in c.fetch(TOPIC, 0, 0, max_records=100).records]
        assert got == VALUES
        assert [r.value for r in c.fetch("auto1", 0, 0).records] == [b"x"]
        assert [(o.topic, o.partition, o.offset) for o in c.fetch_offsets("g1")] == [(TOPIC, 0, 7)]


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("name", ["producers.json", "topics.json", "link-usage.json"])
def test_a_damaged_state_file_is_rebuilt_and_reported(
    seed: Path, tmp_path: Path, name: str, damage: str
) -> None:
    g = _copy(seed, tmp_path)
    path = g.data_dir / name
    bad = DAMAGES[damage](path.read_bytes())
    path.write_bytes(bad)
    g.start()
    try:
        damaged = g.status()["state_files"]["damaged"]
        assert [d["file"] for d in damaged] == [name], damaged
        moved = Path(damaged[0]["quarantined"])
        assert moved.parent == g.data_dir / "quarantine"
        assert moved.read_bytes() == bad  # kept for a person to read, not deleted
        # Rebuilt, or gone until the next save (link-usage.json: usage from 0).
        assert not path.exists() or path.read_bytes() != bad
        assert _metric(g, name) == 1
        assert _metric(g, "routing.json") == 0
        assert f"damaged state file {path}" in g.log.read_text()
        _assert_everything_readable(g)
        with g.client() as c:
            pid, epoch = c.init_producer()
        # Id 1 was issued before the damage: never again (rebuilt with a jump past it).
        assert pid > 1
        assert epoch == 0
        if name == "producers.json":
            assert pid > 2**32
    finally:
        assert g.stop() == 0, g.tail()
    # The rebuilt file is sound: the next start finds nothing to report.
    g.start()
    try:
        assert g.status()["state_files"]["damaged"] == []
        assert _metric(g, name) == 0
        _assert_everything_readable(g)
    finally:
        assert g.stop() == 0, g.tail()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["producers.json", "topics.json"])
def test_a_crash_between_quarantine_and_rebuild_finds_the_damage_again(
    seed: Path, tmp_path: Path, name: str
) -> None:
    """The damaged file stays in place until the rebuilt one is written over it: a
    missing producers.json would mean "no id issued", a missing topics.json would
    forget auto1."""
    g = _copy(seed, tmp_path)
    path = g.data_dir / name
    bad = _flipped(path.read_bytes())
    path.write_bytes(bad)
    g.env = {failpoints.ENV: "statefile.quarantined"}  # dies right after the copy
    g.spawn()
    assert g.proc is not None
    assert g.proc.wait(timeout=60) != 0
    assert "fail point statefile.quarantined" in g.tail()
    assert path.read_bytes() == bad
    g.env = {}
    g.start()
    try:
        damaged = g.status()["state_files"]["damaged"]
        assert [d["file"] for d in damaged] == [name]
        copies = sorted((g.data_dir / "quarantine").glob(f"{name}.*"))
        assert [p.read_bytes() for p in copies] == [bad, bad]
        _assert_everything_readable(g)
        with g.client() as c:
            assert c.init_producer()[0] > 1
    finally:
        assert g.stop() == 0, g.tail()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "flipped", "zeroed"])
def test_damaged_group_offsets_are_refused_with_one_line(
    seed: Path, tmp_path: Path, damage: str
) -> None:
    """Offsets are held nowhere else: starting without them re-delivers or skips data."""
    g = _copy(seed, tmp_path)
    path = g.data_dir / "groups.sqlite"
    data = path.read_bytes()
    if damage == "flipped":  # a byte of the offsets table's page (the second page)
        bad = bytearray(data)
        bad[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(bad))
    else:
        path.write_bytes(DAMAGES[damage](data))
    before = path.read_bytes()
    g.spawn()
    assert g.proc is not None
    code = g.proc.wait(timeout=60)
    assert code != 0
    last = g.tail(1)
    assert last.startswith(f"error: CorruptData: {path}: consumer-group offsets damaged"), last
    assert f"move it (and groups.sqlite-wal) to {g.data_dir / 'quarantine'}/" in last
    assert path.read_bytes() == before  # not moved, not reset: a person decides


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "flipped", "zeroed", "wrong-types"])
def test_damaged_shipper_state_is_refused_with_one_line(
    seed: Path, tmp_path: Path, damage: str
) -> None:
    """The writer's epoch and what it sent are held nowhere else: a person decides."""
    g = _copy(seed, tmp_path)
    path = g.data_dir / "journal" / "shipper.json"
    assert "crc32c" in json.loads(path.read_text())
    path.write_bytes(DAMAGES[damage](path.read_bytes()))
    before = path.read_bytes()
    g.spawn()
    assert g.proc is not None
    code = g.proc.wait(timeout=60)
    assert code != 0
    last = g.tail(1)
    assert last.startswith(f"error: CorruptData: {path}: shipper state damaged ("), last
    assert "restore shipper.json from a backup, or run `edgegw restore`" in last, last
    assert path.read_bytes() == before


@pytest.mark.slow
def test_state_files_written_before_the_checksum_still_open(seed: Path, tmp_path: Path) -> None:
    g = _copy(seed, tmp_path)
    old = {
        "producers.json": {"v": 1, "id_limit": 1026, "epochs": []},
        "topics.json": {"auto_created": [{"name": "auto1", "partitions": 1}]},
        "link-usage.json": {
            "version": 1,
            "day": "2000-01-01",
            "day_bytes": 5,
            "month": "2000-01",
            "month_bytes": 5,
        },
    }
    for name, doc in old.items():
        (g.data_dir / name).write_text(json.dumps(doc))
    shipper = g.data_dir / "journal" / "shipper.json"
    doc = json.loads(shipper.read_text())
    del doc["crc32c"]
    shipper.write_text(json.dumps(doc))
    g.start()
    try:
        assert g.status()["state_files"]["damaged"] == []
        _assert_everything_readable(g)
        with g.client() as c:
            assert c.init_producer()[0] == 1026  # issued from the old file's block end
    finally:
        assert g.stop() == 0, g.tail()
    assert "crc32c" in json.loads((g.data_dir / "producers.json").read_text())
    assert "crc32c" in json.loads(shipper.read_text())
