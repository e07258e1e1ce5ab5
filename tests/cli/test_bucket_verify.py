"""``edgegw bucket verify`` against the log a real ``edgegw serve`` shipped, on moto's S3
server and on a local-directory bucket: clean (also while that gateway keeps producing),
then with the replica damaged -- a flipped byte in an object, an object whose records were
forged with valid CRCs, a missing object -- and with the bucket unreachable. Exit codes 0
(clean), 1 (damage or mismatch), 2 (usage, unreachable); ``--json``; the command lines of
docs/operations.md, run as written.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
from _cli_support import assert_one_line_failure, invoke, run_edgegw
from _serve import Fleet, Gateway, Producer, TopicSpec, wait_until

from edge_gateway._crc import crc32c
from edge_gateway.bucket import LocalBucket
from edge_gateway.bucket_verify import compare_partition, describe_difference, verify_replica
from edge_gateway.encryption import write_key_file
from edge_gateway.format import logobject
from edge_gateway.format.batch import Record, decode_batch, encode_batch, encode_records
from edge_gateway.format.crypt import generate_key
from edge_gateway.journal import compress_sealed_segment

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

ROOT = Path(__file__).resolve().parents[2]
TOPICS = [
    TopicSpec("t", "north", partitions=3),
    TopicSpec("alarms", "north", partitions=1, priority="critical"),
]
SECTIONS = {
    # at_rest off: the tests compress segments themselves (the gateway's own
    # rewriter would race them)
    "journal": {"segment_bytes": 65536, "max_bytes": 8 * 1024 * 1024, "at_rest": "off"},
    "shipper": {"manifest_every": 5},
}
#: objects shipped before the damage tests take their copies
OBJECTS = 12


@dataclass(frozen=True)
class Site:
    gw: Gateway
    fleet: Fleet
    #: ``--json`` reports taken while the gateway was producing
    while_running: list[dict[str, Any]]
    acked: tuple[int, int]


def _run_site(fleet: Fleet) -> Site:
    gw = fleet["north"]
    gw.start()
    try:
        producers = [
            Producer(gw.url, "t", 3, pause=0.005, max_batch=20),
            Producer(gw.url, "alarms", 1, seed=2, pause=0.02, max_batch=5),
        ]
        for p in producers:
            p.start()
        wait_until(lambda: gw.status()["shipper"]["next_seq"] > OBJECTS, 120, "objects shipped")
        before = sum(p.n for p in producers)
        reports = []
        for _ in range(2):
            res = run_edgegw("bucket", "verify", "--config", gw.config, "--json", "--rate", "0")
            assert res.returncode == 0, res.stdout + res.stderr
            reports.append(json.loads(res.stdout))
        after = sum(p.n for p in producers)
        for p in producers:
            p.stop()
            assert p.error is None, p.error
        wait_until(lambda: gw.status()["shipper"]["pending_lsns"] == 0, 60, "everything shipped")
    finally:
        assert gw.stop() == 0, gw.tail()
    return Site(gw, fleet, reports, (before, after))


@pytest.fixture(scope="module")
def local_site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    root = tmp_path_factory.mktemp("bucket-verify-local")
    return _run_site(Fleet(root, ["north"], TOPICS, sections=SECTIONS))


@pytest.fixture(scope="module")
def s3_site(
    tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str, s3_admin: S3Client
) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("bucket-verify-s3")
    name = "edgegw-bucket-verify"
    s3_admin.create_bucket(Bucket=name)
    port = int(moto_endpoint.rsplit(":", 1)[1])
    fleet = Fleet(root, ["north"], TOPICS, s3=(port, name), sections=SECTIONS)
    try:
        yield _run_site(fleet)
    finally:
        for proxy in fleet.proxies.values():
            proxy.stop()


@pytest.fixture
def copy(local_site: Site, tmp_path: Path) -> Path:
    """A copy of the stopped gateway's files (data dir, config, bucket), to damage."""
    root = local_site.fleet.root
    dst = tmp_path / "site"
    shutil.copytree(root, dst, ignore=shutil.ignore_patterns("edgegw.lock", "*.log"))
    config = dst / "north.toml"
    config.write_text(config.read_text().replace(str(root), str(dst)))
    return dst


def _verify(config: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    res = invoke("bucket", "verify", "--config", config, "--json", "--rate", "0", *args)
    text = invoke("bucket", "verify", "--config", config, "--rate", "0", *args)
    assert text.exit_code == res.exit_code, text.stdout + text.stderr
    return res.exit_code, json.loads(res.stdout), text.stdout


def _log_objects(bucket: Path) -> list[Path]:
    return sorted((bucket / "objects" / "regions" / "north" / "log").glob("*.egw"))


def _with_data(objects: list[Path]) -> list[Path]:
    """Objects holding blocks of topic ``t`` (not fences, not only alarms)."""
    out = []
    for p in objects:
        data = p.read_bytes()
        h = logobject.decode_header(data, where=str(p), object_size=len(data))
        if any(b.topic == "t" for b in h.blocks):
            out.append(p)
    return out


def _problems(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["kind"] != "note"]


# ---------------------------------------------------------------- clean


@pytest.mark.parametrize("where", ["local", "s3"])
def test_verifies_clean_while_the_gateway_produces(
    where: str, request: pytest.FixtureRequest
) -> None:
    site: Site = request.getfixturevalue(f"{where}_site")
    before, after = site.acked
    assert after > before, "the gateway was not producing while verify ran"
    for doc in site.while_running:
        assert doc["ok"] is True, doc["findings"]
        assert _problems(doc) == []
        s = doc["summary"]
        assert s["objects"] >= OBJECTS
        assert s["manifests"] >= 1
        assert s["compared"] >= 1
        assert s["compared_records"] > 0
        assert doc["journal"] == str(site.gw.data_dir / "journal")
    heads = [doc["head"] for doc in site.while_running]
    assert heads == sorted(heads)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_stopped_gateways_replica_verifies_clean(
    where: str, request: pytest.FixtureRequest
) -> None:
    site: Site = request.getfixturevalue(f"{where}_site")
    code, doc, text = _verify(site.gw.config)
    assert code == 0, text
    assert doc["ok"] is True
    s = doc["summary"]
    # Every record shipped is still in the journal here: all compared.
    assert s["records"] == s["compared_records"]
    assert s["not_held"] == 0
    assert s["objects"] == doc["head"]
    assert re.search(r" objects, .* compared with the journal .*: OK$", text.splitlines()[-1])


def test_json_shape(local_site: Site) -> None:
    code, doc, _ = _verify(local_site.gw.config)
    assert code == 0
    assert set(doc) == {
        "region",
        "bucket",
        "journal",
        "ok",
        "gc_boundary",
        "first_seq",
        "head",
        "findings",
        "summary",
        "journal_note",
    }
    assert set(doc["summary"]) == {
        "objects",
        "bytes",
        "blocks",
        "records",
        "manifests",
        "compared",
        "compared_records",
        "partly_held",
        "not_held",
        "stale",
        "damaged",
        "missing",
        "mismatch",
        "journal",
        "notes",
    }


def test_from_seq_and_a_data_dir_with_bucket_options(local_site: Site) -> None:
    gw = local_site.gw
    res = invoke(
        "bucket", "verify", "--region", "north", "--bucket-dir", local_site.fleet.bucket_dir,
        "--data-dir", gw.data_dir, "--from-seq", "5", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["first_seq"] == 5
    assert doc["summary"]["objects"] == doc["head"] - 4
    assert doc["summary"]["compared"] >= 1


def test_the_log_alone_without_a_journal(local_site: Site) -> None:
    res = invoke(
        "bucket", "verify", "--region", "north", "--bucket-dir", local_site.fleet.bucket_dir
    )
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "journal: none (give --data-dir to compare)" in res.stdout
    assert res.stdout.splitlines()[-1].endswith(": OK")


# ---------------------------------------------------------------- damage


def test_a_flipped_byte_in_an_object(copy: Path) -> None:
    obj = _with_data(_log_objects(copy / "bucket"))[2]
    data = bytearray(obj.read_bytes())
    h = logobject.decode_header(bytes(data), where="x", object_size=len(data))
    block = next(b for b in h.blocks if b.topic == "t")
    data[block.offset + block.stored_length // 2] ^= 0x10
    obj.write_bytes(data)
    code, doc, text = _verify(copy / "north.toml")
    assert code == 1, text
    [bad] = _problems(doc)
    assert bad["kind"] == "damaged"
    assert bad["key"] == f"regions/north/log/{obj.name}"
    assert (bad["topic"], bad["partition"]) == (block.topic, block.partition)
    assert (bad["first_offset"], bad["last_offset"]) == (block.first_offset, block.last_offset)
    assert "CRC mismatch" in bad["what"]
    [line] = [x for x in text.splitlines() if x.startswith("DAMAGED ")]
    assert obj.name in line
    assert f"t/{block.partition} offsets {block.first_offset}..{block.last_offset}" in line
    assert text.splitlines()[-1].endswith("DAMAGED (1 damaged)")


def _forge(obj: Path) -> tuple[str, int, int]:
    """Rewrite ``obj`` with one record's value changed, every CRC valid; what was changed."""
    data = obj.read_bytes()
    h = logobject.decode_header(data, where="x", object_size=len(data))
    builder = logobject.LogObjectBuilder()
    forged: tuple[str, int, int] | None = None
    for b in h.blocks:
        raw = logobject.decode_block(b, data[b.offset : b.end], where="x")
        batches = []
        for batch in logobject.iter_block_batches(b, raw):
            records = batch.records()
            if forged is None and b.topic == "t":
                r = records[0]
                value = bytes(reversed(r.value or b"")) + b"!"
                records[0] = Record(r.offset, r.timestamp, r.key, value, r.headers)
                forged = (b.topic, b.partition, r.offset)
            batches.append(encode_records(records))
        builder.add(b.topic, b.partition, batches)
    assert forged is not None
    obj.write_bytes(
        builder.build(
            h.region,
            h.epoch,
            h.seq,
            h.first_lsn,
            h.last_lsn,
            h.created_ms,
            lanes=h.lanes,
            gaps=h.gaps,
        )
    )
    return forged


def test_an_object_with_forged_records_and_valid_crcs(copy: Path) -> None:
    obj = _with_data(_log_objects(copy / "bucket"))[-1]
    topic, partition, offset = _forge(obj)
    code, doc, text = _verify(copy / "north.toml")
    assert code == 1, text
    key = f"regions/north/log/{obj.name}"
    [bad] = [f for f in doc["findings"] if f["kind"] == "mismatch"]
    assert bad["key"] == key
    assert (bad["topic"], bad["partition"]) == (topic, partition)
    assert bad["first_offset"] <= offset <= bad["last_offset"]
    assert f"at offset {offset}: value differs" in bad["what"]
    # Nothing else is wrong with the object: its CRCs and structure hold.
    others = [f for f in _problems(doc) if f["kind"] != "mismatch"]
    assert all(f["key"].startswith("regions/north/manifest/") for f in others), others
    [line] = [x for x in text.splitlines() if x.startswith("MISMATCH ")]
    assert f"{key} {topic}/{partition} offsets " in line
    assert "value differs (bucket " in line


def test_a_missing_object_is_reported(copy: Path) -> None:
    objects = _log_objects(copy / "bucket")
    gone = objects[len(objects) // 2]
    gone.unlink()
    code, doc, text = _verify(copy / "north.toml")
    assert code == 1, text
    seq = int(gone.stem)
    missing = [f for f in doc["findings"] if f["kind"] == "missing"]
    assert [(f["seq"], f["key"]) for f in missing] == [(seq, f"regions/north/log/{gone.name}")]
    # The objects around the hole are sound: the hole explains the jump in offsets.
    assert _problems(doc) == missing
    assert f"MISSING  regions/north/log/{gone.name}: no object at this seq of the log" in text


def test_a_flipped_byte_in_an_s3_object(s3_site: Site, s3_admin: S3Client) -> None:
    bucket = "edgegw-bucket-verify"
    listed = s3_admin.list_objects_v2(Bucket=bucket, Prefix="regions/north/log/")["Contents"]
    key = sorted(o["Key"] for o in listed)[3]
    clean = s3_admin.get_object(Bucket=bucket, Key=key)["Body"].read()
    h = logobject.decode_header(clean, where=key, object_size=len(clean))
    assert h.blocks, key
    damaged = bytearray(clean)
    damaged[h.blocks[0].offset] ^= 0x01
    s3_admin.put_object(Bucket=bucket, Key=key, Body=bytes(damaged))
    try:
        code, doc, text = _verify(s3_site.gw.config)
    finally:
        s3_admin.put_object(Bucket=bucket, Key=key, Body=clean)
    assert code == 1, text
    [bad] = _problems(doc)
    assert (bad["kind"], bad["key"], bad["seq"]) == ("damaged", key, h.seq)
    assert _verify(s3_site.gw.config)[0] == 0


# ---------------------------------------------------------------- errors


def test_an_unreachable_bucket_exits_2_with_one_clear_line(s3_site: Site) -> None:
    proxy = s3_site.fleet.proxies["north"]
    proxy.set_mode("refuse")
    try:
        res = run_edgegw("bucket", "verify", "--config", s3_site.gw.config)
    finally:
        proxy.set_mode("pass")
    assert res.returncode == 2, res.stdout + res.stderr
    line = assert_one_line_failure(res.returncode, res.stderr, "could not verify the bucket")
    assert "edgegw-bucket-verify" in line or "unreachable" in line or "connect" in line, line
    assert res.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--config", "/nonexistent/edgegw.tmol"],
        ["--region", "north"],
        ["--region", "north", "--bucket-dir", "/nonexistent/bucket"],
        ["--region", "no such", "--bucket-dir", "."],
        ["--config", "x.toml", "--bucket-dir", "."],
        ["--region", "north", "--bucket-dir", ".", "--data-dir", "/nonexistent/data"],
        ["--region", "north", "--bucket-dir", ".", "--rate", "fast"],
    ],
)
def test_usage_errors_exit_2_with_one_clear_line(args: list[str]) -> None:
    res = invoke("bucket", "verify", *args)
    assert res.exit_code == 2, res.stdout + res.stderr
    assert res.stderr.startswith("error: ")
    assert len(res.stderr.strip().splitlines()) == 1
    assert res.stdout == ""


def test_a_region_without_a_log_exits_2(local_site: Site) -> None:
    res = invoke(
        "bucket", "verify", "--region", "south", "--bucket-dir", local_site.fleet.bucket_dir
    )
    assert res.exit_code == 2
    assert "region 'south' has no log in" in res.stderr


# ---------------------------------------------------------------- the comparison, pure


def _batch(base: int, values: list[bytes | None]) -> bytes:
    return encode_batch(values, timestamps=1000, base_offset=base)


def test_compare_partition_names_the_first_difference() -> None:
    a = [(0, _batch(0, [b"a", b"b"])), (2, _batch(2, [b"c"]))]
    assert compare_partition(a, list(a), whole=True) is None
    b = [(0, _batch(0, [b"a", None])), (2, _batch(2, [b"c"]))]
    what, first, last = compare_partition(a, b, whole=True) or ("", 0, 0)
    assert (first, last) == (0, 1)
    assert what == "at offset 1: value differs (bucket b'b', journal null)"
    # The journal holds only the later part: compared from its first offset.
    assert compare_partition(a, a[1:], whole=False) is None
    what, first, last = compare_partition(a, a[1:], whole=True) or ("", 0, 0)
    assert (first, last) == (0, 2)
    what, first, last = compare_partition(a[:1], a, whole=True) or ("", 0, 0)
    assert what == "records in the journal that the bucket's object does not hold"
    assert (first, last) == (2, 2)


def test_describe_difference_names_the_field() -> None:
    x = encode_records([Record(5, 10, b"k", b"v", (("h", b"1"),))])
    assert "timestamp differs" in describe_difference(
        x, encode_records([Record(5, 11, b"k", b"v", (("h", b"1"),))])
    )
    assert "at offset 5: headers differ (bucket " in describe_difference(
        x, encode_records([Record(5, 10, b"k", b"v", (("h", None),))])
    )
    assert "key differs (bucket b'k', journal null)" in describe_difference(
        x, encode_records([Record(5, 10, None, b"v", (("h", b"1"),))])
    )
    assert decode_batch(x).count == 1


# ---------------------------------------------------------------- docs


def _documented() -> list[str]:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Verifying the replica\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^(edgegw bucket verify .*)$", section, re.MULTILINE)


def test_the_documented_commands_run(local_site: Site) -> None:
    lines = _documented()
    assert len(lines) >= 3
    for line in lines:
        line = line.replace("/etc/edgegw/edgegw.toml", str(local_site.gw.config))
        line = line.replace("/var/lib/edgegw/bucket", str(local_site.fleet.bucket_dir))
        args = line.replace("/var/lib/edgegw", str(local_site.gw.data_dir)).split()[1:]
        res = run_edgegw(*args)
        assert res.returncode == 0, f"{line}: {res.stdout}{res.stderr}"
        if "--json" in args:
            assert json.loads(res.stdout)["ok"] is True
        else:
            assert res.stdout.splitlines()[-1].endswith(": OK")


# ---------------------------------------------------------------- the journal's side


def test_compressed_journal_segments_are_compared_too(copy: Path) -> None:
    journal = copy / "north" / "journal"
    sealed = sorted(journal.glob("*.wal"))[:-1]
    assert len(sealed) >= 2
    for seg in sealed:
        compress_sealed_segment(journal, int(seg.stem))
    assert all(seg.read_bytes()[:4] == b"EGWC" for seg in sealed)
    code, doc, text = _verify(copy / "north.toml")
    assert code == 0, text
    s = doc["summary"]
    assert s["records"] == s["compared_records"]


def test_a_journal_segment_deleted_by_retention_is_no_longer_compared(copy: Path) -> None:
    journal = copy / "north" / "journal"
    first = sorted(journal.glob("*.wal"))[0]
    first.unlink()
    first.with_suffix(".idx").unlink(missing_ok=True)
    code, doc, text = _verify(copy / "north.toml")
    assert code == 0, text
    s = doc["summary"]
    assert s["not_held"] + s["partly_held"] >= 1
    assert 0 < s["compared_records"] < s["records"]


# ---------------------------------------------------------------- the rate


async def test_reads_are_held_to_the_rate(local_site: Site, autojump_clock: trio.abc.Clock) -> None:
    rate = 64 * 1024
    bucket = await LocalBucket.open(local_site.fleet.bucket_dir, create=False)
    async with bucket:
        start = trio.current_time()
        report = await verify_replica(bucket, "", "north", rate=rate)
        took = trio.current_time() - start
    assert report.ok, report.findings
    assert report.bytes > 2 * rate
    # Each read waits until the bytes read so far fit the rate (the last one included).
    assert took >= report.bytes / rate


# ---------------------------------------------------------------- sealed objects


@pytest.fixture(scope="module")
def sealed_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Site, Path]:
    root = tmp_path_factory.mktemp("bucket-verify-sealed")
    key = root / "north-1.key"
    write_key_file(key, generate_key())
    sections = {**SECTIONS, "encryption": {"key_file": str(key)}}
    fleet = Fleet(root, ["north"], TOPICS[:1], sections=sections)
    gw = fleet["north"]
    gw.start()
    try:
        producer = Producer(gw.url, "t", 3, pause=0.01, max_batch=10, limit=300)
        producer.start()
        producer.join(timeout=120)
        assert producer.error is None, producer.error
        wait_until(lambda: gw.status()["shipper"]["pending_lsns"] == 0, 60, "everything shipped")
    finally:
        assert gw.stop() == 0, gw.tail()
    return Site(gw, fleet, [], (0, producer.n)), key


def test_sealed_objects_are_opened_with_the_configs_keys(sealed_site: tuple[Site, Path]) -> None:
    site, _ = sealed_site
    code, doc, text = _verify(site.gw.config)
    assert code == 0, text
    assert doc["findings"] == []
    s = doc["summary"]
    assert s["records"] == s["compared_records"] > 0


def test_sealed_objects_without_the_key_get_their_crcs_checked(
    sealed_site: tuple[Site, Path],
) -> None:
    site, key = sealed_site
    where = ["--region", "north", "--bucket-dir", site.fleet.bucket_dir, "--json"]
    res = invoke("bucket", "verify", *where)
    assert res.exit_code == 0, res.stdout + res.stderr
    notes = json.loads(res.stdout)["findings"]
    assert notes
    assert all(f["kind"] == "note" and "which was not given" in f["what"] for f in notes)
    res = invoke("bucket", "verify", *where, "--key-file", key)
    assert res.exit_code == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["findings"] == []


def test_a_sealed_object_with_a_forged_block_fails_its_tag(
    sealed_site: tuple[Site, Path], tmp_path: Path
) -> None:
    site, key = sealed_site
    bucket = tmp_path / "bucket"
    shutil.copytree(site.fleet.bucket_dir, bucket, ignore=shutil.ignore_patterns("lock"))
    obj = _with_data(_log_objects(bucket))[0]
    data = bytearray(obj.read_bytes())
    h = logobject.decode_header(bytes(data), where="x", object_size=len(data))
    b = h.blocks[0]
    # A byte of the sealed payload changed, and the CRC made to match: only the tag knows.
    data[b.offset + 20] ^= 0x01
    stored = bytes(data[b.offset : b.end])
    forged = dataclasses.replace(b, crc=crc32c(stored))
    header = dataclasses.replace(h, blocks=tuple(forged if x is b else x for x in h.blocks))
    head = logobject.encode_header(header)
    assert len(head) == h.header_length
    obj.write_bytes(head + bytes(data[h.header_length :]))
    res = invoke(
        "bucket", "verify", "--region", "north", "--bucket-dir", bucket, "--key-file", key,
        "--json",
    )  # fmt: skip
    assert res.exit_code == 1, res.stdout + res.stderr
    problems = _problems(json.loads(res.stdout))
    [bad] = [f for f in problems if f["key"] == f"regions/north/log/{obj.name}"]
    assert bad["kind"] == "damaged"
    assert "authentication failed" in bad["what"]
    # The manifest covering it recorded the CRC the forger replaced.
    others = [f for f in problems if f is not bad]
    assert all(f["key"].startswith("regions/north/manifest/") for f in others), others


# ---------------------------------------------------------------- manifests


def _manifests(bucket: Path) -> list[Path]:
    return sorted((bucket / "objects" / "regions" / "north" / "manifest").glob("*.json"))


def test_a_damaged_manifest(copy: Path) -> None:
    manifest = _manifests(copy / "bucket")[1]
    manifest.write_bytes(manifest.read_bytes()[:-7])
    code, doc, text = _verify(copy / "north.toml")
    assert code == 1, text
    [bad] = _problems(doc)
    assert (bad["kind"], bad["key"]) == ("damaged", f"regions/north/manifest/{manifest.name}")


def test_a_manifest_that_disagrees_with_its_objects(copy: Path) -> None:
    # Valid on its own (a block's CRC is any u32): only a comparison with the object finds it.
    manifest = _manifests(copy / "bucket")[2]
    doc = json.loads(manifest.read_bytes())
    entry = next(e for e in doc["entries"] if e["blocks"])
    entry["blocks"][0][11] ^= 0x5A5A
    manifest.write_text(json.dumps(doc, separators=(",", ":"), sort_keys=True))
    code, report, text = _verify(copy / "north.toml")
    assert code == 1, text
    [bad] = _problems(report)
    assert (bad["kind"], bad["key"]) == ("damaged", f"regions/north/manifest/{manifest.name}")
    assert bad["seq"] == entry["seq"]
    assert f"its entry for seq {entry['seq']} is not that object's header" in bad["what"]
    assert "block 0 (" in bad["what"]
    assert "crc " in bad["what"]
