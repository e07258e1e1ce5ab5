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
* ages are measured on **the bucket's clock**: a manifest's age is the
  bucket's time now minus its ``LastModified``, both written by the store
  (see :mod:`edge_gateway.clock`). This machine's wall clock is never
  compared with the store's, so a device whose clock is weeks ahead deletes
  nothing early, and one years behind still deletes on time. When this
  gateway's clock is off by more than ``clock.gc_pause_skew_ms``, nothing is
  deleted at all until it is set right;
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

The boundary document also says which deletions were a loss for whom
(:class:`GcState`): ``subscribers`` maps each subscriber to the first seq
written while it was one (recorded when GC first sees it in the routing,
:func:`register_subscribers`), and ``lost`` maps a subscriber to the seqs
the age cap deleted before it mirrored them although it was subscribed when
they were written. A reader that starts on a log whose beginning is gone
takes that part of its start as a gap of its own (the gap policy applies);
the rest is an ordinary start.

The decision is sans-IO (:func:`plan_gc`); :func:`collect_garbage` does the
bucket calls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from edge_gateway.bucket import (
    Bucket,
    NotFound,
    ObjectInfo,
    PreconditionFailed,
    UnsupportedStore,
)
from edge_gateway.clock import BucketClock
from edge_gateway.errors import ConfigError, CorruptData, InvalidName, Unavailable
from edge_gateway.format.manifest import (
    Manifest,
    gc_boundary_key,
    log_key,
    manifest_prefix,
    parse_manifest_key,
)
from edge_gateway.mirror._packs import list_packs
from edge_gateway.mirror.cursor import read_cursors
from edge_gateway.names import validate_region

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
    """A manifest as GC sees it: the last seq it covers and when the bucket stored it."""

    last_seq: int
    key: str
    #: The store's ``LastModified`` (the bucket's clock), ms since the epoch.
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
    #: Per overridden reader: the seqs deleted that it was subscribed to when
    #: they were written and has not mirrored (first, last), if any.
    lost: Mapping[str, tuple[int, int]] = field(default_factory=dict)


def plan_gc(
    manifests: Sequence[ManifestAge],
    cursors: Mapping[str, int],
    *,
    boundary: int,
    now_ms: int,
    config: GcConfig,
    since: Mapping[str, int] | None = None,
) -> GcPlan:
    """Decide how far to delete, from the manifests (sorted by seq) and the readers' cursors.

    ``cursors`` maps each subscriber to the seq it mirrored through (0:
    nothing, or no cursor yet). ``now_ms`` is the bucket's time, the clock
    of the manifests' ``modified_ms``. ``since`` maps a subscriber to the
    first seq written while it was one (absent: since before the log began).
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
    lost: dict[str, tuple[int, int]] = {}
    for reader in sorted(overridden):
        first = max(cursors[reader] + 1, (since or {}).get(reader, 1), boundary + 1)
        if first <= new_boundary:
            lost[reader] = (first, new_boundary)
    return GcPlan(new_boundary, tuple(chosen), tuple(sorted(overridden)), stopped, lost)


# --------------------------------------------------------------------------
# the boundary document


#: Version of the boundary document (``bucket_log`` reads the same document).
_STATE_VERSION: Final = 1
#: A boundary document is small (a few entries per subscriber); anything larger is not one.
MAX_STATE_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class GcState:
    """``gc-boundary.json``: how far GC deleted, and what that cost whom.

    ``{"version": 1, "highest_deleted_seq": 32, "subscribers": {"south": 2},
    "lost": {"south": [2, 32]}}`` (the last two keys are optional; readers
    that know only the first two ignore them).
    """

    #: Every seq up to this one may be gone (0: nothing was ever deleted).
    highest_deleted_seq: int = 0
    #: Subscriber -> the first seq written while it was one (see :func:`register_subscribers`).
    subscribers: Mapping[str, int] = field(default_factory=dict)
    #: Subscriber -> (first, last) seqs deleted by the age cap before it
    #: mirrored them, although it was subscribed when they were written.
    lost: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "version": _STATE_VERSION,
            "highest_deleted_seq": self.highest_deleted_seq,
        }
        if self.subscribers:
            doc["subscribers"] = dict(sorted(self.subscribers.items()))
        if self.lost:
            doc["lost"] = {r: [a, b] for r, (a, b) in sorted(self.lost.items())}
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("ascii")

    @classmethod
    def decode(cls, data: bytes, *, where: str) -> GcState:
        """Parse and check a boundary document; raises only :class:`CorruptData`."""
        if len(data) > MAX_STATE_BYTES:
            raise CorruptData(f"GC boundary of {len(data)} bytes is too large", where=where)
        try:
            doc = json.loads(data)
            if type(doc) is not dict or doc.get("version") != _STATE_VERSION:
                raise ValueError("not a version 1 document")
            boundary = _seq(doc["highest_deleted_seq"], zero=True)
            subscribers = {
                validate_region(r): _seq(s) for r, s in _table(doc.get("subscribers", {})).items()
            }
            lost: dict[str, tuple[int, int]] = {}
            for r, pair in _table(doc.get("lost", {})).items():
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError(f"lost range of {r!r} is not [first, last]")
                first, last = _seq(pair[0]), _seq(pair[1])
                if first > last:
                    raise ValueError(f"lost range of {r!r} is empty")
                lost[validate_region(r)] = (first, last)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise CorruptData(f"malformed GC boundary: {exc}", where=where) from None
        except InvalidName as exc:
            raise CorruptData(f"malformed GC boundary: {exc}", where=where) from None
        return cls(boundary, subscribers, lost)


def _seq(value: object, *, zero: bool = False) -> int:
    if type(value) is not int or value < (0 if zero else 1) or value >= 2**63:
        raise ValueError(f"{value!r} is not a seq")
    return value


def _table(value: object) -> dict[str, object]:
    if type(value) is not dict:
        raise ValueError(f"{value!r} is not an object")
    return value


async def read_gc_state(bucket: Bucket, prefix: str, region: str) -> GcState:
    """The region's boundary document (an empty state when GC never wrote one)."""
    key = gc_boundary_key(prefix, region)
    try:
        res = await bucket.get(key)
    except NotFound:
        return GcState()
    return GcState.decode(res.data, where=key)


async def _update_state(
    bucket: Bucket,
    prefix: str,
    region: str,
    change: Callable[[GcState], GcState | None],
    attempts: int,
) -> GcState:
    """Apply ``change`` to the boundary document with a compare-and-swap; returns the state.

    ``change`` returns the new state, or None when there is nothing to
    write. It is applied again to what another GC wrote if that one won.
    """
    key = gc_boundary_key(prefix, region)
    for _ in range(attempts):
        try:
            current = await bucket.get(key)
        except NotFound:
            new = change(GcState())
            if new is None:
                return GcState()
            try:
                await bucket.put(key, new.encode(), if_none_match=True)
            except PreconditionFailed:
                continue  # another GC created it first: look again
            return new
        state = GcState.decode(current.data, where=key)
        new = change(state)
        if new is None:
            return state
        try:
            await bucket.put(key, new.encode(), if_match=current.etag)
        except NotFound:
            continue
        except PreconditionFailed as exc:
            # Contention, or a store that refuses compare-and-swap: read back.
            # An ETag that is still the one sent means nobody else wrote, and
            # the store refused its own current version (issue 27).
            try:
                now = await bucket.head(key)
            except NotFound:
                continue
            if _bare_etag(now.etag) == _bare_etag(current.etag):
                raise UnsupportedStore(
                    f"gc {region}: {bucket.describe()} answered 412 to a compare-and-swap of "
                    f"{key!r} whose ETag {current.etag} is the object's current one: the store "
                    "refuses If-Match on PutObject, so the GC boundary cannot advance and "
                    "nothing is deleted (the bucket grows); use a store with S3 conditional "
                    "writes (If-Match), or run `edgegw bucket check` against it"
                ) from exc
            continue
        return new
    raise Unavailable(f"gc {region}: the GC boundary kept changing under {attempts} attempts")


def _bare_etag(etag: str) -> str:
    return etag.strip('"')


def _registered(
    state: GcState, subscribers: Sequence[str] | None, first_new_seq: int
) -> GcState | None:
    """``state`` with new subscribers recorded from ``first_new_seq`` (None: no change).

    With a list of subscribers, those no longer in it are forgotten (and
    their losses with them): if one subscribes again, it does so anew.
    ``None`` (every reader with a cursor) records no one.
    """
    if subscribers is None:
        return None
    wanted = set(subscribers)
    since = {r: s for r, s in state.subscribers.items() if r in wanted}
    for r in sorted(wanted - since.keys()):
        since[r] = first_new_seq
    lost = {r: v for r, v in state.lost.items() if r in wanted}
    if since == dict(state.subscribers) and lost == dict(state.lost):
        return None
    return GcState(state.highest_deleted_seq, since, lost)


async def register_subscribers(
    bucket: Bucket,
    region: str,
    subscribers: Iterable[str] | None,
    *,
    prefix: str = "",
    head_seq: int | None = None,
    attempts: int = 5,
) -> GcState:
    """Record in the boundary document when each subscriber was first seen (home side).

    A subscriber not recorded yet gets ``head_seq + 1``: entries up to the
    log's head were written before this gateway knew it as a subscriber. The
    gateway calls this at start and GC at every run, so a subscriber added
    while the gateway runs counts from the next GC run. ``head_seq=None``
    takes the newest manifest's last seq (entries after it count as written
    while subscribed). Writes only when something changed.
    """
    validate_region(region)
    wanted = None if subscribers is None else sorted({validate_region(r) for r in subscribers})
    if head_seq is None:
        head_seq = max(
            (m.last_seq for m in await _manifests(bucket, prefix, region)),
            default=0,
        )
    first_new = head_seq + 1
    return await _update_state(
        bucket, prefix, region, lambda s: _registered(s, wanted, first_new), attempts
    )


# --------------------------------------------------------------------------
# the run


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
    #: Why nothing was deleted at all (this gateway's clock is off), or None.
    paused: str | None = None
    #: Readers that lost entries they were subscribed to (see :class:`GcState`).
    lost: dict[str, tuple[int, int]] = field(default_factory=dict)


async def collect_garbage(
    bucket: Bucket,
    region: str,
    subscribers: Iterable[str] | None,
    config: GcConfig | None = None,
    *,
    prefix: str = "",
    now_ms: int | None = None,
    clock: BucketClock | None = None,
    head_seq: int | None = None,
) -> GcResult:
    """Delete the region's log entries and manifests that the rules allow (see module doc).

    ``subscribers`` are the regions that mirror this one (from the routing
    table); ``None`` takes every reader that published a cursor. A
    subscriber without a cursor blocks deletion (until the age cap).

    Ages are measured on the bucket's clock: ``now_ms`` when given (a time
    on the bucket's clock), else ``clock.now_ms()`` (the gateway's
    :class:`BucketClock`, fed by the objects it writes), else the newest
    ``LastModified`` among the manifests — a time the bucket has already
    passed, so manifests look younger than they are and GC deletes later,
    never sooner. With a ``clock`` whose skew is beyond its
    ``gc_pause_skew_ms``, nothing is deleted (``GcResult.paused`` says why).
    ``head_seq`` is the log's last committed seq, for
    :func:`register_subscribers`.

    Raises ``BucketUnavailable`` when the bucket is away (nothing is lost:
    run again later), :class:`CorruptData` for a malformed boundary or
    cursor (GC then does nothing rather than guess), and
    :class:`UnsupportedStore` when the store refuses the boundary's
    compare-and-swap with the object's current ETag (not contention: see
    ``_update_state``).
    """
    config = config or GcConfig()
    validate_region(region)
    listed = None if subscribers is None else sorted({validate_region(r) for r in subscribers})
    cursors = {
        r: (c.through_seq if c is not None else 0)
        for r, c in (await read_cursors(bucket, prefix, region, listed)).items()
    }
    ages = [
        ManifestAge(m.last_seq, m.info.key, _ms(m.info))
        for m in await _manifests(bucket, prefix, region)
    ]
    if head_seq is None:
        head_seq = max((a.last_seq for a in ages), default=0)
    first_new = head_seq + 1
    state = await _update_state(
        bucket,
        prefix,
        region,
        lambda s: _registered(s, listed, first_new),
        config.cas_attempts,
    )
    boundary = state.highest_deleted_seq
    paused = clock.gc_pause_reason() if clock is not None else None
    if paused is not None:
        return GcResult(boundary, boundary, 0, 0, (), paused, cursors, paused)
    if now_ms is not None:
        now = now_ms
    elif clock is not None and (bucket_now := clock.now_ms()) is not None:
        now = bucket_now
    else:
        now = max((a.modified_ms for a in ages), default=0)
    plan = plan_gc(
        ages, cursors, boundary=boundary, now_ms=now, config=config, since=state.subscribers
    )
    if not plan.manifests:
        return GcResult(boundary, boundary, 0, 0, (), plan.stopped_by, cursors)
    if plan.overridden:
        log.warning(
            "gc %s: deleting through seq %d although %s have not mirrored it (age cap %d ms)%s",
            region,
            plan.boundary,
            ", ".join(plan.overridden),
            config.age_cap_ms,
            "".join(
                f"; {r} loses entries {a}..{b} it was subscribed to"
                for r, (a, b) in sorted(plan.lost.items())
            ),
        )
    # The first entry to delete: the oldest manifest's first seq (leftovers
    # of an interrupted run below it are deleted too: from the old boundary).
    first_doc = await _manifest(bucket, plan.manifests[0].key, region)
    start = min(first_doc.first_seq, boundary + 1)
    await _update_state(bucket, prefix, region, lambda s: _advanced(s, plan), config.cas_attempts)
    deleted = 0
    limiter = trio.CapacityLimiter(config.concurrency)
    packs = [
        (p.last_seq, p.key)
        for p in await list_packs(bucket, prefix, region, 0)
        if p.last_seq <= plan.boundary
    ]
    lo = start
    for m in plan.manifests:
        keys = [log_key(prefix, region, s) for s in range(lo, m.last_seq + 1)]
        # A pack goes with the last entry it copies (leftovers below too),
        # before the manifest.
        gone = [key for last, key in packs if last <= m.last_seq]
        packs = [(last, key) for last, key in packs if last > m.last_seq]
        await _delete_all(bucket, keys + gone, limiter)
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
        None,
        dict(plan.lost),
    )


def _advanced(state: GcState, plan: GcPlan) -> GcState | None:
    """``state`` with the boundary raised to the plan's and its losses added (never lowered)."""
    lost = dict(state.lost)
    for reader, (first, last) in plan.lost.items():
        old = lost.get(reader)
        lost[reader] = (first, last) if old is None else (min(old[0], first), max(old[1], last))
    boundary = max(state.highest_deleted_seq, plan.boundary)
    if boundary == state.highest_deleted_seq and lost == dict(state.lost):
        return None
    return GcState(boundary, state.subscribers, lost)


@dataclass(frozen=True, slots=True)
class _Listed:
    last_seq: int
    info: ObjectInfo


async def _manifests(bucket: Bucket, prefix: str, region: str) -> list[_Listed]:
    """The region's manifests as listed (one LIST), by last seq."""
    out = []
    for info in await bucket.list(manifest_prefix(prefix, region)):
        try:
            _, last_seq = parse_manifest_key(info.key, prefix)
        except CorruptData:
            continue
        out.append(_Listed(last_seq, info))
    return sorted(out, key=lambda m: m.last_seq)


def _ms(info: ObjectInfo) -> int:
    return int(info.last_modified.timestamp() * 1000)


async def _manifest(bucket: Bucket, key: str, region: str) -> Manifest:
    res = await bucket.get(key)
    return Manifest.decode(res.data, where=key, region=region)


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
