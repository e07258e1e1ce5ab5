"""``edgegw inspect``: journal segments, log objects and manifests, from local
files, a local-directory bucket and S3 (moto's server), through the real CLI.

Most tests run the typer app in-process (CliRunner); ``test_real_process``
runs the installed ``.venv/bin/edgegw``.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio
from _cli_support import assert_one_line_failure, invoke, run_edgegw

from edge_gateway.bucket import LocalBucket
from edge_gateway.format.batch import Record, encode_records
from edge_gateway.format.entry import SourceCoords
from edge_gateway.format.logobject import (
    FIRST_GET_BYTES,
    LogObjectBuilder,
    LogObjectHeader,
    decode_header,
    encode_fence,
)
from edge_gateway.format.manifest import Manifest, ManifestEntry, log_key, manifest_key
from edge_gateway.journal import Journal, JournalConfig, MirrorBlock
from edge_gateway.testing.ports import free_port

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

SITE = "north"
T0 = 1_700_000_000_000
MARKUP = b"[bold]not markup[/bold]"


@dataclass(frozen=True)
class Site:
    """A region's log in a local bucket: a fence, a small object, a big one, a manifest."""

    bucket_dir: Path
    objects: dict[str, bytes]
    headers: dict[int, LogObjectHeader]
    records: dict[tuple[str, int], list[Record]]

    def file(self, key: str) -> Path:
        return self.bucket_dir / "objects" / key


def _telemetry(p: int, o: int) -> bytes:
    return json.dumps({"p": p, "o": o}, separators=(",", ":")).encode()


def build_site(root: Path) -> Site:
    rnd = random.Random(5)
    records: dict[tuple[str, int], list[Record]] = {}
    fence = encode_fence(SITE, 1, 1, 0, T0)
    small = LogObjectBuilder()
    for p in range(3):
        rs = [Record(o, T0 + o, b"sensor-%d" % p, _telemetry(p, o)) for o in range(10)]
        small.add("telemetry", p, [encode_records(rs[:4]), encode_records(rs[4:])])
        records[("telemetry", p)] = rs
    orders = [
        Record(0, T0, None, MARKUP),
        Record(1, T0 + 1, b"bin", bytes(range(256))),
        Record(2, T0 + 2, b"long", b"x" * 500),
    ]
    small.add_batch("orders", 0, encode_records(orders))
    records[("orders", 0)] = orders
    obj2 = small.build(SITE, 1, 2, 1, 7, T0 + 100)
    # Incompressible values: the object is several times FIRST_GET_BYTES, so
    # blocks lie beyond the first GET and one straddles its end.
    big = LogObjectBuilder()
    for p in range(6):
        rs = [Record(o, T0 + o, None, rnd.randbytes(9000)) for o in range(4)]
        big.add_batch("big", p, encode_records(rs))
        records[("big", p)] = rs
    obj3 = big.build(SITE, 1, 3, 8, 13, T0 + 200)
    objects: dict[str, bytes] = {}
    headers: dict[int, LogObjectHeader] = {}
    entries = []
    for seq, obj in ((1, fence), (2, obj2), (3, obj3)):
        h = decode_header(obj, where="build", object_size=len(obj))
        headers[seq] = h
        entries.append(ManifestEntry.from_header(h, len(obj)))
        objects[log_key("", SITE, seq)] = obj
    assert len(obj3) > 3 * FIRST_GET_BYTES
    assert any(b.offset < FIRST_GET_BYTES < b.end for b in headers[3].blocks)
    manifest = Manifest.covering(
        region=SITE, epoch=1, entries=entries, low_watermark=1, created_ms=T0 + 300
    )
    objects[manifest_key("", SITE, 3)] = manifest.encode()

    async def put_all() -> None:
        async with await LocalBucket.open(root, create=True) as bucket:
            for key, data in objects.items():
                await bucket.put(key, data, if_none_match=True)

    trio.run(put_all)
    return Site(root, objects, headers, records)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    return build_site(tmp_path_factory.mktemp("inspect") / "bucket")


@pytest.fixture
def s3_site(site: Site, s3_admin: S3Client, s3_bucket_name: str) -> str:
    """The same objects in a fresh bucket on moto's server; returns the bucket name."""
    for key, data in site.objects.items():
        s3_admin.put_object(Bucket=s3_bucket_name, Key=key, Body=data)
    return s3_bucket_name


def s3_options(endpoint: str, bucket: str) -> list[str]:
    return ["--s3-bucket", bucket, "--s3-endpoint", endpoint, "--s3-path-style"]


LOG2 = log_key("", SITE, 2)
LOG3 = log_key("", SITE, 3)
MANIFEST = manifest_key("", SITE, 3)


def assert_records_shown(out: str, records: list[Record]) -> None:
    for r in records:
        assert f"│ {r.offset} " in out, (r.offset, out)


# --------------------------------------------------------------------------
# log objects


def test_log_object_from_a_file(site: Site) -> None:
    res = invoke("inspect", "object", site.file(LOG2))
    assert res.exit_code == 0, res.output
    out = res.stdout
    h = site.headers[2]
    for text in ("log object v1", "north", "LSNs", "1..7 (7 entries)", "4 in 4 partitions"):
        assert text in out
    assert "33 records" in out
    for b in h.blocks:
        assert f"{b.topic}/{b.partition}" in out
        assert f"{b.crc:08x}" in out
        assert f"[{b.offset}, {b.end})" in out
    assert "records (" not in out, "records only with --records"


def test_fence_entry(site: Site) -> None:
    res = invoke(
        "inspect", "object", LOG2.replace("2.egw", "1.egw"), "--bucket-dir", site.bucket_dir
    )
    assert res.exit_code == 0, res.output
    assert "fence entry v1, flags 0x01" in res.stdout
    assert "empty (shipped through 0)" in res.stdout
    assert "block index" not in res.stdout


def test_records_from_a_bucket_dir(site: Site) -> None:
    res = invoke("inspect", "object", LOG2, "--bucket-dir", site.bucket_dir, "--records")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "records (33 of 33)" in out
    for p in range(3):
        for r in site.records[("telemetry", p)]:
            assert r.value.decode() in out
    assert "sensor-2" in out
    assert "2023-11-14T22:13:20.009Z" in out  # T0 + 9 ms, UTC
    # Values are text, not rich markup; binary and long values are previewed.
    assert MARKUP.decode() in out
    assert "null" in out
    assert "b'\\x00\\x01\\x02" in out
    assert "(256 B)" in out
    assert "(500 B)" in out


def test_topic_and_partition_filters(site: Site) -> None:
    res = invoke(
        "inspect",
        "object",
        LOG2,
        "--bucket-dir",
        site.bucket_dir,
        "--records",
        "--topic",
        "telemetry",
        "--partition",
        "1",
    )
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "(1 of 4: topic telemetry and partition 1)" in out
    assert "records (10 of 10)" in out
    assert _telemetry(1, 9).decode() in out
    assert _telemetry(0, 0).decode() not in out
    assert "orders/0" not in out
    res = invoke("inspect", "object", LOG2, "--bucket-dir", site.bucket_dir, "--topic", "nope")
    assert res.exit_code == 0, res.output
    assert "no block of topic nope in this object" in res.stdout


def test_record_limit(site: Site) -> None:
    res = invoke(
        "inspect", "object", LOG2, "--bucket-dir", site.bucket_dir, "--records", "--limit", "12"
    )
    assert res.exit_code == 0, res.output
    # Blocks come in index order: orders/0 (3 records), then telemetry/0.
    assert "records (12 of 33)" in res.stdout
    assert _telemetry(0, 8).decode() in res.stdout
    assert _telemetry(0, 9).decode() not in res.stdout


@pytest.mark.parametrize("partition", range(6))
def test_ranged_reads_of_a_big_object(site: Site, partition: int) -> None:
    """Blocks past the first GET, and the one that straddles its end, come from
    planned ranged reads and decode to the records that were written."""
    res = invoke(
        "inspect",
        "object",
        LOG3,
        "--bucket-dir",
        site.bucket_dir,
        "--records",
        "--partition",
        str(partition),
    )
    assert res.exit_code == 0, res.output
    assert "records (4 of 4)" in res.stdout
    assert res.stdout.count(f"big/{partition} ") >= 5  # index row + 4 records
    for r in site.records[("big", partition)]:
        assert repr(r.value[:48]) in res.stdout


def test_s3_bucket(site: Site, s3_site: str, moto_endpoint: str) -> None:
    opts = s3_options(moto_endpoint, s3_site)
    res = invoke("inspect", "object", LOG3, *opts, "--records", "--limit", "24")
    assert res.exit_code == 0, res.output
    assert "records (24 of 24)" in res.stdout
    for p in range(6):
        for r in site.records[("big", p)]:
            assert repr(r.value[:48]) in res.stdout
    res = invoke("inspect", "object", MANIFEST, *opts)
    assert res.exit_code == 0, res.output
    assert "1..3 (3 entries)" in res.stdout
    res = invoke("inspect", "object", log_key("", SITE, 4), *opts)
    assert_one_line_failure(res.exit_code, res.stderr, "not found")


# --------------------------------------------------------------------------
# manifests


@pytest.mark.parametrize("how", ["file", "key"])
def test_manifest(site: Site, how: str) -> None:
    args = [site.file(MANIFEST)] if how == "file" else [MANIFEST, "--bucket-dir", site.bucket_dir]
    res = invoke("inspect", "object", *args)
    assert res.exit_code == 0, res.output
    out = res.stdout
    for text in ("manifest v1", "1..3 (3 entries)", "low watermark", "fences", "next offsets"):
        assert text in out
    assert "telemetry/2 0..9" in out
    assert "big/5" in out
    for topic, p in site.records:
        assert f"{topic}/{p}" in out
    assert "57 records" in out  # 33 + 24


def test_manifest_filters(site: Site) -> None:
    res = invoke("inspect", "object", site.file(MANIFEST), "--topic", "big", "--partition", "2")
    assert res.exit_code == 0, res.output
    assert "entries with blocks of topic big and partition 2" in res.stdout
    assert "big/2 0..3" in res.stdout
    assert "telemetry/0" not in res.stdout


def test_manifest_has_no_records(site: Site) -> None:
    res = invoke("inspect", "object", site.file(MANIFEST), "--records")
    assert_one_line_failure(res.exit_code, res.stderr, "is a manifest; --records applies to log")


# --------------------------------------------------------------------------
# errors: one line, non-zero exit, no traceback


@pytest.fixture
def broken(site: Site, tmp_path: Path) -> Path:
    """A copy of the site's bucket to damage."""
    copy = tmp_path / "bucket"
    shutil.copytree(site.bucket_dir, copy)
    return copy


def _damage(path: Path, pos: int, data: bytes | None = None, *, truncate: bool = False) -> None:
    buf = bytearray(path.read_bytes())
    if truncate:
        del buf[pos:]
    else:
        buf[pos : pos + len(data or b"")] = data or b""
    path.write_bytes(bytes(buf))


def test_missing_key_and_file(site: Site, tmp_path: Path) -> None:
    res = invoke("inspect", "object", log_key("", SITE, 9), "--bucket-dir", site.bucket_dir)
    assert_one_line_failure(res.exit_code, res.stderr, "not found: no object with key")
    res = invoke("inspect", "object", tmp_path / "nothing.egw")
    assert_one_line_failure(res.exit_code, res.stderr, "no such file")
    res = invoke("inspect", "object", LOG2)
    assert_one_line_failure(res.exit_code, res.stderr, "a bucket key? add --bucket-dir")
    res = invoke("inspect", "object", LOG2, "--bucket-dir", tmp_path / "nowhere")
    assert_one_line_failure(res.exit_code, res.stderr, "is not a bucket directory")
    assert not (tmp_path / "nowhere").exists(), "inspect must not create a bucket"


def test_corrupt_block(site: Site, broken: Path) -> None:
    h = site.headers[2]
    last = h.blocks[-1]  # telemetry/2: the records before it are intact
    _damage(broken / "objects" / LOG2, last.offset + 3, b"\xff\xff")
    res = invoke("inspect", "object", LOG2, "--bucket-dir", broken, "--records")
    line = assert_one_line_failure(res.exit_code, res.stderr, "CorruptData")
    assert f"block telemetry/2 at {last.offset}: CRC mismatch" in line
    assert _telemetry(1, 9).decode() in res.stdout, "records before the bad block are shown"
    assert _telemetry(2, 0).decode() not in res.stdout
    # Without --records the blocks are not read, and the header is fine.
    res = invoke("inspect", "object", LOG2, "--bucket-dir", broken)
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        ((20, b"\x09"), "header CRC mismatch"),
        ((0, b"EGWX"), "not a log object"),
        ((4, b"\x04"), "unsupported log object version 4"),
        ((-1, None), "object is"),
    ],
)
def test_corrupt_header(
    site: Site, broken: Path, damage: tuple[int, bytes | None], fragment: str
) -> None:
    pos, data = damage
    path = broken / "objects" / LOG2
    if data is None:
        _damage(path, len(path.read_bytes()) + pos, truncate=True)
    else:
        _damage(path, pos, data)
    res = invoke("inspect", "object", LOG2, "--bucket-dir", broken)
    assert_one_line_failure(res.exit_code, res.stderr, fragment)
    res = invoke("inspect", "object", path)
    assert_one_line_failure(res.exit_code, res.stderr, fragment)


def test_object_under_the_wrong_key(site: Site, broken: Path) -> None:
    wrong = broken / "objects" / log_key("", SITE, 7)
    wrong.write_bytes(site.objects[LOG2])
    res = invoke("inspect", "object", log_key("", SITE, 7), "--bucket-dir", broken)
    assert_one_line_failure(res.exit_code, res.stderr, "its key says seq 7 of 'north'")
    # A local file of a bucket directory is checked against its path too...
    res = invoke("inspect", "object", wrong)
    assert_one_line_failure(res.exit_code, res.stderr, "its key says seq 7")
    # ... but a copy elsewhere is only checked against itself.
    loose = broken / "copy.egw"
    loose.write_bytes(site.objects[LOG2])
    assert invoke("inspect", "object", loose).exit_code == 0


def test_corrupt_manifest(site: Site, broken: Path) -> None:
    path = broken / "objects" / MANIFEST
    doc = json.loads(path.read_bytes())
    doc["entries"][1]["blocks"][0][2] = 5  # first_offset above last_offset
    path.write_text(json.dumps(doc))
    res = invoke("inspect", "object", MANIFEST, "--bucket-dir", broken)
    assert_one_line_failure(res.exit_code, res.stderr, "first_offset 5 > last_offset")
    path.write_bytes(site.objects[MANIFEST].replace(b'"region":"north"', b'"region":"south"'))
    res = invoke("inspect", "object", MANIFEST, "--bucket-dir", broken)
    assert_one_line_failure(res.exit_code, res.stderr, "under region 'north'")
    path.write_bytes(b'{"format": "edgegw-manifest", "version": 1.5}')
    res = invoke("inspect", "object", path)
    assert_one_line_failure(res.exit_code, res.stderr, "non-integer number '1.5'")


def test_unreachable_s3(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    res = invoke("inspect", "object", LOG2, *s3_options(endpoint, "no-such-bucket"))
    assert_one_line_failure(res.exit_code, res.stderr, "BucketUnavailable")


# --------------------------------------------------------------------------
# journal segments (the command's original job)


@pytest.fixture
def segment(tmp_path: Path) -> Path:
    j = Journal.open_sync(tmp_path / "journal", JournalConfig())
    try:
        for p in range(2):
            rs = [Record(o, T0 + o, b"k", _telemetry(p, o)) for o in range(3)]
            j.append_nowait("telemetry", p, encode_records(rs))
    finally:
        j.close_sync()
    (seg,) = sorted((tmp_path / "journal").glob("*.wal"))
    return seg


def test_journal_segment(segment: Path) -> None:
    results = [
        invoke("inspect", "journal", segment, "--records"),
        invoke("inspect", segment, "--records"),  # no subcommand: a segment, as before
        invoke("inspect", "--records", segment),
    ]
    for res in results:
        assert res.exit_code == 0, res.output
        assert "journal segment from LSN 1" in res.stdout
        assert "checkpoint" in res.stdout
        assert "telemetry/1" in res.stdout
        assert _telemetry(1, 2).decode() in res.stdout
    assert results[0].stdout == results[1].stdout == results[2].stdout


def test_journal_segment_with_block_entries(tmp_path: Path) -> None:
    """A mirror's version 3 segment: a block entry shows its block and, with --records,
    the records inside it, decompressed."""
    b = LogObjectBuilder()
    b.add_batch(
        "telemetry",
        0,
        encode_records([Record(o, T0 + o, b"k", _telemetry(0, o)) for o in range(3)]),
    )
    obj = b.build("south", 1, 7, 1, 1, 0)
    (blk,) = decode_header(obj, where="o").blocks
    coords = SourceCoords("south", 7, 1, True)

    async def write() -> None:
        j = Journal.open_sync(tmp_path / "journal", JournalConfig())
        try:
            block = MirrorBlock("south.telemetry", 0, blk, obj[blk.offset : blk.end])
            await j.append_mirror_blocks([block], coords, coords)
        finally:
            j.close_sync()

    trio.run(write)
    seg = sorted((tmp_path / "journal").glob("*.wal"))[-1]
    res = invoke("inspect", "journal", seg, "--records")
    assert res.exit_code == 0, res.output
    assert "block" in res.stdout
    assert "south.telemetry/0" in res.stdout
    assert "south#7 epoch 1" in res.stdout
    assert _telemetry(0, 2).decode() in res.stdout


def test_corrupt_journal_segment(segment: Path) -> None:
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0xFF
    segment.write_bytes(bytes(data))
    res = invoke("inspect", segment)
    assert_one_line_failure(res.exit_code, res.stderr, "entries before it are intact")


def test_help_lists_both_subcommands() -> None:
    res = invoke("inspect", "--help")
    assert res.exit_code == 0, res.output
    assert "journal" in res.stdout
    assert "object" in res.stdout


# --------------------------------------------------------------------------
# the installed console script, as a real process


def test_real_process(site: Site) -> None:
    proc = run_edgegw(
        "inspect", "object", LOG2, "--bucket-dir", site.bucket_dir, "--records", "--topic", "orders"
    )
    assert proc.returncode == 0, proc.stderr
    assert "orders/0" in proc.stdout
    assert MARKUP.decode() in proc.stdout
    assert "telemetry/0" not in proc.stdout
    proc = run_edgegw("inspect", "object", log_key("", SITE, 99), "--bucket-dir", site.bucket_dir)
    assert_one_line_failure(proc.returncode, proc.stderr, "not found")


def test_a_version_2_object_shows_every_lane(tmp_path: Path) -> None:
    path = tmp_path / "fence.egw"
    path.write_bytes(encode_fence("r1", 2, 7, 41, 1_700_000_000_000, {1: 9, 2: 0}))
    res = invoke("inspect", "object", path)
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "fence entry v2" in text
    assert "normal empty (shipped through 41); critical empty (shipped through 9)" in text
    assert "bulk empty (shipped through 0)" in text
