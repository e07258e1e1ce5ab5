"""Tailer configuration."""

from __future__ import annotations

from dataclasses import dataclass

from edge_gateway.errors import ConfigError
from edge_gateway.format import logobject
from edge_gateway.mirror._plan import GapPolicy

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class TailerConfig:
    """Settings of one tailer; every field has a default fit for a small gateway."""

    #: Idle polling starts at this interval after new data ...
    poll_interval_s: float = 0.1
    #: ... and backs off (doubling) while nothing new comes, up to this bound.
    max_poll_interval_s: float = 5.0
    #: Polls after new data that stay at ``poll_interval_s`` before backing
    #: off: about a source's flush interval (250-800 ms) at the default, so a
    #: source that ships steadily is never polled at a backed-off rate.
    poll_hold: int = 8
    #: ``fail``: stop this source when data it needs is gone; ``skip``: continue
    #: after the gap, recording its exact range.
    gap_policy: GapPolicy = GapPolicy.FAIL
    #: Backoff while the bucket (or the journal's disk budget) is unavailable.
    retry_base_s: float = 0.1
    retry_cap_s: float = 30.0
    #: Backoff between attempts at a quarantined (corrupt) entry.
    quarantine_retry_base_s: float = 1.0
    #: 30 s, not minutes: a corrupt object at a writer's next seq is replaced by
    #: its writer as soon as it ships again (docs/protocol.md, "set aside"), also
    #: after hours down; one ranged GET per 30 s while quarantined costs nothing.
    quarantine_retry_cap_s: float = 30.0
    #: While idle, re-read the source's GC boundary this often (deleted
    #: entries look like "nothing new" otherwise).
    gap_check_interval_s: float = 60.0
    #: At least this many entries behind: plan from manifests and prefetch.
    catch_up_threshold: int = 16
    #: Look at the manifests (one LIST) at most this often while following.
    catch_up_check_interval_s: float = 30.0
    #: Catch-up: objects fetched ahead of the one being applied ...
    prefetch_objects: int = 8
    #: ... and the bytes they may hold (fetched plus decompressed); one
    #: larger object is still fetched, alone.
    prefetch_bytes: int = 64 * MiB
    #: Catching up from manifests, read the source's packs (one GET for many
    #: small entries, ``format/pack.py``) instead of each entry's object.
    packs: bool = True
    #: A pack larger than this (as listed) is not read: its entries are GET alone.
    pack_max_bytes: int = 64 * MiB
    #: Entries with nothing to append record progress in the journal at
    #: least every this many entries (and whenever the tailer goes idle).
    progress_every: int = 64
    #: Publish ``regions/<source>/cursors/<reader>.json`` this often (0: never).
    cursor_interval_s: float = 10.0
    #: Ranged-read planning (see ``logobject.plan_ranges``).
    coalesce_gap: int = logobject.DEFAULT_COALESCE_GAP
    whole_object_fraction: float = logobject.DEFAULT_WHOLE_OBJECT_FRACTION
    #: Blocks larger than this (raw bytes per entry) are decoded in a worker
    #: thread: zstd and CRC-32C release the GIL, so the entries fetched ahead
    #: decode in parallel, off the event loop that applies them (profiled: at
    #: 1 MiB, a catch-up of ~0.6 MB entries decoded them all on the loop). A
    #: small entry of a following tailer is cheaper to decode in place.
    decode_in_thread_bytes: int = 64 * 1024
    #: Keep each fetched block of a subscribed partition as one journal block
    #: entry, as shipped (checked, opened if sealed, never decompressed:
    #: docs/at-rest.md, "The block entry"); False: decompress it and append
    #: each batch (the path before, and still the one for an entry resumed
    #: inside a block).
    keep_blocks: bool = True
    #: While a head relay is active (:meth:`Tailer.set_relay`), an idle tailer
    #: waits for relayed heads instead of polling; it still polls this often
    #: as a safety net (0: never).
    relay_safety_poll_s: float = 300.0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "gap_policy", GapPolicy(self.gap_policy))
        except ValueError:
            raise ConfigError(
                f"mirror.gap_policy: {self.gap_policy!r} is not one of fail, skip"
            ) from None
        positive = (
            "poll_interval_s",
            "max_poll_interval_s",
            "retry_base_s",
            "retry_cap_s",
            "quarantine_retry_base_s",
            "quarantine_retry_cap_s",
            "gap_check_interval_s",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"mirror.{name} must be > 0")
        if self.max_poll_interval_s < self.poll_interval_s:
            raise ConfigError("mirror.max_poll_interval_s must be >= mirror.poll_interval_s")
        if self.catch_up_check_interval_s < 0 or self.cursor_interval_s < 0:
            raise ConfigError("mirror intervals must be >= 0")
        if self.poll_hold < 0:
            raise ConfigError("mirror.poll_hold must be >= 0")
        for name in ("catch_up_threshold", "prefetch_objects", "progress_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"mirror.{name} must be >= 1")
        if self.prefetch_bytes < 64 * 1024:
            raise ConfigError("mirror.prefetch_bytes must be at least 64 KiB")
        if self.coalesce_gap < 0 or not 0.0 <= self.whole_object_fraction <= 1.0:
            raise ConfigError("mirror.coalesce_gap >= 0 and whole_object_fraction in 0..1")
        if self.relay_safety_poll_s < 0:
            raise ConfigError("mirror.relay_safety_poll_s must be >= 0 (0: never)")
        if self.decode_in_thread_bytes < 0:
            raise ConfigError("mirror.decode_in_thread_bytes must be >= 0")
