"""The ``edgegw`` Spark data source: a bucket's region logs as a DataFrame.

::

    spark.dataSource.register(EdgegwDataSource)
    df = (spark.read.format("edgegw")
          .option("bucket", "s3://my-bucket")           # or a local-directory bucket path
          .option("endpoint_url", "http://127.0.0.1:9000")
          .option("access_key", "...").option("secret_key", "...")
          .option("regions", "north,south")             # default: every region in the bucket
          .option("topics", "telemetry")                 # default: every topic
          .option("ranges", '{"north": [1, 120]}')       # inclusive log seqs per region
          .option("key_files", '{"north": ["/etc/edgegw/keys/north-2026-11.key"]}')  # encrypted
          .load())

Rows: ``region, topic, partition, offset, timestamp, key, value, headers,
log_seq``. Planning (``partitions()``, on the driver) reads each region's
manifests and the headers after the newest one (:mod:`.plan`); each input
partition is a list of log-object slices. Workers fetch the byte ranges of
their blocks (:func:`edge_gateway.format.logobject.plan_ranges`), decode them
with the gateway's own sans-IO code and yield one Arrow record batch per
block. Bucket access (endpoint, credentials) travels in the options, so
executors on other machines need nothing from the driver's environment.

Options (all strings): ``bucket`` (required), ``endpoint_url``, ``region``,
``access_key``, ``secret_key``, ``session_token``, ``path_style``,
``prefix`` (key layout prefix), ``regions``, ``topics`` (comma-separated),
``start_seq``/``end_seq`` (all regions) or ``ranges`` (JSON ``{region:
[first, last]}``), ``max_partition_bytes`` (raw bytes per task, default 64
MiB), ``min_partitions`` (default 2), ``verify`` (batch CRCs, default true).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from edge_gateway.errors import InvalidInput
from edge_gateway.pipeline.bucketspec import BucketSpec
from edge_gateway.pipeline.plan import ObjectSlice, list_regions, plan_region, split_slices

NAME: Final = "edgegw"
SCHEMA_DDL: Final = (
    "region string, topic string, partition int, offset bigint, timestamp timestamp, "
    "key binary, value binary, headers array<struct<key:string,value:binary>>, log_seq bigint"
)
DEFAULT_PARTITION_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """The parsed options of a read."""

    bucket: BucketSpec
    prefix: str
    regions: tuple[str, ...] | None
    topics: frozenset[str] | None
    ranges: dict[str, tuple[int, int | None]]
    start_seq: int
    end_seq: int | None
    max_partition_bytes: int
    min_partitions: int
    verify: bool
    #: (region, key file) of the keys of encrypted regions
    key_files: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, options: Any) -> ReadOptions:
        def items(name: str) -> list[str] | None:
            value = options.get(name)
            if value is None or not str(value).strip():
                return None
            return [x.strip() for x in str(value).split(",") if x.strip()]

        def integer(name: str, default: int | None) -> int | None:
            value = options.get(name)
            if value is None:
                return default
            try:
                return int(value)
            except ValueError:
                raise InvalidInput(f"option {name!r} must be an integer, got {value!r}") from None

        ranges: dict[str, tuple[int, int | None]] = {}
        raw = options.get("ranges")
        if raw:
            try:
                doc = json.loads(raw)
                for region, pair in doc.items():
                    first, last = pair
                    ranges[str(region)] = (int(first), None if last is None else int(last))
            except (ValueError, TypeError, AttributeError) as exc:
                raise InvalidInput(
                    f'option "ranges" must be JSON {{"region": [first, last]}}: {exc}'
                ) from None
        key_files: list[tuple[str, str]] = []
        raw_keys = options.get("key_files")
        if raw_keys:
            try:
                for region, paths in json.loads(raw_keys).items():
                    if not isinstance(paths, list):
                        raise TypeError("a region's key files are a list")
                    key_files += [(str(region), str(p)) for p in paths]
            except (ValueError, TypeError, AttributeError) as exc:
                raise InvalidInput(
                    f'option "key_files" must be JSON {{"region": ["path", ...]}}: {exc}'
                ) from None
        regions = items("regions")
        if regions is None and ranges:
            regions = sorted(ranges)
        topics = items("topics")
        return cls(
            bucket=BucketSpec.from_options(options),
            prefix=str(options.get("prefix") or ""),
            regions=tuple(regions) if regions is not None else None,
            topics=frozenset(topics) if topics is not None else None,
            ranges=ranges,
            start_seq=integer("start_seq", 1) or 1,
            end_seq=integer("end_seq", None),
            max_partition_bytes=integer("max_partition_bytes", DEFAULT_PARTITION_BYTES)
            or DEFAULT_PARTITION_BYTES,
            min_partitions=integer("min_partitions", 2) or 1,
            verify=str(options.get("verify", "true")).lower() != "false",
            key_files=tuple(key_files),
        )


class SlicePartition(InputPartition):
    """One read task: slices of log objects."""

    def __init__(self, slices: list[ObjectSlice]) -> None:
        super().__init__(None)
        self.slices = slices

    def __repr__(self) -> str:
        return f"SlicePartition({len(self.slices)} slices)"


def plan_partitions(opts: ReadOptions) -> list[list[ObjectSlice]]:
    """The read tasks of a read (runs on the driver)."""
    topics = opts.topics

    def wanted(topic: str) -> bool:
        return topics is None or topic in topics

    slices: list[ObjectSlice] = []
    bucket = opts.bucket.shared()
    regions = opts.regions if opts.regions is not None else list_regions(bucket, opts.prefix)
    for region in regions:
        first, last = opts.ranges.get(region, (opts.start_seq, opts.end_seq))
        if last is not None and last < first:
            continue
        plan = plan_region(
            bucket, region, first_seq=first, last_seq=last, wanted=wanted, prefix=opts.prefix
        )
        slices += plan.slices
    return list(
        split_slices(
            slices, target_raw_bytes=opts.max_partition_bytes, min_parts=opts.min_partitions
        )
    )


def read_slices(opts: ReadOptions, slices: Sequence[ObjectSlice]) -> Iterator[Any]:
    """Arrow record batches of the slices' records, one per block (runs on a worker)."""
    from edge_gateway.encryption import keyring_from_files
    from edge_gateway.pipeline._arrow import read_blocks

    keyring = keyring_from_files(opts.key_files) if opts.key_files else None
    return read_blocks(opts.bucket.shared(), slices, verify=opts.verify, keyring=keyring)


class EdgegwReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return [SlicePartition(group) for group in plan_partitions(self.options)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SlicePartition)
        return read_slices(self.options, partition.slices)


class EdgegwDataSource(DataSource):
    """``spark.read.format("edgegw")``: records of a bucket's region logs."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return EdgegwReader(ReadOptions.parse(self.options))
