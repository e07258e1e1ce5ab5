"""One Spark task of a pipeline run: log-object slices of one topic into Parquet files.

The job plans on the driver, then runs one task per group of slices on the
executors (``sparkContext.parallelize(tasks).map(run_write_task)``). A task
fetches and checks its blocks (:func:`._arrow.read_blocks`) and works
through them in chunks of about :data:`CHUNK_BYTES` of values: adds the
``date`` column (UTC), decodes JSON values if the topic has a schema
(:mod:`._json`), and hands the rows to one Parquet writer per
``(date, region)`` in the run's staging folder, for the topic's table and,
for values that do not decode, for ``_rejects``. Its memory is bounded by
one chunk plus the row-group buffers, however much it reads. It returns what
it wrote; nothing is visible until the driver commits the files of every
task with the new positions.

Why the tasks write Parquet with Arrow instead of handing rows to Spark's
writer: the records are already Arrow columns in the Python worker; moving
them into the JVM, parsing JSON there with ``from_json`` and writing from
the JVM made the job 0.35x as fast as Spark's own JSON-lines job, this way
2-2.9x (``docs/pipeline.md``, "Performance"). The files are the Parquet a
Spark write makes (timestamps as ``TIMESTAMP_MICROS``, zstd), and Spark,
pyiceberg and any Parquet reader read them.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from edge_gateway.encryption import keyring_from_files
from edge_gateway.pipeline._arrow import SCHEMA, from_numpy, read_blocks
from edge_gateway.pipeline._json import JsonDecoder, decoder_for
from edge_gateway.pipeline.bucketspec import BucketSpec
from edge_gateway.pipeline.plan import ObjectSlice

#: the column a task adds: the UTC date of ``timestamp`` (the tables' first partition column)
DATE: Final = pa.field("date", pa.date32())
#: the columns of a topic's table before the JSON fields (``value`` only without JSON)
BASE_COLUMNS: Final = (*SCHEMA.names, DATE.name)
#: the columns of ``_rejects``
REJECT_SCHEMA: Final = pa.schema(
    [
        *(SCHEMA.field(n) for n in ("region", "topic", "partition", "offset", "timestamp")),
        DATE,
        *(SCHEMA.field(n) for n in ("key", "value")),
        pa.field("reason", pa.string()),
        SCHEMA.field("log_seq"),
    ]
)
#: a task reads, decodes and writes its blocks in chunks of about this many bytes of values
CHUNK_BYTES: Final = 8 * 1024 * 1024
#: rows per Parquet row group (DuckDB's default size; Arrow buffers them uncompressed)
ROW_GROUP_ROWS: Final = 122_880
#: rows of a file's first row group that decide which columns are dictionary-encoded
_DICTIONARY_SAMPLE: Final = 8192
#: rows a task buffers across all its files before writing the fullest one early
MAX_BUFFERED_ROWS: Final = 4 * ROW_GROUP_ROWS
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
    #: (region, key file) of every key the slices may need: executors read the
    #: files (at the same paths) so that keys never travel in the task itself
    key_files: tuple[tuple[str, str], ...] = ()


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
    #: CPU time of the task (user + system, its own process)
    cpu_seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.files)


def run_write_task(task: WriteTask) -> WriteResult:
    """Run one task (on an executor); see the module docstring."""
    started = time.process_time()
    decoder = decoder_for(task.json_schema, task.json_schema_text) if task.json_schema else None
    out = _PartitionWriter(Path(task.out_dir), _table_schema(decoder), task)
    rejects = (
        _PartitionWriter(Path(task.rejects_dir), REJECT_SCHEMA, task)
        if task.rejects_dir is not None and decoder is not None
        else None
    )
    records = rejected = 0
    try:
        keyring = keyring_from_files(task.key_files) if task.key_files else None
        blocks = read_blocks(task.bucket.shared(), task.slices, verify=task.verify, keyring=keyring)
        for chunk in _chunks(blocks):
            table = pa.Table.from_batches(chunk, schema=SCHEMA)
            table = table.append_column(DATE, pc.cast(table.column("timestamp"), DATE.type))
            records += table.num_rows
            if decoder is not None:
                decoded = decoder.decode(table.column("value").combine_chunks())
                if len(decoded.rejected):
                    assert rejects is not None
                    rejected += len(decoded.rejected)
                    bad = table.take(from_numpy(decoded.rejected))
                    bad = bad.append_column("reason", pa.array(decoded.reasons, pa.string()))
                    rejects.add(_after(bad.select(REJECT_SCHEMA.names), task.rejects_done))
                    table = table.take(from_numpy(decoded.accepted))
                table = table.drop_columns(["value"])
                for i, f in enumerate(decoder.schema):
                    table = table.append_column(f, decoded.table.column(i))
            out.add(table)
        files = out.close()
        reject_files = rejects.close() if rejects is not None else []
    except BaseException:
        out.abort()
        if rejects is not None:
            rejects.abort()
        raise
    return WriteResult(
        tuple(files), tuple(reject_files), records, rejected, time.process_time() - started
    )


def _table_schema(decoder: JsonDecoder | None) -> pa.Schema:
    """The columns a task writes for its topic's table (before dropping partition columns).

    With a JSON schema, its fields replace ``value`` (even a schema of no fields).
    """
    if decoder is None:
        return pa.schema([*SCHEMA, DATE])
    base = [f for f in SCHEMA if f.name != "value"]
    return pa.schema([*base, DATE, *decoder.schema])


def _chunks(batches: Iterable[pa.RecordBatch]) -> Iterator[list[pa.RecordBatch]]:
    """Consecutive blocks grouped into chunks of about :data:`CHUNK_BYTES` of values."""
    chunk: list[pa.RecordBatch] = []
    size = 0
    for b in batches:
        chunk.append(b)
        size += b.column("value").nbytes
        if size >= CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _after(table: pa.Table, done: Mapping[str, int]) -> pa.Table:
    """The rows not committed already: ``log_seq`` above the region's ``done`` seq."""
    if not done or table.num_rows == 0:
        return table
    regions = table.column("region").to_numpy(zero_copy_only=False)
    limits = np.array([done.get(str(r), 0) for r in regions], dtype=np.int64)
    keep = table.column("log_seq").to_numpy() > limits
    return table.take(from_numpy(np.flatnonzero(keep)))


class ParquetSink:
    """One Parquet file written as rows come, in row groups of :data:`ROW_GROUP_ROWS`.

    The file is written under a temporary name (``.<name>.tmp``) and renamed
    by :meth:`close`: a file with its final name is complete. Its first rows
    decide which columns are dictionary-encoded (:func:`_repetitive`). Used
    by the write tasks (one per ``(date, region)``) and by compaction.
    """

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self.rows = 0
        self.buffered = 0
        self._tmp = path.with_name(f".{path.name}.tmp")
        self._buffer: list[pa.Table] = []
        self._writer: pq.ParquetWriter | None = None

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._buffer.append(table)
        self.buffered += table.num_rows
        if self.buffered >= ROW_GROUP_ROWS:
            self.flush(whole_groups=True)

    def flush(self, *, whole_groups: bool = False) -> None:
        """Write the buffered rows; only whole row groups if ``whole_groups``."""
        if not self._buffer:
            return
        table = pa.concat_tables(self._buffer)
        self._buffer, self.buffered = [], 0
        if whole_groups:
            cut = table.num_rows - table.num_rows % ROW_GROUP_ROWS
            if cut < table.num_rows:
                self._buffer, self.buffered = [table.slice(cut)], table.num_rows - cut
                table = table.slice(0, cut)
        if table.num_rows == 0:
            return
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(
                self._tmp,
                self.schema,
                compression="zstd",
                use_dictionary=_repetitive(table),
                coerce_timestamps="us",
                use_deprecated_int96_timestamps=False,
            )
        self._writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        self.rows += table.num_rows

    def close(self) -> int:
        """Write what is buffered, close and rename the file; the rows it holds."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            os.replace(self._tmp, self.path)
        return self.rows

    def abort(self) -> None:
        """Close and delete the file if it was not renamed yet (a failed task)."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        self._tmp.unlink(missing_ok=True)


class _PartitionWriter:
    """One :class:`ParquetSink` per ``(date, region)`` under ``root``, written as the rows come.

    A task's memory stays bounded however much it reads: its sinks hold at
    most :data:`MAX_BUFFERED_ROWS` rows between them (past that, the fullest
    buffer is written as a shorter row group).
    """

    def __init__(self, root: Path, schema: pa.Schema, task: WriteTask) -> None:
        self._root = root
        self._task = task
        self._dirs = PARTITION_DIRS[task.iceberg]
        self._file_schema = (
            schema
            if task.iceberg
            else pa.schema([f for f in schema if f.name not in ("date", "region")])
        )
        self._sinks: dict[tuple[datetime.date, str], ParquetSink] = {}

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        for key, part in _split(table):
            if not self._task.iceberg:
                part = part.drop_columns(["date", "region"])
            sink = self._sinks.get(key)
            if sink is None:
                sink = self._sinks[key] = ParquetSink(self._path(key), self._file_schema)
            sink.add(part)
        while sum(s.buffered for s in self._sinks.values()) > MAX_BUFFERED_ROWS:
            max(self._sinks.values(), key=lambda s: s.buffered).flush()

    def _path(self, key: tuple[datetime.date, str]) -> Path:
        date, region = key
        folder = self._root / f"{self._dirs[0]}={date.isoformat()}" / f"{self._dirs[1]}={region}"
        return folder / f"part-{self._task.index:05d}-{uuid.uuid4().hex[:12]}.zstd.parquet"

    def close(self) -> list[tuple[str, int]]:
        """Close every file; (path, rows) of each."""
        out = [(str(sink.path), sink.close()) for sink in self._sinks.values()]
        self._sinks.clear()
        return out

    def abort(self) -> None:
        """Delete the files not renamed yet (a failed task)."""
        for sink in self._sinks.values():
            sink.abort()
        self._sinks.clear()


def _repetitive(table: pa.Table) -> list[str]:
    """The columns worth dictionary-encoding: at most half their values distinct.

    Decided once per file from its first rows, like parquet-mr's
    fallback from dictionary encoding: a dictionary of mostly unique values
    (offsets, timestamps, counters) costs time to build and makes the file
    bigger (measured: 2.4x bigger, 1.5x slower to write for the bench's rows).
    """
    sample = table.slice(0, _DICTIONARY_SAMPLE)
    out = []
    for name, column in zip(sample.column_names, sample.columns, strict=True):
        if pa.types.is_nested(column.type):
            continue
        if pc.count_distinct(column, mode="all").as_py() * 2 <= sample.num_rows:
            out.append(name)
    return out


def _split(table: pa.Table) -> Iterator[tuple[tuple[datetime.date, str], pa.Table]]:
    """``table``'s rows by ``(date, region)``; no copy when it holds one of them."""
    dates, regions = table.column("date"), table.column("region")
    lo, hi = pc.min_max(dates).values()
    if lo == hi and pc.count_distinct(regions).as_py() == 1:
        yield (lo.as_py(), regions[0].as_py()), table
        return
    # not Table.group_by: its first call imports pyarrow.dataset, and that imports pandas
    for date in pc.unique(dates):
        on_date = pc.equal(dates, date)
        for region in pc.unique(regions):
            mask = pc.and_(on_date, pc.equal(regions, region))
            if pc.any(mask).as_py():
                yield (date.as_py(), region.as_py()), table.filter(mask)


def staged_files(root: Path) -> set[str]:
    """Every file under a staging folder (to delete what no successful task reported)."""
    return {str(p) for p in root.rglob("*") if p.is_file()} if root.is_dir() else set()


__all__ = [
    "BASE_COLUMNS",
    "ParquetSink",
    "WriteResult",
    "WriteTask",
    "run_write_task",
    "staged_files",
]
