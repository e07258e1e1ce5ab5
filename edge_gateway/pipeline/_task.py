"""One Spark task of a pipeline run: log-object slices of one topic into Parquet files.

The job plans on the driver, then runs one task per group of slices on the
executors (``sparkContext.parallelize(tasks).map(run_write_task)``). A task
fetches and checks its blocks (:func:`._arrow.read_blocks`), adds the
``date`` column (UTC), decodes JSON values if the topic has a schema
(:mod:`._json`), and writes one Parquet file per ``(date, region)`` it holds
into the run's staging folder, for the topic's table and, for values that do
not decode, for ``_rejects``. It returns what it wrote; nothing is visible
until the driver commits the files of every task with the new positions.

Why the tasks write Parquet with Arrow instead of handing rows to Spark's
writer: the records are already Arrow columns in the Python worker; moving
them into the JVM, parsing JSON there with ``from_json`` and writing from
the JVM made the job 0.35x as fast as Spark's own JSON-lines job, this way
1.6-2.2x (``docs/pipeline.md``, "Performance"). The files are the Parquet a
Spark write makes (timestamps as ``TIMESTAMP_MICROS``, zstd), and Spark,
pyiceberg and any Parquet reader read them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from edge_gateway.pipeline._arrow import SCHEMA, read_blocks
from edge_gateway.pipeline._json import decoder_for
from edge_gateway.pipeline._store import BucketSpec
from edge_gateway.pipeline.plan import ObjectSlice

#: the columns of a topic's table before the JSON fields (``value`` only without JSON)
BASE_COLUMNS: Final = (*SCHEMA.names, "date")
REJECT_COLUMNS: Final = (
    "region",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "date",
    "key",
    "value",
    "reason",
    "log_seq",
)
#: how a run's data files are named in its staging folder, by output kind
PARTITION_DIRS: Final = {True: ("pdate", "pregion"), False: ("date", "region")}


@dataclass(frozen=True, slots=True)
class WriteTask:
    """What one task reads and where it writes (pickled to an executor)."""

    index: int
    bucket: BucketSpec
    slices: tuple[ObjectSlice, ...]
    #: the run's staging folder of the topic's table
    out_dir: str
    #: Iceberg output keeps ``date``/``region`` in the files (pyiceberg's add_files
    #: reads partition values from column statistics); plain Parquet drops them
    iceberg: bool = True
    #: the topic's JSON schema (Spark ``StructType.json()``), or None to keep values
    json_schema: str | None = None
    json_schema_text: str = ""
    #: the run's staging folder of ``_rejects`` (JSON topics)
    rejects_dir: str | None = None
    #: region -> last seq whose rejects are committed already (after a crash
    #: between the two commits): those are not written again
    rejects_done: Mapping[str, int] = field(default_factory=dict)
    verify: bool = True


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one task wrote."""

    #: (path, rows) of the topic's data files
    files: tuple[tuple[str, int], ...]
    #: (path, rows) of the ``_rejects`` files
    reject_files: tuple[tuple[str, int], ...]
    #: records read, and of them rejected (including rejects committed before)
    records: int
    rejected: int

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.files)


def run_write_task(task: WriteTask) -> WriteResult:
    """Run one task (on an executor); see the module docstring."""
    batches = list(read_blocks(task.bucket.open(), task.slices, verify=task.verify))
    table = pa.Table.from_batches(batches, schema=SCHEMA)
    table = table.append_column("date", pc.cast(table.column("timestamp"), pa.date32()))
    records = table.num_rows
    rejected = 0
    reject_files: list[tuple[str, int]] = []
    if task.json_schema is not None:
        decoder = decoder_for(task.json_schema, task.json_schema_text)
        decoded = decoder.decode(table.column("value").combine_chunks())
        base = table.drop_columns(["value"])
        good = base.take(pa.array(decoded.accepted)) if len(decoded.rejected) else base
        for i, f in enumerate(decoder.schema):
            good = good.append_column(f, decoded.table.column(i))
        rejected = len(decoded.rejected)
        if rejected:
            assert task.rejects_dir is not None
            bad = table.take(pa.array(decoded.rejected))
            bad = bad.append_column("reason", pa.array(decoded.reasons, pa.string()))
            bad = bad.select(list(REJECT_COLUMNS))
            bad = _after(bad, task.rejects_done)
            reject_files = _write_partitioned(bad, Path(task.rejects_dir), task)
        table = good
    files = _write_partitioned(table, Path(task.out_dir), task)
    return WriteResult(tuple(files), tuple(reject_files), records, rejected)


def _after(table: pa.Table, done: Mapping[str, int]) -> pa.Table:
    """The rows not committed already: ``log_seq`` above the region's ``done`` seq."""
    if not done or table.num_rows == 0:
        return table
    regions = table.column("region").to_numpy(zero_copy_only=False)
    limits = np.array([done.get(str(r), 0) for r in regions], dtype=np.int64)
    keep = table.column("log_seq").to_numpy() > limits
    return table.filter(pa.array(keep))


def _write_partitioned(table: pa.Table, root: Path, task: WriteTask) -> list[tuple[str, int]]:
    """One Parquet file per ``(date, region)`` of ``table`` under ``root``; (path, rows) each."""
    if table.num_rows == 0:
        return []
    date_dir, region_dir = PARTITION_DIRS[task.iceberg]
    groups = table.group_by(["date", "region"], use_threads=False).aggregate([])
    out: list[tuple[str, int]] = []
    for date, region in zip(
        groups.column("date").to_pylist(), groups.column("region").to_pylist(), strict=True
    ):
        part = table
        if groups.num_rows > 1:
            mask = pc.and_(
                pc.equal(table.column("date"), pa.scalar(date, pa.date32())),
                pc.equal(table.column("region"), region),
            )
            part = table.filter(mask)
        if not task.iceberg:
            part = part.drop_columns(["date", "region"])
        folder = root / f"{date_dir}={date.isoformat()}" / f"{region_dir}={region}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"part-{task.index:05d}-{uuid.uuid4().hex[:12]}.zstd.parquet"
        _write_file(part, path)
        out.append((str(path), part.num_rows))
    return out


def _write_file(table: pa.Table, path: Path) -> None:
    # written under a temporary name: a file with its final name is complete
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(
        table,
        tmp,
        compression="zstd",
        coerce_timestamps="us",
        use_deprecated_int96_timestamps=False,
        row_group_size=1 << 20,
    )
    os.replace(tmp, path)


def staged_files(root: Path) -> set[str]:
    """Every file under a staging folder (to delete what no successful task reported)."""
    return {str(p) for p in root.rglob("*") if p.is_file()} if root.is_dir() else set()


__all__ = ["BASE_COLUMNS", "WriteResult", "WriteTask", "run_write_task", "staged_files"]
