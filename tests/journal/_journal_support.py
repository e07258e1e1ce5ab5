"""Helpers for the journal tests."""

from __future__ import annotations

from typing import Protocol

from edge_gateway.format.batch import Record, decode_batch
from edge_gateway.journal import Entry


class Readable(Protocol):
    """A :class:`~edge_gateway.journal.Journal` or its :class:`~edge_gateway.journal.Lanes`."""

    def first_offset(self, topic: str, partition: int) -> int: ...

    def read(
        self, topic: str, partition: int, offset: int, *, max_records: int, max_bytes: int
    ) -> list[Entry]: ...


def read_records(
    src: Readable, topic: str, partition: int, *, max_records: int = 50, max_bytes: int = 4096
) -> list[Record]:
    """Every record of a partition, read page by page (small pages: many reads)."""
    out: list[Record] = []
    offset = src.first_offset(topic, partition)
    while True:
        entries = src.read(topic, partition, offset, max_records=max_records, max_bytes=max_bytes)
        if not entries:
            return out
        for e in entries:
            for r in decode_batch(e.payload).records(offset):
                out.append(r)
                offset = r.offset + 1
