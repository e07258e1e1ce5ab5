"""The local write-ahead journal (see ``docs/journal.md``).

This module is the journal package's public face: the gateway, the shipper and
the CLI import from here, never from the private modules. ``Lanes`` is what the
gateway and the shipper hold (one :class:`Journal` per lane); ``Drop`` and
``DroppedRange`` are what a ``drop-oldest`` lane deleted unshipped.
"""

from typing import TYPE_CHECKING

from edge_gateway._lazy import lazy_attributes
from edge_gateway.format.entry import Entry, SourceCoords
from edge_gateway.journal._chunks import ChunkSpan, StoredChunk
from edge_gateway.journal._config import FsyncPolicy, JournalConfig
from edge_gateway.journal._dropped import Drop, DroppedRange
from edge_gateway.journal._journal import (
    Appended,
    Journal,
    JournalStats,
    MirrorBatch,
    MirrorBlock,
    OffsetOutOfRange,
    open_journal,
)
from edge_gateway.journal._lane import (
    DRAIN_ORDER,
    MAIN_LANE,
    Lane,
    OnFull,
    Priority,
    lane_by_id,
    lane_path,
    lanes_on_disk,
)
from edge_gateway.journal._lanes import LaneAppended, Lanes, open_lanes
from edge_gateway.journal._lost_repaired import later_repairs
from edge_gateway.journal._mirror_repair import MirroredObject, MirrorSource
from edge_gateway.journal._quarantine import Loss, LostRange
from edge_gateway.journal._reads import ReadBuffers
from edge_gateway.journal._repair import Repaired, RepairedRange, RepairSource, ShippedObject
from edge_gateway.journal._scrub import Scrubber, ScrubFinding, ScrubStats, scrub_rate

if TYPE_CHECKING:
    from edge_gateway.journal._compress import (
        Compressed,
        Expanded,
        compress_sealed_segment,
        expand_journal,
    )
    from edge_gateway.journal._held import HeldLane, HeldRange
    from edge_gateway.journal._verify import FileCheck, VerifyReport, verify_journal

__all__ = [
    "DRAIN_ORDER",
    "MAIN_LANE",
    "Appended",
    "ChunkSpan",
    "Compressed",
    "Drop",
    "Expanded",
    "LostRange",
    "Loss",
    "DroppedRange",
    "Entry",
    "FileCheck",
    "FsyncPolicy",
    "HeldLane",
    "HeldRange",
    "Journal",
    "JournalConfig",
    "JournalStats",
    "Lane",
    "LaneAppended",
    "Lanes",
    "MirrorBatch",
    "MirrorBlock",
    "MirrorSource",
    "MirroredObject",
    "OffsetOutOfRange",
    "OnFull",
    "Priority",
    "ReadBuffers",
    "RepairSource",
    "Repaired",
    "RepairedRange",
    "ScrubFinding",
    "ScrubStats",
    "Scrubber",
    "ShippedObject",
    "SourceCoords",
    "StoredChunk",
    "VerifyReport",
    "compress_sealed_segment",
    "expand_journal",
    "lane_by_id",
    "later_repairs",
    "lane_path",
    "lanes_on_disk",
    "open_journal",
    "open_lanes",
    "scrub_rate",
    "verify_journal",
]

# The verifier's shell, the offline compressor and the read-only reader of held entries
# (edgegw bucket verify) load when a tool asks for them (the
# gateway's scrub imports only the verifier's pure checks, from the same module).
__getattr__ = lazy_attributes(
    __name__,
    {
        **dict.fromkeys(
            ("FileCheck", "VerifyReport", "verify_journal"), "edge_gateway.journal._verify"
        ),
        **dict.fromkeys(
            ("Compressed", "Expanded", "compress_sealed_segment", "expand_journal"),
            "edge_gateway.journal._compress",
        ),
        **dict.fromkeys(("HeldLane", "HeldRange"), "edge_gateway.journal._held"),
    },
)
