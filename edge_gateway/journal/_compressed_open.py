"""At open: a sealed compressed segment whose directory does not read, rebuilt from the bucket.

Issue 45 leftovers. An open loads a sealed compressed segment (``EGWC``)
from its directory alone (``_open._load_compressed``); a directory whose CRC
fails used to stop the open. With a repair source (the gateway's) and the
bucket holding the segment, :func:`repair_at_open` makes the live repair's
copy (``_live_repair.prepare_repair``: the segment's checkpoint kept, every
later LSN rebuilt from the bucket, ``_compressed_repair.py``), bounded by
the next segment (its base LSN ends the range, its checkpoint says where
each partition stood, its first entry's append time is the rebuilt entries'
-- never earlier than a lost entry's), and renames it over the segment: the
open then scans it as an entry log and builds its index. Otherwise the open
stops as before, naming the file; nothing was changed (the copy is deleted).
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from edge_gateway.errors import CorruptData, EdgeGatewayError
from edge_gateway.journal import _fs
from edge_gateway.journal._fs import fsync_dir
from edge_gateway.journal._live_repair import NotRepaired, prepare_repair
from edge_gateway.journal._repair import Repaired, RepairSource
from edge_gateway.journal._segment import first_entry_after

__all__ = ["repair_at_open"]

log = logging.getLogger("edgegw.journal")


def _next_segment(path: Path, base: int) -> tuple[int, int] | None:
    """The next segment's base LSN and its first entry's append time (None: no next
    segment, or its first entry does not read)."""
    try:
        found = first_entry_after(path, base)
    except (OSError, CorruptData):
        return None
    if found is None:
        return None
    nxt, first = found
    return int(nxt.stem), first.append_time


def repair_at_open(
    path: Path, base: int, source: RepairSource | None, known: list[Repaired], exc: CorruptData
) -> bool:
    """Rebuild sealed compressed segment ``path`` (whose directory did not read:
    ``exc``) from the bucket into an entry log at ``path``; True if done. Blocking."""
    if source is None:
        return False
    nxt = _next_segment(path, base)
    if nxt is None:
        return False
    end = (nxt[0], nxt[1] if nxt[1] > 0 else time.time_ns() // 1_000_000)
    try:
        prepared = prepare_repair(path, base, source, known, end=end)
    except (NotRepaired, EdgeGatewayError, OSError) as err:
        reason = err.reason if isinstance(err, NotRepaired | CorruptData) else str(err)
        log.warning(
            "journal: %s does not open (%s) and was not rebuilt from the bucket (%s)",
            path,
            exc.reason,
            reason,
        )
        return False
    if prepared is None:
        return False
    _fs.ops.replace(prepared.tmp, path)
    fsync_dir(path.parent)
    with contextlib.suppress(FileNotFoundError):
        _fs.ops.unlink(path.with_suffix(".idx"))
    log.warning(
        "journal: %s did not open (%s): rebuilt from the bucket (LSN %d-%d); it is an "
        "entry log again",
        path,
        exc.reason,
        base + 1,
        end[0] - 1,
    )
    return True
