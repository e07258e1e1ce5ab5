"""Compaction: rewrite the small data files of an Iceberg table's partitions into larger ones.

Each run of the job adds at least one file per (date, region) it touched, so
a table fed every few minutes collects many small files. ``compact`` finds
partitions with at least ``min_files`` files smaller than ``target_bytes``,
cuts each partition's small files (in log order) into groups of up to
``target_bytes`` together, and rewrites each group as one file in one
Iceberg commit (the group's files out, the new file in). Large files are
left alone, and the rewrite streams row groups through a
:class:`~._task.ParquetSink`, so its memory does not grow with the
partition. Readers see the old files or the new one, with the same rows,
in the same order. The job's positions live in table properties, which a
rewrite leaves as they are.

The new files go to ``data/run-<id>/`` like a run's, with the id in the
snapshot summary: a compaction killed before its commit leaves a folder
that the next job deletes.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: snapshot summary property naming the partition a compaction rewrote
COMPACTED = "edgegw.compacted"


@dataclass(frozen=True, slots=True)
class CompactResult:
    table: str
    partitions: int
    files_before: int
    files_after: int
    rows: int


def compact_table(
    table: Any,
    *,
    target_bytes: int = 128 * 1024 * 1024,
    min_files: int = 2,
    progress: Callable[[str], None] = lambda _msg: None,
) -> CompactResult:
    """Compact one pyiceberg table (see the module docstring)."""
    import pyarrow.parquet as pq

    from edge_gateway.pipeline.tables import RUN_ID

    name = ".".join(table.name()) if callable(getattr(table, "name", None)) else str(table)
    spec_fields = [table.schema().find_field(f.source_id).name for f in table.spec().fields]
    if not spec_fields:
        return CompactResult(name, 0, 0, 0, 0)
    small: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for task in table.scan().plan_files():
        f = task.file
        if f.file_size_in_bytes < target_bytes:
            small[tuple(f.partition[i] for i in range(len(spec_fields)))].append(f)
    todo = {p: files for p, files in small.items() if len(files) >= min_files}
    run_id = f"compact-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    data_dir = Path(table.location().removeprefix("file://")) / "data" / f"run-{run_id}"
    before = after = rows = 0
    for values in sorted(todo, key=str):
        files = sorted(todo[values], key=lambda f: (_first_seq(pq, f), f.file_path))
        # the partition folders of the job's files (pdate=…/pregion=…), under this run
        folder = data_dir.joinpath(
            *Path(_local(files[0].file_path)).parts[-1 - len(spec_fields) : -1]
        )
        for group in _groups(files, target_bytes):
            written = _rewrite(pq, group, folder)
            _commit(table, group, written, {RUN_ID: run_id, COMPACTED: "/".join(map(str, values))})
            before += len(group)
            after += 1
            rows += sum(f.record_count for f in group)
            progress(f"{name} {values}: {len(group)} files -> 1")
    return CompactResult(name, len(todo), before, after, rows)


def _first_seq(pq: Any, data_file: Any) -> int:
    """The lowest ``log_seq`` of a file, from its footer (files in log order)."""
    meta = pq.ParquetFile(_local(data_file.file_path)).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    if "log_seq" not in names or meta.num_row_groups == 0:
        return 0
    stats = meta.row_group(0).column(names.index("log_seq")).statistics
    return int(stats.min) if stats is not None and stats.has_min_max else 0


def _groups(files: list[Any], target_bytes: int) -> list[list[Any]]:
    """Consecutive files in groups of at most ``target_bytes``; groups of one are left out."""
    groups: list[list[Any]] = [[]]
    size = 0
    for f in files:
        if groups[-1] and size + f.file_size_in_bytes > target_bytes:
            groups.append([])
            size = 0
        groups[-1].append(f)
        size += f.file_size_in_bytes
    return [g for g in groups if len(g) > 1]


def _rewrite(pq: Any, group: list[Any], folder: Path) -> Path:
    """The rows of ``group`` (in order) as one new Parquet file in ``folder``."""
    import pyarrow as pa

    from edge_gateway.pipeline._task import ParquetSink

    schema = pq.read_schema(_local(group[0].file_path)).remove_metadata()
    sink = ParquetSink(folder / f"compacted-{uuid.uuid4().hex[:12]}.zstd.parquet", schema)
    try:
        for f in group:
            for batch in pq.ParquetFile(_local(f.file_path)).iter_batches(batch_size=65_536):
                part = pa.Table.from_batches([batch])
                sink.add(part if part.schema.equals(schema) else part.cast(schema))
        sink.close()
    except BaseException:
        sink.abort()
        raise
    return sink.path


def _commit(table: Any, group: list[Any], written: Path, summary: dict[str, str]) -> None:
    """One snapshot: the group's files out, the rewritten file in."""
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    with table.transaction() as tx:
        new_file = parquet_file_to_data_file(table.io, tx.table_metadata, f"file://{written}")
        with tx.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
            for f in group:
                overwrite.delete_data_file(f)
            overwrite.append_data_file(new_file)


def _local(path: str) -> str:
    return path.removeprefix("file://")
