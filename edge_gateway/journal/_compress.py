"""Rewriting sealed segments of a closed journal compressed, and back (offline).

``compress_sealed_segment`` is the atomic swap of docs/at-rest.md ("The atomic
swap of a rewritten segment") for a journal that no process has open: it
takes the journal directory's lock for the whole rewrite, so a running
gateway makes it fail (``InUse``) instead of swapping a file under it. The
background rewriter of a live journal (``_rewriter.py``) runs the same steps
through the same functions (``write_compressed``, ``fsync_dir``), with the
swap of the in-memory segment between the rename and the directory's fsync.

``expand_journal`` is the way back, for a downgrade to a gateway from before
compressed segments (docs/operations.md, upgrade order): every compressed
segment of every lane becomes the entry log it replaced, byte for byte
(``expand_segment``), with the same atomic steps; every lane's lock is held
throughout, so it refuses (``InUse``) while a gateway runs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge_gateway.datadir import lock_directory
from edge_gateway.errors import InvalidInput, UnsupportedFormat
from edge_gateway.format import atrest
from edge_gateway.format import entry as fentry
from edge_gateway.journal import _fs
from edge_gateway.journal._lane import lane_path, lanes_on_disk
from edge_gateway.journal._rewriter import expand_file, fsync_dir, write_compressed
from edge_gateway.journal._segment import INDEX_SUFFIX, SEGMENT_SUFFIX, segment_name


@dataclass(frozen=True, slots=True)
class Compressed:
    """What :func:`compress_sealed_segment` did: the file and its sizes before and after."""

    path: Path
    wal_bytes: int
    compressed_bytes: int


def compress_sealed_segment(
    journal_dir: str | os.PathLike[str],
    base_lsn: int,
    *,
    level: int = 3,
    frame_raw_bytes: int = atrest.DEFAULT_FRAME_RAW_BYTES,
    chunk_raw_bytes: int = atrest.DEFAULT_CHUNK_RAW_BYTES,
) -> Compressed:
    """Rewrite the sealed segment ``<base_lsn>.wal`` of a CLOSED journal as a compressed one.

    Only for a journal no process has open (the directory's lock is held
    throughout; ``InUse`` otherwise); a live journal has its ``Rewriter``.
    Never the last segment (the one a journal appends to). Steps:
    write ``<lsn>.wal.z-tmp`` (``iter_compressed``), fsync it, verify it
    (``expand_segment`` of the file read back equals the segment, byte for
    byte), rename it over ``<lsn>.wal``, fsync the directory, unlink
    ``<lsn>.idx``. A crash at any step leaves a journal the next open reads:
    it deletes a ``.z-tmp`` and an index file beside a compressed segment.
    """
    root = Path(journal_dir)
    lock = lock_directory(root, "journal")
    try:
        path = root / segment_name(base_lsn)
        if not path.exists():
            raise InvalidInput(f"no segment {path.name} in {root}")
        later = [f for f in root.glob(f"*{SEGMENT_SUFFIX}") if f.name > path.name]
        if not later:
            raise InvalidInput(f"{path.name} is the last segment, the one the journal appends to")
        with path.open("rb") as f:
            head = f.read(fentry.SEGMENT_HEADER_SIZE)
        if head[: len(atrest.MAGIC)] == atrest.MAGIC:
            raise InvalidInput(f"{path.name} is compressed already")
        prepared = write_compressed(
            path, level=level, frame_raw_bytes=frame_raw_bytes, chunk_raw_bytes=chunk_raw_bytes
        )
        if prepared is None:
            raise UnsupportedFormat(
                f"segment version {fentry.segment_version(head)} is not compressed yet",
                where=str(path),
            )
        try:
            _fs.ops.replace(prepared.tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                _fs.ops.unlink(prepared.tmp)
            raise
        fsync_dir(root)
        with contextlib.suppress(FileNotFoundError):
            _fs.ops.unlink(path.with_suffix(INDEX_SUFFIX))
        return Compressed(path, prepared.wal_bytes, prepared.size)
    finally:
        lock.release()


@dataclass(frozen=True, slots=True)
class Expanded:
    """One compressed segment :func:`expand_journal` turned back into its entry log."""

    path: Path
    compressed_bytes: int
    wal_bytes: int


def expand_journal(
    journal_dir: str | os.PathLike[str],
    *,
    progress: Callable[[Expanded], None] | None = None,
) -> list[Expanded]:
    """Expand every compressed segment of every lane of a CLOSED journal back into entry logs.

    ``journal_dir`` is the normal lane's directory (``<data_dir>/journal``);
    the other lanes beside it are expanded too. Every lane's lock is taken
    first (``InUse`` while a gateway runs: nothing is changed then) and held
    until the end. Each file is expanded atomically (:func:`expand_file`),
    so an interrupted run leaves a journal that opens, and running it again
    expands what is left. Damage is ``CorruptData`` naming the file (the
    files before it are expanded, it and those after are not). ``progress``
    is told of each segment as it is done.
    """
    main = Path(journal_dir)
    if not main.is_dir():
        raise InvalidInput(f"no journal at {main}")
    dirs = [lane_path(main, lane) for lane in sorted(lanes_on_disk(main), key=lambda ln: ln.rank)]
    locks = []
    try:
        for d in dirs:
            locks.append(lock_directory(d, "journal"))
        done: list[Expanded] = []
        for d in dirs:
            for path in sorted(d.glob(f"*{SEGMENT_SUFFIX}")):
                with path.open("rb") as f:
                    head = f.read(len(atrest.MAGIC))
                if head != atrest.MAGIC:
                    continue
                before, after = expand_file(path)
                done.append(Expanded(path, before, after))
                if progress is not None:
                    progress(done[-1])
        return done
    finally:
        for lock in locks:
            lock.release()
