"""Where the job's output goes: Apache Iceberg tables (pyiceberg) or plain Parquet directories.

Both keep the job's **committed position** — the last log seq of each region
read into the table — in the same atomic step as the data:

* **Iceberg**: one catalog commit (a transaction) adds the run's data files
  and sets the table property ``edgegw.positions`` (JSON ``{region: seq}``;
  the snapshot summary records it too, with the run id). The SQL catalog on
  SQLite is the embedded default, a REST catalog URL the production choice.
* **Parquet** (Iceberg off): the run's files are written under
  ``<table>/_staging/run-<id>/``; the commit is a marker
  ``<table>/_committed/<n>.json`` (written to a temporary name, fsynced,
  renamed) that lists the files and the positions, after which the files are
  moved to their ``date=…/region=…`` folders. A marker whose files are still
  staged is finished by the next run. Readers that go through Spark or
  pyarrow skip ``_``-prefixed folders, so they never see uncommitted files.

Files of a run that never committed (a crash, kill -9) are deleted by the
next run; they were never part of a table.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from edge_gateway.durable import replace_file
from edge_gateway.errors import ConfigError, InvalidInput

POSITIONS: Final = "edgegw.positions"
RUN_ID: Final = "edgegw.run-id"
JSON_SCHEMA: Final = "edgegw.json-schema"
PARTITION_COLUMNS: Final = ("date", "region")
REJECTS: Final = "_rejects"


def _dump(positions: Mapping[str, Any]) -> str:
    return json.dumps(dict(sorted(positions.items())), sort_keys=True, separators=(",", ":"))


@contextlib.contextmanager
def warehouse_lock(warehouse: Path) -> Iterator[None]:
    """One job at a time per warehouse (an ``flock``; released even on kill -9)."""
    warehouse.mkdir(parents=True, exist_ok=True)
    fd = os.open(warehouse / ".edgegw-pipeline.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InvalidInput(f"another pipeline job is running on {warehouse}") from None
        yield
    finally:
        os.close(fd)


class Table(Protocol):
    """A topic's output table as the job sees it."""

    name: str

    @property
    def exists(self) -> bool: ...

    def positions(self) -> dict[str, Any]:
        """The committed positions (``{region: seq}``; nested per topic for ``_rejects``)."""
        ...

    def properties(self) -> dict[str, str]: ...

    def staging_dir(self, run_id: str) -> Path:
        """Where a run writes its files before the commit."""
        ...

    def clean_uncommitted(self, keep: str | None = None) -> int:
        """Delete staged files of runs that never committed; returns how many runs."""
        ...

    def commit(
        self, run_id: str, files: list[Path], positions: Mapping[str, Any], props: Mapping[str, str]
    ) -> None:
        """Add ``files`` and set ``positions`` atomically."""
        ...

    def data_files(self) -> list[str]:
        """The data files of the current table state."""
        ...


# --------------------------------------------------------------------------
# Iceberg


@contextlib.contextmanager
def open_catalog(warehouse: Path, catalog_uri: str | None, name: str = "edgegw") -> Iterator[Any]:
    """The SQL catalog on SQLite in the warehouse by default; a REST catalog for ``http(s)://``.

    A context manager: leaving it closes the catalog (the SQL catalog's
    connection pool, the REST catalog's HTTP session), so a process that runs
    the job again and again holds no database connection between runs.
    """
    catalog = _new_catalog(warehouse, catalog_uri, name)
    try:
        yield catalog
    finally:
        catalog.close()


def _new_catalog(warehouse: Path, catalog_uri: str | None, name: str) -> Any:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse.mkdir(parents=True, exist_ok=True)
    uri = catalog_uri or f"sqlite:///{warehouse / 'catalog.db'}"
    if uri.startswith(("http://", "https://")):
        return load_catalog(name, type="rest", uri=uri, warehouse=f"file://{warehouse}")
    if not uri.startswith(("sqlite:", "postgresql", "mysql")):
        raise ConfigError(f"catalog: {uri!r} is neither a SQLAlchemy URL nor a REST URL")
    return SqlCatalog(name, uri=uri, warehouse=f"file://{warehouse}")


def _local(path: str) -> Path:
    return Path(path.removeprefix("file://"))


class IcebergTable:
    def __init__(self, catalog: Any, namespace: str, name: str, warehouse: Path) -> None:
        self.catalog = catalog
        self.namespace = namespace
        self.name = name
        self.identifier = (namespace, name)
        self.location = warehouse / namespace / name
        self._table: Any = None
        self.reload()

    def reload(self) -> None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            self._table = self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            self._table = None

    @property
    def exists(self) -> bool:
        return self._table is not None

    @property
    def table(self) -> Any:
        return self._table

    def properties(self) -> dict[str, str]:
        return dict(self._table.properties) if self._table is not None else {}

    def positions(self) -> dict[str, Any]:
        raw = self.properties().get(POSITIONS)
        return dict(json.loads(raw)) if raw else {}

    def staging_dir(self, run_id: str) -> Path:
        return self.location / "data" / f"run-{run_id}"

    def _committed_runs(self) -> set[str]:
        if self._table is None:
            return set()
        return {
            s.summary[RUN_ID]
            for s in self._table.snapshots()
            if s.summary is not None and RUN_ID in s.summary.additional_properties
        }

    def clean_uncommitted(self, keep: str | None = None) -> int:
        data = self.location / "data"
        if not data.is_dir():
            return 0
        committed = self._committed_runs()
        candidates = [
            d
            for d in data.iterdir()
            if d.is_dir()
            and d.name.startswith("run-")
            and d.name.removeprefix("run-") not in committed | {keep}
        ]
        if not candidates:
            return 0
        # A run no snapshot names crashed before its commit -- or committed, and its
        # snapshot was expired since (standard Iceberg maintenance): its files are
        # still in the table. Only folders with no file in the table are deleted.
        live = {Path(p.removeprefix("file://")) for p in self.data_files()}
        live_dirs = {parent for f in live for parent in f.parents}
        removed = 0
        for d in candidates:
            if d not in live_dirs:
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
        return removed

    def _create(self, files: list[Path], props: Mapping[str, str]) -> None:
        import pyarrow.parquet as pq
        from pyiceberg.exceptions import NamespaceAlreadyExistsError

        with contextlib.suppress(NamespaceAlreadyExistsError):
            self.catalog.create_namespace(self.namespace)
        schema = pq.read_schema(files[0]).remove_metadata()
        self._table = self.catalog.create_table(
            self.identifier,
            schema=schema,
            location=f"file://{self.location}",
            properties={"format-version": "2", **props},
        )

    def _ensure_spec(self) -> None:
        # created, then partitioned: a crash in between leaves a table this completes
        names = {f.name for f in self._table.schema().fields}
        if self._table.spec().fields or not set(PARTITION_COLUMNS) <= names:
            return
        with self._table.update_spec() as spec:
            for column in PARTITION_COLUMNS:
                spec.add_identity(column)

    def commit(
        self, run_id: str, files: list[Path], positions: Mapping[str, Any], props: Mapping[str, str]
    ) -> None:
        if self._table is None:
            if not files:
                return  # nothing to create a table from; positions stay at 0
            self._create(files, props)
        self._ensure_spec()
        position_doc = _dump(positions)
        tx = self._table.transaction()
        if files:
            tx.add_files(
                [f"file://{p}" for p in files],
                snapshot_properties={RUN_ID: run_id, POSITIONS: position_doc},
                check_duplicate_files=False,
            )
        tx.set_properties({**props, POSITIONS: position_doc})
        self._table = tx.commit_transaction()

    def data_files(self) -> list[str]:
        if self._table is None:
            return []
        return [t.file.file_path for t in self._table.scan().plan_files()]


# --------------------------------------------------------------------------
# plain Parquet


class ParquetTable:
    def __init__(self, warehouse: Path, name: str) -> None:
        self.name = name
        self.location = warehouse / name
        self.markers = self.location / "_committed"
        self.staging = self.location / "_staging"

    @property
    def exists(self) -> bool:
        return self.markers.is_dir() and any(self.markers.glob("*.json"))

    def _markers(self) -> list[dict[str, Any]]:
        if not self.markers.is_dir():
            return []
        docs = []
        for path in sorted(self.markers.glob("*.json"), key=lambda p: int(p.stem)):
            docs.append(json.loads(path.read_text()))
        return docs

    def properties(self) -> dict[str, str]:
        docs = self._markers()
        return dict(docs[-1]["properties"]) if docs else {}

    def positions(self) -> dict[str, Any]:
        docs = self._markers()
        return dict(docs[-1]["positions"]) if docs else {}

    def staging_dir(self, run_id: str) -> Path:
        return self.staging / f"run-{run_id}"

    def _finish(self, doc: Mapping[str, Any]) -> None:
        for staged, final in doc["files"]:
            src, dst = self.location / staged, self.location / final
            if src.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)

    def clean_uncommitted(self, keep: str | None = None) -> int:
        docs = self._markers()
        for doc in docs:
            self._finish(doc)  # a commit interrupted while moving its files
        committed = {doc["run_id"] for doc in docs}
        removed = 0
        if self.staging.is_dir():
            for d in self.staging.iterdir():
                run = d.name.removeprefix("run-")
                if run != keep:
                    shutil.rmtree(d, ignore_errors=True)
                    removed += run not in committed
        return removed

    def commit(
        self, run_id: str, files: list[Path], positions: Mapping[str, Any], props: Mapping[str, str]
    ) -> None:
        staged_root = self.staging_dir(run_id)
        moves = []
        for f in files:
            # staged as <staging>/run-<id>/date=…/region=…/<file>: moved to date=…/region=…/<file>
            moves.append([str(f.relative_to(self.location)), str(f.relative_to(staged_root))])
        docs = self._markers()
        n = len(docs) + 1
        doc = {
            "run_id": run_id,
            "files": moves,
            "positions": dict(positions),
            "properties": {**(docs[-1]["properties"] if docs else {}), **props},
        }
        self.markers.mkdir(parents=True, exist_ok=True)
        replace_file(self.markers / f"{n}.json", json.dumps(doc).encode())
        self._finish(doc)

    def data_files(self) -> list[str]:
        return [str(self.location / final) for doc in self._markers() for _, final in doc["files"]]


@dataclass(frozen=True, slots=True)
class Output:
    """Where tables live: the warehouse directory and, for Iceberg, the catalog."""

    warehouse: Path
    iceberg: bool = True
    catalog_uri: str | None = None
    namespace: str = "edgegw"

    @contextlib.contextmanager
    def open(self) -> Iterator[Any]:
        """The catalog (None for Parquet), closed on leaving."""
        if not self.iceberg:
            yield None
            return
        with open_catalog(self.warehouse, self.catalog_uri) as catalog:
            yield catalog

    def table(self, catalog: Any, name: str) -> Table:
        if self.iceberg:
            return IcebergTable(catalog, self.namespace, name, self.warehouse)
        return ParquetTable(self.warehouse, name)
