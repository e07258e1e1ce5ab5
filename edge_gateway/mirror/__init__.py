"""Mirroring: tail other regions' logs into local, read-only mirror topics (``docs/mirroring.md``).

* :class:`Tailer` follows one source region's log and appends the batches of
  the subscribed topics to the local journal as ``<source>.<topic>``, with the
  source's offsets, exactly once and in order;
* :class:`PriorityGate` orders the catch-up of several sources by priority;
* :mod:`edge_gateway.mirror.cursor` publishes how far each reader mirrored;
* :mod:`edge_gateway.mirror.log_gc` deletes what every reader has mirrored (home side).

The decisions are sans-IO in ``_plan.py`` (:class:`SourceState`), so every
rule is testable without a bucket.
"""

from edge_gateway.mirror._config import TailerConfig
from edge_gateway.mirror._plan import (
    Action,
    EntryInfo,
    EntryPlan,
    Gap,
    GapKind,
    GapPolicy,
    MirrorAppend,
    SourceGap,
    SourceState,
)
from edge_gateway.mirror._priority import PriorityGate
from edge_gateway.mirror._tailer import CatchUpResult, QuarantinedEntry, Tailer, TailerStats
from edge_gateway.mirror.cursor import Cursor

__all__ = [
    "Action",
    "CatchUpResult",
    "Cursor",
    "EntryInfo",
    "EntryPlan",
    "Gap",
    "GapKind",
    "GapPolicy",
    "MirrorAppend",
    "PriorityGate",
    "QuarantinedEntry",
    "SourceGap",
    "SourceState",
    "Tailer",
    "TailerConfig",
    "TailerStats",
]
