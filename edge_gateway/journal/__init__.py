"""The local write-ahead journal (see ``docs/journal.md``)."""

from edge_gateway.format.entry import Entry, SourceCoords
from edge_gateway.journal._config import FsyncPolicy, JournalConfig
from edge_gateway.journal._journal import (
    Appended,
    Journal,
    JournalStats,
    OffsetOutOfRange,
    open_journal,
)

__all__ = [
    "Appended",
    "Entry",
    "FsyncPolicy",
    "Journal",
    "JournalConfig",
    "JournalStats",
    "OffsetOutOfRange",
    "SourceCoords",
    "open_journal",
]
