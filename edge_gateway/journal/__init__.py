"""The local write-ahead journal (see ``docs/journal.md``)."""

from typing import TYPE_CHECKING

from edge_gateway._lazy import lazy_attributes
from edge_gateway.format.entry import Entry, SourceCoords
from edge_gateway.journal._config import FsyncPolicy, JournalConfig
from edge_gateway.journal._journal import (
    Appended,
    Journal,
    JournalStats,
    MirrorBatch,
    OffsetOutOfRange,
    open_journal,
)
from edge_gateway.journal._lane import DRAIN_ORDER, MAIN_LANE, Lane, OnFull, Priority
from edge_gateway.journal._reads import ReadBuffers

if TYPE_CHECKING:
    from edge_gateway.journal._verify import FileCheck, VerifyReport, verify_journal

__all__ = [
    "DRAIN_ORDER",
    "MAIN_LANE",
    "Appended",
    "Entry",
    "FileCheck",
    "FsyncPolicy",
    "Journal",
    "JournalConfig",
    "JournalStats",
    "Lane",
    "MirrorBatch",
    "OffsetOutOfRange",
    "OnFull",
    "Priority",
    "ReadBuffers",
    "SourceCoords",
    "VerifyReport",
    "open_journal",
    "verify_journal",
]

# The verifier (and the compressed-segment decoders it uses) loads when a tool asks for it:
# a gateway never does.
__getattr__ = lazy_attributes(
    __name__,
    dict.fromkeys(("FileCheck", "VerifyReport", "verify_journal"), "edge_gateway.journal._verify"),
)
