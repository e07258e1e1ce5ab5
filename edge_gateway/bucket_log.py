"""Reading a region's log in the bucket: keys, headers, the head, manifests, GC boundary.

I/O helpers shared by the shipper (which writes its own region's log), the
tailers (which read other regions' logs), ``edgegw restore`` and the pipeline.
The decisions live in :mod:`edge_gateway.protocol.log_decisions` and the
encodings in :mod:`edge_gateway.format`; this module only fetches and decodes.

It also tells an edgegw bucket from any other (:func:`is_edgegw_bucket`):
``<prefix>edgegw-bucket.json``, a marker the admin writes (``edgegw bucket
mark``; a gateway's first claim or an explicit ``--new-bucket`` where their
credentials may), or, for buckets written before the marker existed -- and
when the marker is malformed -- objects of the layout under
``<prefix>regions/``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar

import trio

from edge_gateway.bucket import Bucket, NotFound, PreconditionFailed
from edge_gateway.errors import CorruptData
from edge_gateway.format import logobject
from edge_gateway.format.logobject import LogObjectHeader
from edge_gateway.format.manifest import (
    Manifest,
    gc_boundary_key,
    log_key,
    manifest_prefix,
    parse_manifest_key,
    quarantine_key,
)
from edge_gateway.names import validate_region
from edge_gateway.protocol.log_decisions import HeadSearch

#: Header reads of a log's tail in flight at once (:func:`read_headers`). A
#: claim, a restore and a reship read every entry after the newest manifest
#: (up to a manifest interval of them); one after another that was one
#: round trip each -- on a 60 ms link, seconds before a gateway could claim.
TAIL_READS: Final = 16

#: HEADs in flight at once while looking for a log's head (:func:`find_head`).
HEAD_PROBES: Final = 8

_T = TypeVar("_T")
_R = TypeVar("_R")

# The logger keeps the module's former name: operators filter on it.
log = logging.getLogger("edgegw.regionlog")

#: First ranged GET of a log object: holds the index of all but huge objects,
#: and the whole object when it is small.
HEADER_READ_BYTES = logobject.FIRST_GET_BYTES
_GC_VERSION = 1

#: The marker object of an edgegw bucket, under the key prefix.
BUCKET_MARKER: Final = "edgegw-bucket.json"
_MARKER_FORMAT: Final = "edgegw-bucket"
_MARKER_VERSION: Final = 1
#: Keys of the layout (docs/protocol.md, "Bucket layout") below ``regions/``.
_LAYOUT_KEY: Final = re.compile(
    r"regions/[A-Za-z0-9_-]+/(log/[0-9]{20}\.egw|manifest/[0-9]{20}\.json|gc-boundary\.json"
    r"|cursors/[A-Za-z0-9_-]+\.json)"
)
#: Keys under ``regions/`` looked at before calling a bucket foreign.
_LAYOUT_LIST_LIMIT: Final = 100


@dataclass(frozen=True, slots=True)
class HeaderRead:
    header: LogObjectHeader
    #: the object's first bytes as read (at least the header; all of a small object)
    prefix: bytes
    #: the whole object's size
    size: int


async def read_header(bucket: Bucket, key: str, first_bytes: int = HEADER_READ_BYTES) -> HeaderRead:
    """The header of the log object at ``key``, with the bytes read so far (from 0).

    One ranged GET of ``first_bytes`` in the usual case (all of an object no
    larger); a second only when the index is larger than that.
    """
    res = await bucket.get(key, start=0, end=first_bytes)
    data = res.data
    need = logobject.header_length_hint(data[:12], where=key)
    if need > len(data):
        more = await bucket.get(key, start=len(data), end=need)
        data += more.data
    header = logobject.decode_header(data[:need], where=key, object_size=res.size)
    return HeaderRead(header, data, res.size)


async def exists(bucket: Bucket, key: str) -> bool:
    try:
        await bucket.head(key)
    except NotFound:
        return False
    return True


async def find_head(bucket: Bucket, prefix: str, region: str, known: int = 0) -> int:
    """The highest seq in the region's log (0 if empty), by galloping HEADs above ``known``.

    :data:`HEAD_PROBES` HEADs at once per round (:meth:`HeadSearch.next_probes`).
    """
    search = HeadSearch(known)

    async def probe(seq: int) -> bool:
        return await exists(bucket, log_key(prefix, region, seq))

    while probes := search.next_probes(HEAD_PROBES):
        search.record_batch(zip(probes, await in_order(probes, probe, HEAD_PROBES), strict=True))
    return search.head


async def in_order(items: Sequence[_T], fn: Callable[[_T], Awaitable[_R]], width: int) -> list[_R]:
    """``fn(item)`` for each of ``items``, ``width`` at a time; the results in order.

    The calls start in order. When calls fail, the first failure in order
    is raised (as calling them one by one would have), once the calls
    before it ended; no call starts after a failure. Nothing is wrapped in
    an exception group: callers catch what ``fn`` raises.
    """
    results: list[_R | None] = [None] * len(items)
    errors: list[Exception | None] = [None] * len(items)
    todo = iter(enumerate(items))
    failed = False

    async def worker() -> None:
        nonlocal failed
        for i, item in todo:  # shared: each item goes to one worker, in order
            if failed:
                return
            try:
                results[i] = await fn(item)
            except Exception as exc:  # noqa: BLE001 - raised below, in order
                errors[i] = exc
                failed = True

    async with trio.open_nursery() as nursery:
        for _ in range(min(width, len(items))):
            nursery.start_soon(worker)
    out: list[_R] = []
    for result, error in zip(results, errors, strict=True):
        if error is not None:
            raise error
        out.append(result)  # type: ignore[arg-type]  # set: every call before a failure ran
    return out


async def read_gc_boundary(bucket: Bucket, prefix: str, region: str) -> int:
    """The highest seq ever deleted from the region's log (0 if none)."""
    key = gc_boundary_key(prefix, region)
    try:
        res = await bucket.get(key)
    except NotFound:
        return 0
    try:
        doc = json.loads(res.data)
        value = doc["highest_deleted_seq"]
        if doc.get("version") != _GC_VERSION or not isinstance(value, int) or value < 0:
            raise ValueError(f"bad document {doc!r}")
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptData(f"malformed GC boundary: {exc}", where=key) from None
    return value


def encode_gc_boundary(highest_deleted_seq: int) -> bytes:
    return json.dumps({"version": _GC_VERSION, "highest_deleted_seq": highest_deleted_seq}).encode()


async def latest_manifest(bucket: Bucket, prefix: str, region: str) -> Manifest | None:
    """The newest manifest of the region (one LIST of the manifest folder)."""
    folder = manifest_prefix(prefix, region)
    infos = await bucket.list(folder)
    for info in reversed(infos):
        try:
            _, last_seq = parse_manifest_key(info.key, prefix)
        except CorruptData:
            continue  # not a manifest (a stray file in the folder)
        res = await bucket.get(info.key)
        return Manifest.decode(res.data, where=info.key, region=region, last_seq=last_seq)
    return None


@dataclass(slots=True)
class LogState:
    """What a reader or a restarting writer knows about a region's log."""

    head: int = 0
    head_header: LogObjectHeader | None = None
    gc_boundary: int = 0
    manifest: Manifest | None = None
    #: headers of the entries after the newest manifest, in seq order
    tail: list[tuple[LogObjectHeader, int]] = field(default_factory=list)
    #: (topic, partition) -> next offset after the head
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    #: seqs below the head whose headers :func:`skip_to_head` did not read yet
    #: (``tail`` and ``next_offsets`` are incomplete until :func:`read_skipped`)
    skipped: list[int] = field(default_factory=list)

    @property
    def head_epoch(self) -> int:
        return self.head_header.epoch if self.head_header else 0

    @property
    def head_last_lsn(self) -> int:
        return self.head_header.last_lsn if self.head_header else 0

    @property
    def max_epoch(self) -> int:
        epochs = [h.epoch for h, _ in self.tail]
        if self.manifest is not None:
            epochs.append(self.manifest.epoch)
        return max(epochs, default=0)


async def load_log_state(bucket: Bucket, prefix: str, region: str) -> LogState:
    """Head, newest manifest and the headers after it: what a writer needs to continue."""
    state = LogState()
    state.gc_boundary = await read_gc_boundary(bucket, prefix, region)
    state.manifest = await latest_manifest(bucket, prefix, region)
    known = state.gc_boundary
    if state.manifest is not None:
        known = max(known, state.manifest.last_seq)
        state.next_offsets = dict(state.manifest.next_offsets)
    start = (state.manifest.last_seq + 1) if state.manifest is not None else state.gc_boundary + 1
    await _read_tail(
        bucket, prefix, region, state, start, await find_head(bucket, prefix, region, known)
    )
    if not state.tail and state.head:
        state.head_header = (await read_header(bucket, log_key(prefix, region, state.head))).header
    return state


async def skip_to_head(bucket: Bucket, prefix: str, region: str, state: LogState) -> LogState:
    """``state`` (from :func:`load_log_state`) moved to the log's head now, in place.

    Reads only the new head's header (its epoch and last LSN are the log's
    newest); the seqs between the old head and the new one are noted in
    ``state.skipped``, read by :func:`read_skipped`. A writer that lost a
    claim race to a live writer (its fence's seq was taken) retries with
    this: reading every entry the live writer committed meanwhile first
    took longer, on a slow or busy link, than the live writer took to
    commit the next one, and the claim did not land for minutes.
    """
    head = await find_head(bucket, prefix, region, state.head)
    if head > state.head:
        state.skipped.extend(range(state.head + 1, head))
        await _read_tail(bucket, prefix, region, state, head, head)
    return state


async def read_skipped(bucket: Bucket, prefix: str, region: str, state: LogState) -> LogState:
    """Read the headers :func:`skip_to_head` skipped: ``tail`` and ``next_offsets`` complete."""
    if not state.skipped:
        return state
    state.tail += await read_headers(bucket, prefix, region, state.skipped)
    state.skipped = []
    state.tail.sort(key=lambda entry: entry[0].seq)
    state.next_offsets = dict(state.manifest.next_offsets) if state.manifest is not None else {}
    for header, _ in state.tail:
        _advance_offsets(state.next_offsets, header)
    return state


def _advance_offsets(next_offsets: dict[tuple[str, int], int], header: LogObjectHeader) -> None:
    """Move each partition's next offset past ``header``'s gaps, then its blocks (a gap
    marker names offsets before the blocks of the same entry)."""
    for g in header.gaps:
        key = (g.topic, g.partition)
        next_offsets[key] = max(next_offsets.get(key, 0), g.last_offset + 1)
    for b in header.blocks:
        next_offsets[(b.topic, b.partition)] = b.last_offset + 1


def _check_seq(header: LogObjectHeader, seq: int, region: str, key: str) -> None:
    if header.seq != seq or header.region != region:
        raise CorruptData(f"entry claims seq {header.seq} of region {header.region!r}", where=key)


async def _read_tail(
    bucket: Bucket, prefix: str, region: str, state: LogState, start: int, head: int
) -> None:
    """Append the headers of seqs ``start..head`` to ``state``; its head becomes ``head``."""
    for header, size in await read_headers(bucket, prefix, region, range(start, head + 1)):
        state.tail.append((header, size))
        state.head_header = header
        _advance_offsets(state.next_offsets, header)
    state.head = max(state.head, head)


async def read_headers(
    bucket: Bucket, prefix: str, region: str, seqs: Sequence[int]
) -> list[tuple[LogObjectHeader, int]]:
    """The header and size of each of the region's entries ``seqs``, in that order.

    :data:`TAIL_READS` at once (:func:`in_order`: the first failure in seq
    order is raised). Each header is checked to be the entry its key names.
    """

    async def read(seq: int) -> tuple[LogObjectHeader, int]:
        key = log_key(prefix, region, seq)
        got = await read_header(bucket, key)
        _check_seq(got.header, seq, region, key)
        return got.header, got.size  # not the bytes read: a tail may be long

    return await in_order(seqs, read, TAIL_READS)


# ---------------------------------------------------------------- bucket identity


def bucket_marker_key(prefix: str) -> str:
    """``<prefix>/edgegw-bucket.json`` (``prefix`` may be empty)."""
    return f"{prefix.rstrip('/')}/{BUCKET_MARKER}" if prefix.strip("/") else BUCKET_MARKER


def encode_bucket_marker(region: str, created_ms: int) -> bytes:
    """The marker's content: what it is, and who made the bucket an edgegw bucket when."""
    doc = {
        "format": _MARKER_FORMAT,
        "version": _MARKER_VERSION,
        "created_by": validate_region(region),
        "created_ms": created_ms,
    }
    return json.dumps(doc).encode()


def check_bucket_marker(data: bytes, key: str) -> dict[str, object]:
    """The marker's document; :class:`CorruptData` if ``data`` is not an edgegw marker."""
    try:
        doc = json.loads(data)
        if doc["format"] != _MARKER_FORMAT or not isinstance(doc["version"], int):
            raise ValueError(f"not an edgegw marker: {doc!r:.80}")
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptData(f"malformed bucket marker: {exc}", where=key) from None
    return dict(doc)


async def is_edgegw_bucket(bucket: Bucket, prefix: str) -> bool:
    """Whether the bucket (under ``prefix``) holds edgegw data.

    True when the marker exists (one GET), or else when an object of the
    layout (a log entry, manifest, GC boundary or cursor of some region) is
    under ``regions/`` (one LIST): buckets written before the marker existed
    keep working. An empty bucket, and one holding only other data, is not.
    A GET, not a HEAD: only a GET's error tells a missing bucket from a
    missing key.

    A marker that is not edgegw's (garbage, another format) counts as no
    marker, with a WARNING naming it and what to do: whoever may write it
    (an admin; a region key if an old policy still grants it) would
    otherwise stop ``edgegw sync``, ``restore`` and ``reship`` at every site.
    """
    key = bucket_marker_key(prefix)
    try:
        res = await bucket.get(key)
    except NotFound:
        pass
    else:
        try:
            check_bucket_marker(res.data, key)
        except CorruptData as exc:
            log.warning(
                "the fleet marker %s in %s is malformed (%s): ignoring it and recognising the "
                "bucket by its region logs; an admin rewrites it with `edgegw bucket mark` "
                "(the admin's credentials), and should find out who could overwrite it "
                "(docs/security.md)",
                key,
                bucket.describe(),
                exc.reason,
            )
        else:
            return True
    base = f"{prefix.rstrip('/')}/" if prefix.strip("/") else ""
    for info in await bucket.list(f"{base}regions/", limit=_LAYOUT_LIST_LIMIT):
        if _LAYOUT_KEY.fullmatch(info.key, len(base)):
            return True
    return False


async def mark_bucket(bucket: Bucket, prefix: str, region: str, created_ms: int) -> bool:
    """Create the marker if it is missing; True if this call created it.

    Create-only: of concurrent first users one writes it, and an existing
    marker is never replaced. Looked for first (one GET): a region confined
    to its own keys may not be allowed to create it (docs/security.md), and
    only the fleet's first claim needs to.
    """
    try:
        await bucket.get(bucket_marker_key(prefix))
    except NotFound:
        pass
    else:
        return False
    try:
        await bucket.put(
            bucket_marker_key(prefix),
            encode_bucket_marker(region, created_ms),
            if_none_match=True,
        )
    except PreconditionFailed:
        return False
    return True


#: :func:`write_bucket_marker`'s outcomes.
MarkOutcome = Literal["created", "present", "replaced"]

#: The ``created_by`` of a marker an admin writes (``edgegw bucket mark``).
ADMIN_MARKER_BY: Final = "admin"


async def write_bucket_marker(
    bucket: Bucket, prefix: str, created_ms: int, *, by: str = ADMIN_MARKER_BY
) -> tuple[MarkOutcome, bytes]:
    """The admin's write of the fleet marker (``edgegw bucket mark``); (outcome, what was there).

    ``created``: there was none. ``present``: a valid marker is kept as it is
    (never replaced: it says who made the bucket edgegw's, and when).
    ``replaced``: a malformed one (returned, as evidence) was overwritten by
    compare-and-swap on its ETag, so a marker written meanwhile is not lost.
    """
    key = bucket_marker_key(prefix)
    data = encode_bucket_marker(by, created_ms)
    for _ in range(3):  # each turn loses a race to another writer of the marker at most
        try:
            res = await bucket.get(key)
        except NotFound:
            try:
                await bucket.put(key, data, if_none_match=True)
            except PreconditionFailed:
                continue  # created meanwhile: look at it
            return "created", b""
        try:
            check_bucket_marker(res.data, key)
        except CorruptData:
            try:
                await bucket.put(key, data, if_match=res.etag)
            except (PreconditionFailed, NotFound):
                continue  # replaced or deleted meanwhile: look again
            return "replaced", res.data
        return "present", res.data
    raise PreconditionFailed(f"{key}: changed by another writer at every attempt", key=key)


#: Bytes of a set-aside object kept as evidence in its note (base64).
SET_ASIDE_EVIDENCE_BYTES: Final = 1024


async def set_aside(
    bucket: Bucket, prefix: str, region: str, seq: int, why: CorruptData, now_ms: int
) -> str:
    """Move a corrupt object out of the writer's next seq; the key of the note left.

    Only the region's own writer calls this, for the seq its next entry goes
    to (docs/protocol.md, "A corrupt object where the next entry goes"). The
    note ``<region>/quarantine/<seq>-<ms>.json`` records the key, size, ETag,
    the reason and the object's first bytes; then the object is deleted so the
    conditional create can land. Readers never applied it (every check runs
    before the first append), so the entry created there is the only one
    they will apply.
    """
    key = log_key(prefix, region, seq)
    try:
        res = await bucket.get(key, start=0, end=SET_ASIDE_EVIDENCE_BYTES)
    except NotFound:
        return ""  # gone meanwhile: nothing to set aside
    note = {
        "key": key,
        "size": res.size,
        "etag": res.etag,
        "reason": why.reason,
        "found_ms": now_ms,
        "first_bytes_b64": base64.b64encode(res.data[:SET_ASIDE_EVIDENCE_BYTES]).decode(),
    }
    dest = quarantine_key(prefix, region, seq, now_ms)
    # PreconditionFailed: the same object set aside in the same millisecond.
    with contextlib.suppress(PreconditionFailed):
        await bucket.put(dest, json.dumps(note, indent=1).encode(), if_none_match=True)
    await bucket.delete(key)
    return dest
