"""``edgegw metadata migrate``: copy a metadata database into a new one (SQLite to PostgreSQL).

Everything the server keeps is copied as stored: regions with their token
hashes (current and, during a rotation, previous), topics, bucket
locations, the routing version and the admin token's hash. So after the
move every region token and the admin token still work, and a gateway's
cached table (its ETag, the routing version) is still current: its next
poll is a 304. Heads are not copied: gateways report them again after their
next commit and in every heartbeat.

The target must hold no region, topic or bucket location yet: a migration
never merges two fleets. The copy is one transaction on the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edge_gateway.errors import ConfigError
from edge_gateway.metadata._db import SqlStore

__all__ = ["MigrationReport", "migrate_database"]


@dataclass(frozen=True, slots=True)
class MigrationReport:
    source: str
    target: str
    regions: int
    topics: int
    buckets: int
    routing_version: int


def migrate_database(source: Path | str, target: Path | str) -> MigrationReport:
    """Copy the metadata database ``source`` into ``target`` (created and migrated)."""
    from edge_gateway.metadata.server import open_database

    if isinstance(source, Path) and not source.is_file():
        raise ConfigError(f"{source}: no such metadata database")
    src: SqlStore = open_database(source)
    try:
        rows = src.dump()
        dst = open_database(target)
        try:
            dst.load(rows)
            table = dst.routing()
            return MigrationReport(
                src.describe(),
                dst.describe(),
                regions=len(rows["regions"]),
                topics=len(table.topics),
                buckets=len(table.buckets),
                routing_version=table.version,
            )
        finally:
            dst.close()
    finally:
        src.close()
