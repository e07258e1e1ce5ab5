"""Home-side bucket GC: delete a region's old log entries once every subscriber has them.

The gateway that owns a region runs :func:`collect_garbage` for its own log
now and then (say every few minutes). Rules, in whole manifests (each
manifest covers a contiguous run of entries; consecutive manifests cover
consecutive runs):

* a manifest and its entries may go when the manifest is older than
  ``retention_ms`` (entries are older than the manifest that covers them)
  **and** every subscriber's cursor has passed its last seq — or when it is
  older than ``age_cap_ms``, whatever the cursors say (a reader gone for
  longer than that meets a gap, handled by its gap policy);
* deletion runs from the oldest manifest and stops at the first that may
  not go; the newest manifest is never deleted, so the log keeps one that
  covers its oldest remaining entry (and the cumulative next offsets a
  restoring writer needs);
* before deleting anything, the GC boundary (``gc-boundary.json``,
  ``highest_deleted_seq``) is advanced with a compare-and-swap, so a writer
  that stalled past GC cannot re-create a deleted seq unnoticed, and readers
  tell "deleted" from "not written yet";
* log entries are deleted first and their manifest last: a GC that crashes
  half-way leaves the manifest, and the next run deletes the rest.

The decision is sans-IO (:func:`plan_gc`); :func:`collect_garbage` does the
bucket calls.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import trio

from edge_gateway.bucket import Bucket, NotFound, PreconditionFailed
from edge_gateway.errors import ConfigError, CorruptData, Unavailable
from edge_gateway.format.manifest import (
    Manifest,
    gc_boundary_key,
    log_key,
    manifest_prefix,
    parse_manifest_key,
)
from edge_gateway.mirror.cursor import read_cursors
from edge_gateway.names import validate_region
from edge_gateway.regionlog import encode_gc_boundary, read_gc_boundary

log = logging.getLogger("edgegw.gc")

HOUR_MS: Final = 3600 * 1000
DAY_MS: Final = 24 * HOUR_MS


@dataclass(frozen=True, slots=True)
class GcConfig:
    """When a region's log entries may be deleted."""

    #: Nothing younger than this is deleted, mirrored or not.
    retention_ms: int = HOUR_MS
    #: Anything older than this is deleted even if a subscriber has not mirrored it.
    age_cap_ms: int = 7 * DAY_MS
    #: Deletes in flight at once.
    concurrency: int = 8
    #: Attempts at the boundary's compare-and-swap against a concurrent GC.
    cas_attempts: int = 5

    def __post_init__(self) -> None:
        if self.retention_ms < 0:
            raise ConfigError("gc.retention_ms must be >= 0")
        if self.age_cap_ms < self.retention_ms:
            raise ConfigError("gc.age_cap_ms must be >= gc.retention_ms")
        if self.concurrency < 1 or self.cas_attempts < 1:
            raise ConfigError("gc.concurrency and gc.cas_attempts must be >= 1")


@dataclass(frozen=True, slots=True)
class ManifestAge:
    """A manifest as GC sees it: the last seq it covers and when it was written."""

    last_seq: int
    key: str
    modified_ms: int


@dataclass(frozen=True, slots=True)
class GcPlan:
    """What :func:`plan_gc` decided."""

    #: The new ``highest_deleted_seq`` (unchanged if nothing may go).
    boundary: int
    #: Manifests to delete (after their entries), oldest first.
    manifests: tuple[ManifestAge, ...]
    #: Readers whose unmirrored entries the age cap deletes anyway.
    overridden: tuple[str, ...] = ()
    #: Why deletion stopped where it did.
    stopped_by: str = ""


def plan_gc(
    manifests: Sequence[ManifestAge],
    cursors: Mapping[str, int],
    *,
    boundary: int,
    now_ms: int,
    config: GcConfig,
) -> GcPlan:
    """Decide how far to delete, from the manifests (sorted by seq) and the readers' cursors.

    ``cursors`` maps each subscriber to the seq it mirrored through (0:
    nothing, or no cursor yet).
    """
    ordered = sorted(manifests, key=lambda m: m.last_seq)
    chosen: list[ManifestAge] = []
    overridden: set[str] = set()
    new_boundary = boundary
    stopped = "the newest manifest is always kept"
    for m in ordered[:-1]:
        age = now_ms - m.modified_ms
        if age < config.retention_ms:
            stopped = f"manifest ..{m.last_seq} is younger than the retention"
            break
        behind = sorted(r for r, through in cursors.items() if through < m.last_seq)
        if behind and age < config.age_cap_ms:
            stopped = f"readers {behind} have not mirrored through seq {m.last_seq}"
            break
        overridden.update(behind)
        chosen.append(m)
        new_boundary = max(new_boundary, m.last_seq)
    return GcPlan(new_boundary, tuple(chosen), tuple(sorted(overridden)), stopped)


@dataclass(frozen=True, slots=True)
class GcResult:
    """What one :func:`collect_garbage` run did."""

    boundary_before: int
    boundary_after: int
    deleted_entries: int
    deleted_manifests: int
    overridden: tuple[str, ...] = ()
    stopped_by: str = ""
    cursors: dict[str, int] = field(default_factory=dict)


async def collect_garbage(
    bucket: Bucket,
    region: str,
    subscribers: Iterable[str] | None,
    config: GcConfig | None = None,
    *,
    prefix: str = "",
    now_ms: int | None = None,
) -> GcResult:
    """Delete the region's log entries and manifests that the rules allow (see module doc).

    ``subscribers`` are the regions that mirror this one (from the routing
    table); ``None`` takes every reader that published a cursor. A
    subscriber without a cursor blocks deletion (until the age cap).
    Raises ``BucketUnavailable`` when the bucket is away (nothing is lost:
    run again later) and :class:`CorruptData` for a malformed boundary or
    cursor (GC then does nothing rather than guess).
    """
    config = config or GcConfig()
    validate_region(region)
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    cursors = {
        r: (c.through_seq if c is not None else 0)
        for r, c in (await read_cursors(bucket, prefix, region, subscribers)).items()
    }
    folder = manifest_prefix(prefix, region)
    ages: list[ManifestAge] = []
    for info in await bucket.list(folder):
        try:
            _, last_seq = parse_manifest_key(info.key, prefix)
        except CorruptData:
            continue
        ages.append(ManifestAge(last_seq, info.key, int(info.last_modified.timestamp() * 1000)))
    boundary = await read_gc_boundary(bucket, prefix, region)
    plan = plan_gc(ages, cursors, boundary=boundary, now_ms=now, config=config)
    if not plan.manifests:
        return GcResult(boundary, boundary, 0, 0, (), plan.stopped_by, cursors)
    if plan.overridden:
        log.warning(
            "gc %s: deleting through seq %d although %s have not mirrored it (age cap %d ms)",
            region,
            plan.boundary,
            ", ".join(plan.overridden),
            config.age_cap_ms,
        )
    # The first entry to delete: the oldest manifest's first seq (leftovers
    # of an interrupted run below it are deleted too: from the old boundary).
    first_doc = await _manifest(bucket, plan.manifests[0].key, region)
    start = min(first_doc.first_seq, boundary + 1)
    await _advance_boundary(bucket, prefix, region, plan.boundary, config.cas_attempts)
    deleted = 0
    limiter = trio.CapacityLimiter(config.concurrency)
    lo = start
    for m in plan.manifests:
        keys = [log_key(prefix, region, s) for s in range(lo, m.last_seq + 1)]
        await _delete_all(bucket, keys, limiter)
        deleted += len(keys)
        await bucket.delete(m.key)  # last: it records what remains to delete
        lo = m.last_seq + 1
    log.info(
        "gc %s: deleted entries %d..%d and %d manifests (boundary %d -> %d)",
        region,
        start,
        plan.boundary,
        len(plan.manifests),
        boundary,
        plan.boundary,
    )
    return GcResult(
        boundary,
        plan.boundary,
        deleted,
        len(plan.manifests),
        plan.overridden,
        plan.stopped_by,
        cursors,
    )


async def _manifest(bucket: Bucket, key: str, region: str) -> Manifest:
    res = await bucket.get(key)
    return Manifest.decode(res.data, where=key, region=region)


async def _advance_boundary(
    bucket: Bucket, prefix: str, region: str, boundary: int, attempts: int
) -> None:
    """Raise ``highest_deleted_seq`` to ``boundary`` (compare-and-swap; never lowers it)."""
    key = gc_boundary_key(prefix, region)
    for _ in range(attempts):
        try:
            current = await bucket.get(key)
        except NotFound:
            try:
                await bucket.put(key, encode_gc_boundary(boundary), if_none_match=True)
            except PreconditionFailed:
                continue  # another GC created it first: look again
            return
        if _parse_boundary(current.data, key) >= boundary:
            return
        try:
            await bucket.put(key, encode_gc_boundary(boundary), if_match=current.etag)
        except (PreconditionFailed, NotFound):
            continue
        return
    raise Unavailable(f"gc {region}: the GC boundary kept changing under {attempts} attempts")


def _parse_boundary(data: bytes, key: str) -> int:
    """``highest_deleted_seq`` of a boundary document (the format ``regionlog`` reads)."""
    try:
        doc = json.loads(data)
        value = doc["highest_deleted_seq"]
        if doc.get("version") != 1 or type(value) is not int or value < 0:
            raise ValueError("bad document")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CorruptData(f"malformed GC boundary: {exc}", where=key) from None
    return value


async def _delete_all(bucket: Bucket, keys: Sequence[str], limiter: trio.CapacityLimiter) -> None:
    """Delete ``keys`` concurrently; every delete is tried, then the first error is raised."""
    errors: list[Exception] = []

    async def one(key: str) -> None:
        async with limiter:
            try:
                await bucket.delete(key)
            except Exception as exc:  # noqa: BLE001 - raised below, after the others ran
                errors.append(exc)

    async with trio.open_nursery() as nursery:
        for key in keys:
            nursery.start_soon(one, key)
    if errors:
        raise errors[0]
