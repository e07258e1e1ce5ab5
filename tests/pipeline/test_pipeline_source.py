"""The ``edgegw`` Spark data source against real buckets (local directory, moto's S3)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from _pipeline_support import T0, Rows, Site, local_site, merge, s3_site

from edge_gateway.errors import ConfigError, CorruptData
from edge_gateway.format.manifest import log_key
from edge_gateway.pipeline.bucketspec import BucketSpec
from edge_gateway.pipeline.plan import plan_region, split_slices
from edge_gateway.pipeline.session import check_java


def rows_of(df: Any) -> Rows:
    out: Rows = {}
    for r in df.collect():
        key = (r["region"], r["topic"], r["partition"], r["offset"])
        assert key not in out, f"duplicate row {key}"
        ts = r["timestamp"].replace(tzinfo=UTC)
        out[key] = (
            int(ts.timestamp() * 1000),
            None if r["key"] is None else bytes(r["key"]),
            bytes(r["value"]),
            tuple((h["key"], bytes(h["value"])) for h in r["headers"]),
        )
    return out


def read(spark: Any, bucket: str, **options: str) -> Any:
    reader = spark.read.format("edgegw").option("bucket", bucket)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_round_trip_local_bucket(spark: Any, tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    north = local_site("north", tmp_path, bucket)
    south = local_site("south", tmp_path, bucket)
    north.ship("telemetry", 3, 4, headers=True)
    north.ship("events", 1, 2)
    south.ship("telemetry", 2, 3)
    df = read(spark, str(bucket))
    assert [f.name for f in df.schema.fields] == [
        "region", "topic", "partition", "offset", "timestamp", "key", "value", "headers", "log_seq",
    ]  # fmt: skip
    got = rows_of(df)
    assert got == merge(north, south)
    assert any(h for (_, _, _, h) in got.values())
    assert any(k is None for (_, k, _, _) in got.values())
    first = df.where("region = 'north' and offset = 0").first()
    assert first["timestamp"].replace(tzinfo=UTC) == datetime.fromtimestamp(T0 / 1000, UTC)


def test_topics_regions_and_bounded_ranges(spark: Any, tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    north = local_site("north", tmp_path, bucket)
    south = local_site("south", tmp_path, bucket)
    north.ship("a", 2, 2)
    north.ship("b", 1, 2)
    south.ship("a", 1, 1)
    only_a = rows_of(read(spark, str(bucket), topics="a", regions="north"))
    assert only_a == {k: v for k, v in north.expected.items() if k[1] == "a"}
    # bounded: entries 1..2 of north only; the same rows however the log grows
    df = read(spark, str(bucket), ranges=json.dumps({"north": [1, 2]}))
    seqs = {r["log_seq"] for r in df.select("log_seq").collect()}
    assert seqs <= {1, 2}
    before = rows_of(df)
    north.ship("a", 2, 3)
    assert rows_of(read(spark, str(bucket), ranges=json.dumps({"north": [1, 2]}))) == before
    # and everything from seq 3 on is what the first read left out
    rest = rows_of(read(spark, str(bucket), regions="north", start_seq="3"))
    assert before.keys().isdisjoint(rest.keys())
    assert {**before, **rest} == north.expected


def test_round_trip_s3_with_options(
    spark: Any, tmp_path: Path, moto_endpoint: str, s3_bucket_name: str
) -> None:
    north = s3_site("north", tmp_path, moto_endpoint, s3_bucket_name)
    north.ship("telemetry", 2, 5, headers=True)
    df = read(
        spark,
        f"s3://{s3_bucket_name}",
        endpoint_url=moto_endpoint,
        access_key="testing",
        secret_key="testing",
        max_partition_bytes="4096",
    )
    assert df.rdd.getNumPartitions() >= 2
    assert rows_of(df) == north.expected


def test_plan_uses_manifests_and_tail(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    site = local_site("north", tmp_path, bucket)
    for _ in range(4):
        site.ship("t", 2, 1)
    with BucketSpec(str(bucket)).open() as reader:
        plan = plan_region(reader, "north")
        assert plan.first_seq == 1
        assert plan.last_seq >= 5  # a fence per claim plus the data entries
        assert plan.records == len(site.expected)
        seqs = [s.seq for s in plan.slices]
        assert seqs == sorted(set(seqs))
        partial = plan_region(reader, "north", first_seq=3, last_seq=plan.last_seq - 1)
        assert all(3 <= s.seq < plan.last_seq for s in partial.slices)
        groups = list(split_slices(list(plan.slices), target_raw_bytes=1, min_parts=1))
        assert sum(len(b.blocks) for g in groups for b in g) == sum(
            len(s.blocks) for s in plan.slices
        )
        with pytest.raises(CorruptData, match="missing"):
            plan_region(reader, "north", first_seq=1, last_seq=plan.last_seq + 5)


def test_corrupt_block_fails_the_read(spark: Any, tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    site = local_site("north", tmp_path, bucket)
    site.ship("t", 1, 3)
    with BucketSpec(str(bucket)).open() as reader:
        plan = plan_region(reader, "north")
        s = plan.slices[0]
        path = bucket / "objects" / log_key("", "north", s.seq)
        data = bytearray(path.read_bytes())
        data[s.blocks[0].offset + 3] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(Exception, match="CRC mismatch"):
            read(spark, str(bucket)).collect()


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(ConfigError, match="needs Java"):
        check_java()


def test_site_helper_checks_itself(tmp_path: Path) -> None:
    site: Site = local_site("north", tmp_path, tmp_path / "bucket")
    assert site.ship("t", 1, 1) >= 1
    assert len(site.expected) == 10


@pytest.mark.parametrize(
    ("sizes", "target", "min_parts", "multiple_of"),
    [
        ([100] * 40, 1000, 1, 1),
        ([100] * 40, 1000, 1, 3),
        ([100] * 41, 1000, 4, 2),
        ([5, 500, 7, 300, 1, 1, 900, 40] * 5, 600, 2, 2),
        ([100] * 3, 1, 8, 2),  # fewer blocks than tasks wanted
        ([0, 0], 10, 2, 2),
    ],
)
def test_split_slices_balances_tasks(
    sizes: list[int], target: int, min_parts: int, multiple_of: int
) -> None:
    from edge_gateway.format.logobject import BlockIndex
    from edge_gateway.pipeline.plan import ObjectSlice

    def block(i: int, raw: int) -> BlockIndex:
        return BlockIndex("t", i % 4, 0, 0, 1, 0, 0, 64 + i, 1, raw, 0, 0)

    blocks = [block(i, raw) for i, raw in enumerate(sizes)]
    slices = [
        ObjectSlice("north", seq + 1, f"k{seq}", 10_000, tuple(blocks[seq * 4 : seq * 4 + 4]))
        for seq in range(-(-len(blocks) // 4))
    ]
    groups = list(split_slices(slices, target_raw_bytes=target, min_parts=min_parts,
                               multiple_of=multiple_of))  # fmt: skip
    # every block once, in order
    assert [b for g in groups for s in g for b in s.blocks] == blocks
    total = sum(sizes)
    if total == 0:
        assert len(groups) == 1
        return
    wanted = max(min_parts, -(-total // target))
    wanted = -(-wanted // multiple_of) * multiple_of
    mean, biggest = total / wanted, max(sizes)
    assert len(groups) <= wanted
    if len(blocks) >= wanted and biggest <= mean:
        assert len(groups) == wanted
    # cut at the multiples of total / tasks: no task is more than a block off the mean
    for g in groups:
        assert sum(s.raw_bytes for s in g) <= mean + biggest


def test_plan_reports_gap_markers(tmp_path: Path) -> None:
    """Offsets a drop-oldest topic dropped at the source are planned as gaps (no Spark)."""
    from edge_gateway.format.batch import encode_batch
    from edge_gateway.format.logobject import GapRange, LaneRange, LogObjectBuilder, encode_fence

    bucket = tmp_path / "bucket"
    objects = bucket / "objects"

    def put(seq: int, data: bytes) -> None:
        path = objects / log_key("", "north", seq)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    put(1, encode_fence("north", 1, 1, 0, 0, {5: 0}))
    b = LogObjectBuilder()
    b.add_batch("t", 0, encode_batch([b"a"] * 10, timestamps=T0))
    put(2, b.build("north", 1, 2, 1, 0, 0, lanes=(LaneRange(5, 1, 3),)))
    b = LogObjectBuilder()
    b.add_batch("t", 0, encode_batch([b"b"] * 5, timestamps=T0, base_offset=50))
    gaps = (GapRange(5, "t", 0, 10, 49, 40, 4000), GapRange(5, "u", 0, 0, 9, 10, 1000))
    put(3, b.build("north", 1, 3, 1, 0, 0, lanes=(LaneRange(5, 4, 9),), gaps=gaps))
    with BucketSpec(str(bucket)).open() as reader:
        plan = plan_region(reader, "north")
        assert plan.records == 15
        assert [(g.topic, g.first_offset, g.last_offset, g.records, g.seq) for g in plan.gaps] == [
            ("t", 10, 49, 40, 3),
            ("u", 0, 9, 10, 3),
        ]
        assert "dropped at the source" in plan.gaps[0].describe()
        only_t = plan_region(reader, "north", wanted=lambda t: t == "t")
        assert [g.topic for g in only_t.gaps] == ["t"]
        assert plan_region(reader, "north", first_seq=4, last_seq=3).gaps == ()
