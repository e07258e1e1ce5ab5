"""``edgegw pipeline run``: each (region, topic)'s new records into a table per topic, exactly once.

One run:

1. takes the warehouse lock, opens the catalog, and for each topic table
   reads its committed positions (``{region: last seq}``) and deletes the
   files of runs that never committed;
2. plans every region's log from the lowest position still needed to the
   head *as of now* (:mod:`.plan`); the head is fixed for the run, so the read
   of each topic is the bounded, reproducible range ``position + 1 .. head``;
3. for each topic: splits that range's blocks into tasks of about
   ``max_partition_bytes`` and runs them on the executors (:mod:`._task`):
   each reads its blocks, adds ``date`` (UTC, from the timestamp), optionally
   decodes JSON values into columns (:mod:`._json`; values that do not
   decode go to the ``_rejects`` table with the reason) and writes Parquet
   partitioned by ``date`` and ``region`` into the run's staging folder;
   then the driver checks every planned record was written or rejected and
   commits files and new positions in one step (:mod:`.tables`): rejects
   first, then the topic's table.

A run killed at any point leaves either the old positions and no visible
data (the next run re-reads the same range and deletes the orphaned files),
or the new positions and the data: never duplicates, never gaps. The rejects
table keeps its own positions per topic, so a crash between its commit and
the topic's never writes a reject twice.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_gateway.encryption import keyring_from_files
from edge_gateway.errors import CorruptData, InvalidInput
from edge_gateway.pipeline._json import decoder_for
from edge_gateway.pipeline._task import (
    BASE_COLUMNS,
    WriteResult,
    WriteTask,
    run_write_task,
    staged_files,
)
from edge_gateway.pipeline.bucketspec import BucketSpec
from edge_gateway.pipeline.plan import (
    ObjectSlice,
    PlannedGap,
    RegionPlan,
    check_keys,
    list_regions,
    plan_region,
    split_slices,
)
from edge_gateway.pipeline.session import LazySession
from edge_gateway.pipeline.tables import JSON_SCHEMA, REJECTS, Output, Table, warehouse_lock

log = logging.getLogger("edgegw.pipeline")


@dataclass(frozen=True, slots=True)
class JobConfig:
    bucket: BucketSpec
    output: Output
    regions: tuple[str, ...] | None = None
    topics: tuple[str, ...] | None = None
    #: topic -> Spark DDL of its JSON values (``"a int, b string"``), or None to infer once
    json_topics: Mapping[str, str | None] = field(default_factory=dict)
    prefix: str = ""
    max_partition_bytes: int = 128 * 1024 * 1024
    #: (region, key file) of the keys of encrypted regions (``--key-file``)
    key_files: tuple[tuple[str, str], ...] = ()


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
    #: of ``seconds``: the write tasks, and the commit(s)
    task_seconds: float = 0.0
    commit_seconds: float = 0.0
    #: CPU time the tasks used, summed over the executors
    task_cpu_seconds: float = 0.0
    tasks: int = 0
    committed: bool = False
    #: region -> last committed seq: before the run, after it once ``committed``
    positions: dict[str, int] = field(default_factory=dict)
    #: offsets the source dropped before shipping them, in the entries read
    #: (gap markers): the table has a hole there, reported, never silent
    gaps: list[PlannedGap] = field(default_factory=list)

    @property
    def gap_records(self) -> int:
        return sum(g.records for g in self.gaps)


@dataclass(slots=True)
class JobPlan:
    regions: dict[str, RegionPlan]
    topics: dict[str, TopicResult]


Progress = Callable[[str], None]


def _tables(cfg: JobConfig, catalog: Any, topics: Iterable[str]) -> dict[str, Table]:
    return {t: cfg.output.table(catalog, t) for t in topics}


def plan_job(cfg: JobConfig, catalog: Any) -> tuple[JobPlan, dict[str, Table]]:
    """What a run would read: per topic, per region, the seq range after the committed position."""
    bucket = cfg.bucket.shared()
    regions = list(cfg.regions) if cfg.regions else list_regions(bucket, cfg.prefix)
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
            bucket,
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
    # An encrypted region without its key stops the run here, before Spark starts.
    check_keys(region_plans.values(), keyring_from_files(cfg.key_files))
    tables = {**known, **_tables(cfg, catalog, (t for t in topic_names if t not in known))}
    results: dict[str, TopicResult] = {}
    for topic in topic_names:
        positions = tables[topic].positions()
        res = TopicResult(topic, {}, positions={str(r): int(v) for r, v in positions.items()})
        for region, plan in region_plans.items():
            first = max(int(positions.get(region, 0)) + 1, plan.first_seq)
            if first > plan.last_seq:
                continue
            res.ranges[region] = (first, plan.last_seq)
            res.gaps += (g for g in plan.gaps if g.topic == topic and g.seq >= first)
            for s in plan.slices:
                if s.seq >= first:
                    for b in s.blocks:
                        if b.topic == topic:
                            res.planned_records += b.record_count
                            res.planned_bytes += b.stored_length
        results[topic] = res
    return JobPlan(region_plans, results), tables


def _json_schema(
    spark: Any,
    cfg: JobConfig,
    topic: str,
    ranges: Mapping[str, tuple[int, int]],
    ddl: str | None,
    table: Table,
) -> tuple[str, str]:
    """The topic's JSON schema: (Spark ``StructType.json()``, its simple string).

    The schema stored with the table wins; else the DDL given; else it is
    inferred once from up to 10,000 of the values to read and then fixed.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    stored = table.properties().get(JSON_SCHEMA)
    if stored:
        schema = StructType.fromJson(json.loads(stored))
    elif ddl:
        parsed = spark.createDataFrame([], ddl).schema
        schema = StructType(list(parsed.fields))
    else:
        sample = (
            spark.read.format("edgegw")
            .options(
                **cfg.bucket.to_options(),
                prefix=cfg.prefix,
                key_files=json.dumps(_key_files_option(cfg.key_files)),
                topics=topic,
                ranges=json.dumps({r: list(v) for r, v in ranges.items()}),
            )
            .load()
        )
        values = sample.select(F.col("value").cast("string").alias("v")).limit(10_000)
        schema = spark.read.json(values.rdd.map(lambda r: r.v)).schema
        schema = StructType([f for f in schema.fields if f.name != "_corrupt_record"])
    fields = [f.name for f in schema.fields]
    own = {c for c in BASE_COLUMNS if c != "value"} | {"pdate", "pregion"}
    if clash := sorted(set(fields) & own):
        raise InvalidInput(
            f"the JSON schema of {table.name!r} has fields named like the table's own "
            f"columns ({', '.join(clash)}): rename them in the schema"
        )
    text = schema.json()
    decoder_for(text)  # refuses unsupported types before anything is written
    return text, schema.simpleString()


def _key_files_option(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for region, path in pairs:
        out.setdefault(region, []).append(path)
    return out


def _topic_slices(
    plan: JobPlan, topic: str, ranges: Mapping[str, tuple[int, int]]
) -> list[ObjectSlice]:
    """The blocks of ``topic`` in each region's planned range."""
    out: list[ObjectSlice] = []
    for region, (first, last) in sorted(ranges.items()):
        for s in plan.regions[region].slices:
            if first <= s.seq <= last:
                blocks = tuple(b for b in s.blocks if b.topic == topic)
                if blocks:
                    out.append(dataclasses.replace(s, blocks=blocks))
    return out


def _run_tasks(spark: Any, tasks: list[WriteTask], staging: list[Path]) -> list[WriteResult]:
    """Run the write tasks on the executors; delete files no successful task reported."""
    sc = spark.sparkContext
    sc.setJobDescription(f"edgegw: {len(tasks)} write tasks")
    results: list[WriteResult] = sc.parallelize(tasks, len(tasks)).map(run_write_task).collect()
    reported = {p for r in results for p, _ in (*r.files, *r.reject_files)}
    for root in staging:
        # attempts that failed and were retried leave files of their own
        for stale in staged_files(root) - reported:
            Path(stale).unlink(missing_ok=True)
    return results


def run_job(
    spark: Any | LazySession,
    cfg: JobConfig,
    *,
    progress: Progress = lambda _msg: None,
    dry_run: bool = False,
    min_partitions: int | None = None,
) -> JobPlan:
    """Run the job once (see the module docstring); returns the plan with its results.

    ``spark`` is a session, or a :class:`LazySession` started only if some
    topic has records to read.
    """

    def session() -> Any:
        return spark.get() if isinstance(spark, LazySession) else spark

    with warehouse_lock(cfg.output.warehouse), cfg.output.open() as catalog:
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
        for topic, res in plan.topics.items():
            if not res.ranges:
                continue
            for gap in res.gaps:
                log.warning("pipeline: %s", gap.describe())
                progress(f"{topic}: GAP: {gap.describe()}")
            started = time.monotonic()
            table = tables[topic]
            positions = {**table.positions(), **{r: last for r, (_, last) in res.ranges.items()}}
            if res.planned_records == 0:
                if table.exists:
                    table.commit(run_id, [], positions, {})
                    res.committed = True
                    res.positions = {str(r): int(v) for r, v in positions.items()}
                continue
            progress(
                f"{topic}: reading {res.planned_records} records ({res.planned_bytes} bytes) "
                f"from {', '.join(f'{r} {a}..{b}' for r, (a, b) in sorted(res.ranges.items()))}"
            )
            props: dict[str, str] = {}
            schema_json: str | None = None
            schema_text = ""
            done: dict[str, int] = {}
            rejects_run = f"{run_id}.{topic}"
            cores = session().sparkContext.defaultParallelism
            if topic in cfg.json_topics:
                assert rejects_table is not None
                schema_json, schema_text = _json_schema(
                    session(), cfg, topic, res.ranges, cfg.json_topics[topic], table
                )
                props[JSON_SCHEMA] = schema_json
                done = {str(r): int(v) for r, v in rejects_table.positions().get(topic, {}).items()}
            staging = table.staging_dir(run_id)
            rejects_staging = rejects_table.staging_dir(rejects_run) if rejects_table else None
            groups = split_slices(
                _topic_slices(plan, topic, res.ranges),
                target_raw_bytes=cfg.max_partition_bytes,
                min_parts=min_partitions or cores,
                multiple_of=cores,
            )
            tasks = [
                WriteTask(
                    index=i,
                    bucket=cfg.bucket,
                    slices=tuple(group),
                    out_dir=str(staging),
                    iceberg=cfg.output.iceberg,
                    json_schema=schema_json,
                    json_schema_text=schema_text,
                    rejects_dir=str(rejects_staging) if rejects_staging else None,
                    rejects_done=done,
                    key_files=cfg.key_files,
                )
                for i, group in enumerate(groups)
            ]
            running = time.monotonic()
            results = _run_tasks(
                session(), tasks, [staging, *([rejects_staging] if rejects_staging else [])]
            )
            res.task_seconds = time.monotonic() - running
            res.task_cpu_seconds = sum(r.cpu_seconds for r in results)
            files = sorted(Path(p) for r in results for p, _ in r.files)
            res.rows = sum(r.rows for r in results)
            res.files = len(files)
            res.rejects = sum(r.rejected for r in results)
            read = sum(r.records for r in results)
            if read != res.planned_records or res.rows + res.rejects != read:
                raise CorruptData(
                    f"{topic}: read {read} records and wrote {res.rows} rows and "
                    f"{res.rejects} rejects, the plan counted {res.planned_records} records: "
                    "nothing committed"
                )
            committing = time.monotonic()
            if res.rejects:
                assert rejects_table is not None
                reject_files = sorted(Path(p) for r in results for p, _ in r.reject_files)
                rejects_positions = {**rejects_table.positions()}
                rejects_positions[topic] = {
                    **done,
                    **{r: last for r, (_, last) in res.ranges.items()},
                }
                rejects_table.commit(rejects_run, reject_files, rejects_positions, {})
            table.commit(run_id, files, positions, props)
            res.committed = True
            res.positions = {str(r): int(v) for r, v in positions.items()}
            res.commit_seconds = time.monotonic() - committing
            res.tasks = len(tasks)
            res.seconds = time.monotonic() - started
            progress(
                f"{topic}: committed {res.rows} rows in {res.files} files"
                + (f", {res.rejects} rejects" if res.rejects else "")
                + f" ({res.tasks} tasks {res.task_seconds:.1f} s, "
                f"{res.task_cpu_seconds:.1f} CPU-s; commit {res.commit_seconds:.1f} s)"
            )
        return plan
