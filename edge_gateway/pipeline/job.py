"""``edgegw pipeline run``: each (region, topic)'s new records into a table per topic, exactly once.

One run:

1. takes the warehouse lock, opens the catalog, and for each topic table
   reads its committed positions (``{region: last seq}``) and deletes the
   files of runs that never committed;
2. plans every region's log from the lowest position still needed to the
   head *as of now* (:mod:`.plan`); the head is fixed for the run, so the read
   of each topic is the bounded, reproducible range ``position + 1 .. head``;
3. for each topic: reads that range with the ``edgegw`` data source, adds
   ``date`` (UTC, from the timestamp), optionally decodes JSON values into
   columns (records that do not parse go to the ``_rejects`` table with the
   reason), writes Parquet partitioned by ``date`` and ``region`` into the
   run's staging folder, then commits files and new positions in one step
   (:mod:`.tables`): rejects first, then the topic's table.

A run killed at any point leaves either the old positions and no visible
data (the next run re-reads the same range and deletes the orphaned files),
or the new positions and the data: never duplicates, never gaps. The rejects
table keeps its own positions per topic, so a crash between its commit and
the topic's never writes a reject twice.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.pipeline._store import BucketSpec
from edge_gateway.pipeline.plan import RegionPlan, list_regions, plan_region
from edge_gateway.pipeline.tables import JSON_SCHEMA, REJECTS, Output, Table, warehouse_lock


@dataclass(frozen=True, slots=True)
class JobConfig:
    bucket: BucketSpec
    output: Output
    regions: tuple[str, ...] | None = None
    topics: tuple[str, ...] | None = None
    #: topic -> Spark DDL of its JSON values (``"a int, b string"``), or None to infer once
    json_topics: Mapping[str, str | None] = field(default_factory=dict)
    prefix: str = ""
    max_partition_bytes: int = 64 * 1024 * 1024


@dataclass(slots=True)
class TopicResult:
    topic: str
    #: region -> (first seq, last seq) read
    ranges: dict[str, tuple[int, int]]
    planned_records: int = 0
    planned_bytes: int = 0
    rows: int = 0
    rejects: int = 0
    files: int = 0
    seconds: float = 0.0
    committed: bool = False


@dataclass(slots=True)
class JobPlan:
    regions: dict[str, RegionPlan]
    topics: dict[str, TopicResult]


Progress = Callable[[str], None]


def _tables(cfg: JobConfig, catalog: Any, topics: Iterable[str]) -> dict[str, Table]:
    return {t: cfg.output.table(catalog, t) for t in topics}


def plan_job(cfg: JobConfig, catalog: Any) -> tuple[JobPlan, dict[str, Table]]:
    """What a run would read: per topic, per region, the seq range after the committed position."""
    reader = cfg.bucket.open()
    regions = list(cfg.regions) if cfg.regions else list_regions(reader, cfg.prefix)
    wanted_topics = set(cfg.topics) if cfg.topics else None
    known: dict[str, Table] = _tables(cfg, catalog, cfg.topics or ())
    # With a topic list, the read starts at the lowest position of those tables;
    # otherwise a topic never seen may hold records anywhere: plan from the start.
    region_plans: dict[str, RegionPlan] = {}
    for region in regions:
        if wanted_topics is not None:
            first = min(int(known[t].positions().get(region, 0)) + 1 for t in wanted_topics)
        else:
            first = 1
        region_plans[region] = plan_region(
            reader,
            region,
            first_seq=first,
            wanted=lambda t: wanted_topics is None or t in wanted_topics,
            prefix=cfg.prefix,
        )
    topic_names = sorted(
        wanted_topics
        if wanted_topics is not None
        else {t for p in region_plans.values() for t in p.topics()}
    )
    if REJECTS in topic_names:
        raise InvalidInput(f"a topic named {REJECTS!r} clashes with the rejects table")
    tables = {**known, **_tables(cfg, catalog, (t for t in topic_names if t not in known))}
    results: dict[str, TopicResult] = {}
    for topic in topic_names:
        positions = tables[topic].positions()
        res = TopicResult(topic, {})
        for region, plan in region_plans.items():
            first = max(int(positions.get(region, 0)) + 1, plan.first_seq)
            if first > plan.last_seq:
                continue
            res.ranges[region] = (first, plan.last_seq)
            for s in plan.slices:
                if s.seq >= first:
                    for b in s.blocks:
                        if b.topic == topic:
                            res.planned_records += b.record_count
                            res.planned_bytes += b.stored_length
        results[topic] = res
    return JobPlan(region_plans, results), tables


def _json_columns(spark: Any, df: Any, ddl: str | None, table: Table) -> tuple[Any, Any, str]:
    """(rows with the JSON fields as columns, rejected rows with a reason, schema JSON).

    Both frames parse the values from ``df``; nothing is cached: the job
    writes the good rows first and reads the rejects only when fewer rows
    were written than planned (rejects are rare, a second pass over every
    run would double its cost).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    stored = table.properties().get(JSON_SCHEMA)
    if stored:
        schema = StructType.fromJson(json.loads(stored))
    elif ddl:
        parsed = spark.createDataFrame([], ddl).schema
        schema = StructType(list(parsed.fields))
    else:
        sample = df.select(F.col("value").cast("string").alias("v")).limit(10_000)
        schema = spark.read.json(sample.rdd.map(lambda r: r.v)).schema
        schema = StructType([f for f in schema.fields if f.name != "_corrupt_record"])
    fields = [f.name for f in schema.fields]
    base = [c for c in df.columns if c != "value"]
    if clash := sorted(set(fields) & {*base, "pdate", "pregion"}):
        raise InvalidInput(
            f"the JSON schema of {table.name!r} has fields named like the table's own "
            f"columns ({', '.join(clash)}): rename them in the schema"
        )
    with_corrupt = StructType([*schema.fields, StructField("_corrupt", StringType())])
    text = F.col("value").cast("string")
    parsed = df.select(
        *df.columns,
        F.from_json(
            text, with_corrupt, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"}
        ).alias("_json"),
        # A nondeterministic column keeps the optimizer from pushing the
        # filters below into this projection, where each would parse the
        # JSON again (three parses per record instead of one).
        F.spark_partition_id().alias("_task"),
    )
    broken = F.col("_json").isNull() | F.col("_json._corrupt").isNotNull()
    # Both filters name ``_task`` (always true), so it is not pruned before them.
    guard = F.col("_task") >= 0
    good = parsed.where(~broken & guard).select(
        *base, *[F.col(f"_json.{name}").alias(name) for name in fields]
    )
    is_object = F.from_json(text, "map<string,string>").isNotNull()
    reason = F.when(~is_object | F.col("_json").isNull(), F.lit("not a JSON object")).otherwise(
        F.lit(f"does not match the schema {schema.simpleString()}")
    )
    rejects = parsed.where(broken & guard).select(
        "region",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "date",
        "key",
        "value",
        reason.alias("reason"),
        "log_seq",
    )
    return good, rejects, schema.json()


def _commit_rejects(
    rejects_table: Table,
    rejected: Any,
    topic: str,
    ranges: Mapping[str, tuple[int, int]],
    rejects_run: str,
    cfg: JobConfig,
) -> int:
    """Write and commit the rejects of ``topic`` not committed yet; returns how many."""
    from pyspark.sql import functions as F

    done = rejects_table.positions().get(topic, {})
    fresh = F.lit(False)
    for region, (first, _last) in ranges.items():
        after = max(first - 1, int(done.get(region, 0)))
        fresh = fresh | ((F.col("region") == region) & (F.col("log_seq") > after))
    # a run id of its own per topic: a crash between two topics' rejects
    # leaves only uncommitted runs behind, which are cleaned
    staging = rejects_table.staging_dir(rejects_run)
    files = _write(rejected.where(fresh), staging, cfg.output.iceberg)
    positions = {**rejects_table.positions()}
    positions[topic] = {**done, **{r: b for r, (_, b) in ranges.items()}}
    rejects_table.commit(rejects_run, files, positions, {})
    return _rows(files)


def _write(df: Any, path: Path, iceberg: bool) -> list[Path]:
    from pyspark.sql import functions as F

    if iceberg:
        # The files keep their partition columns (pyiceberg's add_files reads
        # partition values from the columns' statistics): partition by copies.
        out = df.withColumn("pdate", F.col("date")).withColumn("pregion", F.col("region"))
        out.write.mode("overwrite").partitionBy("pdate", "pregion").parquet(str(path))
    else:
        df.write.mode("overwrite").partitionBy("date", "region").parquet(str(path))
    return sorted(p for p in path.rglob("*.parquet") if not p.name.startswith((".", "_")))


def _rows(files: list[Path]) -> int:
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in files)


def run_job(
    spark: Any,
    cfg: JobConfig,
    *,
    progress: Progress = lambda _msg: None,
    dry_run: bool = False,
    min_partitions: int | None = None,
) -> JobPlan:
    """Run the job once (see the module docstring); returns the plan with its results."""
    from pyspark.sql import functions as F

    with warehouse_lock(cfg.output.warehouse):
        catalog = cfg.output.open()
        plan, tables = plan_job(cfg, catalog)
        if dry_run:
            return plan
        run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        rejects_table = cfg.output.table(catalog, REJECTS) if cfg.json_topics else None
        for table in tables.values():
            if (removed := table.clean_uncommitted(keep=run_id)) > 0:
                progress(f"{table.name}: removed the files of {removed} uncommitted run(s)")
        if rejects_table is not None:
            rejects_table.clean_uncommitted()
        parallelism = min_partitions or 2 * spark.sparkContext.defaultParallelism
        for topic, res in plan.topics.items():
            if not res.ranges:
                continue
            started = time.monotonic()
            table = tables[topic]
            positions = {**table.positions(), **{r: last for r, (_, last) in res.ranges.items()}}
            if res.planned_records == 0:
                if table.exists:
                    table.commit(run_id, [], positions, {})
                    res.committed = True
                continue
            progress(
                f"{topic}: reading {res.planned_records} records ({res.planned_bytes} bytes) "
                f"from {', '.join(f'{r} {a}..{b}' for r, (a, b) in sorted(res.ranges.items()))}"
            )
            options = {
                **cfg.bucket.to_options(),
                "prefix": cfg.prefix,
                "topics": topic,
                "ranges": json.dumps({r: list(v) for r, v in res.ranges.items()}),
                "max_partition_bytes": str(cfg.max_partition_bytes),
                "min_partitions": str(parallelism),
            }
            df = (
                spark.read.format("edgegw")
                .options(**options)
                .load()
                .withColumn("date", F.to_date("timestamp"))
            )
            props: dict[str, str] = {}
            rejected = None
            if topic in cfg.json_topics:
                assert rejects_table is not None
                df_out, rejected, props[JSON_SCHEMA] = _json_columns(
                    spark, df, cfg.json_topics[topic], table
                )
            else:
                df_out = df
            files = _write(df_out, table.staging_dir(run_id), cfg.output.iceberg)
            res.rows = _rows(files)
            res.files = len(files)
            if rejected is not None and res.rows < res.planned_records:
                assert rejects_table is not None
                res.rejects = _commit_rejects(
                    rejects_table, rejected, topic, res.ranges, f"{run_id}.{topic}", cfg
                )
            elif res.rows != res.planned_records:
                raise CorruptData(
                    f"{topic}: wrote {res.rows} rows, the plan counted {res.planned_records} "
                    "records: nothing committed"
                )
            table.commit(run_id, files, positions, props)
            res.committed = True
            res.seconds = time.monotonic() - started
            progress(
                f"{topic}: committed {res.rows} rows in {res.files} files"
                + (f", {res.rejects} rejects" if res.rejects else "")
                + f" ({res.seconds:.1f} s)"
            )
        return plan
