"""Journal configuration."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from edge_gateway.errors import ConfigError
from edge_gateway.journal._lane import Priority

MiB = 1024 * 1024
GiB = 1024 * MiB
#: The index cache keeps at least 8 pages (4 KiB each, counted with their overhead).
INDEX_CACHE_MIN_BYTES = 8 * (4096 + 320)
#: ``journal.at_rest``: sealed segments rewritten compressed, or left as they are.
AT_REST_MODES = ("compressed", "off")


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|min|m|h|d)?")
_UNIT_S = {"ms": 0.001, "s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, key: str) -> float | None:
    """Seconds of a duration: ``24h``, ``90min``, ``30s``, ``500ms`` (None: ``0``, ``off``)."""
    value = text.strip().lower()
    if value in ("0", "off"):
        return None
    m = _DURATION.fullmatch(value)
    if m is None or m.group(2) is None:
        raise ConfigError(
            f'{key}: {text!r} is not a duration (a number and a unit: ms, s, min, h, d; or "off")'
        )
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    return seconds if seconds > 0 else None


class FsyncPolicy(enum.StrEnum):
    """When appended entries are forced to stable storage.

    * ``always``: an append returns after an fsync covering it; concurrent
      appenders share one fsync (group commit).
    * ``interval`` (default): an append returns once the entry is written to
      the OS (it survives a crash of the process); an fsync follows within
      ``fsync_interval_ms`` or after ``fsync_bytes`` unsynced bytes.
    * ``never``: the OS decides (fsync only on segment roll and close).
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class JournalConfig:
    """Settings of one journal; every field has a default fit for a small gateway."""

    fsync: FsyncPolicy = FsyncPolicy.INTERVAL
    fsync_interval_ms: float = 5.0
    fsync_bytes: int = 4 * MiB
    #: Segment files roll over at this size.
    segment_bytes: int = 64 * MiB
    #: Disk budget for segments and their index files; appends beyond it fail
    #: with ``JournalFull`` unless shipped segments can be deleted.
    max_bytes: int = 4 * GiB
    #: Shipped segments are kept for local readers at least this long ...
    retention_ms: int = 24 * 3600 * 1000
    #: ... unless the journal grows beyond this many bytes (default: half the budget).
    retention_bytes: int | None = None
    #: Run fsync on the event-loop thread instead of a worker thread. The
    #: default (None) does so for ``always``, where every appender waits for
    #: the fsync anyway and a thread hand-off would add ~0.2 ms to each ack
    #: (measured by bench/journal.py); ``interval`` fsyncs in a worker
    #: thread so appends go on while the disk flushes.
    inline_fsync: bool | None = None
    #: Preallocate the active segment (``segment_bytes``) and copy entries of
    #: up to 16 KiB into a shared memory map of it: a memcpy instead of a write
    #: system call (~1 us less per append here; larger entries, and all of
    #: them while an fdatasync runs, use pwrite into the preallocated space).
    #: The data reaches the same page cache, so a crash of the process loses
    #: nothing acknowledged, and fsync covers it as usual. Turn it off on
    #: copy-on-write filesystems (btrfs, ZFS), where writing into
    #: preallocated space can still run out of disk, which a memory map can
    #: only report as a fatal SIGBUS. See docs/journal.md, "The append path".
    preallocate: bool = True
    #: Size of the reserve file (``space.reserve`` in the journal directory)
    #: kept for a full disk: when everything shipped is in the active
    #: segment and the disk has no room for the next one, the journal deletes
    #: this file to seal that segment early, so it can then be deleted (an
    #: "emergency ballast", as CockroachDB keeps). 0 turns it off. Not
    #: counted in ``max_bytes``. See docs/journal.md, "Disk full".
    reserve_bytes: int = 1 * MiB
    #: RAM for pages of sealed segments' index files (an LRU; read with pread).
    #: Sealed segments keep only a summary in memory and look entries up in
    #: their index files through this cache; see docs/journal.md, "Memory",
    #: for the bound on the journal's index memory.
    index_cache_bytes: int = 1 * MiB
    #: RAM for decompressed frames of compressed sealed segments (an LRU of
    #: whole frames, 256 KiB each by default; a frame larger than this is
    #: served but not kept); see docs/at-rest.md, "The frame cache".
    block_cache_bytes: int = 32 * MiB
    #: Bytes of ``max_bytes`` guaranteed to a priority's lane, that other
    #: lanes cannot take (``{ critical = "256MiB" }``); see docs/journal.md, "Lanes".
    reserve: dict[str, int] = field(default_factory=dict)
    #: One full pass of the background scrub over every lane's sealed segments
    #: takes about this long (``"24h"``; ``"off"`` or ``"0"``: no scrub); see
    #: docs/operations.md, "A damaged disk".
    scrub_interval: str = "24h"
    #: ``"compressed"``: a background task rewrites sealed segments as compressed
    #: segments (docs/at-rest.md; ``max_bytes`` then holds ~10x the records);
    #: ``"off"``: sealed segments stay entry logs (compressed ones still read).
    at_rest: str = "compressed"
    #: zstd level of that rewrite (1-22; off the ack path, see docs/at-rest.md).
    at_rest_level: int = 3

    def __post_init__(self) -> None:
        if self.at_rest not in AT_REST_MODES:
            raise ConfigError(
                f"journal.at_rest: {self.at_rest!r} is not one of {', '.join(AT_REST_MODES)}"
            )
        if type(self.at_rest_level) is not int or not 1 <= self.at_rest_level <= 22:
            raise ConfigError(
                f"journal.at_rest_level: {self.at_rest_level!r} is not a zstd level (1-22)"
            )
        parse_duration(self.scrub_interval, "journal.scrub_interval")
        try:
            object.__setattr__(self, "fsync", FsyncPolicy(self.fsync))
        except ValueError:
            raise ConfigError(
                f"journal.fsync: {self.fsync!r} is not one of always, interval, never"
            ) from None
        if self.fsync_interval_ms <= 0:
            raise ConfigError("journal.fsync_interval_ms must be > 0")
        if self.fsync_bytes <= 0:
            raise ConfigError("journal.fsync_bytes must be > 0")
        if self.segment_bytes < 64 * 1024:
            raise ConfigError("journal.segment_bytes must be at least 64 KiB")
        if self.max_bytes < 2 * self.segment_bytes:
            raise ConfigError(
                f"journal.max_bytes ({self.max_bytes}) must be at least twice "
                f"journal.segment_bytes ({self.segment_bytes})"
            )
        if self.retention_ms < 0:
            raise ConfigError("journal.retention_ms must be >= 0")
        if self.reserve_bytes < 0:
            raise ConfigError("journal.reserve_bytes must be >= 0")
        if self.index_cache_bytes < 0:
            raise ConfigError("journal.index_cache_bytes must be >= 0")
        if self.block_cache_bytes < 0:
            raise ConfigError("journal.block_cache_bytes must be >= 0")
        if self.retention_bytes is not None and self.retention_bytes < 0:
            raise ConfigError("journal.retention_bytes must be >= 0")
        reserve: dict[str, int] = {}
        for key, size in self.reserve.items():
            priority = Priority.parse(key, "journal.reserve")
            if type(size) is not int or size < 0:
                raise ConfigError(f"journal.reserve.{key}: must be a size >= 0, not {size!r}")
            reserve[priority.value] = size
        object.__setattr__(self, "reserve", reserve)
        # Every lane needs room for an active segment beyond what the others reserve.
        if sum(reserve.values()) > self.max_bytes - 2 * self.segment_bytes:
            raise ConfigError(
                f"journal.reserve: {sum(reserve.values())} bytes reserved leave less than "
                f"two segments ({2 * self.segment_bytes}) of journal.max_bytes ({self.max_bytes}) "
                "to share"
            )

    def reserved(self, priority: Priority) -> int:
        """Bytes of the budget reserved for ``priority``'s lane (0: none)."""
        return self.reserve.get(priority.value, 0)

    @property
    def compress_at_rest(self) -> bool:
        """Sealed segments are rewritten compressed (``journal.at_rest``)."""
        return self.at_rest == "compressed"

    @property
    def scrub_interval_s(self) -> float | None:
        """Seconds of a full scrub pass (None: the scrub is off)."""
        return parse_duration(self.scrub_interval, "journal.scrub_interval")

    @property
    def fsync_inline(self) -> bool:
        if self.inline_fsync is None:
            return self.fsync is FsyncPolicy.ALWAYS
        return self.inline_fsync

    def index_memory_bound(self, segments: int, partitions: int) -> int:
        """Bytes of RAM the journal's read index stays under (docs/journal.md, "Memory").

        For a journal of ``segments`` segment files and ``partitions``
        partitions: the active segment's index (24 bytes per entry, an entry
        is at least 97 bytes, arrays over-allocate: 0.3 x segment_bytes), per
        segment a summary (1.5 KiB, and 48 bytes per partition with entries
        in it), per partition 1.5 KiB, and the index cache. (tracemalloc: a
        sealed segment's objects take ~1.1 KiB, a partition's ~1 KiB.) Index files that a
        full disk kept from being written are held in memory on top of this
        (24 bytes per entry of those segments) until they are written.
        """
        cache = max(self.index_cache_bytes, INDEX_CACHE_MIN_BYTES)
        return (
            self.segment_bytes * 3 // 10
            + segments * (1536 + 48 * partitions)
            + partitions * 1536
            + cache
        )

    @property
    def effective_retention_bytes(self) -> int:
        return self.max_bytes // 2 if self.retention_bytes is None else self.retention_bytes
