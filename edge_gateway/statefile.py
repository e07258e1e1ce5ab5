"""Damaged state files: copied to ``<data_dir>/quarantine/``, rebuilt, reported.

A gateway keeps a few small state files in its data dir (the producers'
registry, the auto-created topics, the link's usage, the routing cache; see
docs/operations.md, "A damaged disk"). An SD card that rots can return any of
them truncated, with a flipped byte, as a page of zeros or as JSON of the
wrong shape. The module that owns a file decides what its loss means: it
rebuilds the file from what the journal, the bucket or the metadata server
hold, or it refuses to start with one line naming the file. Either way the
damage is never silent: :meth:`StateFiles.damaged` copies the bytes found to
``quarantine/<name>.<UTC time>`` (kept: a person may want to read them),
logs a WARNING naming the file, the reason and what was done, and keeps a
record that ``edgegw status`` and the metric
``edgegw_state_files_damaged_total{file}`` show.

A JSON state file carries its own checksum (:func:`seal`, :func:`unseal`):
a ``crc32c`` field over the document's canonical form, so a flipped byte
that leaves valid JSON (a digit, a letter of a name) is found too. The field
is optional on reading: a file written before it opens as it is, and older
gateways ignore the field (docs/format.md, "State files").

This module imports nothing of edgegw above :mod:`edge_gateway.durable`
(besides the error tree and the CRC function), so every owner of a state
file may use it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_gateway._crc import crc32c
from edge_gateway.durable import replace_file, sync_directory
from edge_gateway.errors import CorruptData
from edge_gateway.failpoints import fail_point

__all__ = [
    "CHECKSUM_FIELD",
    "QUARANTINE_DIR",
    "STATE_FILES",
    "DamagedStateFile",
    "StateFiles",
    "quarantine",
    "seal",
    "unseal",
]

log = logging.getLogger("edgegw.state")

#: Under the data dir: where copies of damaged state files are kept.
QUARANTINE_DIR = "quarantine"
#: The state files rebuilt when damaged (each a label of the metric, 0 until found).
STATE_FILES = ("link-usage.json", "producers.json", "routing.json", "topics.json")
#: The checksum's field in a sealed JSON state file.
CHECKSUM_FIELD = "crc32c"


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()


def seal(doc: dict[str, Any]) -> bytes:
    """``doc`` as JSON bytes with a ``crc32c`` field over its canonical form."""
    body = {k: v for k, v in doc.items() if k != CHECKSUM_FIELD}
    return _canonical({**body, CHECKSUM_FIELD: crc32c(_canonical(body))})


def unseal(data: bytes, *, where: str, legacy_keys: frozenset[str]) -> dict[str, Any]:
    """The JSON object in ``data``, its ``crc32c`` checked (then removed).

    :class:`CorruptData` when it is not JSON, not an object, or the checksum
    does not match. A document without the field is one written before it
    existed: accepted when its keys are among ``legacy_keys`` (the old form's),
    so that a flipped byte in the field's own name is not taken for the old
    form. The caller checks the fields.
    """
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CorruptData(f"not JSON: {exc}", where=where) from None
    if not isinstance(doc, dict):
        raise CorruptData("not a JSON object", where=where)
    if CHECKSUM_FIELD not in doc:
        if not doc.keys() <= legacy_keys:
            raise CorruptData(
                f"no checksum and unknown fields {sorted(doc.keys() - legacy_keys)}", where=where
            )
        return doc
    stored = doc.pop(CHECKSUM_FIELD)
    try:
        actual = crc32c(_canonical(doc))
    except ValueError:  # NaN or infinity: never written by seal
        raise CorruptData("not a state document", where=where) from None
    if stored != actual:
        raise CorruptData(f"checksum mismatch (stored {stored!r}, computed {actual})", where=where)
    return doc


@dataclass(frozen=True, slots=True)
class DamagedStateFile:
    """One damaged state file found (at start, in this run)."""

    #: The file's name (``producers.json``): the metric's label.
    file: str
    #: Where it was.
    path: str
    #: The copy of its bytes in quarantine/ (None: it could not be copied; the log says why).
    quarantined: str | None
    #: What was wrong with it.
    reason: str
    #: What the gateway did instead (``rebuilt from the journal``...).
    action: str
    #: When it was found (ms since the epoch).
    found_ms: int

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "path": self.path,
            "quarantined": self.quarantined,
            "reason": self.reason,
            "action": self.action,
            "found_ms": self.found_ms,
        }


def quarantine(path: Path, data_dir: Path, *, now: float | None = None) -> Path:
    """Copy ``path`` to ``<data_dir>/quarantine/<name>.<UTC time>`` (durably); the copy's path.

    A copy, not a rename: the damaged file stays where it is until its owner
    has written the rebuilt one over it (or removed it), so a crash between
    the two finds the damage again at the next start instead of a missing
    file, which for some files means "nothing was ever issued".
    ``OSError`` if it cannot be read or copied.
    """
    data = path.read_bytes()
    qdir = data_dir / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = qdir / f"{path.name}.{stamp}"
    n = 1
    while target.exists():  # twice in one second: keep both
        target = qdir / f"{path.name}.{stamp}.{n}"
        n += 1
    replace_file(target, data)
    return target


class StateFiles:
    """The damaged state files of one gateway's data dir, as found in this run.

    Owned by the gateway and handed to each owner of a state file; read by
    ``edgegw status`` and the metrics (:meth:`statistics`). Thread-safe: the
    owners load their files in worker threads too.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._damaged: list[DamagedStateFile] = []
        self._lock = threading.Lock()

    def damaged(
        self, path: Path, reason: str, action: str, *, remove: bool = True
    ) -> DamagedStateFile:
        """Report ``path`` as damaged: copied to quarantine, logged at WARNING, recorded.

        ``action`` says what the gateway does instead (it is in the log line
        and in ``edgegw status``). ``remove``: then delete ``path`` (for a
        file whose absence means the same as its rebuild); False leaves it for
        the owner to write the rebuilt file over it.
        """
        try:
            copy: str | None = str(quarantine(path, self.data_dir))
        except FileNotFoundError:
            copy = None
        except OSError as exc:
            log.error("state file %s: cannot copy it to %s/: %s", path, QUARANTINE_DIR, exc)
            copy = None
        # A crash here (a fail point for the tests) must find the damage again.
        fail_point("statefile.quarantined")
        if remove and copy is not None:
            path.unlink(missing_ok=True)
            sync_directory(path.parent)
        record = DamagedStateFile(
            file=path.name,
            path=str(path),
            quarantined=copy,
            reason=reason,
            action=action,
            found_ms=int(time.time() * 1000),
        )
        with self._lock:
            self._damaged.append(record)
        log.warning(
            "damaged state file %s (%s): %s; the damaged bytes are in %s",
            path,
            reason,
            action,
            copy or "(not copied)",
        )
        return record

    def statistics(self) -> tuple[DamagedStateFile, ...]:
        """Every damaged state file found in this run, in the order found."""
        with self._lock:
            return tuple(self._damaged)
